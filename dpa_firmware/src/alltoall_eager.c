/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All-to-all, eager, for blocks of at most eager_max bytes (<= OFFLOAD_EAGER_BYTES), as an
 * MPI shared-memory FIFO or DeepEP's low-latency buffers do it: no ready round trip. Each
 * rank's control region holds per team and source OFFLOAD_EAGER_SLOTS slots; a sender
 * writes its block into its slot at the receiver (slot = op seq % slots), then the slot's
 * header behind it on the same queue, which wakes the receiver. The header is the op's
 * signature (signature.c), its seq word last. The receiver copies the block out into its
 * destination and hands the slot back: it writes the seq word it consumed into the
 * sender's eager_credit. A sender reuses a slot only once the seq word of the slot's
 * previous eager op came back, so a fast sender never overruns a slow receiver. One
 * message each way per pair and op, against the rendezvous' three.
 *
 * The gate, without its round: no op moves data before every member's signature agreed
 * (signature.c). Here the signature comes with the block: the receiver judges each header
 * as it arrives and copies nothing out (its own block included) before every peer's
 * header was judged and agreed; blocks sit in their slots meanwhile. A disagreeing header
 * fails the op with OFFLOAD_ERR_MISMATCH naming its sender and what differs, exactly as
 * the gate would. A peer that runs a gated op at this sequence (another size, another
 * collective, another eager_max) shows its gate signature instead: we judge it (and
 * fail), and post ours to it, so that its gate fails too, naming us; its slot of ours it
 * will never hand back, so we take it back ourselves (eager_skip). Nothing else of ours
 * is at stake: a gated op whose gate fails sends nothing more.
 *
 * Item j exchanges with team peer me + j both ways (item 0: our own block), so that every
 * write of an item goes to that peer (the copy out goes to ourselves: DPA_WR_DATA_SELF).
 * An item has one data write in flight at a time, and `round` says which.
 */
#include "eager.h"
#include "p2p.h"
#include "signature.h"

static int eager_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *cmd = &op->cmd;
	uint64_t total;

	(void)hal;
	/* The slots are OFFLOAD_EAGER_MAX_TEAM sources wide: a larger team never selects
	 * this (a2a_select), and is refused should it get here. */
	if (team->size > OFFLOAD_EAGER_MAX_TEAM || cmd->flags ||
	    __builtin_mul_overflow(cmd->count, team->size, &total) ||
	    (total && (!cmd->src_addr || !cmd->dst_addr || cmd->dst_len < total)))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	else
		op->result0 = total;
	dpa_eager_begin(eng, op);
	return (int)team->size;
}

void dpa_eager_begin(struct dpa_engine *eng, struct dpa_op *op)
{
	struct dpa_team *team = &eng->teams[op->team_id];

	/* The protocol is part of what every member must agree on (the ranks' eager_max). */
	op->sig.op |= OFFLOAD_SIG_EAGER << OFFLOAD_SIG_MODE_SHIFT;
	op->alg.hdr_pending = team->size - 1;
	op->alg.hdr_fail = 0;
	/* Intake runs ops in sequence order: the slot's previous eager op is known here. */
	op->alg.eager_prev = team->eager_last[dpa_eager_slot(op)];
	team->eager_last[dpa_eager_slot(op)] = op->seq;
}

/* A data write of item i to team peer `peer` (the copy out: to ourselves). */
int dpa_eager_write(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		       uint32_t peer, uint64_t laddr, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		    uint64_t len, enum dpa_eager_w what)
{
	struct dpa_item *it = &op->items[i];
	uint32_t world = eng->teams[op->team_id].peers[peer].world_rank;
	int rc;

	if (dpa_rail_select(eng, hal, world) == DPA_NO_RAIL) {
		dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, world);
		return 0;
	}
	rc = dpa_hal_rdma_write(hal, world, laddr, lkey, raddr, rkey, len,
				dpa_wr_id(op, i, what == EAGER_W_COPY ? DPA_WR_DATA_SELF :
						 what == EAGER_W_CREDIT ? DPA_WR_CREDIT : DPA_WR_DATA));
	if (rc == DPA_HAL_EAGAIN)
		return 0;
	if (rc) {  /* settled as done at the next call, with nothing moved */
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, world);
		it->flags |= DPA_ITEM_FAILED;
	} else {
		it->inflight++;
	}
	it->round = what;
	return 1;
}

/* The write in flight completed (its completion was polled): take note, or, if a failed
 * rail dropped it, leave it to be posted again. */
void dpa_eager_settle(struct dpa_item *it)
{
	if (it->flags & DPA_ITEM_RESEND) {
		it->flags &= ~DPA_ITEM_RESEND;
		it->round = EAGER_W_NONE;
		return;
	}
	if (it->round == EAGER_W_BLOCK)
		it->flags |= DPA_ITEM_PUT;
	else if (it->round == EAGER_W_COPY)
		it->flags |= DPA_ITEM_COPIED;
	else if (it->round == EAGER_W_CREDIT)
		it->flags |= DPA_ITEM_RECVD;
	it->round = EAGER_W_NONE;
}

/* May we overwrite our slot at the peer: did it hand back the slot's previous op? */
static int credit_ok(struct dpa_engine *eng, const struct dpa_op *op, struct dpa_hal *hal,
		     uint32_t peer)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t k = dpa_eager_slot(op), prev = op->alg.eager_prev;
	/* Pairs with the peer's credit write (a plain RDMA write of the consumed word). */
	uint32_t back = OFFLOAD_EAGER_SEQ(off_load_acquire(dpa_my_credit(eng, hal, op->team_id, k,
									 peer)));

	return !prev || (int32_t)(back - prev) >= 0 || team->eager_skip[k][peer] == prev;
}

/* Item i judged its peer's header (or found it will never come): once every one is, the
 * copies may run, unless one disagreed. Items on sibling threads may wait for it. */
static void judged(struct dpa_op *op, struct dpa_hal *hal, int agrees)
{
	int sole = dpa_hal_num_threads(hal) == 1;

	if (!agrees)
		__atomic_store_n(&op->alg.hdr_fail, 1, __ATOMIC_SEQ_CST);
	if (off_count_down(&op->alg.hdr_pending, sole) == 0 && !sole)
		dpa_hal_notify(hal);
}

/* Every header judged: 1 if the blocks may be copied out, 0 if nothing may move, -1 if
 * some header is still to come. */
int dpa_eager_copies_allowed(const struct dpa_op *op)
{
	if (__atomic_load_n(&op->alg.hdr_pending, __ATOMIC_SEQ_CST))
		return -1;
	return !__atomic_load_n(&op->alg.hdr_fail, __ATOMIC_SEQ_CST) && !op->refuse;
}

/* Item 0: our own block, src to dst, with no slot in between, once the peers agree. */
static int self_step(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct dpa_item *it = &op->items[0];
	const struct offload_cmd *cmd = &op->cmd;
	uint64_t off = (uint64_t)eng->teams[op->team_id].my_rank * cmd->count;
	int allowed = dpa_eager_copies_allowed(op);

	if (allowed < 0)
		return 0;
	if (!(it->flags & DPA_ITEM_PUT) && allowed && cmd->count)
		return dpa_eager_write(eng, op, 0, hal, eng->teams[op->team_id].my_rank,
				   cmd->src_addr + off, cmd->src_key, cmd->dst_addr + off,
				   cmd->dst_key, cmd->count, EAGER_W_BLOCK);
	it->flags |= DPA_ITEM_PUT | DPA_ITEM_SIGNALED | DPA_ITEM_RECVD | DPA_ITEM_FINISHED;
	return 1;
}

/* The slot's header at peer p, behind the block: our signature, its seq word last (maybe
 * with OFFLOAD_EAGER_ERROR). A logged control word, so that a failed rail sends it again.
 * Returns DPA_HAL_EAGAIN, or 0 once posted (or failed for good). */
static int post_header(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t p,
		       int error)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *peer = &team->peers[p];
	struct dpa_ctrl_msg m = {
		.wr_id = dpa_wr_id(op, p, DPA_WR_EAGER),
		.raddr = peer->ctrl_addr + dpa_ctrl_eager_off(eng, op->team_id, team->my_rank,
							      dpa_eager_slot(op)),
		.value = op->seq | (error ? OFFLOAD_EAGER_ERROR : 0),
		.peer = peer->world_rank, .rkey = peer->ctrl_key,
		.kind = DPA_WR_EAGER, .len = offsetof(struct offload_sig, seq),
		.seq_off = offsetof(struct offload_eager_slot, sig.seq),
	};
	int rc;

	__builtin_memcpy(m.body, &op->sig, m.len);
	rc = dpa_ctrl_post(eng, hal, &m);
	if (rc == DPA_HAL_EAGAIN)
		return rc;
	if (rc == OFFLOAD_ERR_LINK_DOWN)
		dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, peer->world_rank);
	else if (rc)
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, peer->world_rank);
	return 0;
}

/* Our block to peer p: into its slot, then the slot's header. A failed op sends the
 * header alone, marked as an error. */
int dpa_eager_send(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		   uint32_t p, uint64_t src_off)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *peer = &team->peers[p];
	struct dpa_item *it = &op->items[i];
	const struct offload_cmd *cmd = &op->cmd;
	int err = op->refuse || (it->flags & DPA_ITEM_FAILED);

	if (dpa_peer_gone(eng, op, hal, peer->world_rank)) {
		it->flags |= DPA_ITEM_SIGNALED;  /* nobody to tell */
		return 1;
	}
	if (!credit_ok(eng, op, hal, p)) {
		dpa_wake_at(eng, hal, dpa_hal_time_ns(hal) + DPA_EAGER_CREDIT_POLL_NS);
		return 0;
	}
	if (!err && !(it->flags & DPA_ITEM_PUT)) {
		if (cmd->count)
			return dpa_eager_write(eng, op, i, hal, p, cmd->src_addr + src_off,
					   cmd->src_key,
					   peer->ctrl_addr + dpa_ctrl_eager_off(eng, op->team_id, team->my_rank,
										dpa_eager_slot(op)) +
					   offsetof(struct offload_eager_slot, data),
					   peer->ctrl_key, cmd->count, EAGER_W_BLOCK);
		it->flags |= DPA_ITEM_PUT;
	}
	if (post_header(eng, op, hal, p, err) == DPA_HAL_EAGAIN)
		return 0;
	it->flags |= DPA_ITEM_SIGNALED;
	return 1;
}

/*
 * An aborted op (cancel, op_timeout, a lost peer): a peer that has not taken our block yet
 * (no credit for this op) finds an error header instead, and fails at once when it posts
 * its part, instead of completing against a rank that gave up. A slot still holding the
 * previous op's block (its credit not back) is left alone: that op may still complete. A
 * peer in a gated op here gets our signature, which its gate waits for.
 */
int dpa_eager_abort(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t p = (team->my_rank + i) % team->size;
	struct dpa_item *it = &op->items[i];

	if (i == 0 || dpa_peer_gone(eng, op, hal, team->peers[p].world_rank))
		return 0;
	if (!(it->flags & DPA_ITEM_SIG_OUT) && dpa_sig_gated(eng, hal, op->team_id, op->seq, p) &&
	    dpa_sig_post_once(eng, op, hal, i) == DPA_HAL_EAGAIN)
		return DPA_HAL_EAGAIN;
	if (it->flags & DPA_ITEM_SIGNALED) {
		if (OFFLOAD_EAGER_SEQ(off_load_acquire(dpa_my_credit(eng, hal, op->team_id,
								     dpa_eager_slot(op), p))) == op->seq)
			return 0;  /* it took the block already */
	} else if (!credit_ok(eng, op, hal, p)) {
		return 0;
	}
	return post_header(eng, op, hal, p, 1);
}

/* Peer p runs a gated op at this sequence: its gate waits for our signature. Once ours is
 * out, and our own block went into its slot (the next op's may follow it there only
 * after it, on the same queue), the slot is ours again: p will never hand it back. */
static int fallback_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal, uint32_t p)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	int work = dpa_sig_post_once(eng, op, hal, i);

	if (work == DPA_HAL_EAGAIN)
		return 0;
	if (!(it->flags & DPA_ITEM_SIGNALED))
		return work;
	team->eager_skip[dpa_eager_slot(op)][p] = op->seq;
	it->flags |= DPA_ITEM_COPIED | DPA_ITEM_RECVD;
	return work + 1;
}

/* Peer p's header: judge it; a gated signature or none at all instead is judged as the
 * gate would. Returns work done. */
static int judge_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		      uint32_t p, const struct offload_eager_slot *slot)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t world = team->peers[p].world_rank;
	const struct offload_sig *gated;
	/* Pairs with the sender's seq word write, which follows its header and block. */
	uint64_t word = off_load_acquire(&slot->sig.seq);

	if (OFFLOAD_EAGER_SEQ(word) == op->seq) {
		int agrees = dpa_sig_judge(op, &slot->sig, world);

		if (agrees && (word & OFFLOAD_EAGER_ERROR))
			dpa_op_fail(op, OFFLOAD_ERR_PEER_OP, world);  /* its part failed */
		it->flags |= DPA_ITEM_JUDGED;
		judged(op, hal, agrees);
		return 1;
	}
	gated = dpa_sig_gated(eng, hal, op->team_id, op->seq, p);
	if (gated) {
		dpa_sig_judge(op, gated, world);  /* it differs: ours says eager */
		it->flags |= DPA_ITEM_JUDGED | DPA_ITEM_FALLBACK;
		judged(op, hal, 0);
		return 1 + fallback_step(eng, op, i, hal, p);
	}
	if (!dpa_sig_absent(eng, op, hal, i, p))
		return 0;
	/* It will never send (gone, or in an agreement): no block, no slot to hand back. */
	it->flags |= DPA_ITEM_JUDGED | DPA_ITEM_COPIED | DPA_ITEM_RECVD;
	judged(op, hal, 0);
	return 1;
}

int dpa_eager_judge(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		    uint32_t p)
{
	struct dpa_item *it = &op->items[i];

	if (it->flags & DPA_ITEM_FALLBACK)
		return fallback_step(eng, op, i, hal, p);
	if (it->flags & DPA_ITEM_JUDGED)
		return 0;
	return judge_step(eng, op, i, hal, p, dpa_eager_slot_ptr(eng, op, hal, p));
}

const struct offload_eager_slot *dpa_eager_slot_ptr(struct dpa_engine *eng, const struct dpa_op *op,
						     struct dpa_hal *hal, uint32_t p)
{
	return dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL,
				  dpa_ctrl_eager_off(eng, op->team_id, p, dpa_eager_slot(op)),
				  sizeof(struct offload_eager_slot));
}

int dpa_eager_credit(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		     uint32_t p)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *me = &team->peers[team->my_rank], *peer = &team->peers[p];
	uint64_t off = dpa_ctrl_eager_off(eng, op->team_id, p, dpa_eager_slot(op));

	/* The credit is the slot's seq word itself, read from our control region by the write. */
	return dpa_eager_write(eng, op, i, hal, p,
			       me->ctrl_addr + off + offsetof(struct offload_eager_slot, sig.seq),
			       me->ctrl_key,
			       peer->ctrl_addr + dpa_ctrl_credit_off(eng, op->team_id,
								     dpa_eager_slot(op), team->my_rank),
			       peer->ctrl_key, sizeof(uint64_t), EAGER_W_CREDIT);
}

/* Peer p's block: judge its header, copy the block out of its slot here once every
 * header agreed, then hand the slot back. */
static int recv_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		     uint32_t p)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *me = &team->peers[team->my_rank];
	struct dpa_item *it = &op->items[i];
	const struct offload_cmd *cmd = &op->cmd;
	int work = dpa_eager_judge(eng, op, i, hal, p), allowed;

	if (!(it->flags & DPA_ITEM_JUDGED) || (it->flags & (DPA_ITEM_RECVD | DPA_ITEM_FALLBACK)))
		return work;
	if (!(it->flags & DPA_ITEM_COPIED)) {
		uint64_t off = dpa_ctrl_eager_off(eng, op->team_id, p, dpa_eager_slot(op));
		const struct offload_eager_slot *slot = dpa_eager_slot_ptr(eng, op, hal, p);

		allowed = dpa_eager_copies_allowed(op);
		if (allowed < 0)
			return work;
		/* Ours until we hand it back: the sender rewrites nothing of it before. */
		if (allowed && cmd->count && !(off_read_once(&slot->sig.seq) & OFFLOAD_EAGER_ERROR))
			return work + dpa_eager_write(eng, op, i, hal, team->my_rank,
						      me->ctrl_addr + off +
						      offsetof(struct offload_eager_slot, data),
						      me->ctrl_key,
						      cmd->dst_addr + (uint64_t)p * cmd->count,
						      cmd->dst_key, cmd->count, EAGER_W_COPY);
		it->flags |= DPA_ITEM_COPIED;
	}
	return work + dpa_eager_credit(eng, op, i, hal, p);
}

static int eager_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			  struct dpa_hal *hal)
{
	return dpa_eager_item_step(eng, op, i, hal, op->cmd.count, self_step, recv_step);
}

/* Sent everything, and waits for nothing but the peers' headers (none passed on): the op
 * can copy out only once all are in. Anything else (a credit, a fallback, a write in
 * flight, a copy that may run) may move on with any event. */
uint32_t dpa_eager_events_needed(const struct dpa_op *op)
{
	uint32_t need = 0, pending = __atomic_load_n(&op->alg.hdr_pending, __ATOMIC_SEQ_CST);

	for (uint32_t i = 1; i < op->nitems; i++) {
		const struct dpa_item *it = &op->items[i];
		uint32_t f = off_read_once(&it->flags);

		if (f & DPA_ITEM_FINISHED)
			continue;
		if (!(f & DPA_ITEM_SIGNALED) || (f & DPA_ITEM_FALLBACK) ||
		    off_read_once(&it->inflight))
			return 1;
		if (!(f & DPA_ITEM_JUDGED))
			need++;
		else if (!pending || (f & DPA_ITEM_COPIED))
			return 1;  /* its copy or its credit may go now */
	}
	return need ? need : 1;
}

const struct dpa_algo dpa_algo_alltoall_eager = {
	.start = eager_start,
	.progress = eager_progress,
	.abort = dpa_eager_abort,
	.events_needed = dpa_eager_events_needed,
	.carries_sig = 1,
};

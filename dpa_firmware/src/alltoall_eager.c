/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All-to-all, eager, for blocks of at most eager_max bytes (<= OFFLOAD_EAGER_BYTES), as an
 * MPI shared-memory FIFO or DeepEP's low-latency buffers do it: no ready round trip. Each
 * rank's control region holds per team and source OFFLOAD_EAGER_SLOTS slots; a sender
 * writes its block into its slot at the receiver (slot = op seq % slots), then the slot's
 * word (seq, length) behind it on the same queue, which wakes the receiver. The receiver
 * copies the block out into its destination and hands the slot back: it writes the word
 * it consumed into the sender's eager_credit. A sender reuses a slot only once the word
 * of the slot's previous eager op came back, so a fast sender never overruns a slow
 * receiver. One message each way per pair and op, against the rendezvous' three.
 *
 * Item j exchanges with team peer me + j both ways (item 0: our own block), so that every
 * write of an item goes to that peer (the copy out goes to ourselves: DPA_WR_DATA_SELF).
 * An item has one data write in flight at a time, and `round` says which.
 *
 * Every rank picks this algorithm from the block size alone (engine.c). A peer that runs
 * another op at this sequence (another size, all-to-all-v) shows it with a ready or a
 * count of this op in our control region: we then answer it as a refusing rendezvous peer
 * would (a refused ready, an error done signal, and its done signal taken), so both sides
 * fail at once and the done counters stay in step.
 */
#include "engine_internal.h"

#define DPA_EAGER_CREDIT_POLL_NS 20000u  /* credits wake nobody: look again this often */

enum eager_write {
	EAGER_W_NONE = 0,
	EAGER_W_BLOCK,   /* our block into the peer's slot (item 0: into our dst) */
	EAGER_W_COPY,    /* the peer's block out of its slot here into our dst */
	EAGER_W_CREDIT,  /* the consumed slot's word back to the peer */
};

static uint32_t eager_slot(const struct dpa_op *op)
{
	return op->seq % OFFLOAD_EAGER_SLOTS;
}

static int eager_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *cmd = &op->cmd;
	uint64_t total;

	(void)hal;
	if (cmd->flags || __builtin_mul_overflow(cmd->count, team->size, &total) ||
	    (total && (!cmd->src_addr || !cmd->dst_addr || cmd->dst_len < total)))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	else
		op->result0 = total;
	/* Intake runs ops in sequence order: the slot's previous eager op is known here. */
	op->eager_prev = team->eager_last[eager_slot(op)];
	team->eager_last[eager_slot(op)] = op->seq;
	return (int)team->size;
}

/* A data write of item i to team peer `peer` (the copy out: to ourselves). */
static int eager_write(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		       uint32_t peer, uint64_t laddr, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		       uint64_t len, enum eager_write what)
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
static void settle(struct dpa_item *it)
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
	const struct offload_ctrl_team *ctrl = dpa_my_ctrl(hal, op->team_id);
	uint32_t k = eager_slot(op), prev = op->eager_prev;
	/* Pairs with the peer's credit write (a plain RDMA write of the consumed word). */
	uint32_t back = OFFLOAD_EAGER_SEQ(off_load_acquire(&ctrl->eager_credit[k][peer]));

	return !prev || (int32_t)(back - prev) >= 0 || team->eager_skip[k][peer] == prev;
}

/* Item 0: our own block, src to dst, with no slot in between. */
static int self_step(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct dpa_item *it = &op->items[0];
	const struct offload_cmd *cmd = &op->cmd;
	uint64_t off = (uint64_t)eng->teams[op->team_id].my_rank * cmd->count;

	if (!(it->flags & DPA_ITEM_PUT) && !op->refuse && cmd->count)
		return eager_write(eng, op, 0, hal, eng->teams[op->team_id].my_rank,
				   cmd->src_addr + off, cmd->src_key, cmd->dst_addr + off,
				   cmd->dst_key, cmd->count, EAGER_W_BLOCK);
	it->flags |= DPA_ITEM_PUT | DPA_ITEM_SIGNALED | DPA_ITEM_RECVD | DPA_ITEM_FINISHED;
	return 1;
}

/* The slot's word at peer p, behind the block: a logged control word, so that a failed
 * rail sends it again. Returns DPA_HAL_EAGAIN, or 0 once posted (or failed for good). */
static int post_word(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t p,
		     uint64_t word)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *peer = &team->peers[p];
	struct dpa_ctrl_msg m = {
		.wr_id = dpa_wr_id(op, p, DPA_WR_EAGER),
		.raddr = peer->ctrl_addr + dpa_ctrl_eager_off(op->team_id, team->my_rank,
							      eager_slot(op)),
		.value = word, .peer = peer->world_rank, .rkey = peer->ctrl_key,
		.kind = DPA_WR_EAGER, .len = 0, .seq_off = offsetof(struct offload_eager_slot, word),
	};
	int rc = dpa_ctrl_post(eng, hal, &m);

	if (rc == DPA_HAL_EAGAIN)
		return rc;
	if (rc == OFFLOAD_ERR_LINK_DOWN)
		dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, peer->world_rank);
	else if (rc)
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, peer->world_rank);
	return 0;
}

/* Our block to peer p: into its slot, then the slot's word. A failed op sends the word
 * alone, marked as an error. */
static int send_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		     uint32_t p)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *peer = &team->peers[p];
	struct dpa_item *it = &op->items[i];
	const struct offload_cmd *cmd = &op->cmd;
	int err = op->refuse || (it->flags & DPA_ITEM_FAILED);

	if (dpa_peer_gone(eng, op, peer->world_rank)) {
		it->flags |= DPA_ITEM_SIGNALED;  /* nobody to tell */
		return 1;
	}
	if (!credit_ok(eng, op, hal, p)) {
		dpa_wake_at(eng, hal, dpa_hal_time_ns(hal) + DPA_EAGER_CREDIT_POLL_NS);
		return 0;
	}
	if (!err && !(it->flags & DPA_ITEM_PUT)) {
		if (cmd->count)
			return eager_write(eng, op, i, hal, p, cmd->src_addr + (uint64_t)p * cmd->count,
					   cmd->src_key,
					   peer->ctrl_addr + dpa_ctrl_eager_off(op->team_id, team->my_rank,
										eager_slot(op)) +
					   offsetof(struct offload_eager_slot, data),
					   peer->ctrl_key, cmd->count, EAGER_W_BLOCK);
		it->flags |= DPA_ITEM_PUT;
	}
	if (post_word(eng, op, hal, p, OFFLOAD_EAGER_WORD(op->seq, err ? 0 : cmd->count) |
				      (err ? OFFLOAD_EAGER_ERROR : 0)) == DPA_HAL_EAGAIN)
		return 0;
	it->flags |= DPA_ITEM_SIGNALED;
	return 1;
}

/*
 * An aborted op (cancel, op_timeout, a lost peer): a peer that has not taken our block yet
 * (no credit for this op) finds an error word instead, and fails at once when it posts
 * its part, instead of completing against a rank that gave up. A slot still holding the
 * previous op's block (its credit not back) is left alone: that op may still complete.
 */
static int eager_abort(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_ctrl_team *ctrl = dpa_my_ctrl(hal, op->team_id);
	uint32_t p = (team->my_rank + i) % team->size;
	struct dpa_item *it = &op->items[i];

	if (i == 0 || dpa_peer_gone(eng, op, team->peers[p].world_rank))
		return 0;
	if (it->flags & DPA_ITEM_SIGNALED) {
		if (OFFLOAD_EAGER_SEQ(off_load_acquire(&ctrl->eager_credit[eager_slot(op)][p])) ==
		    op->seq)
			return 0;  /* it took the block already */
	} else if (!credit_ok(eng, op, hal, p)) {
		return 0;
	}
	return post_word(eng, op, hal, p, OFFLOAD_EAGER_WORD(op->seq, 0) | OFFLOAD_EAGER_ERROR);
}

/* Does peer p run another op at this sequence? Its ready, or its count, says so. */
static int32_t other_op(const struct offload_ctrl_team *ctrl, const struct dpa_op *op, uint32_t p)
{
	const struct offload_ready *r = &ctrl->ready[op->slot][p];

	/* Pairs with the peer's seq write, which follows the body on the same queue. */
	if (off_load_acquire(&r->seq) == op->seq)
		return r->flags & OFFLOAD_READY_REFUSED ? OFFLOAD_ERR_PEER_OP : OFFLOAD_ERR_INVALID;
	if (off_load_acquire(&ctrl->counts[op->slot][p].seq) == op->seq)
		return OFFLOAD_ERR_PEER_OP;  /* it counts (all-to-all-v) and refuses our ready */
	return OFFLOAD_OK;
}

/* Peer p runs another op: what its rendezvous protocol waits for from us (a ready, which
 * we refuse, and a done signal, an error), and the done signal it sends us in turn. */
static int fallback_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal, uint32_t p)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	int work = 0;

	if (!(it->flags & DPA_ITEM_STARTED)) {
		dpa_expect_done(eng, op, it, p);
		it->flags |= DPA_ITEM_STARTED;
		work++;
	}
	if (!(it->flags & DPA_ITEM_READY_OUT)) {
		if (dpa_publish_ready(eng, op, hal, p, 0, 0,
				      OFFLOAD_READY_REFUSED | OFFLOAD_READY_FIXED) == DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_READY_OUT;
		work++;
	}
	if (!(it->flags & DPA_ITEM_FB_SIGNAL)) {
		if (dpa_signal_done(eng, op, hal, p, 1) == DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_FB_SIGNAL;
		work++;
	}
	if (!dpa_check_done(eng, op, hal, it, p) &&
	    !dpa_peer_gone(eng, op, team->peers[p].world_rank))
		return work;
	/* It never reads what we wrote into its slot: the slot is ours again. */
	team->eager_skip[eager_slot(op)][p] = op->seq;
	it->flags |= DPA_ITEM_RECVD;
	return work + 1;
}

/* Peer p's block: copy it out of its slot here, then hand the slot back. */
static int recv_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		     uint32_t p)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *me = &team->peers[team->my_rank], *peer = &team->peers[p];
	struct dpa_item *it = &op->items[i];
	const struct offload_cmd *cmd = &op->cmd;
	uint64_t off = dpa_ctrl_eager_off(op->team_id, p, eager_slot(op));
	const struct offload_eager_slot *slot = dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL, off,
								  sizeof(*slot));
	uint64_t word;
	int32_t why;

	if (it->flags & DPA_ITEM_FALLBACK)
		return fallback_step(eng, op, i, hal, p);
	if (!(it->flags & DPA_ITEM_COPIED)) {
		/* Pairs with the sender's word write, which follows its block on one queue. */
		word = off_load_acquire(&slot->word);
		if (OFFLOAD_EAGER_SEQ(word) != op->seq) {
			why = other_op(dpa_my_ctrl(hal, op->team_id), op, p);
			if (why) {
				dpa_op_fail(op, why, peer->world_rank);
				it->flags |= DPA_ITEM_FALLBACK;
				return 1 + fallback_step(eng, op, i, hal, p);
			}
			if (!dpa_peer_gone(eng, op, peer->world_rank))
				return 0;
			it->flags |= DPA_ITEM_RECVD;
			return 1;
		}
		if (word & OFFLOAD_EAGER_ERROR)
			dpa_op_fail(op, OFFLOAD_ERR_PEER_OP, peer->world_rank);
		else if (OFFLOAD_EAGER_LEN(word) != cmd->count)
			/* The ranks disagree on the block size: take nothing. */
			dpa_op_fail(op, OFFLOAD_ERR_INVALID, peer->world_rank);
		else if (!op->refuse && cmd->count)
			return eager_write(eng, op, i, hal, team->my_rank,
					   me->ctrl_addr + off + offsetof(struct offload_eager_slot, data),
					   me->ctrl_key, cmd->dst_addr + (uint64_t)p * cmd->count,
					   cmd->dst_key, cmd->count, EAGER_W_COPY);
		it->flags |= DPA_ITEM_COPIED;
	}
	/* The credit is the slot's word itself, read from our control region by the write. */
	return eager_write(eng, op, i, hal, p, me->ctrl_addr + off, me->ctrl_key,
			   peer->ctrl_addr + dpa_ctrl_credit_off(op->team_id, eager_slot(op),
								 team->my_rank),
			   peer->ctrl_key, sizeof(uint64_t), EAGER_W_CREDIT);
}

static int eager_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			  struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t p = (team->my_rank + i) % team->size;
	int work = 0;

	if (it->inflight)
		return 0;  /* its completion comes with the next poll */
	if (it->round != EAGER_W_NONE) {
		settle(it);
		work++;
	}
	if (i == 0)
		return work + self_step(eng, op, hal);
	if (!(it->flags & DPA_ITEM_SIGNALED))
		work += send_step(eng, op, i, hal, p);
	if (!it->inflight && !(it->flags & DPA_ITEM_RECVD))
		work += recv_step(eng, op, i, hal, p);
	if ((it->flags & DPA_ITEM_SIGNALED) && (it->flags & DPA_ITEM_RECVD) && !it->inflight)
		it->flags |= DPA_ITEM_FINISHED;
	return work;
}

/* Sent everything, and waits for nothing but the peers' words (none passed on): the op
 * completes only once all are in. Anything else (a credit, a fallback, a write in flight)
 * may move on with any event. */
static uint32_t eager_events_needed(const struct dpa_op *op)
{
	uint32_t need = 0;

	for (uint32_t i = 1; i < op->nitems; i++) {
		const struct dpa_item *it = &op->items[i];
		uint32_t f = off_read_once(&it->flags);

		if (f & DPA_ITEM_FINISHED)
			continue;
		if (!(f & DPA_ITEM_SIGNALED) || (f & (DPA_ITEM_COPIED | DPA_ITEM_FALLBACK)) ||
		    off_read_once(&it->inflight))
			return 1;
		need++;
	}
	return need ? need : 1;
}

const struct dpa_algo dpa_algo_alltoall_eager = {
	.name = "alltoall_eager",
	.start = eager_start,
	.progress = eager_progress,
	.abort = eager_abort,
	.events_needed = eager_events_needed,
};

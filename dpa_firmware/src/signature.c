/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gate every op passes before its algorithm runs. At intake a rank publishes the op's
 * signature (struct offload_sig: which collective and mode, root, block size, the team as
 * it built it) into every member's control region, ahead of any other word of the op on
 * the same queue. Item i judges member me + i's signature; only once every member's agreed
 * do the items run the algorithm. Hence:
 *  - ranks that post different collectives, roots or sizes at the same point of a team's
 *    sequence all see a signature that differs (each one differs from some other), fail
 *    the op naming what differs, and move nothing: no ready is trusted, no data written,
 *    no done signal sent, so the team's words stay in step and its next op pairs up;
 *  - a member that died or closed its context before joining the op fails it here (it
 *    never joins: waiting on it would wait for op_timeout);
 *  - a barrier is nothing more than this gate (barrier.c).
 * One round of n - 1 control words per op and rank; the readies and counts the algorithm
 * publishes at intake travel in the same round.
 *
 * An eager all-to-all (alltoall_eager.c) has no such round, which would double its one-way
 * latency: its signature is the header of each block's slot, and its items judge a peer's
 * with dpa_sig_judge() when they take the block, before copying anything out. Against a
 * peer that runs a gated op at the same point (its signature is here, not a slot header),
 * the eager item fails naming it and posts our signature to it, so that its gate fails
 * naming us: both at once, with the same messages, and nothing moved on either side.
 *
 * Nobody acknowledges a signature, so a member must not overwrite one another member has
 * not read: words are kept per seq % OFFLOAD_SIG_WINDOW (two op windows). To post op
 * s + 2W, a rank needs its op s + W completed, hence peer q's signature for s + W, which q
 * posts only once it took op s + W, that is once its op s completed, past its gate, where
 * it read our signature for s.
 */
#include "engine_internal.h"
#include "signature.h"

uint32_t dpa_team_fp(uint32_t team_id, uint32_t size, const struct offload_peer *peers)
{
	uint32_t h = 2166136261u;  /* FNV-1a: cheap, order-sensitive */
	uint32_t words[2] = { team_id, size };

	for (uint32_t i = 0; i < 2 + size; i++) {
		uint32_t w = i < 2 ? words[i] : peers[i - 2].world_rank;

		for (uint32_t b = 0; b < 4; b++) {
			h ^= (w >> (8 * b)) & 0xffu;
			h *= 16777619u;
		}
	}
	return h;
}

void dpa_sig_init(struct dpa_engine *eng, struct dpa_op *op)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *cmd = &op->cmd;
	uint32_t reduction = cmd->opcode == OFFLOAD_OP_REDUCE_SCATTER ||
			     cmd->opcode == OFFLOAD_OP_ALLREDUCE;
	uint32_t sized = cmd->opcode == OFFLOAD_OP_ALLTOALL || cmd->opcode == OFFLOAD_OP_BROADCAST ||
			 cmd->opcode == OFFLOAD_OP_ALLGATHER || reduction;
	/* Modes the receiver's side depends on; rows gathered by index concern the sender only. */
	uint32_t mode = cmd->opcode == OFFLOAD_OP_ALLTOALLV ?
			cmd->flags & (OFFLOAD_CMD_F_SLOTS | OFFLOAD_CMD_F_PLACE) : 0;

	op->sig = (struct offload_sig){
		.op = cmd->opcode | mode << OFFLOAD_SIG_MODE_SHIFT,
		.root = cmd->opcode == OFFLOAD_OP_BROADCAST || reduction ? cmd->root : 0,
		.size = sized ? cmd->count : 0,
		.team_fp = team->fp,
		.world_rank = team->peers[team->my_rank].world_rank,
		.seq = op->seq,
	};
}

static int sig_post(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t me = team->my_rank;

	return dpa_post_sequenced(eng, op, hal, (me + i) % team->size,
				  dpa_ctrl_sig_off(eng, op->team_id, op->seq, me), &op->sig,
				  offsetof(struct offload_sig, seq), offsetof(struct offload_sig, seq),
				  DPA_WR_SIG);
}

int dpa_sig_post_once(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i)
{
	struct dpa_item *it = &op->items[i];

	if (it->flags & DPA_ITEM_SIG_OUT)
		return 0;
	if (sig_post(eng, op, hal, i) == DPA_HAL_EAGAIN)
		return DPA_HAL_EAGAIN;
	it->flags |= DPA_ITEM_SIG_OUT;
	return 1;
}

/* The first difference of theirs from ours, as enum offload_mismatch (0: none), with both
 * values. The team comes first: with another team, nothing else compares. The protocol
 * (eager or not) comes last: ranks whose sizes differ across eager_max differ in size, and
 * only ranks that agree on everything else differ in their eager_max. */
static uint32_t differs(const struct offload_sig *ours, const struct offload_sig *theirs,
			uint32_t world, uint64_t *mine, uint64_t *other)
{
	const uint32_t eager = OFFLOAD_SIG_EAGER << OFFLOAD_SIG_MODE_SHIFT;

	if (theirs->team_fp != ours->team_fp || theirs->world_rank != world) {
		*mine = ours->team_fp;
		*other = theirs->team_fp;
		return OFFLOAD_MISMATCH_TEAM;
	}
	if ((theirs->op & ~eager) != (ours->op & ~eager)) {
		*mine = ours->op;
		*other = theirs->op;
		return OFFLOAD_MISMATCH_OP;
	}
	if (theirs->root != ours->root) {
		*mine = ours->root;
		*other = theirs->root;
		return OFFLOAD_MISMATCH_ROOT;
	}
	if (theirs->size != ours->size) {
		*mine = ours->size;
		*other = theirs->size;
		return OFFLOAD_MISMATCH_SIZE;
	}
	if (theirs->op != ours->op) {
		*mine = ours->op;
		*other = theirs->op;
		return OFFLOAD_MISMATCH_OP;
	}
	return 0;
}

int dpa_sig_judge(struct dpa_op *op, const struct offload_sig *theirs, uint32_t world)
{
	uint64_t mine = 0, other = 0, none = 0;
	/* Copy the body once: the peer may not write it again for this seq, but read it in
	 * one go all the same (a forged one is judged like any other). */
	struct offload_sig copy = *theirs;
	uint32_t what = differs(&op->sig, &copy, world, &mine, &other);

	if (!what)
		return 1;
	if (off_cas(&op->fail, &none, ((uint64_t)world << 32) | (uint32_t)OFFLOAD_ERR_MISMATCH)) {
		op->result0 = ((uint64_t)what << OFFLOAD_MISMATCH_SHIFT) |
			      (mine & ((1ull << OFFLOAD_MISMATCH_SHIFT) - 1));
		op->result1 = other;
	}
	return 0;
}

/* Peer p (item i's) started an agreement (create_team, shrink) that we have not, before
 * it took this op: the op fails naming it, unless a failure explains it (dpa_out_of_step;
 * the sibling check is in agree_ft.c). p's proposal carries its team sequence when it
 * started, so no ordering between queues is assumed. */
static int in_agreement(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint32_t i, uint32_t p)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_agree_word *w =
		dpa_my_word(eng, hal, op->team_id, offload_ctrl_agree_prop_in(team->size, p),
			    sizeof(struct offload_agree_word));
	uint64_t none = 0;

	if (off_load_acquire(&w->epoch) != off_read_once(&eng->agree[op->team_id].epoch) + 1 ||
	    w->extra > op->seq || !dpa_out_of_step(eng, hal, team, &op->items[i].oos_since))
		return 0;
	if (off_cas(&op->fail, &none, ((uint64_t)team->peers[p].world_rank << 32) |
		    (uint32_t)OFFLOAD_ERR_MISMATCH)) {
		op->result0 = (uint64_t)OFFLOAD_MISMATCH_OP << OFFLOAD_MISMATCH_SHIFT | op->sig.op;
		op->result1 = OFFLOAD_OP_AGREE;
	}
	return 1;
}

const struct offload_sig *dpa_sig_gated(struct dpa_engine *eng, struct dpa_hal *hal,
				       uint32_t team_id, uint32_t seq, uint32_t p)
{
	const struct offload_sig *theirs = dpa_my_sig(eng, hal, team_id, seq, p);

	/* Pairs with the writer's seq, written after the body on the same queue. */
	return off_load_acquire(&theirs->seq) == seq ? theirs : NULL;
}

int dpa_sig_eager(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team_id, uint32_t seq,
		  uint32_t p, struct offload_sig *out)
{
	const struct offload_eager_slot *slot;

	/* Eager slots exist for teams of at most OFFLOAD_EAGER_MAX_TEAM members only. */
	if (eng->teams[team_id].size > OFFLOAD_EAGER_MAX_TEAM)
		return 0;
	slot = dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL,
				  dpa_ctrl_eager_off(eng, team_id, p, seq % OFFLOAD_EAGER_SLOTS),
				  sizeof(*slot));

	/* Pairs with the writer's seq word, written after the header on the same queue. */
	if (OFFLOAD_EAGER_SEQ(off_load_acquire(&slot->sig.seq)) != seq)
		return 0;
	*out = slot->sig;
	/* A reader that never hands the slot back (not eager itself) may find the next op's
	 * header written meanwhile: the copy counts only if the seq word still says ours. */
	off_fence();
	return OFFLOAD_EAGER_SEQ(off_read_once(&slot->sig.seq)) == seq;
}

int dpa_sig_absent(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i,
		   uint32_t p)
{
	const struct dpa_team *team = &eng->teams[op->team_id];

	if (in_agreement(eng, op, hal, i, p))
		return 1;
	if (op->items[i].oos_since)
		return 0;  /* p ran an agreement instead: settle that first (it may close) */
	/* It never joined this op (dead, closed), or our word did not reach it. */
	return dpa_peer_gone(eng, op, hal, team->peers[p].world_rank);
}

int dpa_sig_step(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t p = (team->my_rank + i) % team->size, world = team->peers[p].world_rank;
	const struct offload_sig *theirs = dpa_sig_gated(eng, hal, op->team_id, op->seq, p);
	struct offload_sig eager;
	int work;

	work = dpa_sig_post_once(eng, op, hal, i);
	if (work == DPA_HAL_EAGAIN)
		return 0;
	if (theirs) {
		if (!dpa_sig_judge(op, theirs, world))
			__atomic_store_n(&op->gate_fail, 1, __ATOMIC_SEQ_CST);
	} else if (dpa_sig_eager(eng, hal, op->team_id, op->seq, p, &eager)) {
		/* p runs an eager op here: its slot header is its signature, and ours differs
		 * (we are gated), so the gate fails; it sees ours and fails too. */
		if (!dpa_sig_judge(op, &eager, world))
			__atomic_store_n(&op->gate_fail, 1, __ATOMIC_SEQ_CST);
	} else if (dpa_sig_absent(eng, op, hal, i, p)) {
		__atomic_store_n(&op->gate_fail, 1, __ATOMIC_SEQ_CST);
	} else {
		return work;
	}
	it->flags |= DPA_ITEM_SIG_IN;
	/* The last judgement opens the gate (or fails it) for items on sibling threads. */
	int sole = dpa_hal_num_threads(hal) == 1;

	if (off_count_down(&op->sig_pending, sole) == 0 && !sole)
		dpa_hal_notify(hal);
	return work + 1;
}

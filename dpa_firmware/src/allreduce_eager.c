/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Allreduce, eager, for vectors of at most eager_max bytes (<= OFFLOAD_EAGER_BYTES) in
 * teams of at most OFFLOAD_EAGER_MAX_TEAM: every rank writes its whole vector into every
 * peer's eager slot for it (the eager all-to-all's protocol, eager.h: header = our
 * signature, judged as the gate would; slots handed back by credit), and its own into its
 * slot for itself, then reduces the n vectors itself, element by element in the order of
 * reduce.h (order block g: x[g-1] (+) x[g-2] ... (+) x[g]), so that the result is bit for
 * bit the rendezvous allreduce's (allreduce.c) and gloo's. One message each way per pair
 * against allreduce.c's push, two signal rounds and a read; no scratch.
 *
 * The n slots of one slot index lie at a fixed stride in our control region, ordered by
 * source: the kernel reads them as its n operands and writes the result over our own
 * (a tile is read whole before it is stored), which item 0 then writes into dst.
 *
 * Item 0: our vector into our own slot (once the slot's previous eager allreduce
 * finished: no peer credits it), reduce once every header agreed, the result into dst.
 * Item j (peer me + j): send our vector and header, judge its header, and hand its slot
 * back once item 0 reduced (or gave up). A mismatch, a failed peer or a refused command
 * reduces nothing and copies nothing.
 */
#include "eager.h"
#include "reduce.h"

static int are_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *c = &op->cmd;
	uint32_t es = dpa_dtype_size(OFFLOAD_REDOP_DT(c->root)), k = dpa_eager_slot(op);

	(void)hal;
	/* The host never sends more than its eager_max here (ar_select); a forged command
	 * is refused, moving nothing. */
	if (team->size > OFFLOAD_EAGER_MAX_TEAM || c->flags || !dpa_redop_valid(c->root) ||
	    c->count % es || c->count > OFFLOAD_EAGER_BYTES ||
	    (c->count && (!c->src_addr || !c->dst_addr || c->dst_len < c->count)))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	dpa_eager_begin(eng, op);
	op->alg.eager_self_prev = team->eager_self_last[k];
	team->eager_self_last[k] = op->seq;
	return (int)team->size;
}

static int usable(const struct dpa_op *op)
{
	return dpa_eager_copies_allowed(op) == 1 && !off_load_acquire(&op->fail) && op->cmd.count;
}

/* The n slots of this op, from source 0, and the distance between them. */
static uint8_t *slots_data(struct dpa_engine *eng, const struct dpa_op *op, struct dpa_hal *hal,
			   uint64_t *stride)
{
	uint32_t n = eng->teams[op->team_id].size;
	uint64_t first = dpa_ctrl_eager_off(eng, op->team_id, 0, dpa_eager_slot(op));

	*stride = dpa_ctrl_eager_off(eng, op->team_id, 1, dpa_eager_slot(op)) - first;
	first += offsetof(struct offload_eager_slot, data);
	return dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL, first, (n - 1) * *stride + op->cmd.count);
}

/* In the order of reduce.h, over gloo's order blocks, the result over our own slot. */
static void reduce_slots(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t n = team->size, es = dpa_dtype_size(OFFLOAD_REDOP_DT(op->cmd.root));
	uint64_t stride, t = op->cmd.count, order = dpa_order_block(t, es, n);
	uint8_t *base = slots_data(eng, op, hal, &stride);

	if (!base) {
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, team->peers[team->my_rank].world_rank);
		return;
	}
	for (uint64_t off = 0, g = 0; off < t; off += order, g++)
		dpa_reduce(op->cmd.root, n, (uint32_t)((g + n - 1) % n), base + off, stride,
			   base + (uint64_t)team->my_rank * stride + off,
			   (t - off < order ? t - off : order) / es);
}

/* Is it our turn at our own slot: has every earlier op of the slot finished with it? */
static int self_ok(const struct dpa_engine *eng, const struct dpa_op *op)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t prev = op->alg.eager_self_prev;
	uint32_t done = __atomic_load_n(&team->eager_self_done[dpa_eager_slot(op)],
					__ATOMIC_ACQUIRE);

	/* An op that an abort finished before its turn never wrote the slot and published
	 * nothing: the turn passes over it to its own predecessor. Only on a poisoned team
	 * (an abort poisons first), which takes no op again, so that op's slot in the window
	 * still holds it, FREE or not. */
	while (prev && (int32_t)(done - prev) < 0 && off_load_acquire(&team->poisoned)) {
		const struct dpa_op *p = &eng->ops[op->team_id * OFFLOAD_OP_WINDOW +
						   prev % OFFLOAD_OP_WINDOW];

		if (p->seq != prev || !__atomic_load_n(&p->alg.eager_self_early, __ATOMIC_ACQUIRE))
			return 0;
		prev = p->alg.eager_self_prev;
	}
	return !prev || (int32_t)(done - prev) >= 0;
}

static int self_step(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *me = &team->peers[team->my_rank];
	struct dpa_item *it = &op->items[0];
	uint64_t mine = me->ctrl_addr + dpa_ctrl_eager_off(eng, op->team_id, team->my_rank,
							   dpa_eager_slot(op)) +
			offsetof(struct offload_eager_slot, data);

	if (!(it->flags & DPA_ITEM_PUT)) {
		/* Even a refused op waits its turn: the slot's ops finish in order. */
		if (!self_ok(eng, op)) {
			dpa_wake_at(eng, hal, dpa_hal_time_ns(hal) + DPA_EAGER_CREDIT_POLL_NS);
			return 0;
		}
		if (!op->refuse && op->cmd.count)
			return dpa_eager_write(eng, op, 0, hal, team->my_rank, op->cmd.src_addr,
					       op->cmd.src_key, mine, me->ctrl_key, op->cmd.count,
					       EAGER_W_BLOCK);
		it->flags |= DPA_ITEM_PUT;
	}
	if (!__atomic_load_n(&op->alg.eager_reduced, __ATOMIC_ACQUIRE)) {
		if (dpa_eager_copies_allowed(op) < 0)
			return 0;
		if (usable(op))
			reduce_slots(eng, op, hal);
		__atomic_store_n(&op->alg.eager_reduced, 1, __ATOMIC_RELEASE);
		dpa_hal_notify(hal);  /* items on sibling threads wait for it to hand slots back */
		return 1;
	}
	if (!(it->flags & DPA_ITEM_COPIED)) {
		if (usable(op))
			return dpa_eager_write(eng, op, 0, hal, team->my_rank, mine, me->ctrl_key,
					       op->cmd.dst_addr, op->cmd.dst_key, op->cmd.count,
					       EAGER_W_COPY);
		it->flags |= DPA_ITEM_COPIED;
	}
	it->flags |= DPA_ITEM_SIGNALED | DPA_ITEM_RECVD | DPA_ITEM_FINISHED;
	return 1;
}

/* Peer p's slot: judged, then handed back once item 0 has read it. */
static int recv_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		     uint32_t p)
{
	struct dpa_item *it = &op->items[i];
	int work = dpa_eager_judge(eng, op, i, hal, p);

	if (!(it->flags & DPA_ITEM_JUDGED) || (it->flags & (DPA_ITEM_RECVD | DPA_ITEM_FALLBACK)))
		return work;
	if (!__atomic_load_n(&op->alg.eager_reduced, __ATOMIC_ACQUIRE))
		return work;
	it->flags |= DPA_ITEM_COPIED;  /* for events_needed: its credit may go now */
	return work + dpa_eager_credit(eng, op, i, hal, p);
}

static int are_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	return dpa_eager_item_step(eng, op, i, hal, 0, self_step, recv_step);  /* one vector for all */
}

/* Every item is done (nothing in flight): our own slot is free for the slot's next op, if
 * it was ours. An op aborted before its turn must not say so while an earlier op may still
 * reduce in the slot (the next one would write over that op's vector): it marks itself
 * passed over instead (self_ok). */
static void are_finish(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct dpa_team *team = &eng->teams[op->team_id];

	(void)hal;
	if (self_ok(eng, op))
		__atomic_store_n(&team->eager_self_done[dpa_eager_slot(op)], op->seq,
				 __ATOMIC_RELEASE);
	else
		__atomic_store_n(&op->alg.eager_self_early, 1, __ATOMIC_RELEASE);
}

const struct dpa_algo dpa_algo_allreduce_eager = {
	.start = are_start,
	.progress = are_progress,
	.abort = dpa_eager_abort,
	.events_needed = dpa_eager_events_needed,
	.finish = are_finish,
	.carries_sig = 1,
};

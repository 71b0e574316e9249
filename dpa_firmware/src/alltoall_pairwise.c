/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All-to-all, pairwise exchange. Item i of an op covers step i of the pairwise order:
 * this rank sends its block to (me + i) and receives from (me - i). Items are striped
 * over the DPA threads, so up to num_threads peers move data at once (a2a_window blocks
 * per thread when paced). Every block has
 * the same size, so each receiver knows its layout up front and publishes all its readies
 * at intake; the rest is the shared exchange step (p2p.c).
 */
#include "eager.h"
#include "engine_internal.h"
#include "p2p.h"

static int publish(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t src)
{
	if (op->refuse)
		return dpa_publish_ready(eng, op, hal, src, 0, 0,
					 OFFLOAD_READY_REFUSED | OFFLOAD_READY_FIXED);
	return dpa_publish_ready(eng, op, hal, src, op->cmd.dst_addr + (uint64_t)src * op->cmd.count,
				 op->cmd.count, OFFLOAD_READY_FIXED);
}

static int a2a_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *cmd = &op->cmd;
	uint32_t n = team->size, me = team->my_rank;
	uint64_t total;

	if (cmd->flags || __builtin_mul_overflow(cmd->count, n, &total) ||
	    (total && (!cmd->src_addr || !cmd->dst_addr || cmd->dst_len < total)))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	else
		op->result0 = total;
	/* Readies go out here in pairwise order, so that senders can start as soon as they
	 * see them; one that found the queue full is published by its item's owner. */
	for (uint32_t i = 0; i < n; i++) {
		if (publish(eng, op, hal, (me + n - i) % n) == DPA_HAL_EAGAIN)
			break;
		op->items[i].flags |= DPA_ITEM_READY_OUT;
	}
	return (int)n;
}

/*
 * A thread looks for one source's done signal per pass, its first item's whose signal is
 * not in (the cursor), not every item's: sources send in pairwise order, so the signals
 * come in about the order of the items, and a pass that finds the cursor's moves on to
 * the next item's in the same pass (items are visited in order). A signal that came early
 * waits in its word until the cursor reaches it, which delays nothing: the op completes
 * on its last signal either way. At n ranks and T threads that is one control word read
 * per pass instead of n / T.
 */
static int recv_due(struct dpa_op *op, uint32_t i, uint32_t nthreads)
{
	uint32_t me = i % nthreads, k;

	if (me >= OFFLOAD_MAX_THREADS)
		return 1;
	k = op->alg.a2a_recv_from[me] > me ? op->alg.a2a_recv_from[me] : me;
	while (k < op->nitems && (op->items[k].flags & (DPA_ITEM_RECVD | DPA_ITEM_FINISHED)))
		k += nthreads;
	op->alg.a2a_recv_from[me] = k;
	return i <= k;
}

static int a2a_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t dst = (team->my_rank + i) % team->size;
	uint64_t count = op->cmd.count;
	struct dpa_send send = { .addr = op->cmd.src_addr + (uint64_t)dst * count, .len = count,
				 .fixed = 1 };
	/* Paced (a2a_window): a thread's item starts its block once the one a window before it
	 * (the same thread's) is written and acknowledged, so each thread has at most that many
	 * blocks on the wire; unpaced, every block goes as soon as its ready is in. */
	uint32_t lag = eng->params.a2a_window * dpa_hal_num_threads(hal);
	int work, later = 0;

	send.hold = lag && i >= lag &&
		    !(op->items[i - lag].flags & (DPA_ITEM_SIGNALED | DPA_ITEM_FINISHED | DPA_ITEM_ABORTED));
	/* Our own block (item 0) goes a visit after the peers' blocks, which come next in the
	 * same pass: a peer waits for its block from us, nobody waits for ours (n=2, 1 MiB:
	 * the peer's block went out after a 1 MiB local copy). The deferral is work: the pass
	 * after this one copies it. */
	if (i == 0 && team->size > 1 && !(op->items[0].flags & DPA_ITEM_SELF_LATER)) {
		op->items[0].flags |= DPA_ITEM_SELF_LATER;
		send.hold = later = 1;
	}
	send.recv_later = !recv_due(op, i, dpa_hal_num_threads(hal));
	work = dpa_item_begin(eng, op, i, hal, publish);

	return work < 0 ? later : later + work + dpa_exchange_step(eng, op, i, hal, &send);
}

/* Paced, a thread's items past the first one it has not sent (signaled) plus the window
 * are on hold: once their readies are out (intake posts them, in pairwise order, as far as
 * the queue takes them; the items post the rest) they only wait, for a ready or a done
 * word that stays where it is until this op takes it (the next op of the slot needs this
 * one complete), so a pass need not look at them until the window reaches them. Unpaced:
 * every item moves at once. */
static uint32_t a2a_horizon(const struct dpa_engine *eng, struct dpa_op *op, uint32_t first,
			    uint32_t nthreads)
{
	uint32_t lag = eng->params.a2a_window * nthreads, i = first, me = first % nthreads, r;

	if (!lag || me >= OFFLOAD_MAX_THREADS)
		return op->nitems;
	while (i < op->nitems &&
	       (op->items[i].flags & (DPA_ITEM_SIGNALED | DPA_ITEM_FINISHED | DPA_ITEM_ABORTED)))
		i += nthreads;
	i = i >= op->nitems || op->nitems - i <= lag ? op->nitems : i + lag;
	r = op->alg.a2a_ready_from[me] > first ? op->alg.a2a_ready_from[me] : first;
	while (r < op->nitems && (op->items[r].flags & DPA_ITEM_READY_OUT))
		r += nthreads;
	op->alg.a2a_ready_from[me] = r;
	return r < op->nitems && r >= i ? r + 1 : i;
}

/* Blocks that fit go eagerly (alltoall_eager.c). */
static const struct dpa_algo *a2a_select(const struct dpa_engine_params *p,
					 const struct offload_cmd *cmd, uint32_t team_size)
{
	if (dpa_eager_fits(p, cmd, team_size))
		return &dpa_algo_alltoall_eager;
	return &dpa_algo_alltoall_pairwise;
}

const struct dpa_algo dpa_algo_alltoall_pairwise = {
	.select = a2a_select,
	.start = a2a_start,
	.progress = a2a_progress,
	.horizon = a2a_horizon,
};

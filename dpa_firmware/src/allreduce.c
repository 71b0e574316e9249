/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Allreduce = reduce-scatter (reduce_scatter.c's exchange and reducer, over gloo's block
 * split so that every element's order is one rank's) then an all-gather by RDMA READ:
 * each rank reads every owner's reduced block out of the owner's scratch into its dst.
 *
 * Item i, for peer p = me + i (whose scratch we pushed into, so we know it from its ready):
 *   1. push our block p into p's scratch, take (me - i)'s into ours   (done signal #1)
 *   2. once our block is reduced, tell p                                (done signal #2)
 *   3. once p said its block is reduced, read it into dst             (p's signal #2)
 *   4. tell p we have read it                                          (done signal #3)
 *   5. wait until p has read ours: our scratch is free to go back      (p's signal #3)
 * Each peer's signals to us are posted in this order by one item, so "k signals arrived"
 * means its k-th was posted. In place is safe: the read into block p of dst comes after
 * item i's own push of that block completed (step 1), and nothing else reads dst.
 * A failed op reads nothing and still signals (with the error), so that every peer ends.
 */
#include "eager.h"
#include "reduce.h"

static int ar_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	return dpa_red_start(eng, op, hal);
}

static int ar_signal(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		     uint32_t peer, uint32_t flag, int *work)
{
	struct dpa_item *it = &op->items[(peer + eng->teams[op->team_id].size -
					  eng->teams[op->team_id].my_rank) %
					 eng->teams[op->team_id].size];

	if (it->flags & flag)
		return 1;
	if (dpa_signal_done(eng, op, hal, peer, off_load_acquire(&op->fail) != 0) == DPA_HAL_EAGAIN)
		return 0;
	it->flags |= flag;
	*work += 1;
	return 1;
}

static int ar_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t n = team->size, me = team->my_rank, peer = (me + i) % n;
	uint64_t off, len, stride = dpa_red_stride(eng, op);
	int work = 0;

	if (!dpa_red_push(eng, op, i, hal, &work))
		return work;
	if (i == 0 && !dpa_red_reduce(eng, op, hal, &work))
		return work;
	if (!(off_load_acquire(&op->alg.red_flags) & DPA_RED_REDUCED))
		return work;
	if (!ar_signal(eng, op, hal, peer, DPA_RED_SIG2, &work))
		return work;
	if (!(it->flags & DPA_RED_READ)) {
		if (!dpa_red_heard(eng, op, hal, peer, 2))
			return work;
		dpa_red_block(eng, op, peer, &off, &len);
		/* p's ready named its slot for us: its own block's slot is `peer - me` slots on. */
		if (!op->refuse && !off_load_acquire(&op->fail) &&
		    !dpa_red_read(eng, op, i, hal, peer, it->raddr - me * stride + peer * stride,
				  it->rkey, off, len, &work))
			return work;
		if (it->inflight)
			return work;
		it->flags |= DPA_RED_READ;
		work++;
	}
	if (!ar_signal(eng, op, hal, peer, DPA_RED_SIG3, &work) || !dpa_red_heard(eng, op, hal, peer, 3))
		return work;
	it->flags |= DPA_ITEM_FINISHED;
	return work + 1;
}

/* Vectors that fit go eagerly (allreduce_eager.c), as the all-to-all's blocks do. */
static const struct dpa_algo *ar_select(const struct dpa_engine_params *p,
					const struct offload_cmd *cmd, uint32_t team_size)
{
	if (dpa_eager_fits(p, cmd, team_size))
		return &dpa_algo_allreduce_eager;
	return &dpa_algo_allreduce;
}

const struct dpa_algo dpa_algo_allreduce = {
	.select = ar_select,
	.start = ar_start,
	.progress = ar_progress,
};

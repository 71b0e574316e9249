/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Barrier, dissemination algorithm: in round k this rank signals (me + 2^k) and waits for
 * (me - 2^k); after ceil(log2 n) rounds every rank has heard, transitively, from all.
 * One item, so one thread runs it; the signals are the same done counters all ops use.
 */
#include "engine_internal.h"

static int barrier_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	(void)hal;
	/* A malformed barrier still synchronizes (its peers are waiting), then fails. */
	if (op->cmd.count || op->cmd.src_addr || op->cmd.dst_addr || op->cmd.flags)
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	return 1;
}

static int barrier_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			    struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t n = team->size, me = team->my_rank;
	int work = 0;

	while ((1u << it->round) < n) {
		uint32_t dist = 1u << it->round;
		uint32_t src = (me + n - dist) % n;

		if (!(it->flags & DPA_ITEM_WAITING)) {
			if (dpa_signal_done(eng, op, hal, (me + dist) % n, 0) == DPA_HAL_EAGAIN)
				return work;
			dpa_expect_done(eng, op, it, src);
			it->flags |= DPA_ITEM_WAITING;
			work++;
		}
		if (!dpa_check_done(eng, op, hal, it, src) &&
		    !dpa_peer_gone(eng, op, team->peers[src].world_rank))
			return work;
		it->flags &= ~DPA_ITEM_WAITING;
		it->round++;
		work++;
	}
	it->flags |= DPA_ITEM_FINISHED;
	return work + 1;
}

const struct dpa_algo dpa_algo_barrier_dissemination = {
	.name = "barrier_dissemination",
	.start = barrier_start,
	.progress = barrier_progress,
};

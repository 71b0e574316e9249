/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Barrier, flat, for small teams (at most DPA_BARRIER_FLAT_MAX ranks): every rank signals
 * every other one at once and waits for all their signals. n - 1 signals a rank against
 * dissemination's log2(n), but no chain: the last rank to arrive releases everyone with
 * its own signals, and a rank that waits needs waking only once, when the last one came
 * in (events_needed), instead of once per round. Item i signals peer me + i and waits for
 * me - i; the signals are the same done counters all ops use.
 */
#include "engine_internal.h"

static int flat_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	(void)hal;
	/* A malformed barrier still synchronizes (its peers are waiting), then fails. */
	if (op->cmd.count || op->cmd.src_addr || op->cmd.dst_addr || op->cmd.flags)
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	return (int)eng->teams[op->team_id].size;
}

static int flat_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t n = team->size, me = team->my_rank, src = (me + n - i) % n;
	int work = 0;

	if (i == 0) {
		it->flags |= DPA_ITEM_FINISHED;
		return 1;
	}
	if (!(it->flags & DPA_ITEM_SIGNALED)) {
		if (dpa_signal_done(eng, op, hal, (me + i) % n, 0) == DPA_HAL_EAGAIN)
			return 0;
		dpa_expect_done(eng, op, it, src);
		it->flags |= DPA_ITEM_SIGNALED;
		work++;
	}
	if (!dpa_check_done(eng, op, hal, it, src) &&
	    !dpa_peer_gone(eng, op, team->peers[src].world_rank))
		return work;
	it->flags |= DPA_ITEM_RECVD | DPA_ITEM_FINISHED;
	return work + 1;
}

/* Every signal out, and only the peers' signals awaited (none passed on): all are needed. */
static uint32_t flat_events_needed(const struct dpa_op *op)
{
	uint32_t need = 0;

	for (uint32_t i = 1; i < op->nitems; i++) {
		uint32_t f = off_read_once(&op->items[i].flags);

		if (f & DPA_ITEM_FINISHED)
			continue;
		if (!(f & DPA_ITEM_SIGNALED))
			return 1;
		need++;
	}
	return need ? need : 1;
}

const struct dpa_algo dpa_algo_barrier_flat = {
	.name = "barrier_flat",
	.start = flat_start,
	.progress = flat_progress,
	.events_needed = flat_events_needed,
};

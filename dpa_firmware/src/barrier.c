/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Barrier: the gate every op passes (signature.c) is the barrier. Each member publishes
 * its signature to every other at intake and an op's items run only once every member's
 * arrived, that is, once every member reached this op; past the gate there is nothing left
 * to do. One round of n - 1 control words per rank, against ceil(log2 n) rounds of one
 * for dissemination: on a DPA the words leave together, and a barrier whose members ran
 * another op fails on every rank like any other op.
 */
#include "engine_internal.h"
#include "p2p.h"

static int barrier_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	(void)hal;
	/* A malformed barrier still synchronizes (its peers are waiting), then fails. */
	if (op->cmd.count || op->cmd.src_addr || op->cmd.dst_addr || op->cmd.flags)
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	return (int)eng->teams[op->team_id].size;
}

static int barrier_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			    struct dpa_hal *hal)
{
	(void)eng;
	(void)hal;
	op->items[i].flags |= DPA_ITEM_FINISHED;
	return 1;
}

const struct dpa_algo dpa_algo_barrier = {
	.start = barrier_start,
	.progress = barrier_progress,
};

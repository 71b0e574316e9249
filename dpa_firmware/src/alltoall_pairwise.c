/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All-to-all, pairwise exchange. Item i of an op covers step i of the pairwise order:
 * this rank sends its block to (me + i) and receives from (me - i). Items are striped
 * over the DPA threads, so up to num_threads peers move data at once.
 *
 * Per item: (1) publish "ready" (where the source may write) into the source's control
 * region; (2) wait for the destination's ready; (3) write the block in chunk_size pieces,
 * at most chunks_per_pass per progress call; (4) once every piece completed, add to the
 * destination's done counter; (5) wait for the source's done signal. A sender never
 * writes before the receiver published ready for this very op, so a receive buffer is
 * only written after the receiver re-posted it.
 */
#include "engine_internal.h"

static int publish_ready(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			 uint32_t src)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *peer = &team->peers[src];
	struct offload_ready ready = {
		.addr = op->cmd.dst_addr + (uint64_t)src * op->cmd.count,
		.len = op->cmd.count,
		.key = op->cmd.dst_key,
	};
	uint64_t raddr = dpa_peer_ctrl_addr(team, src,
					    dpa_ctrl_ready_off(op->team_id, op->slot, team->my_rank));
	uint64_t seq = op->seq;
	uint64_t wr = dpa_wr_id(op, src, DPA_WR_CTRL);
	int rc;

	/* Body first, then seq: writes on one QP land in order, seq last makes it valid. */
	rc = dpa_hal_rdma_write_inline(hal, peer->world_rank, &ready,
				       offsetof(struct offload_ready, seq), raddr, peer->ctrl_key, wr);
	if (!rc)
		rc = dpa_hal_rdma_write_inline(hal, peer->world_rank, &seq, sizeof(seq),
					       raddr + offsetof(struct offload_ready, seq),
					       peer->ctrl_key, wr);
	if (rc && rc != DPA_HAL_EAGAIN)
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, peer->world_rank);
	return rc;
}

/* Returns 1 once the destination's ready for this op was seen. */
static int take_ready(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      struct dpa_item *it, uint32_t dst)
{
	struct offload_ctrl_team *ctrl = dpa_my_ctrl(eng, hal, op->team_id);
	struct offload_ready *r = &ctrl->ready[op->slot][dst];

	/* Pairs with the receiver's seq write, which follows the body on the same QP. */
	if (off_load_acquire(&r->seq) != op->seq)
		return 0;
	it->raddr = r->addr;
	it->rkey = r->key;
	if (r->len != op->cmd.count) {
		/* The ranks disagree on the block size: move nothing, tell the receiver. */
		dpa_op_fail(op, OFFLOAD_ERR_INVALID, eng->teams[op->team_id].peers[dst].world_rank);
		it->flags |= DPA_ITEM_FAILED;
		it->posted = op->cmd.count;
	}
	return 1;
}

static int post_chunks(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       struct dpa_item *it, uint32_t i, uint32_t dst)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint64_t chunk = eng->params.chunk_size;
	uint64_t base = op->cmd.src_addr + (uint64_t)dst * op->cmd.count;
	int posted = 0;

	while (it->posted < op->cmd.count && posted < (int)eng->params.chunks_per_pass) {
		uint64_t len = op->cmd.count - it->posted;

		if (len > chunk)
			len = chunk;
		int rc = dpa_hal_rdma_write(hal, team->peers[dst].world_rank, base + it->posted,
					    op->cmd.src_key, it->raddr + it->posted, it->rkey, len,
					    dpa_wr_id(op, i, DPA_WR_DATA));

		if (rc == DPA_HAL_EAGAIN)
			break;
		if (rc) {
			dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, team->peers[dst].world_rank);
			it->flags |= DPA_ITEM_FAILED;
			it->posted = op->cmd.count;
			break;
		}
		it->posted += len;
		it->inflight++;
		posted++;
	}
	return posted;
}

static int a2a_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *cmd = &op->cmd;
	uint32_t n = team->size;
	uint64_t total;

	if (cmd->count && (__builtin_mul_overflow(cmd->count, n, &total) ||
			   !cmd->src_addr || !cmd->dst_addr || cmd->dst_len < total))
		return OFFLOAD_ERR_INVALID;
	/*
	 * Publish every ready right here, in pairwise order: senders start as soon as they
	 * see it, whichever thread later copies our own data. An item whose ready found the
	 * queue full publishes it from its owner thread.
	 */
	for (uint32_t i = 0; i < n; i++) {
		if (publish_ready(eng, op, hal, (team->my_rank + n - i) % n) == DPA_HAL_EAGAIN)
			break;
		op->items[i].flags |= DPA_ITEM_READY_OUT;
	}
	return (int)n;
}

static int a2a_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t n = team->size, me = team->my_rank;
	uint32_t src = (me + n - i) % n, dst = (me + i) % n;
	int work = 0;

	if (!(it->flags & DPA_ITEM_STARTED)) {
		dpa_expect_done(eng, op, it, src);
		it->flags |= DPA_ITEM_STARTED;
	}
	if (!(it->flags & DPA_ITEM_READY_OUT)) {
		if (publish_ready(eng, op, hal, src) == DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_READY_OUT;
		work++;
	}
	if (!(it->flags & DPA_ITEM_READY_IN) && take_ready(eng, op, hal, it, dst)) {
		it->flags |= DPA_ITEM_READY_IN;
		work++;
	}
	if (it->flags & DPA_ITEM_READY_IN) {
		work += post_chunks(eng, op, hal, it, i, dst);
		/* Every piece completed (a failed one too): tell the receiver how it went. */
		if (!(it->flags & DPA_ITEM_SIGNALED) && it->inflight == 0 &&
		    it->posted >= op->cmd.count &&
		    dpa_signal_done(eng, op, hal, dst, !!(it->flags & DPA_ITEM_FAILED)) != DPA_HAL_EAGAIN) {
			it->flags |= DPA_ITEM_SIGNALED;
			work++;
		}
	}
	if (!(it->flags & DPA_ITEM_RECVD) && dpa_check_done(eng, op, hal, it, src)) {
		it->flags |= DPA_ITEM_RECVD;
		work++;
	}
	if ((it->flags & DPA_ITEM_READY_OUT) && (it->flags & DPA_ITEM_SIGNALED) &&
	    (it->flags & DPA_ITEM_RECVD))
		it->flags |= DPA_ITEM_FINISHED;
	return work;
}

const struct dpa_algo dpa_algo_alltoall_pairwise = {
	.name = "alltoall_pairwise",
	.start = a2a_start,
	.progress = a2a_progress,
};

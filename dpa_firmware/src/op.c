/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An op's fate and the words every layer reaches: its first error, refusing, aborting,
 * poisoning its team, writing a completion, this thread's counters and the control
 * regions. A leaf: it calls only the HAL, so that the engine, the algorithms, p2p.c,
 * mcast.c and rails.c all use it without calling back up (engine -> algorithm ->
 * p2p/mcast -> rails -> HAL).
 */
#include "engine_internal.h"

struct offload_thread_stats *dpa_stats(struct dpa_hal *hal)
{
	uint32_t t = dpa_hal_thread_index(hal);

	return dpa_hal_window_ptr(hal, DPA_HAL_WIN_STATS, t * sizeof(struct offload_thread_stats),
				  sizeof(struct offload_thread_stats));
}

uint64_t dpa_peer_ctrl_addr(const struct dpa_team *team, uint32_t peer, uint64_t offset)
{
	return team->peers[peer].ctrl_addr + offset;
}

void dpa_op_fail(struct dpa_op *op, int32_t status, uint32_t world_rank)
{
	uint64_t cur = 0, why = ((uint64_t)world_rank << 32) | (uint32_t)status;

	/* The first error wins, but a peer that closed is the weakest reason: it often closed
	 * because of a failure this rank learns of a moment later (a death, its own rails). */
	while (!off_cas(&op->fail, &cur, why))
		if ((int32_t)(uint32_t)cur != OFFLOAD_ERR_PEER_CLOSED ||
		    (status != OFFLOAD_ERR_PEER && status != OFFLOAD_ERR_LINK_DOWN))
			return;
}

void dpa_op_refuse(struct dpa_engine *eng, struct dpa_op *op, int32_t status)
{
	dpa_op_fail(op, status, eng->teams[op->team_id].peers[eng->teams[op->team_id].my_rank].world_rank);
	op->refuse = 1;
}

int dpa_write_cqe(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cqe *cqe)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	uint64_t cq_off = sizeof(*ring) + (uint64_t)eng->params.sq_entries * sizeof(struct offload_cmd);
	struct offload_cqe *cq = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, cq_off,
						    (uint64_t)eng->params.cq_entries * sizeof(*cq));
	uint32_t tail, head;

	/* A few stores under the lock: wait for it. Returning "not now" would make intake
	 * redo a command whose side effects (TEAM_CREATE) already happened. */
	while (!off_trylock(&eng->cq_lock))
		;
	tail = ring->cq_tail;                     /* ours: only written under cq_lock */
	head = off_load_acquire(&ring->cq_head);  /* host-owned; pairs with its release */
	if (tail - head >= eng->params.cq_entries) {
		off_unlock(&eng->cq_lock);
		return 0;
	}
	cq[tail & (eng->params.cq_entries - 1)] = *cqe;
	off_store_release(&ring->cq_tail, tail + 1);  /* pairs with the host's acquire */
	off_unlock(&eng->cq_lock);
	/* The host checks cq_tail after announcing itself in cq_waiters; order both sides. */
	off_fence();
	if (off_read_once(&ring->cq_waiters))
		dpa_hal_host_notify(hal);
	return 1;
}

int dpa_complete_cmd(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd,
		     int32_t status, uint32_t detail, uint64_t result0, uint64_t result1)
{
	struct offload_cqe cqe = { .tag = cmd->tag, .status = status, .detail = detail,
				   .result0 = result0, .result1 = result1 };

	return dpa_write_cqe(eng, hal, &cqe);
}

void dpa_team_poison(struct dpa_team *team, int32_t status, uint32_t detail)
{
	uint64_t none = 0;

	off_cas(&team->poisoned, &none, ((uint64_t)detail << 32) | (uint32_t)status);
}

/*
 * Abort an op that cannot finish: a member died, it ran past the op timeout, or the host
 * cancelled it. Its completion carries why (a dead member overrides an earlier error, so
 * every survivor names the same rank), and the team is poisoned: its peers' sequence no
 * longer pairs with ours.
 */
void dpa_op_abort(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_op *op, int32_t status,
		  uint32_t detail)
{
	uint64_t why = ((uint64_t)detail << 32) | (uint32_t)status;

	if (status == OFFLOAD_ERR_PEER)
		__atomic_store_n(&op->fail, why, __ATOMIC_SEQ_CST);
	else
		dpa_op_fail(op, status, detail);
	dpa_team_poison(&eng->teams[op->team_id], status, detail);
	__atomic_store_n(&op->aborted, 1, __ATOMIC_SEQ_CST);
	dpa_hal_notify(hal);  /* items on parked sibling threads finish now */
}

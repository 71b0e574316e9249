/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Posting on the FlexIO HAL (dpa_hal_flexio.c has the whole picture): WQEs built in the
 * QP's SQ (DPA heap) and rung with flexio_dev_qp_sq_ring_db, every firmware post signaled
 * with its wr_id in a slot at the WQE's first basic block; a signal is a fetch-add followed
 * by a fenced zero-length SEND that wakes the peer thread, an inline write a WRITE WITH
 * IMMEDIATE; the host is woken by a SEND on its loopback QP. A post to a broken QP or of
 * nothing completes here (dpa_flexio_soft_complete).
 */
#include "flexio_hal_dev.h"

#include "offload_atomic.h"

/* ------------------------------------------------------------------ building WQEs */

static inline union flexio_dev_sqe_seg *sq_seg(const struct dpa_flexio_qp *qp, uint32_t bb,
					       uint32_t seg)
{
	/* A WQE may wrap past the end of the ring: segments continue at its start. */
	return &qp->sq[(bb * DPA_MLX5_SEGS_PER_BB + seg) & qp->seg_mask];
}

static struct dpa_flexio_qp *peer_qp(struct dpa_hal *hal, uint32_t peer)
{
	return peer < hal->world_size ? dpa_flexio_peer_qp(hal, hal->rail_of[peer], peer) : NULL;
}

uint32_t dpa_hal_num_rails(const struct dpa_hal *hal)
{
	return hal->num_rails;
}

/*
 * UD multicast is not bound on the card yet: it needs a UD QP attached to the team's group
 * (ibv_attach_mcast on the host), receive WQEs posted into staging slots and the copy out
 * through the window. Until then an MTU of 0 says "no multicast": the firmware refuses
 * broadcast/all-gather with OFFLOAD_ERR_UNSUPPORTED instead of running them wrong.
 */
uint32_t dpa_hal_mtu(const struct dpa_hal *hal)
{
	(void)hal;
	return 0;
}

int dpa_hal_mcast_send(struct dpa_hal *hal, uint32_t group, uint64_t laddr, uint32_t lkey,
		       uint32_t len, uint32_t imm, uint64_t wr_id)
{
	(void)hal, (void)group, (void)laddr, (void)lkey, (void)len, (void)imm, (void)wr_id;
	return DPA_HAL_EOPNOTSUPP;
}

int dpa_hal_mcast_post(struct dpa_hal *hal, uint32_t group, uint32_t seq8,
		       const struct dpa_hal_mcast_region *regions, uint32_t n)
{
	(void)hal, (void)group, (void)seq8, (void)regions;
	return n ? DPA_HAL_EOPNOTSUPP : 0;
}

int dpa_hal_mcast_poll(struct dpa_hal *hal, uint32_t group, struct dpa_hal_mcast_cqe *out,
		       int max)
{
	(void)hal, (void)group, (void)out, (void)max;
	return 0;
}

/* Nothing joins a group here yet (sends and posts are refused above). */
void dpa_hal_mcast_leave(struct dpa_hal *hal, uint32_t group)
{
	(void)hal, (void)group;
}

/* The UD binding will receive into staging slots in DPA memory (see above). */
uint32_t dpa_hal_mcast_slots(const struct dpa_hal *hal)
{
	(void)hal;
	return 0;
}

int dpa_hal_mcast_slot_copy(struct dpa_hal *hal, uint32_t group, uint32_t slot, uint64_t addr,
			    uint32_t key, uint32_t len, uint64_t wr_id)
{
	(void)hal, (void)group, (void)slot, (void)addr, (void)key, (void)len, (void)wr_id;
	return DPA_HAL_EOPNOTSUPP;
}

int dpa_hal_mcast_slot_free(struct dpa_hal *hal, uint32_t group, uint32_t slot)
{
	(void)hal, (void)group, (void)slot;
	return DPA_HAL_EOPNOTSUPP;
}

void dpa_hal_set_rail(struct dpa_hal *hal, uint32_t peer, uint32_t rail)
{
	if (peer < hal->world_size && rail < hal->num_rails)
		hal->rail_of[peer] = (uint8_t)rail;
}

static int sq_room(const struct dpa_hal *hal, const struct dpa_flexio_qp *qp, uint32_t nbb,
		   int fw)
{
	if (qp->pi - qp->ci + nbb > qp->bb_mask + 1)
		return DPA_HAL_EAGAIN;
	/* Room in the CQ and in the soft ring for the completion this post owes. */
	if (fw && hal->outstanding >= hal->max_outstanding)
		return DPA_HAL_EAGAIN;
	return 0;
}

static void wqe_ctrl(union flexio_dev_sqe_seg *seg, uint32_t bb, uint32_t opcode, uint32_t qpn,
		     uint32_t ds, uint32_t fm_ce_se, uint32_t imm)
{
	/* Like flexio_dev_swqe_seg_ctrl_set(), which fixes ds per opcode: ours varies with the
	 * gather list and inline length, and the wake SEND needs the fence bit. */
	seg->ctrl.idx_opcode = cpu_to_be32(((bb & 0xffffu) << 8) | opcode);
	seg->ctrl.qpn_ds = cpu_to_be32((qpn << 8) | ds);
	seg->ctrl.signature_fm_ce_se = cpu_to_be32(fm_ce_se);
	seg->ctrl.general_id = imm;
}

/* Record a WQE built at qp->pi and advance past it; the doorbell comes later (sq_ring). */
static void sq_stage(struct dpa_hal *hal, struct dpa_flexio_qp *qp, uint32_t nbb, uint64_t wr_id,
		     uint32_t bytes, uint16_t flags)
{
	struct dpa_flexio_slot *slot = &qp->slots[qp->pi & qp->bb_mask];

	slot->wr_id = wr_id;
	slot->bytes = bytes;
	slot->nbb = (uint16_t)nbb;
	slot->flags = flags;
	if (flags & DPA_FLEXIO_SLOT_FW)
		hal->outstanding++;
	qp->pi += nbb;
}

static void sq_ring(struct dpa_flexio_qp *qp)
{
	/* WQE bytes before the doorbell record, the record before the doorbell (the order
	 * NVIDIA's FlexIO samples use before flexio_dev_qp_sq_ring_db). */
	__dpa_thread_memory_writeback();
	qp->dbr[1] = cpu_to_be32(qp->pi & 0xffffu);
	__dpa_thread_memory_writeback();
	flexio_dev_qp_sq_ring_db((uint16_t)qp->pi, qp->qpn);
}

/* RDMA WRITE or READ of a gather list into/out of one remote range, one signaled WQE. */
static int post_rdma(struct dpa_hal *hal, uint32_t peer, uint32_t opcode,
		     const struct dpa_hal_sge *sge, uint32_t nsge, uint32_t lkey, uint64_t raddr,
		     uint32_t rkey, uint64_t wr_id)
{
	struct dpa_flexio_qp *qp = peer_qp(hal, peer);
	uint64_t total = 0;
	uint32_t ndata = 0, ds, nbb, bb;
	int rc;

	if (!qp || !nsge || nsge > DPA_HAL_MAX_SGE)
		return DPA_HAL_EINVAL;
	for (uint32_t i = 0; i < nsge; i++) {
		if (sge[i].len > DPA_FLEXIO_MAX_MSG)
			return DPA_HAL_EINVAL;
		total += sge[i].len;
		ndata += sge[i].len != 0;
	}
	if (total > DPA_FLEXIO_MAX_MSG)
		return DPA_HAL_EINVAL;
	if (qp->broken)
		return dpa_flexio_soft_complete(hal, qp, wr_id, OFFLOAD_ERR_LINK_DOWN, 0);
	if (!total)  /* nothing to move; a 0 byte count in a data segment is not "empty" */
		return dpa_flexio_soft_complete(hal, qp, wr_id, OFFLOAD_OK, 0);
	ds = 2 + ndata;
	nbb = (ds + DPA_MLX5_SEGS_PER_BB - 1) / DPA_MLX5_SEGS_PER_BB;
	rc = sq_room(hal, qp, nbb, 1);
	if (rc)
		return rc;
	bb = qp->pi;
	wqe_ctrl(sq_seg(qp, bb, 0), bb, opcode, qp->qpn, ds, MLX5_CTRL_SEG_CE_CQE_ALWAYS << 2, 0);
	flexio_dev_swqe_seg_rdma_set(sq_seg(qp, bb, 1), rkey, raddr);
	for (uint32_t i = 0, s = 2; i < nsge; i++) {
		if (!sge[i].len)
			continue;
		flexio_dev_swqe_seg_mem_ptr_data_set(sq_seg(qp, bb, s++), (uint32_t)sge[i].len, lkey,
						     sge[i].addr);
	}
	sq_stage(hal, qp, nbb, wr_id, (uint32_t)total, DPA_FLEXIO_SLOT_FW | DPA_FLEXIO_SLOT_SIGNALED);
	sq_ring(qp);
	return 0;
}

int dpa_hal_rdma_write(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		       uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	struct dpa_hal_sge sge = { .addr = laddr, .len = len };

	return post_rdma(hal, peer, MLX5_CTRL_SEG_OPCODE_RDMA_WRITE, &sge, 1, lkey, raddr, rkey,
			 wr_id);
}

int dpa_hal_rdma_read(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		      uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	struct dpa_hal_sge sge = { .addr = laddr, .len = len };

	return post_rdma(hal, peer, MLX5_CTRL_SEG_OPCODE_RDMA_READ, &sge, 1, lkey, raddr, rkey,
			 wr_id);
}

int dpa_hal_rdma_write_sg(struct dpa_hal *hal, uint32_t peer, const struct dpa_hal_sge *sge,
			  uint32_t nsge, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	return post_rdma(hal, peer, MLX5_CTRL_SEG_OPCODE_RDMA_WRITE, sge, nsge, lkey, raddr, rkey,
			 wr_id);
}

int dpa_hal_rdma_write_inline(struct dpa_hal *hal, uint32_t peer, const void *data,
			      uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct dpa_flexio_qp *qp = peer_qp(hal, peer);
	const uint8_t *src = data;
	uint32_t inl, ds, nbb, bb;
	int rc;

	if (!qp || len > OFFLOAD_FLEXIO_MAX_INLINE)
		return DPA_HAL_EINVAL;
	if (qp->broken)
		return dpa_flexio_soft_complete(hal, qp, wr_id, OFFLOAD_ERR_LINK_DOWN, 0);
	/* Inline segment: a 4-byte count, then the bytes, padded to 16-byte units. */
	inl = len ? (4 + len + 15) / 16 : 0;
	ds = 2 + inl;
	nbb = (ds + DPA_MLX5_SEGS_PER_BB - 1) / DPA_MLX5_SEGS_PER_BB;
	rc = sq_room(hal, qp, nbb, 1);
	if (rc)
		return rc;
	bb = qp->pi;
	/* WITH IMMEDIATE: the peer's receive CQE is what wakes its progress thread. */
	wqe_ctrl(sq_seg(qp, bb, 0), bb, MLX5_CTRL_SEG_OPCODE_RDMA_WRITE_WITH_IMMEDIATE, qp->qpn, ds,
		 MLX5_CTRL_SEG_CE_CQE_ALWAYS << 2, cpu_to_be32(hal->world_rank));
	flexio_dev_swqe_seg_rdma_set(sq_seg(qp, bb, 1), rkey, raddr);
	if (inl) {
		sq_seg(qp, bb, 2)->inline_send_data.byte_count = cpu_to_be32(DPA_MLX5_INLINE_SEG | len);
		for (uint32_t pos = 4; pos < inl * 16; pos++) {
			uint8_t *seg = (uint8_t *)sq_seg(qp, bb, 2 + pos / 16);

			seg[pos % 16] = pos - 4 < len ? src[pos - 4] : 0;
		}
	}
	sq_stage(hal, qp, nbb, wr_id, len, DPA_FLEXIO_SLOT_FW | DPA_FLEXIO_SLOT_SIGNALED);
	sq_ring(qp);
	return 0;
}

/* A zero-length SEND: consumes one receive WQE at the other end, raising a CQE there. */
static void stage_wake_send(struct dpa_hal *hal, struct dpa_flexio_qp *qp, uint32_t fence,
			    int signaled)
{
	uint32_t bb = qp->pi;
	uint32_t ce = signaled ? MLX5_CTRL_SEG_CE_CQE_ALWAYS : MLX5_CTRL_SEG_CE_CQE_ON_CQE_ERROR;

	wqe_ctrl(sq_seg(qp, bb, 0), bb, MLX5_CTRL_SEG_OPCODE_SEND, qp->qpn, 1, (ce << 2) | fence, 0);
	sq_stage(hal, qp, 1, 0, 0, signaled ? DPA_FLEXIO_SLOT_SIGNALED : 0);
}

int dpa_hal_rdma_signal_add(struct dpa_hal *hal, uint32_t peer, uint64_t raddr, uint32_t rkey,
			    uint64_t value, uint64_t wr_id)
{
	struct dpa_flexio_qp *qp = peer_qp(hal, peer);
	uint32_t bb;
	int rc;

	if (!qp)
		return DPA_HAL_EINVAL;
	if (qp->broken)
		return dpa_flexio_soft_complete(hal, qp, wr_id, OFFLOAD_ERR_LINK_DOWN, 0);
	if (raddr & 7)  /* atomics need an aligned word; the emulator says the same */
		return dpa_flexio_soft_complete(hal, qp, wr_id, OFFLOAD_ERR_REMOTE_ACCESS, 0);
	rc = sq_room(hal, qp, 2, 1);
	if (rc)
		return rc;
	bb = qp->pi;
	wqe_ctrl(sq_seg(qp, bb, 0), bb, MLX5_CTRL_SEG_OPCODE_ATOMIC_FETCH_AND_ADD, qp->qpn, 4,
		 MLX5_CTRL_SEG_CE_CQE_ALWAYS << 2, 0);
	flexio_dev_swqe_seg_rdma_set(sq_seg(qp, bb, 1), rkey, raddr);
	flexio_dev_swqe_seg_atomic_set(sq_seg(qp, bb, 2), value, 0);
	/* The old value is not wanted; it lands in this thread's scratch word. */
	flexio_dev_swqe_seg_mem_ptr_data_set(sq_seg(qp, bb, 3), sizeof(uint64_t),
					     hal->ctx->scratch_lkey, hal->ctx->scratch_daddr);
	sq_stage(hal, qp, 1, wr_id, 0, DPA_FLEXIO_SLOT_FW | DPA_FLEXIO_SLOT_SIGNALED);
	/* Fenced behind the atomic: the peer sees the new counter before it is woken. */
	stage_wake_send(hal, qp, DPA_MLX5_FENCE_SMALL, 0);
	sq_ring(qp);
	return 0;
}


void dpa_hal_host_notify(struct dpa_hal *hal)
{
	struct dpa_flexio_qp *qp = &hal->host_qp;
	int signaled = (++hal->notifies % DPA_FLEXIO_NOTIFY_SIGNAL) == 0;

	/* The completion the host is about to read must be in host memory before it wakes. */
	__dpa_thread_window_writeback();
	/* Unsignaled SENDs are retired by the next signaled one; with the SQ full, a wake is
	 * already on its way and the host re-checks on its own after a bounded sleep. */
	if (qp->broken || sq_room(hal, qp, 1, 0))
		return;
	stage_wake_send(hal, qp, 0, signaled || qp->pi - qp->ci + 2 > qp->bb_mask + 1);
	sq_ring(qp);
}

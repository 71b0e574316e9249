/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dpa_hal.h on a BlueField-3 DPA with the FlexIO device API (built by dpacc, DOCA >= 2.9 /
 * FlexIO device API 24.10). The host backend (host/src/flexio/flexio_backend.c) creates,
 * for every progress thread, an event handler, one CQ for all of that thread's work, one
 * "wake" CQ, an RC QP per (thread, rail, world rank) (our own rank's paired with a twin) and a
 * loopback QP to the host, and describes them in a struct offload_flexio_thread_ctx
 * (offload_abi.h) passed as the handler argument. There are no globals: everything a thread
 * keeps lives in host-allocated DPA memory named by that context, so the image is stateless
 * and a re-run handler finds its state again.
 *
 * Posting: WQEs are built in the QP's SQ (DPA heap) and rung with flexio_dev_qp_sq_ring_db.
 * Every firmware post is signaled; its wr_id sits in a slot at the WQE's first basic block,
 * found again from the CQE's wqe_counter. A completion for WQE n also retires every earlier
 * unsignaled WQE of the same SQ (mlx5 completes an SQ in order).
 *
 * Waking: data writes carry no event. A signal (fetch-add) is followed by a zero-length
 * SEND, fenced behind the atomic, and an inline write is a WRITE WITH IMMEDIATE: both consume
 * a receive WQE at the peer and so raise a CQE on the peer thread's CQ, which triggers its
 * event handler. notify() triggers siblings' wake CQs; host_notify() SENDs to the host QP,
 * whose completion channel the host sleeps on.
 */
#include "flexio_hal_dev.h"

#include "dpa_engine.h"
#include "offload_atomic.h"

#define DPA_FLEXIO_IDLE_PASSES      4u   /* empty passes before parking, nothing in flight */
#define DPA_FLEXIO_IDLE_PASSES_BUSY 64u  /* the same while an op is in flight */
/* A firmware timer closer than this is polled through; a later one parks the thread. */
#define DPA_FLEXIO_TIMER_SPIN_NS    1000000ull
#define DPA_FLEXIO_POLL_BUDGET      512u /* CQEs looked at per poll_cq call */

_Static_assert(DPA_HAL_WIN_RING == OFFLOAD_FLEXIO_WIN_RING &&
	       DPA_HAL_WIN_STATS == OFFLOAD_FLEXIO_WIN_STATS &&
	       DPA_HAL_WIN_CTRL == OFFLOAD_FLEXIO_WIN_CTRL, "window order shared with the host");
_Static_assert((DPA_FLEXIO_SOFT_DEPTH & (DPA_FLEXIO_SOFT_DEPTH - 1)) == 0, "soft depth");

static inline void *dptr(uint64_t daddr)
{
	return (void *)(uintptr_t)daddr;
}

/* ------------------------------------------------------------------ setup */

static void cq_init(struct dpa_flexio_cq *cq, const struct offload_flexio_cq *d)
{
	cq->ring = dptr(d->ring_daddr);
	cq->dbr = dptr(d->dbr_daddr);
	cq->cqn = d->cqn;
	cq->mask = (1u << d->log_depth) - 1;
	cq->ci = 0;
	cq->hw_owner = 1;  /* the host preset every owner bit to 1: first-pass CQEs carry 0 */
}

static void qp_init(struct dpa_flexio_qp *qp, const struct offload_flexio_qp *d)
{
	qp->sq = dptr(d->sq_daddr);
	qp->dbr = dptr(d->dbr_daddr);
	qp->slots = dptr(d->slots_daddr);
	qp->qpn = d->qpn;
	qp->peer = d->peer;
	qp->rail = d->rail;
	qp->bb_mask = (1u << d->log_sq_depth) - 1;
	qp->seg_mask = (DPA_MLX5_SEGS_PER_BB << d->log_sq_depth) - 1;
	qp->pi = 0;  /* the host left the SQ doorbell record at 0 */
	qp->ci = 0;
	qp->broken = 0;
}

/* First run of this thread's handler: turn the host's description into runtime state. */
static void hal_init(struct dpa_hal *hal, struct offload_flexio_thread_ctx *ctx)
{
	const struct offload_flexio_qp *qps = dptr(ctx->qps_daddr);

	hal->thread_index = ctx->thread_index;
	hal->num_threads = ctx->num_threads;
	hal->world_rank = ctx->world_rank;
	hal->world_size = ctx->world_size;
	hal->num_rails = ctx->num_rails ? ctx->num_rails : 1;
	hal->max_outstanding = ctx->max_outstanding < DPA_FLEXIO_SOFT_DEPTH ?
			       ctx->max_outstanding : DPA_FLEXIO_SOFT_DEPTH;
	hal->outstanding = 0;
	hal->notifies = 0;
	hal->ctx = ctx;
	hal->board = dptr(ctx->board_daddr);
	hal->tick_ns = ctx->tick_ns ? ctx->tick_ns : 1000u;
	cq_init(&hal->cq, &ctx->cq);
	cq_init(&hal->wake_cq, &ctx->wake_cq);
	qp_init(&hal->host_qp, &ctx->host_qp);
	for (uint32_t r = 0; r < hal->num_rails; r++) {
		const struct offload_flexio_qp *row = &qps[r * (ctx->world_size + 1)];

		for (uint32_t p = 0; p < ctx->world_size; p++)
			qp_init(&hal->qps[r][p], &row[p]);
		qp_init(&hal->twins[r], &row[ctx->world_size]);
	}
	for (uint32_t p = 0; p < OFFLOAD_MAX_RANKS; p++)
		hal->rail_of[p] = 0;
	hal->soft_head = hal->soft_tail = 0;
	hal->magic = DPA_FLEXIO_HAL_MAGIC;
}

/*
 * Map the host windows for this invocation. Window entity 0 gets the arena's key: one
 * registration holding the ring, the stats and the control words, so that pointers into
 * all three are alive at once (the engine holds them together). The window maps the
 * registration linearly: the base acquired for the arena's first byte gives the others
 * (NVIDIA's vrdma DPA code adds host offsets to an acquired base likewise). Entity 1 is
 * for command arguments, each under its own key (dpa_hal_aux_ptr); nothing is configured
 * on it until one is needed. The configuration is the thread's, and may not outlive the
 * invocation: it is made again on every entry.
 */
static int window_setup(struct dpa_hal *hal)
{
	flexio_uintptr_t base = 0;

	hal->aux_key = 0;
	if (flexio_dev_window_config(FLEXIO_DEV_WINDOW_ENTITY_0, (uint16_t)hal->ctx->window_id,
				     hal->ctx->window_mkey) != FLEXIO_DEV_STATUS_SUCCESS)
		return -1;
	if (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_0, hal->ctx->arena_haddr,
					  &base) != FLEXIO_DEV_STATUS_SUCCESS)
		return -1;
	hal->win_base = base - hal->ctx->arena_haddr;
	return 0;
}

/* ------------------------------------------------------------------ simple queries */

uint32_t dpa_hal_thread_index(const struct dpa_hal *hal)
{
	return hal->thread_index;
}

uint32_t dpa_hal_num_threads(const struct dpa_hal *hal)
{
	return hal->num_threads;
}

uint64_t dpa_hal_time_ns(struct dpa_hal *hal)
{
	/* unverified: tick length. Ticks of this EU's timer (microseconds on BlueField-3 per
	 * DOCA's PCC headers); the
	 * host passes the tick length, so a different clock only changes the context. */
	return (uint64_t)__dpa_thread_time() * hal->tick_ns;
}

void *dpa_hal_window_ptr(struct dpa_hal *hal, enum dpa_hal_window win, uint64_t offset,
			 uint64_t len)
{
	const struct offload_flexio_window *w;
	uint64_t haddr;

	switch (win) {
	case DPA_HAL_WIN_RING:
	case DPA_HAL_WIN_STATS:
	case DPA_HAL_WIN_CTRL:
		w = &hal->ctx->win[win];
		if (offset > w->len || len > w->len - offset ||
		    w->haddr < hal->ctx->arena_haddr ||
		    w->haddr - hal->ctx->arena_haddr + w->len > hal->ctx->arena_len)
			return NULL;
		haddr = w->haddr + offset;
		break;
	default:
		return NULL;
	}
	/* Host, NIC and peers write the ring indices, aux descriptors and control words
	 * behind our back: drop stale window lines before the caller reads through it. */
	if (win != DPA_HAL_WIN_STATS)
		__dpa_thread_window_read_inv();
	return dptr(hal->win_base + haddr);
}

/*
 * Command arguments in host memory, which the host registered under key (local read and
 * write): window entity 1 is configured with that key (kept while the next command uses
 * the same) and both ends of the range acquired, so a key that is unknown, of another
 * protection domain, or does not cover the whole range gives NULL, not a fault. The
 * pointer lives as long as entity 1 keeps this key: until this thread's next aux_ptr with
 * another key, or the end of the invocation (see dpa_hal.h).
 */
void *dpa_hal_aux_ptr(struct dpa_hal *hal, uint32_t key, uint64_t addr, uint64_t len)
{
	flexio_uintptr_t first = 0, last = 0;

	if (!key || !addr || addr + len < addr)
		return NULL;
	if (hal->aux_key != key) {
		hal->aux_key = 0;
		if (flexio_dev_window_config(FLEXIO_DEV_WINDOW_ENTITY_1,
					     (uint16_t)hal->ctx->window_id, key) !=
		    FLEXIO_DEV_STATUS_SUCCESS)
			return NULL;
		hal->aux_key = key;
	}
	if (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_1, addr, &first) !=
	    FLEXIO_DEV_STATUS_SUCCESS)
		return NULL;
	if (len && (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_1, addr + len - 1,
						  &last) != FLEXIO_DEV_STATUS_SUCCESS ||
		    last - first != len - 1))
		return NULL;
	__dpa_thread_window_read_inv();
	return dptr(first);
}

/* ------------------------------------------------------------------ completions made up here */

/* A completion for a post that never reaches the wire (zero length, broken QP). It counts
 * against max_outstanding like a real one, so the soft ring cannot overflow. */
static void cqe_fill(struct dpa_hal_cqe *c, uint64_t wr_id, int32_t status, uint32_t bytes,
		     uint32_t rail)
{
	c->wr_id = wr_id;
	c->status = status;
	c->bytes = bytes;
	c->rail = rail;
	c->resv = 0;
}

/*
 * A QP whose peer closed its context breaks like one whose peer died (the closer's QPs are
 * gone: retries run out, the rest is flushed), but the peer said it was closing first (the
 * host puts it in the ring's closed_ranks on its notice): what failed for that reason
 * reports OFFLOAD_ERR_PEER_CLOSED, not a link down to fail over from or a death.
 */
static int32_t peer_status(struct dpa_hal *hal, const struct dpa_flexio_qp *qp, int32_t status)
{
	const struct offload_ring_hdr *ring;

	if (status != OFFLOAD_ERR_LINK_DOWN || qp->peer >= OFFLOAD_MAX_RANKS ||
	    qp->peer == hal->world_rank)
		return status;
	ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	return ring && (off_load_acquire(&ring->closed_ranks) >> qp->peer & 1) ?
	       OFFLOAD_ERR_PEER_CLOSED : status;
}

static int soft_complete(struct dpa_hal *hal, const struct dpa_flexio_qp *qp, uint64_t wr_id,
			 int32_t status, uint32_t bytes)
{
	if (hal->outstanding >= hal->max_outstanding)
		return DPA_HAL_EAGAIN;
	status = peer_status(hal, qp, status);
	cqe_fill(&hal->soft[hal->soft_tail++ & (DPA_FLEXIO_SOFT_DEPTH - 1)], wr_id, status, bytes,
		 qp->rail);
	hal->outstanding++;
	return 0;
}

/* Used while retiring a broken QP's WQEs: their owed completions are already counted. */
static void soft_push_owed(struct dpa_hal *hal, const struct dpa_flexio_qp *qp, uint64_t wr_id,
			   int32_t status)
{
	cqe_fill(&hal->soft[hal->soft_tail++ & (DPA_FLEXIO_SOFT_DEPTH - 1)], wr_id,
		 peer_status(hal, qp, status), 0, qp->rail);
}

static int soft_drain(struct dpa_hal *hal, struct dpa_hal_cqe *out, int max)
{
	int n = 0;

	while (n < max && hal->soft_head != hal->soft_tail) {
		out[n++] = hal->soft[hal->soft_head++ & (DPA_FLEXIO_SOFT_DEPTH - 1)];
		hal->outstanding--;
	}
	return n;
}

/* ------------------------------------------------------------------ building WQEs */

static inline union flexio_dev_sqe_seg *sq_seg(const struct dpa_flexio_qp *qp, uint32_t bb,
					       uint32_t seg)
{
	/* A WQE may wrap past the end of the ring: segments continue at its start. */
	return &qp->sq[(bb * DPA_MLX5_SEGS_PER_BB + seg) & qp->seg_mask];
}

static struct dpa_flexio_qp *peer_qp(struct dpa_hal *hal, uint32_t peer)
{
	return peer < hal->world_size ? &hal->qps[hal->rail_of[peer]][peer] : NULL;
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
		return soft_complete(hal, qp, wr_id, OFFLOAD_ERR_LINK_DOWN, 0);
	if (!total)  /* nothing to move; a 0 byte count in a data segment is not "empty" */
		return soft_complete(hal, qp, wr_id, OFFLOAD_OK, 0);
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
		return soft_complete(hal, qp, wr_id, OFFLOAD_ERR_LINK_DOWN, 0);
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
		return soft_complete(hal, qp, wr_id, OFFLOAD_ERR_LINK_DOWN, 0);
	if (raddr & 7)  /* atomics need an aligned word; the emulator says the same */
		return soft_complete(hal, qp, wr_id, OFFLOAD_ERR_REMOTE_ACCESS, 0);
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

/* ------------------------------------------------------------------ polling */

static struct flexio_dev_cqe64 *cq_peek(struct dpa_flexio_cq *cq)
{
	struct flexio_dev_cqe64 *cqe = &cq->ring[cq->ci & cq->mask];

	if (flexio_dev_cqe_get_owner(cqe) == cq->hw_owner)
		return NULL;
	/* The owner bit is written last by the NIC: read the body only after it. */
	__dpa_thread_fence(__DPA_MEMORY, __DPA_R, __DPA_R);
	return cqe;
}

static void cq_pop(struct dpa_flexio_cq *cq)
{
	cq->ci++;
	if (!(cq->ci & cq->mask))
		cq->hw_owner ^= 1;
}

/*
 * Error syndrome of a failed WQE to a status. A QP in error delivers nothing more, so what
 * breaks the path (retries exhausted: our port, the link or the peer's port) is a rail going
 * down, and the firmware resends on another rail; the peer refusing us is the peer's fault.
 */
static int32_t status_of(uint32_t syndrome)
{
	switch (syndrome) {
	case DPA_MLX5_SYND_REMOTE_ACCESS_ERR:
	case DPA_MLX5_SYND_REMOTE_INVAL_REQ_ERR:  /* out of the bounds of the remote key */
	case DPA_MLX5_SYND_LOCAL_PROT_ERR:        /* our lkey: the emulator reports this too */
	case DPA_MLX5_SYND_LOCAL_ACCESS_ERR:
		return OFFLOAD_ERR_REMOTE_ACCESS;
	case DPA_MLX5_SYND_TRANSPORT_RETRY_EXC_ERR:
	case DPA_MLX5_SYND_WR_FLUSH_ERR:
		return OFFLOAD_ERR_LINK_DOWN;
	case DPA_MLX5_SYND_REMOTE_OP_ERR:
	case DPA_MLX5_SYND_RNR_RETRY_EXC_ERR:
	case DPA_MLX5_SYND_REMOTE_ABORTED_ERR:
	case DPA_MLX5_SYND_BAD_RESP_ERR:
		return OFFLOAD_ERR_PEER;
	case DPA_MLX5_SYND_LOCAL_LENGTH_ERR:
	case DPA_MLX5_SYND_LOCAL_QP_OP_ERR:
	default:
		return OFFLOAD_ERR_INTERNAL;
	}
}

/* The QP of a CQE: user_index names a peer QP (rail * OFFLOAD_MAX_RANKS + world rank) and the
 * QP number confirms; the loopback, the self twins and a search are the fallback. */
static struct dpa_flexio_qp *qp_of(struct dpa_hal *hal, struct flexio_dev_cqe64 *cqe)
{
	uint32_t uidx = flexio_dev_cqe_get_user_index(cqe), qpn = flexio_dev_cqe_get_qpn(cqe);
	uint32_t rail = uidx / OFFLOAD_MAX_RANKS, peer = uidx % OFFLOAD_MAX_RANKS;

	if (rail < hal->num_rails && peer < hal->world_size && hal->qps[rail][peer].qpn == qpn)
		return &hal->qps[rail][peer];
	if (hal->host_qp.qpn == qpn)
		return &hal->host_qp;
	for (rail = 0; rail < hal->num_rails; rail++) {
		if (hal->twins[rail].qpn == qpn)
			return &hal->twins[rail];
		for (peer = 0; peer < hal->world_size; peer++)
			if (hal->qps[rail][peer].qpn == qpn)
				return &hal->qps[rail][peer];
	}
	return NULL;
}

/* A requester CQE for the WQE starting at wqe_counter: retire it and all before it. */
static int sq_complete(struct dpa_hal *hal, struct dpa_flexio_qp *qp, uint16_t wqe_counter,
		       struct dpa_hal_cqe *out)
{
	struct dpa_flexio_slot *slot = &qp->slots[wqe_counter & qp->bb_mask];
	uint16_t end = (uint16_t)(wqe_counter + slot->nbb);

	if (qp->broken)  /* already retired in full when it broke; these are flushes */
		return 0;
	/* An SQ completes in order: a CQE for a block we already retired is bogus, and
	 * moving ci backwards (or past pi) would corrupt the ring. */
	if ((uint16_t)(end - (uint16_t)qp->ci) > qp->pi - qp->ci)
		return 0;
	qp->ci += (uint16_t)(end - (uint16_t)qp->ci);
	if (!(slot->flags & DPA_FLEXIO_SLOT_FW))
		return 0;
	cqe_fill(out, slot->wr_id, OFFLOAD_OK, slot->bytes, qp->rail);
	hal->outstanding--;
	return 1;
}

/*
 * An error CQE moves the QP to the error state. The failed WQE reports the mapped status;
 * every later firmware WQE on it is owed a completion that the hardware may or may not
 * deliver as a flush, so make them all up here (LINK_DOWN: not delivered, resend elsewhere)
 * and ignore the QP's CQEs from now on. Later posts to it complete with LINK_DOWN at once:
 * nothing reconnects a QP on the card (see docs/hardware_binding_notes.md).
 */
static int sq_fail(struct dpa_hal *hal, struct dpa_flexio_qp *qp, uint16_t wqe_counter,
		   int32_t status, struct dpa_hal_cqe *out)
{
	uint32_t bb = qp->ci + (uint16_t)(wqe_counter - (uint16_t)qp->ci);
	int n = 0;

	if (qp->broken)
		return 0;
	status = peer_status(hal, qp, status);
	qp->broken = status;
	while (bb != qp->pi) {
		struct dpa_flexio_slot *slot = &qp->slots[bb & qp->bb_mask];

		if (!slot->nbb)  /* never: every staged WQE has at least one block */
			break;
		if ((slot->flags & DPA_FLEXIO_SLOT_FW) && !n) {
			cqe_fill(out, slot->wr_id, status, 0, qp->rail);
			hal->outstanding--;
			n = 1;
		} else if (slot->flags & DPA_FLEXIO_SLOT_FW) {
			soft_push_owed(hal, qp, slot->wr_id, OFFLOAD_ERR_LINK_DOWN);
		}
		bb += slot->nbb;
	}
	qp->ci = qp->pi;
	return n;
}

/* Give a receive WQE back: the host pre-posted all of them, we only move the counter. */
static void rq_repost(struct dpa_flexio_qp *qp)
{
	flexio_dev_dbr_rq_inc_pi(&qp->dbr[0]);
}

/* Consume whatever sibling notifies left on the wake CQ (they carry no data). */
static void drain_wake_cq(struct dpa_hal *hal)
{
	struct dpa_flexio_cq *cq = &hal->wake_cq;
	uint32_t before = cq->ci;

	while (cq_peek(cq))
		cq_pop(cq);
	if (cq->ci != before)
		flexio_dev_dbr_cq_set_ci(cq->dbr, cq->ci);
}

int dpa_hal_poll_cq(struct dpa_hal *hal, struct dpa_hal_cqe *out, int max)
{
	struct dpa_flexio_cq *cq = &hal->cq;
	uint32_t before = cq->ci, budget = DPA_FLEXIO_POLL_BUDGET;
	int n = soft_drain(hal, out, max), woken = 0;
	struct flexio_dev_cqe64 *cqe;

	/* One CQE yields at most one completion: stop while room is left for it. */
	while (n < max && budget-- && (cqe = cq_peek(cq))) {
		struct dpa_flexio_qp *qp = qp_of(hal, cqe);
		uint8_t opcode = flexio_dev_cqe_get_opcode(cqe);

		if (qp) {
			switch (opcode) {
			case DPA_MLX5_CQE_REQ:
				n += sq_complete(hal, qp, flexio_dev_cqe_get_wqe_counter(cqe), &out[n]);
				break;
			case DPA_MLX5_CQE_REQ_ERR:
				n += sq_fail(hal, qp, flexio_dev_cqe_get_wqe_counter(cqe),
					     status_of(flexio_dev_cqe_get_err_synd(cqe)), &out[n]);
				break;
			case DPA_MLX5_CQE_RESP_WR_IMM:
			case DPA_MLX5_CQE_RESP_SEND:
			case DPA_MLX5_CQE_RESP_SEND_IMM:
			case DPA_MLX5_CQE_RESP_ERR:
				/* A peer's control write or signal, or the host's doorbell. */
				rq_repost(qp);
				woken |= qp != &hal->host_qp;
				break;
			default:
				break;
			}
		}
		cq_pop(cq);
	}
	if (cq->ci != before)
		flexio_dev_dbr_cq_set_ci(cq->dbr, cq->ci);
	drain_wake_cq(hal);
	/* A remote signal is for the rank, not for this thread: the op it advances may be
	 * striped onto a sibling (the emulator wakes all of a rank's threads likewise). */
	if (woken)
		dpa_hal_notify(hal);
	return n;
}

/* ------------------------------------------------------------------ scheduling */

/*
 * Wake siblings that parked. Pairs with the parking sequence in the event handler: a
 * thread arms its CQs, then sets its board flag, then fences and looks for work once more.
 * We published our work before this fence, so either it sees the work or we see its flag
 * (and then its CQ is armed, so the trigger raises an event).
 */
void dpa_hal_notify(struct dpa_hal *hal)
{
	/* unverified: that a zero CQE on a thread-attached CQ runs that thread's handler
	 * (the header says it "may activate any handler connected to the CQ"). */
	off_fence();
	for (uint32_t t = 0; t < hal->num_threads; t++)
		if (t != hal->thread_index && off_read_once(&hal->board[t]))
			flexio_dev_zcqe_gen(hal->ctx->wake_cqn[t]);  /* "msix_send" by its 24.10 name */
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

/* One pass of the engine with fresh window reads before and our writes pushed after. */
static int run_pass(struct dpa_hal *hal)
{
	int work;

	__dpa_thread_window_read_inv();
	work = dpa_progress(dptr(hal->ctx->state_daddr), hal);
	__dpa_thread_window_writeback();
	return work;
}

static void arm_cqs(struct dpa_hal *hal)
{
	flexio_dev_cq_arm(hal->cq.ci, hal->cq.cqn);
	flexio_dev_cq_arm(hal->wake_cq.ci, hal->wake_cq.cqn);
}

static int stop_requested(const struct offload_flexio_thread_ctx *ctx)
{
	__dpa_thread_fence(__DPA_MEMORY, __DPA_R, __DPA_R);  /* the host writes it by DMA */
	return off_read_once(&ctx->stop) != 0;
}

/*
 * Firmware timers (dpa_engine_wake_at). A DPA has no timer event, so a thread parks past a
 * timer that is not due soon, and whichever thread runs gives a parked sibling whose timer
 * expired an event of its own. Some thread runs at least every FX_WAIT_SLICE_MS while the
 * host waits for a completion (it rings thread 0 at each slice), so a timer fires within
 * about that of its time while anyone waits; one due while nobody waits (a multicast loss
 * timeout, an op_timeout) fires at the next doorbell.
 */
static void wake_expired_siblings(struct dpa_hal *hal, uint64_t now)
{
	void *state = dptr(hal->ctx->state_daddr);

	for (uint32_t t = 0; t < hal->num_threads; t++)
		if (t != hal->thread_index && off_read_once(&hal->board[t]) &&
		    dpa_engine_wake_at(state, t, now) == 1)
			flexio_dev_zcqe_gen(hal->ctx->wake_cqn[t]);
}

/* Poll on (1) rather than park: our own timer is due, or due within the spin time. */
static int timer_due(struct dpa_hal *hal, uint64_t now)
{
	uint64_t when = dpa_engine_wake_at(dptr(hal->ctx->state_daddr), hal->thread_index, now);

	return when == 1 || (when && when - now < DPA_FLEXIO_TIMER_SPIN_NS);
}

/*
 * The thread's entry point, run by FlexIO on each event of its CQs (host doorbell, peer
 * signal or control write, completion of our own work, sibling notify). Runs the engine
 * until it stops advancing, then parks: arm both CQs, announce itself on the board, look
 * once more (see dpa_hal_notify), and give the EU back until the next event.
 */
flexio_dev_event_handler_t dpa_offload_event_handler;
__dpa_global__ void dpa_offload_event_handler(uint64_t thread_arg)
{
	struct offload_flexio_thread_ctx *ctx = dptr(thread_arg);
	struct dpa_hal *hal;
	uint32_t idle = 0;

	if (ctx->magic != OFFLOAD_FLEXIO_CTX_MAGIC || ctx->version != OFFLOAD_FLEXIO_CTX_VERSION ||
	    ctx->world_size > OFFLOAD_MAX_RANKS || ctx->num_threads > OFFLOAD_MAX_THREADS ||
	    ctx->thread_index >= ctx->num_threads || ctx->num_rails > OFFLOAD_FLEXIO_MAX_RAILS)
		flexio_dev_error(DPA_FLEXIO_ERR_BAD_CTX);
	hal = dptr(ctx->hal_daddr);
	if (hal->magic != DPA_FLEXIO_HAL_MAGIC)
		hal_init(hal, ctx);
	if (window_setup(hal))
		flexio_dev_error(DPA_FLEXIO_ERR_WINDOW);  /* the host sees it in the process status */
	if (stop_requested(ctx)) {
		flexio_dev_thread_finish();
		return;
	}
	off_write_once(&hal->board[hal->thread_index], 0u);
	for (;;) {
		uint32_t limit = dpa_engine_load(dptr(ctx->state_daddr)) == DPA_ENGINE_IDLE ?
				 DPA_FLEXIO_IDLE_PASSES : DPA_FLEXIO_IDLE_PASSES_BUSY;

		idle = run_pass(hal) ? 0 : idle + 1;
		if (idle < limit)
			continue;
		if (stop_requested(ctx))
			break;
		wake_expired_siblings(hal, dpa_hal_time_ns(hal));
		if (timer_due(hal, dpa_hal_time_ns(hal)))
			continue;
		arm_cqs(hal);
		__dpa_thread_system_fence();  /* the arm doorbells before the board flag */
		off_store_release(&hal->board[hal->thread_index], 1u);
		off_fence();
		if (!run_pass(hal))
			break;
		off_write_once(&hal->board[hal->thread_index], 0u);
		idle = 0;
	}
	if (stop_requested(ctx)) {
		flexio_dev_thread_finish();
		return;
	}
	flexio_dev_thread_reschedule();
}

/* ------------------------------------------------------------------ RPCs from the host */

/* Sizes the host needs before it can allocate: engine state, HAL runtime, ABI version. */
flexio_dev_rpc_handler_t dpa_offload_query_rpc;
__dpa_rpc__ uint64_t dpa_offload_query_rpc(uint64_t what)
{
	switch (what) {
	case OFFLOAD_FLEXIO_QUERY_ABI:
		return OFFLOAD_ABI_VERSION;
	case OFFLOAD_FLEXIO_QUERY_STATE_SIZE:
		return dpa_engine_state_size();
	case OFFLOAD_FLEXIO_QUERY_HAL_BYTES:
		return sizeof(struct dpa_hal);
	default:
		return 0;
	}
}

/* dpa_engine_init() on the state buffer; params is a struct dpa_engine_params the host
 * copied into DPA memory. Returns 0 or the engine's negative errno, as a uint64_t. */
__dpa_rpc__ uint64_t dpa_offload_init_rpc(uint64_t state_daddr, uint64_t params_daddr);
__dpa_rpc__ uint64_t dpa_offload_init_rpc(uint64_t state_daddr, uint64_t params_daddr)
{
	const struct dpa_engine_params *params = dptr(params_daddr);

	if (!state_daddr || !params_daddr)
		return (uint64_t)(int64_t)DPA_HAL_EINVAL;
	return (uint64_t)(int64_t)dpa_engine_init(dptr(state_daddr), params);
}

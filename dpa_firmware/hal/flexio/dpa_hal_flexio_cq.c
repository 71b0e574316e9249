/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Completions on the FlexIO HAL (dpa_hal_flexio.c has the whole picture): polled from the
 * thread's CQ, where a CQE for WQE n also retires every earlier unsignaled WQE of its SQ
 * (mlx5 completes an SQ in order) and the wr_id is found again from its wqe_counter; or
 * made up here for posts that never reach the wire (zero length, a broken QP), queued in
 * the soft ring and counted against max_outstanding like real ones.
 */
#include "flexio_hal_dev.h"

#include "offload_atomic.h"

#define DPA_FLEXIO_POLL_BUDGET      512u /* CQEs looked at per poll_cq call */

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
 * host puts it in the ring's closed set on its notice): what failed for that reason
 * reports OFFLOAD_ERR_PEER_CLOSED, not a link down to fail over from or a death.
 */
static int32_t peer_status(struct dpa_hal *hal, const struct dpa_flexio_qp *qp, int32_t status)
{
	const struct offload_ring_hdr *ring;
	const uint64_t *closed;

	if (status != OFFLOAD_ERR_LINK_DOWN || qp->peer >= hal->world_size ||
	    qp->peer == hal->world_rank)
		return status;
	ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	if (!ring)
		return status;
	/* Pairs with the host's gen increment after the bit (offload_rankset_add). */
	(void)off_load_acquire(&ring->closed_gen);
	closed = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, ring->closed_off,
				    8ull * offload_rank_words(qp->peer + 1));
	return closed && offload_rankset_has(closed, qp->peer) ? OFFLOAD_ERR_PEER_CLOSED : status;
}

int dpa_flexio_soft_complete(struct dpa_hal *hal, const struct dpa_flexio_qp *qp, uint64_t wr_id,
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

/*
 * QPs by number. QP index i (1 + i in a slot, 0: empty) is peer QP i below rails x W, then
 * the twins, then the loopback. The table is at least twice as large as the QPs it holds,
 * so a probe ends at an empty slot; an odd multiplier spreads consecutive QP numbers.
 */
static struct dpa_flexio_qp *qp_at(struct dpa_hal *hal, uint32_t i)
{
	uint32_t peers = hal->num_rails * hal->world_size;

	if (i < peers)
		return &hal->qps[i];
	if (i - peers < hal->num_rails)
		return &hal->twins[i - peers];
	return &hal->host_qp;
}

/* Fibonacci hashing: the product's mix is in its high bits, folded down before the
 * caller masks (the low bits alone depend only on the QP number's low bits). */
static uint32_t qpn_hash(uint32_t qpn)
{
	uint32_t h = qpn * 0x9e3779b1u;

	return h ^ (h >> 16);
}

void dpa_flexio_index_qpns(struct dpa_hal *hal)
{
	uint32_t count = hal->num_rails * hal->world_size + hal->num_rails + 1;

	for (uint32_t s = 0; s <= hal->qpn_mask; s++)
		hal->qpn_slots[s] = 0;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t s = qpn_hash(qp_at(hal, i)->qpn) & hal->qpn_mask;

		while (hal->qpn_slots[s])
			s = (s + 1) & hal->qpn_mask;
		hal->qpn_slots[s] = i + 1;
	}
}

static struct dpa_flexio_qp *qp_by_qpn(struct dpa_hal *hal, uint32_t qpn)
{
	uint32_t s = qpn_hash(qpn) & hal->qpn_mask;

	for (uint32_t tries = 0; tries <= hal->qpn_mask && hal->qpn_slots[s]; tries++) {
		struct dpa_flexio_qp *qp = qp_at(hal, hal->qpn_slots[s] - 1);

		if (qp->qpn == qpn)
			return qp;
		s = (s + 1) & hal->qpn_mask;
	}
	return NULL;
}

/* The QP of a CQE: user_index names it (OFFLOAD_FLEXIO_UIDX(rail, world rank), or
 * the loopback or a twin) and the QP number confirms; a user_index that names no QP of this
 * job (a peer >= W, a rail >= rails) is never used as an index. Where the NIC does not
 * report user_index (the model leaves requester CQEs' at 0), the QP number alone finds it. */
struct dpa_flexio_qp *dpa_flexio_qp_of(struct dpa_hal *hal, uint32_t uidx, uint32_t qpn)
{
	struct dpa_flexio_qp *qp = NULL;

	if (uidx == OFFLOAD_FLEXIO_UIDX_HOST) {
		qp = &hal->host_qp;
	} else if (uidx > OFFLOAD_FLEXIO_UIDX_HOST) {
		if (uidx - OFFLOAD_FLEXIO_UIDX_HOST - 1 < hal->num_rails)
			qp = &hal->twins[uidx - OFFLOAD_FLEXIO_UIDX_HOST - 1];
	} else {
		uint32_t rail = uidx / OFFLOAD_RANKS_LIMIT;
		uint32_t peer = uidx % OFFLOAD_RANKS_LIMIT;

		if (rail < hal->num_rails && peer < hal->world_size)
			qp = dpa_flexio_peer_qp(hal, rail, peer);
	}
	if (qp && qp->qpn == qpn)
		return qp;
	return qp_by_qpn(hal, qpn);
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
		struct dpa_flexio_qp *qp = dpa_flexio_qp_of(hal, flexio_dev_cqe_get_user_index(cqe),
							    flexio_dev_cqe_get_qpn(cqe));
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

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's libflexio (fxm_flexio.c has the rest): CQs and QPs whose rings live in the
 * DPA process's heap, as DPA code reads and writes them, attached to the model's NIC.
 * Stricter than the documentation requires (fxm_flexio.c says why): queue memory must
 * lie inside the heap and name the process's UAR.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fxm_dpa.h"

/* ------------------------------------------------------------------ CQs and QPs */

flexio_status flexio_cq_create(struct flexio_process *process, struct ibv_context *ibv_ctx,
			       const struct flexio_cq_attr *fattr, struct flexio_cq **cq)
{
	struct flexio_cq *c;
	uint64_t bytes;

	(void)ibv_ctx;
	if (!process || !fattr || !cq || fattr->log_cq_depth < 1 || fattr->log_cq_depth > 22)
		return FLEXIO_STATUS_FAILED;
	bytes = 64ull << fattr->log_cq_depth;
	if (fattr->cq_ring_qmem.memtype != FLEXIO_MEMTYPE_DPA ||
	    !fxm_heap_range(process, fattr->cq_ring_qmem.daddr, bytes) ||
	    !fxm_heap_range(process, fattr->cq_dbr_daddr, 8))
		return fxm_flexio_fail("flexio_cq_create: %s", "ring or doorbell record outside the DPA heap");
	if (fattr->uar_id != process->uar.id)
		return fxm_flexio_fail("flexio_cq_create: %s", "uar_id is not the process's UAR");
	if (fattr->element_type != FLEXIO_CQ_ELEMENT_TYPE_DPA_THREAD || !fattr->thread ||
	    ((struct fxm_eh *)fattr->thread)->proc != process)
		return fxm_flexio_fail("flexio_cq_create: %s", "only CQs that run a thread of this process are modelled");
	c = calloc(1, sizeof(*c));
	if (!c)
		return FLEXIO_STATUS_FAILED;
	c->proc = process;
	c->cq.ring = (uint8_t *)(uintptr_t)fattr->cq_ring_qmem.daddr;
	c->cq.dbr = (uint32_t *)(uintptr_t)fattr->cq_dbr_daddr;
	c->cq.log_depth = fattr->log_cq_depth;
	c->cq.eh = (struct fxm_eh *)fattr->thread;
	c->cq.overrun_ignore = fattr->overrun_ignore;
	c->cq.always_armed = fattr->always_armed;
	c->cq.armed = !fattr->no_arm;   /* "Indication to not arm the CQ on creation" */
	fxm_cq_add(&c->cq);
	*cq = c;
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_cq_destroy(struct flexio_cq *cq)
{
	if (!cq)
		return FLEXIO_STATUS_FAILED;
	fxm_cq_remove(&cq->cq);
	free(cq);
	return FLEXIO_STATUS_SUCCESS;
}

uint32_t flexio_cq_get_cq_num(struct flexio_cq *cq)
{
	return cq ? cq->cq.cqn : UINT32_MAX;
}

static struct fxm_cq *cq_by_num(uint32_t cqn)
{
	struct fxm_cq *c;

	pthread_mutex_lock(&fxm.lock);
	c = fxm_cq_find_locked(cqn);
	pthread_mutex_unlock(&fxm.lock);
	return c;
}

flexio_status flexio_qp_create(struct flexio_process *process, struct ibv_context *ibv_ctx,
			       struct flexio_qp_attr *a, struct flexio_qp **qp_ptr)
{
	struct flexio_qp *q;
	uint64_t rq_bytes, sq_bytes;

	(void)ibv_ctx;
	if (!process || !a || !qp_ptr)
		return FLEXIO_STATUS_FAILED;
	if (a->transport_type != FLEXIO_QPC_ST_RC || a->no_sq ||
	    a->rq_type != FLEXIO_QP_QPC_RQ_TYPE_REGULAR)
		return fxm_flexio_fail("flexio_qp_create: %s", "only RC QPs with a regular RQ are modelled");
	if (a->log_sq_depth < 1 || a->log_sq_depth > 15 || a->log_rq_depth < 0 ||
	    a->log_rq_depth > 15 || a->user_index > 0xffffffu)
		return fxm_flexio_fail("flexio_qp_create: %s", "queue depth or user index out of range");
	if (a->uar_id != process->uar.id)
		return fxm_flexio_fail("flexio_qp_create: %s", "uar_id is not the process's UAR");
	/* The WQ buffer holds the RQ (16-byte receive WQEs) and then the SQ (64-byte basic
	 * blocks); the doorbell record is [0] RQ counter, [1] SQ counter. */
	rq_bytes = 16ull << a->log_rq_depth;
	sq_bytes = 64ull << a->log_sq_depth;
	if (a->qp_wq_buff_qmem.memtype != FLEXIO_MEMTYPE_DPA ||
	    a->qp_wq_dbr_qmem.memtype != FLEXIO_MEMTYPE_DPA ||
	    !fxm_heap_range(process, a->qp_wq_buff_qmem.daddr, rq_bytes + sq_bytes) ||
	    !fxm_heap_range(process, a->qp_wq_dbr_qmem.daddr, 8))
		return fxm_flexio_fail("flexio_qp_create: %s", "work queue or doorbell record outside the DPA heap");
	q = calloc(1, sizeof(*q));
	if (!q)
		return FLEXIO_STATUS_FAILED;
	q->proc = process;
	q->qp.dpa = 1;
	q->qp.proc = process;
	q->qp.pd = a->pd ? to_fxm_pd(a->pd) : process->pd;
	q->qp.user_index = a->user_index;
	q->qp.access = a->qp_access_mask;
	q->qp.rq = (uint8_t *)(uintptr_t)a->qp_wq_buff_qmem.daddr;
	q->qp.log_rq = (uint32_t)a->log_rq_depth;
	q->qp.rq_stride = 16;
	q->qp.sq = q->qp.rq + rq_bytes;
	q->qp.log_sq = (uint32_t)a->log_sq_depth;
	q->qp.dbr = (uint32_t *)(uintptr_t)a->qp_wq_dbr_qmem.daddr;
	q->qp.scq = cq_by_num(a->sq_cqn);
	q->qp.rcq = cq_by_num(a->rq_cqn);
	q->qp.state = IBV_QPS_RESET;
	q->qp.timeout = FXM_DEFAULT_TIMEOUT;   /* flexio_qp_attr has no ACK timeout */
	q->qp.rnr_retry = 0;                   /* nor an RNR retry count: 0, no retry */
	if (!q->qp.scq || !q->qp.rcq || !fxm_qp_add(&q->qp)) {
		free(q);
		return fxm_flexio_fail("flexio_qp_create: %s", "sq_cqn or rq_cqn names no CQ");
	}
	*qp_ptr = q;
	return FLEXIO_STATUS_SUCCESS;
}

/* RST -> INIT -> RTR -> RTS, as the PRM's QP state machine; RTR needs the remote QP, a GID
 * of the port (RoCE: GRH on) and a destination MAC. */
flexio_status flexio_qp_modify(struct flexio_qp *qp, struct flexio_qp_attr *a,
			       struct flexio_qp_attr_opt_param_mask *mask)
{
	struct fxm_qp *q = qp ? &qp->qp : NULL;

	(void)mask;
	if (!q || !a)
		return FLEXIO_STATUS_FAILED;
	switch (a->next_state) {
	case FLEXIO_QP_STATE_INIT:
		if (q->state != IBV_QPS_RESET || !fxm_port(a->vhca_port_num ? a->vhca_port_num : 1))
			return fxm_flexio_fail("flexio_qp_modify: %s", "INIT only from RESET, on a port of the device");
		q->port = a->vhca_port_num ? a->vhca_port_num : 1;
		q->access = a->qp_access_mask;
		q->state = IBV_QPS_INIT;
		return FLEXIO_STATUS_SUCCESS;
	case FLEXIO_QP_STATE_RTR:
		if (q->state != IBV_QPS_INIT)
			return fxm_flexio_fail("flexio_qp_modify: %s", "RTR only from INIT");
		if (!a->grh || !a->dest_mac || a->gid_table_index >= FXM_GIDS_PER_PORT ||
		    !a->path_mtu || a->path_mtu > FLEXIO_QP_QPC_MTU_BYTES_4K ||
		    (a->vhca_port_num && a->vhca_port_num != q->port))
			return fxm_flexio_fail("flexio_qp_modify: %s", "RTR on RoCE needs grh, dest_mac, a GID "
				    "index of the port and a path MTU");
		q->remote_qpn = a->remote_qp_num & 0xffffffu;
		q->rgid = a->rgid_or_rip;
		q->sgid_index = a->gid_table_index;
		q->fl = a->fl;
		q->grh = a->grh;
		q->expected_psn = a->next_rcv_psn & 0xffffffu;
		q->state = IBV_QPS_RTR;
		return FLEXIO_STATUS_SUCCESS;
	case FLEXIO_QP_STATE_RTS:
		if (q->state != IBV_QPS_RTR)
			return fxm_flexio_fail("flexio_qp_modify: %s", "RTS only from RTR");
		q->retry_cnt = a->retry_count > 7 ? 7 : a->retry_count;
		q->next_psn = a->next_send_psn & 0xffffffu;
		q->state = IBV_QPS_RTS;
		return FLEXIO_STATUS_SUCCESS;
	default:
		return fxm_flexio_fail("flexio_qp_modify: %s", "only RST -> INIT -> RTR -> RTS is modelled");
	}
}

flexio_status flexio_qp_destroy(struct flexio_qp *qp)
{
	if (!qp)
		return FLEXIO_STATUS_FAILED;
	fxm_qp_remove(&qp->qp);
	free(qp);
	return FLEXIO_STATUS_SUCCESS;
}

uint32_t flexio_qp_get_qp_num(struct flexio_qp *qp)
{
	return qp ? qp->qp.qpn : UINT32_MAX;
}

enum flexio_qp_state flexio_qp_state_get(struct flexio_qp *qp)
{
	static const enum flexio_qp_state map[] = {
		FLEXIO_QP_STATE_RST, FLEXIO_QP_STATE_INIT, FLEXIO_QP_STATE_RTR, FLEXIO_QP_STATE_RTS,
		FLEXIO_QP_STATE_RTS, FLEXIO_QP_STATE_RTS, FLEXIO_QP_STATE_ERR,
	};

	return qp && qp->qp.state <= IBV_QPS_ERR ? map[qp->qp.state] : FLEXIO_QP_STATE_ERR;
}

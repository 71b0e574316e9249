/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's libibverbs, queue side: completion channels, CQs and RC QPs of the host,
 * built as rdma-core's mlx5 provider builds them: ibv_post_send writes mlx5 WQEs into the
 * QP's send queue and rings the NIC, ibv_post_recv writes receive WQEs and bumps the
 * doorbell record, ibv_poll_cq parses the CQE64s the NIC wrote. The NIC executes host QPs
 * exactly like the DPA's (fxm_nic.c). Only RC QPs, SEND / RDMA WRITE / RDMA READ and
 * one or two scatter-gather entries: what the FlexIO backend needs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fxm.h"

struct fxm_chan {
	struct ibv_comp_channel ibv;
	int wfd;
};

static uint32_t pow2_at_least(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

static uint32_t log2u(uint32_t v)
{
	uint32_t l = 0;

	while ((1u << l) < v)
		l++;
	return l;
}

static struct fxm_cq *to_fxm_cq(struct ibv_cq *cq)
{
	return (struct fxm_cq *)cq;
}

static struct fxm_qp *to_fxm_qp(struct ibv_qp *qp)
{
	return (struct fxm_qp *)qp;
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const names[] = {
		"success", "local length error", "local QP operation error",
		"local EE context operation error", "local protection error", "Work Request Flushed Error",
		"memory management operation error", "bad response error", "local access error",
		"remote invalid request error", "remote access error", "remote operation error",
		"transport retry counter exceeded", "RNR retry counter exceeded",
		"local RDD violation error", "remote invalid RD request", "aborted error",
		"invalid EE context number", "invalid EE context state", "fatal error",
		"response timeout error", "general error",
	};

	return (unsigned)status < sizeof(names) / sizeof(names[0]) ? names[status] : "unknown";
}

/* ------------------------------------------------------------------ completion channels */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct fxm_chan *ch = calloc(1, sizeof(*ch));
	int fds[2];

	if (!ch || pipe2(fds, O_CLOEXEC)) {
		free(ch);
		errno = ENOMEM;
		return NULL;
	}
	fcntl(fds[1], F_SETFL, O_NONBLOCK);
	ch->ibv.context = context;
	ch->ibv.fd = fds[0];
	ch->wfd = fds[1];
	return &ch->ibv;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct fxm_chan *ch = (struct fxm_chan *)channel;

	if (!ch)
		return EINVAL;
	if (ch->ibv.refcnt)
		return EBUSY;
	close(ch->ibv.fd);
	close(ch->wfd);
	free(ch);
	return 0;
}

/* An event of an armed host CQ: one record on its channel (lost if the pipe is full,
 * which only happens to a channel nobody reads; the CQEs are there either way). */
void fxm_chan_notify(struct fxm_cq *cq)
{
	struct fxm_chan *ch = (struct fxm_chan *)cq->chan;
	struct ibv_cq *ibv = &cq->ibv;

	if (write(ch->wfd, &ibv, sizeof(ibv)) < 0 && errno != EAGAIN)
		fxm_log("completion channel: %s", strerror(errno));
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct ibv_cq *got;
	ssize_t n = read(channel->fd, &got, sizeof(got));

	if (n != sizeof(got))
		return -1;
	*cq = got;
	*cq_context = got->cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_mutex_unlock(&cq->mutex);
}

/* ------------------------------------------------------------------ CQs */

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct fxm_cq *cq;
	uint32_t n;

	(void)comp_vector;
	if (!context || cqe < 1 || cqe > (1 << 22)) {
		errno = EINVAL;
		return NULL;
	}
	n = pow2_at_least((uint32_t)cqe + 1);
	cq = calloc(1, sizeof(*cq));
	if (!cq || !(cq->ring = aligned_alloc(64, 64ull * n)) ||
	    !(cq->dbr = calloc(2, sizeof(uint32_t)))) {
		if (cq)
			free(cq->ring);
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++)
		cq->ring[64ull * i + 63] = (FXM_CQE_INVALID << 4) | 1u;
	cq->log_depth = log2u(n);
	cq->host = 1;
	cq->chan = channel;
	cq->ibv = (struct ibv_cq){ .context = context, .channel = channel,
		.cq_context = cq_context, .cqe = (int)n - 1 };
	pthread_mutex_init(&cq->ibv.mutex, NULL);
	pthread_cond_init(&cq->ibv.cond, NULL);
	cq->ibv.handle = fxm_cq_add(cq);
	if (channel)
		__atomic_fetch_add(&channel->refcnt, 1, __ATOMIC_RELAXED);
	return &cq->ibv;
}

int ibv_destroy_cq(struct ibv_cq *ibv)
{
	struct fxm_cq *cq = to_fxm_cq(ibv);

	if (!cq)
		return EINVAL;
	fxm_cq_remove(cq);
	if (cq->chan)
		__atomic_fetch_sub(&cq->chan->refcnt, 1, __ATOMIC_RELAXED);
	pthread_mutex_destroy(&cq->ibv.mutex);
	pthread_cond_destroy(&cq->ibv.cond);
	free(cq->ring);
	free(cq->dbr);
	free(cq);
	return 0;
}

int ibv_req_notify_cq(struct ibv_cq *ibv, int solicited_only)
{
	struct fxm_cq *cq = to_fxm_cq(ibv);

	(void)solicited_only;
	fxm_cq_arm(cq, cq->poll_ci);
	return 0;
}

static enum ibv_wc_status wc_status(uint8_t synd)
{
	switch (synd) {
	case FXM_SYND_LOCAL_LENGTH: return IBV_WC_LOC_LEN_ERR;
	case FXM_SYND_LOCAL_QP_OP: return IBV_WC_LOC_QP_OP_ERR;
	case FXM_SYND_LOCAL_PROT: return IBV_WC_LOC_PROT_ERR;
	case FXM_SYND_WR_FLUSH: return IBV_WC_WR_FLUSH_ERR;
	case FXM_SYND_BAD_RESP: return IBV_WC_BAD_RESP_ERR;
	case FXM_SYND_LOCAL_ACCESS: return IBV_WC_LOC_ACCESS_ERR;
	case FXM_SYND_REMOTE_INVAL_REQ: return IBV_WC_REM_INV_REQ_ERR;
	case FXM_SYND_REMOTE_ACCESS: return IBV_WC_REM_ACCESS_ERR;
	case FXM_SYND_REMOTE_OP: return IBV_WC_REM_OP_ERR;
	case FXM_SYND_TRANSPORT_RETRY_EXC: return IBV_WC_RETRY_EXC_ERR;
	case FXM_SYND_RNR_RETRY_EXC: return IBV_WC_RNR_RETRY_EXC_ERR;
	default: return IBV_WC_GENERAL_ERR;
	}
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* One CQE into wc, as the mlx5 provider parses it. Error completions fill only wr_id,
 * status, qp_num and vendor_err (verbs man page): opcode is left as it was. */
static void parse_cqe(const uint8_t *cqe, struct ibv_wc *wc)
{
	uint8_t opcode = cqe[0x3f] >> 4;
	uint32_t qpn = be32(cqe + 0x38) & 0xffffffu;
	uint16_t counter = (uint16_t)(cqe[0x3c] << 8 | cqe[0x3d]);
	int recv = opcode == FXM_CQE_RESP_SEND || opcode == FXM_CQE_RESP_SEND_IMM ||
		   opcode == FXM_CQE_RESP_WR_IMM || opcode == FXM_CQE_RESP_ERR;
	struct fxm_qp *qp;

	pthread_mutex_lock(&fxm.lock);
	qp = fxm_qp_find_locked(qpn);
	pthread_mutex_unlock(&fxm.lock);
	wc->qp_num = qpn;
	wc->vendor_err = cqe[0x36];
	wc->status = opcode == FXM_CQE_REQ_ERR || opcode == FXM_CQE_RESP_ERR ?
		     wc_status(cqe[0x37]) : IBV_WC_SUCCESS;
	wc->wr_id = 0;
	if (qp && qp->sq_wrid) {
		if (recv) {
			wc->wr_id = qp->rq_wrid[counter & ((1u << qp->log_rq) - 1)];
		} else {
			uint32_t mask = (1u << qp->log_sq) - 1;

			wc->wr_id = qp->sq_wrid[counter & mask];
			/* This WQE and every earlier one have left the send queue. */
			pthread_mutex_lock(&qp->post_lock);
			qp->sq_retired += (uint16_t)(counter + 1 - (uint16_t)qp->sq_retired);
			pthread_mutex_unlock(&qp->post_lock);
		}
	}
	if (wc->status != IBV_WC_SUCCESS)
		return;
	wc->byte_len = be32(cqe + 0x2c);
	wc->wc_flags = 0;
	memcpy(&wc->imm_data, cqe + 0x24, 4);
	if (recv) {
		wc->opcode = opcode == FXM_CQE_RESP_WR_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
		if (opcode != FXM_CQE_RESP_SEND)
			wc->wc_flags |= IBV_WC_WITH_IMM;
	} else if (qp && qp->sq_signal) {
		wc->opcode = (enum ibv_wc_opcode)qp->sq_signal[counter & ((1u << qp->log_sq) - 1)];
	} else {
		wc->opcode = IBV_WC_SEND;
	}
}

int ibv_poll_cq(struct ibv_cq *ibv, int num_entries, struct ibv_wc *wc)
{
	struct fxm_cq *cq = to_fxm_cq(ibv);
	uint32_t mask = (1u << cq->log_depth) - 1;
	int n = 0;

	pthread_mutex_lock(&ibv->mutex);
	while (n < num_entries) {
		const uint8_t *cqe = cq->ring + 64ull * (cq->poll_ci & mask);
		uint8_t own = __atomic_load_n(&cqe[0x3f], __ATOMIC_ACQUIRE);

		if ((own & 1u) != ((cq->poll_ci >> cq->log_depth) & 1u) || (own >> 4) == FXM_CQE_INVALID)
			break;
		parse_cqe(cqe, &wc[n++]);
		cq->poll_ci++;
	}
	if (n)
		__atomic_store_n(cq->dbr, __builtin_bswap32(cq->poll_ci & 0xffffffu), __ATOMIC_RELEASE);
	pthread_mutex_unlock(&ibv->mutex);
	return n;
}

/* ------------------------------------------------------------------ QPs */

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct fxm_qp *qp;
	uint32_t sq, rq, sge;

	if (!pd || !attr || attr->qp_type != IBV_QPT_RC || attr->srq || !attr->send_cq ||
	    !attr->recv_cq || attr->cap.max_send_sge > 2 || attr->cap.max_recv_sge > 4 ||
	    !attr->cap.max_send_wr || attr->cap.max_send_wr > 4096 || attr->cap.max_recv_wr > 4096) {
		errno = EINVAL;
		return NULL;
	}
	sq = pow2_at_least(attr->cap.max_send_wr);
	rq = pow2_at_least(attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1);
	sge = pow2_at_least(attr->cap.max_recv_sge ? attr->cap.max_recv_sge + 1 : 1);
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->pd = to_fxm_pd(pd);
	qp->log_sq = log2u(sq);
	qp->log_rq = log2u(rq);
	qp->rq_stride = 16 * sge;
	qp->sq = aligned_alloc(64, 64ull * sq);
	qp->rq = calloc(rq, qp->rq_stride);
	qp->dbr = calloc(2, sizeof(uint32_t));
	qp->sq_wrid = calloc(sq, sizeof(uint64_t));
	qp->sq_signal = calloc(sq, 1);
	qp->rq_wrid = calloc(rq, sizeof(uint64_t));
	qp->scq = to_fxm_cq(attr->send_cq);
	qp->rcq = to_fxm_cq(attr->recv_cq);
	qp->sq_sig_all = attr->sq_sig_all;
	qp->state = IBV_QPS_RESET;
	qp->rnr_retry = 7;
	qp->retry_cnt = 7;
	pthread_mutex_init(&qp->post_lock, NULL);
	if (!qp->sq || !qp->rq || !qp->dbr || !qp->sq_wrid || !qp->sq_signal || !qp->rq_wrid ||
	    !fxm_qp_add(qp)) {
		free(qp->sq);
		free(qp->rq);
		free(qp->dbr);
		free(qp->sq_wrid);
		free(qp->sq_signal);
		free(qp->rq_wrid);
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	memset(qp->sq, 0, 64ull * sq);
	qp->ibv = (struct ibv_qp){ .context = pd->context, .qp_context = attr->qp_context, .pd = pd,
		.send_cq = attr->send_cq, .recv_cq = attr->recv_cq, .handle = qp->qpn,
		.qp_num = qp->qpn, .state = IBV_QPS_RESET, .qp_type = IBV_QPT_RC };
	attr->cap.max_send_wr = sq;
	attr->cap.max_recv_wr = rq;
	attr->cap.max_inline_data = 0;
	return &qp->ibv;
}

/* The attributes each transition requires and allows (the kernel's ib_modify_qp_is_ok,
 * RC rows). */
static int modify_ok(int cur, int next, int mask)
{
	static const struct { int cur, next, req, opt; } rows[] = {
		{ IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0 },
		{ IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
		  IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX },
		{ IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
		  IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
		  IBV_QP_PATH_MIG_STATE },
	};
	int extra = mask & ~IBV_QP_STATE;

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (rows[i].cur == cur && rows[i].next == next)
			return (extra & rows[i].req) == rows[i].req &&
			       !(extra & ~(rows[i].req | rows[i].opt));
	return 0;
}

int ibv_modify_qp(struct ibv_qp *ibv, struct ibv_qp_attr *attr, int mask)
{
	struct fxm_qp *qp = to_fxm_qp(ibv);
	int next = attr->qp_state;

	if (!(mask & IBV_QP_STATE) || !modify_ok(qp->state, next, mask))
		return EINVAL;
	if (next == IBV_QPS_INIT) {
		if (!fxm_port(attr->port_num))
			return EINVAL;
		qp->port = attr->port_num;
		qp->access = (int)attr->qp_access_flags;
	} else if (next == IBV_QPS_RTR) {
		/* RoCE: every packet carries a GRH, from a GID of the QP's port. */
		if (!attr->ah_attr.is_global || attr->ah_attr.grh.sgid_index >= FXM_GIDS_PER_PORT ||
		    (attr->ah_attr.port_num && attr->ah_attr.port_num != qp->port))
			return EINVAL;
		qp->rgid = attr->ah_attr.grh.dgid;
		qp->sgid_index = attr->ah_attr.grh.sgid_index;
		qp->remote_qpn = attr->dest_qp_num & 0xffffffu;
		qp->expected_psn = attr->rq_psn & 0xffffffu;
		qp->grh = 1;
		if (mask & IBV_QP_ACCESS_FLAGS)
			qp->access = (int)attr->qp_access_flags;
	} else {
		qp->next_psn = attr->sq_psn & 0xffffffu;
		qp->timeout = attr->timeout;
		qp->retry_cnt = attr->retry_cnt;
		qp->rnr_retry = attr->rnr_retry;
	}
	qp->state = next;
	qp->ibv.state = (enum ibv_qp_state)next;
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *ibv)
{
	struct fxm_qp *qp = to_fxm_qp(ibv);

	if (!qp)
		return EINVAL;
	fxm_qp_remove(qp);
	pthread_mutex_destroy(&qp->post_lock);
	free(qp->sq);
	free(qp->rq);
	free(qp->dbr);
	free(qp->sq_wrid);
	free(qp->sq_signal);
	free(qp->rq_wrid);
	free(qp);
	return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	v = __builtin_bswap32(v);
	memcpy(p, &v, 4);
}

static void put_be64(uint8_t *p, uint64_t v)
{
	v = __builtin_bswap64(v);
	memcpy(p, &v, 8);
}

/* One WR as one mlx5 WQE (one basic block: control, RDMA and up to two data segments). */
static int build_wqe(struct fxm_qp *qp, const struct ibv_send_wr *wr)
{
	uint32_t mask = (1u << qp->log_sq) - 1, bb = qp->sq_pi, ds = 1, opcode;
	uint8_t *w = qp->sq + 64ull * (bb & mask);
	enum ibv_wc_opcode wc_op;

	switch (wr->opcode) {
	case IBV_WR_SEND: opcode = FXM_OP_SEND; wc_op = IBV_WC_SEND; break;
	case IBV_WR_RDMA_WRITE: opcode = FXM_OP_RDMA_WRITE; wc_op = IBV_WC_RDMA_WRITE; break;
	case IBV_WR_RDMA_READ: opcode = FXM_OP_RDMA_READ; wc_op = IBV_WC_RDMA_READ; break;
	default: return EINVAL;
	}
	if (wr->num_sge < 0 || wr->num_sge > 2 || (wr->send_flags & IBV_SEND_INLINE))
		return EINVAL;
	if (bb - qp->sq_retired >= mask + 1)
		return ENOMEM;  /* the send queue is full */
	memset(w, 0, 64);
	if (opcode != FXM_OP_SEND) {
		put_be64(w + 16, wr->wr.rdma.remote_addr);
		put_be32(w + 24, wr->wr.rdma.rkey);
		ds++;
	}
	for (int i = 0; i < wr->num_sge; i++, ds++) {
		put_be32(w + 16 * ds, wr->sg_list[i].length);
		put_be32(w + 16 * ds + 4, wr->sg_list[i].lkey);
		put_be64(w + 16 * ds + 8, wr->sg_list[i].addr);
	}
	put_be32(w + 4, (qp->qpn << 8) | ds);
	put_be32(w + 8, ((wr->send_flags & IBV_SEND_SIGNALED) || qp->sq_sig_all ? 2u << 2 : 0) |
			((wr->send_flags & IBV_SEND_FENCE) ? 1u << 5 : 0));
	/* The control word last: the NIC finds a whole WQE once it reads this index. */
	put_be32(w, ((bb & 0xffff) << 8) | opcode);
	qp->sq_wrid[bb & mask] = wr->wr_id;
	qp->sq_signal[bb & mask] = (uint8_t)wc_op;
	qp->sq_pi = bb + 1;
	return 0;
}

int ibv_post_send(struct ibv_qp *ibv, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct fxm_qp *qp = to_fxm_qp(ibv);
	int rc = 0;

	pthread_mutex_lock(&qp->post_lock);
	if (qp->state < IBV_QPS_RTS && qp->state != IBV_QPS_ERR)
		rc = EINVAL;
	for (; wr && !rc; wr = wr->next)
		rc = build_wqe(qp, wr);
	if (rc && bad_wr)
		*bad_wr = wr;
	__atomic_store_n(&qp->dbr[1], __builtin_bswap32(qp->sq_pi & 0xffff), __ATOMIC_RELEASE);
	fxm_nic_doorbell(qp, qp->sq_pi & 0xffff);
	pthread_mutex_unlock(&qp->post_lock);
	return rc;
}

int ibv_post_recv(struct ibv_qp *ibv, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct fxm_qp *qp = to_fxm_qp(ibv);
	uint32_t size = 1u << qp->log_rq;
	int rc = 0;

	pthread_mutex_lock(&qp->post_lock);
	for (; wr; wr = wr->next) {
		uint8_t *w = qp->rq + (uint64_t)qp->rq_stride * (qp->rq_pi & (size - 1));
		uint32_t i;

		if (qp->rq_pi - qp->rq_ci >= size || wr->num_sge < 0 ||
		    (uint32_t)wr->num_sge * 16 > qp->rq_stride) {
			rc = qp->rq_pi - qp->rq_ci >= size ? ENOMEM : EINVAL;
			break;
		}
		memset(w, 0, qp->rq_stride);
		for (i = 0; i < (uint32_t)wr->num_sge; i++) {
			put_be32(w + 16 * i, wr->sg_list[i].length);
			put_be32(w + 16 * i + 4, wr->sg_list[i].lkey);
			put_be64(w + 16 * i + 8, wr->sg_list[i].addr);
		}
		if (i * 16 < qp->rq_stride)
			put_be32(w + 16 * i + 4, FXM_INVALID_LKEY);
		qp->rq_wrid[qp->rq_pi & (size - 1)] = wr->wr_id;
		qp->rq_pi++;
	}
	if (rc && bad_wr)
		*bad_wr = wr;
	__atomic_store_n(&qp->dbr[0], __builtin_bswap32(qp->rq_pi & 0xffff), __ATOMIC_RELEASE);
	pthread_mutex_unlock(&qp->post_lock);
	fxm_nic_rq_doorbell(qp);
	return rc;
}

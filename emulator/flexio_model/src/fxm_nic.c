/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The emulated NIC of one process: a thread that executes the WQEs software rings the
 * doorbell for, in order per QP, sends them to the responder's NIC, and completes them
 * when the answer comes (fxm_resp.c is the other half). It reads the WQEs from the SQ
 * buffer in mlx5 layout (big endian; a WQE may wrap past the end of the ring), checks
 * every local key as it goes, and writes CQEs in order of the SQ: a WQE's completion
 * never overtakes an earlier one's.
 *
 * RC semantics kept: requests of a QP are answered in order; an error completes the
 * failing WQE with its syndrome and moves the QP to the error state, after which every
 * outstanding and every later WQE (signaled or not) completes with a flush error, and
 * so does every receive posted to it; a QP in error never leaves it. A request nobody
 * answers (the peer process died, a port is down, the responder dropped it) is sent
 * again after the QP's ACK timeout (4.096 us << timeout), up to retry_cnt times, then
 * completes with a transport-retry error. An RNR NAK (no receive posted) is retried
 * rnr_retry times (7: for ever) after the responder's minimal RNR timer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fxm.h"
#include "fxm_msg.h"
#include "fxm_wire.h"

static struct {
	pthread_mutex_t lock;       /* doorbell list, refs, gen */
	pthread_cond_t cond;
	int refs;
	int running;
	int stop;
	pthread_t thread;
	struct fxm_qp **db;
	uint32_t ndb, cap;
	uint64_t gen;
	int error_qps;              /* QPs in error: their new WQEs are flushed as posted */
} nic = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

/* ------------------------------------------------------------------ object tables */

uint32_t fxm_cq_add(struct fxm_cq *cq)
{
	pthread_mutex_init(&cq->lock, NULL);
	pthread_mutex_lock(&fxm.lock);
	cq->cqn = fxm.next_cqn++;
	cq->next = fxm.cqs;
	fxm.cqs = cq;
	pthread_mutex_unlock(&fxm.lock);
	return cq->cqn;
}

struct fxm_cq *fxm_cq_find_locked(uint32_t cqn)
{
	for (struct fxm_cq *c = fxm.cqs; c; c = c->next)
		if (c->cqn == cqn)
			return c;
	return NULL;
}

void fxm_cq_remove(struct fxm_cq *cq)
{
	pthread_mutex_lock(&fxm.lock);
	for (struct fxm_cq **pp = &fxm.cqs; *pp; pp = &(*pp)->next)
		if (*pp == cq) {
			*pp = cq->next;
			break;
		}
	pthread_mutex_unlock(&fxm.lock);
	fxm_nic_quiesce();
	pthread_mutex_destroy(&cq->lock);
}

uint32_t fxm_qp_add(struct fxm_qp *qp)
{
	qp->cap_inflight = 1u << qp->log_sq;
	qp->inflight = calloc(qp->cap_inflight, sizeof(*qp->inflight));
	if (!qp->inflight)
		return 0;
	pthread_mutex_lock(&fxm.lock);
	qp->qpn = fxm.next_qpn++ & 0xffffffu;
	qp->next = fxm.qps;
	fxm.qps = qp;
	qp->pd->refs++;
	pthread_mutex_unlock(&fxm.lock);
	return qp->qpn;
}

struct fxm_qp *fxm_qp_find_locked(uint32_t qpn)
{
	for (struct fxm_qp *q = fxm.qps; q; q = q->next)
		if (q->qpn == qpn)
			return q;
	return NULL;
}

void fxm_qp_remove(struct fxm_qp *qp)
{
	pthread_mutex_lock(&fxm.lock);
	for (struct fxm_qp **pp = &fxm.qps; *pp; pp = &(*pp)->next)
		if (*pp == qp) {
			*pp = qp->next;
			qp->pd->refs--;
			break;
		}
	pthread_mutex_unlock(&fxm.lock);
	pthread_mutex_lock(&nic.lock);
	for (uint32_t i = 0; i < nic.ndb; i++)
		if (nic.db[i] == qp)
			nic.db[i--] = nic.db[--nic.ndb];
	if (qp->state == IBV_QPS_ERR)
		nic.error_qps--;
	pthread_mutex_unlock(&nic.lock);
	fxm_nic_quiesce();
	for (uint32_t i = 0; i < qp->cap_inflight; i++)
		free(qp->inflight[i].msg);
	free(qp->inflight);
}

/* ------------------------------------------------------------------ completing */

uint64_t fxm_ack_timeout_ns(const struct fxm_qp *qp)
{
	uint32_t t = qp->timeout ? qp->timeout : FXM_DEFAULT_TIMEOUT;

	return 4096ull << (t > 30 ? 30 : t);
}

struct fxm_inflight *fxm_inflight_head(struct fxm_qp *qp)
{
	return qp->n_inflight ? &qp->inflight[qp->head_inflight] : NULL;
}

void fxm_inflight_pop(struct fxm_qp *qp)
{
	struct fxm_inflight *e = fxm_inflight_head(qp);

	free(e->msg);
	memset(e, 0, sizeof(*e));
	qp->head_inflight = (qp->head_inflight + 1) & (qp->cap_inflight - 1);
	qp->n_inflight--;
}

void fxm_push_req_cqe(struct fxm_qp *qp, uint32_t wqe_index, uint8_t opcode, uint8_t synd,
			 uint32_t bytes)
{
	if (synd && synd != FXM_SYND_WR_FLUSH && fxm_verbose())
		fxm_log("QP 0x%x: WQE %u completes with syndrome 0x%x", qp->qpn, wqe_index, synd);
	/* No user index in a requester CQE: whether the NIC reports one there is not documented
	 * (rdma-core's mlx5 provider finds a send CQE's QP by the QPN field, a receive CQE's by
	 * srqn_uidx), so the model takes the stricter reading and leaves it 0. */
	struct fxm_cqe_info c = { .opcode = opcode, .syndrome = synd, .qpn = qp->qpn,
		.user_index = 0, .wqe_counter = (uint16_t)wqe_index,
		.byte_cnt = bytes, .vendor_synd = synd ? 0x81 : 0 };

	if (qp->scq)
		fxm_cq_push(qp->scq, &c);
}

static uint32_t wqe_nbb(const struct fxm_qp *qp, uint32_t bb)
{
	const uint8_t *ctrl = qp->sq + 64ull * (bb & ((1u << qp->log_sq) - 1));
	uint32_t ds = fxm_be32(ctrl + 4) & 0x3f;

	return ds ? (ds + 3) / 4 : 1;
}

static void flush_rq(struct fxm_qp *qp)
{
	uint32_t posted = fxm_rq_posted(qp);

	while ((uint16_t)qp->rq_ci != (uint16_t)posted) {
		struct fxm_cqe_info c = { .opcode = FXM_CQE_RESP_ERR, .syndrome = FXM_SYND_WR_FLUSH,
			.qpn = qp->qpn, .user_index = qp->user_index,
			.wqe_counter = (uint16_t)qp->rq_ci };

		if (qp->rcq)
			fxm_cq_push(qp->rcq, &c);
		qp->rq_ci++;
	}
}

/* In error: flush what is outstanding, what was posted and not executed, the receives. */
void fxm_flush_all(struct fxm_qp *qp)
{
	while (qp->n_inflight) {
		fxm_push_req_cqe(qp, fxm_inflight_head(qp)->wqe_index, FXM_CQE_REQ_ERR, FXM_SYND_WR_FLUSH, 0);
		fxm_inflight_pop(qp);
	}
	while (qp->sq_next != qp->sq_db) {
		fxm_push_req_cqe(qp, qp->sq_next, FXM_CQE_REQ_ERR, FXM_SYND_WR_FLUSH, 0);
		qp->sq_next += wqe_nbb(qp, qp->sq_next);
		if ((int32_t)(qp->sq_db - qp->sq_next) < 0)
			qp->sq_next = qp->sq_db;
	}
	flush_rq(qp);
	qp->reads_inflight = 0;
	qp->deadline_ns = 0;
}

void fxm_note_error_qp(void)
{
	pthread_mutex_lock(&nic.lock);
	nic.error_qps++;
	pthread_mutex_unlock(&nic.lock);
}

void fxm_qp_to_error(struct fxm_qp *qp)
{
	if (qp->state != IBV_QPS_ERR) {
		qp->state = IBV_QPS_ERR;
		fxm_note_error_qp();
		if (fxm_verbose())
			fxm_log("QP 0x%x (%s) moved to the error state", qp->qpn,
				qp->dpa ? "DPA" : "host");
	}
	fxm_flush_all(qp);
}

/* Complete local entries at the head (no answer expected). */
void fxm_complete_locals(struct fxm_qp *qp)
{
	struct fxm_inflight *e;

	while ((e = fxm_inflight_head(qp)) && !e->msg) {
		uint32_t synd = e->psn;  /* a local entry keeps its syndrome in psn */

		if (synd) {
			fxm_push_req_cqe(qp, e->wqe_index, FXM_CQE_REQ_ERR, (uint8_t)synd, 0);
			fxm_inflight_pop(qp);
			fxm_qp_to_error(qp);
			return;
		}
		if (e->signaled)
			fxm_push_req_cqe(qp, e->wqe_index, FXM_CQE_REQ, 0, 0);
		fxm_inflight_pop(qp);
	}
}

/* The answer to the oldest request (the responder answers in order). */
void fxm_req_answer(struct fxm_qp *qp, const struct fxm_msg *m)
{
	struct fxm_inflight *e = fxm_inflight_head(qp);

	if (!e || !e->msg || e->psn != m->psn || qp->state == IBV_QPS_ERR)
		return;  /* an answer to a resent request we already have, or late */
	switch (m->kind) {
	case FXM_MSG_ACK:
		if (e->opcode == FXM_OP_ATOMIC_FA && e->nsge)
			memcpy((void *)(uintptr_t)e->sge[0].addr, &m->atomic_old, 8);
		if (e->opcode == FXM_OP_RDMA_READ || e->opcode == FXM_OP_ATOMIC_FA)
			qp->reads_inflight--;
		if (e->signaled)
			fxm_push_req_cqe(qp, e->wqe_index, FXM_CQE_REQ, 0,
				     e->opcode == FXM_OP_RDMA_READ ? m->resp_bytes :
				     e->opcode == FXM_OP_ATOMIC_FA ? 8 : 0);
		fxm_inflight_pop(qp);
		qp->attempts = 0;
		qp->rnr_attempts = 0;
		qp->deadline_ns = 0;
		fxm_complete_locals(qp);
		break;
	case FXM_MSG_NAK:
		fxm_push_req_cqe(qp, e->wqe_index, FXM_CQE_REQ_ERR, (uint8_t)m->syndrome, 0);
		fxm_inflight_pop(qp);
		fxm_qp_to_error(qp);
		break;
	case FXM_MSG_RNR:
		/* 7 retries for ever (IB spec); FlexIO QPs have no rnr_retry to set: 0. */
		if (qp->rnr_retry != 7 && ++qp->rnr_attempts > qp->rnr_retry) {
			fxm_push_req_cqe(qp, e->wqe_index, FXM_CQE_REQ_ERR, FXM_SYND_RNR_RETRY_EXC, 0);
			fxm_inflight_pop(qp);
			fxm_qp_to_error(qp);
			break;
		}
		qp->rnr_until_ns = fxm_now_ns() + 100000;   /* the minimal RNR timer, ~0.1 ms */
		break;
	case FXM_MSG_DROP:
		if (fxm_verbose())
			fxm_log("QP 0x%x: request PSN %u was dropped", qp->qpn, m->psn);
		if (!qp->deadline_ns)
			qp->deadline_ns = fxm_now_ns() + fxm_ack_timeout_ns(qp);
		break;
	default:
		break;
	}
}

/* ------------------------------------------------------------------ receive queues */

uint32_t fxm_rq_posted(const struct fxm_qp *qp)
{
	uint32_t posted = __builtin_bswap32(__atomic_load_n(&qp->dbr[0], __ATOMIC_ACQUIRE)) & 0xffff;

	/* Extend the 16-bit counter to rq_ci's range. */
	return qp->rq_ci + (uint16_t)(posted - (uint16_t)qp->rq_ci);
}

/* ------------------------------------------------------------------ the thread */

void fxm_nic_doorbell(struct fxm_qp *qp, uint32_t pi16)
{
	pthread_mutex_lock(&nic.lock);
	qp->db_pi += (uint16_t)(pi16 - (uint16_t)qp->db_pi);
	if (!qp->db_queued) {
		if (nic.ndb == nic.cap) {
			uint32_t cap = nic.cap ? nic.cap * 2 : 64;
			struct fxm_qp **db = realloc(nic.db, cap * sizeof(*db));

			if (!db) {
				pthread_mutex_unlock(&nic.lock);
				fxm_log("out of memory queueing a doorbell");
				return;
			}
			nic.db = db;
			nic.cap = cap;
		}
		nic.db[nic.ndb++] = qp;
		qp->db_queued = 1;
	}
	pthread_mutex_unlock(&nic.lock);
	fxm_wire_wake();
}

void fxm_nic_rq_doorbell(struct fxm_qp *qp)
{
	if (qp->state == IBV_QPS_ERR)
		fxm_wire_wake();   /* the receive just posted is flushed */
}

static uint64_t service_qps(void)
{
	uint64_t now = fxm_now_ns(), next = 0;
	struct fxm_qp **all;
	uint32_t n = 0, cap = 64;

	/* A snapshot of the QPs: those destroyed meanwhile stay allocated until this loop
	 * iteration ended (fxm_nic_quiesce). */
	pthread_mutex_lock(&fxm.lock);
	for (struct fxm_qp *qp = fxm.qps; qp; qp = qp->next)
		n++;
	cap = n ? n : 1;
	all = malloc(cap * sizeof(*all));
	n = 0;
	for (struct fxm_qp *qp = fxm.qps; all && qp && n < cap; qp = qp->next)
		all[n++] = qp;
	pthread_mutex_unlock(&fxm.lock);
	if (!all)
		return fxm_now_ns() + 1000000ull;
	pthread_mutex_lock(&nic.lock);
	for (uint32_t i = 0; i < nic.ndb; i++)
		nic.db[i]->db_queued = 0;
	nic.ndb = 0;
	for (uint32_t i = 0; i < n; i++)
		all[i]->sq_db = all[i]->db_pi;
	pthread_mutex_unlock(&nic.lock);
	for (uint32_t i = 0; i < n; i++) {
		struct fxm_qp *qp = all[i];
		uint64_t t;

		if (qp->state == IBV_QPS_ERR) {
			fxm_flush_all(qp);
			continue;
		}
		if (qp->sq_next != qp->sq_db)
			fxm_run_sq(qp);
		t = fxm_qp_timers(qp, now);
		if (t && (!next || t < next))
			next = t;
	}
	free(all);
	return next;
}

static volatile sig_atomic_t dump_requested;

static void on_dump_signal(int sig)
{
	(void)sig;
	dump_requested = 1;
	fxm_wire_wake();
}

static void dump(void)
{
	pthread_mutex_lock(&fxm.lock);
	for (struct fxm_cq *c = fxm.cqs; c; c = c->next)
		fxm_log("CQ 0x%x: pi %u ci %u armed %d error %d events %llu%s", c->cqn, c->pi,
			__builtin_bswap32(*c->dbr) & 0xffffffu, c->armed, c->error,
			(unsigned long long)c->events, c->host ? " host" : "");
	for (struct fxm_qp *q = fxm.qps; q; q = q->next)
		fxm_log("QP 0x%x %s: state %d sq %u/%u inflight %u reads %u deadline %llu rq %u/%u",
			q->qpn, q->dpa ? "dpa" : "host", q->state, q->sq_next, q->sq_db, q->n_inflight,
			q->reads_inflight, (unsigned long long)q->deadline_ns, q->rq_ci,
			fxm_rq_posted(q));
	pthread_mutex_unlock(&fxm.lock);
	fxm_dump_dpa();
}

static void *nic_thread(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "fxm-nic");
	for (;;) {
		uint64_t next, now;
		int timeout;

		pthread_mutex_lock(&nic.lock);
		nic.gen++;
		pthread_cond_broadcast(&nic.cond);
		if (nic.stop) {
			pthread_mutex_unlock(&nic.lock);
			break;
		}
		timeout = nic.error_qps ? 2 : -1;
		pthread_mutex_unlock(&nic.lock);
		if (dump_requested) {
			dump_requested = 0;
			dump();
		}
		next = service_qps();
		now = fxm_now_ns();
		if (next) {
			int ms = next <= now ? 0 : (int)((next - now + 999999) / 1000000);

			timeout = timeout < 0 || ms < timeout ? ms : timeout;
		}
		fxm_wire_poll(timeout, fxm_rx);
	}
	return NULL;
}

int fxm_nic_get(void)
{
	int rc = 0;

	pthread_mutex_lock(&nic.lock);
	if (nic.refs++ == 0) {
		nic.stop = 0;
		const char *dbg = getenv("FXM_DEBUG_DUMP");

		if (dbg && *dbg == '1')
			signal(SIGUSR2, on_dump_signal);
		if (fxm_wire_open() || pthread_create(&nic.thread, NULL, nic_thread, NULL)) {
			fxm_wire_close();
			nic.refs--;
			rc = -1;
		} else {
			nic.running = 1;
		}
	}
	pthread_mutex_unlock(&nic.lock);
	return rc;
}

void fxm_nic_put(void)
{
	pthread_t t;
	int last;

	pthread_mutex_lock(&nic.lock);
	last = --nic.refs == 0 && nic.running;
	if (last) {
		nic.stop = 1;
		nic.running = 0;
	}
	t = nic.thread;
	pthread_mutex_unlock(&nic.lock);
	if (!last)
		return;
	fxm_wire_wake();
	pthread_join(t, NULL);
	fxm_wire_close();
}

/* Wait until the NIC thread went once around its loop: it holds no pointer to an object
 * unlinked before this call any more. */
void fxm_nic_quiesce(void)
{
	uint64_t target;

	pthread_mutex_lock(&nic.lock);
	if (!nic.running || pthread_equal(pthread_self(), nic.thread)) {
		pthread_mutex_unlock(&nic.lock);
		return;
	}
	target = nic.gen + 2;
	pthread_mutex_unlock(&nic.lock);
	fxm_wire_wake();
	pthread_mutex_lock(&nic.lock);
	while (nic.running && nic.gen < target) {
		pthread_mutex_unlock(&nic.lock);
		fxm_wire_wake();
		pthread_mutex_lock(&nic.lock);
		if (nic.gen < target) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&nic.cond, &nic.lock, &ts);
		}
	}
	pthread_mutex_unlock(&nic.lock);
}

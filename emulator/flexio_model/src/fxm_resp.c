/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The responder half of the emulated NIC, and the dispatch of what arrives.
 *
 * A request is taken only by the QP it names if that QP is ready to receive (RTR or RTS),
 * is connected to the sender's QP and GID, and the request is the next in sequence;
 * anything else falls on the floor (the requester's retry timer notices). The responder
 * checks the rkey against its own registrations: it exists, belongs to the QP's protection
 * domain, covers the range and grants the access (remote write, read or atomic; the QP's
 * own access flags too). A failed check is a NAK with the syndrome the requester's CQE
 * carries (remote access error), and the responder's QP moves to the error state as well,
 * with an access-violation event (IB spec responder class J errors; rdma-core's
 * IBV_EVENT_QP_ACCESS_ERR): the stricter of the readings, since a ConnectX could also keep
 * the responder QP alive. Nothing is written on a failed check.
 *
 * Bytes move in one copy between the two processes (process_vm_readv pulls a WRITE's
 * payload from the requester's buffers into the registered target; process_vm_writev
 * pushes a READ's into the requester's), or inline from the request. Fetch-add is atomic
 * on the target word in host byte order (mlx5_core sets the 8-byte atomic endianness
 * mode to the host's where the device supports it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fxm.h"
#include "fxm_msg.h"

static int psn_cmp(uint32_t psn, uint32_t expected)
{
	uint32_t d = (psn - expected) & 0xffffffu;

	return d == 0 ? 0 : d >= 0x800000u ? -1 : 1;
}

static void answer(const struct fxm_msg *req, uint8_t lport, uint32_t kind, uint32_t synd,
		   uint32_t bytes, uint64_t old)
{
	struct fxm_msg m;

	memset(&m, 0, sizeof(m));
	m.kind = kind;
	m.op = req->op;
	m.src_ipv4 = req->dst_ipv4;
	m.dst_ipv4 = req->src_ipv4;
	m.sqpn = req->dqpn;
	m.dqpn = req->sqpn;
	m.psn = req->psn;
	m.syndrome = synd;
	m.resp_bytes = bytes;
	m.atomic_old = old;
	fxm_nic_send(lport, req->src_ipv4, &m, NULL, 0);  /* a dead requester hears nothing */
}

/* Copy len bytes between our memory at local and the requester's buffers (its sges);
 * to_local: pull (WRITE/SEND), else push (READ). 0 or -1. */
static int move(const struct fxm_msg *req, uint8_t *local, uint64_t len, int to_local)
{
	struct iovec l = { local, len }, r[FXM_MAX_SGE];
	uint64_t done = 0;

	for (uint32_t i = 0; i < req->nsge; i++)
		r[i] = (struct iovec){ (void *)(uintptr_t)req->sge[i].addr, req->sge[i].len };
	if (req->pid == (int32_t)getpid()) {
		for (uint32_t i = 0; i < req->nsge && done < len; i++) {
			uint64_t n = req->sge[i].len < len - done ? req->sge[i].len : len - done;

			if (to_local)
				memmove(local + done, r[i].iov_base, n);
			else
				memmove(r[i].iov_base, local + done, n);
			done += n;
		}
		return 0;
	}
	while (done < len) {
		ssize_t n;
		struct iovec lv = { local + done, len - done }, rv[FXM_MAX_SGE];
		uint64_t skip = done;
		uint32_t k = 0;

		(void)l;
		for (uint32_t i = 0; i < req->nsge; i++) {
			if (skip >= r[i].iov_len) {
				skip -= r[i].iov_len;
				continue;
			}
			rv[k].iov_base = (uint8_t *)r[i].iov_base + skip;
			rv[k++].iov_len = r[i].iov_len - skip;
			skip = 0;
		}
		n = to_local ? process_vm_readv(req->pid, &lv, 1, rv, k, 0) :
			       process_vm_writev(req->pid, &lv, 1, rv, k, 0);
		if (n <= 0)
			return -1;
		done += (uint64_t)n;
	}
	return 0;
}

/* The next posted receive: its WQE's scatter list, checked for local write. */
static int take_receive(struct fxm_qp *qp, uint64_t len, uint32_t *synd, struct iovec *sg,
			uint32_t *nsg)
{
	uint32_t size = 1u << qp->log_rq;
	const uint8_t *wqe;
	uint64_t room = 0;

	if ((uint16_t)(fxm_rq_posted(qp) - qp->rq_ci) == 0)
		return 1;   /* none posted: RNR */
	wqe = qp->rq + (uint64_t)qp->rq_stride * (qp->rq_ci & (size - 1));
	*nsg = 0;
	for (uint32_t off = 0; off + 16 <= qp->rq_stride && *nsg < FXM_MAX_SGE; off += 16) {
		uint32_t bc, lkey;
		uint64_t addr;

		memcpy(&bc, wqe + off, 4);
		memcpy(&lkey, wqe + off + 4, 4);
		memcpy(&addr, wqe + off + 8, 8);
		bc = __builtin_bswap32(bc);
		lkey = __builtin_bswap32(lkey);
		addr = __builtin_bswap64(addr);
		if (lkey == FXM_INVALID_LKEY)
			break;
		if (bc && !fxm_mr_check(qp->pd, lkey, addr, bc, IBV_ACCESS_LOCAL_WRITE, 0, synd))
			return -1;
		sg[(*nsg)++] = (struct iovec){ (void *)(uintptr_t)addr, bc };
		room += bc;
	}
	if (len > room) {
		*synd = FXM_SYND_LOCAL_LENGTH;
		return -1;
	}
	return 0;
}

static void recv_cqe(struct fxm_qp *qp, uint8_t opcode, uint8_t synd, uint32_t bytes,
		     uint32_t imm)
{
	struct fxm_cqe_info c = { .opcode = opcode, .syndrome = synd, .qpn = qp->qpn,
		.user_index = qp->user_index, .wqe_counter = (uint16_t)qp->rq_ci,
		.byte_cnt = bytes, .imm = imm };

	if (qp->rcq)
		fxm_cq_push(qp->rcq, &c);
	qp->rq_ci++;
}

/* A responder error: NAK the requester with what its CQE says, break our QP. */
static void refuse(struct fxm_qp *qp, const struct fxm_msg *req, uint8_t lport, uint32_t synd)
{
	answer(req, lport, FXM_MSG_NAK, synd, 0, 0);
	fxm_qp_to_error(qp);
}

static void execute(struct fxm_qp *qp, const struct fxm_msg *req, const uint8_t *inl,
		    uint8_t lport, int duplicate)
{
	uint32_t synd = 0, nsg = 0;
	struct iovec sg[FXM_MAX_SGE];
	uint64_t len = req->length;

	switch (req->op) {
	case FXM_OP_RDMA_WRITE:
	case FXM_OP_RDMA_WRITE_IMM: {
		int imm = req->op == FXM_OP_RDMA_WRITE_IMM;

		if (duplicate) {   /* already written (a WRITE is idempotent), already received */
			answer(req, lport, FXM_MSG_ACK, 0, 0, 0);
			return;
		}
		if (len && (!(qp->access & IBV_ACCESS_REMOTE_WRITE) ||
			    !fxm_mr_check(qp->pd, req->rkey, req->raddr, len,
					  IBV_ACCESS_REMOTE_WRITE, 1, &synd))) {
			refuse(qp, req, lport, FXM_SYND_REMOTE_ACCESS);
			return;
		}
		if (imm) {
			int rc = take_receive(qp, 0, &synd, sg, &nsg);

			if (rc > 0) {
				answer(req, lport, FXM_MSG_RNR, 0, 0, 0);
				return;
			}
		}
		if (len && (req->inline_len ? (memcpy((void *)(uintptr_t)req->raddr, inl, len), 0) :
			    move(req, (uint8_t *)(uintptr_t)req->raddr, len, 1))) {
			refuse(qp, req, lport, FXM_SYND_REMOTE_OP);
			return;
		}
		if (imm)
			recv_cqe(qp, FXM_CQE_RESP_WR_IMM, 0, (uint32_t)len, req->imm);
		break;
	}
	case FXM_OP_SEND:
	case FXM_OP_SEND_IMM: {
		int rc;

		if (duplicate) {
			answer(req, lport, FXM_MSG_ACK, 0, 0, 0);
			return;
		}
		rc = take_receive(qp, len, &synd, sg, &nsg);
		if (rc > 0) {
			answer(req, lport, FXM_MSG_RNR, 0, 0, 0);
			return;
		}
		if (rc < 0) {
			/* Our receive cannot take it: a local error here, an invalid request
			 * for the requester (IB spec). */
			recv_cqe(qp, FXM_CQE_RESP_ERR, (uint8_t)synd, 0, 0);
			refuse(qp, req, lport, FXM_SYND_REMOTE_INVAL_REQ);
			return;
		}
		if (len) {
			uint8_t *tmp = req->inline_len ? NULL : malloc(len);
			const uint8_t *src = req->inline_len ? inl : tmp;
			uint64_t off = 0;

			if (!req->inline_len && (!tmp || move(req, tmp, len, 1))) {
				free(tmp);
				refuse(qp, req, lport, FXM_SYND_REMOTE_OP);
				return;
			}
			for (uint32_t i = 0; i < nsg && off < len; i++) {
				uint64_t n = sg[i].iov_len < len - off ? sg[i].iov_len : len - off;

				memcpy(sg[i].iov_base, src + off, n);
				off += n;
			}
			free(tmp);
		}
		recv_cqe(qp, req->op == FXM_OP_SEND_IMM ? FXM_CQE_RESP_SEND_IMM : FXM_CQE_RESP_SEND, 0,
			 (uint32_t)len, req->imm);
		break;
	}
	case FXM_OP_RDMA_READ:
		if (!(qp->access & IBV_ACCESS_REMOTE_READ) ||
		    !fxm_mr_check(qp->pd, req->rkey, req->raddr, len, IBV_ACCESS_REMOTE_READ, 1,
				  &synd)) {
			refuse(qp, req, lport, FXM_SYND_REMOTE_ACCESS);
			return;
		}
		if (len && move(req, (uint8_t *)(uintptr_t)req->raddr, len, 0)) {
			refuse(qp, req, lport, FXM_SYND_REMOTE_OP);
			return;
		}
		answer(req, lport, FXM_MSG_ACK, 0, (uint32_t)len, 0);
		return;
	case FXM_OP_ATOMIC_FA: {
		uint64_t old = 0;

		if (duplicate) {  /* answer with the value it returned the first time */
			for (uint32_t i = 0; i < FXM_ATOMIC_CACHE; i++)
				if (qp->atomic_cache[i].psn == req->psn) {
					answer(req, lport, FXM_MSG_ACK, 0, 8, qp->atomic_cache[i].old);
					return;
				}
			return;
		}
		if (req->raddr & 7) {
			refuse(qp, req, lport, FXM_SYND_REMOTE_INVAL_REQ);
			return;
		}
		if (!(qp->access & IBV_ACCESS_REMOTE_ATOMIC) ||
		    !fxm_mr_check(qp->pd, req->rkey, req->raddr, 8, IBV_ACCESS_REMOTE_ATOMIC, 1,
				  &synd)) {
			refuse(qp, req, lport, FXM_SYND_REMOTE_ACCESS);
			return;
		}
		old = __atomic_fetch_add((uint64_t *)(uintptr_t)req->raddr, req->add, __ATOMIC_SEQ_CST);
		qp->atomic_cache[qp->atomic_cache_next].psn = req->psn;
		qp->atomic_cache[qp->atomic_cache_next].old = old;
		qp->atomic_cache_next = (qp->atomic_cache_next + 1) % FXM_ATOMIC_CACHE;
		answer(req, lport, FXM_MSG_ACK, 0, 8, old);
		return;
	}
	default:
		refuse(qp, req, lport, FXM_SYND_REMOTE_INVAL_REQ);
		return;
	}
	answer(req, lport, FXM_MSG_ACK, 0, 0, 0);
}

static void on_request(uint8_t lport, const struct fxm_msg *req, const uint8_t *inl)
{
	struct fxm_qp *qp;
	int order;

	pthread_mutex_lock(&fxm.lock);
	qp = fxm_qp_find_locked(req->dqpn);
	pthread_mutex_unlock(&fxm.lock);
	if (!qp || qp->port != lport || (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS) ||
	    qp->remote_qpn != req->sqpn || memcmp(&qp->rgid, &req->sgid, sizeof(qp->rgid))) {
		if (fxm_verbose())
			fxm_log("dropped a request for QP 0x%x from QP 0x%x: %s", req->dqpn, req->sqpn,
				!qp ? "no such QP" : qp->port != lport ? "another port" :
				qp->state == IBV_QPS_ERR ? "QP in error" :
				qp->state < IBV_QPS_RTR ? "QP not ready" : "not the connected peer");
		answer(req, lport, FXM_MSG_DROP, 0, 0, 0);
		return;
	}
	order = psn_cmp(req->psn, qp->expected_psn);
	if (order > 0) {   /* a request after one we did not take: out of sequence */
		if (fxm_verbose())
			fxm_log("QP 0x%x: request PSN %u out of sequence (expected %u)", qp->qpn,
				req->psn, qp->expected_psn);
		answer(req, lport, FXM_MSG_DROP, 0, 0, 0);
		return;
	}
	if (order == 0) {
		uint32_t before = qp->rq_ci;

		execute(qp, req, inl, lport, 0);
		/* An RNR NAK does not advance: the same PSN comes again. */
		if (qp->state != IBV_QPS_ERR &&
		    !((req->op == FXM_OP_SEND || req->op == FXM_OP_SEND_IMM ||
		       req->op == FXM_OP_RDMA_WRITE_IMM) && qp->rq_ci == before))
			qp->expected_psn = (qp->expected_psn + 1) & 0xffffffu;
		return;
	}
	execute(qp, req, inl, lport, 1);
}

static void on_answer(const struct fxm_msg *m)
{
	struct fxm_qp *qp;

	pthread_mutex_lock(&fxm.lock);
	qp = fxm_qp_find_locked(m->dqpn);
	pthread_mutex_unlock(&fxm.lock);
	if (qp && qp->remote_qpn == m->sqpn)
		fxm_req_answer(qp, m);
}

void fxm_rx(uint8_t lport, const uint8_t *buf, uint32_t len)
{
	struct fxm_msg m;

	if (len < sizeof(m))
		return;
	memcpy(&m, buf, sizeof(m));
	if (m.inline_len > FXM_MAX_INLINE || len != sizeof(m) + m.inline_len || m.nsge > FXM_MAX_SGE)
		return;
	if (m.kind == FXM_MSG_REQ)
		on_request(lport, &m, buf + sizeof(m));
	else
		on_answer(&m);
}

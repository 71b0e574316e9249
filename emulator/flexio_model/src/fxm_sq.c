/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The requester half of the emulated NIC (fxm_nic.c has the whole picture): which port
 * and peer a QP's request goes to, and the execution of the WQEs software rang the
 * doorbell for, read from the SQ buffer in mlx5 layout (big endian; a WQE may wrap past
 * the end of the ring) with every local key checked, sent to the responder's NIC and
 * kept in flight until answered, resent after the QP's ACK timeout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fxm.h"
#include "fxm_msg.h"
#include "fxm_wire.h"

/* ------------------------------------------------------------------ addressing */

/* The port address a GID names: ::ffff:a.b.c.d, or the model's fe80:: form (fxm_wire.c). */
uint32_t fxm_gid_ipv4(const union ibv_gid *g)
{
	return (uint32_t)g->raw[12] << 24 | (uint32_t)g->raw[13] << 16 |
	       (uint32_t)g->raw[14] << 8 | g->raw[15];
}

/* Where a QP's packets go, or -1 if the fabric cannot carry them: another port is only
 * reached through a router, which forwards RoCE v2 between routable addresses. */
static int route(const struct fxm_qp *qp, uint32_t *dst)
{
	struct fxm_port *lp = fxm_port(qp->port);

	if (!lp)
		return -1;
	*dst = fxm_gid_ipv4(&qp->rgid);
	if (*dst == lp->ipv4)
		return 0;
	if (qp->sgid_index >= FXM_GIDS_PER_PORT ||
	    !fxm_gid_is_routable(&lp->gid[qp->sgid_index], lp->gid_type[qp->sgid_index]) ||
	    !fxm_gid_is_routable(&qp->rgid, IBV_GID_TYPE_ROCE_V2))
		return -1;
	return 0;
}

int fxm_nic_send(uint8_t lport, uint32_t dst, const struct fxm_msg *m, const void *payload,
		 uint32_t plen)
{
	uint8_t buf[sizeof(*m) + FXM_MAX_INLINE];

	if (plen > FXM_MAX_INLINE)
		return -1;
	memcpy(buf, m, sizeof(*m));
	if (plen)
		memcpy(buf + sizeof(*m), payload, plen);
	return fxm_wire_send(lport, dst, buf, (uint32_t)sizeof(*m) + plen);
}

/* Fault injection: a port that sent its quota goes down for good. */
static void account_sent(uint8_t lport, uint64_t bytes)
{
	struct fxm_port *p = fxm_port(lport);

	if (!p || !p->up || p->down_after == UINT64_MAX)
		return;
	p->sent += bytes;
	if (p->sent >= p->down_after) {
		fxm_log("port %u (rail %u) goes down after %llu bytes (OFFLOAD_FXM_PORT_FAULTS)",
			p->num, p->num - 1u, (unsigned long long)p->sent);
		fxm_wire_port_down(p->num);
	}
}

/* ------------------------------------------------------------------ executing WQEs */

static const uint8_t *seg_at(const struct fxm_qp *qp, uint32_t bb, uint32_t seg)
{
	uint32_t mask = (4u << qp->log_sq) - 1;

	return qp->sq + 16ull * ((bb * 4 + seg) & mask);
}

/* Add an entry for the WQE at bb; msg NULL for one that completes locally. */
static struct fxm_inflight *enqueue(struct fxm_qp *qp, uint32_t bb, uint32_t nbb, uint32_t opcode,
				    int signaled)
{
	struct fxm_inflight *e;

	e = &qp->inflight[(qp->head_inflight + qp->n_inflight) & (qp->cap_inflight - 1)];
	memset(e, 0, sizeof(*e));
	e->wqe_index = bb;
	e->nbb = nbb;
	e->opcode = opcode;
	e->signaled = signaled;
	qp->n_inflight++;
	return e;
}

/* Build the request of the WQE at bb into m; 0, or the syndrome of a local error. */
static uint32_t build(struct fxm_qp *qp, uint32_t bb, uint32_t opcode, uint32_t ds,
		      struct fxm_msg *m, uint8_t *inl, uint32_t *inl_len)
{
	uint32_t first = 1, synd = 0;
	int rdma = opcode == FXM_OP_RDMA_WRITE || opcode == FXM_OP_RDMA_WRITE_IMM ||
		   opcode == FXM_OP_RDMA_READ || opcode == FXM_OP_ATOMIC_FA;
	int local_write = opcode == FXM_OP_RDMA_READ || opcode == FXM_OP_ATOMIC_FA;

	if (rdma) {
		const uint8_t *r = seg_at(qp, bb, 1);

		if (ds < 2)
			return FXM_SYND_LOCAL_QP_OP;
		m->raddr = fxm_be64(r);
		m->rkey = fxm_be32(r + 8);
		first = 2;
	}
	if (opcode == FXM_OP_ATOMIC_FA) {
		const uint8_t *a = seg_at(qp, bb, 2);

		if (ds != 4)
			return FXM_SYND_LOCAL_QP_OP;
		m->add = fxm_be64(a);
		first = 3;
	}
	*inl_len = 0;
	for (uint32_t s = first; s < ds; s++) {
		const uint8_t *d = seg_at(qp, bb, s);
		uint32_t bc = fxm_be32(d);

		if (bc & FXM_INLINE_SEG) {
			/* Inline: 4-byte count, then the bytes, running on into the next
			 * segments (and around the ring). */
			uint32_t len = bc & ~FXM_INLINE_SEG;

			if (local_write || len > FXM_MAX_INLINE || 4 + len > (ds - s) * 16)
				return FXM_SYND_LOCAL_LENGTH;
			for (uint32_t i = 0; i < len; i++)
				inl[i] = seg_at(qp, bb, s + (4 + i) / 16)[(4 + i) % 16];
			*inl_len = len;
			m->length += len;
			s += (4 + len + 15) / 16 - 1;
			continue;
		}
		{
			uint64_t len = bc ? bc : 0x80000000ull;   /* 0 means 2 GiB (mlx5 PRM) */
			uint32_t lkey = fxm_be32(d + 4);
			uint64_t addr = fxm_be64(d + 8);

			if (m->nsge == FXM_MAX_SGE)
				return FXM_SYND_LOCAL_LENGTH;
			if (!fxm_mr_check(qp->pd, lkey, addr, len,
					  local_write ? IBV_ACCESS_LOCAL_WRITE : 0, 0, &synd))
				return synd;
			m->sge[m->nsge].addr = addr;
			m->sge[m->nsge].len = len;
			m->nsge++;
			m->length += len;
		}
	}
	if (opcode == FXM_OP_ATOMIC_FA && (m->nsge != 1 || m->sge[0].len != 8))
		return FXM_SYND_LOCAL_LENGTH;
	return 0;
}

/* Execute the doorbelled WQEs of qp that may go now. */
void fxm_run_sq(struct fxm_qp *qp)
{
	uint32_t dst = 0;

	while (qp->sq_next != qp->sq_db) {
		uint32_t bb = qp->sq_next;
		const uint8_t *ctrl = seg_at(qp, bb, 0);
		uint32_t idx_op = fxm_be32(ctrl), qpn_ds = fxm_be32(ctrl + 4), fm = fxm_be32(ctrl + 8) & 0xff;
		uint32_t opcode = idx_op & 0xff, ds = qpn_ds & 0x3f, nbb = ds ? (ds + 3) / 4 : 1;
		int signaled = ((fm & FXM_WQE_CE_MASK) >> FXM_WQE_CE_SHIFT) == 2 || qp->sq_sig_all;
		uint8_t inl[FXM_MAX_INLINE];
		uint32_t inl_len = 0, synd = 0;
		struct fxm_inflight *e;
		struct fxm_msg m;

		if (qp->state == IBV_QPS_ERR) {
			fxm_flush_all(qp);
			return;
		}
		if (qp->state != IBV_QPS_RTS || qp->n_inflight == qp->cap_inflight)
			return;
		if ((fm & FXM_WQE_FENCE_MASK) && qp->reads_inflight)
			return;   /* resumed when the READs/atomics before the fence completed */
		/* The WQE must say it is the one at this index, of this QP, with a sane size. */
		if (((idx_op >> 8) & 0xffff) != (bb & 0xffff) || (qpn_ds >> 8) != qp->qpn || !ds ||
		    nbb > (1u << qp->log_sq)) {
			fxm_log("QP 0x%x: malformed WQE at %u (index %u, qpn 0x%x, ds %u)", qp->qpn,
				bb, (idx_op >> 8) & 0xffff, qpn_ds >> 8, ds);
			e = enqueue(qp, bb, 1, opcode, 1);
			e->psn = FXM_SYND_LOCAL_QP_OP;
			qp->sq_next = qp->sq_db;
			fxm_complete_locals(qp);
			return;
		}
		qp->sq_next += nbb;
		if (opcode == FXM_OP_NOP) {
			enqueue(qp, bb, nbb, opcode, signaled);
			fxm_complete_locals(qp);
			continue;
		}
		memset(&m, 0, sizeof(m));
		if (opcode != FXM_OP_RDMA_WRITE && opcode != FXM_OP_RDMA_WRITE_IMM &&
		    opcode != FXM_OP_SEND && opcode != FXM_OP_SEND_IMM &&
		    opcode != FXM_OP_RDMA_READ && opcode != FXM_OP_ATOMIC_FA)
			synd = FXM_SYND_LOCAL_QP_OP;
		else
			synd = build(qp, bb, opcode, ds, &m, inl, &inl_len);
		if (!synd && route(qp, &dst))
			dst = 0;  /* unroutable: the request leaves and is never answered */
		e = enqueue(qp, bb, nbb, opcode, signaled);
		if (synd) {
			e->psn = synd;
			fxm_complete_locals(qp);
			if (qp->state == IBV_QPS_ERR)
				return;
			continue;
		}
		if (fxm_verbose() > 1)
			fxm_log("QP 0x%x WQE %u: op 0x%x raddr 0x%llx rkey 0x%x len %llu%s", qp->qpn, bb,
				opcode, (unsigned long long)m.raddr, m.rkey,
				(unsigned long long)m.length, signaled ? " signaled" : "");
		m.kind = FXM_MSG_REQ;
		m.op = opcode;
		m.src_ipv4 = fxm_port(qp->port)->ipv4;
		m.dst_ipv4 = dst;
		m.sqpn = qp->qpn;
		m.dqpn = qp->remote_qpn;
		m.psn = qp->next_psn;
		m.pid = (int32_t)getpid();
		m.sgid = fxm_port(qp->port)->gid[qp->sgid_index % FXM_GIDS_PER_PORT];
		m.dgid = qp->rgid;
		if (opcode == FXM_OP_RDMA_WRITE_IMM || opcode == FXM_OP_SEND_IMM)
			memcpy(&m.imm, ctrl + 12, 4);
		m.inline_len = inl_len;
		qp->next_psn = (qp->next_psn + 1) & 0xffffffu;
		e->psn = m.psn;
		e->bytes = (uint32_t)m.length;
		e->nsge = m.nsge;
		memcpy(e->sge, m.sge, sizeof(e->sge));
		e->msg_len = (uint32_t)sizeof(m) + inl_len;
		e->msg = malloc(e->msg_len);
		if (!e->msg) {
			e->psn = FXM_SYND_LOCAL_QP_OP;
			fxm_complete_locals(qp);
			return;
		}
		memcpy(e->msg, &m, sizeof(m));
		memcpy(e->msg + sizeof(m), inl, inl_len);
		if (opcode == FXM_OP_RDMA_READ || opcode == FXM_OP_ATOMIC_FA)
			qp->reads_inflight++;
		if (!dst || fxm_wire_send(qp->port, dst, e->msg, e->msg_len)) {
			if (fxm_verbose())
				fxm_log("QP 0x%x: request PSN %u could not be sent", qp->qpn, e->psn);
			if (!qp->deadline_ns)
				qp->deadline_ns = fxm_now_ns() + fxm_ack_timeout_ns(qp);
		}
		if (opcode != FXM_OP_RDMA_READ)
			account_sent(qp->port, m.length);
	}
}

/* Send every outstanding request again (go back N: the responder dropped the ones after
 * the first it did not take, and answers duplicates of those it did). */
static void resend(struct fxm_qp *qp)
{
	uint32_t dst = 0;
	int ok = !route(qp, &dst);

	for (uint32_t i = 0; i < qp->n_inflight; i++) {
		struct fxm_inflight *e = &qp->inflight[(qp->head_inflight + i) & (qp->cap_inflight - 1)];

		if (!e->msg)
			continue;
		if (!ok || fxm_wire_send(qp->port, dst, e->msg, e->msg_len)) {
			qp->deadline_ns = fxm_now_ns() + fxm_ack_timeout_ns(qp);
			return;
		}
	}
}

/* Timers of a QP with requests out; returns the next time it needs looking at, or 0. */
uint64_t fxm_qp_timers(struct fxm_qp *qp, uint64_t now)
{
	uint32_t dst = 0;

	if (qp->state == IBV_QPS_ERR || !qp->n_inflight)
		return 0;
	if (qp->rnr_until_ns) {
		if (now < qp->rnr_until_ns)
			return qp->rnr_until_ns;
		qp->rnr_until_ns = 0;
		resend(qp);
	}
	/* A connection that broke (or a route that never was) loses what is on it. */
	if (!qp->deadline_ns && (route(qp, &dst) || !fxm_wire_alive(qp->port, dst))) {
		if (fxm_verbose())
			fxm_log("QP 0x%x: %s; its requests are lost", qp->qpn,
				route(qp, &dst) ? "no route" : "the connection is down");
		qp->deadline_ns = now + fxm_ack_timeout_ns(qp);
	}
	if (!qp->deadline_ns)
		return now + 5000000ull;   /* look at the connection again in 5 ms */
	if (now < qp->deadline_ns)
		return qp->deadline_ns;
	qp->deadline_ns = 0;
	if (++qp->attempts > qp->retry_cnt) {
		fxm_push_req_cqe(qp, fxm_inflight_head(qp)->wqe_index, FXM_CQE_REQ_ERR, FXM_SYND_TRANSPORT_RETRY_EXC, 0);
		fxm_inflight_pop(qp);
		fxm_qp_to_error(qp);
		return 0;
	}
	resend(qp);
	return now + 1000000ull;
}

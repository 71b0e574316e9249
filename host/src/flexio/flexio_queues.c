/* SPDX-License-Identifier: Apache-2.0 */
/* The FlexIO backend: queues in DPA memory, the host loopback, connecting them. */
#define _GNU_SOURCE
#include "flexio_backend.h"

/* ------------------------------------------------------------------ DPA queues */

static enum flexio_qp_qpc_mtu fx_mtu(enum ibv_mtu m)
{
	switch (m) {
	case IBV_MTU_256: return FLEXIO_QP_QPC_MTU_BYTES_256;
	case IBV_MTU_512: return FLEXIO_QP_QPC_MTU_BYTES_512;
	case IBV_MTU_1024: return FLEXIO_QP_QPC_MTU_BYTES_1K;
	case IBV_MTU_2048: return FLEXIO_QP_QPC_MTU_BYTES_2K;
	default: return FLEXIO_QP_QPC_MTU_BYTES_4K;
	}
}

/* A CQ whose events run this thread's handler; ring and record live in DPA memory. */
static int fx_dcq_create(struct fx_device *d, struct fx_thread *t, uint32_t log_depth, int wake,
			 struct fx_dcq *c)
{
	size_t bytes = (size_t)64 << log_depth;
	uint8_t *ring = calloc(1, bytes);
	uint32_t dbr[2] = { 0, 0 };
	struct flexio_cq_attr a;
	flexio_uintptr_t ring_d = 0, dbr_d = 0;
	int rc = -EIO;

	if (!ring)
		return -ENOMEM;
	/* Owner bit 1 and an invalid opcode: hardware writes owner 0 on its first pass. */
	for (size_t i = 63; i < bytes; i += 64)
		ring[i] = FX_MLX5_CQE_INVALID | 1u;
	if (fx_fail(flexio_copy_from_host(d->proc, ring, bytes, &ring_d), "flexio_copy_from_host") ||
	    fx_fail(flexio_copy_from_host(d->proc, dbr, sizeof(dbr), &dbr_d), "flexio_copy_from_host"))
		goto out;
	memset(&a, 0, sizeof(a));
	a.log_cq_depth = (uint8_t)log_depth;
	a.element_type = FLEXIO_CQ_ELEMENT_TYPE_DPA_THREAD;
	a.thread = flexio_event_handler_get_thread(t->eh);
	a.uar_id = flexio_uar_get_id(d->uar);
	a.cq_ring_qmem.memtype = FLEXIO_MEMTYPE_DPA;
	a.cq_ring_qmem.daddr = ring_d;
	a.cq_dbr_daddr = dbr_d;
	a.overrun_ignore = wake ? 1 : 0;  /* sibling triggers nobody consumes must not break it */
	if (fx_fail(flexio_cq_create(d->proc, NULL, &a, &c->cq), "flexio_cq_create"))
		goto out;
	c->desc = (struct offload_flexio_cq){ .ring_daddr = ring_d, .dbr_daddr = dbr_d,
		.cqn = flexio_cq_get_cq_num(c->cq), .log_depth = log_depth };
	rc = 0;
out:
	free(ring);
	return rc;
}

/*
 * An RC QP with its WQ buffer (RQ first, then SQ, as FlexIO expects), doorbell record and
 * wr_id slots in DPA memory. Every receive WQE is posted up front (a zero-length scatter
 * list): control writes and signals only need the CQE; the DPA reposts by bumping the count.
 */
static int fx_dqp_create(struct fx_device *d, const struct fx_dcq *cq, uint32_t log_sq,
			 uint32_t log_rq, uint32_t uidx, uint32_t peer, uint32_t rail,
			 struct fx_dqp *q)
{
	size_t rq_bytes = (size_t)16 << log_rq, sq_bytes = (size_t)64 << log_sq;
	size_t slot_bytes = (size_t)OFFLOAD_FLEXIO_SQ_SLOT_BYTES << log_sq;
	uint32_t *rq = calloc(1, rq_bytes);
	uint32_t dbr[2] = { htobe32(1u << log_rq), 0 };
	flexio_uintptr_t wq = 0, dbr_d = 0, slots = 0;
	struct flexio_qp_attr a;
	int rc = -EIO;

	if (!rq)
		return -ENOMEM;
	for (size_t i = 0; i < rq_bytes / 16; i++)
		rq[i * 4 + 1] = htobe32(FX_MLX5_INVALID_LKEY);
	if (fx_fail(flexio_buf_dev_alloc(d->proc, rq_bytes + sq_bytes, &wq), "flexio_buf_dev_alloc") ||
	    fx_fail(flexio_host2dev_memcpy(d->proc, rq, rq_bytes, wq), "flexio_host2dev_memcpy") ||
	    fx_fail(flexio_buf_dev_memset(d->proc, 0, sq_bytes, wq + rq_bytes), "flexio_buf_dev_memset") ||
	    fx_fail(flexio_copy_from_host(d->proc, dbr, sizeof(dbr), &dbr_d), "flexio_copy_from_host") ||
	    fx_fail(flexio_buf_dev_alloc(d->proc, slot_bytes, &slots), "flexio_buf_dev_alloc") ||
	    fx_fail(flexio_buf_dev_memset(d->proc, 0, slot_bytes, slots), "flexio_buf_dev_memset"))
		goto out;
	memset(&a, 0, sizeof(a));
	a.transport_type = FLEXIO_QPC_ST_RC;
	a.uar_id = flexio_uar_get_id(d->uar);
	a.user_index = uidx;
	a.qp_access_mask = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_ATOMIC;
	a.pd = d->pd;
	a.log_sq_depth = (int)log_sq;
	a.sq_cqn = cq->desc.cqn;
	a.log_rq_depth = (int)log_rq;
	a.rq_type = FLEXIO_QP_QPC_RQ_TYPE_REGULAR;
	a.rq_cqn = cq->desc.cqn;
	a.qp_wq_buff_qmem.memtype = FLEXIO_MEMTYPE_DPA;
	a.qp_wq_buff_qmem.daddr = wq;
	a.qp_wq_dbr_qmem.memtype = FLEXIO_MEMTYPE_DPA;
	a.qp_wq_dbr_qmem.daddr = dbr_d;
	if (fx_fail(flexio_qp_create(d->proc, NULL, &a, &q->qp), "flexio_qp_create"))
		goto out;
	q->desc = (struct offload_flexio_qp){ .sq_daddr = wq + rq_bytes, .rq_daddr = wq,
		.dbr_daddr = dbr_d, .slots_daddr = slots, .qpn = flexio_qp_get_qp_num(q->qp),
		.log_sq_depth = log_sq, .log_rq_depth = log_rq, .peer = peer, .rail = rail };
	rc = 0;
out:
	free(rq);
	return rc;
}

/* INIT -> RTR -> RTS towards (rqpn at gid/mac/lid) on a rail. */
int fx_dqp_connect(struct fx_device *d, struct fx_dqp *q, uint32_t rail, uint32_t rqpn,
			  const uint8_t gid[16], const uint8_t mac[6], uint16_t lid, int loopback)
{
	static const enum flexio_qp_state steps[] = {
		FLEXIO_QP_STATE_INIT, FLEXIO_QP_STATE_RTR, FLEXIO_QP_STATE_RTS,
	};
	const struct fx_rail *r = &d->rails[rail];
	struct flexio_qp_attr_opt_param_mask mask;
	struct flexio_qp_attr a;
	uint8_t dmac[6];

	memcpy(dmac, mac, sizeof(dmac));
	memset(&mask, 0, sizeof(mask));
	memset(&a, 0, sizeof(a));
	a.remote_qp_num = rqpn;
	a.qp_access_mask = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_ATOMIC;
	a.dest_mac = dmac;
	memcpy(a.rgid_or_rip.raw, gid, 16);
	a.gid_table_index = (uint8_t)r->gid_index;
	a.rlid = lid;
	a.fl = loopback ? 1 : 0;
	a.grh = r->eth;
	a.min_rnr_nak_timer = 1;  /* receive WQEs come back within microseconds */
	/* unverified: flexio_qp_attr has no rnr_retry; the RQs are sized so none runs dry. */
	a.path_mtu = fx_mtu(r->mtu);
	a.retry_count = 7;
	a.vhca_port_num = r->port;
	a.udp_sport = (uint16_t)(0xc000u | (q->desc.qpn & 0x3fffu));  /* RoCE v2 ECMP entropy */
	a.log_rra_max = 4;  /* RDMA READs and atomics in flight, both directions */
	a.log_sra_max = 4;
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		a.next_state = steps[i];
		if (fx_fail(flexio_qp_modify(q->qp, &a, &mask), "flexio_qp_modify"))
			return -EIO;
	}
	return 0;
}

/* ------------------------------------------------------------------ host loopback */

static int fx_post_host_recv(struct fx_thread *t, uint32_t index)
{
	struct ibv_recv_wr wr = { .wr_id = FX_WR_RECV | index, .sg_list = NULL, .num_sge = 0 }, *bad;

	return ibv_post_recv(t->hqp, &wr, &bad);
}

static int fx_hqp_create(struct fx_device *d, struct fx_thread *t)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = d->hcq, .recv_cq = d->hcq, .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
		.cap = { .max_send_wr = FX_HOST_SQ, .max_recv_wr = FX_HOST_RQ,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	t->hqp = ibv_create_qp(d->pd, &ia);
	if (!t->hqp) {
		fx_log("ibv_create_qp: %s", strerror(errno));
		return -EIO;
	}
	return 0;
}

/* The host end of the loopback, connected to the DPA end on rail 0 of this very port. */
/* A host RC QP through INIT, RTR and RTS towards QP rqpn at dgid on rail's port. */
int fx_host_qp_connect(struct fx_device *d, struct ibv_qp *qp, uint32_t rail, uint32_t rqpn,
		       const union ibv_gid *dgid, int access)
{
	const struct fx_rail *r = &d->rails[rail];
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = r->port;
	a.qp_access_flags = (unsigned)access;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		return -EIO;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = r->mtu;
	a.dest_qp_num = rqpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = r->eth;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = (uint8_t)r->gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.dlid = r->lid;
	a.ah_attr.port_num = r->port;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -EIO;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;       /* 4.096 us << 14 = 67 ms per try */
	a.retry_cnt = 7;
	a.rnr_retry = 7;      /* 7: retry for ever while the other end reposts */
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		return -EIO;
	return 0;
}

/* The host end of the loopback, connected to the DPA end on rail 0 of this very port. */
static int fx_hqp_connect(struct fx_device *d, struct fx_thread *t, uint32_t index)
{
	const struct fx_rail *r = &d->rails[0];

	if (fx_host_qp_connect(d, t->hqp, 0, t->loop.desc.qpn, &r->gid, IBV_ACCESS_LOCAL_WRITE))
		return -EIO;
	for (uint32_t i = 0; i < FX_HOST_RQ; i++)
		if (fx_post_host_recv(t, index))
			return -EIO;
	return fx_dqp_connect(d, &t->loop, 0, t->hqp->qp_num, r->gid.raw, r->mac, r->lid, 1);
}

/* Reap the host CQ: doorbell sends retire, DPA notifies are reposted. Under cq_lock. Which
 * is which comes from the wr_id: an error completion's opcode is undefined (verbs). */
void fx_drain_locked(struct fx_device *d)
{
	struct ibv_wc wc[16];
	int n;

	while ((n = ibv_poll_cq(d->hcq, 16, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			uint32_t index = (uint32_t)wc[i].wr_id & ~FX_WR_RECV;
			struct fx_thread *t;

			if (index >= d->attr.num_threads)
				continue;
			t = &d->threads[index];
			if (wc[i].wr_id & FX_WR_RECV) {
				if (wc[i].status == IBV_WC_SUCCESS)
					fx_post_host_recv(t, index);
			} else if (t->hsq_inflight) {
				t->hsq_inflight--;
			}
		}
	}
}

/* A zero-length SEND to thread index: its receive CQE triggers the thread's handler. */
void fx_ring(struct fx_device *d, uint32_t index)
{
	struct fx_thread *t = &d->threads[index];
	struct ibv_send_wr wr = { .wr_id = index, .opcode = IBV_WR_SEND, .num_sge = 0,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	pthread_mutex_lock(&d->cq_lock);
	if (t->hsq_inflight >= FX_HOST_SQ)
		fx_drain_locked(d);
	/* Still full: doorbells are on their way already and one wakes the thread. */
	if (t->hsq_inflight < FX_HOST_SQ && !ibv_post_send(t->hqp, &wr, &bad))
		t->hsq_inflight++;
	pthread_mutex_unlock(&d->cq_lock);
}

/* ------------------------------------------------------------------ per-thread setup */

int fx_thread_create(struct fx_device *d, uint32_t index)
{
	struct fx_thread *t = &d->threads[index];
	uint32_t size = d->attr.size, cols = size + 1, rq = 1u << d->log_rq;
	struct flexio_event_handler_attr ea;
	uint64_t cqes;
	int rc;

	memset(&ea, 0, sizeof(ea));
	ea.host_stub_func = dpa_offload_event_handler;
	ea.affinity.type = FLEXIO_AFFINITY_NONE;
	if (fx_fail(flexio_event_handler_create(d->proc, &ea, &t->eh), "flexio_event_handler_create"))
		return -EIO;
	/* CQ room: every firmware completion owed, every receive WQE of every QP, and the
	 * periodic signaled notifies of the loopback. */
	cqes = d->max_outstanding + (uint64_t)d->num_rails * cols * rq + (1u << FX_LOOP_LOG_RQ) +
	       (1u << FX_LOOP_LOG_SQ);
	rc = fx_dcq_create(d, t, log2_ceil(cqes), 0, &t->cq);
	if (!rc)
		rc = fx_dcq_create(d, t, 6, 1, &t->wake);
	if (rc)
		return rc;
	t->qps = calloc((size_t)d->num_rails * cols, sizeof(*t->qps));
	if (!t->qps)
		return -ENOMEM;
	for (uint32_t r = 0; r < d->num_rails && !rc; r++) {
		for (uint32_t p = 0; p < size && !rc; p++)
			rc = fx_dqp_create(d, &t->cq, d->log_sq, d->log_rq,
					   OFFLOAD_FLEXIO_UIDX(r, p), p, r, &t->qps[r * cols + p]);
		/* The twin that receives what we send to ourselves: an RC QP pairs with another
		 * (unverified: whether a QP connected to itself would do). */
		if (!rc)
			rc = fx_dqp_create(d, &t->cq, FX_LOOP_LOG_SQ, d->log_rq,
					   OFFLOAD_FLEXIO_UIDX_HOST + 1 + r, d->attr.rank, r,
					   &t->qps[r * cols + size]);
	}
	if (!rc)
		rc = fx_dqp_create(d, &t->cq, FX_LOOP_LOG_SQ, FX_LOOP_LOG_RQ, OFFLOAD_FLEXIO_UIDX_HOST,
				   OFFLOAD_FLEXIO_PEER_HOST, 0, &t->loop);
	if (!rc)
		rc = fx_hqp_create(d, t);
	return rc;
}

/* Everything a DPA thread reads, copied into DPA memory; returns its address in ctx_daddr. */
int fx_thread_publish(struct fx_device *d, uint32_t index, flexio_uintptr_t state,
			     const struct host_fw_windows *win)
{
	struct fx_thread *t = &d->threads[index];
	uint32_t cols = d->attr.size + 1, n = d->num_rails * cols;
	struct offload_flexio_qp *qps = calloc(n, sizeof(*qps));
	struct offload_flexio_thread_ctx ctx;
	flexio_uintptr_t qps_d = 0, hal_d = 0;
	int rc = -EIO;

	if (!qps)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		qps[i] = t->qps[i].desc;
	memset(&ctx, 0, sizeof(ctx));
	ctx = (struct offload_flexio_thread_ctx){
		.magic = OFFLOAD_FLEXIO_CTX_MAGIC, .version = OFFLOAD_FLEXIO_CTX_VERSION,
		.thread_index = index, .num_threads = d->attr.num_threads,
		.world_rank = d->attr.rank, .world_size = d->attr.size,
		.window_id = flexio_window_get_id(d->window), .window_mkey = d->arena_mr->lkey,
		.state_daddr = state, .board_daddr = d->board,
		.scratch_daddr = d->scratch + 8ull * index,
		.scratch_lkey = flexio_mkey_get_id(d->scratch_mkey), .tick_ns = d->tick_ns,
		.max_outstanding = d->max_outstanding, .stop = 0,
		.cq = t->cq.desc, .wake_cq = t->wake.desc, .host_qp = t->loop.desc,
		.num_rails = d->num_rails, .hal_bytes = d->hal_bytes,
		.arena_haddr = (uintptr_t)d->arena,
		.arena_len = d->arena_len,
	};
	ctx.win[OFFLOAD_FLEXIO_WIN_RING] = (struct offload_flexio_window){
		.haddr = (uintptr_t)win->ring, .len = win->ring_len };
	ctx.win[OFFLOAD_FLEXIO_WIN_STATS] = (struct offload_flexio_window){
		.haddr = (uintptr_t)win->stats, .len = win->stats_len };
	ctx.win[OFFLOAD_FLEXIO_WIN_CTRL] = (struct offload_flexio_window){
		.haddr = (uintptr_t)d->ctrl, .len = offload_ctrl_bytes(d->attr.size) };
	for (uint32_t i = 0; i < d->attr.num_threads; i++)
		ctx.wake_cqn[i] = d->threads[i].wake.desc.cqn;
	if (fx_fail(flexio_copy_from_host(d->proc, qps, (size_t)n * sizeof(*qps), &qps_d),
		    "flexio_copy_from_host") ||
	    fx_fail(flexio_buf_dev_alloc(d->proc, d->hal_bytes, &hal_d),
		    "flexio_buf_dev_alloc") ||
	    fx_fail(flexio_buf_dev_memset(d->proc, 0, d->hal_bytes, hal_d),
		    "flexio_buf_dev_memset"))
		goto out;
	ctx.qps_daddr = qps_d;
	ctx.hal_daddr = hal_d;
	if (fx_fail(flexio_copy_from_host(d->proc, &ctx, sizeof(ctx), &t->ctx_daddr),
		    "flexio_copy_from_host"))
		goto out;
	rc = 0;
out:
	free(qps);
	return rc;
}

/* ------------------------------------------------------------------ address exchange */

int fx_exchange(struct fx_device *d, uint32_t **qpns_out)
{
	uint32_t T = d->attr.num_threads, R = d->num_rails, S = d->attr.size, cols = S + 1;
	size_t per_rank = (size_t)T * R * S;
	struct fx_addr me;
	uint32_t *mine = NULL, *all = NULL;
	int rc;

	memset(&me, 0, sizeof(me));
	me = (struct fx_addr){ .magic = FX_ADDR_MAGIC, .rank = d->attr.rank, .num_threads = T,
		.num_rails = R, .ctrl_addr = (uintptr_t)d->ctrl, .ctrl_key = d->ctrl_mr->rkey };
	for (uint32_t r = 0; r < R; r++) {
		memcpy(me.rail[r].gid, d->rails[r].gid.raw, 16);
		me.rail[r].lid = d->rails[r].lid;
		me.rail[r].eth = d->rails[r].eth;
	}
	rc = d->attr.allgather(d->attr.allgather_arg, &me, sizeof(me), d->peers);
	if (rc)
		return rc;
	for (uint32_t p = 0; p < S; p++) {
		if (d->peers[p].magic != FX_ADDR_MAGIC || d->peers[p].rank != p ||
		    d->peers[p].num_threads != T || d->peers[p].num_rails != R) {
			fx_log("rank %u disagrees on threads/rails (%u/%u vs %u/%u)", p,
			       d->peers[p].num_threads, d->peers[p].num_rails, T, R);
			return -EINVAL;
		}
	}
	/* Our QP numbers, [thread][rail][peer], then everyone's. */
	mine = malloc(per_rank * sizeof(*mine));
	all = malloc(per_rank * S * sizeof(*all));
	if (!mine || !all) {
		free(mine);
		free(all);
		return -ENOMEM;
	}
	for (uint32_t t = 0; t < T; t++)
		for (uint32_t r = 0; r < R; r++)
			for (uint32_t p = 0; p < S; p++)
				mine[((size_t)t * R + r) * S + p] = d->threads[t].qps[r * cols + p].desc.qpn;
	rc = d->attr.allgather(d->attr.allgather_arg, mine, (uint32_t)(per_rank * sizeof(*mine)),
			       all);
	free(mine);
	if (rc) {
		free(all);
		return rc;
	}
	*qpns_out = all;
	return 0;
}

/* Our QP (t, r, p) talks to p's QP (t, r, us); our own one to its twin, both ways. */
int fx_connect_all(struct fx_device *d, const uint32_t *qpns)
{
	uint32_t T = d->attr.num_threads, R = d->num_rails, S = d->attr.size, me = d->attr.rank;
	uint32_t cols = S + 1;
	uint8_t *macs = calloc((size_t)R * S, 6);   /* next-hop MAC per (rail, peer) */
	int rc = macs ? 0 : -ENOMEM;

	for (uint32_t r = 0; r < R && !rc; r++)
		for (uint32_t p = 0; p < S && !rc; p++)
			if (p != me)
				rc = fx_dest_mac(d, r, d->peers[p].rail[r].gid,
						 macs + ((size_t)r * S + p) * 6);
	for (uint32_t t = 0; t < T && !rc; t++) {
		struct fx_thread *th = &d->threads[t];

		for (uint32_t r = 0; r < R && !rc; r++) {
			struct fx_dqp *self = &th->qps[r * cols + me], *twin = &th->qps[r * cols + S];
			const struct fx_rail *rl = &d->rails[r];

			for (uint32_t p = 0; p < S && !rc; p++) {
				const struct fx_addr *pa = &d->peers[p];

				if (p == me)
					continue;
				rc = fx_dqp_connect(d, &th->qps[r * cols + p], r,
						    qpns[(((size_t)p * T + t) * R + r) * S + me],
						    pa->rail[r].gid, macs + ((size_t)r * S + p) * 6,
						    pa->rail[r].lid, 0);
			}
			if (!rc)
				rc = fx_dqp_connect(d, self, r, twin->desc.qpn, rl->gid.raw, rl->mac,
						    rl->lid, 1);
			if (!rc)
				rc = fx_dqp_connect(d, twin, r, self->desc.qpn, rl->gid.raw, rl->mac,
						    rl->lid, 1);
		}
		if (!rc)
			rc = fx_hqp_connect(d, th, t);
	}
	free(macs);
	return rc;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer liveness on a card. A dead peer process shows up on the wire only as requests
 * nobody answers, and only to a rank that sends it something; a rank merely waiting for
 * the dead one's data would wait for op_timeout. So a host thread probes every peer on
 * every rail with an 8-byte RDMA READ of its control words every FX_KEEPALIVE_MS, on host
 * QPs of its own (timeout 67 ms, 7 retries: a dead peer is known within ~0.6 s more). A
 * peer whose probes fail on every rail is dead: its bit goes into the ring header's
 * failed_ranks, where the firmware aborts every op of a team it belongs to (naming it),
 * and every DPA thread is rung to see it. A QP whose probe failed stays in error, so a
 * rail once lost to a peer stays lost, as the firmware's rails do.
 */
#define _GNU_SOURCE
#include "flexio_backend.h"

#define FX_KEEPALIVE_MS 200

enum { KA_IDLE = 0, KA_OUT = 1, KA_DEAD = 2 };

static struct ibv_qp *ka_qp(struct fx_device *d, uint32_t rail, uint32_t peer)
{
	return d->ka_qps[(size_t)rail * d->attr.size + peer];
}

/* Keepalive QPs and their CQ, created at open before the exchange. */
int fx_keepalive_create(struct fx_device *d)
{
	uint32_t S = d->attr.size, R = d->num_rails;
	struct ibv_qp_init_attr ia;

	d->ka_cq = ibv_create_cq(d->ibv, (int)(R * S + 1), NULL, NULL, 0);
	d->ka_qps = calloc((size_t)R * S, sizeof(*d->ka_qps));
	d->ka_state = calloc((size_t)R * S, sizeof(*d->ka_state));
	d->ka_buf = aligned_alloc(64, 64ull * R * S);
	if (!d->ka_cq || !d->ka_qps || !d->ka_state || !d->ka_buf)
		return -ENOMEM;
	d->ka_mr = ibv_reg_mr(d->pd, d->ka_buf, 64ull * R * S, IBV_ACCESS_LOCAL_WRITE);
	if (!d->ka_mr)
		return -ENOMEM;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = ia.recv_cq = d->ka_cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap = (struct ibv_qp_cap){ .max_send_wr = 2, .max_recv_wr = 1, .max_send_sge = 1,
				      .max_recv_sge = 1 };
	for (uint32_t r = 0; r < R; r++)
		for (uint32_t p = 0; p < S; p++) {
			if (p == d->attr.rank)
				continue;
			d->ka_qps[(size_t)r * S + p] = ibv_create_qp(d->pd, &ia);
			if (!d->ka_qps[(size_t)r * S + p]) {
				fx_log("keepalive QP: ibv_create_qp: %s", strerror(errno));
				return -EIO;
			}
		}
	return 0;
}

/* Exchange the keepalive QP numbers and connect each to its peer's twin. */
int fx_keepalive_connect(struct fx_device *d)
{
	uint32_t S = d->attr.size, R = d->num_rails, me = d->attr.rank;
	uint32_t *mine = calloc((size_t)R * S, sizeof(*mine));
	uint32_t *all = calloc((size_t)R * S * S, sizeof(*all));
	int rc = !mine || !all ? -ENOMEM : 0;

	for (uint32_t i = 0; !rc && i < R * S; i++)
		mine[i] = d->ka_qps[i] ? d->ka_qps[i]->qp_num : 0;
	if (!rc)
		rc = d->attr.allgather(d->attr.allgather_arg, mine, (uint32_t)(R * S * sizeof(*mine)),
				       all);
	for (uint32_t r = 0; !rc && r < R; r++)
		for (uint32_t p = 0; !rc && p < S; p++) {
			union ibv_gid g;

			if (p == me)
				continue;
			memcpy(g.raw, d->peers[p].rail[r].gid, 16);
			rc = fx_host_qp_connect(d, ka_qp(d, r, p), r, all[((size_t)p * R + r) * S + me],
						&g, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		}
	free(mine);
	free(all);
	return rc;
}

static void mark_dead(struct fx_device *d, uint32_t peer)
{
	struct offload_ring_hdr *ring = (struct offload_ring_hdr *)d->arena;

	fx_log("rank %u does not answer on any rail: it is failed", peer);
	__atomic_fetch_or(&ring->failed_ranks, 1ull << peer, __ATOMIC_SEQ_CST);
	for (uint32_t t = 0; t < d->attr.num_threads; t++)
		fx_ring(d, t);
}

static void reap(struct fx_device *d)
{
	uint32_t S = d->attr.size, R = d->num_rails;
	struct ibv_wc wc[16];
	int n;

	while ((n = ibv_poll_cq(d->ka_cq, 16, wc)) > 0)
		for (int i = 0; i < n; i++) {
			uint32_t idx = (uint32_t)wc[i].wr_id, peer = idx % S, alive = 0;

			if (idx >= R * S)
				continue;
			d->ka_state[idx] = wc[i].status == IBV_WC_SUCCESS ? KA_IDLE : KA_DEAD;
			if (d->ka_state[idx] != KA_DEAD)
				continue;
			for (uint32_t r = 0; r < R; r++)
				alive |= d->ka_state[(size_t)r * S + peer] != KA_DEAD;
			if (!alive)
				mark_dead(d, peer);
		}
}

static void probe(struct fx_device *d, uint32_t rail, uint32_t peer)
{
	uint32_t idx = rail * d->attr.size + peer;
	struct ibv_sge sge = { .addr = (uintptr_t)(d->ka_buf + 64ull * idx), .length = 8,
			       .lkey = d->ka_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = idx, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = d->peers[peer].ctrl_addr;
	wr.wr.rdma.rkey = d->peers[peer].ctrl_key;
	if (!ibv_post_send(ka_qp(d, rail, peer), &wr, &bad))
		d->ka_state[idx] = KA_OUT;
}

static void *keepalive_main(void *arg)
{
	struct fx_device *d = arg;
	struct timespec tick = { 0, FX_KEEPALIVE_MS * 1000000l };

	pthread_setname_np(pthread_self(), "dpa-keepalive");
	while (!__atomic_load_n(&d->ka_stop, __ATOMIC_ACQUIRE)) {
		struct offload_ring_hdr *ring = (struct offload_ring_hdr *)d->arena;
		uint64_t failed = __atomic_load_n(&ring->failed_ranks, __ATOMIC_ACQUIRE);

		reap(d);
		for (uint32_t r = 0; r < d->num_rails; r++)
			for (uint32_t p = 0; p < d->attr.size; p++)
				if (p != d->attr.rank && !(failed & (1ull << p)) &&
				    d->ka_state[(size_t)r * d->attr.size + p] == KA_IDLE)
					probe(d, r, p);
		nanosleep(&tick, NULL);
	}
	return NULL;
}

int fx_keepalive_start(struct fx_device *d)
{
	if (d->attr.size < 2)
		return 0;
	if (pthread_create(&d->ka_thread, NULL, keepalive_main, d))
		return -EAGAIN;
	d->ka_running = 1;
	return 0;
}

void fx_keepalive_stop(struct fx_device *d)
{
	uint32_t n = d->num_rails * d->attr.size;

	if (d->ka_running) {
		__atomic_store_n(&d->ka_stop, 1, __ATOMIC_RELEASE);
		pthread_join(d->ka_thread, NULL);
		d->ka_running = 0;
	}
	for (uint32_t i = 0; d->ka_qps && i < n; i++)
		if (d->ka_qps[i])
			ibv_destroy_qp(d->ka_qps[i]);
	if (d->ka_mr)
		ibv_dereg_mr(d->ka_mr);
	if (d->ka_cq)
		ibv_destroy_cq(d->ka_cq);
	free(d->ka_qps);
	free(d->ka_state);
	free(d->ka_buf);
	d->ka_qps = NULL;
	d->ka_state = NULL;
	d->ka_buf = NULL;
	d->ka_mr = NULL;
	d->ka_cq = NULL;
}

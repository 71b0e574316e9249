/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer liveness on a card. A dead peer process shows up on the wire only as requests
 * nobody answers, and only to a rank that sends it something; a rank merely waiting for
 * the dead one's data would wait for op_timeout. So a host thread probes every peer on
 * every rail with an 8-byte RDMA READ of its control words every FX_KEEPALIVE_MS, on host
 * QPs of its own (timeout 67 ms, 7 retries: a dead peer is known within ~0.6 s more). A
 * peer whose probes fail on every rail is dead: its bit goes into the ring header's
 * failed set, where the firmware aborts every op of a team it belongs to (naming it),
 * and every DPA thread is rung to see it. A QP whose probe failed stays in error, so a
 * rail once lost to a peer stays lost, as the firmware's rails do.
 *
 * A rank that closes its context cleanly says so first: a zero-length SEND to every peer on
 * the keepalive QPs (each has one receive posted for it). A peer that receives it puts the
 * rank into the ring header's closed set (the firmware fails ops waiting for it with
 * OFFLOAD_ERR_PEER_CLOSED) and stops probing it, so it is closed, not failed.
 */
#define _GNU_SOURCE
#include "flexio_backend.h"

#include <sys/eventfd.h>

#define FX_KEEPALIVE_MS 200
#define FX_CLOSE_WAIT_MS 250          /* a closing rank waits this long for its notices */
#define FX_KA_RECV  (1ull << 62)      /* wr_id flags: the receive of a peer's close notice, */
#define FX_KA_CLOSE (1ull << 61)      /* our close notice (else a probe) */

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

	/* A probe, a close notice and a receive per QP can be on it at once. */
	d->ka_wake = eventfd(0, EFD_CLOEXEC);
	d->ka_chan = ibv_create_comp_channel(d->ibv);
	d->ka_cq = d->ka_chan ? ibv_create_cq(d->ibv, (int)(3 * R * S + 1), NULL, d->ka_chan, 0) :
		   NULL;
	d->ka_qps = calloc((size_t)R * S, sizeof(*d->ka_qps));
	d->ka_state = calloc((size_t)R * S, sizeof(*d->ka_state));
	d->ka_buf = aligned_alloc(64, 64ull * R * S);
	if (d->ka_wake < 0 || !d->ka_cq || !d->ka_qps || !d->ka_state || !d->ka_buf)
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
			if (!rc) {  /* for the peer's close notice */
				struct ibv_recv_wr wr = { .wr_id = FX_KA_RECV | (r * S + p),
							  .num_sge = 0 }, *bad;

				rc = ibv_post_recv(ka_qp(d, r, p), &wr, &bad) ? -EIO : 0;
			}
		}
	free(mine);
	free(all);
	return rc;
}

/* The ring header's failed (closed = 0) or closed set, in the arena. */
static uint64_t *ring_set(struct fx_device *d, int closed)
{
	struct offload_ring_hdr *ring = (struct offload_ring_hdr *)d->arena;

	return (uint64_t *)(d->arena + (closed ? ring->closed_off : ring->failed_off));
}

static void mark_dead(struct fx_device *d, uint32_t peer)
{
	struct offload_ring_hdr *ring = (struct offload_ring_hdr *)d->arena;

	fx_log("rank %u does not answer on any rail: it is failed", peer);
	offload_rankset_add(ring_set(d, 0), &ring->failed_gen, peer);
	for (uint32_t t = 0; t < d->attr.num_threads; t++)
		fx_ring(d, t);
}

static void mark_closed(struct fx_device *d, uint32_t peer)
{
	struct offload_ring_hdr *ring = (struct offload_ring_hdr *)d->arena;

	offload_rankset_add(ring_set(d, 1), &ring->closed_gen, peer);
	for (uint32_t t = 0; t < d->attr.num_threads; t++)
		fx_ring(d, t);
}

/* Whether peer is failed or closed: the ring header's rank sets, a bit per rank of the job
 * (offload_rank_words(size) words each). The gens are read first, as the firmware does. */
static int gone(struct fx_device *d, uint32_t peer)
{
	struct offload_ring_hdr *ring = (struct offload_ring_hdr *)d->arena;

	(void)__atomic_load_n(&ring->failed_gen, __ATOMIC_ACQUIRE);
	(void)__atomic_load_n(&ring->closed_gen, __ATOMIC_ACQUIRE);
	return offload_rankset_has(ring_set(d, 0), peer) || offload_rankset_has(ring_set(d, 1), peer);
}

/* Completions of the keepalive QPs. Told apart by wr_id: an error completion's opcode is
 * undefined (verbs). */
static void reap(struct fx_device *d)
{
	uint32_t S = d->attr.size, R = d->num_rails;
	struct ibv_wc wc[16];
	int n;

	while ((n = ibv_poll_cq(d->ka_cq, 16, wc)) > 0)
		for (int i = 0; i < n; i++) {
			uint32_t idx = (uint32_t)wc[i].wr_id, peer = idx % S, alive = 0;

			if (idx >= R * S || (wc[i].wr_id & FX_KA_CLOSE))
				continue;
			if (wc[i].wr_id & FX_KA_RECV) {  /* a flush when the QP broke: nothing */
				if (wc[i].status == IBV_WC_SUCCESS)
					mark_closed(d, peer);
				continue;
			}
			d->ka_state[idx] = wc[i].status == IBV_WC_SUCCESS ? KA_IDLE : KA_DEAD;
			if (d->ka_state[idx] != KA_DEAD)
				continue;
			for (uint32_t r = 0; r < R; r++)
				alive |= d->ka_state[(size_t)r * S + peer] != KA_DEAD;
			if (!alive && !gone(d, peer))
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

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Probes every FX_KEEPALIVE_MS; between them, sleeps on the CQ's channel, so that a close
 * notice is seen when it lands, and on ka_wake to stop. */
static void *keepalive_main(void *arg)
{
	struct fx_device *d = arg;
	int64_t next = 0;

	pthread_setname_np(pthread_self(), "dpa-keepalive");
	while (!__atomic_load_n(&d->ka_stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pfd[2] = { { .fd = d->ka_chan->fd, .events = POLLIN },
					 { .fd = d->ka_wake, .events = POLLIN } };
		int64_t now = now_ms();
		struct ibv_cq *ev_cq;
		void *ev_ctx;

		reap(d);
		if (now >= next) {
			for (uint32_t p = 0; p < d->attr.size; p++) {
				if (p == d->attr.rank || gone(d, p))
					continue;
				for (uint32_t r = 0; r < d->num_rails; r++)
					if (d->ka_state[(size_t)r * d->attr.size + p] == KA_IDLE)
						probe(d, r, p);
			}
			next = now + FX_KEEPALIVE_MS;
		}
		ibv_req_notify_cq(d->ka_cq, 0);
		reap(d);  /* what completed before the arm raises no event */
		if (poll(pfd, 2, (int)(next - now_ms() > 0 ? next - now_ms() : 0)) > 0 &&
		    (pfd[0].revents & POLLIN) && !ibv_get_cq_event(d->ka_chan, &ev_cq, &ev_ctx))
			ibv_ack_cq_events(ev_cq, 1);
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

/* Tell every peer still here that we close, on a rail that still reaches it, and wait (a
 * bounded while) for the notices to be taken: a peer that misses one finds us failed. */
static void announce_close(struct fx_device *d)
{
	uint32_t S = d->attr.size, R = d->num_rails, out = 0;
	struct timespec t0, now;
	struct ibv_wc wc[16];

	for (uint32_t p = 0; p < S; p++) {
		if (p == d->attr.rank || gone(d, p))
			continue;
		for (uint32_t r = 0; r < R; r++) {
			struct ibv_send_wr wr = { .wr_id = FX_KA_CLOSE | (r * S + p), .num_sge = 0,
						  .opcode = IBV_WR_SEND,
						  .send_flags = IBV_SEND_SIGNALED }, *bad;

			if (d->ka_state[(size_t)r * S + p] == KA_DEAD ||
			    ibv_post_send(ka_qp(d, r, p), &wr, &bad))
				continue;
			out++;
			break;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (out) {
		int n = ibv_poll_cq(d->ka_cq, 16, wc);

		for (int i = 0; i < n; i++)
			if (wc[i].wr_id & FX_KA_CLOSE)
				out--;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >
		    FX_CLOSE_WAIT_MS)
			break;
		if (n <= 0) {
			struct timespec nap = { 0, 200000 };

			nanosleep(&nap, NULL);
		}
	}
}

void fx_keepalive_stop(struct fx_device *d)
{
	uint32_t n = d->num_rails * d->attr.size;

	if (d->ka_running) {
		uint64_t one = 1;

		__atomic_store_n(&d->ka_stop, 1, __ATOMIC_RELEASE);
		if (write(d->ka_wake, &one, sizeof(one)) < 0)
			fx_log("keepalive: eventfd write: %s", strerror(errno));
		pthread_join(d->ka_thread, NULL);
		d->ka_running = 0;
		announce_close(d);
	}
	for (uint32_t i = 0; d->ka_qps && i < n; i++)
		if (d->ka_qps[i])
			ibv_destroy_qp(d->ka_qps[i]);
	if (d->ka_mr)
		ibv_dereg_mr(d->ka_mr);
	if (d->ka_cq)
		ibv_destroy_cq(d->ka_cq);
	if (d->ka_chan)
		ibv_destroy_comp_channel(d->ka_chan);
	if (d->ka_wake > 0)
		close(d->ka_wake);
	free(d->ka_qps);
	free(d->ka_state);
	free(d->ka_buf);
	d->ka_qps = NULL;
	d->ka_state = NULL;
	d->ka_buf = NULL;
	d->ka_mr = NULL;
	d->ka_cq = NULL;
	d->ka_chan = NULL;
	d->ka_wake = -1;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulator's host side (sim_driver.h): rings, commands, buffers with known patterns,
 * exact checks of every result at the moment the host reaps its completion, and liveness:
 * a quiescent world (nothing left to happen) with an op pending is a hang, found at once
 * in virtual time, after the rescue ticks the emulator's sleep slices would give.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "sim_driver.h"

#define RING_ENTRIES 64u
#define GUARD 64u
#define GUARD_BYTE 0xa5u
#define RESCUE_PS SIM_PS(50000000ull)      /* the emulator's 50 ms sleep slice */
#define RESCUES_MAX 24u                    /* > 2 x the firmware's 0.2 s dead grace */
#define MAX_VIRTUAL_PS SIM_PS(20000000000ull)
#define PHANTOM_BASE 0xf000000000000000ull

static uint8_t pat(uint32_t s, uint32_t d, uint64_t i, uint32_t k)
{
	return (uint8_t)((s * 0x9du + d * 0x3bu + k * 0x65u + (uint32_t)i * 7u +
			  (uint32_t)(i >> 8) * 0x11u + (uint32_t)(i >> 16) * 5u) ^ 0x5au);
}

static int64_t rval(uint32_t w, uint64_t i, uint32_t k)
{
	return (int64_t)w * 1000003 + (int64_t)i * 7 - (int64_t)k * 11;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

uint64_t sim_vcount(uint64_t seed, uint32_t op, uint32_t src, uint32_t dst, uint64_t max,
		    uint32_t vmode)
{
	uint64_t h = mix(seed ^ mix(((uint64_t)op << 40) ^ ((uint64_t)src << 20) ^ dst));

	(void)vmode;
	if (!max || h % 5 == 0)
		return 0;   /* zeros included */
	return (h >> 8) % (max + 1);
}

static void fail(struct sim_drv *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct sim_drv *d, const char *fmt, ...)
{
	va_list ap;
	char msg[400];

	if (d->w.failed)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sim_violation(&d->w, "t=%.3fus %s", (double)d->w.now / 1e6, msg);
}

static int team_rank(const struct sim_team *t, uint32_t world)
{
	for (uint32_t i = 0; i < t->size; i++)
		if (t->members[i] == world)
			return (int)i;
	return -1;
}

static uint64_t order_block(uint64_t total, uint64_t esize, uint64_t n)
{
	uint64_t maxseg = esize * ((1u << 20) / esize ? (1u << 20) / esize : 1);
	uint64_t nseg = (total + maxseg - 1) / maxseg, seg;

	if (nseg < 2 * n)
		nseg = 2 * n;
	nseg = (nseg + n - 1) / n * n;
	seg = (total + nseg - 1) / nseg;
	seg = (seg + esize - 1) / esize * esize;
	return nseg / n * seg;
}

/* ---- buffers ---- */

static uint8_t *buf_new(struct sim_drv *d, struct sim_rank *r, struct sim_inst *in, uint64_t len,
			uint32_t access, int aux, uint32_t *key)
{
	uint8_t *p;
	int phantom = d->job.payload == SIM_PHANTOM && !aux;

	if (phantom) {
		/* Non-canonical addresses, never dereferenced by mistake: rank, op, buffer. */
		p = (uint8_t *)(uintptr_t)(PHANTOM_BASE | ((uint64_t)r->rank << 44) |
					   ((uint64_t)((in - ((struct sim_host *)r->host)->inst) & 0xff) << 36) |
					   ((uint64_t)in->nkeys << 34));
		*key = sim_mr_reg(&d->w, r, (uint64_t)(uintptr_t)p, len ? len : 1, access, 1);
	} else {
		p = aligned_alloc(64, (len + GUARD + 63) & ~63ull);
		if (!p)
			return NULL;
		memset(p + len, GUARD_BYTE, GUARD);
		*key = sim_mr_reg(&d->w, r, (uint64_t)(uintptr_t)p, len ? len : 1, access, 0);
	}
	if (in->nkeys < 4)
		in->keys[in->nkeys++] = *key;
	return p;
}

static int real(const struct sim_drv *d)
{
	return d->job.payload == SIM_REAL;
}

static void inst_release(struct sim_drv *d, struct sim_rank *r, struct sim_inst *in)
{
	for (uint32_t i = 0; i < in->nkeys; i++)
		sim_mr_dereg(r, in->keys[i]);  /* as host/ does: a late write is refused */
	in->nkeys = 0;
	if (real(d)) {
		free(in->src);
		if (in->dst != in->src)
			free(in->dst);
	}
	free(in->aux);
	in->src = in->dst = in->aux = NULL;
}

static const uint32_t SRC_ACCESS = OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_REMOTE_READ;
static const uint32_t DST_ACCESS = OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
				   OFFLOAD_ACCESS_REMOTE_WRITE;
static const uint32_t AUX_ACCESS = OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE;
static const uint32_t ALL_ACCESS = OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
				   OFFLOAD_ACCESS_REMOTE_READ | OFFLOAD_ACCESS_REMOTE_WRITE |
				   OFFLOAD_ACCESS_REMOTE_ATOMIC;

/* ---- commands ---- */

static int build(struct sim_drv *d, struct sim_rank *r, uint32_t k, struct offload_cmd *c)
{
	const struct sim_opdesc *op = &d->ops[k];
	const struct sim_team *t = &d->teams[op->team];
	struct sim_inst *in = &((struct sim_host *)r->host)->inst[k];
	uint32_t n = t->size, me = (uint32_t)team_rank(t, r->rank), key = 0;
	uint64_t m = op->size;

	memset(c, 0, sizeof(*c));
	c->opcode = (uint8_t)op->opcode;
	c->team = (uint16_t)op->team;
	c->tag = in->tag;
	switch (op->opcode) {
	case OFFLOAD_OP_TEAM_CREATE: {
		struct offload_team_desc *desc;

		in->aux = buf_new(d, r, in, sizeof(*desc), AUX_ACCESS, 1, &c->aux_key);
		if (!in->aux)
			return -1;
		desc = (struct offload_team_desc *)in->aux;
		memset(desc, 0, sizeof(*desc));
		desc->team_id = op->team;
		desc->size = n;
		desc->my_rank = me;
		for (uint32_t i = 0; i < n; i++) {
			struct sim_rank *p = &d->w.ranks[t->members[i]];

			desc->peers[i] = (struct offload_peer){ .ctrl_addr = (uint64_t)(uintptr_t)p->ctrl,
				.ctrl_key = p->ctrl_key, .world_rank = p->rank };
		}
		c->aux_addr = (uint64_t)(uintptr_t)in->aux;
		return 0;
	}
	case OFFLOAD_OP_BARRIER:
		return 0;
	case OFFLOAD_OP_ALLTOALL:
		in->src_len = in->dst_len = m * n;
		in->src = buf_new(d, r, in, in->src_len, SRC_ACCESS, 0, &c->src_key);
		in->dst = buf_new(d, r, in, in->dst_len, DST_ACCESS, 0, &c->dst_key);
		if (!in->src || !in->dst)
			return -1;
		if (real(d))
			for (uint32_t p = 0; p < n; p++)
				for (uint64_t i = 0; i < m; i++)
					in->src[p * m + i] = pat(r->rank, t->members[p], i, k);
		c->count = m;
		break;
	case OFFLOAD_OP_ALLTOALLV: {
		struct offload_alltoallv_args *a;
		uint64_t sends = 0, recvs = 0, off = 0;

		in->aux = buf_new(d, r, in, sizeof(*a), AUX_ACCESS, 1, &c->aux_key);
		if (!in->aux)
			return -1;
		a = (struct offload_alltoallv_args *)in->aux;
		memset(a, 0, sizeof(*a));
		for (uint32_t p = 0; p < n; p++) {
			a->send_bytes[p] = sim_vcount(d->job.seed, k, r->rank, t->members[p], m, op->vmode);
			a->expect_bytes[p] = sim_vcount(d->job.seed, k, t->members[p], r->rank, m, op->vmode);
			sends += a->send_bytes[p];
			recvs += a->expect_bytes[p];
		}
		if (op->vmode == SIM_V_EXPECT)
			c->flags = OFFLOAD_CMD_F_EXPECT;
		if (op->vmode == SIM_V_SLOTS) {
			c->flags = OFFLOAD_CMD_F_SLOTS;
			a->slot_bytes = m;
			recvs = m * n;
		}
		in->src_len = sends;
		in->dst_len = recvs;
		in->src = buf_new(d, r, in, sends, SRC_ACCESS, 0, &c->src_key);
		in->dst = buf_new(d, r, in, recvs, DST_ACCESS, 0, &c->dst_key);
		if (!in->src || !in->dst)
			return -1;
		if (real(d))
			for (uint32_t p = 0; p < n; p++)
				for (uint64_t i = 0; i < a->send_bytes[p]; i++)
					in->src[off++] = pat(r->rank, t->members[p], i, k);
		if (real(d) && op->vmode == SIM_V_SLOTS)
			memset(in->dst, 0, recvs);
		c->count = sends;
		c->aux_addr = (uint64_t)(uintptr_t)in->aux;
		break;
	}
	case OFFLOAD_OP_BROADCAST:
		in->src_len = in->dst_len = m;
		in->src = in->dst = buf_new(d, r, in, m, SRC_ACCESS, 0, &c->src_key);
		if (!in->src)
			return -1;
		/* the same memory under a second key, as host/ registers src and dst */
		c->dst_key = sim_mr_reg(&d->w, r, (uint64_t)(uintptr_t)in->dst, m ? m : 1, DST_ACCESS,
					!real(d));
		if (in->nkeys < 4)
			in->keys[in->nkeys++] = c->dst_key;
		if (real(d))
			for (uint64_t i = 0; i < m; i++)
				in->src[i] = me == op->root ? pat(t->members[op->root], 0, i, k) : 0;
		c->count = m;
		c->root = op->root;
		break;
	case OFFLOAD_OP_ALLGATHER:
		in->src_len = m;
		in->dst_len = m * n;
		in->src = buf_new(d, r, in, m, SRC_ACCESS, 0, &c->src_key);
		in->dst = buf_new(d, r, in, m * n, DST_ACCESS, 0, &c->dst_key);
		if (!in->src || !in->dst)
			return -1;
		if (real(d))
			for (uint64_t i = 0; i < m; i++)
				in->src[i] = pat(r->rank, 0, i, k);
		c->count = m;
		break;
	case OFFLOAD_OP_REDUCE_SCATTER:
	case OFFLOAD_OP_ALLREDUCE: {
		uint64_t stride = op->opcode == OFFLOAD_OP_REDUCE_SCATTER ? m / n : order_block(m, 8, n);

		in->src_len = m;
		in->dst_len = op->opcode == OFFLOAD_OP_REDUCE_SCATTER ? m / n : m;
		in->src = buf_new(d, r, in, m, SRC_ACCESS, 0, &c->src_key);
		in->dst = buf_new(d, r, in, in->dst_len, DST_ACCESS, 0, &c->dst_key);
		in->aux_len = stride * n;
		in->aux = m ? buf_new(d, r, in, in->aux_len, ALL_ACCESS, 1, &c->aux_key) : NULL;
		if (!in->src || !in->dst || (m && !in->aux))
			return -1;
		for (uint64_t i = 0; real(d) && i < m / 8; i++)
			((int64_t *)in->src)[i] = rval(r->rank, i, k);
		c->count = m;
		c->root = OFFLOAD_REDOP(OFFLOAD_RED_SUM, OFFLOAD_DT_I64);
		c->aux_addr = (uint64_t)(uintptr_t)in->aux;
		break;
	}
	default:
		return -1;
	}
	(void)key;
	c->src_addr = (uint64_t)(uintptr_t)in->src;
	c->dst_addr = (uint64_t)(uintptr_t)in->dst;
	c->dst_len = in->dst_len;
	return 0;
}

/* ---- checks ---- */

static int guard_ok(const struct sim_inst *in)
{
	for (uint32_t i = 0; i < GUARD; i++)
		if (in->dst[in->dst_len + i] != GUARD_BYTE)
			return 0;
	return 1;
}

static void check(struct sim_drv *d, struct sim_rank *r, uint32_t k, const struct offload_cqe *c)
{
	const struct sim_opdesc *op = &d->ops[k];
	const struct sim_team *t = &d->teams[op->team];
	struct sim_inst *in = &((struct sim_host *)r->host)->inst[k];
	uint32_t n = t->size, me = (uint32_t)team_rank(t, r->rank);
	uint64_t m = op->size, off = 0;

	if (c->status != OFFLOAD_OK) {
		d->failed_ops++;
		/* A named failure is right only where a fault may cause it. */
		uint64_t doomed_team = 0;

		for (uint32_t i = 0; i < n; i++)
			doomed_team |= d->doomed & (1ull << t->members[i]);
		if (!doomed_team || (c->status != OFFLOAD_ERR_PEER && c->status != OFFLOAD_ERR_PEER_OP &&
				     c->status != OFFLOAD_ERR_LINK_DOWN && c->status != OFFLOAD_ERR_TIMEOUT))
			fail(d, "rank %u op %u (opcode %u team %u): status %d detail %u, want OK",
			     r->rank, k, op->opcode, op->team, c->status, c->detail);
		return;
	}
	if (!real(d))
		return;
	switch (op->opcode) {
	case OFFLOAD_OP_ALLTOALL:
		if (c->result0 != m * n)
			fail(d, "rank %u op %u all-to-all: result0 %llu want %llu", r->rank, k,
			     (unsigned long long)c->result0, (unsigned long long)(m * n));
		for (uint32_t s = 0; s < n; s++)
			for (uint64_t i = 0; i < m; i++)
				if (in->dst[s * m + i] != pat(t->members[s], r->rank, i, k)) {
					fail(d, "rank %u op %u all-to-all: block from team rank %u byte %llu wrong",
					     r->rank, k, s, (unsigned long long)i);
					return;
				}
		break;
	case OFFLOAD_OP_ALLTOALLV: {
		const struct offload_alltoallv_args *a = (const void *)in->aux;

		for (uint32_t s = 0; s < n; s++) {
			uint64_t want = sim_vcount(d->job.seed, k, t->members[s], r->rank, m, op->vmode);
			uint64_t base = op->vmode == SIM_V_SLOTS ? s * m : off;

			if (a->recv_bytes[s] != want) {
				fail(d, "rank %u op %u all-to-all-v: recv_bytes[%u] %llu want %llu", r->rank, k,
				     s, (unsigned long long)a->recv_bytes[s], (unsigned long long)want);
				return;
			}
			for (uint64_t i = 0; i < want; i++)
				if (in->dst[base + i] != pat(t->members[s], r->rank, i, k)) {
					fail(d, "rank %u op %u all-to-all-v: from team rank %u byte %llu wrong",
					     r->rank, k, s, (unsigned long long)i);
					return;
				}
			if (op->vmode == SIM_V_SLOTS)
				for (uint64_t i = want; i < m; i++)
					if (in->dst[base + i]) {
						fail(d, "rank %u op %u all-to-all-v slots: slot %u written past its count",
						     r->rank, k, s);
						return;
					}
			off += want;
		}
		if (op->vmode != SIM_V_SLOTS && c->result0 != off)
			fail(d, "rank %u op %u all-to-all-v: result0 %llu want %llu", r->rank, k,
			     (unsigned long long)c->result0, (unsigned long long)off);
		break;
	}
	case OFFLOAD_OP_BROADCAST:
		for (uint64_t i = 0; i < m; i++)
			if (in->dst[i] != pat(t->members[op->root], 0, i, k)) {
				fail(d, "rank %u op %u broadcast from %u: byte %llu wrong", r->rank, k, op->root,
				     (unsigned long long)i);
				return;
			}
		break;
	case OFFLOAD_OP_ALLGATHER:
		for (uint32_t s = 0; s < n; s++)
			for (uint64_t i = 0; i < m; i++)
				if (in->dst[s * m + i] != pat(t->members[s], 0, i, k)) {
					fail(d, "rank %u op %u all-gather: block of team rank %u byte %llu wrong",
					     r->rank, k, s, (unsigned long long)i);
					return;
				}
		break;
	case OFFLOAD_OP_REDUCE_SCATTER:
	case OFFLOAD_OP_ALLREDUCE: {
		uint64_t first = op->opcode == OFFLOAD_OP_REDUCE_SCATTER ? me * (m / n / 8) : 0;

		for (uint64_t j = 0; j < in->dst_len / 8; j++) {
			int64_t want = 0;

			for (uint32_t s = 0; s < n; s++)
				want += rval(t->members[s], first + j, k);
			if (((int64_t *)in->dst)[j] != want) {
				fail(d, "rank %u op %u reduction: element %llu is %lld want %lld", r->rank, k,
				     (unsigned long long)j, (long long)((int64_t *)in->dst)[j], (long long)want);
				return;
			}
		}
		break;
	}
	default:
		break;
	}
	if (in->dst && !guard_ok(in))
		fail(d, "rank %u op %u: written past the destination", r->rank, k);
}

/* ---- the host loop ---- */

static void try_post(struct sim_drv *d, struct sim_rank *r)
{
	struct sim_host *h = r->host;
	int posted = 0;

	while (h->next_op < d->nops && h->inflight < d->job.window && d->w.now >= h->skew_ps) {
		uint32_t k = h->next_op++;
		struct sim_inst *in = &h->inst[k];
		const struct sim_team *t = &d->teams[d->ops[k].team];
		struct offload_cmd *slot;

		in->tag = k + 1;
		if (team_rank(t, r->rank) < 0) {  /* not ours */
			in->done = 1;
			h->finished++;
			continue;
		}
		in->member = 1;
		slot = &h->sq[h->hdr->sq_tail & (h->sq_entries - 1)];
		if (build(d, r, k, slot)) {
			fail(d, "rank %u op %u: out of memory building the command", r->rank, k);
			return;
		}
		in->posted = 1;
		in->t_post = d->w.now;
		h->inflight++;
		__atomic_store_n(&h->hdr->sq_tail, h->hdr->sq_tail + 1, __ATOMIC_RELEASE);
		posted = 1;
	}
	if (posted)
		sim_schedule(&d->w, d->w.now + SIM_PS(d->w.model.host_post_ns + d->w.model.pcie_oneway_ns),
			     SIM_EV_DOORBELL, r->rank, 0, 0, NULL);
}

static void on_host(struct sim_world *w, struct sim_rank *r)
{
	struct sim_drv *d = w->driver;
	struct sim_host *h = r->host;

	while (h->cq_head != __atomic_load_n(&h->hdr->cq_tail, __ATOMIC_ACQUIRE)) {
		struct offload_cqe c = h->cq[h->cq_head & (h->cq_entries - 1)];
		struct sim_inst *in;

		h->cq_head++;
		__atomic_store_n(&h->hdr->cq_head, h->cq_head, __ATOMIC_RELEASE);
		if (c.tag == 0 || c.tag > d->nops || !h->inst[c.tag - 1].posted || h->inst[c.tag - 1].done) {
			fail(d, "rank %u: completion for tag %u that is not pending", r->rank, c.tag);
			return;
		}
		in = &h->inst[c.tag - 1];
		in->done = 1;
		in->status = c.status;
		in->detail = c.detail;
		in->result0 = c.result0;
		in->t_done = w->now;
		h->inflight--;
		h->finished++;
		d->completions++;
		check(d, r, c.tag - 1, &c);
		inst_release(d, r, in);
	}
	try_post(d, r);
}

static void on_post(struct sim_world *w, struct sim_rank *r, uint32_t aux)
{
	(void)aux;
	try_post(w->driver, r);
}

static void on_fault(struct sim_world *w, uint32_t idx)
{
	struct sim_drv *d = w->driver;
	const struct sim_fault *f = &d->faults[idx];

	switch (f->kind) {
	case SIM_F_DEATH:
		w->ranks[f->rank].alive = 0;
		d->failed_now |= 1ull << f->rank;
		for (uint32_t i = 0; i < w->size; i++)  /* survivors' hosts notice later */
			if (i != f->rank)
				sim_schedule(w, w->now + SIM_PS(w->model.fault_detect_ns), SIM_EV_FAULT, i, 0,
					     (uint32_t)(d->nfaults + i), NULL);
		break;
	case SIM_F_RAIL: {
		uint32_t all = 1;

		sim_port_down(w, f->rank, f->rail);
		for (uint32_t k = 0; k < w->rails; k++)
			all &= w->ranks[f->rank].port[k].down;
		if (all) {  /* unreachable: every host marks it failed, as the emulator's fabric */
			d->failed_now |= 1ull << f->rank;
			d->doomed |= 1ull << f->rank;
		}
		if (all)
			for (uint32_t i = 0; i < w->size; i++)
				sim_schedule(w, w->now + SIM_PS(w->model.fault_detect_ns), SIM_EV_FAULT, i, 0,
					     (uint32_t)(d->nfaults + i), NULL);
		break;
	}
	default:
		break;
	}
}

/* FAULT events numbered past the fault table mark the failed rank in one host's ring. */
static void on_fault_event(struct sim_world *w, uint32_t idx)
{
	struct sim_drv *d = w->driver;

	if (idx < d->nfaults) {
		on_fault(w, idx);
		return;
	}
	{
		uint32_t target = idx - d->nfaults;
		struct sim_rank *r = &w->ranks[target];
		struct sim_host *h = r->host;

		if (!r->alive)
			return;
		/* the dead and the unreachable (every rail down), never a rank that lost one rail */
		__atomic_fetch_or(&h->hdr->failed_ranks, d->failed_now, __ATOMIC_RELEASE);
		sim_wake_all(w, r, w->now);
	}
}

static int ops_done(struct sim_world *w)
{
	struct sim_drv *d = w->driver;

	for (uint32_t i = 0; i < w->size; i++) {
		struct sim_host *h = w->ranks[i].host;

		if (w->ranks[i].alive && h->finished < d->nops)
			return 0;
	}
	return 1;
}

static int all_done(struct sim_world *w)
{
	struct sim_drv *d = w->driver;

	if (d->max_events && w->cnt.events > d->max_events)
		return 1;  /* stop: sim_drv_run() reports it */
	return ops_done(w);
}

int sim_drv_init(struct sim_drv *d, const struct sim_job *job, const struct sim_model *model)
{
	struct dpa_engine_params p = {
		.abi_version = OFFLOAD_ABI_VERSION, .num_threads = job->threads,
		.sq_entries = RING_ENTRIES, .cq_entries = 2 * RING_ENTRIES,
		.chunk_size = job->chunk_size, .chunks_per_pass = job->chunks_per_pass,
		.op_timeout_ms = job->op_timeout_ms, .link_mbps = (uint32_t)(model->link_gbps * 125),
		.mcast_roots = job->mcast_roots, .eager_max = job->eager_max,
		.a2a_window = job->a2a_window,
	};
	int rc;

	memset(d, 0, sizeof(*d));
	d->job = *job;
	d->w.model = *model;
	d->w.payload = job->payload;
	d->w.remote_wake_all = job->remote_wake_all;
	d->w.driver = d;
	d->w.on_host = on_host;
	d->w.on_post = on_post;
	d->w.on_fault = on_fault_event;
	if (job->n == 0 || job->n > OFFLOAD_MAX_RANKS || job->threads == 0 || job->rails == 0 ||
	    job->rails > 8)
		return -1;
	rc = sim_world_init(&d->w, job->n, job->threads, job->rails, &p, job->seed);
	if (rc)
		return rc;
	d->hosts = calloc(job->n, sizeof(*d->hosts));
	if (!d->hosts)
		return -1;
	for (uint32_t i = 0; i < job->n; i++) {
		struct sim_rank *r = &d->w.ranks[i];
		struct sim_host *h = &d->hosts[i];
		uint64_t len = sizeof(struct offload_ring_hdr) + RING_ENTRIES * sizeof(struct offload_cmd) +
			       2 * RING_ENTRIES * sizeof(struct offload_cqe);

		r->host = h;
		r->ring = aligned_alloc(64, len);
		r->ring_len = len;
		r->stats = calloc(job->threads, sizeof(*r->stats));
		if (!r->ring || !r->stats)
			return -1;
		memset(r->ring, 0, len);
		h->hdr = (struct offload_ring_hdr *)r->ring;
		h->sq = (struct offload_cmd *)(h->hdr + 1);
		h->cq = (struct offload_cqe *)(h->sq + RING_ENTRIES);
		h->sq_entries = RING_ENTRIES;
		h->cq_entries = 2 * RING_ENTRIES;
		h->hdr->sq_entries = RING_ENTRIES;
		h->hdr->cq_entries = 2 * RING_ENTRIES;
		h->hdr->cq_waiters = 1;  /* the host waits: the firmware notifies every completion */
	}
	return 0;
}

void sim_drv_free(struct sim_drv *d)
{
	for (uint32_t i = 0; d->hosts && i < d->job.n; i++) {
		struct sim_host *h = &d->hosts[i];
		struct sim_rank *r = &d->w.ranks[i];

		for (uint32_t k = 0; h->inst && k < d->nops; k++)
			inst_release(d, r, &h->inst[k]);
		free(h->inst);
		free(r->ring);
		free(r->stats);
	}
	free(d->hosts);
	for (uint32_t t = 0; t < OFFLOAD_MAX_TEAMS; t++)
		free(d->teams[t].members);
	free(d->ops);
	sim_world_free(&d->w);
}

int sim_drv_team(struct sim_drv *d, uint32_t id, uint32_t size, const uint32_t *members)
{
	struct sim_opdesc op = { .opcode = OFFLOAD_OP_TEAM_CREATE, .team = id };

	if (id >= OFFLOAD_MAX_TEAMS || size == 0 || size > d->job.n)
		return -1;
	d->teams[id].id = id;
	d->teams[id].size = size;
	d->teams[id].members = malloc(size * sizeof(uint32_t));
	if (!d->teams[id].members)
		return -1;
	memcpy(d->teams[id].members, members, size * sizeof(uint32_t));
	return sim_drv_add_op(d, &op);
}

int sim_drv_add_op(struct sim_drv *d, const struct sim_opdesc *op)
{
	struct sim_opdesc *ops = realloc(d->ops, (d->nops + 1) * sizeof(*ops));

	if (!ops)
		return -1;
	d->ops = ops;
	d->ops[d->nops++] = *op;
	return 0;
}

static void describe_pending(struct sim_drv *d, char *out, size_t len)
{
	size_t used = 0;

	for (uint32_t i = 0; i < d->job.n && used + 64 < len; i++) {
		struct sim_host *h = &d->hosts[i];

		if (!d->w.ranks[i].alive || h->finished == d->nops)
			continue;
		for (uint32_t k = 0; k < d->nops; k++)
			if (h->inst[k].posted && !h->inst[k].done) {
				used += (size_t)snprintf(out + used, len - used, " r%u:op%u(opcode %u team %u)",
							 i, k, d->ops[k].opcode, d->ops[k].team);
				break;
			}
	}
}

int sim_drv_run(struct sim_drv *d)
{
	struct sim_world *w = &d->w;
	uint32_t stalls = 0, seen = d->completions;

	for (uint32_t i = 0; i < d->job.n; i++) {
		struct sim_host *h = &d->hosts[i];

		h->inst = realloc(h->inst, d->nops * sizeof(*h->inst));
		if (!h->inst)
			return -1;
		memset(h->inst + h->next_op, 0, (d->nops - h->next_op) * sizeof(*h->inst));
		h->skew_ps = w->now + (d->job.max_skew_ns ?
			SIM_PS(sim_rng_below(&w->rng[SIM_RNG_WORK], d->job.max_skew_ns + 1)) : 0);
		sim_schedule(w, h->skew_ps, SIM_EV_POST, i, 0, 0, NULL);
	}
	for (;;) {
		sim_run(w, all_done, MAX_VIRTUAL_PS);
		if (w->failed)
			break;
		if (d->max_events && w->cnt.events > d->max_events && !ops_done(w)) {
			char pend[256] = "";

			describe_pending(d, pend, sizeof(pend));
			fail(d, "livelock: %llu events with ops pending:%s",
			     (unsigned long long)w->cnt.events, pend);
			break;
		}
		if (ops_done(w))
			return 0;
		if (w->heap.n) {
			char pend[256] = "";

			describe_pending(d, pend, sizeof(pend));
			fail(d, "livelock: virtual time past %llu s with ops pending:%s",
			     (unsigned long long)(MAX_VIRTUAL_PS / 1000000000000ull), pend);
			break;
		}
		/* Quiescent with ops pending: give the firmware a rescue tick, as the emulator's
		 * sleep slice would; a pass that does nothing for long enough is a hang. */
		if (d->completions != seen) {
			seen = d->completions;
			stalls = 0;
		}
		if (++stalls > RESCUES_MAX) {
			char pend[256] = "";

			describe_pending(d, pend, sizeof(pend));
			fail(d, "hang: nothing left to happen with ops pending:%s", pend);
			break;
		}
		d->rescues++;
		w->cnt.rescues++;
		w->now += RESCUE_PS;
		for (uint32_t i = 0; i < d->job.n; i++)
			if (w->ranks[i].alive)
				sim_wake_all(w, &w->ranks[i], w->now);
	}
	snprintf(d->err, sizeof(d->err), "%s", w->violation);
	return -1;
}

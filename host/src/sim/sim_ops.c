/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulator's ops (sim_driver.h): commands built as host/ builds them, buffers filled
 * with known patterns, every result checked exactly when the host reaps its completion,
 * and a named failure accepted only on a team a fault doomed.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "sim_driver.h"

#define GUARD_BYTE 0xa5u
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

/* MoE dispatch counts (sim_moe): each rank routes its tokens to SIM_MOE_TOPK distinct
 * experts of SIM_MOE_EXPERTS, drawn with Zipf(1.2) popularity (a few hot experts); expert
 * e lives on rank e * n / experts, and a token goes once to each rank among its experts.
 * count[s * n + d] is the number of s's tokens that go to d. */
#define SIM_MOE_TOPK 8u
#define SIM_MOE_EXPERTS 256u

static void moe_counts(uint64_t seed, uint32_t op, uint32_t n, uint64_t tokens, uint64_t *count)
{
	double cdf[SIM_MOE_EXPERTS], sum = 0;

	for (uint32_t e = 0; e < SIM_MOE_EXPERTS; e++) {
		double x = (double)(e + 1), y = x > 1 ? 1 + (x - 1) / 5 : 1, w;

		for (int i = 0; i < 40; i++)  /* y = x^(1/5) by Newton's method (no libm) */
			y = (4 * y + x / (y * y * y * y)) / 5;
		w = 1.0 / (x * y);  /* (e+1)^-1.2 */

		sum += w;
		cdf[e] = sum;
	}
	memset(count, 0, (uint64_t)n * n * sizeof(*count));
	for (uint32_t s = 0; s < n; s++) {
		struct sim_rng g;

		sim_rng_seed(&g, seed ^ ((uint64_t)op << 32), 1000u + s);
		for (uint64_t t = 0; t < tokens; t++) {
			uint32_t experts[SIM_MOE_TOPK], k = 0;
			uint64_t ranks_hi[(SIM_MAX_RANKS + 63) / 64] = { 0 };

			while (k < SIM_MOE_TOPK) {
				double u = (double)(sim_rng_next(&g) >> 11) / 9007199254740992.0 * sum;
				uint32_t lo = 0, hi = SIM_MOE_EXPERTS - 1, dup = 0;

				while (lo < hi) {
					uint32_t mid = (lo + hi) / 2;

					if (cdf[mid] < u)
						lo = mid + 1;
					else
						hi = mid;
				}
				for (uint32_t j = 0; j < k; j++)
					dup |= experts[j] == lo;
				if (!dup)
					experts[k++] = lo;
			}
			for (uint32_t j = 0; j < k; j++) {
				uint32_t d = experts[j] * n / SIM_MOE_EXPERTS;

				if (!(ranks_hi[d / 64] & (1ull << (d % 64)))) {
					ranks_hi[d / 64] |= 1ull << (d % 64);
					count[(uint64_t)s * n + d]++;
				}
			}
		}
	}
}

uint64_t sim_vcount(struct sim_drv *d, uint32_t op, uint32_t src, uint32_t dst, uint64_t max,
		    uint32_t vmode)
{
	uint64_t h = mix(d->job.seed ^ mix(((uint64_t)op << 40) ^ ((uint64_t)src << 20) ^ dst));
	uint32_t n = d->job.n;

	if (vmode == SIM_V_MOE) {  /* max: bytes per token (a row); tokens from the job */
		if (!d->moe || d->moe_op != op) {
			free(d->moe);
			d->moe = malloc((uint64_t)n * n * sizeof(*d->moe));
			if (!d->moe)
				return 0;
			moe_counts(d->job.seed, op, n, d->job.moe_tokens, d->moe);
			d->moe_op = op;
		}
		return d->moe[(uint64_t)src * n + dst] * max;
	}
	if (!max || h % 5 == 0)
		return 0;   /* zeros included */
	return (h >> 8) % (max + 1);
}

void sim_drv_fail(struct sim_drv *d, const char *fmt, ...)
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

int sim_team_rank(const struct sim_team *t, uint32_t world)
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

void sim_op_bytes(const struct sim_job *job, const struct sim_opdesc *op, uint32_t n,
		  struct sim_op_bytes *out)
{
	uint64_t m = op->size;

	memset(out, 0, sizeof(*out));
	switch (op->opcode) {
	case OFFLOAD_OP_TEAM_CREATE:
		out->aux = offload_team_desc_bytes(n);
		break;
	case OFFLOAD_OP_ALLTOALL:
		out->src = out->dst = m * n;
		break;
	case OFFLOAD_OP_ALLTOALLV:
		out->aux = offload_a2av_args_bytes(n);
		/* sim_vcount gives at most m a peer; MoE m a token for each rank among its
		 * experts, bounded here as a rank's mean (the hot experts' ranks get more) */
		out->src = out->dst = op->vmode == SIM_V_MOE ?
			job->moe_tokens * (n < SIM_MOE_TOPK ? n : SIM_MOE_TOPK) * m : m * n;
		break;
	case OFFLOAD_OP_BROADCAST:
		out->src = out->dst = m;
		out->dst_is_src = 1;
		break;
	case OFFLOAD_OP_ALLGATHER:
		out->src = m;
		out->dst = m * n;
		break;
	case OFFLOAD_OP_REDUCE_SCATTER:
		out->src = m;
		out->dst = m / n;
		out->aux = m / n * n;  /* the scratch: a block per member */
		break;
	case OFFLOAD_OP_ALLREDUCE:
		out->src = out->dst = m;
		out->aux = order_block(m, 8, n) * n;
		break;
	default:
		break;
	}
}

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
		p = aligned_alloc(64, sim_buf_bytes(len));
		if (!p)
			return NULL;
		memset(p + len, GUARD_BYTE, SIM_GUARD);
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

void sim_op_release(struct sim_drv *d, struct sim_rank *r, struct sim_inst *in)
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

int sim_op_build(struct sim_drv *d, struct sim_rank *r, uint32_t k, struct offload_cmd *c)
{
	const struct sim_opdesc *op = &d->ops[k];
	const struct sim_team *t = &d->teams[op->team];
	struct sim_inst *in = &((struct sim_host *)r->host)->inst[k];
	uint32_t n = t->size, me = (uint32_t)sim_team_rank(t, r->rank);
	uint64_t m = op->size;
	struct sim_op_bytes b;

	sim_op_bytes(&d->job, op, n, &b);
	memset(c, 0, sizeof(*c));
	c->opcode = (uint8_t)op->opcode;
	c->team = (uint16_t)op->team;
	c->tag = in->tag;
	switch (op->opcode) {
	case OFFLOAD_OP_TEAM_CREATE: {
		struct offload_team_desc *desc;

		in->aux = buf_new(d, r, in, b.aux, AUX_ACCESS, 1, &c->aux_key);
		if (!in->aux)
			return -1;
		desc = (struct offload_team_desc *)in->aux;
		memset(desc, 0, b.aux);
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
		in->src_len = b.src;
		in->dst_len = b.dst;
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

		in->aux = buf_new(d, r, in, b.aux, AUX_ACCESS, 1, &c->aux_key);
		if (!in->aux)
			return -1;
		a = (struct offload_alltoallv_args *)in->aux;
		memset(a, 0, b.aux);
		a->nranks = n;
		for (uint32_t p = 0; p < n; p++) {
			offload_a2av_send(a)[p] = sim_vcount(d, k, r->rank, t->members[p], m, op->vmode);
			offload_a2av_expect(a)[p] = sim_vcount(d, k, t->members[p], r->rank, m, op->vmode);
			sends += offload_a2av_send(a)[p];
			recvs += offload_a2av_expect(a)[p];
		}
		if (op->vmode == SIM_V_EXPECT)
			c->flags = OFFLOAD_CMD_F_EXPECT;
		if (op->vmode == SIM_V_SLOTS) {
			c->flags = OFFLOAD_CMD_F_SLOTS;
			a->slot_bytes = m;
			recvs = b.dst;
		}
		in->src_len = sends;
		in->dst_len = recvs;
		in->src = buf_new(d, r, in, sends, SRC_ACCESS, 0, &c->src_key);
		in->dst = buf_new(d, r, in, recvs, DST_ACCESS, 0, &c->dst_key);
		if (!in->src || !in->dst)
			return -1;
		if (real(d))
			for (uint32_t p = 0; p < n; p++)
				for (uint64_t i = 0; i < offload_a2av_send(a)[p]; i++)
					in->src[off++] = pat(r->rank, t->members[p], i, k);
		if (real(d) && op->vmode == SIM_V_SLOTS)
			memset(in->dst, 0, recvs);
		c->count = sends;
		c->aux_addr = (uint64_t)(uintptr_t)in->aux;
		break;
	}
	case OFFLOAD_OP_BROADCAST:
		in->src_len = in->dst_len = b.src;
		in->src = in->dst = buf_new(d, r, in, b.src, SRC_ACCESS, 0, &c->src_key);
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
		in->src_len = b.src;
		in->dst_len = b.dst;
		in->src = buf_new(d, r, in, b.src, SRC_ACCESS, 0, &c->src_key);
		in->dst = buf_new(d, r, in, b.dst, DST_ACCESS, 0, &c->dst_key);
		if (!in->src || !in->dst)
			return -1;
		if (real(d))
			for (uint64_t i = 0; i < m; i++)
				in->src[i] = pat(r->rank, 0, i, k);
		c->count = m;
		break;
	case OFFLOAD_OP_REDUCE_SCATTER:
	case OFFLOAD_OP_ALLREDUCE:
		in->src_len = b.src;
		in->dst_len = b.dst;
		in->src = buf_new(d, r, in, b.src, SRC_ACCESS, 0, &c->src_key);
		in->dst = buf_new(d, r, in, b.dst, DST_ACCESS, 0, &c->dst_key);
		in->aux_len = b.aux;
		in->aux = m ? buf_new(d, r, in, b.aux, ALL_ACCESS, 1, &c->aux_key) : NULL;
		if (!in->src || !in->dst || (m && !in->aux))
			return -1;
		for (uint64_t i = 0; real(d) && i < m / 8; i++)
			((int64_t *)in->src)[i] = rval(r->rank, i, k);
		c->count = m;
		c->root = OFFLOAD_REDOP(OFFLOAD_RED_SUM, OFFLOAD_DT_I64);
		c->aux_addr = (uint64_t)(uintptr_t)in->aux;
		break;
	default:
		return -1;
	}
	c->src_addr = (uint64_t)(uintptr_t)in->src;
	c->dst_addr = (uint64_t)(uintptr_t)in->dst;
	c->dst_len = in->dst_len;
	return 0;
}

/* ---- checks ---- */

static int guard_ok(const struct sim_inst *in)
{
	for (uint32_t i = 0; i < SIM_GUARD; i++)
		if (in->dst[in->dst_len + i] != GUARD_BYTE)
			return 0;
	return 1;
}

void sim_op_check(struct sim_drv *d, struct sim_rank *r, uint32_t k, const struct offload_cqe *c)
{
	const struct sim_opdesc *op = &d->ops[k];
	const struct sim_team *t = &d->teams[op->team];
	struct sim_inst *in = &((struct sim_host *)r->host)->inst[k];
	uint32_t n = t->size, me = (uint32_t)sim_team_rank(t, r->rank);
	uint64_t m = op->size, off = 0;

	if (c->status != OFFLOAD_OK) {
		d->failed_ops++;
		/* A named failure is right only where a fault may cause it. */
		uint32_t doomed_team = 0;

		for (uint32_t i = 0; i < n; i++)
			doomed_team |= d->hosts[t->members[i]].doomed;
		if (!doomed_team || (c->status != OFFLOAD_ERR_PEER && c->status != OFFLOAD_ERR_PEER_OP &&
				     c->status != OFFLOAD_ERR_LINK_DOWN && c->status != OFFLOAD_ERR_TIMEOUT))
			sim_drv_fail(d, "rank %u op %u (opcode %u team %u): status %d detail %u, want OK",
			     r->rank, k, op->opcode, op->team, c->status, c->detail);
		return;
	}
	if (!real(d))
		return;
	switch (op->opcode) {
	case OFFLOAD_OP_ALLTOALL:
		if (c->result0 != m * n)
			sim_drv_fail(d, "rank %u op %u all-to-all: result0 %llu want %llu", r->rank, k,
			     (unsigned long long)c->result0, (unsigned long long)(m * n));
		for (uint32_t s = 0; s < n; s++)
			for (uint64_t i = 0; i < m; i++)
				if (in->dst[s * m + i] != pat(t->members[s], r->rank, i, k)) {
					sim_drv_fail(d, "rank %u op %u all-to-all: block from team rank %u byte %llu wrong",
					     r->rank, k, s, (unsigned long long)i);
					return;
				}
		break;
	case OFFLOAD_OP_ALLTOALLV: {
		struct offload_alltoallv_args *a = (void *)in->aux;

		for (uint32_t s = 0; s < n; s++) {
			uint64_t want = sim_vcount(d, k, t->members[s], r->rank, m, op->vmode);
			uint64_t base = op->vmode == SIM_V_SLOTS ? s * m : off;

			if (offload_a2av_recv(a)[s] != want) {
				sim_drv_fail(d, "rank %u op %u all-to-all-v: recv_bytes[%u] %llu want %llu", r->rank, k,
				     s, (unsigned long long)offload_a2av_recv(a)[s], (unsigned long long)want);
				return;
			}
			for (uint64_t i = 0; i < want; i++)
				if (in->dst[base + i] != pat(t->members[s], r->rank, i, k)) {
					sim_drv_fail(d, "rank %u op %u all-to-all-v: from team rank %u byte %llu "
						     "(at %llu of %llu) is %#x, want %#x", r->rank, k, s,
						     (unsigned long long)i, (unsigned long long)(base + i),
						     (unsigned long long)in->dst_len, in->dst[base + i],
						     pat(t->members[s], r->rank, i, k));
					return;
				}
			if (op->vmode == SIM_V_SLOTS)
				for (uint64_t i = want; i < m; i++)
					if (in->dst[base + i]) {
						sim_drv_fail(d, "rank %u op %u all-to-all-v slots: slot %u written past its count",
						     r->rank, k, s);
						return;
					}
			off += want;
		}
		if (op->vmode != SIM_V_SLOTS && c->result0 != off)
			sim_drv_fail(d, "rank %u op %u all-to-all-v: result0 %llu want %llu", r->rank, k,
			     (unsigned long long)c->result0, (unsigned long long)off);
		break;
	}
	case OFFLOAD_OP_BROADCAST:
		for (uint64_t i = 0; i < m; i++)
			if (in->dst[i] != pat(t->members[op->root], 0, i, k)) {
				sim_drv_fail(d, "rank %u op %u broadcast from %u: byte %llu wrong", r->rank, k, op->root,
				     (unsigned long long)i);
				return;
			}
		break;
	case OFFLOAD_OP_ALLGATHER:
		for (uint32_t s = 0; s < n; s++)
			for (uint64_t i = 0; i < m; i++)
				if (in->dst[s * m + i] != pat(t->members[s], 0, i, k)) {
					sim_drv_fail(d, "rank %u op %u all-gather: block of team rank %u byte %llu wrong",
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
				sim_drv_fail(d, "rank %u op %u reduction: element %llu is %lld want %lld", r->rank, k,
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
		sim_drv_fail(d, "rank %u op %u: written past the destination", r->rank, k);
}


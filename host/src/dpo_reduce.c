/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reductions through the C API (allreduce, reduce-scatter block form): argument checks,
 * the command's redop word, and the scratch every reduction names as its aux region.
 *
 * Scratch is a slot per team rank of the op's block size into which peers write their
 * contributions (docs/reductions.md). It comes from a per-context pool of registered
 * buffers (as offload_lib/_reduce.py's ScratchPool): a request takes one at init and
 * gives it back at finalize, so a steady stream of reductions registers nothing; a
 * larger op registers a larger buffer once, and the pool keeps the few largest.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dpo_internal.h"

#define ALL_ACCESS (OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE | \
		    OFFLOAD_ACCESS_REMOTE_READ | OFFLOAD_ACCESS_REMOTE_WRITE)
#define SCRATCH_ROUND (64u << 10)  /* near sizes share buffers */

static uint32_t firmware_dtype(dpo_datatype_t dt)
{
	switch (dt) {
	case DPO_DT_FLOAT32: return OFFLOAD_DT_F32;
	case DPO_DT_FLOAT64: return OFFLOAD_DT_F64;
	case DPO_DT_FLOAT16: return OFFLOAD_DT_F16;
	case DPO_DT_BFLOAT16: return OFFLOAD_DT_BF16;
	case DPO_DT_INT32: return OFFLOAD_DT_I32;
	case DPO_DT_INT64: return OFFLOAD_DT_I64;
	default: return 0;
	}
}

static dpo_status_t redop_word(dpo_reduction_op_t op, dpo_datatype_t dt, uint32_t *word)
{
	uint32_t fdt = firmware_dtype(dt);

	if (op < DPO_OP_SUM || op > DPO_OP_AVG)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "op %d is not a reduction the DPA runs: use "
				"DPO_OP_SUM, DPO_OP_PROD, DPO_OP_MAX, DPO_OP_MIN or DPO_OP_AVG", (int)op);
	if (!fdt)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "the DPA reduces DPO_DT_FLOAT32, FLOAT64, "
				"FLOAT16, BFLOAT16, INT32 and INT64, not datatype %d", (int)dt);
	if (op == DPO_OP_AVG && (fdt == OFFLOAD_DT_I32 || fdt == OFFLOAD_DT_I64))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "DPO_OP_AVG of an integer type has no result "
				"of that type: reduce with DPO_OP_SUM and divide, or use a floating type");
	/* the firmware's op numbers are the dpo ones */
	*word = OFFLOAD_REDOP((uint32_t)op, fdt);
	return DPO_OK;
}

/* Bytes per order block: gloo's segment split, as dpa_order_block (reduce_kernel.c) and
 * _reduce.order_block compute it; the allreduce's scratch is team size such blocks. */
static uint64_t order_block(uint64_t total, uint64_t es, uint64_t n)
{
	uint64_t maxseg = es * ((1u << 20) / es ? (1u << 20) / es : 1);
	uint64_t nseg = (total + maxseg - 1) / maxseg, seg;

	if (nseg < 2 * n)
		nseg = 2 * n;
	nseg = (nseg + n - 1) / n * n;
	seg = (total + nseg - 1) / nseg;
	seg = (seg + es - 1) / es * es;
	return nseg / n * seg;
}

static int overlap(const void *a, uint64_t alen, const void *b, uint64_t blen)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return alen && blen && x < y + blen && y < x + alen;
}

static dpo_status_t sized(const dpo_coll_buffer_info_t *b, const char *which, uint64_t es,
			  uint64_t *bytes)
{
	if (__builtin_mul_overflow(b->count, es, bytes) || *bytes > (1ull << 62))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s: %llu elements are more than any buffer "
				"holds", which, (unsigned long long)b->count);
	if (!b->buffer && *bytes)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s is NULL but holds %llu bytes", which,
				(unsigned long long)*bytes);
	return DPO_OK;
}

static dpo_status_t scratch_take(struct dpo_context *ctx, uint64_t len, struct dpo_scratch *out)
{
	struct dpo_scratch s = { 0 };
	int best = -1, owned, rc;

	pthread_mutex_lock(&ctx->lock);
	for (uint32_t i = 0; i < ctx->scratch_nfree; i++)
		if (ctx->scratch_free[i].len >= len &&
		    (best < 0 || ctx->scratch_free[i].len < ctx->scratch_free[best].len))
			best = (int)i;
	if (best >= 0) {
		s = ctx->scratch_free[best];
		ctx->scratch_free[best] = ctx->scratch_free[--ctx->scratch_nfree];
	}
	pthread_mutex_unlock(&ctx->lock);
	if (best >= 0) {
		*out = s;
		return DPO_OK;
	}
	s.len = (len + SCRATCH_ROUND - 1) / SCRATCH_ROUND * SCRATCH_ROUND;
	s.addr = aligned_alloc(4096, s.len);
	if (!s.addr)
		return dpo_fail(DPO_ERR_NO_MEMORY, "reduction scratch: out of memory for %llu bytes",
				(unsigned long long)s.len);
	rc = host_mr_acquire(ctx->host, s.addr, s.len, ALL_ACCESS, &s.key, &owned);
	if (rc) {
		free(s.addr);
		return dpo_from_errno(rc, "registering the reduction scratch");
	}
	*out = s;
	return DPO_OK;
}

void dpo_scratch_put(struct dpo_context *ctx, struct dpo_scratch *s)
{
	struct dpo_scratch drop = { 0 };

	if (!s->addr)
		return;
	pthread_mutex_lock(&ctx->lock);
	if (ctx->scratch_nfree < DPO_SCRATCH_KEEP) {
		ctx->scratch_free[ctx->scratch_nfree++] = *s;
	} else {
		/* keep the largest: a smaller op fits into them */
		uint32_t small = 0;

		for (uint32_t i = 1; i < ctx->scratch_nfree; i++)
			if (ctx->scratch_free[i].len < ctx->scratch_free[small].len)
				small = i;
		if (ctx->scratch_free[small].len < s->len) {
			drop = ctx->scratch_free[small];
			ctx->scratch_free[small] = *s;
		} else {
			drop = *s;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	if (drop.addr) {
		host_mr_release(ctx->host, drop.key);
		free(drop.addr);
	}
	*s = (struct dpo_scratch){ 0 };
}

void dpo_scratch_release_all(struct dpo_context *ctx)
{
	for (uint32_t i = 0; i < ctx->scratch_nfree; i++) {
		host_mr_release(ctx->host, ctx->scratch_free[i].key);
		free(ctx->scratch_free[i].addr);
	}
	ctx->scratch_nfree = 0;
}

dpo_status_t dpo_reduce_init(struct dpo_team *team, const dpo_coll_args_t *a, uint64_t flags,
			     struct host_op *op, struct dpo_scratch *scratch, uint32_t *key,
			     int *owned)
{
	uint32_t n = team->size;
	int in_place = !!(flags & DPO_COLL_ARGS_FLAG_IN_PLACE);
	int allreduce = a->coll_type == DPO_COLL_TYPE_ALLREDUCE;
	const dpo_coll_buffer_info_t *d = &a->dst.info, *s = in_place ? d : &a->src.info;
	uint64_t es = dpo_dt_size(d->datatype), sbytes, dbytes, stride;
	uint8_t *src, *dst;
	dpo_status_t st;
	int rc;

	if ((st = redop_word(a->op, d->datatype, &op->root)))
		return st;
	if (s->datatype != d->datatype)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "src is datatype %d but dst is %d: use the "
				"same datatype", (int)s->datatype, (int)d->datatype);
	if ((st = sized(s, in_place ? "dst" : "src", es, &sbytes)) || (st = sized(d, "dst", es, &dbytes)))
		return st;
	src = s->buffer;
	dst = d->buffer;
	if (allreduce) {
		if (!in_place && s->count != d->count)
			return dpo_fail(DPO_ERR_INVALID_PARAM, "src has %llu elements but dst has %llu: "
					"allreduce needs equal counts", (unsigned long long)s->count,
					(unsigned long long)d->count);
		if (!in_place && overlap(src, sbytes, dst, dbytes) && src != dst)
			return dpo_fail(DPO_ERR_INVALID_PARAM, "src and dst overlap partially: pass the "
					"same buffer or DPO_COLL_ARGS_FLAG_IN_PLACE");
		stride = sbytes ? order_block(sbytes, es, n) : 0;
	} else {
		uint64_t block;

		if (s->count % n)
			return dpo_fail(DPO_ERR_INVALID_PARAM, "%s has %llu elements, which do not "
					"split evenly over %u ranks: use a multiple of %u",
					in_place ? "dst" : "src", (unsigned long long)s->count, n, n);
		block = sbytes / n;
		if (in_place) {
			dst = src + (uint64_t)team->rank * block;
		} else {
			if (d->count != s->count / n)
				return dpo_fail(DPO_ERR_INVALID_PARAM, "dst has %llu elements but "
						"reduce-scatter gives each rank src's %llu / %u = %llu",
						(unsigned long long)d->count,
						(unsigned long long)s->count, n,
						(unsigned long long)(s->count / n));
			if (overlap(src, sbytes, dst, block) && dst != src + (uint64_t)team->rank * block)
				return dpo_fail(DPO_ERR_INVALID_PARAM, "src and dst overlap: dst may only "
						"be this rank's own block of src (or pass "
						"DPO_COLL_ARGS_FLAG_IN_PLACE)");
		}
		dbytes = block;
		stride = block;
	}
	op->opcode = allreduce ? OFFLOAD_OP_ALLREDUCE : OFFLOAD_OP_REDUCE_SCATTER;
	op->count = sbytes;
	op->src_addr = (uint64_t)(uintptr_t)src;
	op->src_len = sbytes;
	op->dst_addr = (uint64_t)(uintptr_t)dst;
	op->dst_len = dbytes;
	if (!sbytes)
		return DPO_OK;
	if ((st = scratch_take(team->ctx, stride * n, scratch)))
		return st;
	op->aux_addr = (uint64_t)(uintptr_t)scratch->addr;
	op->aux_len = stride * n;
	op->aux_key = scratch->key;
	/* In place (dst lies in src): one registration with every right, as the DPA both reads
	 * and writes the pages; two of the same pages with different rights would not do. */
	if (overlap(src, sbytes, dst, dbytes)) {
		rc = host_mr_acquire(team->ctx->host, src, sbytes, ALL_ACCESS, key, owned);
		if (rc)
			return dpo_from_errno(rc, "registering the in-place buffer");
		op->src_key = op->dst_key = *key;
	}
	return DPO_OK;
}

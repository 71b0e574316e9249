/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Collective requests: dpo_collective_init checks the arguments and builds the command
 * (nothing is posted), post hands it to the ring, test/wait reap its completion.
 *
 * Layouts the DPA does not take directly are adapted here with one host copy: all-to-all-v
 * displacements that are not the packed prefix sums (gathered into / scattered out of a
 * packed bounce buffer), and in-place all-to-all(v) (the DPA refuses overlapping src and
 * dst, so dst is copied aside first). Every other layout moves with no host copy.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dpo_internal.h"

#define SRC_ACCESS (OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_REMOTE_READ)
#define DST_ACCESS (OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE | \
		    OFFLOAD_ACCESS_REMOTE_WRITE)
#define POLL_MAX_BYTES (1u << 20)  /* ops up to this many bytes per rank spin in their wait */
#define ALL_FLAGS (DPO_COLL_ARGS_FLAG_IN_PLACE | DPO_COLL_ARGS_FLAG_PERSISTENT)

struct dpo_coll_req {
	struct dpo_team *team;
	dpo_coll_type_t type;
	uint64_t flags;
	struct host_op op;
	uint64_t poll_bytes;             /* what the wait policy counts */
	double post_timeout;
	/* all-to-all-v: per team rank, bytes */
	uint64_t *sbytes, *soff, *rbytes, *roff;
	int src_packed, dst_packed;
	uint8_t *user_src, *user_dst;
	struct offload_alltoallv_args *vargs;
	uint8_t *bounce_src, *bounce_dst;
	uint64_t bounce_src_len, bounce_dst_len;
	/* persistent registrations (released at finalize) */
	uint32_t keys[2];
	int owned[2];
	struct dpo_scratch scratch;      /* reductions: from the context's pool until finalize */
	int posted;                      /* posted and not yet reaped */
	int done;                        /* the last post completed (status below) */
	uint32_t tag;
	dpo_status_t status;
	int32_t peer;
	char error[256];
};

static dpo_status_t bad(const char *fmt, const char *a, uint64_t x, uint64_t y)
{
	return dpo_fail(DPO_ERR_INVALID_PARAM, fmt, a, (unsigned long long)x, (unsigned long long)y);
}

static int overlap(const void *a, uint64_t alen, const void *b, uint64_t blen)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return alen && blen && x < y + blen && y < x + alen;
}

static dpo_status_t elem_size(dpo_datatype_t dt, const char *which, uint64_t *es)
{
	*es = dpo_dt_size(dt);
	if (!*es)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s has an unknown datatype %d: use a "
				"DPO_DT_* value", which, (int)dt);
	return DPO_OK;
}

static dpo_status_t same_type(dpo_datatype_t s, dpo_datatype_t d)
{
	if (s != d)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "src is datatype %d but dst is %d: use the "
				"same datatype", (int)s, (int)d);
	return DPO_OK;
}

static dpo_status_t bytes_of(uint64_t count, uint64_t es, const char *which, uint64_t *out)
{
	if (__builtin_mul_overflow(count, es, out) || *out > (1ull << 62))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s: %llu elements are more than any buffer "
				"holds", which, (unsigned long long)count);
	return DPO_OK;
}

static dpo_status_t need_buffer(const void *p, uint64_t bytes, const char *which)
{
	if (!p && bytes)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s is NULL but holds %llu bytes", which,
				(unsigned long long)bytes);
	return DPO_OK;
}

static dpo_status_t init_alltoall(struct dpo_coll_req *r, const dpo_coll_args_t *a)
{
	uint32_t n = r->team->size;
	const dpo_coll_buffer_info_t *s = &a->src.info, *d = &a->dst.info;
	uint64_t es, total;
	dpo_status_t st;

	if ((st = elem_size(d->datatype, "dst", &es)) || (st = bytes_of(d->count, es, "dst", &total)) ||
	    (st = need_buffer(d->buffer, total, "dst")))
		return st;
	if (r->flags & DPO_COLL_ARGS_FLAG_IN_PLACE) {
		if (total) {
			r->bounce_src = malloc(total);
			if (!r->bounce_src)
				return dpo_fail(DPO_ERR_NO_MEMORY, "in-place all-to-all: out of memory");
		}
		r->bounce_src_len = total;
		r->user_dst = d->buffer;
	} else {
		if ((st = same_type(s->datatype, d->datatype)))
			return st;
		if (s->count != d->count)
			return bad("%s has %llu elements but dst has %llu: all-to-all needs equal sizes",
				   "src", s->count, d->count);
		if ((st = need_buffer(s->buffer, total, "src")))
			return st;
		if (overlap(s->buffer, total, d->buffer, total))
			return dpo_fail(DPO_ERR_INVALID_PARAM, "src and dst overlap: pass "
					"DPO_COLL_ARGS_FLAG_IN_PLACE to exchange dst in place");
	}
	if (d->count % n)
		return bad("%s: %llu elements do not split evenly over %llu ranks", "all-to-all",
			   d->count, n);
	r->op.opcode = OFFLOAD_OP_ALLTOALL;
	r->op.src_addr = (uint64_t)(uintptr_t)(r->bounce_src ? (void *)r->bounce_src : s->buffer);
	r->op.src_len = total;
	r->op.dst_addr = (uint64_t)(uintptr_t)d->buffer;
	r->op.dst_len = total;
	r->op.count = total / n;
	r->poll_bytes = total;
	return DPO_OK;
}

/* Per-rank byte counts and offsets of one side of an all-to-all-v; packed: the offsets are
 * the prefix sums (the layout the DPA reads and writes). */
static dpo_status_t v_side(struct dpo_coll_req *r, const dpo_coll_buffer_info_v_t *v,
			   const char *which, uint64_t es, uint64_t **bytes, uint64_t **off,
			   int *packed, uint64_t *sum)
{
	uint32_t n = r->team->size;
	uint64_t at = 0;

	if (!v->counts)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s counts are NULL", which);
	*bytes = calloc(n, sizeof(uint64_t));
	*off = calloc(n, sizeof(uint64_t));
	if (!*bytes || !*off)
		return dpo_fail(DPO_ERR_NO_MEMORY, "all-to-all-v: out of memory");
	*packed = 1;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t b, o, end;

		if (bytes_of(v->counts[i], es, which, &b))
			return DPO_ERR_INVALID_PARAM;
		if (bytes_of(v->displacements ? v->displacements[i] : at / es, es, which, &o) ||
		    __builtin_add_overflow(o, b, &end) || __builtin_add_overflow(at, b, &at) ||
		    at > (1ull << 62))
			return dpo_fail(DPO_ERR_INVALID_PARAM, "%s counts add up to more than any "
					"buffer holds", which);
		if (o != at - b)
			*packed = 0;
		(*bytes)[i] = b;
		(*off)[i] = o;
	}
	*sum = at;
	return need_buffer(v->buffer, at, which);
}

static dpo_status_t init_alltoallv(struct dpo_coll_req *r, const dpo_coll_args_t *a)
{
	uint32_t n = r->team->size;
	int in_place = !!(r->flags & DPO_COLL_ARGS_FLAG_IN_PLACE);
	const dpo_coll_buffer_info_v_t *s = in_place ? &a->dst.info_v : &a->src.info_v;
	const dpo_coll_buffer_info_v_t *d = &a->dst.info_v;
	uint64_t es, ssum, rsum;
	dpo_status_t st;

	if ((st = elem_size(d->datatype, "dst", &es)) || (!in_place && (st = same_type(s->datatype,
										 d->datatype))))
		return st;
	if ((st = v_side(r, s, "src", es, &r->sbytes, &r->soff, &r->src_packed, &ssum)) ||
	    (st = v_side(r, d, "dst", es, &r->rbytes, &r->roff, &r->dst_packed, &rsum)))
		return st;
	if (!in_place && overlap(s->buffer, ssum, d->buffer, rsum))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "src and dst overlap: pass "
				"DPO_COLL_ARGS_FLAG_IN_PLACE to exchange dst in place");
	r->user_src = s->buffer;
	r->user_dst = d->buffer;
	if (in_place || !r->src_packed) {
		r->bounce_src = ssum ? malloc(ssum) : NULL;
		r->bounce_src_len = ssum;
		r->src_packed = 0;
	}
	if (!r->dst_packed) {
		r->bounce_dst = rsum ? malloc(rsum) : NULL;
		r->bounce_dst_len = rsum;
	}
	r->vargs = aligned_alloc(64, (offload_a2av_args_bytes(n) + 63) & ~(size_t)63);
	if ((ssum && !r->src_packed && !r->bounce_src) || (rsum && !r->dst_packed && !r->bounce_dst) ||
	    !r->vargs)
		return dpo_fail(DPO_ERR_NO_MEMORY, "all-to-all-v: out of memory");
	memset(r->vargs, 0, offload_a2av_args_bytes(n));
	r->vargs->nranks = n;
	for (uint32_t i = 0; i < n; i++) {
		offload_a2av_send(r->vargs)[i] = r->sbytes[i];
		offload_a2av_expect(r->vargs)[i] = r->rbytes[i];
	}
	r->op.opcode = OFFLOAD_OP_ALLTOALLV;
	r->op.flags = OFFLOAD_CMD_F_EXPECT;  /* a sender that sends otherwise fails the op */
	r->op.src_addr = (uint64_t)(uintptr_t)(r->bounce_src ? r->bounce_src : r->user_src);
	r->op.src_len = ssum;
	r->op.count = ssum;
	r->op.dst_addr = (uint64_t)(uintptr_t)(r->bounce_dst ? r->bounce_dst : r->user_dst);
	r->op.dst_len = rsum;
	r->op.aux_addr = (uint64_t)(uintptr_t)r->vargs;
	r->op.aux_len = offload_a2av_args_bytes(n);
	r->poll_bytes = ssum > rsum ? ssum : rsum;
	return DPO_OK;
}

static dpo_status_t init_bcast(struct dpo_coll_req *r, const dpo_coll_args_t *a)
{
	const dpo_coll_buffer_info_t *b = &a->src.info;
	uint64_t es, bytes;
	dpo_status_t st;

	if (a->root >= r->team->size)
		return bad("%s must be a team rank from 0 to %llu, got %llu", "root",
			   r->team->size - 1, a->root);
	if ((st = elem_size(b->datatype, "buffer", &es)) || (st = bytes_of(b->count, es, "buffer", &bytes)) ||
	    (st = need_buffer(b->buffer, bytes, "buffer")))
		return st;
	r->op.opcode = OFFLOAD_OP_BROADCAST;
	r->op.root = (uint32_t)a->root;
	r->op.count = bytes;
	r->op.src_addr = r->op.dst_addr = (uint64_t)(uintptr_t)b->buffer;
	r->op.src_len = r->op.dst_len = bytes;
	r->poll_bytes = bytes * r->team->size;  /* the firmware counts every member's copy */
	return DPO_OK;
}

static dpo_status_t init_allgather(struct dpo_coll_req *r, const dpo_coll_args_t *a)
{
	uint32_t n = r->team->size;
	const dpo_coll_buffer_info_t *s = &a->src.info, *d = &a->dst.info;
	uint64_t es, block, total;
	uint8_t *src;
	dpo_status_t st;

	if ((st = elem_size(d->datatype, "dst", &es)) || (st = bytes_of(d->count, es, "dst", &total)) ||
	    (st = need_buffer(d->buffer, total, "dst")))
		return st;
	if (d->count % n)
		return bad("%s has %llu elements: all-gather needs %llu equal blocks", "dst",
			   d->count, n);
	block = total / n;
	if (r->flags & DPO_COLL_ARGS_FLAG_IN_PLACE) {
		src = (uint8_t *)d->buffer + (uint64_t)r->team->rank * block;
	} else {
		if ((st = same_type(s->datatype, d->datatype)))
			return st;
		if (s->count * n != d->count)
			return bad("%s has %llu elements but all-gather needs src's count x ranks = %llu",
				   "dst", d->count, s->count * n);
		src = s->buffer;
		if ((st = need_buffer(src, block, "src")))
			return st;
		if (overlap(src, block, d->buffer, total) &&
		    src != (uint8_t *)d->buffer + (uint64_t)r->team->rank * block)
			return dpo_fail(DPO_ERR_INVALID_PARAM, "src and dst overlap: src may only be "
					"this rank's own block of dst (or pass "
					"DPO_COLL_ARGS_FLAG_IN_PLACE)");
	}
	r->op.opcode = OFFLOAD_OP_ALLGATHER;
	r->op.count = block;
	r->op.src_addr = (uint64_t)(uintptr_t)src;
	r->op.src_len = block;
	r->op.dst_addr = (uint64_t)(uintptr_t)d->buffer;
	r->op.dst_len = total;
	r->poll_bytes = total;
	return DPO_OK;
}

static void free_req(struct dpo_coll_req *r)
{
	struct host_ctx *h = r->team->ctx->host;

	for (int i = 0; i < 2; i++)
		if (r->owned[i])
			host_mr_release(h, r->keys[i]);
	dpo_scratch_put(r->team->ctx, &r->scratch);
	free(r->sbytes), free(r->soff), free(r->rbytes), free(r->roff);
	free(r->vargs), free(r->bounce_src), free(r->bounce_dst);
	__atomic_fetch_sub(&r->team->requests, 1, __ATOMIC_SEQ_CST);
	free(r);
}

/* Persistent: register src and dst once; every post reuses the keys. */
static dpo_status_t register_once(struct dpo_coll_req *r)
{
	struct host_ctx *h = r->team->ctx->host;
	uint32_t both = SRC_ACCESS | DST_ACCESS;
	int rc;

	if (r->op.src_key)  /* an in-place reduction registered its buffer at init */
		return DPO_OK;
	if (r->op.src_len) {
		rc = host_mr_acquire(h, (void *)(uintptr_t)r->op.src_addr, r->op.src_len,
				     r->type == DPO_COLL_TYPE_BCAST ? both : SRC_ACCESS, &r->keys[0],
				     &r->owned[0]);
		if (rc)
			return dpo_from_errno(rc, "registering src");
		r->op.src_key = r->keys[0];
	}
	if (r->type == DPO_COLL_TYPE_BCAST) {
		r->op.dst_key = r->op.src_key;
		return DPO_OK;
	}
	if (r->op.dst_len) {
		rc = host_mr_acquire(h, (void *)(uintptr_t)r->op.dst_addr, r->op.dst_len, DST_ACCESS,
				     &r->keys[1], &r->owned[1]);
		if (rc)
			return dpo_from_errno(rc, "registering dst");
		r->op.dst_key = r->keys[1];
	}
	return DPO_OK;
}

DPO_API dpo_status_t dpo_collective_init(const dpo_coll_args_t *a, dpo_coll_req_h *out,
					 dpo_team_h team)
{
	struct dpo_coll_req *r;
	dpo_status_t st;

	dpo_clear_error();
	if (!a || !out || !team)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_collective_init: NULL argument");
	*out = NULL;
	if (team->state != DPO_TEAM_READY)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_collective_init: the team is not "
				"created (dpo_team_create_test did not return DPO_OK)");
	r = calloc(1, sizeof(*r));
	if (!r)
		return dpo_fail(DPO_ERR_NO_MEMORY, "dpo_collective_init: out of memory");
	r->team = team;
	__atomic_fetch_add(&team->requests, 1, __ATOMIC_SEQ_CST);
	r->type = a->coll_type;
	r->flags = a->mask & DPO_COLL_ARGS_FIELD_FLAGS ? a->flags : 0;
	r->post_timeout = a->mask & DPO_COLL_ARGS_FIELD_TIMEOUT && a->timeout > 0 ?
			  a->timeout : team->ctx->cfg.post_timeout;
	r->peer = -1;
	r->op.team = team->slot;
	if (r->flags & ~(uint64_t)ALL_FLAGS)
		st = dpo_fail(DPO_ERR_INVALID_PARAM, "unknown flags 0x%llx",
			      (unsigned long long)(r->flags & ~(uint64_t)ALL_FLAGS));
	else if (a->coll_type == DPO_COLL_TYPE_ALLTOALL)
		st = init_alltoall(r, a);
	else if (a->coll_type == DPO_COLL_TYPE_ALLTOALLV)
		st = init_alltoallv(r, a);
	else if (a->coll_type == DPO_COLL_TYPE_BCAST)
		st = init_bcast(r, a);
	else if (a->coll_type == DPO_COLL_TYPE_ALLGATHER)
		st = init_allgather(r, a);
	else if (a->coll_type == DPO_COLL_TYPE_ALLREDUCE ||
		 a->coll_type == DPO_COLL_TYPE_REDUCE_SCATTER) {
		st = dpo_reduce_init(team, a, r->flags, &r->op, &r->scratch, &r->keys[0],
				     &r->owned[0]);
		r->poll_bytes = r->op.src_len;
	} else if (a->coll_type == DPO_COLL_TYPE_BARRIER)
		st = (r->op.opcode = OFFLOAD_OP_BARRIER, DPO_OK);
	else
		st = dpo_fail(DPO_ERR_INVALID_PARAM, "unknown coll_type %d", (int)a->coll_type);
	if (!st && r->flags & DPO_COLL_ARGS_FLAG_PERSISTENT)
		st = register_once(r);
	if (st) {
		free_req(r);
		return st;
	}
	*out = r;
	return DPO_OK;
}

static void gather_src(struct dpo_coll_req *r)
{
	uint64_t at = 0;

	if (r->type == DPO_COLL_TYPE_ALLTOALL) {
		if (r->bounce_src_len)
			memcpy(r->bounce_src, r->user_dst, r->bounce_src_len);
		return;
	}
	for (uint32_t i = 0; i < r->team->size; i++) {
		memcpy(r->bounce_src + at, r->user_src + r->soff[i], r->sbytes[i]);
		at += r->sbytes[i];
	}
}

static void scatter_dst(struct dpo_coll_req *r)
{
	uint64_t at = 0;

	for (uint32_t i = 0; i < r->team->size; i++) {
		memcpy(r->user_dst + r->roff[i], r->bounce_dst + at, r->rbytes[i]);
		at += r->rbytes[i];
	}
}

DPO_API dpo_status_t dpo_collective_post(dpo_coll_req_h r)
{
	int rc;

	dpo_clear_error();
	if (!r)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_collective_post: request is NULL");
	if (r->posted)
		return dpo_fail(DPO_ERR_BUSY, "the request is already posted and not complete; wait "
				"for it before posting again");
	if (r->done && !(r->flags & DPO_COLL_ARGS_FLAG_PERSISTENT))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "the request completed and is not persistent: "
				"init a new one (or pass DPO_COLL_ARGS_FLAG_PERSISTENT)");
	if (r->bounce_src)
		gather_src(r);
	if (r->vargs)
		memset(offload_a2av_recv(r->vargs), 0, 8ull * r->vargs->nranks);
	rc = host_post(r->team->ctx->host, &r->op, (int64_t)(r->post_timeout * 1e9), &r->tag);
	if (rc)
		return dpo_from_errno(rc, "posting the collective");
	r->posted = 1;
	r->done = 0;
	r->status = DPO_INPROGRESS;
	r->error[0] = 0;
	r->peer = -1;
	return DPO_OK;
}

DPO_API dpo_status_t dpo_collective_init_and_post(const dpo_coll_args_t *a, dpo_coll_req_h *out,
						  dpo_team_h team)
{
	dpo_status_t st = dpo_collective_init(a, out, team);

	if (st)
		return st;
	st = dpo_collective_post(*out);
	if (st) {
		char msg[512];

		snprintf(msg, sizeof(msg), "%s", dpo_last_error());
		free_req(*out);
		*out = NULL;
		dpo_fail(st, "%s", msg);
	}
	return st;
}

static const char *describe(const struct dpo_coll_req *r, const struct host_completion *c,
			    char *buf, size_t len)
{
	switch (c->status) {
	case OFFLOAD_ERR_PEER:
		snprintf(buf, len, "rank %u died", c->detail);
		break;
	case OFFLOAD_ERR_PEER_CLOSED:
		snprintf(buf, len, "rank %u closed its context", c->detail);
		break;
	case OFFLOAD_ERR_LINK_DOWN:
		snprintf(buf, len, "every rail to rank %u is down", c->detail);
		break;
	case OFFLOAD_ERR_NO_SPACE:
		snprintf(buf, len, "destination too small: %llu bytes arrive but dst holds %llu",
			 (unsigned long long)c->result0, (unsigned long long)c->result1);
		break;
	case OFFLOAD_ERR_COUNT_MISMATCH:
		snprintf(buf, len, "rank %u sends %llu bytes but %llu were expected", c->detail,
			 (unsigned long long)c->result0, (unsigned long long)c->result1);
		break;
	case OFFLOAD_ERR_MISMATCH:
		snprintf(buf, len, "rank %u posted another collective, size or root at this point "
			 "of the team's sequence", c->detail);
		break;
	case OFFLOAD_ERR_PEER_OP:
		snprintf(buf, len, "rank %u's part of the op failed", c->detail);
		break;
	case OFFLOAD_ERR_REMOTE_ACCESS:
		snprintf(buf, len, "rank %u's memory could not be accessed", c->detail);
		break;
	default:
		snprintf(buf, len, "%s", dpo_status_string((dpo_status_t)c->status));
	}
	(void)r;
	return buf;
}

static dpo_status_t reap(struct dpo_coll_req *r, const struct host_completion *c)
{
	r->posted = 0;
	r->done = 1;
	r->status = (dpo_status_t)c->status;
	if (c->status) {
		describe(r, c, r->error, sizeof(r->error));
		if (c->status == OFFLOAD_ERR_PEER || c->status == OFFLOAD_ERR_PEER_CLOSED ||
		    c->status == OFFLOAD_ERR_LINK_DOWN || c->status == OFFLOAD_ERR_COUNT_MISMATCH ||
		    c->status == OFFLOAD_ERR_MISMATCH || c->status == OFFLOAD_ERR_PEER_OP ||
		    c->status == OFFLOAD_ERR_REMOTE_ACCESS)
			r->peer = (int32_t)c->detail;
		return dpo_fail(r->status, "%s", r->error);
	}
	if (r->bounce_dst)
		scatter_dst(r);
	return DPO_OK;
}

DPO_API dpo_status_t dpo_collective_test(dpo_coll_req_h r)
{
	struct host_completion c;
	int rc;

	dpo_clear_error();
	if (!r)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_collective_test: request is NULL");
	if (!r->posted)
		return r->done ? (r->status ? dpo_fail(r->status, "%s", r->error) : DPO_OK) :
		       dpo_fail(DPO_ERR_INVALID_PARAM, "the request was never posted");
	rc = host_test(r->team->ctx->host, r->tag, &c);
	if (rc < 0)
		return dpo_from_errno(rc, "testing the collective");
	return rc ? reap(r, &c) : DPO_INPROGRESS;
}

DPO_API dpo_status_t dpo_collective_wait(dpo_coll_req_h r, int64_t timeout_ns)
{
	struct host_completion c;
	int rc;

	dpo_clear_error();
	if (!r)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_collective_wait: request is NULL");
	if (!r->posted)
		return dpo_collective_test(r);
	/* Spinning saves the wake-up of short ops (as offload_lib: spin_us); a bulk op's
	 * wait sleeps, leaving the CPU to the copies. */
	rc = host_wait(r->team->ctx->host, r->tag, timeout_ns,
		       r->poll_bytes <= POLL_MAX_BYTES ?
		       (int64_t)r->team->ctx->cfg.spin_us * 1000 : 0, &c);
	if (rc == -ETIMEDOUT)
		return DPO_INPROGRESS;
	if (rc)
		return dpo_from_errno(rc, "waiting for the collective");
	return reap(r, &c);
}

DPO_API const char *dpo_collective_error(dpo_coll_req_h r)
{
	return r ? r->error : "";
}

DPO_API int32_t dpo_collective_peer(dpo_coll_req_h r)
{
	return r ? r->peer : -1;
}

DPO_API dpo_status_t dpo_collective_finalize(dpo_coll_req_h r)
{
	dpo_clear_error();
	if (!r)
		return DPO_OK;
	if (r->posted)
		return dpo_fail(DPO_ERR_BUSY, "dpo_collective_finalize: the request is posted and not "
				"complete; wait for it first");
	free_req(r);
	return DPO_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public C API end to end, with no Python in the process: N forked ranks bootstrap a
 * context over a shared-memory OOB, build the world and two disjoint half teams (live at
 * once, multicast on both), run every collective over datatypes and sizes against
 * expected data, persistent and in-place requests, refused arguments, slot reuse, and
 * the resource limit; allreduce and reduce-scatter against a reference reduced in the
 * firmware's documented order (bitwise, also across repetitions). Usage: capi N. Exit 0 pass, 1 fail.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capi_oob.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "rank %u: FAIL %s:%d: ", \
	g_rank, __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, " [%s]\n", \
	dpo_last_error()); } } while (0)

static uint32_t g_rank;

static dpo_team_h make_team(dpo_context_h ctx, struct oob_ep *ep, const uint32_t *map)
{
	dpo_team_params_t tp = { .mask = DPO_TEAM_PARAM_FIELD_OOB | DPO_TEAM_PARAM_FIELD_EP_MAP,
				 .oob = oob_of(ep),
				 .ep_map = { map ? DPO_EP_MAP_ARRAY : DPO_EP_MAP_FULL, ep->n, map } };
	dpo_team_h team;
	dpo_status_t st = dpo_team_create_post(ctx, &tp, &team);

	CHECK(st == DPO_OK, "team_create_post %s", dpo_status_string(st));
	if (st)
		return NULL;
	while ((st = dpo_team_create_test(team)) == DPO_INPROGRESS)
		;
	CHECK(st == DPO_OK, "team_create_test %s", dpo_status_string(st));
	return team;
}

static uint8_t pattern(uint32_t from, uint32_t to, uint64_t i)
{
	return (uint8_t)(from * 31 + to * 7 + i * 13 + 1);
}

static dpo_status_t run(dpo_coll_args_t *a, dpo_team_h team)
{
	dpo_coll_req_h req;
	dpo_status_t st = dpo_collective_init_and_post(a, &req, team);

	if (st)
		return st;
	st = dpo_collective_wait(req, -1);
	dpo_collective_finalize(req);
	return st;
}

static void collectives(dpo_team_h team, dpo_datatype_t dt, uint64_t count)
{
	dpo_team_attr_t at;
	uint64_t es = dpo_dt_size(dt), n, me, blk;
	uint8_t *src, *dst;
	dpo_coll_args_t a;
	uint64_t sc[OOB_MAX], sd[OOB_MAX], rc[OOB_MAX], rd[OOB_MAX], at_s = 0, at_r = 0;

	dpo_team_get_attr(team, &at);
	n = at.size, me = at.rank, blk = count * es;
	src = calloc(n * blk + 64, 1);
	dst = calloc(n * blk * 2 + 64, 1);
	/* all-to-all */
	for (uint64_t j = 0; j < n; j++)
		for (uint64_t i = 0; i < blk; i++)
			src[j * blk + i] = pattern(at.ctx_ranks[me], at.ctx_ranks[j], i);
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_ALLTOALL;
	a.src.info = (dpo_coll_buffer_info_t){ src, count * n, dt };
	a.dst.info = (dpo_coll_buffer_info_t){ dst, count * n, dt };
	CHECK(run(&a, team) == DPO_OK, "alltoall dt %d count %llu", dt, (unsigned long long)count);
	for (uint64_t j = 0; j < n; j++)
		for (uint64_t i = 0; i < blk; i++)
			if (dst[j * blk + i] != pattern(at.ctx_ranks[j], at.ctx_ranks[me], i)) {
				CHECK(0, "alltoall data from %llu at %llu", (unsigned long long)j,
				      (unsigned long long)i);
				j = n;
				break;
			}
	/* all-to-all in place: dst holds what goes out and gets what comes in */
	memcpy(dst, src, n * blk);
	a.mask = DPO_COLL_ARGS_FIELD_FLAGS;
	a.flags = DPO_COLL_ARGS_FLAG_IN_PLACE;
	CHECK(run(&a, team) == DPO_OK, "alltoall in place");
	for (uint64_t j = 0; j < n && blk; j++)
		CHECK(dst[j * blk] == pattern(at.ctx_ranks[j], at.ctx_ranks[me], 0), "in place data");
	/* all-to-all-v: rank j gets count + j elements, received at shuffled displacements */
	for (uint64_t j = 0; j < n; j++) {
		sc[j] = count ? count + j : 0;
		sd[j] = at_s, at_s += sc[j];
		rc[j] = count ? count + me : 0;
	}
	for (uint64_t j = n; j-- > 0;)
		rd[j] = at_r, at_r += rc[j];  /* reversed order: not packed */
	free(src);
	src = calloc(at_s * es + 1, 1);
	free(dst);
	dst = calloc(at_r * es + 1, 1);
	for (uint64_t j = 0; j < n; j++)
		for (uint64_t i = 0; i < sc[j] * es; i++)
			src[sd[j] * es + i] = pattern(at.ctx_ranks[me], at.ctx_ranks[j], i);
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_ALLTOALLV;
	a.src.info_v = (dpo_coll_buffer_info_v_t){ src, sc, sd, dt };
	a.dst.info_v = (dpo_coll_buffer_info_v_t){ dst, rc, rd, dt };
	CHECK(run(&a, team) == DPO_OK, "alltoallv");
	for (uint64_t j = 0; j < n; j++)
		for (uint64_t i = 0; i < rc[j] * es; i++)
			if (dst[rd[j] * es + i] != pattern(at.ctx_ranks[j], at.ctx_ranks[me], i)) {
				CHECK(0, "alltoallv data from %llu", (unsigned long long)j);
				j = n;
				break;
			}
	free(src);
	free(dst);
	/* broadcast from every root */
	src = calloc(blk + 1, 1);
	for (uint64_t root = 0; root < n; root++) {
		for (uint64_t i = 0; i < blk; i++)
			src[i] = me == root ? pattern((uint32_t)root, 99, i) : 0;
		memset(&a, 0, sizeof(a));
		a.coll_type = DPO_COLL_TYPE_BCAST;
		a.root = root;
		a.src.info = (dpo_coll_buffer_info_t){ src, count, dt };
		CHECK(run(&a, team) == DPO_OK, "bcast root %llu", (unsigned long long)root);
		for (uint64_t i = 0; i < blk; i++)
			if (src[i] != pattern((uint32_t)root, 99, i)) {
				CHECK(0, "bcast data root %llu at %llu", (unsigned long long)root,
				      (unsigned long long)i);
				break;
			}
	}
	/* all-gather, then in place */
	dst = calloc(n * blk + 1, 1);
	for (uint64_t i = 0; i < blk; i++)
		src[i] = pattern(at.ctx_ranks[me], 5, i);
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_ALLGATHER;
	a.src.info = (dpo_coll_buffer_info_t){ src, count, dt };
	a.dst.info = (dpo_coll_buffer_info_t){ dst, count * n, dt };
	CHECK(run(&a, team) == DPO_OK, "allgather");
	for (uint64_t j = 0; j < n; j++)
		for (uint64_t i = 0; i < blk; i++)
			if (dst[j * blk + i] != pattern(at.ctx_ranks[j], 5, i)) {
				CHECK(0, "allgather data from %llu", (unsigned long long)j);
				j = n;
				break;
			}
	memset(dst, 0, n * blk);
	memcpy(dst + me * blk, src, blk);
	a.mask = DPO_COLL_ARGS_FIELD_FLAGS;
	a.flags = DPO_COLL_ARGS_FLAG_IN_PLACE;
	CHECK(run(&a, team) == DPO_OK, "allgather in place");
	for (uint64_t j = 0; j < n && blk; j++)
		CHECK(dst[j * blk + blk - 1] == pattern(at.ctx_ranks[j], 5, blk - 1), "in place ag");
	free(src);
	free(dst);
}

/* ---- reductions ---------------------------------------------------------------------- */
/* Team rank r's element i for op (as double; cast to the type): floats that do not add up
 * exactly, so the order shows; products that stay finite and integers that do not wrap. */
static double red_value(uint32_t r, uint64_t i, dpo_reduction_op_t op, int is_int)
{
	int64_t v = (int64_t)((r * 7 + i * 13) % 97) - 48;

	if (op == DPO_OP_PROD)
		return is_int ? (double)((r + i) % 3 == 0 ? 2 : ((r + i) % 3 == 1 ? -1 : 1)) :
		       1.0 + (double)v * 0.00137;
	return is_int ? (double)(v * 1000003 + (int64_t)r) : (double)v * 0.37 + 1.0 / (r + 3);
}

/* dpo_reduce.c's order_block: the order blocks the firmware reduces in */
static uint64_t ref_order_block(uint64_t total, uint64_t es, uint64_t n)
{
	uint64_t maxseg = es * ((1u << 20) / es), nseg = (total + maxseg - 1) / maxseg, seg;

	nseg = nseg < 2 * n ? 2 * n : nseg;
	nseg = (nseg + n - 1) / n * n;
	seg = ((total + nseg - 1) / nseg + es - 1) / es * es;
	return nseg / n * seg;
}

/* The allreduce of every member's red_value in the documented order: element i of order
 * block g is the reduction of ranks g-1, g-2, ..., g-n (mod n), left to right. */
#define REF(T, NAME)                                                                          \
static void NAME(void *out, uint64_t count, uint32_t n, dpo_reduction_op_t op, int is_int)   \
{                                                                                           \
	uint64_t ob = count ? ref_order_block(count * sizeof(T), sizeof(T), n) / sizeof(T) : 1; \
	T *o = out;                                                                             \
	for (uint64_t i = 0; i < count; i++) {                                                  \
		uint32_t g = (uint32_t)(i / ob);                                                \
		T acc = (T)red_value((g + n - 1) % n, i, op, is_int);                           \
		for (uint32_t s = 2; s <= n; s++) {                                             \
			T x = (T)red_value((g + 2 * n - s) % n, i, op, is_int);                 \
			acc = op == DPO_OP_PROD ? (T)(acc * x) : op == DPO_OP_MAX ?             \
			      (acc > x ? acc : x) : op == DPO_OP_MIN ? (acc < x ? acc : x) :    \
			      (T)(acc + x);                                                     \
		}                                                                               \
		o[i] = op == DPO_OP_AVG ? (T)(acc / (T)n) : acc;                                \
	}                                                                                       \
}
REF(float, ref_f32)
REF(double, ref_f64)
REF(int32_t, ref_i32)
REF(int64_t, ref_i64)

static void fill_values(void *buf, dpo_datatype_t dt, uint32_t r, uint64_t count,
			dpo_reduction_op_t op)
{
	for (uint64_t i = 0; i < count; i++) {
		double v = red_value(r, i, op, dt == DPO_DT_INT32 || dt == DPO_DT_INT64);

		if (dt == DPO_DT_FLOAT32)
			((float *)buf)[i] = (float)v;
		else if (dt == DPO_DT_FLOAT64)
			((double *)buf)[i] = v;
		else if (dt == DPO_DT_INT32)
			((int32_t *)buf)[i] = (int32_t)v;
		else
			((int64_t *)buf)[i] = (int64_t)v;
	}
}

static void reduce_one(dpo_team_h team, dpo_datatype_t dt, dpo_reduction_op_t op, uint64_t count)
{
	dpo_team_attr_t at;
	uint64_t es = dpo_dt_size(dt), n, me, bytes = count * es;
	int is_int = dt == DPO_DT_INT32 || dt == DPO_DT_INT64;
	uint8_t *src, *dst, *want, *first;
	dpo_coll_args_t a;

	dpo_team_get_attr(team, &at);
	n = at.size, me = at.rank;
	src = malloc(bytes + 8), dst = malloc(bytes + 8), want = malloc(bytes + 8);
	first = malloc(bytes + 8);
	(dt == DPO_DT_FLOAT32 ? ref_f32 : dt == DPO_DT_FLOAT64 ? ref_f64 :
	 dt == DPO_DT_INT32 ? ref_i32 : ref_i64)(want, count, (uint32_t)n, op, is_int);
	/* allreduce: out of place twice (bitwise the same), then in place */
	for (int rep = 0; rep < 3; rep++) {
		fill_values(src, dt, (uint32_t)me, count, op);
		memset(dst, 0xa5, bytes + 8);
		memset(&a, 0, sizeof(a));
		a.coll_type = DPO_COLL_TYPE_ALLREDUCE;
		a.op = op;
		a.dst.info = (dpo_coll_buffer_info_t){ rep == 2 ? src : dst, count, dt };
		a.src.info = (dpo_coll_buffer_info_t){ src, count, dt };
		if (rep == 2)
			a.mask = DPO_COLL_ARGS_FIELD_FLAGS, a.flags = DPO_COLL_ARGS_FLAG_IN_PLACE;
		CHECK(run(&a, team) == DPO_OK, "allreduce dt %d op %d count %llu", dt, op,
		      (unsigned long long)count);
		CHECK(!memcmp(rep == 2 ? src : dst, want, bytes), "allreduce dt %d op %d count %llu "
		      "rep %d differs from the reference", dt, op, (unsigned long long)count, rep);
		CHECK(rep == 2 || dst[bytes] == 0xa5, "allreduce wrote past dst");
		if (rep == 0)
			memcpy(first, dst, bytes);
		CHECK(rep != 1 || !memcmp(first, dst, bytes), "allreduce not repeatable");
	}
	/* reduce-scatter (block form) on the count rounded down to team size blocks */
	count -= count % n;
	bytes = count * es;
	(dt == DPO_DT_FLOAT32 ? ref_f32 : dt == DPO_DT_FLOAT64 ? ref_f64 :
	 dt == DPO_DT_INT32 ? ref_i32 : ref_i64)(want, count, (uint32_t)n, op, is_int);
	for (int rep = 0; rep < 2; rep++) {
		uint64_t blk = bytes / n;

		fill_values(src, dt, (uint32_t)me, count, op);
		memset(dst, 0xa5, bytes + 8);
		memset(&a, 0, sizeof(a));
		a.coll_type = DPO_COLL_TYPE_REDUCE_SCATTER;
		a.op = op;
		if (rep) {
			a.mask = DPO_COLL_ARGS_FIELD_FLAGS, a.flags = DPO_COLL_ARGS_FLAG_IN_PLACE;
			a.dst.info = (dpo_coll_buffer_info_t){ src, count, dt };
		} else {
			a.src.info = (dpo_coll_buffer_info_t){ src, count, dt };
			a.dst.info = (dpo_coll_buffer_info_t){ dst, count / n, dt };
		}
		CHECK(run(&a, team) == DPO_OK, "reduce-scatter dt %d op %d count %llu", dt, op,
		      (unsigned long long)count);
		CHECK(!memcmp(rep ? src + me * blk : dst, want + me * blk, blk), "reduce-scatter dt %d "
		      "op %d count %llu rep %d differs from the reference", dt, op,
		      (unsigned long long)count, rep);
		CHECK(rep || dst[blk] == 0xa5, "reduce-scatter wrote past dst");
	}
	/* out of place into this rank's own block of src, and a persistent allreduce posted
	 * three times (its scratch and registrations held from init to finalize) */
	if (count) {
		uint64_t blk = bytes / n;
		dpo_coll_req_h req;

		fill_values(src, dt, (uint32_t)me, count, op);
		memset(&a, 0, sizeof(a));
		a.coll_type = DPO_COLL_TYPE_REDUCE_SCATTER;
		a.op = op;
		a.src.info = (dpo_coll_buffer_info_t){ src, count, dt };
		a.dst.info = (dpo_coll_buffer_info_t){ src + me * blk, count / n, dt };
		CHECK(run(&a, team) == DPO_OK && !memcmp(src + me * blk, want + me * blk, blk),
		      "reduce-scatter into its own block of src, dt %d op %d", dt, op);
		a.coll_type = DPO_COLL_TYPE_ALLREDUCE;
		a.mask = DPO_COLL_ARGS_FIELD_FLAGS;
		a.flags = DPO_COLL_ARGS_FLAG_PERSISTENT;
		a.dst.info = (dpo_coll_buffer_info_t){ dst, count, dt };
		CHECK(dpo_collective_init(&a, &req, team) == DPO_OK, "persistent allreduce init");
		for (int rep = 0; req && rep < 3; rep++) {
			fill_values(src, dt, (uint32_t)me, count, op);
			memset(dst, 0, bytes);
			CHECK(dpo_collective_post(req) == DPO_OK && dpo_collective_wait(req, -1) == DPO_OK,
			      "persistent allreduce post %d", rep);
			CHECK(!memcmp(dst, want, bytes), "persistent allreduce %d differs", rep);
		}
		dpo_collective_finalize(req);
	}
	free(src), free(dst), free(want), free(first);
}

static void reductions(dpo_team_h team)
{
	static const dpo_datatype_t dts[] = { DPO_DT_FLOAT32, DPO_DT_FLOAT64, DPO_DT_INT32,
					      DPO_DT_INT64 };
	static const uint64_t counts[] = { 1, 257, 70001 };
	dpo_coll_args_t a;
	float f[64], g[64];
	int32_t i32[64];

	for (unsigned d = 0; d < 4; d++)
		for (dpo_reduction_op_t op = DPO_OP_SUM; op <= DPO_OP_AVG; op++)
			for (unsigned c = 0; c < 3; c++)
				if ((op != DPO_OP_AVG || d < 2) && (op == DPO_OP_SUM || c == 1))
					reduce_one(team, dts[d], op, counts[c]);
	/* refused before anything is posted */
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_ALLREDUCE;
	a.op = DPO_OP_AVG;
	a.src.info = (dpo_coll_buffer_info_t){ i32, 64, DPO_DT_INT32 };
	a.dst.info = (dpo_coll_buffer_info_t){ i32, 64, DPO_DT_INT32 };
	CHECK(run(&a, team) == DPO_ERR_INVALID_PARAM && strstr(dpo_last_error(), "DPO_OP_AVG"),
	      "avg of int32");
	a.op = 9;
	a.src.info = a.dst.info = (dpo_coll_buffer_info_t){ f, 64, DPO_DT_FLOAT32 };
	CHECK(run(&a, team) == DPO_ERR_INVALID_PARAM && strstr(dpo_last_error(), "op 9"), "bad op");
	a.op = DPO_OP_SUM;
	a.src.info = (dpo_coll_buffer_info_t){ f, 64, DPO_DT_UINT8 };
	a.dst.info = (dpo_coll_buffer_info_t){ g, 64, DPO_DT_UINT8 };
	CHECK(run(&a, team) == DPO_ERR_INVALID_PARAM && strstr(dpo_last_error(), "reduces"), "uint8");
	a.src.info = (dpo_coll_buffer_info_t){ f, 64, DPO_DT_FLOAT32 };
	a.dst.info = (dpo_coll_buffer_info_t){ g, 63, DPO_DT_FLOAT32 };
	CHECK(run(&a, team) == DPO_ERR_INVALID_PARAM, "allreduce count mismatch");
	a.dst.info = (dpo_coll_buffer_info_t){ f + 1, 64, DPO_DT_FLOAT32 };
	CHECK(run(&a, team) == DPO_ERR_INVALID_PARAM && strstr(dpo_last_error(), "partially"),
	      "partial overlap");
	a.coll_type = DPO_COLL_TYPE_REDUCE_SCATTER;
	a.src.info = (dpo_coll_buffer_info_t){ f, 60, DPO_DT_FLOAT32 };  /* 60: any n <= 6 */
	a.dst.info = (dpo_coll_buffer_info_t){ g, 61, DPO_DT_FLOAT32 };
	CHECK(run(&a, team) == DPO_ERR_INVALID_PARAM && strstr(dpo_last_error(), "gives each"),
	      "reduce-scatter dst count");
	{
		dpo_team_attr_t at;

		dpo_team_get_attr(team, &at);
		a.src.info.count = at.size * 4 + 1;
		a.dst.info.count = 4;
		CHECK(at.size == 1 || (run(&a, team) == DPO_ERR_INVALID_PARAM &&
				       strstr(dpo_last_error(), "split evenly")), "uneven reduce-scatter");
	}
}

static void persistent_and_errors(dpo_team_h team)
{
	dpo_team_attr_t at;
	double s[64], d[64];
	int32_t di[64];
	dpo_coll_args_t a;
	dpo_coll_req_h req = NULL;
	dpo_status_t st;

	dpo_team_get_attr(team, &at);
	memset(&a, 0, sizeof(a));
	a.mask = DPO_COLL_ARGS_FIELD_FLAGS;
	a.flags = DPO_COLL_ARGS_FLAG_PERSISTENT;
	a.coll_type = DPO_COLL_TYPE_ALLTOALL;
	a.src.info = (dpo_coll_buffer_info_t){ s, at.size * 4, DPO_DT_FLOAT64 };
	a.dst.info = (dpo_coll_buffer_info_t){ d, at.size * 4, DPO_DT_FLOAT64 };
	CHECK(dpo_collective_init(&a, &req, team) == DPO_OK, "persistent init");
	for (int it = 0; it < 3 && req; it++) {
		for (uint32_t i = 0; i < at.size * 4; i++)
			s[i] = it * 1000 + at.rank * 10 + i / 4;
		CHECK(dpo_collective_post(req) == DPO_OK, "persistent post %d", it);
		st = dpo_collective_post(req);
		CHECK(st == DPO_ERR_BUSY || st == DPO_OK, "second post while posted: %d", st);
		if (st == DPO_OK)
			CHECK(0, "a posted request was posted again");
		CHECK(dpo_collective_wait(req, -1) == DPO_OK, "persistent wait %d", it);
		for (uint32_t j = 0; j < at.size; j++)
			CHECK(d[j * 4] == it * 1000 + j * 10 + at.rank, "persistent data %d", it);
	}
	CHECK(dpo_team_destroy(team) == DPO_ERR_BUSY, "destroy with a live request");
	dpo_collective_finalize(req);
	/* refused arguments: each fails at init, naming what to fix */
	a.mask = 0;
	a.dst.info.datatype = DPO_DT_INT64;
	CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM &&
	      strstr(dpo_last_error(), "same datatype"), "dtype mismatch");
	a.dst.info = (dpo_coll_buffer_info_t){ s + 1, at.size * 4, DPO_DT_FLOAT64 };
	CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM &&
	      strstr(dpo_last_error(), "overlap"), "overlap");
	a.src.info = (dpo_coll_buffer_info_t){ di, at.size * 4 + 1, DPO_DT_INT32 };
	a.dst.info = (dpo_coll_buffer_info_t){ d, at.size * 4 + 1, DPO_DT_INT32 };
	if (at.size > 1)
		CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM &&
		      strstr(dpo_last_error(), "split evenly"), "not divisible");
	a.coll_type = DPO_COLL_TYPE_BCAST;
	a.root = at.size;
	CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM &&
	      strstr(dpo_last_error(), "root"), "root out of range");
	a.root = 0;
	a.src.info.buffer = NULL;
	CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM &&
	      strstr(dpo_last_error(), "NULL"), "NULL buffer");
	a.mask = DPO_COLL_ARGS_FIELD_FLAGS;
	a.flags = 1u << 20;
	CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM, "unknown flag");
	a.mask = 0;
	a.coll_type = (dpo_coll_type_t)77;
	CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM, "unknown type");
	a.coll_type = DPO_COLL_TYPE_ALLTOALL;
	a.src.info = (dpo_coll_buffer_info_t){ s, at.size, (dpo_datatype_t)99 };
	CHECK(dpo_collective_init(&a, &req, team) == DPO_ERR_INVALID_PARAM &&
	      strstr(dpo_last_error(), "datatype"), "unknown datatype");
}

static void config_checks(void)
{
	dpo_config_h cfg;
	char buf[32];

	CHECK(dpo_config_read(&cfg) == DPO_OK, "config read");
	CHECK(dpo_config_modify(cfg, "mtu", "3000") == DPO_ERR_INVALID_PARAM &&
	      strstr(dpo_last_error(), "mtu"), "mtu not a power of two");
	CHECK(dpo_config_modify(cfg, "nope", "1") == DPO_ERR_INVALID_PARAM, "unknown key");
	CHECK(dpo_config_modify(cfg, "chunk_size", "256K") == DPO_OK, "size suffix");
	dpo_config_get(cfg, "chunk_size", buf, sizeof(buf));
	CHECK(!strcmp(buf, "262144"), "chunk_size read back %s", buf);
	dpo_config_release(cfg);
	CHECK(!strcmp(dpo_status_string(DPO_ERR_PEER_FAILED), "DPO_ERR_PEER_FAILED"), "strerror");
}

static int rank_main(uint32_t rank, uint32_t n, struct oob_board **boards)
{
	struct oob_ep world = { boards[0], rank, n, 0, NULL, 0 };
	struct oob_ep half = { boards[1 + rank % 2], rank / 2, (n + 1 - rank % 2) / 2, 0, NULL, 0 };
	struct oob_ep churn = { boards[3], rank, n, 0, NULL, 0 };
	dpo_context_params_t cp = { .mask = DPO_CONTEXT_PARAM_FIELD_OOB, .oob = oob_of(&world) };
	static const dpo_datatype_t types[] = { DPO_DT_BYTE, DPO_DT_INT32, DPO_DT_FLOAT32,
						DPO_DT_FLOAT64, DPO_DT_COMPLEX128 };
	static const uint64_t counts[] = { 0, 1, 7, 4096 };
	uint32_t map[OOB_MAX], nt = 0;
	dpo_thread_stats_t stats[8];
	dpo_context_attr_t attr;
	dpo_team_h w, h, extra[16];
	dpo_context_h ctx;
	dpo_config_h cfg;

	g_rank = rank;
	config_checks();
	if (dpo_config_read(&cfg) || dpo_context_create(&cp, cfg, &ctx)) {
		CHECK(0, "context create");
		return 1;
	}
	dpo_context_get_attr(ctx, &attr);
	CHECK(attr.rank == rank && attr.size == n && !strcmp(attr.backend, "emulator"), "attr");
	/* The rank lists (any job size): none failed or closed yet; a list needs its array. */
	CHECK(dpo_context_failed_ranks(ctx, map, OOB_MAX, &nt) == DPO_OK && nt == 0, "failed list");
	CHECK(dpo_context_closed_ranks(ctx, NULL, 0, &nt) == DPO_OK && nt == 0, "closed list");
	CHECK(dpo_context_failed_ranks(ctx, NULL, 1, &nt) == DPO_ERR_INVALID_PARAM, "no array");
	nt = 0;
	w = make_team(ctx, &world, NULL);
	for (uint32_t i = rank % 2; i < n; i += 2)
		map[nt++] = i;
	h = make_team(ctx, &half, map);
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
			collectives(w, types[t], counts[c]);
			collectives(h, types[t], counts[c]);
		}
	collectives(w, DPO_DT_BYTE, 1 << 20);
	persistent_and_errors(w);
	reductions(w);
	if (h)
		reductions(h);
	/* slot reuse: create, broadcast, destroy, many times (multicast groups left each time) */
	for (int i = 0; i < 40; i++) {
		dpo_team_h t = make_team(ctx, &churn, NULL);

		collectives(t, DPO_DT_BYTE, (uint64_t)(i % 3) * 3000);
		CHECK(dpo_team_destroy(t) == DPO_OK, "churn destroy %d", i);
	}
	/* the limit: the job holds 16 live teams; world and the halves are live (one half
	 * when n = 1), so 13 more fit, the next fails */
	for (nt = 0; nt < 16; nt++) {
		dpo_team_params_t tp = { .mask = DPO_TEAM_PARAM_FIELD_OOB, .oob = oob_of(&churn) };
		dpo_status_t st = dpo_team_create_post(ctx, &tp, &extra[nt]);

		if (st == DPO_OK)
			while ((st = dpo_team_create_test(extra[nt])) == DPO_INPROGRESS)
				;
		if (st) {
			CHECK(st == DPO_ERR_NO_RESOURCE && nt == (n > 1 ? 13u : 14u), "team %u: %s", nt,
			      dpo_status_string(st));
			dpo_team_destroy(extra[nt]);
			break;
		}
	}
	for (uint32_t i = 0; i < nt; i++)
		CHECK(dpo_team_destroy(extra[i]) == DPO_OK, "extra destroy");
	CHECK(dpo_context_destroy(ctx) == DPO_ERR_BUSY, "destroy with live teams");
	CHECK(dpo_context_stats(ctx, stats, 8, &nt) == DPO_OK && nt >= 1 &&
	      stats[0].ops_completed + (nt > 1 ? stats[1].ops_completed : 0) > 0, "stats");
	CHECK(dpo_team_destroy(h) == DPO_OK && dpo_team_destroy(w) == DPO_OK, "destroy");
	CHECK(dpo_context_destroy(ctx) == DPO_OK, "context destroy");
	dpo_config_release(cfg);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	uint32_t n = argc > 1 ? (uint32_t)atoi(argv[1]) : 3;
	struct oob_board *boards[4];
	int bad = 0;

	if (n < 1 || n > OOB_MAX)
		return 2;
	for (int i = 0; i < 4; i++)
		if (!(boards[i] = oob_board_new()))
			return 2;
	for (uint32_t r = 0; r < n; r++)
		if (fork() == 0)
			_exit(rank_main(r, n, boards));
	for (uint32_t r = 0; r < n; r++) {
		int status;

		wait(&status);
		bad |= !WIFEXITED(status) || WEXITSTATUS(status);
	}
	printf("capi n=%u: %s\n", n, bad ? "FAIL" : "ok");
	return bad;
}

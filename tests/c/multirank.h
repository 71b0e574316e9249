/* SPDX-License-Identifier: Apache-2.0 */
/* The multi-rank C job (multirank.c): one rank's state and the helpers its checks share. */
#ifndef MULTIRANK_H
#define MULTIRANK_H

#include <stdint.h>

#include "offload_abi.h"
#include "offload_host.h"

#define MAX_N          128u   /* past 64: jobs beyond 64-bit rank masks (-scale) */
#define GUARD_ELEMS    64u
#define GUARD_VAL      0xEEEEEEEEu
#define WAIT_NS        (30ll * 1000000000ll)
#define BARRIER_ROUNDS 6u

/* Memory shared by the parent and every rank (set up before fork). */
struct shared {
	uint32_t arrived[2 * BARRIER_ROUNDS];
	uint32_t mcast_staged;  /* -staged: multicast received into staging slots (UD) */
	uint32_t threads_only;  /* -threads-only: no cooperative progress */
	uint32_t scale;         /* -scale: a short set of ops for jobs of many ranks */
	uint64_t job_key;
};

struct rank {
	uint32_t me, n;
	struct host_ctx *ctx;
	struct shared *sh;
	uint32_t big;          /* elements per peer of the largest all-to-all */
	int failures;
};

/* Buffers of uint32 elements with a guard after them: private (malloc) or job-shared. */
struct buf {
	uint32_t *p;
	uint64_t elems;        /* usable */
	uint64_t alloc_bytes;
	int shared;
};

#define THREAD_TEAM 2u
#define THREAD_OPS  12u

/* multirank.c: report a failure of this rank (the first ten); the value element i of the
 * block src sends dst has at iteration iter; guarded buffers; post and wait, failing. */
void fail(struct rank *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint32_t val(uint32_t src, uint32_t dst, uint32_t i, uint32_t iter);
int buf_new(struct rank *r, struct buf *b, uint64_t elems, int shared);
void buf_free(struct rank *r, struct buf *b);
void check_guard(struct rank *r, const struct buf *b, uint64_t from, const char *what);
int post(struct rank *r, const struct host_op *op, uint32_t *tag, const char *what);
int wait_ok(struct rank *r, uint32_t tag, struct host_completion *c, const char *what);

/* multirank_alltoall.c; an all-to-all in flight (a2a_post, then a2a_finish checks it) */
struct a2a {
	struct buf src, dst;
	uint32_t cnt, iter, team, tag;
	const uint32_t *members;   /* world rank of each team rank */
	uint32_t my;               /* my team rank */
};

int a2a_post(struct rank *r, struct a2a *a, uint32_t cnt, uint32_t iter, int shared,
	     uint32_t team, const uint32_t *members);
void a2a_finish(struct rank *r, struct a2a *a);
void test_alltoall(struct rank *r, const uint32_t *world);
void test_alltoallv(struct rank *r);
void test_alltoallv_scale(struct rank *r);
void test_overlap(struct rank *r);
void test_threads(struct rank *r, const uint32_t *world);
/* multirank_agree.c */
void test_agreement_scale(struct rank *r);

#endif /* MULTIRANK_H */

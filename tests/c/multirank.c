/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A multi-rank job in C, no Python: the parent forks N rank processes, each opens a host
 * context on the emulator through host/'s API (offload_host.h) and runs all-to-all (sizes
 * 0 to 1 MiB per peer, private and job-shared buffers, several in flight at once, a team
 * in reverse rank order), all-to-all-v (counts with zeros, expected counts, fixed slots),
 * barriers (no rank leaves before all arrived), a forged all-to-all whose src and dst
 * overlap, two host threads posting on two teams at once, and multicast broadcast and
 * all-gather (private and shared buffers, 2% of chunks lost), checking every element
 * received and the guard past every destination. Built with sanitizers by
 * tests/test_sanitizers.py; runs alone too:
 *
 *   cc -std=c11 -O2 -g -fsanitize=address,undefined -Idpa_firmware/include -Ihost/include \
 *      tests/c/multirank.c $(ls dpa_firmware/src/[a-z]*.c emulator/[a-z]*.c host/src/[a-z]*.c) \
 *      -lpthread -o multirank
 *   ./multirank -n 4 [-threads 2] [-rails 1] [-rail0_down_after BYTES] [-timeout 60] [-big 262144]
 *               [-staged] [-threads-only]
 * (-rail0_down_after: each rank's port 0 fails once it sent that much; with -rails 2 or more
 * the traffic must fail over and every byte still arrive. -staged: multicast chunks land in
 * staging slots that the firmware copies out, the UD fallback. Small ops (at most 1 MiB
 * each way) are run by the posting and waiting host threads themselves (cooperative
 * progress), unless -threads-only leaves everything to the DPA threads.)
 *
 * Exit status: 0 every rank passed; 1 a rank failed, crashed or the job timed out (the
 * parent then kills the survivors); 2 bad usage. A failing rank says what and where.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "offload_abi.h"
#include "offload_host.h"

#define MAX_N          16u
#define GUARD_ELEMS    64u
#define GUARD_VAL      0xEEEEEEEEu
#define WAIT_NS        (30ll * 1000000000ll)
#define BARRIER_ROUNDS 6u

/* Memory shared by the parent and every rank (set up before fork). */
struct shared {
	uint32_t arrived[2 * BARRIER_ROUNDS];
	uint32_t mcast_staged;  /* -staged: multicast received into staging slots (UD) */
	uint32_t threads_only;  /* -threads-only: no cooperative progress */
	uint64_t job_key;
};

struct rank {
	uint32_t me, n;
	struct host_ctx *ctx;
	struct shared *sh;
	uint32_t big;          /* elements per peer of the largest all-to-all */
	int failures;
};

static void fail(struct rank *r, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	if (__atomic_fetch_add(&r->failures, 1, __ATOMIC_RELAXED) >= 10)
		return;
	n = snprintf(line, sizeof(line), "[rank %u] FAIL: ", r->me);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* One write per line: ranks share the terminal. */
	if (write(2, line, (size_t)n) < 0)
		return;
}

static uint32_t val(uint32_t src, uint32_t dst, uint32_t i, uint32_t iter)
{
	return (src << 24) ^ (dst << 16) ^ (i * 2654435761u) ^ (iter * 40503u);
}

/* Buffers of uint32 elements with a guard after them: private (malloc) or job-shared. */
struct buf {
	uint32_t *p;
	uint64_t elems;        /* usable */
	uint64_t alloc_bytes;
	int shared;
};

static int buf_new(struct rank *r, struct buf *b, uint64_t elems, int shared)
{
	uint64_t bytes = (elems + GUARD_ELEMS) * sizeof(uint32_t);
	uint32_t key;
	int rc;

	memset(b, 0, sizeof(*b));
	b->elems = elems;
	b->alloc_bytes = bytes;
	b->shared = shared;
	if (shared) {
		rc = host_alloc_shared(r->ctx, bytes, (void **)&b->p, &key);
		if (rc) {
			fail(r, "host_alloc_shared(%llu) = %d", (unsigned long long)bytes, rc);
			return rc;
		}
	} else {
		b->p = malloc(bytes);
		if (!b->p) {
			fail(r, "out of memory");
			return -ENOMEM;
		}
	}
	for (uint64_t i = 0; i < elems + GUARD_ELEMS; i++)
		b->p[i] = GUARD_VAL;
	return 0;
}

static void buf_free(struct rank *r, struct buf *b)
{
	if (!b->p)
		return;
	if (b->shared)
		host_free_shared(r->ctx, b->p, b->alloc_bytes);
	else
		free(b->p);
	b->p = NULL;
}

static void check_guard(struct rank *r, const struct buf *b, uint64_t from, const char *what)
{
	for (uint64_t i = from; i < b->elems + GUARD_ELEMS; i++) {
		if (b->p[i] != GUARD_VAL) {
			fail(r, "%s: element %llu past the received data was written (%#x)", what,
			     (unsigned long long)i, b->p[i]);
			return;
		}
	}
}

static int post(struct rank *r, const struct host_op *op, uint32_t *tag, const char *what)
{
	struct host_op o = *op;
	int rc;

	/* As offload_lib does: at most 1 MiB each way is small (cooperative progress). */
	o.small = o.src_len <= (1u << 20) && o.dst_len <= (1u << 20);
	rc = host_post(r->ctx, &o, WAIT_NS, tag);

	if (rc)
		fail(r, "%s: host_post = %d", what, rc);
	return rc;
}

static int wait_ok(struct rank *r, uint32_t tag, struct host_completion *c, const char *what)
{
	int rc = host_wait(r->ctx, tag, WAIT_NS, 1000000, c);

	if (rc) {
		fail(r, "%s: host_wait = %d", what, rc);
		return rc;
	}
	if (c->status != OFFLOAD_OK) {
		fail(r, "%s: completed with status %d (detail %u)", what, c->status, c->detail);
		return -EIO;
	}
	return 0;
}

/* ---- all-to-all ---- */

struct a2a {
	struct buf src, dst;
	uint32_t cnt, iter, team, tag;
	const uint32_t *members;   /* world rank of each team rank */
	uint32_t my;               /* my team rank */
};

static int a2a_post(struct rank *r, struct a2a *a, uint32_t cnt, uint32_t iter, int shared,
		    uint32_t team, const uint32_t *members)
{
	uint64_t total = (uint64_t)cnt * r->n;
	struct host_op op;
	char what[96];

	a->cnt = cnt;
	a->iter = iter;
	a->team = team;
	a->members = members;
	for (a->my = 0; members[a->my] != r->me; a->my++)
		;
	if (buf_new(r, &a->src, total, shared & 1) || buf_new(r, &a->dst, total, shared & 2))
		return -1;
	/* Block p of src goes to team rank p; values name world ranks. */
	for (uint32_t p = 0; p < r->n; p++)
		for (uint32_t i = 0; i < cnt; i++)
			a->src.p[(uint64_t)p * cnt + i] = val(r->me, members[p], i, iter);
	op = (struct host_op){ .opcode = OFFLOAD_OP_ALLTOALL, .team = team,
		.src_addr = (uintptr_t)a->src.p, .src_len = total * 4,
		.dst_addr = (uintptr_t)a->dst.p, .dst_len = total * 4, .count = (uint64_t)cnt * 4 };
	snprintf(what, sizeof(what), "alltoall team %u, %u elements per peer", team, cnt);
	return post(r, &op, &a->tag, what);
}

static void a2a_finish(struct rank *r, struct a2a *a)
{
	struct host_completion c;
	uint64_t total = (uint64_t)a->cnt * r->n;
	char what[96];

	snprintf(what, sizeof(what), "alltoall team %u, %u elements per peer (%s src, %s dst)",
		 a->team, a->cnt, a->src.shared ? "shared" : "private",
		 a->dst.shared ? "shared" : "private");
	if (!wait_ok(r, a->tag, &c, what)) {
		if (c.result0 != total * 4)
			fail(r, "%s: result0 %llu, want %llu", what, (unsigned long long)c.result0,
			     (unsigned long long)(total * 4));
		for (uint32_t s = 0; s < r->n; s++) {
			for (uint32_t i = 0; i < a->cnt; i++) {
				uint32_t got = a->dst.p[(uint64_t)s * a->cnt + i];
				uint32_t want = val(a->members[s], r->me, i, a->iter);

				if (got != want) {
					fail(r, "%s: block from team rank %u, element %u: got %#x, want %#x",
					     what, s, i, got, want);
					s = r->n;
					break;
				}
			}
		}
		check_guard(r, &a->dst, total, what);
	}
	buf_free(r, &a->src);
	buf_free(r, &a->dst);
}

static void test_alltoall(struct rank *r, const uint32_t *world)
{
	const uint32_t sizes[] = { 0, 1, 1000, 4099, r->big };
	struct a2a a[3];
	uint32_t iter = 0;

	for (uint32_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		/* 0: private both; 3: shared both (memcpy path); 2: shared dst only. */
		for (int shared = 0; shared < 4; shared += 3) {
			if (!a2a_post(r, &a[0], sizes[k], iter++, shared, OFFLOAD_WORLD_TEAM, world))
				a2a_finish(r, &a[0]);
		}
	}
	/* Three in flight at once, mixed sizes and memory. */
	for (int i = 0; i < 3; i++)
		a2a_post(r, &a[i], i == 1 ? 70000 : 333 * (uint32_t)(i + 1), iter++, i, OFFLOAD_WORLD_TEAM,
			 world);
	for (int i = 0; i < 3; i++)
		a2a_finish(r, &a[i]);
}

/* ---- all-to-all-v ---- */

static uint32_t vcount(uint32_t src, uint32_t dst, uint32_t iter)
{
	if (iter == 3 && (src + dst) % 3 == 0)
		return 100000 + src;   /* a few large blocks */
	return ((src * 7 + dst * 3 + iter * 5) % 11) * 37;  /* zeros included */
}

enum vmode { V_PLAIN, V_EXPECT, V_SLOTS };

static void test_alltoallv_one(struct rank *r, uint32_t team, uint32_t iter, enum vmode mode)
{
	static const char *const names[] = { "alltoallv", "alltoallv expect", "alltoallv slots" };
	struct offload_alltoallv_args *args;
	struct host_completion c;
	struct buf src, dst;
	uint64_t sends = 0, recvs = 0, off = 0, slot = 0;
	struct host_op op;
	uint32_t tag;
	char what[80];

	snprintf(what, sizeof(what), "%s team %u round %u", names[mode], team, iter);
	args = aligned_alloc(64, (sizeof(*args) + 63) & ~(size_t)63);
	if (!args) {
		fail(r, "out of memory");
		return;
	}
	memset(args, 0, sizeof(*args));
	for (uint32_t p = 0; p < r->n; p++) {
		uint32_t out = vcount(r->me, p, iter), in = vcount(p, r->me, iter);

		args->send_bytes[p] = (uint64_t)out * 4;
		args->expect_bytes[p] = (uint64_t)in * 4;
		sends += out;
		recvs += in;
		for (uint32_t q = 0; q < r->n; q++)
			if (vcount(q, p, iter) > slot)
				slot = vcount(q, p, iter);
	}
	if (mode == V_SLOTS)
		args->slot_bytes = slot * 4;
	if (buf_new(r, &src, sends, iter & 1) ||
	    buf_new(r, &dst, mode == V_SLOTS ? slot * r->n : recvs, (iter >> 1) & 1))
		goto out;
	for (uint32_t p = 0; p < r->n; p++)
		for (uint32_t i = 0; i < vcount(r->me, p, iter); i++)
			src.p[off++] = val(r->me, p, i, 100 + iter);
	op = (struct host_op){ .opcode = OFFLOAD_OP_ALLTOALLV, .team = team,
		.flags = mode == V_EXPECT ? OFFLOAD_CMD_F_EXPECT : mode == V_SLOTS ? OFFLOAD_CMD_F_SLOTS : 0,
		.src_addr = (uintptr_t)src.p, .src_len = sends * 4, .count = sends * 4,
		.dst_addr = (uintptr_t)dst.p, .dst_len = dst.elems * 4, .aux_addr = (uintptr_t)args,
		.aux_len = sizeof(*args) };
	if (post(r, &op, &tag, what) || wait_ok(r, tag, &c, what))
		goto out;
	if (mode != V_SLOTS && c.result0 != recvs * 4)
		fail(r, "%s: result0 %llu, want %llu", what, (unsigned long long)c.result0,
		     (unsigned long long)(recvs * 4));
	off = 0;
	for (uint32_t s = 0; s < r->n; s++) {
		uint32_t in = vcount(s, r->me, iter);
		uint64_t base = mode == V_SLOTS ? s * slot : off;

		if (args->recv_bytes[s] != (uint64_t)in * 4)
			fail(r, "%s: recv_bytes[%u] = %llu, want %u", what, s,
			     (unsigned long long)args->recv_bytes[s], in * 4);
		for (uint32_t i = 0; i < in; i++) {
			if (dst.p[base + i] != val(s, r->me, i, 100 + iter)) {
				fail(r, "%s: from rank %u element %u: got %#x, want %#x", what, s, i,
				     dst.p[base + i], val(s, r->me, i, 100 + iter));
				break;
			}
		}
		if (mode == V_SLOTS)   /* the rest of a slot stays as it was */
			for (uint64_t i = base + in; i < base + slot; i++)
				if (dst.p[i] != GUARD_VAL) {
					fail(r, "%s: slot of rank %u written past its %u elements", what, s, in);
					break;
				}
		off += in;
	}
	check_guard(r, &dst, dst.elems, what);
out:
	buf_free(r, &src);
	buf_free(r, &dst);
	free(args);
}

static void test_alltoallv(struct rank *r)
{
	for (uint32_t iter = 0; iter < 4; iter++)
		test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, iter, V_PLAIN);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 5, V_EXPECT);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 6, V_SLOTS);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 7, V_SLOTS);
}

/* A command the Python layer refuses, forged here: src and dst overlap in one job-shared
 * buffer, so the rank's write to itself copies within one region. On a team of this rank
 * alone (one item, one thread: the overlap is no race between DPA threads); the op must
 * complete, and nothing may go wrong underneath. */
#define SELF_TEAM 3u

static void test_overlap(struct rank *r)
{
	uint64_t block = 4096, total = block, bytes = total + 64;
	struct host_op op = { .opcode = OFFLOAD_OP_ALLTOALL, .team = SELF_TEAM, .count = block };
	struct host_completion c;
	uint32_t tag, key;
	uint8_t *p;
	int rc;

	rc = host_alloc_shared(r->ctx, bytes, (void **)&p, &key);
	if (rc) {
		fail(r, "host_alloc_shared = %d", rc);
		return;
	}
	memset(p, 0x5a, bytes);
	op.src_addr = (uintptr_t)p;
	op.src_len = total;
	op.dst_addr = (uintptr_t)(p + 8);
	op.dst_len = total;
	rc = host_team_create(r->ctx, SELF_TEAM, 1, &r->me, WAIT_NS);
	if (rc)
		fail(r, "host_team_create(self) = %d", rc);
	else if (!post(r, &op, &tag, "overlapping alltoall"))
		wait_ok(r, tag, &c, "overlapping alltoall");
	host_free_shared(r->ctx, p, bytes);
}

/* ---- two host threads on one context, each on its own team ---- */

#define THREAD_TEAM 2u
#define THREAD_OPS  12u

struct worker {
	struct rank *r;
	const uint32_t *world;
	int second;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	for (uint32_t k = 0; k < THREAD_OPS; k++) {
		if (w->second) {
			/* all-to-all-v and barriers on THREAD_TEAM (the same ranks as the world) */
			if (k % 3 == 2) {
				struct host_op op = { .opcode = OFFLOAD_OP_BARRIER, .team = THREAD_TEAM };
				struct host_completion c;
				uint32_t tag;

				if (!post(w->r, &op, &tag, "threaded barrier"))
					wait_ok(w->r, tag, &c, "threaded barrier");
			} else {
				test_alltoallv_one(w->r, THREAD_TEAM, k % 4, k % 6 ? V_PLAIN : V_SLOTS);
			}
		} else {
			struct a2a a;

			if (!a2a_post(w->r, &a, 500 + 97 * k, 200 + k, (int)(k % 4), OFFLOAD_WORLD_TEAM,
				      w->world))
				a2a_finish(w->r, &a);
		}
	}
	return NULL;
}

static void test_threads(struct rank *r, const uint32_t *world)
{
	struct worker w[2] = { { r, world, 0 }, { r, world, 1 } };
	pthread_t t[2];
	int started = 0;

	for (int i = 0; i < 2; i++) {
		if (pthread_create(&t[i], NULL, worker_main, &w[i])) {
			fail(r, "pthread_create failed");
			break;
		}
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(t[i], NULL);
}

/* ---- multicast ---- */

/* Post op on the world team and wait; 0 once it completed OK. */
static int run_op(struct rank *r, struct host_op *op, const char *what)
{
	struct host_completion c;
	uint32_t tag;

	op->team = OFFLOAD_WORLD_TEAM;
	if (post(r, op, &tag, what))
		return -1;
	return wait_ok(r, tag, &c, what);
}

static void check_block(struct rank *r, const uint32_t *got, uint32_t owner, uint32_t cnt,
			uint32_t iter, const char *what)
{
	for (uint32_t i = 0; i < cnt; i++) {
		if (got[i] != val(owner, 0, i, iter)) {
			fail(r, "%s: block of rank %u, element %u: got %#x, want %#x", what, owner,
			     i, got[i], val(owner, 0, i, iter));
			return;
		}
	}
}

/* Broadcast and all-gather, chunks of one MTU (1024 elements) and around it, private and
 * job-shared buffers (the emulator's multicast ring holds the latter by reference), with
 * 2% of the chunks lost so that receivers also read from the owners' buffers. */
static void test_multicast(struct rank *r)
{
	const uint32_t sizes[] = { 0, 1, 1023, 1025, r->big };
	uint32_t iter = 500;

	host_set_mcast_faults(r->ctx, 20000, 0);
	for (uint32_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		for (int shared = 0; shared < 2; shared++, iter += 2) {
			uint32_t cnt = sizes[k], root = (k + (uint32_t)shared) % r->n;
			uint64_t bytes = (uint64_t)cnt * 4;
			struct buf b, s, d;
			char what[96];

			snprintf(what, sizeof(what), "broadcast of %u elements from %u (%s)", cnt, root,
				 shared ? "shared" : "private");
			if (buf_new(r, &b, cnt, shared))
				return;
			for (uint32_t i = 0; i < cnt; i++)
				b.p[i] = r->me == root ? val(root, 0, i, iter) : 0;
			if (!run_op(r, &(struct host_op){ .opcode = OFFLOAD_OP_BROADCAST, .root = root,
					.src_addr = (uintptr_t)b.p, .src_len = bytes,
					.dst_addr = (uintptr_t)b.p, .dst_len = bytes, .count = bytes },
				    what)) {
				check_block(r, b.p, root, cnt, iter, what);
				check_guard(r, &b, cnt, what);
			}
			buf_free(r, &b);

			snprintf(what, sizeof(what), "all-gather of %u elements per rank (%s)", cnt,
				 shared ? "shared" : "private");
			if (buf_new(r, &s, cnt, shared))
				return;
			if (buf_new(r, &d, (uint64_t)cnt * r->n, shared)) {
				buf_free(r, &s);
				return;
			}
			for (uint32_t i = 0; i < cnt; i++)
				s.p[i] = val(r->me, 0, i, iter + 1);
			if (!run_op(r, &(struct host_op){ .opcode = OFFLOAD_OP_ALLGATHER,
					.src_addr = (uintptr_t)s.p, .src_len = bytes,
					.dst_addr = (uintptr_t)d.p, .dst_len = bytes * r->n,
					.count = bytes }, what)) {
				for (uint32_t p = 0; p < r->n; p++)
					check_block(r, d.p + (uint64_t)p * cnt, p, cnt, iter + 1, what);
				check_guard(r, &d, (uint64_t)cnt * r->n, what);
			}
			buf_free(r, &s);
			buf_free(r, &d);
		}
	}
	host_set_mcast_faults(r->ctx, 0, 0);
}

/* ---- barrier ---- */

/* Rounds first..first+BARRIER_ROUNDS-1: each rank counts itself in, then waits. */
static void test_barrier(struct rank *r, uint32_t first)
{
	for (uint32_t k = first; k < first + BARRIER_ROUNDS; k++) {
		struct host_op op = { .opcode = OFFLOAD_OP_BARRIER, .team = OFFLOAD_WORLD_TEAM };
		struct timespec nap = { 0, (long)((r->me * 7 + k * 3) % 5) * 2000000 };
		struct host_completion c;
		uint32_t tag, seen;
		char what[48];

		snprintf(what, sizeof(what), "barrier %u", k);
		nanosleep(&nap, NULL);  /* arrive at different times */
		__atomic_fetch_add(&r->sh->arrived[k], 1, __ATOMIC_SEQ_CST);
		if (post(r, &op, &tag, what) || wait_ok(r, tag, &c, what))
			return;
		seen = __atomic_load_n(&r->sh->arrived[k], __ATOMIC_SEQ_CST);
		if (seen != r->n)
			fail(r, "%s completed after only %u of %u ranks arrived", what, seen, r->n);
	}
}

/* With port 0 failing mid-run, this rank's traffic must have moved to another rail (and
 * the data checks above say it all arrived). host_stats() is a racy snapshot by design, so
 * ThreadSanitizer builds leave it out. */
static void check_failover(struct rank *r)
{
#ifndef __SANITIZE_THREAD__
	struct offload_thread_stats stats[8];
	uint64_t failovers = 0, resent = 0;
	int n = host_stats(r->ctx, (uint64_t *)stats, 8);

	for (int t = 0; t < n && t < 8; t++) {
		failovers += stats[t].failovers;
		resent += stats[t].resent_bytes;
	}
	if (!failovers)
		fail(r, "rail 0 failed, yet no traffic moved to another rail");
	else
		printf("[rank %u] %llu failovers, %llu bytes resent\n", r->me,
		       (unsigned long long)failovers, (unsigned long long)resent);
#else
	(void)r;
#endif
}

/* ---- one rank ---- */

static int rank_main(uint32_t me, uint32_t n, const char *job, uint32_t threads, uint32_t rails,
		     uint64_t rail0_bytes, uint32_t big, struct shared *sh)
{
	struct host_ctx_params p = {
		.struct_size = sizeof(p), .version = HOST_CTX_PARAMS_VERSION,
		.job = job, .backend = "emulator", .rank = me, .size = n, .num_threads = threads,
		.ring_entries = 64, .spin_us = 0, .bootstrap_timeout_ns = WAIT_NS, .mtu = 4096,
		.mcast_rq_depth = 512, .engine = { .chunk_size = 256 * 1024, .eager_max = OFFLOAD_EAGER_BYTES },
	};
	struct rank r = { .me = me, .n = n, .sh = sh, .big = big };
	uint32_t world[MAX_N], reversed[MAX_N];
	int rc;

	p.rails = rails;
	p.mcast_staged = sh->mcast_staged;
	p.job_key = sh->job_key;  /* the job's secret: the same for every rank, not 0 */
	p.coop = !sh->threads_only;
	for (uint32_t i = 0; i < sizeof(p.rail_down_after) / sizeof(p.rail_down_after[0]); i++)
		p.rail_down_after[i] = UINT64_MAX;   /* no fault injection */
	p.rail_down_after[0] = rail0_bytes;

	for (uint32_t i = 0; i < n; i++) {
		world[i] = i;
		reversed[i] = n - 1 - i;
	}
	rc = host_ctx_open(&p, &r.ctx);
	if (rc) {
		fprintf(stderr, "[rank %u] FAIL: host_ctx_open = %d\n", me, rc);
		return 1;
	}
	rc = host_team_create(r.ctx, OFFLOAD_WORLD_TEAM, n, world, WAIT_NS);
	if (!rc)
		rc = host_team_create(r.ctx, 1, n, reversed, WAIT_NS);
	if (!rc)
		rc = host_team_create(r.ctx, THREAD_TEAM, n, world, WAIT_NS);
	if (rc) {
		fail(&r, "host_team_create = %d", rc);
	} else {
		struct a2a a;

		test_barrier(&r, 0);
		test_alltoall(&r, world);
		/* A team whose ranks run backwards: team rank t is world rank n-1-t. */
		if (!a2a_post(&r, &a, 513, 77, 0, 1, reversed))
			a2a_finish(&r, &a);
		test_alltoallv(&r);
		test_overlap(&r);
		test_threads(&r, world);
		test_multicast(&r);
		test_barrier(&r, BARRIER_ROUNDS);
	}
	if (!rc && rail0_bytes != UINT64_MAX)
		check_failover(&r);
	host_ctx_close(r.ctx);
	if (!r.failures)
		printf("[rank %u] ok\n", me);
	return r.failures ? 1 : 0;
}

/* ---- the job ---- */

static void remove_segments(const char *job)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	size_t len = strlen(job);
	char name[300];

	if (!d)
		return;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, job, len))
			continue;
		snprintf(name, sizeof(name), "/%s", e->d_name);
		shm_unlink(name);
	}
	closedir(d);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	uint32_t n = 2, threads = 2, rails = 1, big = 256 * 1024;
	uint64_t rail0_bytes = UINT64_MAX;
	uint32_t staged = 0, threads_only = 0;
	double timeout = 60, deadline, failed_at = 0;
	pid_t pids[MAX_N];
	int done[MAX_N] = { 0 }, left, bad = 0;
	struct shared *sh;
	char job[128];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			n = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "-threads") && i + 1 < argc)
			threads = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "-rails") && i + 1 < argc)
			rails = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "-rail0_down_after") && i + 1 < argc)
			rail0_bytes = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "-timeout") && i + 1 < argc)
			timeout = atof(argv[++i]);
		else if (!strcmp(argv[i], "-big") && i + 1 < argc)
			big = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "-staged"))
			staged = 1;
		else if (!strcmp(argv[i], "-threads-only"))
			threads_only = 1;
		else {
			fprintf(stderr, "usage: %s [-n N] [-threads T] [-rails R] [-rail0_down_after BYTES] "
				"[-timeout S] [-big ELEMS] [-staged] [-threads-only]\n", argv[0]);
			return 2;
		}
	}
	if (n < 1 || n > MAX_N || threads < 1 || threads > 8) {
		fprintf(stderr, "multirank: need 1 <= n <= %u and 1 <= threads <= 8\n", MAX_N);
		return 2;
	}
	/* The launcher's naming (dpaoff-<uid>-<pid>-<hex>): its stale-segment sweep knows it. */
	snprintf(job, sizeof(job), "dpaoff-%u-%d-%08lx%08lx", (unsigned)getuid(), (int)getpid(),
		 (unsigned long)(time(NULL) & 0xffffffff), (unsigned long)(now_s() * 1e6) & 0xffffffff);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(sh, 0, sizeof(*sh));
	sh->mcast_staged = staged;
	sh->job_key = ((uint64_t)getpid() << 32 | (uint64_t)time(NULL)) | 1;  /* never 0 */
	sh->threads_only = threads_only;
	printf("multirank: job %s, %u ranks, %u DPA threads and %u rails each, largest all-to-all "
	       "%u elements per peer%s\n", job, n, threads, rails, big,
	       rail0_bytes != UINT64_MAX ? ", rail 0 fails" : "");
	fflush(stdout);
	for (uint32_t i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			perror("fork");
			n = i;
			bad = 1;
			break;
		}
		if (pids[i] == 0) {
			int rc = rank_main(i, n, job, threads, rails, rail0_bytes, big, sh);

			fflush(NULL);
			exit(rc);
		}
	}
	deadline = now_s() + timeout;
	for (left = (int)n; left > 0;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		double t = now_s();

		if (pid > 0) {
			for (uint32_t i = 0; i < n; i++) {
				if (pids[i] != pid)
					continue;
				done[i] = 1;
				left--;
				if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
					break;
				bad = 1;
				if (WIFSIGNALED(status))
					fprintf(stderr, "multirank: rank %u died of signal %d\n", i,
						WTERMSIG(status));
				else
					fprintf(stderr, "multirank: rank %u exited %d\n", i,
						WEXITSTATUS(status));
				if (!failed_at)
					failed_at = t;
				break;
			}
			continue;
		}
		/* A failed rank leaves its peers waiting: give them a moment to notice, then stop. */
		if (t > deadline || (failed_at && t > failed_at + 5)) {
			if (t > deadline)
				fprintf(stderr, "multirank: timed out after %.0f s\n", timeout);
			for (uint32_t i = 0; i < n; i++) {
				if (!done[i]) {
					fprintf(stderr, "multirank: killing rank %u (still running)\n", i);
					kill(pids[i], SIGKILL);
				}
			}
			while (waitpid(-1, NULL, 0) > 0)
				;
			bad = 1;
			break;
		}
		usleep(10000);
	}
	remove_segments(job);
	printf("multirank: %s\n", bad ? "FAILED" : "all ranks passed");
	return bad ? 1 : 0;
}

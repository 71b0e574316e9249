/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A multi-rank job in C, no Python: the parent forks N rank processes, each opens a host
 * context on the emulator through host/'s API (offload_host.h) and runs all-to-all (sizes
 * 0 to 1 MiB per peer, private and job-shared buffers, several in flight at once, a team
 * in reverse rank order), all-to-all-v (counts with zeros, expected counts, fixed slots),
 * barriers (no rank leaves before all arrived), a forged all-to-all whose src and dst
 * overlap, two host threads posting on two teams at once, and multicast broadcast and
 * all-gather (private and shared buffers, 2% of chunks lost), checking every element
 * received and the guard past every destination (the point-to-point checks are in
 * multirank_alltoall.c; -scale's agreement and shrink in multirank_agree.c). Built with sanitizers by tests/test_sanitizers.py; runs alone too:
 *
 *   python3 build_defs.py build multirank_asan multirank
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

#include "multirank.h"

void fail(struct rank *r, const char *fmt, ...)
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

uint32_t val(uint32_t src, uint32_t dst, uint32_t i, uint32_t iter)
{
	return (src << 24) ^ (dst << 16) ^ (i * 2654435761u) ^ (iter * 40503u);
}

int buf_new(struct rank *r, struct buf *b, uint64_t elems, int shared)
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

void buf_free(struct rank *r, struct buf *b)
{
	if (!b->p)
		return;
	if (b->shared)
		host_free_shared(r->ctx, b->p, b->alloc_bytes);
	else
		free(b->p);
	b->p = NULL;
}

void check_guard(struct rank *r, const struct buf *b, uint64_t from, const char *what)
{
	for (uint64_t i = from; i < b->elems + GUARD_ELEMS; i++) {
		if (b->p[i] != GUARD_VAL) {
			fail(r, "%s: element %llu past the received data was written (%#x)", what,
			     (unsigned long long)i, b->p[i]);
			return;
		}
	}
}

int post(struct rank *r, const struct host_op *op, uint32_t *tag, const char *what)
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

int wait_ok(struct rank *r, uint32_t tag, struct host_completion *c, const char *what)
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
	/* -scale: one size, whose all-gather spans more chunks than ranks (4 KiB MTU). */
	uint32_t iter = 500, nsizes = r->sh->scale ? 1 : sizeof(sizes) / sizeof(sizes[0]);
	uint32_t first = r->sh->scale ? 3 : 0;

	host_set_mcast_faults(r->ctx, 20000, 0);
	for (uint32_t k = first; k < first + nsizes; k++) {
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
		.mcast_rq_depth = 512, .wire_min = 64 * 1024,
		.engine = { .chunk_size = 256 * 1024, .eager_max = OFFLOAD_EAGER_BYTES },
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
	} else if (sh->scale) {
		struct a2a a;

		/* Many ranks: each collective once, small (every rank of the job is a process
		 * on the same cores). */
		test_barrier(&r, 0);
		if (!a2a_post(&r, &a, 1, 1, 0, OFFLOAD_WORLD_TEAM, world))
			a2a_finish(&r, &a);
		if (!a2a_post(&r, &a, 300, 2, 3, OFFLOAD_WORLD_TEAM, world))
			a2a_finish(&r, &a);
		if (!a2a_post(&r, &a, 33, 77, 0, 1, reversed))
			a2a_finish(&r, &a);
		test_alltoallv_scale(&r);
		test_multicast(&r);
		test_agreement_scale(&r);
		test_barrier(&r, BARRIER_ROUNDS);
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
	uint32_t staged = 0, threads_only = 0, scale = 0;
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
		else if (!strcmp(argv[i], "-scale"))
			scale = 1;
		else {
			fprintf(stderr, "usage: %s [-n N] [-threads T] [-rails R] [-rail0_down_after BYTES] "
				"[-timeout S] [-big ELEMS] [-staged] [-threads-only] [-scale]\n", argv[0]);
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
	sh->scale = scale;
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

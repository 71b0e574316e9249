/* SPDX-License-Identifier: Apache-2.0 */
/*
 * multirank.c's point-to-point checks: all-to-all (sizes 0 to `big` elements per peer,
 * private and job-shared buffers, several in flight, a team in reverse rank order),
 * all-to-all-v (counts with zeros, expected counts, fixed slots), a forged all-to-all
 * whose src and dst overlap, and two host threads posting on two teams at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "multirank.h"

/* ---- all-to-all ---- */

int a2a_post(struct rank *r, struct a2a *a, uint32_t cnt, uint32_t iter, int shared,
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

void a2a_finish(struct rank *r, struct a2a *a)
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

void test_alltoall(struct rank *r, const uint32_t *world)
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
	args = aligned_alloc(64, (offload_a2av_args_bytes(r->n) + 63) & ~(size_t)63);
	if (!args) {
		fail(r, "out of memory");
		return;
	}
	memset(args, 0, offload_a2av_args_bytes(r->n));
	args->nranks = r->n;
	for (uint32_t p = 0; p < r->n; p++) {
		uint32_t out = vcount(r->me, p, iter), in = vcount(p, r->me, iter);

		offload_a2av_send(args)[p] = (uint64_t)out * 4;
		offload_a2av_expect(args)[p] = (uint64_t)in * 4;
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
		.aux_len = offload_a2av_args_bytes(r->n) };
	if (post(r, &op, &tag, what) || wait_ok(r, tag, &c, what))
		goto out;
	if (mode != V_SLOTS && c.result0 != recvs * 4)
		fail(r, "%s: result0 %llu, want %llu", what, (unsigned long long)c.result0,
		     (unsigned long long)(recvs * 4));
	off = 0;
	for (uint32_t s = 0; s < r->n; s++) {
		uint32_t in = vcount(s, r->me, iter);
		uint64_t base = mode == V_SLOTS ? s * slot : off;

		if (offload_a2av_recv(args)[s] != (uint64_t)in * 4)
			fail(r, "%s: recv_bytes[%u] = %llu, want %u", what, s,
			     (unsigned long long)offload_a2av_recv(args)[s], in * 4);
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

void test_alltoallv(struct rank *r)
{
	for (uint32_t iter = 0; iter < 4; iter++)
		test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, iter, V_PLAIN);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 5, V_EXPECT);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 6, V_SLOTS);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 7, V_SLOTS);
}

/* -scale: each mode once, with no large block (many ranks share two cores). */
void test_alltoallv_scale(struct rank *r)
{
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 1, V_PLAIN);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 5, V_EXPECT);
	test_alltoallv_one(r, OFFLOAD_WORLD_TEAM, 6, V_SLOTS);
}

/* A command the Python layer refuses, forged here: src and dst overlap in one job-shared
 * buffer, so the rank's write to itself copies within one region. On a team of this rank
 * alone (one item, one thread: the overlap is no race between DPA threads); the op must
 * complete, and nothing may go wrong underneath. */
#define SELF_TEAM 3u

void test_overlap(struct rank *r)
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

void test_threads(struct rank *r, const uint32_t *world)
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

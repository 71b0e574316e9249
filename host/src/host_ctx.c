/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host side of the ring: owns the command ring, the completion ring and the request
 * table, rings the doorbell, and sleeps on the completion ring while the DPA works.
 *
 * Locking: ctx->lock guards posting (sq_tail, tags) and reaping (cq_head, tag table).
 * It is never held while sleeping, nor while driving the firmware.
 *
 * Cooperative progress (emulator): a thread that posts, tests or waits for a small op runs
 * the firmware itself through the device's drive op, instead of ringing the doorbell and
 * sleeping until a progress thread did the work: no hand-off between threads, and no
 * wake-up, on the path of a small exchange. Bulk ops stay with the progress threads.
 *
 * Closing from any thread: every public call runs between enter() and leave(), which count
 * the threads inside the library. host_ctx_shutdown() marks the context closing (calls
 * entering from then on return -ESHUTDOWN), wakes the threads that sleep in it (waiters,
 * posters waiting for ring space) and makes those driving the firmware leave it (the
 * device's wake_waiters), and releases the device and the rings only once none is inside;
 * the struct itself lives on until host_ctx_close(), so a thread that read the pointer
 * before the shutdown gets -ESHUTDOWN, not freed memory.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "host_device.h"
#include "offload_abi.h"
#include "offload_atomic.h"
#include "offload_host.h"

#define HOST_TAGS        4096u         /* requests alive (posted, not yet waited for) */
#define HOST_SLEEP_MAX   100000000ll   /* re-check at least every 100 ms */
#define HOST_MAX_SHARED  256u

enum host_tag_state {
	TAG_FREE = 0,
	TAG_PENDING,
	TAG_DONE,
	TAG_ABANDONED,
};

struct host_tag {
	uint32_t tag;
	uint32_t state;
	uint32_t release_keys[3];
	uint32_t keys[3];     /* src, dst, aux: deregistering them is refused while pending */
	uint32_t small;       /* host_op.small */
	struct host_completion done;
};

struct host_shared {
	uint8_t *addr;
	uint64_t len;
	uint32_t key;
};

struct host_ctx {
	const struct host_device_ops *ops;
	uint32_t closing;             /* set once by host_ctx_shutdown(), never cleared */
	uint32_t users;               /* threads between enter() and leave() */
	uint32_t shut;                /* the device and rings are released */
	void *backend_dl;             /* dlopen handle of a run-time loaded backend */
	struct host_device *dev;
	uint32_t rank;
	uint32_t size;
	uint32_t num_threads;
	uint32_t coop;                /* cooperative progress (host_ctx_params.coop) */
	void *ring_mem;
	uint64_t ring_len;
	int fw_mem_of_device;         /* ring_mem and stats belong to the device (fw_memory) */
	struct offload_ring_hdr *ring;
	struct offload_cmd *sq;
	struct offload_cqe *cq;
	uint32_t sq_entries;
	uint32_t cq_entries;
	struct offload_thread_stats *stats;
	pthread_mutex_t lock;
	uint32_t next_tag;
	uint32_t inflight;            /* posted and not reaped: bounded by cq_entries */
	struct host_tag tags[HOST_TAGS];
	struct host_shared shared[HOST_MAX_SHARED];
};

/* Pairs with host_ctx_shutdown(): it stores closing, then reads users; we add to users,
 * then read closing. Sequentially consistent, so one of us sees the other. */
static void leave(struct host_ctx *ctx)
{
	__atomic_fetch_sub(&ctx->users, 1, __ATOMIC_SEQ_CST);
}

static int enter(struct host_ctx *ctx)
{
	__atomic_fetch_add(&ctx->users, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&ctx->closing, __ATOMIC_SEQ_CST)) {
		leave(ctx);
		return -ESHUTDOWN;
	}
	return 0;
}

static int closing(struct host_ctx *ctx)
{
	return __atomic_load_n(&ctx->closing, __ATOMIC_SEQ_CST) != 0;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* The FlexIO backend needs DOCA's libraries: it is a separate shared object
 * (scripts/build_flexio.sh), loaded only when asked for, so this library builds and runs
 * where DOCA is absent. */
#define FLEXIO_OPS_SYMBOL "dpaoffload_flexio_ops"
#define FLEXIO_ABI_SYMBOL "dpaoffload_flexio_abi"

static int find_backend(struct host_ctx *ctx, const char *name, const char *lib)
{
	const struct host_device_ops *(*get_ops)(void);
	uint32_t (*get_abi)(void);

	if (!name || !strcmp(name, "emulator")) {
		ctx->ops = &emu_device_ops;
		return 0;
	}
	if (strcmp(name, "flexio") || !lib)
		return -ENODEV;
	ctx->backend_dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!ctx->backend_dl)
		return -ENOENT;
	*(void **)&get_ops = dlsym(ctx->backend_dl, FLEXIO_OPS_SYMBOL);
	*(void **)&get_abi = dlsym(ctx->backend_dl, FLEXIO_ABI_SYMBOL);
	/* A backend built from other headers would read our structs wrong. */
	if (get_ops && (!get_abi || get_abi() != OFFLOAD_ABI_VERSION))
		return -EPROTO;
	ctx->ops = get_ops ? get_ops() : NULL;
	return ctx->ops ? 0 : -ENOEXEC;
}


uint32_t host_num_threads(const struct host_ctx *ctx)
{
	return ctx->num_threads;
}

static uint64_t ring_bytes(uint32_t entries)
{
	return sizeof(struct offload_ring_hdr) + entries * sizeof(struct offload_cmd) +
	       2ull * entries * sizeof(struct offload_cqe);
}

/* The command and completion rings and the stats: in memory of the device's where it
 * places them itself (a card's window arena), else page-aligned zeroed memory of ours. */
static int map_rings(struct host_ctx *ctx, uint32_t entries)
{
	struct host_fw_windows fw;

	ctx->sq_entries = entries;
	ctx->cq_entries = entries * 2;
	ctx->ring_len = ring_bytes(entries);
	if (ctx->ops->fw_memory) {
		int rc = ctx->ops->fw_memory(ctx->dev, &fw);

		if (rc)
			return rc;
		ctx->fw_mem_of_device = 1;
		ctx->ring_mem = fw.ring;
		ctx->stats = fw.stats;
	} else {
		ctx->ring_mem = mmap(NULL, ctx->ring_len, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (ctx->ring_mem == MAP_FAILED) {
			ctx->ring_mem = NULL;
			return -ENOMEM;
		}
		ctx->stats = calloc(ctx->num_threads, sizeof(*ctx->stats));
		if (!ctx->stats)
			return -ENOMEM;
	}
	ctx->ring = ctx->ring_mem;
	ctx->ring->sq_entries = ctx->sq_entries;
	ctx->ring->cq_entries = ctx->cq_entries;
	ctx->sq = (struct offload_cmd *)(ctx->ring + 1);
	ctx->cq = (struct offload_cqe *)(ctx->sq + entries);
	return 0;
}

int host_ctx_open(const struct host_ctx_params *p, struct host_ctx **out)
{
	struct host_device_attr attr = {
		.job = p->job, .rank = p->rank, .size = p->size, .num_threads = p->num_threads,
		.spin_us = p->spin_us,
		.bootstrap_timeout_ns = p->bootstrap_timeout_ns, .rails = p->rails,
		.allgather = p->allgather, .allgather_arg = p->allgather_arg,
		.mtu = p->mtu, .mcast_rq_depth = p->mcast_rq_depth, .mcast_staged = p->mcast_staged,
		.mcast_loss_ppm = p->mcast_loss_ppm, .mcast_reorder_ppm = p->mcast_reorder_ppm,
		.mcast_seed = p->mcast_seed, .job_key = p->job_key,
		.ring_len = ring_bytes(p->ring_entries),
		.stats_len = (uint64_t)p->num_threads * sizeof(struct offload_thread_stats),
	};
	struct dpa_engine_params params = {
		.abi_version = OFFLOAD_ABI_VERSION, .world_rank = p->rank, .world_size = p->size,
		.num_threads = p->num_threads, .chunk_size = p->chunk_size, .chunks_per_pass = 4,
		.op_timeout_ms = p->op_timeout_ms, .link_mbps = p->link_mbps,
		.mcast_roots = p->mcast_roots, .eager_max = p->eager_max,
	};
	struct host_fw_windows win;
	struct host_ctx *ctx;
	int rc;

	if (p->ring_entries < 8 || (p->ring_entries & (p->ring_entries - 1)) ||
	    p->ring_entries * 2 > HOST_TAGS || !p->chunk_size)
		return -EINVAL;
	_Static_assert(sizeof(p->rail_down_after) == sizeof(attr.rail_down_after), "rails");
	memcpy(attr.rail_down_after, p->rail_down_after, sizeof(attr.rail_down_after));
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	pthread_mutex_init(&ctx->lock, NULL);
	rc = find_backend(ctx, p->backend, p->backend_lib);
	ctx->rank = p->rank;
	ctx->size = p->size;
	ctx->num_threads = p->num_threads;
	ctx->next_tag = 1;
	ctx->coop = !!p->coop;
	if (!rc)
		rc = ctx->ops->open(&attr, &ctx->dev);
	if (!rc)
		rc = map_rings(ctx, p->ring_entries);
	if (rc)
		goto err;
	params.sq_entries = ctx->sq_entries;
	params.cq_entries = ctx->cq_entries;
	win = (struct host_fw_windows){ .ring = ctx->ring_mem, .ring_len = ctx->ring_len,
		.stats = ctx->stats, .stats_len = p->num_threads * sizeof(*ctx->stats) };
	rc = ctx->ops->start(ctx->dev, &params, &win);
	if (rc)
		goto err;
	*out = ctx;
	return 0;
err:
	host_ctx_close(ctx);
	return rc;
}

void host_ctx_shutdown(struct host_ctx *ctx)
{
	const struct timespec pause = { 0, 1000000 };

	if (!ctx || __atomic_exchange_n(&ctx->closing, 1, __ATOMIC_SEQ_CST))
		return;  /* another thread shuts it down: host_ctx_close() waits for it */
	/* Wake sleepers until they left: a waiter that checked `closing` just before we set it
	 * may go to sleep after our first wake, so wake again until the count drops. */
	while (__atomic_load_n(&ctx->users, __ATOMIC_SEQ_CST)) {
		if (ctx->ring && ctx->ops->wake_waiters)
			ctx->ops->wake_waiters(ctx->dev, &ctx->ring->cq_tail);
		nanosleep(&pause, NULL);
	}
	/* The device revokes every registration and unlinks ctx.empty() segments; their
	 * mappings stay until the arrays holding them are freed (host_free_shared). */
	if (ctx->dev)
		ctx->ops->close(ctx->dev);
	ctx->dev = NULL;
	if (ctx->ring_mem && !ctx->fw_mem_of_device)
		munmap(ctx->ring_mem, ctx->ring_len);
	ctx->ring_mem = NULL;
	ctx->ring = NULL;
	if (!ctx->fw_mem_of_device)
		free(ctx->stats);
	ctx->stats = NULL;
	__atomic_store_n(&ctx->shut, 1, __ATOMIC_SEQ_CST);
}

void host_ctx_close(struct host_ctx *ctx)
{
	const struct timespec pause = { 0, 1000000 };

	if (!ctx)
		return;
	host_ctx_shutdown(ctx);
	while (!__atomic_load_n(&ctx->shut, __ATOMIC_SEQ_CST))  /* a concurrent shutdown */
		nanosleep(&pause, NULL);
	if (ctx->backend_dl)
		dlclose(ctx->backend_dl);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
}

/* Drain the completion ring into the tag table. Called with ctx->lock held. */
static void reap_locked(struct host_ctx *ctx)
{
	uint32_t head = ctx->ring->cq_head;                 /* ours */
	uint32_t tail = off_load_acquire(&ctx->ring->cq_tail); /* pairs with the DPA's release */

	while (head != tail) {
		const struct offload_cqe *c = &ctx->cq[head & (ctx->cq_entries - 1)];
		struct host_tag *t = &ctx->tags[c->tag % HOST_TAGS];

		/* An op that failed because a peer died or became unreachable names it: from now
		 * on failed_ranks lists it too, whatever told the firmware first (the watch, or the
		 * peer's memory refusing a write), so a caller that reads failed_ranks after the
		 * error finds the rank it names, and every later op of its teams fails at intake. */
		if ((c->status == OFFLOAD_ERR_PEER || c->status == OFFLOAD_ERR_LINK_DOWN) &&
		    c->detail < OFFLOAD_MAX_RANKS && c->detail != ctx->rank)
			__atomic_fetch_or(&ctx->ring->failed_ranks, 1ull << c->detail,
					  __ATOMIC_SEQ_CST);
		if (t->tag == c->tag && (t->state == TAG_PENDING || t->state == TAG_ABANDONED)) {
			for (int i = 0; i < 3; i++)
				if (t->release_keys[i])
					ctx->ops->mr_dereg(ctx->dev, t->release_keys[i]);
			t->done = (struct host_completion){ .status = c->status, .detail = c->detail,
				.result0 = c->result0, .result1 = c->result1 };
			t->state = t->state == TAG_ABANDONED ? TAG_FREE : TAG_DONE;
			ctx->inflight--;
		}
		head++;
	}
	off_store_release(&ctx->ring->cq_head, head);  /* the DPA may reuse those entries */
}

static int post_locked(struct host_ctx *ctx, const struct host_op *op, const uint32_t release[3],
		       uint32_t *tag_out)
{
	uint32_t tail = ctx->ring->sq_tail;  /* ours */
	uint32_t tag = ctx->next_tag;
	struct host_tag *t = &ctx->tags[tag % HOST_TAGS];
	struct offload_cmd *slot;

	reap_locked(ctx);
	if (t->state != TAG_FREE)
		return -EBUSY;
	if (tail - off_load_acquire(&ctx->ring->sq_head) >= ctx->sq_entries ||
	    ctx->inflight >= ctx->cq_entries)
		return -EAGAIN;
	slot = &ctx->sq[tail & (ctx->sq_entries - 1)];
	*slot = (struct offload_cmd){
		.opcode = (uint8_t)op->opcode, .flags = (uint8_t)op->flags, .team = (uint16_t)op->team,
		.tag = tag,
		.src_addr = op->src_addr, .dst_addr = op->dst_addr, .count = op->count,
		.src_key = op->src_key, .dst_key = op->dst_key, .dst_len = op->dst_len,
		.aux_addr = op->aux_addr, .aux_key = op->aux_key, .root = op->root,
	};
	*t = (struct host_tag){ .tag = tag, .state = TAG_PENDING,
		.release_keys = { release[0], release[1], release[2] },
		.keys = { op->src_key, op->dst_key, op->aux_key }, .small = !!op->small };
	ctx->inflight++;
	ctx->next_tag = tag + 1 ? tag + 1 : 1;  /* tag 0 is never used */
	off_store_release(&ctx->ring->sq_tail, tail + 1);  /* pairs with the DPA's acquire */
	*tag_out = tag;
	return 0;
}

/* Does test() run the firmware for an op of this size? Only a small one: a test() in a
 * loop between other work must stay cheap. */
static int drives(const struct host_ctx *ctx, uint32_t small)
{
	return small && ctx->coop && ctx->ops->drive;
}

static int acquire_op_keys(struct host_ctx *ctx, struct host_op *op, uint32_t release[3])
{
	int owned, rc;

	if (!op->src_key && op->src_len) {
		rc = host_mr_acquire(ctx, (const void *)(uintptr_t)op->src_addr, op->src_len,
				     OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_REMOTE_READ,
				     &op->src_key, &owned);
		if (rc)
			return rc;
		if (owned)
			release[0] = op->src_key;
	}
	if (!op->dst_key && op->dst_len) {
		rc = host_mr_acquire(ctx, (const void *)(uintptr_t)op->dst_addr, op->dst_len,
				     OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
				     OFFLOAD_ACCESS_REMOTE_WRITE, &op->dst_key, &owned);
		if (rc)
			return rc;
		if (owned)
			release[1] = op->dst_key;
	}
	if (!op->aux_key && op->aux_len) {
		/* Arguments the firmware reads and writes back (counts) in place. */
		rc = host_mr_acquire(ctx, (const void *)(uintptr_t)op->aux_addr, op->aux_len,
				     OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE,
				     &op->aux_key, &owned);
		if (rc)
			return rc;
		if (owned)
			release[2] = op->aux_key;
	}
	return 0;
}

static int post_in(struct host_ctx *ctx, const struct host_op *user_op, int64_t timeout_ns,
		   uint32_t *tag)
{
	int64_t deadline = now_ns() + (timeout_ns > 0 ? timeout_ns : 0);
	struct timespec pause = { 0, 20000 };
	struct host_op op = *user_op;
	uint32_t release[3] = { 0, 0, 0 };
	int rc;

	/* Fields wider here than in the 64-byte slot must fit it, not be truncated. */
	if (op.opcode == OFFLOAD_OP_NOP || op.opcode >= OFFLOAD_OP_MAX || op.team > UINT16_MAX ||
	    op.flags > UINT8_MAX)
		return -EINVAL;
	rc = acquire_op_keys(ctx, &op, release);
	while (!rc) {
		pthread_mutex_lock(&ctx->lock);
		rc = post_locked(ctx, &op, release, tag);
		pthread_mutex_unlock(&ctx->lock);
		if (rc != -EAGAIN)
			break;
		/* Ring full: the DPA frees slots at intake; wait for it, bounded. */
		ctx->ops->doorbell(ctx->dev);
		if (closing(ctx)) {
			rc = -ESHUTDOWN;
			break;
		}
		if (now_ns() >= deadline)
			break;
		nanosleep(&pause, NULL);
		rc = 0;
	}
	if (rc) {
		for (int i = 0; i < 3; i++)
			if (release[i])
				ctx->ops->mr_dereg(ctx->dev, release[i]);
		return rc;
	}
	/* The op starts on this thread (a small one; a bulk one too where the device lets
	 * the host copy): it takes the command, and its first messages leave now. What
	 * remains waits for peers, whose writes wake whoever runs the firmware then; only a
	 * drive that could not run (or not to the end) needs the doorbell. */
	if (!ctx->coop || !ctx->ops->drive ||
	    ctx->ops->drive(ctx->dev, NULL, 0, 0, op.small ? HOST_DRIVE_NO_BULK : HOST_DRIVE_BULK_CMD))
		ctx->ops->doorbell(ctx->dev);
	return 0;
}

int host_post(struct host_ctx *ctx, const struct host_op *op, int64_t timeout_ns, uint32_t *tag)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = post_in(ctx, op, timeout_ns, tag);
	leave(ctx);
	return rc;
}

/* 1: done (out filled, tag freed); 0: pending; -ENOENT: unknown tag. */
static int take_locked(struct host_ctx *ctx, uint32_t tag, struct host_completion *out)
{
	struct host_tag *t = &ctx->tags[tag % HOST_TAGS];

	if (t->tag != tag || t->state == TAG_FREE || t->state == TAG_ABANDONED)
		return -ENOENT;
	reap_locked(ctx);
	if (t->state != TAG_DONE)
		return 0;
	*out = t->done;
	t->state = TAG_FREE;
	return 1;
}

static int take(struct host_ctx *ctx, uint32_t tag, struct host_completion *out)
{
	int rc;

	pthread_mutex_lock(&ctx->lock);
	rc = take_locked(ctx, tag, out);
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

static uint32_t tag_small(struct host_ctx *ctx, uint32_t tag)
{
	const struct host_tag *t = &ctx->tags[tag % HOST_TAGS];
	uint32_t small;

	pthread_mutex_lock(&ctx->lock);
	small = t->tag == tag && t->small;
	pthread_mutex_unlock(&ctx->lock);
	return small;
}

static int test_in(struct host_ctx *ctx, uint32_t tag, struct host_completion *out)
{
	int rc = take(ctx, tag, out);

	/* Not done: give the firmware a turn on this thread (cooperative progress). */
	if (rc == 0 && drives(ctx, tag_small(ctx, tag)) &&
	    ctx->ops->drive(ctx->dev, NULL, 0, 0, HOST_DRIVE_NO_BULK) == 0)
		rc = take(ctx, tag, out);
	return rc;
}

int host_test(struct host_ctx *ctx, uint32_t tag, struct host_completion *out)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = test_in(ctx, tag, out);
	leave(ctx);
	return rc;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static int wait_in(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns, int64_t poll_ns,
		   struct host_completion *out)
{
	int64_t start = now_ns();
	int64_t deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
	/* A small op's waiter runs the firmware; for a bulk op's the device decides. */
	int drive = ctx->coop && ctx->ops->drive;

	if (poll_ns && !ctx->ops->poll_worthwhile(ctx->dev))
		poll_ns = 0;
	for (;;) {
		uint32_t seen = off_load_acquire(&ctx->ring->cq_tail);
		int64_t now, left;
		int rc = take(ctx, tag, out);

		if (rc)
			return rc < 0 ? rc : 0;
		if (closing(ctx))  /* woken by host_ctx_shutdown(); the op stays pending */
			return -ESHUTDOWN;
		now = now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		left = deadline - now < HOST_SLEEP_MAX ? deadline - now : HOST_SLEEP_MAX;
		/* Run the firmware here until the completion ring moves; -EBUSY (another thread
		 * drives, bulk work came in, or the context closes): sleep on the ring below
		 * instead (or, closing, leave at the top of the loop). */
		if (drive && ctx->ops->drive(ctx->dev, &ctx->ring->cq_tail, seen, left, 0) != -EBUSY)
			continue;
		if (now - start < poll_ns) {
			for (int i = 0; i < 64; i++)
				cpu_relax();
			continue;
		}
		off_fetch_add(&ctx->ring->cq_waiters, 1);
		/* Pairs with the DPA's fence between publishing cq_tail and reading cq_waiters. */
		off_fence();
		if (off_load_acquire(&ctx->ring->cq_tail) == seen && !closing(ctx))
			ctx->ops->wait_completion(ctx->dev, &ctx->ring->cq_tail, seen, left);
		off_fetch_sub(&ctx->ring->cq_waiters, 1);
	}
}

int host_wait(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns, int64_t poll_ns,
	      struct host_completion *out)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = wait_in(ctx, tag, timeout_ns, poll_ns, out);
	leave(ctx);
	return rc;
}

static void abandon_in(struct host_ctx *ctx, uint32_t tag)
{
	struct host_tag *t = &ctx->tags[tag % HOST_TAGS];

	pthread_mutex_lock(&ctx->lock);
	reap_locked(ctx);
	if (t->tag == tag && t->state == TAG_PENDING)
		t->state = TAG_ABANDONED;
	else if (t->tag == tag && t->state == TAG_DONE)
		t->state = TAG_FREE;
	pthread_mutex_unlock(&ctx->lock);
}

void host_abandon(struct host_ctx *ctx, uint32_t tag)
{
	if (enter(ctx))
		return;
	abandon_in(ctx, tag);
	leave(ctx);
}

int host_cancel(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns)
{
	struct host_op op = { .opcode = OFFLOAD_OP_CANCEL, .count = tag };
	struct host_completion done;
	uint32_t cancel_tag;
	int rc = host_post(ctx, &op, timeout_ns, &cancel_tag);

	if (rc)
		return rc;
	rc = host_wait(ctx, cancel_tag, timeout_ns, 0, &done);
	if (rc) {
		host_abandon(ctx, cancel_tag);
		return rc;
	}
	return done.status == OFFLOAD_OK ? 0 : -ENOENT;
}

uint64_t host_failed_ranks(struct host_ctx *ctx)
{
	uint64_t mask;

	if (enter(ctx))
		return 0;
	mask = __atomic_load_n(&ctx->ring->failed_ranks, __ATOMIC_ACQUIRE);
	leave(ctx);
	return mask;
}

static int mcast_faults_in(struct host_ctx *ctx, uint32_t loss_ppm, uint32_t reorder_ppm)
{
	if (!ctx->ops->set_mcast_faults)
		return -EOPNOTSUPP;
	if (loss_ppm > 1000000u || reorder_ppm > 1000000u)
		return -EINVAL;
	return ctx->ops->set_mcast_faults(ctx->dev, loss_ppm, reorder_ppm);
}

uint64_t host_closed_ranks(struct host_ctx *ctx)
{
	uint64_t mask;

	if (enter(ctx))
		return 0;
	mask = __atomic_load_n(&ctx->ring->closed_ranks, __ATOMIC_ACQUIRE);
	leave(ctx);
	return mask;
}

int host_set_mcast_faults(struct host_ctx *ctx, uint32_t loss_ppm, uint32_t reorder_ppm)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = mcast_faults_in(ctx, loss_ppm, reorder_ppm);
	leave(ctx);
	return rc;
}

static int team_create_in(struct host_ctx *ctx, uint32_t team_id, uint32_t nmembers,
			  const uint32_t *world_ranks, int64_t timeout_ns)
{
	struct offload_team_desc *desc;
	struct host_completion done;
	struct host_op op = { .opcode = OFFLOAD_OP_TEAM_CREATE, .team = team_id };
	uint32_t tag, me = nmembers;
	int rc;

	if (team_id >= OFFLOAD_MAX_TEAMS || nmembers == 0 || nmembers > OFFLOAD_MAX_RANKS)
		return -EINVAL;
	desc = calloc(1, sizeof(*desc));
	if (!desc)
		return -ENOMEM;
	desc->team_id = team_id;
	desc->size = nmembers;
	for (uint32_t i = 0; i < nmembers; i++) {
		if (world_ranks[i] == ctx->rank)
			me = i;
		rc = ctx->ops->peer_ctrl(ctx->dev, world_ranks[i], &desc->peers[i]);
		if (rc)
			goto out;
	}
	rc = -EINVAL;
	if (me == nmembers)
		goto out;
	desc->my_rank = me;
	op.aux_addr = (uint64_t)(uintptr_t)desc;
	op.aux_len = sizeof(*desc);
	rc = host_post(ctx, &op, timeout_ns, &tag);
	if (rc)
		goto out;
	rc = host_wait(ctx, tag, timeout_ns, 0, &done);
	if (rc == -ETIMEDOUT || rc == -ESHUTDOWN) {
		/* The firmware may still read desc: leak it rather than free under its feet. */
		host_abandon(ctx, tag);
		return rc;
	}
	if (!rc && done.status)
		rc = -EINVAL;
out:
	free(desc);
	return rc;
}

int host_team_create(struct host_ctx *ctx, uint32_t team_id, uint32_t nmembers,
		     const uint32_t *world_ranks, int64_t timeout_ns)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = team_create_in(ctx, team_id, nmembers, world_ranks, timeout_ns);
	leave(ctx);
	return rc;
}

static int mr_acquire_in(struct host_ctx *ctx, const void *addr, uint64_t len, uint32_t access,
			 uint32_t *key, int *owned)
{
	const uint8_t *p = addr;

	pthread_mutex_lock(&ctx->lock);
	for (uint32_t i = 0; i < HOST_MAX_SHARED; i++) {
		struct host_shared *s = &ctx->shared[i];

		if (s->addr && p >= s->addr && len <= s->len && (uint64_t)(p - s->addr) <= s->len - len) {
			*key = s->key;
			*owned = 0;
			pthread_mutex_unlock(&ctx->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	*owned = 1;
	return ctx->ops->mr_reg(ctx->dev, addr, len ? len : 1, access, key);
}

int host_mr_acquire(struct host_ctx *ctx, const void *addr, uint64_t len, uint32_t access,
		    uint32_t *key, int *owned)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = mr_acquire_in(ctx, addr, len, access, key, owned);
	leave(ctx);
	return rc;
}

static int dmabuf_in(struct host_ctx *ctx, uint64_t addr, uint64_t len, int fd, uint32_t access,
		     uint32_t *key)
{
	if (!ctx->ops->mr_reg_dmabuf)
		return -EOPNOTSUPP;
	if (!len || fd < 0)
		return -EINVAL;
	return ctx->ops->mr_reg_dmabuf(ctx->dev, addr, len, fd, access, key);
}

int host_mr_acquire_dmabuf(struct host_ctx *ctx, uint64_t addr, uint64_t len, int fd,
			   uint32_t access, uint32_t *key)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = dmabuf_in(ctx, addr, len, fd, access, key);
	leave(ctx);
	return rc;
}

/* Is key used by an op the firmware may still be running? Call with ctx->lock held. */
static int key_busy_locked(struct host_ctx *ctx, uint32_t key)
{
	reap_locked(ctx);
	if (!ctx->inflight)
		return 0;
	for (uint32_t i = 0; i < HOST_TAGS; i++) {
		const struct host_tag *t = &ctx->tags[i];

		if ((t->state == TAG_PENDING || t->state == TAG_ABANDONED) &&
		    (t->keys[0] == key || t->keys[1] == key || t->keys[2] == key))
			return 1;
	}
	return 0;
}

static int mr_release_in(struct host_ctx *ctx, uint32_t key)
{
	int busy;

	/* Like ibv_dereg_mr on a region a posted WR still uses: refused, not pulled from
	 * under the DMA. */
	pthread_mutex_lock(&ctx->lock);
	busy = key && key_busy_locked(ctx, key);
	pthread_mutex_unlock(&ctx->lock);
	return busy ? -EBUSY : ctx->ops->mr_dereg(ctx->dev, key);
}

int host_mr_release(struct host_ctx *ctx, uint32_t key)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = mr_release_in(ctx, key);
	leave(ctx);
	return rc;
}

static int alloc_shared_in(struct host_ctx *ctx, uint64_t len, void **addr, uint32_t *key)
{
	int rc;

	pthread_mutex_lock(&ctx->lock);
	for (uint32_t i = 0; i < HOST_MAX_SHARED; i++) {
		struct host_shared *s = &ctx->shared[i];

		if (s->addr)
			continue;
		rc = ctx->ops->alloc_shared(ctx->dev, len, addr, key);
		if (!rc)
			*s = (struct host_shared){ .addr = *addr, .len = len, .key = *key };
		pthread_mutex_unlock(&ctx->lock);
		return rc;
	}
	pthread_mutex_unlock(&ctx->lock);
	return -ENOSPC;
}

int host_alloc_shared(struct host_ctx *ctx, uint64_t len, void **addr, uint32_t *key)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = alloc_shared_in(ctx, len, addr, key);
	leave(ctx);
	return rc;
}

int host_free_shared(struct host_ctx *ctx, void *addr, uint64_t len)
{
	int rc = -EBUSY;

	/* The context is closed (or closing): its device already revoked and unlinked it. */
	if (!ctx || enter(ctx))
		return munmap(addr, len ? (len + 4095) & ~4095ull : 4096) ? -errno : 0;
	pthread_mutex_lock(&ctx->lock);
	for (uint32_t i = 0; i < HOST_MAX_SHARED; i++) {
		if (ctx->shared[i].addr != addr)
			continue;
		if (key_busy_locked(ctx, ctx->shared[i].key))
			goto out;
		ctx->shared[i] = (struct host_shared){ 0 };
	}
	rc = 0;
out:
	pthread_mutex_unlock(&ctx->lock);
	if (!rc)
		rc = ctx->ops->free_shared(ctx->dev, addr, len);
	leave(ctx);
	return rc;
}

void host_drive_stats(struct host_ctx *ctx, uint64_t *ops, uint64_t *passes)
{
	*ops = *passes = 0;
	if (enter(ctx))
		return;
	if (ctx->ops->drive_stats)
		ctx->ops->drive_stats(ctx->dev, ops, passes);
	leave(ctx);
}

static int stats_in(struct host_ctx *ctx, uint64_t *out, uint32_t max_threads)
{
	uint32_t n = ctx->num_threads < max_threads ? ctx->num_threads : max_threads;

	/* Racy snapshot by design: the counters are monotonic and only for reporting. */
	memcpy(out, ctx->stats, n * sizeof(*ctx->stats));
	return (int)ctx->num_threads;
}

int host_stats(struct host_ctx *ctx, uint64_t *out, uint32_t max_threads)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = stats_in(ctx, out, max_threads);
	leave(ctx);
	return rc;
}

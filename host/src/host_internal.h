/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the host side's three parts share, as liburing splits setup, queue and register:
 * host_setup.c (open, shutdown, close, counters), host_queue.c (post, reap, test, wait,
 * cancel, teams) and host_mr.c (memory: registrations, the registration cache, shared
 * allocations).
 *
 * Locking: ctx->lock guards posting (sq_tail, tags), reaping (cq_head, tag table), the
 * shared allocations and the registration cache. It is never held while sleeping, nor
 * while driving the firmware, nor while registering memory.
 */
#ifndef HOST_INTERNAL_H
#define HOST_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "host_device.h"
#include "offload_abi.h"
#include "offload_host.h"

#define HOST_TAGS        4096u         /* requests alive (posted, not yet waited for) */
#define HOST_SLEEP_MAX   100000000ll   /* re-check at least every 100 ms */
#define HOST_MAX_SHARED  256u
#define HOST_OP_BUFS     3u            /* src, dst, aux */
#define HOST_MR_CACHE    64u           /* registrations kept for buffers used again */
#define HOST_MR_HINTS    16u           /* cookies whose last entry is looked at first */

/* A buffer host_post registered for one op: a cache entry it holds a reference on
 * (entry + 1), or a registration of its own to release at completion (key). */
struct host_op_mr {
	uint32_t entry;
	uint32_t key;
};

enum host_tag_state {
	TAG_FREE = 0,
	TAG_PENDING,
	TAG_DONE,
	TAG_ABANDONED,
};

struct host_tag {
	uint32_t tag;
	uint32_t state;
	struct host_op_mr mr[HOST_OP_BUFS];  /* what host_post registered for the op */
	uint32_t keys[HOST_OP_BUFS];  /* src, dst, aux: deregistering them is refused while pending */
	uint32_t small;       /* host_op.small */
	struct host_completion done;
};

/* A registration kept for its exporter (host_mr.c): reused by every op whose buffer it
 * covers, with the same cookie and enough rights, until the exporter dies. */
struct host_mr_entry {
	uint64_t cookie;      /* the exporter's, from the binding; 0: slot free */
	uint64_t addr;
	uint64_t len;
	uint32_t access;
	uint32_t key;
	uint32_t refs;        /* ops in flight that use it */
	uint32_t dead;        /* invalidated while in use: deregistered at the last unref */
	uint64_t last_use;    /* for eviction: the least recently used idle entry goes */
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
	uint32_t shared_end;          /* shared[] is empty from here on */
	/* Registration cache, under lock (host_mr.c). */
	struct host_mr_entry mr_cache[HOST_MR_CACHE];
	/* Per cookie (mod HOST_MR_HINTS): the entry it matched last, + 1. A small op looks
	 * up its two buffers on every post: that entry, not a scan of the cache. */
	uint8_t mr_hint[HOST_MR_HINTS];
	uint64_t mr_clock;
	uint64_t mr_registrations;    /* every registration host_post or host_mr_acquire made */
	uint64_t mr_hits;             /* op buffers the cache already covered */
};

/* Pairs with host_ctx_shutdown(): it stores closing, then reads users; we add to users,
 * then read closing. Sequentially consistent, so one of us sees the other. */
static inline void leave(struct host_ctx *ctx)
{
	__atomic_fetch_sub(&ctx->users, 1, __ATOMIC_SEQ_CST);
}

static inline int enter(struct host_ctx *ctx)
{
	__atomic_fetch_add(&ctx->users, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&ctx->closing, __ATOMIC_SEQ_CST)) {
		leave(ctx);
		return -ESHUTDOWN;
	}
	return 0;
}

static inline int closing(struct host_ctx *ctx)
{
	return __atomic_load_n(&ctx->closing, __ATOMIC_SEQ_CST) != 0;
}

static inline int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* host_queue.c */
void host_reap_locked(struct host_ctx *ctx);
int host_key_busy_locked(struct host_ctx *ctx, uint32_t key);

/* host_mr.c: the registrations an op's zero keys ask for (op's keys filled in, mr[] says
 * what to give back), and giving them back: before posting (put) or once reaped (put_locked). */
int host_mr_get_op(struct host_ctx *ctx, struct host_op *op, struct host_op_mr mr[HOST_OP_BUFS]);
void host_mr_put(struct host_ctx *ctx, const struct host_op_mr mr[HOST_OP_BUFS]);
void host_mr_put_locked(struct host_ctx *ctx, const struct host_op_mr mr[HOST_OP_BUFS]);

/* The ring header's failed (closed = 0) or closed set: offload_rank_words(size) words. */
static inline uint64_t *host_rank_set(struct host_ctx *ctx, int closed)
{
	return (uint64_t *)((uint8_t *)ctx->ring +
			    (closed ? ctx->ring->closed_off : ctx->ring->failed_off));
}

#endif /* HOST_INTERNAL_H */

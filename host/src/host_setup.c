/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Setting up and tearing down the host side of the ring (host_internal.h has the map):
 * load the backend, open its device, map the rings, start the firmware; read counters.
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
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "host_internal.h"

/* The FlexIO backend needs DOCA's libraries: it is a separate shared object
 * (scripts/build_flexio.sh), loaded only when asked for, so this library builds and runs
 * where DOCA is absent. */
#define FLEXIO_OPS_SYMBOL "dpaoffload_flexio_ops"
#define FLEXIO_ABI_SYMBOL "dpaoffload_flexio_abi"
#define FLEXIO_PARAMS_SYMBOL "dpaoffload_flexio_params_version"

static int find_backend(struct host_ctx *ctx, const char *name, const char *lib)
{
	const struct host_device_ops *(*get_ops)(void);
	uint32_t (*get_abi)(void), (*get_params)(void);

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
	*(void **)&get_params = dlsym(ctx->backend_dl, FLEXIO_PARAMS_SYMBOL);
	/* A backend built from other headers would read our structs wrong. */
	if (get_ops && (!get_abi || get_abi() != OFFLOAD_ABI_VERSION || !get_params ||
			get_params() != HOST_CTX_PARAMS_VERSION))
		return -EPROTO;
	ctx->ops = get_ops ? get_ops() : NULL;
	return ctx->ops ? 0 : -ENOEXEC;
}


uint32_t host_num_threads(const struct host_ctx *ctx)
{
	return ctx->num_threads;
}

/* The command and completion rings and the stats: in memory of the device's where it
 * places them itself (a card's window arena), else page-aligned zeroed memory of ours. */
static int map_rings(struct host_ctx *ctx, const struct host_ctx_params *p)
{
	uint32_t entries = p->ring_entries;
	struct host_fw_windows fw;

	ctx->sq_entries = entries;
	ctx->cq_entries = entries * 2;
	ctx->ring_len = host_ring_len(p);
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
	offload_ring_set_ranks(ctx->ring, ctx->sq_entries, ctx->cq_entries, p->size);
	ctx->sq = (struct offload_cmd *)(ctx->ring + 1);
	ctx->cq = (struct offload_cqe *)(ctx->sq + entries);
	return 0;
}

int host_ctx_open(const struct host_ctx_params *p, struct host_ctx **out)
{
	struct dpa_engine_params params;
	struct host_fw_windows win;
	struct host_ctx *ctx;
	int rc;

	_Static_assert(sizeof(p->rail_down_after) / sizeof(p->rail_down_after[0]) ==
		       HOST_MAX_RAILS, "rails");
	if (!host_params_known(p))
		return -EPROTONOSUPPORT;
	if (p->ring_entries < 8 || (p->ring_entries & (p->ring_entries - 1)) ||
	    p->ring_entries * 2 > HOST_TAGS || !p->engine.chunk_size)
		return -EINVAL;
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
		rc = ctx->ops->open(p, &ctx->dev);
	if (!rc)
		rc = map_rings(ctx, p);
	if (rc)
		goto err;
	/* The caller's engine settings as they are, with what setup decided. */
	params = p->engine;
	params.abi_version = OFFLOAD_ABI_VERSION;
	params.world_rank = p->rank;
	params.world_size = p->size;
	params.num_threads = p->num_threads;
	params.sq_entries = ctx->sq_entries;
	params.cq_entries = ctx->cq_entries;
	params.chunks_per_pass = 4;
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

/* Ranks of the ring's set: the count, the first max of them in out. */
static uint32_t set_list(struct host_ctx *ctx, int closed, uint32_t *out, uint32_t max)
{
	const uint64_t *set = host_rank_set(ctx, closed);
	uint32_t n = 0;

	/* Pairs with offload_rankset_add()'s gen increment: bits before it are visible. */
	(void)__atomic_load_n(closed ? &ctx->ring->closed_gen : &ctx->ring->failed_gen,
			      __ATOMIC_ACQUIRE);
	for (uint32_t w = 0; w < offload_rank_words(ctx->size); w++)
		for (uint64_t m = __atomic_load_n(&set[w], __ATOMIC_ACQUIRE); m; m &= m - 1) {
			if (n < max && out)
				out[n] = w * 64 + (uint32_t)__builtin_ctzll(m);
			n++;
		}
	return n;
}

/* The ranks below 64 of a set, a bit each (the u64 form older callers read). */
static uint64_t set_mask(struct host_ctx *ctx, int closed)
{
	return __atomic_load_n(&host_rank_set(ctx, closed)[0], __ATOMIC_ACQUIRE);
}

uint64_t host_failed_ranks(struct host_ctx *ctx)
{
	uint64_t mask;

	if (enter(ctx))
		return 0;
	mask = set_mask(ctx, 0);
	leave(ctx);
	return mask;
}

int host_failed_list(struct host_ctx *ctx, uint32_t *ranks, uint32_t max)
{
	uint32_t n;

	if (enter(ctx))
		return -ESHUTDOWN;
	n = set_list(ctx, 0, ranks, max);
	leave(ctx);
	return (int)n;
}

int host_closed_list(struct host_ctx *ctx, uint32_t *ranks, uint32_t max)
{
	uint32_t n;

	if (enter(ctx))
		return -ESHUTDOWN;
	n = set_list(ctx, 1, ranks, max);
	leave(ctx);
	return (int)n;
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
	mask = set_mask(ctx, 1);
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

void host_drive_stats(struct host_ctx *ctx, struct host_drive_stats *out)
{
	*out = (struct host_drive_stats){ 0 };
	if (enter(ctx))
		return;
	if (ctx->ops->drive_stats)
		ctx->ops->drive_stats(ctx->dev, out);
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

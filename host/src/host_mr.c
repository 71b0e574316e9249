/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory: registrations, the registration cache, and ctx.empty() allocations.
 *
 * The cache (UCX's rcache, in small): host_post registers an op's buffer once and keeps the
 * registration for the next op on the same memory, instead of registering and
 * deregistering around every one-shot op (ibv_reg_mr per op on a card: tens of
 * microseconds per MiB). An entry belongs to the buffer's exporter, named by a cookie the
 * binding gives (host_op.src_cookie, dst_cookie): a lookup matches only the same
 * exporter's memory, and the binding invalidates the cookie when the exporter dies
 * (host_mr_invalidate), before its memory can be freed and handed to someone else. So
 * memory freed and allocated again at the same address is registered again, never
 * reached through the old registration. A buffer without a cookie (an exporter that
 * cannot tell when it dies) is registered for its op alone, as before.
 *
 * Entries hold a reference per op in flight; one invalidated while in use is
 * deregistered when the last op that uses it is reaped. A full cache evicts its least
 * recently used idle entry. Everything here runs under ctx->lock but the registration
 * itself, which may be slow (pinning pages) and runs unlocked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "host_internal.h"

/* The ctx.empty() allocation holding [p, p + len), or NULL. Under ctx->lock. */
static const struct host_shared *shared_covering_locked(const struct host_ctx *ctx,
							const uint8_t *p, uint64_t len)
{
	for (uint32_t i = 0; i < ctx->shared_end; i++) {
		const struct host_shared *s = &ctx->shared[i];

		if (s->addr && p >= s->addr && len <= s->len && (uint64_t)(p - s->addr) <= s->len - len)
			return s;
	}
	return NULL;
}

static int mr_reg(struct host_ctx *ctx, uint64_t addr, uint64_t len, uint32_t access,
		  uint32_t *key)
{
	int rc = ctx->ops->mr_reg(ctx->dev, (const void *)(uintptr_t)addr, len ? len : 1, access,
				  key);

	if (!rc)
		__atomic_fetch_add(&ctx->mr_registrations, 1, __ATOMIC_RELAXED);
	return rc;
}

static int mr_acquire_in(struct host_ctx *ctx, const void *addr, uint64_t len, uint32_t access,
			 uint32_t *key, int *owned)
{
	const struct host_shared *s;

	pthread_mutex_lock(&ctx->lock);
	s = shared_covering_locked(ctx, addr, len);
	if (s) {
		*key = s->key;
		*owned = 0;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (s)
		return 0;
	*owned = 1;
	return mr_reg(ctx, (uint64_t)(uintptr_t)addr, len, access, key);
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

/* -- the cache ---------------------------------------------------------------------------- */

static int cache_covers(const struct host_mr_entry *e, uint64_t cookie, uint64_t addr,
			uint64_t len, uint32_t access)
{
	return e->cookie == cookie && !e->dead && addr >= e->addr && len <= e->len &&
	       addr - e->addr <= e->len - len && (e->access & access) == access;
}

static struct host_mr_entry *cache_find_locked(struct host_ctx *ctx, uint64_t cookie,
					       uint64_t addr, uint64_t len, uint32_t access)
{
	uint8_t *hint = &ctx->mr_hint[cookie % HOST_MR_HINTS];

	if (*hint && cache_covers(&ctx->mr_cache[*hint - 1], cookie, addr, len, access))
		return &ctx->mr_cache[*hint - 1];
	for (uint32_t i = 0; i < HOST_MR_CACHE; i++) {
		if (cache_covers(&ctx->mr_cache[i], cookie, addr, len, access)) {
			*hint = (uint8_t)(i + 1);
			return &ctx->mr_cache[i];
		}
	}
	return NULL;
}

static void cache_drop_locked(struct host_ctx *ctx, struct host_mr_entry *e)
{
	ctx->ops->mr_dereg(ctx->dev, e->key);
	*e = (struct host_mr_entry){ 0 };
}

/* A free slot, or the least recently used idle entry's (deregistered); NULL if every
 * entry is in use. */
static struct host_mr_entry *cache_slot_locked(struct host_ctx *ctx)
{
	struct host_mr_entry *lru = NULL;

	for (uint32_t i = 0; i < HOST_MR_CACHE; i++) {
		struct host_mr_entry *e = &ctx->mr_cache[i];

		if (!e->cookie)
			return e;
		if (!e->refs && (!lru || e->last_use < lru->last_use))
			lru = e;
	}
	if (lru)
		cache_drop_locked(ctx, lru);
	return lru;
}

static void cache_hold_locked(struct host_ctx *ctx, struct host_mr_entry *e, uint32_t *key,
			      struct host_op_mr *mr)
{
	e->refs++;
	e->last_use = ++ctx->mr_clock;
	*key = e->key;
	mr->entry = (uint32_t)(e - ctx->mr_cache) + 1;
}

/* A key for one buffer of an op: an ctx.empty() allocation's, a cached registration of
 * the same exporter's, or a new registration (cached when the exporter has a cookie). */
static int get_buf(struct host_ctx *ctx, uint64_t addr, uint64_t len, uint32_t access,
		   uint64_t cookie, uint32_t *key, struct host_op_mr *mr)
{
	const struct host_shared *s;
	struct host_mr_entry *e = NULL;
	int rc;

	pthread_mutex_lock(&ctx->lock);
	s = shared_covering_locked(ctx, (const uint8_t *)(uintptr_t)addr, len);
	if (s) {
		*key = s->key;
		pthread_mutex_unlock(&ctx->lock);
		return 0;
	}
	if (cookie)
		e = cache_find_locked(ctx, cookie, addr, len, access);
	if (e) {
		cache_hold_locked(ctx, e, key, mr);
		ctx->mr_hits++;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (e)
		return 0;
	rc = mr_reg(ctx, addr, len, access, key);
	if (rc)
		return rc;
	mr->key = *key;
	if (!cookie)
		return 0;
	pthread_mutex_lock(&ctx->lock);
	e = cache_slot_locked(ctx);
	if (e) {
		*e = (struct host_mr_entry){ .cookie = cookie, .addr = addr, .len = len,
			.access = access, .key = *key };
		cache_hold_locked(ctx, e, key, mr);
		mr->key = 0;
	}
	pthread_mutex_unlock(&ctx->lock);
	return 0;
}

/* In place under one cookie (a reduction's dst is its src, or a block of it): one
 * registration of src with both rights serves both keys, cached like any other; two of
 * the same pages, one per right, would take two cache entries and two registrations. */
static int in_place(const struct host_op *op)
{
	return op->src_cookie && op->src_cookie == op->dst_cookie && !op->src_key && !op->dst_key &&
	       op->src_len && op->dst_len && op->dst_addr >= op->src_addr &&
	       op->dst_len <= op->src_len && op->dst_addr - op->src_addr <= op->src_len - op->dst_len;
}

int host_mr_get_op(struct host_ctx *ctx, struct host_op *op, struct host_op_mr mr[HOST_OP_BUFS])
{
	int rc = 0;

	if (in_place(op)) {
		rc = get_buf(ctx, op->src_addr, op->src_len,
			     OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
			     OFFLOAD_ACCESS_REMOTE_READ | OFFLOAD_ACCESS_REMOTE_WRITE, op->src_cookie,
			     &op->src_key, &mr[0]);
		op->dst_key = op->src_key;
	}
	if (!rc && !op->src_key && op->src_len)
		rc = get_buf(ctx, op->src_addr, op->src_len,
			     OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_REMOTE_READ, op->src_cookie,
			     &op->src_key, &mr[0]);
	if (!rc && !op->dst_key && op->dst_len)
		rc = get_buf(ctx, op->dst_addr, op->dst_len,
			     OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
			     OFFLOAD_ACCESS_REMOTE_WRITE, op->dst_cookie, &op->dst_key, &mr[1]);
	/* Arguments the firmware reads and writes back (counts) in place: made for each op,
	 * so registered for it alone. */
	if (!rc && !op->aux_key && op->aux_len)
		rc = get_buf(ctx, op->aux_addr, op->aux_len,
			     OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE, 0, &op->aux_key,
			     &mr[2]);
	if (rc)
		host_mr_put(ctx, mr);
	return rc;
}

void host_mr_put_locked(struct host_ctx *ctx, const struct host_op_mr mr[HOST_OP_BUFS])
{
	for (uint32_t i = 0; i < HOST_OP_BUFS; i++) {
		if (mr[i].entry) {
			struct host_mr_entry *e = &ctx->mr_cache[mr[i].entry - 1];

			if (!--e->refs && e->dead)
				cache_drop_locked(ctx, e);
		}
		if (mr[i].key)
			ctx->ops->mr_dereg(ctx->dev, mr[i].key);
	}
}

void host_mr_put(struct host_ctx *ctx, const struct host_op_mr mr[HOST_OP_BUFS])
{
	pthread_mutex_lock(&ctx->lock);
	host_mr_put_locked(ctx, mr);
	pthread_mutex_unlock(&ctx->lock);
}

static void invalidate_in(struct host_ctx *ctx, uint64_t cookie)
{
	pthread_mutex_lock(&ctx->lock);
	for (uint32_t i = 0; i < HOST_MR_CACHE; i++) {
		struct host_mr_entry *e = &ctx->mr_cache[i];

		if (e->cookie != cookie)
			continue;
		if (e->refs)
			e->dead = 1;  /* an op still uses it: deregistered once reaped */
		else
			cache_drop_locked(ctx, e);
	}
	pthread_mutex_unlock(&ctx->lock);
}

void host_mr_invalidate(struct host_ctx *ctx, uint64_t cookie)
{
	if (!cookie || enter(ctx))
		return;
	invalidate_in(ctx, cookie);
	leave(ctx);
}

void host_mr_cache_stats(struct host_ctx *ctx, uint64_t *registrations, uint64_t *hits,
			 uint32_t *cached)
{
	*registrations = *hits = 0;
	*cached = 0;
	if (enter(ctx))
		return;
	pthread_mutex_lock(&ctx->lock);
	*registrations = __atomic_load_n(&ctx->mr_registrations, __ATOMIC_RELAXED);
	*hits = ctx->mr_hits;
	for (uint32_t i = 0; i < HOST_MR_CACHE; i++)
		*cached += ctx->mr_cache[i].cookie != 0;
	pthread_mutex_unlock(&ctx->lock);
	leave(ctx);
}

/* -- dma-bufs, release, shared allocations ----------------------------------------------- */

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

static int mr_release_in(struct host_ctx *ctx, uint32_t key)
{
	int busy;

	/* Like ibv_dereg_mr on a region a posted WR still uses: refused, not pulled from
	 * under the DMA. */
	pthread_mutex_lock(&ctx->lock);
	busy = key && host_key_busy_locked(ctx, key);
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
		if (!rc) {
			*s = (struct host_shared){ .addr = *addr, .len = len, .key = *key };
			if (ctx->shared_end <= i)
				ctx->shared_end = i + 1;
		}
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
		if (host_key_busy_locked(ctx, ctx->shared[i].key))
			goto out;
		ctx->shared[i] = (struct host_shared){ 0 };
	}
	while (ctx->shared_end && !ctx->shared[ctx->shared_end - 1].addr)
		ctx->shared_end--;
	rc = 0;
out:
	pthread_mutex_unlock(&ctx->lock);
	if (!rc)
		rc = ctx->ops->free_shared(ctx->dev, addr, len);
	leave(ctx);
	return rc;
}

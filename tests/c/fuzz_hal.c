/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An in-process dpa_hal.h for the fuzz harness, one thread, everything deterministic.
 * It checks what the emulator checks (emulator/emu_hal.c, emu_job.c), in the same order
 * and with the same answers, so that the firmware sees the same world:
 *  - windows: RING, STATS and CTRL are bounds-checked exactly as the emulator does. AUX,
 *    which the emulator resolves through the registration of its key (bounds and local
 *    access, emu_hal.c), is here a FZ_AUX_LEN buffer at FZ_AUX_BASE under any key, and
 *    anything outside is NULL, so that random aux addresses test the firmware's NULL
 *    handling, not libc;
 *  - RDMA: a peer outside the world is OFFLOAD_ERR_REMOTE_ACCESS, a dead one
 *    OFFLOAD_ERR_PEER, then key, access and bounds against the peer's region table; a
 *    refused access is an error completion with nothing written;
 *  - every post completes at once (the firmware must not assume it), into a per-thread
 *    completion queue whose depth the input picks: a full one answers DPA_HAL_EAGAIN.
 * Peers are loopback: their regions are local buffers nobody else touches.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

static const uint32_t fz_access[FZ_KINDS] = {
	[FZ_CTRL] = OFFLOAD_ACCESS_REMOTE_WRITE | OFFLOAD_ACCESS_REMOTE_ATOMIC |
		    OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE,
	[FZ_SRC] = OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_REMOTE_READ,
	[FZ_DST] = OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
		   OFFLOAD_ACCESS_REMOTE_WRITE,
};

static const uint64_t fz_len[FZ_KINDS] = {
	[FZ_CTRL] = 0,  /* offload_ctrl_bytes(world): set per input (fz_world_reset) */
	[FZ_SRC] = FZ_SRC_LEN,
	[FZ_DST] = FZ_DST_LEN,
};

void fz_fail(const char *fmt, ...)
{
	va_list ap;

	fputs("fuzz invariant violated: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
	abort();
}

/* A buffer with guard bytes on both sides, 64-byte aligned like the host's pages. */
static struct fz_buf buf_new(uint64_t len)
{
	uint8_t *raw = aligned_alloc(64, (len + 2 * FZ_GUARD + 63) & ~63ull);

	if (!raw) {
		fputs("fuzz: out of memory\n", stderr);
		exit(2);
	}
	memset(raw, FZ_GUARD_BYTE, FZ_GUARD);
	memset(raw + FZ_GUARD + len, FZ_GUARD_BYTE, FZ_GUARD);
	return (struct fz_buf){ .mem = raw + FZ_GUARD, .len = len };
}

static void buf_reset(struct fz_buf *b, uint64_t len, int fill)
{
	/* The guard follows the length in use, so a write just past it is caught too. */
	b->len = len;
	memset(b->mem - FZ_GUARD, FZ_GUARD_BYTE, FZ_GUARD);
	if (fill >= 0)
		memset(b->mem, fill, len);
	memset(b->mem + len, FZ_GUARD_BYTE, FZ_GUARD);
}

static void buf_check(const struct fz_buf *b, const char *name, uint32_t rank, const char *when)
{
	for (uint32_t i = 0; i < FZ_GUARD; i++) {
		if (b->mem[-(int64_t)FZ_GUARD + i] != FZ_GUARD_BYTE)
			fz_fail("%s: write before %s (rank %u) at offset -%u", when, name, rank,
				FZ_GUARD - i);
		if (b->mem[b->len + i] != FZ_GUARD_BYTE)
			fz_fail("%s: write past %s (rank %u) at offset len+%u", when, name, rank, i);
	}
}

struct fz_world *fz_world_new(void)
{
	struct fz_world *w = calloc(1, sizeof(*w));
	uint64_t ring_max = offload_ring_bytes(64, 64, FZ_MAX_WORLD);

	if (!w) {
		fputs("fuzz: out of memory\n", stderr);
		exit(2);
	}
	w->ring = buf_new(ring_max);
	w->stats = buf_new(FZ_MAX_THREADS * sizeof(struct offload_thread_stats));
	w->aux = buf_new(FZ_AUX_LEN);
	for (uint32_t r = 0; r < FZ_MAX_WORLD; r++) {
		for (uint32_t k = 0; k < FZ_KINDS; k++) {
			struct fz_region *reg = &w->regions[r][k];

			uint64_t len = k == FZ_CTRL ? offload_ctrl_bytes(FZ_MAX_WORLD) : fz_len[k];

			*reg = (struct fz_region){ .rank = r, .kind = k, .key = fz_key(r, k),
				.access = fz_access[k], .addr = fz_addr(r, k), .buf = buf_new(len) };
			buf_reset(&reg->buf, len, k == FZ_SRC ? FZ_SRC_BYTE : 0);
		}
	}
	for (uint32_t t = 0; t < FZ_MAX_THREADS; t++)
		w->hals[t] = (struct dpa_hal){ .w = w, .index = t };
	return w;
}

void fz_world_reset(struct fz_world *w, const struct fz_input *in)
{
	w->size = in->world;
	w->me = in->me;
	w->nthreads = in->threads;
	w->dead = in->h.dead & ~(1u << in->me) & ((1u << in->world) - 1);
	w->num_rails = in->rails;
	memset(w->rail_down, 0, sizeof(w->rail_down));
	w->ring_len = offload_ring_bytes(in->sq_entries, in->cq_entries, in->world);
	buf_reset(&w->ring, w->ring_len, 0);
	buf_reset(&w->stats, in->threads * sizeof(struct offload_thread_stats), 0);
	buf_reset(&w->aux, FZ_AUX_LEN, 0);
	memcpy(w->aux.mem, in->aux, in->aux_len < FZ_AUX_LEN ? in->aux_len : FZ_AUX_LEN);
	/* Control words must start at zero: a stale seq from the last input would pair. dst
	 * contents don't matter; src is checked, never rewritten. */
	for (uint32_t r = 0; r < in->world; r++)
		buf_reset(&w->regions[r][FZ_CTRL].buf, offload_ctrl_bytes(in->world), 0);
	for (uint32_t t = 0; t < FZ_MAX_THREADS; t++) {
		memset(w->hals[t].rail, 0, sizeof(w->hals[t].rail));
		w->hals[t].cq.head = w->hals[t].cq.tail = 0;
		w->hals[t].cq.depth = in->hal_cq;
	}
	w->clock_ns = 1000000000ull;
	w->notifies = w->host_notifies = w->activity = 0;
	w->last_wr_id = 0;
	w->dst_cmds = NULL;
	w->ndst_cmds = 0;
	w->dst_writes = 0;
}

void *fz_region_ptr(struct fz_world *w, uint32_t rank, enum fz_kind kind)
{
	return w->regions[rank][kind].buf.mem;
}

void fz_world_check(const struct fz_world *w, const char *when)
{
	static const char *const names[FZ_KINDS] = { "ctrl", "src", "dst" };

	buf_check(&w->ring, "the ring", w->me, when);
	buf_check(&w->stats, "the stats window", w->me, when);
	buf_check(&w->aux, "the aux window", w->me, when);
	static uint8_t src_ref[FZ_SRC_LEN];

	if (!src_ref[0])
		memset(src_ref, FZ_SRC_BYTE, sizeof(src_ref));
	for (uint32_t r = 0; r < FZ_MAX_WORLD; r++) {
		const struct fz_region *src = &w->regions[r][FZ_SRC];

		for (uint32_t k = 0; k < FZ_KINDS; k++)
			buf_check(&w->regions[r][k].buf, names[k], r, when);
		/* Only the world's ranks are reachable; the rest keep their guards checked. */
		if (r >= w->size || !memcmp(src->buf.mem, src_ref, FZ_SRC_LEN))
			continue;
		for (uint64_t i = 0; i < FZ_SRC_LEN; i++)
			if (src->buf.mem[i] != FZ_SRC_BYTE)
				fz_fail("%s: src of rank %u (no write access) changed at %llu", when, r,
					(unsigned long long)i);
	}
}

/* ---- dpa_hal.h ---- */

uint32_t dpa_hal_thread_index(const struct dpa_hal *hal)
{
	return hal->index;
}

uint32_t dpa_hal_num_threads(const struct dpa_hal *hal)
{
	return hal->w->nthreads;
}

static void *in_window(const struct fz_buf *b, uint64_t offset, uint64_t len)
{
	/* emu_hal.c's check, word for word. */
	if (offset > b->len || len > b->len - offset)
		return NULL;
	return b->mem + offset;
}

void *dpa_hal_window_ptr(struct dpa_hal *hal, enum dpa_hal_window win, uint64_t offset,
			 uint64_t len)
{
	struct fz_world *w = hal->w;
	struct fz_buf ring = { .mem = w->ring.mem, .len = w->ring_len };

	switch (win) {
	case DPA_HAL_WIN_RING:
		return in_window(&ring, offset, len);
	case DPA_HAL_WIN_STATS:
		return in_window(&w->stats, offset, len);
	case DPA_HAL_WIN_CTRL:
		return in_window(&w->regions[w->me][FZ_CTRL].buf, offset, len);
	}
	return NULL;
}

/* Command arguments: only the aux buffer, only under the key the host registered it with. */
void *dpa_hal_aux_ptr(struct dpa_hal *hal, uint32_t key, uint64_t addr, uint64_t len)
{
	if (key != FZ_AUX_KEY || addr < FZ_AUX_BASE)
		return NULL;
	return in_window(&hal->w->aux, addr - FZ_AUX_BASE, len);
}

/* emu_mr_resolve(): rank, liveness, key, access, bounds; a pointer to the bytes. */
static int32_t resolve(struct fz_world *w, uint32_t rank, uint32_t key, uint64_t addr,
		       uint64_t len, uint32_t access, uint8_t **ptr, const struct fz_region **out)
{
	const struct fz_region *reg = NULL;

	if (rank >= w->size)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	if (w->dead & (1u << rank))
		return OFFLOAD_ERR_PEER;
	for (uint32_t k = 0; k < FZ_KINDS && key; k++)
		if (w->regions[rank][k].key == key)
			reg = &w->regions[rank][k];
	if (!reg)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	if ((reg->access & access) != access || addr < reg->addr || len > reg->buf.len ||
	    addr - reg->addr > reg->buf.len - len)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	*ptr = reg->buf.mem + (addr - reg->addr);
	if (out)
		*out = reg;
	return OFFLOAD_OK;
}

static int cq_full(const struct dpa_hal *hal)
{
	return hal->cq.tail - hal->cq.head >= hal->cq.depth;
}

static uint32_t rail_of(const struct dpa_hal *hal, uint32_t peer)
{
	return peer < FZ_MAX_WORLD ? hal->rail[peer] : 0;
}

void fz_push_cqe(struct dpa_hal *hal, uint32_t peer, uint64_t wr_id, int32_t status,
		 uint64_t bytes)
{
	struct dpa_hal_cqe *c = &hal->cq.cqe[hal->cq.tail % FZ_HAL_CQ_MAX];

	*c = (struct dpa_hal_cqe){ .wr_id = wr_id, .status = status, .bytes = (uint32_t)bytes,
				   .rail = rail_of(hal, peer) };
	hal->cq.tail++;
	hal->w->activity++;
}

static int push_cqe(struct dpa_hal *hal, uint32_t peer, uint64_t wr_id, int32_t status,
		    uint64_t bytes)
{
	hal->w->last_wr_id = wr_id;
	fz_push_cqe(hal, peer, wr_id, status, bytes);
	return 0;
}

/* emu_hal.c's rail_gate(): a post on a rail that is down completes LINK_DOWN and delivers
 * nothing (checked where the emulator checks it: after the local side, before the remote). */
static int32_t rail_gate(const struct dpa_hal *hal, uint32_t peer)
{
	if (peer >= hal->w->size || peer >= FZ_MAX_WORLD)
		return OFFLOAD_OK;  /* resolving the key refuses it */
	return hal->w->rail_down[peer] >> rail_of(hal, peer) & 1 ? OFFLOAD_ERR_LINK_DOWN : OFFLOAD_OK;
}

/* A data write that passed the checks landed in reg: if it is our own dst and the input
 * could not forge descriptors, it must lie inside some posted command's [dst, dst+dst_len).
 * (Control writes go where team descriptors say, and those are the host's to get right.) */
static void observe_write(struct fz_world *w, const struct fz_region *reg, uint64_t raddr,
			  uint64_t len, int data)
{
	if (reg->kind != FZ_DST)
		return;
	w->dst_writes++;
	if (!data || !w->dst_cmds || reg->rank != w->me)
		return;
	for (uint32_t i = 0; i < w->ndst_cmds; i++) {
		const struct offload_cmd *c = &w->dst_cmds[i];

		if ((c->opcode == OFFLOAD_OP_ALLTOALL || c->opcode == OFFLOAD_OP_ALLTOALLV ||
		     c->opcode == OFFLOAD_OP_BROADCAST || c->opcode == OFFLOAD_OP_ALLGATHER) &&
		    c->dst_key == reg->key && raddr >= c->dst_addr && len <= c->dst_len &&
		    raddr - c->dst_addr <= c->dst_len - len)
			return;
	}
	fz_fail("a write of %llu bytes at %#llx into our dst is outside every command's "
		"[dst_addr, dst_addr + dst_len)", (unsigned long long)len,
		(unsigned long long)raddr);
}

static int32_t do_write(struct fz_world *w, uint32_t peer, const void *src, uint64_t raddr,
			uint32_t rkey, uint64_t len, int data)
{
	const struct fz_region *reg;
	uint8_t *ptr;
	int32_t st;

	if (!len)
		return OFFLOAD_OK;
	st = resolve(w, peer, rkey, raddr, len, OFFLOAD_ACCESS_REMOTE_WRITE, &ptr, &reg);
	if (st)
		return st;
	observe_write(w, reg, raddr, len, data);
	/* A forged command can name overlapping src and dst in one region: DMA copes. */
	memmove(ptr, src, len);
	return OFFLOAD_OK;
}

/* The local side of a post, by lkey in our own table; its bytes, or NULL if refused. */
static int32_t check_local(struct fz_world *w, uint64_t laddr, uint32_t lkey, uint64_t len,
			   uint32_t access, uint8_t **ptr)
{
	*ptr = NULL;
	if (!len)
		return OFFLOAD_OK;
	return resolve(w, w->me, lkey, laddr, len, access, ptr, NULL);
}

int dpa_hal_rdma_write(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		       uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	uint8_t *local;
	int32_t st;

	if (cq_full(hal))
		return DPA_HAL_EAGAIN;
	st = check_local(hal->w, laddr, lkey, len, OFFLOAD_ACCESS_LOCAL_READ, &local);
	if (!st)
		st = rail_gate(hal, peer);
	if (!st)
		st = do_write(hal->w, peer, local, raddr, rkey, len, 1);
	return push_cqe(hal, peer, wr_id, st, st ? 0 : len);
}

int dpa_hal_rdma_write_sg(struct dpa_hal *hal, uint32_t peer, const struct dpa_hal_sge *sge,
			  uint32_t nsge, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct fz_world *w = hal->w;
	uint8_t *local[DPA_HAL_MAX_SGE], *ptr;
	const struct fz_region *reg;
	uint64_t total = 0;
	int32_t st = OFFLOAD_OK;

	if (cq_full(hal))
		return DPA_HAL_EAGAIN;
	if (!nsge || nsge > DPA_HAL_MAX_SGE)
		return DPA_HAL_EINVAL;
	for (uint32_t i = 0; i < nsge && !st; i++) {
		st = check_local(w, sge[i].addr, lkey, sge[i].len, OFFLOAD_ACCESS_LOCAL_READ, &local[i]);
		if (__builtin_add_overflow(total, sge[i].len, &total))
			st = OFFLOAD_ERR_REMOTE_ACCESS;
	}
	if (!st)
		st = rail_gate(hal, peer);
	if (!st && total)
		st = resolve(w, peer, rkey, raddr, total, OFFLOAD_ACCESS_REMOTE_WRITE, &ptr, &reg);
	if (!st && total) {
		observe_write(w, reg, raddr, total, 1);
		for (uint32_t i = 0; i < nsge; ptr += sge[i].len, i++)
			if (sge[i].len)
				memmove(ptr, local[i], sge[i].len);
	}
	return push_cqe(hal, peer, wr_id, st, st ? 0 : total);
}

int dpa_hal_rdma_write_inline(struct dpa_hal *hal, uint32_t peer, const void *data,
			      uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	int32_t st;

	if (cq_full(hal))
		return DPA_HAL_EAGAIN;
	st = rail_gate(hal, peer);
	if (!st)
		st = do_write(hal->w, peer, data, raddr, rkey, len, 0);
	return push_cqe(hal, peer, wr_id, st, st ? 0 : len);
}

int dpa_hal_rdma_read(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		      uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	uint8_t *local, *ptr;
	int32_t st;

	if (cq_full(hal))
		return DPA_HAL_EAGAIN;
	st = check_local(hal->w, laddr, lkey, len, OFFLOAD_ACCESS_LOCAL_WRITE, &local);
	if (!st)
		st = rail_gate(hal, peer);
	if (!st && len)
		st = resolve(hal->w, peer, rkey, raddr, len, OFFLOAD_ACCESS_REMOTE_READ, &ptr, NULL);
	if (!st && len)
		memmove(local, ptr, len);
	return push_cqe(hal, peer, wr_id, st, st ? 0 : len);
}

int dpa_hal_rdma_signal_add(struct dpa_hal *hal, uint32_t peer, uint64_t raddr, uint32_t rkey,
			    uint64_t value, uint64_t wr_id)
{
	uint8_t *ptr = NULL;
	int32_t st;

	if (cq_full(hal))
		return DPA_HAL_EAGAIN;
	st = rail_gate(hal, peer);
	if (!st)
		st = resolve(hal->w, peer, rkey, raddr, sizeof(uint64_t), OFFLOAD_ACCESS_REMOTE_ATOMIC,
			     &ptr, NULL);
	if (!st && ((uintptr_t)ptr & 7))
		st = OFFLOAD_ERR_REMOTE_ACCESS;  /* atomics need an aligned word, as in the emulator */
	if (!st)
		__atomic_fetch_add((uint64_t *)(void *)ptr, value, __ATOMIC_ACQ_REL);
	return push_cqe(hal, peer, wr_id, st, 0);
}

uint32_t dpa_hal_num_rails(const struct dpa_hal *hal)
{
	return hal->w->num_rails;
}

/* Multicast: chunks leave (and complete) but no fake peer receives them; the firmware's
 * refetch path then reads everything through the checked RDMA READ below. */
uint32_t dpa_hal_mtu(const struct dpa_hal *hal)
{
	(void)hal;
	return 4096;
}

int dpa_hal_mcast_send(struct dpa_hal *hal, uint32_t group, uint64_t laddr, uint32_t lkey,
		       uint32_t len, uint32_t imm, uint64_t wr_id)
{
	uint8_t *local;
	int32_t st;

	(void)imm;
	if (group >= OFFLOAD_MAX_TEAMS || len > 4096)
		fz_fail("dpa_hal_mcast_send(group %u, len %u)", group, len);
	if (cq_full(hal))
		return DPA_HAL_EAGAIN;
	st = check_local(hal->w, laddr, lkey, len, OFFLOAD_ACCESS_LOCAL_READ, &local);
	return push_cqe(hal, hal->w->me, wr_id, st, st ? 0 : len);
}

int dpa_hal_mcast_post(struct dpa_hal *hal, uint32_t group, uint32_t seq8,
		       const struct dpa_hal_mcast_region *regions, uint32_t n)
{
	(void)seq8, (void)regions;
	if (group >= OFFLOAD_MAX_TEAMS || n > hal->w->size)
		fz_fail("dpa_hal_mcast_post(group %u, %u regions)", group, n);
	return 0;
}

int dpa_hal_mcast_poll(struct dpa_hal *hal, uint32_t group, struct dpa_hal_mcast_cqe *out,
		       int max)
{
	(void)hal, (void)out, (void)max;
	if (group >= OFFLOAD_MAX_TEAMS)
		fz_fail("dpa_hal_mcast_poll(group %u)", group);
	return 0;
}

void dpa_hal_mcast_leave(struct dpa_hal *hal, uint32_t group)
{
	(void)hal;
	if (group >= OFFLOAD_MAX_TEAMS)
		fz_fail("dpa_hal_mcast_leave(group %u)", group);
}

/* Chunks are placed by id here (no staging slots): the firmware never hands one back. */
uint32_t dpa_hal_mcast_slots(const struct dpa_hal *hal)
{
	(void)hal;
	return 0;
}

int dpa_hal_mcast_slot_copy(struct dpa_hal *hal, uint32_t group, uint32_t slot, uint64_t addr,
			    uint32_t key, uint32_t len, uint64_t wr_id)
{
	(void)hal, (void)addr, (void)key, (void)len, (void)wr_id;
	fz_fail("dpa_hal_mcast_slot_copy(group %u, slot %u) without slots", group, slot);
	return DPA_HAL_EINVAL;
}

int dpa_hal_mcast_slot_free(struct dpa_hal *hal, uint32_t group, uint32_t slot)
{
	(void)hal;
	fz_fail("dpa_hal_mcast_slot_free(group %u, slot %u) without slots", group, slot);
	return DPA_HAL_EINVAL;
}

void dpa_hal_set_rail(struct dpa_hal *hal, uint32_t peer, uint32_t rail)
{
	if (peer >= hal->w->size || peer >= FZ_MAX_WORLD || rail >= hal->w->num_rails)
		fz_fail("dpa_hal_set_rail(peer %u, rail %u) with %u ranks and %u rails", peer, rail,
			hal->w->size, hal->w->num_rails);
	hal->rail[peer] = (uint8_t)rail;
}

int dpa_hal_poll_cq(struct dpa_hal *hal, struct dpa_hal_cqe *out, int max)
{
	int n = 0;

	while (n < max && hal->cq.head != hal->cq.tail)
		out[n++] = hal->cq.cqe[hal->cq.head++ % FZ_HAL_CQ_MAX];
	hal->w->activity += (uint64_t)n;
	return n;
}

void dpa_hal_notify(struct dpa_hal *hal)
{
	hal->w->notifies++;
}

void dpa_hal_host_notify(struct dpa_hal *hal)
{
	hal->w->host_notifies++;
}

uint64_t dpa_hal_time_ns(struct dpa_hal *hal)
{
	/* A deterministic clock: every look advances it a microsecond. */
	hal->w->clock_ns += 1000;
	return hal->w->clock_ns;
}

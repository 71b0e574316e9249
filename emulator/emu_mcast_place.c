/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A member's emulated NIC delivering the multicast chunks it accepted (emu_mcast.c walks
 * the group's ring and decides which): placed by chunk id into a posted region, runs of
 * back-to-back by-reference chunks copied as one, or, staged (mcast_placement: staged, the
 * UD fallback), copied whole into a staging slot of its own that the firmware copies out
 * (dpa_hal_mcast_slot_copy) or gives back (dpa_hal_mcast_slot_free).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "offload_atomic.h"

uint32_t emu_mcast_stage_slots(const struct emu_device *dev)
{
	uint32_t n = dev->attr.mcast_rq_depth;

	return n < EMU_MCAST_STAGE_MAX ? n : EMU_MCAST_STAGE_MAX;
}

uint32_t dpa_hal_mcast_slots(const struct dpa_hal *hal)
{
	return hal->dev->attr.mcast_staged ? emu_mcast_stage_slots(hal->dev) : 0;
}

static int stage_busy(const struct emu_mcast_rx *rx, uint32_t slot)
{
	return (rx->stage_busy[slot / 64] >> (slot % 64)) & 1;
}

static void stage_set(struct emu_mcast_rx *rx, uint32_t slot, int busy)
{
	uint64_t bit = 1ull << (slot % 64);

	rx->stage_busy[slot / 64] = busy ? rx->stage_busy[slot / 64] | bit :
					   rx->stage_busy[slot / 64] & ~bit;
}

/* A free staging slot, now busy; UINT32_MAX if every one holds a chunk. */
static uint32_t stage_take(const struct emu_device *dev, struct emu_mcast_rx *rx)
{
	uint32_t n = emu_mcast_stage_slots(dev);

	for (uint32_t k = 0; k < n; k++) {
		uint32_t slot = (rx->stage_next + k) % n;

		if (!stage_busy(rx, slot)) {
			stage_set(rx, slot, 1);
			rx->stage_next = (slot + 1) % n;
			return slot;
		}
	}
	return UINT32_MAX;
}

void emu_mcast_lock_rx(struct emu_mcast_rx *rx)
{
	while (!off_trylock(&rx->lock))
		sched_yield();  /* a poll of this group is placing chunks: brief */
}

/* The slot, if it is the firmware's to hand back; NULL otherwise (the lock is then free). */
static struct emu_mcast_rx *slot_owner(struct dpa_hal *hal, uint32_t group, uint32_t slot)
{
	struct emu_device *dev = hal->dev;
	struct emu_mcast_rx *rx;

	if (group >= OFFLOAD_MAX_TEAMS || !dev->attr.mcast_staged || slot >= emu_mcast_stage_slots(dev))
		return NULL;
	rx = &dev->mc_rx[group];
	emu_mcast_lock_rx(rx);
	if (rx->stage && stage_busy(rx, slot))
		return rx;
	off_unlock(&rx->lock);
	return NULL;
}

int dpa_hal_mcast_slot_copy(struct dpa_hal *hal, uint32_t group, uint32_t slot, uint64_t addr,
			    uint32_t key, uint32_t len, uint64_t wr_id)
{
	struct emu_device *dev = hal->dev;
	struct emu_mcast_rx *rx;
	struct emu_map *held;
	uint8_t *ptr = NULL;
	int32_t pid, st = OFFLOAD_OK;

	if (emu_cq_full(hal))
		return DPA_HAL_EAGAIN;
	rx = slot_owner(hal, group, slot);
	if (!rx)
		return -EINVAL;
	if (len > rx->stage_len[slot]) {  /* only what arrived: never the slot's stale bytes */
		off_unlock(&rx->lock);
		return -EINVAL;
	}
	/* Into our own registered memory, as the DPA's copy out of its slot would go. */
	if (len)
		st = emu_mr_resolve(dev, dev->attr.rank, key, addr, len, OFFLOAD_ACCESS_LOCAL_WRITE,
				    &ptr, &pid, &held);
	if (!st && len && !ptr)
		st = OFFLOAD_ERR_REMOTE_ACCESS;
	if (!st && len)
		memmove(ptr, rx->stage + (uint64_t)slot * dev->attr.mtu, len);
	stage_set(rx, slot, 0);
	off_unlock(&rx->lock);
	return emu_push_cqe(hal, wr_id, st, st ? 0 : len, 0);
}

int dpa_hal_mcast_slot_free(struct dpa_hal *hal, uint32_t group, uint32_t slot)
{
	struct emu_mcast_rx *rx = slot_owner(hal, group, slot);

	if (!rx)
		return -EINVAL;
	stage_set(rx, slot, 0);
	off_unlock(&rx->lock);
	return 0;
}


/* Where a chunk lands: its posted region (seq8 and chunk id), checked against our
 * registration. NULL: no posted region takes it. */
static uint8_t *place(struct emu_device *dev, const struct emu_mcast_rx *rx, uint32_t imm,
		      uint32_t len)
{
	uint64_t mtu = dev->attr.mtu, id = imm & 0xffffffu;
	struct emu_map *held;
	uint8_t *ptr;
	int32_t pid;

	if (imm >> 24 != rx->seq8)
		return NULL;
	for (uint32_t i = 0; i < rx->nregions; i++) {
		const struct dpa_hal_mcast_region *r = &rx->regions[i];
		uint64_t nchunks = r->len / mtu + (r->len % mtu != 0), off;

		if (id < r->first_chunk || id - r->first_chunk >= nchunks)
			continue;
		off = (id - r->first_chunk) * mtu;
		if (off + len > r->len)
			return NULL;  /* the chunk is longer than the region's last piece */
		if (!len)
			return (uint8_t *)(uintptr_t)(r->addr + off);
		if (emu_mr_resolve(dev, dev->attr.rank, r->key, r->addr + off, len,
				   OFFLOAD_ACCESS_LOCAL_WRITE, &ptr, &pid, &held) != OFFLOAD_OK || !ptr)
			return NULL;
		return ptr;
	}
	return NULL;
}

/* Copy the run and keep the completions of the slots not rewritten meanwhile; returns the
 * output's new length (the run's entries are its tail). */
int emu_mcast_flush_run(struct emu_device *dev, uint32_t group, struct emu_mcast_run *run,
			struct dpa_hal_mcast_cqe *out, int n)
{
	int first = n - (int)run->count, kept = first;
	struct emu_map *held;
	uint8_t *src;
	int32_t pid;
	int ok;

	if (!run->count)
		return n;
	/* A source deregistered (or its owner gone) drops the run: read again if wanted. */
	ok = emu_mr_resolve(dev, run->sender, run->key, run->src_addr, run->len,
			    OFFLOAD_ACCESS_REMOTE_READ, &src, &pid, &held) == OFFLOAD_OK && src;
	if (ok) {
		memmove(run->dst, src, run->len);
		emu_map_release(held);
	}
	/* Seqlock reader: a slot rewritten while we copied was not ours to deliver. Only a
	 * reader the credits did not count can be overtaken; its copy is refetched anyway. */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	for (uint32_t k = 0; k < run->count; k++)
		if (ok && off_read_once(&emu_mcast_slot_of(dev, group, run->index[k])->gen) == run->index[k] + 1)
			out[kept++] = out[first + (int)k];
	run->count = 0;
	return kept;
}

/* Staged receive: ring slot i's chunk, whatever its immediate, whole into a free staging
 * slot, which its completion names (out[*n] and ++*n); 0 if it was dropped. */
static int deliver_staged(struct emu_device *dev, uint32_t group, struct emu_mcast_rx *rx,
			  uint64_t i, uint64_t gen, struct dpa_hal_mcast_cqe *out, int *n)
{
	const struct emu_mcast_slot *s = emu_mcast_slot_of(dev, group, i);
	uint32_t imm = off_read_once(&s->imm), len = off_read_once(&s->len);
	uint32_t key = off_read_once(&s->src_key), slot;
	const uint8_t *src = emu_mcast_payload_of(dev, group, i);
	struct emu_map *held = NULL;
	uint8_t *ptr;
	int32_t pid;

	if (!rx->nregions || len > dev->attr.mtu)
		return 0;  /* not armed: no receive is posted */
	if (len && key) {  /* by reference: from the sender's buffer */
		if (emu_mr_resolve(dev, off_read_once(&s->sender), key, off_read_once(&s->src_addr),
				   len, OFFLOAD_ACCESS_REMOTE_READ, &ptr, &pid, &held) != OFFLOAD_OK ||
		    !ptr)
			return 0;
		src = ptr;
	}
	slot = stage_take(dev, rx);
	if (slot != UINT32_MAX && len)
		memmove(rx->stage + (uint64_t)slot * dev->attr.mtu, src, len);
	emu_map_release(held);
	if (slot == UINT32_MAX)
		return 0;  /* every slot holds a chunk: the receive queue overran */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);  /* seqlock reader, as in emu_mcast_flush_run() */
	if (off_read_once(&s->gen) != gen) {
		stage_set(rx, slot, 0);
		return 0;
	}
	rx->stage_len[slot] = len;
	out[(*n)++] = (struct dpa_hal_mcast_cqe){ .imm = imm, .len = len, .slot = slot };
	return 1;
}

/* Place slot i's chunk: out[*n] and ++*n, 1; or 0 if it was dropped. A by-reference chunk
 * may join the pending run (its completion is then kept only if the run's copy holds); any
 * other chunk is copied now, after the run. */
int emu_mcast_deliver(struct emu_device *dev, uint32_t group, struct emu_mcast_rx *rx,
		      uint64_t i, struct emu_mcast_run *run, struct dpa_hal_mcast_cqe *out, int *n)
{
	struct emu_mcast_slot *s = emu_mcast_slot_of(dev, group, i);
	uint64_t gen = off_load_acquire(&s->gen);  /* pairs with the sender's publish */
	uint32_t imm, len, key, sender;
	uint64_t src_addr;
	uint8_t *dst;

	if (gen != i + 1)
		return 0;
	if (dev->attr.mcast_staged)
		return deliver_staged(dev, group, rx, i, gen, out, n);
	imm = off_read_once(&s->imm);
	len = off_read_once(&s->len);
	key = off_read_once(&s->src_key);
	sender = off_read_once(&s->sender);
	src_addr = off_read_once(&s->src_addr);
	dst = len <= dev->attr.mtu ? place(dev, rx, imm, len) : NULL;
	if (!dst)
		return 0;
	if (len && key) {
		if (run->count && (run->count == EMU_MCAST_RUN_MAX || run->sender != sender ||
				   run->key != key || run->dst + run->len != dst ||
				   run->src_addr + run->len != src_addr))
			*n = emu_mcast_flush_run(dev, group, run, out, *n);
		if (!run->count) {  /* field by field: index[] is filled as the run grows */
			run->dst = dst;
			run->src_addr = src_addr;
			run->len = 0;
			run->sender = sender;
			run->key = key;
		}
		run->index[run->count++] = i;
		run->len += len;
		out[(*n)++] = (struct dpa_hal_mcast_cqe){ .imm = imm, .len = len };
		return 1;
	}
	*n = emu_mcast_flush_run(dev, group, run, out, *n);
	/* Cached copies, in and out of the ring (memmove: a forged region may overlap it):
	 * MTU-sized chunks from a ring that stays in cache ran slower with streaming stores,
	 * whose fence each chunk pays (bench broadcast/allgather, 1M and 16M). */
	if (len)
		memmove(dst, emu_mcast_payload_of(dev, group, i), len);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (off_read_once(&s->gen) != gen)
		return 0;
	out[(*n)++] = (struct dpa_hal_mcast_cqe){ .imm = imm, .len = len };
	return 1;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * UD multicast on an ordinary host: each group (one per team id) is a ring of MTU-sized
 * slots in the job segment. A send copies its chunk once into the next slot, whatever the
 * group's size; each member's emulated NIC (dpa_hal_mcast_poll) walks the ring from its
 * cursor, and places a chunk with one copy at its offset in a posted region, or drops it.
 *
 * A chunk whose source peers can map (ctx.empty() memory, the job segment) goes into the
 * slot by reference: each member's NIC copies it straight from the sender's buffer, so a
 * byte costs n-1 copies for n-1 receivers, as replication in a switch costs the hosts
 * nothing. Private memory is copied into the ring once. The sender's send completion then
 * comes before the members read, which the HAL allows (dpa_hal.h): the firmware keeps a
 * multicast source unchanged until every receiver acknowledged it, or withdrew it when its
 * op aborted; a receiver checks for that after its last read and fails (mcast.c). A
 * by-reference chunk whose sender is gone (dead, or the buffer deregistered) is dropped
 * as a lost one would be; the receiver's refetch then fails naming the sender.
 *
 * Ring protocol (indices are free-running 64-bit counters, masked on access):
 *  - a sender claims index i by CAS on head, only when every counted member's cursor is
 *    past i - slots (receive credits; otherwise DPA_HAL_EAGAIN and nothing is claimed) and
 *    the slot's previous sender published (two senders never fill one slot);
 *  - the slot is a seqlock: gen = WRITING, header and payload, then gen = i + 1 (release);
 *    a reader copies, then checks gen again, so a slot rewritten under a reader the
 *    credits did not count is dropped, never delivered torn;
 *  - a member publishes its cursor (release) after its reads: the sender's acquire of the
 *    cursor orders those reads before its overwrite;
 *  - a reader passes a slot whose sender is still writing it and consumes the published
 *    ones behind it (a bitmap marks them): one stalled sender delays only its own chunk,
 *    as on a fabric; the cursor stops at the first slot not consumed.
 * Counted members: the other ranks that joined the group (first post or poll) and are
 * alive and not failed, and the sender itself while it has regions posted: a rank that
 * sends and receives (all-gather) must not overwrite what its own NIC has not read yet,
 * while a sender that receives nothing (a broadcast root, which may not poll) must not
 * block on its own cursor. A member only receives chunks claimed after it joined.
 *
 * Staged receive (mcast_placement: staged), the UD fallback: a member's NIC does not place
 * by chunk id; while the group is armed it copies each chunk whole into a free staging slot
 * of its own (process memory) and hands the slot to the firmware, which copies it out
 * (dpa_hal_mcast_slot_copy) or drops it. No free slot: the chunk is dropped.
 *
 * Receive-side faults, as one member's NIC sees them, in this order: a ring lap missed
 * (overwritten), chunks lost by the fabric (loss_ppm, a hash of seed, rank, group and slot
 * index, so a run reproduces), the receive queue overrun (more than mcast_rq_depth
 * chunks arrived and unconsumed: the oldest beyond the depth are dropped), reordering
 * (reorder_ppm: a chunk is held back and delivered right after the next delivered chunk,
 * or at the latest at the end of the next poll), and matching against the posted regions.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "offload_atomic.h"

#define EMU_PPM          1000000u
#define EMU_SALT_LOSS    0x6c6f73735f6d6331ull
#define EMU_SALT_REORDER 0x72656f72645f6d31ull

static void bit_set(uint64_t *bits, uint32_t r)
{
	__atomic_fetch_or(&bits[r / 64], 1ull << (r % 64), __ATOMIC_SEQ_CST);
}

static void bit_clear(uint64_t *bits, uint32_t r)
{
	__atomic_fetch_and(&bits[r / 64], ~(1ull << (r % 64)), __ATOMIC_SEQ_CST);
}

static int any_set(const struct emu_device *dev, const uint64_t *bits)
{
	for (uint32_t w = 0; w < offload_rank_words(dev->attr.size); w++)
		if (off_read_once(&bits[w]))
			return 1;
	return 0;
}

uint32_t emu_mcast_slots(uint32_t mtu)
{
	uint32_t n = mtu ? EMU_MCAST_RING_BYTES / mtu : EMU_MCAST_MAX_SLOTS;

	if (n < EMU_MCAST_MIN_SLOTS)
		return EMU_MCAST_MIN_SLOTS;
	return n > EMU_MCAST_MAX_SLOTS ? EMU_MCAST_MAX_SLOTS : n;
}

void emu_mcast_forget(struct emu_device *dev)
{
	for (uint32_t g = 0; g < OFFLOAD_MAX_TEAMS; g++)
		bit_clear(emu_mc_bits(dev, g, EMU_MC_JOINED), dev->attr.rank);
}

uint32_t dpa_hal_mtu(const struct dpa_hal *hal)
{
	return hal->dev->attr.mtu;
}

/* splitmix64's finalizer: fault decisions must be reproducible, not random. */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static int inject(const struct emu_device *dev, uint32_t group, uint64_t i, uint64_t salt,
		  uint32_t ppm)
{
	uint64_t x;

	if (!ppm)
		return 0;
	x = mix(mix(mix(mix(dev->attr.mcast_seed ^ salt) ^ dev->attr.rank) ^ group) ^ i);
	return x % EMU_PPM < ppm;
}

/* Word w of the ranks the fabric or the process watch declared gone: they hold no
 * credits. */
static uint64_t failed_word(const struct emu_device *dev, const uint64_t *ring_failed, uint32_t w)
{
	uint64_t failed = off_read_once(&dev->unreachable[w]);

	if (ring_failed)
		failed |= off_read_once(&ring_failed[w]);
	return failed;
}

/* Our cursor only moves forward: our sender threads may move it past our own chunks. The
 * release orders our reads of the slots before a sender's reuse of them. */
static void publish_cursor(struct emu_mcast_member *m, uint64_t to)
{
	uint64_t cur = off_read_once(&m->cursor);

	while (cur < to && !__atomic_compare_exchange_n(&m->cursor, &cur, to, 0, __ATOMIC_RELEASE,
							 __ATOMIC_RELAXED))
		;
}

/* Wake the ranks of word w (bits of ranks w * 64 on) but `skip`. */
static void wake_word(struct emu_device *dev, uint32_t w, uint64_t mask, uint32_t skip)
{
	for (; mask; mask &= mask - 1) {
		uint32_t r = w * 64 + (uint32_t)__builtin_ctzll(mask);

		if (r < dev->attr.size && r != skip)
			emu_wake_rank(dev, r, NULL);
	}
}

/* Wake every rank of a group bitmap but `skip`; take = 1 clears the bitmap as it goes
 * (the ranks are woken once: a waiter sets its bit again before it looks again). */
static void wake_set(struct emu_device *dev, uint64_t *bits, int take, uint32_t skip)
{
	for (uint32_t w = 0; w < offload_rank_words(dev->attr.size); w++) {
		uint64_t m = off_read_once(&bits[w]);

		if (m && take)
			m = __atomic_exchange_n(&bits[w], 0, __ATOMIC_SEQ_CST);
		else if (m)
			m = off_load_acquire(&bits[w]);
		wake_word(dev, w, m, skip);
	}
}

/* Senders that found no credit: wake them (their firmware may park on EAGAIN). Called
 * after a fence that follows the store which freed or filled a slot. */
static void wake_blocked(struct emu_device *dev, uint32_t group)
{
	wake_set(dev, emu_mc_bits(dev, group, EMU_MC_BLOCKED), 1, UINT32_MAX);
}

static void join(struct emu_device *dev, uint32_t group, struct emu_mcast_rx *rx)
{
	struct emu_mcast_group *g = emu_mc_group(dev, group);
	struct emu_mcast_member *m = emu_mc_member(dev, group, dev->attr.rank);
	uint64_t head, cur;

	bit_set(emu_mc_bits(dev, group, EMU_MC_JOINED), dev->attr.rank);
	/* Pairs with the fence in credit_limit(): a sender that does not count us yet claims
	 * below the head it saw + slots, and we start at a head at least that far, so nothing
	 * we read can be reused under us. As on a fabric, we get what was sent after we joined. */
	off_fence();
	head = off_load_acquire(&g->head);
	cur = off_read_once(&m->cursor);
	rx->next = head > cur ? head : cur;
	publish_cursor(m, rx->next);
	rx->joined = 1;
}

/* One past the last index a sender may claim now: the slowest counted member's cursor
 * plus the ring, and never more than head + ring (see join()). */
static uint64_t credit_limit(struct emu_device *dev, uint32_t group, uint64_t head)
{
	const uint64_t *joined = emu_mc_bits(dev, group, EMU_MC_JOINED);
	const uint64_t *ring_failed = emu_ring_failed(dev);
	uint64_t nslots = dev->mc_nslots, limit = head + nslots;
	uint32_t me = dev->attr.rank;

	off_fence();  /* pairs with join() and with the fence after a poll's cursor store */
	for (uint32_t w = 0; w < offload_rank_words(dev->attr.size); w++) {
		uint64_t mask = off_load_acquire(&joined[w]) & ~failed_word(dev, ring_failed, w);

		if (w == me / 64) {
			mask &= ~(1ull << (me % 64));
			if (off_read_once(&dev->mc_rx[group].posted))
				mask |= 1ull << (me % 64);
		}
		for (; mask; mask &= mask - 1) {
			uint32_t r = w * 64 + (uint32_t)__builtin_ctzll(mask);
			uint64_t cur;

			if (r >= dev->attr.size ||
			    off_load_acquire(&dev->ranks[r].state) != EMU_RANK_ALIVE)
				continue;
			/* pairs with publish_cursor() */
			cur = off_load_acquire(&emu_mc_member(dev, group, r)->cursor);
			if (cur + nslots < limit)
				limit = cur + nslots;
		}
	}
	return limit;
}

/*
 * Claim the next index, or DPA_HAL_EAGAIN having claimed nothing. The credit limit is
 * cached per rank and group (cursors only grow, so an old limit is still safe) and only
 * recomputed when head reaches it: the sender's cost does not grow with the group.
 */
static int claim_slot(struct emu_device *dev, uint32_t group, uint64_t *index)
{
	struct emu_mcast_group *g = emu_mc_group(dev, group);
	struct emu_mcast_rx *rx = &dev->mc_rx[group];
	uint64_t nslots = dev->mc_nslots, head = off_load_acquire(&g->head);

	for (;;) {
		/* Acquire/release: the limit carries the members' cursor releases (their reads
		 * of the slots) from the thread that scanned them to this one. */
		uint64_t limit = off_load_acquire(&rx->limit), prev;

		if (head >= limit) {
			limit = credit_limit(dev, group, head);
			if (head >= limit) {
				/* Announce ourselves, then look again: either we see the credit a
				 * poll just freed, or that poll sees our bit and wakes us. */
				bit_set(emu_mc_bits(dev, group, EMU_MC_BLOCKED), dev->attr.rank);
				limit = credit_limit(dev, group, head);
				if (head >= limit)
					return DPA_HAL_EAGAIN;
			}
			off_store_release(&rx->limit, limit);
		}
		/* The slot's previous sender must have published (acquire: its writes come
		 * before ours). A sender that claimed this index first makes this fail too:
		 * retry at the new head; only one stalled mid-copy is worth an EAGAIN. */
		prev = head >= nslots ? head - nslots + 1 : 0;
		if (off_load_acquire(&emu_mcast_slot_of(dev, group, head)->gen) != prev) {
			uint64_t now = off_load_acquire(&g->head);

			if (now != head) {
				head = now;
				continue;
			}
			bit_set(emu_mc_bits(dev, group, EMU_MC_BLOCKED_SLOT), dev->attr.rank);
			return DPA_HAL_EAGAIN;
		}
		if (__atomic_compare_exchange_n(&g->head, &head, head + 1, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			*index = head;
			return 0;
		}
	}
}

/* Multicast leaves on our first port that is up (a bonded port fails over by itself). */
static int32_t pick_rail(const struct emu_device *dev, uint32_t *rail)
{
	uint32_t down = off_load_acquire(&dev->ranks[dev->attr.rank].rails_down);

	for (uint32_t r = 0; r < dev->attr.rails; r++) {
		if (!(down & (1u << r))) {
			*rail = r;
			return OFFLOAD_OK;
		}
	}
	*rail = 0;
	return OFFLOAD_ERR_LINK_DOWN;
}

/* Whether peers can map our registration `key` (and so read a chunk from it in place). */
static int mappable(const struct emu_device *dev, uint32_t key)
{
	const struct emu_mr *mr = &dev->mrs[(uint64_t)dev->attr.rank * EMU_MAX_MRS +
					    (key & (EMU_MAX_MRS - 1))];
	uint32_t kind;

	if (off_load_acquire(&mr->key) != key)  /* the owner writes key last */
		return 0;
	kind = off_read_once(&mr->kind);
	return kind == EMU_MR_SHARED || kind == EMU_MR_JOB;
}

int dpa_hal_mcast_send(struct dpa_hal *hal, uint32_t group, uint64_t laddr, uint32_t lkey,
		       uint32_t len, uint32_t imm, uint64_t wr_id)
{
	struct emu_device *dev = hal->dev;
	uint32_t me = dev->attr.rank, rail = 0;
	struct emu_mcast_slot *s;
	struct emu_map *held;
	uint64_t index, cur;
	uint8_t *ptr;
	int32_t pid, st = OFFLOAD_OK;

	if (group >= OFFLOAD_MAX_TEAMS || len > dev->attr.mtu)
		return -EINVAL;
	if (emu_cq_full(hal))
		return DPA_HAL_EAGAIN;
	/* Our own memory: never a peer mapping, nothing to release. */
	if (len)
		st = emu_mr_resolve(dev, me, lkey, laddr, len, OFFLOAD_ACCESS_LOCAL_READ, &ptr, &pid,
				    &held);
	if (!st)
		st = pick_rail(dev, &rail);
	if (st)
		return emu_push_cqe(hal, wr_id, st, 0, rail);
	if (claim_slot(dev, group, &index))
		return DPA_HAL_EAGAIN;
	s = emu_mcast_slot_of(dev, group, index);
	/* Seqlock writer: mark the slot before touching it (a reader the credits did not
	 * count may still be copying the previous chunk), publish it once whole. */
	off_write_once(&s->gen, EMU_MCAST_WRITING);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	off_write_once(&s->sender, me);
	off_write_once(&s->imm, imm);
	off_write_once(&s->len, len);
	off_write_once(&s->src_key, len && mappable(dev, lkey) ? lkey : 0u);
	off_write_once(&s->src_addr, laddr);
	if (len && !s->src_key)
		memmove(emu_mcast_payload_of(dev, group, index), (const void *)(uintptr_t)laddr, len);
	off_store_release(&s->gen, index + 1);
	/* Loopback is off: our NIC never receives our chunks. If it had consumed everything
	 * before this one, it consumes this one now, so a sender that does not poll holds no
	 * credits and is not counted as dropping its own chunks. */
	cur = index;
	__atomic_compare_exchange_n(&emu_mc_member(dev, group, me)->cursor, &cur, index + 1, 0,
				    __ATOMIC_RELEASE,
				    __ATOMIC_RELAXED);
	/* Pairs with join(): a member that joined before this fence is woken; one that joins
	 * after it starts at a head past this chunk. Receive events are moderated, as a CQ's
	 * event moderation does (ibv_modify_cq cq_count): a parked member is woken once per
	 * EMU_MCAST_EVENT_EVERY chunks and then drains them in one pass instead of paying a
	 * futex wake-up per chunk. The firmware's "sent all" (an inline write, which wakes)
	 * ends every train. */
	off_fence();
	if (!(index % EMU_MCAST_EVENT_EVERY))
		wake_set(dev, emu_mc_bits(dev, group, EMU_MC_JOINED), 0, me);
	/* Only senders that waited for this very slot to be published; credit waiters are
	 * the receivers' to wake (waking them per send would make them spin). */
	wake_set(dev, emu_mc_bits(dev, group, EMU_MC_BLOCKED_SLOT), 1, UINT32_MAX);
	return emu_push_cqe(hal, wr_id, OFFLOAD_OK, len, rail);
}

void dpa_hal_mcast_leave(struct dpa_hal *hal, uint32_t group)
{
	struct emu_device *dev = hal->dev;
	struct emu_mcast_rx *rx;

	if (group >= OFFLOAD_MAX_TEAMS)
		return;
	rx = &dev->mc_rx[group];
	emu_mcast_lock_rx(rx);
	/* Senders stop counting our cursor; a later join starts at the head again. */
	bit_clear(emu_mc_bits(dev, group, EMU_MC_JOINED), dev->attr.rank);
	rx->joined = 0;
	rx->nregions = 0;
	off_write_once(&rx->posted, 0);
	rx->hold = 0;
	rx->limit = 0;
	memset(rx->done, 0, sizeof(rx->done));
	memset(rx->stage_busy, 0, sizeof(rx->stage_busy));
	rx->stage_next = 0;
	off_unlock(&rx->lock);
}

int dpa_hal_mcast_post(struct dpa_hal *hal, uint32_t group, uint32_t seq8,
		       const struct dpa_hal_mcast_region *regions, uint32_t n)
{
	struct emu_device *dev = hal->dev;
	struct emu_mcast_rx *rx;
	struct emu_map *held;
	uint8_t *ptr;
	int32_t pid;

	if (group >= OFFLOAD_MAX_TEAMS || n > dev->attr.size || (n && !regions))
		return -EINVAL;
	/* Checked now, as posting a receive checks its lkey; placement checks again, as a
	 * registration may be revoked while posted. */
	for (uint32_t i = 0; i < n; i++)
		if (regions[i].len &&
		    emu_mr_resolve(dev, dev->attr.rank, regions[i].key, regions[i].addr,
				   regions[i].len, OFFLOAD_ACCESS_LOCAL_WRITE, &ptr, &pid, &held))
			return -EINVAL;
	rx = &dev->mc_rx[group];
	emu_mcast_lock_rx(rx);
	if (n && dev->attr.mcast_staged && !rx->stage) {
		rx->stage = malloc((uint64_t)emu_mcast_stage_slots(dev) * dev->attr.mtu);
		if (!rx->stage) {
			off_unlock(&rx->lock);
			return -ENOMEM;
		}
	}
	if (!rx->joined)
		join(dev, group, rx);
	if (n)
		memcpy(rx->regions, regions, n * sizeof(*regions));
	rx->nregions = n;
	rx->seq8 = seq8 & 0xffu;
	off_write_once(&rx->posted, n > 0);
	off_unlock(&rx->lock);
	return 0;
}

static int done_test(const struct emu_device *dev, const struct emu_mcast_rx *rx, uint64_t i)
{
	uint64_t b = i & (dev->mc_nslots - 1);

	return (rx->done[b / 64] >> (b % 64)) & 1;
}

static void done_set(const struct emu_device *dev, struct emu_mcast_rx *rx, uint64_t i, int on)
{
	uint64_t b = i & (dev->mc_nslots - 1), bit = 1ull << (b % 64);

	rx->done[b / 64] = on ? rx->done[b / 64] | bit : rx->done[b / 64] & ~bit;
}

/* Move our first unconsumed index to `to`; the count of slots in between that we had not
 * consumed (they were reused under us). */
static uint64_t skip_to(const struct emu_device *dev, struct emu_mcast_rx *rx, uint64_t to)
{
	uint64_t missed = 0;

	for (; rx->next < to; rx->next++) {
		missed += !done_test(dev, rx, rx->next);
		done_set(dev, rx, rx->next, 0);
	}
	return missed;
}

/* Chunks that arrived at our receive queue and wait in [from, to): published, from a
 * peer, not lost on the way, not consumed yet. */
static uint64_t queued(const struct emu_device *dev, const struct emu_mcast_rx *rx,
		       uint32_t group, uint64_t from, uint64_t to)
{
	uint64_t q = 0;

	for (uint64_t i = from; i < to; i++) {
		const struct emu_mcast_slot *s = emu_mcast_slot_of(dev, group, i);

		if (done_test(dev, rx, i) || off_load_acquire(&s->gen) != i + 1)
			continue;
		if (off_read_once(&s->sender) != dev->attr.rank &&
		    !inject(dev, group, i, EMU_SALT_LOSS, off_read_once(&dev->attr.mcast_loss_ppm)))
			q++;
	}
	return q;
}

/* A slot not holding index i: still being filled (come back later) or already reused. */
static int overtaken(const struct emu_device *dev, const struct emu_mcast_group *g, uint64_t i,
		     uint64_t gen)
{
	if (gen == EMU_MCAST_WRITING)
		return off_load_acquire(&g->head) - i > dev->mc_nslots;
	return gen > i + 1;
}

/* What this NIC does with published slot i: emu_mcast_deliver() it (1 if it was), or drop
 * or hold it (0). */
static int consume(struct emu_device *dev, uint32_t group, struct emu_mcast_rx *rx, uint64_t i,
		   uint64_t *excess, struct emu_mcast_run *run, struct dpa_hal_mcast_cqe *out,
		   int *n)
{
	if (off_read_once(&emu_mcast_slot_of(dev, group, i)->sender) == dev->attr.rank)
		return 0;
	if (inject(dev, group, i, EMU_SALT_LOSS, off_read_once(&dev->attr.mcast_loss_ppm)))
		return 0;
	if (*excess) {
		--*excess;
		return 0;
	}
	if (!rx->hold &&
	    inject(dev, group, i, EMU_SALT_REORDER, off_read_once(&dev->attr.mcast_reorder_ppm))) {
		rx->hold = i + 1;  /* its slot stays ours: the cursor stops before it */
		return 0;
	}
	return emu_mcast_deliver(dev, group, rx, i, run, out, n);
}

static int poll_ring(struct emu_device *dev, uint32_t group, struct emu_mcast_rx *rx,
		     struct dpa_hal_mcast_cqe *out, int max)
{
	struct emu_mcast_group *g = emu_mc_group(dev, group);
	struct emu_mcast_member *m = emu_mc_member(dev, group, dev->attr.rank);
	uint64_t nslots = dev->mc_nslots, depth = dev->attr.mcast_rq_depth;
	uint64_t held_before = rx->hold, cur = off_read_once(&m->cursor), head, excess = 0, cursor;
	struct emu_mcast_run run = { .count = 0 };
	int n = 0;

	skip_to(dev, rx, cur);  /* our senders consumed our own chunks (nothing to count) */
	head = off_load_acquire(&g->head);
	if (head - rx->next > nslots)  /* a lap behind (we were not counted): slots reused */
		skip_to(dev, rx, head - nslots);
	if (head - rx->next > depth) {
		uint64_t q = queued(dev, rx, group, rx->next, head);

		excess = q > depth ? q - depth : 0;
	}
	for (uint64_t i = rx->next; i < head && n < max; i++) {
		uint64_t gen;

		if (done_test(dev, rx, i))
			continue;
		gen = off_load_acquire(&emu_mcast_slot_of(dev, group, i)->gen);
		if (gen != i + 1) {
			if (!overtaken(dev, g, i, gen))
				continue;  /* its sender is still writing it: a later poll */
		} else if (consume(dev, group, rx, i, &excess, &run, out, &n) && n < max &&
			   rx->hold && rx->hold != i + 1) {
			/* the held chunk comes right after the one that overtook it */
			emu_mcast_deliver(dev, group, rx, rx->hold - 1, &run, out, &n);
			rx->hold = 0;
		}
		done_set(dev, rx, i, 1);
	}
	/* Nothing overtook a chunk held since the last poll: it is late, not lost. */
	if (rx->hold && rx->hold == held_before && n < max) {
		emu_mcast_deliver(dev, group, rx, rx->hold - 1, &run, out, &n);
		rx->hold = 0;
	}
	n = emu_mcast_flush_run(dev, group, &run, out, n);  /* before our cursor lets the slots go */
	while (rx->next < head && done_test(dev, rx, rx->next))
		done_set(dev, rx, rx->next++, 0);
	cursor = rx->hold && rx->hold - 1 < rx->next ? rx->hold - 1 : rx->next;
	publish_cursor(m, cursor);
	off_fence();  /* pairs with claim_slot(): a blocked sender sees our cursor or is woken */
	/* Wake a blocked sender only when there is credit for it now: a member that is not
	 * the slowest frees none, and waking for it makes senders spin (wake, EAGAIN, park).
	 * Credit returns are moderated too: at most once per half ring of our own progress. */
	if (any_set(dev, emu_mc_bits(dev, group, EMU_MC_BLOCKED)) && head - cursor <= nslots / 2) {
		uint64_t now = off_load_acquire(&g->head);

		if (credit_limit(dev, group, now) > now)
			wake_blocked(dev, group);
	}
	return n;
}

int dpa_hal_mcast_poll(struct dpa_hal *hal, uint32_t group, struct dpa_hal_mcast_cqe *out,
		       int max)
{
	struct emu_device *dev = hal->dev;
	struct emu_mcast_rx *rx;
	int n;

	if (group >= OFFLOAD_MAX_TEAMS)
		return -EINVAL;
	if (max <= 0)
		return 0;
	rx = &dev->mc_rx[group];
	if (!off_trylock(&rx->lock))
		return 0;  /* a post is replacing the regions: the next pass finds the new ones */
	if (!rx->joined)
		join(dev, group, rx);
	n = poll_ring(dev, group, rx, out, max);
	off_unlock(&rx->lock);
	return n;
}

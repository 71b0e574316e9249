/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The emulated wire: an RDMA write into another rank's private memory (numpy arrays, any
 * buffer that is not a ctx.empty() segment) goes in two copies through slots in the job
 * segment, as a shared-memory transport moves it, instead of one process_vm_writev: the
 * sender's thread copies each piece into a slot, and the target rank's threads copy it
 * into place in their own address space. process_vm_writev pins the target's pages one
 * by one; measured here (scripts/copy_cost.c), 1 MiB into 4 KiB pages took 78-126 us by
 * process_vm_writev against 20-25 us for each memcpy, and Open MPI's single copy
 * (process_vm_readv) pays what we paid. The target's share is its own CPU's, spent where
 * the data lands, as a NIC's placement costs the target host nothing but memory.
 *
 * Semantics kept from RC: a write's completion means it was placed (so the firmware's
 * signal after it finds the data there); writes on one QP land in order, so while a write
 * to a peer is on the wire, this thread's other work to that peer waits (DPA_HAL_EAGAIN,
 * as a full queue would). Only a rank's DPA thread 0 uses the wires (one producer per
 * wire, so a slot's status is read by the thread that filled it); with more threads per
 * rank the others write by process_vm_writev as before.
 *
 * The target re-resolves every piece against its own registration before it copies (the
 * buffer may have been deregistered since the sender looked), and answers with the
 * status the sender's completion carries. A piece nobody placed within EMU_WIRE_STALL_NS
 * (a target stopped, closing, dead) is taken back by its sender and written by
 * process_vm_writev (or fails with the peer's status): an op's abort, which waits for its
 * writes' completions, never waits on a peer that does not run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "emu_internal.h"
#include "offload_atomic.h"

uint32_t emu_wire_slots(uint32_t nranks)
{
	uint64_t pairs = (uint64_t)nranks * (nranks - 1), slots = EMU_WIRE_MAX_SLOTS;

	if (nranks < 2)
		return 0;
	while (slots >= 2 && pairs * slots * EMU_WIRE_SLOT_BYTES > EMU_WIRE_BUDGET)
		slots /= 2;
	return slots >= 2 ? (uint32_t)slots : 0;
}

static struct emu_wire *wire_of(const struct emu_device *dev, uint32_t from, uint32_t to)
{
	return &dev->wires[(uint64_t)from * dev->attr.size + to];
}

static uint8_t *slot_of(const struct emu_device *dev, uint32_t from, uint32_t to, uint64_t index)
{
	uint64_t wire = (uint64_t)from * dev->attr.size + to;

	return dev->wire_data + (wire * dev->wire_slots + index % dev->wire_slots) *
				EMU_WIRE_SLOT_BYTES;
}

/*
 * Only where every rank has a core: the target's thread then places a piece while it is
 * still in the caches the sender's copy left it in. Where the ranks share the cores a
 * piece waits for its target's turn, its slot is back in memory by then, and the second
 * copy's memory traffic costs more than the pinning it saves (1 MiB per peer all-to-all:
 * n=2 1.03-1.24x Open MPI's busbw against 0.61-0.76x by process_vm_writev; n=4 even,
 * n=8 0.81-0.84x against 0.89-1.16x; docs/performance.md).
 */
int emu_wire_takes(const struct dpa_hal *hal, uint32_t peer, uint64_t len)
{
	const struct emu_device *dev = hal->dev;
	uint64_t min = dev->attr.wire_min;

	return hal->wire_tx && min && len >= min && peer != dev->attr.rank &&
	       dev->attr.size <= dev->ncores && hal->nout < EMU_WIRE_OUTBOX;
}

int emu_wire_post(struct dpa_hal *hal, uint32_t peer, uint64_t src, uint64_t raddr,
		  uint32_t rkey, uint64_t len, uint64_t wr_id, uint32_t rail)
{
	struct emu_wire_send *s = &hal->outbox[hal->nout++];

	*s = (struct emu_wire_send){
		.src = src, .raddr = raddr, .len = len, .wr_id = wr_id, .peer = peer,
		.rkey = rkey, .rail = rail, .first = UINT64_MAX, .end = UINT64_MAX,
	};
	hal->wire_tx[peer].sending++;
	emu_wire_poll(hal);
	return 0;
}

/* process_vm_writev of `len` bytes from `from` to the peer's raddr; a status. */
static int32_t write_direct(struct emu_device *dev, uint32_t peer, uint32_t rkey,
			    const void *from, uint64_t raddr, uint64_t len)
{
	struct emu_map *held;
	uint8_t *ptr;
	int32_t pid, st;

	st = emu_mr_resolve(dev, peer, rkey, raddr, len, OFFLOAD_ACCESS_REMOTE_WRITE, &ptr, &pid,
			    &held);
	if (!st && !ptr) {
		struct iovec l = { (void *)(uintptr_t)from, len };
		struct iovec r = { (void *)(uintptr_t)raddr, len };

		if (process_vm_writev(pid, &l, 1, &r, 1, 0) != (ssize_t)len)
			st = errno == ESRCH ? emu_peer_lost(dev, peer) : OFFLOAD_ERR_REMOTE_ACCESS;
	}
	emu_map_release(held);
	return st;
}

/* What of s has not gone out goes straight to the target, as without the wire. */
static void send_direct(struct dpa_hal *hal, struct emu_wire_send *s)
{
	/* First what the peers sent us: their ops wait for it, ours for this copy. */
	struct emu_device *dev = hal->dev;

	emu_wire_place(dev, hal);
	if (s->pushed < s->len && s->status == OFFLOAD_OK) {
		s->status = write_direct(dev, s->peer, s->rkey,
					 (const void *)(uintptr_t)(s->src + s->pushed),
					 s->raddr + s->pushed, s->len - s->pushed);
		off_write_once(&dev->wire_direct_bytes,
			       off_read_once(&dev->wire_direct_bytes) + s->len - s->pushed);
	}
	s->pushed = s->len;
}

/* Copy the next pieces of s into free slots; 1 if any went out. */
static int push(struct dpa_hal *hal, struct emu_wire_send *s)
{
	struct emu_device *dev = hal->dev;
	struct emu_wire_tx *tx = &hal->wire_tx[s->peer];
	struct emu_wire *w = wire_of(dev, dev->attr.rank, s->peer);
	int moved = 0;

	if (s->first == UINT64_MAX)
		s->first = s->end = tx->tail;
	while (s->pushed < s->len) {
		/* (A slot still being placed from before: only a dead process's, whose rank
		 * this process took over; emu_device.c starts us past its pieces.) */
		if (tx->tail - tx->acked >= dev->wire_slots ||
		    off_load_acquire(&w->piece[tx->tail % dev->wire_slots].state) == EMU_WIRE_TAKEN) {
			/* Full (a write longer than the wire, or the target behind): the rest
			 * goes by process_vm_writev. Waiting for slots measured worse: both ranks
			 * of an exchange end up asleep on each other's placing (n=2, 4 MiB per
			 * peer: 1.9 ms against 1.1 without the wire). */
			send_direct(hal, s);
			return 1;
		}
		uint64_t idx = tx->tail, left = s->len - s->pushed;
		uint32_t len = left < EMU_WIRE_SLOT_BYTES ? (uint32_t)left : EMU_WIRE_SLOT_BYTES;
		struct emu_wire_piece *p = &w->piece[idx % dev->wire_slots];

		memcpy(slot_of(dev, dev->attr.rank, s->peer, idx),
		       (const void *)(uintptr_t)(s->src + s->pushed), len);
		p->raddr = s->raddr + s->pushed;
		p->index = idx;
		p->rkey = s->rkey;
		p->len = len;
		p->status = OFFLOAD_OK;
		off_store_release(&p->state, EMU_WIRE_READY);
		tx->tail = s->end = idx + 1;
		off_store_release(&w->tail, tx->tail);
		off_fetch_add(&dev->ranks[s->peer].wire_in, 1);
		s->pushed += len;
		off_write_once(&dev->wire_bytes, off_read_once(&dev->wire_bytes) + len);
		if (!moved) {  /* the target starts placing while we copy the rest */
			emu_nudge_rank(dev, s->peer, hal);
			emu_flush_wakes(hal);
		}
		moved = 1;
	}
	if (moved)  /* for what went out after its first look (rung at the pass's end) */
		emu_nudge_rank(dev, s->peer, hal);
	return moved;
}

/* Pieces of s placed since we last looked: their slots are ours again. */
static int reap(struct dpa_hal *hal, struct emu_wire_send *s)
{
	struct emu_device *dev = hal->dev;
	struct emu_wire_tx *tx = &hal->wire_tx[s->peer];
	struct emu_wire *w = wire_of(dev, dev->attr.rank, s->peer);
	int moved = 0;

	if (s->first == UINT64_MAX)
		return 0;
	while (tx->acked < s->end && tx->acked >= s->first) {
		struct emu_wire_piece *p = &w->piece[tx->acked % dev->wire_slots];

		if (off_load_acquire(&p->state) != EMU_WIRE_FREE)
			break;
		if (p->status != OFFLOAD_OK && s->status == OFFLOAD_OK)
			s->status = p->status;
		tx->acked++;
		moved = 1;
	}
	return moved;
}

/* The target has not placed s's pieces for a long time: place them ourselves. */
static void rescue(struct dpa_hal *hal, struct emu_wire_send *s)
{
	struct emu_device *dev = hal->dev;
	struct emu_wire *w = wire_of(dev, dev->attr.rank, s->peer);

	for (uint64_t idx = s->first; s->first != UINT64_MAX && idx < s->end; idx++) {
		struct emu_wire_piece *p = &w->piece[idx % dev->wire_slots];
		uint32_t ready = EMU_WIRE_READY, taken = EMU_WIRE_TAKEN;

		if (!off_cas(&p->state, &ready, EMU_WIRE_RESCUED)) {
			/* Placed, or the target is placing it: unless it died or closed meanwhile
			 * (no thread of its runs then), and the piece with it. */
			if (off_load_acquire(&dev->ranks[s->peer].state) != EMU_RANK_ALIVE &&
			    off_cas(&p->state, &taken, EMU_WIRE_RESCUED)) {
				p->status = emu_peer_lost(dev, s->peer);
				off_store_release(&p->state, EMU_WIRE_FREE);
			}
			continue;
		}
		p->status = write_direct(dev, s->peer, p->rkey,
					 slot_of(dev, dev->attr.rank, s->peer, idx), p->raddr, p->len);
		off_write_once(&dev->wire_rescues, off_read_once(&dev->wire_rescues) + 1);
		off_write_once(&dev->wire_direct_bytes,
			       off_read_once(&dev->wire_direct_bytes) + p->len);
		off_store_release(&p->state, EMU_WIRE_FREE);
	}
	send_direct(hal, s);
}

/* An older write to s's peer still in the outbox (its first `kept` entries)? `pushing`:
 * one whose pieces have not all gone out yet. */
static int older(const struct dpa_hal *hal, uint32_t kept, uint32_t peer, int pushing)
{
	for (uint32_t j = 0; j < kept; j++)
		if (hal->outbox[j].peer == peer &&
		    (!pushing || hal->outbox[j].pushed < hal->outbox[j].len))
			return 1;
	return 0;
}

void emu_wire_poll(struct dpa_hal *hal)
{
	uint64_t now = 0;
	uint32_t kept = 0;

	for (uint32_t i = 0; i < hal->nout; i++) {
		struct emu_wire_send s = hal->outbox[i];
		struct emu_wire_tx *tx = &hal->wire_tx[s.peer];
		int moved = reap(hal, &s);

		/* Pieces go out in order: the oldest write to a peer pushes first. */
		if (s.pushed < s.len && !older(hal, kept, s.peer, 1))
			moved |= push(hal, &s);
		if (moved) {
			s.moved_ns = 0;
		} else if (s.pushed < s.len || tx->acked < s.end) {
			if (!now)
				now = emu_now_ns();
			if (!s.moved_ns) {
				s.moved_ns = now;
			} else if (now - s.moved_ns > EMU_WIRE_STALL_NS &&
				   !older(hal, kept, s.peer, 0)) {
				rescue(hal, &s);
				reap(hal, &s);
			}
		}
		if (s.pushed < s.len || (s.first != UINT64_MAX && tx->acked < s.end) ||
		    emu_cq_full(hal)) {
			hal->outbox[kept++] = s;
			continue;
		}
		struct emu_wire_send *done = &s;

		tx->sending--;
		emu_push_cqe(hal, done->wr_id, done->status, done->status ? 0 : done->len,
			     done->rail);
	}
	hal->nout = kept;
}

/* Place one piece into our own memory, after checking it against our registration. The
 * descriptor is read once: the sender may not touch it now, but a forged one might. */
static int32_t place(struct emu_device *dev, const struct emu_wire_piece *p, const uint8_t *from)
{
	uint64_t raddr = off_read_once(&p->raddr);
	uint32_t rkey = off_read_once(&p->rkey), len = off_read_once(&p->len);
	struct emu_map *held;
	uint8_t *ptr;
	int32_t pid, st;

	if (len > EMU_WIRE_SLOT_BYTES)  /* a piece never spans slots */
		return OFFLOAD_ERR_REMOTE_ACCESS;
	st = emu_mr_resolve(dev, dev->attr.rank, rkey, raddr, len, OFFLOAD_ACCESS_REMOTE_WRITE,
			    &ptr, &pid, &held);
	if (st)
		return st;
	/* Our own thread, next to the buffers it reads soon: cache-filling stores where
	 * every rank has a core, streaming ones where the ranks share them (emu_hal.c). */
	if (dev->attr.size <= dev->ncores)
		memcpy(ptr, from, len);
	else
		emu_dma_copy(ptr, from, len);
	emu_map_release(held);
	return OFFLOAD_OK;
}

int emu_wire_place(struct emu_device *dev, struct dpa_hal *pass)
{
	uint32_t me = dev->attr.rank, in = off_load_acquire(&dev->ranks[me].wire_in);
	int placed = 0;

	if (in == off_read_once(&dev->wire_in_seen) || !off_trylock(&dev->wire_lock))
		return 0;
	off_write_once(&dev->wire_in_seen, in);
	for (uint32_t from = 0; from < dev->attr.size; from++) {
		struct emu_wire *w = from == me ? NULL : wire_of(dev, from, me);
		uint64_t head = dev->wire_head[from], tail;
		int wake = 0;

		if (!w || head == (tail = off_load_acquire(&w->tail)))
			continue;
		for (; head < tail; head++) {
			struct emu_wire_piece *p = &w->piece[head % dev->wire_slots];
			uint32_t ready = EMU_WIRE_READY;

			if (p->index != head || !off_cas(&p->state, &ready, EMU_WIRE_TAKEN))
				continue;  /* its sender took it back */
			p->status = place(dev, p, slot_of(dev, from, me, head));
			off_store_release(&p->state, EMU_WIRE_FREE);
			wake = 1;
			placed++;
		}
		dev->wire_head[from] = head;
		/* Its completions wait on these: an event for its firmware, like a peer's
		 * signal (a write's last piece need not be on the wire: a full wire's rest
		 * goes directly, so every placement counts). */
		if (wake)
			emu_wake_rank(dev, from, pass);
	}
	off_unlock(&dev->wire_lock);
	return placed;
}

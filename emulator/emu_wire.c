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
 * buffer may have been deregistered since the sender looked), reading the descriptor once,
 * and answers with the status the sender's completion carries. A piece nobody took within
 * EMU_WIRE_STALL_NS (a target stopped, closing, dead) is taken back by its sender and
 * written by process_vm_writev, from the sender's own record of where it goes; one a
 * target took and died with fails with the peer's status. One a live target took and has
 * not let go of (stopped or preempted mid-copy) is written by its sender too, the same
 * bytes, where the target runs one DPA thread: its passes and its placing then share that
 * thread's lock, so no op of the target completes (hands its buffer back) while its own
 * copy is unfinished. With more threads any of them may complete an op meanwhile, so there
 * the write fails with a timeout after EMU_WIRE_TAKEN_NS, as RC's retries running out
 * would. Either way the slot stays unused until the target lets go, and an op's abort,
 * which waits for its writes' completions, never waits long on a peer that does not run.
 */
#define _GNU_SOURCE
#include <string.h>

#include "emu_internal.h"
#include "offload_atomic.h"

#define EMU_WIRE_FLOOR 4096u  /* a smaller wire_min counts as this: flags stay atomic */

uint32_t emu_wire_slots(uint32_t nranks)
{
	uint64_t pairs = (uint64_t)nranks * (nranks - 1), slots = EMU_WIRE_MAX_SLOTS;

	if (nranks < 2)
		return 0;
	while (slots >= 2 && pairs * slots * EMU_WIRE_SLOT_BYTES > EMU_WIRE_BUDGET)
		slots /= 2;
	return slots >= 2 ? (uint32_t)slots : 0;
}

static struct emu_wire *emu_wire_of(const struct emu_device *dev, uint32_t from, uint32_t to)
{
	return &dev->wires[(uint64_t)from * dev->attr.size + to];
}

static uint8_t *slot_of(const struct emu_device *dev, uint32_t from, uint32_t to, uint64_t index)
{
	uint64_t wire = (uint64_t)from * dev->attr.size + to;

	return dev->wire_data + (wire * dev->wire_slots + index % dev->wire_slots) *
				EMU_WIRE_SLOT_BYTES;
}

/* The shortest write the wire takes (a smaller wire_min counts as EMU_WIRE_FLOOR). */
static uint64_t wire_floor(const struct emu_device *dev)
{
	return dev->attr.wire_min > EMU_WIRE_FLOOR ? dev->attr.wire_min : EMU_WIRE_FLOOR;
}

/*
 * Only where every rank has a core: the target's thread then places a piece while it is
 * still in the caches the sender's copy left it in. Where the ranks share the cores a
 * piece waits for its target's turn, its slot is back in memory by then, and the second
 * copy's memory traffic costs more than the pinning it saves (1 MiB per peer all-to-all:
 * n=2 0.98-1.00x Open MPI's busbw against 0.41-0.78x by process_vm_writev; at n=4 even,
 * at n=8 0.81-0.84x against 0.89-1.16x; docs/performance.md).
 */
int emu_wire_takes(const struct dpa_hal *hal, uint32_t peer, uint64_t len)
{
	const struct emu_device *dev = hal->dev;
	uint64_t min = dev->attr.wire_min;

	return hal->wire_tx && min && len >= wire_floor(dev) &&
	       peer < dev->attr.size && peer != dev->attr.rank && dev->attr.size <= dev->ncores &&
	       hal->nout < EMU_WIRE_OUTBOX;
}

static void count(uint64_t *counter, uint64_t n)
{
	off_write_once(counter, off_read_once(counter) + n);  /* thread 0's; read racily */
}

/* Writes shorter than this are timed too (a clock read costs ~30 ns): where the wire
 * takes shorter writes than EMU_WIRE_TIMED_MIN, its choice must still see both costs. */
static uint64_t timed_min(const struct emu_device *dev)
{
	uint64_t min = wire_floor(dev);

	return min < EMU_WIRE_TIMED_MIN ? min : EMU_WIRE_TIMED_MIN;
}

/* A cost per MiB, folded into a moving average that follows a machine whose memory gets
 * faster or slower (neighbours on a shared host). A preempted copy must not set the cost
 * for many writes: the lower of the first two samples starts the average, and a sample
 * after those counts at most 4x it. */
static void note_cost(const struct emu_device *dev, struct emu_wire_cost *c, uint64_t len,
		      uint64_t ns)
{
	uint64_t per_mib;

	if (len < timed_min(dev))
		return;
	if (ns > UINT64_MAX >> 20)  /* a sender stopped for hours */
		ns = UINT64_MAX >> 20;
	per_mib = ns * (1u << 20) / len;
	if (c->samples >= 2) {
		if (per_mib > 4 * c->ns_per_mib)
			per_mib = 4 * c->ns_per_mib;
		c->ns_per_mib = c->ns_per_mib - c->ns_per_mib / 4 + per_mib / 4;
		return;
	}
	if (!c->samples++ || per_mib < c->ns_per_mib)
		c->ns_per_mib = per_mib;
}

/*
 * The wire or one process_vm_writev, by what each cost this thread lately. The wire's
 * cost is two copies, the target's assumed to cost what ours into the slots did (both
 * memcpy between private memory and the segment; scripts/copy_cost.c: 107-117 us each
 * per MiB on a day its process_vm_writev took 145-157, 20-25 against 78-126 on another).
 * Which is cheaper depends on the machine's memory and on what else runs on it, so it is
 * measured here, not fixed: where the copies are cheap the wire wins (its pinning-free
 * copies), where memory is slow the single copy does (n=2, 1 MiB per peer: 0.50-0.54x
 * Open MPI's busbw by the wire against 0.74-1.00x directly, docs/performance.md). Every
 * EMU_WIRE_PROBE_EVERY-th write goes the other way, to keep its cost current. The wire's
 * cost leaves out the wake-up of its target (a system call, as a direct write is one).
 */
static int wire_cheaper(const struct emu_wire_costs *c)
{
	int wire;

	if (!c->wire.samples)  /* no piece went into a warm slot yet */
		return 1;
	if (!c->direct.samples)
		return 0;
	wire = 2 * c->wire.ns_per_mib < c->direct.ns_per_mib;
	return c->choices % EMU_WIRE_PROBE_EVERY == EMU_WIRE_PROBE_EVERY - 1 ? !wire : wire;
}

int emu_wire_route(struct dpa_hal *hal, uint32_t peer, int may_take)
{
	int way = may_take && wire_cheaper(&hal->wire_costs) ? EMU_WAY_WIRE :
		  may_take ? EMU_WAY_MEASURED : EMU_WAY_DIRECT;

	/* Anything else to that peer lands after what is on its wire; a write sent back
	 * here chooses again when it is retried, and only the choice that goes counts. */
	if (way != EMU_WAY_WIRE && emu_wire_busy(hal, peer))
		return DPA_HAL_EAGAIN;
	if (may_take)
		hal->wire_costs.choices++;  /* wrapping round is harmless */
	return way;
}

int32_t emu_wire_direct(struct dpa_hal *hal, uint32_t peer, uint64_t src, uint64_t raddr,
			uint32_t rkey, uint64_t len)
{
	uint64_t start = emu_now_ns();
	int32_t st = emu_write_remote(hal->dev, peer, (const void *)(uintptr_t)src, raddr, rkey, len);

	if (!st) {
		note_cost(hal->dev, &hal->wire_costs.direct, len, emu_now_ns() - start);
		count(&hal->dev->wire_skipped_bytes, len);
	}
	return st;
}

/* Copy what fits of s into free slots, the rest straight to the target. */
static void push(struct dpa_hal *hal, struct emu_wire_send *s)
{
	struct emu_device *dev = hal->dev;
	struct emu_wire_tx *tx = &hal->wire_tx[s->peer];
	struct emu_wire *w = emu_wire_of(dev, dev->attr.rank, s->peer);
	uint64_t sent = 0, timed = 0, took = 0;

	s->first = s->end = s->reaped = tx->tail;
	while (sent < s->len) {
		struct emu_wire_piece *p = &w->piece[tx->tail % dev->wire_slots];
		uint64_t left = s->len - sent;
		uint32_t len = left < EMU_WIRE_SLOT_BYTES ? (uint32_t)left : EMU_WIRE_SLOT_BYTES;

		/* Full, or a slot its target still holds (a piece given up on, or one of a
		 * dead process whose rank we took over): the rest goes directly. */
		if (tx->tail - tx->acked >= dev->wire_slots ||
		    off_load_acquire(&p->state) != EMU_WIRE_FREE)
			break;
		uint64_t start = emu_now_ns();

		memcpy(slot_of(dev, dev->attr.rank, s->peer, tx->tail),
		       (const void *)(uintptr_t)(s->src + sent), len);
		/* Only the copy counts, and only into a slot this process used before: a
		 * first use faults the segment's page in, a cost paid once. */
		if (tx->tail >= tx->first + dev->wire_slots) {
			took += emu_now_ns() - start;
			timed += len;
		}
		off_write_once(&p->raddr, s->raddr + sent);
		off_write_once(&p->index, tx->tail);
		off_write_once(&p->rkey, s->rkey);
		off_write_once(&p->len, len);
		off_write_once(&p->status, OFFLOAD_OK);
		off_store_release(&p->state, EMU_WIRE_READY);  /* the descriptor before */
		tx->tail = s->end = tx->tail + 1;
		off_store_release(&w->tail, tx->tail);
		off_fetch_add(&dev->ranks[s->peer].wire_in, 1);
		if (!sent) {  /* the target starts placing while we copy the rest */
			emu_nudge_rank(dev, s->peer, hal);
			emu_flush_wakes(hal);
		}
		sent += len;
	}
	note_cost(dev, &hal->wire_costs.wire, timed, took);
	count(&dev->wire_bytes, sent);
	if (sent > EMU_WIRE_SLOT_BYTES)  /* for the pieces after the first (rung at the end) */
		emu_nudge_rank(dev, s->peer, hal);
	if (sent < s->len) {
		/* A write longer than the free slots (measured: waiting for slots put both
		 * ranks of an exchange to sleep on each other's placing). First what the peers
		 * sent us: their ops wait for it while ours copies. */
		emu_wire_place(dev, hal);
		s->status = emu_write_remote(dev, s->peer, (const void *)(uintptr_t)(s->src + sent),
					     s->raddr + sent, s->rkey, s->len - sent);
		count(&dev->wire_direct_bytes, s->len - sent);
	}
}

int emu_wire_post(struct dpa_hal *hal, uint32_t peer, uint64_t src, uint64_t raddr,
		  uint32_t rkey, uint64_t len, uint64_t wr_id, uint32_t rail)
{
	struct emu_wire_send *s = &hal->outbox[hal->nout++];

	*s = (struct emu_wire_send){
		.src = src, .raddr = raddr, .len = len, .wr_id = wr_id, .peer = peer,
		.rkey = rkey, .rail = rail,
	};
	hal->wire_tx[peer].sending++;
	push(hal, s);
	return 0;
}

/* Account for s's pieces its target let go of, in order (older writes to the peer first). */
static int reap(struct dpa_hal *hal, struct emu_wire_send *s)
{
	struct emu_device *dev = hal->dev;
	struct emu_wire_tx *tx = &hal->wire_tx[s->peer];
	struct emu_wire *w = emu_wire_of(dev, dev->attr.rank, s->peer);
	int moved = 0;

	while (s->reaped < s->end && tx->acked == s->reaped) {
		struct emu_wire_piece *p = &w->piece[s->reaped % dev->wire_slots];
		uint32_t state = off_load_acquire(&p->state);
		int32_t st = off_read_once(&p->status);

		if (state == EMU_WIRE_TAKEN && (s->held & (1u << (s->reaped - s->first)))) {
			st = s->held_status;  /* written by us too, or given up on (see the top) */
		} else if (state != EMU_WIRE_FREE) {
			break;
		}
		if (st != OFFLOAD_OK && s->status == OFFLOAD_OK)
			s->status = st;
		tx->acked = ++s->reaped;
		moved = 1;
	}
	return moved;
}

/* Piece idx of s as the sender recorded it: where it lands and how long it is. */
static void piece_of(const struct emu_wire_send *s, uint64_t idx, uint64_t *raddr, uint64_t *len)
{
	uint64_t off = (idx - s->first) * EMU_WIRE_SLOT_BYTES, left = s->len - off;

	*raddr = s->raddr + off;
	*len = left < EMU_WIRE_SLOT_BYTES ? left : EMU_WIRE_SLOT_BYTES;
}

/* Write piece idx of s from its slot straight to the target (a rescue). */
static int32_t write_piece(struct dpa_hal *hal, const struct emu_wire_send *s, uint64_t idx)
{
	struct emu_device *dev = hal->dev;
	uint64_t raddr, len;

	piece_of(s, idx, &raddr, &len);
	count(&dev->wire_rescues, 1);
	count(&dev->wire_direct_bytes, len);
	return emu_write_remote(dev, s->peer, slot_of(dev, dev->attr.rank, s->peer, idx), raddr,
				s->rkey, len);
}

/* The target has not placed s's pieces for a long time (`stalled` ns). */
static void rescue(struct dpa_hal *hal, struct emu_wire_send *s, uint64_t stalled)
{
	struct emu_device *dev = hal->dev;
	struct emu_wire *w = emu_wire_of(dev, dev->attr.rank, s->peer);
	int alive = off_load_acquire(&dev->ranks[s->peer].state) == EMU_RANK_ALIVE;

	for (uint64_t idx = s->reaped; idx < s->end; idx++) {
		struct emu_wire_piece *p = &w->piece[idx % dev->wire_slots];
		uint32_t ready = EMU_WIRE_READY, taken = EMU_WIRE_TAKEN;
		int32_t st;

		if (off_cas(&p->state, &ready, EMU_WIRE_RESCUED)) {
			st = write_piece(hal, s, idx);  /* not taken: from our own record */
		} else if (!alive && off_cas(&p->state, &taken, EMU_WIRE_RESCUED)) {
			/* Taken by a target that died or closed meanwhile: no thread of its runs. */
			st = emu_peer_lost(dev, s->peer);
		} else {
			uint32_t bit = 1u << (idx - s->first);

			if (off_load_acquire(&p->state) != EMU_WIRE_TAKEN || (s->held & bit))
				continue;  /* placed meanwhile, or done with already */
			if (off_read_once(&dev->ranks[s->peer].threads) == 1)
				st = write_piece(hal, s, idx);  /* the same bytes: see the top */
			else if (stalled > EMU_WIRE_TAKEN_NS)
				st = OFFLOAD_ERR_TIMEOUT;
			else
				continue;
			if (st != OFFLOAD_OK && s->held_status == OFFLOAD_OK)
				s->held_status = st;
			s->held |= bit;
			continue;
		}
		off_write_once(&p->status, st);
		off_store_release(&p->state, EMU_WIRE_FREE);
	}
}

void emu_wire_poll(struct dpa_hal *hal)
{
	uint64_t now = 0;
	uint32_t kept = 0;

	for (uint32_t i = 0; i < hal->nout; i++) {
		struct emu_wire_send s = hal->outbox[i];
		struct emu_wire_tx *tx = &hal->wire_tx[s.peer];

		if (reap(hal, &s)) {
			s.moved_ns = 0;
		} else if (s.reaped < s.end && tx->acked == s.reaped) {
			/* The oldest write to its peer, and its target has not moved. */
			if (!now)
				now = emu_now_ns();
			if (!s.moved_ns) {
				s.moved_ns = now;
			} else if (now - s.moved_ns > EMU_WIRE_STALL_NS) {
				rescue(hal, &s, now - s.moved_ns);
				reap(hal, &s);
			}
		}
		/* Complete in order per peer: its pieces, and every older write's. */
		if (tx->acked < s.end || s.reaped < s.end || emu_cq_full(hal)) {
			hal->outbox[kept++] = s;
			continue;
		}
		tx->sending--;
		emu_push_cqe(hal, s.wr_id, s.status, s.status ? 0 : s.len, s.rail);
	}
	hal->nout = kept;
}

/* Place one piece into our own memory, after checking it against our registration. The
 * descriptor is read once: the sender may not touch it now, but a forged one might. */
static int32_t place(struct emu_device *dev, const struct emu_wire_piece *p, const uint8_t *from)
{
	uint64_t raddr = off_read_once(&p->raddr);
	uint32_t rkey = off_read_once(&p->rkey), len = off_read_once(&p->len);
	struct emu_map *held = NULL;
	uint8_t *ptr = NULL;
	int32_t pid, st;

	if (len > EMU_WIRE_SLOT_BYTES)  /* a piece never spans slots */
		return OFFLOAD_ERR_REMOTE_ACCESS;
	st = emu_mr_resolve(dev, dev->attr.rank, rkey, raddr, len, OFFLOAD_ACCESS_REMOTE_WRITE,
			    &ptr, &pid, &held);
	if (st)
		return st;
	emu_dma_to(dev, dev->attr.rank, ptr, from, len);  /* our own thread, our memory */
	emu_map_release(held);
	return OFFLOAD_OK;
}

int emu_wire_pending(const struct emu_device *dev)
{
	return dev->wire_slots && off_load_acquire(&dev->ranks[dev->attr.rank].wire_in) !=
				  off_read_once(&dev->wire_in_seen);
}

int emu_wire_place(struct emu_device *dev, struct dpa_hal *pass)
{
	uint32_t me = dev->attr.rank, in;
	int placed = 0;

	if (!emu_wire_pending(dev) || !off_trylock(&dev->wire_lock))
		return 0;
	/* Before the tails: a piece published after them bumps it past what we saw. */
	in = off_load_acquire(&dev->ranks[me].wire_in);
	off_write_once(&dev->wire_in_seen, in);
	for (uint32_t from = 0; from < dev->attr.size; from++) {
		struct emu_wire *w = from == me ? NULL : emu_wire_of(dev, from, me);
		uint64_t head = dev->wire_head[from], tail;
		int moved = 0;

		if (!w || head == (tail = off_load_acquire(&w->tail)))
			continue;
		for (; head < tail; head++) {
			struct emu_wire_piece *p = &w->piece[head % dev->wire_slots];
			uint32_t ready = EMU_WIRE_READY;

			if (off_read_once(&p->index) != head ||
			    !off_cas(&p->state, &ready, EMU_WIRE_TAKEN))
				continue;  /* its sender took it back */
			off_write_once(&p->status, place(dev, p, slot_of(dev, from, me, head)));
			off_store_release(&p->state, EMU_WIRE_FREE);
			moved = 1;
			placed++;
		}
		dev->wire_head[from] = head;
		/* Its completions wait on these: an event for its firmware, like a peer's
		 * signal (a forced kick woke its progress thread for nothing: 2-3x at 1 MiB). */
		if (moved)
			emu_wake_rank_now(dev, from, pass);
	}
	off_unlock(&dev->wire_lock);
	return placed;
}

void emu_wire_adopt(struct emu_device *dev)
{
	uint32_t me = dev->attr.rank;

	for (uint32_t r = 0; r < dev->attr.size; r++) {
		struct emu_wire *out = emu_wire_of(dev, me, r), *in = emu_wire_of(dev, r, me);
		struct emu_wire_tx *tx = &dev->hals[0].wire_tx[r];

		/* The slots are the segment's, their page-table entries this process's. */
		tx->first = tx->tail = tx->acked = off_load_acquire(&out->tail);
		dev->wire_head[r] = off_load_acquire(&in->tail);
		for (uint32_t k = 0; k < dev->wire_slots && r != me; k++) {
			uint32_t ready = EMU_WIRE_READY, rescued = EMU_WIRE_RESCUED;
			uint32_t taken = EMU_WIRE_TAKEN;

			/* Ours, from the dead process: nobody waits for them any more. */
			if (!off_cas(&out->piece[k].state, &ready, EMU_WIRE_FREE))
				off_cas(&out->piece[k].state, &rescued, EMU_WIRE_FREE);
			/* Being placed by the dead process: its senders' writes fail. */
			if (off_cas(&in->piece[k].state, &taken, EMU_WIRE_RESCUED)) {
				off_write_once(&in->piece[k].status, OFFLOAD_ERR_PEER);
				off_store_release(&in->piece[k].state, EMU_WIRE_FREE);
			}
		}
	}
}

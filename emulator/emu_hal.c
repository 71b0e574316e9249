/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dpa_hal.h on an ordinary host. RDMA is executed at post time, in one copy with no
 * bounce buffer: memcpy when the target is mapped here (job segment, ctx.empty() segments,
 * our own memory), else one process_vm_writev/readv into the target process; a large
 * write into another process's memory instead takes the wire (emu_wire.c). Every
 * access is checked against the target's registration first; a failed check becomes an
 * error completion and nothing is written.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "emu_internal.h"
#include "offload_atomic.h"

uint32_t dpa_hal_thread_index(const struct dpa_hal *hal)
{
	return hal->index;
}

uint32_t dpa_hal_num_threads(const struct dpa_hal *hal)
{
	return hal->dev->attr.num_threads;
}

void *dpa_hal_window_ptr(struct dpa_hal *hal, enum dpa_hal_window win, uint64_t offset,
			 uint64_t len)
{
	struct emu_device *dev = hal->dev;

	switch (win) {
	case DPA_HAL_WIN_RING:
		if (offset > dev->win.ring_len || len > dev->win.ring_len - offset)
			return NULL;
		return (uint8_t *)dev->win.ring + offset;
	case DPA_HAL_WIN_STATS:
		if (offset > dev->win.stats_len || len > dev->win.stats_len - offset)
			return NULL;
		return (uint8_t *)dev->win.stats + offset;
	case DPA_HAL_WIN_CTRL:
		if (offset > dev->ctrl_bytes || len > dev->ctrl_bytes - offset)
			return NULL;
		return emu_ctrl_of(dev, dev->attr.rank) + offset;
	}
	return NULL;
}

/* Our port `rail` failed; with none left, this rank is unreachable for the whole job
 * (the fabric's view: every peer's connections to us fail). */
void emu_rail_down(struct emu_device *dev, uint32_t rail)
{
	uint32_t all = (1u << dev->attr.rails) - 1;
	uint32_t down = __atomic_or_fetch(&dev->ranks[dev->attr.rank].rails_down, 1u << rail,
					  __ATOMIC_SEQ_CST);

	if ((down & all) != all)
		return;
	offload_rankset_add(dev->unreachable, &dev->hdr->unreachable_gen, dev->attr.rank);
	for (uint32_t i = 0; i < dev->attr.size; i++)
		emu_kick_rank(dev, i);
}

uint32_t dpa_hal_num_rails(const struct dpa_hal *hal)
{
	return hal->dev->attr.rails;
}

void dpa_hal_set_rail(struct dpa_hal *hal, uint32_t peer, uint32_t rail)
{
	if (peer < hal->dev->attr.size && rail < hal->dev->attr.rails)
		hal->rail[peer] = (uint8_t)rail;
}

/*
 * The port a post to peer leaves on, and whether it is up. A port fails both ways: work
 * on rail r fails when our port r or the peer's is down. Fault injection takes our port r
 * down once this rank has sent rail_down_after[r] bytes through it; the post that crosses
 * the mark fails whole (nothing of it is delivered).
 */
static int32_t rail_gate(struct dpa_hal *hal, uint32_t peer, uint64_t len, uint32_t *rail)
{
	struct emu_device *dev = hal->dev;
	uint32_t r = peer < dev->attr.size ? hal->rail[peer] : 0, bit = 1u << r;
	struct emu_rank *me = &dev->ranks[dev->attr.rank];

	*rail = r;
	if (peer >= dev->attr.size)
		return OFFLOAD_OK;  /* resolving the key refuses it */
	if ((off_load_acquire(&me->rails_down) | off_load_acquire(&dev->ranks[peer].rails_down)) & bit)
		return OFFLOAD_ERR_LINK_DOWN;
	if (dev->rail_faults &&
	    off_fetch_add(&dev->rail_sent[r], len) + len > dev->attr.rail_down_after[r]) {
		emu_rail_down(dev, r);
		return OFFLOAD_ERR_LINK_DOWN;
	}
	return OFFLOAD_OK;
}

/* process_vm_* may move less than asked; finish the transfer or report why not. */
static int32_t vm_copy(int32_t pid, int to_remote, void *local, uint64_t raddr, uint64_t len)
{
	while (len) {
		struct iovec l = { .iov_base = local, .iov_len = len };
		struct iovec r = { .iov_base = (void *)(uintptr_t)raddr, .iov_len = len };
		ssize_t n = to_remote ? process_vm_writev(pid, &l, 1, &r, 1, 0) :
					process_vm_readv(pid, &l, 1, &r, 1, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == ESRCH ? OFFLOAD_ERR_PEER : OFFLOAD_ERR_REMOTE_ACCESS;
		}
		if (n == 0)
			return OFFLOAD_ERR_REMOTE_ACCESS;
		local = (uint8_t *)local + n;
		raddr += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return OFFLOAD_OK;
}

/* A contiguous write into memory mapped here: as a NIC's DMA does it (emu_dma_copy,
 * streaming stores), except into our own memory where every rank has a core: there the
 * rank's own thread copies (emu_drive.c) between buffers it just touched, and cache-
 * filling stores beat streaming ones (n=2, 1 MiB per peer: 0.6x Open MPI's busbw with
 * streaming, 0.8x with memcpy). Where ranks share cores the progress threads copy, and
 * streaming measured better (n=4: 0.74-0.90x against 0.64-0.85x). Rows gathered or placed
 * (write_sg: MoE's tables, far larger than the caches) always stream. */
void emu_dma_to(const struct emu_device *dev, uint32_t peer, void *dst, const void *src,
		uint64_t len)
{
	if (peer == dev->attr.rank && dev->attr.size <= dev->ncores)
		memmove(dst, src, len);
	else
		emu_dma_copy(dst, src, len);
}

int32_t emu_write_remote(struct emu_device *dev, uint32_t peer, const void *src,
			 uint64_t raddr, uint32_t rkey, uint64_t len)
{
	struct emu_map *held;
	uint8_t *ptr;
	int32_t pid, st;

	if (!len)
		return OFFLOAD_OK;
	st = emu_mr_resolve(dev, peer, rkey, raddr, len, OFFLOAD_ACCESS_REMOTE_WRITE, &ptr, &pid,
			    &held);
	if (st)
		return st;
	if (!ptr) {
		st = vm_copy(pid, 1, (void *)(uintptr_t)src, raddr, len);
		return st == OFFLOAD_ERR_PEER ? emu_peer_lost(dev, peer) : st;
	}
	if (len == sizeof(uint64_t) && !((uintptr_t)ptr & 7)) {
		/* Aligned 8-byte writes land atomically: flags and sequence words are read
		 * with load-acquire on the other side. */
		uint64_t v;

		memcpy(&v, src, sizeof(v));
		off_store_release((uint64_t *)(void *)ptr, v);
	} else {
		emu_dma_to(dev, peer, ptr, src, len);
		/* Later writes on this queue must not become visible before this one. */
		__atomic_thread_fence(__ATOMIC_RELEASE);
	}
	emu_map_release(held);
	return OFFLOAD_OK;
}

void *dpa_hal_aux_ptr(struct dpa_hal *hal, uint32_t key, uint64_t addr, uint64_t len)
{
	struct emu_map *held;
	uint8_t *ptr;
	int32_t pid;

	/* The host's own memory, so reachable directly once the registration covers it. */
	if (!len || emu_mr_resolve(hal->dev, hal->dev->attr.rank, key, addr, len,
				   OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE, &ptr, &pid,
				   &held) != OFFLOAD_OK)
		return NULL;
	return (void *)(uintptr_t)addr;
}

static int32_t check_local(struct emu_device *dev, uint64_t laddr, uint32_t lkey, uint64_t len,
			   uint32_t access)
{
	struct emu_map *held;
	uint8_t *ptr;
	int32_t pid;

	if (!len)
		return OFFLOAD_OK;
	/* Our own memory: never a peer mapping, nothing to release. */
	return emu_mr_resolve(dev, dev->attr.rank, lkey, laddr, len, access, &ptr, &pid, &held);
}

/* A completion copied in 8-byte words, in and out of the queue alike: a load wider than
 * the stores that wrote its bytes cannot take them from the store buffer and waits for it
 * to drain, this pass's block copies into peers' lines included (a poll right after a
 * small write's post: half of dpa_hal_poll_cq's samples, 1 KiB all-to-all at n=4). */
typedef uint64_t __attribute__((may_alias)) emu_word;
_Static_assert(sizeof(struct dpa_hal_cqe) == 3 * sizeof(uint64_t), "a CQE is three words");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "emu_push_cqe packs fields in LE");
static inline void emu_cqe_copy(struct dpa_hal_cqe *dst, const struct dpa_hal_cqe *src)
{
	for (int i = 0; i < 3; i++)
		off_write_once(&((emu_word *)dst)[i], off_read_once(&((const emu_word *)src)[i]));
}

int emu_push_cqe(struct dpa_hal *hal, uint64_t wr_id, int32_t status, uint64_t bytes,
		 uint32_t rail)
{
	emu_word *c = (emu_word *)&hal->cq[hal->cq_tail & (EMU_CQ_DEPTH - 1)];

	/* The fields' words as little-endian memory holds them (asserted above). */
	off_write_once(&c[0], wr_id);
	off_write_once(&c[1], (uint64_t)(uint32_t)status | (uint64_t)(uint32_t)bytes << 32);
	off_write_once(&c[2], (uint64_t)rail);
	hal->cq_tail++;
	return 0;
}

int dpa_hal_rdma_write(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		       uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	uint32_t rail = 0;
	int32_t st;
	int way;

	if (emu_cq_full(hal))
		return DPA_HAL_EAGAIN;
	/* Into a peer's private memory: by the wire (emu_wire.c), whose placing checks the
	 * piece against the registration in full, where it costs less than the one copy. */
	way = emu_wire_route(hal, peer, emu_wire_takes(hal, peer, len) &&
					emu_mr_is_private(hal->dev, peer, rkey));
	if (way < 0)
		return way;
	if (len >= EMU_FLUSH_BEFORE)
		emu_flush_wakes(hal);
	st = check_local(hal->dev, laddr, lkey, len, OFFLOAD_ACCESS_LOCAL_READ);
	if (!st)
		st = rail_gate(hal, peer, len, &rail);
	if (!st && way == EMU_WAY_WIRE)
		return emu_wire_post(hal, peer, laddr, raddr, rkey, len, wr_id, rail);
	if (!st && way == EMU_WAY_MEASURED)
		st = emu_wire_direct(hal, peer, laddr, raddr, rkey, len);
	else if (!st)
		st = emu_write_remote(hal->dev, peer, (const void *)(uintptr_t)laddr, raddr, rkey, len);
	return emu_push_cqe(hal, wr_id, st, st ? 0 : len, rail);
}

/* process_vm_writev of a gather list into one remote range, finishing partial transfers. */
static int32_t vm_write_sg(int32_t pid, struct iovec *iov, uint32_t n, uint64_t raddr, uint64_t len)
{
	uint32_t first = 0;

	while (len) {
		struct iovec r = { .iov_base = (void *)(uintptr_t)raddr, .iov_len = len };
		ssize_t done = process_vm_writev(pid, iov + first, n - first, &r, 1, 0);

		if (done < 0) {
			if (errno == EINTR)
				continue;
			return errno == ESRCH ? OFFLOAD_ERR_PEER : OFFLOAD_ERR_REMOTE_ACCESS;
		}
		if (done == 0)
			return OFFLOAD_ERR_REMOTE_ACCESS;
		raddr += (uint64_t)done;
		len -= (uint64_t)done;
		while (done > 0 && first < n) {  /* skip what went out, trim a piece half sent */
			size_t step = (size_t)done < iov[first].iov_len ? (size_t)done : iov[first].iov_len;

			iov[first].iov_base = (uint8_t *)iov[first].iov_base + step;
			iov[first].iov_len -= step;
			done -= (ssize_t)step;
			if (!iov[first].iov_len)
				first++;
		}
	}
	return OFFLOAD_OK;
}

int dpa_hal_rdma_write_sg(struct dpa_hal *hal, uint32_t peer, const struct dpa_hal_sge *sge,
			  uint32_t nsge, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct emu_device *dev = hal->dev;
	struct iovec iov[DPA_HAL_MAX_SGE];
	struct emu_map *held = NULL;
	uint64_t total = 0;
	uint8_t *ptr;
	uint32_t rail = 0;
	int32_t pid, st = OFFLOAD_OK;

	if (emu_cq_full(hal) || emu_wire_busy(hal, peer))
		return DPA_HAL_EAGAIN;
	if (!nsge || nsge > DPA_HAL_MAX_SGE)
		return -EINVAL;
	for (uint32_t i = 0; i < nsge && !st; i++) {
		st = check_local(dev, sge[i].addr, lkey, sge[i].len, OFFLOAD_ACCESS_LOCAL_READ);
		if (__builtin_add_overflow(total, sge[i].len, &total))
			st = OFFLOAD_ERR_REMOTE_ACCESS;
		iov[i] = (struct iovec){ .iov_base = (void *)(uintptr_t)sge[i].addr,
					 .iov_len = sge[i].len };
	}
	if (total >= EMU_FLUSH_BEFORE)
		emu_flush_wakes(hal);
	if (!st)
		st = rail_gate(hal, peer, total, &rail);
	if (!st && total)
		st = emu_mr_resolve(dev, peer, rkey, raddr, total, OFFLOAD_ACCESS_REMOTE_WRITE, &ptr,
				    &pid, &held);
	if (!st && total) {
		if (ptr) {
			for (uint32_t i = 0; i < nsge; ptr += sge[i].len, i++)
				emu_dma_copy(ptr, (const void *)(uintptr_t)sge[i].addr, sge[i].len);
			__atomic_thread_fence(__ATOMIC_RELEASE);
		} else {
			st = vm_write_sg(pid, iov, nsge, raddr, total);
			if (st == OFFLOAD_ERR_PEER)
				st = emu_peer_lost(dev, peer);
		}
		emu_map_release(held);
	}
	return emu_push_cqe(hal, wr_id, st, st ? 0 : total, rail);
}

int dpa_hal_rdma_write_inline(struct dpa_hal *hal, uint32_t peer, const void *data,
			      uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	uint32_t rail;
	int32_t st;

	if (emu_cq_full(hal) || emu_wire_busy(hal, peer))
		return DPA_HAL_EAGAIN;
	st = rail_gate(hal, peer, len, &rail);
	if (!st)
		st = emu_write_remote(hal->dev, peer, data, raddr, rkey, len);
	/* Inline writes are control messages (write-with-immediate on hardware): they raise
	 * a completion event that wakes the target's progress threads. */
	if (!st)
		emu_wake_rank(hal->dev, peer, hal);
	return emu_push_cqe(hal, wr_id, st, st ? 0 : len, rail);
}

int dpa_hal_rdma_read(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		      uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	struct emu_device *dev = hal->dev;
	struct emu_map *held = NULL;
	uint8_t *ptr;
	uint32_t rail = 0;
	int32_t pid, st;

	if (emu_cq_full(hal) || emu_wire_busy(hal, peer))
		return DPA_HAL_EAGAIN;
	if (len >= EMU_FLUSH_BEFORE)
		emu_flush_wakes(hal);
	st = check_local(dev, laddr, lkey, len, OFFLOAD_ACCESS_LOCAL_WRITE);
	if (!st)
		st = rail_gate(hal, peer, len, &rail);
	if (!st && len)
		st = emu_mr_resolve(dev, peer, rkey, raddr, len, OFFLOAD_ACCESS_REMOTE_READ, &ptr, &pid,
				    &held);
	if (!st && len) {
		if (ptr)
			emu_dma_copy((void *)(uintptr_t)laddr, ptr, len);
		else
			st = vm_copy(pid, 0, (void *)(uintptr_t)laddr, raddr, len);
		if (st == OFFLOAD_ERR_PEER)
			st = emu_peer_lost(dev, peer);
		emu_map_release(held);
	}
	return emu_push_cqe(hal, wr_id, st, st ? 0 : len, rail);
}

int dpa_hal_rdma_signal_add(struct dpa_hal *hal, uint32_t peer, uint64_t raddr, uint32_t rkey,
			    uint64_t value, uint64_t wr_id)
{
	struct emu_device *dev = hal->dev;
	struct emu_map *held = NULL;
	uint8_t *ptr = NULL;
	uint32_t rail;
	int32_t pid, st;

	if (emu_cq_full(hal) || emu_wire_busy(hal, peer))
		return DPA_HAL_EAGAIN;
	st = rail_gate(hal, peer, sizeof(uint64_t), &rail);
	if (!st)
		st = emu_mr_resolve(dev, peer, rkey, raddr, sizeof(uint64_t),
				    OFFLOAD_ACCESS_REMOTE_ATOMIC, &ptr, &pid, &held);
	/* Atomics need the word mapped here: signal words always live in shared memory. */
	if (!st && (!ptr || ((uintptr_t)ptr & 7)))
		st = OFFLOAD_ERR_REMOTE_ACCESS;
	if (!st) {
		/* Pairs with the receiver's load-acquire of the counter: data written
		 * before the signal is visible once the signal is. */
		off_fetch_add((uint64_t *)(void *)ptr, value);
		emu_wake_rank(dev, peer, hal);
	}
	emu_map_release(held);
	return emu_push_cqe(hal, wr_id, st, 0, rail);
}

int dpa_hal_poll_cq(struct dpa_hal *hal, struct dpa_hal_cqe *out, int max)
{
	int n = 0;

	if (hal->nout)  /* writes on the wires: completions of those placed */
		emu_wire_poll(hal);
	while (n < max && hal->cq_head != hal->cq_tail)
		emu_cqe_copy(&out[n++], &hal->cq[hal->cq_head++ & (EMU_CQ_DEPTH - 1)]);
	return n;
}

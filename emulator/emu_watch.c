/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer death, as the emulated NIC sees it. On a card a dead peer shows up as QP errors
 * (retry exceeded) and async events; here one thread per rank process holds a pidfd for
 * every peer and sleeps in poll() until one of them exits. A peer that exits without
 * having closed its context is failed: its bit goes into the ring header's failed set,
 * where the firmware aborts every op of a team it belongs to, and the progress threads
 * are woken to do so. Costs nothing while everyone lives.
 *
 * The first survivor to notice also does the dead rank's housekeeping: it marks the rank
 * closed, so the last rank to leave still removes the job segment, and unlinks the rank's
 * ctx.empty() segments.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "emu_internal.h"
#include "offload_atomic.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define EMU_WATCH_POLL_MS 100  /* re-check peers this often when pidfds are unavailable */

static int pid_gone(int32_t pid)
{
	return kill(pid, 0) != 0 && errno == ESRCH;
}

static void reap_dead_rank(struct emu_device *dev, uint32_t rank)
{
	struct emu_rank *r = &dev->ranks[rank];
	struct emu_mr *mrs = &dev->mrs[(uint64_t)rank * EMU_MAX_MRS];
	uint32_t alive = EMU_RANK_ALIVE;
	char name[160];

	/* Every survivor watches; one wins and cleans up after the dead rank. */
	if (!off_cas(&r->state, &alive, EMU_RANK_DEAD))
		return;
	for (uint32_t i = 0; i < EMU_MAX_MRS; i++) {
		if (!off_load_acquire(&mrs[i].key))
			continue;
		if (mrs[i].kind == EMU_MR_SHARED) {
			emu_shared_name(dev, rank, mrs[i].serial, mrs[i].nonce, name, sizeof(name));
			shm_unlink(name);
		}
		off_store_release(&mrs[i].key, 0);  /* nothing of the dead rank stays reachable */
	}
	off_fetch_add(&dev->hdr->closed, 1);
}

/* A peer that closed: its firmware learns it, and learns the deaths the closer knew of
 * at the same moment (it may have closed because of one: the op that fails here must
 * name that death, not the clean close that followed it). */
/* Put the ranks of `set` (but us) into the ring's failed set. */
static void fail_all(struct emu_device *dev, const uint64_t *set)
{
	struct offload_ring_hdr *ring = dev->win.ring;
	uint64_t *failed = emu_ring_failed(dev);
	uint32_t me = dev->attr.rank;

	for (uint32_t w = 0; w < offload_rank_words(dev->attr.size); w++)
		for (uint64_t m = off_load_acquire(&set[w]); m; m &= m - 1) {
			uint32_t r = w * 64 + (uint32_t)__builtin_ctzll(m);

			if (r != me)
				offload_rankset_add(failed, &ring->failed_gen, r);
		}
}

static void peer_closed(struct emu_device *dev, uint32_t rank)
{
	struct offload_ring_hdr *ring = dev->win.ring;

	if (!ring)
		return;
	/* Pairs with emu_job_close(): the closer's deaths are in the dead set before its
	 * CLOSED state. */
	fail_all(dev, dev->dead);
	offload_rankset_add(emu_ring_set(dev, 1), &ring->closed_gen, rank);
}

void emu_sync_peers(struct emu_device *dev)
{
	uint32_t words = offload_rank_words(dev->attr.size), me = dev->attr.rank;
	uint32_t gen = off_load_acquire(&dev->hdr->unreachable_gen);

	if (!dev->win.ring)
		return;
	/* Peers the fabric lost behave like dead ones for the firmware. */
	if (gen != off_read_once(&dev->unreachable_gen_seen)) {
		fail_all(dev, dev->unreachable);
		off_write_once(&dev->unreachable_gen_seen, gen);
	}
	/* Deaths other ranks saw first: a peer's error signal that followed one finds it. */
	gen = off_load_acquire(&dev->hdr->dead_gen);
	if (gen != off_read_once(&dev->dead_gen_seen)) {
		fail_all(dev, dev->dead);
		off_write_once(&dev->dead_gen_seen, gen);
	}
	gen = off_load_acquire(&dev->hdr->closed_gen);
	if (gen == off_read_once(&dev->closed_gen_seen))
		return;
	for (uint32_t w = 0; w < words; w++) {
		uint64_t fresh = off_load_acquire(&dev->closed[w]) &
				 ~off_read_once(&dev->closed_seen[w]);

		if (w == me / 64)
			fresh &= ~(1ull << (me % 64));
		for (uint64_t m = fresh; m; m &= m - 1)
			peer_closed(dev, w * 64 + (uint32_t)__builtin_ctzll(m));
		if (fresh)
			__atomic_fetch_or(&dev->closed_seen[w], fresh, __ATOMIC_SEQ_CST);
	}
	off_write_once(&dev->closed_gen_seen, gen);
}

/* Every rank's NIC hears of a death any of them saw, before the firmware that saw it
 * acts on it: an op that fails on the error signal it sends then names the dead rank on
 * every survivor (the firmware holds such a completion for a moment), not the messenger. */
void emu_publish_death(struct emu_device *dev, uint32_t rank)
{
	if (rank < dev->attr.size)
		offload_rankset_add(dev->dead, &dev->hdr->dead_gen, rank);
}

int32_t emu_peer_lost(struct emu_device *dev, uint32_t rank)
{
	struct offload_ring_hdr *ring = dev->win.ring;
	uint32_t state = off_load_acquire(&dev->ranks[rank].state);

	if (state == EMU_RANK_CLOSED) {
		peer_closed(dev, rank);
		return OFFLOAD_ERR_PEER_CLOSED;
	}
	/* Dead (a survivor reaped it), or its process is gone while its state still says
	 * alive: it exited without closing. The firmware hears of it now, not when our watch
	 * wakes, so that the error it reports and the failed set agree. */
	if (ring && rank != dev->attr.rank) {
		emu_publish_death(dev, rank);
		offload_rankset_add(emu_ring_failed(dev), &ring->failed_gen, rank);
	}
	return OFFLOAD_ERR_PEER;
}

static void peer_failed(struct emu_device *dev, uint32_t rank)
{
	struct offload_ring_hdr *ring = dev->win.ring;

	/* A rank that closed its context cleanly and then exited is not a failure. */
	if (off_load_acquire(&dev->ranks[rank].state) == EMU_RANK_CLOSED)
		return;
	emu_publish_death(dev, rank);
	offload_rankset_add(emu_ring_failed(dev), &ring->failed_gen, rank);
	reap_dead_rank(dev, rank);
	emu_kick_rank(dev, dev->attr.rank);
}

static void *watch_thread(void *arg)
{
	struct emu_device *dev = arg;
	uint32_t n = dev->attr.size, me = dev->attr.rank;
	struct pollfd *fds = calloc(n + 1, sizeof(*fds));
	int32_t *pids = calloc(n, sizeof(*pids));
	int fallback = 0;

	pthread_setname_np(pthread_self(), "dpa-watch");
	if (!fds || !pids)
		goto out;
	fds[n] = (struct pollfd){ .fd = dev->watch_stop_fd, .events = POLLIN };
	for (uint32_t i = 0; i < n; i++) {
		fds[i].fd = -1;
		if (i == me)
			continue;
		pids[i] = off_load_acquire(&dev->ranks[i].pid);
		fds[i].fd = (int)syscall(SYS_pidfd_open, pids[i], 0);
		if (fds[i].fd >= 0) {
			fds[i].events = POLLIN;
		} else if (errno == ESRCH) {
			peer_failed(dev, i);
		} else {
			fallback = 1;  /* no pidfds (old kernel): look with kill(pid, 0) instead */
		}
	}
	while (!off_read_once(&dev->stop)) {
		int rc = poll(fds, n + 1, fallback ? EMU_WATCH_POLL_MS : -1);

		if (rc < 0 && errno != EINTR)
			break;
		if (fds[n].revents)
			break;
		for (uint32_t i = 0; i < n; i++) {
			int dead = fds[i].fd >= 0 ? !!fds[i].revents :
				   i != me && pids[i] > 0 && fallback && pid_gone(pids[i]);

			if (!dead)
				continue;
			peer_failed(dev, i);
			if (fds[i].fd >= 0)
				close(fds[i].fd);
			fds[i].fd = -1;
			pids[i] = 0;
		}
	}
out:
	for (uint32_t i = 0; fds && i < n; i++)
		if (fds[i].fd >= 0)
			close(fds[i].fd);
	free(fds);
	free(pids);
	return NULL;
}

int emu_watch_start(struct emu_device *dev)
{
	int rc;

	dev->watch_stop_fd = eventfd(0, EFD_CLOEXEC);
	if (dev->watch_stop_fd < 0)
		return -errno;
	rc = pthread_create(&dev->watch, NULL, watch_thread, dev);
	if (rc) {
		close(dev->watch_stop_fd);
		dev->watch_stop_fd = -1;
		return -rc;
	}
	dev->watching = 1;
	return 0;
}

void emu_watch_stop(struct emu_device *dev)
{
	uint64_t one = 1;

	if (!dev->watching)
		return;
	if (write(dev->watch_stop_fd, &one, sizeof(one)) != sizeof(one))
		abort();  /* an eventfd write of 1 cannot fail; joining would then hang */
	pthread_join(dev->watch, NULL);
	close(dev->watch_stop_fd);
	dev->watching = 0;
}

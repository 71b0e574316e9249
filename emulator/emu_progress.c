/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Who runs the firmware. A rank's engine is driven by its progress threads (one struct
 * dpa_hal each, calling dpa_progress()), or, while a host thread of the rank waits for a
 * small op, by that host thread itself (cooperative progress): the same passes over the
 * same dpa_hal, only the caller differs, so an exchange needs no hand-off to another
 * thread on either side.
 *
 * Lock rules: a pass on a dpa_hal runs under its `busy` lock (try-lock: the progress
 * thread and a host thread never wait for each other). One host thread drives at a time
 * (drive_lock); while it does, the rank's `driving` word in the job segment sends every
 * wake-up of the rank to it (futex bitset EMU_WAKE_HOST), and the progress threads sleep
 * until it leaves. It leaves them nothing they would not be woken for: it runs passes
 * until one finds no work and no event came in meanwhile, or else wakes them as it goes.
 *
 * Waiting: spin for at most the measured wake-up cost (where the ranks do not outnumber
 * the cores), then sleep on the rank's event word until a doorbell, a peer's write or a
 * sibling's notify bumps it. Never sched_yield: a yielding thread hands its core to any
 * runnable task for a slice and, not being "woken", does not preempt it when its event
 * arrives.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dpa_engine.h"
#include "emu_internal.h"
#include "offload_atomic.h"

#define EMU_WAKE_DPA  1u                /* futex bitset: progress threads */
#define EMU_WAKE_HOST 2u                /* futex bitset: the host thread driving */
#define EMU_SLEEP_SLICE_NS 50000000ll   /* re-check the stop flag at least this often */
#define EMU_WAKE_COST_INIT 20000ull     /* ns, until a wake-up has been measured */
#define EMU_DRIVE_ROUNDS 64             /* passes a post or a test() runs at most */

uint64_t emu_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct timespec emu_ns_to_ts(int64_t ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000ll, .tv_nsec = ns % 1000000000ll };

	return ts;
}

/* bits: 0 for a plain FUTEX_WAIT/WAKE, else a bitset (only on shared words here). */
long emu_futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts, uint32_t bits)
{
	if (!bits)
		return syscall(SYS_futex, word, op, val, ts, NULL, 0);
	op = op == FUTEX_WAIT ? FUTEX_WAIT_BITSET : FUTEX_WAKE_BITSET;
	/* WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline. */
	if (ts) {
		uint64_t at = emu_now_ns() + (uint64_t)ts->tv_sec * 1000000000ull +
			      (uint64_t)ts->tv_nsec;
		struct timespec abs = emu_ns_to_ts((int64_t)at);

		return syscall(SYS_futex, word, op, val, &abs, NULL, bits);
	}
	return syscall(SYS_futex, word, op, val, NULL, NULL, bits);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

void emu_wake_rank(struct emu_device *dev, uint32_t rank)
{
	struct emu_rank *r = &dev->ranks[rank];
	uint32_t bits = 0;

	off_fetch_add(&r->event, 1);
	/* Pairs with a sleeper's fence between announcing itself and re-reading event. */
	off_fence();
	/* While a host thread drives the rank, its progress threads would find nothing to do:
	 * only the driver is woken (it wakes them when it leaves work behind). */
	if (off_read_once(&r->driving))
		bits = off_read_once(&r->drivers) ? EMU_WAKE_HOST : 0;
	else if (off_read_once(&r->sleepers))
		bits = EMU_WAKE_DPA;
	if (!bits)
		return;
	off_write_once(&r->wake_ns, emu_now_ns());  /* the sleeper measures its wake-up */
	emu_futex(&r->event, FUTEX_WAKE, INT_MAX, NULL, bits);
}

int emu_job_bulk(const struct emu_device *dev)
{
	for (uint32_t i = 0; i < dev->attr.size; i++)
		if (off_read_once(&dev->ranks[i].load) == DPA_ENGINE_BULK)
			return 1;
	return 0;
}

static struct emu_rank *self_rank(struct emu_device *dev)
{
	return &dev->ranks[dev->attr.rank];
}

static uint32_t event_snapshot(struct emu_device *dev)
{
	return off_load_acquire(&self_rank(dev)->event);
}

/* How long a waiter spins before it sleeps: never longer than a wake-up costs, and not
 * at all where spinning would keep another rank of the job off its core (spin_us 0). */
static uint64_t spin_budget_ns(const struct emu_device *dev)
{
	uint64_t cap = (uint64_t)dev->attr.spin_us * 1000u;
	uint64_t cost = off_read_once(&dev->wake_cost_ns);

	return cost < cap ? cost : cap;
}

/*
 * Sleep on the event word (bitset `bits`) while it still reads snap, at most ns. count
 * is the rank's sleepers or drivers word, which wakers read after bumping event: the
 * increment, the fence and the re-read below pair with their bump, fence and read.
 */
static void sleep_on_event(struct emu_device *dev, uint32_t snap, uint32_t bits, uint32_t *count,
			   int64_t ns)
{
	struct emu_rank *r = self_rank(dev);
	struct timespec slice = emu_ns_to_ts(ns > 0 ? ns : 1);
	uint64_t t0;
	long rc = -1;

	off_fetch_add(count, 1);
	off_fence();
	t0 = emu_now_ns();
	if (off_load_acquire(&r->event) == snap && !off_read_once(&dev->stop))
		rc = emu_futex(&r->event, FUTEX_WAIT, snap, &slice, bits);
	off_fetch_sub(count, 1);
	if (rc == 0) {
		/* Woken: how long since the waker asked (a moving average of 1/8). */
		uint64_t t1 = emu_now_ns(), at = off_read_once(&r->wake_ns);

		if (at >= t0 && at <= t1) {
			uint64_t cost = off_read_once(&dev->wake_cost_ns);

			off_write_once(&dev->wake_cost_ns, cost - cost / 8 + (t1 - at) / 8);
		}
	}
}

/* The earliest firmware timer of any thread, 0 if none; 1 if one is due now. */
static uint64_t next_timer(struct emu_device *dev, uint64_t now)
{
	uint64_t first = 0;

	for (uint32_t t = 0; t < dev->attr.num_threads; t++) {
		uint64_t at = dpa_engine_wake_at(dev->fw_state, t, now);

		if (at == 1)
			return 1;
		if (at && (!first || at < first))
			first = at;
	}
	return first;
}

/* One firmware pass on hal's queues, by whoever holds hal->busy. */
static int run_pass(struct emu_device *dev, struct dpa_hal *hal, int host)
{
	struct emu_rank *self = self_rank(dev);
	struct offload_thread_stats *st = (struct offload_thread_stats *)dev->win.stats + hal->index;
	uint64_t unreachable = off_read_once(&dev->hdr->unreachable) & ~(1ull << dev->attr.rank);
	uint64_t done = off_read_once(&st->ops_completed);
	int work;

	/* Peers the fabric lost behave like dead ones for the firmware. */
	if (unreachable & ~off_read_once(&dev->unreachable_seen)) {
		struct offload_ring_hdr *ring = dev->win.ring;

		__atomic_fetch_or(&ring->failed_ranks, unreachable, __ATOMIC_SEQ_CST);
		__atomic_fetch_or(&dev->unreachable_seen, unreachable, __ATOMIC_SEQ_CST);
	}
	work = dpa_progress(dev->fw_state, hal);
	enum dpa_engine_load load = dpa_engine_load(dev->fw_state);

	/* Published for every rank's waits (emu_job_bulk()). */
	if (off_read_once(&self->load) != (uint32_t)load)
		off_write_once(&self->load, (uint32_t)load);
	if (host) {  /* read racily by emu_drive_stats() */
		off_write_once(&dev->host_passes, off_read_once(&dev->host_passes) + 1);
		off_write_once(&dev->host_ops, off_read_once(&dev->host_ops) +
			       (off_read_once(&st->ops_completed) - done));
	}
	return work;
}

/* A progress thread whose pass found nothing: spin (if allowed), then sleep until an
 * event, its firmware timer or, at the latest, the next slice. */
static void thread_idle(struct emu_device *dev, struct dpa_hal *hal, uint32_t snap, int spin)
{
	struct emu_rank *r = self_rank(dev);
	uint64_t now = emu_now_ns(), timer = dpa_engine_wake_at(dev->fw_state, hal->index, now);
	uint64_t spin_end = now + (spin ? spin_budget_ns(dev) : 0);
	int64_t ns = EMU_SLEEP_SLICE_NS;

	if (timer && timer <= now)
		return;  /* a firmware timeout expired: no event will say so */
	while (now < spin_end) {
		if (off_load_acquire(&r->event) != snap || off_read_once(&dev->stop) ||
		    off_read_once(&r->driving) || (timer && now >= timer))
			return;
		for (int i = 0; i < 64; i++)
			cpu_relax();
		now = emu_now_ns();
	}
	if (timer && timer - now < (uint64_t)ns)
		ns = (int64_t)(timer - now);
	sleep_on_event(dev, snap, EMU_WAKE_DPA, &r->sleepers, ns);
}

static void *progress_thread(void *arg)
{
	struct dpa_hal *hal = arg;
	struct emu_device *dev = hal->dev;
	struct emu_rank *self = self_rank(dev);
	char name[16];

	snprintf(name, sizeof(name), "dpa-r%u-t%u", dev->attr.rank, hal->index);
	pthread_setname_np(pthread_self(), name);
	while (!off_read_once(&dev->stop)) {
		uint32_t snap = event_snapshot(dev);

		/* A host thread runs the engine: sleep until it leaves (it wakes us if it
		 * leaves work behind) or an event comes after it left. */
		if (off_load_acquire(&self->driving) || !off_trylock(&hal->busy)) {
			thread_idle(dev, hal, snap, 0);
			continue;
		}
		int work = run_pass(dev, hal, 0);

		off_unlock(&hal->busy);
		if (!work)
			thread_idle(dev, hal, snap, 1);
	}
	return NULL;
}

int emu_threads_start(struct emu_device *dev)
{
	off_write_once(&dev->wake_cost_ns, EMU_WAKE_COST_INIT);
	for (uint32_t i = 0; i < dev->attr.num_threads; i++) {
		int rc;

		dev->hals[i].dev = dev;
		dev->hals[i].index = i;
		rc = pthread_create(&dev->threads[i], NULL, progress_thread, &dev->hals[i]);
		if (rc) {
			emu_threads_stop(dev);
			return -rc;
		}
		dev->nthreads_started++;
	}
	return 0;
}

void emu_threads_stop(struct emu_device *dev)
{
	off_store_release(&dev->stop, 1);
	if (dev->ranks) {  /* every sleeper: the progress threads and a driving host thread */
		off_fetch_add(&self_rank(dev)->event, 1);
		emu_futex(&self_rank(dev)->event, FUTEX_WAKE, INT_MAX, NULL, FUTEX_BITSET_MATCH_ANY);
	}
	for (uint32_t i = 0; i < dev->nthreads_started; i++)
		pthread_join(dev->threads[i], NULL);
	dev->nthreads_started = 0;
}

/* Does the engine need a pass without any event coming: a command not taken, or a timer? */
static int work_waiting(struct emu_device *dev)
{
	struct offload_ring_hdr *ring = dev->win.ring;

	return off_load_acquire(&ring->sq_tail) != off_read_once(&ring->sq_head) ||
	       next_timer(dev, emu_now_ns()) != 0;
}

/* One pass on every thread's queues whose lock is free; *all: every lock was. */
static int drive_round(struct emu_device *dev, int *all)
{
	int work = 0;

	*all = 1;
	for (uint32_t t = 0; t < dev->attr.num_threads; t++) {
		struct dpa_hal *hal = &dev->hals[t];

		if (!off_trylock(&hal->busy)) {
			*all = 0;  /* its progress thread is ending a pass: it sees `driving` next */
			continue;
		}
		work += run_pass(dev, hal, 1);
		off_unlock(&hal->busy);
	}
	return work;
}

/* The driver's wait between rounds: like thread_idle, also ending when *word moves. */
static void host_idle(struct emu_device *dev, uint32_t snap, uint32_t *word, uint32_t seen,
		      uint64_t deadline)
{
	struct emu_rank *r = self_rank(dev);
	uint64_t now = emu_now_ns(), timer = next_timer(dev, now);
	uint64_t spin_end = now + spin_budget_ns(dev), until = deadline;

	if (timer == 1)
		return;
	while (now < spin_end) {
		if (off_load_acquire(&r->event) != snap || off_load_acquire(word) != seen ||
		    off_read_once(&dev->stop) || now >= deadline || (timer && now >= timer))
			return;
		for (int i = 0; i < 64; i++)
			cpu_relax();
		now = emu_now_ns();
	}
	if (timer && timer < until)
		until = timer;
	if (until - now > (uint64_t)EMU_SLEEP_SLICE_NS)
		until = now + (uint64_t)EMU_SLEEP_SLICE_NS;
	if (until > now)
		sleep_on_event(dev, snap, EMU_WAKE_HOST, &r->drivers, (int64_t)(until - now));
}

/*
 * Cooperative progress (host_device_ops.drive): run this rank's firmware on the calling
 * host thread until *word != seen, or (word NULL) until a round finds nothing to do.
 * Bulk ops stay with the progress threads (offload: the host sleeps meanwhile).
 */
int emu_drive(struct host_device *hd, uint32_t *word, uint32_t seen, int64_t timeout_ns)
{
	struct emu_device *dev = to_emu(hd);
	struct emu_rank *r = self_rank(dev);
	uint64_t deadline = emu_now_ns() + (uint64_t)(timeout_ns > 0 ? timeout_ns : 0);
	int rc = -EBUSY, quiet = 0, rounds = 0, all;
	uint32_t snap = 0;

	if (!dev->nthreads_started || !off_trylock(&dev->drive_lock))
		return -EBUSY;
	if (dpa_engine_load(dev->fw_state) == DPA_ENGINE_BULK) {
		off_unlock(&dev->drive_lock);
		return -EBUSY;
	}
	off_store_release(&r->driving, 1);
	off_fence();  /* pairs with wakers' fence: from here on, this rank's wakes are ours */
	while (!off_read_once(&dev->stop)) {
		snap = event_snapshot(dev);
		int work = drive_round(dev, &all);

		quiet = !work && all;
		if (dpa_engine_load(dev->fw_state) == DPA_ENGINE_BULK)
			break;  /* bulk work stays with the progress threads */
		if (!word) {  /* a post or a test(): until nothing is left to do */
			if (quiet)
				rc = 0;
			if (quiet || !all || ++rounds >= EMU_DRIVE_ROUNDS)
				break;
			continue;
		}
		if (rc == 0 || off_load_acquire(word) != seen) {
			/* Done. A round or two more takes the completions of what the last pass
			 * posted, so that we leave the threads nothing to be woken for. */
			rc = 0;
			if (quiet || ++rounds >= 4)
				break;
			continue;
		}
		if (emu_now_ns() >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		if (quiet)
			host_idle(dev, snap, word, seen, deadline);
	}
	off_store_release(&r->driving, 0);
	/* Pairs with a progress thread's sleepers increment and fence before it sleeps: it
	 * either sees driving clear, or we see it asleep. It needs waking only if we leave
	 * work behind that no later event would announce. */
	off_fence();
	if (off_read_once(&r->sleepers) &&
	    (!quiet || off_load_acquire(&r->event) != snap || work_waiting(dev)))
		emu_wake_rank(dev, dev->attr.rank);
	off_unlock(&dev->drive_lock);
	return rc;
}

void emu_drive_stats(struct host_device *hd, uint64_t *ops, uint64_t *passes)
{
	struct emu_device *dev = to_emu(hd);

	*ops = off_read_once(&dev->host_ops);
	*passes = off_read_once(&dev->host_passes);
}

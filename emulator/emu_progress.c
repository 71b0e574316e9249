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
 * wake-up of the rank to it, and the progress threads sleep until it leaves. It leaves
 * them nothing they would not be woken for: it runs passes until one finds no work and no
 * event came in meanwhile, or else wakes them as it goes.
 *
 * The host thread's side, the drive, is emu_drive.c.
 *
 * Waiting (emu_spin.c): spin at most spin_us (and at most what a wake-up was measured to
 * cost), and only while every awake thread of the job has a core (the job header counts
 * those asleep), or, a driver, while no other awake thread of the job last ran on its
 * vCPU, and no thread woken a while ago still waits for one (then it is queued behind
 * the spinner); else sleep until a doorbell, a peer's write or a sibling's notify bumps
 * the rank's event word. A peer's write does not wake the progress thread while the
 * host's lease holds (a host that drove small ops is back within microseconds). Every
 * sleeper of the job waits on one futex, the job's bell, with a bit of its own, so that
 * one FUTEX_WAKE at the end of a pass wakes every rank the pass wrote to; a driver asks
 * to sleep through peers' writes until as many came in as its ops need
 * (dpa_engine_events_needed: an eager all-to-all waits for every block).
 * No yield-polling: a yielding thread hands its core to any runnable task for a slice
 * and, not being "woken", does not preempt it when its event arrives. The one yield is
 * the driver's hand-off (host_idle): once per wait, and once after each sleep, while a
 * thread of the job waits for a core.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dpa_engine.h"
#include "emu_internal.h"
#include "offload_atomic.h"

#define EMU_WAKE_COST_INIT 20000ull     /* ns, until a wake-up has been measured */
#define EMU_NAP_AFTER_NS 2000000ull     /* an idle poll naps from this much idle time on... */
#define EMU_NAP_MAX_NS 1000000ull       /* ... at most this long */

static struct emu_rank *self_rank(struct emu_device *dev)
{
	return &dev->ranks[dev->attr.rank];
}

static uint32_t event_snapshot(struct emu_device *dev)
{
	return off_load_acquire(&self_rank(dev)->event);
}

/*
 * Sleep (bits: EMU_WAKE_DPA or EMU_WAKE_HOST) while the rank's event still reads snap,
 * at most ns, on the job's bell. The caller announced itself where wakers look (sleepers,
 * or armed) and fenced: that pairs with their bump of event, fence and read. Counted in
 * the job's asleep meanwhile.
 */
static void sleep_on_event(struct emu_device *dev, uint32_t snap, uint32_t bits, int64_t ns)
{
	struct emu_rank *r = self_rank(dev);
	struct timespec slice = emu_ns_to_ts(ns > 0 ? ns : 1);
	uint64_t t0 = emu_now_ns();
	long rc = -1;

	/* Read before event: a waker bumps event, then the bell. */
	uint32_t bell = off_load_acquire(&dev->hdr->bell);

	if (off_load_acquire(&r->event) == snap && !off_read_once(&dev->stop) &&
	    !(bits == EMU_WAKE_HOST && off_load_acquire(&dev->closing)))
		rc = emu_futex(&dev->hdr->bell, FUTEX_WAIT, bell, &slice,
			       emu_bell_bits(dev->attr.rank, bits));
	if (rc != 0)
		return;
	off_write_once(&r->waking_ns, 0);  /* running: no spinner need leave its core to us */
	/* Woken: how long since the waker asked (a moving average of 1/8). */
	uint64_t t1 = emu_now_ns(), at = off_read_once(&r->wake_ns);

	if (at >= t0 && at <= t1) {
		uint64_t cost = off_read_once(&dev->wake_cost_ns);

		off_write_once(&dev->wake_cost_ns, cost - cost / 8 + (t1 - at) / 8);
	}
}

/* Progress thread `thread`'s sleep (any event wakes it; a doorbell not while it naps). */
static void thread_sleep(struct emu_device *dev, uint32_t thread, uint32_t snap, int64_t ns,
			 int nap)
{
	struct emu_rank *r = self_rank(dev);
	uint64_t bit = 1ull << thread;

	if (nap)  /* before the sleepers bit: a doorbell that sees that one sees this */
		__atomic_fetch_or(&r->napping, bit, __ATOMIC_SEQ_CST);
	off_write_once(&r->dpa_sleep_until, emu_now_ns() + (uint64_t)ns);  /* emu_host_leased() */
	off_fetch_add(&dev->hdr->asleep, 1);
	__atomic_fetch_or(&r->sleepers, bit, __ATOMIC_SEQ_CST);
	off_fence();
	sleep_on_event(dev, snap, EMU_WAKE_DPA, ns);
	/* Not taken by a waker (timeout, or event moved before we slept): our bit is still
	 * there, and we take ourselves out. */
	if (__atomic_fetch_and(&r->sleepers, ~bit, __ATOMIC_SEQ_CST) & bit)
		off_fetch_sub(&dev->hdr->asleep, 1);
	if (nap)
		__atomic_fetch_and(&r->napping, ~bit, __ATOMIC_SEQ_CST);
}

/*
 * The idle poll (io_uring's SQPOLL idle, with naps instead of a spin: the cores are
 * shared). For idle_poll_us after it last worked on a bulk op (what the host leaves to
 * it where the ranks outnumber the cores), a progress thread that has been idle for
 * EMU_NAP_AFTER_NS sleeps in naps of an eighth of its idle time (at most EMU_NAP_MAX_NS)
 * and looks at its event word after each; the host's doorbell does not wake it meanwhile
 * (emu_bell.c), so a post costs the poster no system call and no inter-processor
 * interrupt, as a doorbell write on a card costs the host nothing more. A command waits
 * at most a nap: an eighth of the time the thread had been idle, 1 ms at most. Before
 * EMU_NAP_AFTER_NS the thread sleeps as outside the poll, woken by the doorbell: ops
 * posted back to back start at once, and no nap's timer interrupts the ranks still at
 * work (naps from the first 50 us of idle time cost n=8's bulk all-to-all ~5%).
 * Peers' writes wake it at once either way. The poll's nap length, 0 outside the poll.
 */
static int in_idle_poll(const struct emu_device *dev, const struct dpa_hal *hal, uint64_t now)
{
	return hal->bulk_ns && now - hal->bulk_ns < (uint64_t)dev->attr.idle_poll_us * 1000u;
}

static uint64_t idle_nap_ns(const struct emu_device *dev, const struct dpa_hal *hal,
			    uint64_t now)
{
	uint64_t nap = (now - hal->work_ns) / 8;

	if (!in_idle_poll(dev, hal, now))
		return 0;
	return nap > EMU_NAP_MAX_NS ? EMU_NAP_MAX_NS : nap ? nap : 1;
}

/* The driver's sleep: peers' writes wake it once `need` of them came in (kicks at once). */
void emu_driver_sleep(struct emu_device *dev, uint32_t snap, uint32_t need, int64_t ns)
{
	struct emu_rank *r = self_rank(dev);
	uint32_t armed = 1;

	off_write_once(&r->wake_event, snap + need);
	off_fetch_add(&dev->hdr->asleep, 1);
	off_write_once(&r->sleep_cpu, emu_cpu_now());  /* a waker may hand our wake-up there */
	emu_publish_cpu(dev, EMU_CPU_ASLEEP);
	__atomic_store_n(&r->armed, 1, __ATOMIC_SEQ_CST);
	off_fence();
	sleep_on_event(dev, snap, EMU_WAKE_HOST, ns);
	emu_publish_cpu(dev, emu_cpu_now());
	if (off_cas(&r->armed, &armed, 0))  /* no waker took us: take ourselves out */
		off_fetch_sub(&dev->hdr->asleep, 1);
}

/* The earliest firmware timer of any thread, 0 if none; 1 if one is due now. */
uint64_t emu_next_timer(struct emu_device *dev, uint64_t now)
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
int emu_run_pass(struct emu_device *dev, struct dpa_hal *hal, int host)
{
	struct emu_rank *self = self_rank(dev);
	struct offload_thread_stats *st = (struct offload_thread_stats *)dev->win.stats + hal->index;
	uint64_t done = off_read_once(&st->ops_completed);
	int work;

	/* Running: no spinner need leave its core to us (a ring marked us waking, maybe
	 * after we had stopped waiting: nobody else clears it then). */
	if (off_read_once(&self->waking_ns))
		off_write_once(&self->waking_ns, 0);
	hal->now_ns = 0;  /* emu_pass_now: this pass's clock (emu_flush_wakes resets it too) */
	emu_sync_peers(dev);  /* closed and unreachable peers, for the firmware */
	work = emu_wire_place(dev, hal);  /* peers' writes on our wires, into place */
	work += dpa_progress(dev->fw_state, hal);
	emu_flush_wakes(hal);  /* the peers this pass wrote to, woken at once */
	enum dpa_engine_load load = dpa_engine_load(dev->fw_state);

	/* Published for every rank's waits (job_bulk()) and wakers (wake()). */
	if (off_read_once(&self->load) != (uint32_t)load)
		off_write_once(&self->load, (uint32_t)load);
	if (!host && work) {  /* this progress thread's idle poll (idle_nap_ns) */
		hal->work_ns = emu_now_ns();
		if (load == DPA_ENGINE_BULK)
			hal->bulk_ns = hal->work_ns;
	}
	if (host) {  /* read racily by emu_drive_stats() */
		off_write_once(&dev->host_passes, off_read_once(&dev->host_passes) + 1);
		off_write_once(&dev->host_ops, off_read_once(&dev->host_ops) +
			       (off_read_once(&st->ops_completed) - done));
	}
	return work;
}

/* Has something come in that a sleeping or spinning progress thread must look at? */
static int thread_called(struct emu_device *dev, uint32_t snap, uint64_t timer, uint64_t now)
{
	struct emu_rank *r = self_rank(dev);

	return off_load_acquire(&r->event) != snap || off_read_once(&dev->stop) ||
	       (timer && now >= timer);
}

/* A progress thread whose pass found nothing (or a host thread drives: spin 0): spin (if
 * allowed; never while a host drives), nap through its idle poll, then sleep until an
 * event, its firmware timer or, at the latest, the next slice. A driver wakes a sleeper
 * if it leaves work behind; a napper keeps its idle poll through a host's small ops. */
static void thread_idle(struct emu_device *dev, struct dpa_hal *hal, uint32_t snap, int spin)
{
	uint64_t now = emu_now_ns(), timer = dpa_engine_wake_at(dev->fw_state, hal->index, now);
	uint64_t spin_end = now + (spin ? emu_spin_budget_ns(dev) : 0);

	if (timer && timer <= now)
		return;  /* a firmware timeout expired: no event will say so */
	while (now < spin_end && emu_cores_to_spare(dev) && !emu_woken_waiting(dev, now)) {
		if (thread_called(dev, snap, timer, now) || off_read_once(&self_rank(dev)->driving))
			return;
		for (int i = 0; i < OFF_SPIN_PAUSES; i++)
			off_cpu_relax();
		now = emu_now_ns();
	}
	for (;;) {
		uint64_t poll = idle_nap_ns(dev, hal, now), idle = now - hal->work_ns;
		int nap = poll && idle >= EMU_NAP_AFTER_NS;
		/* In the poll but not napping yet: a plain sleep until the naps start. */
		int64_t ns = nap ? (int64_t)poll : poll ? (int64_t)(EMU_NAP_AFTER_NS - idle) :
			     EMU_SLEEP_SLICE_NS;

		uint64_t lease = off_read_once(&self_rank(dev)->host_lease_ns);

		if (timer && timer - now < (uint64_t)ns)
			ns = (int64_t)(timer - now);
		if (lease > now && lease - now < (uint64_t)ns)  /* peers' writes may not wake us */
			ns = (int64_t)(lease - now);
		thread_sleep(dev, hal->index, snap, ns, nap);
		now = emu_now_ns();
		if (!poll || thread_called(dev, snap, timer, now))
			return;
	}
}

/*
 * Where the ranks outnumber the cores, a progress thread that copies bulk ops runs on a
 * core of its own (rank and thread index, round robin over the process's CPUs) until its
 * idle poll after them ends. Left to the scheduler, two copiers of different ranks shared
 * one vCPU while the other idled (a thread that ran in the last 0.5 ms is not pulled to an
 * idle CPU: sched_migration_cost), 10% of the time at n=4. 1 MiB per peer, numpy, op time
 * of the slowest rank alternated with and without: n=8 median 5.8 against 6.4 ms (5 of 6
 * pairs), n=4 1.38 against 1.55 ms (5 of 8); small ops never pin (docs/performance.md).
 */
static void pin_for_bulk(struct emu_device *dev, struct dpa_hal *hal, int bulk)
{
	cpu_set_t cpus;

	if (bulk == hal->pinned || dev->attr.size <= dev->ncores ||
	    sched_getaffinity(0, sizeof(cpus), &cpus))
		return;
	hal->pinned = bulk;
	if (!bulk) {
		pthread_setaffinity_np(pthread_self(), sizeof(hal->cpus), &hal->cpus);
		return;
	}
	hal->cpus = cpus;
	uint32_t k = (dev->attr.rank * dev->attr.num_threads + hal->index) % dev->ncores, seen = 0;

	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (CPU_ISSET(c, &cpus) && seen++ == k) {
			CPU_ZERO(&cpus);
			CPU_SET(c, &cpus);
			pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus);
			return;
		}
	}
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
		int work = emu_run_pass(dev, hal, 0);

		off_unlock(&hal->busy);
		/* Where the ranks outnumber the cores, a bulk op's waiter that took over sleeps
		 * until this pass is over (emu_drive.c). Pairs with its fence between setting
		 * driving and taking our lock. */
		if (dev->attr.size > dev->ncores) {
			off_fence();
			if (off_read_once(&self->driving))
				emu_kick_rank(dev, dev->attr.rank);
		}
		/* Pinned through the idle poll after bulk work (a bulk loop's next op). */
		if (hal->bulk_ns)
			pin_for_bulk(dev, hal, in_idle_poll(dev, hal, emu_now_ns()));
		if (!work)
			thread_idle(dev, hal, snap, 1);
	}
	return NULL;
}

int emu_threads_start(struct emu_device *dev)
{
	CPU_ZERO(&dev->cpus);
	dev->ncores = sched_getaffinity(0, sizeof(dev->cpus), &dev->cpus) ? 1 :
		      (uint32_t)CPU_COUNT(&dev->cpus);
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
		uint32_t me = dev->attr.rank;

		off_fetch_add(&self_rank(dev)->event, 1);
		emu_ring(dev, emu_bell_bits(me, EMU_WAKE_DPA) | emu_bell_bits(me, EMU_WAKE_HOST),
			 &me, 1);
	}
	for (uint32_t i = 0; i < dev->nthreads_started; i++)
		pthread_join(dev->threads[i], NULL);
	dev->nthreads_started = 0;
	/* A host thread driving (close called from another thread) sees stop after its
	 * pass: the engine's memory may go only once it left. */
	while (off_load_acquire(&dev->drive_lock))
		off_cpu_relax();
}

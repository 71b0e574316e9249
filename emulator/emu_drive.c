/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cooperative progress (host_device_ops.drive): a host thread that posts a small op, or
 * waits for or tests one, runs its rank's firmware itself, pass after pass on the same
 * dpa_hal as the progress threads (emu_progress.c has the whole picture: the lock rules,
 * how a driver sleeps and is woken). Here: how long a drive goes on, when it spins, hands
 * its core over or sleeps between passes, and what it leaves the progress threads.
 *
 * Closing from another thread (host_ctx.c counts the host threads inside the library and
 * closes the device only once none is): emu_wake_waiters() marks the device closing and
 * wakes a driver asleep between rounds; a driver sees the mark after its pass and leaves,
 * and a drive that starts after it refuses, so the closer's wait ends promptly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>

#include "dpa_engine.h"
#include "emu_internal.h"
#include "offload_atomic.h"

#define EMU_DRIVE_ROUNDS 64             /* passes a post or a test() runs at most */
#define EMU_SPIN_PREEMPTED_NS 10000ull  /* a spin step this long: another task ran */
#define EMU_BESIDE_IDLE_OFF_NS 100000000ull  /* ... then no spin beside idle ranks */

/* A command posted that no pass has taken yet? */
static int cmd_waiting(struct emu_device *dev)
{
	struct offload_ring_hdr *ring = dev->win.ring;

	return off_load_acquire(&ring->sq_tail) != off_read_once(&ring->sq_head);
}

/* Is a firmware timer set on any thread, due or not? (Read with `now` 0: no clock read,
 * and a due timer is left for the pass that runs it to take.) */
static int timer_set(struct emu_device *dev)
{
	for (uint32_t t = 0; t < dev->attr.num_threads; t++)
		if (dpa_engine_wake_at(dev->fw_state, t, 0))
			return 1;
	return 0;
}

/* Does the engine need a pass without any event coming: a command not taken, or a timer? */
static int work_waiting(struct emu_device *dev)
{
	return cmd_waiting(dev) || emu_wire_pending(dev) || timer_set(dev);
}

/* Could a pass do anything now? Not with no op in flight, no completion to reap and no
 * work waiting: the pass that completed the last op left nothing behind, and the one a
 * drive would run to see that would find nothing (0.85 of them per 1 KiB all-to-all at
 * n=4, and one per post that completes at once). */
static int engine_settled(struct emu_device *dev)
{
	if (dpa_engine_load(dev->fw_state) != DPA_ENGINE_IDLE)
		return 0;
	/* Read after the round released the locks: the progress threads pass no more while
	 * we drive, so these hold still. */
	for (uint32_t t = 0; t < dev->attr.num_threads; t++)
		if (off_read_once(&dev->hals[t].cq_head) != off_read_once(&dev->hals[t].cq_tail))
			return 0;
	return !work_waiting(dev);
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
		work += emu_run_pass(dev, hal, 1);
		off_unlock(&hal->busy);
	}
	return work;
}

/*
 * The driver's wait between rounds: like thread_idle, also ending when *word moves.
 *
 * Before it sleeps, the hand-off: if a thread of this job is awake without a core (the
 * job's awake threads outnumber the cores: a peer rank that was woken or never slept,
 * likely queued on ours), the driver calls sched_yield once and goes back to its round
 * instead. The peer then runs on this core at once, with no wake-up at all (a sleeping
 * driver costs a futex wake later, an inter-processor interrupt when its core is busy or
 * halted: 4 ranks on 2 vCPUs, 1 KiB all-to-all, 64-117 us per op against 46-66 with the
 * hand-off, docs/performance.md). Once per drive, and once more only after a round that
 * found work (a peer's write came in) or a sleep: a yield is never repeated while nothing
 * comes in, so an unrelated busy task cannot keep the driver off its core by
 * yield-polling; with nobody of the job waiting for a core there is no yield at all.
 * Meanwhile idle_event tells the others on this CPU that we have nothing to do until our
 * event moves: one of them may spin rather than hand us the core (emu_cpu_alone).
 */
static void host_idle(struct emu_device *dev, uint32_t snap, uint32_t *word, uint32_t seen,
		      uint64_t deadline, int *yielded)
{
	struct emu_rank *r = &dev->ranks[dev->attr.rank];
	uint64_t now = emu_now_ns(), timer = emu_next_timer(dev, now);
	uint64_t spin_end = now + emu_spin_budget_ns(dev), until = deadline;

	if (timer == 1)
		return;
	off_write_once(&r->idle_event, snap + 1);
	while (now < spin_end && (emu_cores_to_spare(dev) || emu_cpu_alone(dev, now)) &&
	       !emu_woken_waiting(dev, now)) {
		uint64_t before = now;

		if (off_load_acquire(&r->event) != snap || off_load_acquire(word) != seen ||
		    off_read_once(&dev->stop) || off_read_once(&dev->closing) || now >= deadline ||
		    (timer && now >= timer))
			goto out;
		for (int i = 0; i < OFF_SPIN_PAUSES; i++)
			off_cpu_relax();
		emu_take_handovers(dev, off_read_once(&r->host_cpu));
		now = emu_now_ns();
		if (now - before > EMU_SPIN_PREEMPTED_NS)  /* the CPU is not ours alone */
			off_write_once(&dev->beside_idle_off_ns, now + EMU_BESIDE_IDLE_OFF_NS);
	}
	if (timer && timer < until)
		until = timer;
	if (until - now > (uint64_t)EMU_SLEEP_SLICE_NS)
		until = now + (uint64_t)EMU_SLEEP_SLICE_NS;
	if (until <= now || emu_balance(dev, now))
		goto out;
	if (!*yielded && !emu_cores_to_spare(dev)) {
		*yielded = 1;
		off_write_once(&dev->handoff_yields, off_read_once(&dev->handoff_yields) + 1);
		sched_yield();
		goto out;
	}
	*yielded = 0;
	off_write_once(&dev->host_sleeps, off_read_once(&dev->host_sleeps) + 1);
	emu_driver_sleep(dev, snap, dpa_engine_events_needed(dev->fw_state), (int64_t)(until - now));
out:
	off_write_once(&r->idle_event, 0);
}

/*
 * Bulk work (long copies) is the waiting thread's, as an MPI rank copies in its blocking
 * call; where every rank has a core of its own, the posting thread's too: a progress
 * thread would need a wake-up to start and the host one to finish, on cores that have
 * nothing else to do (n=2, 1 MiB per peer: 0.5-0.65x Open MPI's busbw, against 0.85-0.9x).
 * Where the ranks outnumber the cores, a post hands the op to the progress threads and
 * returns, and test() never copies (a caller that overlaps gets the offload); a waiter
 * takes over what is left, from the progress threads' next pass on. A waiter that slept
 * instead was woken once the last copy was done, and then ran only when the scheduler
 * gave it a core: with the other ranks computing between ops, up to a slice later (1.7 ms
 * after its op had completed, in a trace; 1 MiB per peer from numpy arrays at n=4 on 2
 * vCPUs, 1 ms of memory-bound compute before each op: 0.71-0.76x Open MPI's busbw, against
 * 0.96-1.25x now, docs/performance.md, eighteenth session).
 */
static int may_drive(const struct emu_device *dev, uint32_t flags)
{
	int host_copies = !(flags & HOST_DRIVE_NO_BULK) &&
			  (dev->attr.size <= dev->ncores || (flags & HOST_DRIVE_BULK_WAIT));

	/* The op is bulk even before a pass took its command (the load says idle then). */
	if (flags & (HOST_DRIVE_BULK_CMD | HOST_DRIVE_BULK_WAIT))
		return host_copies;
	return dpa_engine_load(dev->fw_state) != DPA_ENGINE_BULK || host_copies;
}

/*
 * Cooperative progress (host_device_ops.drive): run this rank's firmware on the calling
 * host thread until *word != seen, or (word NULL) until a round finds nothing to do.
 * Bulk ops a post or a test() finds stay with the progress threads (may_drive).
 */
int emu_drive(struct host_device *hd, uint32_t *word, uint32_t seen, int64_t timeout_ns,
	      uint32_t flags)
{
	struct emu_device *dev = to_emu(hd);
	struct emu_rank *r = &dev->ranks[dev->attr.rank];
	/* A post or a test() runs no clock: it never sleeps. A wait reads it once a round
	 * did not end it (most small waits end in their first). */
	uint64_t deadline = 0;
	int rc = -EBUSY, quiet = 0, rounds = 0, bulk = 0, all, yielded = 0;
	uint32_t snap = 0;

	if (!dev->nthreads_started)
		return -EBUSY;
	if (!may_drive(dev, flags) || !off_trylock(&dev->drive_lock))
		return -EBUSY;
	/* Closing: emu_wake_waiters() (host_ctx_shutdown) or emu_threads_stop() waits for us. */
	if (off_load_acquire(&dev->stop) || off_load_acquire(&dev->closing)) {
		off_unlock(&dev->drive_lock);
		return -EBUSY;
	}
	off_store_release(&r->driving, 1);
	off_fence();  /* pairs with wakers' fence: from here on, this rank's wakes are ours */
	if (word)
		off_write_once(&dev->host_waits, off_read_once(&dev->host_waits) + 1);
	while (!off_read_once(&dev->stop) && !off_load_acquire(&dev->closing)) {
		snap = off_load_acquire(&r->event);
		uint32_t cpu = emu_cpu_now();

		emu_publish_cpu(dev, cpu);  /* cpu_alone() of the others reads it */
		emu_take_handovers(dev, cpu);
		int work = drive_round(dev, &all);

		if (work && yielded) {  /* news: the next idle step may hand the core over again */
			yielded = 0;
			off_write_once(&dev->handoff_rearms, off_read_once(&dev->handoff_rearms) + 1);
		}
		quiet = !work && all;
		if (!may_drive(dev, flags & ~HOST_DRIVE_BULK_CMD)) {
			bulk = 1;  /* bulk work stays with the progress threads */
			break;
		}
		if (!quiet && all && engine_settled(dev))
			quiet = 1;  /* the round that would show it is not run */
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
		uint64_t now = emu_now_ns();

		if (!deadline) {
			deadline = now + (uint64_t)(timeout_ns > 0 ? timeout_ns : 0);
		} else if (now >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		/* Where the ranks outnumber the cores, a bulk waiter finding a progress thread
		 * inside a pass (a copy of up to a chunk) sleeps until it ends it (the thread
		 * kicks us) instead of spinning on its lock, on a core the copy may need. */
		if (quiet || (!all && (flags & HOST_DRIVE_BULK_WAIT) &&
			      dev->attr.size > dev->ncores))
			host_idle(dev, snap, word, seen, deadline, &yielded);
	}
	/* Small ops left in flight (the load the last pass published): back soon, as a rule
	 * (emu_host_leased). The line is written only when the lease changes. */
	int small_left = !bulk && dev->attr.num_threads == 1 &&
			 off_read_once(&r->load) == DPA_ENGINE_SMALL;
	uint64_t lease = small_left ? emu_now_ns() + EMU_HOST_LEASE_NS : 0;

	if (lease || off_read_once(&r->host_lease_ns))
		off_write_once(&r->host_lease_ns, lease);
	off_store_release(&r->driving, 0);
	/* Pairs with a progress thread's sleepers increment and fence before it sleeps: it
	 * either sees driving clear, or we see it asleep. It needs waking only if we leave
	 * work behind that no later event would announce (or, leased, its sleep's end).
	 * Pairs with emu_hand_over's fence too: a waker that saw us driving handed its
	 * wake-up to us, and we take it now. */
	off_fence();
	emu_take_handovers(dev, off_read_once(&r->host_cpu));
	if (bulk)  /* handed over as a post would: a thread in its idle poll sees it */
		emu_doorbell_rank(dev, dev->attr.rank);
	else if (off_read_once(&r->sleepers) &&
		 (!quiet || work_waiting(dev) || (off_load_acquire(&r->event) != snap &&
						  off_read_once(&r->load) != DPA_ENGINE_IDLE &&
						  !emu_host_leased(dev, dev->attr.rank, NULL))))
		emu_kick_rank(dev, dev->attr.rank);
	off_unlock(&dev->drive_lock);
	if ((flags & HOST_DRIVE_SMALL_POST) && !bulk)
		emu_hand_back(dev);
	return rc;
}

void emu_wake_waiters(struct host_device *hd, uint32_t *word)
{
	struct emu_device *dev = to_emu(hd);

	/* Before the kick: a driver that reads the event it bumps sees the mark. */
	__atomic_store_n(&dev->closing, 1, __ATOMIC_SEQ_CST);
	if (dev->ranks)
		emu_kick_rank(dev, dev->attr.rank);  /* a driver asleep between rounds */
	emu_wake_word(dev, word);                /* waiters on the completion ring */
}

void emu_drive_stats(struct host_device *hd, struct host_drive_stats *out)
{
	struct emu_device *dev = to_emu(hd);

	out->ops = off_read_once(&dev->host_ops);
	out->passes = off_read_once(&dev->host_passes);
	out->doorbells = off_read_once(&dev->doorbells);
	out->doorbell_wakes = off_read_once(&dev->doorbell_wakes);
	out->waits = off_read_once(&dev->host_waits);
	out->sleeps = off_read_once(&dev->host_sleeps);
	out->handoff_yields = off_read_once(&dev->handoff_yields);
	out->handoff_rearms = off_read_once(&dev->handoff_rearms);
	out->post_yields = off_read_once(&dev->post_yields);
	out->wake_handovers = off_read_once(&dev->wake_handovers);
	out->wire_bytes = off_read_once(&dev->wire_bytes);
	out->wire_direct_bytes = off_read_once(&dev->wire_direct_bytes);
	out->wire_rescues = off_read_once(&dev->wire_rescues);
	out->wire_skipped_bytes = off_read_once(&dev->wire_skipped_bytes);
	out->balance_moves = off_read_once(&dev->balance.moves);
}

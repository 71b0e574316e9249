/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The job's bell: how a rank's firmware runner is woken (emu_progress.c has the whole
 * picture). Every sleeper of the job waits on one futex, the job header's bell, with a bit
 * of its own (emu_bell_bits); a waker takes the sleepers' announcement, counts them out of
 * the job's asleep and rings once for every rank a pass wrote to. Private futex words
 * (the completion ring's cq_tail) and the clock the waits measure by live here too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dpa_engine.h"
#include "emu_internal.h"
#include "offload_atomic.h"

uint64_t emu_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Once a pass: its firmware's deadlines and the leases its writes look at read ten clocks
 * of 42 ns per 1 KiB all-to-all at n=4 (vDSO, this VM). A pass that is about to copy long
 * (emu_flush_wakes) reads it again after. */
uint64_t emu_pass_now(struct dpa_hal *pass)
{
	if (!pass)
		return emu_now_ns();
	if (!pass->now_ns)
		pass->now_ns = emu_now_ns();
	return pass->now_ns;
}

uint32_t emu_cpu_now(void)
{
	int cpu = sched_getcpu();

	return cpu < 0 ? EMU_CPU_UNKNOWN : (uint32_t)cpu;
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

/* FUTEX_WAKE woke n sleepers: they are awake from now on, running or not (job header). */
static void woke(struct emu_device *dev, long n)
{
	if (n > 0)
		off_fetch_sub(&dev->hdr->asleep, (uint32_t)n);
}

/* The bell's bits of rank's progress threads (kind EMU_WAKE_DPA) or driver (EMU_WAKE_HOST). */
uint32_t emu_bell_bits(uint32_t rank, uint32_t kind)
{
	return 1u << ((2 * rank + (kind == EMU_WAKE_HOST)) % 32);
}

/* Ring the bell for `bits`: one bitset FUTEX_WAKE reaches the sleepers of every rank woken
 * (the caller already took them out of the job's asleep: they count as awake from now
 * on). `ranks`, the first EMU_WAKE_LIST of them, only time their wake-up from now. */
void emu_ring(struct emu_device *dev, uint32_t bits, const uint32_t *ranks, uint32_t nranks)
{
	uint64_t now = emu_now_ns();

	for (uint32_t i = 0; i < nranks; i++) {
		struct emu_rank *r = &dev->ranks[ranks[i]];

		off_write_once(&r->wake_ns, now);  /* the sleeper measures its wake-up */
		if (!off_read_once(&r->waking_ns))
			off_write_once(&r->waking_ns, now);
	}
	/* After the events the sleepers compare: one that read the old bell sees them. */
	off_fetch_add(&dev->hdr->bell, 1);
	emu_futex(&dev->hdr->bell, FUTEX_WAKE, INT_MAX, NULL, bits);
}

/*
 * The rank's event counter moved (its firmware has news): wake whoever runs the firmware.
 * While a host thread drives, only it (the progress threads would find nothing to do; it
 * wakes them if it leaves work behind), and once: the first waker to disarm it. Unless
 * forced (kick), a peer's write wakes no driver before the events it said it needs are in
 * (an eager all-to-all waits for every block before it can complete) and no progress
 * thread of a rank with no op in flight (its next post or doorbell looks at everything).
 * With a pass's hal, the bell rings at the end of the pass, once for all it woke.
 */
enum wake_kind { WAKE_EVENT, WAKE_KICK, WAKE_DOORBELL };

/* 1: it woke a sleeper (or left that to the end of the pass). */
static int wake(struct emu_device *dev, uint32_t rank, enum wake_kind kind, struct dpa_hal *pass,
		uint32_t events)
{
	int force = kind != WAKE_EVENT;
	struct emu_rank *r = &dev->ranks[rank];
	uint32_t ev = off_fetch_add(&r->event, events) + events, armed = 1, bits;

	/* Pairs with a sleeper's fence between announcing itself and re-reading event. */
	off_fence();
	/* Whoever takes a sleeper's announcement (armed, or one of sleepers) wakes it and
	 * takes it out of the job's asleep, before the futex call (which a woken thread on
	 * this core may preempt): spinners must count it awake from now on. */
	if (off_read_once(&r->driving)) {
		if (!off_read_once(&r->armed) ||
		    (!force && (int32_t)(ev - off_read_once(&r->wake_event)) < 0) ||
		    !off_cas(&r->armed, &armed, 0))
			return 0;
		off_fetch_sub(&dev->hdr->asleep, 1);
		if (!force && emu_hand_over(dev, rank))
			return 1;
		bits = emu_bell_bits(rank, EMU_WAKE_HOST);
	} else {
		uint64_t taken, asleep = off_read_once(&r->sleepers);

		/* A doorbell finding every sleeper napping leaves them be: each looks at the
		 * event again within its nap (a sleeper sets its napping bit first). A peer's
		 * write leaves them be while the host's lease holds (emu_spin.c). */
		if (!asleep || (!force && off_read_once(&r->load) == DPA_ENGINE_IDLE) ||
		    (!force && emu_host_leased(dev, rank, pass)) ||
		    (kind == WAKE_DOORBELL && !(asleep & ~off_read_once(&r->napping))) ||
		    !(taken = __atomic_exchange_n(&r->sleepers, 0, __ATOMIC_ACQ_REL)))
			return 0;
		off_fetch_sub(&dev->hdr->asleep, (uint32_t)__builtin_popcountll(taken));
		bits = emu_bell_bits(rank, EMU_WAKE_DPA);
	}
	if (!pass) {
		emu_ring(dev, bits, &rank, 1);
		return 1;
	}
	pass->wake_bits |= bits;
	if (pass->nwake < EMU_WAKE_LIST)
		pass->wake_ranks[pass->nwake++] = rank;
	return 1;
}

void emu_flush_wakes(struct dpa_hal *pass)
{
	for (uint32_t i = 0; i < pass->ndue; i++)
		wake(pass->dev, pass->due_ranks[i], WAKE_EVENT, pass, pass->due_events[i]);
	pass->ndue = 0;
	pass->now_ns = 0;  /* a long copy follows: the clock is read again after it */
	if (!pass->wake_bits)
		return;
	emu_ring(pass->dev, pass->wake_bits, pass->wake_ranks, pass->nwake);
	pass->wake_bits = 0;
	pass->nwake = 0;
}

/*
 * A pass's events are announced at its end (emu_flush_wakes), all at once: each announcement
 * is an atomic on the target's event line, and a locked instruction waits for every store
 * before it, the block copies into peers' slots included. Announced write by write, a pass
 * of an eager all-to-all at n=4 waited for each block's lines in turn, three times.
 */
void emu_wake_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	uint32_t i;

	if (!pass) {
		wake(dev, rank, WAKE_EVENT, NULL, 1);
		return;
	}
	for (i = 0; i < pass->ndue && pass->due_ranks[i] != rank; i++)
		;
	if (i < pass->ndue) {
		pass->due_events[i]++;
	} else if (i < EMU_WAKE_LIST) {
		pass->due_ranks[i] = rank;
		pass->due_events[i] = 1;
		pass->ndue++;
	} else {
		wake(dev, rank, WAKE_EVENT, pass, 1);
	}
}

/* emu_wake_rank announced at once (the futex still rung at the pass's end): after a long
 * copy, whose stores drained meanwhile, for a target that should not wait for the rest of
 * the pass (the wire's placed pieces: the sender's next ones wait on their completions). */
void emu_wake_rank_now(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	wake(dev, rank, WAKE_EVENT, pass, 1);
}

void emu_kick_rank(struct emu_device *dev, uint32_t rank)
{
	wake(dev, rank, WAKE_KICK, NULL, 1);
}

void emu_nudge_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	wake(dev, rank, WAKE_KICK, pass, 1);
}

void emu_doorbell_rank(struct emu_device *dev, uint32_t rank)
{
	off_fetch_add(&dev->doorbells, 1);
	if (wake(dev, rank, WAKE_DOORBELL, NULL, 1))
		off_fetch_add(&dev->doorbell_wakes, 1);
}

int emu_wait_word(struct emu_device *dev, uint32_t *word, uint32_t seen, int64_t timeout_ns)
{
	struct timespec ts = emu_ns_to_ts(timeout_ns);
	long rc;

	struct emu_rank *self = dev->ranks ? &dev->ranks[dev->attr.rank] : NULL;
	/* The rank's host thread sleeps here (unless another of its threads drives: that one's
	 * CPU stays published): not back for its firmware on its own, so no lease either. */
	uint32_t *cpu = self && !off_read_once(&self->driving) ? &self->host_cpu : NULL;

	off_fetch_add(&dev->hdr->asleep, 1);
	if (cpu) {
		off_write_once(&self->host_lease_ns, 0);
		off_write_once(cpu, EMU_CPU_ASLEEP);
	}
	rc = emu_futex(word, FUTEX_WAIT_PRIVATE, seen, timeout_ns >= 0 ? &ts : NULL, 0);
	if (cpu)
		off_write_once(cpu, emu_cpu_now());
	if (rc != 0)
		off_fetch_sub(&dev->hdr->asleep, 1);  /* nobody woke us: we count ourselves out */
	return rc < 0 && errno == ETIMEDOUT ? -ETIMEDOUT : 0;
}

void emu_wake_word(struct emu_device *dev, uint32_t *word)
{
	woke(dev, emu_futex(word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, 0));
}

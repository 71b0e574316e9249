/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ranks spread over the cores (emulator/emu_spin.c: emu_balance), on a job table of the
 * test's own: where the job's ranks outnumber its CPUs, a host thread whose CPU holds two
 * more ranks (awake ones where they last drove, drivers asleep where they went to sleep)
 * than another CPU it may run on, at every look for EMU_BALANCE_AFTER_NS, moves there,
 * with its affinity as it was; one move in the job per EMU_BALANCE_GAP_NS; a move the
 * kernel undoes soon doubles the hold; never onto a CPU its own affinity leaves out,
 * never where the ranks fit the cores, never for ranks that left the job or sleep outside
 * a drive, never while a rank of the job is in another session. Also: a spinner stops
 * for a woken sleeper that has not run yet only where the ranks outnumber the cores
 * (emu_woken_waiting); a small post yields to another rank waiting for our CPU
 * (emu_cpu_shared); a waiter spins where nobody of the job on its CPU has anything to do
 * (emu_cpu_alone), unless a spin of its was preempted lately. emu_spin.c is linked alone:
 * ringing the bell does nothing here, and this file stands in for the kernel (the CPU we
 * run on, sched_getaffinity and sched_setaffinity: the executable's definitions take the
 * calls), so that nothing depends on where the kernel puts the test.
 * Prints "ok: balance" and exits 0, else names each failed check.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "emu_internal.h"

#define AFTER 300000ull     /* EMU_BALANCE_AFTER_NS */
#define GAP 1000000ull      /* EMU_BALANCE_GAP_NS */
#define UNDONE 50000000ull  /* EMU_BALANCE_UNDONE_NS */
#define LOOK 50000ull       /* EMU_BALANCE_LOOK_NS */
#define HOLD_MAX 1000000000ull

static int failed;

#define CHECK(cond, ...)                                        \
	do {                                                    \
		if (!(cond)) {                                  \
			failed = 1;                             \
			printf("FAIL line %d: ", __LINE__);     \
			printf(__VA_ARGS__);                    \
			printf("\n");                           \
		}                                               \
	} while (0)

/* The kernel as the test plays it: where we run, what we may run on, the calls made. */
static uint32_t on_cpu;
static cpu_set_t allowed;
static int get_calls, set_calls;
static uint32_t sets_to_fail;   /* bit k: the k-th sched_setaffinity call from now fails */
static cpu_set_t last_sets[2];  /* the last two masks set, oldest first */

uint64_t emu_now_ns(void)
{
	return 0;  /* emu_balance takes its time from the caller */
}

uint64_t emu_pass_now(struct dpa_hal *pass)
{
	(void)pass;
	return emu_now_ns();
}

uint32_t emu_cpu_now(void)
{
	return on_cpu;
}

int sched_getaffinity(pid_t pid, size_t size, cpu_set_t *set)
{
	(void)pid;
	get_calls++;
	memcpy(set, &allowed, size < sizeof(allowed) ? size : sizeof(allowed));
	return 0;
}

int sched_setaffinity(pid_t pid, size_t size, const cpu_set_t *set)
{
	(void)pid, (void)size;
	int fail = sets_to_fail & 1;

	set_calls++;
	sets_to_fail >>= 1;
	last_sets[0] = last_sets[1];
	last_sets[1] = *set;
	if (fail) {
		errno = EINVAL;
		return -1;
	}
	allowed = *set;
	if (!CPU_ISSET(on_cpu, set))  /* the kernel moves us onto a CPU we may run on */
		for (uint32_t c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, set)) {
				on_cpu = c;
				break;
			}
	return 0;
}

uint32_t emu_bell_bits(uint32_t rank, uint32_t kind)
{
	return 1u << ((2 * rank + (kind == EMU_WAKE_HOST)) % 32);
}

void emu_ring(struct emu_device *dev, uint32_t bits, const uint32_t *ranks, uint32_t nranks)
{
	(void)dev, (void)bits, (void)ranks, (void)nranks;
}

static cpu_set_t both, only0, only1;

/* Rank 1 (us) on CPU 1 with two others there (one awake, one asleep in a drive), rank 0
 * on CPU 0; we may run on both. */
static void crowd(struct emu_device *dev)
{
	on_cpu = 1;
	allowed = both;
	dev->ranks[0].host_cpu = 0;
	dev->ranks[1].host_cpu = 1;
	dev->ranks[2].host_cpu = 1;
	dev->ranks[3].host_cpu = EMU_CPU_ASLEEP;
	dev->ranks[3].sleep_cpu = 1;
	dev->ranks[3].armed = 1;
}

/* Seen crowded at t and every AFTER / 2 until t + hold: moved only at the end. */
static int moves_after(struct emu_device *dev, uint64_t t, uint64_t hold)
{
	for (uint64_t at = t; at < t + hold; at += AFTER / 2)
		if (emu_balance(dev, at))
			return 0;
	return emu_balance(dev, t + hold);
}

int main(void)
{
	struct emu_job_hdr hdr;
	struct emu_rank ranks[4];
	struct emu_device dev;

	CPU_ZERO(&both);
	CPU_SET(0, &both);
	CPU_SET(1, &both);
	CPU_ZERO(&only0);
	CPU_SET(0, &only0);
	CPU_ZERO(&only1);
	CPU_SET(1, &only1);
	memset(&hdr, 0, sizeof(hdr));
	memset(ranks, 0, sizeof(ranks));
	memset(&dev, 0, sizeof(dev));
	dev.hdr = &hdr;
	dev.ranks = ranks;
	dev.attr.size = 4;
	dev.attr.rank = 1;
	dev.ncores = 2;
	dev.cpus = both;
	ranks[1].driving = 1;
	for (int i = 0; i < 4; i++)
		ranks[i].state = EMU_RANK_ALIVE;

	/* Crowded: the first sight only starts the clock; the move once it lasted. */
	crowd(&dev);
	uint64_t t = 10 * GAP;
	CHECK(!emu_balance(&dev, t), "moved at the first sight of a crowd");
	CHECK(!emu_balance(&dev, t + AFTER - LOOK / 2), "moved before the crowd lasted");
	CHECK(!emu_balance(&dev, t + AFTER), "looked again within LOOK of the last look");
	t += AFTER + LOOK / 2;  /* LOOK after the last look */
	CHECK(emu_balance(&dev, t), "stayed on a CPU with two more ranks");
	CHECK(on_cpu == 0, "on CPU %u after the move, not 0", on_cpu);
	CHECK(CPU_EQUAL(&last_sets[0], &only0) && CPU_EQUAL(&last_sets[1], &both) &&
	      CPU_EQUAL(&allowed, &both), "not pinned to CPU 0, then given both back");
	CHECK(ranks[1].host_cpu == 0, "the new CPU not published (%u)", ranks[1].host_cpu);
	CHECK(dev.balance.moves == 1, "balance moves %llu", (unsigned long long)dev.balance.moves);
	CHECK(hdr.balance_ns == t + GAP, "the job's next move not held off");

	/* Crowded again when the job's gap holds any move, however long the crowd lasts. The
	 * move held past UNDONE: the kernel did not undo it, the hold stays. */
	t += 2 * UNDONE;
	hdr.balance_ns = t + 2 * AFTER;
	crowd(&dev);
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + AFTER) &&
	      !emu_balance(&dev, t + 2 * AFTER - LOOK), "moved within the job's gap");
	CHECK(emu_balance(&dev, t + 2 * AFTER), "no move after the gap, the crowd lasting");
	CHECK(dev.balance.hold_ns == 0, "a move that held doubled the hold");

	/* Seen crowded twice, AFTER apart and more: we cannot say it lasted; the clock restarts. */
	t += 2 * UNDONE;
	crowd(&dev);
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + AFTER + 1),
	      "moved for a crowd seen twice, too far apart");
	CHECK(dev.balance.crowded_ns == t + AFTER + 1, "the crowd's clock not restarted");
	CHECK(emu_balance(&dev, t + 2 * AFTER + 1), "no move once the new sighting lasted");

	/* The kernel undoes our moves: each undo doubles how long a crowd must last. */
	uint64_t hold = AFTER;
	for (int undo = 0; undo < 14; undo++) {
		t += 2 * GAP;
		crowd(&dev);  /* back on CPU 1, soon after the move from it */
		hold = 2 * hold < HOLD_MAX ? 2 * hold : HOLD_MAX;
		CHECK(moves_after(&dev, t, hold), "undo %d: no move after a crowd of %llu us",
		      undo, (unsigned long long)(hold / 1000));
		CHECK(dev.balance.hold_ns == hold, "undo %d: hold %llu us, not %llu", undo,
		      (unsigned long long)(dev.balance.hold_ns / 1000),
		      (unsigned long long)(hold / 1000));
		t += hold;
	}
	CHECK(hold == HOLD_MAX, "the hold never reached its cap");

	/* A crowd elsewhere than where we moved from is no undo. */
	dev.balance.hold_ns = 0;
	t += 2 * UNDONE;
	crowd(&dev);
	CHECK(moves_after(&dev, t, AFTER), "no move after a plain crowd");
	t += AFTER + GAP;  /* soon after the move, as an undo would come */
	crowd(&dev);
	on_cpu = 0;  /* where we went: crowd it instead, rank 2 there too, rank 0 elsewhere */
	ranks[1].host_cpu = 0;
	ranks[2].host_cpu = 0;
	ranks[3].sleep_cpu = 0;
	ranks[0].host_cpu = 1;
	CHECK(moves_after(&dev, t, AFTER), "no move from a crowd on the CPU we moved to");
	CHECK(dev.balance.hold_ns == 0, "a crowd on the new CPU counted as an undo");

	/* A driver asleep counts where it sleeps; a host thread asleep outside a drive not. */
	t += 2 * UNDONE;
	crowd(&dev);
	ranks[3].armed = 0;
	uint64_t moves = dev.balance.moves;
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + AFTER) && dev.balance.moves == moves,
	      "moved for a rank asleep in a plain wait");

	/* Pinned by the user to CPU 1: never moved, however crowded; its affinity read once a
	 * hold, not at every look. */
	t += 2 * UNDONE;
	crowd(&dev);
	allowed = only1;
	get_calls = set_calls = 0;
	for (uint64_t at = t; at <= t + 10 * AFTER; at += AFTER / 10)
		CHECK(!emu_balance(&dev, at), "moved a pinned thread");
	CHECK(on_cpu == 1 && set_calls == 0, "a pinned thread's affinity changed");
	CHECK(get_calls >= 1 && get_calls <= 10, "affinity read %d times in 10 holds", get_calls);

	/* The affinity not given back: the process's CPUs at start instead (here a third CPU,
	 * which no rank runs on, and which ours leaves out); if that fails too, no more moves:
	 * left pinned, we must not move again. */
	cpu_set_t three = both;

	CPU_SET(2, &three);
	dev.cpus = three;
	t += 2 * UNDONE;
	crowd(&dev);
	set_calls = 0;
	sets_to_fail = 1u << 1;  /* the pin works, the restore to ours fails */
	CHECK(moves_after(&dev, t, AFTER), "no move when the restore failed");
	CHECK(on_cpu == 0 && set_calls == 3 && CPU_EQUAL(&allowed, &three) && !dev.balance.off,
	      "not given the start's CPUs when ours failed (%d calls)", set_calls);
	t += 2 * UNDONE;
	crowd(&dev);
	set_calls = 0;
	sets_to_fail = 3u << 1;  /* both restores fail */
	CHECK(moves_after(&dev, t, AFTER), "no move when the restores failed");
	CHECK(on_cpu == 0 && CPU_EQUAL(&allowed, &only0) && dev.balance.off,
	      "balancing on after we were left pinned");
	t += 2 * UNDONE;
	crowd(&dev);
	moves = dev.balance.moves;
	CHECK(!moves_after(&dev, t, AFTER) && dev.balance.moves == moves, "moved while off");
	dev.balance.off = 0;
	dev.cpus = both;

	/* Ranks that fit the cores: the kernel spreads them; nothing to do. */
	t += 2 * UNDONE;
	crowd(&dev);
	dev.ncores = 4;
	CHECK(!moves_after(&dev, t, AFTER), "moved with a core per rank");
	dev.ncores = 2;

	/* Ranks that left the job are not counted where they last ran. */
	t += 2 * UNDONE;
	crowd(&dev);
	ranks[2].state = EMU_RANK_CLOSED;
	ranks[3].state = EMU_RANK_DEAD;
	CHECK(!moves_after(&dev, t, AFTER), "moved for ranks gone");
	ranks[2].state = ranks[3].state = EMU_RANK_ALIVE;

	/* A rank of the job in another session (torchrun starts each in its own): with
	 * autogroup a move onto a CPU other groups keep busy can wait there for long, so none;
	 * once that rank left the job, the move. */
	t += 2 * UNDONE;
	crowd(&dev);
	ranks[0].sid = 7;
	int calls_before_sessions = get_calls;
	CHECK(!moves_after(&dev, t, AFTER), "moved with a rank in another session");
	CHECK(get_calls == calls_before_sessions, "asked the kernel for our CPUs all the same");
	ranks[0].state = EMU_RANK_CLOSED;
	CHECK(moves_after(&dev, t + AFTER + LOOK, AFTER), "no move once the job shares a session");
	ranks[0].state = EMU_RANK_ALIVE;
	ranks[0].sid = 0;

	/* A CPU the kernel did not tell: nothing counted, nothing moved. */
	t += 2 * UNDONE;
	crowd(&dev);
	on_cpu = EMU_CPU_UNKNOWN;
	CHECK(!moves_after(&dev, t, AFTER), "moved from an unknown CPU");

	/* A sleeper woken 10 us ago and not running yet is queued behind us only where the
	 * ranks outnumber the cores; where they fit, it is on its way to a core of its own. */
	ranks[2].waking_ns = t;
	dev.ncores = 2;
	CHECK(emu_woken_waiting(&dev, t + 10000), "a late wake-up, 4 ranks on 2 CPUs, not seen");
	dev.ncores = 4;
	CHECK(!emu_woken_waiting(&dev, t + 10000), "a spin stopped for a rank with a core");

	/* The hand-back: another rank of the job awake on our CPU waits for it, if it is in a
	 * drive (a wait it yielded to us), or is the only one there. */
	dev.ncores = 2;
	crowd(&dev);  /* us (rank 1) and rank 2 on CPU 1, rank 3 asleep, rank 0 on CPU 0 */
	ranks[2].driving = 0;
	CHECK(emu_cpu_shared(&dev), "the one other rank on our CPU not waiting for it");
	ranks[0].host_cpu = 1;
	CHECK(!emu_cpu_shared(&dev), "two ranks in Python on our CPU counted as waiting");
	ranks[0].driving = 1;
	CHECK(emu_cpu_shared(&dev), "a rank in a drive on our CPU not waiting for it");
	ranks[0].state = EMU_RANK_CLOSED;
	CHECK(emu_cpu_shared(&dev), "the one other rank left, a closed one counted");
	ranks[2].host_cpu = EMU_CPU_ASLEEP;
	CHECK(!emu_cpu_shared(&dev), "a rank asleep or closed waits for our CPU");
	ranks[2].host_cpu = 1;
	on_cpu = EMU_CPU_UNKNOWN;
	CHECK(!emu_cpu_shared(&dev), "a CPU the kernel did not tell us shared");
	ranks[0].state = EMU_RANK_ALIVE;

	/* A spin where a core would not be handed to anyone with something to do: no other
	 * host thread awake on our CPU, or only drivers idling with nothing new since they
	 * looked; never while a progress thread is awake (it publishes no CPU). */
	crowd(&dev);  /* us (rank 1) and rank 2 on CPU 1, rank 3 asleep, rank 0 on CPU 0 */
	ranks[0].driving = ranks[2].driving = 1;
	hdr.asleep = 1;  /* rank 3's host thread; no progress threads here (num_threads 0) */
	ranks[2].event = 7;
	CHECK(!emu_cpu_alone(&dev, t), "alone beside a rank running its own code");
	ranks[2].idle_event = 8;  /* idling since it saw event 7 */
	CHECK(emu_cpu_alone(&dev, t), "a rank idling with nothing new counted as busy");
	ranks[2].event = 8;
	CHECK(!emu_cpu_alone(&dev, t), "a rank idling with a new event counted as idle");
	ranks[2].event = 0xffffffffu;
	ranks[2].idle_event = 0;  /* its event + 1 wrapped: counted busy, as if not idling */
	CHECK(!emu_cpu_alone(&dev, t), "a wrapped idle_event counted as idling");
	ranks[2].host_cpu = EMU_CPU_ASLEEP;
	hdr.asleep = 2;
	CHECK(emu_cpu_alone(&dev, t), "a rank asleep counted on our CPU");
	hdr.asleep = 1;  /* one thread more awake than the host threads seen: a progress thread */
	CHECK(!emu_cpu_alone(&dev, t), "alone while a progress thread is awake");
	ranks[2].host_cpu = 1;
	ranks[2].event = 7;
	ranks[2].idle_event = 8;
	ranks[0].host_cpu = 1;
	ranks[0].idle_event = 3;
	ranks[0].event = 2;
	CHECK(emu_cpu_alone(&dev, t), "two ranks idling with nothing new counted as busy");
	dev.beside_idle_off_ns = t + 1;  /* a spin of ours was preempted lately */
	CHECK(!emu_cpu_alone(&dev, t), "a spin beside idle ranks on a CPU shared with others");
	CHECK(emu_cpu_alone(&dev, t + 1), "the spin beside idle ranks not back after the pause");
	dev.beside_idle_off_ns = 0;
	ranks[0].event = 3;
	CHECK(!emu_cpu_alone(&dev, t), "one of two idling ranks with news missed");
	ranks[0].host_cpu = 0;
	ranks[0].idle_event = ranks[0].event = ranks[2].idle_event = ranks[2].event = 0;
	hdr.asleep = 0;

	if (failed)
		return 1;
	printf("ok: balance\n");
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ranks spread over the cores (emulator/emu_spin.c: emu_balance), on a job table of the
 * test's own and this thread's real CPU: where the job's ranks outnumber its CPUs, a host
 * thread whose CPU holds two more ranks (awake ones where they last drove, sleepers where
 * they went to sleep) than another CPU it may run on, for EMU_BALANCE_AFTER_NS, moves
 * there, with its affinity as it was; one move in the job per EMU_BALANCE_GAP_NS; never
 * onto a CPU its own affinity leaves out, never where the ranks fit the cores, never for
 * ranks that left the job. emu_spin.c is linked alone; the bell is a stub. Prints "ok" (or
 * "skip": fewer than two CPUs) and exits 0, else names each failed check.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

#define US 1000ull
#define AFTER 300000ull   /* EMU_BALANCE_AFTER_NS */
#define GAP 1000000ull    /* EMU_BALANCE_GAP_NS */

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

uint64_t emu_now_ns(void)
{
	return 0;  /* emu_balance takes its time from the caller */
}

uint32_t emu_cpu_now(void)
{
	return (uint32_t)sched_getcpu();
}

uint32_t emu_bell_bits(uint32_t rank, uint32_t kind)
{
	return 1u << ((2 * rank + (kind == EMU_WAKE_HOST)) % 32);
}

void emu_ring(struct emu_device *dev, uint32_t bits, const uint32_t *ranks, uint32_t nranks)
{
	(void)dev, (void)bits, (void)ranks, (void)nranks;
}

static uint32_t cpu0, cpu1;
static cpu_set_t both;

/* Run on `cpu` now, allowed `allowed` afterwards (how the kernel may have left us). */
static void place(uint32_t cpu, const cpu_set_t *allowed)
{
	cpu_set_t one;

	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one) ||
	    sched_setaffinity(0, sizeof(*allowed), allowed)) {
		perror("sched_setaffinity");
		exit(2);
	}
}

/* Rank 1 (us) on cpu1 with two others there (one awake, one asleep), rank 0 on cpu0. */
static void crowd(struct emu_device *dev)
{
	dev->ranks[0].host_cpu = cpu0;
	dev->ranks[1].host_cpu = cpu1;
	dev->ranks[2].host_cpu = cpu1;
	dev->ranks[3].host_cpu = EMU_CPU_ASLEEP;
	dev->ranks[3].sleep_cpu = cpu1;
}

int main(void)
{
	struct emu_job_hdr hdr;
	struct emu_rank ranks[4];
	struct emu_device dev;
	cpu_set_t now_allowed, pinned;
	uint32_t seen = 0;

	if (sched_getaffinity(0, sizeof(now_allowed), &now_allowed))
		return perror("sched_getaffinity"), 2;
	for (uint32_t c = 0; c < 64 && seen < 2; c++)
		if (CPU_ISSET(c, &now_allowed))
			*(seen++ ? &cpu1 : &cpu0) = c;
	if (seen < 2) {
		printf("skip: fewer than two CPUs\n");
		return 0;
	}
	CPU_ZERO(&both);
	CPU_SET(cpu0, &both);
	CPU_SET(cpu1, &both);
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
	place(cpu1, &both);
	crowd(&dev);
	uint64_t t = 10 * GAP;
	CHECK(!emu_balance(&dev, t), "moved at the first sight of a crowd");
	CHECK(!emu_balance(&dev, t + AFTER - 1), "moved before the crowd lasted");
	CHECK(emu_balance(&dev, t + AFTER), "stayed on a CPU with two more ranks");
	CHECK((uint32_t)sched_getcpu() == cpu0, "on CPU %d after the move, not %u",
	      sched_getcpu(), cpu0);
	CHECK(sched_getaffinity(0, sizeof(now_allowed), &now_allowed) == 0 &&
	      CPU_EQUAL(&now_allowed, &both), "affinity not restored after the move");
	CHECK(ranks[1].host_cpu == cpu0, "the new CPU not published (%u)", ranks[1].host_cpu);
	CHECK(dev.balance_moves == 1, "balance_moves %llu", (unsigned long long)dev.balance_moves);
	CHECK(hdr.balance_ns == t + AFTER + GAP, "the job's next move not held off");

	/* Crowded again at once: the job's gap holds any move, however long it lasts. */
	place(cpu1, &both);
	crowd(&dev);
	t += AFTER + 1;
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + AFTER), "moved within the gap");
	t = hdr.balance_ns;
	CHECK(emu_balance(&dev, t), "no move after the gap, the crowd lasting");
	CHECK((uint32_t)sched_getcpu() == cpu0, "not on CPU %u after the second move", cpu0);

	/* One more rank than there is room for is no crowd; a crowd seen, then gone, restarts. */
	place(cpu1, &both);
	crowd(&dev);
	ranks[2].host_cpu = cpu0;
	t = hdr.balance_ns + GAP;
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + 2 * AFTER), "moved for 2 against 2");
	crowd(&dev);
	CHECK(!emu_balance(&dev, t + 3 * AFTER), "a new crowd took the clock of an old one");
	CHECK(dev.crowded_ns == t + 3 * AFTER, "the crowd's clock not restarted");

	/* Pinned by the user to cpu1: never moved, however crowded. */
	CPU_ZERO(&pinned);
	CPU_SET(cpu1, &pinned);
	place(cpu1, &pinned);
	crowd(&dev);
	t = hdr.balance_ns + GAP;
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + AFTER), "moved a pinned thread");
	CHECK((uint32_t)sched_getcpu() == cpu1, "a pinned thread left its CPU");

	/* Ranks that fit the cores: the kernel spreads them; nothing to do. */
	place(cpu1, &both);
	crowd(&dev);
	dev.ncores = 4;
	dev.crowded_ns = 0;
	t += GAP;
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + AFTER), "moved with a core per rank");
	CHECK(dev.balance_moves == 2, "balance_moves %llu at the end",
	      (unsigned long long)dev.balance_moves);

	/* A rank that left the job is not counted where it last ran. */
	place(cpu1, &both);
	crowd(&dev);
	ranks[2].state = EMU_RANK_CLOSED;
	ranks[3].state = EMU_RANK_DEAD;
	dev.ncores = 2;
	t += GAP;
	CHECK(!emu_balance(&dev, t) && !emu_balance(&dev, t + AFTER), "moved for ranks gone");

	if (failed)
		return 1;
	printf("ok: balance\n");
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * When a waiting thread of the emulated DPU may spin, and when a peer's write need not
 * wake a rank's progress thread (emu_progress.c has the whole picture of who runs the
 * firmware and how it sleeps). In this VM a wake-up is the expensive part of a small op:
 * a futex wake of a thread on the other vCPU is an inter-processor interrupt, ~30 us
 * when that vCPU had halted, against ~3 us for a switch on one vCPU and ~0.1 us for a
 * spinner to see a peer's write.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>

#include "dpa_engine.h"
#include "emu_internal.h"
#include "offload_atomic.h"

#define EMU_WAKING_NS 3000ull           /* a woken thread normally runs within this */
#define EMU_BALANCE_GAP_NS 1000000ull   /* the job's ranks move one at a time, this apart */
#define EMU_BALANCE_CPUS 64u            /* CPUs the balance counts ranks on: 0-63 */
#define EMU_BALANCE_AFTER_NS 300000ull  /* a rank moves once it saw its CPU crowded this long */
#define EMU_BALANCE_LOOK_NS 50000ull     /* a rank counts the job's ranks at most this often */
#define EMU_BALANCE_UNDONE_NS 50000000ull      /* moved back within this: the kernel undid it */
#define EMU_BALANCE_HOLD_MAX_NS 1000000000ull  /* how long a crowd may have to last, at most */

/* How long a waiter spins before it sleeps: never longer than a wake-up costs (nor
 * spin_us). */
uint64_t emu_spin_budget_ns(const struct emu_device *dev)
{
	uint64_t cap = (uint64_t)dev->attr.spin_us * 1000u;
	uint64_t cost = off_read_once(&dev->wake_cost_ns);

	return cost < cap ? cost : cap;
}

/* The job's threads not asleep in a wait (woken ones count as awake). Every rank has one
 * host thread and num_threads progress threads; others, like a stager's, are not counted. */
static int64_t job_awake(const struct emu_device *dev)
{
	int64_t threads = (int64_t)dev->attr.size * (1 + dev->attr.num_threads);

	return threads - (int64_t)off_read_once(&dev->hdr->asleep);
}

/* Does every awake thread of the job have a core? Else a spinner keeps one of them off
 * its core: sleep instead. */
int emu_cores_to_spare(const struct emu_device *dev)
{
	return job_awake(dev) <= (int64_t)dev->ncores;
}

/* Is o's host thread idling between rounds of a wait with nothing new since it looked? */
static int idles_unmoved(const struct emu_rank *o)
{
	uint32_t idle = off_read_once(&o->idle_event);

	return idle && off_load_acquire(&o->event) == idle - 1;
}

/* Is this CPU ours alone among the job's threads: no other rank's host thread that last
 * ran on it is awake with anything to do, and no progress thread is awake anywhere (they
 * publish no CPU)? Then a spinner keeps nobody of the job off a core, even where the
 * job's threads outnumber the cores: 4 ranks on 2 vCPUs, the two on the other vCPU
 * sending what we wait for while the other rank of ours sleeps. Sleeping there would
 * halt this vCPU, and the peers' wake-up would cost an inter-processor interrupt into a
 * halted vCPU (~30 us in this VM, against a spin the peers end in a few). A host thread
 * idling between rounds of a wait with nothing new since it looked (its event where it
 * left it: idle_event) has nothing to do either: handed the core, it would give it
 * straight back. Both ranks of a vCPU waiting for the other vCPU's posts used to yield
 * to each other like that, two switches of ~0.8 us for nothing each time, while the
 * blocks they waited for came in (docs/performance.md, seventeenth session). */
int emu_cpu_alone(const struct emu_device *dev, uint64_t now)
{
	uint32_t me = dev->attr.rank, cpu = emu_cpu_now(), hosts_awake = 0;
	int beside_idle = now >= off_read_once(&dev->beside_idle_off_ns);

	for (uint32_t i = 0; i < dev->attr.size; i++) {
		const struct emu_rank *o = &dev->ranks[i];
		uint32_t at = off_read_once(&o->host_cpu);

		if (at == EMU_CPU_ASLEEP)
			continue;
		hosts_awake++;
		if (at != cpu || i == me)
			continue;
		if (!beside_idle || !idles_unmoved(o))
			return 0;
	}
	return job_awake(dev) <= (int64_t)hosts_awake;
}

/*
 * The hand-back. Where the job's ranks outnumber the cores, two ranks share a vCPU, and
 * the one that went to wait first (it yielded its core to the other: the hand-off) should
 * finish first. The other, posting its own small op, often completes it at once: every
 * peer's block is in by then. Running on into its next op, it left its neighbour waiting
 * for the core, though its op had been complete since the post: at n=4 on 2 vCPUs the
 * rank that left a barrier last finished its 1 KiB all-to-all first (7.5 us) and the
 * first finished last (30 us), where Open MPI's ranks finish in the order they started,
 * 21-23 us each. So a host thread that posted a small op yields once if another rank's
 * host thread of the job last ran on its CPU and is awake (it waits for this core), and
 * is in a drive (a wait that yielded to us) or is the only one there: with four ranks to
 * a vCPU (n=8), yielding for ranks busy in their own code between ops gave runs of
 * 117-140 us per op against 92-103. Once per post, and only for a thread of the job.
 */
int emu_cpu_shared(const struct emu_device *dev)
{
	uint32_t me = dev->attr.rank, cpu = emu_cpu_now(), others = 0, waiting = 0;

	if (cpu >= EMU_CPU_UNKNOWN)
		return 0;
	for (uint32_t i = 0; i < dev->attr.size; i++)
		if (i != me && off_read_once(&dev->ranks[i].host_cpu) == cpu &&
		    off_read_once(&dev->ranks[i].state) == EMU_RANK_ALIVE) {
			others++;
			waiting += off_read_once(&dev->ranks[i].driving) != 0;
		}
	return waiting || others == 1;
}

void emu_hand_back(struct emu_device *dev)
{
	if (emu_cores_to_spare(dev) || !emu_cpu_shared(dev))
		return;
	off_write_once(&dev->post_yields, off_read_once(&dev->post_yields) + 1);
	sched_yield();
}

/* Was a sleeper woken more than EMU_WAKING_NS ago and has not run yet? Then, where the
 * ranks outnumber the cores, it is likely queued behind us (a woken thread lands on its
 * waker's core): stop spinning for it. Where they fit, it has a core of its own, and what
 * it waits for is the wake-up itself (an interrupt into a halted vCPU, ~30 us here): a
 * spinner keeps nobody off a core, and one that stopped would sleep in turn, to be woken
 * as slowly (n=2 on 2 vCPUs: every wait that did not end at once ended in a sleep, and a
 * barrier took 5.7-8.5 us, against 2.2 without this exit; Open MPI 0.84). */
int emu_woken_waiting(const struct emu_device *dev, uint64_t now)
{
	if (dev->attr.size <= dev->ncores)
		return 0;
	for (uint32_t i = 0; i < dev->attr.size; i++) {
		uint64_t at = off_read_once(&dev->ranks[i].waking_ns);

		if (at && now > at + EMU_WAKING_NS)
			return 1;
	}
	return 0;
}

/*
 * Ranks spread over the cores. Where the ranks outnumber the cores, the kernel can leave
 * them badly placed for tens of milliseconds: 4 ranks on 2 vCPUs, three on one vCPU and
 * one alone on the other, which then idles a third of the time while its rank waits for
 * the three; their wake-ups cross vCPUs and no hand-over finds a driver beside a sleeper.
 * A 1 KiB all-to-all took 40-55 us instead of 26 for the first 30-150 ms of a job until
 * the load balancer moved one (it leaves a thread that ran within the last 0.5 ms where
 * it is: cache hot) (a perf sched trace, docs/performance.md). So a host thread about to
 * give up its CPU (host_idle) that has seen two more of the job's ranks there than on
 * another CPU it may run on, at every look for EMU_BALANCE_AFTER_NS, moves itself: pinned
 * to that CPU for the move, its own affinity back at once (widening it moves nothing).
 * One move in the job per EMU_BALANCE_GAP_NS, so that the crowd does not all leave at
 * once. A move the kernel undoes soon (it has its reasons: someone else's busy task on
 * the CPU we went to) doubles how long a crowd must last before our next one: we do not
 * fight the kernel's balancer forever. A rank counts at most once per EMU_BALANCE_LOOK_NS
 * (at every idle step it was 1.2% of the CPU of a 1 KiB all-to-all loop at n=4).
 * Only where every rank of the job is in our session: with autogroup, a session is a
 * scheduling group, and a thread moved onto a CPU that other groups keep busy waited there
 * up to 788 ms, runnable (a perf sched trace); torchrun starts each rank in a session of
 * its own.
 */

/* The job's ranks by CPU: a host thread awake where it last drove, a driver asleep where
 * it went to sleep. Not counted: host threads asleep in a plain wait (not back for their
 * firmware on their own), ranks not in the job (not joined, or gone). */
static void count_ranks(const struct emu_device *dev, uint32_t cpu, uint32_t *count)
{
	for (uint32_t i = 0; i < dev->attr.size; i++) {
		const struct emu_rank *r = &dev->ranks[i];
		uint32_t at = i == dev->attr.rank ? cpu : off_read_once(&r->host_cpu);

		if (i != dev->attr.rank && off_read_once(&r->state) != EMU_RANK_ALIVE)
			continue;
		if (at == EMU_CPU_ASLEEP && off_read_once(&r->armed))
			at = off_read_once(&r->sleep_cpu);
		if (at < EMU_BALANCE_CPUS)
			count[at]++;
	}
}

/* Every rank still in the job is in our session (emu_job_open publishes each one's, 0 for
 * all where the kernel does not schedule sessions as groups). */
static int one_session(const struct emu_device *dev)
{
	int32_t ours = off_read_once(&dev->ranks[dev->attr.rank].sid);

	for (uint32_t i = 0; i < dev->attr.size; i++)
		if (off_load_acquire(&dev->ranks[i].state) == EMU_RANK_ALIVE &&
		    off_read_once(&dev->ranks[i].sid) != ours)
			return 0;
	return 1;
}

/* The CPU of `allowed` with the fewest ranks (ours if none has fewer). */
static uint32_t least_crowded(const uint32_t *count, const cpu_set_t *allowed, uint32_t cpu)
{
	uint32_t best = cpu;

	for (uint32_t c = 0; c < EMU_BALANCE_CPUS; c++)
		if (CPU_ISSET(c, allowed) && count[c] < count[best])
			best = c;
	return best;
}

/* Back where we moved from, within EMU_BALANCE_UNDONE_NS of the move: the kernel undid it. */
static void note_undone(struct emu_balance *b, uint32_t cpu, uint64_t now)
{
	uint64_t hold = 2 * (b->hold_ns ? b->hold_ns : EMU_BALANCE_AFTER_NS);

	if (!b->moved_ns)
		return;
	if (now - b->moved_ns >= EMU_BALANCE_UNDONE_NS) {
		b->moved_ns = 0;  /* it held */
		return;
	}
	if (cpu != b->moved_from)
		return;  /* not undone yet */
	b->hold_ns = hold < EMU_BALANCE_HOLD_MAX_NS ? hold : EMU_BALANCE_HOLD_MAX_NS;
	b->moved_ns = 0;
}

/* Pin ourselves to `target` for the move, then give ourselves back `mine` (else the
 * process's CPUs at start). 0 if we did not move. */
static int move_to(struct emu_balance *b, uint32_t target, const cpu_set_t *mine,
		   const cpu_set_t *start)
{
	cpu_set_t one;

	CPU_ZERO(&one);
	CPU_SET(target, &one);
	if (sched_setaffinity(0, sizeof(one), &one))
		return 0;
	if (sched_setaffinity(0, sizeof(*mine), mine) &&
	    sched_setaffinity(0, sizeof(*start), start))
		b->off = 1;  /* left pinned to target: at least never move again */
	return 1;
}

int emu_balance(struct emu_device *dev, uint64_t now)
{
	struct emu_balance *b = &dev->balance;
	uint32_t count[EMU_BALANCE_CPUS] = { 0 }, cpu = emu_cpu_now(), target;
	uint64_t until = off_read_once(&dev->hdr->balance_ns);
	cpu_set_t mine, may;

	if (dev->attr.size <= dev->ncores || cpu >= EMU_BALANCE_CPUS || b->off ||
	    now - b->looked_ns < EMU_BALANCE_LOOK_NS)
		return 0;
	b->looked_ns = now;
	note_undone(b, cpu, now);
	count_ranks(dev, cpu, count);
	if (count[least_crowded(count, &dev->cpus, cpu)] + 2 > count[cpu]) {
		b->crowded_ns = 0;
		return 0;
	}
	/* A crowd lasts from its first sighting while we look again within AFTER: a host
	 * thread away longer cannot say what happened meanwhile. */
	if (!b->crowded_ns || now - b->seen_ns > EMU_BALANCE_AFTER_NS)
		b->crowded_ns = now;
	b->seen_ns = now;
	if (now - b->crowded_ns < (b->hold_ns ? b->hold_ns : EMU_BALANCE_AFTER_NS) || now < until)
		return 0;
	if (!one_session(dev)) {
		b->crowded_ns = now;  /* the ranks in other sessions may leave: look again later */
		return 0;
	}
	/* The process's CPUs at start said where to look; our own, now, say where we may go. */
	if (sched_getaffinity(0, sizeof(mine), &mine)) {
		b->off = 1;
		return 0;
	}
	CPU_AND(&may, &mine, &dev->cpus);
	target = least_crowded(count, &may, cpu);
	if (count[target] + 2 > count[cpu]) {
		b->crowded_ns = now;  /* pinned here (by the user): look again a hold later */
		return 0;
	}
	if (!off_cas(&dev->hdr->balance_ns, &until, now + EMU_BALANCE_GAP_NS) ||
	    !move_to(b, target, &mine, &dev->cpus))
		return 0;
	b->crowded_ns = 0;
	b->moved_ns = now;
	b->moved_from = cpu;
	off_write_once(&b->moves, b->moves + 1);
	emu_publish_cpu(dev, target);
	return 1;
}

/*
 * The host's lease. A host thread leaving a drive (a post, a test(), a wait that ends)
 * with small ops still in flight is back within microseconds as a rule: its wait(), its
 * next test() or post. A peer's write meanwhile would wake the rank's progress thread for
 * a pass the host runs anyway, at the price of a wake-up and a switch (an inter-processor
 * interrupt where it sleeps on the other vCPU): 0.6 of them per barrier + 1 KiB
 * all-to-all at n=4. So for EMU_HOST_LEASE_NS after such a drive, peers' writes leave the
 * progress thread asleep, and it sleeps at most until the lease ends: a host that went
 * off to other work has its ops taken over within about a lease. Only with one progress
 * thread per rank (the ranks fill the cores), whose sleep's end is published exactly
 * (dpa_sleep_until); a sleeper that went to bed before the lease, for longer, is woken.
 */
int emu_host_leased(const struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	const struct emu_rank *r = &dev->ranks[rank];
	uint64_t lease = off_read_once(&r->host_lease_ns);

	/* No lease (the usual case outside small ops): no clock read on the waker's path. */
	return lease && emu_pass_now(pass) < lease &&
	       off_read_once(&r->dpa_sleep_until) <= lease + EMU_HOST_LEASE_NS;
}

/* Is any rank of the job in the middle of a bulk op (long copies hogging cores)? */
static int job_bulk(const struct emu_device *dev)
{
	for (uint32_t i = 0; i < dev->attr.size; i++)
		if (off_read_once(&dev->ranks[i].load) == DPA_ENGINE_BULK)
			return 1;
	return 0;
}

int emu_spin_worthwhile(const struct emu_device *dev)
{
	return !job_bulk(dev) && emu_cores_to_spare(dev);
}

/*
 * The wake-up hand-over. A peer's write that wakes a rank's driver asleep on another CPU
 * costs the waker an inter-processor interrupt: ~10 us of its CPU here, and ~33 us until
 * the sleeper runs, against ~5 us for a wake-up on the sleeper's own CPU
 * (docs/performance.md). Where a driver of another rank runs on the sleeper's CPU (4
 * ranks on 2 vCPUs: the sleeper's neighbour, spinning or in a round), the waker leaves
 * the wake-up to it: it marks the sleeper handed and counts it in the job's handovers;
 * drivers look at that count in every round and spin step and wake what was handed to
 * their CPU. The guardian must still be there once the mark is visible (store, fence,
 * load), and a driver that leaves its CPU (sleeps, ends its drive, moves) publishes that
 * first, then takes what was handed to it: one of the two sees the other, and whoever
 * clears the mark wakes the sleeper.
 */
static uint32_t guardian(const struct emu_device *dev, uint32_t sleeper, uint32_t cpu)
{
	for (uint32_t i = 0; i < dev->attr.size; i++)
		if (i != sleeper && off_read_once(&dev->ranks[i].host_cpu) == cpu &&
		    off_read_once(&dev->ranks[i].driving))
			return i;
	return UINT32_MAX;
}

int emu_hand_over(struct emu_device *dev, uint32_t rank)
{
	struct emu_rank *r = &dev->ranks[rank];
	uint32_t cpu = off_read_once(&r->sleep_cpu), g;

	if (cpu >= EMU_CPU_UNKNOWN || cpu == emu_cpu_now() ||
	    (g = guardian(dev, rank, cpu)) == UINT32_MAX)
		return 0;
	off_fetch_add(&dev->hdr->handovers, 1);
	__atomic_store_n(&r->handed, 1, __ATOMIC_SEQ_CST);
	off_fence();  /* pairs with emu_publish_cpu's fence */
	if (off_read_once(&dev->ranks[g].host_cpu) != cpu || !off_read_once(&dev->ranks[g].driving)) {
		/* The guardian left: take the wake-up back, unless a driver took it already. */
		if (!__atomic_exchange_n(&r->handed, 0, __ATOMIC_ACQ_REL))
			return 1;
		off_fetch_sub(&dev->hdr->handovers, 1);
		return 0;
	}
	off_write_once(&dev->wake_handovers, off_read_once(&dev->wake_handovers) + 1);
	return 1;
}

void emu_take_handovers(struct emu_device *dev, uint32_t cpu)
{
	uint32_t woken[EMU_WAKE_LIST], n = 0, bits = 0;

	if (!off_read_once(&dev->hdr->handovers))
		return;
	for (uint32_t i = 0; i < dev->attr.size; i++) {
		struct emu_rank *r = &dev->ranks[i];

		if (!off_read_once(&r->handed) || off_read_once(&r->sleep_cpu) != cpu ||
		    !__atomic_exchange_n(&r->handed, 0, __ATOMIC_ACQ_REL))
			continue;
		off_fetch_sub(&dev->hdr->handovers, 1);
		bits |= emu_bell_bits(i, EMU_WAKE_HOST);
		if (n < EMU_WAKE_LIST)
			woken[n++] = i;
	}
	if (bits)
		emu_ring(dev, bits, woken, n);
}

void emu_publish_cpu(struct emu_device *dev, uint32_t cpu)
{
	struct emu_rank *me = &dev->ranks[dev->attr.rank];
	uint32_t was = off_read_once(&me->host_cpu);

	if (was == cpu)
		return;
	off_write_once(&me->host_cpu, cpu);
	if (was != EMU_CPU_ASLEEP && off_read_once(&me->driving)) {
		off_fence();  /* pairs with emu_hand_over's fence */
		emu_take_handovers(dev, was);
	}
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What handing a turn to another thread costs on this machine: two threads pass one word
 * back and forth, ROUNDS round trips, by futex (the waiter sleeps, the other wakes it),
 * by sched_yield polling and by spinning, on one CPU and across two. The emulator's
 * waits are built around these numbers (emulator/emu_spin.c, docs/performance.md).
 *
 *     cc -O2 -pthread scripts/wake_cost.c -o /tmp/wake_cost && /tmp/wake_cost [CPU_A CPU_B]
 *
 * Run it once more beside `nice -n 19` busy loops to see what a busy machine does to each.
 *
 * Then one wake-up at a time, the sleeper left alone long enough for its CPU to halt (as a
 * rank's driver that sleeps between two ops): what FUTEX_WAKE costs the waker inside the
 * system call, and how long until the sleeper runs (medians and p90 of WAKES).
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 20000
#define WAKES 3000
#define WAKE_GAP_US 200  /* between wake-ups: the sleeper's CPU halts meanwhile */

enum mode { FUTEX, YIELD, SPIN };

struct pingpong {
	uint32_t word;
	enum mode mode;
	int cpu;  /* the second thread's CPU */
};

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void await(struct pingpong *p, uint32_t want)
{
	uint32_t seen;

	while ((seen = __atomic_load_n(&p->word, __ATOMIC_ACQUIRE)) != want) {
		if (p->mode == FUTEX)
			syscall(SYS_futex, &p->word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
		else if (p->mode == YIELD)
			sched_yield();
	}
}

static void pass(struct pingpong *p, uint32_t value)
{
	__atomic_store_n(&p->word, value, __ATOMIC_RELEASE);
	if (p->mode == FUTEX)
		syscall(SYS_futex, &p->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void *second(void *arg)
{
	struct pingpong *p = arg;

	pin(p->cpu);
	for (uint32_t i = 0; i < ROUNDS; i++) {
		await(p, 2 * i + 1);
		pass(p, 2 * i + 2);
	}
	return NULL;
}

static double round_trip_us(enum mode mode, int cpu_a, int cpu_b)
{
	struct pingpong p = { .word = 0, .mode = mode, .cpu = cpu_b };
	pthread_t t;
	double t0, t1;

	pin(cpu_a);
	if (pthread_create(&t, NULL, second, &p))
		return -1;
	usleep(1000);
	t0 = now_us();
	for (uint32_t i = 0; i < ROUNDS; i++) {
		pass(&p, 2 * i + 1);
		await(&p, 2 * i + 2);
	}
	t1 = now_us();
	pthread_join(t, NULL);
	return (t1 - t0) / ROUNDS;
}

struct sleeper {
	uint32_t word, ack;
	int cpu;
};

static void *sleep_loop(void *arg)
{
	struct sleeper *s = arg;
	uint32_t seen = 0;

	pin(s->cpu);
	while (seen != UINT32_MAX) {
		while (__atomic_load_n(&s->word, __ATOMIC_ACQUIRE) == seen)
			syscall(SYS_futex, &s->word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
		seen = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
		__atomic_store_n(&s->ack, seen, __ATOMIC_RELEASE);
	}
	return NULL;
}

static int by_value(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

static void wake_once(int waker, int sleeper_cpu)
{
	static double in_call[WAKES], until_run[WAKES];
	struct sleeper s = { .cpu = sleeper_cpu };
	pthread_t t;

	pin(waker);
	if (pthread_create(&t, NULL, sleep_loop, &s))
		return;
	usleep(1000);
	for (uint32_t i = 1; i <= WAKES; i++) {
		double t0, t1;

		usleep(WAKE_GAP_US);
		t0 = now_us();
		__atomic_store_n(&s.word, i, __ATOMIC_RELEASE);
		syscall(SYS_futex, &s.word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
		t1 = now_us();
		while (__atomic_load_n(&s.ack, __ATOMIC_ACQUIRE) != i)
			;
		in_call[i - 1] = t1 - t0;
		until_run[i - 1] = now_us() - t0;
	}
	__atomic_store_n(&s.word, UINT32_MAX, __ATOMIC_RELEASE);
	syscall(SYS_futex, &s.word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	pthread_join(t, NULL);
	qsort(in_call, WAKES, sizeof(double), by_value);
	qsort(until_run, WAKES, sizeof(double), by_value);
	printf("CPU %d wakes a sleeper on CPU %d: FUTEX_WAKE %6.1f (p90 %5.1f), until it runs "
	       "%6.1f (p90 %5.1f)\n", waker, sleeper_cpu, in_call[WAKES / 2],
	       in_call[WAKES * 9 / 10], until_run[WAKES / 2], until_run[WAKES * 9 / 10]);
}

int main(int argc, char **argv)
{
	int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;

	printf("round trip, us (%d rounds)\n", ROUNDS);
	printf("futex, one CPU (%d):       %7.2f\n", a, round_trip_us(FUTEX, a, a));
	printf("futex, two CPUs (%d, %d):  %7.2f\n", a, b, round_trip_us(FUTEX, a, b));
	printf("yield polling, one CPU:   %7.2f\n", round_trip_us(YIELD, a, a));
	printf("spinning, two CPUs:       %7.2f\n", round_trip_us(SPIN, a, b));
	printf("one wake-up, us (%d, %d us apart)\n", WAKES, WAKE_GAP_US);
	wake_once(a, b);
	wake_once(a, a);
	return 0;
}

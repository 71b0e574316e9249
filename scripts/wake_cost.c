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

int main(int argc, char **argv)
{
	int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;

	printf("round trip, us (%d rounds)\n", ROUNDS);
	printf("futex, one CPU (%d):       %7.2f\n", a, round_trip_us(FUTEX, a, a));
	printf("futex, two CPUs (%d, %d):  %7.2f\n", a, b, round_trip_us(FUTEX, a, b));
	printf("yield polling, one CPU:   %7.2f\n", round_trip_us(YIELD, a, a));
	printf("spinning, two CPUs:       %7.2f\n", round_trip_us(SPIN, a, b));
	return 0;
}

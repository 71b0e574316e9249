/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What moving 1 MiB between two processes costs on this machine, the way the emulator can
 * do it: one process_vm_writev (or _readv) into the other process's private 4 KiB pages,
 * against a memcpy into or out of memory both map (the wire's two copies, emu_wire.c).
 * Eight source and destination buffers in rotation, so that no copy finds its data in the
 * caches from the copy before; medians of 400.
 *
 *     cc -O2 -o /tmp/copy_cost scripts/copy_cost.c && /tmp/copy_cost
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LEN (1u << 20)
#define NBUF 8
#define REPS 400

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *t)
{
	qsort(t, REPS, sizeof(*t), by_value);
	return t[REPS / 2];
}

/* Private memory in 4 KiB pages (as a numpy array smaller than the huge-page cut), touched. */
static char *private_pages(void)
{
	char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	madvise(p, LEN, MADV_NOHUGEPAGE);
	memset(p, 1, LEN);
	return p;
}

int main(void)
{
	char *src[NBUF], *dst[NBUF];
	double t[REPS];

	for (int i = 0; i < NBUF; i++) {
		src[i] = private_pages();
		dst[i] = private_pages();
	}
	char *shared = mmap(NULL, (size_t)NBUF * LEN, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (shared == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(shared, 2, (size_t)NBUF * LEN);
	/* The peer: a fork, so its buffers sit at our addresses (first writes break the
	 * copy-on-write sharing; the medians are past them). */
	pid_t peer = fork();

	if (peer == 0)
		for (;;)
			pause();
	for (int r = 0; r < REPS; r++) {
		struct iovec l = { src[r % NBUF], LEN }, rm = { dst[(r + 3) % NBUF], LEN };
		double a = now_us();

		if (process_vm_writev(peer, &l, 1, &rm, 1, 0) != LEN)
			perror("process_vm_writev");
		t[r] = now_us() - a;
	}
	printf("process_vm_writev 1 MiB into 4 KiB pages: %.1f us\n", median(t));
	for (int r = 0; r < REPS; r++) {
		struct iovec l = { dst[(r + 3) % NBUF], LEN }, rm = { src[r % NBUF], LEN };
		double a = now_us();

		if (process_vm_readv(peer, &l, 1, &rm, 1, 0) != LEN)
			perror("process_vm_readv");
		t[r] = now_us() - a;
	}
	printf("process_vm_readv 1 MiB from 4 KiB pages: %.1f us\n", median(t));
	for (int r = 0; r < REPS; r++) {
		double a = now_us();

		memcpy(shared + (size_t)((r + 3) % NBUF) * LEN, src[r % NBUF], LEN);
		t[r] = now_us() - a;
	}
	printf("memcpy private -> shared: %.1f us\n", median(t));
	for (int r = 0; r < REPS; r++) {
		double a = now_us();

		memcpy(dst[r % NBUF], shared + (size_t)((r + 3) % NBUF) * LEN, LEN);
		t[r] = now_us() - a;
	}
	printf("memcpy shared -> private: %.1f us\n", median(t));
	kill(peer, SIGKILL);
	waitpid(peer, NULL, 0);
	return 0;
}

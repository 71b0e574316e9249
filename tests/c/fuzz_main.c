/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Standalone driver for the firmware fuzz target (fuzz_engine.c), for compilers without
 * libFuzzer (gcc). No coverage feedback (tried with -fsanitize-coverage=trace-pc: keeping
 * inputs that reach new blocks added nothing over the seeds' mutants on this small engine,
 * at a third of the speed). It runs the seed inputs (valid command sequences, built in
 * fuzz_seeds.c), then random inputs and seeds mutated field by field, for a bounded number
 * of runs or seconds. Same seed, same inputs: a failure reproduces.
 *
 *   python3 build_defs.py build fuzz_main fuzz_main   (fuzz_mutate.c makes the inputs)
 *   ./fuzz_main -seed=1 -max_total_time=20       random + mutated inputs, bounded
 *   ./fuzz_main crash-1-1234.bin corpus/         replay files (or every file in a folder)
 *   ./fuzz_main -dump_corpus=corpus/             write the seed inputs (for libFuzzer)
 * Options (libFuzzer's names): -seed=N -runs=N -max_total_time=S -max_len=N
 * -artifact_prefix=PATH (where a crashing input is saved; default ./), and -verbose=1 (print
 * every completion).
 * On a failure it prints the seed, the iteration and the input in hex, and saves the input
 * as <artifact_prefix>crash-<seed>-<iteration>.bin.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fuzz.h"

#define POOL        64u
#define NSEEDS_MAX  32u

/* ---- the input being run, for the crash report ---- */

static const uint8_t *cur_data;
static size_t cur_size;
static uint64_t cur_seed, cur_iter;
static char artifact_prefix[512] = "./";
static int replaying;   /* the input came from a file: don't save it again */
static volatile sig_atomic_t reporting;

static void put(const char *s, size_t n)
{
	while (n) {
		ssize_t k = write(2, s, n);

		if (k <= 0)
			return;
		s += k;
		n -= (size_t)k;
	}
}

static void puts2(const char *s)
{
	put(s, strlen(s));
}

static void put_u64(uint64_t v)
{
	char b[24];
	int i = 23;

	b[i] = 0;
	do {
		b[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	puts2(b + i);
}

/* Async-signal-safe: called from the signal handlers. */
static void report_crash(void)
{
	static const char hex[] = "0123456789abcdef";
	char path[640], line[129];
	size_t n = 0;
	int fd;

	if (reporting || !cur_data)
		return;
	reporting = 1;
	if (replaying) {
		puts2("\n==fuzz== the input replayed above failed\n");
		return;
	}
	puts2("\n==fuzz== failing input: seed=");
	put_u64(cur_seed);
	puts2(" iteration=");
	put_u64(cur_iter);
	puts2(" size=");
	put_u64(cur_size);
	puts2("\n==fuzz== hex:\n");
	for (size_t i = 0; i < cur_size; i++) {
		line[n++] = hex[cur_data[i] >> 4];
		line[n++] = hex[cur_data[i] & 15];
		if (n == 128 || i + 1 == cur_size) {
			line[n++] = '\n';
			put(line, n);
			n = 0;
		}
	}
	/* <prefix>crash-<seed>-<iter>.bin, built without snprintf. */
	n = strlen(artifact_prefix);
	memcpy(path, artifact_prefix, n);
	memcpy(path + n, "crash-", 6);
	n += 6;
	for (int part = 0; part < 2; part++) {
		char b[24];
		int i = 23;
		uint64_t v = part ? cur_iter : cur_seed;

		do {
			b[--i] = (char)('0' + v % 10);
			v /= 10;
		} while (v);
		memcpy(path + n, b + i, (size_t)(23 - i));
		n += (size_t)(23 - i);
		path[n++] = part ? '.' : '-';
	}
	memcpy(path + n, "bin", 4);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd >= 0) {
		ssize_t k = write(fd, cur_data, cur_size);

		(void)k;
		close(fd);
		puts2("==fuzz== saved as ");
		puts2(path);
		puts2(" (replay: fuzz_main ");
		puts2(path);
		puts2(")\n");
	}
}

static void on_signal(int sig)
{
	report_crash();
	signal(sig, SIG_DFL);
	raise(sig);
}

/*
 * Sanitizer reports end in abort() (not _exit), so that on_signal() prints the input. The
 * runtimes read these defaults before the environment's *SAN_OPTIONS, which still win. (A
 * death callback would not do: with address,undefined gcc links two runtimes, and UBSan's
 * never calls the callback registered with ASan's.)
 */
const char *__asan_default_options(void);
const char *__ubsan_default_options(void);
const char *__tsan_default_options(void);

const char *__asan_default_options(void)
{
	return "abort_on_error=1";
}

const char *__ubsan_default_options(void)
{
	return "abort_on_error=1:print_stacktrace=1";
}

const char *__tsan_default_options(void)
{
	return "abort_on_error=1";
}

static void install_handlers(void)
{
	static const int sigs[] = { SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL };

	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		signal(sigs[i], on_signal);
}

static void run_one(const uint8_t *data, size_t size, uint64_t iter)
{
	cur_data = data;
	cur_size = size;
	cur_iter = iter;
	LLVMFuzzerTestOneInput(data, size);
	cur_data = NULL;
}

static struct fz_bytes seeds[NSEEDS_MAX];
static const char *seed_names[NSEEDS_MAX];
static uint32_t nseeds;

/* ---- main ---- */

static int read_file(const char *path, struct fz_bytes *in)
{
	FILE *f = fopen(path, "rb");

	if (!f)
		return -errno;
	in->len = fread(in->data, 1, FZ_MAX_INPUT, f);
	fclose(f);
	return 0;
}

static int replay(const char *path, uint64_t *count)
{
	static struct fz_bytes in;
	struct stat st;

	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *e;
		char sub[4096];
		int rc = 0;

		if (!d)
			return -errno;
		while ((e = readdir(d)) && !rc) {
			if (e->d_name[0] == '.')
				continue;
			snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
			rc = replay(sub, count);
		}
		closedir(d);
		return rc;
	}
	if (read_file(path, &in)) {
		fprintf(stderr, "fuzz_main: cannot read %s: %s\n", path, strerror(errno));
		return -1;
	}
	fprintf(stderr, "replaying %s (%zu bytes)\n", path, in.len);
	run_one(in.data, in.len, *count);
	(*count)++;
	return 0;
}

static int dump_corpus(const char *dir)
{
	char path[4096];

	mkdir(dir, 0755);
	for (uint32_t i = 0; i < nseeds; i++) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/seed-%02u.bin", dir, i);
		f = fopen(path, "wb");
		if (!f || fwrite(seeds[i].data, 1, seeds[i].len, f) != seeds[i].len) {
			fprintf(stderr, "fuzz_main: cannot write %s\n", path);
			return 1;
		}
		fclose(f);
		printf("%s  %s\n", path, seed_names[i]);
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void summary(uint64_t iters, double secs)
{
	printf("fuzz_main: seed=%llu iterations=%llu time=%.1fs (%.0f/s)\n",
	       (unsigned long long)cur_seed, (unsigned long long)iters, secs,
	       secs > 0 ? iters / secs : 0.0);
	printf("  inputs=%llu commands=%llu completions=%llu ok_collectives=%llu "
	       "passes=%llu idle_stops=%llu liveness_checked=%llu\n",
	       (unsigned long long)fz_totals.inputs, (unsigned long long)fz_totals.commands,
	       (unsigned long long)fz_totals.completions, (unsigned long long)fz_totals.ok_collectives,
	       (unsigned long long)fz_totals.passes, (unsigned long long)fz_totals.idle_stops,
	       (unsigned long long)fz_totals.live_checked);
	printf("  completions by status:");
	for (int s = 0; s < 16; s++)
		if (fz_totals.status_count[s] || s < 10)
			printf(" %d:%llu", -s, (unsigned long long)fz_totals.status_count[s]);
	printf("\n");
}

int main(int argc, char **argv)
{
	static struct fz_bytes pool[POOL], cur;
	uint64_t seed = 0, runs = UINT64_MAX, iters = 0, replayed = 0;
	double max_time = 0, t0;
	size_t max_len = FZ_MAX_INPUT;
	const char *dump = NULL;
	int nfiles = 0, have_seed = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strncmp(a, "-seed=", 6)) {
			seed = strtoull(a + 6, NULL, 0);
			have_seed = 1;
		} else if (!strncmp(a, "-runs=", 6)) {
			runs = strtoull(a + 6, NULL, 0);
		} else if (!strncmp(a, "-max_total_time=", 16)) {
			max_time = strtod(a + 16, NULL);
		} else if (!strncmp(a, "-max_len=", 9)) {
			max_len = strtoull(a + 9, NULL, 0);
			if (max_len < 16 || max_len > FZ_MAX_INPUT)
				max_len = FZ_MAX_INPUT;
		} else if (!strncmp(a, "-artifact_prefix=", 17)) {
			snprintf(artifact_prefix, sizeof(artifact_prefix), "%s", a + 17);
		} else if (!strncmp(a, "-verbose=", 9)) {
			fz_verbose = atoi(a + 9);
		} else if (!strncmp(a, "-dump_corpus=", 13)) {
			dump = a + 13;
		} else if (a[0] == '-') {
			fprintf(stderr, "fuzz_main: unknown option %s\n", a);
			return 2;
		} else {
			nfiles++;
		}
	}
	if (!have_seed)
		seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
	cur_seed = seed;
	fz_rng_seed(seed);
	nseeds = fz_build_seeds(seeds, seed_names, NSEEDS_MAX);
	install_handlers();
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (dump)
		return dump_corpus(dump);
	if (nfiles) {
		replaying = 1;
		for (int i = 1; i < argc; i++)
			if (argv[i][0] != '-' && replay(argv[i], &replayed))
				return 1;
		printf("fuzz_main: replayed %llu inputs, no failure\n", (unsigned long long)replayed);
		return 0;
	}
	if (runs == UINT64_MAX && max_time <= 0)
		runs = 10000;
	printf("fuzz_main: seed=%llu (rerun with -seed=%llu) runs=%s max_total_time=%g\n",
	       (unsigned long long)seed, (unsigned long long)seed,
	       runs == UINT64_MAX ? "unbounded" : "bounded", max_time);
	t0 = now_s();
	/* The seeds as they are, then random and mutated inputs. */
	for (uint32_t i = 0; i < nseeds && iters < runs; i++, iters++) {
		if (fz_verbose)
			fprintf(stderr, "seed input %u: %s\n", i, seed_names[i]);
		run_one(seeds[i].data, seeds[i].len, iters);
	}
	for (uint32_t i = 0; i < POOL; i++)
		pool[i] = seeds[i % nseeds];
	for (double last = t0; iters < runs; iters++) {
		uint32_t choice = fz_below(8);

		if (choice == 0) {
			fz_random_input(&cur);
		} else {
			/* Mostly a seed, sometimes a mutant of earlier rounds: mutations compound. */
			const struct fz_bytes *base = choice < 5 ? &seeds[fz_below(nseeds)] : &pool[fz_below(POOL)];

			cur = *base;
			fz_mutate(&cur, &seeds[fz_below(nseeds)]);
		}
		if (cur.len > max_len)
			cur.len = max_len;
		run_one(cur.data, cur.len, iters);
		pool[fz_below(POOL)] = cur;
		if ((iters & 255) == 0) {
			double t = now_s();

			if (max_time > 0 && t - t0 >= max_time)
				break;
			if (t - last >= 5) {
				printf("#%llu  %.0f inputs/s\n", (unsigned long long)iters, iters / (t - t0));
				last = t;
			}
		}
	}
	summary(iters, now_s() - t0);
	return 0;
}

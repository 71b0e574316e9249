/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Standalone driver for the firmware fuzz target (fuzz_engine.c), for compilers without
 * libFuzzer (gcc). No coverage feedback (tried with -fsanitize-coverage=trace-pc: keeping
 * inputs that reach new blocks added nothing over the seeds' mutants on this small engine,
 * at a third of the speed). It runs the seed inputs (valid command sequences, built in
 * fuzz_seeds.c), then random inputs and seeds mutated field by field, for a bounded number
 * of runs or seconds. Same seed, same inputs: a failure reproduces.
 *
 *   cc -std=c11 -O2 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
 *      -Idpa_firmware/include tests/c/fuzz_main.c tests/c/fuzz_seeds.c tests/c/fuzz_engine.c \
 *      tests/c/fuzz_hal.c $(ls dpa_firmware/src/[a-z]*.c) -o fuzz_main
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

/* ---- random numbers (splitmix64: the seed alone fixes every input) ---- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t below(uint32_t n)
{
	return n ? (uint32_t)(rnd() % n) : 0;
}

static struct fz_bytes seeds[NSEEDS_MAX];
static const char *seed_names[NSEEDS_MAX];
static uint32_t nseeds;

/* ---- mutation ---- */

static const uint64_t interesting64[] = {
	0, 1, 2, 7, 8, 63, 64, 100, 255, 256, 1000, 1024, 4095, 4096, 4097, 65535, 65536, 65537,
	1ull << 31, 1ull << 32, (1ull << 32) - 1, 1ull << 62, 1ull << 63, UINT64_MAX,
	UINT64_MAX - 1, UINT64_MAX - 63, FZ_AUX_BASE, FZ_AUX_BASE + FZ_AUX_LEN - 8,
};

static uint64_t pick_addr(uint32_t world)
{
	static const uint64_t len[FZ_KINDS] = { sizeof(struct offload_ctrl), FZ_SRC_LEN, FZ_DST_LEN };
	uint32_t k = below(FZ_KINDS + 1);
	uint64_t base, span;

	if (k == FZ_KINDS) {   /* aux */
		base = FZ_AUX_BASE;
		span = FZ_AUX_LEN;
	} else {
		base = fz_addr(below(world + 1), (enum fz_kind)k);
		span = len[k];
	}
	switch (below(6)) {
	case 0: return base;
	case 1: return base + span;
	case 2: return base + span - 1 - below(16);
	case 3: return base - 1 - below(64);
	case 4: return base + (below((uint32_t)span) & ~7u);
	default: return base + below((uint32_t)span);
	}
}

static uint64_t pick_value(uint32_t world)
{
	switch (below(5)) {
	case 0: return interesting64[below(sizeof(interesting64) / sizeof(interesting64[0]))];
	case 1: return pick_addr(world);
	case 2: return below(5000);
	case 3: return (uint64_t)below(64) << below(20);
	default: return rnd();
	}
}

static uint32_t pick_key(uint32_t world)
{
	switch (below(4)) {
	case 0: return 0;
	case 1: return (uint32_t)rnd();
	default: return fz_key(below(world + 1), (enum fz_kind)below(FZ_KINDS));
	}
}

/* Offsets of the sections, the way fz_decode finds them. */
struct layout {
	uint32_t world, ncmds, npokes;
	size_t cmds, pokes, aux;
};

static struct layout layout_of(const struct fz_bytes *in)
{
	static struct fz_input dec;
	struct layout l;

	fz_decode(in->data, in->len, &dec);
	l.world = dec.world;
	l.ncmds = dec.ncmds;
	l.npokes = dec.npokes;
	l.cmds = sizeof(struct fz_header);
	l.pokes = l.cmds + l.ncmds * sizeof(struct offload_cmd);
	l.aux = l.pokes + l.npokes * sizeof(struct fz_poke);
	return l;
}

static void set_header_count(struct fz_bytes *in, size_t field, uint32_t v)
{
	in->data[field] = (uint8_t)v;
}

static void mutate_cmd(struct fz_bytes *in, const struct layout *l)
{
	struct offload_cmd c;
	size_t off;

	if (!l->ncmds)
		return;
	off = l->cmds + below(l->ncmds) * sizeof(c);
	memcpy(&c, in->data + off, sizeof(c));
	switch (below(12)) {
	case 0: c.opcode = (uint8_t)(below(4) ? below(OFFLOAD_OP_MAX + 2) : rnd()); break;
	case 1: c.flags = (uint8_t)(below(2) ? 1u << below(8) : rnd()); break;
	case 2: c.team = (uint16_t)(below(3) ? below(OFFLOAD_MAX_TEAMS + 1) : rnd()); break;
	case 3: c.src_addr = pick_value(l->world); break;
	case 4: c.dst_addr = pick_value(l->world); break;
	case 5: c.count = below(3) ? pick_value(l->world) : FZ_TAG(below(FZ_MAX_CMDS)); break;
	case 6: c.src_key = pick_key(l->world); break;
	case 7: c.dst_key = pick_key(l->world); break;
	case 8: c.dst_len = pick_value(l->world); break;
	case 9: c.aux_addr = below(3) ? FZ_AUX_BASE + below(FZ_AUX_LEN + 64) : pick_value(l->world); break;
	case 10: c.root = below(2) ? below(8) : (uint32_t)rnd(); break;
	default: c.count = c.count ? c.count * 2 : 1; c.dst_len = c.count * l->world; break;
	}
	memcpy(in->data + off, &c, sizeof(c));
}

static void mutate_poke(struct fz_bytes *in, const struct layout *l)
{
	struct fz_poke p;
	size_t off;

	if (!l->npokes)
		return;
	off = l->pokes + below(l->npokes) * sizeof(p);
	memcpy(&p, in->data + off, sizeof(p));
	switch (below(8)) {
	case 0: p.kind = (uint8_t)below(FZ_POKE_KINDS); break;
	case 1: p.seq = (uint16_t)(below(4) ? below(12) : rnd()); break;
	case 2: p.a = pick_value(l->world); break;
	case 3: p.b = pick_value(l->world); break;
	case 4: p.c = below(2) ? pick_key(l->world) : (uint32_t)rnd(); break;
	case 5: p.d = below(2) ? OFFLOAD_READY_REFUSED : (uint32_t)rnd(); break;
	case 6: p.at_pass = (uint16_t)below(64); break;
	default: p.src = (uint8_t)below(l->world + 1); p.slot = (uint8_t)below(8); break;
	}
	memcpy(in->data + off, &p, sizeof(p));
}

/* Insert n bytes at off (bounded by FZ_MAX_INPUT); returns 0 if there is no room. */
static int insert_bytes(struct fz_bytes *in, size_t off, const void *p, size_t n)
{
	if (in->len + n > FZ_MAX_INPUT)
		return 0;
	memmove(in->data + off + n, in->data + off, in->len - off);
	memcpy(in->data + off, p, n);
	in->len += n;
	return 1;
}

static void erase_bytes(struct fz_bytes *in, size_t off, size_t n)
{
	memmove(in->data + off, in->data + off + n, in->len - off - n);
	in->len -= n;
}

static void add_poke(struct fz_bytes *in, const struct layout *l)
{
	uint32_t src = below(l->world), me = in->data[1] % l->world;
	struct fz_poke p = { .kind = (uint8_t)below(FZ_POKE_KINDS), .team = (uint8_t)below(3),
		.slot = (uint8_t)below(OFFLOAD_OP_WINDOW), .src = (uint8_t)src,
		.at_pass = (uint16_t)below(40), .seq = (uint16_t)(1 + below(10)) };

	switch (p.kind) {
	case FZ_POKE_READY:
		p.a = fz_addr(src, FZ_DST) + me * (uint64_t)below(2048);
		p.b = below(2) ? below(4096) : pick_value(l->world);
		p.c = below(4) ? fz_key(src, FZ_DST) : pick_key(l->world);
		p.d = below(8) ? 0 : OFFLOAD_READY_REFUSED;
		break;
	case FZ_POKE_COUNT:
		p.a = below(4) ? below(4096) : pick_value(l->world);
		break;
	case FZ_POKE_DONE:
		p.a = below(4) ? OFFLOAD_SIGNAL_OK : below(2) ? OFFLOAD_SIGNAL_ERROR : rnd();
		break;
	case FZ_POKE_HOST:
		p.c = below(4) ? 0 : (uint32_t)rnd();
		p.a = below(2) ? 1ull << below(l->world) : rnd();
		break;
	case FZ_POKE_RAIL:
		p.c = below(4);
		p.d = below(4) == 0;
		break;
	default:
		p.a = pick_value(l->world);
		p.c = (uint32_t)rnd();
		break;
	}
	if (l->npokes < FZ_MAX_POKES && insert_bytes(in, l->aux, &p, sizeof(p)))
		set_header_count(in, offsetof(struct fz_header, npokes), l->npokes + 1);
}

static void mutate_aux(struct fz_bytes *in, const struct layout *l)
{
	static const uint32_t anchors[] = { FZ_SEED_AUX_DESC, FZ_SEED_AUX_ARGS, FZ_SEED_AUX_ARGS2,
					    FZ_SEED_AUX_ROWS, FZ_SEED_AUX_DESC2 };
	uint32_t base = anchors[below(5)], off;
	uint64_t v = pick_value(l->world);

	/* Near a structure the seeds placed: a field of a descriptor or of the args. */
	off = base + (below(3) ? below(64) * 8 : below(sizeof(struct offload_alltoallv_args)));
	if (below(3) == 0)
		v = below(70);
	while (l->aux + off + 8 > in->len && in->len + 8 <= FZ_MAX_INPUT)
		in->data[in->len++] = 0;
	if (l->aux + off + 8 <= in->len)
		memcpy(in->data + l->aux + off, &v, below(2) ? 8 : 4);
}

static void mutate(struct fz_bytes *in, const struct fz_bytes *other)
{
	uint32_t n = 1 + below(6);

	if (in->len < sizeof(struct fz_header)) {  /* mutations assume a whole header */
		memset(in->data + in->len, 0, sizeof(struct fz_header) - in->len);
		in->len = sizeof(struct fz_header);
	}
	for (uint32_t k = 0; k < n; k++) {
		struct layout l = layout_of(in);
		size_t off;
		struct offload_cmd c;

		switch (below(14)) {
		case 0:
			if (in->len)
				in->data[below((uint32_t)in->len)] ^= (uint8_t)(1u << below(8));
			break;
		case 1:
			if (in->len)
				in->data[below((uint32_t)in->len)] = (uint8_t)(below(2) ? rnd() : interesting64[below(8)]);
			break;
		case 2: /* a header field */
			in->data[below(sizeof(struct fz_header))] = (uint8_t)rnd();
			break;
		case 3: case 4: case 5:
			mutate_cmd(in, &l);
			break;
		case 6: /* duplicate a command */
			if (l.ncmds && l.ncmds < FZ_MAX_CMDS) {
				off = l.cmds + below(l.ncmds) * sizeof(c);
				memcpy(&c, in->data + off, sizeof(c));
				if (insert_bytes(in, l.cmds + below(l.ncmds + 1) * sizeof(c), &c, sizeof(c)))
					set_header_count(in, offsetof(struct fz_header, ncmds), l.ncmds + 1);
			}
			break;
		case 7: /* drop a command */
			if (l.ncmds) {
				erase_bytes(in, l.cmds + below(l.ncmds) * sizeof(c), sizeof(c));
				set_header_count(in, offsetof(struct fz_header, ncmds), l.ncmds - 1);
			}
			break;
		case 8: /* splice: a command of another input */
			if (other && l.ncmds) {
				struct layout lo = layout_of(other);

				if (lo.ncmds) {
					memcpy(&c, other->data + lo.cmds + below(lo.ncmds) * sizeof(c), sizeof(c));
					memcpy(in->data + l.cmds + below(l.ncmds) * sizeof(c), &c, sizeof(c));
				}
			}
			break;
		case 9:
			add_poke(in, &l);
			break;
		case 10:
			mutate_poke(in, &l);
			break;
		case 11: case 12:
			mutate_aux(in, &l);
			break;
		default: /* truncate */
			if (in->len > 16 && !below(4))
				in->len = 16 + below((uint32_t)(in->len - 16));
			break;
		}
	}
}

static void random_input(struct fz_bytes *in)
{
	size_t ncmds = below(24), npokes = below(4), aux = below(2) ? below(4096) : 0;

	for (size_t i = 0; i < sizeof(struct fz_header); i++)
		in->data[i] = (uint8_t)rnd();
	in->data[offsetof(struct fz_header, ncmds)] = (uint8_t)ncmds;
	in->data[offsetof(struct fz_header, npokes)] = (uint8_t)npokes;
	in->len = sizeof(struct fz_header) + ncmds * 64 + npokes * 32 + aux;
	for (size_t i = sizeof(struct fz_header); i < in->len; i++)
		in->data[i] = (uint8_t)rnd();
	/* Opcodes mostly valid: otherwise almost every command is rejected at once. */
	for (size_t i = 0; i < ncmds; i++) {
		uint8_t *cmd = in->data + sizeof(struct fz_header) + i * 64;

		if (below(4))
			cmd[0] = (uint8_t)below(OFFLOAD_OP_MAX + 1);
		if (below(2))
			cmd[2] = cmd[3] = 0;   /* team 0 */
	}
}

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
	rng_state = seed;
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
		uint32_t choice = below(8);

		if (choice == 0) {
			random_input(&cur);
		} else {
			/* Mostly a seed, sometimes a mutant of earlier rounds: mutations compound. */
			const struct fz_bytes *base = choice < 5 ? &seeds[below(nseeds)] : &pool[below(POOL)];

			cur = *base;
			mutate(&cur, &seeds[below(nseeds)]);
		}
		if (cur.len > max_len)
			cur.len = max_len;
		run_one(cur.data, cur.len, iters);
		pool[below(POOL)] = cur;
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

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dpa-sim: the simulator's command line, driven by offload_lib/sim_cli.py
 * (`dpa-offload sim ...`), which turns user options into key=value arguments:
 *
 *   dpa-sim run coll=alltoall n=64 size=16384 [threads= rails= seed= chunk= window=
 *           iters= payload=real|phantom vmode= root= events=F trace=F model.NAME=V
 *           mem_check=0|1 ...]   (1: refuse, exit 2, a job this machine cannot hold)
 *   dpa-sim explore seeds=LO..HI [budget_s=S]      seeds of generator g1, one line per failure
 *   dpa-sim replay seed=K [events=F]               one explorer seed, described
 *   dpa-sim check n=LO..HI [threads=T]             every collective at every n, exact
 *   dpa-sim model                                  every model parameter and its default
 *
 * Results are one JSON object on stdout.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_driver.h"

static double wall(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const struct { const char *name; uint32_t opcode; } colls[] = {
	{ "alltoall", OFFLOAD_OP_ALLTOALL }, { "alltoallv", OFFLOAD_OP_ALLTOALLV },
	{ "barrier", OFFLOAD_OP_BARRIER }, { "broadcast", OFFLOAD_OP_BROADCAST },
	{ "allgather", OFFLOAD_OP_ALLGATHER }, { "reduce_scatter", OFFLOAD_OP_REDUCE_SCATTER },
	{ "allreduce", OFFLOAD_OP_ALLREDUCE },
};

struct run_args {
	struct sim_job job;
	struct sim_model model;
	uint32_t opcode, iters, vmode, root, mem_check;
	uint64_t size;
	const char *events, *trace;
};

static int parse_u64(const char *v, uint64_t *out)
{
	char *end;

	*out = strtoull(v, &end, 0);
	return end == v || *end ? -1 : 0;
}

static int parse_run(int argc, char **argv, struct run_args *a)
{
	sim_model_defaults(&a->model);
	a->job = (struct sim_job){ .n = 8, .threads = 4, .rails = 1, .window = 1, .seed = 1,
				   .chunk_size = 1u << 20, .chunks_per_pass = 4, .mcast_roots = 2 };
	a->opcode = OFFLOAD_OP_ALLTOALL;
	a->iters = 1;
	a->mem_check = 1;
	a->size = 4096;
	a->job.moe_tokens = 4096;
	for (int i = 0; i < argc; i++) {
		char *eq = strchr(argv[i], '='), *key = argv[i];
		uint64_t v = 0;
		int num;

		if (!eq) {
			fprintf(stderr, "dpa-sim: argument '%s' is not key=value\n", argv[i]);
			return -1;
		}
		*eq = 0;
		num = !parse_u64(eq + 1, &v);
		if (!strncmp(key, "model.", 6)) {
			if (sim_model_set(&a->model, key + 6, eq + 1)) {
				fprintf(stderr, "dpa-sim: unknown model parameter or bad value: %s=%s\n",
					key + 6, eq + 1);
				return -1;
			}
		} else if (!strcmp(key, "coll")) {
			uint32_t k = 0;

			while (k < sizeof(colls) / sizeof(colls[0]) && strcmp(colls[k].name, eq + 1))
				k++;
			if (k == sizeof(colls) / sizeof(colls[0])) {
				fprintf(stderr, "dpa-sim: unknown collective %s\n", eq + 1);
				return -1;
			}
			a->opcode = colls[k].opcode;
		} else if (!strcmp(key, "payload")) {
			a->job.payload = !strcmp(eq + 1, "phantom") ? SIM_PHANTOM : SIM_REAL;
		} else if (!strcmp(key, "events")) {
			a->events = eq + 1;
		} else if (!strcmp(key, "trace")) {
			a->trace = eq + 1;
		} else if (!num) {
			fprintf(stderr, "dpa-sim: %s wants a number, got %s\n", key, eq + 1);
			return -1;
		} else if (!strcmp(key, "n")) {
			a->job.n = (uint32_t)v;
		} else if (!strcmp(key, "size")) {
			a->size = v;
		} else if (!strcmp(key, "threads")) {
			a->job.threads = (uint32_t)v;
		} else if (!strcmp(key, "rails")) {
			a->job.rails = (uint32_t)v;
		} else if (!strcmp(key, "seed")) {
			a->job.seed = v;
		} else if (!strcmp(key, "chunk")) {
			a->job.chunk_size = v;
		} else if (!strcmp(key, "chunks_per_pass")) {
			a->job.chunks_per_pass = (uint32_t)v;
		} else if (!strcmp(key, "eager")) {
			a->job.eager_max = (uint32_t)v;
		} else if (!strcmp(key, "roots")) {
			a->job.mcast_roots = (uint32_t)v;
		} else if (!strcmp(key, "iters")) {
			a->iters = (uint32_t)v;
		} else if (!strcmp(key, "vmode")) {
			a->vmode = (uint32_t)v;
		} else if (!strcmp(key, "root")) {
			a->root = (uint32_t)v;
		} else if (!strcmp(key, "tokens")) {
			a->job.moe_tokens = v;
		} else if (!strcmp(key, "a2a_window")) {
			a->job.a2a_window = (uint32_t)v;
		} else if (!strcmp(key, "window")) {
			a->job.window = (uint32_t)v;
		} else if (!strcmp(key, "mem_check")) {
			a->mem_check = (uint32_t)v;
		} else if (!strcmp(key, "remote_wake_all")) {
			a->job.remote_wake_all = (uint32_t)v;
		} else {
			fprintf(stderr, "dpa-sim: unknown argument %s\n", key);
			return -1;
		}
	}
	if (a->job.n < 1 || a->job.n > SIM_MAX_RANKS) {
		fprintf(stderr, "dpa-sim: n=%u: this build's jobs hold 1..%u ranks\n", a->job.n,
			SIM_MAX_RANKS);
		return -1;
	}
	if (a->root >= a->job.n) {
		fprintf(stderr, "dpa-sim: root=%u is not a rank of n=%u\n", a->root, a->job.n);
		return -1;
	}
	return 0;
}

static int cmd_run(int argc, char **argv)
{
	struct run_args a = { 0 };
	struct sim_mem_need need;
	struct sim_drv d;
	char why[512];
	uint32_t *world, n;
	uint64_t *busy0, *tx0, t0 = 0, tmax = 0, sum_tx = 0, max_tx = 0;
	double w0 = wall(), busy_sum = 0, busy_max = 0;
	FILE *events = NULL;
	int rc;

	if (parse_run(argc, argv, &a))
		return 2;
	n = a.job.n;
	sim_mem_need(&a.job, &a.model, a.opcode, a.size, a.vmode, &need);
	if (a.mem_check && sim_mem_fits(&a.job, &need, why, sizeof(why))) {
		fprintf(stderr, "dpa-sim: %s\n", why);
		return 2;
	}
	if (sim_drv_init(&d, &a.job, &a.model)) {
		fprintf(stderr, "dpa-sim: cannot set up the world (memory?)\n");
		return 1;
	}
	if (a.events) {
		events = fopen(a.events, "w");
		if (!events) {
			perror(a.events);
			return 1;
		}
		d.w.events = events;
	}
	world = malloc(n * sizeof(*world));
	busy0 = calloc((uint64_t)n * a.job.threads, 8);
	tx0 = calloc(n, 8);
	if (!world || !busy0 || !tx0)
		return 1;
	for (uint32_t i = 0; i < n; i++)
		world[i] = i;
	rc = sim_drv_team(&d, 0, n, world) || sim_drv_run(&d);
	for (uint32_t it = 0; !rc && it < a.iters; it++) {
		struct sim_opdesc op = { .opcode = a.opcode, .team = 0, .root = a.root,
					 .vmode = a.vmode, .size = a.size };

		if (it + 1 == a.iters) {  /* the measured op: snapshot counters, trace it */
			for (uint32_t i = 0; i < n; i++) {
				tx0[i] = 0;
				for (uint32_t r = 0; r < a.job.rails; r++)
					tx0[i] += d.w.ranks[i].port[r].bytes_tx;
				for (uint32_t t = 0; t < a.job.threads; t++)
					busy0[i * a.job.threads + t] = d.w.ranks[i].thr[t].busy_ps;
			}
			if (a.trace) {
				d.w.trace = fopen(a.trace, "w");
				if (!d.w.trace) {
					perror(a.trace);
					return 1;
				}
				fprintf(d.w.trace, "{\"traceEvents\":[\n");
				d.w.trace_first = 1;
				d.w.trace_from = d.w.now;
			}
		}
		t0 = d.w.now;
		rc = sim_drv_add_op(&d, &op) || sim_drv_run(&d);
	}
	if (d.w.trace) {
		fprintf(d.w.trace, "],\"displayTimeUnit\":\"ns\"}\n");
		fclose(d.w.trace);
		d.w.trace = NULL;
	}
	if (rc) {
		printf("{\"ok\":false,\"error\":\"%s\"}\n", d.err[0] ? d.err : "setup failed");
		sim_drv_free(&d);
		return 1;
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct sim_inst *in = &d.hosts[i].inst[d.nops - 1];
		uint64_t tx = 0;

		if (in->t_done - t0 > tmax)
			tmax = in->t_done - t0;
		for (uint32_t r = 0; r < a.job.rails; r++)
			tx += d.w.ranks[i].port[r].bytes_tx;
		tx -= tx0[i];
		sum_tx += tx;
		if (tx > max_tx)
			max_tx = tx;
	}
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t t = 0; t < a.job.threads; t++) {
			double b = (double)(d.w.ranks[i].thr[t].busy_ps - busy0[i * a.job.threads + t]) /
				   (double)(tmax ? tmax : 1);

			busy_sum += b;
			if (b > busy_max)
				busy_max = b;
		}
	printf("{\"ok\":true,\"n\":%u,\"size\":%llu,\"threads\":%u,\"time_ps\":%llu,"
	       "\"inj_bytes_mean\":%.1f,\"inj_bytes_max\":%llu,\"dpa_busy_mean\":%.4f,"
	       "\"dpa_busy_max\":%.4f,\"events\":%llu,\"passes\":%llu,\"msgs\":%llu,"
	       "\"mc_chunks\":%llu,\"mc_lost\":%llu,\"rescues\":%u,\"hash\":\"%016llx\","
	       "\"wall_s\":%.3f,\"mem_touched_est\":%llu,\"mem_mapped_est\":%llu}\n",
	       n, (unsigned long long)a.size, a.job.threads, (unsigned long long)tmax,
	       (double)sum_tx / n, (unsigned long long)max_tx,
	       busy_sum / ((double)n * a.job.threads), busy_max,
	       (unsigned long long)d.w.cnt.events, (unsigned long long)d.w.cnt.passes,
	       (unsigned long long)d.w.cnt.msgs, (unsigned long long)d.w.cnt.mc_chunks,
	       (unsigned long long)d.w.cnt.mc_lost, d.rescues, (unsigned long long)d.w.hash,
	       wall() - w0, (unsigned long long)need.touched, (unsigned long long)need.mapped);
	if (events)
		fclose(events);
	sim_drv_free(&d);
	free(world);
	free(busy0);
	free(tx0);
	return 0;
}

/* n=LO..HI [threads=T]: every collective (all-to-all-v in each mode, several sizes) at every
 * world size in the range, real bytes, each checked exactly; one JSON line per failure. */
static int cmd_check(int argc, char **argv)
{
	unsigned lo = 2, hi = 64, threads = 4, failures = 0, runs = 0;
	struct sim_model model;

	for (int i = 0; i < argc; i++)
		if (sscanf(argv[i], "n=%u..%u", &lo, &hi) != 2 && sscanf(argv[i], "threads=%u", &threads) != 1) {
			fprintf(stderr, "dpa-sim check: unknown argument %s\n", argv[i]);
			return 2;
		}
	sim_model_defaults(&model);
	for (unsigned n = lo; n <= hi && n <= SIM_MAX_RANKS; n++) {
		struct sim_job job = { .n = n, .threads = threads, .rails = 1, .window = 2, .seed = n,
				       .chunk_size = 4096, .chunks_per_pass = 4, .mcast_roots = 2 };
		struct sim_drv *d = calloc(1, sizeof(*d));
		uint32_t world[SIM_MAX_RANKS];
		const struct sim_opdesc ops[] = {
			{ .opcode = OFFLOAD_OP_BARRIER },
			{ .opcode = OFFLOAD_OP_ALLTOALL, .size = 1 },
			{ .opcode = OFFLOAD_OP_ALLTOALL, .size = 5000 },
			{ .opcode = OFFLOAD_OP_ALLTOALLV, .size = 3000, .vmode = SIM_V_PLAIN },
			{ .opcode = OFFLOAD_OP_ALLTOALLV, .size = 3000, .vmode = SIM_V_EXPECT },
			{ .opcode = OFFLOAD_OP_ALLTOALLV, .size = 3000, .vmode = SIM_V_SLOTS },
			{ .opcode = OFFLOAD_OP_BROADCAST, .size = 10000, .root = n - 1 },
			{ .opcode = OFFLOAD_OP_ALLGATHER, .size = 5000 },
			{ .opcode = OFFLOAD_OP_REDUCE_SCATTER, .size = 8ull * n * 300 },
			{ .opcode = OFFLOAD_OP_ALLREDUCE, .size = 8ull * 1000 },
			{ .opcode = OFFLOAD_OP_BARRIER },
		};
		int rc;

		if (!d)
			return 1;
		for (uint32_t i = 0; i < n; i++)
			world[i] = i;
		rc = sim_drv_init(d, &job, &model) || sim_drv_team(d, 0, n, world);
		for (uint32_t k = 0; !rc && k < sizeof(ops) / sizeof(ops[0]); k++)
			rc = sim_drv_add_op(d, &ops[k]);
		if (!rc)
			rc = sim_drv_run(d);
		runs++;
		if (rc) {
			failures++;
			printf("{\"n\":%u,\"error\":\"%s\"}\n", n, d->err[0] ? d->err : "setup failed");
		}
		sim_drv_free(d);
		free(d);
	}
	printf("{\"worlds\":%u,\"failures\":%u}\n", runs, failures);
	return failures ? 1 : 0;
}

static int cmd_model(void)
{
	printf("{");
	for (uint32_t i = 0; i < sim_nparams; i++)
		printf("%s\"%s\":{\"default\":%llu,\"unit\":\"%s\"}", i ? "," : "", sim_params[i].name,
		       (unsigned long long)sim_params[i].def, sim_params[i].unit);
	printf("}\n");
	return 0;
}

int sim_cmd_explore(int argc, char **argv);
int sim_cmd_replay(int argc, char **argv);

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "run"))
		return cmd_run(argc - 2, argv + 2);
	if (argc >= 2 && !strcmp(argv[1], "check"))
		return cmd_check(argc - 2, argv + 2);
	if (argc >= 2 && !strcmp(argv[1], "model"))
		return cmd_model();
	if (argc >= 2 && !strcmp(argv[1], "explore"))
		return sim_cmd_explore(argc - 2, argv + 2);
	if (argc >= 2 && !strcmp(argv[1], "replay"))
		return sim_cmd_replay(argc - 2, argv + 2);
	fprintf(stderr, "usage: dpa-sim run|explore|replay|model [key=value ...]\n");
	return 2;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libdpaoffload_mpi: MPI_Init/Finalize, the context, per-communicator teams, statistics.
 *
 * At MPI_Init the context is created over PMPI_Allgather on a duplicate of
 * MPI_COMM_WORLD; its outcome is the same on every rank, so a job either offloads or
 * passes everything through (one warning line from rank 0). Each communicator gets a
 * team at its first offloaded call (every member makes that call, so the creation is
 * collective at a consistent point), over its own duplicate for the team's OOB; the
 * team is destroyed when the communicator is freed (or at MPI_Finalize).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dpo_mpi.h"

struct dpo_mpi dpo_mpi = { .lock = PTHREAD_MUTEX_INITIALIZER, .comm_keyval = MPI_KEYVAL_INVALID };

static const char *const coll_names[C_NCOLL] = {
	"MPI_Alltoall", "MPI_Alltoallv", "MPI_Bcast", "MPI_Allgather",
	"MPI_Ialltoall", "MPI_Ialltoallv", "MPI_Ibcast", "MPI_Iallgather",
	"MPI_Alltoall_init", "MPI_Allreduce", "MPI_Iallreduce", "MPI_Reduce_scatter_block",
	"MPI_Ireduce_scatter_block",
};
static const char *const coll_keys[C_NCOLL] = {
	"alltoall", "alltoallv", "bcast", "allgather", "ialltoall", "ialltoallv", "ibcast",
	"iallgather", "alltoall_init", "allreduce", "iallreduce", "reduce_scatter_block",
	"ireduce_scatter_block",
};
static const char *const reason_names[R_NREASON] = {
	"offloaded", "packed", "disabled", "no_context", "intercomm", "foreign_procs",
	"comm_size_1", "in_place", "below_threshold", "bad_args", "noncontig", "no_team",
	"op", "datatype",
};

const char *dpo_mpi_coll_name(enum dpo_mpi_coll c)
{
	return coll_names[c];
}

void dpo_mpi_lock(void)
{
	if (dpo_mpi.thread_multiple)
		pthread_mutex_lock(&dpo_mpi.lock);
}

void dpo_mpi_unlock(void)
{
	if (dpo_mpi.thread_multiple)
		pthread_mutex_unlock(&dpo_mpi.lock);
}

void dpo_mpi_count(enum dpo_mpi_coll c, enum dpo_mpi_reason r)
{
	if (dpo_mpi.stats_mode)
		__atomic_fetch_add(&dpo_mpi.counts[c][r], 1, __ATOMIC_RELAXED);
}

/* "256K", "1M", "4096" */
static uint64_t parse_bytes(const char *s, uint64_t dflt)
{
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return dflt;
	v = strtoull(s, &end, 10);
	if (end == s)
		return dflt;
	switch (*end) {
	case 'k': case 'K': return v << 10;
	case 'm': case 'M': return v << 20;
	case 'g': case 'G': return v << 30;
	}
	return v;
}

static void read_env(void)
{
	const char *colls = getenv("DPA_OFFLOAD_MPI_COLLS");
	const char *stats = getenv("DPA_OFFLOAD_MPI_STATS");
	const char *nc = getenv("DPA_OFFLOAD_MPI_NONCONTIG");

	/* Defaults from the same-run benchmark (docs/performance.md, n=4 on this kind of
	 * machine): all-to-all wins from 1 MiB per peer, broadcast from 2 MiB; all-gather over
	 * the emulated multicast lost to Open MPI at every size measured (1-4 MiB blocks), so
	 * it is served only when asked for; allreduce wins from a 16 MiB vector,
	 * reduce-scatter-block from a 1 MiB input (dpo_mpi.h). */
	const char *m = getenv("DPA_OFFLOAD_MPI_MIN_BYTES");
	int given = m && *m;
	uint64_t all = parse_bytes(m, 0);

	dpo_mpi.min_alltoall = parse_bytes(getenv("DPA_OFFLOAD_MPI_MIN_BYTES_ALLTOALL"),
					   given ? all : 1u << 20);
	dpo_mpi.min_bcast = parse_bytes(getenv("DPA_OFFLOAD_MPI_MIN_BYTES_BCAST"), given ? all : 2u << 20);
	dpo_mpi.min_allgather = parse_bytes(getenv("DPA_OFFLOAD_MPI_MIN_BYTES_ALLGATHER"),
					    given ? all : UINT64_MAX);
	dpo_mpi.min_allreduce = parse_bytes(getenv("DPA_OFFLOAD_MPI_MIN_BYTES_ALLREDUCE"),
					    given ? all : DPO_MPI_MIN_ALLREDUCE);
	dpo_mpi.min_reduce_scatter = parse_bytes(getenv("DPA_OFFLOAD_MPI_MIN_BYTES_REDUCE_SCATTER"),
						 given ? all : DPO_MPI_MIN_REDUCE_SCATTER);
	for (int c = 0; c < C_NCOLL; c++) {
		/* a name enables its blocking, non-blocking and persistent forms */
		const char *base = coll_keys[c][0] == 'i' && c != C_ALLTOALL_INIT ? coll_keys[c] + 1 :
				   c == C_ALLTOALL_INIT ? "alltoall" : coll_keys[c];
		char list[256];

		dpo_mpi.colls_enabled[c] = 1;
		if (!colls)
			continue;
		snprintf(list, sizeof(list), ",%s,", colls);
		char key[48];
		snprintf(key, sizeof(key), ",%s,", base);
		dpo_mpi.colls_enabled[c] = strstr(list, key) != NULL;
	}
	dpo_mpi.noncontig_pass = nc && !strcmp(nc, "pass");
	dpo_mpi.stats_mode = !stats || !*stats || !strcmp(stats, "0") ? 0 :
			     !strcmp(stats, "rank") ? 2 : 1;
}

/* ---- the context's OOB: PMPI_Allgather on a private duplicate of a communicator ---- */
static dpo_status_t oob_allgather(void *src, void *recv, size_t size, void *info, void **req)
{
	MPI_Comm comm = *(MPI_Comm *)info;

	*req = NULL;
	return PMPI_Allgather(src, (int)size, MPI_BYTE, recv, (int)size, MPI_BYTE, comm) ==
	       MPI_SUCCESS ? DPO_OK : DPO_ERR_OOB;
}

static dpo_status_t oob_test(void *req)
{
	(void)req;
	return DPO_OK;  /* the allgather above completed before it returned */
}

static dpo_status_t oob_free(void *req)
{
	(void)req;
	return DPO_OK;
}

static int comm_delete(MPI_Comm comm, int keyval, void *attr, void *extra)
{
	struct comm_state *cs = attr;

	(void)comm, (void)keyval, (void)extra;
	dpo_mpi_lock();
	cs->freed = 1;
	if (!cs->live_ops)
		dpo_mpi_release_team(cs);
	dpo_mpi_unlock();
	return MPI_SUCCESS;
}

static void start_context(void)
{
	dpo_context_params_t cp = { .mask = DPO_CONTEXT_PARAM_FIELD_OOB };
	const char *off = getenv("DPA_OFFLOAD_MPI");
	dpo_status_t st;
	int ok, all_ok;

	PMPI_Comm_rank(MPI_COMM_WORLD, &dpo_mpi.world_rank);
	PMPI_Comm_size(MPI_COMM_WORLD, &dpo_mpi.world_size);
	PMPI_Comm_group(MPI_COMM_WORLD, &dpo_mpi.world_group);
	read_env();
	if (off && !strcmp(off, "0"))
		return;
	PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, comm_delete, &dpo_mpi.comm_keyval, NULL);
	PMPI_Comm_dup(MPI_COMM_WORLD, &dpo_mpi.boot);
	cp.oob = (dpo_oob_coll_t){ oob_allgather, oob_test, oob_free, &dpo_mpi.boot,
				   (uint32_t)dpo_mpi.world_size, (uint32_t)dpo_mpi.world_rank };
	/* A bad OFFLOAD_* value on one rank only must not split the job: agree on it. */
	st = dpo_config_read(&dpo_mpi.cfg);
	ok = st == DPO_OK;
	PMPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, dpo_mpi.boot);
	if (all_ok)
		st = dpo_context_create(&cp, dpo_mpi.cfg, &dpo_mpi.ctx);
	else if (ok)
		st = DPO_ERR_BOOTSTRAP;
	if (!all_ok || st != DPO_OK) {
		/* the same verdict on every rank (dpo_context_create agrees on it) */
		if (dpo_mpi.world_rank == 0)
			fprintf(stderr, "dpa-offload: collectives are not offloaded in this job: %s; "
				"MPI collectives pass through unchanged\n",
				ok ? dpo_last_error() : "a rank has an invalid OFFLOAD_* setting");
		dpo_config_release(dpo_mpi.cfg);
		dpo_mpi.cfg = NULL;
		dpo_mpi.ctx = NULL;
		return;
	}
	dpo_mpi.enabled = 1;
}

static void after_init(void)
{
	int level;

	PMPI_Query_thread(&level);
	dpo_mpi.thread_multiple = level == MPI_THREAD_MULTIPLE;
	start_context();
}

DPO_MPI_API int MPI_Init(int *argc, char ***argv)
{
	int rc = PMPI_Init(argc, argv);

	if (rc == MPI_SUCCESS)
		after_init();
	return rc;
}

DPO_MPI_API int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
	int rc = PMPI_Init_thread(argc, argv, required, provided);

	if (rc == MPI_SUCCESS)
		after_init();
	return rc;
}

/* Members of comm as world ranks (into out unless NULL); 0 if one is outside
 * MPI_COMM_WORLD (spawned, connected). A block at a time on the stack, so that a foreign
 * member is its only failure: classify() must not take a lack of memory for one. */
static int world_ranks(MPI_Comm comm, int n, uint32_t *out)
{
	enum { BLOCK = 64 };
	int in[BLOCK], w[BLOCK], ok = 1;
	MPI_Group g;

	PMPI_Comm_group(comm, &g);
	for (int base = 0; base < n && ok; base += BLOCK) {
		int k = n - base < BLOCK ? n - base : BLOCK;

		for (int i = 0; i < k; i++)
			in[i] = base + i;
		PMPI_Group_translate_ranks(g, k, in, dpo_mpi.world_group, w);
		for (int i = 0; i < k && ok; i++) {
			ok = w[i] != MPI_UNDEFINED;
			if (out)
				out[base + i] = (uint32_t)w[i];
		}
	}
	PMPI_Group_free(&g);
	return ok;
}

static enum dpo_mpi_reason classify(MPI_Comm comm)
{
	int inter, n;

	PMPI_Comm_test_inter(comm, &inter);
	if (inter)
		return R_INTERCOMM;
	PMPI_Comm_size(comm, &n);
	if (n == 1)
		return R_SIZE_1;
	/* Any size: a communicator is a subset of MPI_COMM_WORLD, whose size the context was
	 * opened with (a job past the offload's ranks limit has no context at all). */
	if (!world_ranks(comm, n, NULL))
		return R_FOREIGN;
	return R_OFFLOADED;
}

struct comm_state *dpo_mpi_state(MPI_Comm comm)
{
	struct comm_state *cs;
	int flag;

	PMPI_Comm_get_attr(comm, dpo_mpi.comm_keyval, &cs, &flag);
	if (flag)
		return cs;
	cs = calloc(1, sizeof(*cs));
	if (!cs)
		return NULL;
	cs->reason = classify(comm);
	cs->comm = comm;
	cs->shadow = MPI_COMM_NULL;
	PMPI_Comm_set_attr(comm, dpo_mpi.comm_keyval, cs);
	dpo_mpi_lock();
	cs->next = dpo_mpi.states;
	dpo_mpi.states = cs;
	dpo_mpi_unlock();
	return cs;
}

/* The first offloaded call on the communicator: every member is in this same call. */
int dpo_mpi_ensure_team(struct comm_state *cs)
{
	uint32_t *map;
	dpo_team_params_t tp;
	dpo_status_t st;
	int n, me;

	if (cs->team)
		return 1;
	if (cs->reason != R_OFFLOADED)
		return 0;
	PMPI_Comm_size(cs->comm, &n);
	PMPI_Comm_rank(cs->comm, &me);
	/* The team copies the map at create_post. Every member is in this call and none can
	 * fail alone without the others waiting in the OOB for it: an allocation failure here
	 * is a failed job either way, so it aborts like MPI's own. */
	map = malloc(sizeof(*map) * (size_t)n);
	if (!map) {
		fprintf(stderr, "dpa-offload: out of memory for the rank map of a team of %d ranks: "
			"give the job more memory, or leave collectives to MPI with "
			"DPA_OFFLOAD_MPI=0\n", n);
		PMPI_Abort(cs->comm, 1);
	}
	if (!world_ranks(cs->comm, n, map)) {
		/* classify() found every member in MPI_COMM_WORLD and a group never changes;
		 * were one foreign, every member would see it: all pass through, as there. */
		free(map);
		cs->reason = R_FOREIGN;
		return 0;
	}
	PMPI_Comm_dup(cs->comm, &cs->shadow);
	memset(&tp, 0, sizeof(tp));
	tp.mask = DPO_TEAM_PARAM_FIELD_OOB | DPO_TEAM_PARAM_FIELD_EP_MAP;
	tp.oob = (dpo_oob_coll_t){ oob_allgather, oob_test, oob_free, &cs->shadow, (uint32_t)n,
				   (uint32_t)me };
	tp.ep_map = (dpo_ep_map_t){ DPO_EP_MAP_ARRAY, (uint32_t)n, map };
	/* Not under our lock: the OOB waits for the other members, whose threads may need
	 * the lock meanwhile (team creation in the C API is thread-safe on its own). */
	st = dpo_team_create_post(dpo_mpi.ctx, &tp, &cs->team);
	free(map);
	while (st == DPO_OK && (st = dpo_team_create_test(cs->team)) == DPO_INPROGRESS)
		;
	if (st != DPO_OK) {
		/* every member reached the same verdict: this communicator passes through */
		if (getenv("DPA_OFFLOAD_MPI_VERBOSE") && me == 0)
			fprintf(stderr, "dpa-offload: no team for a communicator of %d ranks: %s\n",
				n, dpo_last_error());
		if (cs->team)
			dpo_team_destroy(cs->team);
		cs->team = NULL;
		cs->reason = R_NO_TEAM;
		return 0;
	}
	return 1;
}

/* Under the lock. */
void dpo_mpi_release_team(struct comm_state *cs)
{
	if (cs->team && dpo_team_destroy(cs->team) == DPO_OK)
		cs->team = NULL;
	if (cs->shadow != MPI_COMM_NULL)
		PMPI_Comm_free(&cs->shadow);
}

/* An offloaded op failed: say which rank and why, then MPI's error handler decides
 * (the default aborts the job; MPI_ERRORS_RETURN returns the code). */
int dpo_mpi_fail(struct comm_state *cs, enum dpo_mpi_coll c, dpo_coll_req_h req, dpo_status_t st)
{
	int32_t peer = req ? dpo_collective_peer(req) : -1;
	int code = st == DPO_ERR_INVALID_PARAM || st == DPO_ERR_NO_SPACE ||
		   st == DPO_ERR_COUNT_MISMATCH ? MPI_ERR_TRUNCATE : MPI_ERR_OTHER;

	/* the error names the peer by its world rank ("rank 1 died") */
	fprintf(stderr, "dpa-offload: rank %d: %s failed: %s%s\n", dpo_mpi.world_rank,
		coll_names[c], req && *dpo_collective_error(req) ? dpo_collective_error(req) :
		dpo_last_error(), code == MPI_ERR_OTHER ? "; aborting the job" : "");
	(void)peer;
	PMPI_Comm_call_errhandler(cs->comm, code);
	return code;
}

static void print_stats(void)
{
	static uint64_t sum[C_NCOLL][R_NREASON];
	uint64_t (*show)[R_NREASON] = sum;

	if (dpo_mpi.stats_mode == 2)
		show = dpo_mpi.counts;
	else
		PMPI_Reduce(dpo_mpi.counts, sum, C_NCOLL * R_NREASON, MPI_UINT64_T, MPI_SUM, 0,
			    MPI_COMM_WORLD);
	if (dpo_mpi.stats_mode == 1 && dpo_mpi.world_rank != 0)
		return;
	if (dpo_mpi.stats_mode == 1)
		fprintf(stderr, "dpa-offload MPI: %d ranks, counts summed over ranks\n",
			dpo_mpi.world_size);
	else
		fprintf(stderr, "dpa-offload MPI: rank %d\n", dpo_mpi.world_rank);
	fprintf(stderr, "%-26s %10s %8s %8s  %s\n", "collective", "offloaded", "packed", "passed",
		"reasons passed");
	for (int c = 0; c < C_NCOLL; c++) {
		uint64_t passed = 0;
		char reasons[512] = "";
		size_t at = 0;

		for (int r = R_DISABLED; r < R_NREASON; r++)
			if (show[c][r]) {
				passed += show[c][r];
				at += (size_t)snprintf(reasons + at, sizeof(reasons) - at, "%s=%llu ",
						       reason_names[r], (unsigned long long)show[c][r]);
			}
		if (!show[c][R_OFFLOADED] && !passed)
			continue;
		fprintf(stderr, "%-26s %10llu %8llu %8llu  %s\n", coll_names[c],
			(unsigned long long)show[c][R_OFFLOADED],
			(unsigned long long)show[c][R_PACKED], (unsigned long long)passed, reasons);
	}
}

DPO_MPI_API int MPI_Finalize(void)
{
	if (dpo_mpi.stats_mode)
		print_stats();
	if (dpo_mpi.enabled) {
		dpo_mpi_finish_all();
		dpo_mpi_lock();
		for (struct comm_state *cs = dpo_mpi.states; cs; cs = cs->next)
			dpo_mpi_release_team(cs);
		dpo_mpi_unlock();
		dpo_context_destroy(dpo_mpi.ctx);
		dpo_config_release(dpo_mpi.cfg);
		dpo_mpi.enabled = 0;
		PMPI_Comm_free(&dpo_mpi.boot);
	}
	/* states stay allocated: MPI_COMM_WORLD's attribute may still be read by PMPI */
	return PMPI_Finalize();
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dpo_context_create: the bootstrap over the caller's out-of-band allgather.
 *
 * Round 1 gathers one record per rank: versions, the settings every rank must share, and
 * (from ep 0) the job name and secret. Every rank checks the same records, so a
 * disagreement fails every rank with the same message. Then each rank opens its device;
 * round 2 gathers the outcomes, and one rank's failure fails them all with its reason:
 * callers (the MPI library) can fall back consistently.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dpo_internal.h"

#define DPO_BOOT_MAGIC 0x44504f31u  /* "DPO1" */
#define DPO_SLOTS_MAGIC 0x44504f54u
#define DPO_JOB_PREFIX "dpaoff"

struct boot_rec {
	uint32_t magic, api_major, abi_version, ep;
	uint32_t n_eps, pid, uid, cores;
	uint32_t threads, mtu, rails, ring_entries;
	uint64_t chunk_size, key, host_id;
	uint32_t eager_max, coop;
	char backend[16];
	char job[96];
};

struct open_rec {
	int32_t status;
	uint32_t threads;
	char msg[248];
};

_Static_assert(sizeof(struct boot_rec) == 192, "bootstrap record");
_Static_assert(sizeof(struct open_rec) == 256, "open record");

int64_t dpo_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One blocking allgather over the OOB, bounded by timeout_s. */
dpo_status_t dpo_oob_run(const dpo_oob_coll_t *oob, void *mine, void *all, size_t len,
			 double timeout_s)
{
	int64_t deadline = dpo_now_ns() + (int64_t)(timeout_s * 1e9);
	void *req = NULL;
	dpo_status_t st;
	uint32_t spins = 0;

	st = oob->allgather(mine, all, len, oob->coll_info, &req);
	if (st != DPO_OK)
		return dpo_fail(DPO_ERR_OOB, "the out-of-band allgather failed (%s)",
				dpo_status_string(st));
	while ((st = oob->req_test(req)) == DPO_INPROGRESS) {
		if (dpo_now_ns() > deadline) {
			/* req stays with the OOB: freeing a pending request is not ours to do */
			return dpo_fail(DPO_ERR_TIMED_OUT, "the out-of-band allgather did not "
					"complete in %.0f s (bootstrap_timeout): a rank did not join",
					timeout_s);
		}
		/* The peers are other processes: give the core away after a short spin. */
		if (++spins > 100)
			nanosleep(&(struct timespec){ .tv_nsec = 50000 }, NULL);
	}
	if (oob->req_free)
		oob->req_free(req);
	if (st != DPO_OK)
		return dpo_fail(DPO_ERR_OOB, "the out-of-band allgather failed (%s)",
				dpo_status_string(st));
	return DPO_OK;
}

static uint64_t host_hash(void)
{
	char name[256] = { 0 };
	uint64_t h = 1469598103934665603ull;

	gethostname(name, sizeof(name) - 1);
	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	return h;
}

static int pid_alive(long pid)
{
	return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* Every rank flocks its job segment shared while it lives (emulator/emu_job.c). */
static int job_in_use(const char *job)
{
	char path[160];
	int fd, busy;

	snprintf(path, sizeof(path), "/dev/shm/%s", job);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return 0;
	busy = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
	close(fd);
	return busy;
}

/* The C twin of launcher.cleanup_stale_segments: remove our uid's names of jobs whose
 * owner pid is gone and whose segment nobody holds (a job killed before it cleaned up). */
static void sweep_stale_segments(void)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	uid_t uid = getuid();

	if (!d)
		return;
	while ((e = readdir(d))) {
		char job[64];
		unsigned long u;
		long pid;
		int n = 0;
		struct stat st;

		if (sscanf(e->d_name, DPO_JOB_PREFIX "-%lu-%ld-%*16[0-9a-f]%n", &u, &pid, &n) != 2 ||
		    !n || u != uid || (size_t)n >= sizeof(job))
			continue;
		memcpy(job, e->d_name, (size_t)n);
		job[n] = 0;
		if (pid_alive(pid) || job_in_use(job))
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(st.st_mode) && st.st_uid == uid)
			unlinkat(dirfd(d), e->d_name, 0);
	}
	closedir(d);
}

static uint32_t online_cores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n > 0 ? (uint32_t)n : 1;
}

static dpo_status_t check_records(const struct boot_rec *r, uint32_t n, int emulator)
{
	for (uint32_t i = 0; i < n; i++) {
		if (r[i].magic != DPO_BOOT_MAGIC || r[i].api_major != DPO_API_MAJOR ||
		    r[i].abi_version != OFFLOAD_ABI_VERSION)
			return dpo_fail(DPO_ERR_BOOTSTRAP, "rank %u runs another build of "
					"libdpaoffload (API %u, ABI %u; rank 0: API %u, ABI %u)",
					i, r[i].api_major, r[i].abi_version, r[0].api_major,
					r[0].abi_version);
		if (r[i].ep != i || r[i].n_eps != n)
			return dpo_fail(DPO_ERR_BOOTSTRAP, "the OOB allgather is inconsistent: slot "
					"%u holds endpoint %u of %u", i, r[i].ep, r[i].n_eps);
		if (strcmp(r[i].backend, r[0].backend) || r[i].mtu != r[0].mtu ||
		    r[i].rails != r[0].rails || r[i].chunk_size != r[0].chunk_size)
			return dpo_fail(DPO_ERR_BOOTSTRAP, "rank %u has backend=%s mtu=%u rails=%u "
					"chunk_size=%llu but rank 0 has %s/%u/%u/%llu: set the same "
					"OFFLOAD_* values on every rank", i, r[i].backend, r[i].mtu,
					r[i].rails, (unsigned long long)r[i].chunk_size, r[0].backend,
					r[0].mtu, r[0].rails, (unsigned long long)r[0].chunk_size);
		if (r[i].eager_max != r[0].eager_max || r[i].coop != r[0].coop)
			return dpo_fail(DPO_ERR_BOOTSTRAP, "rank %u has eager_max=%u progress=%s but "
					"rank 0 has %u/%s: set the same OFFLOAD_* values on every rank",
					i, r[i].eager_max, r[i].coop ? "cooperative" : "threads",
					r[0].eager_max, r[0].coop ? "cooperative" : "threads");
		if (r[i].threads != r[0].threads)
			return dpo_fail(DPO_ERR_BOOTSTRAP, "rank %u asks for %u DPA threads but rank "
					"0 for %u", i, r[i].threads, r[0].threads);
		if (emulator && r[i].host_id != r[0].host_id)
			return dpo_fail(DPO_ERR_BOOTSTRAP, "the emulator runs every rank on one "
					"machine, but rank %u is on another host than rank 0", i);
	}
	return DPO_OK;
}

/* The job-wide team slot table (emulator: all ranks share one host). */
static struct dpo_slot_table *open_slot_table(const char *job)
{
	char name[128];
	struct dpo_slot_table *t;
	int fd;

	snprintf(name, sizeof(name), "/%s-dpoteams", job);
	fd = shm_open(name, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		return NULL;
	/* Every rank sizes it alike; the first one's zeroes are the initial state. */
	if (ftruncate(fd, sizeof(*t))) {
		close(fd);
		return NULL;
	}
	t = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return t == MAP_FAILED ? NULL : t;
}

static void unlink_slot_table(const char *job)
{
	char name[128];

	snprintf(name, sizeof(name), "/%s-dpoteams", job);
	shm_unlink(name);
}

struct oob_adapter {
	const dpo_oob_coll_t *oob;
	double timeout_s;
};

/* host_ctx_params.allgather for hardware backends: their queue pair exchange. */
static int host_allgather(void *arg, const void *mine, uint32_t len, void *all)
{
	struct oob_adapter *a = arg;

	return dpo_oob_run(a->oob, (void *)mine, all, len, a->timeout_s) == DPO_OK ? 0 : -EIO;
}

static void fill_params(struct host_ctx_params *p, const struct dpo_context *ctx,
			const struct boot_rec *r0)
{
	const struct dpo_config *c = &ctx->cfg;

	memset(p, 0, sizeof(*p));
	p->struct_size = sizeof(*p);
	p->version = HOST_CTX_PARAMS_VERSION;
	p->job = ctx->job;
	p->backend = ctx->backend;
	p->backend_lib = c->backend_lib[0] ? c->backend_lib : NULL;
	p->rank = ctx->rank;
	p->size = ctx->size;
	p->num_threads = ctx->num_threads;
	p->ring_entries = c->ring_entries;
	p->engine.chunk_size = c->chunk_size;
	/* the emulator itself stops spinning where the ranks outnumber the cores */
	p->spin_us = c->spin_us;
	p->idle_poll_us = c->idle_poll_us;
	p->wire_min = c->wire_min;
	p->coop = !strcmp(ctx->backend, "emulator") && c->coop;
	p->engine.eager_max = (uint32_t)c->eager_max;
	p->bootstrap_timeout_ns = (int64_t)(c->bootstrap_timeout * 1e9);
	p->engine.op_timeout_ms = (uint32_t)(c->op_timeout * 1000 + 0.5);
	p->rails = c->rails;
	p->mtu = c->mtu;
	p->mcast_rq_depth = c->mcast_rq_depth;
	p->mcast_loss_ppm = (uint32_t)(c->mcast_loss * 1e6 + 0.5);
	p->mcast_reorder_ppm = (uint32_t)(c->mcast_reorder * 1e6 + 0.5);
	p->mcast_seed = c->mcast_seed;
	p->engine.mcast_roots = c->mcast_roots;
	p->engine.link_mbps = c->link_rate * 1000 < 1 ? 1 : (uint32_t)(c->link_rate * 1000);
	for (int i = 0; i < 8; i++)
		p->rail_down_after[i] = UINT64_MAX;
	p->mcast_staged = c->mcast_staged;
	p->job_key = r0->key ? r0->key : 1;
}

static dpo_status_t open_device(struct dpo_context *ctx, const struct boot_rec *r0,
				struct oob_adapter *ad)
{
	struct host_ctx_params p;
	int rc;

	if (!strcmp(ctx->backend, "emulator")) {
		ctx->slots = open_slot_table(ctx->job);
		if (!ctx->slots)
			return dpo_fail(DPO_ERR_NO_RESOURCE, "could not map the job's team table "
					"in /dev/shm: %s", strerror(errno));
	}
	fill_params(&p, ctx, r0);
	p.allgather = host_allgather;
	p.allgather_arg = ad;
	rc = host_ctx_open(&p, &ctx->host);
	if (rc)
		return dpo_from_errno(rc, "opening the device");
	return DPO_OK;
}

static void release(struct dpo_context *ctx)
{
	if (ctx->host) {
		dpo_scratch_release_all(ctx);
		host_ctx_close(ctx->host);
	}
	if (ctx->slots)
		munmap(ctx->slots, sizeof(*ctx->slots));
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
}

static void prepare_record(struct boot_rec *me, const struct dpo_context *ctx,
			   const dpo_context_params_t *params)
{
	const struct dpo_config *c = &ctx->cfg;

	memset(me, 0, sizeof(*me));
	me->magic = DPO_BOOT_MAGIC;
	me->api_major = DPO_API_MAJOR;
	me->abi_version = OFFLOAD_ABI_VERSION;
	me->ep = ctx->rank;
	me->n_eps = ctx->size;
	me->pid = (uint32_t)getpid();
	me->uid = (uint32_t)getuid();
	me->cores = online_cores();
	me->threads = c->dpa_threads;
	me->mtu = c->mtu;
	me->rails = c->rails;
	me->ring_entries = c->ring_entries;
	me->chunk_size = c->chunk_size;
	me->eager_max = (uint32_t)c->eager_max;
	me->coop = c->coop;
	me->host_id = host_hash();
	snprintf(me->backend, sizeof(me->backend), "%s", ctx->backend);
	if (params->mask & DPO_CONTEXT_PARAM_FIELD_JOB && params->job)
		snprintf(me->job, sizeof(me->job), "%s", params->job);
	else if (ctx->rank == 0) {
		uint64_t rnd[2] = { 0, 0 };

		if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			rnd[0] = (uint64_t)dpo_now_ns() ^ ((uint64_t)getpid() << 32);
		snprintf(me->job, sizeof(me->job), DPO_JOB_PREFIX "-%u-%u-%016llx", me->uid,
			 me->pid, (unsigned long long)rnd[0]);
		me->key = rnd[1] ? rnd[1] : 1;
	}
	if (ctx->rank == 0 && !me->key) {
		if (getrandom(&me->key, sizeof(me->key), 0) != (ssize_t)sizeof(me->key))
			me->key = (uint64_t)dpo_now_ns();
		me->key |= 1;
	}
}

/* Threads per rank: as many as the cores can run next to the ranks (1..4), the same
 * number on every rank (hardware backends refuse unequal counts). */
static uint32_t agree_threads(const struct boot_rec *r, uint32_t n)
{
	uint32_t cores = r[0].cores, t;

	if (r[0].threads)
		return r[0].threads;
	for (uint32_t i = 1; i < n; i++)
		if (r[i].cores < cores)
			cores = r[i].cores;
	t = cores / n;
	return t < 1 ? 1 : t > 4 ? 4 : t;
}

static dpo_status_t bootstrap(struct dpo_context *ctx, const dpo_context_params_t *params,
			      struct oob_adapter *ad)
{
	const dpo_oob_coll_t *oob = &params->oob;
	struct boot_rec me, *all = NULL;
	struct open_rec mine = { 0 }, *outcomes = NULL;
	dpo_status_t st;

	prepare_record(&me, ctx, params);
	all = calloc(ctx->size, sizeof(*all));
	outcomes = calloc(ctx->size, sizeof(*outcomes));
	if (!all || !outcomes) {
		st = dpo_fail(DPO_ERR_NO_MEMORY, "dpo_context_create: out of memory");
		goto out;
	}
	if (ctx->rank == 0)
		sweep_stale_segments();
	if (ctx->size == 1)
		all[0] = me;
	else if ((st = dpo_oob_run(oob, &me, all, sizeof(me), ctx->cfg.bootstrap_timeout)))
		goto out;
	st = check_records(all, ctx->size, !strcmp(ctx->backend, "emulator"));
	if (st)
		goto out;
	snprintf(ctx->job, sizeof(ctx->job), "%s", all[0].job);
	ctx->num_threads = agree_threads(all, ctx->size);
	mine.status = open_device(ctx, &all[0], ad);
	if (mine.status)
		snprintf(mine.msg, sizeof(mine.msg), "%s", dpo_last_error());
	if (ctx->size == 1)
		outcomes[0] = mine;
	else if ((st = dpo_oob_run(oob, &mine, outcomes, sizeof(mine),
				   ctx->cfg.bootstrap_timeout)))
		goto out;
	if (ctx->rank == 0 && ctx->slots)
		unlink_slot_table(ctx->job);  /* every rank has it mapped now */
	st = DPO_OK;
	for (uint32_t i = 0; i < ctx->size; i++)
		if (outcomes[i].status) {
			outcomes[i].msg[sizeof(outcomes[i].msg) - 1] = 0;
			st = dpo_fail((dpo_status_t)outcomes[i].status, "rank %u could not open its "
				      "device: %s", i, outcomes[i].msg);
			break;
		}
out:
	free(all);
	free(outcomes);
	return st;
}

DPO_API dpo_status_t dpo_context_create(const dpo_context_params_t *params, dpo_config_h config,
					dpo_context_h *out)
{
	struct dpo_context *ctx;
	struct oob_adapter ad;
	dpo_status_t st;

	dpo_clear_error();
	if (!params || !out)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_context_create: params and context "
				"must not be NULL");
	*out = NULL;
	if (!(params->mask & DPO_CONTEXT_PARAM_FIELD_OOB))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_context_create: set "
				"DPO_CONTEXT_PARAM_FIELD_OOB and an OOB (n_oob_eps = 1 for one rank)");
	if (!params->oob.n_oob_eps || params->oob.n_oob_eps > OFFLOAD_RANKS_LIMIT ||
	    params->oob.oob_ep >= params->oob.n_oob_eps)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_context_create: oob_ep %u of n_oob_eps "
				"%u: need 1..%u ranks and oob_ep < n_oob_eps", params->oob.oob_ep,
				params->oob.n_oob_eps, OFFLOAD_RANKS_LIMIT);
	if (params->oob.n_oob_eps > 1 && (!params->oob.allgather || !params->oob.req_test))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_context_create: the OOB needs allgather "
				"and req_test callbacks");
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return dpo_fail(DPO_ERR_NO_MEMORY, "dpo_context_create: out of memory");
	pthread_mutex_init(&ctx->lock, NULL);
	if (config)
		ctx->cfg = *config;
	else
		dpo_config_defaults(&ctx->cfg);
	snprintf(ctx->backend, sizeof(ctx->backend), "%s",
		 !strcmp(ctx->cfg.backend, "auto") ?
		 (ctx->cfg.backend_lib[0] ? "flexio" : "emulator") : ctx->cfg.backend);
	ctx->rank = params->oob.oob_ep;
	ctx->size = params->oob.n_oob_eps;
	ad.oob = &params->oob;
	ad.timeout_s = ctx->cfg.bootstrap_timeout;
	st = bootstrap(ctx, params, &ad);
	if (st) {
		release(ctx);
		return st;
	}
	*out = ctx;
	return DPO_OK;
}

DPO_API dpo_status_t dpo_context_destroy(dpo_context_h ctx)
{
	uint32_t teams;

	dpo_clear_error();
	if (!ctx)
		return DPO_OK;
	pthread_mutex_lock(&ctx->lock);
	teams = ctx->teams;
	pthread_mutex_unlock(&ctx->lock);
	if (teams)
		return dpo_fail(DPO_ERR_BUSY, "dpo_context_destroy: %u teams are not destroyed; "
				"destroy them first", teams);
	release(ctx);
	return DPO_OK;
}

DPO_API dpo_status_t dpo_context_get_attr(dpo_context_h ctx, dpo_context_attr_t *attr)
{
	dpo_clear_error();
	if (!ctx || !attr)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_context_get_attr: NULL argument");
	attr->rank = ctx->rank;
	attr->size = ctx->size;
	attr->num_threads = ctx->num_threads;
	attr->resv = 0;
	attr->failed_ranks = host_failed_ranks(ctx->host);
	attr->closed_ranks = host_closed_ranks(ctx->host);
	attr->backend = ctx->backend;
	attr->job = ctx->job;
	return DPO_OK;
}

static dpo_status_t rank_list(dpo_context_h ctx, int closed, uint32_t *ranks, uint32_t max,
			      uint32_t *count, const char *what)
{
	int n;

	dpo_clear_error();
	if (!ctx || !count || (max && !ranks))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s: NULL argument", what);
	n = closed ? host_closed_list(ctx->host, ranks, max) : host_failed_list(ctx->host, ranks, max);
	if (n < 0)
		return dpo_from_errno(n, what);
	*count = (uint32_t)n;
	return DPO_OK;
}

DPO_API dpo_status_t dpo_context_failed_ranks(dpo_context_h ctx, uint32_t *ranks, uint32_t max,
					      uint32_t *count)
{
	return rank_list(ctx, 0, ranks, max, count, "dpo_context_failed_ranks");
}

DPO_API dpo_status_t dpo_context_closed_ranks(dpo_context_h ctx, uint32_t *ranks, uint32_t max,
					      uint32_t *count)
{
	return rank_list(ctx, 1, ranks, max, count, "dpo_context_closed_ranks");
}

DPO_API dpo_status_t dpo_context_stats(dpo_context_h ctx, dpo_thread_stats_t *per_thread,
				       uint32_t max, uint32_t *num_threads)
{
	int n;

	dpo_clear_error();
	if (!ctx || (max && !per_thread))
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_context_stats: NULL argument");
	n = host_stats(ctx->host, (uint64_t *)(void *)per_thread, max);
	if (n < 0)
		return dpo_from_errno(n, "dpo_context_stats");
	if (num_threads)
		*num_threads = (uint32_t)n;
	return DPO_OK;
}

DPO_API dpo_status_t dpo_mem_alloc(dpo_context_h ctx, size_t len, void **addr)
{
	uint32_t key;

	dpo_clear_error();
	if (!ctx || !addr || !len)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_mem_alloc: need a context, len > 0 "
				"and addr");
	return dpo_from_errno(host_alloc_shared(ctx->host, len, addr, &key), "dpo_mem_alloc");
}

DPO_API dpo_status_t dpo_mem_free(dpo_context_h ctx, void *addr, size_t len)
{
	dpo_clear_error();
	if (!ctx || !addr)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_mem_free: NULL argument");
	return dpo_from_errno(host_free_shared(ctx->host, addr, len), "dpo_mem_free");
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulator's host side (sim_driver.h): rings, commands, buffers with known patterns,
 * exact checks of every result at the moment the host reaps its completion, and liveness:
 * a quiescent world (nothing left to happen) with an op pending is a hang, found at once
 * in virtual time, after the rescue ticks the emulator's sleep slices would give.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "sim_driver.h"

#define RESCUE_PS SIM_PS(50000000ull)      /* the emulator's 50 ms sleep slice */
#define RESCUES_MAX 24u                    /* > 2 x the firmware's 0.2 s dead grace */
#define MAX_VIRTUAL_PS SIM_PS(20000000000ull)

/* ---- the host loop ---- */

static void try_post(struct sim_drv *d, struct sim_rank *r)
{
	struct sim_host *h = r->host;
	int posted = 0;

	while (h->next_op < d->nops && h->inflight < d->job.window && d->w.now >= h->skew_ps) {
		uint32_t k = h->next_op++;
		struct sim_inst *in = &h->inst[k];
		const struct sim_team *t = &d->teams[d->ops[k].team];
		struct offload_cmd *slot;

		in->tag = k + 1;
		if (sim_team_rank(t, r->rank) < 0) {  /* not ours */
			in->done = 1;
			h->finished++;
			continue;
		}
		in->member = 1;
		slot = &h->sq[h->hdr->sq_tail & (h->sq_entries - 1)];
		if (sim_op_build(d, r, k, slot)) {
			sim_drv_fail(d, "rank %u op %u: out of memory building the command", r->rank, k);
			return;
		}
		in->posted = 1;
		in->t_post = d->w.now;
		h->inflight++;
		__atomic_store_n(&h->hdr->sq_tail, h->hdr->sq_tail + 1, __ATOMIC_RELEASE);
		posted = 1;
	}
	if (posted)
		sim_schedule(&d->w, d->w.now + SIM_PS(d->w.model.host_post_ns + d->w.model.pcie_oneway_ns),
			     SIM_EV_DOORBELL, r->rank, 0, 0, NULL);
}

static void on_host(struct sim_world *w, struct sim_rank *r)
{
	struct sim_drv *d = w->driver;
	struct sim_host *h = r->host;

	while (h->cq_head != __atomic_load_n(&h->hdr->cq_tail, __ATOMIC_ACQUIRE)) {
		struct offload_cqe c = h->cq[h->cq_head & (h->cq_entries - 1)];
		struct sim_inst *in;

		h->cq_head++;
		__atomic_store_n(&h->hdr->cq_head, h->cq_head, __ATOMIC_RELEASE);
		if (c.tag == 0 || c.tag > d->nops || !h->inst[c.tag - 1].posted || h->inst[c.tag - 1].done) {
			sim_drv_fail(d, "rank %u: completion for tag %u that is not pending", r->rank, c.tag);
			return;
		}
		in = &h->inst[c.tag - 1];
		in->done = 1;
		in->status = c.status;
		in->detail = c.detail;
		in->result0 = c.result0;
		in->t_done = w->now;
		h->inflight--;
		h->finished++;
		d->completions++;
		sim_op_check(d, r, c.tag - 1, &c);
		sim_op_release(d, r, in);
	}
	try_post(d, r);
}

static void on_post(struct sim_world *w, struct sim_rank *r, uint32_t aux)
{
	(void)aux;
	try_post(w->driver, r);
}

void sim_drv_doom(struct sim_drv *d, uint32_t rank)
{
	if (!d->hosts[rank].doomed) {
		d->hosts[rank].doomed = 1;
		d->ndoomed++;
	}
}

static void on_fault(struct sim_world *w, uint32_t idx)
{
	struct sim_drv *d = w->driver;
	const struct sim_fault *f = &d->faults[idx];

	switch (f->kind) {
	case SIM_F_DEATH:
		w->ranks[f->rank].alive = 0;
		d->hosts[f->rank].failed = 1;
		for (uint32_t i = 0; i < w->size; i++)  /* survivors' hosts notice later */
			if (i != f->rank)
				sim_schedule(w, w->now + SIM_PS(w->model.fault_detect_ns), SIM_EV_FAULT, i, 0,
					     (uint32_t)(d->nfaults + i), NULL);
		break;
	case SIM_F_RAIL: {
		uint32_t all = 1;

		sim_port_down(w, f->rank, f->rail);
		for (uint32_t k = 0; k < w->rails; k++)
			all &= w->ranks[f->rank].port[k].down;
		if (all) {  /* unreachable: every host marks it failed, as the emulator's fabric */
			d->hosts[f->rank].failed = 1;
			sim_drv_doom(d, f->rank);
		}
		if (all)
			for (uint32_t i = 0; i < w->size; i++)
				sim_schedule(w, w->now + SIM_PS(w->model.fault_detect_ns), SIM_EV_FAULT, i, 0,
					     (uint32_t)(d->nfaults + i), NULL);
		break;
	}
	default:
		break;
	}
}

/* FAULT events numbered past the fault table mark the failed rank in one host's ring. */
static void on_fault_event(struct sim_world *w, uint32_t idx)
{
	struct sim_drv *d = w->driver;

	if (idx < d->nfaults) {
		on_fault(w, idx);
		return;
	}
	{
		uint32_t target = idx - d->nfaults;
		struct sim_rank *r = &w->ranks[target];
		struct sim_host *h = r->host;

		if (!r->alive)
			return;
		/* the dead and the unreachable (every rail down), never a rank that lost one rail */
		for (uint32_t k = 0; k < d->nfaults; k++)  /* only faults fail ranks */
			if (d->hosts[d->faults[k].rank].failed)
				offload_rankset_add((uint64_t *)(r->ring + h->hdr->failed_off),
						    &h->hdr->failed_gen, d->faults[k].rank);
		sim_wake_all(w, r, w->now);
	}
}

static int ops_done(struct sim_world *w)
{
	struct sim_drv *d = w->driver;

	/* Called after every event: a rank once done (or dead) stays so within a run, so
	 * the scan resumes where it stopped instead of rescanning all ranks. */
	for (; d->done_upto < w->size; d->done_upto++) {
		struct sim_host *h = w->ranks[d->done_upto].host;

		if (w->ranks[d->done_upto].alive && h->finished < d->nops)
			return 0;
	}
	return 1;
}

static int all_done(struct sim_world *w)
{
	struct sim_drv *d = w->driver;

	if (d->max_events && w->cnt.events > d->max_events)
		return 1;  /* stop: sim_drv_run() reports it */
	return ops_done(w);
}

void sim_drv_params(const struct sim_job *job, const struct sim_model *model,
		    struct dpa_engine_params *out)
{
	*out = (struct dpa_engine_params){
		.abi_version = OFFLOAD_ABI_VERSION, .num_threads = job->threads,
		.sq_entries = SIM_RING_ENTRIES, .cq_entries = SIM_CQ_ENTRIES,
		.chunk_size = job->chunk_size, .chunks_per_pass = job->chunks_per_pass,
		.op_timeout_ms = job->op_timeout_ms, .link_mbps = (uint32_t)(model->link_gbps * 125),
		.mcast_roots = job->mcast_roots, .eager_max = job->eager_max,
		.a2a_window = job->a2a_window,
		/* The world and at most one sub-team (the explorer's) at once: the firmware's
		 * team arena sized for that, not its default of 4 x world size members, keeps a
		 * 1024-rank job's state at ~2 MB a rank. */
		.team_pool_ranks = 2 * job->n, .world_size = job->n,
	};
}

uint64_t sim_host_bytes(const struct sim_job *job)
{
	return sizeof(struct sim_host) + sim_ring_bytes(job->n) +
	       job->threads * sizeof(struct offload_thread_stats);
}

int sim_drv_init(struct sim_drv *d, const struct sim_job *job, const struct sim_model *model)
{
	struct dpa_engine_params p;
	int rc;

	sim_drv_params(job, model, &p);
	memset(d, 0, sizeof(*d));
	d->job = *job;
	d->w.model = *model;
	d->w.payload = job->payload;
	d->w.remote_wake_all = job->remote_wake_all;
	d->w.driver = d;
	d->w.on_host = on_host;
	d->w.on_post = on_post;
	d->w.on_fault = on_fault_event;
	if (job->n == 0 || job->n > SIM_MAX_RANKS || job->threads == 0 || job->rails == 0 ||
	    job->rails > 8)
		return -1;
	rc = sim_world_init(&d->w, job->n, job->threads, job->rails, &p, job->seed);
	if (rc)
		return rc;
	d->hosts = calloc(job->n, sizeof(*d->hosts));
	if (!d->hosts)
		return -1;
	for (uint32_t i = 0; i < job->n; i++) {
		struct sim_rank *r = &d->w.ranks[i];
		struct sim_host *h = &d->hosts[i];
		uint64_t len = sim_ring_bytes(job->n);

		r->host = h;
		r->ring = aligned_alloc(64, len);
		r->ring_len = len;
		r->stats = calloc(job->threads, sizeof(*r->stats));
		if (!r->ring || !r->stats)
			return -1;
		memset(r->ring, 0, len);
		h->hdr = (struct offload_ring_hdr *)r->ring;
		h->sq = (struct offload_cmd *)(h->hdr + 1);
		h->cq = (struct offload_cqe *)(h->sq + SIM_RING_ENTRIES);
		h->sq_entries = SIM_RING_ENTRIES;
		h->cq_entries = SIM_CQ_ENTRIES;
		h->hdr->sq_entries = SIM_RING_ENTRIES;
		h->hdr->cq_entries = SIM_CQ_ENTRIES;
		offload_ring_set_ranks(h->hdr, SIM_RING_ENTRIES, SIM_CQ_ENTRIES, job->n);
		h->hdr->cq_waiters = 1;  /* the host waits: the firmware notifies every completion */
	}
	return 0;
}

void sim_drv_free(struct sim_drv *d)
{
	for (uint32_t i = 0; d->hosts && i < d->job.n; i++) {
		struct sim_host *h = &d->hosts[i];
		struct sim_rank *r = &d->w.ranks[i];

		for (uint32_t k = 0; h->inst && k < d->nops; k++)
			sim_op_release(d, r, &h->inst[k]);
		free(h->inst);
		free(r->ring);
		free(r->stats);
	}
	free(d->hosts);
	for (uint32_t t = 0; t < OFFLOAD_MAX_TEAMS; t++)
		free(d->teams[t].members);
	free(d->ops);
	free(d->moe);
	sim_world_free(&d->w);
}

int sim_drv_team(struct sim_drv *d, uint32_t id, uint32_t size, const uint32_t *members)
{
	struct sim_opdesc op = { .opcode = OFFLOAD_OP_TEAM_CREATE, .team = id };

	if (id >= OFFLOAD_MAX_TEAMS || size == 0 || size > d->job.n)
		return -1;
	d->teams[id].id = id;
	d->teams[id].size = size;
	d->teams[id].members = malloc(size * sizeof(uint32_t));
	if (!d->teams[id].members)
		return -1;
	memcpy(d->teams[id].members, members, size * sizeof(uint32_t));
	return sim_drv_add_op(d, &op);
}

int sim_drv_add_op(struct sim_drv *d, const struct sim_opdesc *op)
{
	struct sim_opdesc *ops = realloc(d->ops, (d->nops + 1) * sizeof(*ops));

	if (!ops)
		return -1;
	d->ops = ops;
	d->ops[d->nops++] = *op;
	return 0;
}

static void describe_pending(struct sim_drv *d, char *out, size_t len)
{
	size_t used = 0;

	for (uint32_t i = 0; i < d->job.n && used + 64 < len; i++) {
		struct sim_host *h = &d->hosts[i];

		if (!d->w.ranks[i].alive || h->finished == d->nops)
			continue;
		for (uint32_t k = 0; k < d->nops; k++)
			if (h->inst[k].posted && !h->inst[k].done) {
				used += (size_t)snprintf(out + used, len - used, " r%u:op%u(opcode %u team %u)",
							 i, k, d->ops[k].opcode, d->ops[k].team);
				break;
			}
	}
}

int sim_drv_run(struct sim_drv *d)
{
	struct sim_world *w = &d->w;
	uint32_t stalls = 0, seen = d->completions;

	w->strict_late = !d->ndoomed && !d->nfaults;
	d->done_upto = 0;
	for (uint32_t i = 0; i < d->job.n; i++) {
		struct sim_host *h = &d->hosts[i];

		h->inst = realloc(h->inst, d->nops * sizeof(*h->inst));
		if (!h->inst)
			return -1;
		memset(h->inst + h->next_op, 0, (d->nops - h->next_op) * sizeof(*h->inst));
		h->skew_ps = w->now + (d->job.max_skew_ns ?
			SIM_PS(sim_rng_below(&w->rng[SIM_RNG_WORK], d->job.max_skew_ns + 1)) : 0);
		sim_schedule(w, h->skew_ps, SIM_EV_POST, i, 0, 0, NULL);
	}
	for (;;) {
		sim_run(w, all_done, MAX_VIRTUAL_PS);
		if (w->failed)
			break;
		if (d->max_events && w->cnt.events > d->max_events && !ops_done(w)) {
			char pend[256] = "";

			describe_pending(d, pend, sizeof(pend));
			sim_drv_fail(d, "livelock: %llu events with ops pending:%s",
			     (unsigned long long)w->cnt.events, pend);
			break;
		}
		if (ops_done(w))
			return 0;
		if (w->heap.n) {
			char pend[256] = "";

			describe_pending(d, pend, sizeof(pend));
			sim_drv_fail(d, "livelock: virtual time past %llu s with ops pending:%s",
			     (unsigned long long)(MAX_VIRTUAL_PS / 1000000000000ull), pend);
			break;
		}
		/* Quiescent with ops pending: give the firmware a rescue tick, as the emulator's
		 * sleep slice would; a pass that does nothing for long enough is a hang. */
		if (d->completions != seen) {
			seen = d->completions;
			stalls = 0;
		}
		if (++stalls > RESCUES_MAX) {
			char pend[256] = "";

			describe_pending(d, pend, sizeof(pend));
			sim_drv_fail(d, "hang: nothing left to happen with ops pending:%s", pend);
			break;
		}
		d->rescues++;
		w->cnt.rescues++;
		w->now += RESCUE_PS;
		for (uint32_t i = 0; i < d->job.n; i++)
			if (w->ranks[i].alive)
				sim_wake_all(w, &w->ranks[i], w->now);
	}
	snprintf(d->err, sizeof(d->err), "%s", w->violation);
	return -1;
}

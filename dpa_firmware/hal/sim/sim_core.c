/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The event loop and the DPA runtime model. One RUN event is one call of dpa_progress()
 * for one (rank, thread): a pass, atomic in host execution, whose virtual duration is the
 * sum of the costs of the HAL calls it made (sim_hal.c). Its effects (posts, notifies)
 * are stamped inside that duration. After a pass that found work the next one follows at
 * once (FlexIO runs passes back to back); after an idle one the thread spins for
 * dpa_idle_passes passes' time, then parks: an event that finds it spinning is seen at
 * the next pass boundary, one that finds it parked costs an activation (dpa_wake_ns).
 *
 * Determinism: time is integer picoseconds, every tie is broken by a key drawn from the
 * SCHED stream and a global sequence number, and the canonical event stream (hashed,
 * optionally written) names ranks, threads and wr_ids, never host addresses.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sim.h"

static inline int hent_less(const struct sim_hent *a, const struct sim_hent *b)
{
	if (a->t != b->t)
		return a->t < b->t;
	if (a->key != b->key)
		return a->key < b->key;
	return a->slot < b->slot;
}

#define HEAP_OFF 3u  /* entry k at h[k + 3]: the four children of k start a 64-byte line */

static int pool_grow(struct sim_heap *hp)
{
	uint64_t cap = hp->pool_cap ? hp->pool_cap * 2 : 1024;
	struct sim_event *pool;
	uint32_t *fr;

	if (cap > UINT32_MAX)
		return -1;
	pool = realloc(hp->pool, cap * sizeof(*pool));
	if (!pool)
		return -1;
	hp->pool = pool;
	fr = realloc(hp->free, cap * sizeof(*fr));
	if (!fr)
		return -1;
	hp->free = fr;
	for (uint64_t i = cap; i-- > hp->pool_cap;)  /* lowest slot on top */
		hp->free[hp->nfree++] = (uint32_t)i;
	hp->pool_cap = cap;
	return 0;
}

static int heap_push(struct sim_heap *hp, const struct sim_event *e)
{
	struct sim_hent ent;
	uint64_t i;

	if (!hp->nfree && pool_grow(hp))
		return -1;
	if (hp->n == hp->cap) {
		uint64_t cap = hp->cap ? hp->cap * 2 : 1024;
		struct sim_hent *h = aligned_alloc(64, (cap + HEAP_OFF + 1) * sizeof(*h));

		if (!h)
			return -1;
		if (hp->h)
			memcpy(h + HEAP_OFF, hp->h + HEAP_OFF, hp->n * sizeof(*h));
		free(hp->h);
		hp->h = h;
		hp->cap = cap;
	}
	ent = (struct sim_hent){ .t = e->t, .key = (uint32_t)(e->key >> 32),
				 .slot = hp->free[--hp->nfree] };
	hp->pool[ent.slot] = *e;
	i = hp->n++;
	while (i) {  /* 4-ary: parent of i is (i-1)/4 */
		uint64_t p = (i - 1) / 4;

		if (!hent_less(&ent, &hp->h[p + HEAP_OFF]))
			break;
		hp->h[i + HEAP_OFF] = hp->h[p + HEAP_OFF];
		i = p;
	}
	hp->h[i + HEAP_OFF] = ent;
	return 0;
}

/* The earliest event's time (the heap is not empty). */
static inline uint64_t heap_top_t(const struct sim_heap *hp)
{
	return hp->h[HEAP_OFF].t;
}

static void heap_pop(struct sim_heap *hp, struct sim_event *out)
{
	struct sim_hent *h = hp->h + HEAP_OFF, last;
	uint64_t i = 0;

	*out = hp->pool[h[0].slot];
	hp->free[hp->nfree++] = h[0].slot;
	last = h[--hp->n];
	for (;;) {
		uint64_t c = 4 * i + 1, best = c;

		if (c >= hp->n)
			break;
		for (uint64_t k = c + 1; k < c + 4 && k < hp->n; k++)
			if (hent_less(&h[k], &h[best]))
				best = k;
		if (!hent_less(&h[best], &last))
			break;
		h[i] = h[best];
		i = best;
	}
	if (hp->n)
		h[i] = last;
}

void sim_schedule(struct sim_world *w, uint64_t t, uint32_t type, uint32_t rank, uint32_t thr,
		  uint32_t aux, void *ptr)
{
	struct sim_event e = { .t = t < w->now ? w->now : t, .seq = w->seq++, .type = type,
			       .rank = rank, .thr = thr, .aux = aux, .ptr = ptr };

	e.key = sim_rng_next(&w->rng[SIM_RNG_SCHED]);
	if (heap_push(&w->heap, &e))
		sim_violation(w, "out of memory for events");
}

/* The stream's hash folds each event's fields as words (no formatting: the loop runs
 * tens of millions of events at 1024 ranks); the text is written only when asked for. */
static void hash_word(struct sim_world *w, uint64_t x)
{
	w->hash = (w->hash ^ x) * 0x100000001b3ull;
	w->hash ^= w->hash >> 29;
}

void sim_log(struct sim_world *w, const char *fmt, ...)
{
	va_list ap;

	if (!w->events)
		return;
	va_start(ap, fmt);
	vfprintf(w->events, fmt, ap);
	va_end(ap);
}

void sim_violation(struct sim_world *w, const char *fmt, ...)
{
	va_list ap;

	if (w->failed)
		return;  /* the first one is the finding */
	va_start(ap, fmt);
	vsnprintf(w->violation, sizeof(w->violation), fmt, ap);
	va_end(ap);
	w->failed = 1;
	if (w->on_violation)
		w->on_violation(w, w->violation);
}

void sim_trace_span(struct sim_world *w, uint32_t pid, uint32_t tid, const char *name,
		    uint64_t from, uint64_t to)
{
	if (!w->trace || pid >= 8 || to <= w->trace_from)
		return;
	if (from < w->trace_from)
		from = w->trace_from;
	fprintf(w->trace, "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,"
		"\"ts\":%.6f,\"dur\":%.6f}\n", w->trace_first ? "" : ",", name, pid, tid,
		(double)(from - w->trace_from) / 1e6, (double)(to - from) / 1e6);
	w->trace_first = 0;
}

static const char *const ev_names[] = {
	[SIM_EV_RUN] = "RUN", [SIM_EV_TIMER] = "TIMER", [SIM_EV_ARRIVE] = "ARRIVE",
	[SIM_EV_CQE] = "CQE", [SIM_EV_MC_ARRIVE] = "MC_ARRIVE", [SIM_EV_HOST] = "HOST",
	[SIM_EV_DOORBELL] = "DOORBELL", [SIM_EV_FAULT] = "FAULT", [SIM_EV_POST] = "POST",
};

/* The lengths of a rank's tables: what sim_world_init allocates and what
 * sim_rank_tables_bytes() reports come from here alone. */
struct rank_tables {
	uint64_t thr, port, last_arrive;  /* the rank's */
	uint64_t rail, last_cqe, cq;      /* each of its threads' (struct dpa_hal) */
};

static void rank_tables(uint32_t size, uint32_t nthreads, uint32_t rails,
			const struct sim_model *m, struct rank_tables *t)
{
	t->thr = (uint64_t)nthreads * sizeof(struct dpa_hal);
	t->port = (uint64_t)rails * sizeof(struct sim_port);
	t->last_arrive = (uint64_t)size * rails * sizeof(uint64_t);
	t->rail = size;
	t->last_cqe = (uint64_t)size * rails * sizeof(uint64_t);
	t->cq = m->nic_sq_depth * sizeof(struct dpa_hal_cqe);
}

uint64_t sim_rank_tables_bytes(uint32_t size, uint32_t nthreads, uint32_t rails,
			       const struct sim_model *m)
{
	struct rank_tables t;

	rank_tables(size, nthreads, rails, m, &t);
	return sizeof(struct sim_rank) + t.thr + t.port + t.last_arrive +
	       nthreads * (t.rail + t.last_cqe + t.cq);
}

uint64_t sim_state_bytes(const struct dpa_engine_params *p)
{
	return (dpa_engine_state_size(p) + 63) & ~63ull;  /* 0 stays 0: params refused */
}

int sim_world_init(struct sim_world *w, uint32_t size, uint32_t nthreads, uint32_t rails,
		   const struct dpa_engine_params *params, uint64_t seed)
{
	uint64_t ctrl_bytes = offload_ctrl_bytes(size), state_bytes;
	struct rank_tables tab;

	for (uint32_t s = 0; s < SIM_RNG_STREAMS; s++)
		sim_rng_seed(&w->rng[s], seed, s + 1);
	w->size = size;
	w->nthreads = nthreads;
	w->rails = rails;
	w->hash = 0xcbf29ce484222325ull;
	w->ranks = calloc(size, sizeof(*w->ranks));
	if (!w->ranks)
		return -1;
	rank_tables(size, nthreads, rails, &w->model, &tab);
	if (w->model.topo_hosts_per_leaf) {
		struct sim_fabric *f = &w->fab;
		uint64_t links;

		f->leaves = (size + (uint32_t)w->model.topo_hosts_per_leaf - 1) /
			    (uint32_t)w->model.topo_hosts_per_leaf;
		f->spines = (uint32_t)(w->model.topo_uplinks ? w->model.topo_uplinks : 1);
		links = (uint64_t)f->leaves * f->spines;
		f->up_busy = calloc(links, 8);
		f->down_busy = calloc(links, 8);
		f->up_bytes = calloc(links, 8);
		f->down_bytes = calloc(links, 8);
		if (!f->up_busy || !f->down_busy || !f->up_bytes || !f->down_bytes)
			return -1;
	}
	for (uint32_t i = 0; i < size; i++) {
		struct sim_rank *r = &w->ranks[i];
		struct dpa_engine_params p = *params;

		r->rank = i;
		r->alive = 1;
		r->nthreads = nthreads;
		p.world_rank = i;
		p.world_size = size;
		p.num_threads = nthreads;
		state_bytes = sim_state_bytes(&p);
		if (!state_bytes)
			return -2;
		/* Zero pages: the firmware writes the team arena only where a team is carved,
		 * so its unused members (O(W) a rank) stay unbacked. */
		r->state = mmap(NULL, state_bytes, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (r->state == MAP_FAILED)
			r->state = NULL;
		r->state_bytes = state_bytes;
		r->thr = calloc(1, tab.thr);
		r->port = calloc(1, tab.port);
		r->last_arrive = calloc(1, tab.last_arrive);
		r->ctrl = mmap(NULL, ctrl_bytes, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (r->ctrl == MAP_FAILED)
			r->ctrl = NULL;
		if (!r->state || !r->thr || !r->port || !r->last_arrive || !r->ctrl)
			return -1;
		if (dpa_engine_init(r->state, &p))
			return -2;
		r->ctrl_key = sim_mr_reg(w, r, (uint64_t)(uintptr_t)r->ctrl, ctrl_bytes,
					 OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
					 OFFLOAD_ACCESS_REMOTE_READ | OFFLOAD_ACCESS_REMOTE_WRITE |
					 OFFLOAD_ACCESS_REMOTE_ATOMIC, 0);
		for (uint32_t t = 0; t < nthreads; t++) {
			struct dpa_hal *h = &r->thr[t];

			h->w = w;
			h->r = r;
			h->index = t;
			h->rail = calloc(1, tab.rail);
			h->last_cqe = calloc(1, tab.last_cqe);
			h->cq = calloc(1, tab.cq);
			if (!h->rail || !h->last_cqe || !h->cq)
				return -1;
		}
	}
	return 0;
}

void sim_world_free(struct sim_world *w)
{
	for (uint64_t i = 0; i < w->heap.n; i++) {  /* messages still on the wire */
		struct sim_msg *m = w->heap.pool[w->heap.h[i + HEAP_OFF].slot].ptr;

		if (m && (m->kind != SIM_MSG_MCAST || --m->refs == 0))
			free(m);
	}
	free(w->heap.h);
	free(w->heap.pool);
	free(w->heap.free);
	for (uint32_t i = 0; w->ranks && i < w->size; i++) {
		struct sim_rank *r = &w->ranks[i];

		for (uint32_t t = 0; r->thr && t < r->nthreads; t++) {
			free(r->thr[t].rail);
			free(r->thr[t].last_cqe);
			free(r->thr[t].cq);
		}
		for (uint32_t g = 0; g < OFFLOAD_MAX_TEAMS; g++) {
			free(r->mc[g].cq);
			free(r->mc[g].regions);
		}
		free(r->thr);
		free(r->port);
		free(r->last_arrive);
		if (r->state)
			munmap(r->state, r->state_bytes);
		free(r->mrs.mr);
		if (r->ctrl)
			munmap(r->ctrl, offload_ctrl_bytes(w->size));
	}
	free(w->ranks);
	free(w->fab.up_busy);
	free(w->fab.down_busy);
	free(w->fab.up_bytes);
	free(w->fab.down_bytes);
	memset(w, 0, sizeof(*w));
}

/* When a thread woken at `at` runs its next pass (see the file comment). */
void sim_wake(struct sim_world *w, struct sim_rank *r, uint32_t thr, uint64_t at)
{
	struct dpa_hal *h = &r->thr[thr];
	uint64_t t = at > h->busy_until ? at : h->busy_until;

	if (!r->alive || h->run_queued)
		return;
	if (t > h->spin_until)
		t += SIM_PS(w->model.dpa_wake_ns);
	else if (!w->model.spin_react_event && t > h->busy_until) {
		uint64_t q = w->model.dpa_pass_ns ? SIM_PS(w->model.dpa_pass_ns) : 1;

		t = h->busy_until + (t - h->busy_until + q - 1) / q * q;
	}
	h->run_queued = 1;
	sim_schedule(w, t, SIM_EV_RUN, r->rank, thr, 0, NULL);
}

void sim_wake_all(struct sim_world *w, struct sim_rank *r, uint64_t at)
{
	for (uint32_t t = 0; t < r->nthreads; t++)
		sim_wake(w, r, t, at);
}

static void run_pass(struct sim_world *w, struct sim_rank *r, uint32_t thr)
{
	struct dpa_hal *h = &r->thr[thr];
	uint64_t start = w->now, at;
	int work;

	h->run_queued = 0;
	if (!r->alive)
		return;
	h->clock = start;
	sim_cost(h, SIM_PS(w->model.dpa_pass_ns));
	h->ring_touched = 0;
	work = dpa_progress(r->state, h);
	h->busy_ps += h->clock - start;
	h->busy_until = h->clock;
	h->passes++;
	w->cnt.passes++;
	sim_trace_span(w, r->rank, thr, work ? "pass" : "idle", start, h->clock);
	if (work > 0) {
		h->run_queued = 1;
		sim_schedule(w, h->clock, SIM_EV_RUN, r->rank, thr, 0, NULL);
		return;
	}
	h->idle_passes++;
	h->spin_until = h->clock + w->model.dpa_idle_passes * (h->clock - start);
	at = dpa_engine_wake_at(r->state, thr, h->clock / 1000);
	if (at == 1) {
		sim_wake(w, r, thr, h->clock);
	} else if (at && SIM_PS(at) != h->timer_at) {
		h->timer_at = SIM_PS(at);
		sim_schedule(w, h->timer_at, SIM_EV_TIMER, r->rank, thr, 0, NULL);
	}
}

static void dispatch(struct sim_world *w, const struct sim_event *e)
{
	struct sim_rank *r = &w->ranks[e->rank];
	struct sim_msg *m = e->ptr;

	switch (e->type) {
	case SIM_EV_RUN:
		run_pass(w, r, e->thr);
		break;
	case SIM_EV_TIMER:
		if (r->thr[e->thr].timer_at == e->t) {
			r->thr[e->thr].timer_at = 0;
			sim_wake(w, r, e->thr, e->t);
		}
		break;
	case SIM_EV_ARRIVE:
		sim_nic_arrive(w, m);
		break;
	case SIM_EV_CQE:
		sim_nic_cqe(w, r, e->thr, m, (int32_t)e->aux);
		break;
	case SIM_EV_MC_ARRIVE:
		if (e->aux == 1 || !w->mcast_reorder_ppm ||
		    sim_rng_below(&w->rng[SIM_RNG_NET], 1000000) >= w->mcast_reorder_ppm) {
			sim_mc_arrive(w, r, m);
			break;
		}
		sim_schedule(w, w->now + sim_rng_below(&w->rng[SIM_RNG_NET],
						       SIM_PS(w->mcast_reorder_ns) + 1),
			     SIM_EV_MC_ARRIVE, e->rank, 0, 1, m);
		break;
	case SIM_EV_HOST:
		if (r->alive && w->on_host)
			w->on_host(w, r);
		break;
	case SIM_EV_DOORBELL:
		sim_wake_all(w, r, w->now);
		break;
	case SIM_EV_FAULT:
		if (w->on_fault)
			w->on_fault(w, e->aux);
		break;
	case SIM_EV_POST:
		if (r->alive && w->on_post)
			w->on_post(w, r, e->aux);
		break;
	}
}

uint64_t sim_run(struct sim_world *w, int (*stop)(struct sim_world *w), uint64_t max_ps)
{
	uint64_t count = 0;
	struct sim_event e;

	while (w->heap.n && !w->failed && !(stop && stop(w))) {
		if (heap_top_t(&w->heap) > max_ps)
			break;
		heap_pop(&w->heap, &e);
		w->now = e.t;
		w->cnt.events++;
		count++;
		{
			struct sim_msg *m = e.ptr;

			hash_word(w, e.t);
			hash_word(w, e.seq);
			hash_word(w, (uint64_t)e.type << 48 | (uint64_t)e.thr << 32 | e.rank);
			hash_word(w, e.aux);
			if (m) {
				hash_word(w, (uint64_t)m->kind << 48 | (uint64_t)m->src << 24 | m->dst);
				hash_word(w, m->len);
				hash_word(w, m->wr_id);
			}
			if (m)
				sim_log(w, "%llu.%03llu %llu %s r=%u th=%u a=%u k=%u %u>%u len=%llu wr=%llx\n",
					(unsigned long long)(e.t / 1000), (unsigned long long)(e.t % 1000),
					(unsigned long long)e.seq, ev_names[e.type], e.rank, e.thr, e.aux,
					m->kind, m->src, m->dst, (unsigned long long)m->len,
					(unsigned long long)m->wr_id);
			else
				sim_log(w, "%llu.%03llu %llu %s r=%u th=%u a=%u\n",
					(unsigned long long)(e.t / 1000), (unsigned long long)(e.t % 1000),
					(unsigned long long)e.seq, ev_names[e.type], e.rank, e.thr, e.aux);
		}
		dispatch(w, &e);
	}
	return count;
}

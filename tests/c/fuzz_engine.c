/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the firmware engine: one input (format in fuzz.h) is one run of the real
 * dpa_engine_init() + dpa_progress() over the test HAL, with this harness playing the host
 * (posting commands, reaping completions) and, through pokes, the peers.
 *
 * After every dpa_progress() call and at the end, abort() if:
 *  - a completion has an unknown status, a detail that is not a world rank, a tag that was
 *    not posted (or not yet taken from the ring), or completes a tag twice;
 *  - the engine reports more completions than it took commands, takes commands the host
 *    did not post, lets the completion ring overflow, or moves an index backwards;
 *  - the engine wrote what it does not own: the host's lines of the ring header, the
 *    submission queue, guard bytes around any buffer, a src region (no write access);
 *  - (no pokes) a data write landed in our dst outside every command's [dst, dst + dst_len);
 *  - the engine idles with a command unanswered that nothing could be waiting for: taken
 *    from the ring and not a collective on a team of more than one rank;
 *  - dpa_progress() keeps reporting work while nothing moves (a thread that never parks);
 *  - every command was answered but the engine still reports ops in flight.
 *
 * Build with gcc: see fuzz_main.c. With clang and libFuzzer (from the repository root):
 *   clang -g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -Idpa_firmware/include \
 *     tests/c/fuzz_engine.c tests/c/fuzz_hal.c $(ls dpa_firmware/src/[a-z]*.c) -o fuzz_engine
 *   ./fuzz_main -dump_corpus=corpus      (the seed inputs, from a gcc build of fuzz_main)
 *   ./fuzz_engine -max_total_time=60 corpus
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

struct fz_totals fz_totals;
int fz_verbose;

void fz_decode(const uint8_t *data, size_t size, struct fz_input *in)
{
	static const uint8_t empty[1];
	size_t off = sizeof(struct fz_header), left;

	if (!data) {  /* libFuzzer may pass (NULL, 0) */
		data = empty;
		size = 0;
	}
	memset(&in->h, 0, sizeof(in->h));
	memcpy(&in->h, data, size < sizeof(in->h) ? size : sizeof(in->h));
	in->world = 1 + in->h.world % FZ_MAX_WORLD;
	in->me = in->h.me % in->world;
	in->threads = 1 + in->h.threads % FZ_MAX_THREADS;
	in->sq_entries = 1u << (3 + in->h.sq_log % 4);
	in->cq_entries = 1u << (2 + in->h.cq_log % 5);
	in->hal_cq = 1u << (1 + in->h.hal_cq_log % 8);
	in->chunk_size = 1ull << (6 + in->h.chunk_log % 11);
	in->chunks_per_pass = 1 + in->h.chunks % 4;
	in->passes = 256 + in->h.passes % 4096;
	in->rails = 1 + (in->h.misc >> 1) % 4;
	in->op_timeout_ms = in->h.flags & FZ_F_TIMEOUT ? 1 + in->h.timeout % 64 : 0;
	left = size > off ? size - off : 0;
	in->ncmds = in->h.ncmds;
	if (in->ncmds > FZ_MAX_CMDS)
		in->ncmds = FZ_MAX_CMDS;
	if (in->ncmds > left / sizeof(struct offload_cmd))
		in->ncmds = (uint32_t)(left / sizeof(struct offload_cmd));
	memcpy(in->cmds, data + off, in->ncmds * sizeof(struct offload_cmd));
	off += in->ncmds * sizeof(struct offload_cmd);
	left = size > off ? size - off : 0;
	in->npokes = in->h.npokes;
	if (in->npokes > FZ_MAX_POKES)
		in->npokes = FZ_MAX_POKES;
	if (in->npokes > left / sizeof(struct fz_poke))
		in->npokes = (uint32_t)(left / sizeof(struct fz_poke));
	memcpy(in->pokes, data + off, in->npokes * sizeof(struct fz_poke));
	off += in->npokes * sizeof(struct fz_poke);
	in->aux = data + (off < size ? off : size);
	in->aux_len = size > off ? size - off : 0;
}

/* ---- one run ---- */

struct fz_run {
	const struct fz_input *in;
	struct fz_world *w;
	void *state;
	struct offload_ring_hdr *ring;
	uint32_t failed_off;   /* the ring's failed set, as the host placed it */
	struct offload_cmd *sq;
	struct offload_cqe *cq;
	/* What the host posts, in order (the world's TEAM_CREATE first, unless FZ_F_NO_WORLD). */
	struct offload_cmd queue[FZ_MAX_CMDS + 1];
	uint32_t ntotal, posted, setup;
	uint32_t start;                 /* initial value of all four ring indices */
	uint32_t sq_head, cq_tail;      /* last seen DPA indices */
	uint32_t completed;             /* completions validated */
	uint8_t done[FZ_MAX_CMDS + 1];
	int32_t status[FZ_MAX_CMDS + 1];
	uint8_t line0[64], line3[64];   /* the host's lines of the ring header, as it wrote them */
	uint32_t cq_waiters;
	struct offload_cmd sq_shadow[64];
	uint8_t poked[FZ_MAX_POKES];
	/* TEAM_CREATE descriptors as posted: if the aux bytes change later (the firmware
	 * writes all-to-all-v results into aux too), the liveness check cannot know the teams. */
	/* A TEAM_CREATE's descriptor as posted: its header and up to FZ_MAX_WORLD peers. */
	uint8_t desc_at_post[FZ_MAX_CMDS + 1][16 + 16 * FZ_MAX_WORLD];
	uint8_t desc_valid[FZ_MAX_CMDS + 1];
};

static void check_ring(struct fz_run *r, const char *when)
{
	struct offload_ring_hdr *ring = r->ring;
	uint32_t sq_head = __atomic_load_n(&ring->sq_head, __ATOMIC_ACQUIRE);
	uint32_t cq_tail = __atomic_load_n(&ring->cq_tail, __ATOMIC_ACQUIRE);
	uint32_t taken = sq_head - r->start, answered = cq_tail - r->start;
	const uint8_t *raw = (const uint8_t *)ring;

	if (memcmp(raw, r->line0, 64) || memcmp(raw + 192, r->line3, 64))
		fz_fail("%s: the engine wrote the host's lines of the ring header", when);
	for (uint32_t i = 4; i < 64; i++)
		if (raw[64 + i] || (i >= 8 && raw[128 + i]))
			fz_fail("%s: the engine wrote reserved ring header byte %u", when,
				i + (raw[64 + i] ? 64 : 128));
	if (ring->cq_waiters != r->cq_waiters)
		fz_fail("%s: the engine wrote cq_waiters (host-owned)", when);
	if ((int32_t)(sq_head - r->sq_head) < 0 || (int32_t)(cq_tail - r->cq_tail) < 0)
		fz_fail("%s: a ring index moved backwards (sq_head %#x -> %#x, cq_tail %#x -> %#x)",
			when, r->sq_head, sq_head, r->cq_tail, cq_tail);
	if (taken > r->posted)
		fz_fail("%s: the engine took %u commands, the host posted %u", when, taken, r->posted);
	if (answered > taken)
		fz_fail("%s: %u completions for %u commands taken", when, answered, taken);
	if (cq_tail - ring->cq_head > r->in->cq_entries)
		fz_fail("%s: completion ring overflow: tail %#x head %#x entries %u", when, cq_tail,
			ring->cq_head, r->in->cq_entries);
	r->sq_head = sq_head;
	r->cq_tail = cq_tail;
}

static int32_t queue_index(const struct fz_run *r, uint32_t tag)
{
	uint32_t i;

	if (r->setup && tag == FZ_TAG_SETUP)
		return 0;
	i = tag - FZ_TAG_BASE + r->setup;
	if (tag - FZ_TAG_BASE >= FZ_MAX_CMDS || i >= r->ntotal || r->queue[i].tag != tag)
		return -1;
	return (int32_t)i;
}

static int status_known(int32_t st)
{
	switch (st) {
	case OFFLOAD_OK:
	case OFFLOAD_ERR_INVALID:
	case OFFLOAD_ERR_REMOTE_ACCESS:
	case OFFLOAD_ERR_PEER:
	case OFFLOAD_ERR_TIMEOUT:
	case OFFLOAD_ERR_NO_SPACE:
	case OFFLOAD_ERR_CANCELED:
	case OFFLOAD_ERR_UNSUPPORTED:
	case OFFLOAD_ERR_INTERNAL:
	case OFFLOAD_ERR_PEER_OP:
	case OFFLOAD_ERR_LINK_DOWN:
	case OFFLOAD_ERR_COUNT_MISMATCH:
	case OFFLOAD_ERR_PEER_CLOSED:
	case OFFLOAD_ERR_MISMATCH:
		return 1;
	}
	return 0;   /* OFFLOAD_IN_PROGRESS included: it is no completion */
}

/* Every completion the engine published since the last look. */
static void validate_cqes(struct fz_run *r)
{
	uint32_t tail = r->cq_tail, taken = r->sq_head - r->start;

	while (r->completed != tail - r->start) {
		uint32_t pos = r->start + r->completed;
		const struct offload_cqe *c = &r->cq[pos & (r->in->cq_entries - 1)];
		int32_t idx = queue_index(r, c->tag);

		if (!status_known(c->status))
			fz_fail("completion %u (tag %#x) has unknown status %d", r->completed, c->tag,
				c->status);
		if (c->status != OFFLOAD_OK && c->detail >= r->in->world)
			fz_fail("completion %u (tag %#x, status %d) names rank %u of a %u-rank world",
				r->completed, c->tag, c->status, c->detail, r->in->world);
		if (idx < 0 || (uint32_t)idx >= taken)
			fz_fail("completion %u has tag %#x: never posted, or not taken yet (%u taken)",
				r->completed, c->tag, taken);
		if (r->done[idx])
			fz_fail("tag %#x completed twice (status %d, then %d)", c->tag, r->status[idx],
				c->status);
		r->done[idx] = 1;
		r->status[idx] = c->status;
		if (fz_verbose)
			fprintf(stderr, "  cmd %d (opcode %u team %u): status %d detail %u result %llu/%llu\n",
				idx - (int32_t)r->setup, r->queue[idx].opcode, r->queue[idx].team, c->status,
				c->detail, (unsigned long long)c->result0, (unsigned long long)c->result1);
		fz_totals.completions++;
		fz_totals.status_count[-c->status]++;
		if (c->status == OFFLOAD_OK && r->queue[idx].opcode >= OFFLOAD_OP_BARRIER &&
		    r->queue[idx].opcode < OFFLOAD_OP_MAX && r->queue[idx].opcode != OFFLOAD_OP_CANCEL)
			fz_totals.ok_collectives++;
		r->completed++;
	}
}

static void reap(struct fz_run *r)
{
	/* Everything validated is consumed: the engine may reuse those entries. */
	__atomic_store_n(&r->ring->cq_head, r->start + r->completed, __ATOMIC_RELEASE);
	memcpy(r->line3, (const uint8_t *)r->ring + 192, 64);
}

static int host_post(struct fz_run *r)
{
	uint32_t tail = r->ring->sq_tail, mask = r->in->sq_entries - 1;
	int n = 0;

	while (r->posted < r->ntotal && tail - r->sq_head < r->in->sq_entries) {
		const struct offload_cmd *c = &r->queue[r->posted];

		if (c->opcode == OFFLOAD_OP_TEAM_CREATE) {
			const void *d = dpa_hal_aux_ptr(&r->w->hals[0], c->aux_key, c->aux_addr,
							sizeof(r->desc_at_post[0]));

			if (d) {  /* the input may misalign it: copy bytes */
				memcpy(r->desc_at_post[r->posted], d, sizeof(r->desc_at_post[0]));
				r->desc_valid[r->posted] = 1;
			}
		}
		r->sq[tail & mask] = *c;
		r->sq_shadow[tail & mask] = *c;
		tail++;
		r->posted++;
		n++;
	}
	__atomic_store_n(&r->ring->sq_tail, tail, __ATOMIC_RELEASE);
	memcpy(r->line0, r->ring, 64);
	if (r->w->dst_cmds)
		r->w->ndst_cmds = r->posted;
	return n;
}

static void apply_poke(struct fz_run *r, const struct fz_poke *p)
{
	struct fz_world *w = r->w;
	uint8_t *ctrl = fz_region_ptr(w, w->me, FZ_CTRL);
	/* Words of the team block as a team of the world's size lays them out (a smaller
	 * team's are elsewhere: the poke lands where no member would write, as a hostile
	 * peer's may). */
	uint8_t *t = ctrl + offload_ctrl_team_off(w->size, p->team % OFFLOAD_MAX_TEAMS);
	uint32_t slot = p->slot % OFFLOAD_OP_WINDOW, src = p->src % w->size, n = w->size;
	struct offload_ready *ready = (void *)(t + offload_ctrl_ready_in(n, slot, src));
	struct offload_count *count = (void *)(t + offload_ctrl_count_in(n, slot, src));
	uint64_t *done = (void *)(t + offload_ctrl_done_in(n, slot, src));
	uint8_t *raw;

	switch (p->kind % FZ_POKE_KINDS) {
	case FZ_POKE_READY:
		ready->addr = p->a;
		ready->len = p->b;
		ready->key = p->c;
		ready->flags = p->d;
		__atomic_store_n(&ready->seq, p->seq, __ATOMIC_RELEASE);
		break;
	case FZ_POKE_COUNT:
		count->bytes = p->a;
		__atomic_store_n(&count->seq, p->seq, __ATOMIC_RELEASE);
		break;
	case FZ_POKE_DONE:
		__atomic_fetch_add(done, p->a, __ATOMIC_ACQ_REL);
		break;
	case FZ_POKE_CTRL:
		raw = ctrl + ((p->c % offload_ctrl_bytes(w->size)) & ~7u);
		__atomic_store_n((uint64_t *)(void *)raw, p->a, __ATOMIC_RELEASE);
		break;
	case FZ_POKE_AUX:
		raw = w->aux.mem + ((p->c % FZ_AUX_LEN) & ~7u);
		__atomic_store_n((uint64_t *)(void *)raw, p->a, __ATOMIC_RELEASE);
		break;
	case FZ_POKE_HOST:
		if (p->c % 8 == 0) {  /* ranks into the failed set, as the host's watch puts them */
			for (uint32_t q = 0; q < w->size && q < 64; q++)
				if (p->a >> q & 1)
					offload_rankset_add((uint64_t *)(void *)((uint8_t *)r->ring +
										 r->failed_off),
							    &r->ring->failed_gen, q);
		} else {  /* any word of the host's first line but sq_tail */
			raw = (uint8_t *)r->ring + (p->c % 8) * 8;
			__atomic_store_n((uint64_t *)(void *)raw, p->a, __ATOMIC_RELEASE);
		}
		memcpy(r->line0, r->ring, 64);
		break;
	case FZ_POKE_DEAD:
		if (src % w->size != w->me)
			w->dead |= 1u << (src % w->size);
		break;
	case FZ_POKE_RAIL:
		for (uint32_t peer = 0; peer < w->size; peer++)
			if ((p->d & 1) || peer == src % w->size)
				w->rail_down[peer] |= 1u << (p->c % w->num_rails);
		break;
	case FZ_POKE_CQE: {
		uint64_t item = w->size + p->a % ((1u << 24) - w->size);

		fz_push_cqe(&w->hals[p->c % w->nthreads], src % w->size,
			    (w->last_wr_id & ~(0xffffffull << 8)) | item << 8,
			    p->d % 2 ? OFFLOAD_ERR_LINK_DOWN : OFFLOAD_ERR_REMOTE_ACCESS, 0);
		break;
	}
	}
}

/* Pokes due by this round; with force, the earliest pending one too. Returns how many. */
static int apply_pokes(struct fz_run *r, uint32_t pass, int force)
{
	int n = 0, first = -1;

	for (uint32_t i = 0; i < r->in->npokes; i++) {
		if (r->poked[i])
			continue;
		if (r->in->pokes[i].at_pass % r->in->passes <= pass) {
			apply_poke(r, &r->in->pokes[i]);
			r->poked[i] = 1;
			n++;
		} else if (first < 0 ||
			   r->in->pokes[i].at_pass % r->in->passes <
			   r->in->pokes[first].at_pass % r->in->passes) {
			first = (int)i;
		}
	}
	if (!n && force && first >= 0) {
		apply_poke(r, &r->in->pokes[first]);
		r->poked[first] = 1;
		n++;
	}
	return n;
}

static void setup_world_team(struct fz_run *r)
{
	struct fz_world *w = r->w;
	uint64_t len = offload_team_desc_bytes(w->size);
	struct offload_team_desc *d = (struct offload_team_desc *)(w->aux.mem + FZ_AUX_LEN - len);

	memset(d, 0, len);
	d->team_id = OFFLOAD_WORLD_TEAM;
	d->size = w->size;
	d->my_rank = w->me;
	for (uint32_t i = 0; i < w->size; i++)
		d->peers[i] = (struct offload_peer){ .ctrl_addr = fz_addr(i, FZ_CTRL),
			.ctrl_key = fz_key(i, FZ_CTRL), .world_rank = i };
	r->queue[0] = (struct offload_cmd){ .opcode = OFFLOAD_OP_TEAM_CREATE,
		.tag = FZ_TAG_SETUP, .aux_addr = FZ_AUX_BASE + FZ_AUX_LEN - len,
		.aux_key = FZ_AUX_KEY };
	r->setup = 1;
}

/*
 * Liveness: which taken commands must have been answered once the engine idles. Commands
 * that are no collective must, and so must collectives on a team that does not exist (an
 * error) or on a team of one rank whose descriptor is the one a host builds (our own
 * control region). A collective on any other team may wait for peers forever: no pokes
 * play them, and a descriptor that sends our own control words astray can't be caught by
 * the firmware (the op timeout ends those). Returns -1 if it cannot tell.
 */
enum { TEAM_NONE = 0, TEAM_ALONE = 1, TEAM_OTHER = 2 };

static int must_answer(const struct fz_run *r, uint32_t upto, uint8_t *need)
{
	uint8_t kind[OFFLOAD_MAX_TEAMS] = { 0 };
	const uint32_t me = r->in->me;

	for (uint32_t i = 0; i < upto; i++) {
		const struct offload_cmd *c = &r->queue[i];
		const struct offload_team_desc *d =
			(const struct offload_team_desc *)(const void *)r->desc_at_post[i];

		need[i] = 1;
		if (c->opcode == OFFLOAD_OP_TEAM_CREATE && r->done[i] && r->status[i] == OFFLOAD_OK) {
			const void *now = dpa_hal_aux_ptr(&r->w->hals[0], c->aux_key, c->aux_addr,
							  sizeof(r->desc_at_post[0]));

			if (!r->desc_valid[i] || !now || memcmp(d, now, sizeof(r->desc_at_post[0])) ||
			    d->team_id >= OFFLOAD_MAX_TEAMS)
				return -1;
			kind[d->team_id] = d->size == 1 && d->peers[0].world_rank == me &&
					   d->peers[0].ctrl_addr == fz_addr(me, FZ_CTRL) &&
					   d->peers[0].ctrl_key == fz_key(me, FZ_CTRL) ? TEAM_ALONE : TEAM_OTHER;
		} else if ((c->opcode == OFFLOAD_OP_BARRIER || c->opcode == OFFLOAD_OP_ALLTOALL ||
			    c->opcode == OFFLOAD_OP_ALLTOALLV || c->opcode == OFFLOAD_OP_BROADCAST ||
			    c->opcode == OFFLOAD_OP_ALLGATHER || c->opcode == OFFLOAD_OP_REDUCE_SCATTER ||
			    c->opcode == OFFLOAD_OP_ALLREDUCE) && c->team < OFFLOAD_MAX_TEAMS &&
			   kind[c->team] == TEAM_OTHER) {
			need[i] = 0;
		}
	}
	return 0;
}

static void check_idle(struct fz_run *r)
{
	uint32_t taken = r->sq_head - r->start;
	uint8_t need[FZ_MAX_CMDS + 1];

	if (r->in->npokes || (r->in->h.flags & FZ_F_NO_REAP) || must_answer(r, taken, need))
		return;
	fz_totals.live_checked++;
	for (uint32_t i = 0; i < taken; i++)
		if (need[i] && !r->done[i])
			fz_fail("the engine idles and command %u (tag %#x, opcode %u, team %u) was "
				"taken but never answered", i, r->queue[i].tag, r->queue[i].opcode,
				r->queue[i].team);
}

static void final_checks(struct fz_run *r, int idle)
{
	uint32_t mask = r->in->sq_entries - 1;

	fz_world_check(r->w, "after the run");
	for (uint32_t i = 0; i < r->in->sq_entries; i++)
		if (memcmp(&r->sq[i & mask], &r->sq_shadow[i & mask], sizeof(struct offload_cmd)))
			fz_fail("the engine wrote submission queue slot %u", i);
	if (idle)
		check_idle(r);
	if (r->completed == r->ntotal && dpa_engine_load(r->state) != DPA_ENGINE_IDLE)
		fz_fail("every command was answered but the engine reports load %d",
			(int)dpa_engine_load(r->state));
}

/*
 * A round in which dpa_progress() claimed work, yet posted nothing, polled nothing and moved
 * no ring index. A few happen (an item's flags advance on words already read); a long run
 * of them is a thread that never parks: it burns its core and may never finish an op.
 */
#define FZ_SPIN_MAX 64

static void run(struct fz_run *r)
{
	const struct fz_input *in = r->in;
	uint32_t idle = 0, idle_max = in->op_timeout_ms ? 12 : 3, spin = 0, pass;

	for (pass = 0; pass < in->passes && idle < idle_max; pass++) {
		uint64_t activity = r->w->activity;
		uint32_t sq_head = r->sq_head, cq_tail = r->cq_tail;
		int host = host_post(r) + apply_pokes(r, pass, 0), work = 0;

		for (uint32_t t = 0; t < in->threads; t++) {
			work += dpa_progress(r->state, &r->w->hals[t]);
			check_ring(r, "after dpa_progress");
			validate_cqes(r);
		}
		if (work && !host && activity == r->w->activity && sq_head == r->sq_head &&
		    cq_tail == r->cq_tail) {
			if (++spin >= FZ_SPIN_MAX)
				fz_fail("dpa_progress() reported work for %d rounds in a row while "
					"nothing moved (round %u): its threads would never park",
					FZ_SPIN_MAX, pass);
		} else {
			spin = 0;
		}
		work += host;
		if (!(in->h.flags & FZ_F_NO_REAP))
			reap(r);
		if (pass % 64 == 63)
			fz_world_check(r->w, "during the run");
		if (work) {
			idle = 0;
		} else if (!apply_pokes(r, pass, 1)) {
			idle++;
			r->w->clock_ns += 10000000ull;  /* an idle spell: let op timeouts expire */
		}
	}
	fz_totals.passes += pass;
	if (fz_verbose)
		fprintf(stderr, "  W=%u me=%u threads=%u: %u of %u commands taken, %u answered, "
			"%u passes, %s, %llu dst writes\n", in->world, in->me, in->threads,
			r->sq_head - r->start, r->ntotal, r->completed, pass,
			idle >= idle_max ? "idle" : "pass limit", (unsigned long long)r->w->dst_writes);
	if (idle >= idle_max)
		fz_totals.idle_stops++;
	final_checks(r, idle >= idle_max);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fz_input in;
	static struct fz_run r;
	static struct fz_world *w;
	static void *state;
	struct dpa_engine_params params;
	int rc;

	if (!w) {
		w = fz_world_new();
		/* Exactly the engine's size: a sanitizer sees any write past it. */
		/* Sized per input below: exactly the engine's, so a sanitizer sees any write past. */
	}
	fz_decode(data, size, &in);
	fz_world_reset(w, &in);
	memset(&r, 0, sizeof(r));
	r.in = &in;
	r.w = w;
	r.state = state;
	r.ring = (struct offload_ring_hdr *)w->ring.mem;
	r.sq = (struct offload_cmd *)(r.ring + 1);
	r.cq = (struct offload_cqe *)(r.sq + in.sq_entries);
	r.start = in.h.flags & FZ_F_WRAP ? 0u - 2u * in.sq_entries : 0;
	r.ring->sq_tail = r.ring->sq_head = r.ring->cq_tail = r.ring->cq_head = r.start;
	r.ring->sq_entries = in.sq_entries;
	r.ring->cq_entries = in.cq_entries;
	offload_ring_set_ranks(r.ring, in.sq_entries, in.cq_entries, in.world);
	r.failed_off = r.ring->failed_off;
	r.sq_head = r.cq_tail = r.start;
	/* A host thread asleep on the ring half of the time: the engine then wakes it. */
	r.cq_waiters = r.ring->cq_waiters = in.h.misc & 1;
	memcpy(r.line0, r.ring, 64);
	memcpy(r.line3, (uint8_t *)r.ring + 192, 64);
	if (!(in.h.flags & FZ_F_NO_WORLD))
		setup_world_team(&r);
	for (uint32_t i = 0; i < in.ncmds; i++) {
		r.queue[r.setup + i] = in.cmds[i];
		/* As host_post does: arguments in the aux buffer are registered under its key
		 * (an input that names another key exercises the refusal). */
		if (!r.queue[r.setup + i].aux_key && r.queue[r.setup + i].aux_addr >= FZ_AUX_BASE)
			r.queue[r.setup + i].aux_key = FZ_AUX_KEY;
		r.queue[r.setup + i].tag = FZ_TAG(i);
	}
	r.ntotal = r.setup + in.ncmds;
	if (!in.npokes) {
		w->dst_cmds = r.queue;
		w->ndst_cmds = 0;
	}
	params = (struct dpa_engine_params){
		.abi_version = OFFLOAD_ABI_VERSION, .world_rank = in.me, .world_size = in.world,
		.num_threads = in.threads, .sq_entries = in.sq_entries, .cq_entries = in.cq_entries,
		.chunk_size = in.chunk_size, .chunks_per_pass = in.chunks_per_pass,
		.team_pool_ranks = in.h.misc & 8 ? in.world + 1 : 0,
#if OFFLOAD_ABI_VERSION >= 5
		.op_timeout_ms = in.op_timeout_ms,
#endif
	};
	free(state);
	if (posix_memalign(&state, 64, dpa_engine_state_size(&params)))
		abort();
	r.state = state;
	rc = dpa_engine_init(state, &params);
	if (rc)
		fz_fail("dpa_engine_init refused valid parameters: %d", rc);
	run(&r);
	fz_totals.inputs++;
	fz_totals.commands += r.ntotal;
	return 0;
}

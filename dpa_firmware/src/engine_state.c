/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's state, carved from one buffer the loader sized by the job (no malloc: the
 * firmware runs freestanding): the fixed struct dpa_engine, the job's rank sets as this
 * engine last merged them from the ring header, rails_down per world peer, and the team
 * arena (team.c carves it). Sizes: docs/scale.md.
 */
#include "engine_internal.h"

static uint64_t align64(uint64_t v)
{
	return (v + 63u) & ~63ull;
}

/* Where the engine's variable parts sit after struct dpa_engine (state_size and init
 * agree through it): the failed set, the threads' closed snapshots, rails_down, the
 * team arena. */
struct dpa_carve {
	uint64_t failed, closed, rails, arena, arena_bytes, total;
};

static struct dpa_carve carve(const struct dpa_engine_params *p)
{
	uint64_t words = offload_rank_words(p->world_size);
	struct dpa_carve c;

	c.failed = align64(sizeof(struct dpa_engine));
	c.closed = align64(c.failed + 8u * words);
	c.rails = align64(c.closed + 8u * words * p->num_threads);
	c.arena = align64(c.rails + 4ull * p->world_size);
	c.arena_bytes = (uint64_t)dpa_team_pool_ranks(p) * dpa_team_member_bytes() +
			OFFLOAD_MAX_TEAMS * dpa_team_fixed_bytes();
	c.total = align64(c.arena + c.arena_bytes);
	return c;
}

/* Any memory's words, whatever it held before (the state buffer is untyped to us). */
typedef uint64_t __attribute__((may_alias)) state_word;

static int is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

/* What the state's size depends on (a loader may ask with nothing else filled in). */
static int size_params_ok(const struct dpa_engine_params *p)
{
	return p->world_size != 0 && p->world_size <= OFFLOAD_RANKS_LIMIT &&
	       p->num_threads != 0 && p->num_threads <= OFFLOAD_MAX_THREADS &&
	       p->team_pool_ranks <= 16u * OFFLOAD_RANKS_LIMIT;
}

static int params_ok(const struct dpa_engine_params *p)
{
	return size_params_ok(p) && p->abi_version == OFFLOAD_ABI_VERSION &&
	       p->world_rank < p->world_size && is_pow2(p->sq_entries) &&
	       is_pow2(p->cq_entries) && p->chunk_size != 0 && p->chunks_per_pass != 0 &&
	       p->eager_max <= OFFLOAD_EAGER_BYTES;
}

uint64_t dpa_engine_state_size(const struct dpa_engine_params *p)
{
	return size_params_ok(p) ? carve(p).total : 0;
}

int dpa_engine_init(void *state, const struct dpa_engine_params *p)
{
	struct dpa_engine *eng = state;
	uint8_t *bytes = state;
	state_word *words = state;
	struct dpa_carve c;

	if (!params_ok(p))
		return DPA_HAL_EINVAL;
	c = carve(p);
	/* Zero all but the team arena (last in the state): carve_team() zeroes a team's part
	 * of it when the team is made, so the parts no team uses are never written (a loader
	 * that hands over fresh anonymous pages keeps them unbacked). c.arena is a multiple
	 * of 64 bytes. */
	for (uint64_t i = 0; i < c.arena / 8u; i++)
		words[i] = 0;
	eng->params = *p;
	eng->rank_words = offload_rank_words(p->world_size);
	eng->failed = (uint64_t *)(bytes + c.failed);
	eng->closed_snap = (uint64_t *)(bytes + c.closed);
	eng->rails_down = (uint32_t *)(bytes + c.rails);
	eng->arena = bytes + c.arena;
	eng->arena_bytes = c.arena_bytes;
	for (uint32_t i = 0; i < OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW; i++)
		eng->ops[i].index = i;
	return 0;
}

/* The ring header's rank sets, if the host placed them where the window reaches. */
static uint64_t *ring_set(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t off)
{
	return dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, off, 8ull * eng->rank_words);
}

/* Merge the ring's failed set into ours when its gen moved (ranks only join it): one load
 * per pass otherwise. Any thread; the words only gain bits. */
void dpa_failed_refresh(struct dpa_engine *eng, struct dpa_hal *hal)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	uint32_t gen = off_load_acquire(&ring->failed_gen), seen = off_load_acquire(&eng->failed_gen);
	const uint64_t *set;

	if (gen == seen || ring->rank_words != eng->rank_words)
		return;
	set = ring_set(eng, hal, ring->failed_off);
	if (!set)
		return;
	for (uint32_t w = 0; w < eng->rank_words; w++) {
		uint64_t v = __atomic_load_n(&set[w], __ATOMIC_RELAXED);

		if (v & ~off_read_once(&eng->failed[w]))
			__atomic_fetch_or(&eng->failed[w], v, __ATOMIC_SEQ_CST);
	}
	/* The largest gen merged wins (gens only grow: compare as distances). */
	while ((int32_t)(gen - seen) > 0 && !off_cas(&eng->failed_gen, &seen, gen))
		;
}

/* The calling thread's snapshot of the closed set, taken at the start of its pass. */
void dpa_closed_refresh(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t me)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	uint32_t gen = off_load_acquire(&ring->closed_gen);
	uint64_t *snap = eng->closed_snap + (uint64_t)me * eng->rank_words;
	const uint64_t *set;

	if (me >= eng->params.num_threads || gen == eng->closed_gen_seen[me] ||
	    ring->rank_words != eng->rank_words)
		return;
	set = ring_set(eng, hal, ring->closed_off);
	if (!set)
		return;
	for (uint32_t w = 0; w < eng->rank_words; w++)
		snap[w] = __atomic_load_n(&set[w], __ATOMIC_RELAXED);
	eng->closed_gen_seen[me] = gen;
}

uint32_t dpa_team_lowest_dead(struct dpa_engine *eng, const struct dpa_team *team)
{
	uint32_t gen = off_load_acquire(&eng->failed_gen), low = UINT32_MAX;
	uint64_t c = off_read_once(&team->dead_cache);

	if ((uint32_t)(c >> 32) == gen)
		return (uint32_t)c - 1u;
	for (uint32_t i = 0; i < team->size; i++) {
		uint32_t r = team->peers[i].world_rank;

		if (r < low && dpa_rank_failed(eng, r))
			low = r;
	}
	/* A cache (any thread may write it, every writer computes the same for a gen). */
	off_write_once(&((struct dpa_team *)team)->dead_cache,
		       ((uint64_t)gen << 32) | (uint32_t)(low + 1u));
	return low;
}

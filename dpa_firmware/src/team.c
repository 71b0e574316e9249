/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TEAM_CREATE: a team's members and where their control regions are, checked and taken
 * from the host's descriptor. The op gate (signature.c) fingerprints the result.
 */
#include "engine_internal.h"
#include "signature.h"

/* Per member, in the order carve_team lays them out (8-byte aligned each). */
#define TEAM_MEMBER_BYTES (sizeof(struct offload_peer) + 2u * OFFLOAD_OP_WINDOW * 4u + \
			   OFFLOAD_EAGER_SLOTS * 4u + OFFLOAD_OP_WINDOW * sizeof(struct dpa_item) + \
			   OFFLOAD_OP_WINDOW * 4u * 8u + sizeof(struct dpa_mcast_block) + \
			   sizeof(struct dpa_hal_mcast_region))

uint32_t dpa_team_pool_ranks(const struct dpa_engine_params *p)
{
	uint32_t w = p->world_size;

	if (p->team_pool_ranks)
		return p->team_pool_ranks;
	return w <= 256u ? 16u * w : (4u * w > 4096u ? 4u * w : 4096u);
}

uint64_t dpa_team_member_bytes(void)
{
	return TEAM_MEMBER_BYTES;
}

uint64_t dpa_team_fixed_bytes(void)
{
	return 64u * 64u;  /* alignment slack of the arrays of one team (54 of them) */
}

static uint64_t team_footprint(uint32_t n)
{
	return (uint64_t)n * TEAM_MEMBER_BYTES + dpa_team_fixed_bytes();
}

/* First fit among the live teams' parts of the arena (at most OFFLOAD_MAX_TEAMS of them);
 * UINT64_MAX: no gap of len bytes. */
static uint64_t arena_find(const struct dpa_engine *eng, uint64_t len)
{
	uint64_t at = 0;

	for (;;) {
		uint64_t next = UINT64_MAX;
		int clash = 0;

		if (at + len > eng->arena_bytes)
			return UINT64_MAX;
		for (uint32_t t = 0; t < OFFLOAD_MAX_TEAMS; t++) {
			const struct dpa_team *o = &eng->teams[t];
			uint64_t end = o->arena_off + o->arena_len;

			if (!o->active || !o->arena_len)
				continue;
			if (o->arena_off < at + len && at < end) {
				clash = 1;
				if (end < next)
					next = end;
			}
		}
		if (!clash)
			return at;
		at = next;
	}
}

static uint8_t *take(uint8_t **cur, uint64_t bytes)
{
	uint8_t *p = *cur;

	*cur += (bytes + 63u) & ~63ull;
	return p;
}

/* Zero the team's part and point its tables (and its op slots' layouts and multicast
 * blocks) into it. */
static void carve_team(struct dpa_engine *eng, uint32_t t, uint32_t n)
{
	struct dpa_team *team = &eng->teams[t];
	uint8_t *base = eng->arena + team->arena_off, *cur = base;

	for (uint64_t i = 0; i < team->arena_len; i++)
		base[i] = 0;
	team->peers = (struct offload_peer *)take(&cur, sizeof(struct offload_peer) * n);
	for (uint32_t s = 0; s < OFFLOAD_OP_WINDOW; s++) {
		team->expect_lo[s] = (uint32_t *)take(&cur, 4ull * n);
		team->errs_seen[s] = (uint32_t *)take(&cur, 4ull * n);
	}
	for (uint32_t k = 0; k < OFFLOAD_EAGER_SLOTS; k++)
		team->eager_skip[k] = (uint32_t *)take(&cur, 4ull * n);
	team->items = (struct dpa_item *)take(&cur, sizeof(struct dpa_item) * OFFLOAD_OP_WINDOW * n);
	for (uint32_t s = 0; s < OFFLOAD_OP_WINDOW; s++) {
		struct dpa_vlayout *v = &eng->vlayouts[t * OFFLOAD_OP_WINDOW + s];

		v->send_off = (uint64_t *)take(&cur, 8ull * n);
		v->send_len = (uint64_t *)take(&cur, 8ull * n);
		v->recv_off = (uint64_t *)take(&cur, 8ull * n);
		v->recv_len = (uint64_t *)take(&cur, 8ull * n);
	}
	eng->mcast[t].blocks = (struct dpa_mcast_block *)take(&cur,
							      sizeof(struct dpa_mcast_block) * n);
	eng->mcast[t].regions = (struct dpa_hal_mcast_region *)take(
		&cur, sizeof(struct dpa_hal_mcast_region) * n);
}

static int32_t validate_team_desc(struct dpa_engine *eng, const struct offload_team_desc *d,
				  uint32_t n, uint32_t tid, uint32_t me)
{
	if (tid >= OFFLOAD_MAX_TEAMS || me >= n)
		return OFFLOAD_ERR_INVALID;
	if (d->peers[me].world_rank != eng->params.world_rank)
		return OFFLOAD_ERR_INVALID;
	for (uint32_t i = 0; i < n; i++)
		if (d->peers[i].world_rank >= eng->params.world_size)
			return OFFLOAD_ERR_INVALID;
	return OFFLOAD_OK;
}

int32_t dpa_team_create(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd)
{
	const struct offload_team_desc *d =
		/* Misaligned: the DPA's loads of its 8-byte fields would fault. */
		cmd->aux_addr & 7 ? NULL :
		dpa_hal_aux_ptr(hal, cmd->aux_key, cmd->aux_addr, sizeof(*d));
	struct dpa_team *team;
	uint64_t at, len;
	uint32_t n, tid, me;
	int32_t st;

	/* The header first: its size (read once: host memory) bounds the peers, which must be
	 * in the registration too. A team larger than the job is refused. */
	if (!d)
		return OFFLOAD_ERR_INVALID;
	n = off_read_once(&d->size);
	if (n == 0 || n > eng->params.world_size)
		return OFFLOAD_ERR_INVALID;
	d = dpa_hal_aux_ptr(hal, cmd->aux_key, cmd->aux_addr, offload_team_desc_bytes(n));
	if (!d)
		return OFFLOAD_ERR_INVALID;
	/* Host memory: each field read once, then only the copies are used. */
	tid = off_read_once(&d->team_id);
	me = off_read_once(&d->my_rank);
	st = validate_team_desc(eng, d, n, tid, me);
	if (st)
		return st;
	team = &eng->teams[tid];
	if (team->active)
		return OFFLOAD_ERR_INVALID;
	len = team_footprint(n);
	at = arena_find(eng, len);
	if (at == UINT64_MAX)
		return OFFLOAD_ERR_NO_SPACE;
	*team = (struct dpa_team){ 0 };
	team->arena_off = at;
	team->arena_len = len;
	carve_team(eng, tid, n);
	team->size = n;
	team->my_rank = me;
	team->next_seq = 1;
	for (uint32_t i = 0; i < n; i++) {
		team->peers[i] = d->peers[i];
		/* Checked again: the host may have rewritten it since validate_team_desc(). */
		if (team->peers[i].world_rank >= eng->params.world_size ||
		    (i == me && team->peers[i].world_rank != eng->params.world_rank)) {
			*team = (struct dpa_team){ 0 };
			return OFFLOAD_ERR_INVALID;
		}
	}
	team->fp = dpa_team_fp(tid, n, team->peers);
	team->active = 1;
	return OFFLOAD_OK;
}

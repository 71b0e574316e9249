/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TEAM_CREATE: a team's members and where their control regions are, checked and taken
 * from the host's descriptor. The op gate (signature.c) fingerprints the result.
 */
#include "engine_internal.h"
#include "signature.h"

static int32_t validate_team_desc(struct dpa_engine *eng, const struct offload_team_desc *d)
{
	if (d->team_id >= OFFLOAD_MAX_TEAMS || d->size == 0 || d->size > OFFLOAD_MAX_RANKS ||
	    d->my_rank >= d->size)
		return OFFLOAD_ERR_INVALID;
	if (d->peers[d->my_rank].world_rank != eng->params.world_rank)
		return OFFLOAD_ERR_INVALID;
	for (uint32_t i = 0; i < d->size; i++)
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
	int32_t st;

	if (!d)
		return OFFLOAD_ERR_INVALID;
	st = validate_team_desc(eng, d);
	if (st)
		return st;
	team = &eng->teams[d->team_id];
	if (team->active)
		return OFFLOAD_ERR_INVALID;
	team->size = d->size;
	team->my_rank = d->my_rank;
	team->next_seq = 1;
	team->world_mask = 0;
	team->poisoned = 0;
	for (uint32_t i = 0; i < d->size; i++) {
		team->peers[i] = d->peers[i];
		team->world_mask |= 1ull << d->peers[i].world_rank;
	}
	team->fp = dpa_team_fp(d->team_id, d->size, d->peers);
	team->active = 1;
	return OFFLOAD_OK;
}

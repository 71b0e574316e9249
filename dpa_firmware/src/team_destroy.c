/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Team destroy: retire one team slot on this rank so that a later TEAM_CREATE can reuse it.
 *
 * Local on purpose. Every word a peer writes into our control region for an op (its
 * signature, its ready, its done signal, a multicast acknowledgement) is one this rank
 * needs before the op completes here, so once every op of the team completed on this rank
 * nothing more arrives for it. The host posts the destroy only then, and reuses the slot
 * for a new team only after every member destroyed it (host/src/dpo_team.c), so zeroing
 * our words cannot swallow a new team's first signature.
 */
#include "engine_internal.h"

static int team_idle(struct dpa_engine *eng, uint32_t t)
{
	for (uint32_t s = 0; s < OFFLOAD_OP_WINDOW; s++) {
		const struct dpa_op *op = &eng->ops[t * OFFLOAD_OP_WINDOW + s];

		if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) != DPA_OP_FREE ||
		    __atomic_load_n(&op->users, __ATOMIC_SEQ_CST) != 0)
			return 0;
	}
	return !__atomic_load_n(&eng->agree[t].active, __ATOMIC_SEQ_CST) &&
	       !eng->mcast[t].owner;
}

int32_t dpa_team_destroy(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd)
{
	uint32_t t = cmd->team;
	uint8_t *ctrl;
	uint32_t n, eager_srcs;

	if (t >= OFFLOAD_MAX_TEAMS || !eng->teams[t].active || cmd->count || cmd->flags ||
	    cmd->src_addr || cmd->dst_addr || cmd->aux_addr)
		return OFFLOAD_ERR_INVALID;
	/* The host posts this once every op of the team completed, but a slot is freed just
	 * after its completion is written: wait for that rather than clear state a thread
	 * may still be reading (the slot's release notifies intake). */
	if (!team_idle(eng, t))
		return DPA_TEAM_DESTROY_LATER;
	/* What the team's members could have written of our block: its first
	 * offload_ctrl_team_bytes(n) bytes (the layout is the team size's). */
	n = eng->teams[t].size;
	ctrl = dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL, dpa_ctrl_team_off(eng, t),
				  offload_ctrl_team_bytes(n));
	if (!ctrl)
		return OFFLOAD_ERR_INTERNAL;
	dpa_hal_mcast_leave(hal, t);
	for (uint64_t i = 0; i < offload_ctrl_team_bytes(n); i++)
		ctrl[i] = 0;
	/* Our eager receive slots of the team: a stale header must not meet a new team's
	 * op of the same sequence number. Only their headers matter (the data is read only
	 * under a header that matches). */
	eager_srcs = n < OFFLOAD_EAGER_MAX_TEAM ? n : OFFLOAD_EAGER_MAX_TEAM;
	for (uint32_t src = 0; src < eager_srcs; src++)
		for (uint32_t k = 0; k < OFFLOAD_EAGER_SLOTS; k++) {
			struct offload_eager_slot *e =
				dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL,
						   dpa_ctrl_eager_off(eng, t, src, k),
						   sizeof(struct offload_sig));
			if (e)
				e->sig = (struct offload_sig){ 0 };
		}
	eng->mcast[t] = (struct dpa_mcast_state){ 0 };
	eng->agree[t] = (struct dpa_agree){ 0 };
	/* active last: the slot is free for TEAM_CREATE only once it is clean. */
	eng->teams[t] = (struct dpa_team){ 0 };
	return OFFLOAD_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
#ifndef DPA_SIGNATURE_H
#define DPA_SIGNATURE_H

#include "engine_internal.h"
#include "p2p.h"
/* signature.c: every op's signature and the gate before its algorithm (see there). */
uint32_t dpa_team_fp(uint32_t team_id, uint32_t size, const struct offload_peer *peers);
void dpa_sig_init(struct dpa_engine *eng, struct dpa_op *op);
/* Post our signature to peer me + i unless it is out already (DPA_ITEM_SIG_OUT): 1 posted
 * now, 0 out before, DPA_HAL_EAGAIN: the control log is full, later. */
int dpa_sig_post_once(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i);
/* Item i's part of the gate: our signature out, peer me + i's judged. Returns work done. */
int dpa_sig_step(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i);
/* Peer `world`'s signature against ours: 1 if it agrees; else the op fails with
 * OFFLOAD_ERR_MISMATCH naming it and what differs (the first failure wins) and 0. */
int dpa_sig_judge(struct dpa_op *op, const struct offload_sig *theirs, uint32_t world);
/* Team peer p's signature of op seq as the gate posts it, if it arrived; else NULL. */
const struct offload_sig *dpa_sig_gated(struct dpa_engine *eng, struct dpa_hal *hal,
				       uint32_t team_id, uint32_t seq, uint32_t p);
/* ... or as an eager op carries it (its slot header): 1 and a copy in *out if there. */
int dpa_sig_eager(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team_id, uint32_t seq,
		  uint32_t p, struct offload_sig *out);
/* Item i's peer p has sent nothing for this op: 1 if the op fails for it (p runs an
 * agreement instead, once settled: OFFLOAD_ERR_MISMATCH; p is gone), 0 to wait on. */
int dpa_sig_absent(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i,
		   uint32_t p);


/* agree_ft.c: fault-tolerant agreement (OFFLOAD_OP_AGREE). intake: 1 taken, 0 not now
 * (the team's previous agreement still runs); progress: the calling thread's teams. */
int dpa_agree_intake(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd);
int dpa_agree_progress(struct dpa_engine *eng, struct dpa_hal *hal);
/* One rank runs an agreement where another runs a collective: 1 once that has held for
 * DPA_OOS_SETTLE_NS on a team whose sequences pair up (no member gone, no op aborted:
 * after a failure they legitimately differ). *since: the caller's first sighting. */
#define DPA_OOS_SETTLE_NS 200000000ull
int dpa_out_of_step(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_team *team,
		    uint64_t *since);

#endif /* DPA_SIGNATURE_H */

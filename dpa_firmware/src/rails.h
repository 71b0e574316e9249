/* SPDX-License-Identifier: Apache-2.0 */
#ifndef DPA_RAILS_H
#define DPA_RAILS_H

#include "engine_internal.h"

/* rails.c: failover between rails and the control-word log (see there): the bottom
 * layer above the HAL. It calls nothing above it; what it cannot resend it reports. */
uint32_t dpa_rail_select(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t peer);
/* The rail item `it` posts its next data to `peer` on; DPA_NO_RAIL when none is left, or
 * DPA_RAIL_WAIT while the item still has writes or reads in flight on another rail. */
uint32_t dpa_item_rail(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_item *it,
		       uint32_t peer);
void dpa_rail_failed(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t peer, uint32_t rail);
/* Post a logged control word; DPA_HAL_EAGAIN, OFFLOAD_ERR_LINK_DOWN (no rail) or 0. */
int dpa_ctrl_post(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_ctrl_msg *msg);
int dpa_ctrl_completed(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_hal_cqe *c);
/* A control word that could not go again (its peer has no rail left): its op must abort. */
struct dpa_wr_failure {
	uint64_t wr_id;
	uint32_t peer;         /* world rank */
};
/* Post again the words failed rails dropped (returns the work done); those that found no
 * rail are reported in lost[] (room for DPA_CTRL_LOG), *nlost of them. */
int dpa_ctrl_resend(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_wr_failure *lost,
		    uint32_t *nlost);
int dpa_ctrl_pending(struct dpa_engine *eng, const struct dpa_op *op);
/* Is any control word of op index opi (whatever its seq) still owed by any thread? */
int dpa_ctrl_opi_pending(struct dpa_engine *eng, uint32_t opi);
/* Is the control word with this wr_id still owed by any thread? */
int dpa_ctrl_word_pending(struct dpa_engine *eng, uint64_t wr_id);

#endif /* DPA_RAILS_H */

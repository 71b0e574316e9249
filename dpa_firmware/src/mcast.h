/* SPDX-License-Identifier: Apache-2.0 */
#ifndef DPA_MCAST_H
#define DPA_MCAST_H

#include "engine_internal.h"
#include "rails.h"
#include "p2p.h"
/* mcast.c: what broadcast and all-gather share (see there). */
struct dpa_mcast_state *dpa_mcast_claim(struct dpa_engine *eng, struct dpa_op *op);
/* The op's counters for the host (aux buffer), if it asked: start() checks the buffer. */
int dpa_mcast_stats_ok(struct dpa_hal *hal, const struct dpa_op *op);
/* The algorithms' read_completed hook: a refetch read from the owner of block `owner`. */
void dpa_mcast_read_completed(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			      uint32_t owner, const struct dpa_hal_cqe *c);
/* The algorithms' finish hook: give the receive state back, report the counters. */
void dpa_mcast_finish(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal);
/* Post the regions of every block not complete (nor `complete`, one completing now). */
int dpa_mcast_post(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		   struct dpa_mcast_state *st, uint32_t complete);
int dpa_mcast_inject(struct dpa_op *op, struct dpa_hal *hal, uint32_t first_chunk,
		     uint64_t src, uint64_t len, int *done);
/* Poll arrivals, learn owners' readies and "sent all", fetch what was lost; returns work
 * done. Sets DPA_BLOCK_COMPLETE on every block that is whole. */
int dpa_mcast_receive(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      struct dpa_mcast_state *st);
uint32_t dpa_mcast_chunks(struct dpa_hal *hal, uint64_t len);
int dpa_mcast_peer_word(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint32_t p);
int dpa_mcast_owner_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal, uint32_t p);
int dpa_mcast_take_ack(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
		       struct dpa_hal *hal, uint32_t p);
/* An aborted owner's unfinished item for peer p (p has not acknowledged our block):
 * withdraw our source from p. */
int dpa_mcast_withdraw(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t p);

#endif /* DPA_MCAST_H */

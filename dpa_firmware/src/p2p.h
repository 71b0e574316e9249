/* SPDX-License-Identifier: Apache-2.0 */
#ifndef DPA_P2P_H
#define DPA_P2P_H

#include "engine_internal.h"
#include "rails.h"
/* p2p.c: point-to-point steps: done signals, readies, counts, the exchange step shared
 * by all-to-all and all-to-all-v. Below the algorithms, above rails.c. */
/* A control descriptor into team peer peer_rank's region at off: len bytes of body, then
 * the op's seq at off + seq_off (same queue: a reader that sees the seq sees the body). */
int dpa_post_sequenced(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t peer_rank, uint64_t off, const void *body, uint32_t len,
		       uint32_t seq_off, uint32_t kind);
int dpa_publish_ready(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t src, uint64_t addr, uint64_t len, uint32_t flags);
/* The same descriptor naming any of our regions: multicast owners publish their source
 * (src_key, remote read) so that receivers can read what they lost. */
int dpa_publish_region(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t peer, uint64_t addr, uint64_t len, uint32_t key, uint32_t flags);
/* The same descriptor with OFFLOAD_READY_WITHDRAWN, as its own control word (its own
 * wr_id kind: the log tells its completions from the ready's). */
int dpa_withdraw_region(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint32_t peer, uint64_t addr, uint64_t len, uint32_t key);
/* Publishes this rank's ready for one source (fixed-layout exchanges). */
typedef int (*dpa_publish_fn)(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			      uint32_t src);
/* Item i's first steps in a fixed-layout exchange: expect the source's signal, publish our
 * ready to it if start() could not. Returns the work done, or -1 to retry later. */
int dpa_item_begin(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		   dpa_publish_fn publish);
/* Tell dst how many bytes this op sends it (struct offload_count, seq last). */
int dpa_publish_count(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t dst, uint64_t bytes);
/* Item i: take the destination's ready, write the send block, signal, and wait
 * for the source's signal; sets DPA_ITEM_FINISHED once READY_OUT is set too. */
int dpa_exchange_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		      const struct dpa_send *send);


/* Signals: our done signal to a peer, the source's we expect, whether it arrived. */
int dpa_signal_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		    uint32_t peer, int error);
void dpa_expect_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_item *it, uint32_t src);
/* Returns 1 if peer's done signal for this item arrived, 0 if not yet; fails the op on error. */
int dpa_check_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		   struct dpa_item *it, uint32_t src);
/* The peer will never answer this op: it died (the op fails naming it), it closed its
 * context without sending what we wait for (the op fails with OFFLOAD_ERR_PEER_CLOSED),
 * or the op failed reaching it (it refused our control write). Waits on it end. Callers
 * look for the peer's word first and call this when it is missing. */
int dpa_peer_gone(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		  uint32_t world_rank);

#endif /* DPA_P2P_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The eager slot protocol (alltoall_eager.c), shared by the eager all-to-all and the eager
 * allreduce (allreduce_eager.c), firmware-private: a block goes straight into the
 * receiver's slot for us, its header (our signature) behind it; the receiver judges the
 * header as the gate would and hands the slot back with a credit. Items: one per team
 * peer, item j with peer me + j.
 */
#ifndef DPA_EAGER_H
#define DPA_EAGER_H

#include <stdint.h>

#include "engine_internal.h"

#define DPA_EAGER_CREDIT_POLL_NS 20000u  /* credits wake nobody: look again this often */

enum dpa_eager_w {
	EAGER_W_NONE = 0,
	EAGER_W_BLOCK,   /* our block into the peer's slot (item 0: into our dst) */
	EAGER_W_COPY,    /* a block out of a slot here into our dst */
	EAGER_W_CREDIT,  /* the consumed slot's word back to the peer */
};

/* Does a command of count bytes go eagerly? Within the rank's eager_max, in a team of at
 * most OFFLOAD_EAGER_MAX_TEAM members (the eager slots' width): every rank has the same
 * count and team, and is told to use the same eager_max (the op signature checks it). */
static inline int dpa_eager_fits(const struct dpa_engine_params *p,
				 const struct offload_cmd *cmd, uint32_t team_size)
{
	return p->eager_max && cmd->count <= p->eager_max && team_size <= OFFLOAD_EAGER_MAX_TEAM;
}

static inline uint32_t dpa_eager_slot(const struct dpa_op *op)
{
	return op->seq % OFFLOAD_EAGER_SLOTS;
}

/* At start: mark the protocol in our signature, note the slot's previous eager op. */
void dpa_eager_begin(struct dpa_engine *eng, struct dpa_op *op);
/* A data write of item i to team peer `peer` (to ourselves: EAGER_W_COPY); 1 if posted
 * (or failed for good), 0 to try again. */
int dpa_eager_write(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		    uint32_t peer, uint64_t laddr, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		    uint64_t len, enum dpa_eager_w what);
/* The item's write completed: PUT, COPIED or RECVD (credit) raised, or posted again. */
void dpa_eager_settle(struct dpa_item *it);
/* Every header judged: 1 if blocks may be used, 0 if nothing may move, -1 not yet. */
int dpa_eager_copies_allowed(const struct dpa_op *op);
/* Our block (src + src_off, cmd.count bytes) and header to peer p; 1 once SIGNALED. */
int dpa_eager_send(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		   uint32_t p, uint64_t src_off);
/* Judge peer p's header (or its gated signature, or its absence); DPA_ITEM_JUDGED once
 * done, with RECVD (nothing to hand back) or FALLBACK set where there is no block. */
int dpa_eager_judge(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		    uint32_t p);
/* Hand peer p's slot back (its credit); RECVD once it completed. */
int dpa_eager_credit(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		     uint32_t p);
const struct offload_eager_slot *dpa_eager_slot_ptr(struct dpa_engine *eng,
						     const struct dpa_op *op, struct dpa_hal *hal,
						     uint32_t p);
/* Item i's step in either eager algorithm: settle its last write; item 0 runs the
 * algorithm's own part (self), the others send our data from src + peer x src_stride to
 * their peer and take the peer's (recv); FINISHED once both are done and nothing is in
 * flight. Inline, so the steps are direct calls in each algorithm. */
static inline int dpa_eager_item_step(
	struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
	uint64_t src_stride, int (*self)(struct dpa_engine *, struct dpa_op *, struct dpa_hal *),
	int (*recv)(struct dpa_engine *, struct dpa_op *, uint32_t, struct dpa_hal *, uint32_t))
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t p = (team->my_rank + i) % team->size;
	int work = 0;

	if (it->inflight)
		return 0;  /* its completion comes with the next poll */
	if (it->round != EAGER_W_NONE) {
		dpa_eager_settle(it);
		work++;
	}
	if (i == 0)
		return work + self(eng, op, hal);
	if (!(it->flags & DPA_ITEM_SIGNALED))
		work += dpa_eager_send(eng, op, i, hal, p, (uint64_t)p * src_stride);
	/* flags and inflight one word at a time, as the steps stored them: one 8-byte load
	 * over both (which compilers make of it) cannot take them from the store buffer, and
	 * waits until it drained, with the step's block copy's stores to a peer's lines ahead
	 * (84% of this function's samples, 1 KiB all-to-all at n=4). */
	if (!off_read_once(&it->inflight) && !(off_read_once(&it->flags) & DPA_ITEM_RECVD))
		work += recv(eng, op, i, hal, p);
	if ((off_read_once(&it->flags) & (DPA_ITEM_SIGNALED | DPA_ITEM_RECVD)) ==
	    (DPA_ITEM_SIGNALED | DPA_ITEM_RECVD) && !off_read_once(&it->inflight))
		it->flags |= DPA_ITEM_FINISHED;
	return work;
}

int dpa_eager_abort(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal);
uint32_t dpa_eager_events_needed(const struct dpa_op *op);

#endif /* DPA_EAGER_H */

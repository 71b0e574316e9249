/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reductions (reduce_kernel.c, reduce_scatter.c, allreduce.c), firmware-private.
 *
 * The order of every reduction is fixed, so results repeat bit for bit whatever the timing
 * or thread count, and equal gloo's ring allreduce (torch 2.13, CPU): the input of T bytes
 * is cut into "order blocks" of dpa_order_block() bytes (gloo's segment split); an element
 * in order block g of an n-rank team is reduced as
 *     acc = x[g-1]; acc = acc (+) x[g-2]; ...; acc = acc (+) x[g]     (ranks mod n)
 * each partial stored in the dtype (half types: computed in f32, rounded to nearest even),
 * AVG = the final sum divided by n. Integers wrap (two's complement). MAX keeps acc only
 * when acc > x (so a NaN survives only when it comes last), MIN when acc < x.
 * Never build this with -ffast-math or FP contraction (-ffp-contract=off).
 */
#ifndef DPA_REDUCE_H
#define DPA_REDUCE_H

#include <stdint.h>

#include "engine_internal.h"
#include "p2p.h"

/* Element size of an OFFLOAD_DT_*, 0 if unknown. */
uint32_t dpa_dtype_size(uint32_t dtype);
/* Is the root word a reduction this firmware runs (known op and dtype, no AVG on ints)? */
int dpa_redop_valid(uint32_t redop);
/* gloo's segment split: bytes per order block of a T-byte reduction over n ranks. */
uint64_t dpa_order_block(uint64_t total, uint32_t esize, uint32_t n);

/*
 * out[k] = x[first] (+) x[first-1] (+) ... (+) x[first-n+1] for k < count elements, where
 * x[j] (team rank j's operand) is at src0 + j * stride: no table of n pointers, whatever
 * the team's size; out may be any operand (a tile is read whole before it is stored). AVG
 * divides.
 */
void dpa_reduce(uint32_t redop, uint32_t n, uint32_t first, const void *src0, uint64_t stride,
		void *out, uint64_t count);

/* The exchange both reductions share (reduce_scatter.c); `stride` is the distance between
 * blocks in src (and scratch). Items: one per team peer, as in the all-to-all. */
uint64_t dpa_red_stride(const struct dpa_engine *eng, const struct dpa_op *op);
int dpa_red_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal);
/* Phase 1 of item i: push our contribution, take the peer's; 1 once both are done. Takes
 * the item's signal expectations (1 per peer for reduce-scatter, 3 for allreduce). */
int dpa_red_push(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		 int *work);
/* Item 0: reduce this rank's block in scratch once every contribution is in (a chunk per
 * call); 1 once done (DPA_RED_REDUCED raised). */
int dpa_red_reduce(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, int *work);
/* Read [raddr, +len) of a peer (team rank) into our dst at dst_off, chunk by chunk on the
 * item's counters; 1 once all of it completed (or failed: the op carries the error). */
int dpa_red_read(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		 uint32_t peer, uint64_t raddr, uint32_t rkey, uint64_t dst_off, uint64_t len,
		 int *work);
/* The k-th done signal of team rank src in this op arrived (or src is gone). */
int dpa_red_heard(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t src,
		  uint32_t k);
/* Block j of the op's split: offset and length in bytes. */
void dpa_red_block(const struct dpa_engine *eng, const struct dpa_op *op, uint32_t j,
		   uint64_t *off, uint64_t *len);

/* op->alg.red_flags of a reduction: */
#define DPA_RED_REDUCED 1u    /* this rank's block is reduced in scratch */

/* Raise red_flags that another item of the op waits for; that item may belong to a
 * sibling thread parked until an event, and a flag in memory is no event: wake them. */
static inline void dpa_red_raise(struct dpa_op *op, struct dpa_hal *hal, uint32_t bits)
{
	__atomic_fetch_or(&op->alg.red_flags, bits, __ATOMIC_RELEASE);
	dpa_hal_notify(hal);
}

/* Item flags of the reductions' later phases (bits the exchange does not use). */
#define DPA_RED_PHASE2 (1u << 20)   /* the exchange finished: posted/acked count reads now */
#define DPA_RED_SIG2   (1u << 21)   /* "reduced" sent to the peer */
#define DPA_RED_READ   (1u << 22)   /* the peer's reduced block is in our dst */
#define DPA_RED_SIG3   (1u << 23)   /* "read you" sent to the peer */
#define DPA_RED_PUSHED (1u << 24)   /* counted in red_pushed */

extern const struct dpa_algo dpa_algo_reduce_scatter;
extern const struct dpa_algo dpa_algo_allreduce;
extern const struct dpa_algo dpa_algo_allreduce_eager;

#endif /* DPA_REDUCE_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reduce-scatter, pairwise exchange into scratch, reduced by the DPA threads.
 *
 * Item i pairs with (me + i) and (me - i) as in the all-to-all: this rank writes block
 * (me + i) of its src into that rank's scratch, at the slot of our rank, and rank (me - i)
 * writes its block me into our slot (me - i). The scratch is the command's aux region,
 * published in the ready, so a sender writes only where the receiver said, once it said
 * so. When every contribution (ours too: item 0's loopback write) has landed, item 0's
 * thread reduces our block in scratch in the fixed order of reduce.h, one chunk per pass so
 * that progress never blocks for long, and reads the result into dst with a loopback RDMA
 * READ (one device pointer per pass: the scratch; dst is reached by RDMA only).
 *
 * The phase-1 exchange and the reducer are shared with allreduce.c.
 */
#include "reduce.h"

static uint32_t red_esize(const struct dpa_op *op)
{
	return dpa_dtype_size(OFFLOAD_REDOP_DT(op->cmd.root));
}

uint64_t dpa_red_stride(const struct dpa_engine *eng, const struct dpa_op *op)
{
	uint32_t n = eng->teams[op->team_id].size, es = red_esize(op);

	if (!es)
		return 0;
	return op->cmd.opcode == OFFLOAD_OP_REDUCE_SCATTER ? op->cmd.count / n :
	       dpa_order_block(op->cmd.count, es, n);
}

void dpa_red_block(const struct dpa_engine *eng, const struct dpa_op *op, uint32_t j,
		   uint64_t *off, uint64_t *len)
{
	uint64_t s = dpa_red_stride(eng, op), t = op->cmd.count;

	*off = (uint64_t)j * s < t ? (uint64_t)j * s : t;
	*len = t - *off < s ? t - *off : s;
}

/* Our scratch slot for src's contribution (to our block). */
static int red_publish(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t src)
{
	uint64_t off, len;

	if (op->refuse)
		return dpa_publish_region(eng, op, hal, src, 0, 0, op->cmd.aux_key,
					  OFFLOAD_READY_REFUSED | OFFLOAD_READY_FIXED);
	dpa_red_block(eng, op, eng->teams[op->team_id].my_rank, &off, &len);
	return dpa_publish_region(eng, op, hal, src,
				  op->cmd.aux_addr + (uint64_t)src * dpa_red_stride(eng, op), len,
				  op->cmd.aux_key, OFFLOAD_READY_FIXED);
}

static int red_valid(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct offload_cmd *c = &op->cmd;
	uint32_t n = eng->teams[op->team_id].size, es = red_esize(op);
	uint64_t scratch;

	if (c->flags || !dpa_redop_valid(c->root) || c->count % es)
		return 0;
	if (c->opcode == OFFLOAD_OP_REDUCE_SCATTER ?
	    c->count % ((uint64_t)n * es) || c->dst_len < c->count / n : c->dst_len < c->count)
		return 0;
	if (!c->count)
		return 1;
	if (__builtin_mul_overflow(dpa_red_stride(eng, op), n, &scratch) || !c->src_addr ||
	    !c->dst_addr || !c->aux_addr)
		return 0;
	/* The scratch holds a slot per rank, and we reduce in it through a device pointer. */
	return dpa_hal_aux_ptr(hal, c->aux_key, c->aux_addr, scratch) != (void *)0;
}

int dpa_red_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t n = team->size, me = team->my_rank;

	if (!red_valid(eng, op, hal))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	for (uint32_t i = 0; i < n; i++) {
		if (red_publish(eng, op, hal, (me + n - i) % n) == DPA_HAL_EAGAIN)
			break;
		op->items[i].flags |= DPA_ITEM_READY_OUT;
	}
	return (int)n;
}

int dpa_red_push(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		 int *work)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint64_t off, len;
	int w;

	if (it->flags & DPA_RED_PUSHED)
		return 1;
	if (!(it->flags & DPA_ITEM_STARTED)) {
		/* Each peer signals us several times in this op (allreduce.c: pushed, reduced,
		 * read you): item i keeps the first expectation of its source (me - i), the
		 * others follow. Taken here, past the gate, as dpa_item_begin does: an op the
		 * gate failed consumes no signals. `round` publishes it to the other items. */
		uint32_t src = (team->my_rank + team->size - i) % team->size;
		struct dpa_team *t = &eng->teams[op->team_id];

		it->expect_lo = t->expect_lo[op->slot][src] + 1;
		it->errs_seen = t->errs_seen[op->slot][src];
		t->expect_lo[op->slot][src] += op->cmd.opcode == OFFLOAD_OP_ALLREDUCE ? 3 : 1;
		it->flags |= DPA_ITEM_STARTED;
		__atomic_store_n(&it->round, 1, __ATOMIC_RELEASE);
	}
	dpa_red_block(eng, op, (team->my_rank + i) % team->size, &off, &len);
	struct dpa_send send = { .addr = op->cmd.src_addr + off, .len = len, .fixed = 1 };

	w = dpa_item_begin(eng, op, i, hal, red_publish);
	if (w < 0)
		return 0;
	*work += w + dpa_exchange_step(eng, op, i, hal, &send);
	if (!(it->flags & DPA_ITEM_FINISHED))
		return 0;
	/* The exchange is done, not the item. */
	it->flags = (it->flags & ~DPA_ITEM_FINISHED) | DPA_RED_PUSHED;
	__atomic_fetch_add(&op->alg.red_pushed, 1, __ATOMIC_RELEASE);
	dpa_hal_notify(hal);  /* the reducer may be parked on another thread */
	return 1;
}

int dpa_red_heard(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t src,
		  uint32_t k)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	/* The item whose source is src holds src's first expectation (set at start). */
	const struct dpa_item *first = &op->items[(team->my_rank + team->size - src) % team->size];
	struct dpa_item probe;

	if (!__atomic_load_n(&first->round, __ATOMIC_ACQUIRE))
		return 0;  /* that item has not taken its expectation yet */
	probe = (struct dpa_item){ .expect_lo = first->expect_lo + k - 1,
				   .errs_seen = first->errs_seen };
	return dpa_check_done(eng, op, hal, &probe, src) ||
	       dpa_peer_gone(eng, op, hal, team->peers[src].world_rank);
}

int dpa_red_reduce(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, int *work)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t n = team->size, me = team->my_rank, es = red_esize(op);
	uint64_t stride = dpa_red_stride(eng, op), order, off, len, at, piece, chunk;
	uint8_t *base;

	if (off_load_acquire(&op->alg.red_flags) & DPA_RED_REDUCED)
		return 1;
	if (off_load_acquire(&op->alg.red_pushed) < n)
		return 0;
	dpa_red_block(eng, op, me, &off, &len);
	at = op->alg.red_next;
	if (op->refuse || off_load_acquire(&op->fail) || at >= len) {
		dpa_red_raise(op, hal, DPA_RED_REDUCED);  /* a failed op reduces nothing */
		*work += 1;
		return 1;
	}
	base = dpa_hal_aux_ptr(hal, op->cmd.aux_key, op->cmd.aux_addr, stride * n);
	if (!base) {  /* checked at start; the host cannot have changed it since */
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, team->peers[me].world_rank);
		dpa_red_raise(op, hal, DPA_RED_REDUCED);
		return 1;
	}
	chunk = eng->params.chunk_size / es * es;
	piece = len - at < chunk ? len - at : chunk ? chunk : es;
	/* One run of a single order block (reduce_scatter's even blocks may straddle two). */
	order = dpa_order_block(op->cmd.count, es, n);
	if ((off + at) / order != (off + at + piece - 1) / order)
		piece = ((off + at) / order + 1) * order - (off + at);
	dpa_reduce(op->cmd.root, n, (uint32_t)(((off + at) / order + n - 1) % n), base + at, stride,
		   base + (uint64_t)me * stride + at, piece / es);
	op->alg.red_next = at + piece;
	if (op->alg.red_next >= len)
		dpa_red_raise(op, hal, DPA_RED_REDUCED);
	*work += 1;
	return op->alg.red_next >= len;
}

int dpa_red_read(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		 uint32_t peer, uint64_t raddr, uint32_t rkey, uint64_t dst_off, uint64_t len,
		 int *work)
{
	struct dpa_item *it = &op->items[i];
	uint32_t world = eng->teams[op->team_id].peers[peer].world_rank, posted = 0;

	if (!(it->flags & DPA_RED_PHASE2)) {
		it->posted = it->acked = 0;
		it->flags |= DPA_RED_PHASE2;
	}
	if (it->flags & DPA_ITEM_RESEND) {
		if (it->inflight)
			return 0;  /* the failed rail flushes what it still holds first */
		dpa_stats(hal)->resent_bytes += it->posted - it->acked;
		it->posted = it->acked;  /* reads are idempotent: read the rest again */
		it->flags &= ~DPA_ITEM_RESEND;
	}
	if (it->posted < len && !(it->flags & DPA_ITEM_FAILED)) {
		uint32_t rail = dpa_item_rail(eng, hal, it, world);

		if (rail == DPA_NO_RAIL) {
			dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, world);
			return 0;
		}
		if (rail == DPA_RAIL_WAIT)
			return 0;
	}
	while (it->posted < len && posted < eng->params.chunks_per_pass) {
		uint64_t piece = len - it->posted < eng->params.chunk_size ? len - it->posted :
				 eng->params.chunk_size;
		int rc = dpa_hal_rdma_read(hal, world, op->cmd.dst_addr + dst_off + it->posted,
					   op->cmd.dst_key, raddr + it->posted, rkey, piece,
					   dpa_wr_id(op, i, DPA_WR_DATA));

		if (rc == DPA_HAL_EAGAIN)
			break;
		if (rc) {
			dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, world);
			it->flags |= DPA_ITEM_FAILED;
			it->posted = len;
			break;
		}
		it->posted += piece;
		it->inflight++;
		posted++;
	}
	*work += (int)posted;
	return it->inflight == 0 && it->posted >= len;
}

static int rs_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	return dpa_red_start(eng, op, hal);
}

static int rs_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	struct dpa_item *it = &op->items[i];
	uint32_t me = eng->teams[op->team_id].my_rank;
	uint64_t off, len;
	int work = 0;

	if (!dpa_red_push(eng, op, i, hal, &work))
		return work;
	if (i) {  /* our contribution is in its owner's scratch; theirs in ours */
		it->flags |= DPA_ITEM_FINISHED;
		return work + 1;
	}
	if (!dpa_red_reduce(eng, op, hal, &work))
		return work;
	dpa_red_block(eng, op, me, &off, &len);
	if (!op->refuse && !off_load_acquire(&op->fail) &&
	    !dpa_red_read(eng, op, 0, hal, me, op->cmd.aux_addr + me * dpa_red_stride(eng, op),
			  op->cmd.aux_key, 0, len, &work))
		return work;
	if (it->inflight)
		return work;
	it->flags |= DPA_ITEM_FINISHED;
	return work + 1;
}

const struct dpa_algo dpa_algo_reduce_scatter = {
	.start = rs_start,
	.progress = rs_progress,
};

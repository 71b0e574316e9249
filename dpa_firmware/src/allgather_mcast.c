/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All-gather over multicast: every rank injects its own block once (chunk ids offset by
 * its rank), so each rank puts S/n bytes into the fabric, against (n-1)/n * S for a ring.
 * At most mcast_roots ranks inject at once, so receivers are not overrun: rank r starts
 * when rank r - mcast_roots said "sent all" (the token passes along the chain). Receiving,
 * placement and refetch are mcast.c's.
 *
 * Item 0: post regions for every other block, copy our own block into dst, inject ours
 * when every peer is ready and the token came, then receive. Item i >= 1, peer p = me + i:
 * publish our source to p (our ready: p may read lost chunks from it), wait for p's
 * ready, send p "sent all" after injecting, acknowledge p's block once it is whole, and
 * wait for p's acknowledgement of ours (our source stays readable until then).
 */
#include "engine_internal.h"
#include "mcast.h"

static int ag_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *cmd = &op->cmd;
	uint64_t total, per_block = (uint64_t)dpa_mcast_chunks(hal, cmd->count);

	if (!dpa_hal_mtu(hal))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_UNSUPPORTED);
	else if (cmd->flags || !dpa_mcast_stats_ok(hal, op) ||
	    __builtin_mul_overflow(cmd->count, team->size, &total) ||
	    per_block * team->size > DPA_MCAST_MAX_CHUNKS ||
	    (total && (!cmd->src_addr || !cmd->dst_addr || cmd->dst_len < total)))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	else
		op->result0 = total;
	return (int)team->size;
}

/* Our turn to inject: mcast_roots ranks at once, in rank order. */
static int have_token(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t k = eng->params.mcast_roots ? eng->params.mcast_roots : 1, me = team->my_rank;
	const struct offload_count *c;

	if (me < k)
		return 1;
	c = dpa_my_count(eng, hal, op->team_id, op->slot, me - k);
	return off_load_acquire(&c->seq) == op->seq ||
	       dpa_peer_gone(eng, op, hal, team->peers[me - k].world_rank);
}

static void setup(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		  struct dpa_mcast_state *st)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t cpb = dpa_mcast_chunks(hal, op->cmd.count);

	for (uint32_t r = 0; r < team->size; r++)
		st->blocks[r] = (struct dpa_mcast_block){
			.dst = op->cmd.dst_addr + (uint64_t)r * op->cmd.count, .len = op->cmd.count,
			.first_chunk = r * cpb, .nchunks = cpb };
	for (uint32_t w = 0; w < (cpb * team->size + 63) / 64; w++)
		st->bits[w] = 0;
}

static int all_blocks_done(const struct dpa_team *team, struct dpa_mcast_state *st)
{
	for (uint32_t r = 0; r < team->size; r++)
		if (r != team->my_rank && !(off_load_acquire(&st->blocks[r].flags) & DPA_BLOCK_COMPLETE))
			return 0;
	return 1;
}

static int ag_self(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[0];
	uint32_t me = team->my_rank, world = team->peers[me].world_rank;
	uint64_t len = op->cmd.count;
	struct dpa_mcast_state *st;
	int work = 0, rc;

	if (op->refuse || !len) {
		dpa_mc_raise(op, hal, DPA_MC_POSTED | DPA_MC_INJECTED | DPA_MC_RECEIVED);
		it->flags |= DPA_ITEM_FINISHED;
		return 1;
	}
	st = dpa_mcast_claim(eng, op);
	if (!st)
		return 0;  /* the team's previous multicast op is still receiving */
	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_POSTED)) {
		setup(eng, op, hal, st);
		dpa_mcast_post(eng, op, hal, st, UINT32_MAX);
		dpa_mc_raise(op, hal, DPA_MC_POSTED);
		work++;
	}
	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_COPYING) &&
	    op->cmd.src_addr == op->cmd.dst_addr + (uint64_t)me * len) {
		/* In place: our block is in dst already. */
		dpa_mc_raise(op, hal, DPA_MC_COPYING | DPA_MC_COPIED);
		work++;
	}
	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_COPYING)) {
		/* Our own block, by the same engine that copies everything else. */
		if (dpa_rail_select(eng, hal, world) == DPA_NO_RAIL) {
			dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, world);
			return work;
		}
		rc = dpa_hal_rdma_write(hal, world, op->cmd.src_addr, op->cmd.src_key,
					op->cmd.dst_addr + (uint64_t)me * len, op->cmd.dst_key, len,
					dpa_wr_id(op, 0, DPA_WR_DATA));
		if (rc == DPA_HAL_EAGAIN)
			return work;
		if (rc)
			dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, world);
		else
			it->inflight++;
		__atomic_fetch_or(&op->alg.mc_flags, DPA_MC_COPYING, __ATOMIC_RELEASE);
		work++;
	}
	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_COPIED)) {
		if (it->inflight)
			return work;  /* nothing else is in flight yet: this is the copy */
		if (it->flags & DPA_ITEM_RESEND) {  /* its rail failed: copy again on another */
			it->flags &= ~DPA_ITEM_RESEND;
			__atomic_fetch_and(&op->alg.mc_flags, ~DPA_MC_COPYING, __ATOMIC_RELEASE);
			return work + 1;
		}
		dpa_mc_raise(op, hal, DPA_MC_COPIED);
		work++;
	}
	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_INJECTED) &&
	    off_load_acquire(&op->alg.mc_readies) == team->size - 1 && have_token(eng, op, hal)) {
		int done = 1;

		if (!off_load_acquire(&op->fail))
			work += dpa_mcast_inject(op, hal, me * dpa_mcast_chunks(hal, len),
						 op->cmd.src_addr, len, &done);
		if (done) {
			dpa_mc_raise(op, hal, DPA_MC_INJECTED);
			work++;
		}
	}
	work += dpa_mcast_receive(eng, op, hal, st);
	if ((off_read_once(&op->alg.mc_flags) & DPA_MC_INJECTED) && it->inflight == 0 &&
	    (all_blocks_done(team, st) || off_load_acquire(&op->fail))) {
		dpa_mc_raise(op, hal, DPA_MC_RECEIVED);
		it->flags |= DPA_ITEM_FINISHED;
		work++;
	}
	return work;
}

static int ag_peer(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t p = (team->my_rank + i) % team->size;
	const struct dpa_mcast_block *b = &eng->mcast[op->team_id].blocks[p];
	int work = dpa_mcast_owner_step(eng, op, i, hal, p);

	if (!(it->flags & DPA_ITEM_COUNT_OUT))
		return work;
	if (!(it->flags & DPA_ITEM_SIGNALED)) {
		/* p's block is whole here (or nothing more will come): p may reuse its source. */
		if (!(off_load_acquire(&op->alg.mc_flags) & DPA_MC_RECEIVED) &&
		    !(op->cmd.count && !op->refuse &&
		      (off_load_acquire(&b->flags) & DPA_BLOCK_COMPLETE)))
			return work;
		if (dpa_signal_done(eng, op, hal, p, off_load_acquire(&op->fail) != 0) ==
		    DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_SIGNALED;
		work++;
	}
	return work + dpa_mcast_take_ack(eng, op, i, hal, p);
}

static int ag_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	return i == 0 ? ag_self(eng, op, hal) : ag_peer(eng, op, i, hal);
}

static int ag_abort(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];

	return i ? dpa_mcast_withdraw(eng, op, hal, (team->my_rank + i) % team->size) : 0;
}

const struct dpa_algo dpa_algo_allgather_mcast = {
	.start = ag_start,
	.progress = ag_progress,
	.abort = ag_abort,
	.multicast = 1,
	.read_completed = dpa_mcast_read_completed,
	.finish = dpa_mcast_finish,
};

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Broadcast over multicast: the root injects each MTU chunk of its buffer once, whatever
 * the team size; receivers place chunks by id and fetch what was lost (mcast.c).
 *
 * Item 0 is this rank's own part (root: inject; receiver: post regions, receive, refetch).
 * Item i >= 1 talks to peer p = me + i:
 *  - root: publish its source (address, key: where lost chunks are read from) to p, wait
 *    for p's ready (p posted its regions), after injecting send p "sent all" (the chunk
 *    count), and wait for p's acknowledgement (its done signal): the root completes only
 *    when its buffer may be reused;
 *  - receiver, p = root: publish ready once regions are posted, and acknowledge when the
 *    buffer is whole (an error signal if this rank's op failed). Other peers: nothing.
 * The handshake runs for zero-length ops too, so ranks that disagree on the size fail
 * instead of waiting forever.
 */
#include "engine_internal.h"
#include "mcast.h"

static int bcast_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_cmd *cmd = &op->cmd;
	uint64_t len = cmd->count;
	int root = cmd->root == team->my_rank;

	if (!dpa_hal_mtu(hal))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_UNSUPPORTED);
	else if (cmd->flags || cmd->root >= team->size || !dpa_mcast_stats_ok(hal, op) ||
	    dpa_mcast_chunks(hal, len) > DPA_MCAST_MAX_CHUNKS ||
	    (len && (!cmd->dst_addr || cmd->dst_len < len || (root && !cmd->src_addr))))
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	else if (!root)
		op->result0 = len;
	return (int)team->size;
}

static int root_self(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[0];
	int work = 0;

	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_POSTED))  /* the root receives nothing */
		dpa_mc_raise(op, hal, DPA_MC_POSTED);
	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_INJECTED)) {
		int done = 1;

		if (off_load_acquire(&op->alg.mc_readies) < team->size - 1)
			return 0;
		if (!op->refuse && !off_load_acquire(&op->fail))
			work += dpa_mcast_inject(op, hal, 0, op->cmd.src_addr, op->cmd.count, &done);
		if (!done)
			return work;
		dpa_mc_raise(op, hal, DPA_MC_INJECTED);
		work++;
	}
	if (it->inflight == 0)
		it->flags |= DPA_ITEM_FINISHED;
	return work;
}

static int receiver_self(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[0];
	struct dpa_mcast_state *st;
	struct dpa_mcast_block *b;
	uint32_t root = op->cmd.root;
	int work;

	if (op->refuse || !op->cmd.count) {
		dpa_mc_raise(op, hal, DPA_MC_POSTED | DPA_MC_RECEIVED);
		it->flags |= DPA_ITEM_FINISHED;
		return 1;
	}
	st = dpa_mcast_claim(eng, op);
	if (!st)
		return 0;  /* the team's previous multicast op is still receiving */
	b = &st->blocks[root];
	if (!(off_read_once(&op->alg.mc_flags) & DPA_MC_POSTED)) {
		uint32_t nchunks = dpa_mcast_chunks(hal, op->cmd.count);

		/* The empty blocks after the root's start where it ends: first_chunk stays
		 * nondecreasing in team-rank order, which block_of()'s search needs. */
		for (uint32_t r = 0; r < team->size; r++)
			st->blocks[r] = (struct dpa_mcast_block){ .first_chunk = r > root ? nchunks : 0 };
		*b = (struct dpa_mcast_block){ .dst = op->cmd.dst_addr, .len = op->cmd.count,
			.nchunks = nchunks };
		for (uint32_t w = 0; w < (b->nchunks + 63) / 64; w++)
			st->bits[w] = 0;
		dpa_mcast_post(eng, op, hal, st, UINT32_MAX);
		dpa_mc_raise(op, hal, DPA_MC_POSTED);
	}
	work = dpa_mcast_receive(eng, op, hal, st);
	/* Done when whole, or when the op failed (nothing more will come) and no read is out. */
	if (it->inflight == 0 &&
	    ((off_load_acquire(&b->flags) & DPA_BLOCK_COMPLETE) || off_load_acquire(&op->fail) ||
	     dpa_peer_gone(eng, op, hal, team->peers[root].world_rank))) {
		off_store_release(&b->flags, b->flags | DPA_BLOCK_COMPLETE);
		dpa_mc_raise(op, hal, DPA_MC_RECEIVED);
		it->flags |= DPA_ITEM_FINISHED;
		work++;
	}
	return work;
}

/* The root's item for receiver p. */
static int root_peer(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		     uint32_t p)
{
	int work = dpa_mcast_owner_step(eng, op, i, hal, p);

	if (op->items[i].flags & DPA_ITEM_COUNT_OUT)
		work += dpa_mcast_take_ack(eng, op, i, hal, p);
	return work;
}

static uint32_t team_root_world(const struct dpa_engine *eng, const struct dpa_op *op)
{
	return eng->teams[op->team_id].peers[op->cmd.root].world_rank;
}

/* A receiver's item for the root. */
static int receiver_root(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal, uint32_t root)
{
	struct dpa_item *it = &op->items[i];
	int work = 0;

	if (!(it->flags & DPA_ITEM_READY_OUT)) {
		if (!(off_load_acquire(&op->alg.mc_flags) & DPA_MC_POSTED) ||
		    dpa_publish_ready(eng, op, hal, root, op->cmd.dst_addr, op->cmd.count,
				      op->refuse ? OFFLOAD_READY_REFUSED : 0) == DPA_HAL_EAGAIN)
			return 0;
		it->flags |= DPA_ITEM_READY_OUT;
		work++;
	}
	/* Acknowledge once the buffer is whole (or our op failed; the signal says so), the
	 * root's own word says we agree on the size (item 0 skips it for empty ops), and its
	 * "sent all" is here: the root writes nothing to us after our acknowledgement, which
	 * lets us complete and close. */
	if (!(off_load_acquire(&op->alg.mc_flags) & DPA_MC_RECEIVED))
		return work;
	if (!(it->flags & DPA_ITEM_READY_IN)) {
		if (!dpa_mcast_peer_word(eng, op, hal, root))
			return work;
		it->flags |= DPA_ITEM_READY_IN;
	}
	/* Pairs with the root's seq write, which follows the chunk count. */
	if (off_load_acquire(&dpa_my_count(eng, hal, op->team_id, op->slot, root)->seq) != op->seq &&
	    !off_load_acquire(&op->fail) && !dpa_peer_gone(eng, op, hal, team_root_world(eng, op)))
		return work;
	if (dpa_signal_done(eng, op, hal, root, off_load_acquire(&op->fail) != 0) == DPA_HAL_EAGAIN)
		return work;
	it->flags |= DPA_ITEM_SIGNALED | DPA_ITEM_FINISHED;
	return work + 1;
}

static int bcast_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			  struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t me = team->my_rank, root = op->cmd.root, p = (me + i) % team->size;

	if (i == 0)
		return me == root ? root_self(eng, op, hal) : receiver_self(eng, op, hal);
	if (me == root)
		return root_peer(eng, op, i, hal, p);
	if (p == root)
		return receiver_root(eng, op, i, hal, root);
	op->items[i].flags |= DPA_ITEM_FINISHED;
	return 1;
}

static int bcast_abort(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];

	if (i == 0 || op->cmd.root != team->my_rank)
		return 0;
	return dpa_mcast_withdraw(eng, op, hal, (team->my_rank + i) % team->size);
}

const struct dpa_algo dpa_algo_broadcast_mcast = {
	.start = bcast_start,
	.progress = bcast_progress,
	.abort = bcast_abort,
	.multicast = 1,
	.read_completed = dpa_mcast_read_completed,
	.finish = dpa_mcast_finish,
};

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All-to-all-v with the counts exchanged by the firmware (no host round trip).
 *
 * At intake every rank publishes, into each peer's control region, how many bytes it will
 * send there. A receiver that has every source's count lays out its destination packed in
 * source-rank order (one thread does it, under layout_lock), writes the receive counts to
 * the host, and only then publishes readies; from there each pair runs the shared
 * exchange step (p2p.c). A destination too small for what arrives fails this rank's op
 * with OFFLOAD_ERR_NO_SPACE (needed/available in the completion) and answers every
 * sender with a refused ready, so the senders fail cleanly too, and nobody writes.
 *
 * Placed (OFFLOAD_CMD_F_PLACE, MoE combine): nothing is packed. Every receiver publishes
 * its whole destination table to every source, marked PLACED, and each sender lands its
 * rows at the receiver's rows its list names, after checking every index against the
 * table: the scatter is done by the writes, not by the receiving host.
 */
#include "engine_internal.h"
#include "p2p.h"
#include "signature.h"

struct offload_alltoallv_args *dpa_a2av_args(struct dpa_engine *eng, struct dpa_hal *hal,
					     const struct dpa_op *op)
{
	uint32_t n = eng->teams[op->team_id].size;
	struct offload_alltoallv_args *a;

	if (op->cmd.aux_addr & 7)  /* misaligned: the DPA's loads would fault */
		return NULL;
	/* The header says how long the arrays are: they must be the team's (indexing goes by
	 * the team's size only, never by this host-written word). */
	a = dpa_hal_aux_ptr(hal, op->cmd.aux_key, op->cmd.aux_addr, sizeof(*a));
	if (!a || off_read_once(&a->nranks) != n)
		return NULL;
	return dpa_hal_aux_ptr(hal, op->cmd.aux_key, op->cmd.aux_addr, offload_a2av_args_bytes(n));
}

static const struct offload_alltoallv_args *args_of(struct dpa_engine *eng, struct dpa_hal *hal,
						    const struct dpa_op *op)
{
	return dpa_a2av_args(eng, hal, op);
}

/* A row list of nrows uint32 entries in the registered argument block, or NULL. */
static const uint32_t *row_list(struct dpa_hal *hal, const struct dpa_op *op, uint64_t addr,
				uint64_t nrows)
{
	uint64_t len;

	if ((addr & 3) || __builtin_mul_overflow(nrows, sizeof(uint32_t), &len))
		return NULL;
	return dpa_hal_aux_ptr(hal, op->cmd.aux_key, addr, len);
}

/* Rows and place modes: every block a whole number of rows; every gathered row index
 * inside src (placed ones are checked against each receiver's table when its ready
 * arrives). */
static int check_rows(struct dpa_hal *hal, const struct dpa_op *op,
		      const struct offload_alltoallv_args *args, struct dpa_vlayout *v,
		      uint64_t total, uint32_t n)
{
	uint64_t row_bytes = args->row_bytes, nrows, table_rows;
	const uint32_t *rows = NULL, *place = NULL;
	int has_rows = !!(op->cmd.flags & OFFLOAD_CMD_F_ROWS);

	if (!row_bytes || total % row_bytes)
		return 0;
	nrows = total / row_bytes;
	if (op->cmd.flags & OFFLOAD_CMD_F_ROWS) {
		table_rows = op->cmd.count / row_bytes;
		rows = row_list(hal, op, args->rows_addr, nrows);
		if (nrows && !rows)
			return 0;
		for (uint64_t k = 0; k < nrows; k++)
			if (rows[k] >= table_rows)
				return 0;
	} else if (total > op->cmd.count) {  /* rows read in order: they must fit in src */
		return 0;
	}
	if (op->cmd.flags & OFFLOAD_CMD_F_PLACE) {
		place = row_list(hal, op, args->place_addr, nrows);
		if (nrows && !place)
			return 0;
	}
	for (uint32_t p = 0; p < n; p++)  /* the team's entries: the rest are not read */
		if (args->bytes[p] % row_bytes)  /* send[p] */
			return 0;
	/* The lists stay in host memory: kept by address, each item reads its part where it
	 * sends (an aux pointer lives for one pass, on one thread: dpa_hal.h). */
	v->rows_addr = has_rows && rows ? args->rows_addr : 0;
	v->place_addr = place ? args->place_addr : 0;
	v->row_bytes = row_bytes;
	return 1;
}

/* Validate the sends against src and fill v's send side; 0 if the command is malformed. */
static int plan_sends(struct dpa_hal *hal, const struct dpa_op *op,
		      const struct offload_alltoallv_args *args, struct dpa_vlayout *v, uint32_t n)
{
	uint64_t off = 0;

	if (!args || (op->cmd.flags & ~(OFFLOAD_CMD_F_EXPECT | OFFLOAD_CMD_F_ROWS |
					 OFFLOAD_CMD_F_PLACE)))
		return 0;
	/* Re-check what crosses the boundary: the sends must fit in src. */
	for (uint32_t p = 0; p < n; p++) {
		v->send_len[p] = args->bytes[p];  /* send[p] */
		v->send_off[p] = off;
		if (__builtin_add_overflow(off, v->send_len[p], &off))
			return 0;
	}
	if (off && !op->cmd.src_addr)
		return 0;
	if (op->cmd.flags & (OFFLOAD_CMD_F_ROWS | OFFLOAD_CMD_F_PLACE))
		return check_rows(hal, op, args, v, off, n);
	return off <= op->cmd.count;
}

static int a2av_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_vlayout *v = &eng->vlayouts[op->index];
	uint32_t n = team->size, me = team->my_rank;

	v->rows_addr = v->place_addr = 0;
	v->row_bytes = 0;
	if (!plan_sends(hal, op, args_of(eng, hal, op), v, n)) {
		/* Refused: announce zero bytes to everyone, so the peers still lay out. */
		for (uint32_t p = 0; p < n; p++)
			v->send_len[p] = v->send_off[p] = 0;
		v->rows_addr = v->place_addr = 0;
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	}
	op->alg.v = v;
	op->alg.layout_done = 0;
	op->alg.layout_scan = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t dst = (me + i) % n;

		if (dpa_publish_count(eng, op, hal, dst, v->send_len[dst]) == DPA_HAL_EAGAIN)
			break;
		op->items[i].flags |= DPA_ITEM_COUNT_OUT;
	}
	return (int)n;
}

/* Lay out the destination once every source's count is in; returns 1 when done. */
static int try_layout(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct offload_alltoallv_args *args = dpa_a2av_args(eng, hal, op);
	uint64_t *recv = args ? args->bytes + team->size : NULL;
	const uint64_t *expect = args ? args->bytes + 2ull * team->size : NULL;
	struct dpa_vlayout *v = op->alg.v;
	uint64_t total = 0;
	int32_t st = OFFLOAD_OK;
	uint32_t mismatch = team->size;  /* the first source whose count recv_counts denies */

	/* Pairs with the layouter's release store below: v and the op's results are final. */
	if (off_load_acquire(&op->alg.layout_done))
		return 1;
	if (!off_trylock(&op->alg.layout_lock))
		return 0;
	/* Look again under the lock: a sibling may have laid out and unlocked since the look
	 * above, and its items already publish readies from v. Laying out twice would rewrite
	 * v under their reads and overwrite a count mismatch's result0/result1. The layouter
	 * stored layout_done before its unlock, which our trylock's acquire pairs with. */
	if (off_read_once(&op->alg.layout_done)) {
		off_unlock(&op->alg.layout_lock);
		return 1;
	}
	/* Resume where the last look stopped: a count, once in, stays for the op, and a gone
	 * peer stays gone, so each source is passed once per op (not once per pass and item). */
	for (uint32_t s = op->alg.layout_scan; s < team->size; s++, op->alg.layout_scan = s) {
		/* Pairs with the sender's seq write, which follows the byte count. Every member
		 * runs this very op (the gate judged its signature), so the count comes, or its
		 * sender is gone: then it counts as nothing (the op fails naming it). */
		if (off_load_acquire(&dpa_my_count(eng, hal, op->team_id, op->slot, s)->seq) == op->seq ||
		    (s != team->my_rank && dpa_peer_gone(eng, op, hal, team->peers[s].world_rank)))
			continue;
		off_unlock(&op->alg.layout_lock);
		return 0;
	}
	for (uint32_t s = 0; s < team->size; s++) {
		const struct offload_count *c = dpa_my_count(eng, hal, op->team_id, op->slot, s);
		int counted = off_load_acquire(&c->seq) == op->seq;

		v->recv_len[s] = counted ? c->bytes : 0;
		v->recv_off[s] = total;
		if (__builtin_add_overflow(total, v->recv_len[s], &total))
			st = OFFLOAD_ERR_INVALID;
		if (!args)  /* a refused command may have no args to report into */
			continue;
		recv[s] = v->recv_len[s];
		if ((op->cmd.flags & OFFLOAD_CMD_F_EXPECT) && expect[s] != v->recv_len[s] &&
		    mismatch == team->size)
			mismatch = s;
	}
	/* A count recv_counts denies is the cause of a too-small destination, if both. Placed
	 * rows are not packed: each sender checks its indices against the table instead. */
	if (!st && mismatch == team->size && !(op->cmd.flags & OFFLOAD_CMD_F_PLACE) &&
	    (total > op->cmd.dst_len || (total && !op->cmd.dst_addr)))
		st = OFFLOAD_ERR_NO_SPACE;
	op->result0 = total;
	op->result1 = op->cmd.dst_len;
	if (!st && mismatch < team->size && !op->refuse) {
		/* Name the source and both counts: the user's split sizes disagree with it. */
		op->result0 = v->recv_len[mismatch];
		op->result1 = expect[mismatch];
		dpa_op_fail(op, OFFLOAD_ERR_COUNT_MISMATCH, team->peers[mismatch].world_rank);
		op->refuse = 1;
	} else if (st && !op->refuse) {
		dpa_op_refuse(eng, op, st);
	}
	off_store_release(&op->alg.layout_done, 1);
	off_unlock(&op->alg.layout_lock);
	dpa_hal_notify(hal);  /* sibling threads publish their readies now */
	return 1;
}

static int a2av_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	struct dpa_vlayout *v = op->alg.v;
	uint32_t n = team->size, me = team->my_rank;
	uint32_t src = (me + n - i) % n, dst = (me + i) % n;
	int work = 0;

	if (!(it->flags & DPA_ITEM_STARTED)) {
		dpa_expect_done(eng, op, it, src);
		it->flags |= DPA_ITEM_STARTED;
	}
	if (!(it->flags & DPA_ITEM_COUNT_OUT)) {
		if (dpa_publish_count(eng, op, hal, dst, v->send_len[dst]) == DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_COUNT_OUT;
		work++;
	}
	if (!(it->flags & DPA_ITEM_READY_OUT)) {
		int placed = !!(op->cmd.flags & OFFLOAD_CMD_F_PLACE);

		if (!try_layout(eng, op, hal))
			return work;
		if (dpa_publish_ready(eng, op, hal, src,
				      op->cmd.dst_addr + (placed ? 0 : v->recv_off[src]),
				      op->refuse ? 0 : placed ? op->cmd.dst_len : v->recv_len[src],
				      op->refuse ? OFFLOAD_READY_REFUSED :
				      placed ? OFFLOAD_READY_PLACED : 0) == DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_READY_OUT;
		work++;
	}
	struct dpa_send send = { .addr = op->cmd.src_addr + v->send_off[dst], .len = v->send_len[dst],
				 .placed = !!(op->cmd.flags & OFFLOAD_CMD_F_PLACE) };

	if (v->row_bytes) {
		/* send_off counts bytes of src, or (rows) rows of the list in bytes' units */
		uint64_t first = v->send_off[dst] / v->row_bytes;
		uint64_t nrows = v->send_len[dst] / v->row_bytes;

		send.row_bytes = v->row_bytes;
		if (v->place_addr)
			send.place = row_list(hal, op, v->place_addr + first * sizeof(uint32_t), nrows);
		if (v->rows_addr) {
			send.addr = op->cmd.src_addr;
			send.rows = row_list(hal, op, v->rows_addr + first * sizeof(uint32_t), nrows);
		}
		/* Checked at start: a list gone now was deregistered under the op. */
		if (nrows && ((v->place_addr && !send.place) || (v->rows_addr && !send.rows))) {
			dpa_op_abort(eng, hal, op, OFFLOAD_ERR_INVALID, eng->params.world_rank);
			return work;
		}
	}
	return work + dpa_exchange_step(eng, op, i, hal, &send);
}

/* Fixed slots, no count round (alltoallv_slots.c), when every rank asks for them. */
static const struct dpa_algo *a2av_select(const struct dpa_engine_params *p,
					  const struct offload_cmd *cmd, uint32_t team_size)
{
	(void)p;
	(void)team_size;
	if (cmd->flags & OFFLOAD_CMD_F_SLOTS)
		return &dpa_algo_alltoallv_slots;
	return &dpa_algo_alltoallv;
}

/* At most the whole source goes out (count: its bytes), whatever the split. */
uint64_t dpa_alltoallv_bytes_sent(const struct dpa_op *op, uint32_t team_size)
{
	(void)team_size;
	return op->cmd.count;
}

const struct dpa_algo dpa_algo_alltoallv = {
	.select = a2av_select,
	.start = a2av_start,
	.progress = a2av_progress,
	.bytes_sent = dpa_alltoallv_bytes_sent,
};

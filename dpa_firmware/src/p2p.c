/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The point-to-point step shared by the exchange algorithms (all-to-all, all-to-all-v):
 * the receiver publishes "ready" (where to write) into the sender's control region; the
 * sender waits for it, writes its block in chunk_size pieces, then adds to the receiver's
 * done counter; the receiver waits for that signal. A sender never writes before the
 * receiver published ready for this very op.
 */
#include "engine_internal.h"
#include "p2p.h"

/*
 * Write a control descriptor into a peer's control region: the body, then its seq word.
 * Writes on one QP land in order, so a reader that sees this op's seq sees the body.
 */
int dpa_post_sequenced(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t peer_rank, uint64_t off, const void *body, uint32_t len,
		       uint32_t seq_off, uint32_t kind)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	const struct offload_peer *peer = &team->peers[peer_rank];
	struct dpa_ctrl_msg m = {
		.wr_id = dpa_wr_id(op, peer_rank, kind),
		.raddr = dpa_peer_ctrl_addr(team, peer_rank, off),
		.value = op->seq, .peer = peer->world_rank, .rkey = peer->ctrl_key,
		.kind = kind, .len = len, .seq_off = seq_off,
	};
	int rc;

	__builtin_memcpy(m.body, body, len);
	rc = dpa_ctrl_post(eng, hal, &m);
	if (rc == OFFLOAD_ERR_LINK_DOWN)
		dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, peer->world_rank);
	else if (rc && rc != DPA_HAL_EAGAIN)
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, peer->world_rank);
	return rc == DPA_HAL_EAGAIN ? rc : 0;
}

int dpa_publish_ready(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t src, uint64_t addr, uint64_t len, uint32_t flags)
{
	return dpa_publish_region(eng, op, hal, src, addr, len, op->cmd.dst_key, flags);
}

/* Our ready descriptor in peer's control region, posted as a control word of `kind`. */
static int post_ready(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t peer, const struct offload_ready *ready, uint32_t kind)
{
	uint32_t me = eng->teams[op->team_id].my_rank;

	return dpa_post_sequenced(eng, op, hal, peer, dpa_ctrl_ready_off(eng, op->team_id, op->slot, me),
				  ready, offsetof(struct offload_ready, seq),
				  offsetof(struct offload_ready, seq), kind);
}

int dpa_publish_region(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t peer, uint64_t addr, uint64_t len, uint32_t key, uint32_t flags)
{
	struct offload_ready ready = { .addr = addr, .len = len, .key = key, .flags = flags };

	return post_ready(eng, op, hal, peer, &ready, DPA_WR_READY);
}

int dpa_withdraw_region(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint32_t peer, uint64_t addr, uint64_t len, uint32_t key)
{
	struct offload_ready ready = {
		.addr = addr, .len = len, .key = key, .flags = OFFLOAD_READY_WITHDRAWN,
	};

	return post_ready(eng, op, hal, peer, &ready, DPA_WR_WITHDRAW);
}

int dpa_publish_count(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t dst, uint64_t bytes)
{
	uint32_t me = eng->teams[op->team_id].my_rank;

	return dpa_post_sequenced(eng, op, hal, dst, dpa_ctrl_count_off(eng, op->team_id, op->slot, me),
				  &bytes, sizeof(bytes), offsetof(struct offload_count, seq),
				  DPA_WR_COUNT);
}

int dpa_item_begin(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		   dpa_publish_fn publish)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t src = (team->my_rank + team->size - i) % team->size;

	if (!(it->flags & DPA_ITEM_STARTED)) {
		dpa_expect_done(eng, op, it, src);
		it->flags |= DPA_ITEM_STARTED;
	}
	if (it->flags & DPA_ITEM_READY_OUT)
		return 0;
	if (publish(eng, op, hal, src) == DPA_HAL_EAGAIN)
		return -1;
	it->flags |= DPA_ITEM_READY_OUT;
	return 1;
}

/* The receiver's ready fits what we send: the same mode (counted, fixed, slot, placed), the
 * exact size, a slot large enough, or a table holding every row index of ours. */
static int ready_fits(const struct offload_ready *r, const struct dpa_send *send)
{
	uint32_t mode = send->placed ? OFFLOAD_READY_PLACED : send->slot ? OFFLOAD_READY_SLOT :
			send->fixed ? OFFLOAD_READY_FIXED : 0;
	uint64_t table_rows, nrows;

	if ((r->flags & (OFFLOAD_READY_PLACED | OFFLOAD_READY_SLOT | OFFLOAD_READY_FIXED)) != mode)
		return 0;
	if (!send->placed)
		return send->slot ? r->len >= send->len : r->len == send->len;
	/* A placing sender that refused its own plan has no row size to judge by. */
	if (!send->row_bytes)
		return 0;
	table_rows = r->len / send->row_bytes;
	nrows = send->len / send->row_bytes;
	for (uint64_t k = 0; k < nrows; k++)
		if (send->place[k] >= table_rows)
			return 0;
	return 1;
}

/* Returns 1 once the destination's ready for this op was seen (and judged). */
static int take_ready(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      struct dpa_item *it, uint32_t dst, const struct dpa_send *send)
{
	uint64_t send_len = send->len;

	struct offload_ready *r = dpa_my_ready(eng, hal, op->team_id, op->slot, dst);
	uint32_t dst_world;

	/* Pairs with the receiver's seq write, which follows the body on the same QP. The
	 * peer table is read only once the ready is in: a pass polls many readies. */
	if (off_load_acquire(&r->seq) != op->seq)
		return 0;
	dst_world = eng->teams[op->team_id].peers[dst].world_rank;
	it->raddr = r->addr;
	it->rkey = r->key;
	if (r->flags & OFFLOAD_READY_REFUSED)
		dpa_op_fail(op, OFFLOAD_ERR_PEER_OP, dst_world);
	else if (!ready_fits(r, send))
		/* The ranks disagree on the block size or mode, the block overflows the slot,
		 * or a placed row falls outside the receiver's table. */
		dpa_op_fail(op, OFFLOAD_ERR_INVALID, dst_world);
	else
		return 1;
	/* Move nothing; the done signal tells the receiver. */
	it->flags |= DPA_ITEM_FAILED;
	it->posted = send_len;
	return 1;
}

/* One write of up to chunk_size bytes from a contiguous block; returns its length. */
static uint64_t post_range(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			   const struct dpa_item *it, uint32_t i, uint32_t peer,
			   const struct dpa_send *send, int *rc)
{
	uint64_t left = send->len - it->posted;
	uint64_t piece = left < eng->params.chunk_size ? left : eng->params.chunk_size;

	*rc = dpa_hal_rdma_write(hal, peer, send->addr + it->posted, op->cmd.src_key,
				 it->raddr + it->posted, it->rkey, piece, dpa_wr_id(op, i, DPA_WR_DATA));
	return piece;
}

/*
 * One write of the next rows: read from src rows by index (rows) or in order, landing at
 * the receiver's rows by index (place) or in order. Adjacent rows merge into one piece,
 * up to DPA_HAL_MAX_SGE pieces and chunk_size bytes, at least one row; a write ends where
 * the receiver's rows stop being consecutive. Returns its length.
 */
static uint64_t post_rows(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			  const struct dpa_item *it, uint32_t i, uint32_t peer,
			  const struct dpa_send *send, int *rc)
{
	struct dpa_hal_sge sge[DPA_HAL_MAX_SGE];
	uint64_t rb = send->row_bytes, k = it->posted / rb, nrows = send->len / rb;
	uint64_t raddr = send->place ? it->raddr + (uint64_t)send->place[k] * rb :
				       it->raddr + it->posted;
	uint64_t bytes = 0;
	uint32_t n = 0;

	for (; k < nrows && (bytes == 0 || bytes + rb <= eng->params.chunk_size); k++) {
		uint64_t addr = send->addr + (send->rows ? (uint64_t)send->rows[k] : k) * rb;

		if (bytes && send->place && it->raddr + (uint64_t)send->place[k] * rb != raddr + bytes)
			break;
		if (n && sge[n - 1].addr + sge[n - 1].len == addr) {
			sge[n - 1].len += rb;
		} else {
			if (n == DPA_HAL_MAX_SGE)
				break;
			sge[n++] = (struct dpa_hal_sge){ .addr = addr, .len = rb };
		}
		bytes += rb;
	}
	*rc = dpa_hal_rdma_write_sg(hal, peer, sge, n, op->cmd.src_key, raddr, it->rkey,
				    dpa_wr_id(op, i, DPA_WR_DATA));
	return bytes;
}

static int put_chunks(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      struct dpa_item *it, uint32_t i, uint32_t dst, const struct dpa_send *send)
{
	uint32_t peer;
	int posted = 0;

	/* Sent, waiting for its completions: the common case of a pass, decided before the
	 * peer table is read. */
	if (!(it->flags & DPA_ITEM_RESEND) && it->posted >= send->len)
		return 0;
	peer = eng->teams[op->team_id].peers[dst].world_rank;
	if (it->flags & DPA_ITEM_RESEND) {
		if (it->inflight)
			return 0;  /* the failed rail flushes what it still holds first */
		dpa_stats(hal)->resent_bytes += it->posted - it->acked;
		it->posted = it->acked;
		it->flags &= ~DPA_ITEM_RESEND;
	}
	if (it->posted < send->len) {
		uint32_t rail = dpa_item_rail(eng, hal, it, peer);

		if (rail == DPA_NO_RAIL) {
			dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, peer);
			return 0;
		}
		if (rail == DPA_RAIL_WAIT)
			return 0;
	}
	while (it->posted < send->len && posted < (int)eng->params.chunks_per_pass) {
		int rc;
		uint64_t len = send->rows || send->place ?
			       post_rows(eng, op, hal, it, i, peer, send, &rc) :
			       post_range(eng, op, hal, it, i, peer, send, &rc);

		if (rc == DPA_HAL_EAGAIN)
			break;
		if (rc) {
			dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, peer);
			it->flags |= DPA_ITEM_FAILED;
			it->posted = send->len;
			break;
		}
		it->posted += len;
		it->inflight++;
		posted++;
	}
	return posted;
}

int dpa_exchange_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		      const struct dpa_send *send)
{
	uint64_t send_len = send->len;
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	uint32_t n = team->size, me = team->my_rank;
	uint32_t src = (me + n - i) % n, dst = (me + i) % n;
	int work = 0;

	if (!(it->flags & DPA_ITEM_READY_IN) && take_ready(eng, op, hal, it, dst, send)) {
		it->flags |= DPA_ITEM_READY_IN;
		if (op->refuse) {  /* our op failed: send nothing, tell the peer */
			it->flags |= DPA_ITEM_FAILED;
			it->posted = send_len;
		}
		work++;
	} else if (!(it->flags & DPA_ITEM_READY_IN) &&
		   dpa_peer_gone(eng, op, hal, team->peers[dst].world_rank)) {
		it->flags |= DPA_ITEM_READY_IN | DPA_ITEM_FAILED;
		it->posted = send_len;
		work++;
	}
	if ((it->flags & DPA_ITEM_READY_IN) && !send->hold) {
		work += put_chunks(eng, op, hal, it, i, dst, send);
		/* Every piece completed (a failed one too): tell the receiver how it went, in a
		 * slot with the byte count first (same QP: it lands before the signal). */
		if (send->slot && !(it->flags & DPA_ITEM_COUNT_OUT) && it->inflight == 0 &&
		    it->posted >= send_len &&
		    dpa_publish_count(eng, op, hal, dst, it->flags & DPA_ITEM_FAILED ? 0 : send_len) !=
		    DPA_HAL_EAGAIN)
			it->flags |= DPA_ITEM_COUNT_OUT;
		if (!(it->flags & DPA_ITEM_SIGNALED) && it->inflight == 0 && it->posted >= send_len &&
		    (!send->slot || (it->flags & DPA_ITEM_COUNT_OUT)) &&
		    dpa_signal_done(eng, op, hal, dst, !!(it->flags & DPA_ITEM_FAILED)) != DPA_HAL_EAGAIN) {
			it->flags |= DPA_ITEM_SIGNALED;
			work++;
		}
	}
	if (!(it->flags & DPA_ITEM_RECVD) && !send->recv_later &&
	    (dpa_check_done(eng, op, hal, it, src) ||
					       dpa_peer_gone(eng, op, hal, team->peers[src].world_rank))) {
		it->flags |= DPA_ITEM_RECVD;
		work++;
	}
	if ((it->flags & DPA_ITEM_READY_OUT) && (it->flags & DPA_ITEM_SIGNALED) &&
	    (it->flags & DPA_ITEM_RECVD))
		it->flags |= DPA_ITEM_FINISHED;
	return work;
}

int dpa_signal_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		    uint32_t peer, int error)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_ctrl_msg m = {
		.wr_id = dpa_wr_id(op, peer, DPA_WR_SIGNAL),
		.raddr = dpa_peer_ctrl_addr(team, peer,
					    dpa_ctrl_done_off(eng, op->team_id, op->slot, team->my_rank)),
		.value = error ? OFFLOAD_SIGNAL_ERROR : OFFLOAD_SIGNAL_OK,
		.peer = team->peers[peer].world_rank, .rkey = team->peers[peer].ctrl_key,
		.kind = DPA_WR_SIGNAL,
	};
	int rc = dpa_ctrl_post(eng, hal, &m);

	if (rc == 0)
		dpa_stats(hal)->signals++;
	else if (rc == OFFLOAD_ERR_LINK_DOWN)
		dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, m.peer);
	else if (rc != DPA_HAL_EAGAIN)
		dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, m.peer);
	return rc == DPA_HAL_EAGAIN ? rc : 0;
}

int dpa_peer_gone(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		  uint32_t world_rank)
{
	uint64_t fail = off_load_acquire(&op->fail);
	int32_t st = (int32_t)(uint32_t)fail;

	if (dpa_rank_failed(eng, world_rank)) {
		dpa_op_fail(op, OFFLOAD_ERR_PEER, world_rank);
		return 1;
	}
	/* Closed as this thread saw it at the start of its pass: a closing peer's words land
	 * before its close shows, so the caller's look for the word, made since, was final. */
	if (dpa_rank_closed(eng, hal, world_rank)) {
		dpa_op_fail(op, OFFLOAD_ERR_PEER_CLOSED, world_rank);
		return 1;
	}
	return fail && (uint32_t)(fail >> 32) == world_rank &&
	       (st == OFFLOAD_ERR_PEER || st == OFFLOAD_ERR_REMOTE_ACCESS ||
		st == OFFLOAD_ERR_PEER_CLOSED);
}

void dpa_expect_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_item *it, uint32_t src)
{
	struct dpa_team *team = &eng->teams[op->team_id];

	it->expect_lo = ++team->expect_lo[op->slot][src];
	it->errs_seen = team->errs_seen[op->slot][src];
}

int dpa_check_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		   struct dpa_item *it, uint32_t src)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	/* Pairs with the peer's signal add, which follows its data writes on the same QP. */
	uint64_t v = off_load_acquire(dpa_my_done(eng, hal, op->team_id, op->slot, src));
	uint32_t lo = (uint32_t)v, errs = (uint32_t)(v >> 32);

	if ((int32_t)(lo - it->expect_lo) < 0)
		return 0;
	if (errs != it->errs_seen) {
		team->errs_seen[op->slot][src] = errs;
		dpa_op_fail(op, OFFLOAD_ERR_PEER_OP, team->peers[src].world_rank);
	}
	return 1;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Multi-rail failover. Every post to a peer goes out on the first rail to that peer not
 * known to be down. A rail fails by completing work with OFFLOAD_ERR_LINK_DOWN; from then
 * on the peer's traffic moves to the next rail:
 *  - data: the item rewinds to the bytes acknowledged so far (completions on one queue
 *    arrive in order, so they are a prefix) and writes the rest again (p2p.c);
 *  - control words (ready, count, done signal): each is kept in a small per-thread log
 *    until its completions arrive, and posted again if the rail dropped it.
 * With no rail left to the peer, the op aborts with OFFLOAD_ERR_LINK_DOWN naming it.
 */
#include "engine_internal.h"
#include "rails.h"

static uint32_t first_up_rail(const struct dpa_engine *eng, struct dpa_hal *hal, uint32_t peer)
{
	uint32_t down = off_load_acquire(&eng->rails_down[peer]);
	uint32_t n = dpa_hal_num_rails(hal);

	for (uint32_t r = 0; r < n && r < DPA_MAX_RAILS; r++)
		if (!(down & (1u << r)))
			return r;
	return DPA_NO_RAIL;
}

uint32_t dpa_rail_select(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t peer)
{
	uint32_t r;

	/* No rail to the peer ever failed: the HAL is on rail 0 (dpa_hal.h), nothing to set.
	 * Rails only fail, so from the first failure on each post sets its rail (a field
	 * store in every binding) and no per-thread cache of the rails set (T x W) is kept. */
	if (!off_load_acquire(&eng->rails_down[peer]))
		return 0;
	r = first_up_rail(eng, hal, peer);
	if (r != DPA_NO_RAIL)
		dpa_hal_set_rail(hal, peer, r);
	return r;
}

uint32_t dpa_item_rail(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_item *it,
		       uint32_t peer)
{
	uint32_t rail = dpa_rail_select(eng, hal, peer);

	if (rail == DPA_NO_RAIL)
		return rail;
	/* Acknowledged bytes are a prefix of what went out on one queue only: data still in
	 * flight on the old rail completes (or fails) before the rest goes on the new one, or
	 * a rewind to `acked` would skip the bytes it carried. */
	if (it->inflight && rail != (it->flags & DPA_ITEM_RAIL_MASK) >> DPA_ITEM_RAIL_SHIFT)
		return DPA_RAIL_WAIT;
	it->flags = (it->flags & ~DPA_ITEM_RAIL_MASK) | (rail << DPA_ITEM_RAIL_SHIFT);
	return rail;
}

void dpa_rail_failed(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t peer, uint32_t rail)
{
	uint32_t bit = 1u << (rail % DPA_MAX_RAILS);

	/* Every queue on the rail reports it; count the failover once. */
	if (!(__atomic_fetch_or(&eng->rails_down[peer], bit, __ATOMIC_SEQ_CST) & bit))
		dpa_stats(hal)->failovers++;
}

_Static_assert(DPA_CTRL_LOG <= 32, "ctrl_busy has one bit per log entry");

static struct dpa_ctrl_msg *log_of(struct dpa_engine *eng, struct dpa_hal *hal)
{
	return eng->ctrl_log[dpa_hal_thread_index(hal)];
}

/* The log's busy word. Only the log's thread writes the log and the word, so plain
 * release stores do: the bit is set before an entry's pending goes nonzero and cleared
 * after it went to 0, and a scan that reads the word misses no entry still pending. Only
 * those two transitions touch it (a completion that leaves words due does not). */
static uint32_t *busy_of(struct dpa_engine *eng, struct dpa_hal *hal)
{
	return &eng->ctrl_busy[dpa_hal_thread_index(hal)];
}

static void set_pending(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_ctrl_msg *m,
			uint8_t pending)
{
	uint32_t *busy = busy_of(eng, hal), bit = 1u << (uint32_t)(m - log_of(eng, hal));

	if (pending && !m->pending)
		off_store_release(busy, off_read_once(busy) | bit);
	__atomic_store_n(&m->pending, pending, __ATOMIC_RELEASE);
	if (!pending)
		off_store_release(busy, off_read_once(busy) & ~bit);
}

/* Completions a logged word's post produces: a signal, or a write of the seq word alone
 * (len 0, e.g. an eager slot's word), is one post; a body and its seq word are two. */
static uint8_t msg_posts(const struct dpa_ctrl_msg *m)
{
	return m->kind == DPA_WR_SIGNAL || !m->len ? 1 : 2;
}

/* Posts m whole. 0: posted, with pending set; or the queue took the body but refused the
 * seq word (m->seq_owed): the body's WQE is counted as in flight and the seq word alone
 * goes later (post_owed_seq), never the body twice. DPA_HAL_EAGAIN: nothing was posted. */
static int post_msg(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_ctrl_msg *m)
{
	uint32_t rail = dpa_rail_select(eng, hal, m->peer);
	int rc;

	if (rail == DPA_NO_RAIL)
		return OFFLOAD_ERR_LINK_DOWN;
	if (m->kind == DPA_WR_SIGNAL)
		rc = dpa_hal_rdma_signal_add(hal, m->peer, m->raddr, m->rkey, m->value, m->wr_id);
	else if (!m->len)
		rc = dpa_hal_rdma_write_inline(hal, m->peer, &m->value, sizeof(m->value),
					       m->raddr + m->seq_off, m->rkey, m->wr_id);
	else {
		/* The body, then the seq word: writes on one queue land in order, so a reader
		 * that sees this op's seq sees the body. */
		rc = dpa_hal_rdma_write_inline(hal, m->peer, m->body, m->len, m->raddr, m->rkey,
					       m->wr_id);
		if (rc)
			return rc;
		m->body_rail = (uint8_t)rail;
		rc = dpa_hal_rdma_write_inline(hal, m->peer, &m->value, sizeof(m->value),
					       m->raddr + m->seq_off, m->rkey, m->wr_id);
		if (rc == DPA_HAL_EAGAIN) {  /* queue full: the body's WQE stays accounted */
			m->seq_owed = 1;
			rc = 0;
		}
	}
	if (rc == 0)  /* release: dpa_ctrl_pending() on other threads reads wr_id after it */
		set_pending(eng, hal, m, msg_posts(m));
	return rc;
}

/* The seq word of a body already posted. It must land after the body: on the body's rail,
 * or on another once the body is acknowledged (pending counts the owed word alone). */
static int post_owed_seq(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_ctrl_msg *m)
{
	uint32_t rail = dpa_rail_select(eng, hal, m->peer);
	int body_acked = m->pending == 1;
	int rc;

	if (rail == DPA_NO_RAIL)
		return body_acked ? OFFLOAD_ERR_LINK_DOWN : DPA_HAL_EAGAIN;
	if (rail != m->body_rail && !body_acked)
		return DPA_HAL_EAGAIN;  /* the body's completion on the old rail decides */
	rc = dpa_hal_rdma_write_inline(hal, m->peer, &m->value, sizeof(m->value),
				       m->raddr + m->seq_off, m->rkey, m->wr_id);
	if (rc == 0)
		m->seq_owed = 0;
	return rc;
}

int dpa_ctrl_post(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_ctrl_msg *msg)
{
	uint32_t free = ~off_read_once(busy_of(eng, hal));
	struct dpa_ctrl_msg *m;
	int rc;

	if (DPA_CTRL_LOG < 32)
		free &= (1u << (DPA_CTRL_LOG % 32)) - 1;
	if (!free)
		return DPA_HAL_EAGAIN;  /* older control words not acknowledged yet */
	m = &log_of(eng, hal)[__builtin_ctz(free)];
	/* Field by field: other threads read wr_id (dpa_ctrl_pending) while we refill. */
	m->raddr = msg->raddr;
	m->value = msg->value;
	m->peer = msg->peer;
	m->rkey = msg->rkey;
	m->kind = msg->kind;
	m->len = msg->len;
	m->seq_off = msg->seq_off;
	m->resend = 0;
	m->seq_owed = 0;
	__builtin_memcpy(m->body, msg->body, sizeof(m->body));
	__atomic_store_n(&m->wr_id, msg->wr_id, __ATOMIC_RELAXED);
	rc = post_msg(eng, hal, m);
	if (rc == 0 && m->seq_owed)  /* dpa_ctrl_resend() finishes it */
		eng->ctrl_resends[dpa_hal_thread_index(hal)]++;
	return rc;
}

/* A control word's completion: forget it, or mark it for resending. Returns 1 if the
 * wr_id was a logged control word. */
int dpa_ctrl_completed(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_hal_cqe *c)
{
	struct dpa_ctrl_msg *log = log_of(eng, hal);

	for (uint32_t busy = off_read_once(busy_of(eng, hal)); busy; busy &= busy - 1) {
		struct dpa_ctrl_msg *m = &log[__builtin_ctz(busy)];
		uint8_t left;

		/* An entry waiting to be resent expects no completion. */
		if (!m->pending || m->pending == DPA_CTRL_RESEND || m->wr_id != c->wr_id)
			continue;
		if (c->status == OFFLOAD_ERR_LINK_DOWN) {
			dpa_rail_failed(eng, hal, m->peer, c->rail);
			m->resend = 1;
		}
		left = (uint8_t)(m->pending - 1);
		/* Nothing left in flight (an owed seq word is not): resend the word whole if a
		 * rail dropped part of it. An owed word is already counted in ctrl_resends. */
		if (left == m->seq_owed && m->resend) {
			if (!m->seq_owed)
				eng->ctrl_resends[dpa_hal_thread_index(hal)]++;
			m->seq_owed = 0;
			left = (uint8_t)DPA_CTRL_RESEND;
		}
		set_pending(eng, hal, m, left);
		return 1;
	}
	return 0;
}

/* Post again the control words a failed rail dropped; 1 if any went out. A word whose
 * peer has no rail left goes into lost[] (*nlost of them): the caller aborts its op. */
int dpa_ctrl_resend(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_wr_failure *lost,
		    uint32_t *nlost)
{
	struct dpa_ctrl_msg *log = log_of(eng, hal);
	uint32_t *resends = &eng->ctrl_resends[dpa_hal_thread_index(hal)];
	int work = 0;

	/* Called every pass: nothing to look at unless a rail dropped a word. */
	if (!*resends)
		return 0;
	for (uint32_t busy = off_read_once(busy_of(eng, hal)); busy && *resends; busy &= busy - 1) {
		struct dpa_ctrl_msg *m = &log[__builtin_ctz(busy)];
		int rc;

		if (m->pending == DPA_CTRL_RESEND) {
			m->resend = 0;
			rc = post_msg(eng, hal, m);
		} else if (m->pending && m->seq_owed && !m->resend) {
			rc = post_owed_seq(eng, hal, m);
		} else {
			continue;
		}
		if (rc == DPA_HAL_EAGAIN)
			continue;
		if (rc == 0) {
			if (!m->seq_owed)
				(*resends)--;
			work++;
			continue;
		}
		(*resends)--;
		m->seq_owed = 0;
		lost[(*nlost)++] = (struct dpa_wr_failure){ .wr_id = m->wr_id, .peer = m->peer };
		set_pending(eng, hal, m, 0);
	}
	return work;
}

/* Does any thread still owe a control word whose wr_id, masked, is `want`? */
static int log_owes(struct dpa_engine *eng, uint64_t mask, uint64_t want)
{
	for (uint32_t t = 0; t < eng->params.num_threads; t++)
		for (uint32_t busy = __atomic_load_n(&eng->ctrl_busy[t], __ATOMIC_SEQ_CST); busy;
		     busy &= busy - 1) {
			const struct dpa_ctrl_msg *m = &eng->ctrl_log[t][__builtin_ctz(busy)];

			if (__atomic_load_n(&m->pending, __ATOMIC_ACQUIRE) &&
			    (__atomic_load_n(&m->wr_id, __ATOMIC_RELAXED) & mask) == want)
				return 1;
		}
	return 0;
}

int dpa_ctrl_word_pending(struct dpa_engine *eng, uint64_t wr_id)
{
	return log_owes(eng, ~0ull, wr_id);
}

int dpa_ctrl_opi_pending(struct dpa_engine *eng, uint32_t opi)
{
	return log_owes(eng, DPA_WR_OP_MASK, dpa_wr_tag(opi, 0, 0, 0));
}

/* Does any thread still owe a control word of this op (not yet acknowledged by the NIC, or
 * waiting to be sent again on another rail)? The op may not complete before: its peers
 * would wait forever for a word whose sender already closed its context. */
int dpa_ctrl_pending(struct dpa_engine *eng, const struct dpa_op *op)
{
	return log_owes(eng, DPA_WR_OPSEQ_MASK, dpa_wr_id(op, 0, 0) & DPA_WR_OPSEQ_MASK);
}

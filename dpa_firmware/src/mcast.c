/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What broadcast and all-gather over multicast share. An owner splits its block into
 * MTU-sized chunks and injects each once into the team's group, immediate
 * {op_seq:8, chunk_id:24}. Receivers post regions where the NIC places each chunk by id,
 * track arrivals in a bitmap (duplicates are counted and ignored; the NIC drops chunks of
 * other ops), and once the owner said it sent everything, wait what the missing bytes
 * would take at the configured link rate, then fetch each missing run with one RDMA READ
 * from the owner's copy. A block is complete when every bit is set.
 *
 * One op at a time per team owns the receive state (regions, bitmap): the next multicast
 * op of the team waits until this one completed, so a late chunk of op k is never placed
 * into op k+1 (the NIC also checks op_seq).
 */
#include "engine_internal.h"
#include "mcast.h"
#include "signature.h"

uint32_t dpa_mcast_chunks(struct dpa_hal *hal, uint64_t len)
{
	uint64_t mtu = dpa_hal_mtu(hal), n;

	if (!mtu)  /* no multicast on this binding */
		return len ? DPA_MCAST_MAX_CHUNKS + 1 : 0;
	n = len / mtu + (len % mtu != 0);

	return n > DPA_MCAST_MAX_CHUNKS ? DPA_MCAST_MAX_CHUNKS + 1 : (uint32_t)n;
}

/* The receive state goes to the team's multicast ops in sequence order: every rank then
 * runs them in the same order (the op table's slots are not in sequence order). */
static int older_multicast_active(struct dpa_engine *eng, const struct dpa_op *op)
{
	const struct dpa_op *ops = &eng->ops[op->team_id * OFFLOAD_OP_WINDOW];

	for (uint32_t s = 0; s < OFFLOAD_OP_WINDOW; s++) {
		const struct dpa_op *o = &ops[s];

		if (o != op && __atomic_load_n(&o->state, __ATOMIC_SEQ_CST) == DPA_OP_ACTIVE &&
		    o->algo->multicast && (int32_t)(o->seq - op->seq) < 0)
			return 1;
	}
	return 0;
}

struct dpa_mcast_state *dpa_mcast_claim(struct dpa_engine *eng, struct dpa_op *op)
{
	struct dpa_mcast_state *st = &eng->mcast[op->team_id];
	uint32_t none = 0, me = op->index + 1;

	if (off_read_once(&st->owner) == me)
		return st;
	if (older_multicast_active(eng, op) || !off_cas(&st->owner, &none, me))
		return NULL;
	return st;
}

static void release(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct dpa_mcast_state *st = &eng->mcast[op->team_id];

	if (off_load_acquire(&st->owner) != op->index + 1)
		return;
	for (uint32_t i = 0; i < st->npending; i++)  /* staged chunks never copied out */
		dpa_hal_mcast_slot_free(hal, op->team_id, st->pending[i].slot);
	st->npending = 0;
	/* No chunk may land in memory the host is about to get back. */
	if (st->posted)
		dpa_hal_mcast_post(hal, op->team_id, 0, NULL, 0);
	st->posted = 0;
	off_store_release(&st->owner, 0);
}

static struct offload_mcast_op_stats *stats_out(struct dpa_hal *hal, const struct dpa_op *op)
{
	if (op->cmd.aux_addr & 7)  /* misaligned: the DPA's stores would fault */
		return NULL;
	return dpa_hal_aux_ptr(hal, op->cmd.aux_key, op->cmd.aux_addr,
			       sizeof(struct offload_mcast_op_stats));
}

/* Item 0's thread, which posted the read, takes its completion: no other writer of the
 * block's flags then (peer items only read them). Bytes count once they landed, so a
 * round read again is not counted twice. */
void dpa_mcast_read_completed(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			      uint32_t owner, const struct dpa_hal_cqe *c)
{
	struct dpa_mcast_block *b;

	if (owner >= eng->teams[op->team_id].size)  /* poll_completions bounds it already */
		return;
	b = &eng->mcast[op->team_id].blocks[owner];

	if (c->status == OFFLOAD_ERR_LINK_DOWN) {
		off_store_release(&b->flags, b->flags | DPA_BLOCK_RESEND);
		return;
	}
	dpa_stats(hal)->refetch_bytes += c->bytes;
	op->alg.mc_stats.refetched_bytes += c->bytes;
}

int dpa_mcast_stats_ok(struct dpa_hal *hal, const struct dpa_op *op)
{
	return !op->cmd.aux_addr || stats_out(hal, op);
}

void dpa_mcast_finish(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct offload_mcast_op_stats *out = op->cmd.aux_addr ? stats_out(hal, op) : NULL;

	release(eng, op, hal);
	if (out)  /* before the completion that says it is there */
		*out = op->alg.mc_stats;
}

int dpa_mcast_post(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		   struct dpa_mcast_state *st, uint32_t complete)
{
	struct dpa_hal_mcast_region *regions = st->regions;  /* [team size], in the arena */
	const struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t n = 0;
	int rc;

	for (uint32_t r = 0; r < team->size; r++) {
		const struct dpa_mcast_block *b = &st->blocks[r];

		if (r == team->my_rank || r == complete || !b->nchunks ||
		    (b->flags & DPA_BLOCK_COMPLETE))
			continue;
		regions[n++] = (struct dpa_hal_mcast_region){ .addr = b->dst, .len = b->len,
			.key = op->cmd.dst_key, .first_chunk = b->first_chunk };
	}
	rc = dpa_hal_mcast_post(hal, op->team_id, op->seq & 0xffu, regions, n);
	if (rc)
		dpa_op_fail(op, OFFLOAD_ERR_REMOTE_ACCESS, team->peers[team->my_rank].world_rank);
	st->posted = 1;
	return rc;
}

/* Inject the next chunks of [src, src+len) with ids from first_chunk on. Returns how many
 * went out (*done once all did): none means the group's credits are used up, and the
 * thread may park until a receiver catches up and wakes it. */
int dpa_mcast_inject(struct dpa_op *op, struct dpa_hal *hal, uint32_t first_chunk,
		     uint64_t src, uint64_t len, int *done)
{
	int sent = 0;

	uint32_t mtu = dpa_hal_mtu(hal), nchunks = dpa_mcast_chunks(hal, len);
	struct offload_thread_stats *stats = dpa_stats(hal);
	struct dpa_item *it = &op->items[0];

	for (uint32_t k = 0; k < DPA_MCAST_SEND_BURST && op->alg.mc_next < nchunks; k++) {
		uint64_t off = (uint64_t)op->alg.mc_next * mtu;
		uint32_t piece = len - off < mtu ? (uint32_t)(len - off) : mtu;
		int rc = dpa_hal_mcast_send(hal, op->team_id, src + off, op->cmd.src_key, piece,
					    DPA_HAL_MCAST_IMM(op->seq, first_chunk + op->alg.mc_next),
					    dpa_wr_id(op, 0, DPA_WR_DATA));

		if (rc == DPA_HAL_EAGAIN)
			break;
		if (rc) {
			dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, 0);
			*done = 1;
			return sent + 1;
		}
		it->inflight++;
		op->alg.mc_next++;
		sent++;
		stats->mcast_chunks_sent++;
		stats->mcast_bytes_sent += piece;
		op->alg.mc_stats.chunks_sent++;
		op->alg.mc_stats.bytes_injected += piece;
	}
	*done = op->alg.mc_next >= nchunks;
	return sent;
}

static struct dpa_mcast_block *block_of(struct dpa_mcast_state *st, const struct dpa_team *team,
					uint32_t id)
{
	uint32_t lo = 0, hi = team->size;  /* the last block starting at or before id: in [lo, hi) */
	struct dpa_mcast_block *b;

	/* Blocks are laid out in team-rank order with nondecreasing first_chunk (an empty one
	 * starts where the next begins), so a chunk's block is a binary search away, not a
	 * scan of the team per chunk. */
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (st->blocks[mid].first_chunk <= id)
			lo = mid;
		else
			hi = mid;
	}
	b = &st->blocks[lo];
	if (!team->size || !b->nchunks || id - b->first_chunk >= b->nchunks || lo == team->my_rank)
		return NULL;
	return b;
}

/* Staged receive: copy chunk id out of its slot to its place in b. 0: it went;
 * DPA_HAL_EAGAIN: our completion queue is full, try again; -1: the slot is ours to give
 * back, and the chunk is read again. The length is checked here: a slot holds whatever
 * datagram arrived. */
static int copy_out(struct dpa_op *op, struct dpa_hal *hal, const struct dpa_mcast_block *b,
		    uint32_t id, const struct dpa_hal_mcast_cqe *c)
{
	uint64_t mtu = dpa_hal_mtu(hal), off = (uint64_t)(id - b->first_chunk) * mtu;
	uint64_t piece = b->len - off < mtu ? b->len - off : mtu;
	int rc;

	if (c->len != piece)
		return -1;
	rc = dpa_hal_mcast_slot_copy(hal, op->team_id, c->slot, b->dst + off, op->cmd.dst_key,
				     c->len, dpa_wr_id(op, 0, DPA_WR_DATA));
	if (rc)
		return rc == DPA_HAL_EAGAIN ? rc : -1;
	op->items[0].inflight++;
	return 0;
}

/* Count the chunks that arrived: placed by id, they are in their block already; staged,
 * each is copied out of its slot, or its slot given back (another op's chunk, a duplicate,
 * a length that does not fit). */
static void place_all(struct dpa_op *op, struct dpa_hal *hal, struct dpa_mcast_state *st,
		      const struct dpa_team *team, const struct dpa_hal_mcast_cqe *cqes, int n,
		      uint32_t staged)
{
	struct offload_thread_stats *stats = dpa_stats(hal);

	for (int i = 0; i < n; i++) {
		uint32_t id = cqes[i].imm & 0xffffffu;
		struct dpa_mcast_block *b = NULL;
		uint64_t bit = 1ull << (id % 64);

		/* A NIC that places by id does so only for our seq and a posted region;
		 * re-check anyway. */
		if (cqes[i].imm >> 24 == (op->seq & 0xffu) && id < DPA_MCAST_MAX_CHUNKS)
			b = block_of(st, team, id);
		if (b && (st->bits[id / 64] & bit)) {
			stats->mcast_dups++;
			op->alg.mc_stats.chunks_duplicated++;
			b = NULL;
		}
		if (staged && b) {
			int rc = copy_out(op, hal, b, id, &cqes[i]);

			if (rc == DPA_HAL_EAGAIN && st->npending < DPA_MCAST_POLL_BATCH) {
				st->pending[st->npending++] = cqes[i];  /* the slot stays ours */
				continue;
			}
			if (rc)
				b = NULL;
		}
		if (staged && !b)
			dpa_hal_mcast_slot_free(hal, op->team_id, cqes[i].slot);
		if (!b)
			continue;
		st->bits[id / 64] |= bit;
		b->got++;
		stats->mcast_chunks_recv++;
		op->alg.mc_stats.chunks_received++;
	}
}

static int poll_arrivals(struct dpa_op *op, struct dpa_hal *hal, struct dpa_mcast_state *st,
			 const struct dpa_team *team)
{
	struct dpa_hal_mcast_cqe cqes[DPA_MCAST_POLL_BATCH];
	uint32_t staged = dpa_hal_mcast_slots(hal) > 0;
	int n = (int)st->npending, got;

	/* Staged chunks whose copy found our completion queue full go first; while some still
	 * wait, nothing new is taken (the NIC's slots hold it, or it drops: an overrun). */
	if (st->npending) {
		__builtin_memcpy(cqes, st->pending, st->npending * sizeof(cqes[0]));
		st->npending = 0;
		place_all(op, hal, st, team, cqes, n, staged);
	}
	/* Drain up to a budget per pass: chunks are small and come in long trains. */
	for (int round = 0; round < DPA_MCAST_POLL_ROUNDS && !st->npending; round++) {
		got = dpa_hal_mcast_poll(hal, op->team_id, cqes, DPA_MCAST_POLL_BATCH);
		n += got;
		place_all(op, hal, st, team, cqes, got, staged);
		if (got < DPA_MCAST_POLL_BATCH)
			break;
	}
	st->drained = n == 0;
	return n;
}


/* The owner's op aborted and took its source back (OFFLOAD_READY_WITHDRAWN): what we read
 * from it since may be the owner's next data. Ours aborts too: the owner acknowledges
 * nothing any more, and the team's sequence is broken on its side. */
static void withdrawn_at(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			 const struct offload_ready *r, uint32_t owner_world)
{
	if (off_load_acquire(&r->seq) != op->seq ||
	    !(off_read_once(&r->flags) & OFFLOAD_READY_WITHDRAWN) ||
	    __atomic_load_n(&op->aborted, __ATOMIC_SEQ_CST))
		return;
	dpa_op_abort(eng, hal, op, OFFLOAD_ERR_PEER_OP, owner_world);
}

static void withdrawn(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t owner, uint32_t owner_world)
{
	withdrawn_at(eng, op, hal, dpa_my_ready(eng, hal, op->team_id, op->slot, owner), owner_world);
}

/* The owner's words in our control region: its source (ready) and its "sent all" (count). */
static void learn_owner(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			struct dpa_mcast_block *b, uint32_t owner, uint32_t owner_world)
{
	const struct offload_ready *r = dpa_my_ready(eng, hal, op->team_id, op->slot, owner);
	const struct offload_count *c = dpa_my_count(eng, hal, op->team_id, op->slot, owner);

	/* Fail now, not at op_timeout. The ready word is looked up once per owner and pass:
	 * item 0 runs this for every owner on every pass, and each look-up is a check. */
	withdrawn_at(eng, op, hal, r, owner_world);
	if (!(b->flags & DPA_BLOCK_HAVE_SRC) && off_load_acquire(&r->seq) == op->seq) {
		if ((r->flags & OFFLOAD_READY_REFUSED) || r->len != b->len)
			dpa_op_fail(op, r->flags & OFFLOAD_READY_REFUSED ? OFFLOAD_ERR_PEER_OP :
				    OFFLOAD_ERR_INVALID, owner_world);
		b->src_addr = r->addr;
		b->src_key = r->key;
		/* Atomic: an all-gather peer item on another thread reads the flags. */
		off_store_release(&b->flags, b->flags | DPA_BLOCK_HAVE_SRC);
	}
	if (!(b->flags & DPA_BLOCK_SENT_ALL) && off_load_acquire(&c->seq) == op->seq) {
		b->sent_all_ns = dpa_hal_time_ns(hal);
		off_store_release(&b->flags, b->flags | DPA_BLOCK_SENT_ALL);
	}
}

static void mark_range(struct dpa_op *op, struct dpa_mcast_state *st, struct dpa_mcast_block *b,
		       uint32_t from, uint32_t to, struct offload_thread_stats *stats)
{
	for (uint32_t c = from; c < to; c++) {
		uint32_t id = b->first_chunk + c;
		uint64_t bit = 1ull << (id % 64);

		if (st->bits[id / 64] & bit)
			continue;
		st->bits[id / 64] |= bit;
		b->got++;
		stats->refetch_chunks++;
		op->alg.mc_stats.chunks_dropped++;
	}
}

/* One round of RDMA READs over the missing runs from b->next on; 1 if any was posted. */
static int refetch_round(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			 struct dpa_mcast_state *st, struct dpa_mcast_block *b, uint32_t owner_world)
{
	struct offload_thread_stats *stats = dpa_stats(hal);
	uint32_t mtu = dpa_hal_mtu(hal), reads = 0, c;

	if (dpa_rail_select(eng, hal, owner_world) == DPA_NO_RAIL) {
		dpa_op_abort(eng, hal, op, OFFLOAD_ERR_LINK_DOWN, owner_world);
		return 0;
	}
	if (b->next >= b->nchunks)
		b->next = 0;
	b->round_start = b->next;
	for (c = b->next; c < b->nchunks && reads < DPA_MCAST_READS;) {
		uint32_t id = b->first_chunk + c, end = c;
		uint64_t off, len;
		int rc;

		if (st->bits[id / 64] & (1ull << (id % 64))) {
			c++;
			continue;
		}
		while (end < b->nchunks && end - c < DPA_MCAST_READ_CHUNKS &&
		       !(st->bits[(b->first_chunk + end) / 64] & (1ull << ((b->first_chunk + end) % 64))))
			end++;
		off = (uint64_t)c * mtu;
		len = (uint64_t)end * mtu < b->len ? (uint64_t)(end - c) * mtu : b->len - off;
		rc = dpa_hal_rdma_read(hal, owner_world, b->dst + off, op->cmd.dst_key,
				       b->src_addr + off, b->src_key, len,
				       dpa_wr_id(op, (uint32_t)(b - st->blocks), DPA_WR_REFETCH));
		if (rc == DPA_HAL_EAGAIN)
			break;
		if (rc) {
			dpa_op_fail(op, OFFLOAD_ERR_INTERNAL, owner_world);
			break;
		}
		op->items[0].inflight++;
		stats->reads++;
		reads++;
		c = end;
	}
	b->next = c;
	return reads > 0;
}

int dpa_mcast_receive(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      struct dpa_mcast_state *st)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it0 = &op->items[0];
	struct offload_thread_stats *stats = dpa_stats(hal);
	uint64_t now = 0;
	int work;

	/* Owners' words first: an owner injects every chunk before it says "sent all", so a
	 * poll after seeing that word finds every chunk that was not lost. */
	for (uint32_t r = 0; r < team->size; r++)
		if (r != team->my_rank && !(st->blocks[r].flags & DPA_BLOCK_COMPLETE))
			learn_owner(eng, op, hal, &st->blocks[r], r, team->peers[r].world_rank);
	work = poll_arrivals(op, hal, st, team);
	for (uint32_t r = 0; r < team->size; r++) {
		struct dpa_mcast_block *b = &st->blocks[r];
		uint32_t world = team->peers[r].world_rank;
		uint64_t missing, grace;

		if (r == team->my_rank || (b->flags & DPA_BLOCK_COMPLETE))
			continue;
		if (b->got >= b->nchunks && it0->inflight == 0 && b->round_start == b->next) {
			/* Every read from the owner's memory (refetch; the emulator's chunks by
			 * reference) is done: had the owner withdrawn its source before any of
			 * them, its flag is visible now. Then the block leaves the posted
			 * regions: nothing may land in it once we acknowledge it. */
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			withdrawn(eng, op, hal, r, world);
			if (__atomic_load_n(&op->aborted, __ATOMIC_SEQ_CST))
				return work + 1;
			if (b->nchunks)
				dpa_mcast_post(eng, op, hal, st, r);
			off_store_release(&b->flags, b->flags | DPA_BLOCK_COMPLETE);
			dpa_hal_notify(hal);  /* all-gather: the owner's item acknowledges it */
			work++;
			continue;
		}
		/* Only after everything was sent, the queue is drained and the missing bytes
		 * had time to arrive at link rate, is a missing chunk lost. */
		if (!(b->flags & DPA_BLOCK_SENT_ALL) || !(b->flags & DPA_BLOCK_HAVE_SRC) ||
		    !st->drained || it0->inflight)
			continue;
		if (b->flags & DPA_BLOCK_RESEND) {  /* a read's rail failed: read the round again */
			off_store_release(&b->flags, b->flags & ~DPA_BLOCK_RESEND);
			b->next = b->round_start;
		} else if (b->round_start != b->next) {  /* the last round's reads all landed */
			mark_range(op, st, b, b->round_start, b->next, stats);
			b->round_start = b->next;
			work++;
			continue;
		}
		if (!now)
			now = dpa_hal_time_ns(hal);
		missing = (uint64_t)(b->nchunks - b->got) * dpa_hal_mtu(hal);
		grace = DPA_MCAST_MIN_GRACE_NS +
			missing * 1000u / (eng->params.link_mbps ? eng->params.link_mbps : 1);
		if (now - b->sent_all_ns < grace) {
			dpa_wake_at(eng, hal, b->sent_all_ns + grace);
			continue;
		}
		work += refetch_round(eng, op, hal, st, b, world);
		if (it0->inflight)
			break;  /* one block's round at a time */
	}
	return work;
}

/* Peer p's descriptor for this op (its ready, or an owner's source) arrived and agrees on
 * the size, or p is gone: 1 (the op failed if not right), 0 while still waiting. */
int dpa_mcast_peer_word(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint32_t p)
{
	const struct offload_ready *r = dpa_my_ready(eng, hal, op->team_id, op->slot, p);
	uint32_t world = eng->teams[op->team_id].peers[p].world_rank;

	if (off_load_acquire(&r->seq) == op->seq) {
		if (r->flags & OFFLOAD_READY_REFUSED)
			dpa_op_fail(op, OFFLOAD_ERR_PEER_OP, world);
		else if (r->len != op->cmd.count)
			dpa_op_fail(op, OFFLOAD_ERR_INVALID, world);
		return 1;
	}
	return dpa_peer_gone(eng, op, hal, world);
}

/*
 * What an owner says to peer p (item i), broadcast root and all-gather alike: our source
 * (once our own regions are posted), p's ready (counted in mc_readies, which injection
 * waits for), "sent all" once we injected. Returns the work done; DPA_ITEM_COUNT_OUT is set
 * once all of it went out.
 */
int dpa_mcast_owner_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal, uint32_t p)
{
	struct dpa_item *it = &op->items[i];
	uint32_t flags = off_load_acquire(&op->alg.mc_flags);
	int work = 0;

	if (!(it->flags & DPA_ITEM_STARTED)) {
		dpa_expect_done(eng, op, it, p);  /* p acknowledges our block */
		it->flags |= DPA_ITEM_STARTED;
	}
	if (!(it->flags & DPA_ITEM_READY_OUT)) {
		if (!(flags & DPA_MC_POSTED) ||
		    dpa_publish_region(eng, op, hal, p, op->cmd.src_addr, op->cmd.count,
				       op->cmd.src_key, op->refuse ? OFFLOAD_READY_REFUSED : 0) ==
		    DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_READY_OUT;
		work++;
	}
	if (!(it->flags & DPA_ITEM_READY_IN)) {
		if (!dpa_mcast_peer_word(eng, op, hal, p))
			return work;
		it->flags |= DPA_ITEM_READY_IN;
		off_fetch_add(&op->alg.mc_readies, 1);
		dpa_hal_notify(hal);  /* item 0 injects once every ready is in */
		work++;
	}
	if (!(it->flags & DPA_ITEM_COUNT_OUT)) {
		if (!(flags & DPA_MC_INJECTED) ||
		    dpa_publish_count(eng, op, hal, p, dpa_mcast_chunks(hal, op->cmd.count)) ==
		    DPA_HAL_EAGAIN)
			return work;
		it->flags |= DPA_ITEM_COUNT_OUT;
		work++;
	}
	return work;
}

int dpa_mcast_withdraw(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t p)
{
	if (dpa_rank_failed(eng, eng->teams[op->team_id].peers[p].world_rank))
		return 0;  /* p is gone: it reads nothing any more */
	/* Our ready to p lands first: a resend of it after the withdrawal would undo it. */
	if (dpa_ctrl_word_pending(eng, dpa_wr_id(op, p, DPA_WR_READY)))
		return DPA_HAL_EAGAIN;
	return dpa_withdraw_region(eng, op, hal, p, op->cmd.src_addr, op->cmd.count,
				   op->cmd.src_key);
}

/* p's acknowledgement of our block (or p is gone): item i finishes. */
int dpa_mcast_take_ack(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
		       struct dpa_hal *hal, uint32_t p)
{
	struct dpa_item *it = &op->items[i];
	uint32_t world = eng->teams[op->team_id].peers[p].world_rank;

	if (!dpa_check_done(eng, op, hal, it, p) && !dpa_peer_gone(eng, op, hal, world)) {
		/* An all-gather peer that aborted acknowledges nothing: abort now, not at
		 * op_timeout (a broadcast receiver never withdraws anything). */
		withdrawn(eng, op, hal, p, world);
		return 0;
	}
	it->flags |= DPA_ITEM_RECVD | DPA_ITEM_FINISHED;
	return 1;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The progress engine: command intake from the ring, the op table, completion routing
 * and the completion ring. Algorithms live one per file and only advance their items.
 *
 * Threads: any thread may take the intake lock (trylock, never waits). Items of an op are
 * striped over threads (item i belongs to thread i % num_threads), so an item's state and
 * its completions are touched by one thread only. An op slot is reused by intake only when
 * its state is FREE and no thread is inside it (users == 0).
 */
#include "engine_internal.h"
#include "rails.h"
#include "signature.h"
#include "reduce.h"

#define DPA_INTAKE_BUDGET 16
#define DPA_POLL_BUDGET   256
/* Rounds of poll + progress a pass adds while its own writes keep completing at once. */
#define DPA_PASS_REPOLLS  3
#define DPA_DEAD_GRACE_NS 200000000ll  /* see check_abort() */
#define DPA_PEER_OP_SETTLE_NS 1000000ull /* see try_complete_op() */

/* The op's bit in eng->active_ops (see there). sole: hal's thread is the engine's only
 * one (no sibling writes the words it counts in: see off_count_down). */
static void op_mask_set(struct dpa_engine *eng, const struct dpa_op *op, int sole)
{
	uint32_t o = (uint32_t)(op - eng->ops);

	off_or_shared(&eng->active_ops[o / 64], 1ull << (o % 64), sole);
}

static void op_mask_clear(struct dpa_engine *eng, const struct dpa_op *op, int sole)
{
	uint32_t o = (uint32_t)(op - eng->ops);

	off_and_shared(&eng->active_ops[o / 64], ~(1ull << (o % 64)), sole);
}

static int sole_thread(struct dpa_hal *hal)
{
	return dpa_hal_num_threads(hal) == 1;
}

static const struct dpa_algo *const dpa_algos[OFFLOAD_OP_MAX] = {
	[OFFLOAD_OP_BARRIER] = &dpa_algo_barrier,
	[OFFLOAD_OP_ALLTOALL] = &dpa_algo_alltoall_pairwise,
	[OFFLOAD_OP_ALLTOALLV] = &dpa_algo_alltoallv,
	[OFFLOAD_OP_BROADCAST] = &dpa_algo_broadcast_mcast,
	[OFFLOAD_OP_ALLGATHER] = &dpa_algo_allgather_mcast,
	[OFFLOAD_OP_REDUCE_SCATTER] = &dpa_algo_reduce_scatter,
	[OFFLOAD_OP_ALLREDUCE] = &dpa_algo_allreduce,
};

static int complete_now(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd,
			int32_t status, uint32_t detail)
{
	return dpa_complete_cmd(eng, hal, cmd, status, detail, 0, 0);
}

static int commands_waiting(struct dpa_hal *hal)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));

	return off_load_acquire(&ring->sq_tail) != off_read_once(&ring->sq_head);
}

static int try_complete_op(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	struct offload_thread_stats *stats = dpa_stats(hal);
	uint64_t fail = off_load_acquire(&op->fail);
	uint32_t dead = fail ? dpa_team_lowest_dead(eng, &eng->teams[op->team_id]) : UINT32_MAX;

	/* An op that failed in a team that lost a member fails because of it, whatever the
	 * first symptom was (a refused write into its revoked memory, a peer's error signal):
	 * every survivor names the same rank. One that finished cleanly had everything it
	 * needed from the dead rank before it died, and succeeds. */
	if (fail && dead != UINT32_MAX)
		fail = ((uint64_t)dead << 32) | (uint32_t)OFFLOAD_ERR_PEER;
	/* A peer's error signal may echo a death that peer saw first: hold the completion
	 * a moment for the death to reach this rank's failed set (the emulator's NIC hands
	 * every rank what any rank saw, at the start of its next pass), so that every
	 * survivor names the dead rank, not the messenger. */
	if ((int32_t)(uint32_t)fail == OFFLOAD_ERR_PEER_OP && dead == UINT32_MAX) {
		uint64_t now = dpa_hal_time_ns(hal) | 1, since = 0;  /* 0 means not yet */

		if (off_cas(&op->peer_op_since, &since, now)) {
			dpa_wake_at(eng, hal, now + DPA_PEER_OP_SETTLE_NS);
			return 0;
		}
		if (now - since < DPA_PEER_OP_SETTLE_NS)
			return 0;
	}
	/* Every control word of the op acknowledged first. An aborted op does not wait (its
	 * peers are gone or failing) unless its algorithm had something to tell them: a
	 * withdrawn multicast source must have landed before the host rewrites it. */
	if ((!__atomic_load_n(&op->aborted, __ATOMIC_SEQ_CST) || op->algo->abort) &&
	    dpa_ctrl_pending(eng, op))
		return 0;
	struct offload_cqe cqe = {
		.tag = op->cmd.tag,
		.status = (int32_t)(uint32_t)fail,
		.detail = (uint32_t)(fail >> 32),
	};

	cqe.result0 = op->result0;
	cqe.result1 = op->result1;
	if (op->algo->finish)  /* before the completion that says the op is over */
		op->algo->finish(eng, op, hal);
	/* Counted before the completion is published (this thread's counters, no other
	 * writer): a host that saw the completion reads counters that include it. Taken back
	 * if the ring was full (the completion is tried again later). */
	stats->ops_completed++;
	stats->errors += cqe.status != OFFLOAD_OK;
	if (!dpa_write_cqe(eng, hal, &cqe)) {
		stats->ops_completed--;
		stats->errors -= cqe.status != OFFLOAD_OK;
		return 0;
	}
	/* A rank lost (dead, or every rail to it down) leaves the team's sequence broken,
	 * whether or not this rank's watch has seen the death yet: later ops fail at intake
	 * with the same error; so does a member that closed its context before joining this
	 * op (it never joins another). (Errors that keep the ranks in step, a refused command or a
	 * destination too small, leave the team usable.) */
	if (cqe.status == OFFLOAD_ERR_PEER || cqe.status == OFFLOAD_ERR_LINK_DOWN ||
	    cqe.status == OFFLOAD_ERR_PEER_CLOSED)
		dpa_team_poison(&eng->teams[op->team_id], cqe.status, cqe.detail);
	op_mask_clear(eng, op, sole_thread(hal));  /* before FREE: intake sets it again */
	__atomic_store_n(&op->state, DPA_OP_FREE, __ATOMIC_SEQ_CST);
	/* A command may be waiting for this slot while the thread holding intake parks. */
	if (commands_waiting(hal))
		dpa_hal_notify(hal);
	if (op->bulk)
		off_count_down(&eng->inflight_bulk, sole_thread(hal));
	off_count_down(&eng->inflight, sole_thread(hal));
	return 1;
}

/* Checks without which there is no team to run on; the algorithm's start() checks the
 * rest and refuses (see intake_one) rather than rejects. */
static int32_t validate_collective(struct dpa_engine *eng, const struct offload_cmd *cmd)
{
	if (cmd->team >= OFFLOAD_MAX_TEAMS || !eng->teams[cmd->team].active)
		return OFFLOAD_ERR_INVALID;
	if (cmd->opcode >= OFFLOAD_OP_MAX || !dpa_algos[cmd->opcode])
		return OFFLOAD_ERR_INVALID;
	return OFFLOAD_OK;
}

/* CANCEL: flag the op that carries the tag; the threads owning its items abort it. */
static int32_t cancel_op(struct dpa_engine *eng, struct dpa_hal *hal, uint64_t target)
{
	for (uint32_t o = 0; o < OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW; o++) {
		struct dpa_op *op = &eng->ops[o];

		/* Slots are (re)filled only under the intake lock, which we hold. */
		if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) == DPA_OP_ACTIVE &&
		    op->cmd.tag == target) {
			struct dpa_team *team = &eng->teams[op->team_id];

			__atomic_store_n(&op->cancel, 1, __ATOMIC_SEQ_CST);
			/* At once, not when the op is next progressed: a command taken right
			 * after this one must already find the team failed. */
			dpa_team_poison(team, OFFLOAD_ERR_CANCELED,
				    team->peers[team->my_rank].world_rank);
			dpa_hal_notify(hal);
			return OFFLOAD_OK;
		}
	}
	return OFFLOAD_ERR_INVALID;  /* no such op in flight: it completed already */
}

/* The algorithm of a collective: the opcode's, or the variant its select hook picks from
 * what every rank of the op has alike (flags, block size), so that all pick the same. */
static const struct dpa_algo *pick_algo(const struct dpa_engine *eng, const struct offload_cmd *cmd)
{
	const struct dpa_algo *algo = dpa_algos[cmd->opcode];

	return algo->select ? algo->select(&eng->params, cmd, eng->teams[cmd->team].size) : algo;
}

/* Returns 1 if the command was consumed, 0 if it must wait for a free op slot. */
static int intake_one(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd)
{
	uint64_t poisoned;
	uint32_t dead;
	struct dpa_team *team;
	struct dpa_op *op;
	uint32_t slot;
	int32_t st;
	int n;

	if (cmd->opcode == OFFLOAD_OP_NOP)
		return complete_now(eng, hal, cmd, OFFLOAD_OK, 0);
	if (cmd->opcode == OFFLOAD_OP_TEAM_CREATE)
		return complete_now(eng, hal, cmd, dpa_team_create(eng, hal, cmd), 0);
	if (cmd->opcode == OFFLOAD_OP_CANCEL)
		return complete_now(eng, hal, cmd, cancel_op(eng, hal, cmd->count), 0);
	if (cmd->opcode == OFFLOAD_OP_AGREE)  /* no op slot, no team sequence: agree_ft.c */
		return dpa_agree_intake(eng, hal, cmd);
	if (cmd->opcode == OFFLOAD_OP_TEAM_DESTROY) {  /* team_destroy.c */
		st = dpa_team_destroy(eng, hal, cmd);
		return st == DPA_TEAM_DESTROY_LATER ? 0 : complete_now(eng, hal, cmd, st, 0);
	}
	st = validate_collective(eng, cmd);
	if (st)
		return complete_now(eng, hal, cmd, st, 0);
	team = &eng->teams[cmd->team];
	dead = dpa_team_lowest_dead(eng, team);
	if (dead != UINT32_MAX)
		dpa_team_poison(team, OFFLOAD_ERR_PEER, dead);
	poisoned = off_load_acquire(&team->poisoned);
	if (poisoned)
		return complete_now(eng, hal, cmd, (int32_t)(uint32_t)poisoned,
				    (uint32_t)(poisoned >> 32));
	slot = team->next_seq % OFFLOAD_OP_WINDOW;
	op = &eng->ops[cmd->team * OFFLOAD_OP_WINDOW + slot];
	if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) != DPA_OP_FREE ||
	    __atomic_load_n(&op->users, __ATOMIC_SEQ_CST) != 0)
		return 0;
	op->cmd = *cmd;
	op->team_id = cmd->team;
	op->slot = slot;
	op->seq = team->next_seq;
	op->fail = 0;
	op->result0 = op->result1 = 0;
	op->refuse = 0;
	op->cancel = 0;
	op->aborted = 0;
	op->dead_since = 0;
	op->peer_op_since = 0;
	for (uint32_t b = 0; b < sizeof(op->alg); b++)  /* every member's bytes, not the first's */
		((uint8_t *)&op->alg)[b] = 0;
	op->deadline_ns = eng->params.op_timeout_ms ?
		dpa_hal_time_ns(hal) + (uint64_t)eng->params.op_timeout_ms * 1000000u : UINT64_MAX;
	op->algo = pick_algo(eng, cmd);
	op->items = team->items + (uint64_t)slot * team->size;
	for (uint32_t i = 0; i < team->size; i++)
		op->items[i] = (struct dpa_item){ 0 };
	dpa_sig_init(eng, op);  /* start() may mark its protocol in it (eager) */
	/*
	 * A command the algorithm rejects still takes its place in the team's sequence: the
	 * op runs refusing everything (no data either way, error signals to every peer), so
	 * the peers' matching ops fail cleanly and the next op pairs up again.
	 */
	n = op->algo->start(eng, op, hal);
	if (n != (int)team->size)  /* an item per member: the gate judges each one's signature */
		return complete_now(eng, hal, cmd, OFFLOAD_ERR_INTERNAL, 0);
	team->next_seq++;
	op->nitems = (uint32_t)n;
	op->remaining = (uint32_t)n;
	for (uint32_t t = 0; t < OFFLOAD_MAX_THREADS; t++)
		op->scan_from[t] = 0;
	/* Our signature to every member now, as far as the control log takes them (the
	 * items post the rest); the gate opens once every member's agreed (signature.c).
	 * An op whose signature travels with its data has no gate: its items judge. */
	op->gate_fail = 0;
	op->sig_pending = op->algo->carries_sig ? 0 : team->size - 1;
	op->items[0].flags |= DPA_ITEM_SIG_OUT | DPA_ITEM_SIG_IN;
	for (uint32_t i = 1; i < team->size; i++) {
		if (op->algo->carries_sig) {
			op->items[i].flags |= DPA_ITEM_SIG_IN;
			continue;
		}
		if (dpa_sig_post_once(eng, op, hal, i) == DPA_HAL_EAGAIN)
			break;
	}
	/* Bytes this rank sends: count per peer, unless the algorithm says otherwise. */
	op->bulk = (op->algo->bytes_sent ? op->algo->bytes_sent(op, team->size) :
		    cmd->count * team->size) > DPA_ENGINE_SMALL_BYTES;
	if (op->bulk)
		off_add_shared(&eng->inflight_bulk, 1, sole_thread(hal));
	off_add_shared(&eng->inflight, 1, sole_thread(hal));
	/* Publish: threads that see ACTIVE see every field above; passes look at it from
	 * the mask's bit on. */
	op_mask_set(eng, op, sole_thread(hal));
	__atomic_store_n(&op->state, DPA_OP_ACTIVE, __ATOMIC_SEQ_CST);
	return 1;
}

static int intake(struct dpa_engine *eng, struct dpa_hal *hal)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	struct offload_cmd *sq = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, sizeof(*ring),
			(uint64_t)eng->params.sq_entries * sizeof(*sq));
	uint32_t head = ring->sq_head;                 /* ours: written only by intake's holder */
	uint32_t tail = off_load_acquire(&ring->sq_tail); /* pairs with the host's release */
	int taken = 0;

	while (head != tail && taken < DPA_INTAKE_BUDGET) {
		struct offload_cmd cmd = sq[head & (eng->params.sq_entries - 1)];

		if (!intake_one(eng, hal, &cmd))
			break;
		head++;
		taken++;
	}
	if (taken) {
		off_store_release(&ring->sq_head, head);  /* the host reuses slots before head */
		dpa_hal_notify(hal);
	}
	return taken;
}

static int poll_completions(struct dpa_engine *eng, struct dpa_hal *hal)
{
	struct dpa_hal_cqe cqes[DPA_POLL_BUDGET];
	int n = dpa_hal_poll_cq(hal, cqes, DPA_POLL_BUDGET);

	for (int i = 0; i < n; i++) {
		uint32_t opi = dpa_wr_op(cqes[i].wr_id), seq16 = dpa_wr_seq16(cqes[i].wr_id);
		uint32_t item = dpa_wr_item(cqes[i].wr_id), kind = dpa_wr_kind(cqes[i].wr_id);
		uint32_t named = UINT32_MAX;  /* the one team peer a data completion concerns */
		uint32_t self = kind == DPA_WR_DATA_SELF, refetch = kind == DPA_WR_REFETCH;
		uint32_t credit = kind == DPA_WR_CREDIT;
		struct dpa_op *op;
		struct dpa_team *team;

		if (kind == DPA_WR_REFETCH) {  /* item 0's data, read from team peer `item` */
			named = item;
			item = 0;
			kind = DPA_WR_DATA;
		}
		if (self || credit)
			kind = DPA_WR_DATA;
		/* Control words are resent from the log even after their op finished. */
		if (kind != DPA_WR_DATA && dpa_ctrl_completed(eng, hal, &cqes[i]) &&
		    cqes[i].status == OFFLOAD_ERR_LINK_DOWN)
			continue;
		/* Agreement words (DPA_AGREE_OPI + team) belong to no op: the log was all. */
		if (opi >= OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW)
			continue;
		op = &eng->ops[opi];
		team = &eng->teams[op->team_id];
		/* A control write's completion may trail its op: the op finished without waiting
		 * for it and the slot holds a later op now. Nothing of that op's to update. The
		 * item (or named peer) indexes the op's team: past its size, no word of ours. */
		if (seq16 != (op->seq & 0xffffu) || item >= team->size ||
		    (named != UINT32_MAX && named >= team->size))
			continue;
		if (self)
			named = team->my_rank;
		if (kind == DPA_WR_DATA) {
			struct dpa_item *it = &op->items[item];

			it->inflight--;
			if (cqes[i].status == OFFLOAD_OK && credit)
				continue;
			if (cqes[i].status == OFFLOAD_OK) {
				it->acked += cqes[i].bytes;
				dpa_stats(hal)->writes++;
				dpa_stats(hal)->bytes_written += cqes[i].bytes;
			} else if (cqes[i].status == OFFLOAD_ERR_LINK_DOWN &&
				   !(it->flags & DPA_ITEM_FAILED)) {
				if (named == UINT32_MAX && !op->algo->multicast)
					named = (team->my_rank + item) % team->size;
				for (uint32_t p = 0; p < team->size; p++)
					if (named == UINT32_MAX || p == named)
						dpa_rail_failed(eng, hal, team->peers[p].world_rank,
								cqes[i].rail);
				if (refetch)  /* the block whose round it was reads it again */
					op->algo->read_completed(eng, op, hal, named, &cqes[i]);
				else
					it->flags |= DPA_ITEM_RESEND;
				continue;
			}
			if (refetch && cqes[i].status == OFFLOAD_OK)
				op->algo->read_completed(eng, op, hal, named, &cqes[i]);
			if (credit)
				continue;  /* its peer is gone: it needs its slot no more */
		}
		if (cqes[i].status != OFFLOAD_OK) {
			/* DATA wr_ids carry the item, CTRL and REFETCH ones the team peer. */
			uint32_t peer = named != UINT32_MAX ? named : kind == DPA_WR_DATA ?
				(team->my_rank + item) % team->size : item;

			dpa_op_fail(op, cqes[i].status, team->peers[peer % team->size].world_rank);
			if (kind == DPA_WR_DATA) {
				/* Post nothing more for this peer; its done signal carries the error. */
				op->items[item].flags |= DPA_ITEM_FAILED;
				op->items[item].posted = UINT64_MAX;
			}
		}
	}
	return n;
}

/* Abort the op a control word's wr_id names, if it is still that op (rails.c reports the
 * words it could not send again). */
static void abort_wr(struct dpa_engine *eng, struct dpa_hal *hal, uint64_t wr_id, int32_t status,
		     uint32_t detail)
{
	uint32_t opi = dpa_wr_op(wr_id);
	struct dpa_op *op;

	if (opi >= OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW)
		return;
	op = &eng->ops[opi];
	if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) == DPA_OP_ACTIVE &&
	    (op->seq & 0xffffu) == dpa_wr_seq16(wr_id))
		dpa_op_abort(eng, hal, op, status, detail);
}

/* Control words a failed rail dropped go again; an op whose peer has no rail left aborts. */
static int resend(struct dpa_engine *eng, struct dpa_hal *hal)
{
	struct dpa_wr_failure lost[DPA_CTRL_LOG];
	uint32_t nlost = 0;
	int work = dpa_ctrl_resend(eng, hal, lost, &nlost);

	for (uint32_t i = 0; i < nlost; i++)
		abort_wr(eng, hal, lost[i].wr_id, OFFLOAD_ERR_LINK_DOWN, lost[i].peer);
	return work;
}

static void check_abort(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint64_t *now)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	uint32_t dead = dpa_team_lowest_dead(eng, team);

	/* A member that closed is no reason to abort: it closes once its ops completed, and
	 * every wait on it ends at once (dpa_peer_gone); a peer still busy in a long op
	 * beside it must not be cut short. */
	if (dead != UINT32_MAX) {
		/* Waits on the dead rank end at once (dpa_peer_gone); an op still stuck after a
		 * grace period waits on it indirectly (counts, a barrier round): abort it. */
		uint64_t none = 0;

		if (!*now)
			*now = dpa_hal_time_ns(hal);
		/* Signed: a sibling thread may have stamped it after this pass read the clock. */
		if (!off_cas(&op->dead_since, &none, *now) &&
		    (int64_t)(*now - off_load_acquire(&op->dead_since)) > DPA_DEAD_GRACE_NS)
			dpa_op_abort(eng, hal, op, OFFLOAD_ERR_PEER, dead);
		return;
	}
	if (__atomic_load_n(&op->cancel, __ATOMIC_SEQ_CST)) {
		dpa_op_abort(eng, hal, op, OFFLOAD_ERR_CANCELED, team->peers[team->my_rank].world_rank);
		return;
	}
	if (op->deadline_ns != UINT64_MAX) {
		if (!*now)
			*now = dpa_hal_time_ns(hal);
		if (*now > op->deadline_ns)
			dpa_op_abort(eng, hal, op, OFFLOAD_ERR_TIMEOUT, team->peers[team->my_rank].world_rank);
	}
}

/* One pass over op's items of this thread (me of nthreads), and its completion once the
 * last one finished. */
static int progress_op(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t me, uint32_t nthreads, uint64_t *now)
{
	int work = 0;

	/* Sibling threads only: one thread frees the ops it runs itself. */
	if (nthreads > 1)
		__atomic_fetch_add(&op->users, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) == DPA_OP_ACTIVE) {
		uint32_t first = me, end = op->nitems;
		int horizon;

		if (!__atomic_load_n(&op->aborted, __ATOMIC_SEQ_CST))
			check_abort(eng, op, hal, now);
		/* Only this thread touches its stripe: skip the items it already finished,
		 * and those past the algorithm's horizon (an aborted op visits them all). */
		if (me < OFFLOAD_MAX_THREADS) {
			if (op->scan_from[me] > me)
				first = op->scan_from[me];
			while (first < op->nitems && (op->items[first].flags & DPA_ITEM_FINISHED))
				first += nthreads;
			op->scan_from[me] = first;
		}
		horizon = op->algo->horizon && !__atomic_load_n(&op->aborted, __ATOMIC_SEQ_CST) &&
			  !__atomic_load_n(&op->sig_pending, __ATOMIC_SEQ_CST);
		if (horizon)
			end = op->algo->horizon(eng, op, first, nthreads);
		for (uint32_t i = first; i < op->nitems; i += nthreads) {
			struct dpa_item *it = &op->items[i];

			/* The items before may have moved it on in this pass. */
			if (i >= end && (!horizon || i >= (end = op->algo->horizon(eng, op, first,
										     nthreads))))
				break;

			if (it->flags & DPA_ITEM_FINISHED)
				continue;
			if (__atomic_load_n(&op->aborted, __ATOMIC_SEQ_CST)) {
				if (op->algo->abort && !(it->flags & DPA_ITEM_ABORTED)) {
					if (op->algo->abort(eng, op, i, hal) == DPA_HAL_EAGAIN)
						continue;
					it->flags |= DPA_ITEM_ABORTED;
					work++;
				}
				/* Wait for nothing but our own writes still in flight. */
				if (it->inflight == 0) {
					it->flags |= DPA_ITEM_FINISHED;
					off_count_down(&op->remaining, nthreads == 1);
					work++;
				}
				continue;
			}
			if (!(it->flags & DPA_ITEM_SIG_IN))
				work += dpa_sig_step(eng, op, hal, i);
			if (__atomic_load_n(&op->sig_pending, __ATOMIC_SEQ_CST))
				continue;  /* not every member's signature is judged yet */
			if (__atomic_load_n(&op->gate_fail, __ATOMIC_SEQ_CST))
				it->flags |= DPA_ITEM_FINISHED;  /* nothing of it ran */
			else
				work += op->algo->progress(eng, op, i, hal);
			if (it->flags & DPA_ITEM_FINISHED)
				off_count_down(&op->remaining, nthreads == 1);
		}
		/*
		 * Whoever sees the last item finished writes the completion; a completion
		 * that found the ring full is retried by whoever passes by next.
		 */
		if (off_load_acquire(&op->remaining) == 0 && off_trylock(&op->completing)) {
			if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) == DPA_OP_ACTIVE &&
			    off_load_acquire(&op->remaining) == 0)
				work += try_complete_op(eng, op, hal);
			off_unlock(&op->completing);
		}
	}
	if (nthreads > 1)
		__atomic_fetch_sub(&op->users, 1, __ATOMIC_SEQ_CST);
	return work;
}

/* *now: the pass's clock, read once when an op first needs it (0 until then). */
static int progress_ops(struct dpa_engine *eng, struct dpa_hal *hal, uint64_t *now)
{
	uint32_t me = dpa_hal_thread_index(hal), nthreads = dpa_hal_num_threads(hal);
	int work = 0;

	/* Closed first: the host writes a closer's known deaths into the failed set before
	 * its closed bit, so an op failing for the close sees those deaths too (and names
	 * them). */
	dpa_closed_refresh(eng, hal, me);
	dpa_failed_refresh(eng, hal);

	for (uint32_t w = 0; w < DPA_OP_MASK_WORDS; w++) {
		for (uint64_t m = off_load_acquire(&eng->active_ops[w]); m; m &= m - 1) {
			struct dpa_op *op = &eng->ops[w * 64 + (uint32_t)__builtin_ctzll(m)];

			if (off_read_once(&op->state) == DPA_OP_ACTIVE)
				work += progress_op(eng, op, hal, me, nthreads, now);
		}
	}
	return work;
}

int dpa_progress(void *state, struct dpa_hal *hal)
{
	struct dpa_engine *eng = state;
	struct offload_thread_stats *stats = dpa_stats(hal);
	uint64_t now = 0;  /* deadlines are seconds: one clock read a pass (repolls included) */
	int work;

	dpa_failed_refresh(eng, hal);  /* intake poisons teams that lost a member */
	work = poll_completions(eng, hal);

	work += resend(eng, hal);
	stats->progress_calls++;
	if (sole_thread(hal)) {
		work += intake(eng, hal);
	} else if (off_trylock(&eng->intake_lock)) {
		work += intake(eng, hal);
		off_unlock(&eng->intake_lock);
	}
	work += progress_ops(eng, hal, &now);
	/* The writes this pass posted may have completed already (a short write reaches a
	 * near peer's memory in about the time the pass takes): reap them and move their ops
	 * on now instead of a pass later, while that keeps paying (an eager op settles each
	 * item's write, then posts its next). A few rounds at most: the commands and the
	 * agreements below wait meanwhile. */
	for (int r = 0; r < DPA_PASS_REPOLLS; r++) {
		int n = poll_completions(eng, hal);

		if (!n)
			break;
		work += n + progress_ops(eng, hal, &now);
	}
	work += dpa_agree_progress(eng, hal);  /* after progress_ops: its closed snapshot */
	if (!work)
		stats->idle_calls++;
	return work;
}

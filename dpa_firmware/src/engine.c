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
#include "reduce.h"

#define DPA_INTAKE_BUDGET 16
#define DPA_POLL_BUDGET   256
#define DPA_DEAD_GRACE_NS 200000000ull  /* see check_abort() */
#define EINVAL_ 22

static const struct dpa_algo *const dpa_algos[OFFLOAD_OP_MAX] = {
	[OFFLOAD_OP_BARRIER] = &dpa_algo_barrier,
	[OFFLOAD_OP_ALLTOALL] = &dpa_algo_alltoall_pairwise,
	[OFFLOAD_OP_ALLTOALLV] = &dpa_algo_alltoallv,
	[OFFLOAD_OP_BROADCAST] = &dpa_algo_broadcast_mcast,
	[OFFLOAD_OP_ALLGATHER] = &dpa_algo_allgather_mcast,
	[OFFLOAD_OP_REDUCE_SCATTER] = &dpa_algo_reduce_scatter,
	[OFFLOAD_OP_ALLREDUCE] = &dpa_algo_allreduce,
};

uint64_t dpa_engine_state_size(void)
{
	return sizeof(struct dpa_engine);
}

static int is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

int dpa_engine_init(void *state, const struct dpa_engine_params *p)
{
	struct dpa_engine *eng = state;
	uint8_t *bytes = state;

	if (p->abi_version != OFFLOAD_ABI_VERSION || p->world_size == 0 ||
	    p->world_size > OFFLOAD_MAX_RANKS || p->world_rank >= p->world_size ||
	    p->num_threads == 0 || p->num_threads > OFFLOAD_MAX_THREADS ||
	    !is_pow2(p->sq_entries) || !is_pow2(p->cq_entries) || p->chunk_size == 0 ||
	    p->chunks_per_pass == 0 || p->eager_max > OFFLOAD_EAGER_BYTES)
		return -EINVAL_;
	for (uint64_t i = 0; i < sizeof(*eng); i++)
		bytes[i] = 0;
	eng->params = *p;
	for (uint32_t i = 0; i < OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW; i++)
		eng->ops[i].index = i;
	return 0;
}

struct offload_thread_stats *dpa_stats(struct dpa_hal *hal)
{
	uint32_t t = dpa_hal_thread_index(hal);

	return dpa_hal_window_ptr(hal, DPA_HAL_WIN_STATS, t * sizeof(struct offload_thread_stats),
				  sizeof(struct offload_thread_stats));
}

struct offload_ctrl_team *dpa_my_ctrl(struct dpa_hal *hal, uint32_t team)
{
	return dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL, dpa_ctrl_team_off(team),
				  sizeof(struct offload_ctrl_team));
}

uint64_t dpa_peer_ctrl_addr(const struct dpa_team *team, uint32_t peer, uint64_t offset)
{
	return team->peers[peer].ctrl_addr + offset;
}

void dpa_op_fail(struct dpa_op *op, int32_t status, uint32_t world_rank)
{
	uint64_t cur = 0, why = ((uint64_t)world_rank << 32) | (uint32_t)status;

	/* The first error wins, but a peer that closed is the weakest reason: it often closed
	 * because of a failure this rank learns of a moment later (a death, its own rails). */
	while (!off_cas(&op->fail, &cur, why))
		if ((int32_t)(uint32_t)cur != OFFLOAD_ERR_PEER_CLOSED ||
		    (status != OFFLOAD_ERR_PEER && status != OFFLOAD_ERR_LINK_DOWN))
			return;
}

int dpa_signal_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		    uint32_t peer, int error)
{
	struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_ctrl_msg m = {
		.wr_id = dpa_wr_id(op, peer, DPA_WR_SIGNAL),
		.raddr = dpa_peer_ctrl_addr(team, peer,
					    dpa_ctrl_done_off(op->team_id, op->slot, team->my_rank)),
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
	uint64_t fail = off_load_acquire(&op->fail), bit = 1ull << world_rank;
	int32_t st = (int32_t)(uint32_t)fail;

	if (off_read_once(&eng->failed_ranks) & bit) {
		dpa_op_fail(op, OFFLOAD_ERR_PEER, world_rank);
		return 1;
	}
	/* Closed as this thread saw it at the start of its pass: a closing peer's words land
	 * before its close shows, so the caller's look for the word, made since, was final. */
	if (dpa_closed_ranks(eng, hal) & bit) {
		dpa_op_fail(op, OFFLOAD_ERR_PEER_CLOSED, world_rank);
		return 1;
	}
	return fail && (uint32_t)(fail >> 32) == world_rank &&
	       (st == OFFLOAD_ERR_PEER || st == OFFLOAD_ERR_REMOTE_ACCESS ||
		st == OFFLOAD_ERR_PEER_CLOSED);
}

void dpa_op_refuse(struct dpa_engine *eng, struct dpa_op *op, int32_t status)
{
	dpa_op_fail(op, status, eng->teams[op->team_id].peers[eng->teams[op->team_id].my_rank].world_rank);
	op->refuse = 1;
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
	struct offload_ctrl_team *ctrl = dpa_my_ctrl(hal, op->team_id);
	/* Pairs with the peer's signal add, which follows its data writes on the same QP. */
	uint64_t v = off_load_acquire(&ctrl->done[op->slot][src]);
	uint32_t lo = (uint32_t)v, errs = (uint32_t)(v >> 32);

	if ((int32_t)(lo - it->expect_lo) < 0)
		return 0;
	if (errs != it->errs_seen) {
		team->errs_seen[op->slot][src] = errs;
		dpa_op_fail(op, OFFLOAD_ERR_PEER_OP, team->peers[src].world_rank);
	}
	return 1;
}

static int write_cqe(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cqe *cqe)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	uint64_t cq_off = sizeof(*ring) + (uint64_t)eng->params.sq_entries * sizeof(struct offload_cmd);
	struct offload_cqe *cq = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, cq_off,
						    (uint64_t)eng->params.cq_entries * sizeof(*cq));
	uint32_t tail, head;

	/* A few stores under the lock: wait for it. Returning "not now" would make intake
	 * redo a command whose side effects (TEAM_CREATE) already happened. */
	while (!off_trylock(&eng->cq_lock))
		;
	tail = ring->cq_tail;                     /* ours: only written under cq_lock */
	head = off_load_acquire(&ring->cq_head);  /* host-owned; pairs with its release */
	if (tail - head >= eng->params.cq_entries) {
		off_unlock(&eng->cq_lock);
		return 0;
	}
	cq[tail & (eng->params.cq_entries - 1)] = *cqe;
	off_store_release(&ring->cq_tail, tail + 1);  /* pairs with the host's acquire */
	off_unlock(&eng->cq_lock);
	/* The host checks cq_tail after announcing itself in cq_waiters; order both sides. */
	off_fence();
	if (off_read_once(&ring->cq_waiters))
		dpa_hal_host_notify(hal);
	return 1;
}

int dpa_complete_cmd(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd,
		     int32_t status, uint32_t detail, uint64_t result0, uint64_t result1)
{
	struct offload_cqe cqe = { .tag = cmd->tag, .status = status, .detail = detail,
				   .result0 = result0, .result1 = result1 };

	return write_cqe(eng, hal, &cqe);
}

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

static uint64_t failed_ranks(struct dpa_hal *hal)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));

	return off_load_acquire(&ring->failed_ranks);  /* host-written, any time */
}

static uint32_t lowest_rank(uint64_t mask)
{
	uint32_t r = 0;

	while (!(mask & 1)) {
		mask >>= 1;
		r++;
	}
	return r;
}

static void poison_team(struct dpa_team *team, int32_t status, uint32_t detail)
{
	uint64_t none = 0;

	off_cas(&team->poisoned, &none, ((uint64_t)detail << 32) | (uint32_t)status);
}

static int try_complete_op(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	uint64_t dead = off_read_once(&eng->failed_ranks) & eng->teams[op->team_id].world_mask;
	uint64_t fail = off_load_acquire(&op->fail);

	/* An op that failed in a team that lost a member fails because of it, whatever the
	 * first symptom was (a refused write into its revoked memory, a peer's error signal):
	 * every survivor names the same rank. One that finished cleanly had everything it
	 * needed from the dead rank before it died, and succeeds. */
	if (fail && dead)
		fail = ((uint64_t)lowest_rank(dead) << 32) | (uint32_t)OFFLOAD_ERR_PEER;
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
	if (op->algo->multicast) {
		dpa_mcast_release(eng, op, hal);
		dpa_mcast_report(hal, op);  /* before the completion that says it is there */
	}
	if (!write_cqe(eng, hal, &cqe))
		return 0;
	/* A rank lost (dead, or every rail to it down) leaves the team's sequence broken,
	 * whether or not this rank's watch has seen the death yet: later ops fail at intake
	 * with the same error; so does a member that closed its context before joining this
	 * op (it never joins another). (Errors that keep the ranks in step, a refused command or a
	 * destination too small, leave the team usable.) */
	if (cqe.status == OFFLOAD_ERR_PEER || cqe.status == OFFLOAD_ERR_LINK_DOWN ||
	    cqe.status == OFFLOAD_ERR_PEER_CLOSED)
		poison_team(&eng->teams[op->team_id], cqe.status, cqe.detail);
	dpa_stats(hal)->ops_completed++;
	if (cqe.status != OFFLOAD_OK)
		dpa_stats(hal)->errors++;
	__atomic_store_n(&op->state, DPA_OP_FREE, __ATOMIC_SEQ_CST);
	/* A command may be waiting for this slot while the thread holding intake parks. */
	if (commands_waiting(hal))
		dpa_hal_notify(hal);
	if (op->bulk)
		off_fetch_sub(&eng->inflight_bulk, 1);
	off_fetch_sub(&eng->inflight, 1);
	return 1;
}

static int32_t validate_team_desc(struct dpa_engine *eng, const struct offload_team_desc *d)
{
	if (d->team_id >= OFFLOAD_MAX_TEAMS || d->size == 0 || d->size > OFFLOAD_MAX_RANKS ||
	    d->my_rank >= d->size)
		return OFFLOAD_ERR_INVALID;
	if (d->peers[d->my_rank].world_rank != eng->params.world_rank)
		return OFFLOAD_ERR_INVALID;
	for (uint32_t i = 0; i < d->size; i++)
		if (d->peers[i].world_rank >= eng->params.world_size)
			return OFFLOAD_ERR_INVALID;
	return OFFLOAD_OK;
}

static int32_t team_create(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd)
{
	const struct offload_team_desc *d =
		/* Misaligned: the DPA's loads of its 8-byte fields would fault. */
		cmd->aux_addr & 7 ? NULL :
		dpa_hal_aux_ptr(hal, cmd->aux_key, cmd->aux_addr, sizeof(*d));
	struct dpa_team *team;
	int32_t st;

	if (!d)
		return OFFLOAD_ERR_INVALID;
	st = validate_team_desc(eng, d);
	if (st)
		return st;
	team = &eng->teams[d->team_id];
	if (team->active)
		return OFFLOAD_ERR_INVALID;
	team->size = d->size;
	team->my_rank = d->my_rank;
	team->next_seq = 1;
	team->world_mask = 0;
	team->poisoned = 0;
	for (uint32_t i = 0; i < d->size; i++) {
		team->peers[i] = d->peers[i];
		team->world_mask |= 1ull << d->peers[i].world_rank;
	}
	team->fp = dpa_team_fp(d->team_id, d->size, d->peers);
	team->active = 1;
	return OFFLOAD_OK;
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
			poison_team(team, OFFLOAD_ERR_CANCELED,
				    team->peers[team->my_rank].world_rank);
			dpa_hal_notify(hal);
			return OFFLOAD_OK;
		}
	}
	return OFFLOAD_ERR_INVALID;  /* no such op in flight: it completed already */
}

/* The algorithm of a collective, from what every rank of the op has alike (opcode, flags,
 * block size, team size), so that all pick the same. */
static const struct dpa_algo *pick_algo(const struct dpa_engine *eng, const struct offload_cmd *cmd)
{
	if (cmd->opcode == OFFLOAD_OP_ALLTOALLV && (cmd->flags & OFFLOAD_CMD_F_SLOTS))
		return &dpa_algo_alltoallv_slots;
	if (cmd->opcode == OFFLOAD_OP_ALLTOALL && eng->params.eager_max &&
	    cmd->count <= eng->params.eager_max)
		return &dpa_algo_alltoall_eager;
	return dpa_algos[cmd->opcode];
}

/* Returns 1 if the command was consumed, 0 if it must wait for a free op slot. */
static int intake_one(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd)
{
	uint64_t dead, poisoned;
	struct dpa_team *team;
	struct dpa_op *op;
	uint32_t slot;
	int32_t st;
	int n;

	if (cmd->opcode == OFFLOAD_OP_NOP)
		return complete_now(eng, hal, cmd, OFFLOAD_OK, 0);
	if (cmd->opcode == OFFLOAD_OP_TEAM_CREATE)
		return complete_now(eng, hal, cmd, team_create(eng, hal, cmd), 0);
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
	dead = failed_ranks(hal) & team->world_mask;
	if (dead)
		poison_team(team, OFFLOAD_ERR_PEER, lowest_rank(dead));
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
	op->mc_flags = op->mc_readies = op->mc_next = 0;
	op->mc_stats = (struct offload_mcast_op_stats){ 0 };
	op->deadline_ns = eng->params.op_timeout_ms ?
		dpa_hal_time_ns(hal) + (uint64_t)eng->params.op_timeout_ms * 1000000u : UINT64_MAX;
	op->algo = pick_algo(eng, cmd);
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
		if (dpa_sig_post(eng, op, hal, i) == DPA_HAL_EAGAIN)
			break;
		op->items[i].flags |= DPA_ITEM_SIG_OUT;
	}
	/* Bytes this rank sends: count per peer, or (all-to-all-v) at most the src size. */
	op->bulk = (cmd->opcode == OFFLOAD_OP_ALLTOALLV ? cmd->count : cmd->count * team->size) >
		   DPA_ENGINE_SMALL_BYTES;
	if (op->bulk)
		off_fetch_add(&eng->inflight_bulk, 1);
	off_fetch_add(&eng->inflight, 1);
	/* Publish: threads that see ACTIVE see every field above. */
	__atomic_store_n(&op->state, DPA_OP_ACTIVE, __ATOMIC_SEQ_CST);
	return 1;
}

static int intake(struct dpa_engine *eng, struct dpa_hal *hal)
{
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	struct offload_cmd *sq = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, sizeof(*ring),
			(uint64_t)eng->params.sq_entries * sizeof(*sq));
	uint32_t head = ring->sq_head;                 /* ours: written only under intake_lock */
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
		uint32_t opi = (uint32_t)(cqes[i].wr_id >> 32);
		uint32_t seq16 = (uint32_t)(cqes[i].wr_id >> 16) & 0xffffu;
		uint32_t item = (uint32_t)(cqes[i].wr_id >> 8) & 0xffu;
		uint32_t kind = (uint32_t)cqes[i].wr_id & 0xffu;
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
		if (opi >= OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW || item >= OFFLOAD_MAX_RANKS)
			continue;
		op = &eng->ops[opi];
		team = &eng->teams[op->team_id];
		/* A control write's completion may trail its op: the op finished without waiting
		 * for it and the slot holds a later op now. Nothing of that op's to update. */
		if (seq16 != (op->seq & 0xffffu))
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
					dpa_mcast_read_completed(eng, op, hal, named, &cqes[i]);
				else
					it->flags |= DPA_ITEM_RESEND;
				continue;
			}
			if (refetch && cqes[i].status == OFFLOAD_OK)
				dpa_mcast_read_completed(eng, op, hal, named, &cqes[i]);
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

/*
 * Abort an op that cannot finish: a member died, it ran past the op timeout, or the host
 * cancelled it. Its completion carries why (a dead member overrides an earlier error, so
 * every survivor names the same rank), and the team is poisoned: its peers' sequence no
 * longer pairs with ours.
 */
void dpa_op_abort(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_op *op, int32_t status,
		  uint32_t detail)
{
	uint64_t why = ((uint64_t)detail << 32) | (uint32_t)status;

	if (status == OFFLOAD_ERR_PEER)
		__atomic_store_n(&op->fail, why, __ATOMIC_SEQ_CST);
	else
		dpa_op_fail(op, status, detail);
	poison_team(&eng->teams[op->team_id], status, detail);
	__atomic_store_n(&op->aborted, 1, __ATOMIC_SEQ_CST);
	dpa_hal_notify(hal);  /* items on parked sibling threads finish now */
}

void dpa_op_abort_wr(struct dpa_engine *eng, struct dpa_hal *hal, uint64_t wr_id, int32_t status,
		     uint32_t detail)
{
	uint32_t opi = (uint32_t)(wr_id >> 32);
	struct dpa_op *op;

	if (opi >= OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW)
		return;
	op = &eng->ops[opi];
	if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) == DPA_OP_ACTIVE &&
	    (op->seq & 0xffffu) == ((wr_id >> 16) & 0xffffu))
		dpa_op_abort(eng, hal, op, status, detail);
}

static void check_abort(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint64_t dead, uint64_t *now)
{
	const struct dpa_team *team = &eng->teams[op->team_id];

	/* A member that closed is no reason to abort: it closes once its ops completed, and
	 * every wait on it ends at once (dpa_peer_gone); a peer still busy in a long op
	 * beside it must not be cut short. */
	dead &= team->world_mask;
	if (dead) {
		/* Waits on the dead rank end at once (dpa_peer_gone); an op still stuck after a
		 * grace period waits on it indirectly (counts, a barrier round): abort it. */
		uint64_t none = 0;

		if (!*now)
			*now = dpa_hal_time_ns(hal);
		if (!off_cas(&op->dead_since, &none, *now) &&
		    *now - off_load_acquire(&op->dead_since) > DPA_DEAD_GRACE_NS)
			dpa_op_abort(eng, hal, op, OFFLOAD_ERR_PEER, lowest_rank(dead));
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

static int progress_ops(struct dpa_engine *eng, struct dpa_hal *hal)
{
	uint32_t me = dpa_hal_thread_index(hal), nthreads = dpa_hal_num_threads(hal);
	struct offload_ring_hdr *ring = dpa_hal_window_ptr(hal, DPA_HAL_WIN_RING, 0, sizeof(*ring));
	/* Closed first: the host writes a closer's known deaths into failed_ranks before its
	 * closed bit, so an op failing for the close sees those deaths too (and names them). */
	uint64_t closed = off_load_acquire(&ring->closed_ranks), dead = failed_ranks(hal), now = 0;
	int work = 0;

	if (dead != off_read_once(&eng->failed_ranks))
		off_write_once(&eng->failed_ranks, dead);
	if (me < OFFLOAD_MAX_THREADS)
		eng->closed_snap[me] = closed;

	for (uint32_t o = 0; o < OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW; o++) {
		struct dpa_op *op = &eng->ops[o];

		if (off_read_once(&op->state) != DPA_OP_ACTIVE)
			continue;
		__atomic_fetch_add(&op->users, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&op->state, __ATOMIC_SEQ_CST) == DPA_OP_ACTIVE) {
			if (!__atomic_load_n(&op->aborted, __ATOMIC_SEQ_CST))
				check_abort(eng, op, hal, dead, &now);
			for (uint32_t i = me; i < op->nitems; i += nthreads) {
				struct dpa_item *it = &op->items[i];

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
						off_fetch_sub(&op->remaining, 1);
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
					off_fetch_sub(&op->remaining, 1);
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
		__atomic_fetch_sub(&op->users, 1, __ATOMIC_SEQ_CST);
	}
	return work;
}

enum dpa_engine_load dpa_engine_load(const void *state)
{
	const struct dpa_engine *eng = state;

	if (off_read_once(&eng->inflight_bulk))
		return DPA_ENGINE_BULK;
	return off_read_once(&eng->inflight) ? DPA_ENGINE_SMALL : DPA_ENGINE_IDLE;
}

/* One op's part of dpa_engine_events_needed(). In the gate, once our signature went to
 * every member, each missing one is at least an event and nothing we do meanwhile helps a
 * peer; past it, the algorithm's say. */
static uint32_t events_needed(const struct dpa_op *op)
{
	uint32_t pending = off_load_acquire(&op->sig_pending);

	if (pending) {
		for (uint32_t i = 1; i < op->nitems; i++)
			if (!(off_read_once(&op->items[i].flags) & DPA_ITEM_SIG_OUT))
				return 1;
		return pending;
	}
	return op->algo->events_needed ? op->algo->events_needed(op) : 1;
}

uint32_t dpa_engine_events_needed(const void *state)
{
	const struct dpa_engine *eng = state;
	uint32_t need = UINT32_MAX;

	for (uint32_t o = 0; o < OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW && need > 1; o++) {
		const struct dpa_op *op = &eng->ops[o];

		if (off_load_acquire(&op->state) != DPA_OP_ACTIVE)
			continue;
		uint32_t n = off_read_once(&op->aborted) ? 1 : events_needed(op);

		if (n < need)
			need = n;
	}
	return need == UINT32_MAX || need == 0 ? 1 : need;
}

uint64_t dpa_engine_wake_at(void *state, uint32_t thread, uint64_t now)
{
	struct dpa_engine *eng = state;
	uint64_t when;

	if (thread >= OFFLOAD_MAX_THREADS)
		return 0;
	when = off_read_once(&eng->wake_at[thread]);
	if (!when || when > now)
		return when;
	off_cas(&eng->wake_at[thread], &when, 0);
	return 1;
}

int dpa_progress(void *state, struct dpa_hal *hal)
{
	struct dpa_engine *eng = state;
	struct offload_thread_stats *stats = dpa_stats(hal);
	int work = poll_completions(eng, hal);

	work += dpa_ctrl_resend(eng, hal);
	stats->progress_calls++;
	if (off_trylock(&eng->intake_lock)) {
		work += intake(eng, hal);
		off_unlock(&eng->intake_lock);
	}
	work += progress_ops(eng, hal);
	work += dpa_agree_progress(eng, hal);  /* after progress_ops: its closed snapshot */
	if (!work)
		stats->idle_calls++;
	return work;
}

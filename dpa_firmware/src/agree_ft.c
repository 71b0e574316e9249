/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fault-tolerant agreement (OFFLOAD_OP_AGREE): the live members of a team decide the same
 * value, whoever dies or closes meanwhile, and whenever each one calls it. Shrink stands
 * on it (the agreed failed set gives every survivor the same team), and so does team
 * creation (the agreed id, and whether every member passed the same list).
 *
 * Rotating coordinator over a perfect failure detector (a member is gone once it is in the
 * failed or closed set: the emulator's pidfds and clean closes; QP errors on a
 * card). Every member posts its proposal to every other. Then for c = 0 .. n-1:
 *  - c == me: unless a decision was taken already, wait for every member's proposal (or
 *    its being gone) and merge them: failed = the union, and the gone we see; value = the
 *    largest; differs = a member whose fp is not ours. Post the decision to every member;
 *  - else: wait for c's decision (take it) or for c being gone (skip the round).
 * After the last round, the decision held is the outcome. Why every member ends with the
 * same one: once a coordinator posted its decision to every member and stayed alive to do
 * so, every member holds that decision, and every later coordinator posts the decision it
 * holds: nothing changes it again. A coordinator that dies halfway may leave members with
 * different decisions, but the next live coordinator overwrites them all, and the last
 * live member is a coordinator that lives. No round waits for a dead member; a member
 * that calls late only delays the rounds (op_timeout bounds the wait).
 *
 * Words live in each member's control region (agree_prop, agree_dec, by the writer's team
 * rank), tagged with the team's agreement epoch: a member starts epoch e + 1 only after
 * every live coordinator read its epoch-e proposal, so no word is overwritten while
 * someone still needs it. Sets are by team rank: the word holds members 0..63, chunks
 * (agree_chunk, same writer) the rest in a team of more than 64, each with the epoch
 * written last, so one writer's slots never race another's (docs/scale.md). The team's
 * op sequence is not used: it works on a team whose ops fail at intake since a member
 * died.
 */
#include "engine_internal.h"
#include "signature.h"

/* Member p gone, as this thread saw it at the start of its pass (see dpa_peer_gone: a
 * closing member's words land before its close shows, so looks made since are final). */
static int gone(const struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_team *team,
		uint32_t p)
{
	uint32_t r = team->peers[p].world_rank;

	return dpa_rank_failed(eng, r) || dpa_rank_closed(eng, hal, r);
}

/* Member p's bit in a set held as a word and its chunks (by team rank). */
static uint64_t *set_word(struct offload_agree_word *w, struct offload_agree_chunk *chunks,
			  uint32_t p)
{
	if (p < 64u)
		return &w->failed;
	p -= 64u;
	return &chunks[p / OFFLOAD_AGREE_CHUNK_RANKS].bits[p % OFFLOAD_AGREE_CHUNK_RANKS / 64u];
}

static void set_add(struct offload_agree_word *w, struct offload_agree_chunk *chunks, uint32_t p)
{
	*set_word(w, chunks, p) |= 1ull << (p % 64u);
}

/* Where a word of kind `dec` (0: proposal, 1: decision) by `writer` goes in a member's
 * block. */
static uint64_t word_in(const struct dpa_team *team, uint32_t dec, uint32_t writer)
{
	return dec ? offload_ctrl_agree_dec_in(team->size, writer) :
		     offload_ctrl_agree_prop_in(team->size, writer);
}

/* writer's word in our block, and its chunks. Our own slots (writer = our team rank) no
 * peer writes: they hold the chunks of our proposal (dec 0) and of the decision we hold. */
static struct offload_agree_word *my_word(struct dpa_engine *eng, struct dpa_hal *hal,
					  uint32_t t, uint32_t dec, uint32_t writer)
{
	return dpa_my_word(eng, hal, t, word_in(&eng->teams[t], dec, writer),
			   sizeof(struct offload_agree_word));
}

static struct offload_agree_chunk *my_chunks(struct dpa_engine *eng, struct dpa_hal *hal,
					     uint32_t t, uint32_t dec, uint32_t writer)
{
	uint32_t n = eng->teams[t].size;

	return dpa_my_word(eng, hal, t, offload_ctrl_agree_chunk_in(n, dec, writer, 0),
			   (uint64_t)offload_agree_chunks(n) * sizeof(struct offload_agree_chunk));
}

/* writer's word of kind dec and every chunk of it carry epoch e. Each epoch pairs with its
 * writer's, written after that body on the same queue; word and chunks may land in any
 * order (a failed rail resends each on its own). */
static int complete(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t t, uint32_t dec,
		    uint32_t writer, uint64_t e)
{
	uint32_t chunks = offload_agree_chunks(eng->teams[t].size);
	const struct offload_agree_chunk *c;

	if (off_load_acquire(&my_word(eng, hal, t, dec, writer)->epoch) != e)
		return 0;
	if (!chunks)  /* a team of at most 64: the word is all */
		return 1;
	c = my_chunks(eng, hal, t, dec, writer);
	for (uint32_t k = 0; k < chunks; k++)
		if (off_load_acquire(&c[k].epoch) != e)
			return 0;
	return 1;
}

/* Distinct for every word and chunk in flight: the log resends by wr_id. */
static uint64_t wr_id(uint32_t team_id, uint32_t dec, uint32_t seq, uint32_t p)
{
	return dpa_wr_tag(DPA_AGREE_OPI + team_id, seq, p | dec << 16, DPA_WR_AGREE);
}

/* Our word of kind dec (k == offload_agree_chunks(n)) or its chunk k into member p's
 * region; DPA_HAL_EAGAIN: later. */
static int post_word(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team_id,
		     const struct dpa_agree *ag, uint32_t p, uint32_t dec, uint32_t k)
{
	const struct dpa_team *team = &eng->teams[team_id];
	uint32_t me = team->my_rank, chunk = k < offload_agree_chunks(team->size);
	uint64_t off = dpa_ctrl_team_off(eng, team_id) +
		       (chunk ? offload_ctrl_agree_chunk_in(team->size, dec, me, k) :
				word_in(team, dec, me));
	struct dpa_ctrl_msg m = {
		.wr_id = wr_id(team_id, dec, chunk ? k + 1 : 0, p),
		.raddr = dpa_peer_ctrl_addr(team, p, off),
		.value = ag->epoch, .peer = team->peers[p].world_rank, .rkey = team->peers[p].ctrl_key,
		.kind = DPA_WR_AGREE, .len = offsetof(struct offload_agree_word, epoch),
		.seq_off = offsetof(struct offload_agree_word, epoch),
	};
	int rc;

	if (chunk)
		__builtin_memcpy(m.body, my_chunks(eng, hal, team_id, dec, me)[k].bits, m.len);
	else
		__builtin_memcpy(m.body, dec ? &ag->est : &ag->mine, m.len);
	rc = dpa_ctrl_post(eng, hal, &m);
	/* No rail left to p: it is unreachable and will be failed; nothing more to send. */
	return rc == DPA_HAL_EAGAIN ? rc : 0;
}

/* Post our word of kind dec, chunks first, to every member from *cur on that is not gone;
 * 1 once all went out. */
static int post_all(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team_id,
		    struct dpa_agree *ag, uint32_t *cur_p, uint32_t *cur_k, uint32_t dec)
{
	const struct dpa_team *team = &eng->teams[team_id];
	uint32_t chunks = offload_agree_chunks(team->size);

	for (; *cur_p < team->size; (*cur_p)++, *cur_k = 0) {
		if (*cur_p == team->my_rank || gone(eng, hal, team, *cur_p))
			continue;
		for (; *cur_k <= chunks; (*cur_k)++)
			if (post_word(eng, hal, team_id, ag, *cur_p, dec, *cur_k) == DPA_HAL_EAGAIN)
				return 0;
	}
	return 1;
}

/* The arguments: a header naming the job's world size, then its failed bitmap; NULL for
 * anything else (the bitmap is read by the world size only, never by a host word). */
static struct offload_agree_args *args_of(struct dpa_engine *eng, struct dpa_hal *hal,
					  const struct offload_cmd *cmd)
{
	uint32_t world = eng->params.world_size;
	struct offload_agree_args *a;

	if (cmd->aux_addr & 7)  /* misaligned: the DPA's loads would fault */
		return NULL;
	a = dpa_hal_aux_ptr(hal, cmd->aux_key, cmd->aux_addr, sizeof(*a));
	if (!a || off_read_once(&a->nranks) != world ||
	    off_read_once(&a->words) != offload_rank_words(world))
		return NULL;
	return dpa_hal_aux_ptr(hal, cmd->aux_key, cmd->aux_addr, offload_agree_args_bytes(world));
}

int dpa_agree_intake(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd)
{
	struct offload_agree_args *args = args_of(eng, hal, cmd);
	struct dpa_agree *ag = &eng->agree[cmd->team % OFFLOAD_MAX_TEAMS];
	const struct dpa_team *team = &eng->teams[cmd->team % OFFLOAD_MAX_TEAMS];
	struct offload_agree_chunk *chunks;
	const uint64_t *failed;

	if (cmd->team >= OFFLOAD_MAX_TEAMS || !team->active || !args || cmd->count ||
	    cmd->src_addr || cmd->dst_addr || cmd->flags)
		return dpa_complete_cmd(eng, hal, cmd, OFFLOAD_ERR_INVALID, 0, 0, 0);
	if (__atomic_load_n(&ag->active, __ATOMIC_ACQUIRE))
		return 0;  /* one agreement at a time per team: the next waits in the ring */
	ag->cmd = *cmd;
	ag->epoch++;
	ag->round = 0;
	ag->decided = 0;
	ag->sent.p = ag->sent.k = ag->told.p = ag->told.k = 0;
	ag->oos_since = 0;
	ag->mine = (struct offload_agree_word){
		.value = args->value, .fp = args->fp, .extra = team->next_seq, .epoch = ag->epoch,
	};
	/* The members the caller knows gone, by team rank (others' bits are dropped). */
	chunks = my_chunks(eng, hal, cmd->team, 0, team->my_rank);
	for (uint32_t k = 0; k < offload_agree_chunks(team->size); k++)
		chunks[k] = (struct offload_agree_chunk){ 0 };
	failed = offload_agree_failed(args);
	for (uint32_t p = 0; p < team->size; p++) {
		uint32_t r = team->peers[p].world_rank;

		if (failed[r / 64u] >> (r % 64u) & 1u)
			set_add(&ag->mine, chunks, p);
	}
	ag->deadline_ns = eng->params.op_timeout_ms ?
		dpa_hal_time_ns(hal) + (uint64_t)eng->params.op_timeout_ms * 1000000u : UINT64_MAX;
	/* Counted first: a pass that reads no agreement running skips the teams' words. */
	__atomic_fetch_add(&eng->agreements, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&ag->active, 1, __ATOMIC_RELEASE);  /* publishes the fields above */
	dpa_hal_notify(hal);  /* its thread may be parked */
	return 1;
}

int dpa_out_of_step(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_team *team,
		    uint64_t *since)
{
	uint64_t now = dpa_hal_time_ns(hal);

	/* Where a member died or an op aborted, the sequences legitimately differ by the ops
	 * some ranks took. A death this rank has not heard of yet looks the same for a moment:
	 * give it DPA_OOS_SETTLE_NS to show. (A member that closed changes nothing: the ops
	 * that needed it fail and poison the team.) */
	(void)hal;
	if (dpa_team_lowest_dead(eng, team) != UINT32_MAX || off_load_acquire(&team->poisoned)) {
		*since = 0;
		return 0;
	}
	if (!*since) {
		*since = now ? now : 1;
		dpa_wake_at(eng, hal, now + DPA_OOS_SETTLE_NS);
		return 0;
	}
	if (now - *since < DPA_OOS_SETTLE_NS) {
		dpa_wake_at(eng, hal, *since + DPA_OOS_SETTLE_NS);
		return 0;
	}
	return 1;
}

/* Member q took our next collective instead of joining this agreement (its signature for
 * that seq is in, by the gate or in an eager slot's header): the members are not in step.
 * 1 and *their_op if so. */
static int runs_collective(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team_id,
			   const struct dpa_team *team, uint32_t q, uint32_t *their_op)
{
	const struct offload_sig *gated = dpa_sig_gated(eng, hal, team_id, team->next_seq, q);
	struct offload_sig eager;

	if (gated) {
		*their_op = gated->op;
		return 1;
	}
	if (dpa_sig_eager(eng, hal, team_id, team->next_seq, q, &eager)) {
		*their_op = eager.op;
		return 1;
	}
	return 0;
}

/* Our round: every member's proposal (or its being gone), merged into our decision. */
static int decide(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_agree *ag,
		  uint32_t t)
{
	const struct dpa_team *team = &eng->teams[t];
	uint32_t me = team->my_rank, chunks = offload_agree_chunks(team->size);
	struct offload_agree_chunk *dc = my_chunks(eng, hal, t, 1, me);
	const struct offload_agree_chunk *mc = my_chunks(eng, hal, t, 0, me);
	struct offload_agree_word d = ag->mine;

	for (uint32_t q = 0; q < team->size; q++)
		if (q != me && !complete(eng, hal, t, 0, q, ag->epoch) && !gone(eng, hal, team, q))
			return 0;
	for (uint32_t k = 0; k < chunks; k++)
		dc[k] = mc[k];
	d.extra = 0;  /* a decision's: differs */
	for (uint32_t q = 0; q < team->size; q++) {
		const struct offload_agree_word *w = my_word(eng, hal, t, 0, q);

		if (q == me)
			continue;
		if (complete(eng, hal, t, 0, q, ag->epoch)) {
			const struct offload_agree_chunk *c = chunks ? my_chunks(eng, hal, t, 0, q) : NULL;

			d.failed |= w->failed;
			d.value = w->value > d.value ? w->value : d.value;
			if (w->fp != ag->mine.fp && !d.extra)
				d.extra = team->peers[q].world_rank + 1;
			for (uint32_t k = 0; k < chunks; k++)
				for (uint32_t i = 0; i < OFFLOAD_AGREE_CHUNK_RANKS / 64u; i++)
					dc[k].bits[i] |= c[k].bits[i];
		}
		if (gone(eng, hal, team, q))
			set_add(&d, dc, q);
	}
	ag->est = d;
	ag->decided = 1;
	return 1;
}

/* The agreement completed: the team may start another. */
static void end(struct dpa_engine *eng, struct dpa_agree *ag)
{
	__atomic_store_n(&ag->active, 0, __ATOMIC_RELEASE);
	__atomic_fetch_sub(&eng->agreements, 1, __ATOMIC_SEQ_CST);
}

/* Coordinator c's decision, complete in our block: it replaces whatever we held. */
static void adopt(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_agree *ag,
		  uint32_t t, uint32_t c)
{
	const struct dpa_team *team = &eng->teams[t];
	struct offload_agree_chunk *dc = my_chunks(eng, hal, t, 1, team->my_rank);
	const struct offload_agree_chunk *theirs = my_chunks(eng, hal, t, 1, c);

	ag->est = *my_word(eng, hal, t, 1, c);
	for (uint32_t k = 0; k < offload_agree_chunks(team->size); k++)
		dc[k] = theirs[k];
	ag->decided = 1;
}

/* The agreed set by world rank into the caller's bitmap (when its arguments are still
 * there); returns its first word, the completion's result0. */
static uint64_t report(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_agree *ag,
		       uint32_t t)
{
	const struct dpa_team *team = &eng->teams[t];
	struct offload_agree_args *args = args_of(eng, hal, &ag->cmd);
	struct offload_agree_chunk *dc = my_chunks(eng, hal, t, 1, team->my_rank);
	uint64_t *failed = args ? offload_agree_failed(args) : NULL, first = 0;

	if (failed)
		__builtin_memset(failed, 0, 8ull * offload_rank_words(eng->params.world_size));
	for (uint32_t p = 0; p < team->size; p++) {
		uint32_t r = team->peers[p].world_rank;

		if (!(*set_word(&ag->est, dc, p) >> (p % 64u) & 1u))
			continue;
		if (failed)
			failed[r / 64u] |= 1ull << (r % 64u);
		if (r < 64u)
			first |= 1ull << r;
	}
	if (args) {
		args->value = ag->est.value;
		args->differs = ag->est.extra;
	}
	return first;
}

/* Advance the team's agreement; returns work done. */
static int step(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t t)
{
	struct dpa_agree *ag = &eng->agree[t];
	const struct dpa_team *team = &eng->teams[t];
	int work = 0;

	if (!post_all(eng, hal, t, ag, &ag->sent.p, &ag->sent.k, 0))
		return 0;
	/* A member that runs a collective instead: fail naming it (OFFLOAD_ERR_MISMATCH, as
	 * for ops) once that is not the echo of a failure (dpa_out_of_step). */
	for (uint32_t q = 0; q < team->size; q++) {
		uint32_t their_op;

		if (q == team->my_rank || off_load_acquire(&my_word(eng, hal, t, 0, q)->epoch) == ag->epoch ||
		    !runs_collective(eng, hal, t, team, q, &their_op))
			continue;
		/* Not before it is settled: q must not count as gone in the rounds meanwhile
		 * (it may close once it failed its op for the same reason). */
		if (!dpa_out_of_step(eng, hal, team, &ag->oos_since)) {
			if (ag->oos_since)
				return work;
			continue;
		}
		if (!dpa_complete_cmd(eng, hal, &ag->cmd, OFFLOAD_ERR_MISMATCH,
				      team->peers[q].world_rank,
				      (uint64_t)OFFLOAD_MISMATCH_OP << OFFLOAD_MISMATCH_SHIFT | OFFLOAD_OP_AGREE, their_op))
			return work;
		end(eng, ag);
		return work + 1;
	}
	while (ag->round < team->size) {
		uint32_t c = ag->round;

		if (c == team->my_rank) {
			if (!ag->decided && !decide(eng, hal, ag, t))
				return work;
			if (!post_all(eng, hal, t, ag, &ag->told.p, &ag->told.k, 1))
				return work;
		} else if (complete(eng, hal, t, 1, c, ag->epoch)) {
			adopt(eng, hal, ag, t, c);
		} else if (!gone(eng, hal, team, c)) {
			if (dpa_hal_time_ns(hal) > ag->deadline_ns)
				break;
			return work;
		}
		ag->round++;
		work++;
	}
	/* Our words landed before we report: a member may still wait for our decision. */
	if (dpa_ctrl_opi_pending(eng, DPA_AGREE_OPI + t))
		return work;
	if (ag->round < team->size) {  /* ran past op_timeout: a live member never joined */
		if (!dpa_complete_cmd(eng, hal, &ag->cmd, OFFLOAD_ERR_TIMEOUT,
				      team->peers[team->my_rank].world_rank, 0, 0))
			return work;
	} else {
		uint64_t first = report(eng, hal, ag, t);

		if (!dpa_complete_cmd(eng, hal, &ag->cmd, OFFLOAD_OK, ag->est.extra, first,
				      ag->est.value))
			return work;
	}
	end(eng, ag);
	return work + 1;
}

int dpa_agree_progress(struct dpa_engine *eng, struct dpa_hal *hal)
{
	uint32_t me = dpa_hal_thread_index(hal), nthreads = dpa_hal_num_threads(hal);
	int work = 0;

	if (!__atomic_load_n(&eng->agreements, __ATOMIC_SEQ_CST))
		return 0;
	for (uint32_t t = me; t < OFFLOAD_MAX_TEAMS; t += nthreads)
		if (__atomic_load_n(&eng->agree[t].active, __ATOMIC_ACQUIRE)) {
			work += step(eng, hal, t);
			/* The op timeout is a wait no event ends. */
			if (__atomic_load_n(&eng->agree[t].active, __ATOMIC_ACQUIRE) &&
			    eng->agree[t].deadline_ns != UINT64_MAX)
				dpa_wake_at(eng, hal, eng->agree[t].deadline_ns + 1);
		}
	return work;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The queue: post commands, reap completions into the request table, test, wait (spin,
 * then sleep on the completion ring while the DPA works), cancel, create teams.
 *
 * Cooperative progress (emulator): a thread that posts, tests or waits for a small op runs
 * the firmware itself through the device's drive op, instead of ringing the doorbell and
 * sleeping until a progress thread did the work: no hand-off between threads, and no
 * wake-up, on the path of a small exchange. Bulk ops stay with the progress threads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"
#include "offload_atomic.h"


/* Drain the completion ring into the tag table. Called with ctx->lock held. */
void host_reap_locked(struct host_ctx *ctx)
{
	uint32_t head = ctx->ring->cq_head;                 /* ours */
	uint32_t tail = off_load_acquire(&ctx->ring->cq_tail); /* pairs with the DPA's release */

	while (head != tail) {
		const struct offload_cqe *c = &ctx->cq[head & (ctx->cq_entries - 1)];
		struct host_tag *t = &ctx->tags[c->tag % HOST_TAGS];

		/* An op that failed because a peer died or became unreachable names it: from now
		 * on the failed set lists it too, whatever told the firmware first (the watch, or
		 * the peer's memory refusing a write), so a caller that reads the set after the
		 * error finds the rank it names, and every later op of its teams fails at intake. */
		if ((c->status == OFFLOAD_ERR_PEER || c->status == OFFLOAD_ERR_LINK_DOWN) &&
		    c->detail < ctx->size && c->detail != ctx->rank)
			offload_rankset_add(host_rank_set(ctx, 0), &ctx->ring->failed_gen, c->detail);
		if (t->tag == c->tag && (t->state == TAG_PENDING || t->state == TAG_ABANDONED)) {
			host_mr_put_locked(ctx, t->mr);
			t->done = (struct host_completion){ .status = c->status, .detail = c->detail,
				.result0 = c->result0, .result1 = c->result1 };
			t->state = t->state == TAG_ABANDONED ? TAG_FREE : TAG_DONE;
			ctx->inflight--;
		}
		head++;
	}
	off_store_release(&ctx->ring->cq_head, head);  /* the DPA may reuse those entries */
}

static int post_locked(struct host_ctx *ctx, const struct host_op *op,
		       const struct host_op_mr mr[HOST_OP_BUFS], uint32_t *tag_out)
{
	uint32_t tail = ctx->ring->sq_tail;  /* ours */
	uint32_t tag = ctx->next_tag;
	struct host_tag *t = &ctx->tags[tag % HOST_TAGS];
	struct offload_cmd *slot;

	host_reap_locked(ctx);
	if (t->state != TAG_FREE)
		return -EBUSY;
	if (tail - off_load_acquire(&ctx->ring->sq_head) >= ctx->sq_entries ||
	    ctx->inflight >= ctx->cq_entries)
		return -EAGAIN;
	slot = &ctx->sq[tail & (ctx->sq_entries - 1)];
	*slot = (struct offload_cmd){
		.opcode = (uint8_t)op->opcode, .flags = (uint8_t)op->flags, .team = (uint16_t)op->team,
		.tag = tag,
		.src_addr = op->src_addr, .dst_addr = op->dst_addr, .count = op->count,
		.src_key = op->src_key, .dst_key = op->dst_key, .dst_len = op->dst_len,
		.aux_addr = op->aux_addr, .aux_key = op->aux_key, .root = op->root,
	};
	*t = (struct host_tag){ .tag = tag, .state = TAG_PENDING,
		.mr = { mr[0], mr[1], mr[2] },
		.keys = { op->src_key, op->dst_key, op->aux_key }, .small = !!op->small };
	ctx->inflight++;
	ctx->next_tag = tag + 1 ? tag + 1 : 1;  /* tag 0 is never used */
	off_store_release(&ctx->ring->sq_tail, tail + 1);  /* pairs with the DPA's acquire */
	*tag_out = tag;
	return 0;
}

/* Does test() run the firmware for an op of this size? Only a small one: a test() in a
 * loop between other work must stay cheap. */
static int drives(const struct host_ctx *ctx, uint32_t small)
{
	return small && ctx->coop && ctx->ops->drive;
}

static int post_in(struct host_ctx *ctx, const struct host_op *user_op, int64_t timeout_ns,
		   uint32_t *tag)
{
	int64_t deadline = 0;  /* set once the ring is full: a post reads no clock otherwise */
	struct timespec pause = { 0, 20000 };
	struct host_op op = *user_op;
	struct host_op_mr mr[HOST_OP_BUFS] = { { 0, 0 } };
	int rc;

	/* Fields wider here than in the 64-byte slot must fit it, not be truncated. */
	if (op.opcode == OFFLOAD_OP_NOP || op.opcode >= OFFLOAD_OP_MAX || op.team > UINT16_MAX ||
	    op.flags > UINT8_MAX)
		return -EINVAL;
	rc = host_mr_get_op(ctx, &op, mr);
	if (rc)
		return rc;
	while (!rc) {
		pthread_mutex_lock(&ctx->lock);
		rc = post_locked(ctx, &op, mr, tag);
		pthread_mutex_unlock(&ctx->lock);
		if (rc != -EAGAIN)
			break;
		/* Ring full: the DPA frees slots at intake; wait for it, bounded. */
		ctx->ops->doorbell(ctx->dev);
		if (closing(ctx)) {
			rc = -ESHUTDOWN;
			break;
		}
		int64_t now = now_ns();

		if (!deadline)
			deadline = now + (timeout_ns > 0 ? timeout_ns : 0);
		if (now >= deadline)
			break;
		nanosleep(&pause, NULL);
		rc = 0;
	}
	if (rc) {
		host_mr_put(ctx, mr);
		return rc;
	}
	/* The op starts on this thread (a small one; a bulk one too where the device lets
	 * the host copy): it takes the command, and its first messages leave now. What
	 * remains waits for peers, whose writes wake whoever runs the firmware then; only a
	 * drive that could not run (or not to the end) needs the doorbell. */
	uint32_t how = op.small ? HOST_DRIVE_NO_BULK | HOST_DRIVE_SMALL_POST : HOST_DRIVE_BULK_CMD;

	if (!ctx->coop || !ctx->ops->drive || ctx->ops->drive(ctx->dev, NULL, 0, 0, how))
		ctx->ops->doorbell(ctx->dev);
	return 0;
}

int host_post(struct host_ctx *ctx, const struct host_op *op, int64_t timeout_ns, uint32_t *tag)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = post_in(ctx, op, timeout_ns, tag);
	leave(ctx);
	return rc;
}

/* 1: done (out filled, tag freed); 0: pending, *small its size class; -ENOENT: unknown
 * tag. */
static int take_locked(struct host_ctx *ctx, uint32_t tag, struct host_completion *out,
		       uint32_t *small)
{
	struct host_tag *t = &ctx->tags[tag % HOST_TAGS];

	if (t->tag != tag || t->state == TAG_FREE || t->state == TAG_ABANDONED)
		return -ENOENT;
	host_reap_locked(ctx);
	if (t->state != TAG_DONE) {
		*small = t->small;
		return 0;
	}
	*out = t->done;
	t->state = TAG_FREE;
	return 1;
}

static int take(struct host_ctx *ctx, uint32_t tag, struct host_completion *out,
		uint32_t *small)
{
	int rc;

	pthread_mutex_lock(&ctx->lock);
	rc = take_locked(ctx, tag, out, small);
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

static int test_in(struct host_ctx *ctx, uint32_t tag, struct host_completion *out)
{
	uint32_t small = 0;
	int rc = take(ctx, tag, out, &small);

	/* Not done: give the firmware a turn on this thread (cooperative progress). */
	if (rc == 0 && drives(ctx, small) &&
	    ctx->ops->drive(ctx->dev, NULL, 0, 0, HOST_DRIVE_NO_BULK) == 0)
		rc = take(ctx, tag, out, &small);
	return rc;
}

int host_test(struct host_ctx *ctx, uint32_t tag, struct host_completion *out)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = test_in(ctx, tag, out);
	leave(ctx);
	return rc;
}

int host_done(struct host_ctx *ctx, uint32_t tag, struct host_completion *out)
{
	uint32_t small;
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = take(ctx, tag, out, &small);
	leave(ctx);
	return rc;
}

static int wait_in(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns, int64_t poll_ns,
		   struct host_completion *out)
{
	int64_t start = 0, deadline = INT64_MAX;  /* from the first look that finds it pending */
	/* A small op's waiter runs the firmware; for a bulk op's the device decides whether
	 * the host may copy (a command its threads have not taken yet is bulk work too). */
	int drive = ctx->coop && ctx->ops->drive;
	int poll = -1;  /* is polling worthwhile: asked when first needed (it reads every
			 * rank's line; a wait that drives never needs it) */
	uint32_t small = 0;

	for (;;) {
		uint32_t seen = off_load_acquire(&ctx->ring->cq_tail);
		int64_t now, left;
		int rc = take(ctx, tag, out, &small);

		if (rc)
			return rc < 0 ? rc : 0;
		if (closing(ctx))  /* woken by host_ctx_shutdown(); the op stays pending */
			return -ESHUTDOWN;
		now = now_ns();
		if (!start) {
			start = now;
			if (timeout_ns >= 0)
				deadline = start + timeout_ns;
		}
		if (now >= deadline)
			return -ETIMEDOUT;
		left = deadline - now < HOST_SLEEP_MAX ? deadline - now : HOST_SLEEP_MAX;
		/* Run the firmware here until the completion ring moves; -EBUSY (another thread
		 * drives, bulk work came in, or the context closes): sleep on the ring below
		 * instead (or, closing, leave at the top of the loop). */
		if (drive && ctx->ops->drive(ctx->dev, &ctx->ring->cq_tail, seen, left,
					     small ? 0 : HOST_DRIVE_BULK_WAIT) != -EBUSY)
			continue;
		if (now - start < poll_ns) {
			if (poll < 0)
				poll = ctx->ops->poll_worthwhile(ctx->dev);
			if (poll) {
				for (int i = 0; i < OFF_SPIN_PAUSES; i++)
					off_cpu_relax();
				continue;
			}
		}
		off_fetch_add(&ctx->ring->cq_waiters, 1);
		/* Pairs with the DPA's fence between publishing cq_tail and reading cq_waiters. */
		off_fence();
		if (off_load_acquire(&ctx->ring->cq_tail) == seen && !closing(ctx))
			ctx->ops->wait_completion(ctx->dev, &ctx->ring->cq_tail, seen, left);
		off_fetch_sub(&ctx->ring->cq_waiters, 1);
	}
}

int host_wait(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns, int64_t poll_ns,
	      struct host_completion *out)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = wait_in(ctx, tag, timeout_ns, poll_ns, out);
	leave(ctx);
	return rc;
}

static void abandon_in(struct host_ctx *ctx, uint32_t tag)
{
	struct host_tag *t = &ctx->tags[tag % HOST_TAGS];

	pthread_mutex_lock(&ctx->lock);
	host_reap_locked(ctx);
	if (t->tag == tag && t->state == TAG_PENDING)
		t->state = TAG_ABANDONED;
	else if (t->tag == tag && t->state == TAG_DONE)
		t->state = TAG_FREE;
	pthread_mutex_unlock(&ctx->lock);
}

void host_abandon(struct host_ctx *ctx, uint32_t tag)
{
	if (enter(ctx))
		return;
	abandon_in(ctx, tag);
	leave(ctx);
}

int host_cancel(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns)
{
	struct host_op op = { .opcode = OFFLOAD_OP_CANCEL, .count = tag };
	struct host_completion done;
	uint32_t cancel_tag;
	int rc = host_post(ctx, &op, timeout_ns, &cancel_tag);

	if (rc)
		return rc;
	rc = host_wait(ctx, cancel_tag, timeout_ns, 0, &done);
	if (rc) {
		host_abandon(ctx, cancel_tag);
		return rc;
	}
	return done.status == OFFLOAD_OK ? 0 : -ENOENT;
}

static int team_create_in(struct host_ctx *ctx, uint32_t team_id, uint32_t nmembers,
			  const uint32_t *world_ranks, int64_t timeout_ns)
{
	struct offload_team_desc *desc;
	struct host_completion done;
	struct host_op op = { .opcode = OFFLOAD_OP_TEAM_CREATE, .team = team_id };
	uint32_t tag, me = nmembers;
	int rc;

	if (team_id >= OFFLOAD_MAX_TEAMS || nmembers == 0 || nmembers > ctx->size)
		return -EINVAL;
	desc = calloc(1, offload_team_desc_bytes(nmembers));
	if (!desc)
		return -ENOMEM;
	desc->team_id = team_id;
	desc->size = nmembers;
	for (uint32_t i = 0; i < nmembers; i++) {
		if (world_ranks[i] == ctx->rank)
			me = i;
		rc = ctx->ops->peer_ctrl(ctx->dev, world_ranks[i], &desc->peers[i]);
		if (rc)
			goto out;
	}
	rc = -EINVAL;
	if (me == nmembers)
		goto out;
	desc->my_rank = me;
	op.aux_addr = (uint64_t)(uintptr_t)desc;
	op.aux_len = offload_team_desc_bytes(nmembers);
	rc = host_post(ctx, &op, timeout_ns, &tag);
	if (rc)
		goto out;
	rc = host_wait(ctx, tag, timeout_ns, 0, &done);
	if (rc == -ETIMEDOUT || rc == -ESHUTDOWN) {
		/* The firmware may still read desc: leak it rather than free under its feet. */
		host_abandon(ctx, tag);
		return rc;
	}
	if (!rc && done.status)
		rc = -EINVAL;
out:
	free(desc);
	return rc;
}

int host_team_create(struct host_ctx *ctx, uint32_t team_id, uint32_t nmembers,
		     const uint32_t *world_ranks, int64_t timeout_ns)
{
	int rc;

	if (enter(ctx))
		return -ESHUTDOWN;
	rc = team_create_in(ctx, team_id, nmembers, world_ranks, timeout_ns);
	leave(ctx);
	return rc;
}

/* Is key used by an op the firmware may still be running? Call with ctx->lock held. Tags
 * are handed out in turn, so the ops in flight sit just below next_tag: walk back from it
 * until all of them were seen, not through the whole table. */
int host_key_busy_locked(struct host_ctx *ctx, uint32_t key)
{
	uint32_t left;

	host_reap_locked(ctx);
	left = ctx->inflight;
	for (uint32_t i = 1; left && i <= HOST_TAGS; i++) {
		const struct host_tag *t = &ctx->tags[(ctx->next_tag - i) % HOST_TAGS];

		if (t->state != TAG_PENDING && t->state != TAG_ABANDONED)
			continue;
		left--;
		if (t->keys[0] == key || t->keys[1] == key || t->keys[2] == key)
			return 1;
	}
	return 0;
}

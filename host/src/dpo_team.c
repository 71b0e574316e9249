/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Teams over a subset of the context's ranks, created by their members only.
 *
 * One OOB allgather among the members carries each one's context rank and, from team
 * rank 0, the DPA team slot it claimed. In the emulator (one host) the claim is a CAS in
 * the job-wide slot table, so two live teams never share a slot anywhere in the job: a
 * slot is also a multicast group, which disjoint teams must not share. A slot is free
 * again once every member destroyed its team (users back to 0), so a new team's first
 * words never land in a member's control region before that member zeroed it (the
 * firmware's TEAM_DESTROY). Without a job-wide table (hardware backends) the members
 * agree on the lowest slot free on all of them.
 *
 * Every member decides from the same gathered records, so they all succeed or all fail
 * alike.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dpo_internal.h"

#define NO_SLOT 0xffffffffu

struct team_rec {
	uint32_t ctx_rank;
	uint32_t slot;       /* team rank 0's claim; NO_SLOT if none (or not rank 0) */
	uint32_t free_mask;  /* team slots free on this rank */
	uint32_t resv;
};

static uint32_t claim_slot(struct dpo_context *ctx, uint32_t members)
{
	uint32_t slot = NO_SLOT;

	pthread_mutex_lock(&ctx->lock);
	for (uint32_t i = 0; i < OFFLOAD_MAX_TEAMS && slot == NO_SLOT; i++) {
		/* Start past the last claim: a just-destroyed slot is reused last. */
		uint32_t s = (ctx->next_claim + i) % OFFLOAD_MAX_TEAMS, zero = 0;

		if (ctx->local_used & (1u << s))
			continue;
		if (__atomic_compare_exchange_n(&ctx->slots->users[s], &zero, members, 0,
						__ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
			slot = s;
			ctx->local_used |= 1u << s;
			ctx->next_claim = s + 1;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	return slot;
}

static void release_local(struct dpo_context *ctx, uint32_t slot)
{
	pthread_mutex_lock(&ctx->lock);
	ctx->local_used &= ~(1u << slot);
	pthread_mutex_unlock(&ctx->lock);
}

/* Mark rank r in a bitmap of ranks; 1 if it was marked already. */
static int seen_before(uint64_t *seen, uint32_t r)
{
	uint64_t bit = 1ull << (r % 64);
	int was = !!(seen[r / 64] & bit);

	seen[r / 64] |= bit;
	return was;
}

static dpo_status_t check_map(struct dpo_context *ctx, const dpo_team_params_t *p,
			      uint64_t *seen)
{
	const dpo_ep_map_t *m = &p->ep_map;

	for (uint32_t i = 0; i < m->ep_num; i++)
		if (m->map[i] >= ctx->size || seen_before(seen, m->map[i]))
			return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: team ranks must "
					"be distinct context ranks below %u (map[%u] = %u)", ctx->size,
					i, m->map[i]);
	if (m->map[p->oob.oob_ep] != ctx->rank)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: map[oob_ep %u] = %u "
				"is not this rank (%u)", p->oob.oob_ep, m->map[p->oob.oob_ep], ctx->rank);
	return DPO_OK;
}

static dpo_status_t check_params(struct dpo_context *ctx, const dpo_team_params_t *p)
{
	const dpo_ep_map_t *m = &p->ep_map;
	uint64_t *seen;
	dpo_status_t st;

	if (!(p->mask & DPO_TEAM_PARAM_FIELD_OOB) || !p->oob.allgather || !p->oob.req_test)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: the team needs an OOB "
				"over its members (DPO_TEAM_PARAM_FIELD_OOB, allgather, req_test)");
	if (!p->oob.n_oob_eps || p->oob.n_oob_eps > ctx->size || p->oob.oob_ep >= p->oob.n_oob_eps)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: oob_ep %u of n_oob_eps "
				"%u: a team has 1..%u members (the context's size)", p->oob.oob_ep,
				p->oob.n_oob_eps, ctx->size);
	if (!(p->mask & DPO_TEAM_PARAM_FIELD_EP_MAP))
		return DPO_OK;
	if (m->ep_num != p->oob.n_oob_eps)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: ep_map has %u members "
				"but the OOB %u", m->ep_num, p->oob.n_oob_eps);
	if (m->type == DPO_EP_MAP_FULL) {
		if (m->ep_num != ctx->size || p->oob.oob_ep != ctx->rank)
			return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: a FULL ep_map "
					"spans all %u ranks with team rank = context rank", ctx->size);
		return DPO_OK;
	}
	if (m->type != DPO_EP_MAP_ARRAY || !m->map)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: ep_map type must be "
				"DPO_EP_MAP_FULL or DPO_EP_MAP_ARRAY with a map");
	seen = calloc(offload_rank_words(ctx->size), sizeof(*seen));
	if (!seen)
		return dpo_fail(DPO_ERR_NO_MEMORY, "dpo_team_create_post: out of memory");
	st = check_map(ctx, p, seen);
	free(seen);
	return st;
}

DPO_API dpo_status_t dpo_team_create_post(dpo_context_h ctx, const dpo_team_params_t *params,
					  dpo_team_h *out)
{
	struct dpo_team *t;
	struct team_rec *me;
	dpo_status_t st;

	dpo_clear_error();
	if (!ctx || !params || !out)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_post: NULL argument");
	*out = NULL;
	st = check_params(ctx, params);
	if (st)
		return st;
	t = calloc(1, sizeof(*t));
	if (!t)
		return dpo_fail(DPO_ERR_NO_MEMORY, "dpo_team_create_post: out of memory");
	t->ctx = ctx;
	t->oob = params->oob;
	t->size = params->oob.n_oob_eps;
	t->rank = params->oob.oob_ep;
	t->slot = NO_SLOT;
	t->send_rec = calloc(1, sizeof(struct team_rec));
	t->recv_recs = calloc(t->size, sizeof(struct team_rec));
	t->ctx_ranks = calloc(t->size, sizeof(uint32_t));
	if (params->mask & DPO_TEAM_PARAM_FIELD_EP_MAP && params->ep_map.type == DPO_EP_MAP_ARRAY) {
		t->has_map = 1;
		t->map = malloc(t->size * sizeof(uint32_t));
		if (t->map)
			memcpy(t->map, params->ep_map.map, t->size * sizeof(uint32_t));
	}
	if (!t->send_rec || !t->recv_recs || !t->ctx_ranks || (t->has_map && !t->map)) {
		free(t->send_rec), free(t->recv_recs), free(t->map), free(t->ctx_ranks), free(t);
		return dpo_fail(DPO_ERR_NO_MEMORY, "dpo_team_create_post: out of memory");
	}
	me = t->send_rec;
	me->ctx_rank = ctx->rank;
	me->slot = NO_SLOT;
	pthread_mutex_lock(&ctx->lock);
	me->free_mask = ~ctx->local_used & ((1u << OFFLOAD_MAX_TEAMS) - 1);
	ctx->teams++;
	pthread_mutex_unlock(&ctx->lock);
	if (t->rank == 0 && ctx->slots) {
		me->slot = claim_slot(ctx, t->size);
		t->claimed = me->slot != NO_SLOT;
	}
	t->state = DPO_TEAM_EXCHANGE;
	st = t->oob.allgather(t->send_rec, t->recv_recs, sizeof(struct team_rec),
			      t->oob.coll_info, &t->oob_req);
	if (st != DPO_OK) {
		t->state = DPO_TEAM_FAILED;
		t->failure = dpo_fail(DPO_ERR_OOB, "team creation: the OOB allgather failed (%s)",
				      dpo_status_string(st));
		snprintf(t->failure_msg, sizeof(t->failure_msg), "%s", dpo_last_error());
	}
	*out = t;
	return DPO_OK;
}

/* The verdict every member reaches alike from the gathered records. */
static dpo_status_t decide(struct dpo_team *t, const struct team_rec *r)
{
	struct dpo_context *ctx = t->ctx;
	uint64_t *seen = calloc(offload_rank_words(ctx->size), sizeof(*seen));
	uint32_t common = (1u << OFFLOAD_MAX_TEAMS) - 1;

	if (!seen)
		return dpo_fail(DPO_ERR_NO_MEMORY, "team creation: out of memory");
	for (uint32_t i = 0; i < t->size; i++) {
		if (r[i].ctx_rank >= ctx->size || seen_before(seen, r[i].ctx_rank)) {
			free(seen);
			return dpo_fail(DPO_ERR_INVALID_PARAM, "team creation: the members' OOB "
					"gathered context rank %u twice or out of range: each "
					"member must pass its own oob_ep", r[i].ctx_rank);
		}
		if (t->has_map && t->map[i] != r[i].ctx_rank) {
			free(seen);
			return dpo_fail(DPO_ERR_INVALID_PARAM, "team creation: ep_map says team rank "
					"%u is context rank %u, but rank %u answered", i, t->map[i],
					r[i].ctx_rank);
		}
		common &= r[i].free_mask;
		t->ctx_ranks[i] = r[i].ctx_rank;
	}
	free(seen);
	if (ctx->slots) {
		t->slot = r[0].slot;
	} else {
		t->slot = NO_SLOT;
		for (uint32_t s = 0; s < OFFLOAD_MAX_TEAMS && t->slot == NO_SLOT; s++)
			if (common >> s & 1)
				t->slot = s;
	}
	if (t->slot >= OFFLOAD_MAX_TEAMS)
		return dpo_fail(DPO_ERR_NO_RESOURCE, "team creation: no DPA team slot is free "
				"(at most %u teams live at once in the job): destroy some teams",
				OFFLOAD_MAX_TEAMS);
	return DPO_OK;
}

static dpo_status_t create_here(struct dpo_team *t)
{
	struct dpo_context *ctx = t->ctx;
	int rc;

	pthread_mutex_lock(&ctx->lock);
	if (t->rank != 0 || !ctx->slots) {
		if (ctx->local_used & (1u << t->slot)) {
			pthread_mutex_unlock(&ctx->lock);
			return dpo_fail(DPO_ERR_NO_RESOURCE, "team creation: slot %u is taken on this "
					"rank by a team created meanwhile: with hardware backends "
					"create teams from one thread at a time", t->slot);
		}
		ctx->local_used |= 1u << t->slot;
	}
	pthread_mutex_unlock(&ctx->lock);
	rc = host_team_create(ctx->host, t->slot, t->size, t->ctx_ranks,
			      (int64_t)(ctx->cfg.post_timeout * 1e9));
	if (rc) {
		release_local(ctx, t->slot);
		return dpo_from_errno(rc, "team creation");
	}
	t->created = 1;
	return DPO_OK;
}

static void fail_team(struct dpo_team *t, dpo_status_t st)
{
	struct dpo_context *ctx = t->ctx;

	t->state = DPO_TEAM_FAILED;
	t->failure = st;
	snprintf(t->failure_msg, sizeof(t->failure_msg), "%s", dpo_last_error());
	if (t->claimed && !t->created) {
		/* Nobody created it: the claim goes back as it was taken. */
		__atomic_store_n(&ctx->slots->users[t->slot], 0, __ATOMIC_SEQ_CST);
		t->claimed = 0;
		release_local(ctx, t->slot);
	}
}

DPO_API dpo_status_t dpo_team_create_test(dpo_team_h t)
{
	dpo_status_t st;

	dpo_clear_error();
	if (!t)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_create_test: team is NULL");
	if (t->state == DPO_TEAM_READY)
		return DPO_OK;
	if (t->state == DPO_TEAM_FAILED)
		return dpo_fail(t->failure, "%s", t->failure_msg);
	st = t->oob.req_test(t->oob_req);
	if (st == DPO_INPROGRESS)
		return DPO_INPROGRESS;
	if (t->oob.req_free)
		t->oob.req_free(t->oob_req);
	t->oob_req = NULL;
	if (st != DPO_OK) {
		if (t->rank == 0 && t->claimed)
			t->slot = ((struct team_rec *)t->send_rec)->slot;
		fail_team(t, dpo_fail(DPO_ERR_OOB, "team creation: the OOB allgather failed (%s)",
				      dpo_status_string(st)));
		return t->failure;
	}
	if (t->rank == 0 && t->claimed)
		t->slot = ((struct team_rec *)t->send_rec)->slot;
	st = decide(t, t->recv_recs);
	if (st) {
		fail_team(t, st);  /* the same verdict everywhere: nobody created it */
		return st;
	}
	st = create_here(t);
	if (st) {
		/* This member alone failed: it leaves its count, as a destroy would. */
		if (t->ctx->slots)
			__atomic_fetch_sub(&t->ctx->slots->users[t->slot], 1, __ATOMIC_SEQ_CST);
		t->claimed = 0;
		fail_team(t, st);
		return st;
	}
	t->state = DPO_TEAM_READY;
	return DPO_OK;
}

DPO_API dpo_status_t dpo_team_destroy(dpo_team_h t)
{
	struct dpo_context *ctx;
	struct host_completion c;
	struct host_op op;
	uint32_t tag;
	int rc;

	dpo_clear_error();
	if (!t)
		return DPO_OK;
	ctx = t->ctx;
	if (t->requests)
		return dpo_fail(DPO_ERR_BUSY, "dpo_team_destroy: %u requests of the team are not "
				"finalized", t->requests);
	if (t->state == DPO_TEAM_EXCHANGE)
		return dpo_fail(DPO_ERR_BUSY, "dpo_team_destroy: the team is being created; call "
				"dpo_team_create_test until it returns");
	if (t->created) {
		memset(&op, 0, sizeof(op));
		op.opcode = OFFLOAD_OP_TEAM_DESTROY;
		op.team = t->slot;
		rc = host_post(ctx->host, &op, (int64_t)(ctx->cfg.post_timeout * 1e9), &tag);
		if (!rc)
			rc = host_wait(ctx->host, tag, -1, 0, &c);
		if (rc)
			return dpo_from_errno(rc, "dpo_team_destroy");
		if (c.status)
			return dpo_fail((dpo_status_t)c.status, "dpo_team_destroy: the DPA refused "
					"(%s): an op of the team is still running",
					dpo_status_string((dpo_status_t)c.status));
		release_local(ctx, t->slot);
		/* Last: the slot may be claimed again once every member got here. */
		if (ctx->slots)
			__atomic_fetch_sub(&ctx->slots->users[t->slot], 1, __ATOMIC_SEQ_CST);
	}
	pthread_mutex_lock(&ctx->lock);
	ctx->teams--;
	pthread_mutex_unlock(&ctx->lock);
	free(t->send_rec);
	free(t->recv_recs);
	free(t->map);
	free(t->ctx_ranks);
	free(t);
	return DPO_OK;
}

DPO_API dpo_status_t dpo_team_get_attr(dpo_team_h t, dpo_team_attr_t *attr)
{
	dpo_clear_error();
	if (!t || !attr)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_get_attr: NULL argument");
	if (t->state != DPO_TEAM_READY)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_team_get_attr: the team is not created "
				"(dpo_team_create_test did not return DPO_OK)");
	attr->size = t->size;
	attr->rank = t->rank;
	attr->id = t->slot;
	attr->resv = 0;
	attr->ctx_ranks = t->ctx_ranks;
	return DPO_OK;
}

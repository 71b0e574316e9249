/* SPDX-License-Identifier: Apache-2.0 */
/*
 * -scale: agreement (OFFLOAD_OP_AGREE, what create_team and shrink stand on) in a job of
 * more than 64 ranks, whose failed sets are bitmaps of offload_rank_words(n) words and
 * whose team members past 64 travel in the control words' chunks (ABI 14).
 *
 * Every rank agrees over the world; two ranks propose others as failed (the last rank, so a
 * world rank >= 64, and rank 2), every proposal carries its own rank as value and one rank
 * passes another fingerprint. Each rank must get the same answer: exactly those two failed,
 * the largest value, the rank whose fingerprint differed. Then the survivors (the world
 * less the agreed set: what shrink builds) form a team and run an all-to-all on it, every
 * element checked, and agree once more among themselves (a team of at most 64: the word
 * alone).
 */
#include <stdlib.h>
#include <string.h>

#include "multirank.h"

#define SHRUNK_TEAM 4u

/* Post an agreement on team with these proposals; 0 once it completed, failed[] then
 * holding the agreed set (offload_rank_words(n) words). */
static int agree(struct rank *r, uint32_t team, const uint64_t *proposed, uint64_t value,
		 uint32_t fp, uint64_t *failed, uint64_t *agreed_value, uint32_t *differs,
		 const char *what)
{
	uint32_t words = offload_rank_words(r->n), tag;
	uint64_t *block = calloc(offload_agree_args_bytes(r->n) / 8, 8);
	struct offload_agree_args *args = (struct offload_agree_args *)(void *)block;
	struct host_completion c;
	int rc;

	if (!block) {
		fail(r, "%s: out of memory", what);
		return -1;
	}
	*args = (struct offload_agree_args){ .nranks = r->n, .words = words, .value = value, .fp = fp };
	memcpy(offload_agree_failed(args), proposed, 8ull * words);
	rc = post(r, &(struct host_op){ .opcode = OFFLOAD_OP_AGREE, .team = team,
			.aux_addr = (uintptr_t)block, .aux_len = offload_agree_args_bytes(r->n) },
		  &tag, what);
	if (!rc)
		rc = wait_ok(r, tag, &c, what);
	if (!rc) {
		memcpy(failed, offload_agree_failed(args), 8ull * words);
		*agreed_value = args->value;
		*differs = args->differs;
		if (c.result0 != failed[0] || c.result1 != args->value || c.detail != args->differs)
			fail(r, "%s: the completion (%#llx, %llu, %u) does not repeat the arguments",
			     what, (unsigned long long)c.result0, (unsigned long long)c.result1,
			     c.detail);
	}
	free(block);
	return rc;
}

static int has(const uint64_t *set, uint32_t rank)
{
	return (int)(set[rank / 64] >> (rank % 64) & 1u);
}

static void add(uint64_t *set, uint32_t rank)
{
	set[rank / 64] |= 1ull << (rank % 64);
}

static void check_set(struct rank *r, const uint64_t *got, const uint64_t *want,
		      const char *what)
{
	for (uint32_t k = 0; k < r->n; k++)
		if (has(got, k) != has(want, k)) {
			fail(r, "%s: rank %u is%s in the agreed set", what, k,
			     has(got, k) ? "" : " not");
			return;
		}
}

void test_agreement_scale(struct rank *r)
{
	uint32_t last = r->n - 1, odd = r->n / 2;
	uint64_t proposed[MAX_N / 64 + 1] = { 0 }, failed[MAX_N / 64 + 1], want[MAX_N / 64 + 1] = { 0 };
	uint32_t survivors[MAX_N], nsurv = 0, my = 0, differs;
	uint64_t value;
	struct rank sub;
	struct a2a a;

	if (r->me == 1)
		add(proposed, last);
	if (r->me == last)
		add(proposed, 2);
	add(want, last);
	add(want, 2);
	if (agree(r, OFFLOAD_WORLD_TEAM, proposed, r->me, r->me == odd ? 99 : 7, failed, &value,
		  &differs, "agreement over the world"))
		return;
	check_set(r, failed, want, "agreement over the world");
	if (value != last || differs != odd + 1)
		fail(r, "agreement over the world: value %llu, differs %u (want %u, %u)",
		     (unsigned long long)value, differs, last, odd + 1);

	/* What shrink makes of it: the survivors, in world order. */
	for (uint32_t k = 0; k < r->n; k++) {
		if (has(failed, k))
			continue;
		if (k == r->me)
			my = nsurv;
		survivors[nsurv++] = k;
	}
	if (has(failed, r->me))
		return;  /* not a member: the others go on without us */
	if (host_team_create(r->ctx, SHRUNK_TEAM, nsurv, survivors, WAIT_NS)) {
		fail(r, "host_team_create(survivors) failed");
		return;
	}
	/* The all-to-all helpers size the team by the rank's n: a rank of the survivors' job. */
	sub = *r;
	sub.n = nsurv;
	if (!a2a_post(&sub, &a, 40, 91, 0, SHRUNK_TEAM, survivors))
		a2a_finish(&sub, &a);
	r->failures += sub.failures;
	memset(proposed, 0, sizeof(proposed));
	memset(want, 0, sizeof(want));
	if (my == 0)  /* one survivor proposes another failed, the last of them */
		add(proposed, survivors[nsurv - 1]);
	add(want, survivors[nsurv - 1]);
	if (!agree(r, SHRUNK_TEAM, proposed, 5, 7, failed, &value, &differs,
		   "agreement among the survivors")) {
		check_set(r, failed, want, "agreement among the survivors");
		if (value != 5 || differs)
			fail(r, "agreement among the survivors: value %llu, differs %u",
			     (unsigned long long)value, differs);
	}
}

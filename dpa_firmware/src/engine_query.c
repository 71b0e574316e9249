/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the runtime asks the engine between passes, to choose how it waits: how loaded it
 * is (bulk ops keep copying), how many events a sleep may wait for before a pass can do
 * anything, and when a firmware timer wants a pass though no event comes (a timer that is
 * due is taken: it asks once).
 */
#include "engine_internal.h"

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

	for (uint32_t w = 0; w < DPA_OP_MASK_WORDS; w++) {
		for (uint64_t m = off_load_acquire(&eng->active_ops[w]); m && need > 1; m &= m - 1) {
			const struct dpa_op *op = &eng->ops[w * 64 + (uint32_t)__builtin_ctzll(m)];

			if (off_load_acquire(&op->state) != DPA_OP_ACTIVE)
				continue;
			uint32_t n = off_read_once(&op->aborted) ? 1 : events_needed(op);

			if (n < need)
				need = n;
		}
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

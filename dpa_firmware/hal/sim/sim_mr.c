/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Registrations: a table per rank, looked up by key (its low 12 bits index the table, the
 * rest is drawn from the seed, as a NIC's keys carry a variant), never by address.
 */
#include <stdlib.h>

#include "sim.h"

#define SIM_MR_INDEX_BITS 12u

uint32_t sim_mr_reg(struct sim_world *w, struct sim_rank *r, uint64_t addr, uint64_t len,
		    uint32_t access, uint32_t phantom)
{
	struct sim_mr_table *t = &r->mrs;
	uint32_t idx = t->n;

	for (uint32_t i = 0; i < t->n; i++) {  /* reuse a freed entry: the variant changes */
		if (!t->mr[i].valid) {
			idx = i;
			break;
		}
	}
	if (idx == t->n) {
		if (t->n == (1u << SIM_MR_INDEX_BITS))
			return 0;
		if (t->n == t->cap) {
			uint32_t cap = t->cap ? t->cap * 2 : 16;
			struct sim_mr *mr = realloc(t->mr, cap * sizeof(*mr));

			if (!mr)
				return 0;
			t->mr = mr;
			t->cap = cap;
		}
		t->n++;
	}
	t->mr[idx] = (struct sim_mr){ .addr = addr, .len = len, .access = access, .valid = 1,
				      .phantom = phantom };
	t->mr[idx].key = ((uint32_t)(sim_rng_below(&w->rng[SIM_RNG_WORK], 0xfffff) + 1)
			  << SIM_MR_INDEX_BITS) | idx;
	return t->mr[idx].key;
}

void sim_mr_dereg(struct sim_rank *r, uint32_t key)
{
	uint32_t idx = key & ((1u << SIM_MR_INDEX_BITS) - 1);

	if (idx < r->mrs.n && r->mrs.mr[idx].valid && r->mrs.mr[idx].key == key)
		r->mrs.mr[idx].valid = 0;
}

const struct sim_mr *sim_mr_check(const struct sim_rank *r, uint32_t key, uint64_t addr,
				  uint64_t len, uint32_t access)
{
	uint32_t idx = key & ((1u << SIM_MR_INDEX_BITS) - 1);
	const struct sim_mr *mr;

	if (idx >= r->mrs.n)
		return NULL;
	mr = &r->mrs.mr[idx];
	if (!mr->valid || mr->key != key || (mr->access & access) != access ||
	    addr < mr->addr || addr - mr->addr > mr->len || len > mr->len - (addr - mr->addr))
		return NULL;
	return mr;
}

int sim_mr_released(const struct sim_rank *r, uint32_t key)
{
	uint32_t idx = key & ((1u << SIM_MR_INDEX_BITS) - 1);

	return idx < r->mrs.n && !r->mrs.mr[idx].valid && r->mrs.mr[idx].key == key;
}

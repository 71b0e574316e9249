/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An out-of-band allgather for forked ranks of one test program: a board in shared
 * anonymous memory (mapped before fork). One board per group of ranks; a round is
 * published with a sequence number and acknowledged before the next overwrites it.
 */
#ifndef CAPI_OOB_H
#define CAPI_OOB_H

#include <sched.h>
#include <string.h>
#include <sys/mman.h>

#include "dpa_offload.h"

#define OOB_MAX 16
#define OOB_BYTES 512

struct oob_board {
	volatile uint64_t seq[OOB_MAX];
	volatile uint64_t ack[OOB_MAX];
	char data[OOB_MAX][OOB_BYTES];
};

struct oob_ep {
	struct oob_board *board;
	uint32_t me, n;
	uint64_t round;
	void *recv;
	size_t size;
};

static struct oob_board *oob_board_new(void)
{
	void *p = mmap(NULL, sizeof(struct oob_board), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static dpo_status_t oob_allgather(void *src, void *recv, size_t size, void *info, void **req)
{
	struct oob_ep *ep = info;

	if (size > OOB_BYTES)
		return DPO_ERR_INVALID_PARAM;
	for (uint32_t i = 0; i < ep->n; i++)  /* everyone read the previous round */
		while (ep->board->ack[i] < ep->round)
			sched_yield();
	memcpy(ep->board->data[ep->me], src, size);
	__atomic_store_n(&ep->board->seq[ep->me], ep->round + 1, __ATOMIC_RELEASE);
	ep->recv = recv;
	ep->size = size;
	*req = ep;
	return DPO_OK;
}

static dpo_status_t oob_test(void *req)
{
	struct oob_ep *ep = req;

	for (uint32_t i = 0; i < ep->n; i++)
		if (__atomic_load_n(&ep->board->seq[i], __ATOMIC_ACQUIRE) < ep->round + 1)
			return DPO_INPROGRESS;
	for (uint32_t i = 0; i < ep->n; i++)
		memcpy((char *)ep->recv + i * ep->size, ep->board->data[i], ep->size);
	ep->round++;
	__atomic_store_n(&ep->board->ack[ep->me], ep->round, __ATOMIC_RELEASE);
	return DPO_OK;
}

static dpo_status_t oob_free(void *req)
{
	(void)req;
	return DPO_OK;
}

static dpo_oob_coll_t oob_of(struct oob_ep *ep)
{
	dpo_oob_coll_t o = { oob_allgather, oob_test, oob_free, ep, ep->n, ep->me };

	return o;
}

#endif

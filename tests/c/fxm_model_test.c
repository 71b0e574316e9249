/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FlexIO model's event handler semantics, through the FlexIO API alone (host side of
 * tests/test_flexio_model_semantics.py), as NVIDIA's samples describe them:
 *   1. flexio_event_handler_run() makes a handler runnable; it does not invoke it;
 *   2. a CQE on its armed CQ (here flexio_dev_zcqe_gen from an RPC) invokes it;
 *   3. never two invocations of one handler at once; events that come while it runs are
 *      not lost (it drains every CQE);
 *   4. an event before run() is lost, and the CQ it disarmed stays disarmed;
 *   5. a window takes a registration's key, reaches exactly that registration and writes
 *      land in host memory; an implicit on-demand-paging key is refused.
 * Prints one "ok ..." line per check; exits 1 with "FAIL ..." on the first failure.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>
#include <libflexio/flexio_ver.h>
#define FLEXIO_VER_USED FLEXIO_VER(24, 10, 0)
#include <libflexio/flexio.h>

#include "fxm_model_test.h"

extern struct flexio_app *fxm_test_app;
extern flexio_func_t fxm_test_handler;
extern flexio_func_t fxm_test_kick;
extern flexio_func_t fxm_test_read;
extern flexio_func_t fxm_test_window;

#define LOG_DEPTH 9  /* 512 CQEs: the whole burst fits, nothing overruns */

struct handler {
	struct flexio_event_handler *eh;
	struct flexio_cq *cq;
	flexio_uintptr_t state;
	uint32_t cqn;
};

static struct flexio_process *proc;

static void fail(const char *what)
{
	printf("FAIL %s\n", what);
	exit(1);
}

static uint64_t call(flexio_func_t *f, uint64_t a, uint64_t b)
{
	uint64_t ret = 0;

	if (flexio_process_call(proc, f, &ret, a, b) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_process_call");
	return ret;
}

static uint64_t field(const struct handler *h, size_t offset)
{
	return call(&fxm_test_read, h->state + offset, 0);
}

#define FIELD(h, name) field(h, offsetof(struct fxm_test_state, name))

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* Poll a state field until it reaches want (2 s at most); its last value. */
static uint64_t wait_for(const struct handler *h, size_t offset, uint64_t want)
{
	uint64_t v = 0;

	for (int i = 0; i < 400 && (v = field(h, offset)) < want; i++)
		sleep_ms(5);
	return v;
}

static void make_handler(struct ibv_pd *pd, struct handler *h, uint64_t spin)
{
	struct flexio_event_handler_attr ea;
	struct flexio_cq_attr ca;
	struct fxm_test_state st;
	size_t bytes = (size_t)64 << LOG_DEPTH;
	uint8_t *ring = calloc(1, bytes);
	uint32_t dbr[2] = { 0, 0 };
	flexio_uintptr_t ring_d, dbr_d;

	(void)pd;
	if (!ring)
		fail("calloc");
	for (size_t i = 63; i < bytes; i += 64)  /* owner 1, opcode invalid (0xf) */
		ring[i] = 0xf0 | 1;
	memset(&ea, 0, sizeof(ea));
	ea.host_stub_func = &fxm_test_handler;
	ea.affinity.type = FLEXIO_AFFINITY_NONE;
	if (flexio_event_handler_create(proc, &ea, &h->eh) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_event_handler_create");
	if (flexio_copy_from_host(proc, ring, bytes, &ring_d) != FLEXIO_STATUS_SUCCESS ||
	    flexio_copy_from_host(proc, dbr, sizeof(dbr), &dbr_d) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_copy_from_host");
	memset(&ca, 0, sizeof(ca));
	ca.log_cq_depth = LOG_DEPTH;
	ca.element_type = FLEXIO_CQ_ELEMENT_TYPE_DPA_THREAD;
	ca.thread = flexio_event_handler_get_thread(h->eh);
	ca.uar_id = flexio_uar_get_id(flexio_process_get_uar(proc));
	ca.cq_ring_qmem.memtype = FLEXIO_MEMTYPE_DPA;
	ca.cq_ring_qmem.daddr = ring_d;
	ca.cq_dbr_daddr = dbr_d;
	ca.overrun_ignore = 1;  /* a burst of triggers may outrun the handler */
	if (flexio_cq_create(proc, NULL, &ca, &h->cq) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_cq_create");
	h->cqn = flexio_cq_get_cq_num(h->cq);
	memset(&st, 0, sizeof(st));
	st.ring_daddr = ring_d;
	st.dbr_daddr = dbr_d;
	st.cqn = h->cqn;
	st.log_depth = LOG_DEPTH;
	st.hw_owner = 1;
	st.spin = spin;
	if (flexio_copy_from_host(proc, &st, sizeof(st), &h->state) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_copy_from_host");
	free(ring);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct flexio_process_attr pa;
	struct ibv_context *ibv;
	struct ibv_pd *pd;
	struct handler a, late;
	uint64_t n, v;

	if (!list || !list[0] || !(ibv = ibv_open_device(list[0])) || !(pd = ibv_alloc_pd(ibv)))
		fail("device");
	if (flexio_version_set(FLEXIO_VER_USED) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_version_set");
	memset(&pa, 0, sizeof(pa));
	pa.pd = pd;
	if (flexio_process_create(ibv, fxm_test_app, &pa, &proc) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_process_create");
	make_handler(pd, &a, 200000);
	make_handler(pd, &late, 0);

	/* 1. run() arms; nothing invokes the handler until its CQ gets a CQE. */
	if (flexio_event_handler_run(a.eh, a.state) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_event_handler_run");
	sleep_ms(100);
	if ((v = FIELD(&a, invocations)) != 0)
		fail("run() invoked the handler");
	printf("ok run() arms the handler without invoking it\n");

	/* 2. One CQE invokes it once. */
	call(&fxm_test_kick, a.cqn, 1);
	if (wait_for(&a, offsetof(struct fxm_test_state, cqes), 1) != 1)
		fail("a CQE on the armed CQ did not invoke the handler");
	sleep_ms(50);
	if (FIELD(&a, invocations) != 1)
		fail("one CQE invoked the handler more than once");
	printf("ok a CQE on its armed CQ invokes it, once\n");

	/* 3. A burst while it runs: one invocation at a time, every CQE drained. */
	for (n = 0; n < 200; n += 20)
		call(&fxm_test_kick, a.cqn, 20);
	if ((v = wait_for(&a, offsetof(struct fxm_test_state, cqes), 201)) != 201) {
		printf("FAIL %lu of 201 CQEs drained\n", (unsigned long)v);
		return 1;
	}
	if (FIELD(&a, overlaps) != 0)
		fail("two invocations of one handler ran at once");
	v = FIELD(&a, invocations);
	if (v < 2 || v > 201)
		fail("the burst's invocation count is out of range");
	printf("ok 200 events while it ran: %lu invocations, never two at once, no CQE lost\n",
	       (unsigned long)v);

	/* 4. An event before run() finds no running handler: it is lost, and the CQ stays
	 * disarmed, so later CQEs do not invoke the handler either. */
	call(&fxm_test_kick, late.cqn, 1);
	if (flexio_event_handler_run(late.eh, late.state) != FLEXIO_STATUS_SUCCESS)
		fail("flexio_event_handler_run");
	sleep_ms(100);
	call(&fxm_test_kick, late.cqn, 1);
	sleep_ms(100);
	if (FIELD(&late, invocations) != 0)
		fail("an event before run() invoked the handler");
	printf("ok an event before run() is lost and leaves the CQ disarmed\n");

	/* 5. Windows. */
	{
		static uint64_t buf[512] __attribute__((aligned(4096)));
		struct flexio_window *win;
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
		struct ibv_mr *odp = ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND |
						IBV_ACCESS_LOCAL_WRITE);
		uint64_t id;

		if (!mr || flexio_window_create(proc, pd, &win) != FLEXIO_STATUS_SUCCESS)
			fail("ibv_reg_mr / flexio_window_create");
		id = flexio_window_get_id(win);
		v = call(&fxm_test_window, (uint64_t)(uintptr_t)buf, id << 32 | mr->lkey);
		if (v != 15 || buf[0] != 0x5eed5eed5eed5eedull) {
			printf("FAIL window checks 0x%lx, word 0x%lx\n", (unsigned long)v,
			       (unsigned long)buf[0]);
			return 1;
		}
		if (odp && call(&fxm_test_window, (uint64_t)(uintptr_t)buf, id << 32 | odp->lkey))
			fail("a window took an implicit on-demand-paging key");
		printf("ok a window reaches exactly its registration; an implicit-ODP key is "
		       "refused\n");
		if (odp)
			ibv_dereg_mr(odp);
		ibv_dereg_mr(mr);
		flexio_window_destroy(win);
	}

	if (flexio_cq_destroy(a.cq) || flexio_cq_destroy(late.cq) ||
	    flexio_event_handler_destroy(a.eh) || flexio_event_handler_destroy(late.eh) ||
	    flexio_process_destroy(proc))
		fail("destroy");
	ibv_dealloc_pd(pd);
	ibv_close_device(ibv);
	ibv_free_device_list(list);
	return 0;
}

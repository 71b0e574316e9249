/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FlexIO binding's per-peer tables past 64 ranks, with no DPA: the binding's device
 * sources (dpa_firmware/hal/flexio/) compiled for this CPU against the FlexIO model's
 * headers, over a thread context built here as the host backend builds it, and a small
 * device runtime of our own below (the model's runtime refuses calls outside its DPA
 * threads). For each (world size, rails): the image's answer to QUERY_HAL, a HAL set up in
 * exactly that many bytes (one less is refused), every peer QP's user_index found again,
 * CQEs whose user_index names a peer >= W, a rail >= rails or a twin past the rails dropped
 * (never an index out of the tables), QP numbers alone (the model's requester CQEs) found
 * by the hash, and a requester CQE polled through dpa_hal_poll_cq to its wr_id.
 * Built with ASan + UBSan by tests/test_flexio_hal_tables.py. Exit 0: all pass.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dpa_engine.h"
#include "flexio_hal_dev.h"

flexio_dev_rpc_handler_t dpa_offload_query_rpc;  /* the image's query RPC */

static int failures;

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); \
	printf(__VA_ARGS__); printf("\n"); if (++failures > 20) exit(1); } } while (0)

/* ------------------------------------------------------------------ device runtime */

static uint32_t zcqes, arms;

void __dpa_thread_fence_internal_1_3(int space, int pred, int succ)
{
	(void)space, (void)pred, (void)succ;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

uint64_t __dpa_thread_time_internal_1_3(void)
{
	return 0;
}

void __fxm_outbox_cq_arm(uint32_t ci, uint32_t qnum)
{
	(void)ci, (void)qnum;
	arms++;
}

void __fxm_outbox_sq_db(uint16_t pi, uint32_t qnum)
{
	(void)pi, (void)qnum;
}

void __fxm_outbox_zcqe(uint32_t cqn)
{
	(void)cqn;
	zcqes++;
}

void flexio_dev_error(uint8_t error)
{
	printf("FAIL: flexio_dev_error(0x%x)\n", error);
	exit(1);
}

flexio_dev_status_t flexio_dev_multi_window_config(enum flexio_window_entity e, uint16_t id,
						   uint32_t mkey)
{
	(void)e, (void)id, (void)mkey;
	return FLEXIO_DEV_STATUS_FAILED;
}

flexio_dev_status_t flexio_dev_multi_window_ptr_acquire(enum flexio_window_entity e,
							uint64_t haddr, flexio_uintptr_t *ptr)
{
	(void)e, (void)haddr, (void)ptr;
	return FLEXIO_DEV_STATUS_FAILED;
}

void flexio_dev_thread_finish(void)
{
	abort();
}

void flexio_dev_thread_reschedule(void)
{
	abort();
}

/* The engine: never run here (no handler is invoked), only linked. */
uint64_t dpa_engine_state_size(const struct dpa_engine_params *p)
{
	(void)p;
	return 0;
}

int dpa_engine_init(void *state, const struct dpa_engine_params *p)
{
	(void)state, (void)p;
	return DPA_HAL_EINVAL;
}

int dpa_progress(void *state, struct dpa_hal *hal)
{
	(void)state, (void)hal;
	return 0;
}

enum dpa_engine_load dpa_engine_load(const void *state)
{
	(void)state;
	return DPA_ENGINE_IDLE;
}

uint64_t dpa_engine_wake_at(void *state, uint32_t thread, uint64_t now)
{
	(void)state, (void)thread, (void)now;
	return 0;
}

/* ------------------------------------------------------------------ a thread context */

#define LOG_SQ 2u
#define LOG_CQ 4u

struct job {
	struct offload_flexio_thread_ctx ctx;
	struct offload_flexio_qp *qps;        /* [rails][W + 1], as the host publishes them */
	struct dpa_flexio_slot slots[1u << LOG_SQ];
	uint32_t dbr[2];
	struct flexio_dev_cqe64 cq[1u << LOG_CQ], wake[1u << LOG_CQ];
	uint32_t cq_dbr[2], wake_dbr[2];
	uint32_t board[2];
	void *hal_mem;
};

/* Distinct 24-bit QP numbers, scattered like a NIC's: i's number. */
static uint32_t qpn_of(uint32_t i)
{
	return 0x1200u + i * 37u;  /* below 2^24 for every index used here */
}

static void desc(struct job *j, struct offload_flexio_qp *q, uint32_t index, uint32_t peer,
		 uint32_t rail)
{
	*q = (struct offload_flexio_qp){ .sq_daddr = (uintptr_t)j->cq, .rq_daddr = 0,
		.dbr_daddr = (uintptr_t)j->dbr, .slots_daddr = (uintptr_t)j->slots,
		.qpn = qpn_of(index), .log_sq_depth = LOG_SQ, .log_rq_depth = 2, .peer = peer,
		.rail = rail };
}

static void cq_desc(struct offload_flexio_cq *d, struct flexio_dev_cqe64 *ring, uint32_t *dbr,
		    uint32_t cqn)
{
	memset(ring, 0, sizeof(*ring) << LOG_CQ);
	for (uint32_t i = 0; i < 1u << LOG_CQ; i++)
		ring[i].op_own = 0xf1;  /* invalid opcode, owner 1: the hardware's */
	*d = (struct offload_flexio_cq){ .ring_daddr = (uintptr_t)ring, .dbr_daddr = (uintptr_t)dbr,
		.cqn = cqn, .log_depth = LOG_CQ };
}

static int job_new(struct job *j, uint32_t world, uint32_t rails, uint64_t hal_bytes)
{
	uint32_t cols = world + 1, n = 0;

	memset(j, 0, sizeof(*j));
	j->qps = calloc((size_t)rails * cols, sizeof(*j->qps));
	j->hal_mem = calloc(1, hal_bytes ? hal_bytes : 1);
	if (!j->qps || !j->hal_mem)
		return -1;
	for (uint32_t r = 0; r < rails; r++) {
		for (uint32_t p = 0; p < world; p++)
			desc(j, &j->qps[r * cols + p], n++, p, r);
		desc(j, &j->qps[r * cols + world], n++, world - 1, r);  /* the twin */
	}
	j->ctx = (struct offload_flexio_thread_ctx){
		.magic = OFFLOAD_FLEXIO_CTX_MAGIC, .version = OFFLOAD_FLEXIO_CTX_VERSION,
		.thread_index = 0, .num_threads = 2, .world_rank = world - 1, .world_size = world,
		.hal_daddr = (uintptr_t)j->hal_mem, .qps_daddr = (uintptr_t)j->qps,
		.board_daddr = (uintptr_t)j->board, .tick_ns = 1000, .max_outstanding = 64,
		.num_rails = rails, .hal_bytes = (uint32_t)hal_bytes,
	};
	cq_desc(&j->ctx.cq, j->cq, j->cq_dbr, 7);
	cq_desc(&j->ctx.wake_cq, j->wake, j->wake_dbr, 8);
	desc(j, &j->ctx.host_qp, n++, OFFLOAD_FLEXIO_PEER_HOST, 0);
	return 0;
}

static void job_free(struct job *j)
{
	free(j->qps);
	free(j->hal_mem);
}

/* Put a CQE where the thread's CQ polls next (ci), owned by software. */
static void push_cqe(struct job *j, struct dpa_hal *hal, uint8_t opcode, uint32_t uidx,
		     uint32_t qpn, uint16_t wqe_counter)
{
	struct flexio_dev_cqe64 *c = &j->cq[hal->cq.ci & hal->cq.mask];
	uint32_t owner = ((hal->cq.ci >> LOG_CQ) & 1u);  /* 0 on the first pass */

	memset(c, 0, sizeof(*c));
	c->srqn_uidx = cpu_to_be32(uidx);
	c->qpn = cpu_to_be32(qpn);
	c->wqe_counter = cpu_to_be16(wqe_counter);
	c->op_own = (uint8_t)(opcode << 4 | owner);
}

/* ------------------------------------------------------------------ the checks */

static void check_job(uint32_t world, uint32_t rails)
{
	uint64_t bytes = dpa_offload_query_rpc(OFFLOAD_FLEXIO_QUERY_HAL(world, rails));
	uint32_t host = OFFLOAD_FLEXIO_UIDX_HOST, bogus = 0xabcdefu;
	struct dpa_hal_cqe out[4];
	struct dpa_flexio_qp *qp;
	struct dpa_hal *hal;
	struct job j;

	CHECK(bytes > sizeof(struct dpa_hal) +
		      (uint64_t)rails * world * sizeof(struct dpa_flexio_qp) + world,
	      "W=%u rails=%u: QUERY_HAL says %llu bytes", world, rails, (unsigned long long)bytes);
	/* One byte short of the layout: refused, the tables are not set up. */
	if (job_new(&j, world, rails, bytes - 1)) {
		CHECK(0, "out of memory");
		return;
	}
	CHECK(!dpa_flexio_hal_attach(&j.ctx), "W=%u: a HAL one byte short was accepted", world);
	job_free(&j);

	if (job_new(&j, world, rails, bytes)) {
		CHECK(0, "out of memory");
		return;
	}
	hal = dpa_flexio_hal_attach(&j.ctx);
	CHECK(hal && hal->world_size == world && hal->num_rails == rails, "W=%u: attach", world);
	if (!hal) {
		job_free(&j);
		return;
	}
	CHECK((uint8_t *)hal->qpn_slots + 4ull * (hal->qpn_mask + 1) <= (uint8_t *)hal + bytes,
	      "W=%u: the QP number table runs past the allocation", world);

	/* Every peer QP's user_index (as the host names it) and QP number find it again. */
	for (uint32_t r = 0; r < rails; r++)
		for (uint32_t p = 0; p < world; p++) {
			uint32_t qpn = j.qps[r * (world + 1) + p].qpn;

			qp = dpa_flexio_qp_of(hal, OFFLOAD_FLEXIO_UIDX(r, p), qpn);
			CHECK(qp == dpa_flexio_peer_qp(hal, r, p) && qp->peer == p && qp->rail == r,
			      "W=%u: user_index of rail %u peer %u", world, r, p);
			qp = dpa_flexio_qp_of(hal, 0, qpn);  /* the model's requester CQEs */
			CHECK(qp == dpa_flexio_peer_qp(hal, r, p), "W=%u: QP number of %u/%u", world,
			      r, p);
		}
	for (uint32_t r = 0; r < rails; r++) {
		qp = dpa_flexio_qp_of(hal, host + 1 + r, j.qps[r * (world + 1) + world].qpn);
		CHECK(qp == &hal->twins[r], "W=%u: twin of rail %u", world, r);
	}
	CHECK(dpa_flexio_qp_of(hal, host, j.ctx.host_qp.qpn) == &hal->host_qp, "loopback");

	/* user_index naming no QP of this job, with a QP number of none either: dropped. */
	CHECK(!dpa_flexio_qp_of(hal, OFFLOAD_FLEXIO_UIDX(0, world), bogus), "W=%u: peer W", world);
	CHECK(!dpa_flexio_qp_of(hal, OFFLOAD_FLEXIO_UIDX(rails - 1, OFFLOAD_RANKS_LIMIT - 1),
				bogus), "W=%u: the last peer of the stride", world);
	CHECK(!dpa_flexio_qp_of(hal, OFFLOAD_FLEXIO_UIDX(rails, 0), bogus), "rail = rails");
	CHECK(!dpa_flexio_qp_of(hal, host + 1 + rails, bogus), "a twin past the rails");
	CHECK(!dpa_flexio_qp_of(hal, (1u << 24) - 1, bogus), "the largest user_index");
	/* A user_index out of range never decides; the QP number does. */
	qp = dpa_flexio_qp_of(hal, OFFLOAD_FLEXIO_UIDX(0, world), j.qps[0].qpn);
	CHECK(qp == dpa_flexio_peer_qp(hal, 0, 0), "W=%u: QP number behind a bad index", world);
	/* A user_index in range whose QP number disagrees: the QP number wins. */
	qp = dpa_flexio_qp_of(hal, OFFLOAD_FLEXIO_UIDX(0, 0), j.qps[world - 1].qpn);
	CHECK(qp == dpa_flexio_peer_qp(hal, 0, world - 1), "W=%u: index and number disagree",
	      world);

	/* Through the poll: a CQE of no QP is consumed and yields nothing; a requester CQE of
	 * the last peer on the last rail completes its firmware WQE. */
	qp = dpa_flexio_peer_qp(hal, rails - 1, world - 1);
	j.slots[0] = (struct dpa_flexio_slot){ .wr_id = 0x5eed0000u + world, .bytes = 64, .nbb = 1,
		.flags = DPA_FLEXIO_SLOT_FW | DPA_FLEXIO_SLOT_SIGNALED };
	qp->pi = 1;
	hal->outstanding = 1;
	push_cqe(&j, hal, DPA_MLX5_CQE_REQ, OFFLOAD_FLEXIO_UIDX(rails, world), bogus, 0);
	CHECK(dpa_hal_poll_cq(hal, out, 4) == 0 && hal->cq.ci == 1 && hal->outstanding == 1,
	      "W=%u: a CQE of no QP completed something", world);
	push_cqe(&j, hal, DPA_MLX5_CQE_REQ, OFFLOAD_FLEXIO_UIDX(rails - 1, world - 1), qp->qpn, 0);
	CHECK(dpa_hal_poll_cq(hal, out, 4) == 1 && out[0].wr_id == 0x5eed0000u + world &&
	      out[0].rail == rails - 1 && out[0].status == OFFLOAD_OK && hal->outstanding == 0,
	      "W=%u: the last peer's completion", world);
	dpa_hal_set_rail(hal, world - 1, rails - 1);
	dpa_hal_set_rail(hal, world, 0);  /* out of range: ignored */
	CHECK(hal->rail_of[world - 1] == rails - 1, "W=%u: set_rail", world);
	job_free(&j);
}

int main(void)
{
	/* The query refuses what the binding cannot hold. */
	CHECK(dpa_offload_query_rpc(OFFLOAD_FLEXIO_QUERY_HAL(0, 1)) == 0, "world 0");
	CHECK(dpa_offload_query_rpc(OFFLOAD_FLEXIO_QUERY_HAL(OFFLOAD_RANKS_LIMIT + 1, 1)) == 0,
	      "past the ranks limit");
	CHECK(dpa_offload_query_rpc(OFFLOAD_FLEXIO_QUERY_HAL(4, OFFLOAD_FLEXIO_MAX_RAILS + 1)) == 0,
	      "past the rails");
	CHECK(dpa_offload_query_rpc(OFFLOAD_FLEXIO_QUERY_CTX) == OFFLOAD_FLEXIO_CTX_VERSION, "ctx");
	check_job(2, 1);
	check_job(65, 1);
	check_job(65, 3);
	check_job(4096, OFFLOAD_FLEXIO_MAX_RAILS);
	if (failures)
		return 1;
	printf("ok: W = 2, 65 (1 and 3 rails), 4096 (%u rails)\n", OFFLOAD_FLEXIO_MAX_RAILS);
	return 0;
}

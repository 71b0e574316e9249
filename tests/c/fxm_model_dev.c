/* SPDX-License-Identifier: Apache-2.0 */
/*
 * DPA side of tests/test_flexio_model_semantics.py: a handler that counts its invocations
 * and the CQEs it drains, and notices if another invocation of it is running (it spins to
 * widen that window); RPCs that trigger its CQ (flexio_dev_zcqe_gen) and read its state.
 * Built by the FlexIO model's dpacc, as the binding is.
 */
#include <libflexio-dev/flexio_dev_ver.h>
#define FLEXIO_DEV_VER_USED FLEXIO_DEV_VER(24, 10, 0)
#include <libflexio-dev/flexio_dev.h>
#include <libflexio-dev/flexio_dev_queue_access.h>
#include <dpaintrin.h>
#include <stdint.h>

#include "fxm_model_test.h"

__dpa_global__ void fxm_test_handler(uint64_t arg)
{
	struct fxm_test_state *s = (struct fxm_test_state *)arg;
	struct flexio_dev_cqe64 *ring = (struct flexio_dev_cqe64 *)s->ring_daddr;
	uint32_t mask = (1u << s->log_depth) - 1;

	if (__atomic_exchange_n(&s->busy, 1, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&s->overlaps, 1, __ATOMIC_SEQ_CST);
	for (volatile uint64_t i = 0; i < s->spin; i++)
		;
	while (flexio_dev_cqe_get_owner(&ring[s->ci & mask]) != s->hw_owner) {
		s->cqes++;
		if (!(++s->ci & mask))
			s->hw_owner ^= 1;
	}
	flexio_dev_dbr_cq_set_ci((uint32_t *)s->dbr_daddr, s->ci);
	__atomic_fetch_add(&s->invocations, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&s->busy, 0, __ATOMIC_SEQ_CST);
	__dpa_thread_memory_writeback();
	flexio_dev_cq_arm(s->ci, s->cqn);
	flexio_dev_thread_reschedule();
}

__dpa_rpc__ uint64_t fxm_test_kick(uint64_t cqn, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		flexio_dev_zcqe_gen((uint32_t)cqn);
	return n;
}

__dpa_rpc__ uint64_t fxm_test_read(uint64_t daddr, uint64_t unused)
{
	(void)unused;
	return __atomic_load_n((uint64_t *)daddr, __ATOMIC_SEQ_CST);
}

/* Window checks: configure entity 0 with (window id, key) = (id_key >> 32, low 32 bits), then
 * write through the pointer acquired for haddr. Bit 0: configured; bit 1: haddr acquired;
 * bit 2: the byte past a 4 KiB registration refused; bit 3: haddr - 1 refused. */
__dpa_rpc__ uint64_t fxm_test_window(uint64_t haddr, uint64_t id_key)
{
	flexio_uintptr_t p = 0;
	uint64_t bits = 0;

	if (flexio_dev_window_config(FLEXIO_DEV_WINDOW_ENTITY_0, (uint16_t)(id_key >> 32),
				     (uint32_t)id_key) != FLEXIO_DEV_STATUS_SUCCESS)
		return bits;
	bits |= 1;
	if (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_0, haddr, &p) ==
	    FLEXIO_DEV_STATUS_SUCCESS) {
		bits |= 2;
		*(volatile uint64_t *)p = 0x5eed5eed5eed5eedull;
		__dpa_thread_window_writeback();
	}
	if (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_0, haddr + 4096, &p) !=
	    FLEXIO_DEV_STATUS_SUCCESS)
		bits |= 4;
	if (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_0, haddr - 1, &p) !=
	    FLEXIO_DEV_STATUS_SUCCESS)
		bits |= 8;
	return bits;
}

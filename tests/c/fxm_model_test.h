/* SPDX-License-Identifier: Apache-2.0 */
/* State shared by tests/c/fxm_model_dev.c (DPA) and tests/c/fxm_model_test.c (host). */
#ifndef FXM_MODEL_TEST_H
#define FXM_MODEL_TEST_H

#include <stdint.h>

struct fxm_test_state {
	uint64_t ring_daddr, dbr_daddr;
	uint32_t cqn, log_depth;
	uint32_t ci, hw_owner;
	uint64_t spin;
	uint64_t busy, overlaps, invocations, cqes;
};

#endif

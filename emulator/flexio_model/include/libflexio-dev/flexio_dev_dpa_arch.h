/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <libflexio-dev/flexio_dev_dpa_arch.h>. On a DPA this header reaches the
 * thread's outbox (MMIO doorbells to the NIC). The model's outbox is a call into the
 * emulated NIC made on behalf of the calling DPA thread; each is what one outbox write
 * does on the card (SXD_DB, CQ_DB, RXT_DB in the SDK's flexio_dev_queue_access.h).
 */
#ifndef _FLEXIO_DEV_DPA_ARCH_H_
#define _FLEXIO_DEV_DPA_ARCH_H_

#include <stdint.h>

void __fxm_outbox_sq_db(uint16_t pi, uint32_t qnum);
void __fxm_outbox_cq_arm(uint32_t ci, uint32_t qnum);
void __fxm_outbox_zcqe(uint32_t cqn);

#endif

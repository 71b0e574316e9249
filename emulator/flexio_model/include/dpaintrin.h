/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <dpaintrin.h>, DPA intrinsics version 1.3 (the macros of NVIDIA's header:
 * __dpa_thread_fence(space, pred, succ) and the window/memory/system shorthands built on
 * it, __dpa_thread_time/cycles). On a DPA they are compiler builtins; in the model they
 * call the model's runtime, which fences the host CPU and keeps the clock.
 */
#ifndef __DPAINTRIN_H
#define __DPAINTRIN_H

#include <stdint.h>

#define DPA_INTRIN_VERSION(major, minor) (((major) << 16) | (minor))
#ifndef DPA_INTRIN_VERSION_USED
#define DPA_INTRIN_VERSION_USED (DPA_INTRIN_VERSION(1, 3))
#endif
#if DPA_INTRIN_VERSION_USED != DPA_INTRIN_VERSION(1, 3)
#error Bad value for DPA_INTRIN_VERSION_USED
#endif

#define __DPA_HEAP   0
#define __DPA_MEMORY 1
#define __DPA_MMIO   2
#define __DPA_SYSTEM 3

#define __DPA_R  1
#define __DPA_W  2
#define __DPA_RW 3

void __dpa_thread_fence_internal_1_3(int memory_space, int pred_op, int succ_op);
uint64_t __dpa_thread_cycles_internal_1_3(void);
uint64_t __dpa_thread_inst_ret_internal_1_3(void);
uint64_t __dpa_thread_time_internal_1_3(void);

#define __dpa_thread_fence(MEMORY_SPACE, PRED_OP, SUCC_OP) \
	__dpa_thread_fence_internal_1_3(MEMORY_SPACE, PRED_OP, SUCC_OP);
#define __dpa_thread_memory_fence(OP1, OP2) __dpa_thread_fence(__DPA_MEMORY, OP1, OP2)
#define __dpa_thread_outbox_fence(OP1, OP2) __dpa_thread_fence(__DPA_MMIO, OP1, OP2)
#define __dpa_thread_window_fence(OP1, OP2) __dpa_thread_fence(__DPA_MMIO, OP1, OP2)
#define __dpa_thread_system_fence() __dpa_thread_fence(__DPA_SYSTEM, __DPA_RW, __DPA_RW)
#define __dpa_thread_window_read_inv() __dpa_thread_fence(__DPA_MMIO, __DPA_R, __DPA_R)
#define __dpa_thread_window_writeback() __dpa_thread_fence(__DPA_MMIO, __DPA_W, __DPA_W)
#define __dpa_thread_memory_writeback() __dpa_thread_fence(__DPA_MEMORY, __DPA_W, __DPA_W)

#define __dpa_thread_cycles() __dpa_thread_cycles_internal_1_3()
#define __dpa_thread_inst_ret() __dpa_thread_inst_ret_internal_1_3()
/* "The number of timer ticks from an arbitrary start point in the past" (header); the
 * model ticks in microseconds, as DOCA's PCC headers say BlueField-3's timer does. */
#define __dpa_thread_time() __dpa_thread_time_internal_1_3()

#endif /* __DPAINTRIN_H */

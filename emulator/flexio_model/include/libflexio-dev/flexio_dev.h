/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <libflexio-dev/flexio_dev.h>, the device API subset a DPA program built
 * against FlexIO 24.10 .. 25.1 uses. Declarations follow NVIDIA's header of the same name
 * (FlexIO SDK, "Copyright (c) 2022-2025", FLEXIO_DEV_CURRENT_VERSION 25.1): same names,
 * types and version gates; emulator/flexio_model/prototypes.txt lists each signature with
 * where it was checked, and tests/test_flexio_model.py keeps the two identical.
 *
 * What differs is underneath: on a DPA these calls write to the thread's outbox (MMIO) and
 * enter the DPA OS; in the model they call the model's runtime (src/fxm_dev.c), which runs
 * each event handler on a host thread and hands queue operations to the emulated NIC.
 */
#ifndef _FLEXIO_DEV_H_
#define _FLEXIO_DEV_H_

#include <libflexio-dev/flexio_dev_ver.h>

#define FLEXIO_DEV_CURRENT_VERSION FLEXIO_DEV_VER(25, 1, 0)
/* The model implements the API from 24.10 on (no thread context argument, window calls
 * with an entity): older code is refused at compile time rather than run half-modelled. */
#define FLEXIO_DEV_LAST_SUPPORTED_VERSION FLEXIO_DEV_VER(24, 10, 0)

#ifndef FLEXIO_DEV_VER_USED
#define FLEXIO_DEV_VER_USED FLEXIO_DEV_CURRENT_VERSION
#elif FLEXIO_DEV_VER_USED == FLEXIO_DEV_VER_LATEST
#undef FLEXIO_DEV_VER_USED
#define FLEXIO_DEV_VER_USED FLEXIO_DEV_CURRENT_VERSION
#endif

#if FLEXIO_DEV_VER_USED < FLEXIO_DEV_LAST_SUPPORTED_VERSION
#error "FLEXIO_DEV_VER_USED is less than FLEXIO_DEV_LAST_SUPPORTED_VERSION (the FlexIO model implements 24.10 and later)."
#endif
#if FLEXIO_DEV_VER_USED > FLEXIO_DEV_CURRENT_VERSION
#error "FLEXIO_DEV_VER_USED is newer than this FlexIO device API (25.1)."
#endif

#define FLEXIO_DEV_STABLE __attribute__((visibility("default"))) __attribute__((used))
#ifndef FLEXIO_DEV_ALLOW_EXPERIMENTAL_API
#define FLEXIO_DEV_EXPERIMENTAL \
	__attribute__((deprecated("Symbol is defined as experimental"))) FLEXIO_DEV_STABLE
#else
#define FLEXIO_DEV_EXPERIMENTAL FLEXIO_DEV_STABLE
#endif

#include <stdint.h>

typedef uint64_t flexio_uintptr_t;

#ifndef FLEXIO_DEV_ALWAYS_INLINE
#define FLEXIO_DEV_ALWAYS_INLINE static inline __attribute__((always_inline))
#endif

/** Return status of Flex IO dev API functions. */
typedef enum {
	FLEXIO_DEV_STATUS_SUCCESS = 0,
	FLEXIO_DEV_STATUS_FAILED  = 1,
} flexio_dev_status_t;

typedef uint32_t flexio_uar_device_id;

/** CQE creation modes (the CE field of a WQE's control segment). */
enum cq_ce_mode {
	MLX5_CTRL_SEG_CE_CQE_ON_CQE_ERROR       = 0x0,
	MLX5_CTRL_SEG_CE_CQE_ON_FIRST_CQE_ERROR = 0x1,
	MLX5_CTRL_SEG_CE_CQE_ALWAYS             = 0x2,
	MLX5_CTRL_SEG_CE_CQE_AND_EQE            = 0x3,
};

/** Window entities: each thread configures up to two windows at once. */
enum flexio_window_entity {
	FLEXIO_DEV_WINDOW_ENTITY_0   = 0,
	FLEXIO_DEV_WINDOW_ENTITY_1   = 1,
	FLEXIO_DEV_WINDOW_ENTITY_NUM = 2,
};

struct flexio_dev_thread_ctx;

typedef uint64_t (flexio_dev_rpc_handler_t)(uint64_t arg);
typedef uint64_t (flexio_dev_arg_unpack_func_t)(void *argbuf, void *func);
typedef void (flexio_dev_async_rpc_handler_t)(uint64_t arg);
/* "On handler function end, need to call flexio_dev_process_finish() [or reschedule]
 * instead of a regular return statement" (SDK header): the model reports a handler that
 * returns as a process error. */
typedef void (flexio_dev_event_handler_t)(uint64_t thread_arg);

FLEXIO_DEV_EXPERIMENTAL int flexio_dev_get_thread_ctx(struct flexio_dev_thread_ctx **dtctx);
/* "Exit from a thread, leave process active ... For the next DUAR the thread will restart
 * from the beginning": in the model it does not return (the invocation's stack is left). */
FLEXIO_DEV_EXPERIMENTAL void flexio_dev_thread_reschedule(void);
/* "The thread will be marked as finished so next DUAR will not trigger it." */
FLEXIO_DEV_EXPERIMENTAL void flexio_dev_thread_finish(void);
FLEXIO_DEV_EXPERIMENTAL void flexio_dev_thread_retrigger(void);
FLEXIO_DEV_EXPERIMENTAL void flexio_dev_process_finish(void);

FLEXIO_DEV_EXPERIMENTAL
flexio_dev_status_t flexio_dev_multi_window_config(enum flexio_window_entity win_entity,
						   uint16_t window_config_id, uint32_t mkey);

static inline flexio_dev_status_t flexio_dev_window_config(enum flexio_window_entity win_entity,
							   uint16_t window_config_id, uint32_t mkey)
{
	return flexio_dev_multi_window_config(win_entity, window_config_id, mkey);
}

FLEXIO_DEV_EXPERIMENTAL
flexio_dev_status_t flexio_dev_multi_window_mkey_config(enum flexio_window_entity win_entity,
							uint32_t mkey);

static inline flexio_dev_status_t flexio_dev_window_mkey_config(
	enum flexio_window_entity win_entity, uint32_t mkey)
{
	return flexio_dev_multi_window_mkey_config(win_entity, mkey);
}

FLEXIO_DEV_EXPERIMENTAL
flexio_dev_status_t flexio_dev_multi_window_ptr_acquire(enum flexio_window_entity win_entity,
							uint64_t haddr, flexio_uintptr_t *daddr);

static inline flexio_dev_status_t flexio_dev_window_ptr_acquire(
	enum flexio_window_entity win_entity, uint64_t haddr, flexio_uintptr_t *daddr)
{
	return flexio_dev_multi_window_ptr_acquire(win_entity, haddr, daddr);
}

FLEXIO_DEV_EXPERIMENTAL uint32_t flexio_dev_get_thread_id(struct flexio_dev_thread_ctx *dtctx);

/* Trigger an event handler of this process by its activation id. */
FLEXIO_DEV_EXPERIMENTAL void flexio_dev_event_handler_activate(uint32_t activation_id);

#endif /* _FLEXIO_DEV_H_ */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: the host API subset of <libflexio/flexio.h> that a FlexIO application
 * such as dpa-offload's backend uses. Types, struct fields (in order) and prototypes are
 * NVIDIA's (FlexIO SDK flexio.h, "Copyright (c) 2022-2024", checked against a stored
 * copy; each function is listed in emulator/flexio_model/prototypes.txt with where it was
 * checked). flexio_version_set, flexio_app_get and struct flexio_app_select_attr are the
 * FlexIO 25.x additions NVIDIA's samples call (no stored header had them: their form is
 * taken from that use and marked so in prototypes.txt).
 *
 * The model implements the library behind these calls in src/fxm_flexio*.c: a DPA process
 * is the image (the device code dpacc compiled, here for x86) loaded into this process,
 * with its own heap, event handlers running on host threads, and queues the emulated NIC
 * (src/fxm_nic.c, src/fxm_sq.c) executes.
 */
#ifndef _FLEXIO_SDK_H_
#define _FLEXIO_SDK_H_

#include <infiniband/verbs.h>
#include <libflexio/flexio_ver.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version this library implements; code may ask for an older one (FLEXIO_VER_USED). */
#define FLEXIO_CURRENT_VERSION FLEXIO_VER(25, 1, 0)
#define FLEXIO_LAST_SUPPORTED_VERSION FLEXIO_VER(24, 10, 0)
#ifndef FLEXIO_VER_USED
#define FLEXIO_VER_USED FLEXIO_CURRENT_VERSION
#endif

typedef uint64_t flexio_uintptr_t;

enum {
	FLEXIO_CQ_ELEMENT_TYPE_DPA_THREAD = 0x0,
	FLEXIO_CQ_ELEMENT_TYPE_EXT_EQ     = 0x2,
	FLEXIO_CQ_ELEMENT_TYPE_NON_DPA_CQ           = 0x8,
	FLEXIO_CQ_ELEMENT_TYPE_DPA_MSIX_EMULATED_CQ = 0x9,
};

typedef enum {
	FLEXIO_STATUS_SUCCESS   = 0,
	FLEXIO_STATUS_FAILED    = 1,
	FLEXIO_STATUS_TIMEOUT   = 2,
	FLEXIO_STATUS_FATAL_ERR = 3,
} flexio_status;

enum flexio_err_status {
	FLEXIO_DEV_NO_ERROR    = 0,
	FLEXIO_DEV_FATAL_ERROR = 1,
	FLEXIO_DEV_USER_ERROR  = 2,
};

enum flexio_qp_transport_type {
	FLEXIO_QPC_ST_RC           = 0x0,
	FLEXIO_QPC_ST_UC           = 0x1,
	FLEXIO_QPC_ST_UD           = 0x2,
	FLEXIO_QPC_ST_XRC          = 0x3,
	FLEXIO_QPC_ST_IBL2         = 0x4,
	FLEXIO_QPC_ST_DCI          = 0x5,
	FLEXIO_QPC_ST_QP0          = 0x7,
	FLEXIO_QPC_ST_QP1          = 0x8,
	FLEXIO_QPC_ST_RAW_DATAGRAM = 0x9,
	FLEXIO_QPC_ST_REG_UMR      = 0xc,
	FLEXIO_QPC_ST_DC_CNAK      = 0x10,
};

enum flexio_cqe_comp_type {
	FLEXIO_CQE_COMP_NONE  = 0x0,
	FLEXIO_CQE_COMP_BASIC = 0x1,
	FLEXIO_CQE_COMP_ENH   = 0x2,
};

enum flexio_cq_period_mode {
	FLEXIO_CQ_PERIOD_MODE_EVENT = 0x0,
	FLEXIO_CQ_PERIOD_MODE_CQE   = 0x1,
};

typedef uint32_t flexio_uar_device_id;

/** Flex IO application function prototype (what dpacc's host stubs are). */
typedef void (flexio_func_t) (void);

struct flexio_process;
struct flexio_window;
struct flexio_outbox;
struct flexio_event_handler;
struct flexio_thread;
struct flexio_cq;
struct flexio_qp;
struct flexio_mkey;
struct flexio_uar;
struct flexio_app;

enum flexio_memtype {
	FLEXIO_MEMTYPE_DPA  = 0,
	FLEXIO_MEMTYPE_HOST = 1,
};

struct flexio_qmem {
	enum flexio_memtype memtype;
	union {
		flexio_uintptr_t daddr;
		uint64_t humem_offset;
	};
	uint32_t umem_id;
};

struct flexio_cq_attr {
	uint8_t log_cq_depth;
	uint8_t element_type;
	union {
		uint32_t emulated_eqn;
		struct flexio_thread *thread;
	};
	uint32_t uar_id;
	void *uar_base_addr;
	enum flexio_cqe_comp_type cqe_comp_type;
	enum flexio_cq_period_mode cq_period_mode;
	uint16_t cq_period;
	uint16_t cq_max_count;
	bool no_arm;
	bool cc;
	uint8_t overrun_ignore;
	uint8_t always_armed;
	struct flexio_qmem cq_ring_qmem;
	flexio_uintptr_t cq_dbr_daddr;
};

struct flexio_process_attr {
	struct ibv_pd *pd;
	int en_pcc;
};

enum flexio_affinity_type {
	FLEXIO_AFFINITY_NONE = 0,
	FLEXIO_AFFINITY_STRICT,
	FLEXIO_AFFINITY_GROUP,
};

struct flexio_affinity {
	enum flexio_affinity_type type;
	uint32_t id;
};

struct flexio_event_handler_attr {
	flexio_func_t *host_stub_func;
	int continuable;
	uint64_t arg;
	flexio_uintptr_t thread_local_storage_daddr;
	struct flexio_affinity affinity;
};

struct flexio_qp_attr_opt_param_mask {
	bool qp_access_mask;
	bool min_rnr_nak_timer;
};

enum flexio_qp_qpc_mtu {
	FLEXIO_QP_QPC_MTU_BYTES_256 = 0x1,
	FLEXIO_QP_QPC_MTU_BYTES_512 = 0x2,
	FLEXIO_QP_QPC_MTU_BYTES_1K  = 0x3,
	FLEXIO_QP_QPC_MTU_BYTES_2K  = 0x4,
	FLEXIO_QP_QPC_MTU_BYTES_4K  = 0x5,
};

enum {
	FLEXIO_QP_QPC_RQ_TYPE_REGULAR             = 0x0,
	FLEXIO_QP_QPC_RQ_TYPE_SRQ_RMP_XRC_SRQ_XRQ = 0x1,
	FLEXIO_QP_QPC_RQ_TYPE_ZERO_SIZE_RQ        = 0x3,
};

enum flexio_qp_state {
	FLEXIO_QP_STATE_RST  = 0x0,
	FLEXIO_QP_STATE_INIT = 0x1,
	FLEXIO_QP_STATE_RTR  = 0x2,
	FLEXIO_QP_STATE_RTS  = 0x3,
	FLEXIO_QP_STATE_ERR  = 0x6,
};

struct flexio_qp_attr {
	uint32_t transport_type;
	uint32_t uar_id;
	uint32_t user_index;
	int qp_access_mask;
	int ops_flag;
	struct ibv_pd *pd;
	int log_sq_depth;
	int no_sq;
	uint32_t sq_cqn;
	int log_rq_depth;
	int rq_type;
	uint32_t rq_cqn;
	uint32_t rmpqn;
	struct flexio_qmem qp_wq_buff_qmem;
	struct flexio_qmem qp_wq_dbr_qmem;
	/* RC QP modify attributes */
	enum flexio_qp_state next_state;
	uint32_t remote_qp_num;
	uint8_t gid_table_index;
	uint8_t fl;
	uint8_t *dest_mac;
	union ibv_gid rgid_or_rip;
	uint16_t rlid;
	uint32_t min_rnr_nak_timer;
	enum flexio_qp_qpc_mtu path_mtu;
	uint8_t retry_count;
	uint8_t vhca_port_num;
	uint32_t next_rcv_psn;
	uint32_t next_send_psn;
	uint16_t udp_sport;
	uint8_t grh;
	uint8_t log_rra_max;
	uint8_t log_sra_max;
	uint8_t isolate_vl_tc;
};

struct flexio_mkey_attr {
	struct ibv_pd *pd;
	flexio_uintptr_t daddr;
	size_t len;
	int access;
};

struct flexio_app_attr {
	const char *app_name;
	void *app_ptr;
	size_t app_bsize;
	char *app_sig_sec_name;
};

/* FlexIO 25.x: pick the application dpacc registered under app_name for the device's
 * hardware model (samples: flexio_app_sel_attr.app_name/.hw_model_id/.ibv_ctx). */
#define FLEXIO_HW_MODEL_DEF 0u
struct flexio_app_select_attr {
	const char *app_name;
	uint32_t hw_model_id;
	struct ibv_context *ibv_ctx;
};

typedef void (flexio_func_arg_pack_fn_t) (void *argbuf, va_list ap);

#define FLEXIO_MAX_NAME_LEN (256)

flexio_status flexio_version_set(uint64_t version);
flexio_status flexio_app_get(struct flexio_app_select_attr *fattr, struct flexio_app **app);

flexio_status flexio_buf_dev_alloc(struct flexio_process *process, size_t buff_bsize,
				   flexio_uintptr_t *dest_daddr_p);
flexio_status flexio_buf_dev_free(struct flexio_process *process, flexio_uintptr_t daddr);
flexio_status flexio_host2dev_memcpy(struct flexio_process *process, void *src_haddr,
				     size_t buff_bsize, flexio_uintptr_t dest_daddr);
flexio_status flexio_buf_dev_memset(struct flexio_process *process, int value,
				    size_t buff_bsize, flexio_uintptr_t dest_daddr);
flexio_status flexio_copy_from_host(struct flexio_process *process, void *src_haddr,
				    size_t buff_bsize, flexio_uintptr_t *dest_daddr_p);

flexio_status flexio_cq_create(struct flexio_process *process, struct ibv_context *ibv_ctx,
			       const struct flexio_cq_attr *fattr, struct flexio_cq **cq);
flexio_status flexio_cq_destroy(struct flexio_cq *cq);

flexio_status flexio_device_mkey_create(struct flexio_process *process,
					struct flexio_mkey_attr *fattr, struct flexio_mkey **mkey);
flexio_status flexio_device_mkey_destroy(struct flexio_mkey *mkey);

flexio_status flexio_event_handler_create(struct flexio_process *process,
					  struct flexio_event_handler_attr *fattr,
					  struct flexio_event_handler **event_handler_ptr);
flexio_status flexio_event_handler_destroy(struct flexio_event_handler *event_handler);
flexio_status flexio_event_handler_run(struct flexio_event_handler *event_handler,
				       uint64_t user_arg);

flexio_status flexio_process_call(struct flexio_process *process, flexio_func_t *host_func,
				  uint64_t *func_ret, ...);
flexio_status flexio_process_create(struct ibv_context *ibv_ctx, struct flexio_app *app,
				    const struct flexio_process_attr *process_attr,
				    struct flexio_process **process_ptr);
flexio_status flexio_crash_data(struct flexio_process *process, const char *outfile);
flexio_status flexio_process_destroy(struct flexio_process *process);

flexio_status flexio_window_create(struct flexio_process *process, struct ibv_pd *pd,
				   struct flexio_window **window);
flexio_status flexio_window_destroy(struct flexio_window *window);

int flexio_err_handler_fd(struct flexio_process *process);
enum flexio_err_status flexio_err_status_get(struct flexio_process *process);

flexio_status flexio_qp_create(struct flexio_process *process, struct ibv_context *ibv_ctx,
			       struct flexio_qp_attr *qp_fattr, struct flexio_qp **qp_ptr);
flexio_status flexio_qp_modify(struct flexio_qp *qp, struct flexio_qp_attr *fattr,
			       struct flexio_qp_attr_opt_param_mask *mask);
flexio_status flexio_qp_destroy(struct flexio_qp *qp);
enum flexio_qp_state flexio_qp_state_get(struct flexio_qp *qp);

flexio_status flexio_app_create(struct flexio_app_attr *fattr, struct flexio_app **app);
flexio_status flexio_app_destroy(struct flexio_app *app);
flexio_status flexio_func_pup_register(struct flexio_app *app,
				       const char *dev_func_name, const char *dev_unpack_func_name,
				       flexio_func_t *host_stub_func_addr, size_t argbuf_size,
				       flexio_func_arg_pack_fn_t *host_pack_func);
flexio_status flexio_func_register(struct flexio_app *app, const char *dev_func_name,
				   flexio_func_t **out_func);

struct flexio_thread *flexio_event_handler_get_thread(struct flexio_event_handler *event_handler);
uint32_t flexio_event_handler_get_id(struct flexio_event_handler *event_handler);
uint32_t flexio_cq_get_cq_num(struct flexio_cq *cq);
uint32_t flexio_qp_get_qp_num(struct flexio_qp *qp);
struct flexio_uar *flexio_process_get_uar(struct flexio_process *process);
uint32_t flexio_uar_get_id(struct flexio_uar *uar);
uint32_t flexio_window_get_id(struct flexio_window *window);
uint32_t flexio_mkey_get_id(struct flexio_mkey *mkey);
const char *flexio_app_get_name(struct flexio_app *app);
struct ibv_pd *flexio_process_get_pd(struct flexio_process *process);

#ifdef __cplusplus
}
#endif

#endif /* _FLEXIO_SDK_H_ */

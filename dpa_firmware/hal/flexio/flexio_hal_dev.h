/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to the FlexIO binding of dpa_hal.h: the per-thread runtime state (struct dpa_hal)
 * and the mlx5 constants the FlexIO device headers do not name. Built by dpacc only.
 *
 * Ownership: one struct dpa_hal per DPA thread, in host-allocated DPA heap memory
 * (offload_flexio_thread_ctx.hal_daddr), followed there by its tables, sized by the world
 * size and rails (dpa_flexio_hal_layout: the host allocates what the query RPC says it
 * takes). Only that thread's event handler touches it, and a
 * FlexIO event handler never runs twice at once, so nothing here takes a lock. The only
 * memory shared between threads is the engine state and the parked board (see notify).
 */
#ifndef FLEXIO_HAL_DEV_H
#define FLEXIO_HAL_DEV_H

/* The device API changed signatures at 24.10 (no thread context argument, window entity
 * argument); pin the version we are written against before flexio_dev.h reads it. */
#include <libflexio-dev/flexio_dev_ver.h>
#ifndef FLEXIO_DEV_VER_USED
#define FLEXIO_DEV_VER_USED FLEXIO_DEV_VER(24, 10, 0)
#endif
#include <libflexio-dev/flexio_dev.h>
#include <libflexio-dev/flexio_dev_err.h>
#include <libflexio-dev/flexio_dev_queue_access.h>
#include <dpaintrin.h>
#include <stdint.h>

#include "dpa_hal.h"
#include "offload_abi.h"

/* CQE opcodes and error syndromes (rdma-core providers/mlx5/mlx5dv.h, same values). */
enum {
	DPA_MLX5_CQE_REQ = 0x0,
	DPA_MLX5_CQE_RESP_WR_IMM = 0x1,
	DPA_MLX5_CQE_RESP_SEND = 0x2,
	DPA_MLX5_CQE_RESP_SEND_IMM = 0x3,
	DPA_MLX5_CQE_REQ_ERR = 0xd,
	DPA_MLX5_CQE_RESP_ERR = 0xe,
};

enum {
	DPA_MLX5_SYND_LOCAL_LENGTH_ERR = 0x01,
	DPA_MLX5_SYND_LOCAL_QP_OP_ERR = 0x02,
	DPA_MLX5_SYND_LOCAL_PROT_ERR = 0x04,
	DPA_MLX5_SYND_WR_FLUSH_ERR = 0x05,
	DPA_MLX5_SYND_BAD_RESP_ERR = 0x10,
	DPA_MLX5_SYND_LOCAL_ACCESS_ERR = 0x11,
	DPA_MLX5_SYND_REMOTE_INVAL_REQ_ERR = 0x12,
	DPA_MLX5_SYND_REMOTE_ACCESS_ERR = 0x13,
	DPA_MLX5_SYND_REMOTE_OP_ERR = 0x14,
	DPA_MLX5_SYND_TRANSPORT_RETRY_EXC_ERR = 0x15,
	DPA_MLX5_SYND_RNR_RETRY_EXC_ERR = 0x16,
	DPA_MLX5_SYND_REMOTE_ABORTED_ERR = 0x22,
};

/* Control segment fm_ce_se byte: "initiator small fence" waits for earlier RDMA READs and
 * atomics of this SQ to complete (rdma-core MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE). */
#define DPA_MLX5_FENCE_SMALL   (1u << 5)
#define DPA_MLX5_INLINE_SEG    0x80000000u  /* byte_count flag of an inline data segment */
#define DPA_MLX5_SEGS_PER_BB   4u           /* 16-byte segments per 64-byte basic block */

#define DPA_FLEXIO_HAL_MAGIC   0x48584c46u  /* "FLXH": runtime state initialised */
#define DPA_FLEXIO_SOFT_DEPTH  1024u        /* completions made up locally, power of two */
#define DPA_FLEXIO_MAX_MSG     0x7fffffffu  /* one RDMA message: 31-bit byte count */
#define DPA_FLEXIO_NOTIFY_SIGNAL 16u        /* signal every Nth unsolicited host notify */

/* enum dpa_flexio_err: codes for flexio_dev_error() (user range 0x80..0xff). */
#define DPA_FLEXIO_ERR_BAD_CTX 0x81u
#define DPA_FLEXIO_ERR_WINDOW  0x82u

/* Bookkeeping of one SQ basic block, at the block where a WQE starts. */
struct dpa_flexio_slot {
	uint64_t wr_id;
	uint32_t bytes;
	uint16_t nbb;           /* basic blocks of this WQE */
	uint16_t flags;         /* DPA_FLEXIO_SLOT_* */
};
_Static_assert(sizeof(struct dpa_flexio_slot) == OFFLOAD_FLEXIO_SQ_SLOT_BYTES, "sq slot");

#define DPA_FLEXIO_SLOT_FW       (1u << 0)  /* the firmware posted it: report its wr_id */
#define DPA_FLEXIO_SLOT_SIGNALED (1u << 1)  /* produces a CQE on success */

struct dpa_flexio_cq {
	struct flexio_dev_cqe64 *ring;
	uint32_t *dbr;
	uint32_t cqn;
	uint32_t mask;
	uint32_t ci;            /* consumer index, free running */
	uint32_t hw_owner;      /* owner bit value that still means "hardware's" */
};

struct dpa_flexio_qp {
	union flexio_dev_sqe_seg *sq;
	uint32_t *dbr;
	struct dpa_flexio_slot *slots;
	uint32_t qpn;
	uint32_t peer;
	uint32_t rail;
	uint32_t bb_mask;       /* basic blocks - 1 */
	uint32_t seg_mask;      /* 16-byte segments - 1 */
	uint32_t pi;            /* next free basic block, free running */
	uint32_t ci;            /* first basic block not known complete */
	int32_t broken;         /* 0, or the status that moved the QP to error */
};

struct dpa_hal {
	uint32_t magic;
	uint32_t thread_index;
	uint32_t num_threads;
	uint32_t world_rank;
	uint32_t world_size;
	uint32_t num_rails;
	uint32_t max_outstanding;
	uint32_t outstanding;   /* FW completions owed: hardware ones plus soft ones queued */
	uint32_t notifies;      /* host notifies posted, for periodic signaling */
	struct offload_flexio_thread_ctx *ctx;
	uint32_t *board;        /* parked flags of all threads of this process */
	uint64_t win_base;      /* window address of host address 0 (see dpa_hal_window_ptr) */
	uint32_t aux_key;       /* the key window entity 1 has this invocation, 0: none */
	uint64_t tick_ns;
	struct dpa_flexio_cq cq;
	struct dpa_flexio_cq wake_cq;
	struct dpa_flexio_qp host_qp;
	struct dpa_flexio_qp twins[OFFLOAD_FLEXIO_MAX_RAILS];  /* receive what we send to self */
	/* The tables behind this struct, in the same allocation (dpa_flexio_hal_layout). */
	struct dpa_flexio_qp *qps;  /* [num_rails * world_size]: rail r, peer p at r * W + p */
	uint8_t *rail_of;           /* [world_size]: the rail each peer's work goes out on */
	uint32_t *qpn_slots;        /* open addressing, qpn -> 1 + QP index (dpa_flexio_qp_of) */
	uint32_t qpn_mask;          /* slots - 1 */
	uint32_t soft_head;     /* completions made up here: posts to a broken QP, flushes */
	uint32_t soft_tail;
	struct dpa_hal_cqe soft[DPA_FLEXIO_SOFT_DEPTH];
};

/* Where the tables sit behind struct dpa_hal for a job of `world` ranks on `rails` rails. */
struct dpa_flexio_hal_layout {
	uint64_t qps_off;
	uint64_t rail_of_off;
	uint64_t qpn_slots_off;
	uint32_t qpn_slots;     /* a power of two, at least twice the QPs it indexes */
	uint64_t bytes;         /* all of it: what the host allocates */
};

/* 0 for a world or rail count the binding does not take. */
uint64_t dpa_flexio_hal_layout(uint32_t world, uint32_t rails, struct dpa_flexio_hal_layout *out);

/* The QP to peer on rail (both in range: the callers check). */
static inline struct dpa_flexio_qp *dpa_flexio_peer_qp(struct dpa_hal *hal, uint32_t rail,
						       uint32_t peer)
{
	return &hal->qps[(uint64_t)rail * hal->world_size + peer];
}

/* dpa_hal_flexio_cq.c: complete a post here (it never reaches the wire: zero length, a
 * broken QP) with status and bytes; DPA_HAL_EAGAIN when max_outstanding are owed. */
int dpa_flexio_soft_complete(struct dpa_hal *hal, const struct dpa_flexio_qp *qp, uint64_t wr_id,
			     int32_t status, uint32_t bytes);

/* dpa_hal_flexio.c: the thread's runtime state for ctx, set up on first use; NULL when the
 * context is not one this image can run (the handler then stops the process). */
struct dpa_hal *dpa_flexio_hal_attach(struct offload_flexio_thread_ctx *ctx);

/* dpa_hal_flexio_cq.c: the QP a CQE names (user_index, confirmed by its QP number, else the
 * QP number alone), or NULL: a CQE of no QP of ours is dropped. */
struct dpa_flexio_qp *dpa_flexio_qp_of(struct dpa_hal *hal, uint32_t uidx, uint32_t qpn);

/* dpa_hal_flexio_cq.c: fill qpn_slots with every QP of the thread (at init). */
void dpa_flexio_index_qpns(struct dpa_hal *hal);

#endif /* FLEXIO_HAL_DEV_H */

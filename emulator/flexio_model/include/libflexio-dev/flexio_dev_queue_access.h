/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <libflexio-dev/flexio_dev_queue_access.h>, the 24.10+ signatures of
 * NVIDIA's header (FlexIO SDK 25.1): doorbells, CQE getters, WQE segment setters and
 * doorbell-record helpers. The setters and getters are plain mlx5 layout code, written
 * here from the layouts in flexio_dev_queue_types.h; the doorbells go to the model's
 * outbox (flexio_dev_dpa_arch.h).
 */
#ifndef _FLEXIO_DEV_QUEUE_ACCESS_H_
#define _FLEXIO_DEV_QUEUE_ACCESS_H_

#include <libflexio-dev/flexio_dev.h>
#include <libflexio-dev/flexio_dev_queue_types.h>
#include <libflexio-dev/flexio_dev_dpa_arch.h>
#include <libflexio-dev/flexio_dev_endianity.h>
#include <stdint.h>

/* Ring the SQ doorbell of QP/SQ qnum: the NIC executes WQEs up to producer index pi. */
FLEXIO_DEV_ALWAYS_INLINE void flexio_dev_qp_sq_ring_db(uint16_t pi, uint32_t qnum)
{
	__fxm_outbox_sq_db(pi, qnum);
}

/* Arm CQ qnum with consumer index ci: the next CQE after ci raises one event. */
FLEXIO_DEV_ALWAYS_INLINE void flexio_dev_cq_arm(uint32_t ci, uint32_t qnum)
{
	__fxm_outbox_cq_arm(ci, qnum);
}

/* "Trigger the given CQ by creating a zero CQE on it. In turn, this may activate any
 * handler connected to the CQ" (SDK header). */
FLEXIO_DEV_ALWAYS_INLINE void flexio_dev_zcqe_gen(uint32_t cqn)
{
	__fxm_outbox_zcqe(cqn);
}

#define flexio_dev_msix_send(cqn) flexio_dev_zcqe_gen(cqn)

FLEXIO_DEV_ALWAYS_INLINE uint16_t flexio_dev_cqe_get_csum_ok(struct flexio_dev_cqe64 *cqe)
{
	return be16_to_cpu((volatile __be16)cqe->csum_ok);
}

FLEXIO_DEV_ALWAYS_INLINE uint32_t flexio_dev_cqe_get_qpn(struct flexio_dev_cqe64 *cqe)
{
	return be32_to_cpu((volatile __be32)cqe->qpn) & ((1 << 24) - 1);
}

FLEXIO_DEV_ALWAYS_INLINE uint16_t flexio_dev_cqe_get_wqe_counter(struct flexio_dev_cqe64 *cqe)
{
	return be16_to_cpu((volatile __be16)cqe->wqe_counter);
}

FLEXIO_DEV_ALWAYS_INLINE uint32_t flexio_dev_cqe_get_byte_cnt(struct flexio_dev_cqe64 *cqe)
{
	return be32_to_cpu((volatile __be32)cqe->byte_cnt);
}

FLEXIO_DEV_ALWAYS_INLINE uint32_t flexio_dev_cqe_get_err_synd(struct flexio_dev_cqe64 *cqe)
{
	return (volatile uint8_t)cqe->syndrome;
}

FLEXIO_DEV_ALWAYS_INLINE uint32_t flexio_dev_cqe_get_hw_err_synd(struct flexio_dev_cqe64 *cqe)
{
	return (volatile uint8_t)cqe->hw_err_syndrome;
}

FLEXIO_DEV_ALWAYS_INLINE uint32_t flexio_dev_cqe_get_vendor_err_synd(struct flexio_dev_cqe64 *cqe)
{
	return (volatile uint8_t)cqe->vendor_err_synd;
}

FLEXIO_DEV_ALWAYS_INLINE uint8_t flexio_dev_cqe_get_opcode(struct flexio_dev_cqe64 *cqe)
{
	return ((volatile uint8_t)cqe->op_own) >> 4;
}

FLEXIO_DEV_ALWAYS_INLINE uint32_t flexio_dev_cqe_get_user_index(struct flexio_dev_cqe64 *cqe)
{
	return be32_to_cpu((volatile __be32)cqe->srqn_uidx) & ((1 << 24) - 1);
}

FLEXIO_DEV_ALWAYS_INLINE uint8_t flexio_dev_cqe_get_owner(struct flexio_dev_cqe64 *cqe)
{
	return ((volatile uint8_t)cqe->op_own) & 0x1;
}

/** WQE control segment types (flexio_dev_swqe_seg_ctrl_set). */
enum flexio_ctrl_seg {
	FLEXIO_CTRL_SEG_SEND_EN                 = 0,
	FLEXIO_CTRL_SEG_SEND_RC                 = 1,
	FLEXIO_CTRL_SEG_SEND_UC                 = 1,
	FLEXIO_CTRL_SEG_SEND_UD                 = 2,
	FLEXIO_CTRL_SEG_LDMA                    = 3,
	FLEXIO_CTRL_SEG_RDMA_WRITE              = 4,
	FLEXIO_CTRL_SEG_RDMA_READ               = 5,
	FLEXIO_CTRL_SEG_LSO                     = 6,
	FLEXIO_CTRL_SEG_NOP                     = 7,
	FLEXIO_CTRL_SEG_RDMA_WRITE_IMM          = 8,
	FLEXIO_CTRL_SEG_TRANSPOSE               = 9,
	FLEXIO_CTRL_SEG_WAIT_ON_DATA            = 10,
	FLEXIO_CTRL_SEG_ATOMIC_COMPARE_AND_SWAP = 11,
	FLEXIO_CTRL_SEG_ATOMIC_FETCH_AND_ADD    = 12,
};

/** WQE control segment opcodes (mlx5 PRM; same values as rdma-core's MLX5_OPCODE_*). */
enum {
	MLX5_CTRL_SEG_OPCODE_NOP                            = 0x0,
	MLX5_CTRL_SEG_OPCODE_SND_INV                        = 0x1,
	MLX5_CTRL_SEG_OPCODE_RDMA_WRITE                     = 0x8,
	MLX5_CTRL_SEG_OPCODE_RDMA_WRITE_WITH_IMMEDIATE      = 0x9,
	MLX5_CTRL_SEG_OPCODE_SEND                           = 0xa,
	MLX5_CTRL_SEG_OPCODE_SEND_WITH_IMMEDIATE            = 0xb,
	MLX5_CTRL_SEG_OPCODE_LSO                            = 0xe,
	MLX5_CTRL_SEG_OPCODE_WAIT                           = 0xf,
	MLX5_CTRL_SEG_OPCODE_RDMA_READ                      = 0x10,
	MLX5_CTRL_SEG_OPCODE_ATOMIC_COMPARE_AND_SWAP        = 0x11,
	MLX5_CTRL_SEG_OPCODE_ATOMIC_FETCH_AND_ADD           = 0x12,
	MLX5_CTRL_SEG_OPCODE_ATOMIC_MASKED_COMPARE_AND_SWAP = 0x14,
	MLX5_CTRL_SEG_OPCODE_ATOMIC_MASKED_FETCH_AND_ADD    = 0x15,
	MLX5_CTRL_SEG_OPCODE_RECEIVE_EN                     = 0x16,
	MLX5_CTRL_SEG_OPCODE_SEND_EN                        = 0x17,
	MLX5_CTRL_SEG_OPCODE_LOCAL_MMO                      = 0x32,
};

enum {
	MLX5_CTRL_SEGMENT_OPC_MOD_LOCAL_MMO_TRANSPOSE = 0x0,
	MLX5_CTRL_SEGMENT_OPC_MOD_LOCAL_MMO_LOCAL_DMA = 0x1,
};

enum {
	MLX5_CTRL_SEGMENT_OPC_MOD_WAIT_ON_DATA = 0x1,
};

/* A control segment with the fixed data-segment count the SDK gives each type. */
FLEXIO_DEV_ALWAYS_INLINE flexio_dev_status_t flexio_dev_swqe_seg_ctrl_set(
	union flexio_dev_sqe_seg *swqe, uint32_t sq_pi, uint32_t sq_number, uint32_t ce,
	enum flexio_ctrl_seg ctrl_seg_type)
{
	uint32_t opcode = MLX5_CTRL_SEG_OPCODE_NOP, ds = 1, mod = 0;

	switch (ctrl_seg_type) {
	case FLEXIO_CTRL_SEG_SEND_EN: opcode = MLX5_CTRL_SEG_OPCODE_SEND; ds = 3; break;
	case FLEXIO_CTRL_SEG_LSO: opcode = MLX5_CTRL_SEG_OPCODE_LSO; ds = 4; break;
	case FLEXIO_CTRL_SEG_SEND_RC: opcode = MLX5_CTRL_SEG_OPCODE_SEND; ds = 2; break;
	case FLEXIO_CTRL_SEG_SEND_UD: opcode = MLX5_CTRL_SEG_OPCODE_SEND; ds = 3; break;
	case FLEXIO_CTRL_SEG_LDMA:
		opcode = MLX5_CTRL_SEG_OPCODE_LOCAL_MMO;
		mod = MLX5_CTRL_SEGMENT_OPC_MOD_LOCAL_MMO_LOCAL_DMA;
		ds = 4;
		break;
	case FLEXIO_CTRL_SEG_TRANSPOSE: opcode = MLX5_CTRL_SEG_OPCODE_LOCAL_MMO; ds = 4; break;
	case FLEXIO_CTRL_SEG_RDMA_WRITE: opcode = MLX5_CTRL_SEG_OPCODE_RDMA_WRITE; ds = 3; break;
	case FLEXIO_CTRL_SEG_RDMA_WRITE_IMM:
		opcode = MLX5_CTRL_SEG_OPCODE_RDMA_WRITE_WITH_IMMEDIATE;
		ds = 3;
		break;
	case FLEXIO_CTRL_SEG_RDMA_READ: opcode = MLX5_CTRL_SEG_OPCODE_RDMA_READ; ds = 3; break;
	case FLEXIO_CTRL_SEG_NOP: opcode = MLX5_CTRL_SEG_OPCODE_NOP; ds = 1; break;
	case FLEXIO_CTRL_SEG_ATOMIC_COMPARE_AND_SWAP:
		opcode = MLX5_CTRL_SEG_OPCODE_ATOMIC_COMPARE_AND_SWAP;
		ds = 4;
		break;
	case FLEXIO_CTRL_SEG_ATOMIC_FETCH_AND_ADD:
		opcode = MLX5_CTRL_SEG_OPCODE_ATOMIC_FETCH_AND_ADD;
		ds = 4;
		break;
	case FLEXIO_CTRL_SEG_WAIT_ON_DATA:
		opcode = MLX5_CTRL_SEG_OPCODE_WAIT;
		mod = MLX5_CTRL_SEGMENT_OPC_MOD_WAIT_ON_DATA;
		ds = 3;
		break;
	}
	swqe->ctrl.idx_opcode = cpu_to_be32((mod << 24) | ((sq_pi & 0xffff) << 8) | opcode);
	swqe->ctrl.qpn_ds = cpu_to_be32((sq_number << 8) | ds);
	swqe->ctrl.signature_fm_ce_se = cpu_to_be32(ce << 2);
	swqe->ctrl.general_id = 0;
	return FLEXIO_DEV_STATUS_SUCCESS;
}

FLEXIO_DEV_ALWAYS_INLINE flexio_dev_status_t flexio_dev_swqe_seg_rdma_set(
	union flexio_dev_sqe_seg *swqe, uint32_t rkey, uint64_t raddr)
{
	swqe->rdma.raddr = cpu_to_be64(raddr);
	swqe->rdma.rkey = cpu_to_be32(rkey);
	return FLEXIO_DEV_STATUS_SUCCESS;
}

FLEXIO_DEV_ALWAYS_INLINE flexio_dev_status_t flexio_dev_swqe_seg_mem_ptr_data_set(
	union flexio_dev_sqe_seg *swqe, uint32_t data_sz, uint32_t lkey, uint64_t data_addr)
{
	swqe->mem_ptr_send_data.byte_count = cpu_to_be32(data_sz);
	swqe->mem_ptr_send_data.lkey = cpu_to_be32(lkey);
	swqe->mem_ptr_send_data.addr = cpu_to_be64(data_addr);
	return FLEXIO_DEV_STATUS_SUCCESS;
}

FLEXIO_DEV_ALWAYS_INLINE flexio_dev_status_t flexio_dev_swqe_seg_inline_data_set(
	union flexio_dev_sqe_seg *swqe, uint32_t data_sz, uint32_t *data)
{
	swqe->inline_send_data.byte_count = cpu_to_be32(0x80000000u | data_sz);
	swqe->inline_send_data.data_and_padding[0] = data[0];
	swqe->inline_send_data.data_and_padding[1] = data[1];
	swqe->inline_send_data.data_and_padding[2] = data[2];
	return FLEXIO_DEV_STATUS_SUCCESS;
}

FLEXIO_DEV_ALWAYS_INLINE flexio_dev_status_t flexio_dev_swqe_seg_atomic_set(
	union flexio_dev_sqe_seg *swqe, uint64_t swap_or_add_data, uint64_t compare_data)
{
	swqe->atomic.swap_or_add_data = cpu_to_be64(swap_or_add_data);
	swqe->atomic.compare_data = cpu_to_be64(compare_data);
	return FLEXIO_DEV_STATUS_SUCCESS;
}

/* Post one more receive WQE: the RQ counter is 16 bits, big endian. */
FLEXIO_DEV_ALWAYS_INLINE flexio_dev_status_t flexio_dev_dbr_rq_inc_pi(uint32_t *rq_dbr)
{
	uint32_t rq_rcv_counter = be32_to_cpu(*rq_dbr);

	*rq_dbr = cpu_to_be32((rq_rcv_counter + 1) & 0xffff);
	return FLEXIO_DEV_STATUS_SUCCESS;
}

/* The CQ consumer index the NIC reads (24 bits, big endian). */
FLEXIO_DEV_ALWAYS_INLINE flexio_dev_status_t flexio_dev_dbr_cq_set_ci(uint32_t *cq_dbr, uint32_t ci)
{
	*cq_dbr = cpu_to_be32(ci & ((1 << 24) - 1));
	return FLEXIO_DEV_STATUS_SUCCESS;
}

#endif /* _FLEXIO_DEV_QUEUE_ACCESS_H_ */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <libflexio-dev/flexio_dev_queue_types.h>: the mlx5 queue element layouts
 * (big endian), field by field as in NVIDIA's header of the same name (FlexIO SDK 25.1,
 * "based on content of mlx5/device.h") and rdma-core's providers/mlx5/mlx5dv.h (struct
 * mlx5_cqe64, mlx5_wqe_*_seg). The emulated NIC (src/fxm_nic.c, fxm_sq.c) reads and writes
 * exactly these bytes, so a WQE the binding builds wrong fails in the model as it would on a
 * card.
 */
#ifndef _FLEXIO_DEV_QUEUE_TYPES_H_
#define _FLEXIO_DEV_QUEUE_TYPES_H_

#include <libflexio-dev/flexio_dev.h>
#include <stdint.h>

/* An SQ is log_sq_depth 64-byte basic blocks (WQEBBs) of four 16-byte segments. */
#define LOG_SQE_NUM_SEGS 2

typedef uint64_t __be64;
typedef uint32_t __be32;
typedef uint16_t __be16;

struct flexio_dev_eqe {
	uint8_t rsvd00;
	uint8_t type;
	uint8_t rsvd02;
	uint8_t sub_type;
	uint8_t rsvd4[28];
	struct {
		__be32 rsvd00[6];
		__be32 cqn;             /* 24 lsb */
	} event_data;
	__be16 rsvd3c;
	uint8_t signature;
	uint8_t owner;
} __attribute__((packed, aligned(8)));

/* CQE64: bytes 0x20 srqn/user index, 0x24 immediate, 0x2c byte count, 0x34 hw/vendor
 * syndromes, 0x37 syndrome (error CQEs), 0x38 qpn (24 bits), 0x3c wqe_counter, 0x3f
 * opcode << 4 | owner. */
struct flexio_dev_cqe64 {
	__be32 rsvd00[5];
	__be16 csum_ok;
	uint8_t rsvd22[2];
	__be32 rsvd24[2];
	__be32 srqn_uidx;
	__be32 imm_inval_pkey;
	__be32 rsvd40;
	__be32 byte_cnt;
	__be32 rsvd48;
	uint8_t hw_err_syndrome;
	uint8_t rsvd50;
	uint8_t vendor_err_synd;
	uint8_t syndrome;
	union {
		struct {
			uint8_t sop_rdrop;
			uint8_t qpn24[3];
		};
		__be32 qpn;
	};
	__be16 wqe_counter;
	union {
		uint8_t signature;
		uint8_t validity_iteration_count;
	};
	volatile uint8_t op_own;
} __attribute__((packed, aligned(8)));

struct flexio_dev_mini_cqe64 {
	__be64 mini_cqe[7];
	uint8_t rsvd0[6];
	uint8_t validity_iteration_count;
	uint8_t num_and_type;
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_mem_ptr_send_data_seg {
	__be32 byte_count;
	__be32 lkey;
	__be64 addr;
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_inline_send_data_seg {
	__be32 byte_count;              /* bit 31: inline */
	__be32 data_and_padding[3];
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_rcv_data_seg {
	__be32 byte_count;
	__be32 lkey;
	__be64 addr;
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_shared_receive_seg {
	uint8_t rsvd0[2];
	__be16 next_wqe_index;
	uint8_t signature;
	uint8_t rsvd1[11];
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_ctrl_seg {
	__be32 idx_opcode;              /* opmod << 24 | wqe index << 8 | opcode */
	__be32 qpn_ds;                  /* qpn << 8 | data segments (16-byte units) */
	__be32 signature_fm_ce_se;      /* low byte: fence << 5 | ce << 2 | se << 1 */
	__be32 general_id;              /* immediate of *_WITH_IMMEDIATE */
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_eth_seg {
	__be32 rsvd0;
	__be16 cs_swp_flags;
	__be16 mss;
	__be32 rsvd2;
	__be16 inline_hdr_bsz;
	uint8_t inline_hdrs[2];
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_inline_data_seg {
	uint8_t inline_data[16];
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_rdma_seg {
	__be64 raddr;
	__be32 rkey;
	__be32 rsvd0;
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_atomic_seg {
	__be64 swap_or_add_data;
	__be64 compare_data;
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_transpose_seg {
	uint8_t rsvd0[0x3];
	uint8_t element_size;
	uint8_t rsvd1;
	uint8_t num_of_cols;
	uint8_t rsvd2;
	uint8_t num_of_rows;
	uint8_t rsvd4[0x8];
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_wait_on_data_seg {
	uint8_t rsvd0[0x3];
	uint8_t op_inv;
	uint32_t lkey;
	uint32_t va_63_32;
	uint32_t va_31_3_fail_act;
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_wait_on_data_data_seg {
	__be64 data;
	__be64 data_mask;
} __attribute__((packed, aligned(8)));

struct flexio_dev_wqe_datagram_seg {
	union {
		struct {
			union {
				struct {
					__be32 qkey;
					__be32 reserved;
				} qkey;
				__be64 dc_key;
			} key;
			__be32 ext_dqp_dct;
			uint8_t stat_rate_sl;
			uint8_t fl_mlid;
			__be16 rlid;
		} s1;
		struct {
			uint8_t reserved0[4];
			uint8_t rmac[6];
			uint8_t tclass;
			uint8_t hop_limit;
			__be32 grh_gid_fl;
		} s2;
		struct {
			uint8_t rgid[16];
		} s3;
	};
} __attribute__((packed, aligned(8)));

union flexio_dev_sqe_seg {
	struct flexio_dev_wqe_ctrl_seg ctrl;
	struct flexio_dev_wqe_eth_seg eth;
	struct flexio_dev_wqe_inline_data_seg inline_data;
	struct flexio_dev_wqe_rdma_seg rdma;
	struct flexio_dev_wqe_mem_ptr_send_data_seg mem_ptr_send_data;
	struct flexio_dev_wqe_inline_send_data_seg inline_send_data;
	struct flexio_dev_wqe_atomic_seg atomic;
	struct flexio_dev_wqe_transpose_seg transpose;
	struct flexio_dev_wqe_shared_receive_seg shared_receive;
	struct flexio_dev_wqe_wait_on_data_seg wait_on_data;
	struct flexio_dev_wqe_wait_on_data_data_seg wait_on_data_data;
	struct flexio_dev_wqe_datagram_seg adres_vector;
};

_Static_assert(sizeof(union flexio_dev_sqe_seg) == 16, "Broken WQE segment union");
_Static_assert(sizeof(struct flexio_dev_cqe64) == 64, "CQE64");
_Static_assert(__builtin_offsetof(struct flexio_dev_cqe64, srqn_uidx) == 0x20, "cqe user index");
_Static_assert(__builtin_offsetof(struct flexio_dev_cqe64, syndrome) == 0x37, "cqe syndrome");
_Static_assert(__builtin_offsetof(struct flexio_dev_cqe64, wqe_counter) == 0x3c, "cqe counter");
_Static_assert(__builtin_offsetof(struct flexio_dev_cqe64, op_own) == 0x3f, "cqe op_own");

#endif /* _FLEXIO_DEV_QUEUE_TYPES_H_ */

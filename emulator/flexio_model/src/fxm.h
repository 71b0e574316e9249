/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FlexIO model's internals: one emulated NIC per process (src/fxm_nic.c) with its
 * ports, memory registrations, CQs and QPs, shared by the model's libibverbs (host
 * verbs, src/fxm_verbs.c, src/fxm_hostq.c) and libflexio (DPA processes, src/fxm_flexio.c,
 * src/fxm_dpa.c). Everything the NIC reads or writes in a queue is in mlx5 layout (big
 * endian), in the memory the queue's owner gave it: DPA heap for FlexIO queues, buffers
 * of the model's own for host queues.
 *
 * Lock rules:
 *  - fxm.lock guards the object tables (MRs, CQs, QPs, PDs) and their creation and
 *    destruction; the NIC looks objects up under it and keeps no pointer across a
 *    destroy (destroy waits for the NIC to let go: fxm_nic_quiesce).
 *  - cq->lock guards a CQ's producer index, arm state and CQE writes (the NIC thread and
 *    DPA threads calling zcqe_gen both write CQEs).
 *  - Everything a QP's requester and responder state holds is touched by the NIC thread
 *    only; other threads talk to it through doorbells (a queue under nic.lock).
 */
#ifndef FXM_H
#define FXM_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define FXM_VENDOR_ID      0x15b3u   /* Mellanox */
#define FXM_PART_BF3       0xa2dcu   /* BlueField-3 integrated ConnectX-7: has a DPA */
#define FXM_FW_VERSION     "32.43.1014 (FlexIO model)"
#define FXM_MAX_PORTS      8u
#define FXM_GIDS_PER_PORT  4u
#define FXM_MAX_SGE        16u
#define FXM_MAX_INLINE     256u
#define FXM_ATOMIC_CACHE   16u
#define FXM_DEFAULT_TIMEOUT 14u      /* local ACK timeout exponent: 4.096 us << 14 = 67 ms */

/* mlx5 CQE opcodes and error syndromes (rdma-core providers/mlx5/mlx5dv.h). */
enum {
	FXM_CQE_REQ = 0x0,
	FXM_CQE_RESP_WR_IMM = 0x1,
	FXM_CQE_RESP_SEND = 0x2,
	FXM_CQE_RESP_SEND_IMM = 0x3,
	FXM_CQE_REQ_ERR = 0xd,
	FXM_CQE_RESP_ERR = 0xe,
	FXM_CQE_INVALID = 0xf,
};

enum {
	FXM_SYND_LOCAL_LENGTH = 0x01,
	FXM_SYND_LOCAL_QP_OP = 0x02,
	FXM_SYND_LOCAL_PROT = 0x04,
	FXM_SYND_WR_FLUSH = 0x05,
	FXM_SYND_BAD_RESP = 0x10,
	FXM_SYND_LOCAL_ACCESS = 0x11,
	FXM_SYND_REMOTE_INVAL_REQ = 0x12,
	FXM_SYND_REMOTE_ACCESS = 0x13,
	FXM_SYND_REMOTE_OP = 0x14,
	FXM_SYND_TRANSPORT_RETRY_EXC = 0x15,
	FXM_SYND_RNR_RETRY_EXC = 0x16,
};

/* WQE opcodes (mlx5 PRM, the values of flexio_dev_queue_access.h / mlx5dv.h). */
enum {
	FXM_OP_NOP = 0x00,
	FXM_OP_RDMA_WRITE = 0x08,
	FXM_OP_RDMA_WRITE_IMM = 0x09,
	FXM_OP_SEND = 0x0a,
	FXM_OP_SEND_IMM = 0x0b,
	FXM_OP_RDMA_READ = 0x10,
	FXM_OP_ATOMIC_CS = 0x11,
	FXM_OP_ATOMIC_FA = 0x12,
};

#define FXM_WQE_CE_SHIFT     2
#define FXM_WQE_CE_MASK      (3u << FXM_WQE_CE_SHIFT)
#define FXM_WQE_FENCE_MASK   (7u << 5)      /* any fence mode: wait for reads/atomics */
#define FXM_INLINE_SEG       0x80000000u
#define FXM_INVALID_LKEY     0x100u         /* MLX5_INVALID_LKEY: ends a receive list */

enum fxm_mr_kind {
	FXM_MR_HOST = 0,       /* ibv_reg_mr of process memory */
	FXM_MR_IMPLICIT = 1,   /* implicit on-demand paging: the whole address space */
	FXM_MR_DPA = 2,        /* flexio_device_mkey_create over DPA heap memory */
	FXM_MR_DMABUF = 3,     /* ibv_reg_dmabuf_mr: iova named, no memory behind it here */
};

struct fxm_pd {
	struct ibv_pd ibv;
	uint32_t id;
	uint32_t refs;          /* MRs, QPs, windows and processes on it */
};

struct fxm_mr {
	struct ibv_mr ibv;
	struct fxm_pd *pd;
	uint32_t key;           /* lkey == rkey, as mlx5 gives a registration one mkey */
	int access;             /* IBV_ACCESS_* */
	uint32_t kind;          /* enum fxm_mr_kind */
	uint64_t addr;
	uint64_t len;
	struct fxm_mr *next;    /* hash chain, under fxm.lock */
};

struct fxm_eh;
struct fxm_chan;

struct fxm_cq {
	struct ibv_cq ibv;      /* host CQs only */
	uint32_t cqn;
	uint32_t log_depth;
	uint8_t *ring;          /* 64 << log_depth bytes of CQE64 */
	uint32_t *dbr;          /* [0]: consumer index, big endian, 24 bits */
	uint32_t pi;            /* producer index, free running */
	int armed;
	int overrun_ignore;
	int error;              /* overrun: the CQ writes nothing more */
	int always_armed;
	struct fxm_eh *eh;      /* DPA thread run on its events, or NULL */
	struct ibv_comp_channel *chan;  /* host CQ's completion channel, or NULL */
	int host;               /* created by ibv_create_cq: ring owned by the model */
	pthread_mutex_t lock;
	uint64_t events;
	uint32_t poll_ci;       /* host CQs: the provider's consumer index */
	struct fxm_cq *next;
};

/* One WQE the requester executed and awaits the answer for. */
struct fxm_inflight {
	uint32_t wqe_index;     /* first basic block, 16 bits as the CQE reports it */
	uint32_t nbb;
	uint32_t psn;
	uint32_t opcode;
	uint32_t signaled;
	uint32_t bytes;
	uint32_t nsge;
	struct { uint64_t addr; uint64_t len; } sge[FXM_MAX_SGE];   /* READ/atomic results */
	uint32_t msg_len;       /* the request as sent, kept for resending */
	uint8_t *msg;
};

struct fxm_qp {
	struct ibv_qp ibv;      /* host QPs only */
	uint32_t qpn;
	uint32_t user_index;
	struct fxm_pd *pd;
	struct fxm_cq *scq, *rcq;
	int dpa;                /* a FlexIO QP (DPA memory, FlexIO attributes) */
	void *proc;             /* the flexio process of a FlexIO QP */
	int state;              /* enum ibv_qp_state */
	int access;             /* IBV_ACCESS_REMOTE_* the QP allows */
	/* send queue */
	uint8_t *sq;
	uint32_t log_sq;        /* basic blocks */
	uint32_t *dbr;          /* [0] RQ counter, [1] SQ counter, big endian */
	uint32_t db_pi;         /* producer index from the last doorbell, 32 bits; nic lock */
	uint32_t sq_db;         /* the NIC's copy of it */
	uint32_t sq_next;       /* next basic block to execute, free running */
	int sq_sig_all;
	/* receive queue */
	uint8_t *rq;
	uint32_t log_rq;        /* receive WQEs */
	uint32_t rq_stride;     /* bytes per receive WQE */
	uint32_t rq_ci;         /* receive WQEs consumed, free running */
	/* connection */
	uint32_t remote_qpn;
	union ibv_gid rgid;
	uint8_t port;           /* 1-based */
	uint8_t sgid_index;
	uint8_t fl;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t grh;
	/* requester, NIC thread only */
	uint32_t next_psn;
	uint32_t reads_inflight;/* READ/atomic awaiting their response: fences wait on them */
	struct fxm_inflight *inflight;
	uint32_t n_inflight, cap_inflight, head_inflight;
	uint64_t deadline_ns;   /* oldest request's answer is due */
	uint32_t attempts;
	uint64_t rnr_until_ns;  /* RNR NAK: resend after this */
	uint32_t rnr_attempts;
	int db_queued;
	/* responder, NIC thread only */
	uint32_t expected_psn;
	struct { uint32_t psn; uint64_t old; } atomic_cache[FXM_ATOMIC_CACHE];
	uint32_t atomic_cache_next;
	/* host QPs: wr_ids by WQE index */
	uint64_t *sq_wrid;
	uint8_t *sq_signal;
	uint64_t *rq_wrid;
	uint32_t rq_pi;         /* host: receives posted */
	uint32_t sq_pi;         /* host: next basic block to fill */
	uint32_t sq_retired;    /* host: first basic block not yet completed */
	pthread_mutex_t post_lock;   /* host posting */
	struct fxm_qp *next;
};

struct fxm_port {
	uint8_t num;            /* 1-based */
	int up;
	uint64_t down_after;    /* fault injection: bytes sent before it goes down */
	uint64_t sent;
	uint32_t ipv4;          /* host order, 127.x.y.z */
	union ibv_gid gid[FXM_GIDS_PER_PORT];
	uint32_t gid_type[FXM_GIDS_PER_PORT];
	int listen_fd;
};

struct fxm_state {
	pthread_mutex_t lock;
	int users;              /* open device contexts */
	uint32_t nports;
	struct fxm_port ports[FXM_MAX_PORTS];
	uint32_t next_cqn, next_qpn, next_pd;
	struct fxm_mr *mrs[256];
	struct fxm_cq *cqs;
	struct fxm_qp *qps;
	uint64_t locked_bytes;  /* registered, counted against RLIMIT_MEMLOCK */
};

extern struct fxm_state fxm;

/* ------------------------------------------------------------------ fxm_verbs.c */
void fxm_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int fxm_verbose(void);   /* FXM_VERBOSE=1: log QP errors and the like */
uint64_t fxm_now_ns(void);
struct fxm_mr *fxm_mr_find_locked(uint32_t key);
/* Registration that covers [addr, addr+len) for access in pd, or NULL; *synd tells why. */
struct fxm_mr *fxm_mr_check(struct fxm_pd *pd, uint32_t key, uint64_t addr, uint64_t len,
			    int access, int remote, uint32_t *synd);
struct fxm_mr *fxm_mr_add(struct fxm_pd *pd, uint64_t addr, uint64_t len, int access,
			  uint32_t kind);
int fxm_mr_remove(struct fxm_mr *mr);
struct fxm_pd *to_fxm_pd(struct ibv_pd *pd);
struct fxm_port *fxm_port(uint8_t num);
int fxm_gid_is_routable(const union ibv_gid *gid, uint32_t type);

/* ------------------------------------------------------------------ fxm_nic.c */
int fxm_nic_get(void);
void fxm_nic_put(void);
void fxm_nic_doorbell(struct fxm_qp *qp, uint32_t pi16);
void fxm_nic_rq_doorbell(struct fxm_qp *qp);
void fxm_nic_quiesce(void);
uint32_t fxm_cq_add(struct fxm_cq *cq);
struct fxm_cq *fxm_cq_find_locked(uint32_t cqn);
void fxm_cq_remove(struct fxm_cq *cq);
uint32_t fxm_qp_add(struct fxm_qp *qp);
struct fxm_qp *fxm_qp_find_locked(uint32_t qpn);
void fxm_qp_remove(struct fxm_qp *qp);
void fxm_qp_to_error(struct fxm_qp *qp);
/* The requester's in-flight WQEs of a QP (fxm_nic.c completes them in SQ order): the
 * oldest, its retirement, a requester CQE, the flush of all of them and of the local ones
 * (no answer awaited) at the head; the ACK timeout a request is resent after. */
uint64_t fxm_ack_timeout_ns(const struct fxm_qp *qp);
struct fxm_inflight *fxm_inflight_head(struct fxm_qp *qp);
void fxm_inflight_pop(struct fxm_qp *qp);
void fxm_push_req_cqe(struct fxm_qp *qp, uint32_t wqe_index, uint8_t opcode, uint8_t synd,
		      uint32_t bytes);
void fxm_flush_all(struct fxm_qp *qp);
void fxm_complete_locals(struct fxm_qp *qp);
/* fxm_sq.c: execute the WQEs rung for (the NIC thread, QP locked); the QP's resends due by
 * now, returning when it next needs a look. */
void fxm_run_sq(struct fxm_qp *qp);
uint64_t fxm_qp_timers(struct fxm_qp *qp, uint64_t now);
/* mlx5 structures are big endian */
static inline uint32_t fxm_be32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return __builtin_bswap32(v);
}

static inline uint64_t fxm_be64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return __builtin_bswap64(v);
}

/* ------------------------------------------------------------------ fxm_cq.c */
struct fxm_cqe_info {
	uint8_t opcode;
	uint8_t syndrome;
	uint8_t vendor_synd;
	uint32_t qpn;
	uint32_t user_index;
	uint16_t wqe_counter;
	uint32_t byte_cnt;
	uint32_t imm;           /* as carried: network order */
};
void fxm_cq_push(struct fxm_cq *cq, const struct fxm_cqe_info *info);
void fxm_cq_arm(struct fxm_cq *cq, uint32_t ci);
/* Defined by whoever attaches handlers (fxm_dpa.c / fxm_hostq.c). */
void fxm_eh_trigger(struct fxm_eh *eh);
/* Debugging (FXM_DEBUG_DUMP=1, then SIGUSR2): the state of every queue and DPA thread. */
void fxm_dump_dpa(void);
void fxm_chan_notify(struct fxm_cq *cq);


#endif /* FXM_H */

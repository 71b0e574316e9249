/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the emulated NICs say to each other: a request (one WQE's worth: RDMA WRITE,
 * WRITE WITH IMMEDIATE, SEND, READ, fetch-add), and an answer (ACK, NAK with the
 * syndrome the requester's CQE will carry, RNR NAK). Payload moves by a single copy
 * between the two processes' memories (process_vm_readv/writev), the way DMA moves it,
 * or inline in the request. DROP is the model's own: it tells a requester that its
 * request fell on the floor (no such QP, QP not ready, out of sequence), which on a wire
 * it would only learn from its retry timer; the requester then waits that timer out.
 */
#ifndef FXM_MSG_H
#define FXM_MSG_H

#include <stdint.h>

#include "fxm.h"

enum fxm_msg_kind {
	FXM_MSG_REQ = 1,
	FXM_MSG_ACK = 2,
	FXM_MSG_NAK = 3,
	FXM_MSG_RNR = 4,
	FXM_MSG_DROP = 5,
};

struct fxm_msg {
	uint32_t kind;
	uint32_t op;            /* REQ: WQE opcode */
	uint32_t src_ipv4;      /* the sending port's address: answers go back to it */
	uint32_t dst_ipv4;
	uint32_t sqpn, dqpn;
	uint32_t psn;
	int32_t pid;            /* requester process: where its local buffers live */
	union ibv_gid sgid, dgid;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;           /* network order, as the WQE's general_id carries it */
	uint64_t length;        /* payload bytes */
	uint64_t add;           /* fetch-add operand */
	uint32_t nsge;          /* requester-local buffers: WRITE/SEND source, READ target */
	uint32_t inline_len;    /* payload bytes following the message */
	struct { uint64_t addr; uint64_t len; } sge[FXM_MAX_SGE];
	/* answers */
	uint32_t syndrome;
	uint32_t resp_bytes;
	uint64_t atomic_old;
};

/* fxm_resp.c: the responder, and the requester's handling of answers. */
void fxm_rx(uint8_t lport, const uint8_t *buf, uint32_t len);
/* fxm_nic.c, for fxm_resp.c */
void fxm_req_answer(struct fxm_qp *qp, const struct fxm_msg *m);
int fxm_nic_send(uint8_t lport, uint32_t dst, const struct fxm_msg *m, const void *payload,
		 uint32_t plen);
uint32_t fxm_gid_ipv4(const union ibv_gid *gid);
uint32_t fxm_rq_posted(const struct fxm_qp *qp);
void fxm_note_error_qp(void);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The emulated BlueField of one rank process. Lock rules:
 *  - mr_lock guards allocation of entries in this rank's own MR table (owner-only writes);
 *    peers read entries lock-free, validating the key before and after (seqlock style).
 *  - map_lock guards the cache of peers' shared segments mapped into this process.
 *  - everything else in the job segment is atomics.
 */
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "dpa_hal.h"
#include "host_device.h"
#include "offload_abi.h"

#define EMU_MAGIC     0x45415044u   /* "DPAE" */
#define EMU_MAX_MRS   1024u         /* per rank; key low bits index the table */
#define EMU_KEY_BITS  10u
#define EMU_MAX_MAPS  256u
#define EMU_CQ_DEPTH  8192u
#define EMU_ADVISED   64u           /* ranges already advised for huge pages */

enum emu_mr_kind {
	EMU_MR_PRIVATE = 0,   /* ordinary process memory: process_vm_writev/readv */
	EMU_MR_JOB = 1,       /* inside the job segment (control words) */
	EMU_MR_SHARED = 2,    /* a ctx.empty() segment: mapped by peers on first use */
};

enum emu_rank_state {
	EMU_RANK_ABSENT = 0,
	EMU_RANK_ALIVE = 1,
	EMU_RANK_CLOSED = 2,
	EMU_RANK_DEAD = 3,    /* exited without closing; a survivor cleaned up after it */
};

struct emu_job_hdr {
	uint32_t magic;
	uint32_t abi;
	uint32_t nranks;
	uint32_t arrived;
	uint32_t closed;
	uint32_t resv0;
	/* Ranks with every port down: unreachable, so peers fail them as if dead. */
	uint64_t unreachable;
	uint32_t resv[8];
};

struct emu_rank {
	int32_t pid;
	uint32_t state;
	uint64_t ctrl_addr;   /* the owner's address of its struct offload_ctrl */
	uint32_t ctrl_key;
	uint32_t rails_down;  /* this rank's failed ports (bit per rail), set by the rank */
	uint32_t resv0[10];
	/* Own line: bumped by doorbells and remote signals, slept on by progress threads. */
	uint32_t event;
	uint32_t sleepers;
	uint32_t load;        /* enum dpa_engine_load, published when a thread parks */
	uint32_t resv1[13];
};

struct emu_mr {
	uint32_t key;         /* 0: free. Written last on registration, first on deregistration */
	uint32_t access;
	uint64_t addr;        /* in the owner's address space */
	uint64_t len;
	uint32_t kind;        /* enum emu_mr_kind */
	uint32_t serial;      /* EMU_MR_SHARED: segment serial */
	uint64_t shm_offset;  /* EMU_MR_JOB: offset in the job segment */
	uint64_t resv[3];
};

/* A peer's ctx.empty() segment mapped here. Slots never move (users hold pointers to
 * them); ptr == NULL marks a free slot. users counts copies in progress: a slot whose
 * registration the owner revoked is unmapped once no copy uses it. */
struct emu_map {
	uint32_t rank;
	uint32_t serial;
	uint32_t key;         /* the owner's key it was mapped for */
	uint32_t users;
	uint8_t *ptr;
	uint64_t len;
};

struct emu_device;

struct dpa_hal {
	struct emu_device *dev;
	uint32_t index;
	uint8_t rail[OFFLOAD_MAX_RANKS];  /* per peer: the rail this thread posts on */
	uint32_t cq_head;     /* consumer and producer are both this thread */
	uint32_t cq_tail;
	struct dpa_hal_cqe cq[EMU_CQ_DEPTH];
};

struct emu_device {
	struct host_device_attr attr;
	char job[96];
	uint8_t *job_map;
	uint64_t job_len;
	struct emu_job_hdr *hdr;
	struct emu_rank *ranks;
	struct emu_mr *mrs;           /* [nranks][EMU_MAX_MRS] */
	struct offload_ctrl *ctrls;   /* [nranks] */
	pthread_mutex_t mr_lock;
	uint64_t rng;
	uint32_t next_serial;
	pthread_mutex_t map_lock;
	struct emu_map maps[EMU_MAX_MAPS];
	uint32_t joined;              /* this rank is published in the job segment */
	uint64_t advised[EMU_ADVISED][2];
	uint32_t advised_next;
	/* firmware */
	void *fw_state;
	struct host_fw_windows win;
	struct dpa_hal *hals;
	pthread_t *threads;
	uint32_t nthreads_started;
	uint32_t stop;
	uint32_t rail_faults;         /* a rail of this rank is set to fail */
	uint64_t unreachable_seen;    /* job's unreachable ranks already in failed_ranks */
	uint64_t rail_sent[HOST_MAX_RAILS];
	/* peer watch (emu_watch.c) */
	pthread_t watch;
	int watch_stop_fd;
	uint32_t watching;
	uint32_t peers_failed;
};

static inline struct emu_device *to_emu(struct host_device *dev)
{
	return (struct emu_device *)dev;
}

/* emu_job.c */
int emu_job_open(struct emu_device *dev);
void emu_job_close(struct emu_device *dev);
int emu_job_barrier(struct emu_device *dev, int64_t timeout_ns);
int emu_mr_reg(struct emu_device *dev, uint64_t addr, uint64_t len, uint32_t access,
	       uint32_t kind, uint32_t serial, uint64_t shm_offset, uint32_t *key);
int emu_mr_dereg(struct emu_device *dev, uint32_t key);
/* Resolve [addr, addr+len) of rank's key for `access`: *ptr set if this process can copy
 * directly, else *pid for process_vm_*; *held is the peer mapping in use, to release after
 * the copy. Returns OFFLOAD_OK or an error status. */
int32_t emu_mr_resolve(struct emu_device *dev, uint32_t rank, uint32_t key, uint64_t addr,
		       uint64_t len, uint32_t access, uint8_t **ptr, int32_t *pid,
		       struct emu_map **held);
/* Ends the copy that emu_mr_resolve() allowed into a mapped peer segment (held may be NULL). */
void emu_map_release(struct emu_map *held);
void emu_shared_name(const struct emu_device *dev, uint32_t rank, uint32_t serial,
		     char *out, uint64_t outlen);
void emu_unmap_peers(struct emu_device *dev);

/* emu_copy.c: a copy into memory mapped here, as the NIC's DMA would do it */
void emu_dma_copy(void *dst, const void *src, uint64_t len);

/* emu_device.c */
void emu_wake_rank(struct emu_device *dev, uint32_t rank);
void emu_rail_down(struct emu_device *dev, uint32_t rail);
/* emu_watch.c: fail peers that exit without closing (see there). */
int emu_watch_start(struct emu_device *dev);
void emu_watch_stop(struct emu_device *dev);
uint64_t emu_now_ns(void);

#endif /* EMU_INTERNAL_H */

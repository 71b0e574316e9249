/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libdpaoffload_mpi: PMPI interposition that runs an unmodified MPI program's all-to-all,
 * all-to-all-v, broadcast, all-gather, allreduce and reduce-scatter-block (blocking, non-blocking, persistent) on the DPA
 * through the public C API, and passes everything else to MPI unchanged.
 *
 * The rule everything here keeps: every rank of a communicator takes the same path for
 * every call, or the team's sequence and MPI's collective order part and the job hangs.
 * So a decision to offload uses only what MPI requires to agree across the communicator
 * (the collective, the communicator, byte counts of the non-v forms, MPI_IN_PLACE) and
 * process-wide facts that the bootstrap made identical everywhere. Local facts (a
 * datatype's layout, displacements) never decide: they are absorbed by packing.
 */
#ifndef DPO_MPI_H
#define DPO_MPI_H

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>

#include "dpa_offload.h"

#define DPO_MPI_API __attribute__((visibility("default")))

enum dpo_mpi_coll {
	C_ALLTOALL, C_ALLTOALLV, C_BCAST, C_ALLGATHER,
	C_IALLTOALL, C_IALLTOALLV, C_IBCAST, C_IALLGATHER,
	C_ALLTOALL_INIT, C_ALLREDUCE, C_IALLREDUCE, C_REDUCE_SCATTER_BLOCK,
	C_IREDUCE_SCATTER_BLOCK, C_NCOLL
};

enum dpo_mpi_reason {
	R_OFFLOADED, R_PACKED,  /* served (packed: through bounce buffers, also counted served) */
	R_DISABLED, R_NO_CONTEXT, R_INTERCOMM, R_FOREIGN, R_SIZE_1, R_IN_PLACE,
	R_BELOW_THRESHOLD, R_BAD_ARGS, R_NONCONTIG, R_NO_TEAM,
	R_OP, R_DATATYPE,       /* reductions: an op / a datatype the DPA does not reduce */
	R_NREASON
};

/* What this process knows about one communicator (an attribute on it). */
struct comm_state {
	enum dpo_mpi_reason reason;   /* R_OFFLOADED: eligible; else why every call passes */
	MPI_Comm comm;                /* the user's (for messages) */
	MPI_Comm shadow;              /* the team's OOB: MPI traffic of ours never mixes with the user's */
	dpo_team_h team;              /* NULL until the first offloaded call */
	uint32_t live_ops;            /* requests not finalized: the team outlives them */
	int freed;                    /* the communicator was freed: destroy once live_ops = 0 */
	struct comm_state *next;      /* every state, for MPI_Finalize */
};

struct dpo_mpi {
	int enabled;                  /* a context exists */
	int thread_multiple;
	dpo_context_h ctx;
	dpo_config_h cfg;
	MPI_Comm boot;                /* the context's OOB */
	int comm_keyval;
	/* offload from this many bytes (per peer, message, block): all-to-all, bcast, all-gather */
	uint64_t min_alltoall, min_bcast, min_allgather;
	/* reductions: from this many bytes of the whole vector (allreduce: count x type size;
	 * reduce-scatter-block: recvcount x type size x ranks) */
	uint64_t min_allreduce, min_reduce_scatter;
	int colls_enabled[C_NCOLL];
	int noncontig_pass;
	int stats_mode;               /* 0 off, 1 summed over ranks, 2 per rank */
	int world_rank, world_size;
	MPI_Group world_group;
	struct comm_state *states;
	pthread_mutex_t lock;         /* states list, op table, progress */
	uint64_t counts[C_NCOLL][R_NREASON];
};

extern struct dpo_mpi dpo_mpi;

/* one served op in flight or persistent (mpi_req.c) */
struct mpi_op {
	enum dpo_mpi_coll coll;
	struct comm_state *cs;
	dpo_coll_req_h req;
	MPI_Request handle;           /* grequest (I*) or inactive placeholder (persistent) */
	int persistent;
	int active;                   /* posted and not seen complete */
	/* packing: src packed at each post, dst unpacked at each completion */
	void *pack_src, *pack_dst;
	const void *user_sbuf;
	void *user_rbuf;
	int scount_total, rcount_total;   /* elements of the user types in one (un)pack */
	MPI_Datatype stype, rtype;
	int pack_bytes_src, pack_bytes_dst;
	/* v-forms packed per block */
	int *vcounts_s, *vdispls_s, *vcounts_r, *vdispls_r, nblocks;
	MPI_Aint sextent, rextent;
	int unpack_skip;              /* broadcast root: its buffer is the source already */
	struct mpi_op *next;
};

/* mpi_lib.c */
void dpo_mpi_count(enum dpo_mpi_coll c, enum dpo_mpi_reason r);
struct comm_state *dpo_mpi_state(MPI_Comm comm);
int dpo_mpi_ensure_team(struct comm_state *cs);
int dpo_mpi_fail(struct comm_state *cs, enum dpo_mpi_coll c, dpo_coll_req_h req, dpo_status_t st);
const char *dpo_mpi_coll_name(enum dpo_mpi_coll c);
void dpo_mpi_lock(void);
void dpo_mpi_unlock(void);
void dpo_mpi_release_team(struct comm_state *cs);

/* mpi_colls.c */
int dpo_mpi_contig(MPI_Datatype t);
/* the checks every served call makes first; R_OFFLOADED if it may go to the DPA */
enum dpo_mpi_reason dpo_mpi_gate(enum dpo_mpi_coll c, MPI_Comm comm, struct comm_state **out);
/* then: under the threshold, no team (created here, collectively, on first use), or an op
 * for the call (NULL: pass it through, reason in *why) */
struct mpi_op *dpo_mpi_admit(enum dpo_mpi_coll c, struct comm_state *cs, uint64_t bytes,
			     uint64_t min_bytes, enum dpo_mpi_reason *why);
/* init the request of op (NULL: pass the call through, reason in *why; op is freed) */
struct mpi_op *dpo_mpi_build(enum dpo_mpi_coll c, struct comm_state *cs, dpo_coll_args_t *a,
			     int persistent, int packed, enum dpo_mpi_reason *why,
			     struct mpi_op *op);
int dpo_mpi_run_blocking(struct mpi_op *op);
int dpo_mpi_start_nonblocking(struct mpi_op *op, MPI_Request *req);

/* Default thresholds of the reductions (whole-vector bytes): docs/performance.md. */
#define DPO_MPI_MIN_ALLREDUCE (16ull << 20)
#define DPO_MPI_MIN_REDUCE_SCATTER (1ull << 20)

/* mpi_req.c */
struct mpi_op *dpo_mpi_op_new(enum dpo_mpi_coll c, struct comm_state *cs);
void dpo_mpi_op_free(struct mpi_op *op);
int dpo_mpi_op_start(struct mpi_op *op);          /* pack + post */
int dpo_mpi_op_wait(struct mpi_op *op);           /* wait with MPI progress, unpack */
int dpo_mpi_op_grequest(struct mpi_op *op, MPI_Request *req);
int dpo_mpi_op_persistent(struct mpi_op *op, MPI_Request *req);
void dpo_mpi_finish_all(void);

#endif

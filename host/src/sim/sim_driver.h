/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulator's host side: each rank's "application" posts 64-byte commands into its
 * ring, as host/ does, reaps completions when the firmware notifies it, and checks every
 * result exactly (real payload). A script is the same list of ops for every rank; a rank
 * posts op k once fewer than `window` of its ops are in flight, after its skew.
 */
#ifndef SIM_DRIVER_H
#define SIM_DRIVER_H

/* Ranks of a simulated job (the ABI takes up to OFFLOAD_RANKS_LIMIT): tables of the world
 * size are allocated per job, and 4096 ranks of default firmware state fit in a few GB. */
#define SIM_MAX_RANKS 4096u
#define SIM_RING_ENTRIES 64u  /* each rank's command ring */
#define SIM_CQ_ENTRIES (2 * SIM_RING_ENTRIES)  /* and its completions */
#define SIM_GUARD 64u         /* bytes of guard pattern after every op buffer */

#include "sim.h"

/* Each rank's ring (struct offload_ring_hdr, SQ, CQ), as sim_drv_init allocates it. */
static inline uint64_t sim_ring_bytes(uint32_t n)
{
	return offload_ring_bytes(SIM_RING_ENTRIES, SIM_CQ_ENTRIES, n);
}

/* What an op buffer of len bytes takes: its guard, rounded up to a 64-byte line. */
static inline uint64_t sim_buf_bytes(uint64_t len)
{
	return (len + SIM_GUARD + 63) & ~63ull;
}

enum sim_vmode { SIM_V_PLAIN = 0, SIM_V_EXPECT = 1, SIM_V_SLOTS = 2, SIM_V_MOE = 3 };

struct sim_opdesc {
	uint32_t opcode, team, root, vmode;
	uint64_t size;        /* bytes: per peer (all-to-all), per rank (all-gather), buffer
			       * (broadcast), src (reductions), largest block (all-to-all-v) */
};

struct sim_team {
	uint32_t id, size;
	uint32_t *members;    /* world ranks in team order */
};

struct sim_inst {
	uint32_t tag, posted, done, member;
	int32_t status;
	uint32_t detail;
	uint64_t result0, t_post, t_done;
	uint8_t *src, *dst, *aux;
	uint64_t src_len, dst_len, aux_len;
	uint32_t keys[4], nkeys;
};

struct sim_host {
	struct offload_ring_hdr *hdr;
	struct offload_cmd *sq;
	struct offload_cqe *cq;
	uint32_t sq_entries, cq_entries, cq_head, next_op, inflight, finished;
	uint64_t skew_ps;
	struct sim_inst *inst;   /* [nops] */
	/* faults: failed (dead, or every rail down) so far; doomed: a fault may make ops of
	 * this rank's teams fail */
	uint8_t failed, doomed;
};

struct sim_job {
	uint32_t n, threads, rails, window, payload, remote_wake_all;
	uint64_t seed, chunk_size;
	uint32_t chunks_per_pass, eager_max, mcast_roots, op_timeout_ms, a2a_window;
	uint64_t max_skew_ns;
	uint64_t moe_tokens;      /* SIM_V_MOE: tokens per rank */
};

struct sim_drv {
	struct sim_world w;
	struct sim_job job;
	struct sim_team teams[OFFLOAD_MAX_TEAMS];
	struct sim_opdesc *ops;
	uint32_t nops;
	uint32_t done_upto;        /* ops_done(): ranks below it are done or dead */
	struct sim_host *hosts;   /* [n] */
	/* faults: ranks that died or lost every rail may make ops of their teams fail */
	uint32_t ndoomed;         /* ranks whose host is marked doomed */
	uint32_t nfaults;
	struct sim_fault { uint32_t kind, rank, rail; uint64_t at_ps; } faults[8];
	uint32_t completions, rescues, failed_ops;
	uint64_t max_events;      /* 0: no bound; past it, a livelock */
	uint64_t *moe;            /* SIM_V_MOE counts of op moe_op, [n * n] tokens */
	uint32_t moe_op;
	char err[512];
};

enum sim_fault_kind { SIM_F_DEATH = 1, SIM_F_RAIL = 2, SIM_F_MARK = 3 };

/* sim_driver.c */
int sim_drv_init(struct sim_drv *d, const struct sim_job *job, const struct sim_model *model);
/* The engine parameters sim_drv_init() gives every rank (world_rank 0). */
void sim_drv_params(const struct sim_job *job, const struct sim_model *model,
		    struct dpa_engine_params *out);
/* Bytes sim_drv_init allocates for each rank's host: its struct sim_host, ring and stats. */
uint64_t sim_host_bytes(const struct sim_job *job);
void sim_drv_free(struct sim_drv *d);
int sim_drv_team(struct sim_drv *d, uint32_t id, uint32_t size, const uint32_t *members);
/* A fault may make ops of rank's teams fail (a named error is then accepted there). */
void sim_drv_doom(struct sim_drv *d, uint32_t rank);
int sim_drv_add_op(struct sim_drv *d, const struct sim_opdesc *op);
/* Post the script from now on (each rank after its skew) and run until every op is done
 * or a failure; 0, or -1 with d->err set (a wrong result, a hang, a violation). */
int sim_drv_run(struct sim_drv *d);
/* Bytes src sends dst in all-to-all-v op: random up to max (zeros included), or with
 * SIM_V_MOE the MoE dispatch of the job's moe_tokens tokens, max bytes each. */
uint64_t sim_vcount(struct sim_drv *d, uint32_t op, uint32_t src, uint32_t dst, uint64_t max,
		    uint32_t vmode);

/* sim_ops.c */
int sim_team_rank(const struct sim_team *t, uint32_t world);
/* The buffers op has on each rank of a team of n, in bytes: sim_op_build allocates these,
 * sim_mem_need counts them. Exact, but all-to-all-v's src and dst depend on its counts:
 * there they bound a rank's mean (every peer's largest block; MoE: each token to as many
 * ranks as it has experts). aux (arguments, a reduction's scratch) is held in phantom
 * payload too; dst_is_src: one buffer (broadcast). */
struct sim_op_bytes {
	uint64_t src, dst, aux;
	uint32_t dst_is_src;
};
void sim_op_bytes(const struct sim_job *job, const struct sim_opdesc *op, uint32_t n,
		  struct sim_op_bytes *out);
int sim_op_build(struct sim_drv *d, struct sim_rank *r, uint32_t k, struct offload_cmd *c);
void sim_op_check(struct sim_drv *d, struct sim_rank *r, uint32_t k, const struct offload_cqe *c);
void sim_op_release(struct sim_drv *d, struct sim_rank *r, struct sim_inst *in);
void sim_drv_fail(struct sim_drv *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* sim_explore.c */
#define SIM_GEN "g1"
/* Build and run explorer seed `seed`; returns 0 or -1 with d's err. verbose: describe. */
struct sim_explore_stats {
	uint64_t ops_ok, ops_err;  /* completions: exact, and failed with a named error */
};
int sim_explore_one(uint64_t seed, FILE *events, FILE *describe, char *err, size_t errlen,
		    uint64_t *hash, struct sim_explore_stats *st);

/* sim_mem.c: the memory a `run` job needs, against what this process may have. */
struct sim_mem_need {
	uint64_t touched;   /* bytes written (resident): engine state, tables, payload */
	uint64_t mapped;    /* address space (RLIMIT_AS counts it): the control regions too */
	uint64_t state, ctrl_touched, tables, payload;  /* touched, per rank (payload: job) */
};
void sim_mem_need(const struct sim_job *job, const struct sim_model *model, uint32_t opcode,
		  uint64_t size, uint32_t vmode, struct sim_mem_need *out);
/* 0 if the job fits, else -1 with why: the need against MemAvailable or RLIMIT_AS. */
int sim_mem_fits(const struct sim_job *job, const struct sim_mem_need *need, char *why,
		 size_t len);

#endif /* SIM_DRIVER_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dpa_offload.h: the public C API of dpa-offload (libdpaoffload.so, pkg-config dpa-offload).
 *
 * Collectives (all-to-all, all-to-all-v, broadcast, all-gather, barrier, allreduce,
 * reduce-scatter) run on the
 * progress threads of a DPA (or of its software emulator) while the calling thread is
 * free. No Python is involved: link with `pkg-config --cflags --libs dpa-offload`.
 *
 * Shaped like UCC so that its users feel at home:
 *
 *   dpo_config_read(&cfg)                     defaults, then OFFLOAD_<KEY> env variables
 *   dpo_context_create(&params, cfg, &ctx)    collective over the out-of-band allgather
 *   dpo_team_create_post(ctx, &tp, &team)     collective over the team's members only;
 *   while (dpo_team_create_test(team) == DPO_INPROGRESS) ...   non-blocking
 *   dpo_collective_init(&args, &req, team)    checks everything, posts nothing
 *   dpo_collective_post(req); dpo_collective_test(req) / dpo_collective_wait(req, -1)
 *   dpo_collective_finalize(req)
 *   dpo_team_destroy(team); dpo_context_destroy(ctx); dpo_config_release(cfg)
 *
 * Status: every call returns a dpo_status_t: DPO_OK (0), DPO_INPROGRESS (1), or a negative
 * error. dpo_status_string() names it; dpo_last_error() is this thread's message for the
 * last error a dpo_ call returned (what was wrong and what to do), "" if none.
 *
 * Threads: contexts and teams may be used from several threads at once; one request is
 * used by one thread at a time. The OOB callbacks are called only from the thread inside
 * dpo_context_create / dpo_team_create_post / dpo_team_create_test. The library never
 * calls back into the user from a thread of its own.
 *
 * Memory: buffers are the caller's and must stay valid until the collective completed
 * (persistent requests: until dpo_collective_finalize). Memory from dpo_mem_alloc() is
 * shared with the job and moves without a system call per transfer in the emulator.
 */
#ifndef DPA_OFFLOAD_H
#define DPA_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DPO_API_MAJOR 1
#define DPO_API_MINOR 1

/* cffi:begin */
typedef enum dpo_status {
	DPO_OK = 0,
	DPO_INPROGRESS = 1,
	/* -1..-13 are the completion statuses of the DPA, unchanged (offload_abi.h). */
	DPO_ERR_INVALID_PARAM = -1,   /* bad argument; nothing was posted */
	DPO_ERR_REMOTE_ACCESS = -2,   /* a peer's buffer was not writable/readable as needed */
	DPO_ERR_PEER_FAILED = -3,     /* a member died; dpo_collective_peer() names it */
	DPO_ERR_TIMED_OUT = -4,
	DPO_ERR_NO_SPACE = -5,        /* a destination smaller than what arrives */
	DPO_ERR_CANCELED = -6,
	DPO_ERR_NOT_SUPPORTED = -7,
	DPO_ERR_INTERNAL = -8,
	DPO_ERR_PEER_OP = -9,         /* a peer's part of the op failed */
	DPO_ERR_LINK_DOWN = -10,      /* every rail to a peer is down */
	DPO_ERR_COUNT_MISMATCH = -11, /* a peer sent another byte count than expected */
	DPO_ERR_PEER_CLOSED = -12,    /* a member destroyed its context before its part */
	DPO_ERR_MISMATCH = -13,       /* members posted different collectives, sizes or roots */
	/* host-side errors */
	DPO_ERR_NO_MEMORY = -64,
	DPO_ERR_NO_RESOURCE = -65,    /* team slots, registrations, ring space */
	DPO_ERR_BUSY = -66,           /* a request or team still has work in flight */
	DPO_ERR_CLOSED = -67,         /* the context was destroyed or shut down */
	DPO_ERR_BOOTSTRAP = -68,      /* the ranks do not agree (job, sizes, versions, config) */
	DPO_ERR_NO_DEVICE = -69,      /* the backend could not be opened */
	DPO_ERR_OOB = -70,            /* an out-of-band callback returned an error */
} dpo_status_t;

const char *dpo_status_string(dpo_status_t status);
const char *dpo_last_error(void);

/* ---- configuration: the tunables of offload_lib's config table -------------------- */
typedef struct dpo_config *dpo_config_h;

/* Defaults, then every OFFLOAD_<KEY> environment variable (OFFLOAD_CHUNK_SIZE=256K, ...).
 * A bad value fails with DPO_ERR_INVALID_PARAM naming the variable. */
dpo_status_t dpo_config_read(dpo_config_h *config);
/* Set one key from text, validated as the environment would be ("mtu", "8192"). */
dpo_status_t dpo_config_modify(dpo_config_h config, const char *key, const char *value);
/* The key's value as text into buf (NUL-terminated, truncated to len). */
dpo_status_t dpo_config_get(dpo_config_h config, const char *key, char *buf, size_t len);
void dpo_config_release(dpo_config_h config);

/* ---- out-of-band collectives (as ucc_oob_coll_t) ---------------------------------------- */
/* allgather: start gathering size bytes from every endpoint into recv_buf (endpoint i's at
 * i * size); store a handle in *request. req_test: DPO_OK once done, DPO_INPROGRESS before,
 * an error if it failed. req_free: release the handle. A blocking implementation may do
 * all the work in allgather and return DPO_OK from req_test. */
typedef struct dpo_oob_coll {
	dpo_status_t (*allgather)(void *src_buf, void *recv_buf, size_t size, void *coll_info,
				  void **request);
	dpo_status_t (*req_test)(void *request);
	dpo_status_t (*req_free)(void *request);
	void *coll_info;
	uint32_t n_oob_eps;           /* endpoints taking part */
	uint32_t oob_ep;              /* this caller's index among them */
} dpo_oob_coll_t;

/* ---- context -------------------------------------------------------------------------- */
enum dpo_context_params_field {
	DPO_CONTEXT_PARAM_FIELD_OOB = 1,  /* required when n_oob_eps > 1 */
	DPO_CONTEXT_PARAM_FIELD_JOB = 2,  /* the job name every rank passes; default: ep 0's new one */
};

typedef struct dpo_context_params {
	uint64_t mask;
	dpo_oob_coll_t oob;           /* context rank = oob_ep, size = n_oob_eps */
	const char *job;
} dpo_context_params_t;

typedef struct dpo_context *dpo_context_h;

/* Collective over the OOB: every rank gets the same outcome (a rank that cannot open its
 * device makes every rank fail with its reason). Blocks until all ranks joined or the
 * bootstrap_timeout passed. */
dpo_status_t dpo_context_create(const dpo_context_params_t *params, dpo_config_h config,
				dpo_context_h *context);
/* Waits for nothing: requests and teams must be finished first (DPO_ERR_BUSY otherwise,
 * and the context stays usable). */
dpo_status_t dpo_context_destroy(dpo_context_h context);

typedef struct dpo_context_attr {
	uint32_t rank;
	uint32_t size;
	uint32_t num_threads;         /* DPA progress threads of this rank */
	uint32_t resv;
	/* Ranks below 64 only (all of them in a context of at most 64 ranks); every rank:
	 * dpo_context_failed_ranks() and dpo_context_closed_ranks(). */
	uint64_t failed_ranks;        /* bit r: rank r was seen dead */
	uint64_t closed_ranks;        /* bit r: rank r destroyed its context */
	const char *backend;          /* "emulator" or "flexio" */
	const char *job;
} dpo_context_attr_t;
dpo_status_t dpo_context_get_attr(dpo_context_h context, dpo_context_attr_t *attr);
/* The ranks seen dead (failed) or that destroyed their context (closed), ascending: their
 * number in *count, the first max of them in ranks (a context's size is enough). */
dpo_status_t dpo_context_failed_ranks(dpo_context_h context, uint32_t *ranks, uint32_t max,
				      uint32_t *count);
dpo_status_t dpo_context_closed_ranks(dpo_context_h context, uint32_t *ranks, uint32_t max,
				      uint32_t *count);

/* The DPA's counters, per progress thread (= struct offload_thread_stats). */
typedef struct dpo_thread_stats {
	uint64_t ops_completed, bytes_written, writes, signals, reads, errors, progress_calls,
		 idle_calls, failovers, resent_bytes, mcast_chunks_sent, mcast_bytes_sent,
		 mcast_chunks_recv, mcast_dups, refetch_chunks, refetch_bytes;
} dpo_thread_stats_t;
/* Fills up to max entries; *num_threads gets the thread count. */
dpo_status_t dpo_context_stats(dpo_context_h context, dpo_thread_stats_t *per_thread,
			       uint32_t max, uint32_t *num_threads);

/* Job-shared memory (registered once): the fastest buffers for collectives. */
dpo_status_t dpo_mem_alloc(dpo_context_h context, size_t len, void **addr);
dpo_status_t dpo_mem_free(dpo_context_h context, void *addr, size_t len);

/* ---- teams ------------------------------------------------------------------------------ */
typedef enum dpo_ep_map_type {
	DPO_EP_MAP_FULL = 1,          /* team rank i = context rank i; every rank is a member */
	DPO_EP_MAP_ARRAY = 2,         /* team rank i = context rank map[i] */
} dpo_ep_map_type_t;

typedef struct dpo_ep_map {
	dpo_ep_map_type_t type;
	uint32_t ep_num;              /* members */
	const uint32_t *map;          /* DPO_EP_MAP_ARRAY: ep_num context ranks */
} dpo_ep_map_t;

enum dpo_team_params_field {
	DPO_TEAM_PARAM_FIELD_OOB = 1,     /* required: an OOB over the members only */
	DPO_TEAM_PARAM_FIELD_EP_MAP = 2,  /* checked against what the members are */
};

typedef struct dpo_team_params {
	uint64_t mask;
	dpo_oob_coll_t oob;           /* team rank = oob_ep, team size = n_oob_eps */
	dpo_ep_map_t ep_map;
} dpo_team_params_t;

typedef struct dpo_team *dpo_team_h;

/* Starts creating a team; only its members call it, with an OOB over themselves. */
dpo_status_t dpo_team_create_post(dpo_context_h context, const dpo_team_params_t *params,
				  dpo_team_h *team);
/* DPO_INPROGRESS until the members agreed; then DPO_OK or the same error on every member
 * (the team must still be destroyed). */
dpo_status_t dpo_team_create_test(dpo_team_h team);
/* Local: every collective of the team must have been finalized (DPO_ERR_BUSY otherwise).
 * The DPA's team slot is reused once every member destroyed the team. */
dpo_status_t dpo_team_destroy(dpo_team_h team);

typedef struct dpo_team_attr {
	uint32_t size;
	uint32_t rank;                /* this member's team rank */
	uint32_t id;                  /* the DPA team slot */
	uint32_t resv;
	const uint32_t *ctx_ranks;    /* team rank -> context rank */
} dpo_team_attr_t;
dpo_status_t dpo_team_get_attr(dpo_team_h team, dpo_team_attr_t *attr);

/* ---- datatypes (contiguous; counts are in elements) -------------------------------------- */
typedef enum dpo_datatype {
	DPO_DT_INT8 = 1, DPO_DT_INT16, DPO_DT_INT32, DPO_DT_INT64,
	DPO_DT_UINT8, DPO_DT_UINT16, DPO_DT_UINT32, DPO_DT_UINT64,
	DPO_DT_FLOAT16, DPO_DT_BFLOAT16, DPO_DT_FLOAT32, DPO_DT_FLOAT64,
	DPO_DT_COMPLEX64, DPO_DT_COMPLEX128,
	DPO_DT_BYTE = DPO_DT_UINT8,
} dpo_datatype_t;
/* Bytes of one element; 0 for an unknown type. */
size_t dpo_dt_size(dpo_datatype_t datatype);

/* ---- collectives ---------------------------------------------------------------------------- */
typedef enum dpo_coll_type {
	DPO_COLL_TYPE_BARRIER = 1,
	DPO_COLL_TYPE_ALLTOALL = 2,   /* src/dst.info: count = elements to each peer x team size */
	DPO_COLL_TYPE_ALLTOALLV = 4,  /* src/dst.info_v: counts and displacements per team rank */
	DPO_COLL_TYPE_BCAST = 8,      /* src.info: the buffer on every member, root's is sent */
	DPO_COLL_TYPE_ALLGATHER = 16, /* src.info: this rank's block; dst.info: size blocks */
	DPO_COLL_TYPE_ALLREDUCE = 32, /* src/dst.info: count elements each; op */
	DPO_COLL_TYPE_REDUCE_SCATTER = 64, /* block form: src.info count x size, dst.info count */
} dpo_coll_type_t;

/* Reductions (API 1.1): the DPA reduces FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32 and
 * INT64, in a fixed order (docs/reductions.md), so a result is bitwise the same on every
 * member and on every repetition. AVG is for the floating types only. */
typedef enum dpo_reduction_op {
	DPO_OP_SUM = 1,
	DPO_OP_PROD = 2,
	DPO_OP_MAX = 3,
	DPO_OP_MIN = 4,
	DPO_OP_AVG = 5,
} dpo_reduction_op_t;

typedef struct dpo_coll_buffer_info {
	void *buffer;
	uint64_t count;               /* elements */
	dpo_datatype_t datatype;
} dpo_coll_buffer_info_t;

typedef struct dpo_coll_buffer_info_v {
	void *buffer;
	const uint64_t *counts;       /* team size entries, elements */
	const uint64_t *displacements;/* team size entries, elements; NULL: packed in order */
	dpo_datatype_t datatype;
} dpo_coll_buffer_info_v_t;

/* IN_PLACE: all-to-all / all-to-all-v exchange dst in place (src is ignored; dst is copied
 * once by the host first); all-gather takes this rank's block from dst; allreduce reduces
 * dst into itself; reduce-scatter reads the whole input from dst (count x size elements)
 * and leaves this rank's reduced block at its own place in dst (offset rank x block), as
 * UCC does. Broadcast is always in place. PERSISTENT: the request may be posted again after each completion; buffers are
 * registered once, at init. */
#define DPO_COLL_ARGS_FLAG_IN_PLACE   (1u << 0)
#define DPO_COLL_ARGS_FLAG_PERSISTENT (1u << 1)

enum dpo_coll_args_field {
	DPO_COLL_ARGS_FIELD_FLAGS = 1,
	DPO_COLL_ARGS_FIELD_TIMEOUT = 2,
};

typedef struct dpo_coll_args {
	uint64_t mask;
	dpo_coll_type_t coll_type;
	union {
		dpo_coll_buffer_info_t info;
		dpo_coll_buffer_info_v_t info_v;
	} src;
	union {
		dpo_coll_buffer_info_t info;
		dpo_coll_buffer_info_v_t info_v;
	} dst;
	uint64_t flags;               /* DPO_COLL_ARGS_FLAG_*, with DPO_COLL_ARGS_FIELD_FLAGS */
	uint64_t root;                /* broadcast: team rank */
	double timeout;               /* seconds a post may wait for ring space (FIELD_TIMEOUT) */
	dpo_reduction_op_t op;        /* allreduce, reduce-scatter (read for those only) */
} dpo_coll_args_t;

typedef struct dpo_coll_req *dpo_coll_req_h;

/* Checks every argument (DPO_ERR_INVALID_PARAM with dpo_last_error() saying what to fix)
 * and posts nothing. The args struct and the counts/displacements arrays are copied. */
dpo_status_t dpo_collective_init(const dpo_coll_args_t *args, dpo_coll_req_h *request,
				 dpo_team_h team);
/* Hands the op to the DPA. A persistent request may be posted again once it completed;
 * DPO_ERR_BUSY while it has not. */
dpo_status_t dpo_collective_post(dpo_coll_req_h request);
dpo_status_t dpo_collective_init_and_post(const dpo_coll_args_t *args, dpo_coll_req_h *request,
					  dpo_team_h team);
/* DPO_INPROGRESS, DPO_OK, or the op's error (then dpo_collective_error() has the text). */
dpo_status_t dpo_collective_test(dpo_coll_req_h request);
/* As test, but waits up to timeout_ns (< 0: forever); DPO_INPROGRESS if it did not end. */
dpo_status_t dpo_collective_wait(dpo_coll_req_h request, int64_t timeout_ns);
/* The message of the request's failure ("" if none), and the peer it names (-1 if none). */
const char *dpo_collective_error(dpo_coll_req_h request);
int32_t dpo_collective_peer(dpo_coll_req_h request);
/* Releases the request. DPO_ERR_BUSY (and nothing happens) while it is posted and not
 * complete: a collective cannot be abandoned halfway without failing the team. */
dpo_status_t dpo_collective_finalize(dpo_coll_req_h request);
/* cffi:end */

#ifdef __cplusplus
}
#endif

#endif /* DPA_OFFLOAD_H */

/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the dpo_*.c files: the objects behind the handles of dpa_offload.h. */
#ifndef DPO_INTERNAL_H
#define DPO_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "dpa_offload.h"
#include "offload_abi.h"
#include "offload_host.h"

#define DPO_API __attribute__((visibility("default")))

/* The C face of offload_lib's config table (config.py): what a context needs. */
struct dpo_config {
	char backend[16];            /* emulator | flexio */
	char backend_lib[256];       /* flexio: the backend's shared library */
	uint32_t dpa_threads;        /* 0: auto */
	uint64_t chunk_size;
	uint32_t ring_entries;
	double post_timeout;
	double op_timeout;
	uint32_t rails;
	uint32_t mtu;
	uint32_t mcast_roots;
	uint32_t mcast_rq_depth;
	uint32_t mcast_staged;
	double link_rate;
	double mcast_loss;
	double mcast_reorder;
	uint64_t mcast_seed;
	double bootstrap_timeout;
	uint32_t spin_us;
	uint32_t idle_poll_us;
	uint64_t wire_min;
	uint32_t coop;                /* progress: cooperative (1) or threads (0) */
	uint64_t eager_max;
};

/* Job-wide team slot use (emulator: one host): users[s] = members that have not
 * destroyed the team on slot s yet. A slot is claimed by CAS 0 -> size. */
struct dpo_slot_table {
	uint32_t magic;
	uint32_t resv;
	uint32_t users[OFFLOAD_MAX_TEAMS];
};

/* A registered reduction scratch buffer (dpo_reduce.c). */
struct dpo_scratch {
	void *addr;
	uint64_t len;
	uint32_t key;
};
#define DPO_SCRATCH_KEEP 4          /* free scratch buffers a context keeps registered */

struct dpo_context {
	struct host_ctx *host;
	uint32_t rank, size, num_threads;
	char job[96];
	char backend[16];
	struct dpo_config cfg;
	struct dpo_slot_table *slots;    /* NULL: slots agreed from members' free masks */
	pthread_mutex_t lock;            /* local_used, counts below */
	uint32_t local_used;             /* team slots in use on this rank (bit per slot) */
	uint32_t teams;                  /* teams not destroyed */
	uint32_t next_claim;             /* where a slot search starts: spread reuse */
	struct dpo_scratch scratch_free[DPO_SCRATCH_KEEP];  /* under lock */
	uint32_t scratch_nfree;
};

enum dpo_team_state { DPO_TEAM_EXCHANGE, DPO_TEAM_READY, DPO_TEAM_FAILED };

struct dpo_team {
	struct dpo_context *ctx;
	dpo_oob_coll_t oob;
	enum dpo_team_state state;
	dpo_status_t failure;
	char failure_msg[256];
	uint32_t size, rank, slot;
	int claimed;                     /* team rank 0 claimed slot in the job-wide table */
	int created;                     /* TEAM_CREATE completed on this rank */
	uint32_t requests;               /* not finalized */
	void *oob_req;
	void *send_rec, *recv_recs;
	uint32_t has_map;
	uint32_t *map;                   /* ep_map given: the expected context ranks */
	uint32_t *ctx_ranks;             /* [size] */
};

/* dpo_status.c */
dpo_status_t dpo_fail(dpo_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
dpo_status_t dpo_from_errno(int rc, const char *what);
void dpo_clear_error(void);

/* dpo_config.c */
void dpo_config_defaults(struct dpo_config *cfg);

/* dpo_context.c */
int64_t dpo_now_ns(void);
dpo_status_t dpo_oob_run(const dpo_oob_coll_t *oob, void *mine, void *all, size_t len,
			 double timeout_s);

/* dpo_reduce.c: fills op (opcode, root word, buffers, aux = scratch taken from the pool);
 * an in-place buffer is registered once into *key (*owned: release it). */
dpo_status_t dpo_reduce_init(struct dpo_team *team, const dpo_coll_args_t *a, uint64_t flags,
			     struct host_op *op, struct dpo_scratch *scratch, uint32_t *key,
			     int *owned);
void dpo_scratch_put(struct dpo_context *ctx, struct dpo_scratch *s);
void dpo_scratch_release_all(struct dpo_context *ctx);

#endif /* DPO_INTERNAL_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host ring API: what offload_lib's cffi binding calls. host/ moves commands and
 * completions and registers memory; it never knows an algorithm.
 *
 * Everything between the cffi markers is read verbatim by offload_lib/_build.py, so it
 * stays plain declarations with fixed-width types. Functions return 0 or a negative errno.
 */
#ifndef OFFLOAD_HOST_H
#define OFFLOAD_HOST_H

#include <stdint.h>

#include "dpa_engine.h"

/* cffi:begin */
struct host_ctx;

/* The layout of struct host_ctx_params this library reads (as io_uring_params: one struct,
 * filled once by the caller and passed down by pointer to host setup and the backend,
 * which keeps it; nothing copies its fields one by one). Bumped when a field changes. */
#define HOST_CTX_PARAMS_VERSION 3

struct host_ctx_params {
	uint32_t struct_size;       /* sizeof(struct host_ctx_params) of the caller's headers */
	uint32_t version;           /* HOST_CTX_PARAMS_VERSION of the caller's headers */
	const char *job;            /* job name shared by all ranks */
	const char *backend;        /* "emulator", or "flexio": loaded from backend_lib */
	const char *backend_lib;    /* shared library of a run-time loaded backend */
	uint32_t rank;
	uint32_t size;
	uint32_t num_threads;
	uint32_t ring_entries;      /* command ring slots, power of two */
	uint32_t spin_us;           /* waits spin at most this long (and at most what a wake-up
				     * costs), then sleep */
	int64_t bootstrap_timeout_ns;
	/* Exchange of len bytes per rank among all ranks (all[r*len] gets rank r's): hardware
	 * backends connect their queue pairs with it; the emulator does not call it. */
	int (*allgather)(void *arg, const void *mine, uint32_t len, void *all);
	void *allgather_arg;
	uint32_t rails;             /* ports per rank (1..8) */
	uint32_t mtu;               /* multicast chunk bytes */
	uint32_t mcast_rq_depth;    /* multicast receive queue, chunks */
	uint32_t mcast_loss_ppm;    /* fault injection: chunks lost, per million */
	uint32_t mcast_reorder_ppm; /* fault injection: chunks reordered, per million */
	uint64_t mcast_seed;
	uint64_t rail_down_after[8];/* fault injection: rail r fails after this many bytes
				     * sent on it (UINT64_MAX: never) */
	uint32_t mcast_staged;      /* emulator: receive multicast into staging slots, as on UD */
	uint64_t job_key;           /* the job's secret, the same on every rank, not 0 */
	uint32_t coop;              /* cooperative progress: a host thread posting, testing or
				     * waiting for a small op runs the emulated firmware itself */
	uint32_t idle_poll_us;      /* emulator: a progress thread naps this long after bulk
				     * work before a doorbell must wake it (emu_progress.c) */
	uint64_t wire_min;          /* emulator: writes from this size into another rank's
				     * private memory take the wire (emu_wire.c); 0: never */
	/* The firmware's settings (dpa_engine.h): the caller sets chunk_size, op_timeout_ms,
	 * link_mbps, mcast_roots and eager_max; host setup fills in the rest and starts the
	 * firmware with it. */
	struct dpa_engine_params engine;
};

/* One command as the host builds it; translated into the 64-byte ABI slot at post. */
struct host_op {
	uint32_t opcode;
	uint32_t team;
	uint32_t flags;
	uint64_t src_addr;
	uint64_t dst_addr;
	uint64_t count;
	uint32_t src_key;
	uint32_t dst_key;
	uint64_t dst_len;
	uint64_t aux_addr;
	uint32_t aux_key;
	uint32_t root;
	uint64_t src_len;           /* bytes of src, for registering it */
	uint64_t aux_len;           /* bytes at aux_addr (command arguments), for registering them */
	uint32_t small;             /* the op moves little (at most 1 MiB per rank): with
				     * cooperative progress, testing it runs the firmware on the
				     * calling thread too, not only posting and waiting */
	/* The exporter of src/dst (0: none known): host_post keeps what it registers for a
	 * zero key in its cache under this cookie, for the next op on that memory, until
	 * host_mr_invalidate(cookie). The binding invalidates it before the exporter's
	 * memory can be freed; without a cookie a registration lasts one op. */
	uint64_t src_cookie;
	uint64_t dst_cookie;
};

struct host_completion {
	int32_t status;             /* enum offload_status */
	uint32_t detail;            /* the peer rank an error names */
	uint64_t result0;
	uint64_t result1;
};

/* -EPROTONOSUPPORT: params' struct_size or version is not this library's (the caller was
 * built from other headers); -ENODEV: unknown backend; -ENOENT / -ENOEXEC: its library did
 * not load / lacks the entry point dpaoffload_flexio_ops; -EPROTO: it was built from other
 * headers (its dpaoffload_flexio_abi() is not OFFLOAD_ABI_VERSION, or it reads another
 * host_ctx_params: dpaoffload_flexio_params_version()). */
int host_ctx_open(const struct host_ctx_params *params, struct host_ctx **out);
/* Safe from any thread while others are inside: calls from then on return -ESHUTDOWN,
 * threads asleep in host_wait, running the firmware in one (cooperative progress), or in a
 * post waiting for ring space leave with -ESHUTDOWN, and the device and rings are released once no thread is inside any call. The struct
 * stays valid (every call answers -ESHUTDOWN) until host_ctx_close. Twice is harmless. */
void host_ctx_shutdown(struct host_ctx *ctx);
/* host_ctx_shutdown, then free ctx: no thread may use the pointer afterwards. */
void host_ctx_close(struct host_ctx *ctx);
uint32_t host_num_threads(const struct host_ctx *ctx);

int host_team_create(struct host_ctx *ctx, uint32_t team_id, uint32_t nmembers,
		     const uint32_t *world_ranks, int64_t timeout_ns);

/* Every call below returns -ESHUTDOWN (host_failed_ranks: 0) once host_ctx_shutdown began.
 * Post: 0 and *tag, -EAGAIN if the ring stays full past timeout_ns (0 = don't block),
 * -EBUSY if too many requests completed without being waited for. A zero src_key/dst_key/
 * aux_key with a non-zero src_len/dst_len/aux_len asks host_post for a key to that buffer:
 * the covering ctx.empty() allocation's, a registration cached under the buffer's cookie,
 * or a new one (kept in the cache with a cookie, else released when the op completes):
 * one call per one-shot op. The firmware reaches aux memory only through its key. */
int host_post(struct host_ctx *ctx, const struct host_op *op, int64_t timeout_ns, uint32_t *tag);
/* 0 with *out filled once the op completed, -ETIMEDOUT otherwise (timeout_ns < 0: forever).
 * With cooperative progress the calling thread runs the firmware while it waits (it
 * spins, then sleeps on the rank's events), unless the device keeps the work to its own
 * threads (bulk copies where ranks outnumber cores); otherwise the first poll_ns are spent
 * spinning on the completion ring and the rest asleep: spinning saves the wake-up latency
 * of short ops, sleeping keeps the CPU free for long ones. */
int host_wait(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns, int64_t poll_ns,
	      struct host_completion *out);
/* 1 and *out if complete, 0 if not yet. */
int host_test(struct host_ctx *ctx, uint32_t tag, struct host_completion *out);
/* host_test without the firmware's turn: 1 and *out if the completion is in (a post's or
 * an earlier call's pass may have written it), 0 if not. Never runs a pass, never waits
 * beyond the request table's lock: a caller may hold its own locks (Python's GIL). */
int host_done(struct host_ctx *ctx, uint32_t tag, struct host_completion *out);
/* Forget a request nobody will wait for; its completion is dropped when it arrives. */
void host_abandon(struct host_ctx *ctx, uint32_t tag);
/* Ask the firmware to abort the op posted as tag (it then completes OFFLOAD_ERR_CANCELED
 * and its team fails every later op). 0 if the op was in flight, -ENOENT if it had
 * completed already, or a post/wait error. Wait on tag afterwards as usual. */
int host_cancel(struct host_ctx *ctx, uint32_t tag, int64_t timeout_ns);
/* World ranks known dead (the ring header's failed set); it includes every rank a
 * completion named as dead (OFFLOAD_ERR_PEER) or unreachable once reaped. The number of
 * them, the first max (ascending) in ranks; -ESHUTDOWN. */
int host_failed_list(struct host_ctx *ctx, uint32_t *ranks, uint32_t max);
/* World ranks that closed their context cleanly (the ring header's closed set), alike. */
int host_closed_list(struct host_ctx *ctx, uint32_t *ranks, uint32_t max);
/* The same sets' ranks below 64, one bit each (a job of at most 64 ranks: all of them). */
uint64_t host_failed_ranks(struct host_ctx *ctx);
uint64_t host_closed_ranks(struct host_ctx *ctx);

/* A key for [addr, addr+len): the covering ctx.empty() allocation's (owned = 0) or a new
 * registration the caller must release (owned = 1). */
int host_mr_acquire(struct host_ctx *ctx, const void *addr, uint64_t len, uint32_t access,
		    uint32_t *key, int *owned);
/* -EBUSY while an op that names the key has not completed. */
int host_mr_release(struct host_ctx *ctx, uint32_t key);
/* The exporter with this cookie died (its memory may be freed now): drop its cached
 * registrations, once the ops in flight that use them completed. */
void host_mr_invalidate(struct host_ctx *ctx, uint64_t cookie);
/* Registrations made so far (every host_mr_acquire and host_post one), op buffers the
 * cache already held, and the registrations it holds now. */
void host_mr_cache_stats(struct host_ctx *ctx, uint64_t *registrations, uint64_t *hits,
			 uint32_t *cached);
/* A key for GPU memory [addr, addr+len) exported as dma-buf fd (the caller keeps and closes
 * fd); release it with host_mr_release. -EOPNOTSUPP where the device cannot reach GPU
 * memory: stage it through host memory instead. */
int host_mr_acquire_dmabuf(struct host_ctx *ctx, uint64_t addr, uint64_t len, int fd,
			   uint32_t access, uint32_t *key);

int host_alloc_shared(struct host_ctx *ctx, uint64_t len, void **addr, uint32_t *key);
/* ctx may be NULL after close: the mapping is then just released. -EBUSY while an op
 * that uses the allocation has not completed. */
int host_free_shared(struct host_ctx *ctx, void *addr, uint64_t len);

/* Fault injection at run time (emulator): the multicast chunks this rank's NIC loses and
 * reorders, per million, from the next chunk on. -EOPNOTSUPP on hardware, -EINVAL out of
 * range. */
int host_set_mcast_faults(struct host_ctx *ctx, uint32_t loss_ppm, uint32_t reorder_ppm);

/* Copies per-thread firmware counters (16 uint64 per thread); returns the thread count. */
int host_stats(struct host_ctx *ctx, uint64_t *out, uint32_t max_threads);
/* Who ran this rank's firmware (zero where the firmware does not run on the host). */
struct host_drive_stats {
	uint64_t ops;             /* cooperative progress: ops completed by host threads' passes */
	uint64_t passes;          /* ... and the passes they ran */
	uint64_t doorbells;       /* work handed to the progress threads (posts, bulk hand-overs) */
	uint64_t doorbell_wakes;  /* ... that had to wake one (none was in its idle poll) */
	uint64_t waits;           /* cooperative progress: waits that ran the firmware */
	uint64_t sleeps;          /* ... the sleeps between their passes */
	uint64_t handoff_yields;  /* ... and the yields to a peer waiting for a core instead */
	uint64_t handoff_rearms;  /* ... passes that found work after such a yield: the next
				   * idle step may yield again */
	uint64_t post_yields;     /* small posts after which the host thread yielded its core
				   * to another rank of the job waiting for it (the hand-back) */
	uint64_t wake_handovers;  /* wake-ups of peers' sleeping drivers handed to a thread of
				   * the job on the sleeper's CPU (a local wake, no interrupt) */
	uint64_t wire_bytes;      /* emulator: bytes sent to peers through the wire's slots */
	uint64_t wire_direct_bytes; /* ... bytes of its writes by process_vm_writev instead:
				   * what did not fit, and pieces taken back from a stalled
				   * target */
	uint64_t wire_rescues;    /* ... those pieces taken back */
	uint64_t wire_skipped_bytes; /* ... bytes of writes the wire could have taken that
				   * went by process_vm_writev by its choice (the cheaper
				   * way lately, or a probe keeping that cost measured) */
	uint64_t balance_moves;   /* emulator: the host thread moved itself to a CPU with two
				   * fewer of the job's ranks (ranks outnumber the cores) */
};
void host_drive_stats(struct host_ctx *ctx, struct host_drive_stats *out);
/* cffi:end */

#endif /* OFFLOAD_HOST_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Entry points of the firmware, called by whatever runs it: the emulator's threads, or
 * the FlexIO event handler on a DPA. The state lives in device memory the loader sized
 * with dpa_engine_state_size(params); the firmware allocates nothing itself.
 */
#ifndef DPA_ENGINE_H
#define DPA_ENGINE_H

#include <stdint.h>

struct dpa_hal;

/* The firmware's settings. The host's caller fills the engine's own (chunk_size,
 * op_timeout_ms, link_mbps, mcast_roots, eager_max) once, inside struct host_ctx_params;
 * host setup adds what it decides (the ABI version, ranks, threads, ring sizes, passes)
 * and hands the struct down as it is. offload_lib's cffi build reads it from here. */
/* cffi:begin */
struct dpa_engine_params {
	uint32_t abi_version;   /* OFFLOAD_ABI_VERSION of the loader */
	uint32_t world_rank;
	uint32_t world_size;
	uint32_t num_threads;
	uint32_t sq_entries;    /* power of two */
	uint32_t cq_entries;    /* power of two */
	uint64_t chunk_size;    /* RDMA write piece, bytes */
	uint32_t chunks_per_pass; /* writes one thread posts per op before moving on */
	uint32_t op_timeout_ms; /* an op not done this long after intake aborts; 0: never */
	uint32_t link_mbps;     /* link rate (MB/s): multicast loss shows after size / rate */
	uint32_t mcast_roots;   /* all-gather: ranks multicasting at once */
	uint32_t eager_max;     /* all-to-all blocks up to this many bytes go eagerly (0: none;
				 * at most OFFLOAD_EAGER_BYTES) */
	uint32_t a2a_window;    /* pairwise all-to-all: blocks each thread has on the wire at
				 * once (0: all it can; 1: the textbook one step at a time) */
	/* ABI 13: members of all the teams this rank belongs to at once, summed (their
	 * tables are carved from an arena of that size; a TEAM_CREATE that does not fit
	 * completes OFFLOAD_ERR_NO_SPACE). 0: 16 x world size up to 256 ranks, else
	 * max(4 x world size, 4096). */
	uint32_t team_pool_ranks;
	uint32_t resv;
};
/* cffi:end */

/* Bytes of state for these params (only world_size, num_threads and team_pool_ranks size
 * it: a loader may ask with the rest zero); 0: those out of range. */
uint64_t dpa_engine_state_size(const struct dpa_engine_params *params);
/* Returns 0, or -EINVAL when params are out of range. */
int dpa_engine_init(void *state, const struct dpa_engine_params *params);
/* One bounded, non-blocking pass for the calling thread; returns how much it advanced. */
int dpa_progress(void *state, struct dpa_hal *hal);
/*
 * What the runtime may poll for: DPA_ENGINE_IDLE (no op in flight), DPA_ENGINE_SMALL (only
 * ops moving at most DPA_ENGINE_SMALL_BYTES per rank: their next event is microseconds
 * away) or DPA_ENGINE_BULK (an op that keeps copy engines busy for a long time).
 */
enum dpa_engine_load {
	DPA_ENGINE_IDLE = 0,
	DPA_ENGINE_SMALL = 1,
	DPA_ENGINE_BULK = 2,
};
#define DPA_ENGINE_SMALL_BYTES (1024u * 1024u)
enum dpa_engine_load dpa_engine_load(const void *state);
/*
 * How many more events (peers' writes that wake this rank) may arrive before a pass is of
 * use, at least 1. More than one only while every op in flight waits for input it does not
 * pass on (an eager all-to-all's blocks: it can complete only once all are in, and nothing
 * it would do meanwhile unblocks a peer), so the runtime may sleep through the others.
 * Doorbells, failures and timers wake it regardless.
 */
uint32_t dpa_engine_events_needed(const void *state);
/*
 * A timer the firmware waits on in `thread` (dpa_hal_thread_index; a multicast receiver's
 * loss timeout): run a pass of that thread at or after the returned dpa_hal_time_ns,
 * whatever the events say; 0 when there is none. Consumed by the call that finds it
 * expired (it returns 1 then): the pass that follows sets it again if it still waits.
 */
uint64_t dpa_engine_wake_at(void *state, uint32_t thread, uint64_t now);

#endif /* DPA_ENGINE_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The firmware fuzz harness: input format, the in-process test HAL (fuzz_hal.c) and the
 * target (fuzz_engine.c). The standalone driver (fuzz_main.c) builds and mutates inputs in
 * this format; under clang the same target links with -fsanitize=fuzzer instead.
 *
 * One input is one run of the real engine (dpa_engine_init + dpa_progress) as rank `me` of
 * a world of W ranks, fed by a command ring the harness fills as the host would:
 *
 *   struct fz_header                  16 bytes (missing bytes read as zero)
 *   struct offload_cmd  x ncmds       64 bytes each (the tag is replaced: see FZ_TAG)
 *   struct fz_poke      x npokes      32 bytes each: what peers and the host do meanwhile
 *   aux bytes                         the rest, copied to the start of the aux window
 *                                     (whose last 1040 bytes hold the world team's
 *                                     descriptor unless FZ_F_NO_WORLD)
 *
 * Every address an input names is a "device address" in the fake layout below; the HAL
 * translates it to local memory after the same checks the emulator makes.
 */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "dpa_engine.h"
#include "dpa_hal.h"
#include "offload_abi.h"

#define FZ_MAX_WORLD    8u
#define FZ_MAX_THREADS  4u
#define FZ_MAX_CMDS     128u
#define FZ_MAX_POKES    64u
#define FZ_HAL_CQ_MAX   256u
#define FZ_GUARD        64u           /* guard bytes before and after every buffer */
#define FZ_GUARD_BYTE   0xA5u
#define FZ_SRC_BYTE     0x3Cu         /* fill of src regions: must never change */

/* Registered regions: one of each kind per world rank. */
enum fz_kind {
	FZ_CTRL = 0,      /* the rank's struct offload_ctrl: peers' signals and descriptors */
	FZ_SRC = 1,       /* LOCAL_READ | REMOTE_READ: never written */
	FZ_DST = 2,       /* LOCAL_READ | LOCAL_WRITE | REMOTE_WRITE */
	FZ_KINDS = 3,
};

#define FZ_SRC_LEN      (64u * 1024u)
#define FZ_DST_LEN      (64u * 1024u)
#define FZ_AUX_LEN      (16u * 1024u)
#define FZ_AUX_BASE     0xA0000000ull /* device address of the aux window's first byte */
#define FZ_AUX_KEY      0x5a5a0a01u   /* the key the host registered the aux buffer under */

/* Device address and key of a rank's region (fixed, so that inputs can name them). */
static inline uint64_t fz_addr(uint32_t rank, enum fz_kind kind)
{
	return ((uint64_t)(rank + 1) << 36) | ((uint64_t)(kind + 1) << 32);
}

static inline uint32_t fz_key(uint32_t rank, enum fz_kind kind)
{
	return 0x4B000000u | (rank << 8) | (uint32_t)(kind + 1);
}

/* Tags are the harness's, not the input's: command i carries FZ_TAG(i). */
#define FZ_TAG_BASE     0x7A000000u
#define FZ_TAG(i)       (FZ_TAG_BASE + (uint32_t)(i))
#define FZ_TAG_SETUP    0x7AFFFFFFu   /* the world team's TEAM_CREATE (FZ_F_NO_WORLD unset) */

/* fz_header.flags */
#define FZ_F_NO_WORLD   (1u << 0)  /* don't create team 0 over the whole world first */
#define FZ_F_NO_REAP    (1u << 1)  /* the host never consumes completions */
#define FZ_F_WRAP       (1u << 2)  /* ring indices start just below 2^32 */
#define FZ_F_TIMEOUT    (1u << 3)  /* op_timeout_ms = 1 + timeout % 64; the HAL's clock moves
				    * 1 us a look and 10 ms a round in which nothing moved */

struct fz_header {
	uint8_t world;        /* W = 1 + world % FZ_MAX_WORLD */
	uint8_t me;           /* me = me % W */
	uint8_t threads;      /* 1 + threads % FZ_MAX_THREADS */
	uint8_t sq_log;       /* sq_entries = 1 << (3 + sq_log % 4): 8..64 */
	uint8_t cq_log;       /* cq_entries = 1 << (2 + cq_log % 5): 4..64 */
	uint8_t hal_cq_log;   /* HAL completion queue depth = 1 << (1 + x % 8): 2..256 */
	uint8_t chunk_log;    /* chunk_size = 1 << (6 + x % 11): 64..64K */
	uint8_t chunks;       /* chunks_per_pass = 1 + chunks % 4 */
	uint8_t flags;        /* FZ_F_* */
	uint8_t dead;         /* peers (bit per world rank) whose RDMA fails OFFLOAD_ERR_PEER */
	uint8_t ncmds;
	uint8_t npokes;
	uint16_t passes;      /* at most 256 + passes % 4096 progress rounds */
	uint8_t timeout;
	uint8_t misc;         /* bit 0: a host thread sleeps on the ring (cq_waiters = 1);
			       * bits 1-2: rails = 1 + (misc >> 1) % 4;
			       * bit 3: a team pool of world + 1 members (the world team and
			       * one of one rank fit: a larger TEAM_CREATE is NO_SPACE) */
};

/* What happens between progress rounds, at round at_pass (or earlier, once the engine
 * idles): peers writing into our control region, or the host touching what it owns. */
enum fz_poke_kind {
	FZ_POKE_READY = 0,    /* ready[team][slot][src] = {a, b, c, d}, then seq */
	FZ_POKE_COUNT = 1,    /* counts[team][slot][src] = {a}, then seq */
	FZ_POKE_DONE = 2,     /* done[team][slot][src] += a (a peer's signal) */
	FZ_POKE_CTRL = 3,     /* 8 bytes a at (c % sizeof ctrl) & ~7 in our control region */
	FZ_POKE_AUX = 4,      /* 8 bytes a at (c % FZ_AUX_LEN) & ~7 in the aux window */
	/* c % 8 == 0: the world ranks of a's bits join the ring's failed set (as the host's
	 * watch adds them); else 8 bytes a at 8 * (c % 8) of the ring's first line (host's,
	 * its rank sets' gens and offsets too) */
	FZ_POKE_HOST = 5,
	FZ_POKE_DEAD = 6,     /* world rank src % W (not us) dies: its RDMA fails from now */
	FZ_POKE_RAIL = 7,     /* rail c % rails to world rank src % W goes down (d & 1: to all) */
	/* A completion the firmware never asked for on thread c % threads: the last wr_id it
	 * posted with the item field (bits 8..31, dpa_wr_id() in engine_internal.h) set to
	 * world + a % (2^24 - world), an item no team of this world has, and status
	 * d % 2 ? LINK_DOWN : REMOTE_ACCESS. The firmware must drop it. */
	FZ_POKE_CQE = 8,
	FZ_POKE_KINDS = 9,
};

struct fz_poke {
	uint8_t kind;
	uint8_t team;         /* % OFFLOAD_MAX_TEAMS */
	uint8_t slot;         /* % OFFLOAD_OP_WINDOW */
	uint8_t src;          /* % the world size */
	uint16_t at_pass;
	uint16_t seq;
	uint32_t c;
	uint32_t d;
	uint64_t a;
	uint64_t b;
};

_Static_assert(sizeof(struct fz_header) == 16, "fuzz header");
_Static_assert(sizeof(struct fz_poke) == 32, "fuzz poke");

/* The input, decoded (fz_decode never fails: short inputs read as zeros). */
struct fz_input {
	struct fz_header h;
	uint32_t world, me, threads, sq_entries, cq_entries, hal_cq, ncmds, npokes, passes, rails;
	uint64_t chunk_size;
	uint32_t chunks_per_pass, op_timeout_ms;
	struct offload_cmd cmds[FZ_MAX_CMDS];
	struct fz_poke pokes[FZ_MAX_POKES];
	const uint8_t *aux;
	size_t aux_len;
};

void fz_decode(const uint8_t *data, size_t size, struct fz_input *in);

/* ---- the test HAL (fuzz_hal.c) ---- */

struct fz_buf {
	uint8_t *mem;         /* the usable bytes; FZ_GUARD guard bytes on each side */
	uint64_t len;
};

struct fz_region {
	uint32_t rank;
	uint32_t kind;
	uint32_t key;
	uint32_t access;
	uint64_t addr;
	struct fz_buf buf;
};

struct fz_hal_cqe_ring {
	uint32_t head, tail, depth;
	struct dpa_hal_cqe cqe[FZ_HAL_CQ_MAX];
};

struct dpa_hal {
	struct fz_world *w;
	uint32_t index;
	uint8_t rail[FZ_MAX_WORLD];    /* dpa_hal_set_rail(): where posts to each peer go */
	struct fz_hal_cqe_ring cq;
};

struct fz_world {
	uint32_t size, me, nthreads;
	uint32_t dead;                 /* bit per world rank */
	uint32_t num_rails;
	uint32_t rail_down[FZ_MAX_WORLD]; /* bit per rail: posts on it complete LINK_DOWN */
	struct fz_buf ring, stats, aux;
	uint64_t ring_len;
	struct fz_region regions[FZ_MAX_WORLD][FZ_KINDS];
	struct dpa_hal hals[FZ_MAX_THREADS];
	uint64_t clock_ns;
	uint64_t notifies, host_notifies;
	uint64_t activity;             /* posts completed and completions polled */
	uint64_t last_wr_id;           /* the firmware's latest post (FZ_POKE_CQE forges from it) */
	/* The commands posted so far: a data write into our dst must land inside one's
	 * [dst_addr, dst_addr + dst_len). NULL: not checked (pokes can forge readies). */
	const struct offload_cmd *dst_cmds;
	uint32_t ndst_cmds;
	uint64_t dst_writes;
};

/* Allocate every buffer once (FZ_MAX_WORLD ranks). */
struct fz_world *fz_world_new(void);
/* Prepare for one input: sizes, fresh control regions and ring, guards refilled. */
void fz_world_reset(struct fz_world *w, const struct fz_input *in);
/* Guard bytes, src contents: abort() with a message on any damage. */
void fz_world_check(const struct fz_world *w, const char *when);
void *fz_region_ptr(struct fz_world *w, uint32_t rank, enum fz_kind kind);
/* Queue a completion on one thread's HAL CQ, as a post's would be. */
void fz_push_cqe(struct dpa_hal *hal, uint32_t peer, uint64_t wr_id, int32_t status,
		 uint64_t bytes);

/* An invariant failed: print why, then abort() (the driver prints the input). */
__attribute__((noreturn, format(printf, 1, 2))) void fz_fail(const char *fmt, ...);

/* ---- the target (fuzz_engine.c) ---- */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Counters over all inputs run so far, for the driver's summary. */
struct fz_totals {
	uint64_t inputs, commands, completions, ok_collectives, passes, idle_stops, live_checked;
	uint64_t status_count[16];     /* by -status */
};
extern struct fz_totals fz_totals;
extern int fz_verbose;   /* print every completion */

/* ---- the driver's inputs (fuzz_main.c, fuzz_seeds.c) ---- */
#define FZ_MAX_INPUT    (64u * 1024u)

struct fz_bytes {
	uint8_t data[FZ_MAX_INPUT];
	size_t len;
};

/* Where the seeds put their aux structures (device address FZ_AUX_BASE + offset); the
 * mutator aims at fields near them. */
#define FZ_SEED_AUX_DESC   0u
#define FZ_SEED_AUX_ARGS   2048u
#define FZ_SEED_AUX_ARGS2  4096u
#define FZ_SEED_AUX_ROWS   6144u
#define FZ_SEED_AUX_DESC2  8192u

/* Valid command sequences, built field by field (fuzz_seeds.c): fills out[] and names[]
 * (what each exercises) up to max; returns how many. */
uint32_t fz_build_seeds(struct fz_bytes *out, const char **names, uint32_t max);

/* fuzz_mutate.c: the driver's random numbers (seeded once: the seed fixes every input), a
 * mutation of in (other: a second input to splice from) and a random input. */
void fz_rng_seed(uint64_t seed);
uint32_t fz_below(uint32_t n);
void fz_mutate(struct fz_bytes *in, const struct fz_bytes *other);
void fz_random_input(struct fz_bytes *in);

#endif /* FUZZ_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The emulated BlueField of one rank process. Lock rules:
 *  - mr_lock guards this rank's own MR table; peers read it lock-free (seqlock style).
 *  - map_lock guards the cache of peers' shared segments mapped into this process.
 *  - everything else in the job segment is atomics (multicast rings: see emu_mcast.c).
 *  - a multicast group's receive side (struct emu_mcast_rx): its own lock (post takes it,
 *    poll only tries). */
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "dpa_hal.h"
#include "host_device.h"
#include "offload_abi.h"
#include "emu_wire.h"

#define EMU_MAGIC     0x45415044u   /* "DPAE" */
#define EMU_MAX_MRS   1024u         /* per rank; key low bits index the table */
#define EMU_KEY_BITS  10u
#define EMU_MAX_MAPS  256u
#define EMU_CQ_DEPTH  8192u
#define EMU_ADVISED   64u           /* ranges already advised for huge pages */
/* UD multicast: each group's ring holds about this many payload bytes (slots of one MTU),
 * with between EMU_MCAST_MIN_SLOTS and EMU_MCAST_MAX_SLOTS slots (powers of two, as the
 * MTU is). 16 groups of 4 MiB stay within a container's /dev/shm; tmpfs pages are only
 * allocated once a group's ring reaches them. The ring (the senders' credit window) is
 * no deeper than the default receive queue (512): a reader that is merely descheduled
 * holds the senders back instead of overrunning; only a smaller queue overruns. */
#define EMU_MCAST_RING_BYTES (4u << 20)
#define EMU_MCAST_MIN_SLOTS  64u
#define EMU_MCAST_MAX_SLOTS  512u
#define EMU_MCAST_EVENT_EVERY 16u   /* receive event moderation: chunks per wake-up */
#define EMU_MCAST_WRITING    UINT64_MAX  /* slot generation while a sender fills it */
#define EMU_MCAST_STAGE_MAX  512u   /* staged receive: slots per group, at most */

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
	uint32_t dead_gen;
	/* Gens of the job's rank sets (bitmaps after the rank table, emu_job.c), bumped after
	 * a bit is set (offload_rankset_add):
	 * unreachable: ranks with every port down, so peers fail them as if dead;
	 * closed: ranks that closed their context cleanly; each peer's NIC passes them on to
	 * its firmware (emu_sync_peers), with the deaths the job knows of;
	 * dead: ranks that died, as soon as any rank's NIC saw it (emu_publish_death). */
	uint32_t unreachable_gen;
	uint32_t closed_gen;
	uint32_t mtu;         /* multicast slot size: every rank must agree (claimed at join) */
	uint32_t resv1;
	uint64_t balance_ns;  /* no rank moves itself to another CPU before this (emu_spin.c) */
	/* The job's secret (OFFLOAD_JOB_KEY from its launcher), claimed by the first rank:
	 * a rank of another job given the same name finds another key and stays out. */
	uint64_t key;
	uint32_t resv[2];
	/* Own line: threads of the job asleep in a wait (progress threads, host threads), so
	 * that a waiter knows whether spinning would keep another one off its core. A sleeper
	 * adds itself; whoever wakes it takes it off (FUTEX_WAKE says how many it woke), so a
	 * thread woken but not yet running already counts as awake. */
	uint32_t asleep;
	uint32_t handovers;   /* wake-ups handed over and not taken yet (emu_spin.c) */
	uint32_t resv_asleep[14];
	/* Own line: the futex every waiting thread of the job sleeps on, bumped before each
	 * wake-up, so that one FUTEX_WAKE wakes all the ranks a pass wrote to (bitset: bit
	 * 2r % 32 for rank r's progress threads, 2r + 1 for its driving host thread). */
	uint32_t bell;
	uint32_t resv_bell[15];
};

struct emu_rank {
	/* Line 1: read by peers on each write (rails_down, state) and by spinners' walks
	 * (host_cpu, waking_ns), written seldom. On line 2, which every write bumps (event),
	 * each walk missed once per rank (10% of emu_drive's own samples at n=4). */
	int32_t pid;
	uint32_t state;
	uint64_t ctrl_addr;   /* the owner's address of its struct offload_ctrl */
	uint32_t ctrl_key;
	uint32_t rails_down;  /* this rank's failed ports (bit per rail), set by the rank */
	uint64_t waking_ns;   /* a sleeper of this rank was woken then and has not run yet */
	uint64_t dpa_sleep_until;  /* its one progress thread's sleep ends (emu_host_leased) */
	uint32_t sleep_cpu;   /* where its host thread last slept in a drive, and whether a */
	uint32_t handed;      /* waker handed its wake-up to a driver there (emu_spin.c) */
	uint32_t wire_in;     /* bumped by senders publishing on a wire to us (emu_wire.c) */
	uint32_t threads;     /* its DPA threads (emu_wire.c: may a sender write a held piece?) */
	/* The CPU its host thread last ran on in the library, EMU_CPU_ASLEEP while it sleeps
	 * in a wait: a driver may spin where no other awake one last ran (emu_spin.c). */
	uint32_t host_cpu;
	int32_t sid;          /* its session: the balance moves only within one (emu_spin.c) */
	/* Line 2, bumped by doorbells and remote signals, slept on by progress threads
	 * (futex bitset EMU_WAKE_DPA) and a host thread driving the engine (EMU_WAKE_HOST). */
	uint32_t event;
	uint32_t load;        /* enum dpa_engine_load, published after each pass */
	/* Progress threads asleep on event, a bit per DPA thread: a waker takes them all at
	 * once, and one that wakes knows whether it was taken (its bit gone), as a count
	 * could not say. */
	uint64_t sleepers;
	uint32_t driving;     /* a host thread runs this rank's engine (cooperative progress) */
	uint32_t armed;       /* that host thread sleeps: the first waker clears it and wakes it */
	uint32_t wake_event;  /* ... once event reaches this (peers' writes; kicks ignore it) */
	uint32_t idle_event;  /* its driver idles since event idle_event - 1; 0: not (emu_spin.c) */
	uint64_t wake_ns;     /* when the last futex wake of this rank was issued */
	/* Progress threads of `sleepers` only napping (idle poll after bulk work): a doorbell
	 * need not wake them (io_uring SQPOLL's NEED_WAKEUP, inverted). Set before sleepers. */
	uint64_t napping;
	/* The host's lease (emu_spin.c): until then a peer's write need not wake the rank's
	 * one progress thread. Written at every drive's end: on the line wakers write. */
	uint64_t host_lease_ns;
	uint64_t resv2;
};

struct emu_mr {
	uint32_t key;         /* 0: free. Written last on registration, first on deregistration */
	uint32_t access;
	uint64_t addr;        /* in the owner's address space */
	uint64_t len;
	uint32_t kind;        /* enum emu_mr_kind */
	uint32_t serial;      /* EMU_MR_SHARED: segment serial */
	uint64_t shm_offset;  /* EMU_MR_JOB: offset in the job segment */
	uint64_t nonce;       /* EMU_MR_SHARED: the random part of the segment's name */
	uint64_t resv[2];
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

/* A multicast group in the job segment (one per team id). Slot indices are free-running
 * 64-bit counters, masked on access. `head` is the next index to claim (senders CAS it);
 * each member publishes `cursor`: it has consumed [0, cursor), so a sender may reuse the
 * slot of index i only once every counted member's cursor passed i - slots (credits). */
struct emu_mcast_member {
	uint64_t cursor;      /* written by its rank (release), read by senders (acquire) */
	uint64_t resv[7];
};

/* A group in the job segment: this header, then three rank bitmaps of
 * offload_rank_words(n) words each (emu_mc_joined/_blocked/_blocked_slot), then members[n]
 * (emu_mc_member); its stride is emu_mcast_group_bytes(n).
 * joined: ranks counted for credits and woken by sends;
 * blocked: ranks whose send found no credit: the next poll wakes them;
 * blocked_slot: ranks whose send found its slot still being filled: the next send (that
 * sender publishing) wakes them. */
struct emu_mcast_group {
	uint64_t head;
	uint64_t resv0[7];
};

static inline uint64_t emu_mcast_group_bytes(uint32_t n)
{
	return 64u + ((24ull * offload_rank_words(n) + 63u) & ~63ull) +
	       (uint64_t)n * sizeof(struct emu_mcast_member);
}

/* Seqlock: gen is index + 1 once published, EMU_MCAST_WRITING while being rewritten. */
struct emu_mcast_slot {
	uint64_t gen;
	uint32_t sender;
	uint32_t imm;
	uint32_t len;
	uint32_t src_key;     /* nonzero: the payload is read from the sender's (mappable) source */
	uint64_t src_addr;    /* with src_key: the chunk in the sender's address space */
	uint32_t resv[8];
};

_Static_assert(sizeof(struct emu_job_hdr) == 3 * 64, "job header: three lines");
_Static_assert(offsetof(struct emu_job_hdr, asleep) == 64, "asleep on its own line");
_Static_assert(offsetof(struct emu_job_hdr, bell) == 128, "the bell on its own line");
_Static_assert(offsetof(struct emu_rank, event) == 64, "a rank's event word on its own line");
_Static_assert(offsetof(struct emu_rank, host_cpu) < 64, "where ranks run: off the event line");
_Static_assert(sizeof(struct emu_rank) == 128, "rank entry: two lines");
_Static_assert(sizeof(struct emu_mcast_member) == 64, "a cursor per cache line");
_Static_assert(sizeof(struct emu_mcast_group) == 64, "group header: a line");
_Static_assert(sizeof(struct emu_mcast_slot) == 64, "a slot header per cache line");
_Static_assert(EMU_MCAST_MAX_SLOTS % 64 == 0, "done bitmap words");

/* This rank's receive side of one group (process memory: only our threads use it). */
struct emu_mcast_rx {
	uint32_t lock;        /* post vs poll (off_trylock); poll never waits for it */
	uint32_t joined;
	uint32_t seq8;
	uint32_t nregions;
	uint32_t posted;      /* nregions > 0, read by our senders without the lock */
	uint32_t resv;
	uint64_t next;        /* first slot index this NIC has not consumed */
	uint64_t hold;        /* reorder injection: held slot index + 1, 0 if none */
	uint64_t limit;       /* send side: claims below this need no credit rescan */
	/* Slots of [next, next + slots) consumed past one still being written (bit i % slots):
	 * a sender stalled mid-copy must not hold back the chunks of the others. */
	uint64_t done[EMU_MCAST_MAX_SLOTS / 64];
	struct dpa_hal_mcast_region *regions;  /* [world size] (a team's members at most) */
	/* Staged receive (attr.mcast_staged): the slots (MTU each, allocated on first post)
	 * and which ones hold a chunk the firmware has not copied out or dropped yet. */
	uint8_t *stage;
	uint32_t stage_len[EMU_MCAST_STAGE_MAX];  /* bytes of the chunk each busy slot holds */
	uint64_t stage_busy[EMU_MCAST_STAGE_MAX / 64];
	uint32_t stage_next;  /* where the search for a free slot starts */
};

#define EMU_WAKE_LIST 8u

struct dpa_hal {
	struct emu_device *dev;
	uint32_t index;
	uint32_t busy;        /* lock: a pass runs on this thread's queues (its progress thread's,
			       * or a host thread's: see emu_progress.c) */
	uint32_t wake_bits;   /* wake-ups this pass owes (futex bitset on the job's bell) */
	uint64_t bulk_ns;     /* its progress thread's last pass that worked on a bulk op ... */
	uint64_t work_ns;     /* ... and the last that did any work (emu_progress.c: idle poll) */
	/* ... and to which ranks (the first EMU_WAKE_LIST: they only time their wake-up) */
	uint32_t wake_ranks[EMU_WAKE_LIST];
	uint32_t nwake;
	/* Events this pass owes peers it wrote to, announced at its end (emu_wake_rank). */
	uint32_t due_ranks[EMU_WAKE_LIST];
	uint32_t due_events[EMU_WAKE_LIST];
	uint32_t ndue;
	uint8_t *rail;        /* [world size] per peer: the rail this thread posts on */
	int pinned;           /* its progress thread runs on one CPU for bulk work ... */
	cpu_set_t cpus;       /* ... and goes back to these after it (emu_progress.c) */
	uint32_t cq_head, cq_tail;  /* consumer and producer are both this thread */
	uint64_t now_ns;      /* the pass's clock, read at most once (emu_pass_now); 0: not yet */
	struct dpa_hal_cqe cq[EMU_CQ_DEPTH];
	/* Thread 0's writes on the wires (emu_wire.c), oldest first, and its side of each
	 * wire ([world size]; NULL on the other threads, whose writes never take one). */
	struct emu_wire_tx *wire_tx;
	uint32_t nout;
	struct emu_wire_send outbox[EMU_WIRE_OUTBOX];
	struct emu_wire_costs wire_costs;  /* thread 0's: which way its writes go */
};

struct emu_device {
	struct host_ctx_params attr;  /* as opened (host_device.h); job: ours */
	char job[96];
	int job_fd;                   /* the job segment, flock'ed shared while we live */
	uint8_t *job_map;
	uint64_t job_len;
	struct emu_job_hdr *hdr;
	struct emu_rank *ranks;
	struct emu_mr *mrs;           /* [nranks][EMU_MAX_MRS] */
	uint8_t *ctrls;               /* [nranks] control regions, ctrl_bytes each */
	uint64_t ctrl_bytes;          /* offload_ctrl_bytes(nranks) */
	/* The job's rank sets (gens in hdr): ranks unreachable, closed, dead */
	uint64_t *unreachable;
	uint64_t *closed;
	uint64_t *dead;
	uint8_t *mc_groups;           /* [OFFLOAD_MAX_TEAMS] groups, mc_group_bytes each */
	uint64_t mc_group_bytes;
	struct emu_mcast_slot *mc_slots;    /* [OFFLOAD_MAX_TEAMS][mc_nslots] */
	uint8_t *mc_payload;                /* [OFFLOAD_MAX_TEAMS][mc_nslots][mtu] */
	uint32_t mc_nslots;
	/* Wires (emu_wire.c): [sender][target] headers and payload slots, wire_slots each (0:
	 * none, every remote write by process_vm_writev); our placing side: the lock one of
	 * our threads holds while placing, each sender's next piece, and wire_in as seen. */
	struct emu_wire *wires;
	uint8_t *wire_data;
	uint32_t wire_slots;
	uint32_t wire_lock;
	uint64_t *wire_head;
	uint32_t wire_in_seen;
	pthread_mutex_t mr_lock;
	uint64_t rng;
	uint32_t next_serial;
	pthread_mutex_t map_lock;
	struct emu_map maps[EMU_MAX_MAPS];
	uint32_t map_hand;            /* next map to look at for eviction (map_lock) */
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
	/* cooperative progress (emu_drive.c) */
	uint32_t drive_lock;          /* one host thread drives at a time */
	uint32_t closing;             /* host threads leave (emu_wake_waiters): no drive runs */
	uint32_t ncores;              /* CPUs this process may run on ... */
	cpu_set_t cpus;               /* ... which, at start */
	uint64_t wake_cost_ns;        /* measured futex wake-up latency (moving average) */
	uint64_t host_ops, host_passes; /* ops completed by passes host threads ran; the passes */
	uint64_t host_waits;          /* drives until a completion (host_wait's) */
	uint64_t host_sleeps;         /* ... sleeps between their rounds */
	uint64_t handoff_yields;      /* ... and yields instead (host_idle's hand-off) */
	uint64_t wake_handovers;      /* our wake-ups of peers taken by a thread on their CPU */
	uint64_t handoff_rearms;      /* ... passes with news that allowed one more yield */
	uint64_t post_yields;         /* small posts that handed the core back (emu_spin.c) */
	uint64_t beside_idle_off_ns;  /* no spin beside idle ranks until then (emu_cpu_alone) */
	struct emu_balance {          /* our host thread's moves (emu_spin.c: emu_balance) */
		uint64_t moves, looked_ns, crowded_ns, seen_ns, hold_ns, moved_ns;
		uint32_t moved_from, off;
	} balance;
	uint64_t wire_bytes;          /* thread 0's writes by the wire: placed by the target, */
	uint64_t wire_direct_bytes;   /* ... the rest (did not fit, or rescued), */
	uint64_t wire_rescues;        /* ... and the pieces rescued (emu_wire.c) */
	uint64_t wire_skipped_bytes;  /* writes the wire could take sent directly by choice */
	uint64_t doorbells;           /* emu_doorbell_rank() calls on our rank ... */
	uint64_t doorbell_wakes;      /* ... that woke a sleeping progress thread */
	uint32_t rail_faults;         /* a rail of this rank is set to fail */
	uint32_t unreachable_gen_seen;/* the job's unreachable set merged into the ring's failed */
	uint32_t closed_gen_seen;     /* ... its closed set, into the ring's closed */
	uint32_t dead_gen_seen;       /* ... its dead set, into the ring's failed */
	uint64_t *closed_seen;        /* [rank words] closes already passed on */
	uint64_t rail_sent[HOST_MAX_RAILS];
	/* peer watch (emu_watch.c) */
	pthread_t watch;
	int watch_stop_fd;
	uint32_t watching;
	/* UD multicast (emu_mcast.c) */
	struct emu_mcast_rx mc_rx[OFFLOAD_MAX_TEAMS];
};

/* Rank r's control region in the job segment. */
static inline uint8_t *emu_ctrl_of(const struct emu_device *dev, uint32_t rank)
{
	return dev->ctrls + (uint64_t)rank * dev->ctrl_bytes;
}

/* The ring header's rank sets (offload_abi.h), or NULL before the firmware's windows. */
static inline uint64_t *emu_ring_set(const struct emu_device *dev, int closed)
{
	struct offload_ring_hdr *ring = dev->win.ring;

	if (!ring)
		return NULL;
	return (uint64_t *)((uint8_t *)ring + (closed ? ring->closed_off : ring->failed_off));
}

static inline uint64_t *emu_ring_failed(const struct emu_device *dev)
{
	return emu_ring_set(dev, 0);
}

/* Multicast group g's header, its rank bitmaps and its members (emu_mcast_group). */
static inline struct emu_mcast_group *emu_mc_group(const struct emu_device *dev, uint32_t g)
{
	return (struct emu_mcast_group *)(dev->mc_groups + (uint64_t)g * dev->mc_group_bytes);
}

static inline uint64_t *emu_mc_bits(const struct emu_device *dev, uint32_t g, uint32_t which)
{
	return (uint64_t *)(emu_mc_group(dev, g) + 1) +
	       (uint64_t)which * offload_rank_words(dev->attr.size);
}

#define EMU_MC_JOINED       0u
#define EMU_MC_BLOCKED      1u
#define EMU_MC_BLOCKED_SLOT 2u

static inline struct emu_mcast_member *emu_mc_member(const struct emu_device *dev, uint32_t g,
						     uint32_t rank)
{
	uint64_t words = offload_rank_words(dev->attr.size);

	return (struct emu_mcast_member *)((uint8_t *)(emu_mc_group(dev, g) + 1) +
					   ((24ull * words + 63u) & ~63ull)) + rank;
}

static inline struct emu_device *to_emu(struct host_device *dev)
{
	return (struct emu_device *)dev;
}

/* emu_job.c */
int emu_job_open(struct emu_device *dev);
void emu_job_close(struct emu_device *dev);
/* Close the job segment's descriptor (and with it our flock), last. */
void emu_job_release(struct emu_device *dev);
int emu_job_barrier(struct emu_device *dev, int64_t timeout_ns);
int emu_mr_reg(struct emu_device *dev, uint64_t addr, uint64_t len, uint32_t access,
	       uint32_t kind, uint32_t serial, uint64_t shm_offset, uint64_t nonce, uint32_t *key);
/* A random 64-bit value (rkeys, segment names): unguessable, not cryptographic. */
uint64_t emu_random64(struct emu_device *dev);
int emu_mr_dereg(struct emu_device *dev, uint32_t key);
/* Resolve [addr, addr+len) of rank's key for `access`: *ptr set if this process can copy
 * directly, else *pid for process_vm_*; *held is the peer mapping in use, to release after
 * the copy. Returns OFFLOAD_OK or an error status. */
int32_t emu_mr_resolve(struct emu_device *dev, uint32_t rank, uint32_t key, uint64_t addr,
		       uint64_t len, uint32_t access, uint8_t **ptr, int32_t *pid,
		       struct emu_map **held);
/* Ends the copy that emu_mr_resolve() allowed into a mapped peer segment (held may be NULL). */
void emu_map_release(struct emu_map *held);
/* A ctx.empty() segment's name: the job's, the owner's rank and serial, and a random
 * part published only in the (private) job segment, so nobody can plant it beforehand. */
void emu_shared_name(const struct emu_device *dev, uint32_t rank, uint32_t serial,
		     uint64_t nonce, char *out, uint64_t outlen);
/* Open a peer's (or our) segment by name, refusing anything but this user's private file
 * of at least len bytes; a descriptor, or -errno. */
int emu_open_private(const char *name, uint64_t len);
void emu_unmap_peers(struct emu_device *dev);

/* Completions of this thread's posts; the thread is the CQ's only producer and consumer. */
static inline int emu_cq_full(const struct dpa_hal *hal)
{
	return hal->cq_tail - hal->cq_head >= EMU_CQ_DEPTH;
}

/* Queue a completion on hal's CQ (emu_hal.c). */
int emu_push_cqe(struct dpa_hal *hal, uint64_t wr_id, int32_t status, uint64_t bytes,
		 uint32_t rail);

/* emu_mcast.c */
uint32_t emu_mcast_slots(uint32_t mtu);
/* A rank's process taking over its rank: the dead process's memberships must not count. */
void emu_mcast_forget(struct emu_device *dev);
/* Group `group`'s ring slot of free-running index i, and its payload. */
static inline struct emu_mcast_slot *emu_mcast_slot_of(const struct emu_device *dev,
						       uint32_t group, uint64_t i)
{
	return &dev->mc_slots[(uint64_t)group * dev->mc_nslots + (i & (dev->mc_nslots - 1))];
}

static inline uint8_t *emu_mcast_payload_of(const struct emu_device *dev, uint32_t group,
					    uint64_t i)
{
	return dev->mc_payload +
	       ((uint64_t)group * dev->mc_nslots + (i & (dev->mc_nslots - 1))) * dev->attr.mtu;
}

/* emu_mcast_place.c: a member's NIC delivering accepted chunks (placed, or staged).
 * By-reference chunks that land back to back from back-to-back source bytes (an owner's
 * train, as a poll usually finds it) are copied as one run: one resolve of the source and
 * one copy instead of one per chunk, then each slot's seqlock is checked. Their
 * completions are the last `count` entries of the poll's output until the run is flushed. */
#define EMU_MCAST_RUN_MAX 64u

struct emu_mcast_run {
	uint8_t *dst;
	uint64_t src_addr;
	uint64_t len;
	uint32_t sender;
	uint32_t key;
	uint32_t count;
	uint64_t index[EMU_MCAST_RUN_MAX];  /* the slots, in output order */
};

/* Copy the run and keep the completions of the slots not rewritten meanwhile; returns the
 * output's new length (the run's entries are its tail). */
int emu_mcast_flush_run(struct emu_device *dev, uint32_t group, struct emu_mcast_run *run,
			struct dpa_hal_mcast_cqe *out, int n);
/* Place slot i's chunk: out[*n] and ++*n, 1; or 0 if it was dropped. */
int emu_mcast_deliver(struct emu_device *dev, uint32_t group, struct emu_mcast_rx *rx,
		      uint64_t i, struct emu_mcast_run *run, struct dpa_hal_mcast_cqe *out, int *n);
/* Staging slots per group (staged receive), and the lock a poll of the group holds. */
uint32_t emu_mcast_stage_slots(const struct emu_device *dev);
void emu_mcast_lock_rx(struct emu_mcast_rx *rx);

/* emu_copy.c: a copy into memory mapped here, as the NIC's DMA would do it */
void emu_dma_copy(void *dst, const void *src, uint64_t len);
/* emu_hal.c: the same into peer's memory mapped here, as the copier's caches favour */
void emu_dma_to(const struct emu_device *dev, uint32_t peer, void *dst, const void *src,
		uint64_t len);
/* emu_job.c: is rank's key a registration of its ordinary (private) memory? */
int emu_mr_is_private(const struct emu_device *dev, uint32_t rank, uint32_t key);

/* emu_progress.c: who runs the firmware (progress threads, or a waiting host thread);
 * emu_bell.c: waking it; emu_drive.c: a host thread running it */
/* A peer's write reached rank: wake whoever runs its firmware (unless idle, or its
 * driver sleeps through more); with a pass's hal, at the pass's end. */
void emu_wake_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass);
void emu_wake_rank_now(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass);
/* Ring now for what the pass wrote so far (before a long copy: no peer waits it out). */
void emu_flush_wakes(struct dpa_hal *pass);
#define EMU_FLUSH_BEFORE (64u * 1024u)  /* copies at least this long flush first */
/* The same, unconditionally: doorbells, sibling notifications, failures, stop. */
void emu_kick_rank(struct emu_device *dev, uint32_t rank);
/* A kick at the end of the pass (the wire's: a rank's firmware cannot count them). */
void emu_nudge_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass);
/* The host's doorbell: a kick, but a progress thread in its idle poll sees it in a nap. */
void emu_doorbell_rank(struct emu_device *dev, uint32_t rank);
int emu_threads_start(struct emu_device *dev);
void emu_threads_stop(struct emu_device *dev);
int emu_run_pass(struct emu_device *dev, struct dpa_hal *hal, int host);  /* under hal->busy */
uint64_t emu_next_timer(struct emu_device *dev, uint64_t now);  /* 1: one is due now */
void emu_driver_sleep(struct emu_device *dev, uint32_t snap, uint32_t need, int64_t ns);
/* emu_drive.c: cooperative progress, a host thread running its rank's firmware */
int emu_drive(struct host_device *hd, uint32_t *word, uint32_t seen, int64_t timeout_ns,
	      uint32_t flags);
void emu_drive_stats(struct host_device *hd, struct host_drive_stats *out);
/* host_device_ops.wake_waiters: every host thread out (drivers, sleepers on `word`). */
void emu_wake_waiters(struct host_device *hd, uint32_t *word);
/* emu_spin.c: who may spin, and when a peer's write need not wake a progress thread */
uint64_t emu_spin_budget_ns(const struct emu_device *dev);
int emu_cores_to_spare(const struct emu_device *dev);
int emu_cpu_alone(const struct emu_device *dev, uint64_t now);
int emu_woken_waiting(const struct emu_device *dev, uint64_t now);
int emu_cpu_shared(const struct emu_device *dev);  /* another rank waits for our CPU? */
void emu_hand_back(struct emu_device *dev);        /* after a small post: yield to it */
/* Ranks outnumber the cores and ours has two more than another CPU: move there (1). */
int emu_balance(struct emu_device *dev, uint64_t now);
int emu_spin_worthwhile(const struct emu_device *dev);  /* no bulk copier, a core each? */
int emu_host_leased(const struct emu_device *dev, uint32_t rank, struct dpa_hal *pass);
/* The wake-up hand-over: 1 if a driver running on the CPU rank's driver sleeps on takes
 * the wake-up (the caller owns it: it disarmed the sleeper), 0 to wake it itself. */
int emu_hand_over(struct emu_device *dev, uint32_t rank);
/* A driver published on `cpu` wakes the sleepers handed to it there. */
void emu_take_handovers(struct emu_device *dev, uint32_t cpu);
/* Publish our host thread's CPU (or EMU_CPU_ASLEEP), first waking what was handed to it. */
void emu_publish_cpu(struct emu_device *dev, uint32_t cpu);

/* emu_bell.c: the job's bell, private futex words, the clock */
#define EMU_CPU_ASLEEP 0xffffffffu      /* emu_rank.host_cpu of a host thread asleep */
#define EMU_CPU_UNKNOWN 0xfffffffeu     /* emu_cpu_now() where the kernel did not say */
#define EMU_HOST_LEASE_NS 1000000ull    /* a host that drove small ops is back within this */
#define EMU_SLEEP_SLICE_NS 50000000ll   /* a sleeper re-checks the stop flag this often */
uint32_t emu_cpu_now(void);             /* the calling thread's CPU (rseq: no system call) */
#define EMU_WAKE_DPA  1u                /* futex bitset: progress threads */
#define EMU_WAKE_HOST 2u                /* futex bitset: the host thread driving */
/* The bell's bits of rank's progress threads (EMU_WAKE_DPA) or driver (EMU_WAKE_HOST). */
uint32_t emu_bell_bits(uint32_t rank, uint32_t kind);
/* One FUTEX_WAKE for `bits` of every rank in `ranks` (taken out of asleep already). */
void emu_ring(struct emu_device *dev, uint32_t bits, const uint32_t *ranks, uint32_t nranks);
long emu_futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts, uint32_t bits);
struct timespec emu_ns_to_ts(int64_t ns);
/* Sleep on a private futex word while it reads `seen`, counted in the job's asleep (the
 * completion ring's cq_tail); emu_wake_word() is its waker. */
int emu_wait_word(struct emu_device *dev, uint32_t *word, uint32_t seen, int64_t timeout_ns);
void emu_wake_word(struct emu_device *dev, uint32_t *word);
uint64_t emu_now_ns(void);
uint64_t emu_pass_now(struct dpa_hal *pass);  /* the clock read once a pass; NULL: now */

/* emu_wire.c: writes into a peer's private memory through the job segment */
uint32_t emu_wire_slots(uint32_t nranks);
/* May a write of len to peer's private memory go on the wire? */
int emu_wire_takes(const struct dpa_hal *hal, uint32_t peer, uint64_t len);
/* Its way (may_take: into private memory), enum emu_wire_way, or DPA_HAL_EAGAIN. */
int emu_wire_route(struct dpa_hal *hal, uint32_t peer, int may_take);
int32_t emu_wire_direct(struct dpa_hal *hal, uint32_t peer, uint64_t src, uint64_t raddr,
			uint32_t rkey, uint64_t len);
/* Put it there (checked already); its completion comes from emu_wire_poll. */
int emu_wire_post(struct dpa_hal *hal, uint32_t peer, uint64_t src, uint64_t raddr,
		  uint32_t rkey, uint64_t len, uint64_t wr_id, uint32_t rail);
/* The sender's side, at every poll of its CQ: complete, take back from stalled targets. */
void emu_wire_poll(struct dpa_hal *hal);
/* The target's side, in every pass: place what came in; the pieces placed. */
int emu_wire_place(struct emu_device *dev, struct dpa_hal *pass);
/* Has something come in on our wires that no pass placed yet? */
int emu_wire_pending(const struct emu_device *dev);
/* A process taking over its rank (before its threads run): go on where the wires stand,
 * and let go of the pieces the dead process held. */
void emu_wire_adopt(struct emu_device *dev);
/* Writes on one QP land in order: other work to a peer waits for those on its wire. */
static inline int emu_wire_busy(const struct dpa_hal *hal, uint32_t peer)
{
	return hal->nout && hal->wire_tx && peer < hal->dev->attr.size &&
	       hal->wire_tx[peer].sending;
}

/* emu_hal.c: a write into rank's memory at once (mapped: a copy; else process_vm_writev);
 * an error status if the registration refuses it or the peer is gone */
int32_t emu_write_remote(struct emu_device *dev, uint32_t peer, const void *src,
			 uint64_t raddr, uint32_t rkey, uint64_t len);
/* emu_hal.c: our port `rail` failed (all of them: this rank is unreachable) */
void emu_rail_down(struct emu_device *dev, uint32_t rail);

/* emu_watch.c: fail peers that exit without closing (see there). */
int emu_watch_start(struct emu_device *dev);
void emu_watch_stop(struct emu_device *dev);
/* What the NIC tells its firmware about a peer it lost (a refused or failed access): the
 * peer closed its context (OFFLOAD_ERR_PEER_CLOSED, and the deaths it knew of are passed
 * on) or died (OFFLOAD_ERR_PEER, and it goes into the failed set at once). */
int32_t emu_peer_lost(struct emu_device *dev, uint32_t rank);
void emu_publish_death(struct emu_device *dev, uint32_t rank);
/* Pass newly closed and unreachable peers on to the firmware's ring header. */
void emu_sync_peers(struct emu_device *dev);

#endif /* EMU_INTERNAL_H */

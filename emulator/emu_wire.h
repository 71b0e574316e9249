/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The emulated wire (emu_wire.c): RDMA writes into another rank's private memory carried
 * by a ring of slots in the job segment, placed by the target rank's own threads.
 */
#ifndef EMU_WIRE_H
#define EMU_WIRE_H

#include <stdint.h>

#define EMU_WIRE_SLOT_BYTES (128u * 1024u)
#define EMU_WIRE_MAX_SLOTS  16u           /* per directed pair of ranks (2 MiB) */
/* Every wire of a job together, at most (tmpfs pages are allocated on first touch only,
 * but a container's /dev/shm is often 64 MiB): 16 slots per pair up to 4 ranks, 4 at 8. */
#define EMU_WIRE_BUDGET     (32ull << 20)
#define EMU_WIRE_OUTBOX     16u            /* writes on the wire per sender thread */
/* The wire is chosen until its copy into slots used before was timed, then one write
 * goes directly; after that, every this many go the way not chosen, so that both ways'
 * costs stay measured (emu_wire_route). */
#define EMU_WIRE_PROBE_EVERY 16u
/* A copy shorter than both this and wire_min (4 KiB at least) is not timed: its cost is
 * mostly the call's. */
#define EMU_WIRE_TIMED_MIN  (64u * 1024u)
/* A piece nobody placed for this long (the target stopped, closes or died) is placed by
 * its sender with process_vm_writev: an op's abort waits for its writes' completions. */
#define EMU_WIRE_STALL_NS   20000000ull
/* A piece a live target with several DPA threads took and has not placed for this long
 * (stopped mid-copy) fails its write with a timeout, as RC's retries running out would. */
#define EMU_WIRE_TAKEN_NS   1000000000ull

/* What a MiB cost a sender thread lately by one way into a peer's private memory (ns, a
 * moving average) and how many samples (counted up to 2) made it. */
struct emu_wire_cost {
	uint64_t ns_per_mib;
	uint32_t samples;
};

/* Both ways (emu_wire_route): its copy into the wire's slots, and one process_vm_writev;
 * and how many writes that could have taken the wire went (by either way). */
struct emu_wire_costs {
	struct emu_wire_cost wire, direct;
	uint32_t choices;
};

/* How a write goes (emu_wire_route): directly, not eligible for the wire; on the wire;
 * directly by the choice, timed (emu_wire_direct). */
enum emu_wire_way {
	EMU_WAY_DIRECT = 0,
	EMU_WAY_WIRE = 1,
	EMU_WAY_MEASURED = 2,
};

enum emu_wire_state {
	EMU_WIRE_FREE = 0,
	EMU_WIRE_READY = 1,     /* filled by the sender, not taken */
	EMU_WIRE_TAKEN = 2,     /* the target copies it into place */
	EMU_WIRE_RESCUED = 3,   /* its sender copies it into place (stalled) */
};

/* A slot's descriptor in the job segment, a line each. */
struct emu_wire_piece {
	uint64_t raddr;       /* where it lands, in the target's address space */
	uint64_t index;       /* the sender's free-running piece number */
	uint32_t rkey;
	uint32_t len;
	uint32_t state;       /* enum emu_wire_state; READY and FREE are release stores */
	int32_t status;       /* the placement's, written before state goes FREE */
	uint32_t resv[8];
};

/* One directed pair's wire: header lines, then the pieces; the payload slots live apart. */
struct emu_wire {
	uint64_t tail;        /* pieces published (the sender's thread 0 is the only producer) */
	uint32_t resv[14];
	struct emu_wire_piece piece[EMU_WIRE_MAX_SLOTS];
};

_Static_assert(sizeof(struct emu_wire_piece) == 64, "a piece per line");
_Static_assert(sizeof(struct emu_wire) == 64 * (1 + EMU_WIRE_MAX_SLOTS), "wire: lines");

/* A write of the sender's thread 0 on a wire, until its completion (process memory): its
 * first (end - first) * EMU_WIRE_SLOT_BYTES bytes went into slots, the rest directly. */
struct emu_wire_send {
	uint64_t src;         /* the local source, registered (checked at post) */
	uint64_t raddr;
	uint64_t len;
	uint64_t first;       /* its pieces: [first, end) */
	uint64_t end;
	uint64_t reaped;      /* [first, reaped): let go of by the target, statuses read */
	uint64_t wr_id;
	uint64_t moved_ns;    /* since when the target has not let go of a piece (0: moving) */
	uint32_t peer;
	uint32_t rkey;
	uint32_t rail;
	int32_t status;       /* the direct part's, or the first failed piece's */
	uint32_t held;        /* pieces (bit idx - first) a live target held: done with by us */
	int32_t held_status;  /* ... how (written by us, or OFFLOAD_ERR_TIMEOUT) */
};

/* The sender's side of its wire to one peer (process memory). */
struct emu_wire_tx {
	uint64_t tail;        /* pieces published */
	uint64_t acked;       /* pieces whose placement was seen (their slots free again) */
	uint64_t first;       /* the first piece this process sent (its slots: emu_wire.c) */
	uint32_t sending;     /* writes in the outbox: other work to this peer waits */
	uint32_t resv;
};

#endif /* EMU_WIRE_H */

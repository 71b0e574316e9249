/* SPDX-License-Identifier: Apache-2.0 */
/* Firmware-private state shared by the engine and the algorithm files. */
#ifndef DPA_ENGINE_INTERNAL_H
#define DPA_ENGINE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dpa_engine.h"
#include "dpa_hal.h"
#include "offload_atomic.h"
#include "offload_abi.h"

enum dpa_op_state { DPA_OP_FREE = 0, DPA_OP_ACTIVE = 1 };

/* Per-peer step of an op; item i is owned by thread i % num_threads (peers striped). */
struct dpa_item {
	uint32_t flags;
	uint32_t inflight;     /* posted writes not yet completed */
	uint64_t posted;       /* bytes posted (all of them, once a piece failed) */
	uint64_t acked;        /* bytes whose writes completed: a prefix of posted */
	uint64_t raddr;        /* the receiver's ready: where to write */
	uint32_t rkey;
	uint32_t expect_lo;    /* done-counter value that means "src finished" */
	uint32_t errs_seen;    /* done-counter error count before this op */
	uint32_t round;        /* barrier round */
	uint64_t oos_since;    /* when the gate first saw its peer in an agreement instead */
};

#define DPA_ITEM_STARTED   (1u << 0)
#define DPA_ITEM_READY_OUT (1u << 1)  /* our ready descriptor is posted to the source */
#define DPA_ITEM_READY_IN  (1u << 2)  /* the destination's ready arrived */
#define DPA_ITEM_SIGNALED  (1u << 3)  /* done signal posted to the destination */
#define DPA_ITEM_RECVD     (1u << 4)  /* the source's done signal arrived */
#define DPA_ITEM_WAITING   (1u << 5)  /* barrier: signal sent, waiting for this round */
#define DPA_ITEM_FINISHED  (1u << 6)
#define DPA_ITEM_FAILED    (1u << 7)  /* a data write failed: the done signal carries an error */
#define DPA_ITEM_COUNT_OUT (1u << 8)  /* all-to-all-v: our byte count is posted to the destination */
#define DPA_ITEM_COUNT_IN  (1u << 9)  /* slots: the source's announced count was read */
#define DPA_ITEM_RESEND    (1u << 10) /* a rail dropped a write: rewind to `acked` and resend */
#define DPA_ITEM_ABORTED   (1u << 11) /* the algorithm's abort step for this item is done */
#define DPA_ITEM_SIG_OUT   (1u << 12) /* our signature is posted to peer me + i */
#define DPA_ITEM_SIG_IN    (1u << 13) /* peer me + i's signature agreed (or it is gone) */
/* Eager all-to-all (alltoall_eager.c): item j exchanges with peer me + j both ways. */
#define DPA_ITEM_PUT       (1u << 14) /* our block is in the peer's slot (or there is none) */
#define DPA_ITEM_COPIED    (1u << 15) /* the peer's block is copied out (or dropped) */
#define DPA_ITEM_FALLBACK  (1u << 16) /* the peer runs a gated op: its gate needs our
				       * signature (SIG_OUT once posted) */
#define DPA_ITEM_JUDGED    (1u << 17) /* the peer's slot header (signature) was judged */
#define DPA_ITEM_SELF_LATER (1u << 18) /* pairwise: our own block waited one visit for the
					   * peers' (alltoall_pairwise.c) */
/* Bits 28-30: the rail this item's writes in flight went out on (p2p.c put_chunks). */
#define DPA_ITEM_RAIL_SHIFT 28u
#define DPA_ITEM_RAIL_MASK  (7u << DPA_ITEM_RAIL_SHIFT)

struct dpa_team {
	uint32_t active;
	uint32_t size;
	uint32_t my_rank;
	uint32_t next_seq;     /* sequence of the next op; starts at 1 */
	uint32_t fp;           /* offload_sig.team_fp of this team as we built it */
	uint32_t resv;
	/* (eng->failed_gen << 32) | (lowest dead member's world rank + 1, 0: none), as
	 * dpa_team_lowest_dead() last computed it. */
	uint64_t dead_cache;
	/* The team's part of the engine's team arena (TEAM_CREATE carves it, sized by the
	 * team; TEAM_DESTROY frees it). */
	uint64_t arena_off;
	uint64_t arena_len;
	/* Set once an op of this team aborted (peer death, op timeout, cancel): the peers'
	 * sequence no longer pairs with ours, so every later op fails at once with it.
	 * (detail << 32) | (uint32_t)status, set by CAS from 0. */
	uint64_t poisoned;
	struct offload_peer *peers;   /* [size], in the arena */
	/* Done-counter bookkeeping per slot and source; touched only by the item owning it. */
	uint32_t *expect_lo[OFFLOAD_OP_WINDOW];  /* [slot][size] */
	uint32_t *errs_seen[OFFLOAD_OP_WINDOW];
	struct dpa_item *items;       /* [OP_WINDOW * size]: slot s's ops use items + s * size */
	/* Eager all-to-all: the seq of the last eager op started in each slot (intake), and,
	 * per slot and peer, a seq whose slot the peer will never hand back because it ran
	 * another op (only that peer's item touches it). */
	uint32_t eager_last[OFFLOAD_EAGER_SLOTS];
	uint32_t *eager_skip[OFFLOAD_EAGER_SLOTS];  /* [slot][size] */
	/* Eager allreduce: its own vector goes into our slot for ourselves, which no peer
	 * credits: the seq of the last such op started per slot (intake), and of the last one
	 * done with the slot (release-stored): the next may write it then (self_ok()). */
	uint32_t eager_self_last[OFFLOAD_EAGER_SLOTS];
	uint32_t eager_self_done[OFFLOAD_EAGER_SLOTS];
};

struct dpa_engine;
struct dpa_op;
struct dpa_hal_cqe;

/* An algorithm, as the engine sees it: everything the engine needs to know of one goes
 * through these hooks (the engine names no algorithm, nor multicast). */
struct dpa_algo {
	/* The variant of this opcode's algorithm that runs cmd, from what every rank of the
	 * op has alike (flags, block size, the engine's parameters). May be NULL: this one. */
	const struct dpa_algo *(*select)(const struct dpa_engine_params *p,
					 const struct offload_cmd *cmd, uint32_t team_size);
	/* Called once at intake; returns the number of items. A command it cannot run is
	 * refused (dpa_op_refuse), not rejected: the op still runs, moving nothing. */
	int (*start)(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal);
	/* Advance item i; returns >0 if it did work. Must not block. */
	int (*progress)(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal);
	/* Item i of an aborted op, before it finishes: what its peer must still hear (a
	 * multicast owner withdraws its source). DPA_HAL_EAGAIN: call again. May be NULL. */
	int (*abort)(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal);
	/* Item 0 talks to the whole group (multicast sends, its own copy): a failed rail in
	 * one of its data completions is given up for every peer, except a refetch read's
	 * (DPA_WR_REFETCH names its owner). */
	uint32_t multicast;
	/* Peers' writes the op waits for that it does not pass on (see
	 * dpa_engine_events_needed); NULL: 1, every event may let it unblock a peer. */
	uint32_t (*events_needed)(const struct dpa_op *op);
	/* The op's signature travels with its data (eager: in the slot's header), so it has
	 * no gate round: the algorithm judges each peer's signature itself (dpa_sig_judge)
	 * and answers a peer that runs a gated op instead with ours (signature.c). */
	uint32_t carries_sig;
	/* Bytes this rank sends, for the bulk/small split; NULL: count per member. */
	uint64_t (*bytes_sent)(const struct dpa_op *op, uint32_t team_size);
	/* Item 0's RDMA READ from team peer `owner` completed (DPA_WR_REFETCH; a failed rail
	 * too: the read goes again). Needed where such reads are posted. */
	void (*read_completed)(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			       uint32_t owner, const struct dpa_hal_cqe *c);
	/* Before the op's completion is written: give back what the op held, report. */
	void (*finish)(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal);
	/* Once the gate is open, the items of one thread (stripe me of nthreads, whose first
	 * unfinished one is `first`) that can move at all are those below the returned
	 * index; a pass visits no item past it (paced all-to-all: nothing past the blocks a
	 * window ahead of the first one not yet sent). NULL: every item. */
	uint32_t (*horizon)(const struct dpa_engine *eng, struct dpa_op *op, uint32_t first,
			    uint32_t nthreads);
};

/* All-to-all-v layout of one op, by team rank: where each block comes from and goes. */
struct dpa_vlayout {   /* the arrays: [team size] each, in the team's arena */
	uint64_t *send_off;    /* bytes into src, or (rows) into the row list */
	uint64_t *send_len;
	uint64_t *recv_off;
	uint64_t *recv_len;
	uint64_t rows_addr;                    /* OFFLOAD_CMD_F_ROWS: the host's row list */
	uint64_t place_addr;                   /* OFFLOAD_CMD_F_PLACE: the receivers' row list */
	uint64_t row_bytes;
};

/* Where an item's outgoing block comes from (one range, or rows gathered by index), and
 * how it must fit the receiver's ready. */
struct dpa_send {
	uint64_t addr;         /* the range's start, or the row table's */
	uint64_t len;          /* bytes to send */
	const uint32_t *rows;  /* NULL, or this block's row indices */
	const uint32_t *place; /* NULL, or the receiver's row for each row of this block */
	uint64_t row_bytes;
	uint32_t slot;         /* the ready is a slot to fill up to its length, not an exact fit;
				* the byte count is announced before the done signal */
	uint32_t placed;       /* OFFLOAD_CMD_F_PLACE: the ready is the receiver's whole table */
	uint32_t fixed;        /* all-to-all: the receiver's ready is marked FIXED */
	uint32_t hold;         /* paced: take the ready, but post no data yet */
	uint32_t recv_later;   /* do not look for the source's done signal in this pass */
};

struct dpa_op {
	uint32_t state;        /* enum dpa_op_state; release-stored after the fields below */
	uint32_t users;        /* threads inside progress of this op: intake may not reuse it */
	uint32_t remaining;    /* items not finished */
	uint32_t completing;   /* lock: one thread writes the completion */
	/* First error: (world rank << 32) | (uint32_t)status, set once by CAS from 0, so the
	 * status and the rank it names are read together. */
	uint64_t fail;
	uint32_t seq;
	uint32_t slot;
	uint32_t team_id;
	uint32_t nitems;
	/* Per thread: its first item not finished yet (0: not known, start at the thread's
	 * first). A pass starts there instead of rescanning the finished ones. */
	uint32_t scan_from[OFFLOAD_MAX_THREADS];
	uint32_t index;        /* position in the engine's op table, for wr_ids */
	uint32_t bulk;         /* counted in inflight_bulk */
	uint32_t refuse;       /* this rank's op failed: it moves no data and refuses peers' */
	uint32_t cancel;       /* a CANCEL command asked for this op (any thread sets it) */
	uint32_t aborted;      /* items stop where they are and finish once nothing is in flight */
	uint64_t deadline_ns;  /* op timeout: abort when the clock passes it; UINT64_MAX: never */
	uint64_t dead_since;   /* when a dead member was first seen (0: none) */
	uint64_t peer_op_since;  /* when a peer's error signal failed it (0: not yet) */
	/* The gate (signature.c): no item runs the algorithm before every peer's signature
	 * agreed; one that disagrees, or a member gone before joining, fails the op there. */
	struct offload_sig sig;   /* ours */
	uint32_t sig_pending;  /* peers whose signature has not been judged yet */
	uint32_t gate_fail;    /* the gate failed the op: items finish without running */
	uint64_t result0;      /* completion's result0/result1 */
	uint64_t result1;
	/* Per-algorithm state, as UCC's tasks keep it: zeroed at intake, then only the op's
	 * algorithm (and the layer it runs on) reads and writes its member. */
	union dpa_op_alg {
		struct {  /* multicast: mcast.c, broadcast_mcast.c, allgather_mcast.c */
			uint32_t mc_flags;    /* DPA_MC_* (item 0 sets, other items read) */
			uint32_t mc_readies;  /* peers whose ready arrived */
			uint32_t mc_next;     /* next chunk to inject */
			uint32_t mc_resv;
			struct offload_mcast_op_stats mc_stats;  /* item 0 counts, finish reports */
		};
		struct {  /* eager all-to-all: alltoall_eager.c */
			uint32_t eager_prev;  /* seq of the slot's previous eager op, 0 if none */
			/* Peers whose header (their signature) is not judged yet, and whether one
			 * disagreed or never came: nothing is copied out before every one agreed. */
			uint32_t hdr_pending;
			uint32_t hdr_fail;
			uint32_t eager_self_prev;  /* allreduce_eager.c: see eager_self_last */
			uint32_t eager_reduced;    /* allreduce_eager.c: the peers' slots are read */
			uint32_t eager_self_early; /* allreduce_eager.c: aborted before its turn */
		};
		struct {  /* reductions: reduce_scatter.c, allreduce.c (reduce.h) */
			uint32_t red_flags;   /* DPA_RED_* (the reducer sets, other items read) */
			uint32_t red_pushed;  /* items whose phase 1 finished */
			uint32_t red_next;    /* the reducer's progress in bytes of its block */
		};
		struct {  /* all-to-all: alltoall_pairwise.c */
			/* per thread: its first item whose ready may not be out yet */
			uint32_t a2a_ready_from[OFFLOAD_MAX_THREADS];
			/* per thread: its first item whose source's done signal is not in */
			uint32_t a2a_recv_from[OFFLOAD_MAX_THREADS];
		};
		struct {  /* all-to-all-v: alltoallv.c, alltoallv_slots.c */
			uint32_t layout_done; /* v is complete (release-stored) */
			uint32_t layout_lock;
			uint32_t layout_scan; /* sources before it have their count in (under the lock) */
			struct dpa_vlayout *v;
		};
	} alg;
	const struct dpa_algo *algo;
	struct offload_cmd cmd;
	struct dpa_item *items;  /* [team size]: the team's for this slot (intake) */
};

/* Multicast (mcast.c): one op at a time per team owns its receive state. */
#define DPA_MCAST_MAX_CHUNKS 32768u  /* per op: 128 MiB at the default 4 KiB MTU */
#define DPA_MCAST_SEND_BURST 256u    /* chunks one pass injects */
#define DPA_MCAST_POLL_ROUNDS 16     /* x 64 chunks one pass receives at most */
#define DPA_MCAST_READS      8u      /* refetch reads in flight */
#define DPA_MCAST_READ_CHUNKS 64u    /* chunks one refetch read covers at most */
/* Before a missing chunk counts as lost: on a fabric "sent all" (reliable, another path)
 * may overtake the last multicast chunks. */
#define DPA_MCAST_MIN_GRACE_NS 20000u

#define DPA_BLOCK_HAVE_SRC 1u  /* the owner's source address and key arrived */
#define DPA_BLOCK_SENT_ALL 2u  /* the owner injected every chunk */
#define DPA_BLOCK_COMPLETE 4u  /* every chunk is here (released after the data) */
#define DPA_BLOCK_RESEND   8u  /* a read of its refetch round lost its rail: read it again */

/* One owner's block of a multicast op, as this rank receives it. */
struct dpa_mcast_block {
	uint64_t dst;          /* where its chunk 0 lands here */
	uint64_t len;
	uint64_t src_addr;     /* the owner's copy, for RDMA READ of lost chunks */
	uint64_t sent_all_ns;  /* when its "sent all" was seen */
	uint32_t src_key;
	uint32_t first_chunk;
	uint32_t nchunks;
	uint32_t got;          /* chunks present */
	uint32_t flags;        /* DPA_BLOCK_* */
	uint32_t next;         /* refetch: next chunk to look at */
	uint32_t round_start;  /* refetch: chunks [round_start, next) are being read */
	uint32_t resv;
};

#define DPA_MCAST_POLL_BATCH 64

struct dpa_mcast_state {
	uint32_t owner;        /* op index + 1 of the op using it; 0: free */
	uint32_t drained;      /* the last poll found nothing */
	uint32_t posted;       /* receive regions are posted */
	uint32_t npending;     /* staged receive: chunks whose copy out found the queue full */
	struct dpa_hal_mcast_cqe pending[DPA_MCAST_POLL_BATCH];
	uint64_t bits[DPA_MCAST_MAX_CHUNKS / 64];
	struct dpa_mcast_block *blocks;  /* [team size], by owner's team rank, in the arena */
	struct dpa_hal_mcast_region *regions;  /* [team size]: what dpa_mcast_post posts */
};

#define DPA_MAX_RAILS  8u
#define DPA_NO_RAIL    0xffffffffu
#define DPA_RAIL_WAIT  0xfffffffeu  /* dpa_item_rail(): not yet, data in flight on another */
#define DPA_CTRL_LOG   32u  /* at most 32: one bit each in dpa_engine.ctrl_busy */
#define DPA_CTRL_RESEND 0xffu  /* pending value: dropped by a failed rail, to post again */

/* A control word in flight (rails.c): everything needed to post it again. */
struct dpa_ctrl_msg {
	uint64_t wr_id;
	uint64_t raddr;
	uint64_t value;        /* signal: the add; sequenced write: the seq word */
	uint32_t peer;         /* world rank */
	uint32_t rkey;
	uint32_t kind;         /* DPA_WR_SIGNAL, or a sequenced write (READY/COUNT) */
	uint32_t len;          /* body bytes */
	uint32_t seq_off;      /* where the seq word goes, from raddr */
	uint8_t pending;       /* completions still due, an owed seq word's included; 0: free;
				* DPA_CTRL_RESEND */
	uint8_t resend;
	uint8_t seq_owed;      /* the queue took the body but refused the seq word: post it alone */
	uint8_t body_rail;     /* the rail the body went on (an owed seq word must follow it) */
	uint8_t body[32];
};

/* A team's agreement (agree_ft.c), run by one thread: team id % num_threads. */
struct dpa_agree {
	uint32_t active;       /* a command is running; set under intake, cleared by its thread */
	uint32_t round;        /* the coordinator (team rank) this rank waits for or is */
	uint32_t decided;      /* est holds a decision: taken from a coordinator, or ours */
	uint32_t resv;
	uint64_t epoch;        /* agreements of this team so far, the current one included */
	/* Our proposal, then (our round) our decision, went out to team ranks below p and
	 * to p its chunks below k (k == offload_agree_chunks(n): the word itself). */
	struct { uint32_t p, k; } sent, told;
	uint64_t deadline_ns;
	uint64_t oos_since;    /* see dpa_out_of_step() */
	/* The words without their sets' members 64 and up: those live in our own slots of
	 * the team block (writer = our team rank), which no peer writes. */
	struct offload_agree_word mine;
	struct offload_agree_word est;
	struct offload_cmd cmd;
};

#define DPA_OP_MASK_WORDS ((OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW + 63) / 64)

struct dpa_engine {
	struct dpa_engine_params params;
	uint32_t intake_lock;
	uint32_t cq_lock;
	uint32_t inflight;     /* active ops; read by the runtime to choose how to idle */
	uint32_t inflight_bulk; /* of which move more than DPA_ENGINE_SMALL_BYTES per rank */
	/* The ring header's failed set, merged into failed[] (rank_words words) up to this
	 * gen (dpa_failed_refresh). */
	uint32_t failed_gen;
	uint32_t rank_words;
	uint64_t *failed;
	/* One bit per op slot that may be ACTIVE: a pass visits these instead of every slot
	 * (a small op's passes are otherwise mostly that scan). Set before a slot turns
	 * ACTIVE, cleared before it turns FREE (it can be taken again only after). */
	uint64_t active_ops[DPA_OP_MASK_WORDS];
	uint32_t agreements;    /* teams with an agreement running (agree_ft.c) */
	/* Per thread: the ring header's closed set as it read it at the start of its pass
	 * (dpa_peer_gone: a word looked for after that read is final): closed_snap holds
	 * rank_words words per thread, up to the gen in closed_gen_seen. */
	uint32_t closed_gen_seen[OFFLOAD_MAX_THREADS];
	uint64_t *closed_snap;
	/* Per thread: the earliest time (dpa_hal_time_ns) a pass of that thread must run
	 * though no event may come (a loss timeout); 0: none. */
	uint64_t wake_at[OFFLOAD_MAX_THREADS];
	struct dpa_team teams[OFFLOAD_MAX_TEAMS];
	struct dpa_op ops[OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW];
	struct dpa_vlayout vlayouts[OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW];
	struct dpa_mcast_state mcast[OFFLOAD_MAX_TEAMS];
	struct dpa_agree agree[OFFLOAD_MAX_TEAMS];
	uint32_t *rails_down;  /* [world size] per world peer: rails known to have failed */
	/* Teams' member tables (dpa_team's pointers), team_pool_ranks members' worth. */
	uint8_t *arena;
	uint64_t arena_bytes;
	struct dpa_ctrl_msg ctrl_log[OFFLOAD_MAX_THREADS][DPA_CTRL_LOG];
	uint32_t ctrl_resends[OFFLOAD_MAX_THREADS];  /* log entries waiting to be sent again */
	uint32_t ctrl_busy[OFFLOAD_MAX_THREADS];     /* bit i: ctrl_log[t][i] pending (rails.c) */
};

#define DPA_MC_POSTED   1u  /* receive regions posted: readies may go out */
#define DPA_MC_INJECTED 2u  /* every chunk of our block injected: "sent all" may go out */
#define DPA_MC_COPIED   4u  /* all-gather: own block copied into dst */
#define DPA_MC_RECEIVED 8u  /* item 0 finished receiving: acknowledgements may go out */
#define DPA_MC_COPYING  16u /* all-gather: the copy of our own block is posted */

/* Ask the runtime to run a pass of this thread at `when` (dpa_hal_time_ns) even if no
 * event comes: what a timeout needs, since no completion announces that time has passed.
 * Per thread, because only the thread whose item waits re-arms it. */
static inline void dpa_wake_at(struct dpa_engine *eng, struct dpa_hal *hal, uint64_t when)
{
	uint32_t t = dpa_hal_thread_index(hal);
	uint64_t cur;

	if (t >= OFFLOAD_MAX_THREADS)
		return;
	cur = off_read_once(&eng->wake_at[t]);
	while ((!cur || when < cur) && !off_cas(&eng->wake_at[t], &cur, when ? when : 1))
		;
}

/* Raise multicast progress flags (DPA_MC_*) that another item of the op waits for. That
 * item may belong to a sibling thread parked until an event, and a flag in memory is no
 * event: wake the siblings. */
static inline void dpa_mc_raise(struct dpa_op *op, struct dpa_hal *hal, uint32_t bits)
{
	__atomic_fetch_or(&op->alg.mc_flags, bits, __ATOMIC_RELEASE);
	dpa_hal_notify(hal);
}

/* Algorithm registry entries, one per file. */
extern const struct dpa_algo dpa_algo_broadcast_mcast;
extern const struct dpa_algo dpa_algo_allgather_mcast;
extern const struct dpa_algo dpa_algo_alltoall_pairwise;
extern const struct dpa_algo dpa_algo_alltoall_eager;
extern const struct dpa_algo dpa_algo_barrier;
extern const struct dpa_algo dpa_algo_alltoallv;
extern const struct dpa_algo dpa_algo_alltoallv_slots;
/* alltoallv.c: both all-to-all-v variants' bytes_sent hook. */
uint64_t dpa_alltoallv_bytes_sent(const struct dpa_op *op, uint32_t team_size);
/* alltoallv.c: the command's arguments, NULL unless their nranks is the team's size and
 * all of them are in the registration (index them by the team's size, never by nranks). */
struct offload_alltoallv_args *dpa_a2av_args(struct dpa_engine *eng, struct dpa_hal *hal,
					     const struct dpa_op *op);

/* op.c: an op's fate and the words every layer reaches (a leaf over the HAL). */
void dpa_op_fail(struct dpa_op *op, int32_t status, uint32_t world_rank);
/* Abort an op (see op.c): its items stop, the team fails every later op. */
void dpa_op_abort(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_op *op, int32_t status,
		  uint32_t detail);
uint64_t dpa_peer_ctrl_addr(const struct dpa_team *team, uint32_t peer, uint64_t offset);
/* World rank r is in the failed set as this engine last merged it. */
static inline int dpa_rank_failed(const struct dpa_engine *eng, uint32_t r)
{
	return r < eng->params.world_size && offload_rankset_has(eng->failed, r);
}
/* World rank r closed, as the calling thread saw the set at the start of its pass. */
static inline int dpa_rank_closed(const struct dpa_engine *eng, struct dpa_hal *hal, uint32_t r)
{
	uint32_t t = dpa_hal_thread_index(hal);

	return t < eng->params.num_threads && r < eng->params.world_size &&
	       offload_rankset_has(eng->closed_snap + (uint64_t)t * eng->rank_words, r);
}
/* engine_state.c: merge the ring header's failed set into eng->failed when its gen moved
 * (any thread), and take the calling thread's snapshot of the closed set (thread me, at
 * the start of its pass). */
void dpa_failed_refresh(struct dpa_engine *eng, struct dpa_hal *hal);
void dpa_closed_refresh(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t me);
/* engine_state.c: the lowest world rank of the team's members in the failed set,
 * UINT32_MAX if none (every survivor names the same one). O(1) until the set changes. */
uint32_t dpa_team_lowest_dead(struct dpa_engine *eng, const struct dpa_team *team);
/* Fail the op on this rank and run it refusing: see intake_one(). */
void dpa_op_refuse(struct dpa_engine *eng, struct dpa_op *op, int32_t status);
struct offload_thread_stats *dpa_stats(struct dpa_hal *hal);

/* Fail every later op of the team: (detail << 32) | status, the first one wins. */
void dpa_team_poison(struct dpa_team *team, int32_t status, uint32_t detail);
/* Write a completion; 0: the ring is full, try again. */
int dpa_write_cqe(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cqe *cqe);
/* team.c: the team arena. Members' worth (params.team_pool_ranks, or its default), bytes
 * per member, and bytes per team slot whatever its size. */
uint32_t dpa_team_pool_ranks(const struct dpa_engine_params *p);
uint64_t dpa_team_member_bytes(void);
uint64_t dpa_team_fixed_bytes(void);
/* team.c: TEAM_CREATE's status (the team is active from then on). */
int32_t dpa_team_create(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd);
/* team_destroy.c: OFFLOAD_OP_TEAM_DESTROY, run under the intake lock. DPA_TEAM_DESTROY_LATER:
 * an op of the team is still being retired (its completion is out, its slot not yet
 * free): the command waits in the ring, as one waiting for a free op slot does. */
#define DPA_TEAM_DESTROY_LATER 1
int32_t dpa_team_destroy(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd);
/* A completion for a command that holds no op slot (agreement); 0: the ring is
 * full, try again. */
int dpa_complete_cmd(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd,
		     int32_t status, uint32_t detail, uint64_t result0, uint64_t result1);


/*
 * wr_id = op index (16) | op seq, low 16 bits (16) | item (24) | kind (8). The seq bits let
 * a completion that arrives after its op finished (and the slot was reused) be told apart;
 * the item field holds any team rank below 1 << 24 (8 bits spilled item 256 into the seq).
 */
#define DPA_WR_ITEM_MAX 0xffffffu
static inline uint64_t dpa_wr_tag(uint32_t opi, uint64_t seq, uint32_t item, uint32_t kind)
{
	return ((uint64_t)(opi & 0xffffu) << 48) | ((seq & 0xffffu) << 32) |
	       ((uint64_t)(item & DPA_WR_ITEM_MAX) << 8) | (kind & 0xffu);
}

static inline uint64_t dpa_wr_id(const struct dpa_op *op, uint32_t item, uint32_t kind)
{
	return dpa_wr_tag(op->index, op->seq, item, kind);
}

static inline uint32_t dpa_wr_op(uint64_t wr_id)    { return (uint32_t)(wr_id >> 48); }
static inline uint32_t dpa_wr_seq16(uint64_t wr_id) { return (uint32_t)(wr_id >> 32) & 0xffffu; }
static inline uint32_t dpa_wr_item(uint64_t wr_id)  { return (uint32_t)(wr_id >> 8) & DPA_WR_ITEM_MAX; }
static inline uint32_t dpa_wr_kind(uint64_t wr_id)  { return (uint32_t)wr_id & 0xffu; }
#define DPA_WR_OP_MASK    (~0ull << 48)     /* the op index's bits */
#define DPA_WR_OPSEQ_MASK (~0xffffffffull)  /* op and seq: every word of one op shares them */

#define DPA_WR_DATA   1u
#define DPA_WR_READY  2u   /* control words: wr_id's item is the team peer */
#define DPA_WR_COUNT  3u
#define DPA_WR_SIGNAL 4u
#define DPA_WR_WITHDRAW 5u /* a multicast owner's ready again, OFFLOAD_READY_WITHDRAWN */
/* Item 0's data read from one owner (multicast refetch): wr_id's item is that team peer,
 * so a failed rail is given up for that peer only. */
#define DPA_WR_REFETCH 6u
#define DPA_WR_SIG     7u  /* the op's signature (a control word: item is the team peer) */
/* An agreement word or chunk: op index DPA_AGREE_OPI + team, item the team peer with the
 * kind (decision) at bit 16, seq 0 for the word, 1 + k for chunk k: every one in the log
 * has its own wr_id (the log resends by wr_id). */
#define DPA_WR_AGREE   8u
#define DPA_AGREE_OPI  (OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW)
/* Item's data written into this rank's own memory (an eager block copied out of its
 * slot): counted like DATA, a failed rail is ours. */
#define DPA_WR_DATA_SELF 9u
/* Control word: an eager slot's header (the op's signature, its seq word last). */
#define DPA_WR_EAGER  10u
/* Item's write handing a peer's eager slot back (the consumed seq word): counted like
 * DATA, but a peer that closed or died no longer needs it, so only a failed rail (it goes
 * again) matters, and it is no payload for the counters. */
#define DPA_WR_CREDIT 11u

/* Offsets of one rank's control words in its control region (offload_abi.h's layout: the
 * team's block by the job's world size, entries by the team's size). */
static inline uint64_t dpa_ctrl_team_off(const struct dpa_engine *eng, uint32_t team)
{
	return offload_ctrl_team_off(eng->params.world_size, team);
}

static inline uint64_t dpa_ctrl_ready_off(const struct dpa_engine *eng, uint32_t team,
					  uint32_t slot, uint32_t src)
{
	return dpa_ctrl_team_off(eng, team) +
	       offload_ctrl_ready_in(eng->teams[team].size, slot, src);
}

static inline uint64_t dpa_ctrl_count_off(const struct dpa_engine *eng, uint32_t team,
					  uint32_t slot, uint32_t src)
{
	return dpa_ctrl_team_off(eng, team) +
	       offload_ctrl_count_in(eng->teams[team].size, slot, src);
}

static inline uint64_t dpa_ctrl_done_off(const struct dpa_engine *eng, uint32_t team,
					 uint32_t slot, uint32_t src)
{
	return dpa_ctrl_team_off(eng, team) +
	       offload_ctrl_done_in(eng->teams[team].size, slot, src);
}

static inline uint64_t dpa_ctrl_sig_off(const struct dpa_engine *eng, uint32_t team,
					uint32_t seq, uint32_t src)
{
	return dpa_ctrl_team_off(eng, team) + offload_ctrl_sig_in(eng->teams[team].size, seq, src);
}

static inline uint64_t dpa_ctrl_credit_off(const struct dpa_engine *eng, uint32_t team,
					   uint32_t slot, uint32_t dst)
{
	return dpa_ctrl_team_off(eng, team) +
	       offload_ctrl_credit_in(eng->teams[team].size, slot, dst);
}

/* Source src's eager slot of this team in a rank's control region. */
static inline uint64_t dpa_ctrl_eager_off(const struct dpa_engine *eng, uint32_t team,
					  uint32_t src, uint32_t slot)
{
	return offload_ctrl_eager_off(eng->params.world_size, team, src, slot);
}

/* This rank's own control words of a team (NULL if the window refuses them). */
static inline void *dpa_my_word(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team,
				uint64_t in_block, uint64_t len)
{
	return dpa_hal_window_ptr(hal, DPA_HAL_WIN_CTRL, dpa_ctrl_team_off(eng, team) + in_block,
				  len);
}

static inline struct offload_ready *dpa_my_ready(struct dpa_engine *eng, struct dpa_hal *hal,
						 uint32_t team, uint32_t slot, uint32_t src)
{
	return dpa_my_word(eng, hal, team, offload_ctrl_ready_in(eng->teams[team].size, slot, src),
			   sizeof(struct offload_ready));
}

static inline struct offload_count *dpa_my_count(struct dpa_engine *eng, struct dpa_hal *hal,
						 uint32_t team, uint32_t slot, uint32_t src)
{
	return dpa_my_word(eng, hal, team, offload_ctrl_count_in(eng->teams[team].size, slot, src),
			   sizeof(struct offload_count));
}

static inline uint64_t *dpa_my_done(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team,
				    uint32_t slot, uint32_t src)
{
	return dpa_my_word(eng, hal, team, offload_ctrl_done_in(eng->teams[team].size, slot, src), 8);
}

static inline uint64_t *dpa_my_credit(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t team,
				      uint32_t slot, uint32_t dst)
{
	return dpa_my_word(eng, hal, team,
			   offload_ctrl_credit_in(eng->teams[team].size, slot, dst), 8);
}

static inline struct offload_sig *dpa_my_sig(struct dpa_engine *eng, struct dpa_hal *hal,
					     uint32_t team, uint32_t seq, uint32_t src)
{
	return dpa_my_word(eng, hal, team, offload_ctrl_sig_in(eng->teams[team].size, seq, src),
			   sizeof(struct offload_sig));
}

#endif /* DPA_ENGINE_INTERNAL_H */

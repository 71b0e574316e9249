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

enum dpa_op_state {
	DPA_OP_FREE = 0,
	DPA_OP_ACTIVE = 1,
};

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

struct dpa_team {
	uint32_t active;
	uint32_t size;
	uint32_t my_rank;
	uint32_t next_seq;     /* sequence of the next op; starts at 1 */
	uint64_t world_mask;   /* members, by world rank */
	uint32_t fp;           /* offload_sig.team_fp of this team as we built it */
	uint32_t resv;
	/* Set once an op of this team aborted (peer death, op timeout, cancel): the peers'
	 * sequence no longer pairs with ours, so every later op fails at once with it.
	 * (detail << 32) | (uint32_t)status, set by CAS from 0. */
	uint64_t poisoned;
	struct offload_peer peers[OFFLOAD_MAX_RANKS];
	/* Done-counter bookkeeping per slot and source; touched only by the item owning it. */
	uint32_t expect_lo[OFFLOAD_OP_WINDOW][OFFLOAD_MAX_RANKS];
	uint32_t errs_seen[OFFLOAD_OP_WINDOW][OFFLOAD_MAX_RANKS];
	/* Eager all-to-all: the seq of the last eager op started in each slot (intake), and,
	 * per slot and peer, a seq whose slot the peer will never hand back because it ran
	 * another op (only that peer's item touches it). */
	uint32_t eager_last[OFFLOAD_EAGER_SLOTS];
	uint32_t eager_skip[OFFLOAD_EAGER_SLOTS][OFFLOAD_MAX_RANKS];
};

struct dpa_engine;
struct dpa_op;

struct dpa_algo {
	const char *name;
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
};

/* All-to-all-v layout of one op, by team rank: where each block comes from and goes. */
struct dpa_vlayout {
	uint64_t send_off[OFFLOAD_MAX_RANKS];  /* bytes into src, or (rows) into the row list */
	uint64_t send_len[OFFLOAD_MAX_RANKS];
	uint64_t recv_off[OFFLOAD_MAX_RANKS];
	uint64_t recv_len[OFFLOAD_MAX_RANKS];
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
	uint32_t index;        /* position in the engine's op table, for wr_ids */
	uint32_t bulk;         /* counted in inflight_bulk */
	uint32_t layout_done;  /* all-to-all-v: v is complete (release-stored) */
	uint32_t layout_lock;
	uint32_t refuse;       /* this rank's op failed: it moves no data and refuses peers' */
	uint32_t cancel;       /* a CANCEL command asked for this op (any thread sets it) */
	uint32_t aborted;      /* items stop where they are and finish once nothing is in flight */
	uint64_t deadline_ns;  /* op timeout: abort when the clock passes it; UINT64_MAX: never */
	uint64_t dead_since;   /* when a dead member was first seen (0: none) */
	/* The gate (signature.c): no item runs the algorithm before every peer's signature
	 * agreed; one that disagrees, or a member gone before joining, fails the op there. */
	struct offload_sig sig;   /* ours */
	uint32_t sig_pending;  /* peers whose signature has not been judged yet */
	uint32_t gate_fail;    /* the gate failed the op: items finish without running */
	uint32_t mc_flags;     /* multicast: DPA_MC_* (item 0 sets, other items read) */
	uint32_t mc_readies;   /* multicast: peers whose ready arrived */
	uint32_t mc_next;      /* multicast: next chunk to inject */
	uint32_t eager_prev;   /* eager: seq of the slot's previous eager op, 0 if none */
	/* Eager: peers whose slot header (their signature) is not judged yet, and whether one
	 * disagreed or never came: nothing is copied out before every one agreed. */
	uint32_t hdr_pending;
	uint32_t hdr_fail;
	struct offload_mcast_op_stats mc_stats;  /* multicast: item 0 counts, completion reports */
	uint64_t result0;      /* completion's result0/result1 */
	uint64_t result1;
	struct dpa_vlayout *v;
	const struct dpa_algo *algo;
	struct offload_cmd cmd;
	struct dpa_item items[OFFLOAD_MAX_RANKS];
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
	struct dpa_mcast_block blocks[OFFLOAD_MAX_RANKS];  /* by owner's team rank */
};

#define DPA_MAX_RAILS  8u
#define DPA_NO_RAIL    0xffffffffu
#define DPA_CTRL_LOG   32u
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
	uint8_t pending;       /* completions still due; 0: free; DPA_CTRL_RESEND */
	uint8_t resend;
	uint8_t resv[2];
	uint8_t body[32];
};

/* A team's agreement (agree_ft.c), run by one thread: team id % num_threads. */
struct dpa_agree {
	uint32_t active;       /* a command is running; set under intake, cleared by its thread */
	uint32_t round;        /* the coordinator (team rank) this rank waits for or is */
	uint32_t decided;      /* est holds a decision: taken from a coordinator, or ours */
	uint32_t resv;
	uint64_t epoch;        /* agreements of this team so far, the current one included */
	uint64_t sent;         /* team ranks our proposal was posted to */
	uint64_t told;         /* team ranks our decision was posted to (our round) */
	uint64_t deadline_ns;
	uint64_t oos_since;    /* see dpa_out_of_step() */
	struct offload_agree_word mine;
	struct offload_agree_word est;
	struct offload_cmd cmd;
};

struct dpa_engine {
	struct dpa_engine_params params;
	uint32_t intake_lock;
	uint32_t cq_lock;
	uint32_t inflight;     /* active ops; read by the runtime to choose how to idle */
	uint32_t inflight_bulk; /* of which move more than DPA_ENGINE_SMALL_BYTES per rank */
	uint64_t failed_ranks;  /* the ring header's failed_ranks, as last read */
	/* Per thread: the ring header's closed_ranks as it read it at the start of its pass
	 * (dpa_peer_gone: a word looked for after that read is final). */
	uint64_t closed_snap[OFFLOAD_MAX_THREADS];
	/* Per thread: the earliest time (dpa_hal_time_ns) a pass of that thread must run
	 * though no event may come (a loss timeout); 0: none. */
	uint64_t wake_at[OFFLOAD_MAX_THREADS];
	struct dpa_team teams[OFFLOAD_MAX_TEAMS];
	struct dpa_op ops[OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW];
	struct dpa_vlayout vlayouts[OFFLOAD_MAX_TEAMS * OFFLOAD_OP_WINDOW];
	struct dpa_mcast_state mcast[OFFLOAD_MAX_TEAMS];
	struct dpa_agree agree[OFFLOAD_MAX_TEAMS];
	uint32_t rails_down[OFFLOAD_MAX_RANKS];  /* per world peer: rails known to have failed */
	uint8_t thread_rail[OFFLOAD_MAX_THREADS][OFFLOAD_MAX_RANKS];  /* rail set in the HAL */
	struct dpa_ctrl_msg ctrl_log[OFFLOAD_MAX_THREADS][DPA_CTRL_LOG];
	uint32_t ctrl_resends[OFFLOAD_MAX_THREADS];  /* log entries waiting to be sent again */
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
	__atomic_fetch_or(&op->mc_flags, bits, __ATOMIC_RELEASE);
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

/* rails.c: failover between rails (see there). */
uint32_t dpa_rail_select(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t peer);
void dpa_rail_failed(struct dpa_engine *eng, struct dpa_hal *hal, uint32_t peer, uint32_t rail);
/* Post a logged control word; DPA_HAL_EAGAIN, OFFLOAD_ERR_LINK_DOWN (no rail) or 0. */
int dpa_ctrl_post(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_ctrl_msg *msg);
int dpa_ctrl_completed(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_hal_cqe *c);
int dpa_ctrl_resend(struct dpa_engine *eng, struct dpa_hal *hal);
int dpa_ctrl_pending(struct dpa_engine *eng, const struct dpa_op *op);
/* Is the control word with this wr_id still owed by any thread? */
int dpa_ctrl_word_pending(struct dpa_engine *eng, uint64_t wr_id);

/* mcast.c: what broadcast and all-gather share (see there). */
struct dpa_mcast_state *dpa_mcast_claim(struct dpa_engine *eng, struct dpa_op *op);
void dpa_mcast_release(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal);
/* The op's counters for the host (aux buffer), if it asked: start() checks the buffer. */
int dpa_mcast_stats_ok(struct dpa_hal *hal, const struct dpa_op *op);
/* A refetch read from the owner of block `owner` completed (poll_completions). */
void dpa_mcast_read_completed(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			      uint32_t owner, const struct dpa_hal_cqe *c);
void dpa_mcast_report(struct dpa_hal *hal, const struct dpa_op *op);
/* Post the regions of every block not complete (nor `complete`, one completing now). */
int dpa_mcast_post(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		   struct dpa_mcast_state *st, uint32_t complete);
int dpa_mcast_inject(struct dpa_op *op, struct dpa_hal *hal, uint32_t first_chunk,
		     uint64_t src, uint64_t len, int *done);
/* Poll arrivals, learn owners' readies and "sent all", fetch what was lost; returns work
 * done. Sets DPA_BLOCK_COMPLETE on every block that is whole. */
int dpa_mcast_receive(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      struct dpa_mcast_state *st);
uint32_t dpa_mcast_chunks(struct dpa_hal *hal, uint64_t len);
int dpa_mcast_peer_word(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint32_t p);
int dpa_mcast_owner_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			 struct dpa_hal *hal, uint32_t p);
int dpa_mcast_take_ack(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
		       struct dpa_hal *hal, uint32_t p);
/* An aborted owner's unfinished item for peer p (p has not acknowledged our block):
 * withdraw our source from p. */
int dpa_mcast_withdraw(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t p);

/* p2p.c: the exchange step shared by all-to-all and all-to-all-v. */
/* A control descriptor into team peer peer_rank's region at off: len bytes of body, then
 * the op's seq at off + seq_off (same queue: a reader that sees the seq sees the body). */
int dpa_post_sequenced(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t peer_rank, uint64_t off, const void *body, uint32_t len,
		       uint32_t seq_off, uint32_t kind);
int dpa_publish_ready(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t src, uint64_t addr, uint64_t len, uint32_t flags);
/* The same descriptor naming any of our regions: multicast owners publish their source
 * (src_key, remote read) so that receivers can read what they lost. */
int dpa_publish_region(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t peer, uint64_t addr, uint64_t len, uint32_t key, uint32_t flags);
/* The same descriptor with OFFLOAD_READY_WITHDRAWN, as its own control word (its own
 * wr_id kind: the log tells its completions from the ready's). */
int dpa_withdraw_region(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			uint32_t peer, uint64_t addr, uint64_t len, uint32_t key);
/* Publishes this rank's ready for one source (fixed-layout exchanges). */
typedef int (*dpa_publish_fn)(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
			      uint32_t src);
/* Item i's first steps in a fixed-layout exchange: expect the source's signal, publish our
 * ready to it if start() could not. Returns the work done, or -1 to retry later. */
int dpa_item_begin(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		   dpa_publish_fn publish);
/* Tell dst how many bytes this op sends it (struct offload_count, seq last). */
int dpa_publish_count(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		      uint32_t dst, uint64_t bytes);
/* Item i: take the destination's ready, write the send block, signal, and wait
 * for the source's signal; sets DPA_ITEM_FINISHED once READY_OUT is set too. */
int dpa_exchange_step(struct dpa_engine *eng, struct dpa_op *op, uint32_t i, struct dpa_hal *hal,
		      const struct dpa_send *send);

/* team_destroy.c: OFFLOAD_OP_TEAM_DESTROY, run under the intake lock. DPA_TEAM_DESTROY_LATER:
 * an op of the team is still being retired (its completion is out, its slot not yet
 * free): the command waits in the ring, as one waiting for a free op slot does. */
#define DPA_TEAM_DESTROY_LATER 1
int32_t dpa_team_destroy(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd);

/* agree_ft.c: fault-tolerant agreement (OFFLOAD_OP_AGREE). intake: 1 taken, 0 not now
 * (the team's previous agreement still runs); progress: the calling thread's teams. */
int dpa_agree_intake(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd);
int dpa_agree_progress(struct dpa_engine *eng, struct dpa_hal *hal);
/* One rank runs an agreement where another runs a collective: 1 once that has held for
 * DPA_OOS_SETTLE_NS on a team whose sequences pair up (no member gone, no op aborted:
 * after a failure they legitimately differ). *since: the caller's first sighting. */
#define DPA_OOS_SETTLE_NS 200000000ull
int dpa_out_of_step(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_team *team,
		    uint64_t *since);

/* engine.c: a completion for a command that holds no op slot (agreement); 0: the ring is
 * full, try again. */
int dpa_complete_cmd(struct dpa_engine *eng, struct dpa_hal *hal, const struct offload_cmd *cmd,
		     int32_t status, uint32_t detail, uint64_t result0, uint64_t result1);

/* signature.c: every op's signature and the gate before its algorithm (see there). */
uint32_t dpa_team_fp(uint32_t team_id, uint32_t size, const struct offload_peer *peers);
void dpa_sig_init(struct dpa_engine *eng, struct dpa_op *op);
/* Post our signature to peer me + i; DPA_HAL_EAGAIN: the control log is full, later. */
int dpa_sig_post(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i);
/* Item i's part of the gate: our signature out, peer me + i's judged. Returns work done. */
int dpa_sig_step(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i);
/* Peer `world`'s signature against ours: 1 if it agrees; else the op fails with
 * OFFLOAD_ERR_MISMATCH naming it and what differs (the first failure wins) and 0. */
int dpa_sig_judge(struct dpa_op *op, const struct offload_sig *theirs, uint32_t world);
/* Team peer p's signature of op seq as the gate posts it, if it arrived; else NULL. */
const struct offload_sig *dpa_sig_gated(struct dpa_hal *hal, uint32_t team_id, uint32_t seq,
				       uint32_t p);
/* ... or as an eager op carries it (its slot header): 1 and a copy in *out if there. */
int dpa_sig_eager(struct dpa_hal *hal, uint32_t team_id, uint32_t seq, uint32_t p,
		  struct offload_sig *out);
/* Item i's peer p has sent nothing for this op: 1 if the op fails for it (p runs an
 * agreement instead, once settled: OFFLOAD_ERR_MISMATCH; p is gone), 0 to wait on. */
int dpa_sig_absent(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t i,
		   uint32_t p);

/* Helpers for algorithms (engine.c). */
void dpa_op_fail(struct dpa_op *op, int32_t status, uint32_t world_rank);
/* Abort an op (see engine.c): its items stop, the team fails every later op. */
void dpa_op_abort(struct dpa_engine *eng, struct dpa_hal *hal, struct dpa_op *op, int32_t status,
		  uint32_t detail);
/* The same for the op a wr_id names, if it is still that op. */
void dpa_op_abort_wr(struct dpa_engine *eng, struct dpa_hal *hal, uint64_t wr_id, int32_t status,
		     uint32_t detail);
struct offload_ctrl_team *dpa_my_ctrl(struct dpa_hal *hal, uint32_t team);
uint64_t dpa_peer_ctrl_addr(const struct dpa_team *team, uint32_t peer, uint64_t offset);
int dpa_signal_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		    uint32_t peer, int error);
/* Returns 1 if peer's done signal for this item arrived, 0 if not yet; fails the op on error. */
int dpa_check_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		   struct dpa_item *it, uint32_t src);
/* The peer will never answer this op: it died (the op fails naming it), it closed its
 * context without sending what we wait for (the op fails with OFFLOAD_ERR_PEER_CLOSED),
 * or the op failed reaching it (it refused our control write). Waits on it end. Callers
 * look for the peer's word first and call this when it is missing. */
int dpa_peer_gone(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		  uint32_t world_rank);
static inline uint64_t dpa_closed_ranks(const struct dpa_engine *eng, struct dpa_hal *hal)
{
	uint32_t t = dpa_hal_thread_index(hal);

	return t < OFFLOAD_MAX_THREADS ? eng->closed_snap[t] : 0;
}
/* Fail the op on this rank and run it refusing: see intake_one(). */
void dpa_op_refuse(struct dpa_engine *eng, struct dpa_op *op, int32_t status);
void dpa_expect_done(struct dpa_engine *eng, struct dpa_op *op, struct dpa_item *it, uint32_t src);
struct offload_thread_stats *dpa_stats(struct dpa_hal *hal);

/*
 * wr_id = op index (32) | op seq, low 16 bits (16) | item (8) | kind (8). The seq bits let
 * a completion that arrives after its op finished (and the slot was reused) be told apart.
 */
static inline uint64_t dpa_wr_id(const struct dpa_op *op, uint32_t item, uint32_t kind)
{
	return ((uint64_t)op->index << 32) | ((uint64_t)(op->seq & 0xffffu) << 16) |
	       ((uint64_t)item << 8) | kind;
}

#define DPA_WR_DATA   1u
#define DPA_WR_READY  2u   /* control words: wr_id's item is the team peer */
#define DPA_WR_COUNT  3u
#define DPA_WR_SIGNAL 4u
#define DPA_WR_WITHDRAW 5u /* a multicast owner's ready again, OFFLOAD_READY_WITHDRAWN */
/* Item 0's data read from one owner (multicast refetch): wr_id's item is that team peer,
 * so a failed rail is given up for that peer only. */
#define DPA_WR_REFETCH 6u
#define DPA_WR_SIG     7u  /* the op's signature (a control word: item is the team peer) */
#define DPA_WR_AGREE   8u  /* an agreement word: op index DPA_AGREE_OPI + team, seq the epoch */
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

/* Offsets of one rank's control words inside struct offload_ctrl. */
static inline uint64_t dpa_ctrl_team_off(uint32_t team)
{
	return (uint64_t)team * sizeof(struct offload_ctrl_team);
}

static inline uint64_t dpa_ctrl_ready_off(uint32_t team, uint32_t slot, uint32_t src)
{
	return dpa_ctrl_team_off(team) + offsetof(struct offload_ctrl_team, ready) +
	       ((uint64_t)slot * OFFLOAD_MAX_RANKS + src) * sizeof(struct offload_ready);
}

static inline uint64_t dpa_ctrl_count_off(uint32_t team, uint32_t slot, uint32_t src)
{
	return dpa_ctrl_team_off(team) + offsetof(struct offload_ctrl_team, counts) +
	       ((uint64_t)slot * OFFLOAD_MAX_RANKS + src) * sizeof(struct offload_count);
}

static inline uint64_t dpa_ctrl_done_off(uint32_t team, uint32_t slot, uint32_t src)
{
	return dpa_ctrl_team_off(team) + offsetof(struct offload_ctrl_team, done) +
	       ((uint64_t)slot * OFFLOAD_MAX_RANKS + src) * sizeof(uint64_t);
}

static inline uint64_t dpa_ctrl_sig_off(uint32_t team, uint32_t seq, uint32_t src)
{
	return dpa_ctrl_team_off(team) + offsetof(struct offload_ctrl_team, sig) +
	       ((uint64_t)(seq % OFFLOAD_SIG_WINDOW) * OFFLOAD_MAX_RANKS + src) *
	       sizeof(struct offload_sig);
}

static inline uint64_t dpa_ctrl_credit_off(uint32_t team, uint32_t slot, uint32_t dst)
{
	return dpa_ctrl_team_off(team) + offsetof(struct offload_ctrl_team, eager_credit) +
	       ((uint64_t)slot * OFFLOAD_MAX_RANKS + dst) * sizeof(uint64_t);
}

/* Source src's eager slot of this team in a rank's control region. */
static inline uint64_t dpa_ctrl_eager_off(uint32_t team, uint32_t src, uint32_t slot)
{
	return offsetof(struct offload_ctrl, eager) +
	       (((uint64_t)team * OFFLOAD_MAX_RANKS + src) * OFFLOAD_EAGER_SLOTS + slot) *
	       sizeof(struct offload_eager_slot);
}

#endif /* DPA_ENGINE_INTERNAL_H */

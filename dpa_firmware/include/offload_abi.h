/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host <-> DPA contract. Shared unchanged by host/, emulator/ and dpa_firmware/.
 *
 * Rules (liburing style): fixed-width types only, new fields only append or take reserved
 * space, every size and offset that the other side depends on is asserted below.
 *
 * Command ring: an array of 64-byte struct offload_cmd in host memory. The host owns
 * sq_tail (producer), the DPA owns sq_head (consumer); both are free-running 32-bit
 * counters masked with (entries - 1). Completion ring: struct offload_cqe, the DPA owns
 * cq_tail, the host owns cq_head. Each index sits on its own 64-byte line.
 */
#ifndef OFFLOAD_ABI_H
#define OFFLOAD_ABI_H

#include <stddef.h>
#include <stdint.h>

#define OFFLOAD_ABI_VERSION 14u

/* ABI 13: ranks in one job, a validation cap only (nothing is sized by it: docs/scale.md) */
#define OFFLOAD_RANKS_LIMIT 65536u
#define OFFLOAD_MAX_TEAMS   16u   /* teams alive at once, world included */
#define OFFLOAD_OP_WINDOW   8u    /* ops in flight per team; slot = seq % window */
/* Signatures are kept twice as long (seq % 2 * window): a member can be a window ahead
 * of another that has not read its signature yet, but no further (signature.c). */
#define OFFLOAD_SIG_WINDOW  (2u * OFFLOAD_OP_WINDOW)
#define OFFLOAD_MAX_THREADS 64u   /* DPA progress threads per rank */
#define OFFLOAD_WORLD_TEAM  0u

/* One status space for completions and for C calls that report an op's fate. */
enum offload_status {
	OFFLOAD_OK = 0,
	OFFLOAD_IN_PROGRESS = 1,
	OFFLOAD_ERR_INVALID = -1,       /* malformed command: opcode, team, sizes, counts */
	OFFLOAD_ERR_REMOTE_ACCESS = -2, /* rkey unknown/revoked, out of bounds, wrong access */
	OFFLOAD_ERR_PEER = -3,          /* a peer failed; detail names it */
	OFFLOAD_ERR_TIMEOUT = -4,
	OFFLOAD_ERR_NO_SPACE = -5,      /* destination smaller than what arrives */
	OFFLOAD_ERR_CANCELED = -6,
	OFFLOAD_ERR_UNSUPPORTED = -7,
	OFFLOAD_ERR_INTERNAL = -8,
	OFFLOAD_ERR_PEER_OP = -9,       /* a peer reported that its part of this op failed */
	OFFLOAD_ERR_LINK_DOWN = -10,    /* every rail to the peer (detail) is down */
	OFFLOAD_ERR_COUNT_MISMATCH = -11, /* source (detail) sends result0 bytes, result1 expected */
	OFFLOAD_ERR_PEER_CLOSED = -12,  /* the peer (detail) closed its context before its part */
	/* The peer (detail) runs another op at this point of the team's sequence: result0 is
	 * (enum offload_mismatch << 56) | our value, result1 its value (struct offload_sig). */
	OFFLOAD_ERR_MISMATCH = -13,
};

/* What differs between two ranks' signatures of one op (OFFLOAD_ERR_MISMATCH). */
enum offload_mismatch {
	OFFLOAD_MISMATCH_OP = 1,    /* offload_sig.op: the collective or its mode */
	OFFLOAD_MISMATCH_ROOT = 2,
	OFFLOAD_MISMATCH_SIZE = 3,
	OFFLOAD_MISMATCH_TEAM = 4,  /* the members, their order, or the team id */
};
/* Where the mismatch's kind sits in the completion's result0, above our value. */
#define OFFLOAD_MISMATCH_SHIFT 56u

enum offload_opcode {
	OFFLOAD_OP_NOP = 0,
	OFFLOAD_OP_TEAM_CREATE = 1, /* aux_addr: struct offload_team_desc in host memory */
	OFFLOAD_OP_BARRIER = 2,
	OFFLOAD_OP_ALLTOALL = 3,    /* count: bytes per peer */
	OFFLOAD_OP_ALLTOALLV = 4,   /* count: bytes in src; aux_addr: struct offload_alltoallv_args */
	OFFLOAD_OP_CANCEL = 5,      /* count: tag of the op to abort (it completes CANCELED) */
	OFFLOAD_OP_BROADCAST = 6,   /* count: bytes; root; src (root) = dst = the buffer */
	OFFLOAD_OP_ALLGATHER = 7,   /* count: bytes per rank (src); dst: count * team size */
	/* ABI 9: fault-tolerant agreement of the team's live members (ULFM's agree, shrink's step);
	 * aux_addr: struct offload_agree_args; result0/result1/detail: its failed[0]/value/differs. */
	OFFLOAD_OP_AGREE = 8,
	/* Reductions (reduce_scatter.c, allreduce.c): root carries OFFLOAD_REDOP(op, dtype);
	 * count: bytes of src (the whole input); aux_addr: the op's scratch, count bytes
	 * rounded up to team size x block, registered for local and remote read and write.
	 * REDUCE_SCATTER: dst = this rank's block, count / team size bytes (count divisible by
	 * team size x element size). ALLREDUCE: dst = count bytes (may be src). */
	OFFLOAD_OP_REDUCE_SCATTER = 9,
	OFFLOAD_OP_ALLREDUCE = 10,
	/* Retire a team on this rank (no peer is involved): the slot and this rank's control
	 * words for it are zeroed and its multicast group left, so a later TEAM_CREATE may
	 * reuse the slot. The host posts it only once every op of the team completed here;
	 * the slot is reused only after every member destroyed it (dpo_team.c). */
	OFFLOAD_OP_TEAM_DESTROY = 11,
	OFFLOAD_OP_MAX = 12,
};

enum offload_dtype {
	OFFLOAD_DT_F32 = 1,
	OFFLOAD_DT_F64 = 2,
	OFFLOAD_DT_F16 = 3,
	OFFLOAD_DT_BF16 = 4,
	OFFLOAD_DT_I32 = 5,
	OFFLOAD_DT_I64 = 6,
	OFFLOAD_DT_MAX = 7,
};

enum offload_redop {
	OFFLOAD_RED_SUM = 1,
	OFFLOAD_RED_PROD = 2,
	OFFLOAD_RED_MAX = 3,
	OFFLOAD_RED_MIN = 4,
	OFFLOAD_RED_AVG = 5,   /* floating dtypes only */
	OFFLOAD_RED_OPS = 6,
};

/* A reduction command's root word: the op in bits 8..15, the dtype in bits 0..7. */
#define OFFLOAD_REDOP_OP_SHIFT 8u
#define OFFLOAD_REDOP(op, dt) ((((uint32_t)(op) & 0xffu) << OFFLOAD_REDOP_OP_SHIFT) | \
			       ((uint32_t)(dt) & 0xffu))
#define OFFLOAD_REDOP_OP(w)   (((uint32_t)(w) >> OFFLOAD_REDOP_OP_SHIFT) & 0xffu)
#define OFFLOAD_REDOP_DT(w)   ((uint32_t)(w) & 0xffu)

/* Command flags. */
#define OFFLOAD_CMD_F_EXPECT (1u << 0)  /* alltoallv: check arrivals against expect_bytes */
#define OFFLOAD_CMD_F_ROWS   (1u << 1)  /* alltoallv: gather src rows by index (rows_addr) */
#define OFFLOAD_CMD_F_SLOTS  (1u << 2)  /* alltoallv: fixed slots, no count round (slot_bytes) */
#define OFFLOAD_CMD_F_PLACE  (1u << 3)  /* alltoallv: land rows at receiver rows by index (place_addr) */

/* Memory access rights, carried by registrations (rkeys/lkeys). */
#define OFFLOAD_ACCESS_LOCAL_READ   (1u << 0)
#define OFFLOAD_ACCESS_LOCAL_WRITE  (1u << 1)
#define OFFLOAD_ACCESS_REMOTE_READ  (1u << 2)
#define OFFLOAD_ACCESS_REMOTE_WRITE (1u << 3)
#define OFFLOAD_ACCESS_REMOTE_ATOMIC (1u << 4)

/* The 64-byte command slot. Unused fields must be zero. */
struct offload_cmd {
	uint8_t opcode;
	uint8_t flags;      /* reserved, zero */
	uint16_t team;
	uint32_t tag;       /* chosen by the host, echoed in the completion */
	uint64_t src_addr;
	uint64_t dst_addr;
	uint64_t count;     /* bytes; meaning per opcode */
	uint32_t src_key;   /* lkey of src */
	uint32_t dst_key;   /* rkey of dst, published to peers */
	uint64_t dst_len;   /* capacity of dst in bytes: the firmware never writes past it */
	uint64_t aux_addr;
	uint32_t aux_key;
	uint32_t root;
};

/* A completion record. detail: the failing peer rank for OFFLOAD_ERR_PEER/REMOTE_ACCESS. */
struct offload_cqe {
	uint32_t tag;
	int32_t status;
	uint32_t detail;
	uint32_t resv;
	uint64_t result0;   /* bytes received, or bytes needed on OFFLOAD_ERR_NO_SPACE */
	uint64_t result1;   /* bytes available on OFFLOAD_ERR_NO_SPACE */
};

struct offload_ring_hdr {
	uint32_t sq_tail;   /* host producer */
	/* ABI 13: two rank sets of the job, bitmaps of rank_words words in the ring window
	 * after the completion ring (offload_ring_set_ranks). Ranks only join a set: bit, then
	 * gen (offload_rankset_add). failed: world ranks known dead (the emulator's process
	 * watch, a completion naming the rank; on hardware QP errors): ops on their teams
	 * abort. closed: ranks that closed their context cleanly (left the job; not failed):
	 * an op waiting for one fails with OFFLOAD_ERR_PEER_CLOSED. */
	uint32_t failed_gen;
	uint32_t closed_gen;
	uint32_t rank_words;  /* offload_rank_words(world size) */
	uint32_t failed_off;
	uint32_t closed_off;
	uint32_t resv0[10];
	uint32_t sq_head;   /* DPA consumer */
	uint32_t resv1[15];
	uint32_t cq_tail;   /* DPA producer; the host sleeps on it */
	uint32_t cq_waiters;/* host threads asleep on cq_tail: the DPA wakes them only if non-zero */
	uint32_t resv2[14];
	uint32_t cq_head;   /* host consumer */
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint32_t resv3[13];
};

/* Words of a bitmap with one bit per rank of a job of `world` ranks. */
static inline uint32_t offload_rank_words(uint32_t world) { return (world + 63u) / 64u; }
/* Bytes of the ring window: header, commands, completions, then the failed and closed
 * rank sets (the host places them there: offload_ring_set_ranks). */
static inline uint64_t offload_ring_bytes(uint32_t sq_entries, uint32_t cq_entries, uint32_t world)
{ return 256ull + 64ull * sq_entries + 32ull * cq_entries + 16ull * offload_rank_words(world); }
/* The host, once at setup, before the firmware starts. */
static inline void offload_ring_set_ranks(struct offload_ring_hdr *h, uint32_t sq_entries,
					  uint32_t cq_entries, uint32_t world)
{
	h->rank_words = offload_rank_words(world);
	h->failed_off = (uint32_t)(256ull + 64ull * sq_entries + 32ull * cq_entries);
	h->closed_off = h->failed_off + 8u * h->rank_words;
}
/* A rank set's bit, read without ordering (the caller read the gen with acquire). */
static inline int offload_rankset_has(const uint64_t *words, uint32_t rank)
{ return (int)((__atomic_load_n(&words[rank / 64u], __ATOMIC_RELAXED) >> (rank % 64u)) & 1u); }
/* Put rank into the set words/gen: bit first, then the gen a reader acquires. Returns 1
 * if the rank was not in it. */
static inline int offload_rankset_add(uint64_t *words, uint32_t *gen, uint32_t rank)
{
	uint64_t bit = 1ull << (rank % 64u);

	if (__atomic_fetch_or(&words[rank / 64u], bit, __ATOMIC_SEQ_CST) & bit)
		return 0;
	__atomic_fetch_add(gen, 1u, __ATOMIC_RELEASE);
	return 1;
}

/* A team member as the firmware sees it: where its control region lives. */
struct offload_peer {
	uint64_t ctrl_addr;
	uint32_t ctrl_key;
	uint32_t world_rank;
};

/* ABI 13: as long as the team (offload_team_desc_bytes); the firmware maps the header,
 * checks size against the job, then maps the peers. */
struct offload_team_desc {
	uint32_t team_id;
	uint32_t size;
	uint32_t my_rank;
	uint32_t resv;
	struct offload_peer peers[];
};

static inline uint64_t offload_team_desc_bytes(uint32_t size) { return 16ull + 16ull * size; }

/* The receiver's "ready" for one op: where the sender may write, published by the
 * receiver into the sender's control region before any byte moves. seq is written last
 * (after addr/key/len) and is the op's team sequence number. */
struct offload_ready {
	uint64_t addr;
	uint64_t len;
	uint32_t key;
	uint32_t flags;     /* OFFLOAD_READY_REFUSED: the receiver failed; send nothing */
	uint64_t seq;
};

#define OFFLOAD_READY_REFUSED (1u << 0)
#define OFFLOAD_READY_PLACED  (1u << 1)  /* addr/len is the whole table: land rows by index */
/* The receiver's mode, which the sender's must match (every member runs the same op once
 * past the gate, signature.c; a ready of another mode is refused all the same). */
#define OFFLOAD_READY_SLOT    (1u << 2)  /* all-to-all-v slot mode: a slot to fill up to len */
#define OFFLOAD_READY_FIXED   (1u << 3)  /* all-to-all: the block, exactly len */
/* A multicast owner whose op aborted takes its source back: what was read from it after
 * this flag landed may already be the host's next data. */
#define OFFLOAD_READY_WITHDRAWN (1u << 4)

/* ABI 9: the signature of one op as one rank runs it, published at intake into every
 * member's control region (before anything else of the op, on the same queue). No member
 * moves data for an op before every other member's signature arrived and agreed, so ranks
 * that post different collectives at the same point all fail at once, and nothing moves.
 * seq is written last, as in a ready. */
#define OFFLOAD_SIG_MODE_SHIFT 8u  /* offload_sig.op: the mode above the opcode */
struct offload_sig {
	uint32_t op;          /* opcode | (mode: OFFLOAD_CMD_F_SLOTS, _PLACE; SIG_EAGER) << 8 */
	uint32_t root;        /* broadcast: the root's team rank; reductions: the redop word; else 0 */
	uint64_t size;        /* bytes per block, where every rank must agree (all-to-all,
			       * broadcast, all-gather); else 0 */
	uint32_t team_fp;     /* FNV-1a of the team id and its world ranks, in order */
	uint32_t world_rank;  /* the writer */
	uint64_t seq;
};

/* ABI 10, in offload_sig.op's mode: an all-to-all whose blocks go eagerly (at most the
 * rank's eager_max): ranks that differ in it disagree on the protocol, not just the size. */
#define OFFLOAD_SIG_EAGER (1u << 7)

/* ABI 14: an agreement's arguments (8-aligned; read at intake, written before the completion),
 * then uint64_t failed[words] (offload_agree_failed): in, world ranks gone; out, the agreed set. */
struct offload_agree_args {
	uint32_t nranks, words;  /* the world size, offload_rank_words(nranks): nothing else goes */
	uint64_t value;       /* in: a proposal; out: the largest among the merged ones */
	uint32_t fp;          /* in: what every member must pass alike (a member list's hash) */
	uint32_t differs;     /* out: 1 + the world rank of a member whose fp differed, or 0 */
	uint64_t resv;
};
static inline uint64_t offload_agree_args_bytes(uint32_t world)
{ return sizeof(struct offload_agree_args) + 8ull * offload_rank_words(world); }
static inline uint64_t *offload_agree_failed(struct offload_agree_args *a)
{ return (uint64_t *)(a + 1); }

/* An agreement's word in a member's control region: a proposal or a coordinator's decision, its
 * set by team rank (64+ in chunks). epoch, written last there and in each chunk, is read in all. */
struct offload_agree_word {
	uint64_t failed;
	uint64_t value;
	uint32_t fp;
	uint32_t extra;  /* proposal: the writer's next op seq (out of step?); decision: differs */
	uint64_t epoch;
};
#define OFFLOAD_AGREE_CHUNK_RANKS 192u  /* chunk k: members 64 + 192 k + i in bits */
struct offload_agree_chunk { uint64_t bits[3]; uint64_t epoch; };
static inline uint32_t offload_agree_chunks(uint32_t n)
{ return n > 64u ? (n - 64u + OFFLOAD_AGREE_CHUNK_RANKS - 1u) / OFFLOAD_AGREE_CHUNK_RANKS : 0u; }

/* What a sender will send (all-to-all-v), published into the receiver's control region
 * before the receiver lays out its destination. seq is written last. */
struct offload_count {
	uint64_t bytes;
	uint64_t seq;
};

/* Host memory named by an all-to-all-v command's aux_addr (ABI 13: a 64-byte header, then
 * three arrays of nranks words, indexed by team rank: offload_a2av_send/_recv/_expect). */
struct offload_alltoallv_args {
	/* With OFFLOAD_CMD_F_ROWS (MoE dispatch): src is a table of row_bytes rows and what
	 * goes to rank j is rows rows_addr[k] for its k's, in order; the row list (uint32) is
	 * concatenated in team-rank order and send[j] is a multiple of row_bytes. The DPA
	 * gathers the rows itself: the host never copies them into a send buffer. */
	uint64_t rows_addr;
	uint64_t row_bytes;
	/* With OFFLOAD_CMD_F_SLOTS (low latency): dst holds one slot of slot_bytes per source
	 * in team-rank order, published at intake; each sender writes at most that much and
	 * announces its byte count with its done signal, so there is no count round. */
	uint64_t slot_bytes;
	/* With OFFLOAD_CMD_F_PLACE (MoE combine), the mirror of F_ROWS: dst is a table of
	 * row_bytes rows, and the k-th row this rank sends to rank j lands at row
	 * place_addr[k] of rank j's dst (uint32, concatenated in team-rank order like rows).
	 * Every rank of the op sets it; receivers publish their whole table and each sender
	 * checks its indices against it before writing, so the host never scatters the
	 * arrivals. May be combined with F_ROWS (gather by index, land by index). */
	uint64_t place_addr;
	uint32_t nranks;      /* the team's size: the firmware refuses another */
	uint32_t resv0;
	uint64_t resv[3];
	/* send[nranks] (in: packed in src in team-rank order), recv[nranks] (out: written by
	 * the firmware), expect[nranks] (in, with OFFLOAD_CMD_F_EXPECT) */
	uint64_t bytes[];
};

static inline uint64_t offload_a2av_args_bytes(uint32_t nranks) { return 64ull + 24ull * nranks; }
static inline uint64_t *offload_a2av_send(struct offload_alltoallv_args *a) { return a->bytes; }
static inline uint64_t *offload_a2av_recv(struct offload_alltoallv_args *a)
{ return a->bytes + a->nranks; }
static inline uint64_t *offload_a2av_expect(struct offload_alltoallv_args *a)
{ return a->bytes + 2ull * a->nranks; }

/*
 * ABI 10: eager all-to-all (blocks of at most OFFLOAD_EAGER_BYTES): a source writes its
 * block straight into a slot of the receiver's control region (slot = op seq % SLOTS),
 * then the slot's header behind it on the same queue: the op's signature (struct
 * offload_sig, with OFFLOAD_SIG_EAGER in its mode), whose seq word, written last, may
 * carry OFFLOAD_EAGER_ERROR. The receiver judges the signature as the gate would
 * (signature.c) when it takes the block: an eager op has no separate signature round.
 * It copies the block out and hands the slot back by writing the seq word it consumed
 * into the source's eager_credit. A source reuses a slot only once the seq word of that
 * slot's previous op came back.
 */
#define OFFLOAD_EAGER_SLOTS 2u
#define OFFLOAD_EAGER_BYTES 8192u
#define OFFLOAD_EAGER_ERROR (1ull << 63)   /* in the seq word: the source failed, no block */
#define OFFLOAD_EAGER_SEQ(word) ((uint32_t)(word))

struct offload_eager_slot {
	struct offload_sig sig;  /* sig.size: bytes of the block; sig.seq written last */
	uint64_t resv[4];
	uint8_t data[OFFLOAD_EAGER_BYTES];
};

/* ABI 13: one rank's control region, written by peers: OFFLOAD_MAX_TEAMS team blocks of
 * offload_ctrl_stride(W) bytes (W: the world size), then the eager slots. Peers compute
 * addresses from the team's size and id alone (no exchange); a team of n members touches
 * the first offload_ctrl_team_bytes(n) bytes of its block (sparse: the rest costs nothing).
 * A team block, arrays of n entries per slot, [slot * n + src]:
 *   ready[OP_WINDOW * n]    the receiver's ready for that slot's op, from src
 *   done[OP_WINDOW * n]     signals from src on that slot: low 32 bits, erroneous: high 32
 *   counts[OP_WINDOW * n]   what src will send (all-to-all-v)
 *   sig[SIG_WINDOW * n]     src's op signature, seq % SIG_WINDOW
 *   agree_prop[n], agree_dec[n]  agreement words by the writer's team rank (agree_ft.c)
 *   eager_credit[EAGER_SLOTS * n] our word dst last consumed from that slot [slot * n + dst]
 *   agree_chunk[2][n][offload_agree_chunks(n)]  ABI 14: the words' chunks [prop, dec][writer]
 * Every offset comes from the helpers below (firmware, every binding, Python). */
#define OFFLOAD_CTRL_ENTRY_BYTES \
	(OFFLOAD_OP_WINDOW * (32u + 8u + 16u) + OFFLOAD_SIG_WINDOW * 32u + 2u * 32u + \
	 OFFLOAD_EAGER_SLOTS * 8u)  /* per member of a team block: 1040 */
/* Eager all-to-all runs on teams of at most this many members (larger ones take the
 * ready path): the slots are OFFLOAD_EAGER_MAX_TEAM sources wide, whatever W. */
#define OFFLOAD_EAGER_MAX_TEAM 64u
static inline uint64_t offload_ctrl_agree_chunk_in(uint32_t n, uint32_t dec, uint32_t src,
						   uint32_t k)
{ return OFFLOAD_CTRL_ENTRY_BYTES * (uint64_t)n +
	 (((uint64_t)dec * n + src) * offload_agree_chunks(n) + k) * 32u; }
static inline uint64_t offload_ctrl_team_bytes(uint32_t n)
{ return (offload_ctrl_agree_chunk_in(n, 2u, 0u, 0u) + 63u) & ~63ull; }
static inline uint64_t offload_ctrl_stride(uint32_t world)
{ return (offload_ctrl_team_bytes(world) + 4095u) & ~4095ull; }
static inline uint64_t offload_ctrl_team_off(uint32_t world, uint32_t team)
{ return (uint64_t)team * offload_ctrl_stride(world); }
static inline uint64_t offload_ctrl_ready_in(uint32_t n, uint32_t slot, uint32_t src)
{ return ((uint64_t)slot * n + src) * 32u; }
static inline uint64_t offload_ctrl_done_in(uint32_t n, uint32_t slot, uint32_t src)
{ return (uint64_t)OFFLOAD_OP_WINDOW * n * 32u + ((uint64_t)slot * n + src) * 8u; }
static inline uint64_t offload_ctrl_count_in(uint32_t n, uint32_t slot, uint32_t src)
{ return (uint64_t)OFFLOAD_OP_WINDOW * n * 40u + ((uint64_t)slot * n + src) * 16u; }
static inline uint64_t offload_ctrl_sig_in(uint32_t n, uint32_t seq, uint32_t src)
{
	return (uint64_t)OFFLOAD_OP_WINDOW * n * 56u +
	       ((uint64_t)(seq % OFFLOAD_SIG_WINDOW) * n + src) * 32u;
}
static inline uint64_t offload_ctrl_agree_prop_in(uint32_t n, uint32_t src)
{ return (uint64_t)n * (OFFLOAD_OP_WINDOW * 56u + OFFLOAD_SIG_WINDOW * 32u) + src * 32ull; }
static inline uint64_t offload_ctrl_agree_dec_in(uint32_t n, uint32_t src)
{ return offload_ctrl_agree_prop_in(n, n) + src * 32ull; }
static inline uint64_t offload_ctrl_credit_in(uint32_t n, uint32_t slot, uint32_t dst)
{ return offload_ctrl_agree_prop_in(n, 2u * n) + ((uint64_t)slot * n + dst) * 8u; }
/* Source src's (team rank < OFFLOAD_EAGER_MAX_TEAM) eager slot of team t. */
static inline uint64_t offload_ctrl_eager_off(uint32_t world, uint32_t team, uint32_t src,
					      uint32_t slot)
{
	return OFFLOAD_MAX_TEAMS * offload_ctrl_stride(world) +
	       (((uint64_t)team * OFFLOAD_EAGER_MAX_TEAM + src) * OFFLOAD_EAGER_SLOTS + slot) *
	       sizeof(struct offload_eager_slot);
}
/* Bytes of one rank's control region; the *_in offsets are inside a team block of n. */
static inline uint64_t offload_ctrl_bytes(uint32_t world)
{ return offload_ctrl_eager_off(world, OFFLOAD_MAX_TEAMS, 0, 0); }

#define OFFLOAD_SIGNAL_OK    1ull
#define OFFLOAD_SIGNAL_ERROR ((1ull << 32) | 1ull)

/* One broadcast's or all-gather's counters on this rank, written into the command's aux
 * buffer (when it names one, 8-aligned) before the op's completion. */
struct offload_mcast_op_stats {
	uint64_t chunks_sent;       /* injected by this rank (once, whatever the group) */
	uint64_t bytes_injected;    /* bytes this rank put into the fabric */
	uint64_t chunks_received;   /* arrived by multicast and taken */
	uint64_t chunks_dropped;    /* never arrived (lost, overrun): read with RDMA READ */
	uint64_t chunks_duplicated; /* arrived again after the first copy */
	uint64_t refetched_bytes;   /* bytes of those reads */
};

/* Counters the firmware keeps per progress thread, in a host-readable window. */
struct offload_thread_stats {
	uint64_t ops_completed;
	uint64_t bytes_written;
	uint64_t writes;
	uint64_t signals;
	uint64_t reads;
	uint64_t errors;
	uint64_t progress_calls;
	uint64_t idle_calls;
	uint64_t failovers;         /* a peer's traffic moved to another rail */
	uint64_t resent_bytes;      /* data written again after a rail failed */
	uint64_t mcast_chunks_sent; /* multicast: chunks injected (once, whatever the group) */
	uint64_t mcast_bytes_sent;  /* bytes injected into the fabric */
	uint64_t mcast_chunks_recv; /* chunks that arrived and were placed */
	uint64_t mcast_dups;        /* chunks that arrived twice */
	uint64_t refetch_chunks;    /* chunks lost and fetched again with RDMA READ */
	uint64_t refetch_bytes;
};

_Static_assert(sizeof(struct offload_cmd) == 64, "command slot is 64 bytes");
_Static_assert(offsetof(struct offload_cmd, tag) == 4, "tag offset");
_Static_assert(offsetof(struct offload_cmd, count) == 24, "count offset");
_Static_assert(offsetof(struct offload_cmd, dst_len) == 40, "dst_len offset");
_Static_assert(offsetof(struct offload_cmd, root) == 60, "root offset");
_Static_assert(sizeof(struct offload_cqe) == 32, "completion record is 32 bytes");
_Static_assert(sizeof(struct offload_ring_hdr) == 256, "ring header is four cache lines");
_Static_assert(offsetof(struct offload_ring_hdr, sq_head) == 64, "sq_head on its own line");
_Static_assert(offsetof(struct offload_ring_hdr, failed_gen) == 4, "host-written line");
_Static_assert(offsetof(struct offload_ring_hdr, closed_off) == 20, "host-written line");
_Static_assert(offsetof(struct offload_ring_hdr, cq_tail) == 128, "cq_tail on its own line");
_Static_assert(offsetof(struct offload_ring_hdr, cq_head) == 192, "cq_head on its own line");
_Static_assert(sizeof(struct offload_peer) == 16, "peer entry");
_Static_assert(sizeof(struct offload_team_desc) == 16, "team desc header");
_Static_assert(sizeof(struct offload_ready) == 32, "ready descriptor");
_Static_assert(sizeof(struct offload_count) == 16, "count descriptor");
_Static_assert(sizeof(struct offload_sig) == 32, "op signature");
_Static_assert(offsetof(struct offload_sig, seq) == 24, "signature seq last");
_Static_assert(sizeof(struct offload_agree_args) == 32, "agreement arguments");
_Static_assert(sizeof(struct offload_agree_chunk) == 32, "agreement chunk");
_Static_assert(offsetof(struct offload_agree_chunk, epoch) == 24, "agreement chunk epoch last");
_Static_assert(sizeof(struct offload_agree_word) == 32, "agreement word");
_Static_assert(offsetof(struct offload_agree_word, epoch) == 24, "agreement epoch last");
_Static_assert(OFFLOAD_CTRL_ENTRY_BYTES == sizeof(struct offload_ready) * OFFLOAD_OP_WINDOW +
	       8 * OFFLOAD_OP_WINDOW + sizeof(struct offload_count) * OFFLOAD_OP_WINDOW +
	       sizeof(struct offload_sig) * OFFLOAD_SIG_WINDOW +
	       2 * sizeof(struct offload_agree_word) + 8 * OFFLOAD_EAGER_SLOTS,
	       "team control words per member");
_Static_assert(sizeof(struct offload_alltoallv_args) == 64, "alltoallv args header");
_Static_assert(offsetof(struct offload_alltoallv_args, nranks) == 32, "alltoallv nranks");
_Static_assert(sizeof(struct offload_thread_stats) == 128, "stats are two cache lines");
_Static_assert(sizeof(struct offload_mcast_op_stats) == 48, "per-op multicast counters");
_Static_assert(sizeof(struct offload_eager_slot) == 64 + OFFLOAD_EAGER_BYTES, "eager slot");
_Static_assert(offsetof(struct offload_eager_slot, sig.seq) == 24, "eager seq word last");

/*
 * ---- FlexIO hardware binding (dpa_firmware/hal/flexio/, host/src/flexio/) ----
 *
 * What the FlexIO host backend writes into DPA heap memory for each progress thread and
 * the DPA event handler reads. The emulator does not use any of it. *_daddr are DPA heap
 * addresses, haddr host virtual addresses reached through the window. Queue contents and
 * doorbell records are big endian (mlx5 layout); everything in these structs is native.
 */
#define OFFLOAD_FLEXIO_CTX_MAGIC      0x584c464fu  /* "OFLX" */
#define OFFLOAD_FLEXIO_CTX_VERSION    3u       /* 3: hal_bytes, tables sized by world size */
#define OFFLOAD_FLEXIO_SQ_SLOT_BYTES  16u      /* per SQ WQE basic block: wr_id bookkeeping */
#define OFFLOAD_FLEXIO_MAX_INLINE     64u      /* bytes dpa_hal_rdma_write_inline() carries */
#define OFFLOAD_FLEXIO_MAX_RAILS      8u       /* ports of the device used as rails */
#define OFFLOAD_FLEXIO_PEER_HOST      0xffffffffu
/* QP user_index (24 bits, as rdma-core's mlx5 and FlexIO read a CQE's srqn_uidx): by rank,
 * UIDX(rail, world rank); the loopback UIDX_HOST, the twin of our own QP on rail r HOST+1+r */
#define OFFLOAD_FLEXIO_UIDX(rail, peer) ((uint32_t)(rail) * OFFLOAD_RANKS_LIMIT + (uint32_t)(peer))
#define OFFLOAD_FLEXIO_UIDX_HOST      (OFFLOAD_FLEXIO_MAX_RAILS * OFFLOAD_RANKS_LIMIT)

/* Windows, in the order of enum dpa_hal_window. */
#define OFFLOAD_FLEXIO_WIN_RING  0u
#define OFFLOAD_FLEXIO_WIN_STATS 1u
/* 2 is unused: command arguments are reached with dpa_hal_aux_ptr() */
#define OFFLOAD_FLEXIO_WIN_CTRL  3u
#define OFFLOAD_FLEXIO_NUM_WINS  4u

/* dpa_offload_query_rpc(what) answers these. */
#define OFFLOAD_FLEXIO_QUERY_ABI        0u
#define OFFLOAD_FLEXIO_QUERY_STATE_SIZE 1u
#define OFFLOAD_FLEXIO_QUERY_HAL_BYTES  2u
#define OFFLOAD_FLEXIO_QUERY_CTX        3u  /* OFFLOAD_FLEXIO_CTX_VERSION of the image */
/* `what` bits 8-24, 25-31, 32-63: QUERY_STATE's world, threads, pool; QUERY_HAL's world, rails */
#define OFFLOAD_FLEXIO_QUERY_STATE(world, threads, pool) \
	(OFFLOAD_FLEXIO_QUERY_STATE_SIZE | ((uint64_t)(world) & 0x1ffffu) << 8 | \
	 ((uint64_t)(threads) & 0x7fu) << 25 | (uint64_t)(uint32_t)(pool) << 32)
#define OFFLOAD_FLEXIO_QUERY_HAL(world, rails) (OFFLOAD_FLEXIO_QUERY_HAL_BYTES ^ \
	OFFLOAD_FLEXIO_QUERY_STATE_SIZE ^ OFFLOAD_FLEXIO_QUERY_STATE(world, rails, 0))
#define OFFLOAD_FLEXIO_QUERY_WORLD(what)   ((uint32_t)((what) >> 8) & 0x1ffffu)
#define OFFLOAD_FLEXIO_QUERY_THREADS(what) ((uint32_t)((what) >> 25) & 0x7fu)
#define OFFLOAD_FLEXIO_QUERY_POOL(what)    ((uint32_t)((what) >> 32))

struct offload_flexio_cq {
	uint64_t ring_daddr;    /* 1 << log_depth CQEs of 64 bytes, owner bits preset to 1 */
	uint64_t dbr_daddr;     /* doorbell record: consumer index */
	uint32_t cqn;
	uint32_t log_depth;
};

struct offload_flexio_qp {
	uint64_t sq_daddr;      /* 1 << log_sq_depth basic blocks of 64 bytes */
	uint64_t rq_daddr;      /* 1 << log_rq_depth receive WQEs of 16 bytes, posted by the host */
	uint64_t dbr_daddr;     /* [0] RQ counter, [1] SQ counter */
	uint64_t slots_daddr;   /* OFFLOAD_FLEXIO_SQ_SLOT_BYTES << log_sq_depth bytes, zeroed */
	uint32_t qpn;
	uint32_t log_sq_depth;
	uint32_t log_rq_depth;
	uint32_t peer;          /* world rank at the other end, or OFFLOAD_FLEXIO_PEER_HOST */
	uint32_t rail;          /* the port it goes out on (0 for the host loopback) */
	uint32_t resv;
};

struct offload_flexio_window {
	uint64_t haddr;         /* inside the arena */
	uint64_t len;
};

struct offload_flexio_thread_ctx {
	uint32_t magic;
	uint32_t version;
	uint32_t thread_index;
	uint32_t num_threads;
	uint32_t world_rank;
	uint32_t world_size;      /* qps_daddr holds a QP per rail and world rank, self included */
	uint32_t window_id;       /* flexio_window_get_id() */
	uint32_t window_mkey;     /* the arena's registration: ring, stats and control words */
	uint64_t state_daddr;     /* engine state, dpa_engine_state_size() bytes */
	uint64_t hal_daddr;       /* hal_bytes, zeroed: HAL runtime state and its tables */
	uint64_t qps_daddr;       /* struct offload_flexio_qp[num_rails][world_size + 1]; the
				   * last column is the twin our own rank's QP is paired with */
	uint64_t board_daddr;     /* uint32_t[num_threads], zeroed: 1 while that thread is parked */
	uint64_t scratch_daddr;   /* 8 bytes of this thread's: fetch-add results land here */
	uint32_t scratch_lkey;
	uint32_t tick_ns;         /* nanoseconds per __dpa_thread_time() tick */
	uint32_t max_outstanding; /* signaled sends in flight per thread (CQ room) */
	uint32_t stop;            /* host sets it before teardown: finish, do not re-arm */
	struct offload_flexio_window win[OFFLOAD_FLEXIO_NUM_WINS];
	struct offload_flexio_cq cq;       /* completions of all this thread's QPs, both directions */
	struct offload_flexio_cq wake_cq;  /* siblings' notify() triggers it */
	struct offload_flexio_qp host_qp;  /* loopback to the host: doorbells in, host_notify out */
	uint32_t wake_cqn[OFFLOAD_MAX_THREADS];
	uint32_t num_rails;       /* 1..OFFLOAD_FLEXIO_MAX_RAILS */
	uint32_t hal_bytes;       /* at hal_daddr: what QUERY_HAL(world_size, num_rails) said */
	/* The window arena: one host registration (window_mkey) holding the ring, the stats and
	 * the control words, so that one window configuration reaches all three at once. */
	uint64_t arena_haddr;
	uint64_t arena_len;
};

_Static_assert(OFFLOAD_FLEXIO_UIDX_HOST + 1 + OFFLOAD_FLEXIO_MAX_RAILS <= 1u << 24, "uidx bits");
_Static_assert(sizeof(struct offload_flexio_cq) == 24, "flexio cq descriptor");
_Static_assert(sizeof(struct offload_flexio_qp) == 56, "flexio qp descriptor");
_Static_assert(sizeof(struct offload_flexio_window) == 16, "flexio window");
_Static_assert(offsetof(struct offload_flexio_thread_ctx, state_daddr) == 32, "ctx state_daddr");
_Static_assert(offsetof(struct offload_flexio_thread_ctx, stop) == 84, "ctx stop");
_Static_assert(offsetof(struct offload_flexio_thread_ctx, win) == 88, "ctx windows");
_Static_assert(offsetof(struct offload_flexio_thread_ctx, host_qp) == 200, "ctx host qp");
_Static_assert(offsetof(struct offload_flexio_thread_ctx, wake_cqn) == 256, "ctx wake cqns");
_Static_assert(offsetof(struct offload_flexio_thread_ctx, arena_haddr) ==
	       264 + 4 * OFFLOAD_MAX_THREADS, "ctx arena");
_Static_assert(sizeof(struct offload_flexio_thread_ctx) == 280 + 4 * OFFLOAD_MAX_THREADS,
	       "flexio thread context");

#endif /* OFFLOAD_ABI_H */

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulator: a third binding of dpa_hal.h. Every rank's firmware state, DPA threads,
 * NICs and the fabric live in one process and run on one thread, driven by a
 * discrete-event loop in virtual time (integer picoseconds). A seeded RNG decides every
 * choice the real world makes at random: which of two simultaneous events goes first
 * (so which DPA thread runs next), latency jitter, multicast loss, faults.
 *
 * Like the emulator, it includes only the public headers (dpa_hal.h, dpa_engine.h,
 * offload_abi.h), never the firmware's internals: the firmware sources are compiled
 * unchanged (tests/test_sim_purity.py). Nothing here assumes a world size: every table is
 * sized from the job.
 */
#ifndef SIM_H
#define SIM_H

#include <stdint.h>
#include <stdio.h>

#include "dpa_engine.h"
#include "dpa_hal.h"
#include "offload_abi.h"

/* ---- the cost model: every parameter named, integer units (sim_model.c) ---- */
struct sim_model {
	uint64_t link_gbps;        /* link signalling rate, Gb/s */
	uint64_t link_mtu;         /* bytes of payload per packet */
	uint64_t link_hdr_bytes;   /* per packet on the wire (LRH+BTH+ICRC+VCRC) */
	uint64_t link_reth_bytes;  /* once per message (RETH) */
	uint64_t link_cable_ns;
	uint64_t switch_latency_ns;
	uint64_t nic_tx_ns;
	uint64_t nic_rx_ns;
	uint64_t nic_msg_rate_m;   /* messages per microsecond x 1e6 (M msg/s) */
	uint64_t nic_wqe_ns;
	uint64_t nic_cqe_ns;
	uint64_t nic_atomic_ns;
	uint64_t nic_ack_bytes;
	uint64_t nic_sq_depth;     /* work requests in flight per DPA thread */
	uint64_t pcie_gbps;        /* effective PCIe payload rate per direction, Gb/s */
	uint64_t pcie_rtt_ns;
	uint64_t pcie_oneway_ns;
	uint64_t dpa_pass_ns;
	uint64_t dpa_post_ns;
	uint64_t dpa_cqe_ns;
	uint64_t dpa_check_ns;
	uint64_t dpa_win_ns;
	uint64_t dpa_ring_ns;       /* first ring touch of a pass: a read over PCIe */
	uint64_t dpa_aux_ns;        /* reaching a command's host memory (aux_ptr) */
	uint64_t dpa_mcast_chunk_ps; /* per multicast chunk polled (picoseconds) */
	uint64_t dpa_wake_ns;
	uint64_t dpa_notify_ns;
	uint64_t dpa_clock_ns;
	uint64_t dpa_idle_passes;    /* idle passes a thread spins before it parks */
	uint64_t host_post_ns;
	uint64_t host_notice_ns;
	uint64_t mcast_rq_depth;
	uint64_t mcast_event_every;
	uint64_t fault_retry_ns;
	uint64_t fault_detect_ns;
	uint64_t topo_hosts_per_leaf; /* 0: one switch; else a two-level fat tree */
	uint64_t topo_uplinks;        /* spines (leaf uplinks) of the fat tree */
	uint64_t spin_react_event;    /* 1: a spinning thread reacts at the event itself */
	uint64_t jitter_ns;           /* latency jitter bound per message (QP order kept) */
};

struct sim_param {
	const char *name;
	uint32_t offset;   /* in struct sim_model */
	uint64_t def;
	const char *unit;
};
extern const struct sim_param sim_params[];
extern const uint32_t sim_nparams;
void sim_model_defaults(struct sim_model *m);
/* name=value; returns 0 or -1 (unknown name, bad number). */
int sim_model_set(struct sim_model *m, const char *name, const char *value);

/* ---- RNG: xoshiro256**, one stream per purpose so draws in one leave the others be ---- */
struct sim_rng {
	uint64_t s[4];
};
enum sim_stream { SIM_RNG_SCHED, SIM_RNG_NET, SIM_RNG_FAULT, SIM_RNG_LOSS, SIM_RNG_WORK,
		  SIM_RNG_STREAMS };
void sim_rng_seed(struct sim_rng *r, uint64_t seed, uint64_t stream);
uint64_t sim_rng_next(struct sim_rng *r);
uint64_t sim_rng_below(struct sim_rng *r, uint64_t bound);  /* [0, bound), bound > 0 */

/* ---- events ---- */
enum sim_ev_type {
	SIM_EV_RUN = 1,      /* a pass of (rank, thread) */
	SIM_EV_TIMER,        /* a firmware timer (dpa_engine_wake_at) */
	SIM_EV_ARRIVE,       /* a message's last byte reached its target (or a read request) */
	SIM_EV_CQE,          /* a completion lands in a thread's CQ */
	SIM_EV_MC_ARRIVE,    /* a multicast chunk reaches one member */
	SIM_EV_HOST,         /* the host of a rank notices completions */
	SIM_EV_DOORBELL,     /* the host's doorbell reaches the DPA */
	SIM_EV_FAULT,        /* a scheduled fault */
	SIM_EV_POST,         /* the driver's host posts its next ops */
};

struct sim_event {
	uint64_t t;        /* ps */
	uint64_t key;      /* drawn from the sched stream: ties go by it */
	uint64_t seq;      /* global: order is total */
	uint32_t type, rank, thr, aux;
	void *ptr;         /* message, or NULL */
};

/* The heap orders 16-byte entries (time, a 32-bit draw of the sched stream, the event's
 * slot in the pool), four children to a cache line; the events themselves stay put in
 * the pool. A 1024-rank all-to-all holds millions of events at once: the heap's walks
 * touch a line per level instead of three. Entries with equal time and draw go by slot
 * (deterministic: slots are reused in LIFO order). */
struct sim_hent {
	uint64_t t;
	uint32_t key, slot;
};

struct sim_heap {
	struct sim_hent *h;       /* entry k at h[k + 3]: children of k share a line */
	uint64_t n, cap;
	struct sim_event *pool;   /* [pool_cap] */
	uint32_t *free;           /* free slots, a stack */
	uint64_t pool_cap, nfree;
};

/* ---- memory registrations (by key, never by address: addresses vary with ASLR) ---- */
struct sim_mr {
	uint64_t addr, len;
	uint32_t access, key, valid, phantom;
};

struct sim_mr_table {
	struct sim_mr *mr;
	uint32_t n, cap;
};

/* ---- messages on the wire ---- */
enum sim_msg_kind { SIM_MSG_WRITE, SIM_MSG_WRITE_SG, SIM_MSG_INLINE, SIM_MSG_ATOMIC,
		    SIM_MSG_READ, SIM_MSG_READ_RESP, SIM_MSG_MCAST };

struct sim_msg {
	uint32_t kind, src, thr, dst, rail, rkey, lkey, nsge;
	uint64_t laddr, raddr, len, value, wr_id;
	struct dpa_hal_sge sge[DPA_HAL_MAX_SGE];
	uint8_t data[64];
	uint32_t group, imm, refs;  /* multicast: members still to reach */
	uint32_t phantom;           /* the source is phantom: lengths only */
	uint64_t posted;            /* ps */
};

/* ---- the DPA runtime: one struct dpa_hal per (rank, thread) ---- */
struct sim_world;
struct sim_rank;

struct dpa_hal {
	struct sim_world *w;
	struct sim_rank *r;
	uint32_t index;
	uint32_t run_queued;       /* a RUN event is in the heap */
	uint64_t clock;            /* ps, inside the running pass */
	uint64_t busy_until;       /* end of the last pass */
	uint64_t spin_until;       /* spinning until then, parked after */
	uint64_t timer_at;         /* ps of a queued TIMER, 0: none */
	uint8_t *rail;             /* [world size] */
	uint64_t *last_cqe;        /* [world size * rails]: a queue pair completes in order */
	struct dpa_hal_cqe *cq;    /* [sq_depth] ring */
	uint32_t cq_head, cq_tail, outstanding, ring_touched, aux_touched, remote_woken;
	uint32_t slow;             /* a slow thread (fault): its costs times this, 0 = 1 */
	uint64_t busy_ps, passes, idle_passes, posts, cqes;
};

struct sim_mc_rx {           /* one member's receive side of one group */
	uint32_t joined, seq8, nregions, pending;
	struct dpa_hal_mcast_region *regions;  /* [cap], grown by a post that needs more */
	uint32_t cap;
	struct dpa_hal_mcast_cqe *cq;   /* [mcast_rq_depth] */
	uint32_t cq_head, cq_tail, since_wake;
};

struct sim_port {            /* (rank, rail): the NIC's transmit side and its link */
	uint64_t up_busy, down_busy;   /* ps: uplink (tx) and downlink (rx) reserved until */
	uint32_t down;                 /* 1: failed */
	uint64_t bytes_tx, bytes_rx, msgs;
};

struct sim_rank {
	uint32_t rank, alive, nthreads;
	void *state;                 /* firmware state, state_bytes (an anonymous mapping) */
	uint64_t state_bytes;
	uint8_t *ring;               /* struct offload_ring_hdr, SQ, CQ */
	uint64_t ring_len;
	struct offload_thread_stats *stats;
	uint8_t *ctrl;               /* offload_ctrl_bytes(world size), MAP_NORESERVE */
	uint32_t ctrl_key;
	struct sim_mr_table mrs;
	struct dpa_hal *thr;         /* [nthreads] */
	struct sim_port *port;       /* [rails] */
	struct sim_mc_rx mc[OFFLOAD_MAX_TEAMS];
	uint64_t *last_arrive;       /* [world * rails]: QP order kept under jitter */
	void *host;                  /* the driver's per-rank host state */
};

/* ---- the fabric: links beyond the NIC ports (fat tree only) ---- */
struct sim_fabric {
	uint32_t leaves, spines;
	uint64_t *up_busy;    /* [leaves * spines]: leaf -> spine */
	uint64_t *down_busy;  /* [spines * leaves]: spine -> leaf */
	uint64_t *up_bytes, *down_bytes;
};

enum sim_payload { SIM_REAL = 0, SIM_PHANTOM = 1 };

struct sim_counters {
	uint64_t events, passes, msgs, bytes, mc_chunks, mc_lost, rescues;
};

struct sim_world {
	struct sim_model model;
	struct sim_rng rng[SIM_RNG_STREAMS];
	uint64_t now;                /* ps */
	uint64_t seq;
	struct sim_heap heap;
	uint32_t size, nthreads, rails, payload;
	uint32_t remote_wake_all;    /* 1: a remote write wakes every thread (emulator) */
	uint32_t strict_late;        /* no fatal fault: a write into released memory is a bug */
	uint64_t mcast_loss_ppm, mcast_reorder_ppm, mcast_reorder_ns;
	struct sim_rank *ranks;      /* [size] */
	struct sim_fabric fab;
	struct sim_counters cnt;
	/* canonical event stream: written to events (if set), always hashed */
	FILE *events;
	uint64_t hash;
	/* Chrome trace of passes and port activity (if set) */
	FILE *trace;
	uint32_t trace_first;
	uint64_t trace_from;         /* ps: only activity after this */
	/* the driver's hooks */
	void (*on_host)(struct sim_world *w, struct sim_rank *r);
	void (*on_post)(struct sim_world *w, struct sim_rank *r, uint32_t aux);
	void (*on_fault)(struct sim_world *w, uint32_t idx);
	void (*on_violation)(struct sim_world *w, const char *what);
	void *driver;
	char violation[256];
	uint32_t failed;             /* a violation was reported */
};

/* sim_core.c */
int sim_world_init(struct sim_world *w, uint32_t size, uint32_t nthreads, uint32_t rails,
		   const struct dpa_engine_params *params, uint64_t seed);
void sim_world_free(struct sim_world *w);
/* Bytes sim_world_init allocates for each rank of a world of `size` beside its engine
 * state and control region: struct sim_rank, its threads, ports and per-peer NIC tables. */
uint64_t sim_rank_tables_bytes(uint32_t size, uint32_t nthreads, uint32_t rails,
			       const struct sim_model *m);
/* The length of a rank's engine-state mapping for params (0: the firmware refuses them). */
uint64_t sim_state_bytes(const struct dpa_engine_params *p);
void sim_schedule(struct sim_world *w, uint64_t t, uint32_t type, uint32_t rank, uint32_t thr,
		  uint32_t aux, void *ptr);
/* Run until the heap is empty or stop() says so; returns events processed. */
uint64_t sim_run(struct sim_world *w, int (*stop)(struct sim_world *w), uint64_t max_ps);
void sim_wake(struct sim_world *w, struct sim_rank *r, uint32_t thr, uint64_t at);
void sim_wake_all(struct sim_world *w, struct sim_rank *r, uint64_t at);
void sim_log(struct sim_world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sim_violation(struct sim_world *w, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void sim_trace_span(struct sim_world *w, uint32_t pid, uint32_t tid, const char *name,
		    uint64_t from, uint64_t to);

/* sim_mr.c */
uint32_t sim_mr_reg(struct sim_world *w, struct sim_rank *r, uint64_t addr, uint64_t len,
		    uint32_t access, uint32_t phantom);
void sim_mr_dereg(struct sim_rank *r, uint32_t key);
const struct sim_mr *sim_mr_check(const struct sim_rank *r, uint32_t key, uint64_t addr,
				  uint64_t len, uint32_t access);
/* key named a registration that was released (the host reaped its op): a late write. */
int sim_mr_released(const struct sim_rank *r, uint32_t key);

/* sim_nic.c */
void sim_nic_arrive(struct sim_world *w, struct sim_msg *m);
void sim_nic_cqe(struct sim_world *w, struct sim_rank *r, uint32_t thr, struct sim_msg *m,
		 int32_t status);
/* Schedule m's completion at t or, to keep its queue pair's completions in order, just
 * after the previous one. */
void sim_cqe_at(struct sim_world *w, struct sim_msg *m, uint64_t t, int32_t status);
uint64_t sim_wire_ps(const struct sim_model *m, uint64_t bytes);
uint64_t sim_one_way_ps(const struct sim_world *w, uint32_t src, uint32_t dst);
/* Reserve the path of a message of `bytes` leaving src's port at or after t: returns the
 * arrival time of its last byte at dst. */
uint64_t sim_reserve(struct sim_world *w, uint32_t src, uint32_t dst, uint32_t rail,
		     uint64_t t, uint64_t bytes, uint64_t *tx_end);
void sim_port_down(struct sim_world *w, uint32_t rank, uint32_t rail);

/* sim_mcast.c */
void sim_mc_arrive(struct sim_world *w, struct sim_rank *r, struct sim_msg *m);

#define SIM_PS(ns) ((uint64_t)(ns) * 1000u)

/* Charge ps of work to the running pass (a slow thread pays its factor). */
static inline void sim_cost(struct dpa_hal *hal, uint64_t ps)
{
	hal->clock += hal->slow ? ps * hal->slow : ps;
}

#endif /* SIM_H */

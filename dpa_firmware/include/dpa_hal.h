/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The few hardware primitives the firmware uses. Two bindings implement it: emulator/
 * (threads, shared memory and process_vm_writev on an ordinary host) and
 * dpa_firmware/hal/flexio/ (FlexIO device API on a BlueField-3 DPA). The firmware sees
 * only this header, so it is the same source in both worlds.
 *
 * Model (FlexIO / DOCA DPA): each progress thread owns a send queue per peer and one
 * completion queue; work is posted, then its completion is polled. A post may complete
 * immediately (the emulator copies synchronously) but the firmware must not assume so.
 * Functions return 0 or a negative errno; completions carry an enum offload_status.
 * A post returns DPA_HAL_EAGAIN when the queue is full: poll completions, try again later.
 */
#ifndef DPA_HAL_H
#define DPA_HAL_H

#include <stdint.h>

struct dpa_hal;   /* one per progress thread; opaque to the firmware */

#define DPA_HAL_EAGAIN (-11)
#define DPA_HAL_EINVAL (-22)      /* errno values, named: the firmware has no errno.h */
#define DPA_HAL_EOPNOTSUPP (-95)

struct dpa_hal_cqe {
	uint64_t wr_id;
	int32_t status;   /* OFFLOAD_OK or an error status (e.g. OFFLOAD_ERR_REMOTE_ACCESS) */
	uint32_t bytes;
	uint32_t rail;    /* the rail the work was posted on */
	uint32_t resv;
};

/* Host-memory windows the host set up for this DPA process. (2 was the unchecked aux
 * window: command arguments are reached through dpa_hal_aux_ptr() now.) */
enum dpa_hal_window {
	DPA_HAL_WIN_RING = 0,   /* struct offload_ring_hdr, then the SQ, then the CQ */
	DPA_HAL_WIN_STATS = 1,  /* struct offload_thread_stats[num_threads] */
	DPA_HAL_WIN_CTRL = 3,   /* this rank's struct offload_ctrl, written by peers */
};

uint32_t dpa_hal_thread_index(const struct dpa_hal *hal);
uint32_t dpa_hal_num_threads(const struct dpa_hal *hal);

/* A device-side pointer to [offset, offset+len) of a window, or NULL if out of range. */
void *dpa_hal_window_ptr(struct dpa_hal *hal, enum dpa_hal_window win,
			 uint64_t offset, uint64_t len);

/*
 * Host memory a command names (aux_addr: team descriptors, all-to-all-v arguments, row
 * lists), which the host registered under key for local read and write. A device pointer
 * to [addr, addr+len), or NULL unless key covers the whole range with those rights: a
 * malformed command gets an error completion, not a fault. The pointer is valid on the
 * calling thread only, and only until its next dpa_hal_aux_ptr() with another key or the
 * end of the pass (a DPA thread reaches it through a window configured with that key):
 * keep the address, not the pointer, across passes and threads.
 */
void *dpa_hal_aux_ptr(struct dpa_hal *hal, uint32_t key, uint64_t addr, uint64_t len);

/* RDMA WRITE/READ between local memory (lkey) and a peer's registered memory (rkey). */
int dpa_hal_rdma_write(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		       uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id);
int dpa_hal_rdma_read(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		      uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id);
/* One RDMA WRITE gathering up to DPA_HAL_MAX_SGE local pieces (all under lkey) into one
 * contiguous remote range, as a send WR with a scatter-gather list does. */
#define DPA_HAL_MAX_SGE 16
struct dpa_hal_sge {
	uint64_t addr;
	uint64_t len;
};
int dpa_hal_rdma_write_sg(struct dpa_hal *hal, uint32_t peer, const struct dpa_hal_sge *sge,
			  uint32_t nsge, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t wr_id);
/* Small inline write (descriptors): data is copied at post time, and the write carries an
 * immediate, so it wakes the peer's progress threads like a signal does. */
int dpa_hal_rdma_write_inline(struct dpa_hal *hal, uint32_t peer, const void *data,
			      uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id);
/* Remote 64-bit atomic add on a signal word; wakes the peer's progress threads. */
int dpa_hal_rdma_signal_add(struct dpa_hal *hal, uint32_t peer, uint64_t raddr,
			    uint32_t rkey, uint64_t value, uint64_t wr_id);

/*
 * Rails: each rank has dpa_hal_num_rails() ports, and a thread's queues to a peer exist on
 * every rail. Work goes out on the rail set for that peer (rail 0 until set). When a rail
 * fails (our port or the peer's), work posted on it completes with OFFLOAD_ERR_LINK_DOWN
 * and nothing more is delivered on it: the firmware moves to another rail and resends.
 */
uint32_t dpa_hal_num_rails(const struct dpa_hal *hal);
void dpa_hal_set_rail(struct dpa_hal *hal, uint32_t peer, uint32_t rail);

/*
 * UD multicast. Every team has a group (group id = team id). A send injects one chunk of
 * at most dpa_hal_mtu() bytes once, whatever the group's size, with a 32-bit immediate
 * {op_seq:8, chunk_id:24}; it completes in dpa_hal_poll_cq() when the chunk left, not when
 * anyone got it. DPA_HAL_EAGAIN: the send queue is full (the group's receive credits are
 * used up), try again later. The sender does not receive its own chunks. A binding may
 * still read the source after the send completed (the emulator hands members a reference
 * to it): the firmware keeps a multicast source unchanged until every member acknowledged
 * it, or withdrew it (OFFLOAD_READY_WITHDRAWN) and receivers check for that after reading.
 *
 * Receiving: the firmware posts the regions where one op's chunks land, placed by chunk id
 * (as a write with immediate is placed): a chunk whose immediate carries seq8 and an id in
 * [first_chunk, first_chunk + ceil(len / mtu)) lands at addr + (id - first_chunk) * mtu.
 * Posting replaces the group's previous regions (one op at a time per group). A chunk that
 * matches no posted region (another op's, or nothing posted), that arrives while this
 * member's receive queue is overrun, or that the fabric loses, is dropped: placed by id,
 * the firmware only ever sees chunks that arrived and were placed, possibly twice or out
 * of order (staged, below: every chunk of the group that found a slot).
 * dpa_hal_mcast_poll() returns them; only one thread polls a group at a time.
 */
#define DPA_HAL_MCAST_IMM(seq8, chunk) ((((uint32_t)(seq8) & 0xffu) << 24) | \
					 ((uint32_t)(chunk) & 0xffffffu))
/* A post passes at most one region per member of the group's team, so never more than the
 * job's world size: bindings size their region tables by that. */

struct dpa_hal_mcast_region {
	uint64_t addr;
	uint64_t len;
	uint32_t key;           /* this rank's registration of [addr, addr+len), local write */
	uint32_t first_chunk;
};

struct dpa_hal_mcast_cqe {
	uint32_t imm;
	uint32_t len;
	uint32_t slot;          /* staged receive only: the slot holding the chunk */
};

/*
 * Staged receive, the UD fallback: a NIC that cannot place a chunk by its id (a UD QP fills
 * its posted receive buffers in arrival order) has dpa_hal_mcast_slots() > 0 staging slots
 * of one MTU per group, in memory of its own. Posting regions then only arms the group
 * (n = 0 disarms); each chunk of the group lands whole in a free slot, whatever its
 * immediate, and its completion names the slot. The slot is the firmware's until it
 * either copies it out, dpa_hal_mcast_slot_copy() (at most the chunk's len bytes, to our
 * registered memory, completing in dpa_hal_poll_cq() as a write does, a bad destination
 * as an error completion), or drops it, dpa_hal_mcast_slot_free(). A copy returns 0 once
 * posted (the slot goes back to the NIC when the copy completed: at once in the
 * emulator), DPA_HAL_EAGAIN when the completion queue is full and -EINVAL for a slot that
 * is not the firmware's or a len past the chunk; the slot stays the firmware's on both.
 * A chunk that finds no free slot is dropped. 0 slots: chunks are placed by id (above).
 */
uint32_t dpa_hal_mcast_slots(const struct dpa_hal *hal);
int dpa_hal_mcast_slot_copy(struct dpa_hal *hal, uint32_t group, uint32_t slot, uint64_t addr,
			    uint32_t key, uint32_t len, uint64_t wr_id);
int dpa_hal_mcast_slot_free(struct dpa_hal *hal, uint32_t group, uint32_t slot);

uint32_t dpa_hal_mtu(const struct dpa_hal *hal);
int dpa_hal_mcast_send(struct dpa_hal *hal, uint32_t group, uint64_t laddr, uint32_t lkey,
		       uint32_t len, uint32_t imm, uint64_t wr_id);
int dpa_hal_mcast_post(struct dpa_hal *hal, uint32_t group, uint32_t seq8,
		       const struct dpa_hal_mcast_region *regions, uint32_t n);
int dpa_hal_mcast_poll(struct dpa_hal *hal, uint32_t group, struct dpa_hal_mcast_cqe *out,
		       int max);
/* Leave the group (its team was destroyed): this member no longer holds senders back by
 * its receive credits, and a later post or poll joins afresh. Nothing may be posted. */
void dpa_hal_mcast_leave(struct dpa_hal *hal, uint32_t group);

/* Poll up to max completions of this thread's posted work; returns how many. */
int dpa_hal_poll_cq(struct dpa_hal *hal, struct dpa_hal_cqe *out, int max);

/*
 * Scheduling. The runtime calls dpa_progress() while there is work and parks the thread
 * when a pass finds none, until a doorbell, a remote signal or notify() (on FlexIO: a CQ
 * event) arrives. notify() wakes sibling threads; host_notify() wakes host threads
 * waiting on the completion ring.
 */
void dpa_hal_notify(struct dpa_hal *hal);
void dpa_hal_host_notify(struct dpa_hal *hal);
uint64_t dpa_hal_time_ns(struct dpa_hal *hal);

#endif /* DPA_HAL_H */

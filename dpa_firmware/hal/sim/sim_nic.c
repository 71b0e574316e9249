/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NICs and the fabric. A message reserves its path when posted: the sender's uplink, in
 * a fat tree the leaf-to-spine and spine-to-leaf links, and the receiver's downlink, each
 * an output-queued FIFO with cut-through (a link starts forwarding after the previous
 * hop's latency and finishes no earlier than the previous one finished). Uncontended
 * that is latency + wire time; under contention, FIFO per link in post order. Messages
 * of one queue pair land in order (jitter is clamped to keep it so), as the firmware
 * relies on. At arrival the target's registration is checked and the bytes are placed
 * (real payload) or only counted (phantom); an RDMA write's completion comes back with
 * its ACK.
 */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

uint64_t sim_wire_ps(const struct sim_model *m, uint64_t bytes)
{
	uint64_t mtu = m->link_mtu ? m->link_mtu : 4096;
	uint64_t pkts = bytes ? (bytes + mtu - 1) / mtu : 1;
	uint64_t wire = bytes + pkts * m->link_hdr_bytes + m->link_reth_bytes;
	uint64_t ps = (wire * 8000u + m->link_gbps - 1) / m->link_gbps;
	uint64_t floor = m->nic_msg_rate_m ? 1000000u / m->nic_msg_rate_m : 0;

	return ps > floor ? ps : floor;
}

static uint64_t pcie_ps(const struct sim_model *m, uint64_t bytes)
{
	return (bytes * 8000u + m->pcie_gbps - 1) / m->pcie_gbps;
}

static int cross_leaf(const struct sim_world *w, uint32_t a, uint32_t b)
{
	uint64_t k = w->model.topo_hosts_per_leaf;

	return k && a / k != b / k;
}

/* Latency from the start of transmission to the last byte's arrival, without wire time
 * and without PCIe: NIC, cables, switches. */
uint64_t sim_one_way_ps(const struct sim_world *w, uint32_t src, uint32_t dst)
{
	const struct sim_model *m = &w->model;
	uint64_t hop = m->link_cable_ns + m->switch_latency_ns;
	uint64_t ns = m->nic_tx_ns + hop + m->link_cable_ns + m->nic_rx_ns;

	if (cross_leaf(w, src, dst))
		ns += 2 * hop;
	return SIM_PS(ns);
}

struct hop {
	uint64_t *busy, *bytes, lat;
};

uint64_t sim_reserve(struct sim_world *w, uint32_t src, uint32_t dst, uint32_t rail,
		     uint64_t t, uint64_t bytes, uint64_t *tx_end)
{
	const struct sim_model *m = &w->model;
	struct sim_port *sp = &w->ranks[src].port[rail], *dp = &w->ranks[dst].port[rail];
	uint64_t ser = sim_wire_ps(m, bytes), hopl = SIM_PS(m->link_cable_ns + m->switch_latency_ns);
	struct hop hops[4];
	uint32_t nh = 0;
	uint64_t start, end;

	hops[nh++] = (struct hop){ &sp->up_busy, &sp->bytes_tx, SIM_PS(m->nic_tx_ns) + hopl };
	if (cross_leaf(w, src, dst)) {
		struct sim_fabric *f = &w->fab;
		uint32_t ls = src / (uint32_t)m->topo_hosts_per_leaf;
		uint32_t ld = dst / (uint32_t)m->topo_hosts_per_leaf;
		uint32_t spine = dst % f->spines;  /* d-mod-k */

		hops[nh++] = (struct hop){ &f->up_busy[ls * f->spines + spine],
					   &f->up_bytes[ls * f->spines + spine], hopl };
		hops[nh++] = (struct hop){ &f->down_busy[spine * f->leaves + ld],
					   &f->down_bytes[spine * f->leaves + ld], hopl };
	}
	hops[nh++] = (struct hop){ &dp->down_busy, &dp->bytes_rx,
				   SIM_PS(m->link_cable_ns + m->nic_rx_ns) };
	start = t > *hops[0].busy ? t : *hops[0].busy;
	end = start + ser;
	*hops[0].busy = end;
	*hops[0].bytes += bytes;
	*tx_end = end;
	for (uint32_t i = 1; i < nh; i++) {
		uint64_t s = start + hops[i - 1].lat, e;

		if (s < *hops[i].busy)
			s = *hops[i].busy;
		e = s + ser;
		if (e < end + hops[i - 1].lat)
			e = end + hops[i - 1].lat;
		*hops[i].busy = e;
		*hops[i].bytes += bytes;
		start = s;
		end = e;
	}
	sim_trace_span(w, src, 100 + rail, "tx", *tx_end - ser, *tx_end);
	sp->msgs++;
	return end + hops[nh - 1].lat;
}

void sim_port_down(struct sim_world *w, uint32_t rank, uint32_t rail)
{
	if (rank < w->size && rail < w->rails)
		w->ranks[rank].port[rail].down = 1;
}

void sim_cqe_at(struct sim_world *w, struct sim_msg *m, uint64_t t, int32_t status)
{
	struct dpa_hal *h = &w->ranks[m->src].thr[m->thr];

	/* A failure found early (a port that is down) must not overtake the completions of
	 * work posted before it: the firmware rewinds a failed rail to its acknowledged prefix. */
	if (m->dst < w->size) {
		uint64_t *last = &h->last_cqe[(uint64_t)m->dst * w->rails + m->rail];

		if (t <= *last)
			t = *last + 1;
		*last = t;
	}
	sim_schedule(w, t, SIM_EV_CQE, m->src, m->thr, (uint32_t)status, m);
}

/* The requester's completion of a write or atomic: the ACK's way back, then the CQE. */
static void ack(struct sim_world *w, struct sim_msg *m, int32_t status)
{
	uint64_t back = m->src == m->dst ? 0 :
			sim_one_way_ps(w, m->dst, m->src) + sim_wire_ps(&w->model, w->model.nic_ack_bytes);

	sim_cqe_at(w, m, w->now + back + SIM_PS(w->model.nic_cqe_ns), status);
}

static void remote_wake(struct sim_world *w, struct sim_rank *r, const struct sim_msg *m)
{
	uint32_t t = m->thr % r->nthreads;

	if (w->remote_wake_all) {
		sim_wake_all(w, r, w->now);
		return;
	}
	r->thr[t].remote_woken = 1;
	sim_wake(w, r, t, w->now);
}

static int real(const struct sim_world *w, const struct sim_msg *m, const struct sim_mr *dst)
{
	return w->payload == SIM_REAL && !m->phantom && !dst->phantom;
}

/* Where a reply (read response) leaves the responder and when it lands. */
static uint64_t path_arrival(struct sim_world *w, uint32_t from, uint32_t to, uint32_t rail,
			     uint64_t t, uint64_t bytes)
{
	const struct sim_model *m = &w->model;
	uint64_t tx_end;

	if (from == to)
		return t + SIM_PS(m->pcie_rtt_ns + m->pcie_oneway_ns) + pcie_ps(m, bytes);
	return sim_reserve(w, from, to, rail, t + SIM_PS(m->pcie_rtt_ns), bytes, &tx_end) +
	       SIM_PS(m->pcie_oneway_ns);
}

void sim_nic_arrive(struct sim_world *w, struct sim_msg *m)
{
	struct sim_rank *src = &w->ranks[m->src], *dst = &w->ranks[m->dst];
	const struct sim_mr *mr;

	if (!src->alive) {  /* a dead rank's NIC completes nothing */
		free(m);
		return;
	}
	if (m->kind == SIM_MSG_READ_RESP) {  /* back at the requester */
		if (w->payload == SIM_REAL && !m->phantom && m->len)
			memmove((void *)(uintptr_t)m->laddr, (const void *)(uintptr_t)m->raddr, m->len);
		sim_cqe_at(w, m, w->now + SIM_PS(w->model.nic_cqe_ns), OFFLOAD_OK);
		return;
	}
	if (!dst->alive) {  /* transport retries run out */
		sim_cqe_at(w, m, w->now + SIM_PS(w->model.fault_retry_ns), OFFLOAD_ERR_PEER);
		return;
	}
	if (src->port[m->rail].down || dst->port[m->rail].down) {
		sim_cqe_at(w, m, w->now, OFFLOAD_ERR_LINK_DOWN);
		return;
	}
	w->cnt.msgs++;
	w->cnt.bytes += m->len;
	switch (m->kind) {
	case SIM_MSG_WRITE:
	case SIM_MSG_WRITE_SG:
	case SIM_MSG_INLINE:
		mr = m->len ? sim_mr_check(dst, m->rkey, m->raddr, m->len, OFFLOAD_ACCESS_REMOTE_WRITE) :
			      NULL;
		if (m->len && !mr) {
			/* The receiver's op completed and its host let the memory go: without a
			 * fault that could excuse it, a write landing now is the firmware's bug. */
			if (w->strict_late && sim_mr_released(dst, m->rkey))
				sim_violation(w, "t=%.3fus late write: rank %u wrote %llu bytes into rank %u's "
					      "memory after the op that published it completed there",
					      (double)w->now / 1e6, m->src, (unsigned long long)m->len, m->dst);
			ack(w, m, OFFLOAD_ERR_REMOTE_ACCESS);
			return;
		}
		if (m->len && m->kind == SIM_MSG_INLINE) {
			memcpy((void *)(uintptr_t)m->raddr, m->data, m->len);
		} else if (m->len && real(w, m, mr) && m->kind == SIM_MSG_WRITE) {
			memmove((void *)(uintptr_t)m->raddr, (const void *)(uintptr_t)m->laddr, m->len);
		} else if (m->len && real(w, m, mr)) {
			uint64_t off = 0;

			for (uint32_t i = 0; i < m->nsge; i++) {
				memmove((uint8_t *)(uintptr_t)m->raddr + off,
					(const void *)(uintptr_t)m->sge[i].addr, m->sge[i].len);
				off += m->sge[i].len;
			}
		}
		if (m->kind == SIM_MSG_INLINE)
			remote_wake(w, dst, m);
		ack(w, m, OFFLOAD_OK);
		return;
	case SIM_MSG_ATOMIC:
		mr = sim_mr_check(dst, m->rkey, m->raddr, 8, OFFLOAD_ACCESS_REMOTE_ATOMIC);
		if (!mr || (m->raddr & 7)) {
			ack(w, m, OFFLOAD_ERR_REMOTE_ACCESS);
			return;
		}
		__atomic_fetch_add((uint64_t *)(uintptr_t)m->raddr, m->value, __ATOMIC_SEQ_CST);
		remote_wake(w, dst, m);
		w->now += SIM_PS(w->model.nic_atomic_ns);
		ack(w, m, OFFLOAD_OK);
		w->now -= SIM_PS(w->model.nic_atomic_ns);
		return;
	case SIM_MSG_READ:
		mr = m->len ? sim_mr_check(dst, m->rkey, m->raddr, m->len, OFFLOAD_ACCESS_REMOTE_READ) :
			      NULL;
		if (m->len && !mr) {
			ack(w, m, OFFLOAD_ERR_REMOTE_ACCESS);
			return;
		}
		m->phantom |= mr ? mr->phantom : 0;
		m->kind = SIM_MSG_READ_RESP;
		sim_schedule(w, path_arrival(w, m->dst, m->src, m->rail, w->now, m->len),
			     SIM_EV_ARRIVE, m->src, m->thr, 0, m);
		return;
	default:
		free(m);
		return;
	}
}

void sim_nic_cqe(struct sim_world *w, struct sim_rank *r, uint32_t thr, struct sim_msg *m,
		 int32_t status)
{
	struct dpa_hal *h = &r->thr[thr];
	uint64_t depth = w->model.nic_sq_depth;

	if (r->alive) {
		h->cq[h->cq_tail % depth] = (struct dpa_hal_cqe){
			.wr_id = m->wr_id, .status = status,
			.bytes = status == OFFLOAD_OK ? (uint32_t)m->len : 0, .rail = m->rail };
		h->cq_tail++;
		sim_wake(w, r, thr, w->now);
	}
	if (m->kind != SIM_MSG_MCAST || --m->refs == 0)
		free(m);
}

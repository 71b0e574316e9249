/* SPDX-License-Identifier: Apache-2.0 */
/*
 * UD multicast in simulated time: a chunk leaves the sender's uplink once and the switch
 * replicates it to every other rank's downlink (a member that has not joined drops it).
 * At each member the receive NIC loses it (seeded, per million), finds its receive queue
 * overrun, or places it by chunk id into the posted region and queues a completion. Chunks
 * are placed by id (no staging slots: dpa_hal_mcast_slots() is 0). Receive completions
 * wake the member's threads once per mcast_event_every chunks (CQ moderation); the
 * firmware's "sent all" write ends every train.
 */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

uint32_t dpa_hal_mtu(const struct dpa_hal *hal)
{
	return (uint32_t)hal->w->model.link_mtu;
}

uint32_t dpa_hal_mcast_slots(const struct dpa_hal *hal)
{
	(void)hal;
	return 0;
}

int dpa_hal_mcast_slot_copy(struct dpa_hal *hal, uint32_t group, uint32_t slot, uint64_t addr,
			    uint32_t key, uint32_t len, uint64_t wr_id)
{
	(void)hal, (void)group, (void)slot, (void)addr, (void)key, (void)len, (void)wr_id;
	return DPA_HAL_EINVAL;  /* no slot is ever the firmware's */
}

int dpa_hal_mcast_slot_free(struct dpa_hal *hal, uint32_t group, uint32_t slot)
{
	(void)hal, (void)group, (void)slot;
	return DPA_HAL_EINVAL;
}

/* The receive queue is allocated at the first join: most (rank, group) pairs of a large
 * job never see multicast traffic. */
static void join(struct sim_world *w, struct sim_mc_rx *rx)
{
	if (!rx->cq) {
		rx->cq = calloc(w->model.mcast_rq_depth, sizeof(*rx->cq));
		if (!rx->cq) {
			sim_violation(w, "out of memory for a multicast receive queue");
			return;
		}
	}
	if (!rx->joined) {
		rx->joined = 1;
		rx->cq_head = rx->cq_tail = rx->pending = 0;
	}
}

int dpa_hal_mcast_send(struct dpa_hal *hal, uint32_t group, uint64_t laddr, uint32_t lkey,
		       uint32_t len, uint32_t imm, uint64_t wr_id)
{
	struct sim_world *w = hal->w;
	const struct sim_model *md = &w->model;
	struct sim_rank *me = hal->r;
	const struct sim_mr *mr = NULL;
	uint32_t rail = 0, members = 0;
	uint64_t t, ser, start, tx_end, lat;
	struct sim_msg *m;

	if (group >= OFFLOAD_MAX_TEAMS || len > md->link_mtu)
		return DPA_HAL_EINVAL;
	if (hal->outstanding >= md->nic_sq_depth)
		return DPA_HAL_EAGAIN;
	m = calloc(1, sizeof(*m));
	if (!m)
		return DPA_HAL_EAGAIN;
	hal->outstanding++;
	hal->posts++;
	sim_cost(hal, SIM_PS(md->dpa_post_ns));
	t = hal->clock + SIM_PS(md->nic_wqe_ns);
	*m = (struct sim_msg){ .kind = SIM_MSG_MCAST, .src = me->rank, .thr = hal->index,
			       .dst = me->rank, .laddr = laddr, .lkey = lkey, .len = len,
			       .wr_id = wr_id, .group = group, .imm = imm, .refs = 1,
			       .posted = hal->clock };
	if (len) {
		mr = sim_mr_check(me, lkey, laddr, len, OFFLOAD_ACCESS_LOCAL_READ);
		if (!mr) {
			sim_schedule(w, t, SIM_EV_CQE, me->rank, hal->index,
				     (uint32_t)OFFLOAD_ERR_REMOTE_ACCESS, m);
			return 0;
		}
		m->phantom = mr->phantom;
	}
	while (rail < w->rails && me->port[rail].down)
		rail++;
	if (rail == w->rails) {
		sim_schedule(w, t, SIM_EV_CQE, me->rank, hal->index, (uint32_t)OFFLOAD_ERR_LINK_DOWN, m);
		return 0;
	}
	m->rail = rail;
	/* One copy on our uplink; the switch replicates it to every downlink. */
	ser = sim_wire_ps(md, len);
	t += SIM_PS(md->pcie_rtt_ns);
	start = t > me->port[rail].up_busy ? t : me->port[rail].up_busy;
	tx_end = start + ser;
	me->port[rail].up_busy = tx_end;
	me->port[rail].bytes_tx += len;
	me->port[rail].msgs++;
	w->cnt.mc_chunks++;
	sim_trace_span(w, me->rank, 100 + rail, "mc", start, tx_end);
	for (uint32_t d = 0; d < w->size; d++) {
		struct sim_port *dp = &w->ranks[d].port[rail];
		uint64_t s, e;

		if (d == me->rank || !w->ranks[d].alive || dp->down)
			continue;
		lat = sim_one_way_ps(w, me->rank, d) - SIM_PS(md->link_cable_ns + md->nic_rx_ns);
		s = start + lat > dp->down_busy ? start + lat : dp->down_busy;
		e = s + ser > tx_end + lat ? s + ser : tx_end + lat;
		dp->down_busy = e;
		dp->bytes_rx += len;
		members++;
		sim_schedule(w, e + SIM_PS(md->link_cable_ns + md->nic_rx_ns + md->pcie_oneway_ns),
			     SIM_EV_MC_ARRIVE, d, 0, 0, m);
	}
	m->refs += members;
	/* complete when the chunk left */
	sim_schedule(w, tx_end + SIM_PS(md->nic_cqe_ns), SIM_EV_CQE, me->rank, hal->index,
		     OFFLOAD_OK, m);
	return 0;
}

void sim_mc_arrive(struct sim_world *w, struct sim_rank *r, struct sim_msg *m)
{
	struct sim_mc_rx *rx = &r->mc[m->group];
	uint64_t mtu = w->model.link_mtu, id = m->imm & 0xffffffu;
	int placed = 0;

	if (!r->alive || !rx->joined || !rx->nregions || !rx->cq)
		goto drop;
	if (w->mcast_loss_ppm && sim_rng_below(&w->rng[SIM_RNG_LOSS], 1000000) < w->mcast_loss_ppm)
		goto drop;
	if (rx->pending >= w->model.mcast_rq_depth || (m->imm >> 24) != rx->seq8)
		goto drop;
	for (uint32_t i = 0; i < rx->nregions && !placed; i++) {
		const struct dpa_hal_mcast_region *reg = &rx->regions[i];
		uint64_t nchunks = (reg->len + mtu - 1) / mtu, off;
		const struct sim_mr *mr;

		if (id < reg->first_chunk || id - reg->first_chunk >= nchunks)
			continue;
		off = (id - reg->first_chunk) * mtu;
		if (m->len > reg->len - off)
			break;
		mr = sim_mr_check(r, reg->key, reg->addr + off, m->len, OFFLOAD_ACCESS_LOCAL_WRITE);
		if (!mr && w->strict_late && sim_mr_released(r, reg->key))
			sim_violation(w, "t=%.3fus late multicast placement: rank %u's region for chunk %llu "
				      "is still posted after its op completed and the memory was released",
				      (double)w->now / 1e6, r->rank, (unsigned long long)id);
		if (!mr)
			break;
		if (w->payload == SIM_REAL && !m->phantom && !mr->phantom && m->len)
			memmove((void *)(uintptr_t)(reg->addr + off), (const void *)(uintptr_t)m->laddr,
				m->len);
		placed = 1;
	}
	if (!placed)
		goto drop;
	rx->cq[rx->cq_tail % w->model.mcast_rq_depth] = (struct dpa_hal_mcast_cqe){
		.imm = m->imm, .len = (uint32_t)m->len };
	rx->cq_tail++;
	rx->pending++;
	if (++rx->since_wake >= w->model.mcast_event_every) {
		rx->since_wake = 0;
		sim_wake_all(w, r, w->now);
	}
	goto out;
drop:
	w->cnt.mc_lost++;
out:
	if (--m->refs == 0)
		free(m);
}

int dpa_hal_mcast_post(struct dpa_hal *hal, uint32_t group, uint32_t seq8,
		       const struct dpa_hal_mcast_region *regions, uint32_t n)
{
	struct sim_mc_rx *rx;

	if (group >= OFFLOAD_MAX_TEAMS || n > hal->w->size || (n && !regions))
		return DPA_HAL_EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (regions[i].len && !sim_mr_check(hal->r, regions[i].key, regions[i].addr,
						    regions[i].len, OFFLOAD_ACCESS_LOCAL_WRITE))
			return DPA_HAL_EINVAL;
	rx = &hal->r->mc[group];
	sim_cost(hal, SIM_PS(hal->w->model.dpa_post_ns));
	if (n > rx->cap) {  /* a team's members at most: grown once per group */
		struct dpa_hal_mcast_region *more = realloc(rx->regions, n * sizeof(*regions));

		if (!more)
			return DPA_HAL_EINVAL;
		rx->regions = more;
		rx->cap = n;
	}
	join(hal->w, rx);
	if (n)
		memcpy(rx->regions, regions, n * sizeof(*regions));
	rx->nregions = n;
	rx->seq8 = seq8 & 0xffu;
	return 0;
}

int dpa_hal_mcast_poll(struct dpa_hal *hal, uint32_t group, struct dpa_hal_mcast_cqe *out,
		       int max)
{
	struct sim_mc_rx *rx;
	int n = 0;

	if (group >= OFFLOAD_MAX_TEAMS)
		return DPA_HAL_EINVAL;
	rx = &hal->r->mc[group];
	join(hal->w, rx);
	while (n < max && rx->cq_head != rx->cq_tail) {
		out[n++] = rx->cq[rx->cq_head % hal->w->model.mcast_rq_depth];
		rx->cq_head++;
		rx->pending--;
		sim_cost(hal, hal->w->model.dpa_mcast_chunk_ps);
	}
	return n;
}

void dpa_hal_mcast_leave(struct dpa_hal *hal, uint32_t group)
{
	struct sim_mc_rx *rx;

	if (group >= OFFLOAD_MAX_TEAMS)
		return;
	rx = &hal->r->mc[group];
	rx->joined = 0;
	rx->nregions = 0;
	rx->cq_head = rx->cq_tail = rx->pending = 0;
}

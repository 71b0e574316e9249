/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dpa_hal.h in simulated time (everything but multicast, which is sim_mcast.c). Each call
 * adds its modelled cost to the running pass's clock; a post leaves the NIC at the clock
 * of the call, so the effects of one pass are spread over its duration.
 */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

uint32_t dpa_hal_thread_index(const struct dpa_hal *hal)
{
	return hal->index;
}

uint32_t dpa_hal_num_threads(const struct dpa_hal *hal)
{
	return hal->r->nthreads;
}

static void *in_window(void *base, uint64_t size, uint64_t off, uint64_t len)
{
	if (!base || off > size || len > size - off)
		return NULL;
	return (uint8_t *)base + off;
}

void *dpa_hal_window_ptr(struct dpa_hal *hal, enum dpa_hal_window win, uint64_t offset,
			 uint64_t len)
{
	const struct sim_model *m = &hal->w->model;
	struct sim_rank *r = hal->r;

	switch (win) {
	case DPA_HAL_WIN_RING:  /* host memory: the first touch of a pass reads it over PCIe */
		sim_cost(hal, SIM_PS(hal->ring_touched ? m->dpa_win_ns : m->dpa_ring_ns));
		hal->ring_touched = 1;
		return in_window(r->ring, r->ring_len, offset, len);
	case DPA_HAL_WIN_STATS:
		sim_cost(hal, SIM_PS(m->dpa_win_ns));
		return in_window(r->stats, (uint64_t)r->nthreads * sizeof(*r->stats), offset, len);
	case DPA_HAL_WIN_CTRL:
		sim_cost(hal, SIM_PS(m->dpa_check_ns));
		return in_window(r->ctrl, offload_ctrl_bytes(hal->w->size), offset, len);
	}
	return NULL;
}

void *dpa_hal_aux_ptr(struct dpa_hal *hal, uint32_t key, uint64_t addr, uint64_t len)
{
	const struct sim_mr *mr = sim_mr_check(hal->r, key, addr, len,
					       OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE);

	sim_cost(hal, SIM_PS(hal->w->model.dpa_aux_ns));
	if (!mr)
		return NULL;
	if (mr->phantom) {
		sim_violation(hal->w, "rank %u: aux_ptr on phantom memory (driver bug)", hal->r->rank);
		return NULL;
	}
	return (void *)(uintptr_t)addr;
}

uint32_t dpa_hal_num_rails(const struct dpa_hal *hal)
{
	return hal->w->rails;
}

void dpa_hal_set_rail(struct dpa_hal *hal, uint32_t peer, uint32_t rail)
{
	if (peer < hal->w->size && rail < hal->w->rails)
		hal->rail[peer] = (uint8_t)rail;
}

static struct sim_msg *msg_new(struct dpa_hal *hal, uint32_t kind, uint32_t peer, uint64_t wr_id)
{
	struct sim_msg *m;

	if (hal->outstanding >= hal->w->model.nic_sq_depth)
		return NULL;
	m = calloc(1, sizeof(*m));
	if (!m) {
		sim_violation(hal->w, "out of memory for messages");
		return NULL;
	}
	m->kind = kind;
	m->src = hal->r->rank;
	m->thr = hal->index;
	m->dst = peer;
	m->wr_id = wr_id;
	m->rail = peer < hal->w->size ? hal->rail[peer] : 0;
	hal->outstanding++;
	hal->posts++;
	sim_cost(hal, SIM_PS(hal->w->model.dpa_post_ns));
	m->posted = hal->clock;
	return m;
}

/* Send m after its local check (status): an error completes at once, as a NIC that
 * refuses a WQE does; otherwise it goes on the wire. */
static int send_msg(struct dpa_hal *hal, struct sim_msg *m, int32_t status, uint64_t bytes)
{
	struct sim_world *w = hal->w;
	const struct sim_model *md = &w->model;
	uint64_t t = hal->clock + SIM_PS(md->nic_wqe_ns), arrive, tx_end, *last;
	struct sim_rank *me = hal->r;

	if (!status && m->dst >= w->size)
		status = OFFLOAD_ERR_REMOTE_ACCESS;
	if (!status && (me->port[m->rail].down || w->ranks[m->dst].port[m->rail].down))
		status = OFFLOAD_ERR_LINK_DOWN;
	if (status) {
		sim_cqe_at(w, m, t, status);
		return 0;
	}
	if (m->dst == me->rank) {  /* loopback: PCIe read, the NIC, PCIe write */
		arrive = t + SIM_PS(md->pcie_rtt_ns + md->pcie_oneway_ns) +
			 (bytes * 8000u + md->pcie_gbps - 1) / md->pcie_gbps;
	} else {
		arrive = sim_reserve(w, me->rank, m->dst, m->rail, t + SIM_PS(md->pcie_rtt_ns), bytes,
				     &tx_end) + SIM_PS(md->pcie_oneway_ns);
		if (md->jitter_ns)
			arrive += sim_rng_below(&w->rng[SIM_RNG_NET], SIM_PS(md->jitter_ns) + 1);
	}
	last = &me->last_arrive[(uint64_t)m->dst * w->rails + m->rail];
	if (arrive <= *last)
		arrive = *last + 1;  /* a queue pair delivers in order (ties would go by the RNG) */
	*last = arrive;
	sim_schedule(w, arrive, SIM_EV_ARRIVE, m->dst, hal->index, 0, m);
	return 0;
}

/* Our registration covers [addr, addr+len) with access: 0, else the error status. */
static int32_t local_check(struct dpa_hal *hal, struct sim_msg *m, uint64_t addr, uint32_t key,
			   uint64_t len, uint32_t access)
{
	const struct sim_mr *mr;

	if (!len)
		return OFFLOAD_OK;
	mr = sim_mr_check(hal->r, key, addr, len, access);
	if (!mr)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	m->phantom |= mr->phantom;
	return OFFLOAD_OK;
}

int dpa_hal_rdma_write(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		       uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	struct sim_msg *m = msg_new(hal, SIM_MSG_WRITE, peer, wr_id);

	if (!m)
		return DPA_HAL_EAGAIN;
	m->laddr = laddr;
	m->lkey = lkey;
	m->raddr = raddr;
	m->rkey = rkey;
	m->len = len;
	return send_msg(hal, m, local_check(hal, m, laddr, lkey, len, OFFLOAD_ACCESS_LOCAL_READ), len);
}

int dpa_hal_rdma_write_sg(struct dpa_hal *hal, uint32_t peer, const struct dpa_hal_sge *sge,
			  uint32_t nsge, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct sim_msg *m;
	int32_t st = OFFLOAD_OK;

	if (nsge > DPA_HAL_MAX_SGE || (nsge && !sge))
		return DPA_HAL_EINVAL;
	m = msg_new(hal, SIM_MSG_WRITE_SG, peer, wr_id);
	if (!m)
		return DPA_HAL_EAGAIN;
	m->nsge = nsge;
	m->lkey = lkey;
	m->raddr = raddr;
	m->rkey = rkey;
	for (uint32_t i = 0; i < nsge; i++) {
		m->sge[i] = sge[i];
		m->len += sge[i].len;
		if (!st)
			st = local_check(hal, m, sge[i].addr, lkey, sge[i].len, OFFLOAD_ACCESS_LOCAL_READ);
	}
	return send_msg(hal, m, st, m->len);
}

int dpa_hal_rdma_write_inline(struct dpa_hal *hal, uint32_t peer, const void *data, uint32_t len,
			      uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct sim_msg *m;

	if (len > sizeof(m->data) || (len && !data))
		return DPA_HAL_EINVAL;
	m = msg_new(hal, SIM_MSG_INLINE, peer, wr_id);
	if (!m)
		return DPA_HAL_EAGAIN;
	memcpy(m->data, data, len);
	m->raddr = raddr;
	m->rkey = rkey;
	m->len = len;
	return send_msg(hal, m, OFFLOAD_OK, len);
}

int dpa_hal_rdma_signal_add(struct dpa_hal *hal, uint32_t peer, uint64_t raddr, uint32_t rkey,
			    uint64_t value, uint64_t wr_id)
{
	struct sim_msg *m = msg_new(hal, SIM_MSG_ATOMIC, peer, wr_id);

	if (!m)
		return DPA_HAL_EAGAIN;
	m->raddr = raddr;
	m->rkey = rkey;
	m->value = value;
	m->len = 8;
	return send_msg(hal, m, OFFLOAD_OK, 8);
}

int dpa_hal_rdma_read(struct dpa_hal *hal, uint32_t peer, uint64_t laddr, uint32_t lkey,
		      uint64_t raddr, uint32_t rkey, uint64_t len, uint64_t wr_id)
{
	struct sim_msg *m = msg_new(hal, SIM_MSG_READ, peer, wr_id);

	if (!m)
		return DPA_HAL_EAGAIN;
	m->laddr = laddr;
	m->lkey = lkey;
	m->raddr = raddr;
	m->rkey = rkey;
	m->len = len;
	/* the request is small; the response carries the bytes (sim_nic.c) */
	return send_msg(hal, m, local_check(hal, m, laddr, lkey, len, OFFLOAD_ACCESS_LOCAL_WRITE), 16);
}

int dpa_hal_poll_cq(struct dpa_hal *hal, struct dpa_hal_cqe *out, int max)
{
	uint64_t depth = hal->w->model.nic_sq_depth;
	int n = 0;

	while (n < max && hal->cq_head != hal->cq_tail) {
		out[n++] = hal->cq[hal->cq_head % depth];
		hal->cq_head++;
		hal->outstanding--;
		hal->cqes++;
		sim_cost(hal, SIM_PS(hal->w->model.dpa_cqe_ns));
	}
	if (hal->remote_woken) {  /* as FlexIO: the thread a remote CQE woke wakes the others */
		hal->remote_woken = 0;
		dpa_hal_notify(hal);
	}
	return n;
}

void dpa_hal_notify(struct dpa_hal *hal)
{
	uint64_t at = hal->clock + SIM_PS(hal->w->model.dpa_notify_ns);

	for (uint32_t t = 0; t < hal->r->nthreads; t++)
		if (t != hal->index)
			sim_wake(hal->w, hal->r, t, at);
}

void dpa_hal_host_notify(struct dpa_hal *hal)
{
	const struct sim_model *m = &hal->w->model;

	sim_schedule(hal->w, hal->clock + SIM_PS(m->pcie_oneway_ns + m->host_notice_ns), SIM_EV_HOST,
		     hal->r->rank, 0, 0, NULL);
}

uint64_t dpa_hal_time_ns(struct dpa_hal *hal)
{
	sim_cost(hal, SIM_PS(hal->w->model.dpa_clock_ns));
	return hal->clock / 1000u;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dpa_hal.h on a BlueField-3 DPA with the FlexIO device API (built by dpacc, DOCA >= 2.9 /
 * FlexIO device API 24.10). The host backend (host/src/flexio/flexio_backend.c) creates,
 * for every progress thread, an event handler, one CQ for all of that thread's work, one
 * "wake" CQ, an RC QP per (thread, rail, world rank) (our own rank's paired with a twin: W x
 * rails x threads QPs, tables sized at creation, see docs/scale.md for the cost) and a
 * loopback QP to the host, and describes them in a struct offload_flexio_thread_ctx
 * (offload_abi.h) passed as the handler argument. There are no globals: everything a thread
 * keeps lives in host-allocated DPA memory named by that context, so the image is stateless
 * and a re-run handler finds its state again.
 *
 * Posting: WQEs are built in the QP's SQ (DPA heap) and rung with flexio_dev_qp_sq_ring_db.
 * Every firmware post is signaled; its wr_id sits in a slot at the WQE's first basic block,
 * found again from the CQE's wqe_counter. A completion for WQE n also retires every earlier
 * unsignaled WQE of the same SQ (mlx5 completes an SQ in order).
 *
 * Waking: data writes carry no event. A signal (fetch-add) is followed by a zero-length
 * SEND, fenced behind the atomic, and an inline write is a WRITE WITH IMMEDIATE: both consume
 * a receive WQE at the peer and so raise a CQE on the peer thread's CQ, which triggers its
 * event handler. notify() triggers siblings' wake CQs; host_notify() SENDs to the host QP,
 * whose completion channel the host sleeps on.
 */
#include "flexio_hal_dev.h"

#include "dpa_engine.h"
#include "offload_atomic.h"

#define DPA_FLEXIO_IDLE_PASSES      4u   /* empty passes before parking, nothing in flight */
#define DPA_FLEXIO_IDLE_PASSES_BUSY 64u  /* the same while an op is in flight */
/* A firmware timer closer than this is polled through; a later one parks the thread. */
#define DPA_FLEXIO_TIMER_SPIN_NS    1000000ull

_Static_assert(DPA_HAL_WIN_RING == OFFLOAD_FLEXIO_WIN_RING &&
	       DPA_HAL_WIN_STATS == OFFLOAD_FLEXIO_WIN_STATS &&
	       DPA_HAL_WIN_CTRL == OFFLOAD_FLEXIO_WIN_CTRL, "window order shared with the host");
_Static_assert((DPA_FLEXIO_SOFT_DEPTH & (DPA_FLEXIO_SOFT_DEPTH - 1)) == 0, "soft depth");

static inline void *dptr(uint64_t daddr)
{
	return (void *)(uintptr_t)daddr;
}

/* ------------------------------------------------------------------ setup */

static void cq_init(struct dpa_flexio_cq *cq, const struct offload_flexio_cq *d)
{
	cq->ring = dptr(d->ring_daddr);
	cq->dbr = dptr(d->dbr_daddr);
	cq->cqn = d->cqn;
	cq->mask = (1u << d->log_depth) - 1;
	cq->ci = 0;
	cq->hw_owner = 1;  /* the host preset every owner bit to 1: first-pass CQEs carry 0 */
}

static void qp_init(struct dpa_flexio_qp *qp, const struct offload_flexio_qp *d)
{
	qp->sq = dptr(d->sq_daddr);
	qp->dbr = dptr(d->dbr_daddr);
	qp->slots = dptr(d->slots_daddr);
	qp->qpn = d->qpn;
	qp->peer = d->peer;
	qp->rail = d->rail;
	qp->bb_mask = (1u << d->log_sq_depth) - 1;
	qp->seg_mask = (DPA_MLX5_SEGS_PER_BB << d->log_sq_depth) - 1;
	qp->pi = 0;  /* the host left the SQ doorbell record at 0 */
	qp->ci = 0;
	qp->broken = 0;
}

uint64_t dpa_flexio_hal_layout(uint32_t world, uint32_t rails, struct dpa_flexio_hal_layout *out)
{
	uint64_t qps, off;
	uint32_t slots = 1;

	if (!world || world > OFFLOAD_RANKS_LIMIT || !rails || rails > OFFLOAD_FLEXIO_MAX_RAILS)
		return 0;
	qps = (uint64_t)rails * world;
	/* Every peer QP, the twins and the loopback, at most half full. */
	while (slots < 2 * (qps + rails + 1))
		slots <<= 1;
	off = (sizeof(struct dpa_hal) + 15u) & ~15ull;
	out->qps_off = off;
	off += qps * sizeof(struct dpa_flexio_qp);
	out->rail_of_off = off;
	off = (off + world + 15u) & ~15ull;
	out->qpn_slots_off = off;
	out->qpn_slots = slots;
	out->bytes = off + 4ull * slots;
	return out->bytes;
}

/* First run of this thread's handler: turn the host's description into runtime state. The
 * host allocated hal_bytes for the layout of this world size and rail count; the tables are
 * reached through pointers set here, never past what the layout says. */
static int hal_init(struct dpa_hal *hal, struct offload_flexio_thread_ctx *ctx)
{
	const struct offload_flexio_qp *qps = dptr(ctx->qps_daddr);
	uint32_t rails = ctx->num_rails ? ctx->num_rails : 1, world = ctx->world_size;
	struct dpa_flexio_hal_layout lay;
	uint8_t *base = (uint8_t *)hal;

	if (!dpa_flexio_hal_layout(world, rails, &lay) || lay.bytes > ctx->hal_bytes)
		return -1;
	hal->thread_index = ctx->thread_index;
	hal->num_threads = ctx->num_threads;
	hal->world_rank = ctx->world_rank;
	hal->world_size = world;
	hal->num_rails = rails;
	hal->max_outstanding = ctx->max_outstanding < DPA_FLEXIO_SOFT_DEPTH ?
			       ctx->max_outstanding : DPA_FLEXIO_SOFT_DEPTH;
	hal->outstanding = 0;
	hal->notifies = 0;
	hal->ctx = ctx;
	hal->board = dptr(ctx->board_daddr);
	hal->tick_ns = ctx->tick_ns ? ctx->tick_ns : 1000u;
	hal->qps = (struct dpa_flexio_qp *)(base + lay.qps_off);
	hal->rail_of = base + lay.rail_of_off;
	hal->qpn_slots = (uint32_t *)(base + lay.qpn_slots_off);
	hal->qpn_mask = lay.qpn_slots - 1;
	cq_init(&hal->cq, &ctx->cq);
	cq_init(&hal->wake_cq, &ctx->wake_cq);
	qp_init(&hal->host_qp, &ctx->host_qp);
	for (uint32_t r = 0; r < rails; r++) {
		const struct offload_flexio_qp *row = &qps[(uint64_t)r * (world + 1)];

		for (uint32_t p = 0; p < world; p++)
			qp_init(dpa_flexio_peer_qp(hal, r, p), &row[p]);
		qp_init(&hal->twins[r], &row[world]);
	}
	for (uint32_t p = 0; p < world; p++)
		hal->rail_of[p] = 0;
	dpa_flexio_index_qpns(hal);
	hal->soft_head = hal->soft_tail = 0;
	hal->magic = DPA_FLEXIO_HAL_MAGIC;
	return 0;
}

struct dpa_hal *dpa_flexio_hal_attach(struct offload_flexio_thread_ctx *ctx)
{
	struct dpa_hal *hal;

	if (ctx->magic != OFFLOAD_FLEXIO_CTX_MAGIC || ctx->version != OFFLOAD_FLEXIO_CTX_VERSION ||
	    !ctx->world_size || ctx->world_size > OFFLOAD_RANKS_LIMIT ||
	    ctx->world_rank >= ctx->world_size || ctx->num_threads > OFFLOAD_MAX_THREADS ||
	    ctx->thread_index >= ctx->num_threads || ctx->num_rails > OFFLOAD_FLEXIO_MAX_RAILS ||
	    !ctx->hal_daddr)
		return NULL;
	hal = dptr(ctx->hal_daddr);
	if (hal->magic != DPA_FLEXIO_HAL_MAGIC && hal_init(hal, ctx))
		return NULL;
	return hal;
}

/*
 * Map the host windows for this invocation. Window entity 0 gets the arena's key: one
 * registration holding the ring, the stats and the control words, so that pointers into
 * all three are alive at once (the engine holds them together). The window maps the
 * registration linearly: the base acquired for the arena's first byte gives the others
 * (NVIDIA's vrdma DPA code adds host offsets to an acquired base likewise). Entity 1 is
 * for command arguments, each under its own key (dpa_hal_aux_ptr); nothing is configured
 * on it until one is needed. The configuration is the thread's, and may not outlive the
 * invocation: it is made again on every entry.
 */
static int window_setup(struct dpa_hal *hal)
{
	flexio_uintptr_t base = 0;

	hal->aux_key = 0;
	if (flexio_dev_window_config(FLEXIO_DEV_WINDOW_ENTITY_0, (uint16_t)hal->ctx->window_id,
				     hal->ctx->window_mkey) != FLEXIO_DEV_STATUS_SUCCESS)
		return -1;
	if (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_0, hal->ctx->arena_haddr,
					  &base) != FLEXIO_DEV_STATUS_SUCCESS)
		return -1;
	hal->win_base = base - hal->ctx->arena_haddr;
	return 0;
}

/* ------------------------------------------------------------------ simple queries */

uint32_t dpa_hal_thread_index(const struct dpa_hal *hal)
{
	return hal->thread_index;
}

uint32_t dpa_hal_num_threads(const struct dpa_hal *hal)
{
	return hal->num_threads;
}

uint64_t dpa_hal_time_ns(struct dpa_hal *hal)
{
	/* unverified: tick length. Ticks of this EU's timer (microseconds on BlueField-3 per
	 * DOCA's PCC headers); the
	 * host passes the tick length, so a different clock only changes the context. */
	return (uint64_t)__dpa_thread_time() * hal->tick_ns;
}

void *dpa_hal_window_ptr(struct dpa_hal *hal, enum dpa_hal_window win, uint64_t offset,
			 uint64_t len)
{
	const struct offload_flexio_window *w;
	uint64_t haddr;

	switch (win) {
	case DPA_HAL_WIN_RING:
	case DPA_HAL_WIN_STATS:
	case DPA_HAL_WIN_CTRL:
		w = &hal->ctx->win[win];
		if (offset > w->len || len > w->len - offset ||
		    w->haddr < hal->ctx->arena_haddr ||
		    w->haddr - hal->ctx->arena_haddr + w->len > hal->ctx->arena_len)
			return NULL;
		haddr = w->haddr + offset;
		break;
	default:
		return NULL;
	}
	/* Host, NIC and peers write the ring indices, aux descriptors and control words
	 * behind our back: drop stale window lines before the caller reads through it. */
	if (win != DPA_HAL_WIN_STATS)
		__dpa_thread_window_read_inv();
	return dptr(hal->win_base + haddr);
}

/*
 * Command arguments in host memory, which the host registered under key (local read and
 * write): window entity 1 is configured with that key (kept while the next command uses
 * the same) and both ends of the range acquired, so a key that is unknown, of another
 * protection domain, or does not cover the whole range gives NULL, not a fault. The
 * pointer lives as long as entity 1 keeps this key: until this thread's next aux_ptr with
 * another key, or the end of the invocation (see dpa_hal.h).
 */
void *dpa_hal_aux_ptr(struct dpa_hal *hal, uint32_t key, uint64_t addr, uint64_t len)
{
	flexio_uintptr_t first = 0, last = 0;

	if (!key || !addr || addr + len < addr)
		return NULL;
	if (hal->aux_key != key) {
		hal->aux_key = 0;
		if (flexio_dev_window_config(FLEXIO_DEV_WINDOW_ENTITY_1,
					     (uint16_t)hal->ctx->window_id, key) !=
		    FLEXIO_DEV_STATUS_SUCCESS)
			return NULL;
		hal->aux_key = key;
	}
	if (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_1, addr, &first) !=
	    FLEXIO_DEV_STATUS_SUCCESS)
		return NULL;
	if (len && (flexio_dev_window_ptr_acquire(FLEXIO_DEV_WINDOW_ENTITY_1, addr + len - 1,
						  &last) != FLEXIO_DEV_STATUS_SUCCESS ||
		    last - first != len - 1))
		return NULL;
	__dpa_thread_window_read_inv();
	return dptr(first);
}

/* ------------------------------------------------------------------ scheduling */

/*
 * Wake siblings that parked. Pairs with the parking sequence in the event handler: a
 * thread arms its CQs, then sets its board flag, then fences and looks for work once more.
 * We published our work before this fence, so either it sees the work or we see its flag
 * (and then its CQ is armed, so the trigger raises an event).
 */
void dpa_hal_notify(struct dpa_hal *hal)
{
	/* unverified: that a zero CQE on a thread-attached CQ runs that thread's handler
	 * (the header says it "may activate any handler connected to the CQ"). */
	off_fence();
	for (uint32_t t = 0; t < hal->num_threads; t++)
		if (t != hal->thread_index && off_read_once(&hal->board[t]))
			flexio_dev_zcqe_gen(hal->ctx->wake_cqn[t]);  /* "msix_send" by its 24.10 name */
}

/* One pass of the engine with fresh window reads before and our writes pushed after. */
static int run_pass(struct dpa_hal *hal)
{
	int work;

	__dpa_thread_window_read_inv();
	work = dpa_progress(dptr(hal->ctx->state_daddr), hal);
	__dpa_thread_window_writeback();
	return work;
}

static void arm_cqs(struct dpa_hal *hal)
{
	flexio_dev_cq_arm(hal->cq.ci, hal->cq.cqn);
	flexio_dev_cq_arm(hal->wake_cq.ci, hal->wake_cq.cqn);
}

static int stop_requested(const struct offload_flexio_thread_ctx *ctx)
{
	__dpa_thread_fence(__DPA_MEMORY, __DPA_R, __DPA_R);  /* the host writes it by DMA */
	return off_read_once(&ctx->stop) != 0;
}

/*
 * Firmware timers (dpa_engine_wake_at). A DPA has no timer event, so a thread parks past a
 * timer that is not due soon, and whichever thread runs gives a parked sibling whose timer
 * expired an event of its own. Some thread runs at least every FX_WAIT_SLICE_MS while the
 * host waits for a completion (it rings thread 0 at each slice), so a timer fires within
 * about that of its time while anyone waits; one due while nobody waits (a multicast loss
 * timeout, an op_timeout) fires at the next doorbell.
 */
static void wake_expired_siblings(struct dpa_hal *hal, uint64_t now)
{
	void *state = dptr(hal->ctx->state_daddr);

	for (uint32_t t = 0; t < hal->num_threads; t++)
		if (t != hal->thread_index && off_read_once(&hal->board[t]) &&
		    dpa_engine_wake_at(state, t, now) == 1)
			flexio_dev_zcqe_gen(hal->ctx->wake_cqn[t]);
}

/* Poll on (1) rather than park: our own timer is due, or due within the spin time. */
static int timer_due(struct dpa_hal *hal, uint64_t now)
{
	uint64_t when = dpa_engine_wake_at(dptr(hal->ctx->state_daddr), hal->thread_index, now);

	return when == 1 || (when && when - now < DPA_FLEXIO_TIMER_SPIN_NS);
}

/*
 * The thread's entry point, run by FlexIO on each event of its CQs (host doorbell, peer
 * signal or control write, completion of our own work, sibling notify). Runs the engine
 * until it stops advancing, then parks: arm both CQs, announce itself on the board, look
 * once more (see dpa_hal_notify), and give the EU back until the next event.
 */
flexio_dev_event_handler_t dpa_offload_event_handler;
__dpa_global__ void dpa_offload_event_handler(uint64_t thread_arg)
{
	struct offload_flexio_thread_ctx *ctx = dptr(thread_arg);
	struct dpa_hal *hal = dpa_flexio_hal_attach(ctx);
	uint32_t idle = 0;

	if (!hal)
		flexio_dev_error(DPA_FLEXIO_ERR_BAD_CTX);
	if (window_setup(hal))
		flexio_dev_error(DPA_FLEXIO_ERR_WINDOW);  /* the host sees it in the process status */
	if (stop_requested(ctx)) {
		flexio_dev_thread_finish();
		return;
	}
	off_write_once(&hal->board[hal->thread_index], 0u);
	for (;;) {
		uint32_t limit = dpa_engine_load(dptr(ctx->state_daddr)) == DPA_ENGINE_IDLE ?
				 DPA_FLEXIO_IDLE_PASSES : DPA_FLEXIO_IDLE_PASSES_BUSY;

		idle = run_pass(hal) ? 0 : idle + 1;
		if (idle < limit)
			continue;
		if (stop_requested(ctx))
			break;
		wake_expired_siblings(hal, dpa_hal_time_ns(hal));
		if (timer_due(hal, dpa_hal_time_ns(hal)))
			continue;
		arm_cqs(hal);
		__dpa_thread_system_fence();  /* the arm doorbells before the board flag */
		off_store_release(&hal->board[hal->thread_index], 1u);
		off_fence();
		if (!run_pass(hal))
			break;
		off_write_once(&hal->board[hal->thread_index], 0u);
		idle = 0;
	}
	if (stop_requested(ctx)) {
		flexio_dev_thread_finish();
		return;
	}
	flexio_dev_thread_reschedule();
}

/* ------------------------------------------------------------------ RPCs from the host */

/* Sizes the host needs before it can allocate: engine state, HAL runtime, ABI version. */
flexio_dev_rpc_handler_t dpa_offload_query_rpc;
__dpa_rpc__ uint64_t dpa_offload_query_rpc(uint64_t what)
{
	switch (what & 0xffu) {
	case OFFLOAD_FLEXIO_QUERY_ABI:
		return OFFLOAD_ABI_VERSION;
	case OFFLOAD_FLEXIO_QUERY_STATE_SIZE: {  /* for the params the query carries */
		struct dpa_engine_params p = {
			.world_size = OFFLOAD_FLEXIO_QUERY_WORLD(what),
			.num_threads = OFFLOAD_FLEXIO_QUERY_THREADS(what),
			.team_pool_ranks = OFFLOAD_FLEXIO_QUERY_POOL(what),
		};

		return dpa_engine_state_size(&p);
	}
	case OFFLOAD_FLEXIO_QUERY_HAL_BYTES: {
		struct dpa_flexio_hal_layout lay;

		return dpa_flexio_hal_layout(OFFLOAD_FLEXIO_QUERY_WORLD(what),
					     OFFLOAD_FLEXIO_QUERY_THREADS(what) /* rails */, &lay);
	}
	case OFFLOAD_FLEXIO_QUERY_CTX:
		return OFFLOAD_FLEXIO_CTX_VERSION;
	default:
		return 0;
	}
}

/* dpa_engine_init() on the state buffer; params is a struct dpa_engine_params the host
 * copied into DPA memory. Returns 0 or the engine's negative errno, as a uint64_t. */
__dpa_rpc__ uint64_t dpa_offload_init_rpc(uint64_t state_daddr, uint64_t params_daddr);
__dpa_rpc__ uint64_t dpa_offload_init_rpc(uint64_t state_daddr, uint64_t params_daddr)
{
	const struct dpa_engine_params *params = dptr(params_daddr);

	if (!state_daddr || !params_daddr)
		return (uint64_t)(int64_t)DPA_HAL_EINVAL;
	return (uint64_t)(int64_t)dpa_engine_init(dptr(state_daddr), params);
}

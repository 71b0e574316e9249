/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FlexIO backend: struct host_device_ops on a BlueField-3 DPA through libflexio and
 * libibverbs. Built only by scripts/build_flexio.sh (needs DOCA); host_ctx loads it with
 * dlopen and calls dpaoffload_flexio_ops(), the one exported symbol.
 *
 * What it sets up (see offload_abi.h, "FlexIO hardware binding", for what the DPA reads):
 *  - a FlexIO process running the firmware image that dpacc linked in (dpa_offload_app),
 *    on a protection domain shared with every memory registration of this rank;
 *  - a window arena: the ring, the stats and this rank's control words in one
 *    registration, which every DPA thread's window entity 0 is configured with (the firmware
 *    holds pointers into all three at once); command arguments (aux) are registered by
 *    host_ctx under keys of their own, which the DPA configures on window entity 1;
 *  - per DPA thread: an event handler, its CQ and wake CQ, an RC QP per (rail, world rank)
 *    (a pair for this rank itself), and a loopback QP pair with the host: the host SENDs a
 *    doorbell on it, the DPA SENDs back when a host thread sleeps on the completion ring;
 *  - this rank's control region (offload_ctrl_bytes(world size)), in the arena, registered
 *    for remote write and atomics on its own, published with the QP numbers through attr->allgather.
 *
 * Locking: cq_lock guards the host CQ and posting on the host QPs (doorbells may come from
 * any thread); pump_lock lets one waiter at a time sleep on the completion channel; mr_lock
 * guards the registration table. open/start/close are not concurrent with anything.
 */
#define _GNU_SOURCE
#include "flexio_backend.h"

char fx_last_error[256];

/* One line on stderr; the last one is kept for the bring-up report. */
__attribute__((format(printf, 1, 2))) void fx_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(fx_last_error, sizeof(fx_last_error), fmt, ap);
	va_end(ap);
	fprintf(stderr, "dpa-offload flexio: %s\n", fx_last_error);
}

/* Nonzero (and a line on stderr naming the call) when a FlexIO call failed. */
int fx_fail(flexio_status st, const char *what)
{
	if (st == FLEXIO_STATUS_SUCCESS)
		return 0;
	fx_log("%s failed (status %d)", what, (int)st);
	return 1;
}

uint32_t env_u32(const char *name, uint32_t dflt, uint32_t lo, uint32_t hi)
{
	const char *s = getenv(name);
	char *end;
	unsigned long v;

	if (!s || !*s)
		return dflt;
	v = strtoul(s, &end, 0);
	if (*end || v < lo || v > hi) {
		fx_log("ignoring %s=%s (expected %u..%u)", name, s, lo, hi);
		return dflt;
	}
	return (uint32_t)v;
}

uint32_t log2_ceil(uint64_t v)
{
	uint32_t l = 0;

	while ((1ull << l) < v)
		l++;
	return l;
}

/* ------------------------------------------------------------------ open / start / close */

void fx_close(struct host_device *hd);

uint64_t fx_query(struct fx_device *d, uint64_t what)
{
	uint64_t ret = 0;

	if (fx_fail(flexio_process_call(d->proc, &dpa_offload_query_rpc, &ret, what),
		    "flexio_process_call(dpa_offload_query_rpc)"))
		return 0;
	return ret;
}

/* The DPA process, running the image dpacc linked in. */
int fx_create_process(struct fx_device *d)
{
	struct flexio_process_attr pa = { .pd = d->pd };

#ifdef FX_HAVE_FLEXIO_VERSION
	if (fx_fail(flexio_version_set(FLEXIO_VER_USED), "flexio_version_set"))
		return -EIO;
#endif
	if (fx_fail(flexio_process_create(d->ibv, dpa_offload_app, &pa, &d->proc),
		    "flexio_process_create"))
		return -EIO;
	return 0;
}

/* The image answers its query RPC, and was built from our headers. */
int fx_check_image(struct fx_device *d)
{
	uint64_t hal_bytes;

	if (fx_query(d, OFFLOAD_FLEXIO_QUERY_ABI) != OFFLOAD_ABI_VERSION ||
	    fx_query(d, OFFLOAD_FLEXIO_QUERY_CTX) != OFFLOAD_FLEXIO_CTX_VERSION) {
		fx_log("the DPA image was built from other headers (ABI %u, FlexIO context %u "
		       "expected)", OFFLOAD_ABI_VERSION, OFFLOAD_FLEXIO_CTX_VERSION);
		return -EPROTO;
	}
	/* The HAL's tables hold a QP per (rail, world rank): the image says what that takes. */
	hal_bytes = fx_query(d, OFFLOAD_FLEXIO_QUERY_HAL(d->attr.size, d->num_rails));
	if (!hal_bytes || hal_bytes > UINT32_MAX) {
		fx_log("the DPA image cannot hold the queue tables of %u ranks on %u rails",
		       d->attr.size, d->num_rails);
		return -EINVAL;
	}
	d->hal_bytes = (uint32_t)hal_bytes;
	d->state_size = fx_query(d, OFFLOAD_FLEXIO_QUERY_STATE(d->attr.size, d->attr.num_threads,
							       d->attr.engine.team_pool_ranks));
	d->uar = flexio_process_get_uar(d->proc);
	if (!d->state_size || !d->uar) {
		fx_log("the DPA image does not say how large its engine state is");
		return -EIO;
	}
	return 0;
}

static int fx_open_process(struct fx_device *d)
{
	struct flexio_mkey_attr ma;
	int rc = fx_create_process(d);

	if (!rc)
		rc = fx_check_image(d);
	if (rc)
		return rc;
	/* Per-thread words: parked flags, and the scratch that fetch-add results land in. */
	if (fx_fail(flexio_buf_dev_alloc(d->proc, 4ull * d->attr.num_threads, &d->board),
		    "flexio_buf_dev_alloc") ||
	    fx_fail(flexio_buf_dev_memset(d->proc, 0, 4ull * d->attr.num_threads, d->board),
		    "flexio_buf_dev_memset") ||
	    fx_fail(flexio_buf_dev_alloc(d->proc, 8ull * d->attr.num_threads, &d->scratch),
		    "flexio_buf_dev_alloc"))
		return -EIO;
	memset(&ma, 0, sizeof(ma));
	ma.pd = d->pd;
	ma.daddr = d->scratch;
	ma.len = 8ull * d->attr.num_threads;
	ma.access = IBV_ACCESS_LOCAL_WRITE;
	if (fx_fail(flexio_device_mkey_create(d->proc, &ma, &d->scratch_mkey),
		    "flexio_device_mkey_create"))
		return -EIO;
	return fx_register_window(d);
}

static uint64_t fx_pages(uint64_t len)
{
	return (len + 4095) & ~4095ull;
}

/* The window arena and the registrations over it (see struct fx_device). */
static int fx_open_arena(struct fx_device *d)
{
	if (!host_ring_len(&d->attr) || !host_stats_len(&d->attr))
		return -EINVAL;
	d->stats_off = fx_pages(host_ring_len(&d->attr));
	d->ctrl_len = fx_pages(offload_ctrl_bytes(d->attr.size));
	d->arena_len = d->stats_off + fx_pages(host_stats_len(&d->attr)) + d->ctrl_len;
	d->arena = mmap(NULL, d->arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			-1, 0);
	if (d->arena == MAP_FAILED) {
		d->arena = NULL;
		return -ENOMEM;
	}
	d->ctrl = d->arena + d->arena_len - d->ctrl_len;
	d->arena_mr = ibv_reg_mr(d->pd, d->arena, d->arena_len, IBV_ACCESS_LOCAL_WRITE);
	/* Peers write ready/count descriptors and add to done counters here. */
	d->ctrl_mr = ibv_reg_mr(d->pd, d->ctrl, d->ctrl_len, IBV_ACCESS_LOCAL_WRITE |
				IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC);
	if (!d->arena_mr || !d->ctrl_mr) {
		fx_log("registering the window arena (%llu bytes) failed: %s (ulimit -l?)",
		       (unsigned long long)d->arena_len, strerror(errno));
		return -ENOMEM;
	}
	return 0;
}

static int fx_fw_memory(struct host_device *hd, struct host_fw_windows *out)
{
	struct fx_device *d = to_fx(hd);

	*out = (struct host_fw_windows){ .ring = d->arena, .ring_len = host_ring_len(&d->attr),
		.stats = d->arena + d->stats_off, .stats_len = host_stats_len(&d->attr) };
	return 0;
}

static int fx_open_host_cq(struct fx_device *d)
{
	int flags;

	d->chan = ibv_create_comp_channel(d->ibv);
	if (!d->chan)
		return -EIO;
	/* Only the pump thread reads it, after poll() said so; never block in the library. */
	flags = fcntl(d->chan->fd, F_GETFL);
	if (flags < 0 || fcntl(d->chan->fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;
	d->hcq = ibv_create_cq(d->ibv, (int)(d->attr.num_threads * (FX_HOST_SQ + FX_HOST_RQ)), NULL,
			       d->chan, 0);
	return d->hcq ? 0 : -EIO;
}

/* Every rank reaches this point before any goes on: an allgather of one word, whose values
 * nobody reads (its return is the only result). */
static int fx_all_reached(struct fx_device *d)
{
	int one = 1, *all = calloc(d->attr.size, sizeof(*all));
	int rc = all ? d->attr.allgather(d->attr.allgather_arg, &one, sizeof(one), all) : -ENOMEM;

	free(all);
	return rc;
}

static int fx_open(const struct host_ctx_params *attr, struct host_device **out)
{
	struct fx_device *d;
	uint32_t *qpns = NULL;
	int rc;

	if (!host_params_known(attr))
		return -EPROTONOSUPPORT;
	if (attr->size == 0 || attr->size > OFFLOAD_RANKS_LIMIT || attr->rank >= attr->size ||
	    attr->num_threads == 0 || attr->num_threads > OFFLOAD_MAX_THREADS)
		return -EINVAL;
	if (!attr->allgather) {
		fx_log("the FlexIO backend needs an allgather to connect its queue pairs");
		return -ENOTSUP;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->attr = *attr;
	d->attr.job = d->attr.backend = d->attr.backend_lib = NULL;  /* the caller's strings */
	pthread_mutex_init(&d->cq_lock, NULL);
	pthread_mutex_init(&d->pump_lock, NULL);
	pthread_mutex_init(&d->mr_lock, NULL);
	d->log_sq = env_u32("OFFLOAD_FLEXIO_LOG_SQ", 7, 4, 12);
	d->log_rq = env_u32("OFFLOAD_FLEXIO_LOG_RQ", 7, 2, 10);  /* > 2 x DPA_CTRL_LOG */
	d->max_outstanding = env_u32("OFFLOAD_FLEXIO_MAX_OUTSTANDING", 512, 16, 1024);
	d->tick_ns = env_u32("OFFLOAD_FLEXIO_TICK_NS", 1000, 1, 1000000);
	d->peers = calloc(attr->size, sizeof(*d->peers));
	d->threads = calloc(attr->num_threads, sizeof(*d->threads));
	d->ibv = fx_open_ibv();
	rc = !d->peers || !d->threads ? -ENOMEM : !d->ibv ? -ENODEV : 0;
	if (!rc)
		rc = fx_setup_rails(d);
	if (!rc && !(d->pd = ibv_alloc_pd(d->ibv)))
		rc = -EIO;
	if (!rc)
		rc = fx_open_process(d);
	if (!rc)
		rc = fx_open_arena(d);
	if (!rc)
		rc = fx_open_host_cq(d);
	for (uint32_t t = 0; t < attr->num_threads && !rc; t++)
		rc = fx_thread_create(d, t);
	if (!rc)
		rc = fx_keepalive_create(d);
	if (!rc)
		rc = fx_exchange(d, &qpns);
	if (!rc)
		rc = fx_connect_all(d, qpns);
	if (!rc)
		rc = fx_keepalive_connect(d);
	free(qpns);
	/* Nobody sends before every rank's queues are ready to receive. */
	if (!rc)
		rc = fx_all_reached(d);
	if (rc) {
		fx_close((struct host_device *)d);
		return rc;
	}
	*out = (struct host_device *)d;
	return 0;
}

static int fx_start(struct host_device *hd, const struct dpa_engine_params *params,
		    const struct host_fw_windows *win)
{
	struct fx_device *d = to_fx(hd);
	flexio_uintptr_t state = 0, params_d = 0;
	uint64_t ret = 0;
	int rc;

	/* The DPA reaches the ring and stats only inside the arena (fw_memory). */
	if ((uint8_t *)win->ring != d->arena || (uint8_t *)win->stats != d->arena + d->stats_off ||
	    win->ring_len > host_ring_len(&d->attr) || win->stats_len > host_stats_len(&d->attr))
		return -EINVAL;
	if (fx_fail(flexio_buf_dev_alloc(d->proc, d->state_size, &state), "flexio_buf_dev_alloc") ||
	    fx_fail(flexio_copy_from_host(d->proc, (void *)params, sizeof(*params), &params_d),
		    "flexio_copy_from_host") ||
	    /* unverified: two uint64_t varargs for a two-argument __dpa_rpc__ (packed by the
	     * stub dpacc generates). */
	    fx_fail(flexio_process_call(d->proc, &dpa_offload_init_rpc, &ret, (uint64_t)state,
					(uint64_t)params_d),
		    "flexio_process_call(dpa_offload_init_rpc)"))
		return -EIO;
	if ((int64_t)ret)
		return (int)(int64_t)ret;
	for (uint32_t t = 0; t < d->attr.num_threads; t++) {
		rc = fx_thread_publish(d, t, state, win);
		if (rc)
			return rc;
	}
	for (uint32_t t = 0; t < d->attr.num_threads; t++)
		if (fx_fail(flexio_event_handler_run(d->threads[t].eh, d->threads[t].ctx_daddr),
			    "flexio_event_handler_run"))
			return -EIO;
	d->started = 1;
	/* A CQE that comes before run() finds no running handler: its event is "blocked and
	 * lost" (NVIDIA's samples) and the CQ, armed at creation, stays disarmed. No rank may
	 * send before every rank's handlers run. */
	rc = fx_all_reached(d);
	if (rc)
		return rc;
	/* run() only makes a handler runnable: the first CQE of its CQ invokes it. A thread
	 * that never ran never parked, so notify() would not wake it: give every thread its
	 * first event now; it parks, and notify() finds it from then on. */
	for (uint32_t t = 0; t < d->attr.num_threads; t++)
		fx_ring(d, t);
	return fx_keepalive_start(d);
}

/* Ask every handler to finish instead of re-arming, and give it an event to see that. */
static void fx_stop_threads(struct fx_device *d)
{
	uint32_t one = 1;
	struct timespec grace = { 0, FX_STOP_GRACE_NS };

	for (uint32_t t = 0; t < d->attr.num_threads; t++) {
		struct fx_thread *th = &d->threads[t];

		if (!th->ctx_daddr)
			continue;
		flexio_host2dev_memcpy(d->proc, &one, sizeof(one),
				       th->ctx_daddr + offsetof(struct offload_flexio_thread_ctx, stop));
		if (th->hqp)
			fx_ring(d, t);
	}
	nanosleep(&grace, NULL);
}

static void fx_destroy_thread(struct fx_device *d, struct fx_thread *t)
{
	uint32_t n = d->num_rails * (d->attr.size + 1);

	if (t->hqp)
		ibv_destroy_qp(t->hqp);
	if (t->loop.qp)
		flexio_qp_destroy(t->loop.qp);
	for (uint32_t i = 0; t->qps && i < n; i++)
		if (t->qps[i].qp)
			flexio_qp_destroy(t->qps[i].qp);
	free(t->qps);
	if (t->cq.cq)
		flexio_cq_destroy(t->cq.cq);
	if (t->wake.cq)
		flexio_cq_destroy(t->wake.cq);
	if (t->eh)
		flexio_event_handler_destroy(t->eh);
}

/* Revokes every registration; buffers from alloc_shared stay mapped until the caller
 * munmaps them (host_free_shared after close), as with the emulator. DPA heap buffers go
 * with the process. */
void fx_close(struct host_device *hd)
{
	struct fx_device *d = to_fx(hd);

	fx_keepalive_stop(d);
	if (d->started)
		fx_stop_threads(d);
	for (uint32_t t = 0; d->threads && t < d->attr.num_threads; t++)
		fx_destroy_thread(d, &d->threads[t]);
	if (d->hcq)
		ibv_destroy_cq(d->hcq);
	if (d->chan)
		ibv_destroy_comp_channel(d->chan);
	if (d->scratch_mkey)
		flexio_device_mkey_destroy(d->scratch_mkey);
	if (d->window)
		flexio_window_destroy(d->window);
	if (d->proc)
		flexio_process_destroy(d->proc);
	for (uint32_t i = 0; i < d->nmrs; i++)
		ibv_dereg_mr(d->mrs[i].mr);
	if (d->arena_mr)
		ibv_dereg_mr(d->arena_mr);
	if (d->ctrl_mr)
		ibv_dereg_mr(d->ctrl_mr);
	if (d->arena)
		munmap(d->arena, d->arena_len);
	if (d->pd)
		ibv_dealloc_pd(d->pd);
	if (d->ibv)
		ibv_close_device(d->ibv);
	pthread_mutex_destroy(&d->cq_lock);
	pthread_mutex_destroy(&d->pump_lock);
	pthread_mutex_destroy(&d->mr_lock);
	free(d->mrs);
	free(d->peers);
	free(d->threads);
	free(d);
}

/* ------------------------------------------------------------------ run time */

static void fx_doorbell(struct host_device *hd)
{
	fx_ring(to_fx(hd), 0);  /* thread 0 takes commands in and wakes its siblings */
}

static int fx_peer_ctrl(struct host_device *hd, uint32_t rank, struct offload_peer *out)
{
	struct fx_device *d = to_fx(hd);

	if (rank >= d->attr.size)
		return -ENOENT;
	out->ctrl_addr = d->peers[rank].ctrl_addr;
	out->ctrl_key = d->peers[rank].ctrl_key;
	out->world_rank = rank;
	return 0;
}

static int fx_poll_worthwhile(struct host_device *hd)
{
	(void)hd;
	return 1;  /* the DPA does not share the host's cores: polling costs it nothing */
}

static int fx_dpa_failed(struct fx_device *d)
{
	if (flexio_err_status_get(d->proc) == FLEXIO_DEV_NO_ERROR)
		return 0;
	if (!d->dpa_failed_reported) {
		d->dpa_failed_reported = 1;
		fx_log("the DPA process stopped with an error; see flexio_crash_data()");
	}
	return 1;
}

/*
 * Sleep on the host CQ's completion channel until a DPA thread SENDs (it does when
 * cq_waiters is set), the slice or the timeout ends. One waiter pumps the channel; the
 * others nap briefly and let host_wait re-check. Rings thread 0 first: the caller has
 * just freed completion-ring slots a completion may be waiting for.
 */
static int fx_wait_completion(struct host_device *hd, uint32_t *word, uint32_t seen,
			      int64_t timeout_ns)
{
	struct fx_device *d = to_fx(hd);
	int64_t ms = timeout_ns <= 0 ? 0 : timeout_ns / 1000000 + 1;
	struct pollfd pfd = { .fd = d->chan->fd, .events = POLLIN };
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	int n;

	fx_ring(d, 0);
	if (pthread_mutex_trylock(&d->pump_lock)) {
		struct timespec nap = { 0, timeout_ns < 200000 ? (long)timeout_ns : 200000 };

		nanosleep(&nap, NULL);
		return 0;
	}
	pthread_mutex_lock(&d->cq_lock);
	fx_drain_locked(d);
	pthread_mutex_unlock(&d->cq_lock);
	ibv_req_notify_cq(d->hcq, 0);
	pthread_mutex_lock(&d->cq_lock);
	fx_drain_locked(d);  /* whatever completed before the arm raises no event */
	pthread_mutex_unlock(&d->cq_lock);
	n = 0;
	if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen && !fx_dpa_failed(d)) {
		n = poll(&pfd, 1, (int)(ms < FX_WAIT_SLICE_MS ? ms : FX_WAIT_SLICE_MS));
		if (n > 0 && !ibv_get_cq_event(d->chan, &ev_cq, &ev_ctx))
			ibv_ack_cq_events(ev_cq, 1);
	}
	pthread_mutex_unlock(&d->pump_lock);
	if (n == 0 && ms <= FX_WAIT_SLICE_MS && __atomic_load_n(word, __ATOMIC_ACQUIRE) == seen)
		return -ETIMEDOUT;
	return 0;
}

static const struct host_device_ops flexio_device_ops = {
	.name = "flexio",
	.alloc_shared = fx_alloc_shared,
	.close = fx_close,
	.doorbell = fx_doorbell,
	.drive = NULL,        /* the firmware runs on the DPA: host threads never drive it */
	.drive_stats = NULL,
	.free_shared = fx_free_shared,
	.fw_memory = fx_fw_memory,
	.mr_dereg = fx_mr_dereg,
	.mr_reg = fx_mr_reg,
	.mr_reg_dmabuf = fx_mr_reg_dmabuf,
	.open = fx_open,
	.peer_ctrl = fx_peer_ctrl,
	.poll_worthwhile = fx_poll_worthwhile,
	.set_mcast_faults = NULL,  /* a real fabric loses what it loses */
	.start = fx_start,
	.wait_completion = fx_wait_completion,
	.wake_waiters = NULL,  /* a waiter's poll ends within FX_WAIT_SLICE_MS */
};

/* What host_ctx looks up after dlopen(): the ops, and the ABI and the host_ctx_params
 * layout they were built with. */
__attribute__((visibility("default"))) const struct host_device_ops *dpaoffload_flexio_ops(void);
__attribute__((visibility("default"))) uint32_t dpaoffload_flexio_abi(void);
__attribute__((visibility("default"))) uint32_t dpaoffload_flexio_params_version(void);

const struct host_device_ops *dpaoffload_flexio_ops(void)
{
	return &flexio_device_ops;
}

uint32_t dpaoffload_flexio_abi(void)
{
	return OFFLOAD_ABI_VERSION;
}

uint32_t dpaoffload_flexio_params_version(void)
{
	return HOST_CTX_PARAMS_VERSION;
}

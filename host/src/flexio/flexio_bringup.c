/* SPDX-License-Identifier: Apache-2.0 */
/*
 * First contact with a card, one step at a time: `dpa-offload bringup` calls
 * dpaoffload_flexio_probe(stage) for the steps below the public API, each from scratch,
 * and reads its one-line report:
 *   1  the RDMA device opens, its first port is active and has a usable GID;
 *   2  the DPA process is created: the app loads (FlexIO API version set, image found);
 *   3  the process answers an RPC: the image's ABI and sizes match these headers.
 * Returns 0 with what was found in report, or -stage with why it failed and, when a DPA
 * process exists, flexio_err_status_get() and where flexio_crash_data() wrote its report.
 */
#define _GNU_SOURCE
#include "flexio_backend.h"

__attribute__((visibility("default"))) int dpaoffload_flexio_probe(uint32_t stage, char *report,
								  uint32_t len);

static void gid_text(const union ibv_gid *g, char *out, size_t len)
{
	static const uint8_t v4[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	if (!memcmp(g->raw, v4, sizeof(v4))) {
		snprintf(out, len, "::ffff:%u.%u.%u.%u", g->raw[12], g->raw[13], g->raw[14], g->raw[15]);
		return;
	}
	snprintf(out, len, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
		 g->raw[0], g->raw[1], g->raw[2], g->raw[3], g->raw[4], g->raw[5], g->raw[6],
		 g->raw[7], g->raw[8], g->raw[9], g->raw[10], g->raw[11], g->raw[12], g->raw[13],
		 g->raw[14], g->raw[15]);
}

static int probe_fail(struct fx_device *d, int step, char *report, uint32_t len, const char *what)
{
	enum flexio_err_status st = d->proc ? flexio_err_status_get(d->proc) : FLEXIO_DEV_NO_ERROR;

	if (d->proc && st != FLEXIO_DEV_NO_ERROR)
		flexio_crash_data(d->proc, NULL);
	snprintf(report, len, "%s: %s%s%s", what, fx_last_error[0] ? fx_last_error : "failed",
		 d->proc ? "; flexio_err_status_get: " : "",
		 !d->proc ? "" : st == FLEXIO_DEV_NO_ERROR ? "no error" :
		 st == FLEXIO_DEV_FATAL_ERROR ? "fatal error (crash data: /tmp/flexio_dev.<pid>.crash)" :
		 "user error (crash data: /tmp/flexio_dev.<pid>.crash)");
	return -step;
}

int dpaoffload_flexio_probe(uint32_t stage, char *report, uint32_t len)
{
	struct fx_device *d = calloc(1, sizeof(*d));
	char gid[64];
	int rc = 0;

	if (!d || !report || !len) {
		free(d);
		return -EINVAL;
	}
	fx_last_error[0] = 0;
	d->attr.num_threads = 1;
	d->attr.size = 1;
	d->attr.rails = 1;
	pthread_mutex_init(&d->cq_lock, NULL);
	pthread_mutex_init(&d->pump_lock, NULL);
	pthread_mutex_init(&d->mr_lock, NULL);
	d->ibv = fx_open_ibv();
	if (!d->ibv || fx_setup_rails(d)) {
		rc = probe_fail(d, 1, report, len, "device");
		goto out;
	}
	gid_text(&d->rails[0].gid, gid, sizeof(gid));
	snprintf(report, len, "%s port %u active, GID index %u %s", ibv_get_device_name(d->ibv->device),
		 d->rails[0].port, d->rails[0].gid_index, gid);
	if (stage < 2)
		goto out;
	d->pd = ibv_alloc_pd(d->ibv);
	if (!d->pd || fx_create_process(d)) {
		rc = probe_fail(d, 2, report, len, "DPA process");
		goto out;
	}
	snprintf(report, len, "app %s loaded into a DPA process", flexio_app_get_name(dpa_offload_app));
	if (stage < 3)
		goto out;
	if (fx_check_image(d)) {
		rc = probe_fail(d, 3, report, len, "RPC");
		goto out;
	}
	snprintf(report, len, "the query RPC answered: ABI %u, engine state %llu bytes",
		 OFFLOAD_ABI_VERSION, (unsigned long long)d->state_size);
out:
	fx_close((struct host_device *)d);
	return rc;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The FlexIO backend: the RDMA device, its ports (rails) and their addresses. */
#define _GNU_SOURCE
#include "flexio_backend.h"

/* ------------------------------------------------------------------ device and ports */

struct ibv_context *fx_open_ibv(void)
{
	const char *want = getenv("OFFLOAD_FLEXIO_DEVICE");
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	if (!list) {
		fx_log("no RDMA devices (ibv_get_device_list: %s)", strerror(errno));
		return NULL;
	}
	for (int i = 0; list[i] && !ctx; i++) {
		const char *name = ibv_get_device_name(list[i]);

		if (want && *want ? !strcmp(name, want) : !strncmp(name, "mlx5", 4))
			ctx = ibv_open_device(list[i]);
	}
	if (!ctx)
		fx_log("no device %s", want && *want ? want : "mlx5_*");
	ibv_free_device_list(list);
	return ctx;
}

/* The MAC of the netdev behind a RoCE GID: RoCE QPs made by FlexIO (DevX) take it as is. */
static int fx_read_mac(uint32_t ifindex, uint8_t mac[6])
{
	char ifname[IF_NAMESIZE], path[64 + IF_NAMESIZE];
	FILE *f;
	int n;

	if (!if_indextoname(ifindex, ifname))
		return -errno;
	snprintf(path, sizeof(path), "/sys/class/net/%s/address", ifname);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	n = fscanf(f, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &mac[0], &mac[1], &mac[2], &mac[3], &mac[4],
		   &mac[5]);
	fclose(f);
	return n == 6 ? 0 : -EINVAL;
}

/* GID to use on a port: OFFLOAD_FLEXIO_GID_INDEX, else the first RoCE v2 (Ethernet) or IB one. */
static int fx_pick_gid(struct ibv_context *ctx, struct fx_rail *r)
{
	struct ibv_gid_entry ent[128];
	uint32_t forced = env_u32("OFFLOAD_FLEXIO_GID_INDEX", UINT32_MAX, 0, 1023);
	ssize_t n = ibv_query_gid_table(ctx, ent, sizeof(ent) / sizeof(ent[0]), 0);

	for (ssize_t i = 0; i < n; i++) {
		if (ent[i].port_num != r->port)
			continue;
		if (forced != UINT32_MAX ? ent[i].gid_index != forced :
		    ent[i].gid_type != (r->eth ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB))
			continue;
		r->gid_index = ent[i].gid_index;
		r->gid = ent[i].gid;
		return r->eth ? fx_read_mac(ent[i].ndev_ifindex, r->mac) : 0;
	}
	fx_log("no usable GID on port %u", r->port);
	return -ENODEV;
}

int fx_setup_rails(struct fx_device *d)
{
	struct ibv_device_attr da;
	int rc;

	if (ibv_query_device(d->ibv, &da))
		return -EIO;
	/* Rails are ports of the one device the DPA process runs on (see the notes for
	 * ports exposed as separate devices). */
	d->num_rails = d->attr.rails ? d->attr.rails : 1;
	if (d->num_rails > OFFLOAD_FLEXIO_MAX_RAILS || d->num_rails > da.phys_port_cnt) {
		fx_log("%u rails asked for, but the device has %u port(s)", d->num_rails,
		       da.phys_port_cnt);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < d->num_rails && i < HOST_MAX_RAILS; i++) {
		if (d->attr.rail_down_after[i] && d->attr.rail_down_after[i] != UINT64_MAX) {
			fx_log("rail_down_after is emulator fault injection; ignored on a card");
			break;
		}
	}
	for (uint32_t i = 0; i < d->num_rails; i++) {
		struct fx_rail *r = &d->rails[i];
		struct ibv_port_attr pa;

		r->port = (uint8_t)(i + 1);
		if (ibv_query_port(d->ibv, r->port, &pa))
			return -EIO;
		if (pa.state != IBV_PORT_ACTIVE) {
			fx_log("port %u is not active", r->port);
			return -ENETDOWN;
		}
		r->eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
		r->lid = pa.lid;
		r->mtu = pa.active_mtu;
		rc = fx_pick_gid(d->ibv, r);
		if (rc)
			return rc;
	}
	return 0;
}

/* The window the DPA threads reach host memory through (keys: the arena's, aux keys). */
int fx_register_window(struct fx_device *d)
{
	if (fx_fail(flexio_window_create(d->proc, d->pd, &d->window), "flexio_window_create"))
		return -EIO;
	return 0;
}

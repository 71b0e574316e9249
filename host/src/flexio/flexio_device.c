/* SPDX-License-Identifier: Apache-2.0 */
/* The FlexIO backend: the RDMA device, its ports (rails) and their addresses. */
#define _GNU_SOURCE
#include "flexio_backend.h"
#include "flexio_addr.h"

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

/*
 * The GID a port's QPs use (flexio_addr.c decides): OFFLOAD_FLEXIO_GID_INDEX if set; else
 * for RoCE the IPv4-mapped RoCE v2 GID (a router forwards it; the link-local one that
 * comes first in the table it does not), on OFFLOAD_FLEXIO_NETDEV if that names a netdev
 * (a VLAN device: the NIC tags what the GID sends), else on the port's own netdev.
 */
static int fx_pick_gid(struct ibv_context *ctx, struct fx_rail *r)
{
	struct ibv_gid_entry ent[128];
	struct fx_gid gids[128];
	uint32_t forced = env_u32("OFFLOAD_FLEXIO_GID_INDEX", UINT32_MAX, 0, 1023);
	const char *netdev = getenv("OFFLOAD_FLEXIO_NETDEV");
	uint32_t want = netdev && *netdev ? if_nametoindex(netdev) : 0;
	ssize_t n = ibv_query_gid_table(ctx, ent, sizeof(ent) / sizeof(ent[0]), 0);
	int i;

	if (netdev && *netdev && !want) {
		fx_log("OFFLOAD_FLEXIO_NETDEV=%s: no such network device", netdev);
		return -ENODEV;
	}
	for (ssize_t k = 0; k < n; k++) {
		memcpy(gids[k].raw, ent[k].gid.raw, 16);
		gids[k].index = ent[k].gid_index;
		gids[k].port = ent[k].port_num;
		gids[k].kind = ent[k].gid_type == IBV_GID_TYPE_ROCE_V2 ? FX_GID_ROCE_V2 :
			       ent[k].gid_type == IBV_GID_TYPE_ROCE_V1 ? FX_GID_ROCE_V1 : FX_GID_IB;
		gids[k].ifindex = ent[k].ndev_ifindex;
		gids[k].vlan = r->eth && fx_netdev_is_vlan(ent[k].ndev_ifindex);
	}
	i = fx_choose_gid(gids, n > 0 ? (size_t)n : 0, r->port, r->eth, forced, want);
	if (i < 0) {
		fx_log("no usable GID on port %u%s%s", r->port, want ? " on " : "", want ? netdev : "");
		return -ENODEV;
	}
	r->gid_index = ent[i].gid_index;
	r->gid = ent[i].gid;
	r->ifindex = ent[i].ndev_ifindex;
	if (r->eth && fx_netdev_mac(r->ifindex, r->mac)) {
		fx_log("port %u: cannot read the MAC of the GID's netdev (ifindex %u)", r->port,
		       r->ifindex);
		return -ENODEV;
	}
	return 0;
}

/*
 * The destination MAC for a QP on rail r to dst (a peer's GID): the next hop's, from the
 * kernel's route (over the GID's netdev, so a VLAN routes as it does) and neighbour table;
 * the peer's own MAC is only right when it is on our subnet.
 */
int fx_dest_mac(struct fx_device *d, uint32_t rail, const uint8_t dst[16], uint8_t mac[6])
{
	const struct fx_rail *r = &d->rails[rail];
	struct fx_neigh neigh[256];
	struct fx_route route;
	uint8_t hop[16];
	char text[64];
	size_t nn = 0;
	int rc;

	if (!r->eth)
		return 0;   /* InfiniBand: routed by LID, no MAC */
	rc = fx_kernel_route(dst, r->ifindex, &route);
	if (!rc && !route.local)
		rc = fx_kernel_neighbours(neigh, sizeof(neigh) / sizeof(neigh[0]), &nn);
	if (!rc)
		rc = fx_next_hop_mac(dst, &route, neigh, nn, r->mac, mac, hop);
	if (rc) {
		fx_ip_text(rc == -EHOSTUNREACH ? hop : dst, text, sizeof(text));
		fx_log(rc == -EHOSTUNREACH ?
		       "rail %u: next hop %s has no neighbour entry: ping it once (or check `ip "
		       "neigh`) so that the kernel resolves its MAC" :
		       "rail %u: no route to %s (`ip route get` it)", rail, text);
		return -EHOSTUNREACH;
	}
	return 0;
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

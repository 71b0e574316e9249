/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FlexIO backend's RoCE addressing (host/src/flexio/flexio_addr.c) over made-up GID,
 * route and neighbour tables, and its kernel side on this machine's loopback. Exit 0: all
 * pass; 1: a check failed (printed).
 */
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>

#include "flexio_addr.h"

static int failures;

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); \
	printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

static struct fx_gid gid(uint32_t index, uint32_t kind, const char *text, uint32_t ifindex,
			 int vlan)
{
	struct fx_gid g = { .index = index, .port = 1, .kind = kind, .ifindex = ifindex, .vlan = vlan };
	unsigned a, b, c, d;

	if (sscanf(text, "v4:%u.%u.%u.%u", &a, &b, &c, &d) == 4) {
		g.raw[10] = g.raw[11] = 0xff;
		g.raw[12] = (uint8_t)a, g.raw[13] = (uint8_t)b, g.raw[14] = (uint8_t)c, g.raw[15] = (uint8_t)d;
	} else if (!strcmp(text, "ll")) {
		g.raw[0] = 0xfe, g.raw[1] = 0x80, g.raw[15] = (uint8_t)index;
	} else {   /* a global IPv6 address */
		g.raw[0] = 0x20, g.raw[1] = 0x01, g.raw[15] = (uint8_t)index;
	}
	return g;
}

static void v4(uint8_t out[16], unsigned a, unsigned b, unsigned c, unsigned d)
{
	memset(out, 0, 16);
	out[10] = out[11] = 0xff;
	out[12] = (uint8_t)a, out[13] = (uint8_t)b, out[14] = (uint8_t)c, out[15] = (uint8_t)d;
}

static void gid_choice(void)
{
	/* A ConnectX port: eth0 (ifindex 4) with fe80:: and 10.0.0.1, VLAN eth0.100 (ifindex 9)
	 * with 192.168.100.1; each address as RoCE v1 and v2, in the kernel's order. */
	struct fx_gid t[] = {
		gid(0, FX_GID_ROCE_V1, "ll", 4, 0), gid(1, FX_GID_ROCE_V2, "ll", 4, 0),
		gid(2, FX_GID_ROCE_V1, "v4:10.0.0.1", 4, 0), gid(3, FX_GID_ROCE_V2, "v4:10.0.0.1", 4, 0),
		gid(4, FX_GID_ROCE_V1, "v4:192.168.100.1", 9, 1),
		gid(5, FX_GID_ROCE_V2, "v4:192.168.100.1", 9, 1),
		gid(6, FX_GID_ROCE_V2, "g6", 4, 0),
	};
	size_t n = sizeof(t) / sizeof(t[0]);

	CHECK(fx_choose_gid(t, n, 1, 1, UINT32_MAX, 0) == 3, "IPv4 RoCE v2 on the port's netdev first");
	CHECK(fx_choose_gid(t, n, 1, 1, UINT32_MAX, 9) == 5, "OFFLOAD_FLEXIO_NETDEV picks the VLAN");
	CHECK(fx_choose_gid(t, n, 1, 1, 4, 0) == 4, "a forced index wins");
	CHECK(fx_choose_gid(t, n, 2, 1, UINT32_MAX, 0) == -1, "nothing on another port");
	CHECK(fx_choose_gid(t, 3, 1, 1, UINT32_MAX, 0) == 1, "link-local v2 only as the last resort");
	CHECK(fx_choose_gid(t, 1, 1, 1, UINT32_MAX, 0) == -1, "never RoCE v1: not routable");
	{
		struct fx_gid ib[] = { gid(0, FX_GID_IB, "ll", 0, 0) };

		CHECK(fx_choose_gid(ib, 1, 1, 0, UINT32_MAX, 0) == 0, "InfiniBand: the IB GID");
	}
	{
		struct fx_gid six[] = { t[1], t[6] };

		CHECK(fx_choose_gid(six, 2, 1, 1, UINT32_MAX, 0) == 1, "global IPv6 before link-local");
	}
}

static void next_hop(void)
{
	static const uint8_t own[6] = { 0x02, 0, 0, 0, 0, 1 }, gw_mac[6] = { 0x02, 0, 0, 0, 0, 0x99 },
			     peer_mac[6] = { 0x02, 0, 0, 0, 0, 0x22 };
	struct fx_neigh tab[3];
	struct fx_route r;
	uint8_t dst[16], mac[6], hop[16];

	memset(tab, 0, sizeof(tab));
	v4(tab[0].ip, 10, 0, 0, 254);     /* the router on eth0 */
	tab[0].ifindex = 4;
	memcpy(tab[0].mac, gw_mac, 6);
	v4(tab[1].ip, 10, 0, 0, 2);       /* a peer on our subnet */
	tab[1].ifindex = 4;
	memcpy(tab[1].mac, peer_mac, 6);
	v4(tab[2].ip, 10, 0, 0, 2);       /* the same address on another netdev */
	tab[2].ifindex = 7;
	memset(tab[2].mac, 0xee, 6);

	v4(dst, 10, 1, 0, 5);             /* a peer behind the router */
	memset(&r, 0, sizeof(r));
	r.has_gateway = 1;
	v4(r.gateway, 10, 0, 0, 254);
	r.oif = 4;
	CHECK(!fx_next_hop_mac(dst, &r, tab, 3, own, mac, hop) && !memcmp(mac, gw_mac, 6),
	      "routed: the gateway's MAC, not the peer's");

	v4(dst, 10, 0, 0, 2);
	memset(&r, 0, sizeof(r));
	r.oif = 4;
	CHECK(!fx_next_hop_mac(dst, &r, tab, 3, own, mac, hop) && !memcmp(mac, peer_mac, 6),
	      "directly connected: the peer's MAC on the route's netdev");

	r.local = 1;
	CHECK(!fx_next_hop_mac(dst, &r, tab, 0, own, mac, hop) && !memcmp(mac, own, 6),
	      "this host: our own MAC");

	memset(&r, 0, sizeof(r));
	r.has_gateway = 1;
	v4(r.gateway, 10, 0, 0, 253);
	r.oif = 4;
	v4(dst, 10, 1, 0, 5);
	CHECK(fx_next_hop_mac(dst, &r, tab, 3, own, mac, hop) == -EHOSTUNREACH &&
	      hop[15] == 253, "no neighbour entry: unreachable, naming the next hop");
}

static void kernel(void)
{
	struct fx_neigh tab[256];
	struct fx_route r;
	uint8_t lo[16];
	size_t n = 0;
	int rc;

	v4(lo, 127, 0, 0, 1);
	rc = fx_kernel_route(lo, if_nametoindex("lo"), &r);
	CHECK(!rc && r.local, "the kernel routes 127.0.0.1 locally (rc %d)", rc);
	rc = fx_kernel_neighbours(tab, 256, &n);
	CHECK(!rc, "the neighbour tables can be read (rc %d)", rc);
}

int main(void)
{
	gid_choice();
	next_hop();
	kernel();
	if (!failures)
		printf("flexio addressing: all checks passed\n");
	return failures ? 1 : 0;
}

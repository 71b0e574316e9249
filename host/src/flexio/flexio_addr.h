/* SPDX-License-Identifier: Apache-2.0 */
/*
 * RoCE addressing of the FlexIO backend, as decisions over plain data (flexio_addr.c),
 * so that tests feed them a GID table, a route and a neighbour table of their own
 * (tests/c/flexio_addr_test.c), and the system calls that gather that data.
 */
#ifndef FLEXIO_ADDR_H
#define FLEXIO_ADDR_H

#include <stddef.h>
#include <stdint.h>

enum fx_gid_kind {      /* what a GID entry is, for choosing one */
	FX_GID_IB = 0,
	FX_GID_ROCE_V1 = 1,
	FX_GID_ROCE_V2 = 2,
};

struct fx_gid {
	uint8_t raw[16];
	uint32_t index;
	uint32_t port;
	uint32_t kind;          /* enum fx_gid_kind */
	uint32_t ifindex;       /* the netdev it belongs to */
	int vlan;               /* that netdev is a VLAN device */
};

/*
 * Which GID of port `port` to use (an index into gids, or -1). Ethernet (RoCE): only RoCE
 * v2 GIDs, which a router forwards (v1 is layer 2 only); among them an IPv4-mapped one
 * (::ffff:a.b.c.d) first, then a global IPv6 one, link-local (fe80::/10) last, as a routed
 * fabric needs; a GID on the port's own netdev before one on a VLAN device, unless
 * `ifindex` names the netdev (a VLAN device for a VLAN) to use, which then is the only
 * choice. InfiniBand: the IB GID. `forced` (not UINT32_MAX) picks by GID index, whatever.
 */
int fx_choose_gid(const struct fx_gid *gids, size_t n, uint32_t port, int eth, uint32_t forced,
		  uint32_t ifindex);

/* Is this GID an IPv4 address (::ffff:a.b.c.d)? */
int fx_gid_is_v4(const uint8_t raw[16]);

/* The kernel's route to a destination, as RTM_GETROUTE answers it. */
struct fx_route {
	int local;              /* RTN_LOCAL: the destination is an address of this host */
	int has_gateway;
	uint8_t gateway[16];    /* IPv4-mapped for IPv4, like GIDs */
	uint32_t oif;
};

struct fx_neigh {       /* a neighbour table entry in a usable state */
	uint8_t ip[16];         /* IPv4-mapped for IPv4 */
	uint32_t ifindex;
	uint8_t mac[6];
};

/*
 * The destination MAC of a RoCE packet to dst: our own netdev's MAC when dst is this host
 * (the NIC loops it back), else the MAC of the next hop: the route's gateway when it has
 * one (a routed fabric), dst itself when it is directly connected; looked up in the
 * neighbour table on the route's netdev. 0, or -EHOSTUNREACH with *next_hop set to the
 * address that has no neighbour entry.
 */
int fx_next_hop_mac(const uint8_t dst[16], const struct fx_route *route,
		    const struct fx_neigh *neigh, size_t nneigh, const uint8_t own_mac[6],
		    uint8_t mac[6], uint8_t next_hop[16]);

/* System side (flexio_netlink.c): route and neighbours from the kernel, MAC and VLAN-ness
 * of a netdev from sysfs. Return 0 or -errno. */
int fx_kernel_route(const uint8_t dst[16], uint32_t oif, struct fx_route *out);
int fx_kernel_neighbours(struct fx_neigh *out, size_t max, size_t *n);
int fx_netdev_mac(uint32_t ifindex, uint8_t mac[6]);
int fx_netdev_is_vlan(uint32_t ifindex);
void fx_ip_text(const uint8_t ip[16], char *out, size_t len);

#endif

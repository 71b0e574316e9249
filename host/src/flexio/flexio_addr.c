/* SPDX-License-Identifier: Apache-2.0 */
/* RoCE addressing decisions of the FlexIO backend (see flexio_addr.h): no system calls. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "flexio_addr.h"

static const uint8_t v4_prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

int fx_gid_is_v4(const uint8_t raw[16])
{
	return !memcmp(raw, v4_prefix, sizeof(v4_prefix));
}

static int is_link_local(const uint8_t raw[16])
{
	return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

static int is_zero(const uint8_t raw[16])
{
	static const uint8_t zero[16];

	return !memcmp(raw, zero, 16);
}

/* Lower is better; -1: not a candidate. */
static int rank_of(const struct fx_gid *g, int eth, uint32_t ifindex)
{
	if (is_zero(g->raw))
		return -1;
	if (!eth)
		return g->kind == FX_GID_IB ? 0 : -1;
	if (g->kind != FX_GID_ROCE_V2 || (ifindex && g->ifindex != ifindex))
		return -1;
	return (fx_gid_is_v4(g->raw) ? 0 : is_link_local(g->raw) ? 4 : 2) + (g->vlan && !ifindex);
}

int fx_choose_gid(const struct fx_gid *gids, size_t n, uint32_t port, int eth, uint32_t forced,
		  uint32_t ifindex)
{
	int best = -1, best_rank = 0;

	for (size_t i = 0; i < n; i++) {
		int r;

		if (gids[i].port != port)
			continue;
		if (forced != UINT32_MAX) {
			if (gids[i].index == forced)
				return (int)i;
			continue;
		}
		r = rank_of(&gids[i], eth, ifindex);
		if (r >= 0 && (best < 0 || r < best_rank ||
			       (r == best_rank && gids[i].index < gids[best].index))) {
			best = (int)i;
			best_rank = r;
		}
	}
	return best;
}

int fx_next_hop_mac(const uint8_t dst[16], const struct fx_route *route,
		    const struct fx_neigh *neigh, size_t nneigh, const uint8_t own_mac[6],
		    uint8_t mac[6], uint8_t next_hop[16])
{
	const uint8_t *hop = route->has_gateway ? route->gateway : dst;

	memcpy(next_hop, hop, 16);
	if (route->local) {
		memcpy(mac, own_mac, 6);
		return 0;
	}
	for (size_t i = 0; i < nneigh; i++) {
		if (neigh[i].ifindex != route->oif || memcmp(neigh[i].ip, hop, 16))
			continue;
		memcpy(mac, neigh[i].mac, 6);
		return 0;
	}
	return -EHOSTUNREACH;
}

void fx_ip_text(const uint8_t ip[16], char *out, size_t len)
{
	if (fx_gid_is_v4(ip)) {
		snprintf(out, len, "%u.%u.%u.%u", ip[12], ip[13], ip[14], ip[15]);
		return;
	}
	snprintf(out, len, "%x:%x:%x:%x:%x:%x:%x:%x", ip[0] << 8 | ip[1], ip[2] << 8 | ip[3],
		 ip[4] << 8 | ip[5], ip[6] << 8 | ip[7], ip[8] << 8 | ip[9], ip[10] << 8 | ip[11],
		 ip[12] << 8 | ip[13], ip[14] << 8 | ip[15]);
}

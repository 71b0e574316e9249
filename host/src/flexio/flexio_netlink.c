/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the kernel knows about RoCE addresses (flexio_addr.h): the route to a destination
 * (rtnetlink RTM_GETROUTE, as `ip route get` asks), the neighbour tables (RTM_GETNEIGH,
 * as `ip neigh`), a netdev's MAC and whether it is a VLAN device (sysfs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "flexio_addr.h"

#define NL_BUF 32768

static int nl_open(void)
{
	struct timeval tv = { 2, 0 };
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);

	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void to_mapped(int family, const void *addr, uint8_t out[16])
{
	memset(out, 0, 16);
	if (family == AF_INET) {
		out[10] = out[11] = 0xff;
		memcpy(out + 12, addr, 4);
	} else {
		memcpy(out, addr, 16);
	}
}

int fx_kernel_route(const uint8_t dst[16], uint32_t oif, struct fx_route *out)
{
	struct {
		struct nlmsghdr nh;
		struct rtmsg rt;
		char attrs[64];
	} req;
	int v4 = fx_gid_is_v4(dst), fd = nl_open(), rc = -EIO;
	char *buf = malloc(NL_BUF);
	struct rtattr *a;
	ssize_t n;

	memset(out, 0, sizeof(*out));
	if (fd < 0 || !buf) {
		rc = -errno;
		goto done;
	}
	memset(&req, 0, sizeof(req));
	req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct rtmsg));
	req.nh.nlmsg_type = RTM_GETROUTE;
	req.nh.nlmsg_flags = NLM_F_REQUEST;
	req.rt.rtm_family = v4 ? AF_INET : AF_INET6;
	req.rt.rtm_dst_len = v4 ? 32 : 128;
	a = (struct rtattr *)((char *)&req + NLMSG_ALIGN(req.nh.nlmsg_len));
	a->rta_type = RTA_DST;
	a->rta_len = RTA_LENGTH(v4 ? 4 : 16);
	memcpy(RTA_DATA(a), v4 ? dst + 12 : dst, v4 ? 4 : 16);
	req.nh.nlmsg_len = NLMSG_ALIGN(req.nh.nlmsg_len) + RTA_ALIGN(a->rta_len);
	if (oif) {   /* the GID's netdev (a VLAN device for a VLAN): route as it would */
		a = (struct rtattr *)((char *)&req + req.nh.nlmsg_len);
		a->rta_type = RTA_OIF;
		a->rta_len = RTA_LENGTH(4);
		memcpy(RTA_DATA(a), &oif, 4);
		req.nh.nlmsg_len += RTA_ALIGN(a->rta_len);
	}
	if (send(fd, &req, req.nh.nlmsg_len, 0) < 0 || (n = recv(fd, buf, NL_BUF, 0)) < 0) {
		rc = -errno;
		goto done;
	}
	for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n);
	     h = NLMSG_NEXT(h, n)) {
		struct rtmsg *rt = NLMSG_DATA(h);
		int len = (int)RTM_PAYLOAD(h);

		if (h->nlmsg_type == NLMSG_ERROR) {
			rc = ((struct nlmsgerr *)NLMSG_DATA(h))->error;
			rc = rc ? rc : -EIO;
			goto done;
		}
		if (h->nlmsg_type != RTM_NEWROUTE)
			continue;
		out->local = rt->rtm_type == RTN_LOCAL;
		for (struct rtattr *r = RTM_RTA(rt); RTA_OK(r, len); r = RTA_NEXT(r, len)) {
			if (r->rta_type == RTA_GATEWAY) {
				to_mapped(rt->rtm_family, RTA_DATA(r), out->gateway);
				out->has_gateway = 1;
			} else if (r->rta_type == RTA_OIF) {
				memcpy(&out->oif, RTA_DATA(r), 4);
			}
		}
		rc = 0;
		break;
	}
done:
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

static int neigh_dump(int family, struct fx_neigh *out, size_t max, size_t *n)
{
	struct {
		struct nlmsghdr nh;
		struct ndmsg nd;
	} req;
	int fd = nl_open(), rc = 0, done = 0;
	char *buf = malloc(NL_BUF);

	if (fd < 0 || !buf) {
		rc = -errno;
		goto out;
	}
	memset(&req, 0, sizeof(req));
	req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct ndmsg));
	req.nh.nlmsg_type = RTM_GETNEIGH;
	req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.nd.ndm_family = (uint8_t)family;
	if (send(fd, &req, req.nh.nlmsg_len, 0) < 0) {
		rc = -errno;
		goto out;
	}
	while (!done) {
		ssize_t len = recv(fd, buf, NL_BUF, 0);

		if (len <= 0) {
			rc = len < 0 ? -errno : -EIO;
			break;
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)len);
		     h = NLMSG_NEXT(h, len)) {
			struct ndmsg *nd = NLMSG_DATA(h);
			int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*nd)));
			struct fx_neigh e;
			int has_ip = 0, has_mac = 0;

			if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
				done = 1;
				break;
			}
			if (h->nlmsg_type != RTM_NEWNEIGH ||
			    !(nd->ndm_state & (NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE |
						NUD_PERMANENT | NUD_NOARP)))
				continue;
			memset(&e, 0, sizeof(e));
			e.ifindex = (uint32_t)nd->ndm_ifindex;
			for (struct rtattr *r = (struct rtattr *)((char *)nd + NLMSG_ALIGN(sizeof(*nd)));
			     RTA_OK(r, alen); r = RTA_NEXT(r, alen)) {
				if (r->rta_type == NDA_DST) {
					to_mapped(family, RTA_DATA(r), e.ip);
					has_ip = 1;
				} else if (r->rta_type == NDA_LLADDR && RTA_PAYLOAD(r) == 6) {
					memcpy(e.mac, RTA_DATA(r), 6);
					has_mac = 1;
				}
			}
			if (has_ip && has_mac && *n < max)
				out[(*n)++] = e;
		}
	}
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

int fx_kernel_neighbours(struct fx_neigh *out, size_t max, size_t *n)
{
	int rc;

	*n = 0;
	rc = neigh_dump(AF_INET, out, max, n);
	if (!rc)
		rc = neigh_dump(AF_INET6, out, max, n);
	return rc;
}

static FILE *sys_net(uint32_t ifindex, const char *what)
{
	char ifname[IF_NAMESIZE], path[64 + IF_NAMESIZE];

	if (!if_indextoname(ifindex, ifname))
		return NULL;
	snprintf(path, sizeof(path), "/sys/class/net/%s/%s", ifname, what);
	return fopen(path, "r");
}

int fx_netdev_mac(uint32_t ifindex, uint8_t mac[6])
{
	FILE *f = sys_net(ifindex, "address");
	int n;

	if (!f)
		return -ENODEV;
	n = fscanf(f, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &mac[0], &mac[1], &mac[2], &mac[3], &mac[4],
		   &mac[5]);
	fclose(f);
	return n == 6 ? 0 : -EINVAL;
}

int fx_netdev_is_vlan(uint32_t ifindex)
{
	FILE *f = sys_net(ifindex, "uevent");
	char line[128];
	int vlan = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		vlan |= !strncmp(line, "DEVTYPE=vlan", 12);
	fclose(f);
	return vlan;
}

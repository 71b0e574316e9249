/* SPDX-License-Identifier: Apache-2.0 */
/* The model's fabric over abstract unix stream sockets (see fxm_wire.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fxm.h"
#include "fxm_wire.h"

#define WIRE_MAX_CONNS 1024
#define WIRE_MAX_FRAME (1u << 20)

enum { CONN_FREE = 0, CONN_OUT, CONN_IN };

struct wire_conn {
	int kind;
	int fd;
	uint8_t lport;
	uint32_t dst;           /* CONN_OUT: peer address */
	int broken;
	uint8_t *in;            /* CONN_IN: partial frames */
	uint32_t in_len, in_cap;
	uint8_t *out;           /* CONN_OUT: bytes the socket did not take yet */
	uint32_t out_len, out_cap;
};

static struct {
	int epfd;
	int wakefd;
	struct wire_conn conns[WIRE_MAX_CONNS];
	/* messages to our own ports: delivered by the next poll */
	uint8_t *local;
	uint32_t local_len, local_cap;
} wire = { .epfd = -1, .wakefd = -1 };

/* epoll data: index into conns, or one of these. */
#define TAG_WAKE   0xffffffffu
#define TAG_LISTEN 0xfffffff0u   /* + port index */

static socklen_t wire_addr(uint32_t ipv4, struct sockaddr_un *sa)
{
	int n;

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "dpaoffload-fxm-%u-%08x",
		     (unsigned)getuid(), ipv4);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int grow(uint8_t **buf, uint32_t *cap, uint32_t need)
{
	uint32_t c = *cap ? *cap : 4096;
	uint8_t *p;

	while (c < need)
		c *= 2;
	if (c == *cap)
		return 0;
	p = realloc(*buf, c);
	if (!p)
		return -1;
	*buf = p;
	*cap = c;
	return 0;
}

static void conn_close(struct wire_conn *c)
{
	if (c->fd >= 0) {
		epoll_ctl(wire.epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	free(c->in);
	free(c->out);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static struct wire_conn *conn_alloc(int kind, int fd, uint8_t lport)
{
	for (uint32_t i = 0; i < WIRE_MAX_CONNS; i++) {
		struct wire_conn *c = &wire.conns[i];
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.u32 = i };

		if (c->kind != CONN_FREE)
			continue;
		memset(c, 0, sizeof(*c));
		c->kind = kind;
		c->fd = fd;
		c->lport = lport;
		if (epoll_ctl(wire.epfd, EPOLL_CTL_ADD, fd, &ev)) {
			c->kind = CONN_FREE;
			return NULL;
		}
		return c;
	}
	return NULL;
}

/* Bind a port to a free address: 127.x.y.z from the pid, the port and a salt. */
static int port_listen(struct fxm_port *p)
{
	for (uint32_t salt = 0; salt < 64; salt++) {
		uint32_t h = ((uint32_t)getpid() * 2654435761u) ^ (p->num * 40503u) ^ (salt * 97u);
		uint32_t ip = (127u << 24) | ((1 + (h >> 16) % 254) << 16) | (h & 0xfffeu) | 1u;
		struct sockaddr_un sa;
		socklen_t len = wire_addr(ip, &sa);
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = TAG_LISTEN + p->num - 1u };

		if (fd < 0)
			return -1;
		if (!bind(fd, (struct sockaddr *)&sa, len) && !listen(fd, 512) &&
		    !epoll_ctl(wire.epfd, EPOLL_CTL_ADD, fd, &ev)) {
			p->listen_fd = fd;
			p->ipv4 = ip;
			return 0;
		}
		close(fd);
	}
	return -1;
}

static void port_gids(struct fxm_port *p)
{
	uint8_t ip[4] = { (uint8_t)(p->ipv4 >> 24), (uint8_t)(p->ipv4 >> 16),
			  (uint8_t)(p->ipv4 >> 8), (uint8_t)p->ipv4 };
	union ibv_gid ll, v4;

	/* fe80::IID with the address in its last four bytes (a model choice: any stable
	 * interface id would do), and ::ffff:a.b.c.d as IPv4 RoCE GIDs are formed. */
	memset(&ll, 0, sizeof(ll));
	ll.raw[0] = 0xfe;
	ll.raw[1] = 0x80;
	ll.raw[8] = 0x02;
	ll.raw[11] = 0xff;
	ll.raw[12] = ip[0];
	ll.raw[13] = ip[1];
	ll.raw[14] = ip[2];
	ll.raw[15] = ip[3];
	memset(&v4, 0, sizeof(v4));
	v4.raw[10] = v4.raw[11] = 0xff;
	memcpy(&v4.raw[12], ip, 4);
	p->gid[0] = p->gid[1] = ll;
	p->gid[2] = p->gid[3] = v4;
	p->gid_type[0] = p->gid_type[2] = IBV_GID_TYPE_ROCE_V1;
	p->gid_type[1] = p->gid_type[3] = IBV_GID_TYPE_ROCE_V2;
}

int fxm_wire_open(void)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = TAG_WAKE };

	wire.epfd = epoll_create1(EPOLL_CLOEXEC);
	wire.wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (wire.epfd < 0 || wire.wakefd < 0 ||
	    epoll_ctl(wire.epfd, EPOLL_CTL_ADD, wire.wakefd, &ev))
		return -1;
	for (uint32_t i = 0; i < WIRE_MAX_CONNS; i++)
		wire.conns[i].fd = -1;
	for (uint32_t i = 0; i < fxm.nports; i++) {
		if (port_listen(&fxm.ports[i]))
			return -1;
		port_gids(&fxm.ports[i]);
	}
	return 0;
}

void fxm_wire_close(void)
{
	for (uint32_t i = 0; i < WIRE_MAX_CONNS; i++)
		if (wire.conns[i].kind != CONN_FREE)
			conn_close(&wire.conns[i]);
	for (uint32_t i = 0; i < fxm.nports; i++) {
		if (fxm.ports[i].listen_fd >= 0)
			close(fxm.ports[i].listen_fd);
		fxm.ports[i].listen_fd = -1;
	}
	if (wire.epfd >= 0)
		close(wire.epfd);
	if (wire.wakefd >= 0)
		close(wire.wakefd);
	wire.epfd = wire.wakefd = -1;
	free(wire.local);
	wire.local = NULL;
	wire.local_len = wire.local_cap = 0;
}

void fxm_wire_wake(void)
{
	uint64_t one = 1;

	if (wire.wakefd >= 0 && write(wire.wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		fxm_log("wake: %s", strerror(errno));
}

static struct wire_conn *conn_out(uint8_t lport, uint32_t dst)
{
	struct sockaddr_un sa;
	socklen_t len;
	struct wire_conn *c;
	int fd;

	for (uint32_t i = 0; i < WIRE_MAX_CONNS; i++) {
		c = &wire.conns[i];
		if (c->kind == CONN_OUT && c->lport == lport && c->dst == dst) {
			if (!c->broken)
				return c;
			conn_close(c);  /* try again: the peer may listen anew (it will not) */
			break;
		}
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return NULL;
	len = wire_addr(dst, &sa);
	if (connect(fd, (struct sockaddr *)&sa, len)) {
		close(fd);
		return NULL;
	}
	if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0) {
		close(fd);
		return NULL;
	}
	c = conn_alloc(CONN_OUT, fd, lport);
	if (!c) {
		close(fd);
		return NULL;
	}
	c->dst = dst;
	return c;
}

static void conn_flush(struct wire_conn *c)
{
	while (c->out_len && !c->broken) {
		ssize_t n = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			c->broken = 1;
			break;
		}
		memmove(c->out, c->out + n, c->out_len - (uint32_t)n);
		c->out_len -= (uint32_t)n;
	}
	if (!c->broken) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP |
						    (c->out_len ? EPOLLOUT : 0),
					  .data.u32 = (uint32_t)(c - wire.conns) };

		epoll_ctl(wire.epfd, EPOLL_CTL_MOD, c->fd, &ev);
	}
}

int fxm_wire_send(uint8_t lport, uint32_t dst, const void *msg, uint32_t len)
{
	struct fxm_port *p = fxm_port(lport);
	struct wire_conn *c;
	uint32_t frame = len;

	if (!p || !__atomic_load_n(&p->up, __ATOMIC_ACQUIRE))
		return -1;
	for (uint32_t i = 0; i < fxm.nports; i++) {
		if (fxm.ports[i].ipv4 != dst)
			continue;
		if (!__atomic_load_n(&fxm.ports[i].up, __ATOMIC_ACQUIRE))
			return -1;
		/* To ourselves: [lport][dst port][len][msg] in the local queue. */
		if (grow(&wire.local, &wire.local_cap, wire.local_len + 8 + len))
			return -1;
		wire.local[wire.local_len] = (uint8_t)(i + 1);
		memcpy(wire.local + wire.local_len + 4, &frame, 4);
		memcpy(wire.local + wire.local_len + 8, msg, len);
		wire.local_len += 8 + len;
		fxm_wire_wake();
		return 0;
	}
	c = conn_out(lport, dst);
	if (!c || c->broken) {
		if (fxm_verbose())
			fxm_log("port %u: no connection to %08x (%s)", lport, dst,
				c ? "broken" : strerror(errno));
		return -1;
	}
	if (grow(&c->out, &c->out_cap, c->out_len + 4 + len))
		return -1;
	memcpy(c->out + c->out_len, &frame, 4);
	memcpy(c->out + c->out_len + 4, msg, len);
	c->out_len += 4 + len;
	conn_flush(c);
	if (c->broken && fxm_verbose())
		fxm_log("port %u: the connection to %08x broke: %s", lport, dst, strerror(errno));
	return c->broken ? -1 : 0;
}

int fxm_wire_alive(uint8_t lport, uint32_t dst)
{
	struct fxm_port *p = fxm_port(lport);

	if (!p || !__atomic_load_n(&p->up, __ATOMIC_ACQUIRE))
		return 0;
	for (uint32_t i = 0; i < fxm.nports; i++)
		if (fxm.ports[i].ipv4 == dst)
			return __atomic_load_n(&fxm.ports[i].up, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < WIRE_MAX_CONNS; i++) {
		struct wire_conn *c = &wire.conns[i];

		if (c->kind == CONN_OUT && c->lport == lport && c->dst == dst)
			return !c->broken;
	}
	return 0;
}

static void conn_read(struct wire_conn *c, fxm_wire_rx_fn rx)
{
	for (;;) {
		ssize_t n;

		if (grow(&c->in, &c->in_cap, c->in_len + 65536)) {
			c->broken = 1;
			return;
		}
		n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
			c->broken = 1;
			break;
		}
		if (n < 0)
			break;
		c->in_len += (uint32_t)n;
	}
	uint32_t off = 0;

	while (c->in_len - off >= 4) {
		uint32_t len;

		memcpy(&len, c->in + off, 4);
		if (len > WIRE_MAX_FRAME) {
			c->broken = 1;
			return;
		}
		if (c->in_len - off - 4 < len)
			break;
		rx(c->lport, c->in + off + 4, len);
		off += 4 + len;
	}
	memmove(c->in, c->in + off, c->in_len - off);
	c->in_len -= off;
}

void fxm_wire_poll(int timeout_ms, fxm_wire_rx_fn rx)
{
	struct epoll_event evs[64];
	int n;

	if (wire.local_len)
		timeout_ms = 0;
	n = epoll_wait(wire.epfd, evs, 64, timeout_ms);
	for (int i = 0; i < n; i++) {
		uint32_t tag = evs[i].data.u32;

		if (tag == TAG_WAKE) {
			uint64_t v;

			if (read(wire.wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				fxm_log("wake read: %s", strerror(errno));
		} else if (tag >= TAG_LISTEN) {
			struct fxm_port *p = &fxm.ports[tag - TAG_LISTEN];
			int fd;

			while ((fd = accept4(p->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0)
				if (!conn_alloc(CONN_IN, fd, p->num))
					close(fd);
		} else if (tag < WIRE_MAX_CONNS) {
			struct wire_conn *c = &wire.conns[tag];

			if (c->kind == CONN_IN && (evs[i].events & EPOLLIN))
				conn_read(c, rx);
			if (c->kind == CONN_OUT && (evs[i].events & EPOLLOUT))
				conn_flush(c);
			if (evs[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP))
				c->broken = 1;
			if (c->kind == CONN_IN && c->broken)
				conn_close(c);
			else if (c->kind == CONN_OUT && c->broken && c->fd >= 0)
				epoll_ctl(wire.epfd, EPOLL_CTL_DEL, c->fd, NULL);
		}
	}
	/* Our own ports' messages, in order; new ones queued meanwhile wait a round. */
	if (wire.local_len) {
		uint32_t len = wire.local_len, off = 0;
		uint8_t *batch = wire.local;

		wire.local = NULL;
		wire.local_len = wire.local_cap = 0;
		while (off < len) {
			uint32_t frame;

			memcpy(&frame, batch + off + 4, 4);
			rx(batch[off], batch + off + 8, frame);
			off += 8 + frame;
		}
		free(batch);
	}
}

void fxm_wire_port_down(uint8_t lport)
{
	struct fxm_port *p = fxm_port(lport);

	if (!p)
		return;
	__atomic_store_n(&p->up, 0, __ATOMIC_RELEASE);
	if (p->listen_fd >= 0) {
		epoll_ctl(wire.epfd, EPOLL_CTL_DEL, p->listen_fd, NULL);
		close(p->listen_fd);
		p->listen_fd = -1;
	}
	for (uint32_t i = 0; i < WIRE_MAX_CONNS; i++)
		if (wire.conns[i].kind != CONN_FREE && wire.conns[i].lport == lport)
			conn_close(&wire.conns[i]);
}

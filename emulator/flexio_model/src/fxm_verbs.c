/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's libibverbs, device side: one device, "mlx5_0", a BlueField-3 (PCI part
 * 0xa2dc) with FXM_PORTS Ethernet ports (default 2), its GID tables, protection domains
 * and memory registrations. Queues and the NIC are in fxm_hostq.c and fxm_nic.c.
 *
 * Addressing. Each port of each process is a RoCE endpoint with an IPv4 address of its
 * own, 127.x.y.z (unique among live processes: it names the port's listening socket),
 * and the GID table a ConnectX builds for one address on one netdev: [0] fe80::/64
 * link-local RoCE v1, [1] the same as RoCE v2, [2] ::ffff:a.b.c.d RoCE v1, [3] the same as
 * RoCE v2, all on the loopback netdev. The fabric between the ports is routed (layer 3):
 * traffic between two ports only flows with RoCE v2 GIDs that are not link-local, as in
 * a routed RoCE data centre. That is the stricter of the fabrics a card meets.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "fxm.h"

struct fxm_state fxm = { .lock = PTHREAD_MUTEX_INITIALIZER, .next_cqn = 0x400,
			 .next_qpn = 0x1000, .next_pd = 1 };

struct ibv_device {
	char name[64];
};

static struct ibv_device fxm_device = { .name = "mlx5_0" };

void fxm_log(const char *fmt, ...)
{
	va_list ap;
	char line[512];

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "flexio model [%d]: %s\n", (int)getpid(), line);
}

int fxm_verbose(void)
{
	static int v = -1;

	if (v < 0) {
		const char *s = getenv("FXM_VERBOSE");

		v = s && *s ? atoi(s) : 0;
	}
	return v;
}

uint64_t fxm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t fxm_env_u32(const char *name, uint32_t dflt, uint32_t lo, uint32_t hi)
{
	const char *s = getenv(name);
	char *end;
	unsigned long v;

	if (!s || !*s)
		return dflt;
	v = strtoul(s, &end, 0);
	if (*end || v < lo || v > hi) {
		fxm_log("ignoring %s=%s (expected %u..%u)", name, s, lo, hi);
		return dflt;
	}
	return (uint32_t)v;
}

/* ------------------------------------------------------------------ devices */

struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list = calloc(2, sizeof(*list));

	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	list[0] = &fxm_device;
	if (num_devices)
		*num_devices = 1;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}

/* Ports: FXM_PORTS of them; fault injection from OFFLOAD_FXM_PORT_FAULTS, "RAIL@BYTES,..."
 * (rail = port - 1): the port goes down once this process sent that many bytes on it. */
static void fxm_ports_init(void)
{
	const char *faults = getenv("OFFLOAD_FXM_PORT_FAULTS");

	fxm.nports = fxm_env_u32("FXM_PORTS", 2, 1, FXM_MAX_PORTS);
	for (uint32_t i = 0; i < fxm.nports; i++) {
		fxm.ports[i] = (struct fxm_port){ .num = (uint8_t)(i + 1), .up = 1,
			.down_after = UINT64_MAX, .listen_fd = -1 };
	}
	while (faults && *faults) {
		unsigned rail;
		unsigned long long after;
		int used = 0;

		if (sscanf(faults, "%u@%llu%n", &rail, &after, &used) != 2) {
			fxm_log("bad OFFLOAD_FXM_PORT_FAULTS entry at '%s' (want RAIL@BYTES)", faults);
			break;
		}
		if (rail < fxm.nports)
			fxm.ports[rail].down_after = after;
		faults += used;
		faults += *faults == ',';
	}
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct ibv_context *ctx;

	if (device != &fxm_device) {
		errno = ENODEV;
		return NULL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	ctx->device = device;
	ctx->cmd_fd = ctx->async_fd = -1;
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	pthread_mutex_lock(&fxm.lock);
	if (fxm.users++ == 0)
		fxm_ports_init();
	pthread_mutex_unlock(&fxm.lock);
	if (fxm_nic_get()) {
		pthread_mutex_lock(&fxm.lock);
		fxm.users--;
		pthread_mutex_unlock(&fxm.lock);
		free(ctx);
		errno = EIO;
		return NULL;
	}
	return ctx;
}

int ibv_close_device(struct ibv_context *context)
{
	if (!context)
		return EINVAL;
	fxm_nic_put();
	pthread_mutex_lock(&fxm.lock);
	fxm.users--;
	pthread_mutex_unlock(&fxm.lock);
	pthread_mutex_destroy(&context->mutex);
	free(context);
	return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	if (!context || !attr)
		return EINVAL;
	memset(attr, 0, sizeof(*attr));
	snprintf(attr->fw_ver, sizeof(attr->fw_ver), "%s", FXM_FW_VERSION);
	attr->vendor_id = FXM_VENDOR_ID;
	attr->vendor_part_id = FXM_PART_BF3;
	attr->max_mr_size = UINT64_MAX;
	attr->page_size_cap = 4096;
	attr->max_qp = 1 << 17;
	attr->max_qp_wr = 1 << 15;
	attr->max_sge = 30;
	attr->max_cq = 1 << 16;
	attr->max_cqe = 1 << 22;
	attr->max_mr = 1 << 20;
	attr->max_pd = 1 << 16;
	attr->max_qp_rd_atom = 16;
	attr->max_qp_init_rd_atom = 16;
	attr->atomic_cap = IBV_ATOMIC_HCA;
	attr->phys_port_cnt = (uint8_t)fxm.nports;
	return 0;
}

int ibv_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			struct ibv_device_attr_ex *attr)
{
	int rc;

	if (!attr || (input && input->comp_mask))
		return EINVAL;
	memset(attr, 0, sizeof(*attr));
	rc = ibv_query_device(context, &attr->orig_attr);
	if (rc)
		return rc;
	/* ConnectX-5 and later report implicit ODP (rdma-core mlx5 provider). */
	attr->odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
	return 0;
}

struct fxm_port *fxm_port(uint8_t num)
{
	return num >= 1 && num <= fxm.nports ? &fxm.ports[num - 1] : NULL;
}

int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr)
{
	struct fxm_port *p = fxm_port(port_num);

	if (!context || !attr || !p)
		return EINVAL;
	memset(attr, 0, sizeof(*attr));
	attr->state = __atomic_load_n(&p->up, __ATOMIC_ACQUIRE) ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
	attr->max_mtu = IBV_MTU_4096;
	attr->active_mtu = IBV_MTU_4096;
	attr->gid_tbl_len = FXM_GIDS_PER_PORT;
	attr->max_msg_sz = 0x80000000u;
	attr->pkey_tbl_len = 1;
	attr->lid = 0;              /* RoCE: no LIDs */
	attr->link_layer = IBV_LINK_LAYER_ETHERNET;
	attr->phys_state = attr->state == IBV_PORT_ACTIVE ? 5 : 3;  /* LinkUp / Disabled */
	return 0;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	struct fxm_port *p = fxm_port(port_num);

	if (!context || !p || index < 0 || (uint32_t)index >= FXM_GIDS_PER_PORT || !gid)
		return -1;
	*gid = p->gid[index];
	return 0;
}

ssize_t ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
			    size_t max_entries, uint32_t flags)
{
	unsigned lo = if_nametoindex("lo");
	size_t n = 0;

	if (!context || flags) {
		errno = EINVAL;
		return -EINVAL;
	}
	for (uint32_t p = 0; p < fxm.nports; p++)
		for (uint32_t i = 0; i < FXM_GIDS_PER_PORT; i++) {
			if (n == max_entries) {
				errno = EINVAL;
				return -EINVAL;  /* rdma-core: the array is too small */
			}
			entries[n++] = (struct ibv_gid_entry){ .gid = fxm.ports[p].gid[i],
				.gid_index = i, .port_num = p + 1, .gid_type = fxm.ports[p].gid_type[i],
				.ndev_ifindex = lo };
		}
	return (ssize_t)n;
}

/* A destination the routed fabric forwards to: RoCE v2, not link-local (fe80::/10). */
int fxm_gid_is_routable(const union ibv_gid *gid, uint32_t type)
{
	return type == IBV_GID_TYPE_ROCE_V2 && !(gid->raw[0] == 0xfe && (gid->raw[1] & 0xc0) == 0x80);
}

/* ------------------------------------------------------------------ protection domains */

struct fxm_pd *to_fxm_pd(struct ibv_pd *pd)
{
	return (struct fxm_pd *)pd;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct fxm_pd *pd;

	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->ibv.context = context;
	pthread_mutex_lock(&fxm.lock);
	pd->id = fxm.next_pd++;
	pthread_mutex_unlock(&fxm.lock);
	pd->ibv.handle = pd->id;
	return &pd->ibv;
}

int ibv_dealloc_pd(struct ibv_pd *ibv)
{
	struct fxm_pd *pd = to_fxm_pd(ibv);
	uint32_t refs;

	if (!pd)
		return EINVAL;
	pthread_mutex_lock(&fxm.lock);
	refs = pd->refs;
	pthread_mutex_unlock(&fxm.lock);
	if (refs)  /* verbs: EBUSY while MRs, QPs (or FlexIO objects) still use it */
		return EBUSY;
	free(pd);
	return 0;
}

/* ------------------------------------------------------------------ memory registration */

static uint32_t fxm_random_key(void)
{
	uint32_t k = 0;

	while (k == 0 || k == FXM_INVALID_LKEY || fxm_mr_find_locked(k)) {
		if (getrandom(&k, sizeof(k), 0) != sizeof(k))
			k = (uint32_t)(fxm_now_ns() * 2654435761u);
	}
	return k;
}

struct fxm_mr *fxm_mr_find_locked(uint32_t key)
{
	for (struct fxm_mr *m = fxm.mrs[key & 0xff]; m; m = m->next)
		if (m->key == key)
			return m;
	return NULL;
}

struct fxm_mr *fxm_mr_add(struct fxm_pd *pd, uint64_t addr, uint64_t len, int access,
			  uint32_t kind)
{
	struct fxm_mr *mr = calloc(1, sizeof(*mr));

	if (!mr)
		return NULL;
	pthread_mutex_lock(&fxm.lock);
	mr->key = fxm_random_key();
	mr->pd = pd;
	mr->access = access;
	mr->kind = kind;
	mr->addr = addr;
	mr->len = len;
	mr->ibv = (struct ibv_mr){ .context = pd->ibv.context, .pd = &pd->ibv,
		.addr = (void *)(uintptr_t)addr, .length = (size_t)len, .handle = mr->key,
		.lkey = mr->key, .rkey = mr->key };
	mr->next = fxm.mrs[mr->key & 0xff];
	fxm.mrs[mr->key & 0xff] = mr;
	pd->refs++;
	pthread_mutex_unlock(&fxm.lock);
	return mr;
}

int fxm_mr_remove(struct fxm_mr *mr)
{
	pthread_mutex_lock(&fxm.lock);
	for (struct fxm_mr **pp = &fxm.mrs[mr->key & 0xff]; *pp; pp = &(*pp)->next) {
		if (*pp != mr)
			continue;
		*pp = mr->next;
		mr->pd->refs--;
		if (mr->kind == FXM_MR_HOST)
			fxm.locked_bytes -= mr->len;
		pthread_mutex_unlock(&fxm.lock);
		free(mr);
		return 0;
	}
	pthread_mutex_unlock(&fxm.lock);
	return EINVAL;
}

/* Every page of [addr, addr+len) mapped, as pinning needs (ibv_reg_mr fails with EFAULT). */
static int fxm_range_mapped(uint64_t addr, uint64_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t start = addr & ~(uint64_t)(page - 1), end = addr + len;
	unsigned char vec[256];

	while (start < end) {
		uint64_t span = end - start < 256ull * page ? end - start : 256ull * page;

		if (mincore((void *)(uintptr_t)start, span, vec) && errno == ENOMEM)
			return 0;
		start += span;
	}
	return 1;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *ibv, void *addr, size_t length, int access)
{
	struct fxm_pd *pd = to_fxm_pd(ibv);
	struct rlimit lim;
	struct fxm_mr *mr;
	uint32_t kind = FXM_MR_HOST;

	if (!pd) {
		errno = EINVAL;
		return NULL;
	}
	/* Remote write or atomics need local write (verbs man page: EINVAL otherwise). */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	if ((access & IBV_ACCESS_ON_DEMAND) && !addr && length == SIZE_MAX) {
		kind = FXM_MR_IMPLICIT;
	} else if (!length || (uint64_t)(uintptr_t)addr + length < (uint64_t)(uintptr_t)addr) {
		errno = EINVAL;
		return NULL;
	} else if (!(access & IBV_ACCESS_ON_DEMAND) && !fxm_range_mapped((uintptr_t)addr, length)) {
		errno = EFAULT;
		return NULL;
	}
	/* The kernel pins a registration's pages against RLIMIT_MEMLOCK unless the process has
	 * CAP_IPC_LOCK (ib_umem_get: -ENOMEM); the model does the same for non-root processes.
	 * FXM_IGNORE_MEMLOCK=1 turns it off, for test machines whose hard limit is lower than
	 * what the tests pin (dpa-offload bringup reports the limit). */
	if (kind == FXM_MR_HOST && !(access & IBV_ACCESS_ON_DEMAND) && geteuid() != 0 &&
	    !fxm_env_u32("FXM_IGNORE_MEMLOCK", 0, 0, 1) &&
	    !getrlimit(RLIMIT_MEMLOCK, &lim) && lim.rlim_cur != RLIM_INFINITY) {
		int over;

		pthread_mutex_lock(&fxm.lock);
		over = fxm.locked_bytes + length > lim.rlim_cur;
		if (!over)
			fxm.locked_bytes += length;
		pthread_mutex_unlock(&fxm.lock);
		if (over) {  /* pinned memory beyond ulimit -l */
			errno = ENOMEM;
			return NULL;
		}
	}
	mr = fxm_mr_add(pd, kind == FXM_MR_IMPLICIT ? 0 : (uintptr_t)addr,
			kind == FXM_MR_IMPLICIT ? UINT64_MAX : length, access, kind);
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	return &mr->ibv;
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *ibv, uint64_t offset, size_t length,
				 uint64_t iova, int fd, int access)
{
	struct fxm_mr *mr;

	(void)offset;
	if (!ibv || fd < 0 || !length) {
		errno = EINVAL;
		return NULL;
	}
	/* No GPU behind the model: the registration exists (keys, bounds) but the NIC refuses
	 * to move bytes through it, as a device without peer memory would. */
	mr = fxm_mr_add(to_fxm_pd(ibv), iova, length, access, FXM_MR_DMABUF);
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	return &mr->ibv;
}

int ibv_dereg_mr(struct ibv_mr *ibv)
{
	return ibv ? fxm_mr_remove((struct fxm_mr *)ibv) : EINVAL;
}

/*
 * The registration key names for [addr, addr+len) with the rights access needs, checked
 * as the NIC checks an lkey (remote = 0) or an rkey (remote = 1): the key exists, belongs
 * to pd, covers the range and grants the access. On failure *synd is the syndrome the
 * requester's error CQE carries: LOCAL_PROT for our own keys, REMOTE_ACCESS for a peer's.
 */
struct fxm_mr *fxm_mr_check(struct fxm_pd *pd, uint32_t key, uint64_t addr, uint64_t len,
			    int access, int remote, uint32_t *synd)
{
	struct fxm_mr *mr;
	int ok;

	pthread_mutex_lock(&fxm.lock);
	mr = fxm_mr_find_locked(key);
	ok = mr && mr->pd == pd && mr->kind != FXM_MR_DMABUF &&
	     (mr->kind == FXM_MR_IMPLICIT ||
	      (addr >= mr->addr && len <= mr->len && addr - mr->addr <= mr->len - len)) &&
	     (mr->access & access) == access;
	pthread_mutex_unlock(&fxm.lock);
	if (!ok) {
		*synd = remote ? FXM_SYND_REMOTE_ACCESS : FXM_SYND_LOCAL_PROT;
		return NULL;
	}
	return mr;
}

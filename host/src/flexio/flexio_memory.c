/* SPDX-License-Identifier: Apache-2.0 */
/* The FlexIO backend: memory registrations and ctx.empty() allocations. */
#define _GNU_SOURCE
#include "flexio_backend.h"

/* ------------------------------------------------------------------ memory */

static int fx_mr_add(struct fx_device *d, struct ibv_mr *mr, int shared)
{
	pthread_mutex_lock(&d->mr_lock);
	if (d->nmrs == d->mr_cap) {
		uint32_t cap = d->mr_cap ? d->mr_cap * 2 : 64;
		struct fx_mr *grown = realloc(d->mrs, cap * sizeof(*grown));

		if (!grown) {
			pthread_mutex_unlock(&d->mr_lock);
			return -ENOMEM;
		}
		d->mrs = grown;
		d->mr_cap = cap;
	}
	d->mrs[d->nmrs++] = (struct fx_mr){ .key = mr->rkey, .shared = (uint32_t)shared, .mr = mr };
	pthread_mutex_unlock(&d->mr_lock);
	return 0;
}

/* Take the entry for key (or, with addr, the shared one at addr) out of the table. */
static struct ibv_mr *fx_mr_take(struct fx_device *d, uint32_t key, const void *addr)
{
	struct ibv_mr *mr = NULL;

	pthread_mutex_lock(&d->mr_lock);
	for (uint32_t i = 0; i < d->nmrs; i++) {
		struct fx_mr *m = &d->mrs[i];

		if (addr ? !(m->shared && m->mr->addr == addr) : m->key != key)
			continue;
		mr = m->mr;
		d->mrs[i] = d->mrs[--d->nmrs];
		break;
	}
	pthread_mutex_unlock(&d->mr_lock);
	return mr;
}

static int fx_ibv_access(uint32_t access)
{
	int flags = 0;

	/* Verbs wants local write whenever remote write or atomics are granted. */
	if (access & (OFFLOAD_ACCESS_LOCAL_WRITE | OFFLOAD_ACCESS_REMOTE_WRITE |
		      OFFLOAD_ACCESS_REMOTE_ATOMIC))
		flags |= IBV_ACCESS_LOCAL_WRITE;
	if (access & OFFLOAD_ACCESS_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	if (access & OFFLOAD_ACCESS_REMOTE_READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	if (access & OFFLOAD_ACCESS_REMOTE_ATOMIC)
		flags |= IBV_ACCESS_REMOTE_ATOMIC;
	return flags;
}

static int fx_reg(struct fx_device *d, void *addr, uint64_t len, uint32_t access, int shared,
		  uint32_t *key)
{
	struct ibv_mr *mr = ibv_reg_mr(d->pd, addr, len, fx_ibv_access(access));
	int rc;

	if (!mr)
		return errno ? -errno : -EIO;
	/* A command names local memory (src_key, used as an lkey) and remote memory (dst_key,
	 * an rkey) with one key each: mlx5 gives a registration the same mkey for both. */
	if (mr->lkey != mr->rkey) {
		ibv_dereg_mr(mr);
		return -ENOTSUP;
	}
	rc = fx_mr_add(d, mr, shared);
	if (rc) {
		ibv_dereg_mr(mr);
		return rc;
	}
	*key = mr->rkey;
	return 0;
}

int fx_mr_reg(struct host_device *hd, const void *addr, uint64_t len, uint32_t access,
		     uint32_t *key)
{
	return fx_reg(to_fx(hd), (void *)addr, len, access, 0, key);
}

/* GPUDirect RDMA: the HCA reaches GPU memory through the dma-buf the CUDA driver exported
 * (cuMemGetHandleForAddressRange). iova = addr, so commands name it by its device address. */
int fx_mr_reg_dmabuf(struct host_device *hd, uint64_t addr, uint64_t len, int fd,
			    uint32_t access, uint32_t *key)
{
	struct fx_device *d = to_fx(hd);
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(d->pd, 0, len, addr, fd, fx_ibv_access(access));
	int rc;

	if (!mr)
		return errno ? -errno : -EIO;
	if (mr->lkey != mr->rkey) {  /* see fx_reg */
		ibv_dereg_mr(mr);
		return -ENOTSUP;
	}
	rc = fx_mr_add(d, mr, 0);
	if (rc) {
		ibv_dereg_mr(mr);
		return rc;
	}
	*key = mr->rkey;
	return 0;
}

int fx_mr_dereg(struct host_device *hd, uint32_t key)
{
	struct ibv_mr *mr = fx_mr_take(to_fx(hd), key, NULL);

	if (!mr)
		return -ENOENT;
	return ibv_dereg_mr(mr) ? -EIO : 0;
}

static uint64_t fx_map_len(uint64_t len)
{
	return len ? (len + 4095) & ~4095ull : 4096;  /* what host_free_shared(NULL) unmaps */
}

int fx_alloc_shared(struct host_device *hd, uint64_t len, void **addr, uint32_t *key)
{
	uint64_t maplen = fx_map_len(len);
	void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int rc;

	/* No shared segment on a card: peers reach this memory by RDMA, like any registration. */
	if (p == MAP_FAILED)
		return -errno;
	rc = fx_reg(to_fx(hd), p, maplen, OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
		    OFFLOAD_ACCESS_REMOTE_READ | OFFLOAD_ACCESS_REMOTE_WRITE, 1, key);
	if (rc) {
		munmap(p, maplen);
		return rc;
	}
	*addr = p;
	return 0;
}

int fx_free_shared(struct host_device *hd, void *addr, uint64_t len)
{
	struct ibv_mr *mr = fx_mr_take(to_fx(hd), 0, addr);

	if (mr)
		ibv_dereg_mr(mr);
	return munmap(addr, fx_map_len(len)) ? -errno : 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The emulated DPU as a host device: open/close, memory registration, ctx.empty()
 * segments. Who runs the firmware (progress threads, or a host thread waiting for a
 * small op) and how they wait: emu_progress.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dpa_engine.h"
#include "emu_internal.h"
#include "offload_atomic.h"

void dpa_hal_notify(struct dpa_hal *hal)
{
	emu_kick_rank(hal->dev, hal->dev->attr.rank);
}

void dpa_hal_host_notify(struct dpa_hal *hal)
{
	struct offload_ring_hdr *ring = hal->dev->win.ring;

	emu_wake_word(hal->dev, &ring->cq_tail);
}

uint64_t dpa_hal_time_ns(struct dpa_hal *hal)
{
	return emu_pass_now(hal);
}

static void emu_close(struct host_device *hd)
{
	struct emu_device *dev = to_emu(hd);

	emu_threads_stop(dev);
	emu_watch_stop(dev);
	emu_job_close(dev);
	emu_job_release(dev);
	free(dev->threads);
	for (uint32_t i = 0; dev->hals && i < dev->attr.num_threads; i++) {
		free(dev->hals[i].rail);
		free(dev->hals[i].wire_tx);
	}
	free(dev->hals);
	free(dev->fw_state);
	for (uint32_t g = 0; g < OFFLOAD_MAX_TEAMS; g++) {
		free(dev->mc_rx[g].stage);
		free(dev->mc_rx[g].regions);
	}
	free(dev->closed_seen);
	free(dev->wire_head);
	pthread_mutex_destroy(&dev->mr_lock);
	pthread_mutex_destroy(&dev->map_lock);
	free(dev);
}

/* Multicast settings: a zeroed attr (mtu 0) is refused, not guessed at. */
static int mcast_attr_valid(const struct host_ctx_params *attr)
{
	return attr->mtu >= 256 && attr->mtu <= 65536 && !(attr->mtu & (attr->mtu - 1)) &&
	       attr->mcast_rq_depth >= 2 && attr->mcast_loss_ppm <= 1000000 &&
	       attr->mcast_reorder_ppm <= 1000000 && attr->mcast_staged <= 1;
}

static int emu_open(const struct host_ctx_params *attr, struct host_device **out)
{
	struct emu_device *dev;
	int rc;

	if (!host_params_known(attr))
		return -EPROTONOSUPPORT;
	if (!attr->job || strlen(attr->job) >= sizeof(dev->job) - 1 || strchr(attr->job, '/') ||
	    attr->size == 0 || attr->size > OFFLOAD_RANKS_LIMIT || attr->rank >= attr->size ||
	    attr->num_threads == 0 || attr->num_threads > OFFLOAD_MAX_THREADS ||
	    attr->rails == 0 || attr->rails > HOST_MAX_RAILS || !mcast_attr_valid(attr) ||
	    !attr->job_key)
		return -EINVAL;
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return -ENOMEM;
	dev->attr = *attr;
	dev->job_fd = -1;
	strcpy(dev->job, attr->job);
	dev->attr.job = dev->job;
	dev->attr.backend = dev->attr.backend_lib = NULL;  /* the caller's strings */
	for (uint32_t r = 0; r < attr->rails; r++)
		if (attr->rail_down_after[r] != UINT64_MAX)
			dev->rail_faults = 1;
	pthread_mutex_init(&dev->mr_lock, NULL);
	pthread_mutex_init(&dev->map_lock, NULL);
	dev->closed_seen = calloc(offload_rank_words(attr->size), sizeof(uint64_t));
	for (uint32_t g = 0; g < OFFLOAD_MAX_TEAMS; g++)
		dev->mc_rx[g].regions = calloc(attr->size, sizeof(struct dpa_hal_mcast_region));
	rc = -ENOMEM;
	if (!dev->closed_seen || !dev->mc_rx[OFFLOAD_MAX_TEAMS - 1].regions)
		goto err;
	for (uint32_t g = 0; g < OFFLOAD_MAX_TEAMS; g++)
		if (!dev->mc_rx[g].regions)
			goto err;
	rc = emu_job_open(dev);
	if (rc)
		goto err;
	rc = emu_job_barrier(dev, attr->bootstrap_timeout_ns);
	if (rc)
		goto err;
	*out = (struct host_device *)dev;
	return 0;
err:
	emu_close((struct host_device *)dev);
	return rc;
}

static int emu_start(struct host_device *hd, const struct dpa_engine_params *params,
		     const struct host_fw_windows *win)
{
	struct emu_device *dev = to_emu(hd);
	uint32_t n = dev->attr.num_threads;
	uint64_t state = dpa_engine_state_size(params);
	int rc;

	if (!state)
		return -EINVAL;
	dev->win = *win;
	dev->fw_state = aligned_alloc(64, (state + 63) & ~63ull);
	dev->hals = calloc(n, sizeof(*dev->hals));
	dev->threads = calloc(n, sizeof(*dev->threads));
	if (!dev->fw_state || !dev->hals || !dev->threads)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		dev->hals[i].rail = calloc(dev->attr.size, 1);
		if (!dev->hals[i].rail)
			return -ENOMEM;
	}
	if (dev->wire_slots) {  /* thread 0 sends on the wires; any thread places */
		dev->wire_head = calloc(dev->attr.size, sizeof(uint64_t));
		dev->hals[0].wire_tx = calloc(dev->attr.size, sizeof(struct emu_wire_tx));
		if (!dev->wire_head || !dev->hals[0].wire_tx)
			return -ENOMEM;
		emu_wire_adopt(dev);
	}
	rc = dpa_engine_init(dev->fw_state, params);
	if (rc)
		return rc;
	rc = emu_threads_start(dev);
	if (rc)
		return rc;
	/* A port set to fail after 0 bytes is down from the start. */
	for (uint32_t r = 0; r < dev->attr.rails; r++)
		if (dev->attr.rail_down_after[r] == 0)
			emu_rail_down(dev, r);
	rc = emu_watch_start(dev);
	if (rc)
		emu_threads_stop(dev);
	return rc;
}

/*
 * Remote writes into ordinary memory go through process_vm_writev, which pins the target's
 * pages one by one: into transparent huge pages it moves twice the bytes per second
 * (measured here: 27 vs 13 GB/s for 1 MiB writes). Like an RDMA driver that prefers huge
 * pages for registered memory, registration advises them for the 2 MiB-aligned interior
 * of large receive buffers; pages fault in huge when first written. Each range is advised
 * once (a small cache) so that re-registering a buffer costs no syscall.
 */
static void advise_huge(struct emu_device *dev, uint64_t addr, uint64_t len)
{
	const uint64_t huge = 2ull << 20;
	uint64_t lo = (addr + huge - 1) & ~(huge - 1), hi = (addr + len) & ~(huge - 1);

	if (hi <= lo)
		return;
	pthread_mutex_lock(&dev->mr_lock);
	for (uint32_t i = 0; i < EMU_ADVISED; i++) {
		if (dev->advised[i][0] <= lo && hi <= dev->advised[i][1]) {
			pthread_mutex_unlock(&dev->mr_lock);
			return;
		}
	}
	dev->advised[dev->advised_next][0] = lo;
	dev->advised[dev->advised_next][1] = hi;
	dev->advised_next = (dev->advised_next + 1) % EMU_ADVISED;
	pthread_mutex_unlock(&dev->mr_lock);
	madvise((void *)(uintptr_t)lo, hi - lo, MADV_HUGEPAGE);  /* advice only: errors are fine */
}

static int emu_reg(struct host_device *hd, const void *addr, uint64_t len, uint32_t access,
		   uint32_t *key)
{
	struct emu_device *dev = to_emu(hd);

	if (access & OFFLOAD_ACCESS_REMOTE_WRITE)
		advise_huge(dev, (uint64_t)(uintptr_t)addr, len);
	return emu_mr_reg(dev, (uint64_t)(uintptr_t)addr, len, access, EMU_MR_PRIVATE, 0, 0, 0, key);
}

static int emu_dereg(struct host_device *hd, uint32_t key)
{
	return emu_mr_dereg(to_emu(hd), key);
}

static int emu_alloc_shared(struct host_device *hd, uint64_t len, void **addr, uint32_t *key)
{
	struct emu_device *dev = to_emu(hd);
	uint64_t maplen = (len + 4095) & ~4095ull, nonce;
	uint32_t serial;
	char name[160];
	void *ptr;
	int fd, rc;

	if (maplen == 0)
		maplen = 4096;
	pthread_mutex_lock(&dev->mr_lock);
	serial = ++dev->next_serial;
	pthread_mutex_unlock(&dev->mr_lock);
	nonce = emu_random64(dev);
	emu_shared_name(dev, dev->attr.rank, serial, nonce, name, sizeof(name));
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)maplen) < 0) {
		rc = -errno;
		goto err_unlink;
	}
	ptr = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ptr == MAP_FAILED) {
		rc = -errno;
		goto err_unlink;
	}
	rc = emu_mr_reg(dev, (uint64_t)(uintptr_t)ptr, maplen,
			OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE |
			OFFLOAD_ACCESS_REMOTE_READ | OFFLOAD_ACCESS_REMOTE_WRITE,
			EMU_MR_SHARED, serial, 0, nonce, key);
	if (rc) {
		munmap(ptr, maplen);
		goto err_unlink;
	}
	close(fd);
	*addr = ptr;
	return 0;
err_unlink:
	close(fd);
	shm_unlink(name);
	return rc;
}

static int emu_free_shared(struct host_device *hd, void *addr, uint64_t len)
{
	struct emu_device *dev = to_emu(hd);
	struct emu_mr *table = &dev->mrs[(uint64_t)dev->attr.rank * EMU_MAX_MRS];
	uint64_t maplen = len ? (len + 4095) & ~4095ull : 4096;
	uint32_t key = 0;
	char name[160];

	/* Under mr_lock: another host thread may be filling a free slot of the table. */
	pthread_mutex_lock(&dev->mr_lock);
	for (uint32_t i = 0; i < EMU_MAX_MRS && !key; i++) {
		uint32_t k = off_load_acquire(&table[i].key);

		if (!k || table[i].kind != EMU_MR_SHARED || table[i].addr != (uintptr_t)addr)
			continue;
		emu_shared_name(dev, dev->attr.rank, table[i].serial, table[i].nonce, name,
				sizeof(name));
		key = k;
	}
	pthread_mutex_unlock(&dev->mr_lock);
	if (key) {
		emu_mr_dereg(dev, key);
		shm_unlink(name);
	}
	return munmap(addr, maplen) ? -errno : 0;
}

static void emu_doorbell(struct host_device *hd)
{
	struct emu_device *dev = to_emu(hd);

	emu_doorbell_rank(dev, dev->attr.rank);
}

static int emu_peer_ctrl(struct host_device *hd, uint32_t rank, struct offload_peer *out)
{
	struct emu_device *dev = to_emu(hd);

	/* A peer that already closed still has valid control words; ops to it fail later. */
	if (rank >= dev->attr.size || !off_load_acquire(&dev->ranks[rank].ctrl_key))
		return -ENOENT;
	out->ctrl_addr = dev->ranks[rank].ctrl_addr;
	out->ctrl_key = dev->ranks[rank].ctrl_key;
	out->world_rank = rank;
	return 0;
}

/* The NIC reads them per chunk (emu_mcast.c); a change applies from the next one. */
static int emu_set_mcast_faults(struct host_device *hd, uint32_t loss_ppm, uint32_t reorder_ppm)
{
	struct emu_device *dev = to_emu(hd);

	off_write_once(&dev->attr.mcast_loss_ppm, loss_ppm);
	off_write_once(&dev->attr.mcast_reorder_ppm, reorder_ppm);
	return 0;
}

static int emu_poll_worthwhile(struct host_device *hd)
{
	return emu_spin_worthwhile(to_emu(hd));
}

static int emu_wait_completion(struct host_device *hd, uint32_t *word, uint32_t seen,
			       int64_t timeout_ns)
{
	return emu_wait_word(to_emu(hd), word, seen, timeout_ns);
}

const struct host_device_ops emu_device_ops = {
	.name = "emulator",
	.alloc_shared = emu_alloc_shared,
	.close = emu_close,
	.doorbell = emu_doorbell,
	.drive = emu_drive,
	.drive_stats = emu_drive_stats,
	.free_shared = emu_free_shared,
	.mr_dereg = emu_dereg,
	.mr_reg = emu_reg,
	.mr_reg_dmabuf = NULL,  /* no GPUDirect: offload_lib stages GPU memory through the host */
	.open = emu_open,
	.peer_ctrl = emu_peer_ctrl,
	.poll_worthwhile = emu_poll_worthwhile,
	.set_mcast_faults = emu_set_mcast_faults,
	.start = emu_start,
	.wait_completion = emu_wait_completion,
	.wake_waiters = emu_wake_waiters,
};

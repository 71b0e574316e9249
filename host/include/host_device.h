/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What host/ needs from a device, as one ops table (rdma-core provider style). The
 * emulator fills it today (emulator/emu_device.c); the FlexIO backend fills it on a card.
 * Every op returns 0 or a negative errno.
 */
#ifndef HOST_DEVICE_H
#define HOST_DEVICE_H

#include <stdint.h>

#include "dpa_engine.h"
#include "offload_abi.h"
#include "offload_host.h"

struct host_device;

#define HOST_MAX_RAILS 8u

/* A device opens with the caller's struct host_ctx_params (offload_host.h) and keeps it
 * (attr): rank, size, threads, rails, multicast settings and fault injection, the
 * bootstrap's allgather (hardware backends connect their queues with it; the emulator
 * ignores it). The strings it points to are the caller's: a device copies what it keeps. */

/* A params struct of the layout these headers describe (host setup and every backend
 * check it: a caller or backend built from other headers is refused, not misread). */
static inline int host_params_known(const struct host_ctx_params *p)
{
	return p && p->struct_size == sizeof(*p) && p->version == HOST_CTX_PARAMS_VERSION;
}

/* Bytes of the firmware's ring window and stats window (host_fw_windows), known at open:
 * a device that places them itself (fw_memory) sizes its memory by them. */
static inline uint64_t host_ring_len(const struct host_ctx_params *p)
{
	return offload_ring_bytes(p->ring_entries, 2u * p->ring_entries, p->size);
}

static inline uint64_t host_stats_len(const struct host_ctx_params *p)
{
	return (uint64_t)p->num_threads * sizeof(struct offload_thread_stats);
}

/* Host memory the firmware reaches through windows. */
struct host_fw_windows {
	void *ring;
	uint64_t ring_len;
	void *stats;
	uint64_t stats_len;
};

/* The ops table of a backend library also exports dpaoffload_flexio_abi(), returning the
 * OFFLOAD_ABI_VERSION it was built with: host_ctx refuses a backend of another version. */
struct host_device_ops {
	const char *name;
	int (*alloc_shared)(struct host_device *dev, uint64_t len, void **addr, uint32_t *key);
	void (*close)(struct host_device *dev);
	void (*doorbell)(struct host_device *dev);
	/* Cooperative progress: run the rank's firmware on the calling host thread until
	 * *word != seen (0), the timeout (-ETIMEDOUT), or, with word NULL, until it has nothing
	 * left to do without an event (0). -EBUSY: not now (another thread drives, or bulk
	 * work, which the device's own threads carry): ring the doorbell or sleep. flags:
	 * HOST_DRIVE_*. NULL: the firmware does not run on the host (hardware). */
	int (*drive)(struct host_device *dev, uint32_t *word, uint32_t seen, int64_t timeout_ns,
		     uint32_t flags);
	/* Ops completed and passes run by host threads driving (drive != NULL), doorbells. */
	void (*drive_stats)(struct host_device *dev, struct host_drive_stats *out);
	int (*free_shared)(struct host_device *dev, void *addr, uint64_t len);
	/* Memory for the firmware's ring and stats windows (attr ring_len, stats_len), zeroed,
	 * owned by the device until close: a card reaches them through one registration. NULL:
	 * the host allocates them (the emulator maps any memory). */
	int (*fw_memory)(struct host_device *dev, struct host_fw_windows *out);
	int (*mr_dereg)(struct host_device *dev, uint32_t key);
	int (*mr_reg)(struct host_device *dev, const void *addr, uint64_t len, uint32_t access,
		      uint32_t *key);
	/* GPU memory exported as a dma-buf (GPUDirect RDMA): fd covers [addr, addr+len) from
	 * its start, and addr is how commands name it. NULL: the device cannot reach GPU
	 * memory (the emulator), and callers stage it through host memory. */
	int (*mr_reg_dmabuf)(struct host_device *dev, uint64_t addr, uint64_t len, int fd,
			     uint32_t access, uint32_t *key);
	int (*open)(const struct host_ctx_params *attr, struct host_device **out);
	int (*peer_ctrl)(struct host_device *dev, uint32_t rank, struct offload_peer *out);
	/* Whether a host thread polling for a completion helps now (the emulator says no
	 * while its threads copy in bulk on the same cores). */
	int (*poll_worthwhile)(struct host_device *dev);
	int (*start)(struct host_device *dev, const struct dpa_engine_params *params,
		     const struct host_fw_windows *win);
	/* Change the injected multicast faults (per million) of this rank's NIC at run time.
	 * NULL: the device injects no faults (hardware). */
	int (*set_mcast_faults)(struct host_device *dev, uint32_t loss_ppm, uint32_t reorder_ppm);
	/* Sleep until *word != seen, a wake, or the timeout (ns); spurious returns are fine. */
	int (*wait_completion)(struct host_device *dev, uint32_t *word, uint32_t seen,
			       int64_t timeout_ns);
	/* Appended: wake every thread asleep in wait_completion on word (the context is
	 * closing). NULL: their sleep ends within its slice anyway. */
	void (*wake_waiters)(struct host_device *dev, uint32_t *word);
};

#define HOST_DRIVE_BULK_CMD (1u << 0)  /* a bulk command was just posted: it is the work */
#define HOST_DRIVE_NO_BULK  (1u << 1)  /* never copy in bulk (test(), a small op's post) */
#define HOST_DRIVE_BULK_WAIT (1u << 2) /* waiting for a bulk op: it is the work; a waiter that
					* may not copy it sleeps instead, handing it over now */
#define HOST_DRIVE_SMALL_POST (1u << 3) /* a small op was just posted: a rank of the job
					 * waiting for this core may go first (emu_spin.c) */

extern const struct host_device_ops emu_device_ops;

#endif /* HOST_DEVICE_H */

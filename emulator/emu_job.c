/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The job segment (one per job, mode 0600, unique name from the launcher) and what lives
 * in it: the rank table, each rank's memory-registration table and control region, and
 * the multicast groups' rings (emu_mcast.c).
 * Also the mapping of peers' ctx.empty() segments, and the registration checks every
 * emulated RDMA access goes through.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"
#include "offload_atomic.h"

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

static uint64_t ranks_off(void)
{
	return align_up(sizeof(struct emu_job_hdr), 64);
}

/* The job's rank sets: unreachable, closed, dead (offload_rank_words(n) each). */
static uint64_t sets_off(uint32_t n)
{
	return align_up(ranks_off() + (uint64_t)n * sizeof(struct emu_rank), 64);
}

static uint64_t mrs_off(uint32_t n)
{
	return align_up(sets_off(n) + 24ull * offload_rank_words(n), 4096);
}

static uint64_t ctrls_off(uint32_t n)
{
	return align_up(mrs_off(n) + (uint64_t)n * EMU_MAX_MRS * sizeof(struct emu_mr), 4096);
}

/* Multicast: group headers, then slot headers, then payloads (one MTU per slot, page
 * aligned so that chunks are MTU-aligned for the DMA copy). */
static uint64_t mc_groups_off(uint32_t n)
{
	return align_up(ctrls_off(n) + (uint64_t)n * offload_ctrl_bytes(n), 4096);
}

static uint64_t mc_slots_off(uint32_t n)
{
	return align_up(mc_groups_off(n) + OFFLOAD_MAX_TEAMS * emu_mcast_group_bytes(n), 4096);
}

static uint64_t mc_payload_off(uint32_t n, uint32_t mtu)
{
	return align_up(mc_slots_off(n) + (uint64_t)OFFLOAD_MAX_TEAMS * emu_mcast_slots(mtu) *
			sizeof(struct emu_mcast_slot), 4096);
}

/* Wires (emu_wire.c): [n][n] headers, then [n][n][slots] payload slots. */
static uint64_t wires_off(uint32_t n, uint32_t mtu)
{
	return align_up(mc_payload_off(n, mtu) +
			(uint64_t)OFFLOAD_MAX_TEAMS * emu_mcast_slots(mtu) * mtu, 4096);
}

static uint64_t wire_data_off(uint32_t n, uint32_t mtu)
{
	uint64_t wires = emu_wire_slots(n) ? (uint64_t)n * n * sizeof(struct emu_wire) : 0;

	return align_up(wires_off(n, mtu) + wires, 4096);
}

static uint64_t job_len(uint32_t n, uint32_t mtu)
{
	return align_up(wire_data_off(n, mtu) +
			(uint64_t)n * n * emu_wire_slots(n) * EMU_WIRE_SLOT_BYTES, 4096);
}

static int claim_u32(uint32_t *word, uint32_t want)
{
	uint32_t zero = 0;

	/* First writer wins; everyone else must agree with it. */
	if (off_cas(word, &zero, want))
		return 0;
	return zero == want ? 0 : -EINVAL;
}

/* Our session where the kernel schedules each session as a group of its own (autogroup
 * on), else 0: then sessions do not matter to where a thread may move (emu_spin.c). Under a
 * cgroup's CPU controller autogroup does not apply either; this stays on the strict side. */
static int32_t sched_session(void)
{
	char on = '0';
	int fd = open("/proc/sys/kernel/sched_autogroup_enabled", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (read(fd, &on, 1) != 1)
			on = '0';
		close(fd);
	}
	return on == '1' ? (int32_t)getsid(0) : 0;
}

/* Is a rank's pid still a live process? (Used to refuse stealing a live rank.) */
static int pid_alive(int32_t pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* A /dev/shm object must be ours alone: a regular file of this user that nobody else may
 * open. One planted by another user (or left open to others) is refused, not used. */
static int private_file(int fd, struct stat *st)
{
	if (fstat(fd, st) < 0)
		return -errno;
	if (!S_ISREG(st->st_mode) || st->st_uid != geteuid() || (st->st_mode & 077))
		return -EACCES;
	return 0;
}

static int claim_u64(uint64_t *word, uint64_t want)
{
	uint64_t zero = 0;

	if (off_cas(word, &zero, want))
		return 0;
	return zero == want ? 0 : -EEXIST;
}

/* Open (or, first, create) the job segment; every rank holds a shared flock on it while
 * it lives, which is how a stale sweep tells a live job from a dead one. */
static int open_job_segment(struct emu_device *dev, const char *name, struct stat *st)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600), rc;

	if (fd < 0 && errno == EEXIST)
		fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	rc = private_file(fd, st);
	if (!rc && flock(fd, LOCK_SH) < 0)
		rc = -errno;
	if (rc) {
		close(fd);
		return rc;
	}
	dev->job_fd = fd;
	return 0;
}

/* Another job under our name (OFFLOAD_JOB forced alike): its key is not ours. Read from
 * the segment's first page, whatever size the other job gave it. */
static int key_of_other_job(int fd, uint64_t key)
{
	struct emu_job_hdr *hdr = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	uint64_t theirs;

	if (hdr == MAP_FAILED)
		return 0;
	theirs = off_load_acquire(&hdr->key);
	munmap(hdr, 4096);
	return theirs && theirs != key;
}

int emu_job_open(struct emu_device *dev)
{
	uint32_t n = dev->attr.size, me = dev->attr.rank;
	char name[128];
	struct emu_rank *self;
	int32_t pid = getpid(), old = 0;
	uint32_t ctrl_key;
	struct stat st;
	int rc;

	snprintf(name, sizeof(name), "/%s", dev->job);
	rc = open_job_segment(dev, name, &st);
	if (rc)
		return rc;
	dev->job_len = job_len(n, dev->attr.mtu);
	/* The first rank sizes the segment (fresh pages read as zero); a rank that finds
	 * another size belongs elsewhere and must not resize it under the live ranks. */
	if (st.st_size == 0 && ftruncate(dev->job_fd, (off_t)dev->job_len) < 0)
		return -errno;
	if (st.st_size != 0 && (uint64_t)st.st_size != dev->job_len)
		return key_of_other_job(dev->job_fd, dev->attr.job_key) ? -EEXIST : -EPROTO;
	dev->job_map = mmap(NULL, dev->job_len, PROT_READ | PROT_WRITE, MAP_SHARED, dev->job_fd, 0);
	if (dev->job_map == MAP_FAILED) {
		dev->job_map = NULL;
		return -errno;
	}
	/* The job's key first: a rank of another job that was given our name touches nothing
	 * else, and fails with "job name in use" (the first key claimed keeps the name). */
	if (claim_u64(&((struct emu_job_hdr *)dev->job_map)->key, dev->attr.job_key))
		return -EEXIST;
	dev->hdr = (struct emu_job_hdr *)dev->job_map;
	dev->ranks = (struct emu_rank *)(dev->job_map + ranks_off());
	dev->mrs = (struct emu_mr *)(dev->job_map + mrs_off(n));
	dev->unreachable = (uint64_t *)(dev->job_map + sets_off(n));
	dev->closed = dev->unreachable + offload_rank_words(n);
	dev->dead = dev->closed + offload_rank_words(n);
	dev->ctrl_bytes = offload_ctrl_bytes(n);
	dev->ctrls = dev->job_map + ctrls_off(n);
	dev->mc_group_bytes = emu_mcast_group_bytes(n);
	dev->mc_groups = dev->job_map + mc_groups_off(n);
	dev->mc_slots = (struct emu_mcast_slot *)(dev->job_map + mc_slots_off(n));
	dev->mc_payload = dev->job_map + mc_payload_off(n, dev->attr.mtu);
	dev->mc_nslots = emu_mcast_slots(dev->attr.mtu);
	dev->wire_slots = emu_wire_slots(n);
	dev->wires = (struct emu_wire *)(dev->job_map + wires_off(n, dev->attr.mtu));
	dev->wire_data = dev->job_map + wire_data_off(n, dev->attr.mtu);
	/* The MTU sizes the rings: ranks configured with different ones cannot share them. */
	if (claim_u32(&dev->hdr->magic, EMU_MAGIC) || claim_u32(&dev->hdr->abi, OFFLOAD_ABI_VERSION) ||
	    claim_u32(&dev->hdr->nranks, n) || claim_u32(&dev->hdr->mtu, dev->attr.mtu))
		return -EPROTO;  /* another job, or ranks started with different sizes */
	self = &dev->ranks[me];
	if (!off_cas(&self->pid, &old, pid)) {
		if (pid_alive(old))
			return -EADDRINUSE;  /* two processes claim the same rank */
		/* Taking over a dead rank: nothing it registered may stay reachable. */
		for (uint32_t i = 0; i < EMU_MAX_MRS; i++)
			off_store_release(&dev->mrs[(uint64_t)me * EMU_MAX_MRS + i].key, 0);
		emu_mcast_forget(dev);
	}
	off_write_once(&self->host_cpu, emu_cpu_now());
	off_write_once(&self->sid, sched_session());
	off_write_once(&self->threads, dev->attr.num_threads);
	off_store_release(&self->pid, pid);
	if (getrandom(&dev->rng, sizeof(dev->rng), 0) != sizeof(dev->rng))
		dev->rng = (uint64_t)pid * 0x9e3779b97f4a7c15ull ^ emu_now_ns();
	rc = emu_mr_reg(dev, (uint64_t)(uintptr_t)emu_ctrl_of(dev, me), dev->ctrl_bytes,
			OFFLOAD_ACCESS_REMOTE_WRITE | OFFLOAD_ACCESS_REMOTE_ATOMIC |
			OFFLOAD_ACCESS_LOCAL_READ | OFFLOAD_ACCESS_LOCAL_WRITE,
			EMU_MR_JOB, 0, ctrls_off(n) + me * dev->ctrl_bytes, 0,
			&ctrl_key);
	if (rc)
		return rc;
	self->ctrl_addr = (uint64_t)(uintptr_t)emu_ctrl_of(dev, me);
	off_store_release(&self->ctrl_key, ctrl_key);  /* peers read ctrl_addr after the key */
	off_store_release(&self->state, EMU_RANK_ALIVE);
	dev->joined = 1;
	off_fetch_add(&dev->hdr->arrived, 1);
	return 0;
}

int emu_job_barrier(struct emu_device *dev, int64_t timeout_ns)
{
	uint64_t deadline = emu_now_ns() + (uint64_t)timeout_ns;
	struct timespec pause = { 0, 1000000 };

	while (off_load_acquire(&dev->hdr->arrived) < dev->attr.size) {
		if (emu_now_ns() > deadline)
			return -ETIMEDOUT;
		nanosleep(&pause, NULL);
	}
	return 0;
}

void emu_shared_name(const struct emu_device *dev, uint32_t rank, uint32_t serial,
		     uint64_t nonce, char *out, uint64_t outlen)
{
	snprintf(out, outlen, "/%s-r%u-s%u-%016llx", dev->job, rank, serial,
		 (unsigned long long)nonce);
}

int emu_open_private(const char *name, uint64_t len)
{
	int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0), rc;
	struct stat st;

	if (fd < 0)
		return -errno;
	rc = private_file(fd, &st);
	if (!rc && (uint64_t)st.st_size < len)
		rc = -EINVAL;
	if (rc) {
		close(fd);
		return rc;
	}
	return fd;
}

void emu_unmap_peers(struct emu_device *dev)
{
	pthread_mutex_lock(&dev->map_lock);
	for (uint32_t i = 0; i < EMU_MAX_MAPS; i++) {
		if (dev->maps[i].ptr)
			munmap(dev->maps[i].ptr, dev->maps[i].len);
		dev->maps[i] = (struct emu_map){ 0 };
	}
	pthread_mutex_unlock(&dev->map_lock);
}

void emu_job_close(struct emu_device *dev)
{
	struct emu_mr *mine;
	char name[160];

	if (!dev->job_map)
		return;
	mine = &dev->mrs[(uint64_t)dev->attr.rank * EMU_MAX_MRS];
	/* Revoke everything we registered: peers' later accesses fail cleanly. A process that
	 * never owned its rank (it failed to join) must not touch the owner's table. */
	for (uint32_t i = 0; dev->joined && i < EMU_MAX_MRS; i++) {
		uint32_t key = off_load_acquire(&mine[i].key);

		if (!key)
			continue;
		if (mine[i].kind == EMU_MR_SHARED) {
			emu_shared_name(dev, dev->attr.rank, mine[i].serial, mine[i].nonce, name,
					sizeof(name));
			shm_unlink(name);
		}
		off_store_release(&mine[i].key, 0);
	}
	emu_unmap_peers(dev);
	/* The last rank to leave removes the job segment (the launcher sweeps it too). */
	if (dev->joined) {
		const uint64_t *failed = emu_ring_failed(dev);
		uint32_t me = dev->attr.rank;

		/* Peers see us closed (not failed), knowing what we knew of deaths: in this
		 * order (emu_watch.c reads them back to front). */
		for (uint32_t w = 0; failed && w < offload_rank_words(dev->attr.size); w++) {
			uint64_t v = off_load_acquire(&failed[w]) &
				     ~(w == me / 64 ? 1ull << (me % 64) : 0);

			for (; v; v &= v - 1)
				emu_publish_death(dev, w * 64 + (uint32_t)__builtin_ctzll(v));
		}
		off_store_release(&dev->ranks[me].state, EMU_RANK_CLOSED);
		offload_rankset_add(dev->closed, &dev->hdr->closed_gen, me);
		for (uint32_t r = 0; r < dev->attr.size; r++)  /* their waits on us end now */
			if (r != dev->attr.rank)
				emu_kick_rank(dev, r);
		dev->joined = 0;
		if (off_fetch_add(&dev->hdr->closed, 1) + 1 == dev->attr.size) {
			snprintf(name, sizeof(name), "/%s", dev->job);
			shm_unlink(name);
		}
	}
	munmap(dev->job_map, dev->job_len);
	dev->job_map = NULL;
}

void emu_job_release(struct emu_device *dev)
{
	if (dev->job_fd >= 0)
		close(dev->job_fd);  /* drops our flock: the sweep may take what is left */
	dev->job_fd = -1;
}

static uint32_t next_random(struct emu_device *dev)
{
	/* xorshift64*: rkeys must be unguessable, not cryptographic. */
	uint64_t x = dev->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	dev->rng = x;
	return (uint32_t)((x * 0x2545f4914f6cdd1dull) >> 32);
}

uint64_t emu_random64(struct emu_device *dev)
{
	uint64_t v;

	if (getrandom(&v, sizeof(v), 0) == sizeof(v))
		return v;
	pthread_mutex_lock(&dev->mr_lock);
	v = (uint64_t)next_random(dev) << 32 | next_random(dev);
	pthread_mutex_unlock(&dev->mr_lock);
	return v;
}

int emu_mr_reg(struct emu_device *dev, uint64_t addr, uint64_t len, uint32_t access,
	       uint32_t kind, uint32_t serial, uint64_t shm_offset, uint64_t nonce, uint32_t *key)
{
	struct emu_mr *table = &dev->mrs[(uint64_t)dev->attr.rank * EMU_MAX_MRS];
	uint32_t k;

	if (addr + len < addr)
		return -EINVAL;
	pthread_mutex_lock(&dev->mr_lock);
	for (uint32_t i = 0; i < EMU_MAX_MRS; i++) {
		struct emu_mr *mr = &table[i];

		/* Acquire: pairs with the release of whoever freed the slot (emu_mr_dereg's CAS,
		 * a close or a reap), so that what the previous registration's users did with it
		 * (a DPA thread's copy for an op the host reaped since) happens before we reuse
		 * the slot. */
		if (off_load_acquire(&mr->key))
			continue;
		do {
			k = (next_random(dev) << EMU_KEY_BITS) | i;
		} while ((k >> EMU_KEY_BITS) == 0);
		/* A reader holding a stale key (a peer's) may still be copying the slot (see
		 * emu_mr_resolve): the fields are atomic words, and this fence pairs with its
		 * acquire fence, so that a reader which sees any field below also sees key 0
		 * (or k) on its second look, never the old key. */
		__atomic_thread_fence(__ATOMIC_RELEASE);
		off_write_once(&mr->access, access);
		off_write_once(&mr->addr, addr);
		off_write_once(&mr->len, len);
		off_write_once(&mr->kind, kind);
		off_write_once(&mr->serial, serial);
		off_write_once(&mr->shm_offset, shm_offset);
		off_write_once(&mr->nonce, nonce);
		off_store_release(&mr->key, k);  /* publishes the fields above to peers */
		pthread_mutex_unlock(&dev->mr_lock);
		*key = k;
		return 0;
	}
	pthread_mutex_unlock(&dev->mr_lock);
	return -ENOSPC;
}

int emu_mr_dereg(struct emu_device *dev, uint32_t key)
{
	struct emu_mr *mr = &dev->mrs[(uint64_t)dev->attr.rank * EMU_MAX_MRS +
				      (key & (EMU_MAX_MRS - 1))];
	uint32_t k = key;

	if (!key || !off_cas(&mr->key, &k, 0))
		return -ENOENT;
	return 0;
}

static int key_live(const struct emu_device *dev, uint32_t rank, uint32_t key)
{
	const struct emu_mr *mr = &dev->mrs[(uint64_t)rank * EMU_MAX_MRS + (key & (EMU_MAX_MRS - 1))];

	return off_load_acquire(&mr->key) == key;
}

/* Unmap segments whose owner revoked them and that no copy uses. Called with map_lock. */
static void sweep_maps(struct emu_device *dev)
{
	for (uint32_t i = 0; i < EMU_MAX_MAPS; i++) {
		struct emu_map *m = &dev->maps[i];

		/* users only grows under map_lock, so 0 here stays 0 until we unlock. */
		if (m->ptr && !off_load_acquire(&m->users) && !key_live(dev, m->rank, m->key)) {
			munmap(m->ptr, m->len);
			*m = (struct emu_map){ 0 };
		}
	}
}

/* Every map holds a live segment (a job past EMU_MAX_MAPS peers, or more of their
 * ctx.empty() buffers in use): unmap one that no copy uses, to be mapped again when next
 * needed; the hand moves on so that evictions spread. Called with map_lock. */
static struct emu_map *evict_map(struct emu_device *dev)
{
	for (uint32_t k = 0; k < EMU_MAX_MAPS; k++) {
		struct emu_map *m = &dev->maps[dev->map_hand++ % EMU_MAX_MAPS];

		if (m->ptr && !off_load_acquire(&m->users)) {  /* stays 0: see sweep_maps */
			munmap(m->ptr, m->len);
			*m = (struct emu_map){ 0 };
			return m;
		}
	}
	return NULL;
}

static struct emu_map *map_shared(struct emu_device *dev, uint32_t rank, uint32_t serial,
				  uint64_t nonce, uint32_t key, uint64_t len)
{
	struct emu_map *found = NULL, *slot = NULL;
	char name[160];
	uint8_t *ptr;
	int fd;

	pthread_mutex_lock(&dev->map_lock);
	for (int pass = 0; pass < 2 && !found && !slot; pass++) {
		if (pass)
			sweep_maps(dev);
		for (uint32_t i = 0; i < EMU_MAX_MAPS && !found; i++) {
			struct emu_map *m = &dev->maps[i];

			if (m->ptr && m->rank == rank && m->serial == serial && m->len >= len)
				found = m;
			else if (!m->ptr && !slot)
				slot = m;
		}
	}
	if (!found && !slot)
		slot = evict_map(dev);
	if (!found && slot) {
		emu_shared_name(dev, rank, serial, nonce, name, sizeof(name));
		fd = emu_open_private(name, len);
		if (fd >= 0) {
			ptr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			close(fd);
			if (ptr != MAP_FAILED) {
				*slot = (struct emu_map){ .rank = rank, .serial = serial, .key = key,
							  .ptr = ptr, .len = len };
				found = slot;
			}
		}
	}
	if (found)
		off_fetch_add(&found->users, 1);
	pthread_mutex_unlock(&dev->map_lock);
	return found;
}

void emu_map_release(struct emu_map *held)
{
	if (held)
		off_fetch_sub(&held->users, 1);
}

int emu_mr_is_private(const struct emu_device *dev, uint32_t rank, uint32_t key)
{
	const struct emu_mr *mr;

	if (rank >= dev->attr.size)
		return 0;
	mr = &dev->mrs[(uint64_t)rank * EMU_MAX_MRS + (key & (EMU_MAX_MRS - 1))];

	/* A racy look, not emu_mr_resolve's seqlock: either path it picks checks everything
	 * again (the direct write here, the wire where the target places). */
	return key && off_load_acquire(&dev->ranks[rank].state) == EMU_RANK_ALIVE &&
	       off_load_acquire(&mr->key) == key && off_read_once(&mr->kind) == EMU_MR_PRIVATE;
}

int32_t emu_mr_resolve(struct emu_device *dev, uint32_t rank, uint32_t key, uint64_t addr,
		       uint64_t len, uint32_t access, uint8_t **ptr, int32_t *pid,
		       struct emu_map **held)
{
	struct emu_mr *mr, snap;
	struct emu_map *map;

	if (rank >= dev->attr.size)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	if (off_load_acquire(&dev->ranks[rank].state) != EMU_RANK_ALIVE)
		return emu_peer_lost(dev, rank);
	mr = &dev->mrs[(uint64_t)rank * EMU_MAX_MRS + (key & (EMU_MAX_MRS - 1))];
	/* Pairs with emu_mr_reg's release of key: the fields are the registration's. */
	if (!key || off_load_acquire(&mr->key) != key)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	/* A seqlock read: the owner may deregister and reuse the slot while we copy (it
	 * clears key before rewriting fields), so each field is read as an atomic word and
	 * the key checked again after the acquire fence, which pairs with emu_mr_reg's
	 * release fence: a stable key means a stable snapshot. */
	snap = (struct emu_mr){
		.access = off_read_once(&mr->access), .addr = off_read_once(&mr->addr),
		.len = off_read_once(&mr->len), .kind = off_read_once(&mr->kind),
		.serial = off_read_once(&mr->serial), .shm_offset = off_read_once(&mr->shm_offset),
		.nonce = off_read_once(&mr->nonce),
	};
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (off_read_once(&mr->key) != key)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	if ((snap.access & access) != access || addr < snap.addr || len > snap.len ||
	    addr - snap.addr > snap.len - len)
		return OFFLOAD_ERR_REMOTE_ACCESS;
	*pid = off_read_once(&dev->ranks[rank].pid);
	*ptr = NULL;
	*held = NULL;
	switch (snap.kind) {
	case EMU_MR_JOB:
		if (snap.shm_offset + snap.len > dev->job_len)
			return OFFLOAD_ERR_REMOTE_ACCESS;
		*ptr = dev->job_map + snap.shm_offset + (addr - snap.addr);
		break;
	case EMU_MR_SHARED:
		if (rank == dev->attr.rank) {
			*ptr = (uint8_t *)(uintptr_t)addr;
			break;
		}
		map = map_shared(dev, rank, snap.serial, snap.nonce, key, snap.len);
		if (!map)
			return OFFLOAD_ERR_REMOTE_ACCESS;
		*ptr = map->ptr + (addr - snap.addr);
		*held = map;
		break;
	default:
		if (rank == dev->attr.rank)
			*ptr = (uint8_t *)(uintptr_t)addr;
		break;
	}
	return OFFLOAD_OK;
}

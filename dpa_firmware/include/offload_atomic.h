/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every memory-ordering primitive used across the host/DPA boundary and between DPA
 * threads. Callers say at each use which store a load pairs with and who owns the word.
 * GCC/Clang __atomic builtins: available in gcc, clang and dpacc alike.
 */
#ifndef OFFLOAD_ATOMIC_H
#define OFFLOAD_ATOMIC_H

#include <stdint.h>

#define off_load_acquire(p)      __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define off_store_release(p, v)  __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define off_read_once(p)         __atomic_load_n((p), __ATOMIC_RELAXED)
#define off_write_once(p, v)     __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define off_fetch_add(p, v)      __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)
#define off_fetch_sub(p, v)      __atomic_fetch_sub((p), (v), __ATOMIC_ACQ_REL)
#define off_cas(p, expp, v)      __atomic_compare_exchange_n((p), (expp), (v), 0, \
					__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
#define off_fence()              __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* One iteration of a spin-wait: tells the core a sibling thread may run (the spin stays
 * short; waits longer than a spin sleep on a futex). A no-op where no hint exists. */
static inline void off_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* Pauses between two looks of a spin-wait at what it waits for. A pause takes 37 ns on
 * an AMD EPYC (Zen) vCPU and ~140 cycles on Intel since Skylake: 64 of them let a peer's
 * write sit unseen for 2.4 us, longer than a small op's whole exchange. */
#define OFF_SPIN_PAUSES 4

/* A test-and-set lock for short critical sections between DPA threads (no sleeping). */
static inline int off_trylock(uint32_t *lock)
{
	return __atomic_exchange_n(lock, 1u, __ATOMIC_ACQUIRE) == 0;
}

static inline void off_unlock(uint32_t *lock)
{
	__atomic_store_n(lock, 0u, __ATOMIC_RELEASE);
}

/*
 * Count down a word an op's items share; returns the new value. With sibling threads a
 * locked subtract; a thread alone (sole) stores it plainly: a locked instruction waits
 * until every store before it has drained, and in a pass those include the block copies
 * into peers' lines (a 1 KiB all-to-all at n=4 spent a quarter of progress_ops there).
 */
static inline uint32_t off_count_down(uint32_t *p, int sole)
{
	uint32_t v;

	if (!sole)
		return __atomic_sub_fetch(p, 1, __ATOMIC_SEQ_CST);
	v = off_read_once(p) - 1;
	off_store_release(p, v);  /* racy readers (load hints) see it in order */
	return v;
}

/* *p += v, *p |= v, *p &= v on words shared the same way (off_count_down). */
static inline void off_add_shared(uint32_t *p, uint32_t v, int sole)
{
	if (sole)
		off_store_release(p, off_read_once(p) + v);
	else
		__atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

static inline void off_or_shared(uint64_t *p, uint64_t v, int sole)
{
	if (sole)
		off_store_release(p, off_read_once(p) | v);
	else
		__atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}

static inline void off_and_shared(uint64_t *p, uint64_t v, int sole)
{
	if (sole)
		off_store_release(p, off_read_once(p) & v);
	else
		__atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}

#endif /* OFFLOAD_ATOMIC_H */

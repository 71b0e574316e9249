/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The wire's choice (emulator/emu_wire.c: emu_wire_choose), with a clock of the test's own:
 * which way a write goes by the costs measured, what a sample does to a cost, which writes
 * are timed, and that the copies into fresh slots are not. emu_wire.c is linked alone; the
 * few emulator calls it makes are stubs here (no job segment, no peer: the target's
 * placing is played by freeing the pieces). Prints "ok" and exits 0, else names the check.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

#define MIB (1ull << 20)
#define SLOTS 2u

static uint64_t fake_now, fake_step;   /* every clock read moves the clock by fake_step */
static uint64_t direct_bytes_written;

uint64_t emu_now_ns(void)
{
	fake_now += fake_step;
	return fake_now;
}

void emu_nudge_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	(void)dev, (void)rank, (void)pass;
}

void emu_flush_wakes(struct dpa_hal *pass)
{
	(void)pass;
}

void emu_wake_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	(void)dev, (void)rank, (void)pass;
}

int32_t emu_write_remote(struct emu_device *dev, uint32_t peer, const void *src, uint64_t raddr,
			 uint32_t rkey, uint64_t len)
{
	(void)dev, (void)peer, (void)src, (void)raddr, (void)rkey;
	direct_bytes_written += len;
	return OFFLOAD_OK;
}

int32_t emu_peer_lost(struct emu_device *dev, uint32_t rank)
{
	(void)dev, (void)rank;
	return OFFLOAD_ERR_PEER;
}

int32_t emu_mr_resolve(struct emu_device *dev, uint32_t owner, uint32_t key, uint64_t addr,
		       uint64_t len, uint32_t access, uint8_t **ptr, int32_t *pid,
		       struct emu_map **held)
{
	(void)dev, (void)owner, (void)key, (void)addr, (void)len, (void)access, (void)ptr;
	(void)pid, (void)held;
	return OFFLOAD_ERR_REMOTE_ACCESS;  /* nothing is placed here */
}

void emu_dma_to(const struct emu_device *dev, uint32_t peer, void *dst, const void *src,
		uint64_t len)
{
	(void)dev, (void)peer, (void)dst, (void)src, (void)len;
}

void emu_map_release(struct emu_map *map)
{
	(void)map;
}

static int failures;

static void check(int ok, const char *what)
{
	if (!ok) {
		printf("FAIL: %s\n", what);
		failures++;
	}
}

/* Rank 0 of two, thread 0's hal, a wire of SLOTS slots each way. */
struct rig {
	struct emu_device dev;
	struct dpa_hal hal;
	struct emu_rank ranks[2];
	struct emu_wire wires[4];
	struct emu_wire_tx tx[2];
	uint8_t *data;
	uint8_t *src;
};

static void rig_init(struct rig *g, uint64_t wire_min)
{
	memset(g, 0, sizeof(*g));
	g->dev.attr.size = 2;
	g->dev.attr.rank = 0;
	g->dev.attr.wire_min = wire_min;
	g->dev.ncores = 2;
	g->dev.ranks = g->ranks;
	g->dev.wires = g->wires;
	g->dev.wire_slots = SLOTS;
	g->data = calloc(4 * SLOTS, EMU_WIRE_SLOT_BYTES);
	g->src = calloc(1, 2 * MIB);
	g->dev.wire_data = g->data;
	g->hal.dev = &g->dev;
	g->hal.wire_tx = g->tx;
	if (!g->data || !g->src) {
		puts("FAIL: out of memory");
		exit(1);
	}
}

static void rig_free(struct rig *g)
{
	free(g->data);
	free(g->src);
}

/* The target places everything on our wire to it; then our completions come. */
static void target_places(struct rig *g)
{
	struct emu_wire *w = &g->wires[0 * 2 + 1];

	for (uint32_t k = 0; k < SLOTS; k++)
		if (w->piece[k].state == EMU_WIRE_READY)
			w->piece[k].state = EMU_WIRE_FREE;
	emu_wire_poll(&g->hal);
}

/* One write of len to rank 1 as dpa_hal_rdma_write makes it, by the way chosen. */
static int write_once(struct rig *g, uint64_t len, uint64_t direct_ns)
{
	int wire = emu_wire_choose(&g->hal);

	emu_wire_chosen(&g->hal);
	if (wire)
		emu_wire_post(&g->hal, 1, (uint64_t)(uintptr_t)g->src, 0x1000, 7, len, 1, 0);
	else
		emu_wire_direct_took(&g->hal, len, direct_ns);
	target_places(g);
	return wire;
}

static void fresh_slots_are_not_timed(void)
{
	struct rig g;

	rig_init(&g, 64 * 1024);
	fake_step = 1000;
	/* Nothing measured: the wire, whose first copies fill the fresh slots, untimed. */
	check(write_once(&g, SLOTS * EMU_WIRE_SLOT_BYTES, 0) == 1, "first write: the wire");
	check(g.hal.wire_costs.wire_ns_per_mib == 0, "copies into fresh slots were timed");
	check(g.dev.wire_bytes == SLOTS * EMU_WIRE_SLOT_BYTES, "first write: all on the wire");
	/* The slots used before: timed, only the copies (a clock step each piece). */
	check(write_once(&g, SLOTS * EMU_WIRE_SLOT_BYTES, 0) == 1, "second write: the wire");
	check(g.hal.wire_costs.wire_ns_per_mib == 1000 * MIB / EMU_WIRE_SLOT_BYTES,
	      "the wire's cost: one clock step per piece");
	/* The wire measured, the direct way not: it goes directly, and is counted skipped. */
	check(write_once(&g, MIB, 900000) == 0, "third write: directly, to measure it");
	check(g.hal.wire_costs.direct_ns_per_mib == 900000, "the direct cost as timed");
	check(g.dev.wire_skipped_bytes == MIB, "a direct write by choice counts as skipped");
	check(g.hal.wire_costs.choices == 3, "every write counted once");
	/* Longer than the free slots: the rest goes directly, not waiting for slots. */
	direct_bytes_written = 0;
	emu_wire_post(&g.hal, 1, (uint64_t)(uintptr_t)g.src, 0x1000, 7, MIB, 2, 0);
	check(direct_bytes_written == MIB - SLOTS * EMU_WIRE_SLOT_BYTES, "overflow went directly");
	target_places(&g);
	rig_free(&g);
}

/* The way that cost less, except every EMU_WIRE_PROBE_EVERY-th choice. */
static void cheaper_way_and_probes(uint64_t wire_ns, uint64_t direct_ns, int want)
{
	struct rig g;
	uint32_t other = 0, choices = 4 * EMU_WIRE_PROBE_EVERY;

	rig_init(&g, 64 * 1024);
	g.hal.wire_costs.wire_ns_per_mib = wire_ns;
	g.hal.wire_costs.direct_ns_per_mib = direct_ns;
	for (uint32_t i = 0; i < choices; i++) {
		int wire = emu_wire_choose(&g.hal);

		/* Asking again without going gives the same answer: retries are not counted. */
		check(emu_wire_choose(&g.hal) == wire, "a second look changed the choice");
		if (wire != want) {
			other++;
			check(i % EMU_WIRE_PROBE_EVERY == EMU_WIRE_PROBE_EVERY - 1,
			      "the other way taken off a probe's turn");
		}
		emu_wire_chosen(&g.hal);
	}
	check(other == choices / EMU_WIRE_PROBE_EVERY, "one probe per EMU_WIRE_PROBE_EVERY");
	rig_free(&g);
}

static void samples(void)
{
	struct rig g;

	rig_init(&g, 64 * 1024);
	emu_wire_direct_took(&g.hal, MIB, 100000);
	check(g.hal.wire_costs.direct_ns_per_mib == 100000, "the first sample is the cost");
	/* A preempted copy (100x) counts as 4x at most: 3/4 * 100000 + 400000 / 4. */
	emu_wire_direct_took(&g.hal, MIB, 10000000);
	check(g.hal.wire_costs.direct_ns_per_mib == 175000, "an outlier's weight is capped");
	/* A faster sample moves it a quarter of the way. */
	emu_wire_direct_took(&g.hal, MIB, 75000);
	check(g.hal.wire_costs.direct_ns_per_mib == 175000 - 43750 + 18750, "moving average");
	/* Shorter than 64 KiB (wire_min 64 KiB): not timed, still counted. */
	emu_wire_direct_took(&g.hal, 32 * 1024, 1);
	check(g.hal.wire_costs.direct_ns_per_mib == 150000, "a short write was timed");
	check(g.dev.wire_skipped_bytes == 3 * MIB + 32 * 1024, "skipped bytes");
	rig_free(&g);

	/* wire_min 8 KiB: writes from 8 KiB are timed, or neither cost would ever be. */
	rig_init(&g, 8 * 1024);
	emu_wire_direct_took(&g.hal, 8 * 1024, 1000);
	check(g.hal.wire_costs.direct_ns_per_mib == 128000, "an 8 KiB write under wire_min 8K");
	rig_free(&g);

	/* wire_min under the 4 KiB floor counts as the floor. */
	rig_init(&g, 1024);
	emu_wire_direct_took(&g.hal, 2048, 1000);
	check(g.hal.wire_costs.direct_ns_per_mib == 0, "a write under the floor was timed");
	emu_wire_direct_took(&g.hal, 4096, 1000);
	check(g.hal.wire_costs.direct_ns_per_mib == 256000, "a 4 KiB write at the floor");
	rig_free(&g);
}

int main(void)
{
	fresh_slots_are_not_timed();
	/* Two copies at 100 against one at 300: the wire; at 200 (even) and 150: directly. */
	cheaper_way_and_probes(100, 300, 1);
	cheaper_way_and_probes(100, 200, 0);
	cheaper_way_and_probes(100, 150, 0);
	samples();
	if (failures)
		return 1;
	puts("ok: wire choice");
	return 0;
}

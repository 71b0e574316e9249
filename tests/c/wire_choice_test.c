/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The wire's choice of way (emulator/emu_wire.c: emu_wire_route, emu_wire_direct), with a
 * clock of the test's own: which way a write goes by the costs measured, that a write sent
 * back on a busy wire is not counted, what a sample does to a cost, which writes and which
 * spans are timed (the copies into slots this process used before; not the target's
 * wake-up), and a rank taken over by a new process. emu_wire.c is linked alone; the few
 * emulator calls it makes are stubs here (no job segment, no peer: the target's placing is
 * played by freeing the pieces). Prints "ok" and exits 0, else names each failed check.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

#define MIB (1ull << 20)
#define SLOTS 2u

static uint64_t fake_now, fake_step;   /* every clock read moves the clock by fake_step */
static uint64_t direct_bytes_written, direct_step;  /* a direct write moves it by direct_step */
#define WAKE_STEP 1000000ull            /* a wake-up of the target: must not be timed */

uint64_t emu_now_ns(void)
{
	fake_now += fake_step;
	return fake_now;
}

void emu_nudge_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	(void)dev, (void)rank, (void)pass;
	fake_now += WAKE_STEP;
}

void emu_flush_wakes(struct dpa_hal *pass)
{
	(void)pass;
	fake_now += WAKE_STEP;
}

void emu_wake_rank(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	(void)dev, (void)rank, (void)pass;
}

void emu_wake_rank_now(struct emu_device *dev, uint32_t rank, struct dpa_hal *pass)
{
	(void)dev, (void)rank, (void)pass;
}

int32_t emu_write_remote(struct emu_device *dev, uint32_t peer, const void *src, uint64_t raddr,
			 uint32_t rkey, uint64_t len)
{
	(void)dev, (void)peer, (void)src, (void)raddr, (void)rkey;
	direct_bytes_written += len;
	fake_now += direct_step;
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

int emu_push_cqe(struct dpa_hal *hal, uint64_t wr_id, int32_t status, uint64_t bytes,
		 uint32_t rail)
{
	hal->cq[hal->cq_tail++ & (EMU_CQ_DEPTH - 1)] = (struct dpa_hal_cqe){
		.wr_id = wr_id, .status = status, .bytes = (uint32_t)bytes, .rail = rail,
	};
	return 0;
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
	uint64_t head[2];
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
	g->dev.wire_head = g->head;
	g->dev.hals = &g->hal;
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

/* One write of len to rank 1 as dpa_hal_rdma_write makes it (into private memory). */
static int write_once(struct rig *g, uint64_t len)
{
	int way = emu_wire_route(&g->hal, 1, 1);

	if (way == EMU_WAY_WIRE)
		emu_wire_post(&g->hal, 1, (uint64_t)(uintptr_t)g->src, 0x1000, 7, len, 1, 0);
	else if (way == EMU_WAY_MEASURED)
		emu_wire_direct(&g->hal, 1, (uint64_t)(uintptr_t)g->src, 0x1000, 7, len);
	target_places(g);
	return way;
}

static void fresh_slots_are_not_timed(void)
{
	struct rig g;
	const uint64_t ring = SLOTS * EMU_WIRE_SLOT_BYTES;

	rig_init(&g, 64 * 1024);
	fake_step = 1000;
	direct_step = 900000;
	/* Nothing measured: the wire, whose first copies fill the fresh slots, untimed. */
	check(write_once(&g, ring) == EMU_WAY_WIRE, "first write: the wire");
	check(g.hal.wire_costs.wire.samples == 0, "copies into fresh slots were timed");
	check(g.dev.wire_bytes == ring, "first write: all on the wire");
	/* The slots used before: timed, the copies only (a clock step a piece; the target's
	 * wake-ups move the clock by far more). */
	check(write_once(&g, ring) == EMU_WAY_WIRE, "second write: the wire");
	check(g.hal.wire_costs.wire.ns_per_mib == 1000 * MIB / EMU_WIRE_SLOT_BYTES,
	      "the wire's cost: one clock step per piece, nothing else");
	/* The wire measured, the direct way not: it goes directly, timed, counted skipped. */
	check(write_once(&g, MIB) == EMU_WAY_MEASURED, "third write: directly, to measure it");
	check(g.hal.wire_costs.direct.ns_per_mib == 900000 + 1000, "the direct cost as timed");
	check(g.dev.wire_skipped_bytes == MIB, "a direct write by choice counts as skipped");
	check(g.hal.wire_costs.choices == 3, "every write counted once");
	/* Longer than the free slots: the rest goes directly, not waiting for slots. */
	direct_bytes_written = 0;
	emu_wire_post(&g.hal, 1, (uint64_t)(uintptr_t)g.src, 0x1000, 7, MIB, 2, 0);
	check(direct_bytes_written == MIB - ring, "overflow went directly");
	/* Its pieces on the wire: a write the choice sends directly (the wire made dear)
	 * waits, uncounted. */
	g.hal.wire_costs.wire.ns_per_mib = 10 * g.hal.wire_costs.direct.ns_per_mib;
	g.hal.wire_costs.choices = 0;
	check(emu_wire_route(&g.hal, 1, 1) == DPA_HAL_EAGAIN, "a direct write passed the wire");
	check(emu_wire_route(&g.hal, 1, 0) == DPA_HAL_EAGAIN, "any write passed the wire");
	check(g.hal.wire_costs.choices == 0, "a write sent back was counted");
	target_places(&g);
	check(emu_wire_route(&g.hal, 1, 1) == EMU_WAY_MEASURED, "the wire free: directly");
	check(g.hal.wire_costs.choices == 1, "the write that went was not counted");
	check(emu_wire_route(&g.hal, 1, 0) == EMU_WAY_DIRECT, "not eligible: directly, untimed");
	check(g.hal.wire_costs.choices == 1, "a write the wire may not take was counted");
	rig_free(&g);
}

/* A process taking over rank 0 goes on where the wire stands: the slots are not its own
 * yet (no page-table entries), so its first ring of copies is not timed either. */
static void taken_over_rank(void)
{
	struct rig g;

	rig_init(&g, 64 * 1024);
	fake_step = 1000;
	g.wires[0 * 2 + 1].tail = 5;  /* the dead process sent 5 pieces to rank 1 */
	emu_wire_adopt(&g.dev);
	check(g.tx[1].tail == 5 && g.tx[1].acked == 5, "adopt: the wire's tail");
	check(write_once(&g, SLOTS * EMU_WIRE_SLOT_BYTES) == EMU_WAY_WIRE, "adopted: the wire");
	check(g.hal.wire_costs.wire.samples == 0, "slots new to this process were timed");
	write_once(&g, SLOTS * EMU_WIRE_SLOT_BYTES);
	check(g.hal.wire_costs.wire.samples == 1, "its own slots were not timed");
	rig_free(&g);
}

/* The way that cost less, except every EMU_WIRE_PROBE_EVERY-th choice. */
static void cheaper_way_and_probes(uint64_t wire_ns, uint64_t direct_ns, int want)
{
	struct rig g;
	uint32_t other = 0, choices = 4 * EMU_WIRE_PROBE_EVERY;

	rig_init(&g, 64 * 1024);
	g.hal.wire_costs.wire = (struct emu_wire_cost){ .ns_per_mib = wire_ns, .samples = 2 };
	g.hal.wire_costs.direct = (struct emu_wire_cost){ .ns_per_mib = direct_ns, .samples = 2 };
	for (uint32_t i = 0; i < choices; i++) {
		int way = emu_wire_route(&g.hal, 1, 1);

		if ((way == EMU_WAY_WIRE) != want) {
			other++;
			check(i % EMU_WIRE_PROBE_EVERY == EMU_WIRE_PROBE_EVERY - 1,
			      "the other way taken off a probe's turn");
		}
	}
	check(other == choices / EMU_WIRE_PROBE_EVERY, "one probe per EMU_WIRE_PROBE_EVERY");
	rig_free(&g);
}

/* A direct write of len that took ns. */
static void direct_took(struct rig *g, uint64_t len, uint64_t ns)
{
	fake_step = 0;
	direct_step = ns;
	emu_wire_direct(&g->hal, 1, (uint64_t)(uintptr_t)g->src, 0x1000, 7, len);
}

static void samples(void)
{
	struct rig g;
	const struct emu_wire_cost *c = &g.hal.wire_costs.direct;

	rig_init(&g, 64 * 1024);
	/* A preempted first copy (100x) does not set the cost: the second is lower. */
	direct_took(&g, MIB, 10000000);
	check(c->ns_per_mib == 10000000 && c->samples == 1, "the first sample");
	direct_took(&g, MIB, 100000);
	check(c->ns_per_mib == 100000, "the lower of the first two starts the average");
	/* After those, a preempted copy counts 4x the average at most: 3/4 + 4/4. */
	direct_took(&g, MIB, 10000000);
	check(c->ns_per_mib == 175000, "an outlier's weight is capped");
	/* A faster sample moves it a quarter of the way. */
	direct_took(&g, MIB, 75000);
	check(c->ns_per_mib == 175000 - 43750 + 18750, "moving average");
	/* Shorter than 64 KiB (wire_min 64 KiB): not timed, still counted. */
	direct_took(&g, 32 * 1024, 1);
	check(c->ns_per_mib == 150000, "a short write was timed");
	check(g.dev.wire_skipped_bytes == 4 * MIB + 32 * 1024, "skipped bytes");
	/* A sender stopped for hours: no overflow into a tiny cost. */
	direct_took(&g, MIB, 1ull << 44);  /* times 2^20: wraps to 0 */
	check(c->ns_per_mib == 150000 - 37500 + 150000, "an overflowing sample");
	rig_free(&g);

	/* wire_min 8 KiB: writes from 8 KiB are timed, or neither cost would ever be. */
	rig_init(&g, 8 * 1024);
	direct_took(&g, 8 * 1024, 1000);
	check(c->ns_per_mib == 128000, "an 8 KiB write under wire_min 8K");
	rig_free(&g);

	/* wire_min under the 4 KiB floor counts as the floor. */
	rig_init(&g, 1024);
	direct_took(&g, 2048, 1000);
	check(c->samples == 0, "a write under the floor was timed");
	direct_took(&g, 4096, 1000);
	check(c->ns_per_mib == 256000, "a 4 KiB write at the floor");
	rig_free(&g);
}

int main(void)
{
	fresh_slots_are_not_timed();
	taken_over_rank();
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

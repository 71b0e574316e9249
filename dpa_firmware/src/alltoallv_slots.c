/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All-to-all-v into fixed slots, for small batches (DeepEP's low-latency mode): the
 * destination holds one slot of slot_bytes per source, so every receiver publishes all its
 * readies at intake, as all-to-all does, and there is no count round. Each sender fills at
 * most a slot and announces its byte count just before its done signal (same QP, so it
 * lands first); the receiver reads the count when the signal arrives.
 */
#include "engine_internal.h"
#include "p2p.h"

/* The sends and the slots, checked against src and dst; 0 if the command is malformed. */
static int plan(struct dpa_engine *eng, struct dpa_hal *hal, const struct dpa_op *op, uint32_t n,
		struct dpa_vlayout *v)
{
	const struct offload_alltoallv_args *args = dpa_a2av_args(eng, hal, op);
	uint64_t off = 0, slots;

	if (!args || op->cmd.flags != OFFLOAD_CMD_F_SLOTS ||
	    __builtin_mul_overflow(args->slot_bytes, n, &slots) || slots > op->cmd.dst_len ||
	    (slots && !op->cmd.dst_addr))
		return 0;
	for (uint32_t p = 0; p < n; p++) {
		v->send_len[p] = args->bytes[p];  /* send[p] */
		v->send_off[p] = off;
		v->recv_off[p] = (uint64_t)p * args->slot_bytes;
		v->recv_len[p] = args->slot_bytes;
		if (__builtin_add_overflow(off, v->send_len[p], &off))
			return 0;
	}
	return off <= op->cmd.count && (!off || op->cmd.src_addr);
}

static int publish(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal, uint32_t src)
{
	const struct dpa_vlayout *v = op->alg.v;

	/* Marked SLOT even when refused: a counting peer waits for our count otherwise. */
	if (op->refuse)
		return dpa_publish_ready(eng, op, hal, src, 0, 0,
					 OFFLOAD_READY_REFUSED | OFFLOAD_READY_SLOT);
	return dpa_publish_ready(eng, op, hal, src, op->cmd.dst_addr + v->recv_off[src],
				 v->recv_len[src], OFFLOAD_READY_SLOT);
}

static int slots_start(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_vlayout *v = &eng->vlayouts[op->index];
	uint32_t n = team->size, me = team->my_rank;

	v->rows_addr = v->place_addr = 0;
	op->alg.v = v;
	if (!plan(eng, hal, op, n, v)) {
		for (uint32_t p = 0; p < n; p++)
			v->send_len[p] = v->send_off[p] = 0;
		dpa_op_refuse(eng, op, OFFLOAD_ERR_INVALID);
	}
	for (uint32_t i = 0; i < n; i++) {
		if (publish(eng, op, hal, (me + n - i) % n) == DPA_HAL_EAGAIN)
			break;
		op->items[i].flags |= DPA_ITEM_READY_OUT;
	}
	return (int)n;
}

/* The source's signal arrived: its announced count says how much of its slot it filled. */
static void take_count(struct dpa_engine *eng, struct dpa_op *op, struct dpa_hal *hal,
		       uint32_t src)
{
	struct offload_alltoallv_args *args = dpa_a2av_args(eng, hal, op);
	const struct offload_count *c = dpa_my_count(eng, hal, op->team_id, op->slot, src);
	/* Pairs with the sender's seq write, which precedes its signal on the same QP. */
	uint64_t bytes = off_load_acquire(&c->seq) == op->seq ? c->bytes : 0;

	if (bytes > op->alg.v->recv_len[src])  /* a peer's word, re-checked like any other */
		bytes = 0;
	if (args && !op->refuse)
		args->bytes[eng->teams[op->team_id].size + src] = bytes;  /* recv[src] */
	off_fetch_add(&op->result0, bytes);
}

static int slots_progress(struct dpa_engine *eng, struct dpa_op *op, uint32_t i,
			  struct dpa_hal *hal)
{
	const struct dpa_team *team = &eng->teams[op->team_id];
	struct dpa_item *it = &op->items[i];
	const struct dpa_vlayout *v = op->alg.v;
	uint32_t n = team->size, me = team->my_rank;
	uint32_t src = (me + n - i) % n, dst = (me + i) % n;
	struct dpa_send send = {
		.addr = op->cmd.src_addr + v->send_off[dst], .len = v->send_len[dst], .slot = 1,
	};
	int work = dpa_item_begin(eng, op, i, hal, publish);

	if (work < 0)
		return 0;
	work += dpa_exchange_step(eng, op, i, hal, &send);
	if ((it->flags & DPA_ITEM_RECVD) && !(it->flags & DPA_ITEM_COUNT_IN)) {
		take_count(eng, op, hal, src);
		it->flags |= DPA_ITEM_COUNT_IN;
	}
	return work;
}

const struct dpa_algo dpa_algo_alltoallv_slots = {
	.start = slots_start,
	.progress = slots_progress,
	.bytes_sent = dpa_alltoallv_bytes_sent,
};

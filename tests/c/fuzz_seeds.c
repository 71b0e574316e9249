/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fuzz driver's starting points: valid command sequences in the input format of fuzz.h,
 * built field by field. One rank alone (every collective, rows, slots, team creation, a
 * ring that wraps, a host that never reaps), malformed commands of every kind, and several
 * ranks whose peers the pokes play: readies, counts and done signals that let all-to-all,
 * all-to-all-v, slots and barriers complete, a refused write, a dead peer, failed_ranks, a
 * rail failing mid-transfer, an op timeout, CANCEL. `fuzz_main -verbose=1 -runs=N` shows
 * what each one's commands completed with.
 */
#include <string.h>

#include "fuzz.h"

struct builder {
	struct fz_header h;
	struct offload_cmd cmds[FZ_MAX_CMDS];
	uint32_t ncmds;
	struct fz_poke pokes[FZ_MAX_POKES];
	uint32_t npokes;
	_Alignas(8) uint8_t aux[FZ_AUX_LEN];
	size_t aux_len;
};

#define AUX_DESC   FZ_SEED_AUX_DESC
#define AUX_ARGS   FZ_SEED_AUX_ARGS
#define AUX_ARGS2  FZ_SEED_AUX_ARGS2
#define AUX_ROWS   FZ_SEED_AUX_ROWS
#define AUX_DESC2  FZ_SEED_AUX_DESC2

static void b_init(struct builder *b, uint32_t world, uint32_t me, uint32_t threads)
{
	memset(b, 0, sizeof(*b));
	b->h.world = (uint8_t)(world - 1);
	b->h.me = (uint8_t)me;
	b->h.threads = (uint8_t)(threads - 1);
	b->h.sq_log = 2;        /* 32 */
	b->h.cq_log = 4;        /* 64 */
	b->h.hal_cq_log = 5;    /* 64 */
	b->h.chunk_log = 6;     /* 4 KiB */
	b->h.chunks = 1;        /* 2 a pass */
	b->h.passes = 1000;
}

static struct offload_cmd *b_cmd(struct builder *b, uint8_t opcode, uint16_t team)
{
	struct offload_cmd *c = &b->cmds[b->ncmds++];

	*c = (struct offload_cmd){ .opcode = opcode, .team = team };
	return c;
}

static void b_aux(struct builder *b, uint32_t off, const void *p, size_t len)
{
	memcpy(b->aux + off, p, len);
	if (b->aux_len < off + len)
		b->aux_len = off + len;
}

static void b_poke(struct builder *b, struct fz_poke p)
{
	b->pokes[b->npokes++] = p;
}

static void b_desc(struct builder *b, uint32_t off, uint32_t team, uint32_t size, uint32_t my_rank,
		   const uint32_t *world_ranks)
{
	uint8_t raw[16 + 16 * FZ_MAX_WORLD] = { 0 };
	struct offload_team_desc *d = (struct offload_team_desc *)(void *)raw;

	d->team_id = team;
	d->size = size;
	d->my_rank = my_rank;
	for (uint32_t i = 0; i < size; i++)
		d->peers[i] = (struct offload_peer){ .ctrl_addr = fz_addr(world_ranks[i], FZ_CTRL),
			.ctrl_key = fz_key(world_ranks[i], FZ_CTRL), .world_rank = world_ranks[i] };
	b_aux(b, off, d, offload_team_desc_bytes(size));
}

static void b_a2a(struct builder *b, uint16_t team, uint32_t me, uint32_t n, uint64_t count)
{
	struct offload_cmd *c = b_cmd(b, OFFLOAD_OP_ALLTOALL, team);

	c->count = count;
	if (count) {
		c->src_addr = fz_addr(me, FZ_SRC);
		c->src_key = fz_key(me, FZ_SRC);
		c->dst_addr = fz_addr(me, FZ_DST);
		c->dst_key = fz_key(me, FZ_DST);
		c->dst_len = count * n;
	}
}

/* An all-to-all-v whose args live at aux offset `off`: send[p] bytes to team rank p. */
static struct offload_cmd *b_a2av(struct builder *b, uint16_t team, uint32_t me, uint32_t n,
				  uint32_t off, const uint64_t *send, uint64_t dst_len)
{
	uint64_t raw[8 + 3 * FZ_MAX_WORLD] = { 0 };
	struct offload_alltoallv_args *args = (struct offload_alltoallv_args *)(void *)raw;
	struct offload_cmd *c = b_cmd(b, OFFLOAD_OP_ALLTOALLV, team);
	uint64_t total = 0;

	args->nranks = n;
	for (uint32_t p = 0; p < n; p++) {
		offload_a2av_send(args)[p] = send[p];
		total += send[p];
	}
	b_aux(b, off, args, offload_a2av_args_bytes(n));
	c->src_addr = fz_addr(me, FZ_SRC);
	c->src_key = fz_key(me, FZ_SRC);
	c->count = total;
	c->dst_addr = fz_addr(me, FZ_DST);
	c->dst_key = fz_key(me, FZ_DST);
	c->dst_len = dst_len;
	c->aux_addr = FZ_AUX_BASE + off;
	return c;
}

/* An agreement on team 0 whose args (header nranks/words, then a one-word bitmap) live
 * at aux offset `off`. */
static struct offload_cmd *b_agree(struct builder *b, uint32_t off, uint32_t nranks,
				   uint32_t words, uint64_t failed)
{
	uint64_t raw[4 + 2] = { 0 };
	struct offload_agree_args *args = (struct offload_agree_args *)(void *)raw;
	struct offload_cmd *c = b_cmd(b, OFFLOAD_OP_AGREE, 0);

	args->nranks = nranks;
	args->words = words;
	args->value = 7;
	args->fp = 3;
	offload_agree_failed(args)[0] = failed;
	b_aux(b, off, args, sizeof(raw));
	c->aux_addr = FZ_AUX_BASE + off;
	return c;
}

static struct offload_alltoallv_args *b_args(struct builder *b, uint32_t off)
{
	return (struct offload_alltoallv_args *)(void *)(b->aux + off);
}

static void b_emit(const struct builder *b, struct fz_bytes *out)
{
	struct fz_header h = b->h;
	size_t off = 0;

	h.ncmds = (uint8_t)b->ncmds;
	h.npokes = (uint8_t)b->npokes;
	memcpy(out->data, &h, sizeof(h));
	off += sizeof(h);
	memcpy(out->data + off, b->cmds, b->ncmds * sizeof(struct offload_cmd));
	off += b->ncmds * sizeof(struct offload_cmd);
	memcpy(out->data + off, b->pokes, b->npokes * sizeof(struct fz_poke));
	off += b->npokes * sizeof(struct fz_poke);
	memcpy(out->data + off, b->aux, b->aux_len);
	out->len = off + b->aux_len;
}

static struct fz_poke ready_poke(uint16_t seq, uint32_t src, uint32_t slot, uint64_t addr,
				 uint64_t len, uint32_t key)
{
	return (struct fz_poke){ .kind = FZ_POKE_READY, .slot = (uint8_t)slot, .src = (uint8_t)src,
		.seq = seq, .a = addr, .b = len, .c = key };
}

static struct fz_poke done_poke(uint32_t src, uint32_t slot, uint64_t value, uint16_t at)
{
	return (struct fz_poke){ .kind = FZ_POKE_DONE, .slot = (uint8_t)slot, .src = (uint8_t)src,
		.a = value, .at_pass = at };
}

static struct fz_poke count_poke(uint16_t seq, uint32_t src, uint32_t slot, uint64_t bytes)
{
	return (struct fz_poke){ .kind = FZ_POKE_COUNT, .slot = (uint8_t)slot, .src = (uint8_t)src,
		.seq = seq, .a = bytes };
}

static struct fz_bytes *seeds;
static const char **seed_names;
static uint32_t nseeds, seeds_max;

static void add_seed(const struct builder *b, const char *name)
{
	if (nseeds == seeds_max)
		return;
	b_emit(b, &seeds[nseeds]);
	seed_names[nseeds++] = name;
}

/* One rank alone: every collective completes without peers. */
static void seeds_single(void)
{
	static struct builder b;
	uint64_t one = 1000;
	uint32_t me0 = 0;
	struct offload_alltoallv_args *a;

	b_init(&b, 1, 0, 1);
	b_cmd(&b, OFFLOAD_OP_NOP, 0);
	b_cmd(&b, OFFLOAD_OP_NOP, 7);
	add_seed(&b, "nop");

	b_init(&b, 1, 0, 2);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	b_a2a(&b, 0, 0, 1, 4096);
	b_a2a(&b, 0, 0, 1, 0);
	b_a2a(&b, 0, 0, 1, FZ_DST_LEN);
	b_a2av(&b, 0, 0, 1, AUX_ARGS, &one, 8192);
	one = 1500;
	b_a2av(&b, 0, 0, 1, AUX_ARGS2, &one, 4096)->flags = OFFLOAD_CMD_F_SLOTS;
	b_args(&b, AUX_ARGS2)->slot_bytes = 2048;
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	add_seed(&b, "single-rank collectives");

	/* Rows (MoE dispatch): a table of 100 rows of 64 bytes, rows 3 1 4 1 5 go to rank 0. */
	b_init(&b, 1, 0, 1);
	one = 5 * 64;
	b_a2av(&b, 0, 0, 1, AUX_ARGS, &one, 4096)->flags = OFFLOAD_CMD_F_ROWS;
	b.cmds[0].count = 100 * 64;
	a = b_args(&b, AUX_ARGS);
	a->rows_addr = FZ_AUX_BASE + AUX_ROWS;
	a->row_bytes = 64;
	b_aux(&b, AUX_ROWS, (const uint32_t[]){ 3, 1, 4, 1, 5 }, 5 * sizeof(uint32_t));
	one = 640;
	b_a2av(&b, 0, 0, 1, AUX_ARGS2, &one, 640)->flags = OFFLOAD_CMD_F_EXPECT;
	offload_a2av_expect(b_args(&b, AUX_ARGS2))[0] = 640;
	add_seed(&b, "rows and expect");

	/* Placed rows (MoE combine): 3 rows of 64 bytes land at rows 7 0 3 of our own table;
	 * then gathered and placed at once (rows 5 2 to rows 1 60). */
	b_init(&b, 1, 0, 1);
	one = 3 * 64;
	b_a2av(&b, 0, 0, 1, AUX_ARGS, &one, 4096)->flags = OFFLOAD_CMD_F_PLACE;
	a = b_args(&b, AUX_ARGS);
	a->place_addr = FZ_AUX_BASE + AUX_ROWS;
	a->row_bytes = 64;
	b_aux(&b, AUX_ROWS, (const uint32_t[]){ 7, 0, 3, 5, 2, 1, 60 }, 7 * sizeof(uint32_t));
	one = 2 * 64;
	b_a2av(&b, 0, 0, 1, AUX_ARGS2, &one, 4096)->flags = OFFLOAD_CMD_F_ROWS | OFFLOAD_CMD_F_PLACE;
	b.cmds[1].count = 10 * 64;
	a = b_args(&b, AUX_ARGS2);
	a->rows_addr = FZ_AUX_BASE + AUX_ROWS + 3 * sizeof(uint32_t);
	a->place_addr = FZ_AUX_BASE + AUX_ROWS + 5 * sizeof(uint32_t);
	a->row_bytes = 64;
	add_seed(&b, "placed rows");

	/* Teams created by the input, including one created twice. */
	b_init(&b, 1, 0, 1);
	b.h.flags = FZ_F_NO_WORLD;
	b_desc(&b, AUX_DESC, 0, 1, 0, &me0);
	b_desc(&b, AUX_DESC2, 3, 1, 0, &me0);
	b_cmd(&b, OFFLOAD_OP_TEAM_CREATE, 0)->aux_addr = FZ_AUX_BASE + AUX_DESC;
	b_cmd(&b, OFFLOAD_OP_TEAM_CREATE, 0)->aux_addr = FZ_AUX_BASE + AUX_DESC2;
	b_cmd(&b, OFFLOAD_OP_TEAM_CREATE, 0)->aux_addr = FZ_AUX_BASE + AUX_DESC2;
	b_cmd(&b, OFFLOAD_OP_BARRIER, 3);
	b_a2a(&b, 3, 0, 1, 512);
	b_a2a(&b, 0, 0, 1, 100);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 1);
	add_seed(&b, "team create");

	/* A team pool of world + 1 members (bit 3): the world team of 2 fits, a second team of
	 * 2 is NO_SPACE (nothing of it exists after), one of 1 fits in what is left. */
	b_init(&b, 2, 0, 1);
	b.h.misc = 8;
	b_desc(&b, AUX_DESC, 4, 2, 0, (const uint32_t[]){ 0, 1 });
	b_desc(&b, AUX_DESC2, 5, 1, 0, &me0);
	b_cmd(&b, OFFLOAD_OP_TEAM_CREATE, 0)->aux_addr = FZ_AUX_BASE + AUX_DESC;
	b_cmd(&b, OFFLOAD_OP_BARRIER, 4);
	b_cmd(&b, OFFLOAD_OP_TEAM_CREATE, 0)->aux_addr = FZ_AUX_BASE + AUX_DESC2;
	b_a2a(&b, 5, 0, 1, 512);
	add_seed(&b, "team pool full");

	/* Many small ops through a small ring whose indices wrap. */
	b_init(&b, 1, 0, 3);
	b.h.flags = FZ_F_WRAP;
	b.h.sq_log = 0;
	b.h.cq_log = 1;
	for (int i = 0; i < 40; i++) {
		if (i % 3 == 0)
			b_a2a(&b, 0, 0, 1, 64u * (uint64_t)(i + 1));
		else
			b_cmd(&b, i % 3 == 1 ? OFFLOAD_OP_BARRIER : OFFLOAD_OP_NOP, 0);
	}
	add_seed(&b, "wrap");

	/* The host never reaps: a full completion ring must hold the engine back. */
	b_init(&b, 1, 0, 1);
	b.h.flags = FZ_F_NO_REAP;
	b.h.cq_log = 0;
	for (int i = 0; i < 12; i++)
		b_cmd(&b, i & 1 ? OFFLOAD_OP_NOP : OFFLOAD_OP_BARRIER, 0);
	add_seed(&b, "no reap");
}

/* Malformed commands: each must be answered with an error, never a crash. */
static void seeds_bad(void)
{
	static struct builder b;
	struct offload_cmd *c;
	uint64_t send = 100;

	b_init(&b, 1, 0, 1);
	b_cmd(&b, OFFLOAD_OP_MAX, 0);
	b_cmd(&b, 200, 0);
	b_cmd(&b, OFFLOAD_OP_BARRIER, OFFLOAD_MAX_TEAMS);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0xffff);
	b_cmd(&b, OFFLOAD_OP_ALLTOALL, 5);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0)->count = 1;
	b_a2a(&b, 0, 0, 1, 1ull << 63);
	b_a2a(&b, 0, 0, 1, 1ull << 20);
	b.cmds[b.ncmds - 1].dst_len = 1ull << 40;  /* the firmware believes it, the HAL won't */
	b_a2a(&b, 0, 0, 1, 4096);
	b.cmds[b.ncmds - 1].src_key = fz_key(0, FZ_DST) ^ 0x100;
	b_a2a(&b, 0, 0, 1, 4096);
	b.cmds[b.ncmds - 1].dst_key = fz_key(0, FZ_SRC);  /* no write access */
	b_a2a(&b, 0, 0, 1, 4096);
	b.cmds[b.ncmds - 1].flags = 0xff;
	b_a2a(&b, 0, 0, 1, 4096);
	b.cmds[b.ncmds - 1].src_addr = fz_addr(0, FZ_SRC) + FZ_SRC_LEN - 100;
	c = b_a2av(&b, 0, 0, 1, AUX_ARGS, &send, 50);        /* no space */
	c = b_a2av(&b, 0, 0, 1, AUX_ARGS, &send, 4096);
	c->aux_addr = 0;
	c = b_a2av(&b, 0, 0, 1, AUX_ARGS, &send, 4096);
	c->aux_addr = FZ_AUX_BASE + FZ_AUX_LEN - 8;
	c = b_a2av(&b, 0, 0, 1, AUX_ARGS, &send, 4096);
	c->count = 10;                                        /* sends exceed src */
	c = b_a2av(&b, 0, 0, 1, AUX_ARGS, &send, 4096);
	c->flags = OFFLOAD_CMD_F_ROWS;                        /* row_bytes 0 */
	c = b_a2av(&b, 0, 0, 1, AUX_ARGS, &send, 4096);
	c->flags = OFFLOAD_CMD_F_PLACE;                       /* row_bytes 0 */
	c = b_a2av(&b, 0, 0, 1, AUX_ARGS2, &send, 4096);
	c->flags = OFFLOAD_CMD_F_PLACE;
	c->count = 50;                                        /* placed sends exceed src */
	b_args(&b, AUX_ARGS2)->row_bytes = 1;
	b_args(&b, AUX_ARGS2)->place_addr = FZ_AUX_BASE + AUX_ROWS;
	b_cmd(&b, OFFLOAD_OP_TEAM_CREATE, 0)->aux_addr = FZ_AUX_BASE + AUX_ARGS;
	b_cmd(&b, OFFLOAD_OP_TEAM_CREATE, 0);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	add_seed(&b, "malformed");

	/* Agreement (ABI 14): one well-formed, then its arguments forged: another world
	 * size, a bitmap of another length, cut off by the window's end, misaligned. */
	b_init(&b, 1, 0, 1);
	b_agree(&b, AUX_ARGS, 1, 1, 1);
	b_agree(&b, AUX_ARGS + 64, 2, 1, 0);
	b_agree(&b, AUX_ARGS + 128, 1, 2, 0);
	b_agree(&b, AUX_ARGS + 192, 1, 0, 0);
	b_agree(&b, AUX_ARGS2, 1, 1, 0)->aux_addr = FZ_AUX_BASE + FZ_AUX_LEN - 32;
	b_aux(&b, FZ_AUX_LEN - 32, b.aux + AUX_ARGS2, 32);  /* a good header, no bitmap */
	b_agree(&b, AUX_ARGS + 256, 1, 1, 0)->aux_addr += 4;
	b_agree(&b, AUX_ARGS + 320, 1, 1, 0)->count = 1;
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	add_seed(&b, "malformed agreement");
}

/* Several ranks: the pokes play the peers, so that some ops complete. */
static void seeds_multi(void)
{
	static struct builder b;
	uint64_t send[FZ_MAX_WORLD];
	uint32_t n, me;

	/* 2 ranks, we are 0: all-to-all (seq 1), barrier (seq 2), all-to-all-v (seq 3). */
	n = 2;
	me = 0;
	b_init(&b, n, me, 2);
	b_a2a(&b, 0, me, n, 1024);
	b_poke(&b, ready_poke(1, 1, 1, fz_addr(1, FZ_DST) + me * 1024, 1024, fz_key(1, FZ_DST)));
	b_poke(&b, done_poke(1, 1, OFFLOAD_SIGNAL_OK, 5));
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	b_poke(&b, done_poke(1, 2, OFFLOAD_SIGNAL_OK, 10));
	send[0] = 300;
	send[1] = 700;
	b_a2av(&b, 0, me, n, AUX_ARGS, send, 4096);
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_COUNT, .slot = 3, .src = 1, .seq = 3, .a = 500,
				     .at_pass = 12 });
	b_poke(&b, ready_poke(3, 1, 3, fz_addr(1, FZ_DST), 700, fz_key(1, FZ_DST)));
	b.pokes[b.npokes - 1].at_pass = 20;
	b_poke(&b, done_poke(1, 3, OFFLOAD_SIGNAL_OK, 30));
	add_seed(&b, "2 ranks, peer played by pokes");

	/* 3 ranks, we are 1: barrier rounds hear from 0 then 2; a peer's signal says error. */
	n = 3;
	me = 1;
	b_init(&b, n, me, 1);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	b_poke(&b, done_poke(0, 1, OFFLOAD_SIGNAL_OK, 3));
	b_poke(&b, done_poke(2, 1, OFFLOAD_SIGNAL_OK, 6));
	b_a2a(&b, 0, me, n, 256);
	b_poke(&b, ready_poke(2, 2, 2, fz_addr(2, FZ_DST) + me * 256, 256, fz_key(2, FZ_DST)));
	b_poke(&b, ready_poke(2, 0, 2, fz_addr(0, FZ_DST) + me * 256, 256, fz_key(0, FZ_SRC)));
	b_poke(&b, done_poke(0, 2, OFFLOAD_SIGNAL_ERROR, 9));
	b_poke(&b, done_poke(2, 2, OFFLOAD_SIGNAL_OK, 9));
	add_seed(&b, "3 ranks, barrier and refused write");

	/* 4 ranks, nobody answers: ops pile up past the op window. */
	n = 4;
	me = 2;
	b_init(&b, n, me, 4);
	for (int i = 0; i < 12; i++) {
		if (i % 3 == 0) {
			b_a2a(&b, 0, me, n, 128u * (uint64_t)(i + 1));
		} else if (i % 3 == 1) {
			for (uint32_t p = 0; p < n; p++)
				send[p] = 64u * (p + (uint32_t)i);
			b_a2av(&b, 0, me, n, i & 4 ? AUX_ARGS : AUX_ARGS2, send, FZ_DST_LEN);
		} else {
			b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
		}
	}
	b_cmd(&b, OFFLOAD_OP_NOP, 0);
	add_seed(&b, "4 ranks, pending");

	/* A dead peer, and the host's failed set. */
	n = 3;
	me = 0;
	b_init(&b, n, me, 2);
	b.h.dead = 1u << 2;
	b_a2a(&b, 0, me, n, 512);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_HOST, .c = 0, .a = 1u << 1, .at_pass = 4 });
	b_a2a(&b, 0, me, n, 512);
	add_seed(&b, "dead peer");

	/* 5 ranks, low-latency slots: readies at intake, counts with the signal. */
	n = 5;
	me = 3;
	b_init(&b, n, me, 3);
	for (uint32_t p = 0; p < n; p++)
		send[p] = 100 + 10 * p;
	b_a2av(&b, 0, me, n, AUX_ARGS, send, 5 * 256)->flags = OFFLOAD_CMD_F_SLOTS;
	b_args(&b, AUX_ARGS)->slot_bytes = 256;
	for (uint32_t p = 0; p < n; p++) {
		if (p == me)
			continue;
		b_poke(&b, ready_poke(1, p, 1, fz_addr(p, FZ_DST) + me * 256, 256, fz_key(p, FZ_DST)));
		b_poke(&b, count_poke(1, p, 1, 50 + p));
		b_poke(&b, done_poke(p, 1, OFFLOAD_SIGNAL_OK, (uint16_t)(8 + p)));
	}
	add_seed(&b, "5 ranks, slots");

	/* 2 ranks, placed: the peer publishes its whole table (PLACED). A row past it fails the
	 * op before any write; a rank whose own plan was refused (row_bytes 0) meets a PLACED
	 * ready without dividing by its row size. */
	n = 2;
	me = 0;
	b_init(&b, n, me, 1);
	send[0] = send[1] = 2 * 64;
	b_a2av(&b, 0, me, n, AUX_ARGS, send, 4096)->flags = OFFLOAD_CMD_F_PLACE;
	b_args(&b, AUX_ARGS)->place_addr = FZ_AUX_BASE + AUX_ROWS;
	b_args(&b, AUX_ARGS)->row_bytes = 64;
	b_aux(&b, AUX_ROWS, (const uint32_t[]){ 1, 0, 3, 2, 0, 9 }, 6 * sizeof(uint32_t));
	b_poke(&b, count_poke(1, 1, 1, 64));
	b_poke(&b, ready_poke(1, 1, 1, fz_addr(1, FZ_DST), 4 * 64, fz_key(1, FZ_DST)));
	b.pokes[b.npokes - 1].d = OFFLOAD_READY_PLACED;
	b_poke(&b, done_poke(1, 1, OFFLOAD_SIGNAL_OK, 10));
	send[0] = send[1] = 64;
	b_a2av(&b, 0, me, n, AUX_ARGS2, send, 4096)->flags = OFFLOAD_CMD_F_PLACE;
	b_args(&b, AUX_ARGS2)->place_addr = FZ_AUX_BASE + AUX_ROWS + 4 * sizeof(uint32_t);
	b_args(&b, AUX_ARGS2)->row_bytes = 64;  /* row 9 is past the peer's 4 */
	b_poke(&b, count_poke(2, 1, 2, 64));
	b_poke(&b, ready_poke(2, 1, 2, fz_addr(1, FZ_DST), 4 * 64, fz_key(1, FZ_DST)));
	b.pokes[b.npokes - 1].d = OFFLOAD_READY_PLACED;
	b_poke(&b, done_poke(1, 2, OFFLOAD_SIGNAL_OK, 20));
	b_a2av(&b, 0, me, n, AUX_DESC, send, 4096)->flags = OFFLOAD_CMD_F_PLACE;
	b_poke(&b, count_poke(3, 1, 3, 64));
	b_poke(&b, ready_poke(3, 1, 3, fz_addr(1, FZ_DST), 4 * 64, fz_key(1, FZ_DST)));
	b.pokes[b.npokes - 1].d = OFFLOAD_READY_PLACED;
	add_seed(&b, "2 ranks, placed");

	/* Two rails; rail 0 to our peer fails mid-transfer: the rest goes out on rail 1. */
	n = 2;
	me = 0;
	b_init(&b, n, me, 2);
	b.h.misc = 1u << 1;     /* 2 rails */
	b.h.chunk_log = 5;      /* 2 KiB pieces */
	b_a2a(&b, 0, me, n, 16384);
	b_poke(&b, ready_poke(1, 1, 1, fz_addr(1, FZ_DST) + me * 16384, 16384, fz_key(1, FZ_DST)));
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_RAIL, .src = 1, .c = 0, .at_pass = 3 });
	b_poke(&b, done_poke(1, 1, OFFLOAD_SIGNAL_OK, 30));
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	b_poke(&b, done_poke(1, 2, OFFLOAD_SIGNAL_OK, 40));
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_RAIL, .c = 1, .d = 1, .at_pass = 50 });
	b_a2a(&b, 0, me, n, 100);
	add_seed(&b, "rail failover");

	/* Completions the firmware never asked for, naming items past any team (the wr_id's
	 * item field is 24 bits): the firmware drops them, never indexes with them. */
	n = 2;
	me = 0;
	b_init(&b, n, me, 2);
	b_a2a(&b, 0, me, n, 4096);
	b_poke(&b, ready_poke(1, 1, 1, fz_addr(1, FZ_DST) + me * 4096, 4096, fz_key(1, FZ_DST)));
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_CQE, .src = 1, .a = 254, .at_pass = 3 });
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_CQE, .src = 1, .a = 298, .c = 1, .d = 1,
				     .at_pass = 4 });
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_CQE, .src = 1, .a = 0xfffff0, .at_pass = 5 });
	b_poke(&b, done_poke(1, 1, OFFLOAD_SIGNAL_OK, 30));
	add_seed(&b, "forged completions");

	/* Timeouts and cancel (ABI 5): a stuck op is aborted, its team poisoned. */
	n = 2;
	me = 1;
	b_init(&b, n, me, 1);
	b.h.flags = FZ_F_TIMEOUT;
	b.h.timeout = 2;
	b_a2a(&b, 0, me, n, 4096);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	add_seed(&b, "timeout");
	b.h.flags = 0;
	b_cmd(&b, 5, 0)->count = FZ_TAG(0);   /* OFFLOAD_OP_CANCEL in ABI 5 */
	b_cmd(&b, 5, 0)->count = FZ_TAG(40);
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	add_seed(&b, "cancel");

	/* An agreement of 2 ranks, we are 0 (its first coordinator): the peer's proposal
	 * (epoch 1, failed: us) and then its decision land in our control region. */
	n = 2;
	me = 0;
	b_init(&b, n, me, 1);
	b_agree(&b, AUX_ARGS, n, 1, 2);
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_CTRL, .a = 1, .at_pass = 3,
		.c = (uint32_t)(offload_ctrl_team_off(n, 0) + offload_ctrl_agree_prop_in(n, 1) +
				offsetof(struct offload_agree_word, epoch)) });
	b_poke(&b, (struct fz_poke){ .kind = FZ_POKE_CTRL, .a = 1, .at_pass = 8,
		.c = (uint32_t)(offload_ctrl_team_off(n, 0) + offload_ctrl_agree_dec_in(n, 1) +
				offsetof(struct offload_agree_word, epoch)) });
	b_cmd(&b, OFFLOAD_OP_BARRIER, 0);
	add_seed(&b, "agreement");
}

uint32_t fz_build_seeds(struct fz_bytes *out, const char **names, uint32_t max)
{
	seeds = out;
	seed_names = names;
	seeds_max = max;
	nseeds = 0;
	seeds_single();
	seeds_bad();
	seeds_multi();
	return nseeds;
}

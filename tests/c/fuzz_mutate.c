/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fuzz driver's inputs (fuzz_main.c runs them): random ones, and seeds mutated field
 * by field (commands, pokes of device memory, aux structures), aimed at the addresses,
 * keys and values the engine checks. splitmix64 from one seed: a failure reproduces.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

/* ---- random numbers (splitmix64: the seed alone fixes every input) ---- */

static uint64_t rng_state;

void fz_rng_seed(uint64_t seed)
{
	rng_state = seed;
}

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint32_t fz_below(uint32_t n)
{
	return n ? (uint32_t)(rnd() % n) : 0;
}

/* ---- mutation ---- */

static const uint64_t interesting64[] = {
	0, 1, 2, 7, 8, 63, 64, 100, 255, 256, 1000, 1024, 4095, 4096, 4097, 65535, 65536, 65537,
	1ull << 31, 1ull << 32, (1ull << 32) - 1, 1ull << 62, 1ull << 63, UINT64_MAX,
	UINT64_MAX - 1, UINT64_MAX - 63, FZ_AUX_BASE, FZ_AUX_BASE + FZ_AUX_LEN - 8,
};

static uint64_t pick_addr(uint32_t world)
{
	const uint64_t len[FZ_KINDS] = { offload_ctrl_bytes(world), FZ_SRC_LEN, FZ_DST_LEN };
	uint32_t k = fz_below(FZ_KINDS + 1);
	uint64_t base, span;

	if (k == FZ_KINDS) {   /* aux */
		base = FZ_AUX_BASE;
		span = FZ_AUX_LEN;
	} else {
		base = fz_addr(fz_below(world + 1), (enum fz_kind)k);
		span = len[k];
	}
	switch (fz_below(6)) {
	case 0: return base;
	case 1: return base + span;
	case 2: return base + span - 1 - fz_below(16);
	case 3: return base - 1 - fz_below(64);
	case 4: return base + (fz_below((uint32_t)span) & ~7u);
	default: return base + fz_below((uint32_t)span);
	}
}

static uint64_t pick_value(uint32_t world)
{
	switch (fz_below(5)) {
	case 0: return interesting64[fz_below(sizeof(interesting64) / sizeof(interesting64[0]))];
	case 1: return pick_addr(world);
	case 2: return fz_below(5000);
	case 3: return (uint64_t)fz_below(64) << fz_below(20);
	default: return rnd();
	}
}

static uint32_t pick_key(uint32_t world)
{
	switch (fz_below(4)) {
	case 0: return 0;
	case 1: return (uint32_t)rnd();
	default: return fz_key(fz_below(world + 1), (enum fz_kind)fz_below(FZ_KINDS));
	}
}

/* Offsets of the sections, the way fz_decode finds them. */
struct layout {
	uint32_t world, ncmds, npokes;
	size_t cmds, pokes, aux;
};

static struct layout layout_of(const struct fz_bytes *in)
{
	static struct fz_input dec;
	struct layout l;

	fz_decode(in->data, in->len, &dec);
	l.world = dec.world;
	l.ncmds = dec.ncmds;
	l.npokes = dec.npokes;
	l.cmds = sizeof(struct fz_header);
	l.pokes = l.cmds + l.ncmds * sizeof(struct offload_cmd);
	l.aux = l.pokes + l.npokes * sizeof(struct fz_poke);
	return l;
}

static void set_header_count(struct fz_bytes *in, size_t field, uint32_t v)
{
	in->data[field] = (uint8_t)v;
}

static void mutate_cmd(struct fz_bytes *in, const struct layout *l)
{
	struct offload_cmd c;
	size_t off;

	if (!l->ncmds)
		return;
	off = l->cmds + fz_below(l->ncmds) * sizeof(c);
	memcpy(&c, in->data + off, sizeof(c));
	switch (fz_below(12)) {
	case 0: c.opcode = (uint8_t)(fz_below(4) ? fz_below(OFFLOAD_OP_MAX + 2) : rnd()); break;
	case 1: c.flags = (uint8_t)(fz_below(2) ? 1u << fz_below(8) : rnd()); break;
	case 2: c.team = (uint16_t)(fz_below(3) ? fz_below(OFFLOAD_MAX_TEAMS + 1) : rnd()); break;
	case 3: c.src_addr = pick_value(l->world); break;
	case 4: c.dst_addr = pick_value(l->world); break;
	case 5: c.count = fz_below(3) ? pick_value(l->world) : FZ_TAG(fz_below(FZ_MAX_CMDS)); break;
	case 6: c.src_key = pick_key(l->world); break;
	case 7: c.dst_key = pick_key(l->world); break;
	case 8: c.dst_len = pick_value(l->world); break;
	case 9: c.aux_addr = fz_below(3) ? FZ_AUX_BASE + fz_below(FZ_AUX_LEN + 64) : pick_value(l->world); break;
	case 10: c.root = fz_below(2) ? fz_below(8) : (uint32_t)rnd(); break;
	default: c.count = c.count ? c.count * 2 : 1; c.dst_len = c.count * l->world; break;
	}
	memcpy(in->data + off, &c, sizeof(c));
}

static void mutate_poke(struct fz_bytes *in, const struct layout *l)
{
	struct fz_poke p;
	size_t off;

	if (!l->npokes)
		return;
	off = l->pokes + fz_below(l->npokes) * sizeof(p);
	memcpy(&p, in->data + off, sizeof(p));
	switch (fz_below(8)) {
	case 0: p.kind = (uint8_t)fz_below(FZ_POKE_KINDS); break;
	case 1: p.seq = (uint16_t)(fz_below(4) ? fz_below(12) : rnd()); break;
	case 2: p.a = pick_value(l->world); break;
	case 3: p.b = pick_value(l->world); break;
	case 4: p.c = fz_below(2) ? pick_key(l->world) : (uint32_t)rnd(); break;
	case 5: p.d = fz_below(2) ? OFFLOAD_READY_REFUSED : (uint32_t)rnd(); break;
	case 6: p.at_pass = (uint16_t)fz_below(64); break;
	default: p.src = (uint8_t)fz_below(l->world + 1); p.slot = (uint8_t)fz_below(8); break;
	}
	memcpy(in->data + off, &p, sizeof(p));
}

/* Insert n bytes at off (bounded by FZ_MAX_INPUT); returns 0 if there is no room. */
static int insert_bytes(struct fz_bytes *in, size_t off, const void *p, size_t n)
{
	if (in->len + n > FZ_MAX_INPUT)
		return 0;
	memmove(in->data + off + n, in->data + off, in->len - off);
	memcpy(in->data + off, p, n);
	in->len += n;
	return 1;
}

static void erase_bytes(struct fz_bytes *in, size_t off, size_t n)
{
	memmove(in->data + off, in->data + off + n, in->len - off - n);
	in->len -= n;
}

static void add_poke(struct fz_bytes *in, const struct layout *l)
{
	uint32_t src = fz_below(l->world), me = in->data[1] % l->world;
	struct fz_poke p = { .kind = (uint8_t)fz_below(FZ_POKE_KINDS), .team = (uint8_t)fz_below(3),
		.slot = (uint8_t)fz_below(OFFLOAD_OP_WINDOW), .src = (uint8_t)src,
		.at_pass = (uint16_t)fz_below(40), .seq = (uint16_t)(1 + fz_below(10)) };

	switch (p.kind) {
	case FZ_POKE_READY:
		p.a = fz_addr(src, FZ_DST) + me * (uint64_t)fz_below(2048);
		p.b = fz_below(2) ? fz_below(4096) : pick_value(l->world);
		p.c = fz_below(4) ? fz_key(src, FZ_DST) : pick_key(l->world);
		p.d = fz_below(8) ? 0 : OFFLOAD_READY_REFUSED;
		break;
	case FZ_POKE_COUNT:
		p.a = fz_below(4) ? fz_below(4096) : pick_value(l->world);
		break;
	case FZ_POKE_DONE:
		p.a = fz_below(4) ? OFFLOAD_SIGNAL_OK : fz_below(2) ? OFFLOAD_SIGNAL_ERROR : rnd();
		break;
	case FZ_POKE_HOST:
		p.c = fz_below(4) ? 0 : (uint32_t)rnd();
		p.a = fz_below(2) ? 1ull << fz_below(l->world) : rnd();
		break;
	case FZ_POKE_RAIL:
		p.c = fz_below(4);
		p.d = fz_below(4) == 0;
		break;
	default:
		p.a = pick_value(l->world);
		p.c = (uint32_t)rnd();
		break;
	}
	if (l->npokes < FZ_MAX_POKES && insert_bytes(in, l->aux, &p, sizeof(p)))
		set_header_count(in, offsetof(struct fz_header, npokes), l->npokes + 1);
}

static void mutate_aux(struct fz_bytes *in, const struct layout *l)
{
	static const uint32_t anchors[] = { FZ_SEED_AUX_DESC, FZ_SEED_AUX_ARGS, FZ_SEED_AUX_ARGS2,
					    FZ_SEED_AUX_ROWS, FZ_SEED_AUX_DESC2 };
	uint32_t base = anchors[fz_below(5)], off;
	uint64_t v = pick_value(l->world);

	/* Near a structure the seeds placed: a field of a descriptor or of the args. */
	off = base + (fz_below(3) ? fz_below(64) * 8 :
		      fz_below((uint32_t)offload_a2av_args_bytes(FZ_MAX_WORLD)));
	if (fz_below(3) == 0)
		v = fz_below(70);
	while (l->aux + off + 8 > in->len && in->len + 8 <= FZ_MAX_INPUT)
		in->data[in->len++] = 0;
	if (l->aux + off + 8 <= in->len)
		memcpy(in->data + l->aux + off, &v, fz_below(2) ? 8 : 4);
}

void fz_mutate(struct fz_bytes *in, const struct fz_bytes *other)
{
	uint32_t n = 1 + fz_below(6);

	if (in->len < sizeof(struct fz_header)) {  /* mutations assume a whole header */
		memset(in->data + in->len, 0, sizeof(struct fz_header) - in->len);
		in->len = sizeof(struct fz_header);
	}
	for (uint32_t k = 0; k < n; k++) {
		struct layout l = layout_of(in);
		size_t off;
		struct offload_cmd c;

		switch (fz_below(14)) {
		case 0:
			if (in->len)
				in->data[fz_below((uint32_t)in->len)] ^= (uint8_t)(1u << fz_below(8));
			break;
		case 1:
			if (in->len)
				in->data[fz_below((uint32_t)in->len)] = (uint8_t)(fz_below(2) ? rnd() : interesting64[fz_below(8)]);
			break;
		case 2: /* a header field */
			in->data[fz_below(sizeof(struct fz_header))] = (uint8_t)rnd();
			break;
		case 3: case 4: case 5:
			mutate_cmd(in, &l);
			break;
		case 6: /* duplicate a command */
			if (l.ncmds && l.ncmds < FZ_MAX_CMDS) {
				off = l.cmds + fz_below(l.ncmds) * sizeof(c);
				memcpy(&c, in->data + off, sizeof(c));
				if (insert_bytes(in, l.cmds + fz_below(l.ncmds + 1) * sizeof(c), &c, sizeof(c)))
					set_header_count(in, offsetof(struct fz_header, ncmds), l.ncmds + 1);
			}
			break;
		case 7: /* drop a command */
			if (l.ncmds) {
				erase_bytes(in, l.cmds + fz_below(l.ncmds) * sizeof(c), sizeof(c));
				set_header_count(in, offsetof(struct fz_header, ncmds), l.ncmds - 1);
			}
			break;
		case 8: /* splice: a command of another input */
			if (other && l.ncmds) {
				struct layout lo = layout_of(other);

				if (lo.ncmds) {
					memcpy(&c, other->data + lo.cmds + fz_below(lo.ncmds) * sizeof(c), sizeof(c));
					memcpy(in->data + l.cmds + fz_below(l.ncmds) * sizeof(c), &c, sizeof(c));
				}
			}
			break;
		case 9:
			add_poke(in, &l);
			break;
		case 10:
			mutate_poke(in, &l);
			break;
		case 11: case 12:
			mutate_aux(in, &l);
			break;
		default: /* truncate */
			if (in->len > 16 && !fz_below(4))
				in->len = 16 + fz_below((uint32_t)(in->len - 16));
			break;
		}
	}
}

void fz_random_input(struct fz_bytes *in)
{
	size_t ncmds = fz_below(24), npokes = fz_below(4), aux = fz_below(2) ? fz_below(4096) : 0;

	for (size_t i = 0; i < sizeof(struct fz_header); i++)
		in->data[i] = (uint8_t)rnd();
	in->data[offsetof(struct fz_header, ncmds)] = (uint8_t)ncmds;
	in->data[offsetof(struct fz_header, npokes)] = (uint8_t)npokes;
	in->len = sizeof(struct fz_header) + ncmds * 64 + npokes * 32 + aux;
	for (size_t i = sizeof(struct fz_header); i < in->len; i++)
		in->data[i] = (uint8_t)rnd();
	/* Opcodes mostly valid: otherwise almost every command is rejected at once. */
	for (size_t i = 0; i < ncmds; i++) {
		uint8_t *cmd = in->data + sizeof(struct fz_header) + i * 64;

		if (fz_below(4))
			cmd[0] = (uint8_t)fz_below(OFFLOAD_OP_MAX + 1);
		if (fz_below(2))
			cmd[2] = cmd[3] = 0;   /* team 0 */
	}
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reduction kernel: n operands to one output in the fixed order of reduce.h. A leaf
 * (no HAL calls), the same C on the DPA and in the emulator.
 *
 * Tiles of DPA_RED_TILE elements with a constant trip count: gcc -O2 vectorises those
 * loops (a runtime-trip loop it does not), and the partials of a tile stay in L1. The
 * per-element order is the same vectorised or not. Half types convert to f32 with integer
 * code (no _Float16: not portable to dpacc), operate, and round to nearest even.
 */
#include "reduce.h"

#define DPA_RED_TILE 1024u

uint32_t dpa_dtype_size(uint32_t dtype)
{
	switch (dtype) {
	case OFFLOAD_DT_F32: case OFFLOAD_DT_I32: return 4;
	case OFFLOAD_DT_F64: case OFFLOAD_DT_I64: return 8;
	case OFFLOAD_DT_F16: case OFFLOAD_DT_BF16: return 2;
	default: return 0;
	}
}

int dpa_redop_valid(uint32_t redop)
{
	uint32_t op = OFFLOAD_REDOP_OP(redop), dt = OFFLOAD_REDOP_DT(redop);

	if (redop >> 16 || !dpa_dtype_size(dt) || op < OFFLOAD_RED_SUM || op >= OFFLOAD_RED_OPS)
		return 0;
	return !(op == OFFLOAD_RED_AVG && (dt == OFFLOAD_DT_I32 || dt == OFFLOAD_DT_I64));
}

uint64_t dpa_order_block(uint64_t total, uint32_t esize, uint32_t n)
{
	uint64_t maxseg = (uint64_t)esize * ((1u << 20) / esize ? (1u << 20) / esize : 1);
	uint64_t nseg = (total + maxseg - 1) / maxseg, seg;

	if (nseg < 2ull * n)
		nseg = 2ull * n;
	nseg = (nseg + n - 1) / n * n;
	seg = (total + nseg - 1) / nseg;
	seg = (seg + esize - 1) / esize * esize;
	return nseg / n * seg;
}

/* -- half types ------------------------------------------------------------------------ */
union dpa_f32 { float f; uint32_t u; };
union dpa_f64 { double f; uint64_t u; };

static inline float bf16_to_f32(uint16_t h)
{
	union dpa_f32 v = { .u = (uint32_t)h << 16 };

	return v.f;
}

static inline uint16_t f32_to_bf16(float f)
{
	union dpa_f32 v = { .f = f };

	if ((v.u & 0x7fffffffu) > 0x7f800000u)  /* NaN: keep it a (quiet) NaN */
		return (uint16_t)((v.u >> 16) | 0x40u);
	return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
	union dpa_f32 v;

	if (exp == 0x1f) {
		v.u = sign | 0x7f800000u | (man << 13);
	} else if (exp) {
		v.u = sign | ((exp + 112u) << 23) | (man << 13);
	} else if (man) {  /* subnormal: normalise */
		uint32_t e = 113;

		while (!(man & 0x400u)) {
			man <<= 1;
			e--;
		}
		v.u = sign | (e << 23) | ((man & 0x3ffu) << 13);
	} else {
		v.u = sign;
	}
	return v.f;
}

static inline uint16_t f32_to_f16(float f)
{
	union dpa_f32 v = { .f = f };
	uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
	int32_t exp = (int32_t)(a >> 23) - 127 + 15;
	uint32_t man, half, rest;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | (a >> 13));
	if (exp >= 0x1f)
		return (uint16_t)(sign | 0x7c00u);  /* overflow (or inf) */
	if (exp <= 0) {  /* subnormal or zero in f16 */
		uint32_t shift;

		if (exp < -10)
			return (uint16_t)sign;
		man = (a & 0x7fffffu) | 0x800000u;
		shift = (uint32_t)(14 - exp);
		half = man >> shift;
		rest = man & ((1u << shift) - 1);
		if (rest > (1u << (shift - 1)) || (rest == (1u << (shift - 1)) && (half & 1u)))
			half++;
		return (uint16_t)(sign | half);
	}
	half = ((uint32_t)exp << 10) | ((a >> 13) & 0x3ffu);
	rest = a & 0x1fffu;
	if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
		half++;  /* may carry into the exponent, up to inf: right */
	return (uint16_t)(sign | half);
}

/* -- the loops ------------------------------------------------------------------------- */
#define OP_SUM(a, b) ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define OP_MIN(a, b) ((a) < (b) ? (a) : (b))

/* One (storage type, compute type, op): tiles, then the tail with the same code. */
#define DPA_RED_FN(name, T, C, LOAD, STORE, OP)                                              \
static void name(uint32_t n, uint32_t first, const uint8_t *src0, uint64_t stride, void *out,  \
		 uint64_t cnt)                                                             \
{                                                                                         \
	C acc[DPA_RED_TILE];                                                              \
	for (uint64_t base = 0; base < cnt; base += DPA_RED_TILE) {                       \
		uint64_t left = cnt - base;                                               \
		uint32_t len = left < DPA_RED_TILE ? (uint32_t)left : DPA_RED_TILE;       \
		const T *x = (const T *)(src0 + first * stride) + base;                   \
		T *o = (T *)out + base;                                                   \
		if (len == DPA_RED_TILE) {                                                \
			for (uint32_t k = 0; k < DPA_RED_TILE; k++)                       \
				acc[k] = LOAD(x[k]);                                      \
		} else {                                                                  \
			for (uint32_t k = 0; k < len; k++)                                \
				acc[k] = LOAD(x[k]);                                      \
		}                                                                         \
		for (uint32_t s = 1; s < n; s++) {                                        \
			x = (const T *)(src0 + (first + n - s) % n * stride) + base;      \
			if (len == DPA_RED_TILE) {                                        \
				for (uint32_t k = 0; k < DPA_RED_TILE; k++)               \
					acc[k] = STORE_LOAD(STORE, LOAD, OP(acc[k], LOAD(x[k]))); \
			} else {                                                          \
				for (uint32_t k = 0; k < len; k++)                        \
					acc[k] = STORE_LOAD(STORE, LOAD, OP(acc[k], LOAD(x[k]))); \
			}                                                                 \
		}                                                                         \
		for (uint32_t k = 0; k < len; k++)                                        \
			o[k] = STORE(acc[k]);                                             \
	}                                                                                 \
}

/* A partial stored in the dtype: for half types a round trip through it. */
#define STORE_LOAD(STORE, LOAD, v) LOAD(STORE(v))
#define ID(v) (v)
#define U32(v) ((uint32_t)(v))
#define U64(v) ((uint64_t)(v))
#define S32(v) ((int32_t)(v))
#define S64(v) ((int64_t)(v))

#define DPA_RED_FLOATS(op, OPM)                                                           \
	DPA_RED_FN(red_f32_##op, float, float, ID, ID, OPM)                                \
	DPA_RED_FN(red_f64_##op, double, double, ID, ID, OPM)                              \
	DPA_RED_FN(red_f16_##op, uint16_t, float, f16_to_f32, f32_to_f16, OPM)             \
	DPA_RED_FN(red_bf16_##op, uint16_t, float, bf16_to_f32, f32_to_bf16, OPM)

DPA_RED_FLOATS(sum, OP_SUM)
DPA_RED_FLOATS(prod, OP_PROD)
DPA_RED_FLOATS(max, OP_MAX)
DPA_RED_FLOATS(min, OP_MIN)
/* Integers: SUM and PROD in unsigned arithmetic (wraps, no undefined behaviour), MAX/MIN
 * signed. */
DPA_RED_FN(red_i32_sum, uint32_t, uint32_t, U32, U32, OP_SUM)
DPA_RED_FN(red_i64_sum, uint64_t, uint64_t, U64, U64, OP_SUM)
DPA_RED_FN(red_i32_prod, uint32_t, uint32_t, U32, U32, OP_PROD)
DPA_RED_FN(red_i64_prod, uint64_t, uint64_t, U64, U64, OP_PROD)
DPA_RED_FN(red_i32_max, int32_t, int32_t, S32, S32, OP_MAX)
DPA_RED_FN(red_i64_max, int64_t, int64_t, S64, S64, OP_MAX)
DPA_RED_FN(red_i32_min, int32_t, int32_t, S32, S32, OP_MIN)
DPA_RED_FN(red_i64_min, int64_t, int64_t, S64, S64, OP_MIN)

typedef void (*dpa_red_fn)(uint32_t, uint32_t, const uint8_t *, uint64_t, void *, uint64_t);

/* [op - 1][dtype - 1]; AVG runs SUM then divides. */
static const dpa_red_fn dpa_red_fns[4][6] = {
	{ red_f32_sum, red_f64_sum, red_f16_sum, red_bf16_sum, red_i32_sum, red_i64_sum },
	{ red_f32_prod, red_f64_prod, red_f16_prod, red_bf16_prod, red_i32_prod, red_i64_prod },
	{ red_f32_max, red_f64_max, red_f16_max, red_bf16_max, red_i32_max, red_i64_max },
	{ red_f32_min, red_f64_min, red_f16_min, red_bf16_min, red_i32_min, red_i64_min },
};

static void divide(uint32_t dt, uint32_t n, void *buf, uint64_t cnt)
{
	float fn = (float)n;
	double dn = (double)n;

	for (uint64_t k = 0; k < cnt; k++) {
		switch (dt) {
		case OFFLOAD_DT_F32: ((float *)buf)[k] /= fn; break;
		case OFFLOAD_DT_F64: ((double *)buf)[k] /= dn; break;
		case OFFLOAD_DT_F16:
			((uint16_t *)buf)[k] = f32_to_f16(f16_to_f32(((uint16_t *)buf)[k]) / fn);
			break;
		default:
			((uint16_t *)buf)[k] = f32_to_bf16(bf16_to_f32(((uint16_t *)buf)[k]) / fn);
			break;
		}
	}
}

void dpa_reduce(uint32_t redop, uint32_t n, uint32_t first, const void *src0, uint64_t stride,
		void *out, uint64_t count)
{
	uint32_t op = OFFLOAD_REDOP_OP(redop), dt = OFFLOAD_REDOP_DT(redop);

	if (!dpa_redop_valid(redop) || !n)
		return;
	dpa_red_fns[(op == OFFLOAD_RED_AVG ? OFFLOAD_RED_SUM : op) - 1][dt - 1](
		n, first % n, src0, stride, out, count);
	if (op == OFFLOAD_RED_AVG)
		divide(dt, n, out, count);
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tunables a C program sets: defaults, OFFLOAD_<KEY> environment variables, and
 * dpo_config_modify(). Names, defaults and ranges are offload_lib/config.py's (a test
 * checks that they agree); YAML config files stay Python's.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dpo_internal.h"

enum kind { K_U32, K_SIZE, K_POW2, K_U64, K_F64, K_THREADS, K_BACKEND, K_PLACEMENT, K_STR,
	    K_PROGRESS };

struct key {
	const char *name;
	enum kind kind;
	size_t off;
	double lo, hi;           /* inclusive; K_F64 with lo_open: lo excluded */
	int lo_open;
};

#define F(f) offsetof(struct dpo_config, f)
static const struct key keys[] = {
	{ "backend", K_BACKEND, F(backend), 0, 0, 0 },
	{ "backend_lib", K_STR, F(backend_lib), 0, 0, 0 },
	{ "dpa_threads", K_THREADS, F(dpa_threads), 1, 64, 0 },
	{ "chunk_size", K_SIZE, F(chunk_size), 4096, 64.0 * 1048576, 0 },
	{ "ring_entries", K_POW2, F(ring_entries), 8, 4096, 0 },
	{ "post_timeout", K_F64, F(post_timeout), 0, 1e300, 1 },
	{ "op_timeout", K_F64, F(op_timeout), 0, 86400, 0 },
	{ "rails", K_U32, F(rails), 1, 8, 0 },
	{ "mtu", K_POW2, F(mtu), 256, 65536, 0 },
	{ "mcast_roots", K_U32, F(mcast_roots), 1, 64, 0 },
	{ "mcast_rq_depth", K_U32, F(mcast_rq_depth), 2, 65536, 0 },
	{ "mcast_placement", K_PLACEMENT, F(mcast_staged), 0, 0, 0 },
	{ "link_rate", K_F64, F(link_rate), 0, 1e300, 1 },
	{ "mcast_loss", K_F64, F(mcast_loss), 0, 1, 0 },
	{ "mcast_reorder", K_F64, F(mcast_reorder), 0, 1, 0 },
	{ "mcast_seed", K_U64, F(mcast_seed), 0, 9223372036854775807.0, 0 },
	{ "bootstrap_timeout", K_F64, F(bootstrap_timeout), 0, 1e300, 1 },
	{ "spin_us", K_U32, F(spin_us), 0, 100000, 0 },
	{ "idle_poll_us", K_U32, F(idle_poll_us), 0, 1000000, 0 },
	{ "wire_min", K_SIZE, F(wire_min), 0, 1073741824.0, 0 },
	{ "progress", K_PROGRESS, F(coop), 0, 0, 0 },
	{ "eager_max", K_SIZE, F(eager_max), 0, 8192, 0 },
};
#undef F

void dpo_config_defaults(struct dpo_config *c)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->backend, "auto");  /* the emulator unless backend_lib names a hardware backend */
	c->chunk_size = 1u << 20;
	c->ring_entries = 256;
	c->post_timeout = 10.0;
	c->op_timeout = 300.0;
	c->rails = 1;
	c->mtu = 4096;
	c->mcast_roots = 2;
	c->mcast_rq_depth = 1024;
	c->link_rate = 10.0;
	c->mcast_seed = 1;
	c->bootstrap_timeout = 60.0;
	c->spin_us = 20;
	c->idle_poll_us = 50000;
	c->wire_min = 64 * 1024;
	c->coop = 1;
	c->eager_max = 8192;
}

static const struct key *find(const char *name)
{
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!strcmp(keys[i].name, name))
			return &keys[i];
	return NULL;
}

/* "4096", "256K", "1M", "64KiB", "1G": binary units, as config.parse_size. */
static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	if (*end) {
		char u = (char)toupper((unsigned char)*end);

		mul = u == 'K' ? 1ull << 10 : u == 'M' ? 1ull << 20 : u == 'G' ? 1ull << 30 : 0;
		if (!mul)
			return -1;
		end++;
		if (!strcasecmp(end, "iB") || !strcasecmp(end, "B"))
			end += strlen(end);
		if (*end)
			return -1;
	}
	if (v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end ? -1 : 0;
}

static dpo_status_t bad(const struct key *k, const char *value, const char *allowed)
{
	return dpo_fail(DPO_ERR_INVALID_PARAM, "config %s=%s is invalid: %s", k->name, value,
			allowed);
}

static dpo_status_t set(struct dpo_config *c, const struct key *k, const char *v)
{
	char *p = (char *)c + k->off;
	char allowed[96];
	uint64_t u;
	double d;
	char *end;

	snprintf(allowed, sizeof(allowed), "expected %.0f..%.0f", k->lo, k->hi);
	switch (k->kind) {
	case K_BACKEND:
		/* auto: the emulator unless backend_lib names a hardware backend */
		if (strcmp(v, "auto") && strcmp(v, "emulator") && strcmp(v, "flexio"))
			return bad(k, v, "expected auto, emulator or flexio");
		snprintf(c->backend, sizeof(c->backend), "%s", v);
		return DPO_OK;
	case K_PROGRESS:
		if (strcmp(v, "cooperative") && strcmp(v, "threads"))
			return bad(k, v, "expected cooperative or threads");
		c->coop = !strcmp(v, "cooperative");
		return DPO_OK;
	case K_PLACEMENT:
		if (strcmp(v, "direct") && strcmp(v, "staged"))
			return bad(k, v, "expected direct or staged");
		c->mcast_staged = !strcmp(v, "staged");
		return DPO_OK;
	case K_STR:
		if (strlen(v) >= sizeof(c->backend_lib))
			return bad(k, v, "too long");
		snprintf(c->backend_lib, sizeof(c->backend_lib), "%s", v);
		return DPO_OK;
	case K_THREADS:
		if (!strcmp(v, "auto")) {
			c->dpa_threads = 0;
			return DPO_OK;
		}
		if (parse_u64(v, &u) || u < k->lo || u > k->hi)
			return bad(k, v, "expected auto or 1..64");
		c->dpa_threads = (uint32_t)u;
		return DPO_OK;
	case K_SIZE:
		if (parse_size(v, &u) || u < k->lo || u > k->hi)
			return bad(k, v, k->hi < 65536 ? "expected 0..8K bytes" :
				   "expected 4K..64M bytes (K/M/G suffixes allowed)");
		*(uint64_t *)(void *)p = u;
		return DPO_OK;
	case K_POW2:
		if (parse_u64(v, &u) || u < k->lo || u > k->hi || (u & (u - 1)))
			return bad(k, v, "expected a power of two in range");
		*(uint32_t *)(void *)p = (uint32_t)u;
		return DPO_OK;
	case K_U32:
	case K_U64:
		if (parse_u64(v, &u) || u < k->lo || (double)u > k->hi)
			return bad(k, v, allowed);
		if (k->kind == K_U32)
			*(uint32_t *)(void *)p = (uint32_t)u;
		else
			*(uint64_t *)(void *)p = u;
		return DPO_OK;
	case K_F64:
		d = strtod(v, &end);
		if (end == v || *end || !isfinite(d) || d < k->lo || d > k->hi ||
		    (k->lo_open && d <= k->lo))
			return bad(k, v, k->lo_open ? "expected a number > 0" : allowed);
		*(double *)(void *)p = d;
		return DPO_OK;
	}
	return DPO_ERR_INTERNAL;
}

DPO_API dpo_status_t dpo_config_read(dpo_config_h *out)
{
	struct dpo_config *c;
	char env[64];

	dpo_clear_error();
	if (!out)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_config_read: config is NULL");
	c = malloc(sizeof(*c));
	if (!c)
		return dpo_fail(DPO_ERR_NO_MEMORY, "dpo_config_read: out of memory");
	dpo_config_defaults(c);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const char *v;
		size_t n = 0;

		n = (size_t)snprintf(env, sizeof(env), "OFFLOAD_");
		for (const char *s = keys[i].name; *s && n + 1 < sizeof(env); s++)
			env[n++] = (char)toupper((unsigned char)*s);
		env[n] = 0;
		v = getenv(env);
		if (v && *v && set(c, &keys[i], v) != DPO_OK) {
			dpo_fail(DPO_ERR_INVALID_PARAM, "%s=%s is invalid: %s", env, v,
				 strstr(dpo_last_error(), ": ") ? strstr(dpo_last_error(), ": ") + 2 :
				 "bad value");
			free(c);
			return DPO_ERR_INVALID_PARAM;
		}
	}
	*out = c;
	return DPO_OK;
}

DPO_API dpo_status_t dpo_config_modify(dpo_config_h c, const char *name, const char *value)
{
	const struct key *k;

	dpo_clear_error();
	if (!c || !name || !value)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_config_modify: NULL argument");
	k = find(name);
	if (!k)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "unknown config key '%s'", name);
	return set(c, k, value);
}

DPO_API dpo_status_t dpo_config_get(dpo_config_h c, const char *name, char *buf, size_t len)
{
	const struct key *k;
	const char *p;

	dpo_clear_error();
	if (!c || !name || !buf || !len)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "dpo_config_get: NULL argument");
	k = find(name);
	if (!k)
		return dpo_fail(DPO_ERR_INVALID_PARAM, "unknown config key '%s'", name);
	p = (const char *)c + k->off;
	switch (k->kind) {
	case K_BACKEND:
	case K_STR:
		snprintf(buf, len, "%s", p);
		break;
	case K_PLACEMENT:
		snprintf(buf, len, "%s", c->mcast_staged ? "staged" : "direct");
		break;
	case K_PROGRESS:
		snprintf(buf, len, "%s", c->coop ? "cooperative" : "threads");
		break;
	case K_THREADS:
		if (!c->dpa_threads)
			snprintf(buf, len, "auto");
		else
			snprintf(buf, len, "%u", c->dpa_threads);
		break;
	case K_SIZE:
	case K_U64:
		snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)(const void *)p);
		break;
	case K_POW2:
	case K_U32:
		snprintf(buf, len, "%u", *(const uint32_t *)(const void *)p);
		break;
	case K_F64:
		snprintf(buf, len, "%g", *(const double *)(const void *)p);
		break;
	}
	return DPO_OK;
}

DPO_API void dpo_config_release(dpo_config_h c)
{
	free(c);
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cost model's parameters, by name, with their defaults (BlueField-3 on a 400 Gb/s
 * fabric; docs/simulation.md gives the source or the estimate behind each), and the
 * simulator's random streams.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define P(field, def, unit) { #field, offsetof(struct sim_model, field), def, unit }

const struct sim_param sim_params[] = {
	P(link_gbps, 400, "Gb/s"),
	P(link_mtu, 4096, "B"),
	P(link_hdr_bytes, 26, "B/packet"),
	P(link_reth_bytes, 16, "B/message"),
	P(link_cable_ns, 25, "ns"),
	P(switch_latency_ns, 300, "ns"),
	P(nic_tx_ns, 300, "ns"),
	P(nic_rx_ns, 300, "ns"),
	P(nic_msg_rate_m, 215, "M msg/s"),
	P(nic_wqe_ns, 150, "ns"),
	P(nic_cqe_ns, 100, "ns"),
	P(nic_atomic_ns, 100, "ns"),
	P(nic_ack_bytes, 30, "B"),
	P(nic_sq_depth, 512, "WQEs/thread"),
	P(pcie_gbps, 448, "Gb/s"),
	P(pcie_rtt_ns, 800, "ns"),
	P(pcie_oneway_ns, 400, "ns"),
	P(dpa_pass_ns, 600, "ns"),
	P(dpa_post_ns, 250, "ns"),
	P(dpa_cqe_ns, 160, "ns"),
	P(dpa_check_ns, 100, "ns"),
	P(dpa_win_ns, 10, "ns"),
	P(dpa_ring_ns, 800, "ns"),
	P(dpa_aux_ns, 800, "ns"),
	P(dpa_mcast_chunk_ps, 320600, "ps/chunk"),
	P(dpa_wake_ns, 1000, "ns"),
	P(dpa_notify_ns, 300, "ns"),
	P(dpa_clock_ns, 20, "ns"),
	P(dpa_idle_passes, 64, "passes"),
	P(host_post_ns, 300, "ns"),
	P(host_notice_ns, 100, "ns"),
	P(mcast_rq_depth, 1024, "chunks"),
	P(mcast_event_every, 16, "chunks"),
	P(fault_retry_ns, 1000000, "ns"),
	P(fault_detect_ns, 1000000, "ns"),
	P(topo_hosts_per_leaf, 0, "ranks"),
	P(topo_uplinks, 32, "spines"),
	P(spin_react_event, 0, "bool"),
	P(jitter_ns, 0, "ns"),
};

const uint32_t sim_nparams = sizeof(sim_params) / sizeof(sim_params[0]);

_Static_assert(sizeof(sim_params) / sizeof(sim_params[0]) ==
	       sizeof(struct sim_model) / sizeof(uint64_t), "every model field has a name");

void sim_model_defaults(struct sim_model *m)
{
	for (uint32_t i = 0; i < sim_nparams; i++)
		*(uint64_t *)((char *)m + sim_params[i].offset) = sim_params[i].def;
}

int sim_model_set(struct sim_model *m, const char *name, const char *value)
{
	char *end;
	unsigned long long v;

	for (uint32_t i = 0; i < sim_nparams; i++) {
		if (strcmp(sim_params[i].name, name))
			continue;
		v = strtoull(value, &end, 0);
		if (end == value || *end)
			return -1;
		*(uint64_t *)((char *)m + sim_params[i].offset) = v;
		return 0;
	}
	return -1;
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void sim_rng_seed(struct sim_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);

	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t sim_rng_next(struct sim_rng *r)
{
	uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

uint64_t sim_rng_below(struct sim_rng *r, uint64_t bound)
{
	return (uint64_t)(((unsigned __int128)sim_rng_next(r) * bound) >> 64);
}

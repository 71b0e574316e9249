/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a simulated job costs in memory, before anything is allocated: every rank holds
 * O(W) state (the engine state and its team arena, the control region, per-peer NIC
 * tables), so a job holds O(W^2), and a job too large for the machine must be refused
 * with a reason rather than found by the OOM killer (docs/simulation.md, "Scale").
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "sim_driver.h"

/* The process itself, the event heap and the messages in flight (measured: tens of MB at
 * n=1024). */
#define SLACK (96ull << 20)

/* Real bytes of one op on one rank, as sim_op_build allocates them: src and dst with
 * real payload only (phantom buffers are addresses), the command's aux always. */
static uint64_t op_buffers(const struct sim_job *job, uint32_t opcode, uint64_t size,
			   uint32_t vmode)
{
	struct sim_opdesc op = { .opcode = opcode, .vmode = vmode, .size = size };
	struct sim_op_bytes b;
	uint64_t bytes = 0;

	sim_op_bytes(job, &op, job->n, &b);
	if (job->payload == SIM_REAL)
		bytes = sim_buf_bytes(b.src) + (b.dst_is_src ? 0 : sim_buf_bytes(b.dst));
	return bytes + (b.aux ? sim_buf_bytes(b.aux) : 0);
}

void sim_mem_need(const struct sim_job *job, const struct sim_model *model, uint32_t opcode,
		  uint64_t size, uint32_t vmode, struct sim_mem_need *out)
{
	struct dpa_engine_params p;
	uint64_t n = job->n, mapped_rank, mapped_state;

	sim_drv_params(job, model, &p);
	memset(out, 0, sizeof(*out));
	/* The state is mapped zero pages and dpa_engine_init() leaves the team arena to the
	 * teams: what gets written is the fixed part and the members of the world team (n of
	 * the arena's 2n: the state sized for a pool of n). */
	mapped_state = sim_state_bytes(&p);
	p.team_pool_ranks = job->n;
	out->state = sim_state_bytes(&p);
	/* Of the control region only the world team's block is written by peers: its entries
	 * (ready, done, counts, signals, credits) of n sources; the rest stays unbacked. */
	out->ctrl_touched = OFFLOAD_CTRL_ENTRY_BYTES * n;
	out->tables = sim_rank_tables_bytes(job->n, job->threads, job->rails, model) +
		      sim_host_bytes(job);
	out->payload = n * job->window * op_buffers(job, opcode, size, vmode);
	if (opcode == OFFLOAD_OP_ALLTOALLV && vmode == SIM_V_MOE)
		out->payload += 8 * n * n;  /* the dispatch's count table */
	out->touched = n * (out->state + out->ctrl_touched + out->tables) + out->payload + SLACK;
	mapped_rank = mapped_state + offload_ctrl_bytes(job->n) + out->tables;
	out->mapped = n * mapped_rank + out->payload + SLACK;
}

static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	unsigned long long kb = 0;

	if (!f)
		return UINT64_MAX;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return kb ? (uint64_t)kb << 10 : UINT64_MAX;
}

static double gib(uint64_t bytes)
{
	return (double)bytes / (double)(1ull << 30);
}

static double mib(uint64_t bytes)
{
	return (double)bytes / (double)(1ull << 20);
}

int sim_mem_fits(const struct sim_job *job, const struct sim_mem_need *need, char *why,
		 size_t len)
{
	uint64_t avail = mem_available();
	struct rlimit as;

	if (need->touched > avail) {
		snprintf(why, len,
			 "n=%u needs ~%.1f GiB of touched memory (a rank: engine state %.1f MiB, "
			 "control entries %.1f MiB, NIC tables and ring %.1f MiB; payload %.1f GiB), "
			 "this machine has %.1f GiB available (MemAvailable): use fewer ranks%s or a "
			 "larger machine (every rank holds O(n) state, a job O(n^2))",
			 job->n, gib(need->touched), mib(need->state), mib(need->ctrl_touched),
			 mib(need->tables), gib(need->payload), gib(avail),
			 need->payload > need->touched / 4 ? ", phantom payload," : "");
		return -1;
	}
	if (!getrlimit(RLIMIT_AS, &as) && as.rlim_cur != RLIM_INFINITY &&
	    need->mapped > (uint64_t)as.rlim_cur) {
		snprintf(why, len,
			 "n=%u maps ~%.1f GiB of address space (a rank: control region %.1f MiB, "
			 "mostly never touched; engine state %.1f MiB), RLIMIT_AS allows %.1f GiB: "
			 "raise it (ulimit -v) or use fewer ranks",
			 job->n, gib(need->mapped), mib(offload_ctrl_bytes(job->n)), mib(need->state),
			 gib((uint64_t)as.rlim_cur));
		return -1;
	}
	return 0;
}

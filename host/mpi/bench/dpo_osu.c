/* SPDX-License-Identifier: Apache-2.0 */
/*
 * osu-style benchmark of the served collectives, with and without libdpaoffload_mpi in
 * the same run: under LD_PRELOAD of the library, MPI_* goes through it and PMPI_* is
 * plain MPI, so alternating the two per iteration compares them on the same processes,
 * buffers and machine state.
 *
 *   mpicc -O2 dpo_osu.c -o dpo_osu
 *   dpa-offload mpirun -n 4 ./dpo_osu alltoall [iters] [sizes...]    (sizes: bytes per peer)
 *
 * Latency: median over iterations of the slowest rank's time (a barrier before each);
 * bandwidth: bytes this rank sends to the others / latency (size x (n-1) for all-to-all
 * and all-gather, size for broadcast and allreduce (the vector), size x n for
 * reduce_scatter_block (its input)). Reductions run MPI_SUM on MPI_FLOAT. ratio = mpi / lib latency (> 1: the library is faster).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { A2A, A2AV, BCAST, AGATHER, ALLRED, RSB, NCOLL };
static const char *const names[] = { "alltoall", "alltoallv", "bcast", "allgather", "allreduce",
				     "reduce_scatter_block" };

struct bufs {
	char *s, *r;
	int *cnt, *dsp;
	int n;
	long size;
};

static void run(enum coll c, int lib, struct bufs *b)
{
	int sz = (int)b->size;

	switch (c) {
	case A2A:
		(lib ? MPI_Alltoall : PMPI_Alltoall)(b->s, sz, MPI_BYTE, b->r, sz, MPI_BYTE,
						     MPI_COMM_WORLD);
		break;
	case A2AV:
		(lib ? MPI_Alltoallv : PMPI_Alltoallv)(b->s, b->cnt, b->dsp, MPI_BYTE, b->r, b->cnt,
						       b->dsp, MPI_BYTE, MPI_COMM_WORLD);
		break;
	case BCAST:
		(lib ? MPI_Bcast : PMPI_Bcast)(b->s, sz, MPI_BYTE, 0, MPI_COMM_WORLD);
		break;
	case AGATHER:
		(lib ? MPI_Allgather : PMPI_Allgather)(b->s, sz, MPI_BYTE, b->r, sz, MPI_BYTE,
						       MPI_COMM_WORLD);
		break;
	case ALLRED:  /* size: bytes of the vector */
		(lib ? MPI_Allreduce : PMPI_Allreduce)(b->s, b->r, sz / 4 ? sz / 4 : 1, MPI_FLOAT,
						       MPI_SUM, MPI_COMM_WORLD);
		break;
	case RSB:     /* size: bytes of each rank's block (the input is size x ranks) */
		(lib ? MPI_Reduce_scatter_block : PMPI_Reduce_scatter_block)(
			b->s, b->r, sz / 4 ? sz / 4 : 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		break;
	case NCOLL:
		break;
	}
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	static const long dflt[] = { 1024, 65536, 262144, 1048576 };
	long sizes[32];
	int nsizes = 0, iters, rank, n;
	enum coll c = A2A;
	char ver[MPI_MAX_LIBRARY_VERSION_STRING];
	int vlen;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	for (int i = 0; i < NCOLL; i++)
		if (argc > 1 && !strcmp(argv[1], names[i]))
			c = (enum coll)i;
	iters = argc > 2 ? atoi(argv[2]) : 30;
	for (int i = 3; i < argc && nsizes < 32; i++)
		sizes[nsizes++] = atol(argv[i]);
	if (!nsizes)
		for (nsizes = 0; nsizes < 4; nsizes++)
			sizes[nsizes] = dflt[nsizes];
	MPI_Get_library_version(ver, &vlen);
	if (rank == 0) {
		printf("# dpa-offload MPI benchmark: %s, %d ranks, %.*s\n", names[c], n,
		       (int)strcspn(ver, ",\n"), ver);
		printf("# same run: lib = MPI_* through libdpaoffload_mpi, mpi = PMPI_* (plain MPI), "
		       "alternating; medians of %d iterations\n", iters);
		printf("%-14s %12s %12s %14s %14s %8s\n", "# Size(B/peer)", "Lat_lib(us)",
		       "Lat_mpi(us)", "BW_lib(MB/s)", "BW_mpi(MB/s)", "ratio");
	}
	for (int si = 0; si < nsizes; si++) {
		struct bufs b = { 0 };
		double *t[2];
		long total;

		b.n = n, b.size = sizes[si];
		total = b.size * n + 64;
		b.s = malloc((size_t)total), b.r = malloc((size_t)total);
		b.cnt = malloc(sizeof(int) * n), b.dsp = malloc(sizeof(int) * n);
		for (long i = 0; i < total / 4; i++)  /* floats for the reductions */
			((float *)(void *)b.s)[i] = (float)((i + rank) % 17) * 0.25f;
		memset(b.r, 0, (size_t)total);
		for (int j = 0; j < n; j++)
			b.cnt[j] = (int)b.size, b.dsp[j] = (int)(j * b.size);
		t[0] = malloc(sizeof(double) * iters), t[1] = malloc(sizeof(double) * iters);
		for (int w = 0; w < 3; w++)  /* warm-up: team creation, registration paths */
			run(c, 1, &b), run(c, 0, &b);
		for (int it = 0; it < iters; it++)
			for (int lib = 1; lib >= 0; lib--) {
				double t0, mine;

				PMPI_Barrier(MPI_COMM_WORLD);
				t0 = MPI_Wtime();
				run(c, lib, &b);
				mine = MPI_Wtime() - t0;
				PMPI_Allreduce(&mine, &t[lib][it], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
			}
		if (rank == 0) {
			double sent = (double)b.size * (c == BCAST || c == ALLRED ? 1 : c == RSB ? n : n - 1);
			double lat[2];

			for (int k = 0; k < 2; k++) {
				qsort(t[k], (size_t)iters, sizeof(double), cmp);
				lat[k] = t[k][iters / 2];
			}
			printf("%14ld %12.2f %12.2f %14.1f %14.1f %8.2f\n", b.size, lat[1] * 1e6,
			       lat[0] * 1e6, sent / lat[1] / 1e6, sent / lat[0] / 1e6, lat[0] / lat[1]);
			fflush(stdout);
		}
		free(t[0]), free(t[1]), free(b.s), free(b.r), free(b.cnt), free(b.dsp);
	}
	MPI_Finalize();
	return 0;
}

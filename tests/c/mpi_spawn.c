/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator with members outside MPI_COMM_WORLD: the job's ranks spawn one process
 * (its own MPI_COMM_WORLD) and merge with it. An all-to-all on the merged communicator
 * must pass through to MPI (foreign_procs) with MPI's result, while the same call on the
 * parents' MPI_COMM_WORLD is still offloaded. Exit 0 pass, 1 fail.
 * Usage: mpi_spawn  (the spawned copy finds its parent and takes the child's part)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { COUNT = 4096 };  /* ints a peer: 16 KiB, above the test's threshold */

/* An all-to-all of known values on comm; 1 if every block is the one its sender sent. */
static int alltoall_ok(MPI_Comm comm)
{
	int rank, n, ok = 1, *src, *dst;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &n);
	src = malloc(sizeof(int) * COUNT * (size_t)n);
	dst = malloc(sizeof(int) * COUNT * (size_t)n);
	if (!src || !dst)
		return 0;
	for (int i = 0; i < COUNT * n; i++)
		src[i] = rank * 1000003 + i;
	MPI_Alltoall(src, COUNT, MPI_INT, dst, COUNT, MPI_INT, comm);
	for (int p = 0; p < n; p++)
		for (int i = 0; i < COUNT; i++)
			ok &= dst[p * COUNT + i] == p * 1000003 + rank * COUNT + i;
	free(src);
	free(dst);
	return ok;
}

int main(int argc, char **argv)
{
	MPI_Comm parent, inter, merged;
	int child, rank, n, ok = 1, all_ok;

	MPI_Init(&argc, &argv);
	MPI_Comm_get_parent(&parent);
	child = parent != MPI_COMM_NULL;
	if (child)
		inter = parent;
	else
		MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter,
			       MPI_ERRCODES_IGNORE);
	MPI_Intercomm_merge(inter, child, &merged);
	MPI_Comm_rank(merged, &rank);
	MPI_Comm_size(merged, &n);
	ok &= alltoall_ok(merged);
	if (!child)
		ok &= alltoall_ok(MPI_COMM_WORLD);
	MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, merged);
	if (rank == 0)
		printf("mpi_spawn: %d ranks merged with a spawned one: %s\n", n - 1,
		       all_ok ? "ok" : "WRONG");
	MPI_Comm_free(&merged);
	MPI_Comm_disconnect(&inter);
	MPI_Finalize();
	return !all_ok;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every served collective through the library (MPI_*) against MPI's own result on the
 * same inputs in the same process (PMPI_*): datatypes, sizes, communicators, blocking,
 * non-blocking (several in flight, mixed with an MPI receive in one MPI_Waitall), and
 * persistent; reductions (integers equal to MPI's, floats within a stated tolerance of
 * MPI's and bitwise the same on every rank and every repetition, as the DPA reduces in a
 * fixed order); plus calls that must pass through. Rank 0 prints the counts the library's
 * statistics must show ("expect ..." lines, same rules as the library: the pytest
 * wrapper compares them with the DPA_OFFLOAD_MPI_STATS table). Exit 0 pass, 1 fail.
 * Usage: mpi_check [--quick] [--kill RANK] [--overhead [CALLS]] [--scale]
 * (--scale: only the all-to-all forms on MPI_COMM_WORLD, for jobs of more than 64 ranks)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

enum { A2A, A2AV, BC, AG, IA2A, IA2AV, IBC, IAG, A2A_INIT, ALLRED, IALLRED, RSB, IRSB, NC };
static const char *names[NC] = { "MPI_Alltoall", "MPI_Alltoallv", "MPI_Bcast", "MPI_Allgather",
	"MPI_Ialltoall", "MPI_Ialltoallv", "MPI_Ibcast", "MPI_Iallgather", "MPI_Alltoall_init",
	"MPI_Allreduce", "MPI_Iallreduce", "MPI_Reduce_scatter_block",
	"MPI_Ireduce_scatter_block" };
static long long off[NC], pass[NC];
static long min_bytes;
static int rank, bad;

#define CHECK(c, ...) do { if (!(c)) { bad++; fprintf(stderr, "rank %d FAIL: ", rank); \
	fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

static void fill(unsigned char *p, size_t n, int salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 7 + salt * 131 + rank * 17 + 3);
}

static void expect(int c, int comm_size, long bytes)
{
	if (comm_size > 1 && (c == A2AV || c == IA2AV || bytes >= min_bytes))
		off[c]++;
	else
		pass[c]++;
}

/* one collective through the library and through PMPI; results must be identical */
static void one(int c, MPI_Comm comm, MPI_Datatype t, int count, int root)
{
	int n, me, tsize;
	MPI_Aint lb, ext;
	size_t blk, total;
	unsigned char *s, *r1, *r2;
	int *sc, *sd, *rc, *rd;
	MPI_Request req;

	MPI_Comm_size(comm, &n);
	MPI_Comm_rank(comm, &me);
	MPI_Type_size(t, &tsize);
	MPI_Type_get_extent(t, &lb, &ext);
	blk = (size_t)count * (size_t)ext;
	total = blk * (size_t)n * 2 + 64;  /* v-forms use up to 2x */
	s = malloc(total), r1 = malloc(total), r2 = malloc(total);
	sc = malloc(4 * n * sizeof(int)), sd = sc + n, rc = sd + n, rd = rc + n;
	fill(s, total, c + count);
	memset(r1, 0xee, total), memset(r2, 0xee, total);
	for (int j = 0; j < n; j++) {  /* v: rank j gets count + (me+j)%2 elements, reversed */
		sc[j] = count + (me + j) % 2;
		rc[j] = count + (me + j) % 2;
	}
	for (int j = 0, at = 0; j < n; j++)
		sd[j] = at, at += sc[j];
	for (int j = n - 1, at = 0; j >= 0; j--)
		rd[j] = at, at += rc[j];
	switch (c) {
	case A2A: case IA2A:
		if (c == A2A)
			MPI_Alltoall(s, count, t, r1, count, t, comm);
		else {
			MPI_Ialltoall(s, count, t, r1, count, t, comm, &req);
			MPI_Wait(&req, MPI_STATUS_IGNORE);
		}
		PMPI_Alltoall(s, count, t, r2, count, t, comm);
		expect(c, n, (long)count * tsize);
		break;
	case A2AV: case IA2AV:
		if (c == A2AV)
			MPI_Alltoallv(s, sc, sd, t, r1, rc, rd, t, comm);
		else {
			MPI_Ialltoallv(s, sc, sd, t, r1, rc, rd, t, comm, &req);
			MPI_Wait(&req, MPI_STATUS_IGNORE);
		}
		PMPI_Alltoallv(s, sc, sd, t, r2, rc, rd, t, comm);
		expect(c, n, 0);
		break;
	case BC: case IBC:
		memcpy(r1, s, total), memcpy(r2, s, total);
		if (me != root)
			memset(r1, 0, blk), memset(r2, 0, blk);
		if (c == BC)
			MPI_Bcast(r1, count, t, root, comm);
		else {
			MPI_Ibcast(r1, count, t, root, comm, &req);
			MPI_Wait(&req, MPI_STATUS_IGNORE);
		}
		PMPI_Bcast(r2, count, t, root, comm);
		expect(c, n, (long)count * tsize);
		break;
	case AG: case IAG:
		if (c == AG)
			MPI_Allgather(s, count, t, r1, count, t, comm);
		else {
			MPI_Iallgather(s, count, t, r1, count, t, comm, &req);
			MPI_Wait(&req, MPI_STATUS_IGNORE);
		}
		PMPI_Allgather(s, count, t, r2, count, t, comm);
		expect(c, n, (long)count * tsize);
		break;
	}
	CHECK(!memcmp(r1, r2, total), "%s count %d type size %d comm size %d: results differ",
	      names[c], count, tsize, n);
	free(s), free(r1), free(r2), free(sc);
}

/* four non-blocking collectives and an MPI receive in flight, one MPI_Waitall */
static void several(MPI_Comm comm, int count)
{
	int n, me, got = -1, sent;
	MPI_Request reqs[5];
	unsigned char *s, *r[4], *ref;

	MPI_Comm_size(comm, &n);
	MPI_Comm_rank(comm, &me);
	sent = me;
	s = malloc((size_t)count * n);
	ref = malloc((size_t)count * n);
	fill(s, (size_t)count * n, 9);
	MPI_Irecv(&got, 1, MPI_INT, (me + n - 1) % n, 77, comm, &reqs[4]);
	for (int i = 0; i < 4; i++) {
		r[i] = calloc((size_t)count * n, 1);
		MPI_Ialltoall(s, count, MPI_BYTE, r[i], count, MPI_BYTE, comm, &reqs[i]);
		expect(IA2A, n, count);
	}
	MPI_Send(&sent, 1, MPI_INT, (me + 1) % n, 77, comm);
	MPI_Waitall(5, reqs, MPI_STATUSES_IGNORE);
	PMPI_Alltoall(s, count, MPI_BYTE, ref, count, MPI_BYTE, comm);
	for (int i = 0; i < 4; i++) {
		CHECK(!memcmp(r[i], ref, (size_t)count * n), "Ialltoall %d of 4 differs", i);
		free(r[i]);
	}
	CHECK(got == (me + n - 1) % n, "the receive beside them got %d", got);
	free(s), free(ref);
}

static void persistent(MPI_Comm comm, int count)
{
	int n, flag = 0, idx;
	MPI_Request req, two[2];
	unsigned char *s, *r, *ref;

	MPI_Comm_size(comm, &n);
	s = malloc((size_t)count * n), r = malloc((size_t)count * n), ref = malloc((size_t)count * n);
	MPI_Alltoall_init(s, count, MPI_BYTE, r, count, MPI_BYTE, comm, MPI_INFO_NULL, &req);
	expect(A2A_INIT, n, count);
	for (int it = 0; it < 4; it++) {
		fill(s, (size_t)count * n, 20 + it);
		if (it < 2) {
			MPI_Start(&req);
			if (it == 0)
				MPI_Wait(&req, MPI_STATUS_IGNORE);
			else
				while (!flag)
					MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
		} else {
			two[0] = req;
			two[1] = MPI_REQUEST_NULL;
			MPI_Startall(1, two);
			if (it == 2)
				MPI_Waitany(2, two, &idx, MPI_STATUS_IGNORE);
			else
				MPI_Waitall(2, two, MPI_STATUSES_IGNORE);
			CHECK(two[0] == req, "a persistent handle changed");
		}
		PMPI_Alltoall(s, count, MPI_BYTE, ref, count, MPI_BYTE, comm);
		CHECK(!memcmp(r, ref, (size_t)count * n), "persistent round %d differs", it);
	}
	MPI_Request_free(&req);
	CHECK(req == MPI_REQUEST_NULL, "Request_free left the handle");
	free(s), free(r), free(ref);
}

/* rank 0 sends a strided vector, the others contiguous ints: the same signature */
static void asymmetric(MPI_Comm comm, int k)
{
	int n, me;
	MPI_Datatype vec;
	int *s, *r, *ref, *packed;

	MPI_Comm_size(comm, &n);
	MPI_Comm_rank(comm, &me);
	MPI_Type_vector(k, 1, 2, MPI_INT, &vec);
	MPI_Type_commit(&vec);
	s = malloc(sizeof(int) * 2 * k * n), packed = malloc(sizeof(int) * k * n);
	r = malloc(sizeof(int) * k * n), ref = malloc(sizeof(int) * k * n);
	for (int i = 0; i < 2 * k * n; i++)
		s[i] = me * 100000 + i;
	if (me == 0) {
		MPI_Datatype blk;

		MPI_Type_create_resized(vec, 0, (MPI_Aint)sizeof(int) * 2 * k, &blk);
		MPI_Type_commit(&blk);
		MPI_Alltoall(s, 1, blk, r, k, MPI_INT, comm);
		for (int i = 0; i < k * n; i++)
			packed[i] = s[2 * i];
		MPI_Type_free(&blk);
	} else {
		MPI_Alltoall(s, k, MPI_INT, r, k, MPI_INT, comm);
		memcpy(packed, s, sizeof(int) * k * n);
	}
	expect(A2A, n, (long)k * 4);
	PMPI_Alltoall(packed, k, MPI_INT, ref, k, MPI_INT, comm);
	CHECK(!memcmp(r, ref, sizeof(int) * k * n), "asymmetric datatypes differ");
	MPI_Type_free(&vec);
	free(s), free(r), free(ref), free(packed);
}

/* every rank sends a strided vector: packed by default, passed through (and counted
 * noncontig) with DPA_OFFLOAD_MPI_NONCONTIG=pass, MPI's result either way */
static void symmetric_noncontig(MPI_Comm comm, int k)
{
	const char *nc = getenv("DPA_OFFLOAD_MPI_NONCONTIG");
	MPI_Datatype vec, blk;
	int n, *s, *r, *ref;

	MPI_Comm_size(comm, &n);
	MPI_Type_vector(k, 1, 2, MPI_INT, &vec);
	MPI_Type_create_resized(vec, 0, (MPI_Aint)sizeof(int) * 2 * k, &blk);
	MPI_Type_commit(&blk);
	s = malloc(sizeof(int) * 2 * k * n), r = malloc(sizeof(int) * k * n);
	ref = malloc(sizeof(int) * k * n);
	for (int i = 0; i < 2 * k * n; i++)
		s[i] = rank * 100000 + i;
	MPI_Alltoall(s, 1, blk, r, k, MPI_INT, comm);
	PMPI_Alltoall(s, 1, blk, ref, k, MPI_INT, comm);
	if (nc && !strcmp(nc, "pass"))
		pass[A2A]++;
	else
		expect(A2A, n, (long)k * 4);
	CHECK(!memcmp(r, ref, sizeof(int) * k * n), "symmetric strided datatypes differ");
	MPI_Type_free(&vec), MPI_Type_free(&blk);
	free(s), free(r), free(ref);
}

/* ---- reductions ---------------------------------------------------------------------- */
static void put_value(void *buf, MPI_Datatype t, size_t i, MPI_Op op, int r)
{
	long v = (long)((i * 7 + (size_t)r * 13) % 97) - 48;
	int is_float = t == MPI_FLOAT || t == MPI_DOUBLE;
	double d = op == MPI_PROD ? (is_float ? 1.0 + v * 0.00137 : (double)((i + r) % 3 == 0 ? 2 :
	       (i + r) % 3 == 1 ? -1 : 1)) : is_float ? v * 0.37 + 1.0 / (r + 3) : (double)(v * 1003 + r);

	if (t == MPI_FLOAT)
		((float *)buf)[i] = (float)d;
	else if (t == MPI_DOUBLE)
		((double *)buf)[i] = d;
	else if (t == MPI_INT || t == MPI_INT32_T)
		((int32_t *)buf)[i] = (int32_t)d;
	else
		((int64_t *)buf)[i] = (int64_t)d;
}

/* ours against MPI's: integers exactly; floats within 1e-5 (float) / 1e-12 (double) of
 * the magnitude, as only the summation order differs */
static int close_enough(const void *a, const void *b, MPI_Datatype t, size_t count)
{
	if (t != MPI_FLOAT && t != MPI_DOUBLE) {
		int sz;

		MPI_Type_size(t, &sz);
		return !memcmp(a, b, count * (size_t)sz);
	}
	for (size_t i = 0; i < count; i++) {
		double x = t == MPI_FLOAT ? ((const float *)a)[i] : ((const double *)a)[i];
		double y = t == MPI_FLOAT ? ((const float *)b)[i] : ((const double *)b)[i];
		double tol = (t == MPI_FLOAT ? 1e-5 : 1e-12) * (1.0 + (y < 0 ? -y : y));

		if (!(x - y <= tol && y - x <= tol))
			return 0;
	}
	return 1;
}

/* every rank's result bitwise equal to rank 0's */
static int same_everywhere(const void *buf, size_t bytes, MPI_Comm comm)
{
	unsigned char *r0 = malloc(bytes + 1);
	int same, all;

	memcpy(r0, buf, bytes);
	PMPI_Bcast(r0, (int)bytes, MPI_BYTE, 0, comm);
	same = !memcmp(r0, buf, bytes);
	PMPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, comm);
	free(r0);
	return all;
}

static void reduce_one(int c, MPI_Comm comm, MPI_Datatype t, MPI_Op op, int count, int in_place)
{
	int n, me, sz;
	size_t total, bytes;
	unsigned char *s, *r1, *r2, *r3;
	MPI_Request req;

	MPI_Comm_size(comm, &n);
	MPI_Comm_rank(comm, &me);
	MPI_Type_size(t, &sz);
	total = (size_t)count * (c == RSB || c == IRSB ? (size_t)n : 1);
	bytes = (size_t)count * (size_t)sz;
	s = malloc(total * sz + 8), r1 = malloc(total * sz + 8), r2 = malloc(total * sz + 8);
	r3 = malloc(total * sz + 8);
	for (size_t i = 0; i < total; i++)
		put_value(s, t, i, op, me);
	for (int rep = 0; rep < 2; rep++) {
		unsigned char *out = rep ? r3 : r1;

		if (in_place)
			memcpy(out, s, total * sz);
		if (c == ALLRED)
			MPI_Allreduce(in_place ? MPI_IN_PLACE : s, out, count, t, op, comm);
		else if (c == IALLRED)
			MPI_Iallreduce(in_place ? MPI_IN_PLACE : s, out, count, t, op, comm, &req),
			MPI_Wait(&req, MPI_STATUS_IGNORE);
		else if (c == RSB)
			MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : s, out, count, t, op, comm);
		else
			MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : s, out, count, t, op, comm,
						  &req), MPI_Wait(&req, MPI_STATUS_IGNORE);
		/* in-place reduce-scatter-block passes through (the DPA leaves the block at
		 * this rank's place) */
		expect(c, n, in_place && (c == RSB || c == IRSB) ? -1 : (long)(total * sz));
	}
	if (c == ALLRED || c == IALLRED)
		PMPI_Allreduce(s, r2, count, t, op, comm);
	else
		PMPI_Reduce_scatter_block(s, r2, count, t, op, comm);
	CHECK(close_enough(r1, r2, t, (size_t)count), "%s count %d type size %d%s differs from MPI's",
	      names[c], count, sz, in_place ? " in place" : "");
	CHECK(!memcmp(r1, r3, bytes), "%s count %d not bitwise repeatable", names[c], count);
	CHECK(same_everywhere(r1, bytes, comm) || c == RSB || c == IRSB,
	      "%s count %d differs between ranks", names[c], count);
	free(s), free(r1), free(r2), free(r3);
}

static void reductions(MPI_Comm comm, int quick)
{
	const MPI_Datatype types[] = { MPI_FLOAT, MPI_DOUBLE, MPI_INT, MPI_INT32_T, MPI_INT64_T,
				       MPI_LONG };
	const MPI_Op ops[] = { MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN };
	const int counts[] = { 1, 3000, 70001 };

	for (int ti = 0; ti < 6; ti++)
		for (int oi = 0; oi < 4; oi++)
			for (int ci = 0; ci < 3; ci++) {
				if ((quick && ci == 2) || (oi && ci != 1))
					continue;
				for (int c = ALLRED; c <= IRSB; c++)
					reduce_one(c, comm, types[ti], ops[oi], counts[ci],
						   (ti + ci + c) % 3 == 0);
			}
}

static void user_sum(void *in, void *inout, int *len, MPI_Datatype *t)
{
	(void)t;
	for (int i = 0; i < *len; i++)
		((int *)inout)[i] += ((int *)in)[i];
}

/* reductions the DPA does not run pass through, counted with their reason */
static void reductions_passed(MPI_Comm comm)
{
	int n, s[4096], r[4096];
	short hs[4096], hr[4096];
	MPI_Op mine;

	MPI_Comm_size(comm, &n);
	for (int i = 0; i < 4096; i++)
		s[i] = i + rank, hs[i] = (short)(i % 100);
	MPI_Op_create(user_sum, 1, &mine);
	MPI_Allreduce(s, r, 4096, MPI_INT, mine, comm);  /* op */
	pass[ALLRED]++;
	CHECK(r[5] == n * 5 + n * (n - 1) / 2, "user op allreduce %d", r[5]);
	MPI_Allreduce(s, r, 4096, MPI_INT, MPI_LAND, comm);  /* op */
	pass[ALLRED]++;
	MPI_Allreduce(hs, hr, 4096, MPI_SHORT, MPI_SUM, comm);  /* datatype */
	pass[ALLRED]++;
	CHECK(hr[7] == 7 * n, "short allreduce %d", hr[7]);
	MPI_Op_free(&mine);
}

static void pass_through(MPI_Comm world, MPI_Comm half, int half_color)
{
	int n, x = rank + 1, sum = 0, *buf;
	MPI_Comm inter;

	MPI_Comm_size(world, &n);
	buf = malloc(sizeof(int) * n * 4096);
	for (int i = 0; i < n * 4096; i++)
		buf[i] = rank;
	MPI_Alltoall(MPI_IN_PLACE, 0, MPI_INT, buf, 4096, MPI_INT, world);  /* in_place */
	pass[A2A]++;
	for (int j = 0; j < n; j++)
		CHECK(buf[j * 4096] == j, "in-place alltoall got %d from %d", buf[j * 4096], j);
	MPI_Allreduce(&x, &sum, 1, MPI_INT, MPI_SUM, world);
	pass[ALLRED]++;
	CHECK(sum == n * (n + 1) / 2, "allreduce %d", sum);
	if (n >= 2) {  /* the two halves as an intercommunicator */
		MPI_Intercomm_create(half, 0, world, half_color ? 0 : 1, 5, &inter);
		MPI_Bcast(buf, 0, MPI_INT, MPI_PROC_NULL, inter);
		pass[BC]++;
		MPI_Comm_free(&inter);
	}
	free(buf);
}

static void matrix(MPI_Comm comm, int quick, unsigned seed)
{
	MPI_Datatype c3;
	const MPI_Datatype types[] = { MPI_BYTE, MPI_INT, MPI_FLOAT, MPI_DOUBLE, MPI_DATATYPE_NULL };
	int sizes[] = { 0, 1, 7, 4096, 1 << 20, 0 };
	int n;

	MPI_Comm_size(comm, &n);
	MPI_Type_contiguous(3, MPI_DOUBLE, &c3);
	MPI_Type_commit(&c3);
	sizes[5] = (int)(seed % 200000) + 1;
	for (int ti = 0; ti < 5; ti++) {
		MPI_Datatype t = types[ti] == MPI_DATATYPE_NULL ? c3 : types[ti];
		int tsize;

		MPI_Type_size(t, &tsize);
		for (int si = 0; si < 6; si++) {
			int count = si == 4 ? (1 << 20) / tsize : si == 5 ? sizes[5] / tsize + 1 : sizes[si];

			if (quick && si > 3)
				continue;
			for (int c = A2A; c <= IAG; c++)
				one(c, comm, t, count, (c + si) % n);
		}
	}
	MPI_Type_free(&c3);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* pass-through cost: the library's MPI_Allreduce against PMPI_Allreduce, alternating,
 * best of 20 batches of `calls` each */
static void overhead(MPI_Comm comm, const char *name, int calls)
{
	double best_lib = 1e9, best_mpi = 1e9, lib_max, mpi_max;
	int x = 1, y;

	for (int b = 0; b < 20; b++) {
		double t0 = now();

		for (int i = 0; i < calls; i++)
			PMPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, comm);
		double t1 = now();
		for (int i = 0; i < calls; i++)
			MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, comm);
		double t2 = now();
		if ((t1 - t0) / calls < best_mpi)
			best_mpi = (t1 - t0) / calls;
		if ((t2 - t1) / calls < best_lib)
			best_lib = (t2 - t1) / calls;
	}
	PMPI_Allreduce(&best_lib, &lib_max, 1, MPI_DOUBLE, MPI_MAX, comm);
	PMPI_Allreduce(&best_mpi, &mpi_max, 1, MPI_DOUBLE, MPI_MAX, comm);
	if (rank == 0)
		printf("overhead %s allreduce(1 int): lib %.3f us mpi %.3f us added %.3f us\n", name,
		       lib_max * 1e6, mpi_max * 1e6, (lib_max - mpi_max) * 1e6);
}

int main(int argc, char **argv)
{
	int quick = 0, kill_rank = -1, overhead_calls = 0, scale = 0, n, provided;
	unsigned seed;
	MPI_Comm half, dup;
	const char *mb = getenv("DPA_OFFLOAD_MPI_MIN_BYTES");

	for (int i = 1; i < argc; i++) {
		quick |= !strcmp(argv[i], "--quick");
		scale |= !strcmp(argv[i], "--scale");
		if (!strcmp(argv[i], "--overhead"))  /* the benchmark's default: 20000 per batch */
			overhead_calls = i + 1 < argc && atoi(argv[i + 1]) > 0 ? atoi(argv[++i]) : 20000;
		if (!strcmp(argv[i], "--kill") && i + 1 < argc)
			kill_rank = atoi(argv[++i]);
	}
	min_bytes = mb ? atol(mb) : 256 * 1024;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	if (overhead_calls) {
		overhead(MPI_COMM_SELF, "self", overhead_calls);
		overhead(MPI_COMM_WORLD, "world", overhead_calls);
		MPI_Finalize();
		return 0;
	}
	if (kill_rank >= 0) {  /* offloaded 1 MiB all-to-alls; one rank dies in the middle */
		unsigned char *s = calloc((size_t)n, 1 << 20), *r = calloc((size_t)n, 1 << 20);

		for (int it = 0; it < 200; it++) {
			if (it == 20 && rank == kill_rank)
				raise(SIGKILL);
			MPI_Alltoall(s, 1 << 20, MPI_BYTE, r, 1 << 20, MPI_BYTE, MPI_COMM_WORLD);
		}
		MPI_Finalize();
		return 0;
	}
	seed = (unsigned)time(NULL);
	const char *se = getenv("OFFLOAD_TEST_SEED");
	if (se)
		seed = (unsigned)atoi(se);
	PMPI_Bcast(&seed, 1, MPI_UNSIGNED, 0, MPI_COMM_WORLD);
	if (rank == 0)
		printf("seed %u\n", seed);
	if (scale) {  /* a communicator of every rank, past the 64 the library once stopped at */
		static const int forms[] = { A2A, A2AV, IA2A, IA2AV };

		for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++)
			one(forms[i], MPI_COMM_WORLD, MPI_BYTE, (int)(min_bytes > 1 ? min_bytes : 1), 0);
		goto report;
	}
	MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
	matrix(MPI_COMM_WORLD, quick, seed);
	matrix(half, 1, seed);
	for (int i = 0; i < 3; i++) {  /* dup, use, free: the team slot comes back */
		MPI_Comm_dup(MPI_COMM_WORLD, &dup);
		matrix(dup, 1, seed);
		MPI_Comm_free(&dup);
	}
	several(MPI_COMM_WORLD, 65536);
	persistent(MPI_COMM_WORLD, 65536);
	if (!getenv("DPA_OFFLOAD_MPI_NONCONTIG"))  /* pass would split this one's ranks */
		asymmetric(MPI_COMM_WORLD, 4096);
	symmetric_noncontig(MPI_COMM_WORLD, 4096);
	reductions(MPI_COMM_WORLD, quick);
	reductions(half, 1);
	reductions_passed(MPI_COMM_WORLD);
	pass_through(MPI_COMM_WORLD, half, rank % 2);
	MPI_Comm_free(&half);
report:
	{
		long long so[NC], sp[NC];
		int allbad;

		PMPI_Reduce(off, so, NC, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
		PMPI_Reduce(pass, sp, NC, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
		PMPI_Allreduce(&bad, &allbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		if (rank == 0) {
			for (int c = 0; c < NC; c++)
				printf("expect %s offloaded=%lld passed=%lld\n", names[c], so[c], sp[c]);
			printf("mpi_check: %s (%d failures)\n", allbad ? "FAIL" : "ok", allbad);
		}
		bad = allbad;
	}
	MPI_Finalize();
	return bad ? 1 : 0;
}

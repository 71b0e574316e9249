/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The served collectives: decide (consistently, see dpo_mpi.h), then describe the op in
 * bytes to the C API. A datatype whose bytes are not one contiguous run in type-map
 * order is packed into a bounce buffer (and unpacked after), so the rank still runs the
 * same team op as every other.
 */
#include <stdlib.h>
#include <string.h>

#include "dpo_mpi.h"

/* Is the type's data one contiguous run of its size, in type-map order, starting at the
 * buffer? An envelope walk: named types are; derived ones only through combiners that
 * keep order (dup, contiguous, resized, vectors without gaps). */
int dpo_mpi_contig(MPI_Datatype t)
{
	int ni, na, nd, comb, ok = 0, size;
	MPI_Aint lb, extent, tlb, textent;
	int ints[4];
	MPI_Aint addrs[2];
	MPI_Datatype inner = MPI_DATATYPE_NULL;

	PMPI_Type_get_envelope(t, &ni, &na, &nd, &comb);
	if (comb == MPI_COMBINER_NAMED)
		return 1;
	PMPI_Type_size(t, &size);
	PMPI_Type_get_extent(t, &lb, &extent);
	PMPI_Type_get_true_extent(t, &tlb, &textent);
	if (lb || tlb || extent != size || textent != size)
		return 0;
	if (ni > 4 || na > 2 || nd != 1)
		return 0;
	PMPI_Type_get_contents(t, ni, na, nd, ints, addrs, &inner);
	switch (comb) {
	case MPI_COMBINER_DUP:
	case MPI_COMBINER_CONTIGUOUS:
	case MPI_COMBINER_RESIZED:
		ok = dpo_mpi_contig(inner);
		break;
	case MPI_COMBINER_VECTOR:
		ok = (ints[0] <= 1 || ints[2] == ints[1]) && dpo_mpi_contig(inner);
		break;
	case MPI_COMBINER_HVECTOR: {
		int isz;

		PMPI_Type_size(inner, &isz);
		ok = (ints[0] <= 1 || addrs[0] == (MPI_Aint)ints[1] * isz) && dpo_mpi_contig(inner);
		break;
	}
	default:
		ok = 0;
	}
	{
		int i2, a2, d2, c2;

		PMPI_Type_get_envelope(inner, &i2, &a2, &d2, &c2);
		if (c2 != MPI_COMBINER_NAMED)
			PMPI_Type_free(&inner);
	}
	return ok;
}

/* The checks every served call makes first; R_OFFLOADED if it may go to the DPA. */
enum dpo_mpi_reason dpo_mpi_gate(enum dpo_mpi_coll c, MPI_Comm comm, struct comm_state **out)
{
	struct comm_state *cs;

	if (!dpo_mpi.colls_enabled[c])
		return R_DISABLED;
	if (!dpo_mpi.enabled)
		return R_NO_CONTEXT;
	if (comm == MPI_COMM_NULL)
		return R_BAD_ARGS;
	cs = dpo_mpi_state(comm);
	if (!cs)
		return R_NO_CONTEXT;
	*out = cs;
	return cs->reason;
}

struct mpi_op *dpo_mpi_admit(enum dpo_mpi_coll c, struct comm_state *cs, uint64_t bytes,
			     uint64_t min_bytes, enum dpo_mpi_reason *why)
{
	struct mpi_op *op;

	if (bytes < min_bytes) {
		*why = R_BELOW_THRESHOLD;
		return NULL;
	}
	if (!dpo_mpi_ensure_team(cs)) {
		*why = cs->reason;  /* its verdict for every member: no_team, or foreign_procs */
		return NULL;
	}
	op = dpo_mpi_op_new(c, cs);
	if (!op)
		*why = R_BAD_ARGS;
	return op;
}

static void *pack_buffer(int bytes)
{
	return malloc(bytes ? (size_t)bytes : 1);
}

/* One side of a non-v collective: the bytes as they are, or packed (src) / a bounce to
 * unpack (dst). */
static int side(struct mpi_op *op, int is_src, const void *buf, int count, MPI_Datatype t,
		void **bytes_at, int *packed)
{
	int bytes;

	if (dpo_mpi_contig(t)) {
		*bytes_at = (void *)buf;
		return 0;
	}
	PMPI_Pack_size(count, t, MPI_COMM_SELF, &bytes);
	*packed = 1;
	if (is_src) {
		op->pack_src = pack_buffer(bytes);
		op->user_sbuf = buf, op->scount_total = count, op->stype = t;
		op->pack_bytes_src = bytes;
		*bytes_at = op->pack_src;
	} else {
		op->pack_dst = pack_buffer(bytes);
		op->user_rbuf = (void *)buf, op->rcount_total = count, op->rtype = t;
		op->pack_bytes_dst = bytes;
		*bytes_at = op->pack_dst;
	}
	return *bytes_at ? 0 : -1;
}

/* Build the op; NULL means: pass this call through (reason in *why). */
struct mpi_op *dpo_mpi_build(enum dpo_mpi_coll c, struct comm_state *cs, dpo_coll_args_t *a,
			    int persistent, int packed, enum dpo_mpi_reason *why, struct mpi_op *op)
{
	dpo_status_t st;

	if (packed && dpo_mpi.noncontig_pass) {
		*why = R_NONCONTIG;
		dpo_mpi_op_free(op);
		return NULL;
	}
	if (persistent) {
		a->mask |= DPO_COLL_ARGS_FIELD_FLAGS;
		a->flags |= DPO_COLL_ARGS_FLAG_PERSISTENT;
	}
	dpo_mpi_lock();
	st = dpo_collective_init(a, &op->req, cs->team);
	dpo_mpi_unlock();
	if (st) {
		/* MPI's rules make these agree on every rank; let MPI report its own error */
		*why = R_BAD_ARGS;
		dpo_mpi_op_free(op);
		return NULL;
	}
	dpo_mpi_count(c, R_OFFLOADED);
	if (packed)
		dpo_mpi_count(c, R_PACKED);
	return op;
}

static struct mpi_op *alltoall_op(enum dpo_mpi_coll c, const void *sbuf, int scount,
				  MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype,
				  MPI_Comm comm, int persistent, enum dpo_mpi_reason *why)
{
	struct comm_state *cs = NULL;
	int n, ssize, rsize, packed = 0;
	dpo_coll_args_t a;
	struct mpi_op *op;
	void *s, *d;

	if ((*why = dpo_mpi_gate(c, comm, &cs)))
		return NULL;
	if (sbuf == MPI_IN_PLACE) {
		*why = R_IN_PLACE;
		return NULL;
	}
	PMPI_Comm_size(comm, &n);
	if (rcount < 0 || scount < 0 || PMPI_Type_size(rtype, &rsize) != MPI_SUCCESS ||
	    PMPI_Type_size(stype, &ssize) != MPI_SUCCESS ||
	    (int64_t)scount * ssize != (int64_t)rcount * rsize) {
		*why = R_BAD_ARGS;
		return NULL;
	}
	op = dpo_mpi_admit(c, cs, (uint64_t)rcount * (uint64_t)rsize, dpo_mpi.min_alltoall, why);
	if (!op)
		return NULL;
	if (side(op, 1, sbuf, scount * n, stype, &s, &packed) ||
	    side(op, 0, rbuf, rcount * n, rtype, &d, &packed)) {
		dpo_mpi_op_free(op);
		*why = R_BAD_ARGS;
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_ALLTOALL;
	a.src.info = (dpo_coll_buffer_info_t){ s, (uint64_t)rcount * (uint64_t)rsize * n, DPO_DT_BYTE };
	a.dst.info = (dpo_coll_buffer_info_t){ d, (uint64_t)rcount * (uint64_t)rsize * n, DPO_DT_BYTE };
	return dpo_mpi_build(c, cs, &a, persistent, packed, why, op);
}

/* v-forms: blocks at element displacements; contiguous types map to byte counts and
 * displacements, others are packed block by block into a packed buffer. */
static int v_side(struct mpi_op *op, int is_src, const void *buf, const int *counts,
		  const int *displs, MPI_Datatype t, int n, uint64_t *bc, uint64_t *bd, void **at,
		  int *packed)
{
	MPI_Aint lb, extent;
	int tsize, total = 0;
	int *cc, *dd;

	PMPI_Type_size(t, &tsize);
	PMPI_Type_get_extent(t, &lb, &extent);
	for (int i = 0; i < n; i++)
		if (counts[i] < 0)
			return -1;
	if (dpo_mpi_contig(t)) {
		for (int i = 0; i < n; i++) {
			bc[i] = (uint64_t)counts[i] * (uint64_t)tsize;
			bd[i] = (uint64_t)(int64_t)displs[i] * (uint64_t)extent;
			if (displs[i] < 0)
				return -1;
		}
		*at = (void *)buf;
		return 0;
	}
	*packed = 1;
	cc = malloc(sizeof(int) * (size_t)n);
	dd = malloc(sizeof(int) * (size_t)n);
	if (!cc || !dd) {
		free(cc), free(dd);
		return -1;
	}
	for (int i = 0; i < n; i++) {
		int b;

		PMPI_Pack_size(counts[i], t, MPI_COMM_SELF, &b);
		bc[i] = (uint64_t)counts[i] * (uint64_t)tsize;
		bd[i] = (uint64_t)total;
		cc[i] = counts[i];
		dd[i] = displs[i];
		total += b;
	}
	op->nblocks = n;
	if (is_src) {
		op->vcounts_s = cc, op->vdispls_s = dd, op->stype = t, op->sextent = extent;
		op->user_sbuf = buf;
		op->pack_src = pack_buffer(total);
		op->pack_bytes_src = total;
		*at = op->pack_src;
	} else {
		op->vcounts_r = cc, op->vdispls_r = dd, op->rtype = t, op->rextent = extent;
		op->user_rbuf = (void *)buf;
		op->pack_dst = pack_buffer(total);
		op->pack_bytes_dst = total;
		*at = op->pack_dst;
	}
	return *at ? 0 : -1;
}

static struct mpi_op *alltoallv_op(enum dpo_mpi_coll c, const void *sbuf, const int *scounts,
				   const int *sdispls, MPI_Datatype stype, void *rbuf,
				   const int *rcounts, const int *rdispls, MPI_Datatype rtype,
				   MPI_Comm comm, enum dpo_mpi_reason *why)
{
	struct comm_state *cs = NULL;
	uint64_t small[4 * 64], *sc, *sd, *rc, *rd;
	int n, packed = 0;
	dpo_coll_args_t a;
	struct mpi_op *op;
	void *s, *d;

	if ((*why = dpo_mpi_gate(c, comm, &cs)))
		return NULL;
	if (sbuf == MPI_IN_PLACE) {
		*why = R_IN_PLACE;
		return NULL;
	}
	PMPI_Comm_size(comm, &n);
	/* no byte threshold: the v-forms have no size that every rank shares */
	op = dpo_mpi_admit(c, cs, 0, 0, why);
	if (!op)
		return NULL;
	/* Byte counts and displacements, one of each per member each way; the op copies them
	 * (dpo_collective_init), so they live only through the build: on the stack up to 64
	 * members, allocated past that. */
	sc = n <= 64 ? small : malloc(4 * sizeof(uint64_t) * (size_t)n);
	if (!sc) {
		dpo_mpi_op_free(op);
		*why = R_BAD_ARGS;  /* out of memory, counted as dpo_mpi_op_new's: MPI runs it */
		return NULL;
	}
	sd = sc + n;
	rc = sd + n;
	rd = rc + n;
	if (v_side(op, 1, sbuf, scounts, sdispls, stype, n, sc, sd, &s, &packed) ||
	    v_side(op, 0, rbuf, rcounts, rdispls, rtype, n, rc, rd, &d, &packed)) {
		if (sc != small)
			free(sc);
		dpo_mpi_op_free(op);
		*why = R_BAD_ARGS;
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_ALLTOALLV;
	a.src.info_v = (dpo_coll_buffer_info_v_t){ s, sc, sd, DPO_DT_BYTE };
	a.dst.info_v = (dpo_coll_buffer_info_v_t){ d, rc, rd, DPO_DT_BYTE };
	op = dpo_mpi_build(c, cs, &a, 0, packed, why, op);
	if (sc != small)
		free(sc);
	return op;
}

static struct mpi_op *bcast_op(enum dpo_mpi_coll c, void *buf, int count, MPI_Datatype t,
			       int root, MPI_Comm comm, enum dpo_mpi_reason *why)
{
	struct comm_state *cs = NULL;
	int n, me, tsize, packed = 0;
	dpo_coll_args_t a;
	struct mpi_op *op;
	void *b;

	if ((*why = dpo_mpi_gate(c, comm, &cs)))
		return NULL;
	PMPI_Comm_size(comm, &n);
	PMPI_Comm_rank(comm, &me);
	if (count < 0 || root < 0 || root >= n || PMPI_Type_size(t, &tsize) != MPI_SUCCESS) {
		*why = R_BAD_ARGS;
		return NULL;
	}
	op = dpo_mpi_admit(c, cs, (uint64_t)count * (uint64_t)tsize, dpo_mpi.min_bcast, why);
	if (!op)
		return NULL;
	if (side(op, 0, buf, count, t, &b, &packed)) {
		dpo_mpi_op_free(op);
		*why = R_BAD_ARGS;
		return NULL;
	}
	if (packed) {
		/* the root packs its data into the bounce (and need not unpack it) */
		op->pack_src = NULL;
		op->user_sbuf = me == root ? buf : NULL;
		op->stype = t, op->scount_total = count;
		op->unpack_skip = me == root;
	}
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_BCAST;
	a.root = (uint64_t)root;
	a.src.info = (dpo_coll_buffer_info_t){ b, (uint64_t)count * (uint64_t)tsize, DPO_DT_BYTE };
	return dpo_mpi_build(c, cs, &a, 0, packed, why, op);
}

static struct mpi_op *allgather_op(enum dpo_mpi_coll c, const void *sbuf, int scount,
				   MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype,
				   MPI_Comm comm, enum dpo_mpi_reason *why)
{
	struct comm_state *cs = NULL;
	int n, me, rsize, ssize, packed = 0;
	MPI_Aint lb, rextent;
	dpo_coll_args_t a;
	struct mpi_op *op;
	void *s = NULL, *d;
	uint64_t block;

	if ((*why = dpo_mpi_gate(c, comm, &cs)))
		return NULL;
	PMPI_Comm_size(comm, &n);
	PMPI_Comm_rank(comm, &me);
	if (rcount < 0 || PMPI_Type_size(rtype, &rsize) != MPI_SUCCESS) {
		*why = R_BAD_ARGS;
		return NULL;
	}
	block = (uint64_t)rcount * (uint64_t)rsize;
	if (sbuf != MPI_IN_PLACE && (scount < 0 || PMPI_Type_size(stype, &ssize) != MPI_SUCCESS ||
				     (uint64_t)scount * (uint64_t)ssize != block)) {
		*why = R_BAD_ARGS;
		return NULL;
	}
	op = dpo_mpi_admit(c, cs, block, dpo_mpi.min_allgather, why);
	if (!op)
		return NULL;
	PMPI_Type_get_extent(rtype, &lb, &rextent);
	if (side(op, 0, rbuf, rcount * n, rtype, &d, &packed)) {
		dpo_mpi_op_free(op);
		*why = R_BAD_ARGS;
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.coll_type = DPO_COLL_TYPE_ALLGATHER;
	a.dst.info = (dpo_coll_buffer_info_t){ d, block * (uint64_t)n, DPO_DT_BYTE };
	if (sbuf == MPI_IN_PLACE && !packed) {
		a.mask = DPO_COLL_ARGS_FIELD_FLAGS;
		a.flags = DPO_COLL_ARGS_FLAG_IN_PLACE;
	} else {
		/* in place with a packed dst: our own block is packed from rbuf as the source */
		const void *from = sbuf == MPI_IN_PLACE ? (char *)rbuf + (MPI_Aint)me * rcount * rextent :
				   sbuf;
		int cnt = sbuf == MPI_IN_PLACE ? rcount : scount;
		MPI_Datatype t = sbuf == MPI_IN_PLACE ? rtype : stype;

		if (side(op, 1, from, cnt, t, &s, &packed)) {
			dpo_mpi_op_free(op);
			*why = R_BAD_ARGS;
			return NULL;
		}
		a.src.info = (dpo_coll_buffer_info_t){ s, block, DPO_DT_BYTE };
	}
	return dpo_mpi_build(c, cs, &a, 0, packed, why, op);
}

/* ---- the entry points ---------------------------------------------------------------- */
int dpo_mpi_run_blocking(struct mpi_op *op)
{
	int rc = dpo_mpi_op_start(op);

	if (rc == MPI_SUCCESS)
		rc = dpo_mpi_op_wait(op);
	dpo_mpi_op_free(op);
	return rc;
}

DPO_MPI_API int MPI_Alltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
			     int rcount, MPI_Datatype rtype, MPI_Comm comm)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = alltoall_op(C_ALLTOALL, sbuf, scount, stype, rbuf, rcount, rtype,
					comm, 0, &why);

	if (op)
		return dpo_mpi_run_blocking(op);
	dpo_mpi_count(C_ALLTOALL, why);
	return PMPI_Alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm);
}

DPO_MPI_API int MPI_Alltoallv(const void *sbuf, const int *scounts, const int *sdispls,
			      MPI_Datatype stype, void *rbuf, const int *rcounts,
			      const int *rdispls, MPI_Datatype rtype, MPI_Comm comm)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = alltoallv_op(C_ALLTOALLV, sbuf, scounts, sdispls, stype, rbuf,
					 rcounts, rdispls, rtype, comm, &why);

	if (op)
		return dpo_mpi_run_blocking(op);
	dpo_mpi_count(C_ALLTOALLV, why);
	return PMPI_Alltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm);
}

DPO_MPI_API int MPI_Bcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm comm)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = bcast_op(C_BCAST, buf, count, t, root, comm, &why);

	if (op)
		return dpo_mpi_run_blocking(op);
	dpo_mpi_count(C_BCAST, why);
	return PMPI_Bcast(buf, count, t, root, comm);
}

DPO_MPI_API int MPI_Allgather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
			      int rcount, MPI_Datatype rtype, MPI_Comm comm)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = allgather_op(C_ALLGATHER, sbuf, scount, stype, rbuf, rcount, rtype,
					 comm, &why);

	if (op)
		return dpo_mpi_run_blocking(op);
	dpo_mpi_count(C_ALLGATHER, why);
	return PMPI_Allgather(sbuf, scount, stype, rbuf, rcount, rtype, comm);
}

int dpo_mpi_start_nonblocking(struct mpi_op *op, MPI_Request *req)
{
	int rc = dpo_mpi_op_start(op);

	if (rc != MPI_SUCCESS) {
		dpo_mpi_op_free(op);
		return rc;
	}
	return dpo_mpi_op_grequest(op, req);
}

DPO_MPI_API int MPI_Ialltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
			      int rcount, MPI_Datatype rtype, MPI_Comm comm, MPI_Request *req)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = alltoall_op(C_IALLTOALL, sbuf, scount, stype, rbuf, rcount, rtype,
					comm, 0, &why);

	if (op)
		return dpo_mpi_start_nonblocking(op, req);
	dpo_mpi_count(C_IALLTOALL, why);
	return PMPI_Ialltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, req);
}

DPO_MPI_API int MPI_Ialltoallv(const void *sbuf, const int *scounts, const int *sdispls,
			       MPI_Datatype stype, void *rbuf, const int *rcounts,
			       const int *rdispls, MPI_Datatype rtype, MPI_Comm comm,
			       MPI_Request *req)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = alltoallv_op(C_IALLTOALLV, sbuf, scounts, sdispls, stype, rbuf,
					 rcounts, rdispls, rtype, comm, &why);

	if (op)
		return dpo_mpi_start_nonblocking(op, req);
	dpo_mpi_count(C_IALLTOALLV, why);
	return PMPI_Ialltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm,
			       req);
}

DPO_MPI_API int MPI_Ibcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm comm,
			   MPI_Request *req)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = bcast_op(C_IBCAST, buf, count, t, root, comm, &why);

	if (op)
		return dpo_mpi_start_nonblocking(op, req);
	dpo_mpi_count(C_IBCAST, why);
	return PMPI_Ibcast(buf, count, t, root, comm, req);
}

DPO_MPI_API int MPI_Iallgather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
			       int rcount, MPI_Datatype rtype, MPI_Comm comm, MPI_Request *req)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = allgather_op(C_IALLGATHER, sbuf, scount, stype, rbuf, rcount, rtype,
					 comm, &why);

	if (op)
		return dpo_mpi_start_nonblocking(op, req);
	dpo_mpi_count(C_IALLGATHER, why);
	return PMPI_Iallgather(sbuf, scount, stype, rbuf, rcount, rtype, comm, req);
}

/* Open MPI 5 declares MPI_VERSION 3.1 but ships the MPI-4 persistent collectives. */
#if MPI_VERSION >= 4 || (defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5)
DPO_MPI_API int MPI_Alltoall_init(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
				  int rcount, MPI_Datatype rtype, MPI_Comm comm, MPI_Info info,
				  MPI_Request *req)
{
	enum dpo_mpi_reason why;
	struct mpi_op *op = alltoall_op(C_ALLTOALL_INIT, sbuf, scount, stype, rbuf, rcount, rtype,
					comm, 1, &why);

	if (op)
		return dpo_mpi_op_persistent(op, req);
	dpo_mpi_count(C_ALLTOALL_INIT, why);
	return PMPI_Alltoall_init(sbuf, scount, stype, rbuf, rcount, rtype, comm, info, req);
}
#endif

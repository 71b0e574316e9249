/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The served reductions: MPI_Allreduce, MPI_Iallreduce, MPI_Reduce_scatter_block and
 * MPI_Ireduce_scatter_block on the DPA (docs/reductions.md), for the predefined ops
 * MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN on MPI_FLOAT, MPI_DOUBLE, MPI_INT, MPI_INT32_T,
 * MPI_INT64_T and MPI_LONG. The decision uses only what MPI requires to agree across the
 * communicator (the op, the datatype of a predefined reduction, the count, MPI_IN_PLACE
 * of reduce-scatter-block), so every rank takes the same path (dpo_mpi.h).
 *
 * A floating-point result is reduced in the DPA's fixed order: bitwise the same on every
 * rank and every run, though it may differ in the last bits from Open MPI's own order.
 */
#include <string.h>

#include "dpo_mpi.h"

static enum dpo_mpi_reason reduction_of(MPI_Op op, MPI_Datatype t, dpo_reduction_op_t *rop,
					dpo_datatype_t *dt)
{
	if (op == MPI_SUM)
		*rop = DPO_OP_SUM;
	else if (op == MPI_PROD)
		*rop = DPO_OP_PROD;
	else if (op == MPI_MAX)
		*rop = DPO_OP_MAX;
	else if (op == MPI_MIN)
		*rop = DPO_OP_MIN;
	else
		return R_OP;  /* user ops, logical and bitwise ops, MAXLOC/MINLOC, ... */
	if (t == MPI_FLOAT)
		*dt = DPO_DT_FLOAT32;
	else if (t == MPI_DOUBLE)
		*dt = DPO_DT_FLOAT64;
	else if (t == MPI_INT32_T || (t == MPI_INT && sizeof(int) == 4))
		*dt = DPO_DT_INT32;
	else if (t == MPI_INT64_T || (t == MPI_LONG && sizeof(long) == 8))
		*dt = DPO_DT_INT64;
	else
		return R_DATATYPE;
	return R_OFFLOADED;
}

static struct mpi_op *reduce_op(enum dpo_mpi_coll c, const void *sbuf, void *rbuf, int count,
				MPI_Datatype t, MPI_Op mop, MPI_Comm comm, int scatter,
				enum dpo_mpi_reason *why)
{
	struct comm_state *cs = NULL;
	dpo_reduction_op_t rop;
	dpo_datatype_t dt;
	dpo_coll_args_t a;
	struct mpi_op *op;
	uint64_t total;
	int n;

	if ((*why = dpo_mpi_gate(c, comm, &cs)) || (*why = reduction_of(mop, t, &rop, &dt)))
		return NULL;
	/* In-place reduce-scatter-block wants the result at the start of rbuf; the DPA leaves
	 * it at this rank's own block. */
	if (scatter && sbuf == MPI_IN_PLACE) {
		*why = R_IN_PLACE;
		return NULL;
	}
	if (count < 0) {
		*why = R_BAD_ARGS;
		return NULL;
	}
	PMPI_Comm_size(comm, &n);
	total = (uint64_t)count * dpo_dt_size(dt) * (scatter ? (uint64_t)n : 1);
	op = dpo_mpi_admit(c, cs, total,
			   scatter ? dpo_mpi.min_reduce_scatter : dpo_mpi.min_allreduce, why);
	if (!op)
		return NULL;
	memset(&a, 0, sizeof(a));
	a.coll_type = scatter ? DPO_COLL_TYPE_REDUCE_SCATTER : DPO_COLL_TYPE_ALLREDUCE;
	a.op = rop;
	a.dst.info = (dpo_coll_buffer_info_t){ rbuf, (uint64_t)count, dt };
	if (sbuf == MPI_IN_PLACE) {
		a.mask = DPO_COLL_ARGS_FIELD_FLAGS;
		a.flags = DPO_COLL_ARGS_FLAG_IN_PLACE;
	} else {
		a.src.info = (dpo_coll_buffer_info_t){ (void *)sbuf,
						       (uint64_t)count * (scatter ? (uint64_t)n : 1), dt };
	}
	return dpo_mpi_build(c, cs, &a, 0, 0, why, op);
}

DPO_MPI_API int MPI_Allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype t,
			      MPI_Op op, MPI_Comm comm)
{
	enum dpo_mpi_reason why;
	struct mpi_op *o = reduce_op(C_ALLREDUCE, sbuf, rbuf, count, t, op, comm, 0, &why);

	if (o)
		return dpo_mpi_run_blocking(o);
	dpo_mpi_count(C_ALLREDUCE, why);
	return PMPI_Allreduce(sbuf, rbuf, count, t, op, comm);
}

DPO_MPI_API int MPI_Iallreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype t,
			       MPI_Op op, MPI_Comm comm, MPI_Request *req)
{
	enum dpo_mpi_reason why;
	struct mpi_op *o = reduce_op(C_IALLREDUCE, sbuf, rbuf, count, t, op, comm, 0, &why);

	if (o)
		return dpo_mpi_start_nonblocking(o, req);
	dpo_mpi_count(C_IALLREDUCE, why);
	return PMPI_Iallreduce(sbuf, rbuf, count, t, op, comm, req);
}

DPO_MPI_API int MPI_Reduce_scatter_block(const void *sbuf, void *rbuf, int rcount,
					 MPI_Datatype t, MPI_Op op, MPI_Comm comm)
{
	enum dpo_mpi_reason why;
	struct mpi_op *o = reduce_op(C_REDUCE_SCATTER_BLOCK, sbuf, rbuf, rcount, t, op, comm, 1,
				     &why);

	if (o)
		return dpo_mpi_run_blocking(o);
	dpo_mpi_count(C_REDUCE_SCATTER_BLOCK, why);
	return PMPI_Reduce_scatter_block(sbuf, rbuf, rcount, t, op, comm);
}

DPO_MPI_API int MPI_Ireduce_scatter_block(const void *sbuf, void *rbuf, int rcount,
					  MPI_Datatype t, MPI_Op op, MPI_Comm comm,
					  MPI_Request *req)
{
	enum dpo_mpi_reason why;
	struct mpi_op *o = reduce_op(C_IREDUCE_SCATTER_BLOCK, sbuf, rbuf, rcount, t, op, comm, 1,
				     &why);

	if (o)
		return dpo_mpi_start_nonblocking(o, req);
	dpo_mpi_count(C_IREDUCE_SCATTER_BLOCK, why);
	return PMPI_Ireduce_scatter_block(sbuf, rbuf, rcount, t, op, comm, req);
}

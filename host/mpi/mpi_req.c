/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Requests: what the program holds for a served non-blocking or persistent collective.
 *
 * MPI_I* return a generalized request that we complete when the DPA reports the op done,
 * so the handle mixes freely with MPI's own requests. MPI_Alltoall_init returns an
 * inactive persistent receive from MPI_PROC_NULL that is never started: MPI sees an
 * inactive request (complete and empty) and keeps the handle valid across Start/Wait; we
 * know whether the op behind it runs. Every request function looks at our table first
 * (one load when it is empty), finishes what completed, and hands the array to PMPI.
 *
 * Waiting makes MPI progress too (PMPI_Iprobe on MPI_COMM_SELF): a legal program may
 * need this rank's MPI to move a peer's message before that peer posts its part of our
 * collective.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "dpo_mpi.h"

static struct mpi_op *live_ops;    /* grequests and persistent ops, under the lock */
static uint32_t live_count;

struct mpi_op *dpo_mpi_op_new(enum dpo_mpi_coll c, struct comm_state *cs)
{
	struct mpi_op *op = calloc(1, sizeof(*op));

	if (!op)
		return NULL;
	op->coll = c;
	op->cs = cs;
	op->handle = MPI_REQUEST_NULL;
	dpo_mpi_lock();
	cs->live_ops++;
	dpo_mpi_unlock();
	return op;
}

static void unlink_op(struct mpi_op *op)
{
	for (struct mpi_op **p = &live_ops; *p; p = &(*p)->next)
		if (*p == op) {
			*p = op->next;
			__atomic_store_n(&live_count, live_count - 1, __ATOMIC_RELAXED);
			return;
		}
}

void dpo_mpi_op_free(struct mpi_op *op)
{
	struct comm_state *cs;

	if (!op)
		return;
	cs = op->cs;
	dpo_mpi_lock();
	unlink_op(op);
	if (op->req)
		dpo_collective_finalize(op->req);
	if (--cs->live_ops == 0 && cs->freed)
		dpo_mpi_release_team(cs);
	dpo_mpi_unlock();
	free(op->pack_src), free(op->pack_dst);
	free(op->vcounts_s), free(op->vdispls_s), free(op->vcounts_r), free(op->vdispls_r);
	free(op);
}

static void pack_in(struct mpi_op *op)
{
	int pos = 0;

	if (op->pack_src && op->vcounts_s) {
		for (int i = 0; i < op->nblocks; i++)
			PMPI_Pack((const char *)op->user_sbuf + op->vdispls_s[i] * op->sextent,
				  op->vcounts_s[i], op->stype, op->pack_src, op->pack_bytes_src, &pos,
				  MPI_COMM_SELF);
	} else if (op->pack_src) {
		PMPI_Pack(op->user_sbuf, op->scount_total, op->stype, op->pack_src,
			  op->pack_bytes_src, &pos, MPI_COMM_SELF);
	} else if (op->user_sbuf && op->pack_dst) {
		/* broadcast root with a packed type: the bounce is what it sends */
		PMPI_Pack(op->user_sbuf, op->scount_total, op->stype, op->pack_dst,
			  op->pack_bytes_dst, &pos, MPI_COMM_SELF);
	}
}

static void unpack_out(struct mpi_op *op)
{
	int pos = 0;

	if (!op->pack_dst || op->unpack_skip)
		return;
	if (op->vcounts_r) {
		for (int i = 0; i < op->nblocks; i++)
			PMPI_Unpack(op->pack_dst, op->pack_bytes_dst, &pos,
				    (char *)op->user_rbuf + op->vdispls_r[i] * op->rextent,
				    op->vcounts_r[i], op->rtype, MPI_COMM_SELF);
	} else {
		PMPI_Unpack(op->pack_dst, op->pack_bytes_dst, &pos, op->user_rbuf, op->rcount_total,
			    op->rtype, MPI_COMM_SELF);
	}
}

int dpo_mpi_op_start(struct mpi_op *op)
{
	dpo_status_t st;

	pack_in(op);
	dpo_mpi_lock();
	st = dpo_collective_post(op->req);
	if (st == DPO_OK)
		op->active = 1;
	dpo_mpi_unlock();
	return st == DPO_OK ? MPI_SUCCESS : dpo_mpi_fail(op->cs, op->coll, op->req, st);
}

/* Under the lock: has the op finished? (Unpacks and completes its grequest once.) */
static int op_done(struct mpi_op *op, int64_t wait_ns, int *rc)
{
	dpo_status_t st;

	if (!op->active)
		return 1;
	st = wait_ns ? dpo_collective_wait(op->req, wait_ns) : dpo_collective_test(op->req);
	if (st == DPO_INPROGRESS)
		return 0;
	op->active = 0;
	if (st != DPO_OK) {
		*rc = dpo_mpi_fail(op->cs, op->coll, op->req, st);
	} else {
		unpack_out(op);
	}
	if (!op->persistent && op->handle != MPI_REQUEST_NULL)
		PMPI_Grequest_complete(op->handle);
	return 1;
}

static void mpi_progress(void)
{
	int flag;

	PMPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
}

/* Blocks until op completes, making MPI progress; slices grow from 50 us to 1 ms. */
int dpo_mpi_op_wait(struct mpi_op *op)
{
	int64_t slice = 50000;
	int rc = MPI_SUCCESS, done;

	for (;;) {
		dpo_mpi_lock();
		done = op_done(op, slice, &rc);
		dpo_mpi_unlock();
		if (done)
			return rc;
		mpi_progress();
		if (slice < 1000000)
			slice *= 2;
	}
}

static int query_fn(void *extra, MPI_Status *st)
{
	(void)extra;
	PMPI_Status_set_elements(st, MPI_BYTE, 0);
	PMPI_Status_set_cancelled(st, 0);
	st->MPI_SOURCE = MPI_UNDEFINED;
	st->MPI_TAG = MPI_UNDEFINED;
	return MPI_SUCCESS;
}

static int free_fn(void *extra)
{
	dpo_mpi_op_free(extra);
	return MPI_SUCCESS;
}

static int cancel_fn(void *extra, int complete)
{
	(void)extra, (void)complete;
	return MPI_SUCCESS;  /* collectives cannot be cancelled */
}

static void link_op(struct mpi_op *op)
{
	dpo_mpi_lock();
	op->next = live_ops;
	live_ops = op;
	__atomic_store_n(&live_count, live_count + 1, __ATOMIC_RELAXED);
	dpo_mpi_unlock();
}

int dpo_mpi_op_grequest(struct mpi_op *op, MPI_Request *req)
{
	int rc = PMPI_Grequest_start(query_fn, free_fn, cancel_fn, op, &op->handle);

	if (rc != MPI_SUCCESS) {
		dpo_mpi_op_wait(op);
		dpo_mpi_op_free(op);
		return rc;
	}
	link_op(op);
	*req = op->handle;
	return MPI_SUCCESS;
}

int dpo_mpi_op_persistent(struct mpi_op *op, MPI_Request *req)
{
	int rc = PMPI_Recv_init(NULL, 0, MPI_BYTE, MPI_PROC_NULL, 0, MPI_COMM_SELF, &op->handle);

	if (rc != MPI_SUCCESS) {
		dpo_mpi_op_free(op);
		return rc;
	}
	op->persistent = 1;
	link_op(op);
	*req = op->handle;
	return MPI_SUCCESS;
}

static struct mpi_op *find(MPI_Request h)
{
	if (h == MPI_REQUEST_NULL)
		return NULL;
	for (struct mpi_op *op = live_ops; op; op = op->next)
		if (op->handle == h)
			return op;
	return NULL;
}

static int any_live(void)
{
	return __atomic_load_n(&live_count, __ATOMIC_RELAXED) != 0;
}

/* Test every op of the array once; 1 if none of ours is still running. */
static int array_done(int n, MPI_Request reqs[], int *rc)
{
	int all = 1;

	dpo_mpi_lock();
	for (int i = 0; i < n; i++) {
		struct mpi_op *op = find(reqs[i]);

		if (op && !op_done(op, 0, rc))
			all = 0;
	}
	dpo_mpi_unlock();
	return all;
}

static void empty_status(MPI_Status *st)
{
	if (st != MPI_STATUS_IGNORE)
		query_fn(NULL, st);
}

DPO_MPI_API int MPI_Wait(MPI_Request *req, MPI_Status *st)
{
	struct mpi_op *op;
	int rc;

	if (!any_live())
		return PMPI_Wait(req, st);
	dpo_mpi_lock();
	op = find(*req);
	dpo_mpi_unlock();
	if (!op)
		return PMPI_Wait(req, st);
	rc = dpo_mpi_op_wait(op);
	if (op->persistent) {
		empty_status(st);
		return rc;
	}
	PMPI_Wait(req, st);  /* the completed grequest: frees the op, *req = MPI_REQUEST_NULL */
	return rc;
}

DPO_MPI_API int MPI_Test(MPI_Request *req, int *flag, MPI_Status *st)
{
	struct mpi_op *op;
	int rc = MPI_SUCCESS, done;

	if (!any_live())
		return PMPI_Test(req, flag, st);
	dpo_mpi_lock();
	op = find(*req);
	done = op ? op_done(op, 0, &rc) : 1;
	dpo_mpi_unlock();
	if (!op)
		return PMPI_Test(req, flag, st);
	if (!done) {
		*flag = 0;
		mpi_progress();
		return MPI_SUCCESS;
	}
	if (op->persistent) {
		*flag = 1;
		empty_status(st);
		return rc;
	}
	PMPI_Test(req, flag, st);
	return rc;
}

DPO_MPI_API int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status sts[])
{
	int rc = MPI_SUCCESS;

	if (!any_live())
		return PMPI_Waitall(n, reqs, sts);
	while (!array_done(n, reqs, &rc)) {
		mpi_progress();
		dpo_mpi_lock();
		for (int i = 0; i < n; i++) {  /* sleep on the first running one, briefly */
			struct mpi_op *op = find(reqs[i]);

			if (op && op->active) {
				op_done(op, 200000, &rc);
				break;
			}
		}
		dpo_mpi_unlock();
	}
	return rc != MPI_SUCCESS ? rc : PMPI_Waitall(n, reqs, sts);
}

DPO_MPI_API int MPI_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status sts[])
{
	int rc = MPI_SUCCESS;

	if (!any_live())
		return PMPI_Testall(n, reqs, flag, sts);
	if (!array_done(n, reqs, &rc)) {
		*flag = 0;  /* MPI: nothing completes unless everything does */
		mpi_progress();
		return rc;
	}
	return rc != MPI_SUCCESS ? rc : PMPI_Testall(n, reqs, flag, sts);
}

/* Our persistent ops are inactive to MPI: the index of one of ours that just finished. */
static int finished_persistent(int n, MPI_Request reqs[], int *rc)
{
	int found = MPI_UNDEFINED;

	dpo_mpi_lock();
	for (int i = 0; i < n && found == MPI_UNDEFINED; i++) {
		struct mpi_op *op = find(reqs[i]);

		if (op && op->persistent && op->active && op_done(op, 0, rc))
			found = i;
	}
	dpo_mpi_unlock();
	return found;
}

static int ours_running(int n, MPI_Request reqs[])
{
	int any = 0;

	dpo_mpi_lock();
	for (int i = 0; i < n && !any; i++) {
		struct mpi_op *op = find(reqs[i]);

		any = op && op->active;
	}
	dpo_mpi_unlock();
	return any;
}

DPO_MPI_API int MPI_Testany(int n, MPI_Request reqs[], int *index, int *flag, MPI_Status *st)
{
	int rc = MPI_SUCCESS, i;

	if (!any_live())
		return PMPI_Testany(n, reqs, index, flag, st);
	array_done(n, reqs, &rc);  /* completes finished grequests */
	i = finished_persistent(n, reqs, &rc);
	if (i != MPI_UNDEFINED) {
		*index = i, *flag = 1;
		empty_status(st);
		return rc;
	}
	PMPI_Testany(n, reqs, index, flag, st);
	if (*flag && *index == MPI_UNDEFINED && ours_running(n, reqs))
		*flag = 0;  /* only our running persistent ops are left */
	return rc;
}

DPO_MPI_API int MPI_Waitany(int n, MPI_Request reqs[], int *index, MPI_Status *st)
{
	int flag = 0, rc;

	if (!any_live())
		return PMPI_Waitany(n, reqs, index, st);
	for (;;) {
		rc = MPI_Testany(n, reqs, index, &flag, st);
		if (flag || rc != MPI_SUCCESS)
			return rc;
		mpi_progress();
	}
}

DPO_MPI_API int MPI_Testsome(int n, MPI_Request reqs[], int *outcount, int indices[],
			     MPI_Status sts[])
{
	int rc = MPI_SUCCESS, got = 0;

	if (!any_live())
		return PMPI_Testsome(n, reqs, outcount, indices, sts);
	array_done(n, reqs, &rc);
	for (int i;
	     (i = finished_persistent(n, reqs, &rc)) != MPI_UNDEFINED;) {
		indices[got] = i;
		if (sts != MPI_STATUSES_IGNORE)
			empty_status(&sts[got]);
		got++;
	}
	PMPI_Testsome(n, reqs, outcount, indices + got,
		      sts == MPI_STATUSES_IGNORE ? sts : sts + got);
	if (*outcount == MPI_UNDEFINED)
		*outcount = got ? got : ours_running(n, reqs) ? 0 : MPI_UNDEFINED;
	else
		*outcount += got;
	return rc;
}

DPO_MPI_API int MPI_Waitsome(int n, MPI_Request reqs[], int *outcount, int indices[],
			     MPI_Status sts[])
{
	int rc;

	if (!any_live())
		return PMPI_Waitsome(n, reqs, outcount, indices, sts);
	for (;;) {
		rc = MPI_Testsome(n, reqs, outcount, indices, sts);
		if (*outcount != 0 || rc != MPI_SUCCESS)
			return rc;
		mpi_progress();
	}
}

DPO_MPI_API int MPI_Start(MPI_Request *req)
{
	struct mpi_op *op;

	if (!any_live())
		return PMPI_Start(req);
	dpo_mpi_lock();
	op = find(*req);
	dpo_mpi_unlock();
	if (!op || !op->persistent)
		return PMPI_Start(req);
	return dpo_mpi_op_start(op);
}

DPO_MPI_API int MPI_Startall(int n, MPI_Request reqs[])
{
	for (int i = 0; i < n; i++) {
		int rc = MPI_Start(&reqs[i]);

		if (rc != MPI_SUCCESS)
			return rc;
	}
	return MPI_SUCCESS;
}

DPO_MPI_API int MPI_Request_free(MPI_Request *req)
{
	struct mpi_op *op;

	if (!any_live())
		return PMPI_Request_free(req);
	dpo_mpi_lock();
	op = find(*req);
	dpo_mpi_unlock();
	if (!op)
		return PMPI_Request_free(req);
	/* The collective still runs on the peers: finish our part before letting go. */
	dpo_mpi_op_wait(op);
	if (op->persistent) {
		MPI_Request h = op->handle;

		dpo_mpi_op_free(op);
		*req = h;
	}
	return PMPI_Request_free(req);  /* a grequest's free_fn frees the op */
}

/* MPI_Finalize: nothing of ours may still run. */
void dpo_mpi_finish_all(void)
{
	struct mpi_op *op;

	for (;;) {
		dpo_mpi_lock();
		for (op = live_ops; op && !op->active; op = op->next)
			;
		dpo_mpi_unlock();
		if (!op)
			break;
		dpo_mpi_op_wait(op);
	}
	/* persistent requests the program never freed */
	for (;;) {
		dpo_mpi_lock();
		for (op = live_ops; op && !op->persistent; op = op->next)
			;
		dpo_mpi_unlock();
		if (!op)
			break;
		PMPI_Request_free(&op->handle);
		dpo_mpi_op_free(op);
	}
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A team's barrier() and its all-to-all on numpy arrays posted before, in C
 * (offload_lib.team.Team is the Python subclass of TeamCore).
 *
 * Where ranks outnumber the cores every call runs cold: another rank ran on the core since
 * the last one. The Python frames each call took there (the method, the context's open
 * check, the kept command's lookup, the context's post) cost 5-7 us of a barrier + 1 KiB
 * all-to-all iteration of ~60 us at 4 ranks on 2 vCPUs (docs/performance.md). Only the
 * common case is handled here: the context open, nothing staged or orphaned in line
 * (Context._make_way), and for the all-to-all a command kept for exactly these arrays
 * (kept.c). Anything else goes to the subclass's _barrier_slow()/_alltoall_slow(), which
 * hold every rule and raise every error.
 */
#include "fastpath.h"  /* Python.h first, as it asks */

#include <structmember.h>

#include <stddef.h>

struct team_core {
	PyObject_HEAD
	PyObject *ctx;         /* the Context: keeps the host_ctx alive while we may use it */
	PyObject *orphans;     /* its requests dropped pending (Context._orphans): reaped first */
	PyObject *barrier_obj; /* the barrier's encoded host_op (cffi): barrier_op points into it */
	PyObject *alltoalls;   /* the all-to-all's kept commands (PreparedCache._entries) */
	PyObject *last_alltoall; /* the kept command found last (fast_kept_post's memo) */
	struct host_ctx *handle;
	const struct host_op *barrier_op;
	long long poll_ns, post_timeout_ns;
	char closed;           /* set by Context.close() before it stops the device */
	char staged;           /* the context stages GPU ops (Context._gpu): they go first */
};

/* May a call skip the Python layer? Not before __init__ ran (no handle). */
static int fast_way(const struct team_core *self)
{
	return self->handle && !self->closed && !self->staged && !PyDict_GET_SIZE(self->orphans);
}

static PyObject *call_slow(PyObject *o, PyObject *name, PyObject *const *args, Py_ssize_t nargs,
			   PyObject *kwnames)
{
	PyObject *method = PyObject_GetAttr(o, name), *r;

	if (!method)
		return NULL;
	r = PyObject_Vectorcall(method, args, (size_t)nargs, kwnames);
	Py_DECREF(method);
	return r;
}

static PyObject *team_barrier(PyObject *o, PyObject *const *args, Py_ssize_t nargs,
			      PyObject *kwnames)
{
	struct team_core *self = (struct team_core *)o;

	if (nargs || kwnames || !fast_way(self))
		return call_slow(o, fast.barrier_slow_name, args, nargs, kwnames);
	return fast_post_op(self->ctx, self->handle, self->barrier_op, self->post_timeout_ns,
			    fast.barrier_name, fast.empty_tuple, self->poll_ns, Py_None);
}

static PyObject *team_alltoall(PyObject *o, PyObject *const *args, Py_ssize_t nargs,
			       PyObject *kwnames)
{
	struct team_core *self = (struct team_core *)o;

	if (nargs == 2 && !kwnames && fast_way(self)) {
		PyObject *req = fast_kept_post(self->alltoalls, &self->last_alltoall, Py_None,
					       self->ctx, self->handle, self->poll_ns,
					       self->post_timeout_ns, args[0], args[1]);

		if (req != Py_None)
			return req;  /* the Request, or NULL: its error */
		Py_DECREF(req);
	}
	return call_slow(o, fast.alltoall_slow_name, args, nargs, kwnames);
}

/* TeamCore(ctx, barrier_op, barrier_addr, alltoalls, poll_ns, post_timeout_ns, orphans) */
static int team_init(PyObject *o, PyObject *args, PyObject *kwds)
{
	static char *names[] = {"ctx", "barrier_op", "barrier_addr", "alltoalls", "poll_ns",
				"post_timeout_ns", "orphans", NULL};
	struct team_core *self = (struct team_core *)o;
	PyObject *ctx, *op_obj, *addr, *alltoalls, *orphans;
	long long poll_ns, timeout_ns;
	struct host_ctx *handle;
	void *op;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!LLO!:TeamCore", names, &ctx, &op_obj,
					 &addr, &PyDict_Type, &alltoalls, &poll_ns, &timeout_ns,
					 &PyDict_Type, &orphans))
		return -1;
	if (!fast.post) {
		PyErr_SetString(PyExc_RuntimeError, "offload_lib._fast: bind() was not called");
		return -1;
	}
	if (!(handle = fast_ctx_handle(ctx)))
		return -1;
	op = PyLong_AsVoidPtr(addr);
	if (!op) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "TeamCore: a null barrier op");
		return -1;
	}
	/* Every field set before the old references go: their finalizers may run. */
	PyObject *old[5] = {self->ctx, self->orphans, self->barrier_obj, self->alltoalls,
			    self->last_alltoall};

	self->ctx = Py_NewRef(ctx);
	self->orphans = Py_NewRef(orphans);
	self->barrier_obj = Py_NewRef(op_obj);
	self->alltoalls = Py_NewRef(alltoalls);
	self->last_alltoall = NULL;
	self->handle = handle;
	self->barrier_op = op;
	self->poll_ns = poll_ns;
	self->post_timeout_ns = timeout_ns;
	self->closed = 0;
	self->staged = 0;
	for (int i = 0; i < 5; i++)
		Py_XDECREF(old[i]);
	return 0;
}

static int team_traverse(PyObject *o, visitproc visit, void *arg)
{
	struct team_core *self = (struct team_core *)o;

	Py_VISIT(self->ctx);
	Py_VISIT(self->orphans);
	Py_VISIT(self->barrier_obj);
	Py_VISIT(self->alltoalls);
	Py_VISIT(self->last_alltoall);
	Py_VISIT(Py_TYPE(o));  /* a heap type's instances hold it */
	return 0;
}

static int team_clear(PyObject *o)
{
	struct team_core *self = (struct team_core *)o;

	self->handle = NULL;  /* no context held: every call takes the Python way */
	Py_CLEAR(self->ctx);
	Py_CLEAR(self->orphans);
	Py_CLEAR(self->barrier_obj);
	Py_CLEAR(self->alltoalls);
	Py_CLEAR(self->last_alltoall);
	return 0;
}

static void team_dealloc(PyObject *o)
{
	PyTypeObject *type = Py_TYPE(o);
	freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);

	PyObject_GC_UnTrack(o);
	team_clear(o);
	free_fn(o);
	Py_DECREF(type);
}

static PyMemberDef team_members[] = {
	{"_fast_closed", T_BOOL, offsetof(struct team_core, closed), 0, NULL},
	{"_staged", T_BOOL, offsetof(struct team_core, staged), 0, NULL},
	{NULL, 0, 0, 0, NULL},
};

static PyMethodDef team_methods[] = {
	{"barrier", (PyCFunction)(void (*)(void))team_barrier, METH_FASTCALL | METH_KEYWORDS,
	 "barrier() -> Request: post a barrier over the team."},
	{"alltoall", (PyCFunction)(void (*)(void))team_alltoall, METH_FASTCALL | METH_KEYWORDS,
	 "alltoall(src, dst) -> Request: post an all-to-all: block j of src goes to rank j, "
	 "block i of dst comes from rank i."},
	{NULL, NULL, 0, NULL},
};

static PyType_Slot team_slots[] = {
	{Py_tp_doc, "A team's barrier() and kept all-to-all in C for the common case "
		    "(offload_lib.team.Team)."},
	{Py_tp_init, team_init},
	{Py_tp_new, PyType_GenericNew},
	{Py_tp_traverse, team_traverse},
	{Py_tp_clear, team_clear},
	{Py_tp_dealloc, team_dealloc},
	{Py_tp_members, team_members},
	{Py_tp_methods, team_methods},
	{0, NULL},
};

PyType_Spec fast_team_spec = {
	.name = "offload_lib._fast.TeamCore",
	.basicsize = sizeof(struct team_core),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.slots = team_slots,
};

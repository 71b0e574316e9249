/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The persistent request's post() and test() in C (offload_lib.request.PersistentRequest
 * is the Python subclass).
 *
 * They are the two calls a training loop makes around other work, so they run with the
 * interpreter's and the library's code and data out of the caches: each Python step and
 * each cffi conversion there is a few cold lines. In Python they cost ~2 and ~3.5 us
 * beyond their C calls after 20 ms of other work (scripts/bench_overlap.py). Only the
 * common case is handled here (nothing staged or orphaned in line, the op idle for post()
 * and posted for test()); anything else goes to the subclass's
 * _post_slow()/_test_slow(), which hold every rule.
 */
#include "fastpath.h"  /* Python.h first, as it asks */

#include <structmember.h>

#include <stddef.h>

struct persistent {
	PyObject_HEAD
	PyObject *ctx;     /* the Context: keeps the host_ctx alive while we may use it */
	PyObject *op_obj;  /* the encoded host_op (a cffi struct): op points into it */
	PyObject *req;     /* the posted op's Request, once wait() or cancel() needed one */
	PyObject *orphans; /* the context's dict of requests dropped pending (Context._orphans) */
	struct host_ctx *handle;
	const struct host_op *op;
	long long post_timeout_ns;
	uint32_t tag;      /* posted, completion not seen yet; 0: idle */
	char freed;
	char staged;       /* the context stages GPU ops (set by Context._gpu): they go first */
};

static PyObject *persistent_post(PyObject *o, PyObject *unused)
{
	struct persistent *self = (struct persistent *)o;
	uint32_t tag = 0;
	int rc;

	(void)unused;
	/* The line is clear unless a staged op or an orphaned request is in it
	 * (Context._make_way). A closed context needs no look: close() marks its persistent
	 * requests freed before it stops the device. Reading the context's attributes here
	 * instead cost ~1.2 us, cold. */
	if (!self->handle || self->freed || self->tag || self->staged ||
	    PyDict_GET_SIZE(self->orphans))
		return PyObject_CallMethodObjArgs(o, fast.post_slow_name, NULL);
	struct host_ctx *handle = self->handle;
	const struct host_op *op = self->op;
	int64_t timeout_ns = (int64_t)self->post_timeout_ns;

	Py_BEGIN_ALLOW_THREADS
	rc = fast.post(handle, op, timeout_ns, &tag);
	Py_END_ALLOW_THREADS
	if (rc)
		return PyObject_CallMethod(o, "_post_failed", "i", rc);
	self->tag = tag;
	Py_INCREF(o);
	return o;
}

static PyObject *persistent_test(PyObject *o, PyObject *unused)
{
	struct persistent *self = (struct persistent *)o;
	struct host_completion comp;
	int rc;

	(void)unused;
	/* Idle (a closed context still raises there), freed, or a Request of its own. */
	if (!self->handle || self->freed || !self->tag || (self->req && self->req != Py_None))
		return PyObject_CallMethodObjArgs(o, fast.test_slow_name, NULL);
	struct host_ctx *handle = self->handle;
	uint32_t tag = self->tag;

	/* A look at the table, the GIL kept; the firmware's turn (a small op's: host_test runs
	 * a pass for it) with the GIL handed over, as it may take a while. */
	rc = fast.done(handle, tag, &comp);
	if (rc == 0 && self->op->small) {
		Py_BEGIN_ALLOW_THREADS
		rc = fast.test(handle, tag, &comp);
		Py_END_ALLOW_THREADS
	}
	if (rc == 0)
		Py_RETURN_FALSE;
	if (rc < 0 || self->tag != tag)  /* closed, or another thread's call came between */
		return PyObject_CallMethodObjArgs(o, fast.test_slow_name, NULL);
	self->tag = 0;
	if (comp.status == 0)
		Py_RETURN_TRUE;
	return PyObject_CallMethod(o, "_failed", "iIKK", (int)comp.status,
				   (unsigned int)comp.detail, (unsigned long long)comp.result0,
				   (unsigned long long)comp.result1);
}

/* PersistentCore(ctx, op, op_addr, post_timeout_ns, orphans) */
static int persistent_init(PyObject *o, PyObject *args, PyObject *kwds)
{
	static char *names[] = {"ctx", "op", "op_addr", "post_timeout_ns", "orphans", NULL};
	struct persistent *self = (struct persistent *)o;
	PyObject *ctx, *op_obj, *addr, *orphans;
	long long timeout_ns;
	struct host_ctx *handle;
	void *op;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOLO!:PersistentCore", names, &ctx, &op_obj,
					 &addr, &timeout_ns, &PyDict_Type, &orphans))
		return -1;
	if (!fast.post || !fast.test || !fast.done) {
		PyErr_SetString(PyExc_RuntimeError, "offload_lib._fast: bind() was not called");
		return -1;
	}
	if (!(handle = fast_ctx_handle(ctx)))
		return -1;
	op = PyLong_AsVoidPtr(addr);
	if (!op) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "PersistentCore: a null op");
		return -1;
	}
	/* Every field set before the old references go: their finalizers may run. */
	PyObject *old[4] = {self->ctx, self->op_obj, self->orphans, self->req};

	Py_INCREF(ctx);
	Py_INCREF(op_obj);
	Py_INCREF(orphans);
	self->ctx = ctx;
	self->op_obj = op_obj;
	self->orphans = orphans;
	self->req = NULL;
	self->handle = handle;
	self->op = op;
	self->post_timeout_ns = timeout_ns;
	self->tag = 0;
	self->freed = 0;
	self->staged = 0;
	for (int i = 0; i < 4; i++)
		Py_XDECREF(old[i]);
	return 0;
}

static int persistent_traverse(PyObject *o, visitproc visit, void *arg)
{
	struct persistent *self = (struct persistent *)o;

	Py_VISIT(self->ctx);
	Py_VISIT(self->op_obj);
	Py_VISIT(self->req);
	Py_VISIT(self->orphans);
	Py_VISIT(Py_TYPE(o));  /* a heap type's instances hold it */
	return 0;
}

static int persistent_clear(PyObject *o)
{
	struct persistent *self = (struct persistent *)o;

	Py_CLEAR(self->ctx);
	Py_CLEAR(self->op_obj);
	Py_CLEAR(self->req);
	Py_CLEAR(self->orphans);
	self->handle = NULL;  /* no context held: every call takes the full way */
	return 0;
}

static void persistent_dealloc(PyObject *o)
{
	PyTypeObject *type = Py_TYPE(o);
	freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);

	PyObject_GC_UnTrack(o);
	persistent_clear(o);
	free_fn(o);
	Py_DECREF(type);
}

static PyMemberDef persistent_members[] = {
	{"_ctx", T_OBJECT, offsetof(struct persistent, ctx), READONLY, NULL},
	{"_op", T_OBJECT, offsetof(struct persistent, op_obj), READONLY, NULL},
	{"_req", T_OBJECT, offsetof(struct persistent, req), 0, NULL},
	{"_tag", T_UINT, offsetof(struct persistent, tag), 0, NULL},
	{"_freed", T_BOOL, offsetof(struct persistent, freed), 0, NULL},
	{"_staged", T_BOOL, offsetof(struct persistent, staged), 0, NULL},
	{NULL, 0, 0, 0, NULL},
};

static PyMethodDef persistent_methods[] = {
	{"post", persistent_post, METH_NOARGS, "Post the op again (it must be idle)."},
	{"test", persistent_test, METH_NOARGS,
	 "True once the posted op completed, or none is posted (raises its error if it failed)."},
	{NULL, NULL, 0, NULL},
};

static PyType_Slot persistent_slots[] = {
	{Py_tp_doc, "A persistent op's post() and test() in C for the common case "
		    "(offload_lib.request.PersistentRequest)."},
	{Py_tp_init, persistent_init},
	{Py_tp_new, PyType_GenericNew},
	{Py_tp_traverse, persistent_traverse},
	{Py_tp_clear, persistent_clear},
	{Py_tp_dealloc, persistent_dealloc},
	{Py_tp_members, persistent_members},
	{Py_tp_methods, persistent_methods},
	{0, NULL},
};

PyType_Spec fast_persistent_spec = {
	.name = "offload_lib._fast.PersistentCore",
	.basicsize = sizeof(struct persistent),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.slots = persistent_slots,
};

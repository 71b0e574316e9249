/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one-shot request in C (offload_lib.request.Request is its Python subclass).
 *
 * A small op's Python layer (post, the Request object, wait(), its finish and its
 * finalizer) cost more per op than the emulated DPU's own work: ~2 us at one rank and
 * ~4.5 us of CPU per barrier + 1 KiB all-to-all at four ranks on two cores, where the
 * whole op of Open MPI costs ~5. Here wait() and test() call host_wait()/host_test()
 * themselves; wait() first looks with host_done(), the GIL held, since a small op's post
 * has often completed it already (one rank: 10-20% less CPU per op than handing the GIL
 * over for that look). Only the common case is handled here; anything else (a timeout,
 * a closed context, a failed op, a result to decode, a slice that ended) goes to the
 * Python methods of the subclass, which hold every rule.
 */
#include "fastpath.h"  /* Python.h first, as it asks */

#include <structmember.h>

#include <stddef.h>

/* host_wait's slice when wait() has no timeout: the Python loop checks signals between
 * slices, so that Ctrl-C reaches a program waiting for a long op. */
#define WAIT_SLICE_NS 250000000ll

struct request {
	PyObject_HEAD
	PyObject *ctx;      /* the Context: keeps the host_ctx alive while we may use it */
	PyObject *what;     /* "alltoall", for messages */
	PyObject *keep;     /* buffers the op may still touch, until it completes */
	PyObject *value;    /* what wait() returns */
	PyObject *error;    /* the op's error, raised again by every later wait() */
	PyObject *result;   /* callable decoding a completion into the value, or None */
	PyObject *itemsize; /* int or None: sizes in error messages */
	struct host_ctx *handle;
	long long poll_ns;
	uint32_t tag;
	char done;
};

/* The finished op's outcome: its value, or its error raised again. */
static PyObject *outcome(struct request *self)
{
	if (self->error && self->error != Py_None) {
		PyErr_SetObject((PyObject *)Py_TYPE(self->error), self->error);
		return NULL;
	}
	if (!self->value)
		Py_RETURN_NONE;
	Py_INCREF(self->value);
	return self->value;
}

/* A completion that went well and has nothing to decode: done, buffers let go. */
static void finish_ok(struct request *self)
{
	PyObject *keep = self->keep;

	self->done = 1;
	self->keep = PyTuple_New(0);
	Py_XDECREF(keep);
}

/* A failed op's completion, for the Python side: _failed() raises the op's error. */
static PyObject *finish_failed(struct request *self, const struct host_completion *comp)
{
	return PyObject_CallMethod((PyObject *)self, "_failed", "iIKK", (int)comp->status,
				   (unsigned int)comp->detail,
				   (unsigned long long)comp->result0,
				   (unsigned long long)comp->result1);
}

/* wait(timeout=None): the timeout, or NULL after an error (Python's argument rules). */
static int timeout_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
		       PyObject **timeout)
{
	Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;

	*timeout = nargs ? args[0] : Py_None;
	if (nargs + nkw > 1) {
		PyErr_SetString(PyExc_TypeError, "wait() takes at most one argument (timeout)");
		return -1;
	}
	if (nkw) {
		PyObject *name = PyTuple_GetItem(kwnames, 0);

		if (!name || PyUnicode_CompareWithASCIIString(name, "timeout")) {
			PyErr_Format(PyExc_TypeError, "wait() got an unexpected keyword argument %R",
				     name);
			return -1;
		}
		*timeout = args[0];
	}
	return 0;
}

static PyObject *request_wait(PyObject *op, PyObject *const *args, Py_ssize_t nargs,
			      PyObject *kwnames)
{
	struct request *self = (struct request *)op;
	struct host_completion comp;
	PyObject *timeout;
	int rc;

	if (timeout_arg(args, nargs, kwnames, &timeout))
		return NULL;
	/* A timeout (checked there, even for a finished op) and anything else uncommon:
	 * Python's way. */
	if (timeout != Py_None || self->result != Py_None || !self->handle || !self->ctx)
		return PyObject_CallMethodObjArgs(op, fast.wait_slow_name, timeout, NULL);
	if (self->done)
		return outcome(self);
	/* A closed context's calls answer -ESHUTDOWN: Python's way then waits for the device
	 * to stop before it raises. What the call needs, read while we hold the GIL. */
	struct host_ctx *handle = self->handle;
	uint32_t tag = self->tag;
	int64_t poll_ns = (int64_t)self->poll_ns;

	/* Often the post's own pass completed it: a look at the table first, the GIL kept
	 * (handing it over and taking it back costs more than the look). */
	rc = fast.done(handle, tag, &comp);
	if (rc == 1) {
		rc = 0;
	} else if (rc == 0) {
		Py_BEGIN_ALLOW_THREADS
		rc = fast.wait(handle, tag, WAIT_SLICE_NS, poll_ns, &comp);
		Py_END_ALLOW_THREADS
	}
	if (rc == 0 && comp.status == 0 && !self->done) {
		finish_ok(self);
		Py_RETURN_NONE;
	}
	if (rc == 0 && !self->done)
		return finish_failed(self, &comp);
	/* The slice ended, an error, or another thread finished it meanwhile. */
	return PyObject_CallMethodObjArgs(op, fast.wait_slow_name, Py_None, NULL);
}

static PyObject *request_test(PyObject *op, PyObject *unused)
{
	struct request *self = (struct request *)op;
	struct host_completion comp;
	int rc;

	(void)unused;
	if (self->done) {
		PyObject *v = outcome(self);

		if (!v)
			return NULL;
		Py_DECREF(v);
		Py_RETURN_TRUE;
	}
	if (self->result != Py_None || !self->handle || !self->ctx)
		return PyObject_CallMethodObjArgs(op, fast.test_slow_name, NULL);
	struct host_ctx *handle = self->handle;
	uint32_t tag = self->tag;

	Py_BEGIN_ALLOW_THREADS
	rc = fast.test(handle, tag, &comp);
	Py_END_ALLOW_THREADS
	if (rc == 0)
		Py_RETURN_FALSE;
	if (rc < 0 || self->done)
		return PyObject_CallMethodObjArgs(op, fast.test_slow_name, NULL);
	if (comp.status == 0) {
		finish_ok(self);
		Py_RETURN_TRUE;
	}
	return finish_failed(self, &comp);
}

struct host_ctx *fast_ctx_handle(PyObject *ctx)
{
	PyObject *v = PyObject_GetAttr(ctx, fast.addr_name);
	void *p;

	if (!v)
		return NULL;
	p = PyLong_AsVoidPtr(v);
	Py_DECREF(v);
	if (!p && !PyErr_Occurred())
		PyErr_SetString(PyExc_ValueError, "a context without a library handle");
	return p;
}

static void set_fields(struct request *self, PyObject *ctx, struct host_ctx *handle, uint32_t tag,
		       PyObject *what, PyObject *keep, PyObject *result, long long poll_ns,
		       PyObject *itemsize)
{
	PyObject *old[7] = {self->ctx, self->what, self->keep, self->result, self->itemsize,
			    self->value, self->error};

	Py_INCREF(ctx);
	Py_INCREF(what);
	Py_INCREF(keep);
	Py_INCREF(result);
	Py_INCREF(itemsize);
	self->ctx = ctx;
	self->what = what;
	self->keep = keep;
	self->result = result;
	self->itemsize = itemsize;
	self->value = NULL;
	self->error = NULL;
	self->handle = handle;
	self->poll_ns = poll_ns;
	self->tag = tag;
	self->done = 0;
	for (int i = 0; i < 7; i++)
		Py_XDECREF(old[i]);
}

PyObject *fast_post_op(PyObject *ctx, struct host_ctx *handle, const struct host_op *op,
		       int64_t timeout_ns, PyObject *what, PyObject *keep, long long poll_ns,
		       PyObject *itemsize)
{
	struct request *req;
	uint32_t tag = 0;
	int rc;

	if (!fast.post) {
		PyErr_SetString(PyExc_RuntimeError, "offload_lib._fast: bind() was not called");
		return NULL;
	}
	/* Made before the post: once posted, the op's buffers must have a keeper. */
	req = (struct request *)fast.request_type->tp_alloc(fast.request_type, 0);
	if (!req)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = fast.post(handle, op, timeout_ns, &tag);
	Py_END_ALLOW_THREADS
	if (rc) {
		Py_DECREF(req);  /* no fields yet: its finalizer has nothing to adopt */
		PyObject *r = PyObject_CallMethod(ctx, "_check", "iN", rc,
						  PyUnicode_FromFormat("posting %S", what));

		if (r) {  /* _check raises for every error host_post returns */
			Py_DECREF(r);
			PyErr_Format(PyExc_RuntimeError, "posting %S: host_post returned %d", what, rc);
		}
		return NULL;
	}
	set_fields(req, ctx, handle, tag, what, keep, Py_None, poll_ns, itemsize);
	return (PyObject *)req;
}

/* Request(ctx, tag, what, keep, result=None, poll_ns=0, itemsize=None) */
static int request_init(PyObject *op, PyObject *args, PyObject *kwds)
{
	static char *names[] = {"ctx", "tag", "what", "keep", "result", "poll_ns", "itemsize", NULL};
	PyObject *ctx, *what, *keep, *result = Py_None, *itemsize = Py_None;
	unsigned long tag;
	long long poll_ns = 0;
	struct host_ctx *handle;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OkOO|OLO:Request", names, &ctx, &tag, &what,
					 &keep, &result, &poll_ns, &itemsize))
		return -1;
	if (!(handle = fast_ctx_handle(ctx)))
		return -1;
	set_fields((struct request *)op, ctx, handle, (uint32_t)tag, what, keep, result, poll_ns,
		   itemsize);
	return 0;
}

/* An op nobody waited for may still write into its buffers: the context keeps them until
 * the completion arrives (Context._adopt). */
static void request_finalize(PyObject *op)
{
	struct request *self = (struct request *)op;
	PyObject *r;

	if (self->done || !self->ctx)
		return;
#if PY_VERSION_HEX >= 0x030C0000
	PyObject *exc = PyErr_GetRaisedException();
#else
	PyObject *type, *value, *tb;

	PyErr_Fetch(&type, &value, &tb);
#endif
	r = PyObject_CallMethodObjArgs(op, fast.adopt_name, NULL);
	if (r)
		Py_DECREF(r);
	else
		PyErr_Clear();
#if PY_VERSION_HEX >= 0x030C0000
	PyErr_SetRaisedException(exc);
#else
	PyErr_Restore(type, value, tb);
#endif
}

static int request_traverse(PyObject *op, visitproc visit, void *arg)
{
	struct request *self = (struct request *)op;

	Py_VISIT(self->ctx);
	Py_VISIT(self->what);
	Py_VISIT(self->keep);
	Py_VISIT(self->value);
	Py_VISIT(self->error);
	Py_VISIT(self->result);
	Py_VISIT(self->itemsize);
	Py_VISIT(Py_TYPE(op));  /* a heap type's instances hold it */
	return 0;
}

static int request_clear(PyObject *op)
{
	struct request *self = (struct request *)op;

	Py_CLEAR(self->ctx);
	Py_CLEAR(self->what);
	Py_CLEAR(self->keep);
	Py_CLEAR(self->value);
	Py_CLEAR(self->error);
	Py_CLEAR(self->result);
	Py_CLEAR(self->itemsize);
	return 0;
}

static void request_dealloc(PyObject *op)
{
	PyTypeObject *type = Py_TYPE(op);
	freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);

	PyObject_GC_UnTrack(op);
	request_clear(op);
	free_fn(op);
	Py_DECREF(type);
}

static PyMemberDef request_members[] = {
	{"_ctx", T_OBJECT, offsetof(struct request, ctx), 0, NULL},
	{"_what", T_OBJECT, offsetof(struct request, what), 0, NULL},
	{"_keep", T_OBJECT, offsetof(struct request, keep), 0, NULL},
	{"_value", T_OBJECT, offsetof(struct request, value), 0, NULL},
	{"_error", T_OBJECT, offsetof(struct request, error), 0, NULL},
	{"_result", T_OBJECT, offsetof(struct request, result), 0, NULL},
	{"_itemsize", T_OBJECT, offsetof(struct request, itemsize), 0, NULL},
	{"_poll_ns", T_LONGLONG, offsetof(struct request, poll_ns), 0, NULL},
	{"_tag", T_UINT, offsetof(struct request, tag), 0, NULL},
	{"_done", T_BOOL, offsetof(struct request, done), 0, NULL},
	{NULL, 0, 0, 0, NULL},
};

static PyMethodDef request_methods[] = {
	{"wait", (PyCFunction)(void (*)(void))request_wait, METH_FASTCALL | METH_KEYWORDS,
	 "Block until the op completes; raise Timeout after ``timeout`` seconds."},
	{"test", request_test, METH_NOARGS, "True once the op completed (raises its error if it failed)."},
	{NULL, NULL, 0, NULL},
};

static PyType_Slot request_slots[] = {
	{Py_tp_doc, "A one-shot op's handle, in C for the common case (offload_lib.request.Request)."},
	{Py_tp_init, request_init},
	{Py_tp_new, PyType_GenericNew},
	{Py_tp_finalize, request_finalize},
	{Py_tp_traverse, request_traverse},
	{Py_tp_clear, request_clear},
	{Py_tp_dealloc, request_dealloc},
	{Py_tp_members, request_members},
	{Py_tp_methods, request_methods},
	{0, NULL},
};

PyType_Spec fast_request_spec = {
	.name = "offload_lib._fast.RequestCore",
	.basicsize = sizeof(struct request),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.slots = request_slots,
};


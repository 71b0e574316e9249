/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A command kept for the next call on the same numpy arrays (offload_lib/_prepared.py
 * says when one is kept and why that is safe), and its post: the check that the arrays
 * are still what the full check saw, then host_post, in one C call. In Python the check
 * alone cost ~0.55 us of a 1 KiB all-to-all's ~2.2 us at one rank.
 */
#include "fastpath.h"  /* Python.h first, as it asks */

#include <structmember.h>

#include <stddef.h>
#include <string.h>

struct kept {
	PyObject_HEAD
	PyObject *src_ref, *dst_ref; /* weak: a kept command keeps no user memory alive */
	PyObject *dtype;             /* both arrays' */
	PyObject *what, *variant, *itemsize;
	Py_ssize_t src_nbytes, dst_nbytes;
	int small;
	struct host_op op;           /* encoded, with its cookies (host_post copies it) */
};

/* Is ref's referent obj? (-1 with an exception set on error.) */
static int refers_to(PyObject *ref, PyObject *obj)
{
#if PY_VERSION_HEX >= 0x030D0000
	PyObject *o;
	int rc = PyWeakref_GetRef(ref, &o);

	if (rc <= 0)
		return rc;
	rc = o == obj;
	Py_DECREF(o);
	return rc;
#else
	return PyWeakref_GetObject(ref) == obj;
#endif
}

/* Is ref's referent alive? */
static int referent_alive(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
	PyObject *o;
	int rc = PyWeakref_GetRef(ref, &o);

	Py_XDECREF(o);
	return rc > 0;
#else
	return PyWeakref_GetObject(ref) != Py_None;
#endif
}

/* obj's C-contiguous (and, writable, writable) buffer is at addr, nbytes long. */
static int same_buffer(PyObject *obj, uint64_t addr, Py_ssize_t nbytes, int writable)
{
	Py_buffer view;
	int same;

	if (PyObject_GetBuffer(obj, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
		PyErr_Clear();  /* read-only, or no longer C-contiguous: the full way says so */
		return 0;
	}
	same = (uint64_t)(uintptr_t)view.buf == addr && view.len == nbytes;
	PyBuffer_Release(&view);
	return same;
}

static int same_dtype(PyObject *obj, PyObject *dtype)
{
	PyObject *d = PyObject_GetAttr(obj, fast.dtype_name);

	if (!d) {
		PyErr_Clear();
		return 0;
	}
	Py_DECREF(d);  /* the kept dtype holds the object alive: identity is enough */
	return d == dtype;
}

/* Still the same arrays, as the full check saw them? (-1: an error.) */
static int kept_matches_arrays(struct kept *k, PyObject *src, PyObject *dst)
{
	int rc = refers_to(k->src_ref, src);

	if (rc > 0)
		rc = refers_to(k->dst_ref, dst);
	if (rc <= 0)
		return rc;
	return same_dtype(src, k->dtype) && same_dtype(dst, k->dtype) &&
	       same_buffer(src, k->op.src_addr, k->src_nbytes, 0) &&
	       same_buffer(dst, k->op.dst_addr, k->dst_nbytes, 1);
}

/* Kept(src, dst, op_addr, what, variant, itemsize): op_addr is the encoded command's
 * address, as posted (cookies, size class); src and dst as that post saw them. */
static int kept_init(PyObject *o, PyObject *args, PyObject *kwds)
{
	struct kept *k = (struct kept *)o;
	PyObject *src, *dst, *addr, *what, *variant, *itemsize, *dtype;
	const struct host_op *op;
	Py_buffer sv, dv;

	if (kwds && PyDict_GET_SIZE(kwds)) {
		PyErr_SetString(PyExc_TypeError, "Kept() takes positional arguments");
		return -1;
	}
	if (!PyArg_ParseTuple(args, "OOOOOO:Kept", &src, &dst, &addr, &what, &variant, &itemsize))
		return -1;
	op = PyLong_AsVoidPtr(addr);
	if (!op) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "Kept(): a null op");
		return -1;
	}
	if (!(dtype = PyObject_GetAttr(src, fast.dtype_name)))
		return -1;
	if (PyObject_GetBuffer(src, &sv, PyBUF_SIMPLE) < 0) {
		Py_DECREF(dtype);
		return -1;
	}
	if (PyObject_GetBuffer(dst, &dv, PyBUF_WRITABLE) < 0) {
		PyBuffer_Release(&sv);
		Py_DECREF(dtype);
		return -1;
	}
	k->src_nbytes = sv.len;
	k->dst_nbytes = dv.len;
	PyBuffer_Release(&sv);
	PyBuffer_Release(&dv);
	Py_XSETREF(k->src_ref, PyWeakref_NewRef(src, NULL));
	Py_XSETREF(k->dst_ref, PyWeakref_NewRef(dst, NULL));
	Py_XSETREF(k->dtype, dtype);
	Py_INCREF(what);
	Py_XSETREF(k->what, what);
	Py_INCREF(variant);
	Py_XSETREF(k->variant, variant);
	Py_INCREF(itemsize);
	Py_XSETREF(k->itemsize, itemsize);
	memcpy(&k->op, op, sizeof(k->op));
	k->small = op->small != 0;
	return k->src_ref && k->dst_ref ? 0 : -1;
}

/* Is entry a command kept for these arrays and this variant, still valid? (-1: an error.) */
static int entry_matches(PyObject *entry, PyObject *variant, PyObject *src, PyObject *dst)
{
	struct kept *k = (struct kept *)entry;
	int rc = Py_TYPE(entry) == fast_kept_type && k->src_ref;

	if (rc > 0 && k->variant != variant)
		rc = PyObject_RichCompareBool(k->variant, variant, Py_EQ);
	if (rc > 0)
		rc = kept_matches_arrays(k, src, dst);
	return rc;
}

/* The command kept in entries (a dict by (id(src), id(dst))) for these arrays and this
 * variant, posted if they are still what it was encoded for (a Request); None sends the
 * caller the full way. *memo (NULL: none) holds the last one found there and is tried
 * first: a loop on the same arrays builds no key and looks nothing up (the key's tuple and
 * ints, their hash and the lookup were ~3% of a rank's CPU, 1 KiB all-to-all at n=4). Any
 * command that still matches its arrays may be posted, in the dict or evicted from it:
 * registrations are looked up at the post. The caller has checked the context (open,
 * nothing staged or orphaned); handle: its host_ctx, or NULL to read it from ctx. */
PyObject *fast_kept_post(PyObject *entries, PyObject **memo, PyObject *variant, PyObject *ctx,
			 struct host_ctx *handle, long long poll_ns, long long timeout_ns,
			 PyObject *src, PyObject *dst)
{
	PyObject *key, *entry = NULL, *keep, *req = NULL;
	struct kept *k;
	int rc;

	/* Ours from here: the comparisons and the post may run Python code that drops it. */
	if (memo && *memo) {
		entry = Py_NewRef(*memo);
		rc = entry_matches(entry, variant, src, dst);
		if (rc < 0)
			goto out;
		if (!rc)
			Py_CLEAR(entry);
	}
	if (!entry) {
		key = Py_BuildValue("(NN)", PyLong_FromVoidPtr(src), PyLong_FromVoidPtr(dst));
		if (!key)
			return NULL;
		entry = Py_XNewRef(PyDict_GetItemWithError(entries, key));
		Py_DECREF(key);
		if (!entry)
			return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
		rc = entry_matches(entry, variant, src, dst);
		if (rc <= 0) {
			if (!rc)
				req = Py_NewRef(Py_None);
			goto out;
		}
		if (memo)
			Py_XSETREF(*memo, Py_NewRef(entry));
	}
	k = (struct kept *)entry;
	if (!handle && !(handle = fast_ctx_handle(ctx)))
		goto out;
	if ((keep = PyTuple_Pack(2, src, dst))) {
		req = fast_post_op(ctx, handle, &k->op, timeout_ns, k->what, keep,
				   k->small ? poll_ns : 0, k->itemsize);
		Py_DECREF(keep);
	}
out:
	Py_XDECREF(entry);
	return req;
}

/* post_kept(entries, variant, ctx, poll_ns, timeout_ns, src, dst) -> Request or None:
 * fast_kept_post() for Python callers (PreparedCache.post). */
PyObject *fast_post_kept(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
	long long poll_ns, timeout_ns;

	(void)module;
	if (nargs != 7 || !PyDict_Check(args[0])) {
		PyErr_SetString(PyExc_TypeError, "post_kept(entries, variant, ctx, poll_ns, "
				"timeout_ns, src, dst)");
		return NULL;
	}
	poll_ns = PyLong_AsLongLong(args[3]);
	if (poll_ns == -1 && PyErr_Occurred())
		return NULL;
	timeout_ns = PyLong_AsLongLong(args[4]);
	if (timeout_ns == -1 && PyErr_Occurred())
		return NULL;
	return fast_kept_post(args[0], NULL, args[1], args[2], NULL, poll_ns, timeout_ns,
			      args[5], args[6]);
}

static PyObject *kept_matches(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
	int rc;

	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "matches(src, dst)");
		return NULL;
	}
	if (!((struct kept *)o)->src_ref)  /* never initialised */
		Py_RETURN_FALSE;
	rc = kept_matches_arrays((struct kept *)o, args[0], args[1]);
	return rc < 0 ? NULL : PyBool_FromLong(rc);
}

/* Both arrays still alive? (An entry to evict first when the cache is full.) */
static PyObject *kept_alive(PyObject *o, PyObject *unused)
{
	struct kept *k = (struct kept *)o;

	(void)unused;
	return PyBool_FromLong(k->src_ref && referent_alive(k->src_ref) &&
			       referent_alive(k->dst_ref));
}

static int kept_traverse(PyObject *o, visitproc visit, void *arg)
{
	struct kept *k = (struct kept *)o;

	Py_VISIT(k->src_ref);
	Py_VISIT(k->dst_ref);
	Py_VISIT(k->dtype);
	Py_VISIT(k->what);
	Py_VISIT(k->variant);
	Py_VISIT(k->itemsize);
	Py_VISIT(Py_TYPE(o));
	return 0;
}

static int kept_clear(PyObject *o)
{
	struct kept *k = (struct kept *)o;

	Py_CLEAR(k->src_ref);
	Py_CLEAR(k->dst_ref);
	Py_CLEAR(k->dtype);
	Py_CLEAR(k->what);
	Py_CLEAR(k->variant);
	Py_CLEAR(k->itemsize);
	return 0;
}

static void kept_dealloc(PyObject *o)
{
	PyTypeObject *type = Py_TYPE(o);

	PyObject_GC_UnTrack(o);
	kept_clear(o);
	type->tp_free(o);
	Py_DECREF(type);
}

static PyMemberDef kept_members[] = {
	{"what", T_OBJECT, offsetof(struct kept, what), READONLY, NULL},
	{"variant", T_OBJECT, offsetof(struct kept, variant), READONLY, NULL},
	{"itemsize", T_OBJECT, offsetof(struct kept, itemsize), READONLY, NULL},
	{"dtype", T_OBJECT, offsetof(struct kept, dtype), READONLY, NULL},
	{"small", T_INT, offsetof(struct kept, small), READONLY, NULL},
	{NULL, 0, 0, 0, NULL},
};

static PyMethodDef kept_methods[] = {
	{"matches", (PyCFunction)(void (*)(void))kept_matches, METH_FASTCALL,
	 "Still the same arrays (identity, dtype, size, address, contiguity, dst writable)?"},
	{"alive", kept_alive, METH_NOARGS, "Are both arrays still alive?"},
	{NULL, NULL, 0, NULL},
};

static PyType_Slot kept_slots[] = {
	{Py_tp_doc, "An encoded command kept for (src, dst) (offload_lib/_prepared.py)."},
	{Py_tp_init, kept_init},
	{Py_tp_new, PyType_GenericNew},
	{Py_tp_traverse, kept_traverse},
	{Py_tp_clear, kept_clear},
	{Py_tp_dealloc, kept_dealloc},
	{Py_tp_members, kept_members},
	{Py_tp_methods, kept_methods},
	{0, NULL},
};

PyType_Spec fast_kept_spec = {
	.name = "offload_lib._fast.Kept",
	.basicsize = sizeof(struct kept),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.slots = kept_slots,
};

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload_lib._fast, the module: bind() and post() (fastpath.h has the map). Built with
 * the full C API of the Python it is built for (the buffer protocol is in the limited API
 * only from 3.11 on, and this needs it on 3.10 too).
 */
#include "fastpath.h"

struct fast_binding fast;
PyTypeObject *fast_kept_type;

/* bind(post_addr, wait_addr, test_addr, done_addr, request_type): the library's functions
 * and the Python subclass the requests are made of. */
static PyObject *fast_bind(PyObject *module, PyObject *args)
{
	PyObject *post, *wait, *test, *done, *type;

	(void)module;
	if (!PyArg_ParseTuple(args, "OOOOO:bind", &post, &wait, &test, &done, &type))
		return NULL;
	if (!PyType_Check(type) || !fast.request_core ||
	    !PyType_IsSubtype((PyTypeObject *)type, fast.request_core)) {
		PyErr_SetString(PyExc_TypeError, "bind(): the fifth argument must be a "
				"subclass of RequestCore");
		return NULL;
	}
	fast.post = (fast_post_fn)PyLong_AsVoidPtr(post);
	fast.wait = (fast_wait_fn)PyLong_AsVoidPtr(wait);
	fast.test = (fast_test_fn)PyLong_AsVoidPtr(test);
	fast.done = (fast_done_fn)PyLong_AsVoidPtr(done);
	if (PyErr_Occurred())
		return NULL;
	Py_INCREF(type);
	Py_XSETREF(fast.request_type, (PyTypeObject *)type);
	Py_RETURN_NONE;
}

/* post(ctx, op_addr, timeout_ns, what, keep, poll_ns, itemsize) -> Request: post the
 * encoded host_op at op_addr (host_post copies it). */
static PyObject *fast_post(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
	struct host_ctx *handle;
	const struct host_op *op;
	long long timeout_ns, poll_ns;

	(void)module;
	if (nargs != 7) {
		PyErr_SetString(PyExc_TypeError, "post() takes 7 arguments");
		return NULL;
	}
	if (!(handle = fast_ctx_handle(args[0])))
		return NULL;
	op = PyLong_AsVoidPtr(args[1]);
	if (!op && PyErr_Occurred())
		return NULL;
	timeout_ns = PyLong_AsLongLong(args[2]);
	if (timeout_ns == -1 && PyErr_Occurred())
		return NULL;
	poll_ns = PyLong_AsLongLong(args[5]);
	if (poll_ns == -1 && PyErr_Occurred())
		return NULL;
	if (!op) {
		PyErr_SetString(PyExc_ValueError, "post(): a null context or op");
		return NULL;
	}
	return fast_post_op(args[0], handle, op, timeout_ns, args[3], args[4], poll_ns, args[6]);
}

static PyMethodDef fast_methods[] = {
	{"bind", fast_bind, METH_VARARGS,
	 "Bind the library's host_post/host_wait/host_test/host_done."},
	{"post", (PyCFunction)(void (*)(void))fast_post, METH_FASTCALL,
	 "Post a ready host_op and return its Request."},
	{"post_kept", (PyCFunction)(void (*)(void))fast_post_kept, METH_FASTCALL,
	 "Post the command kept for (src, dst); None if there is none or they changed."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef fast_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "offload_lib._fast",
	.m_doc = "A small op's Python layer in C (see offload_lib/request.py, _prepared.py).",
	.m_size = -1,
	.m_methods = fast_methods,
};

PyMODINIT_FUNC PyInit__fast(void);

PyMODINIT_FUNC PyInit__fast(void)
{
	PyObject *m = PyModule_Create(&fast_module), *request = NULL, *kept = NULL;
	PyObject *persistent = NULL, *team = NULL;
	static const struct {
		PyObject **slot;
		const char *name;
	} names[] = {
		{&fast.addr_name, "_addr"},
		{&fast.wait_slow_name, "_wait_slow"}, {&fast.test_slow_name, "_test_slow"},
		{&fast.adopt_name, "_adopt_self"}, {&fast.dtype_name, "dtype"},
		{&fast.post_slow_name, "_post_slow"}, {&fast.barrier_slow_name, "_barrier_slow"},
		{&fast.alltoall_slow_name, "_alltoall_slow"}, {&fast.barrier_name, "barrier"},
	};

	if (!m)
		return NULL;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!(*names[i].slot = PyUnicode_InternFromString(names[i].name)))
			goto fail;
	request = PyType_FromSpec(&fast_request_spec);
	kept = PyType_FromSpec(&fast_kept_spec);
	persistent = PyType_FromSpec(&fast_persistent_spec);
	team = PyType_FromSpec(&fast_team_spec);
	if (!request || !kept || !persistent || !team || !(fast.empty_tuple = PyTuple_New(0)))
		goto fail;
	fast_kept_type = (PyTypeObject *)kept;
	fast.request_core = (PyTypeObject *)request;  /* the module's reference holds it */
	Py_INCREF(kept);  /* the module's reference and ours */
	Py_INCREF(request);  /* the module's reference and ours (bind() checks against it) */
	if (PyModule_AddObject(m, "RequestCore", request) < 0)
		goto fail;
	request = NULL;
	if (PyModule_AddObject(m, "Kept", kept) < 0)
		goto fail;
	if (PyModule_AddObject(m, "PersistentCore", persistent) < 0)
		goto fail;
	persistent = NULL;
	if (PyModule_AddObject(m, "TeamCore", team) < 0)
		goto fail;
	return m;
fail:
	Py_XDECREF(team);
	Py_XDECREF(persistent);
	Py_XDECREF(request);
	Py_XDECREF(kept);
	Py_DECREF(m);
	return NULL;
}

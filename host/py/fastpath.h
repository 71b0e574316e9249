/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload_lib._fast: a small op's Python layer in C (issue 16). The pieces:
 *   request.c  the one-shot request (offload_lib.request.Request's base): wait(), test()
 *   kept.c     a command kept for the next call on the same numpy arrays, and its post
 *   persistent.c  the persistent request (PersistentRequest's base): post(), test()
 *   team.c     the team (Team's base): barrier(), and alltoall() of a kept command
 *   fastpath.c the module: bind() and post()
 * The library's functions are offload_lib._native's (their addresses come from bind()),
 * so that one copy of the library runs in the process.
 */
#ifndef DPA_OFFLOAD_FASTPATH_H
#define DPA_OFFLOAD_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "offload_host.h"

typedef int (*fast_post_fn)(struct host_ctx *, const struct host_op *, int64_t, uint32_t *);
typedef int (*fast_wait_fn)(struct host_ctx *, uint32_t, int64_t, int64_t,
			    struct host_completion *);
typedef int (*fast_test_fn)(struct host_ctx *, uint32_t, struct host_completion *);
typedef fast_test_fn fast_done_fn;

/* The module's binding, set once by bind() at import and read-only afterwards: the
 * library's entry points, the Python subclass requests are made of, interned names. */
struct fast_binding {
	fast_post_fn post;
	fast_wait_fn wait;
	fast_test_fn test;
	fast_done_fn done;  /* host_done: a look at the table, made without releasing the GIL */
	PyTypeObject *request_type; /* offload_lib.request.Request */
	PyTypeObject *request_core; /* its C base, RequestCore */
	PyObject *addr_name, *wait_slow_name, *test_slow_name, *adopt_name,
		*dtype_name, *post_slow_name, *barrier_slow_name, *alltoall_slow_name,
		*barrier_name;
	PyObject *empty_tuple;
};

extern struct fast_binding fast;
extern PyType_Spec fast_request_spec, fast_kept_spec, fast_persistent_spec, fast_team_spec;
extern PyTypeObject *fast_kept_type;

/* The raw host_ctx of a Context (its _addr); NULL with an exception set if none. */
struct host_ctx *fast_ctx_handle(PyObject *ctx);
/* Post *op on ctx and return its Request; host_post's error raised as the Python side
 * raises it (Context._check), its message "posting <what>". */
PyObject *fast_post_op(PyObject *ctx, struct host_ctx *handle, const struct host_op *op,
		       int64_t timeout_ns, PyObject *what, PyObject *keep, long long poll_ns,
		       PyObject *itemsize);
PyObject *fast_post_kept(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* The command kept in entries for (src, dst) and variant, posted (a Request), or None
 * when there is none or the arrays changed (kept.c). *memo: the last one found in entries
 * (a strong reference the caller owns; memo NULL: none). handle NULL: read from ctx. */
PyObject *fast_kept_post(PyObject *entries, PyObject **memo, PyObject *variant, PyObject *ctx,
			 struct host_ctx *handle, long long poll_ns, long long timeout_ns,
			 PyObject *src, PyObject *dst);

#endif

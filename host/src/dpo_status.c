/* SPDX-License-Identifier: Apache-2.0 */
/* Status names, the per-thread error message, datatype sizes. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dpo_internal.h"

_Static_assert((int)DPO_ERR_INVALID_PARAM == (int)OFFLOAD_ERR_INVALID, "status space");
_Static_assert((int)DPO_ERR_REMOTE_ACCESS == (int)OFFLOAD_ERR_REMOTE_ACCESS, "status space");
_Static_assert((int)DPO_ERR_PEER_FAILED == (int)OFFLOAD_ERR_PEER, "status space");
_Static_assert((int)DPO_ERR_TIMED_OUT == (int)OFFLOAD_ERR_TIMEOUT, "status space");
_Static_assert((int)DPO_ERR_NO_SPACE == (int)OFFLOAD_ERR_NO_SPACE, "status space");
_Static_assert((int)DPO_ERR_CANCELED == (int)OFFLOAD_ERR_CANCELED, "status space");
_Static_assert((int)DPO_ERR_NOT_SUPPORTED == (int)OFFLOAD_ERR_UNSUPPORTED, "status space");
_Static_assert((int)DPO_ERR_INTERNAL == (int)OFFLOAD_ERR_INTERNAL, "status space");
_Static_assert((int)DPO_ERR_PEER_OP == (int)OFFLOAD_ERR_PEER_OP, "status space");
_Static_assert((int)DPO_ERR_LINK_DOWN == (int)OFFLOAD_ERR_LINK_DOWN, "status space");
_Static_assert((int)DPO_ERR_COUNT_MISMATCH == (int)OFFLOAD_ERR_COUNT_MISMATCH, "status space");
_Static_assert((int)DPO_ERR_PEER_CLOSED == (int)OFFLOAD_ERR_PEER_CLOSED, "status space");
_Static_assert((int)DPO_ERR_MISMATCH == (int)OFFLOAD_ERR_MISMATCH, "status space");
_Static_assert(sizeof(dpo_thread_stats_t) == sizeof(struct offload_thread_stats), "stats");

static _Thread_local char last_error[512];

DPO_API const char *dpo_status_string(dpo_status_t status)
{
	switch (status) {
	case DPO_OK: return "DPO_OK";
	case DPO_INPROGRESS: return "DPO_INPROGRESS";
	case DPO_ERR_INVALID_PARAM: return "DPO_ERR_INVALID_PARAM";
	case DPO_ERR_REMOTE_ACCESS: return "DPO_ERR_REMOTE_ACCESS";
	case DPO_ERR_PEER_FAILED: return "DPO_ERR_PEER_FAILED";
	case DPO_ERR_TIMED_OUT: return "DPO_ERR_TIMED_OUT";
	case DPO_ERR_NO_SPACE: return "DPO_ERR_NO_SPACE";
	case DPO_ERR_CANCELED: return "DPO_ERR_CANCELED";
	case DPO_ERR_NOT_SUPPORTED: return "DPO_ERR_NOT_SUPPORTED";
	case DPO_ERR_INTERNAL: return "DPO_ERR_INTERNAL";
	case DPO_ERR_PEER_OP: return "DPO_ERR_PEER_OP";
	case DPO_ERR_LINK_DOWN: return "DPO_ERR_LINK_DOWN";
	case DPO_ERR_COUNT_MISMATCH: return "DPO_ERR_COUNT_MISMATCH";
	case DPO_ERR_PEER_CLOSED: return "DPO_ERR_PEER_CLOSED";
	case DPO_ERR_MISMATCH: return "DPO_ERR_MISMATCH";
	case DPO_ERR_NO_MEMORY: return "DPO_ERR_NO_MEMORY";
	case DPO_ERR_NO_RESOURCE: return "DPO_ERR_NO_RESOURCE";
	case DPO_ERR_BUSY: return "DPO_ERR_BUSY";
	case DPO_ERR_CLOSED: return "DPO_ERR_CLOSED";
	case DPO_ERR_BOOTSTRAP: return "DPO_ERR_BOOTSTRAP";
	case DPO_ERR_NO_DEVICE: return "DPO_ERR_NO_DEVICE";
	case DPO_ERR_OOB: return "DPO_ERR_OOB";
	}
	return "DPO_ERR_UNKNOWN";
}

DPO_API const char *dpo_last_error(void)
{
	return last_error;
}

void dpo_clear_error(void)
{
	last_error[0] = 0;
}

dpo_status_t dpo_fail(dpo_status_t st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return st;
}

/* A host_* call's -errno as a status, with a message that says what happened. */
dpo_status_t dpo_from_errno(int rc, const char *what)
{
	switch (rc) {
	case 0:
		return DPO_OK;
	case -EINVAL:
		return dpo_fail(DPO_ERR_INVALID_PARAM, "%s: invalid argument", what);
	case -ETIMEDOUT:
		return dpo_fail(DPO_ERR_TIMED_OUT, "%s: timed out", what);
	case -EAGAIN:
		return dpo_fail(DPO_ERR_TIMED_OUT, "%s: the command ring stayed full (raise "
				"post_timeout or ring_entries)", what);
	case -EBUSY:
		return dpo_fail(DPO_ERR_BUSY, "%s: busy (requests completed but never waited for, "
				"or memory still used by an op)", what);
	case -ENOSPC:
		return dpo_fail(DPO_ERR_NO_RESOURCE, "%s: out of registration slots", what);
	case -ENOMEM:
		return dpo_fail(DPO_ERR_NO_MEMORY, "%s: out of memory", what);
	case -ESHUTDOWN:
		return dpo_fail(DPO_ERR_CLOSED, "%s: the context is closed", what);
	case -EPROTO:
		return dpo_fail(DPO_ERR_BOOTSTRAP, "%s: the ranks disagree on the job (another job "
				"of that name, other sizes, or another build)", what);
	case -EADDRINUSE:
		return dpo_fail(DPO_ERR_BOOTSTRAP, "%s: this rank is held by a live process of "
				"the job", what);
	case -ENODEV:
	case -ENOENT:
	case -ENOEXEC:
		return dpo_fail(DPO_ERR_NO_DEVICE, "%s: the backend could not be opened (%s)", what,
				strerror(-rc));
	case -EOPNOTSUPP:
		return dpo_fail(DPO_ERR_NOT_SUPPORTED, "%s: not supported by this backend", what);
	default:
		return dpo_fail(DPO_ERR_INTERNAL, "%s: %s", what, strerror(-rc));
	}
}

DPO_API size_t dpo_dt_size(dpo_datatype_t dt)
{
	switch (dt) {
	case DPO_DT_INT8: case DPO_DT_UINT8: return 1;
	case DPO_DT_INT16: case DPO_DT_UINT16: case DPO_DT_FLOAT16: case DPO_DT_BFLOAT16: return 2;
	case DPO_DT_INT32: case DPO_DT_UINT32: case DPO_DT_FLOAT32: return 4;
	case DPO_DT_INT64: case DPO_DT_UINT64: case DPO_DT_FLOAT64: case DPO_DT_COMPLEX64: return 8;
	case DPO_DT_COMPLEX128: return 16;
	}
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's libflexio (fxm_flexio.c has the rest): event handlers (a DPA thread that
 * runs the handler when its CQ raises an event) and RPCs (flexio_process_call runs a
 * function of the image on a thread of its own and returns its result).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fxm_dpa.h"

/* ------------------------------------------------------------------ event handlers and RPC */

flexio_status flexio_event_handler_create(struct flexio_process *process,
					  struct flexio_event_handler_attr *fattr,
					  struct flexio_event_handler **event_handler_ptr)
{
	const struct fxm_func *f;
	struct fxm_eh *eh;

	if (!process || !fattr || !event_handler_ptr)
		return FLEXIO_STATUS_FAILED;
	f = fxm_func_of(process->app, fattr->host_stub_func);
	if (!f)
		return fxm_flexio_fail("flexio_event_handler_create: %s", "the stub is not a function of the app");
	eh = calloc(1, sizeof(*eh));
	if (!eh)
		return FLEXIO_STATUS_FAILED;
	eh->proc = process;
	eh->func = (void (*)(uint64_t))fxm_dev_symbol(process, f->name);
	eh->arg = fattr->arg;
	if (!eh->func) {
		free(eh);
		return fxm_flexio_fail("flexio_event_handler_create: '%s' is not in the DPA image", f->name);
	}
	pthread_mutex_lock(&process->lock);
	eh->id = process->next_eh++;
	pthread_mutex_unlock(&process->lock);
	if (fxm_eh_start(eh)) {
		free(eh);
		return FLEXIO_STATUS_FAILED;
	}
	pthread_mutex_lock(&process->lock);
	eh->next = process->ehs;
	process->ehs = eh;
	pthread_mutex_unlock(&process->lock);
	*event_handler_ptr = (struct flexio_event_handler *)eh;
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_event_handler_destroy(struct flexio_event_handler *event_handler)
{
	struct fxm_eh *eh = (struct fxm_eh *)event_handler;
	struct flexio_process *p;

	if (!eh)
		return FLEXIO_STATUS_FAILED;
	p = eh->proc;
	pthread_mutex_lock(&p->lock);
	for (struct fxm_eh **pp = &p->ehs; *pp; pp = &(*pp)->next)
		if (*pp == eh) {
			*pp = eh->next;
			break;
		}
	pthread_mutex_unlock(&p->lock);
	/* Detach it from its CQs first: an event must not find it half gone. */
	pthread_mutex_lock(&fxm.lock);
	for (struct fxm_cq *cq = fxm.cqs; cq; cq = cq->next)
		if (cq->eh == eh) {
			pthread_mutex_lock(&cq->lock);
			cq->eh = NULL;
			pthread_mutex_unlock(&cq->lock);
		}
	pthread_mutex_unlock(&fxm.lock);
	fxm_nic_quiesce();
	fxm_eh_stop(eh);
	free(eh);
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_event_handler_run(struct flexio_event_handler *event_handler,
				       uint64_t user_arg)
{
	struct fxm_eh *eh = (struct fxm_eh *)event_handler;
	flexio_status st = FLEXIO_STATUS_SUCCESS;
	const char *delay = getenv("FXM_DELAY_RUN_MS");

	if (!eh)
		return FLEXIO_STATUS_FAILED;
	/* Timing perturbation for tests: a host that is slow to start its handlers (what
	 * other processes see of a busy machine). */
	if (delay && *delay) {
		struct timespec ts = { 0, (long)(atoi(delay) % 1000) * 1000000l };

		nanosleep(&ts, NULL);
	}
	pthread_mutex_lock(&eh->mu);
	if (eh->state != EH_CREATED)
		st = FLEXIO_STATUS_FAILED;
	else {
		/* Running, not invoked: the first CQE of its CQ invokes it. */
		eh->arg = user_arg;
		eh->state = EH_RUNNING;
	}
	pthread_mutex_unlock(&eh->mu);
	return st;
}

struct flexio_thread *flexio_event_handler_get_thread(struct flexio_event_handler *event_handler)
{
	return (struct flexio_thread *)event_handler;
}

uint32_t flexio_event_handler_get_id(struct flexio_event_handler *event_handler)
{
	return event_handler ? ((struct fxm_eh *)event_handler)->id : UINT32_MAX;
}

flexio_status flexio_process_call(struct flexio_process *process, flexio_func_t *host_func,
				  uint64_t *func_ret, ...)
{
	const struct fxm_func *f;
	void *argbuf;
	va_list ap;
	int rc;

	if (!process || !func_ret)
		return FLEXIO_STATUS_FAILED;
	if (process->err != FLEXIO_DEV_NO_ERROR)
		return fxm_flexio_fail("flexio_process_call: %s", "the DPA process stopped with an error");
	f = fxm_func_of(process->app, host_func);
	if (!f || !f->pack)
		return fxm_flexio_fail("flexio_process_call: %s", "the stub is not an RPC of the app");
	argbuf = calloc(1, f->argbuf_size ? f->argbuf_size : 8);
	if (!argbuf)
		return FLEXIO_STATUS_FAILED;
	va_start(ap, func_ret);
	f->pack(argbuf, ap);
	va_end(ap);
	process->rpcs++;
	rc = fxm_rpc(process, f, argbuf, func_ret);
	free(argbuf);
	return rc ? FLEXIO_STATUS_FAILED : FLEXIO_STATUS_SUCCESS;
}

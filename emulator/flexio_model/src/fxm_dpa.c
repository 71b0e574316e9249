/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's DPA: the device API a DPA program calls (flexio_dev_*, the outbox
 * doorbells, windows, dpaintrin) and the "OS" that runs event handlers.
 *
 * Event handlers, as NVIDIA documents them: created in the init state; run() moves one to
 * the running state without invoking it ("Event handlers in the running state may be
 * invoked by an incoming CQE. On other states, the invocation is blocked and lost", FlexIO
 * sample host code); each event of a CQ attached to it invokes it from the start with the
 * argument run() gave; flexio_dev_thread_reschedule() ends the invocation ("For the next
 * DUAR the thread will restart from the beginning"), flexio_dev_thread_finish() ends it
 * for good. One invocation of a handler at a time: an event that comes while it runs is
 * kept and invokes it again once it rescheduled (NVIDIA's samples arm and reschedule
 * without looking at the CQ again, which only works if such an event is kept).
 * Each handler runs on a host thread of its own; an RPC (flexio_process_call) on a thread
 * made for the call.
 *
 * A DPA thread that calls flexio_dev_error(), returns from its handler, or misuses the
 * outbox stops the whole process: flexio_err_status_get() reports it, no handler runs
 * again, and flexio_crash_data() prints what happened.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libflexio-dev/flexio_dev.h>
#include <libflexio-dev/flexio_dev_err.h>
#include <libflexio-dev/flexio_dev_dpa_arch.h>
#include <dpaintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "fxm_dpa.h"

enum { EXIT_NONE = 0, EXIT_RESCHEDULE, EXIT_FINISH, EXIT_ERROR };

static __thread struct fxm_dpa_thread *cur;

/* ------------------------------------------------------------------ process errors */

void fxm_proc_error(struct flexio_process *proc, enum flexio_err_status err, uint8_t code,
		    const char *what)
{
	uint64_t one = 1;

	pthread_mutex_lock(&proc->lock);
	if (proc->err == FLEXIO_DEV_NO_ERROR) {
		proc->err = err;
		proc->err_code = code;
		snprintf(proc->err_what, sizeof(proc->err_what), "%s", what);
		fxm_log("DPA process of app '%s' stopped: %s (status 0x%x)", proc->app->name, what,
			code);
		if (write(proc->errfd, &one, sizeof(one)) < 0)
			fxm_log("error fd: %s", strerror(errno));
	}
	pthread_mutex_unlock(&proc->lock);
}

/* Leave the current invocation (the DPA thread gives its execution unit back). */
static void __attribute__((noreturn)) dpa_exit(int reason)
{
	cur->exit_reason = reason;
	siglongjmp(cur->jmp, 1);
}

static struct fxm_dpa_thread *dpa_self(const char *call)
{
	if (!cur) {
		fxm_log("%s called outside a DPA thread", call);
		abort();
	}
	/* A process that stopped, or a handler being destroyed, runs no further. */
	if (cur->proc->err != FLEXIO_DEV_NO_ERROR || (cur->eh && cur->eh->stop))
		dpa_exit(EXIT_ERROR);
	return cur;
}

static void __attribute__((noreturn)) dpa_fault(const char *what)
{
	fxm_proc_error(cur->proc, FLEXIO_DEV_FATAL_ERROR, 0x41, what);
	dpa_exit(EXIT_ERROR);
}

/* ------------------------------------------------------------------ threads */

int flexio_dev_get_thread_ctx(struct flexio_dev_thread_ctx **dtctx)
{
	*dtctx = (struct flexio_dev_thread_ctx *)dpa_self("flexio_dev_get_thread_ctx");
	return 0;
}

uint32_t flexio_dev_get_thread_id(struct flexio_dev_thread_ctx *dtctx)
{
	struct fxm_dpa_thread *t = (struct fxm_dpa_thread *)dtctx;

	return t && t->eh ? t->eh->id : 0;
}

void flexio_dev_thread_reschedule(void)
{
	dpa_self("flexio_dev_thread_reschedule");
	dpa_exit(EXIT_RESCHEDULE);
}

void flexio_dev_thread_finish(void)
{
	dpa_self("flexio_dev_thread_finish");
	dpa_exit(EXIT_FINISH);
}

void flexio_dev_thread_retrigger(void)
{
	struct fxm_dpa_thread *t = dpa_self("flexio_dev_thread_retrigger");

	if (t->eh) {
		pthread_mutex_lock(&t->eh->mu);
		t->eh->triggered = 1;
		pthread_mutex_unlock(&t->eh->mu);
	}
	dpa_exit(EXIT_RESCHEDULE);
}

/* The model ends the calling thread only; the SDK stops every thread of the process
 * (status 0x40). Nothing here calls it. */
void flexio_dev_process_finish(void)
{
	dpa_self("flexio_dev_process_finish");
	dpa_exit(EXIT_FINISH);
}

void flexio_dev_error(uint8_t error)
{
	char what[64];

	dpa_self("flexio_dev_error");
	/* User codes are 129..255 (the SDK header; it also says 0x80): anything else is
	 * replaced by the illegal-code error. */
	snprintf(what, sizeof(what), "flexio_dev_error(0x%x)", error);
	fxm_proc_error(cur->proc, FLEXIO_DEV_USER_ERROR,
		       error > 0x80 ? error : (uint8_t)FLEXIO_DEV_ERROR_ILLEGAL_ERR, what);
	dpa_exit(EXIT_ERROR);
}

void flexio_dev_event_handler_activate(uint32_t activation_id)
{
	struct fxm_dpa_thread *t = dpa_self("flexio_dev_event_handler_activate");
	struct fxm_eh *eh;

	pthread_mutex_lock(&t->proc->lock);
	for (eh = t->proc->ehs; eh && eh->id != activation_id; eh = eh->next)
		;
	pthread_mutex_unlock(&t->proc->lock);
	if (!eh)
		dpa_fault("flexio_dev_event_handler_activate of an unknown handler");
	fxm_eh_trigger(eh);
}

/* ------------------------------------------------------------------ windows */

/*
 * A window reaches host memory through the registration its mkey names: the key must be
 * an ibv_reg_mr of the window's protection domain, and an address outside that
 * registration cannot be acquired. An implicit on-demand-paging key is refused: every
 * NVIDIA sample configures a window with the key of a regular registration of the buffer
 * it reads, and nothing documents that a window walks ODP page faults; the stricter
 * reading. The model maps a window linearly (device address = host address): it cannot
 * catch a pointer used past the range it was acquired for, or on another thread.
 */
flexio_dev_status_t flexio_dev_multi_window_config(enum flexio_window_entity win_entity,
						   uint16_t window_config_id, uint32_t mkey)
{
	struct fxm_dpa_thread *t = dpa_self("flexio_dev_window_config");
	struct flexio_window *w = NULL;
	struct fxm_mr *mr;
	int ok;

	if ((unsigned)win_entity >= FLEXIO_DEV_WINDOW_ENTITY_NUM)
		return FLEXIO_DEV_STATUS_FAILED;
	if (window_config_id < FXM_MAX_WINDOWS)
		w = t->proc->windows[window_config_id];
	pthread_mutex_lock(&fxm.lock);
	mr = fxm_mr_find_locked(mkey);
	ok = w && mr && mr->pd == w->pd && mr->kind == FXM_MR_HOST;
	pthread_mutex_unlock(&fxm.lock);
	if (!ok) {
		fxm_log("flexio_dev_window_config(entity %d, window %u, mkey 0x%x) refused: %s",
			win_entity, window_config_id, mkey,
			!w ? "no such window" : !mr ? "no such key" : mr->pd != w->pd ?
			"the key is not of the window's protection domain" :
			"the key is not a registration of host memory (implicit ODP or device memory)");
		return FLEXIO_DEV_STATUS_FAILED;
	}
	t->entity[win_entity].window_id = window_config_id;
	t->entity[win_entity].mkey = mkey;
	return FLEXIO_DEV_STATUS_SUCCESS;
}

flexio_dev_status_t flexio_dev_multi_window_mkey_config(enum flexio_window_entity win_entity,
							uint32_t mkey)
{
	struct fxm_dpa_thread *t = dpa_self("flexio_dev_window_mkey_config");

	if ((unsigned)win_entity >= FLEXIO_DEV_WINDOW_ENTITY_NUM || !t->entity[win_entity].mkey)
		return FLEXIO_DEV_STATUS_FAILED;
	return flexio_dev_multi_window_config(win_entity,
					      (uint16_t)t->entity[win_entity].window_id, mkey);
}

flexio_dev_status_t flexio_dev_multi_window_ptr_acquire(enum flexio_window_entity win_entity,
							uint64_t haddr, flexio_uintptr_t *daddr)
{
	struct fxm_dpa_thread *t = dpa_self("flexio_dev_window_ptr_acquire");
	struct fxm_mr *mr;
	int ok;

	if ((unsigned)win_entity >= FLEXIO_DEV_WINDOW_ENTITY_NUM || !t->entity[win_entity].mkey)
		return FLEXIO_DEV_STATUS_FAILED;
	pthread_mutex_lock(&fxm.lock);
	mr = fxm_mr_find_locked(t->entity[win_entity].mkey);
	ok = mr && haddr >= mr->addr && haddr - mr->addr < mr->len;
	pthread_mutex_unlock(&fxm.lock);
	if (!ok)
		return FLEXIO_DEV_STATUS_FAILED;
	*daddr = haddr;
	return FLEXIO_DEV_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ the outbox */

static struct fxm_qp *my_qp(uint32_t qpn)
{
	struct fxm_qp *qp;

	pthread_mutex_lock(&fxm.lock);
	qp = fxm_qp_find_locked(qpn);
	pthread_mutex_unlock(&fxm.lock);
	return qp && qp->dpa && qp->proc == cur->proc ? qp : NULL;
}

static struct fxm_cq *my_cq(uint32_t cqn)
{
	struct fxm_cq *cq;

	pthread_mutex_lock(&fxm.lock);
	cq = fxm_cq_find_locked(cqn);
	pthread_mutex_unlock(&fxm.lock);
	return cq && !cq->host && ((struct flexio_cq *)cq)->proc == cur->proc ? cq : NULL;
}

void __fxm_outbox_sq_db(uint16_t pi, uint32_t qnum)
{
	struct fxm_qp *qp;

	dpa_self("flexio_dev_qp_sq_ring_db");
	qp = my_qp(qnum);
	if (!qp) {
		if (cur->proc->closing)
			return;   /* the host tears the queues down */
		dpa_fault("SQ doorbell for a QP that is not this process's");
	}
	fxm_nic_doorbell(qp, pi);
}

void __fxm_outbox_cq_arm(uint32_t ci, uint32_t qnum)
{
	struct fxm_cq *cq;

	dpa_self("flexio_dev_cq_arm");
	cq = my_cq(qnum);
	if (!cq) {
		if (cur->proc->closing)
			return;
		dpa_fault("CQ arm of a CQ that is not this process's");
	}
	fxm_cq_arm(cq, ci);
}

void __fxm_outbox_zcqe(uint32_t cqn)
{
	static const struct fxm_cqe_info zero;
	struct fxm_cq *cq;

	dpa_self("flexio_dev_zcqe_gen");
	cq = my_cq(cqn);
	if (!cq) {
		if (cur->proc->closing)
			return;
		dpa_fault("zero CQE on a CQ that is not this process's");
	}
	fxm_cq_push(cq, &zero);
}

/* ------------------------------------------------------------------ dpaintrin */

void __dpa_thread_fence_internal_1_3(int memory_space, int pred_op, int succ_op)
{
	(void)memory_space, (void)pred_op, (void)succ_op;
	dpa_self("__dpa_thread_fence");
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

uint64_t __dpa_thread_time_internal_1_3(void)
{
	dpa_self("__dpa_thread_time");
	return fxm_now_ns() / 1000u;
}

uint64_t __dpa_thread_cycles_internal_1_3(void)
{
	dpa_self("__dpa_thread_cycles");
	return fxm_now_ns() * 9u / 5u;   /* an 1.8 GHz execution unit */
}

uint64_t __dpa_thread_inst_ret_internal_1_3(void)
{
	return __dpa_thread_cycles_internal_1_3();
}

/* ------------------------------------------------------------------ event handlers */

void fxm_eh_trigger(struct fxm_eh *eh)
{
	pthread_mutex_lock(&eh->mu);
	if (eh->state == EH_RUNNING && eh->proc->err == FLEXIO_DEV_NO_ERROR) {
		eh->triggered = 1;
		pthread_cond_signal(&eh->cv);
	}
	pthread_mutex_unlock(&eh->mu);
}

static int invoke(struct fxm_dpa_thread *t, void (*func)(uint64_t), uint64_t arg)
{
	t->exit_reason = EXIT_NONE;
	memset(t->entity, 0, sizeof(t->entity));
	cur = t;
	if (!sigsetjmp(t->jmp, 0)) {
		func(arg);
		/* "On handler function end, need to call flexio_dev_process_finish() [or
		 * reschedule / finish] instead of a regular return statement" (SDK). */
		fxm_proc_error(t->proc, FLEXIO_DEV_FATAL_ERROR, 0x41,
			       "an event handler returned instead of rescheduling or finishing");
		t->exit_reason = EXIT_ERROR;
	}
	cur = NULL;
	return t->exit_reason;
}

static void *eh_main(void *arg)
{
	struct fxm_eh *eh = arg;
	char name[16];

	snprintf(name, sizeof(name), "dpa-eh-%u", eh->id);
	pthread_setname_np(pthread_self(), name);
	for (;;) {
		int reason;

		pthread_mutex_lock(&eh->mu);
		while (!eh->stop && !(eh->triggered && eh->state == EH_RUNNING))
			pthread_cond_wait(&eh->cv, &eh->mu);
		if (eh->stop) {
			pthread_mutex_unlock(&eh->mu);
			break;
		}
		eh->triggered = 0;
		eh->executing = 1;
		pthread_mutex_unlock(&eh->mu);
		reason = invoke(&eh->dt, eh->func, eh->arg);
		pthread_mutex_lock(&eh->mu);
		eh->executing = 0;
		eh->invocations++;
		if (reason != EXIT_RESCHEDULE)
			eh->state = EH_FINISHED;
		pthread_cond_broadcast(&eh->cv);
		pthread_mutex_unlock(&eh->mu);
	}
	return NULL;
}

int fxm_eh_start(struct fxm_eh *eh)
{
	pthread_mutex_init(&eh->mu, NULL);
	pthread_cond_init(&eh->cv, NULL);
	eh->dt.proc = eh->proc;
	eh->dt.eh = eh;
	return pthread_create(&eh->thread, NULL, eh_main, eh) ? -1 : 0;
}

void fxm_eh_stop(struct fxm_eh *eh)
{
	pthread_mutex_lock(&eh->mu);
	eh->stop = 1;
	pthread_cond_broadcast(&eh->cv);
	pthread_mutex_unlock(&eh->mu);
	/* A running invocation leaves at its next call into the runtime (dpa_self). */
	pthread_join(eh->thread, NULL);
	pthread_mutex_destroy(&eh->mu);
	pthread_cond_destroy(&eh->cv);
}

/* ------------------------------------------------------------------ RPC */

struct rpc {
	struct fxm_dpa_thread t;
	const struct fxm_func *f;
	void *argbuf;
	uint64_t ret;
	int ok;
};

static void *rpc_main(void *arg)
{
	struct rpc *r = arg;
	uint64_t (*unpack)(void *, void *) =
		(uint64_t (*)(void *, void *))fxm_dev_symbol(r->t.proc, r->f->unpack);
	void *func = fxm_dev_symbol(r->t.proc, r->f->name);

	pthread_setname_np(pthread_self(), "dpa-rpc");
	if (!unpack || !func) {
		fxm_proc_error(r->t.proc, FLEXIO_DEV_FATAL_ERROR, 0x41, "RPC function not in the image");
		return NULL;
	}
	cur = &r->t;
	if (!sigsetjmp(r->t.jmp, 0)) {
		r->ret = unpack(r->argbuf, func);
		r->ok = 1;
	}
	cur = NULL;
	return NULL;
}

int fxm_rpc(struct flexio_process *proc, const struct fxm_func *f, void *argbuf, uint64_t *ret)
{
	struct rpc r;
	pthread_t th;

	memset(&r, 0, sizeof(r));
	r.t.proc = proc;
	r.f = f;
	r.argbuf = argbuf;
	if (pthread_create(&th, NULL, rpc_main, &r))
		return -1;
	pthread_join(th, NULL);
	if (!r.ok)
		return -1;
	*ret = r.ret;
	return 0;
}

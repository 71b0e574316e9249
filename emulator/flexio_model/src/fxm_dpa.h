/* SPDX-License-Identifier: Apache-2.0 */
/* The FlexIO model's DPA side: processes, event handlers and the threads that run them
 * (fxm_dpa.c), shared with the host API (fxm_flexio.c). */
#ifndef FXM_DPA_H
#define FXM_DPA_H

#include <libflexio/flexio.h>
#include <setjmp.h>

#include "fxm.h"

#define FXM_MAX_FUNCS   64u
#define FXM_MAX_WINDOWS 64u

struct fxm_func {
	flexio_func_t *stub;
	char name[FLEXIO_MAX_NAME_LEN + 1];
	char unpack[FLEXIO_MAX_NAME_LEN + 1];
	size_t argbuf_size;
	flexio_func_arg_pack_fn_t *pack;
};

struct flexio_app {
	char name[FLEXIO_MAX_NAME_LEN + 1];
	uint8_t *elf;
	size_t elf_size;
	struct fxm_func funcs[FXM_MAX_FUNCS];
	uint32_t nfuncs;
	struct flexio_app *next;
};

struct flexio_uar {
	uint32_t id;
	struct flexio_process *proc;
};

struct flexio_window {
	uint32_t id;
	struct fxm_pd *pd;
	struct flexio_process *proc;
};

struct flexio_mkey {
	struct fxm_mr *mr;
};

/* What a DPA thread (an event handler's invocation, or an RPC) has configured. */
struct fxm_dpa_thread {
	struct flexio_process *proc;
	struct fxm_eh *eh;          /* NULL for an RPC */
	struct {
		uint32_t window_id;
		uint32_t mkey;          /* 0: not configured */
	} entity[2];
	sigjmp_buf jmp;
	int exit_reason;
};

enum fxm_eh_state { EH_CREATED = 0, EH_RUNNING, EH_FINISHED };

struct fxm_eh {
	struct flexio_process *proc;
	uint32_t id;
	void (*func)(uint64_t);
	uint64_t arg;
	int state;
	int triggered;
	int executing;
	int stop;
	uint64_t invocations;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct fxm_dpa_thread dt;
	struct fxm_eh *next;
};

struct flexio_process {
	struct flexio_app *app;
	struct ibv_context *ibv;
	struct fxm_pd *pd;
	struct ibv_pd *own_pd;
	void *dl;
	uint8_t *heap;
	size_t heap_size, heap_used;
	struct flexio_uar uar;
	pthread_mutex_t lock;
	enum flexio_err_status err;
	uint8_t err_code;
	char err_what[256];
	int errfd;
	int closing;
	uint32_t next_eh, next_window;
	struct flexio_window *windows[FXM_MAX_WINDOWS];
	struct fxm_eh *ehs;
	uint64_t rpcs;
};

struct flexio_cq {
	struct fxm_cq cq;
	struct flexio_process *proc;
};

struct flexio_qp {
	struct fxm_qp qp;
	struct flexio_process *proc;
};

/* fxm_dpa.c */
int fxm_heap_range(const struct flexio_process *proc, uint64_t daddr, uint64_t len);
void fxm_proc_error(struct flexio_process *proc, enum flexio_err_status err, uint8_t code,
		    const char *what);
int fxm_eh_start(struct fxm_eh *eh);
void fxm_eh_stop(struct fxm_eh *eh);
int fxm_rpc(struct flexio_process *proc, const struct fxm_func *f, void *argbuf, uint64_t *ret);
const struct fxm_func *fxm_func_of(const struct flexio_app *app, flexio_func_t *stub);
void *fxm_dev_symbol(struct flexio_process *proc, const char *name);
/* Log what failed (fmt names it with %s: what) and answer FLEXIO_STATUS_FAILED. */
flexio_status fxm_flexio_fail(const char *fmt, const char *what);

#endif

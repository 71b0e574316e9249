/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's libflexio (host API): applications registered by dpacc's generated code,
 * DPA processes (the image loaded into this process with its own heap), heap buffers and
 * copies, CQs and QPs in DPA memory, windows, device mkeys, event handlers and RPCs.
 *
 * Where NVIDIA's documentation leaves a choice, the model takes the stricter one, and the
 * comment says so: flexio_version_set() must come first (FlexIO 25.x samples call it
 * before anything else); heap memory is not zeroed; CQs, QPs and windows must name this
 * process's UAR and memory; queue memory must lie inside the heap.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fxm_dpa.h"

#define FXM_HEAP_DEFAULT (256ull << 20)

static struct flexio_app *apps;
static struct flexio_process *procs[16];   /* for fxm_dump_dpa */
static pthread_mutex_t apps_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t version_used;
static uint32_t next_uar = 1;

flexio_status fxm_flexio_fail(const char *fmt, const char *what)
{
	fxm_log(fmt, what);
	return FLEXIO_STATUS_FAILED;
}

/* ------------------------------------------------------------------ versions and apps */

flexio_status flexio_version_set(uint64_t version)
{
	if (version < FLEXIO_LAST_SUPPORTED_VERSION || version > FLEXIO_CURRENT_VERSION) {
		fxm_log("flexio_version_set(%u.%u.%u): this FlexIO implements 24.10 to 25.1",
			(unsigned)(version >> 24), (unsigned)(version >> 16) & 0xff,
			(unsigned)version & 0xffff);
		return FLEXIO_STATUS_FAILED;
	}
	__atomic_store_n(&version_used, version, __ATOMIC_RELEASE);
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_app_create(struct flexio_app_attr *fattr, struct flexio_app **app)
{
	struct flexio_app *a;

	if (!fattr || !fattr->app_name || !fattr->app_ptr || !fattr->app_bsize || !app)
		return FLEXIO_STATUS_FAILED;
	a = calloc(1, sizeof(*a));
	if (!a || !(a->elf = malloc(fattr->app_bsize))) {
		free(a);
		return FLEXIO_STATUS_FAILED;
	}
	snprintf(a->name, sizeof(a->name), "%s", fattr->app_name);
	memcpy(a->elf, fattr->app_ptr, fattr->app_bsize);
	a->elf_size = fattr->app_bsize;
	pthread_mutex_lock(&apps_lock);
	a->next = apps;
	apps = a;
	pthread_mutex_unlock(&apps_lock);
	*app = a;
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_app_destroy(struct flexio_app *app)
{
	pthread_mutex_lock(&apps_lock);
	for (struct flexio_app **pp = &apps; *pp; pp = &(*pp)->next)
		if (*pp == app) {
			*pp = app->next;
			break;
		}
	pthread_mutex_unlock(&apps_lock);
	free(app->elf);
	free(app);
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_app_get(struct flexio_app_select_attr *fattr, struct flexio_app **app)
{
	struct flexio_app *a;

	if (!fattr || !fattr->app_name || !app)
		return FLEXIO_STATUS_FAILED;
	if (!__atomic_load_n(&version_used, __ATOMIC_ACQUIRE))
		return fxm_flexio_fail("flexio_app_get(%s) before flexio_version_set()", fattr->app_name);
	pthread_mutex_lock(&apps_lock);
	for (a = apps; a && strcmp(a->name, fattr->app_name); a = a->next)
		;
	pthread_mutex_unlock(&apps_lock);
	if (!a)
		return fxm_flexio_fail("flexio_app_get: no application '%s' (was it linked in?)", fattr->app_name);
	*app = a;
	return FLEXIO_STATUS_SUCCESS;
}

const char *flexio_app_get_name(struct flexio_app *app)
{
	return app ? app->name : NULL;
}

flexio_status flexio_func_pup_register(struct flexio_app *app, const char *dev_func_name,
				       const char *dev_unpack_func_name,
				       flexio_func_t *host_stub_func_addr, size_t argbuf_size,
				       flexio_func_arg_pack_fn_t *host_pack_func)
{
	struct fxm_func *f;

	if (!app || !dev_func_name || !host_stub_func_addr || app->nfuncs == FXM_MAX_FUNCS ||
	    strlen(dev_func_name) > FLEXIO_MAX_NAME_LEN ||
	    (dev_unpack_func_name && strlen(dev_unpack_func_name) > FLEXIO_MAX_NAME_LEN))
		return FLEXIO_STATUS_FAILED;
	f = &app->funcs[app->nfuncs++];
	f->stub = host_stub_func_addr;
	snprintf(f->name, sizeof(f->name), "%s", dev_func_name);
	snprintf(f->unpack, sizeof(f->unpack), "%s", dev_unpack_func_name ? dev_unpack_func_name : "");
	f->argbuf_size = argbuf_size;
	f->pack = host_pack_func;
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_func_register(struct flexio_app *app, const char *dev_func_name,
				   flexio_func_t **out_func)
{
	(void)app, (void)dev_func_name, (void)out_func;
	return fxm_flexio_fail("%s: not modelled (dpacc's pack/unpack registration is)", "flexio_func_register");
}

const struct fxm_func *fxm_func_of(const struct flexio_app *app, flexio_func_t *stub)
{
	for (uint32_t i = 0; i < app->nfuncs; i++)
		if (app->funcs[i].stub == stub)
			return &app->funcs[i];
	return NULL;
}

/* ------------------------------------------------------------------ processes */

/* The image is a shared object: loaded from a memory file, so each process gets its own
 * copy of the device program's data, as each DPA process does. */
static void *load_image(const struct flexio_app *app)
{
	char path[64];
	void *dl = NULL;
	int fd = memfd_create(app->name, MFD_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (write(fd, app->elf, app->elf_size) == (ssize_t)app->elf_size) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!dl)
			fxm_log("loading the DPA image of '%s': %s", app->name, dlerror());
	}
	close(fd);
	return dl;
}

void *fxm_dev_symbol(struct flexio_process *proc, const char *name)
{
	return name && *name ? dlsym(proc->dl, name) : NULL;
}

flexio_status flexio_process_create(struct ibv_context *ibv_ctx, struct flexio_app *app,
				    const struct flexio_process_attr *process_attr,
				    struct flexio_process **process_ptr)
{
	struct flexio_process *p;
	const char *heap_env = getenv("FXM_HEAP_BYTES");

	if (!ibv_ctx || !app || !process_ptr)
		return FLEXIO_STATUS_FAILED;
	/* FlexIO 25.x: "Set current version for API" before anything else (every NVIDIA
	 * sample of 25.x does); the model refuses to guess one. */
	if (!__atomic_load_n(&version_used, __ATOMIC_ACQUIRE))
		return fxm_flexio_fail("flexio_process_create(%s): flexio_version_set() was not called; FlexIO "
			    "25.x needs the API version the host code was built for", app->name);
	p = calloc(1, sizeof(*p));
	if (!p)
		return FLEXIO_STATUS_FAILED;
	p->app = app;
	p->ibv = ibv_ctx;
	pthread_mutex_init(&p->lock, NULL);
	p->errfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	p->heap_size = heap_env ? strtoull(heap_env, NULL, 0) : FXM_HEAP_DEFAULT;
	p->heap = mmap(NULL, p->heap_size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p->heap == MAP_FAILED)
		p->heap = NULL;
	if (process_attr && process_attr->pd) {
		p->pd = to_fxm_pd(process_attr->pd);
	} else {
		p->own_pd = ibv_alloc_pd(ibv_ctx);
		p->pd = p->own_pd ? to_fxm_pd(p->own_pd) : NULL;
	}
	p->dl = p->heap && p->pd && p->errfd >= 0 ? load_image(app) : NULL;
	if (!p->dl) {
		if (p->heap)
			munmap(p->heap, p->heap_size);
		if (p->own_pd)
			ibv_dealloc_pd(p->own_pd);
		if (p->errfd >= 0)
			close(p->errfd);
		free(p);
		return FLEXIO_STATUS_FAILED;
	}
	pthread_mutex_lock(&fxm.lock);
	p->pd->refs++;
	p->uar.id = next_uar++;
	pthread_mutex_unlock(&fxm.lock);
	p->uar.proc = p;
	pthread_mutex_lock(&apps_lock);
	for (uint32_t i = 0; i < 16; i++)
		if (!procs[i]) {
			procs[i] = p;
			break;
		}
	pthread_mutex_unlock(&apps_lock);
	*process_ptr = p;
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_process_destroy(struct flexio_process *p)
{
	if (!p)
		return FLEXIO_STATUS_SUCCESS;
	pthread_mutex_lock(&apps_lock);
	for (uint32_t i = 0; i < 16; i++)
		if (procs[i] == p)
			procs[i] = NULL;
	pthread_mutex_unlock(&apps_lock);
	p->closing = 1;
	while (p->ehs)
		flexio_event_handler_destroy((struct flexio_event_handler *)p->ehs);
	for (uint32_t i = 0; i < FXM_MAX_WINDOWS; i++)
		if (p->windows[i])
			flexio_window_destroy(p->windows[i]);
	fxm_nic_quiesce();
	dlclose(p->dl);
	munmap(p->heap, p->heap_size);
	pthread_mutex_lock(&fxm.lock);
	p->pd->refs--;
	pthread_mutex_unlock(&fxm.lock);
	if (p->own_pd)
		ibv_dealloc_pd(p->own_pd);
	close(p->errfd);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return FLEXIO_STATUS_SUCCESS;
}

struct flexio_uar *flexio_process_get_uar(struct flexio_process *process)
{
	return process ? &process->uar : NULL;
}

uint32_t flexio_uar_get_id(struct flexio_uar *uar)
{
	return uar ? uar->id : UINT32_MAX;
}

struct ibv_pd *flexio_process_get_pd(struct flexio_process *process)
{
	return process ? &process->pd->ibv : NULL;
}

int flexio_err_handler_fd(struct flexio_process *process)
{
	return process ? process->errfd : -1;
}

enum flexio_err_status flexio_err_status_get(struct flexio_process *process)
{
	return process ? __atomic_load_n(&process->err, __ATOMIC_ACQUIRE) : FLEXIO_DEV_NO_ERROR;
}

flexio_status flexio_crash_data(struct flexio_process *process, const char *outfile)
{
	char path[512];
	FILE *f;

	if (!process)
		return FLEXIO_STATUS_FAILED;
	if (outfile && *outfile)
		snprintf(path, sizeof(path), "%s.%d.crash", outfile, (int)getpid());
	else
		snprintf(path, sizeof(path), "/tmp/flexio_dev.%d.crash", (int)getpid());
	printf("FlexIO model crash data: app %s, status %d, code 0x%x: %s\n", process->app->name,
	       (int)process->err, process->err_code, process->err_what);
	f = fopen(path, "w");
	if (!f)
		return FLEXIO_STATUS_FAILED;
	fprintf(f, "app: %s\nstatus: %d\ncode: 0x%x\nwhat: %s\nrpcs: %llu\n", process->app->name,
		(int)process->err, process->err_code, process->err_what,
		(unsigned long long)process->rpcs);
	for (struct fxm_eh *eh = process->ehs; eh; eh = eh->next)
		fprintf(f, "thread %u: state %d, invocations %llu%s\n", eh->id, eh->state,
			(unsigned long long)eh->invocations, eh->executing ? ", executing" : "");
	fclose(f);
	return FLEXIO_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ heap */

int fxm_heap_range(const struct flexio_process *proc, uint64_t daddr, uint64_t len)
{
	uint64_t base = (uintptr_t)proc->heap;

	return daddr >= base && len <= proc->heap_used && daddr - base <= proc->heap_used - len;
}

flexio_status flexio_buf_dev_alloc(struct flexio_process *process, size_t buff_bsize,
				   flexio_uintptr_t *dest_daddr_p)
{
	size_t at;

	if (!process || !dest_daddr_p)
		return FLEXIO_STATUS_FAILED;
	*dest_daddr_p = 0;
	pthread_mutex_lock(&process->lock);
	at = (process->heap_used + 63) & ~(size_t)63;
	if (!buff_bsize || at + buff_bsize > process->heap_size) {
		pthread_mutex_unlock(&process->lock);
		return fxm_flexio_fail("flexio_buf_dev_alloc: %s", "the DPA heap is exhausted");
	}
	process->heap_used = at + buff_bsize;
	pthread_mutex_unlock(&process->lock);
	/* Fresh heap memory holds whatever was there: not zeroed (stricter than calloc). */
	memset(process->heap + at, 0xa5, buff_bsize);
	*dest_daddr_p = (uintptr_t)(process->heap + at);
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_buf_dev_free(struct flexio_process *process, flexio_uintptr_t daddr)
{
	(void)daddr;
	return process ? FLEXIO_STATUS_SUCCESS : FLEXIO_STATUS_FAILED;  /* bump heap */
}

flexio_status flexio_host2dev_memcpy(struct flexio_process *process, void *src_haddr,
				     size_t buff_bsize, flexio_uintptr_t dest_daddr)
{
	if (!process || !src_haddr || !fxm_heap_range(process, dest_daddr, buff_bsize))
		return fxm_flexio_fail("flexio_host2dev_memcpy: %s", "destination outside the DPA heap");
	memcpy((void *)(uintptr_t)dest_daddr, src_haddr, buff_bsize);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_buf_dev_memset(struct flexio_process *process, int value,
				    size_t buff_bsize, flexio_uintptr_t dest_daddr)
{
	if (!process || !fxm_heap_range(process, dest_daddr, buff_bsize))
		return fxm_flexio_fail("flexio_buf_dev_memset: %s", "destination outside the DPA heap");
	memset((void *)(uintptr_t)dest_daddr, value, buff_bsize);
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_copy_from_host(struct flexio_process *process, void *src_haddr,
				    size_t buff_bsize, flexio_uintptr_t *dest_daddr_p)
{
	if (flexio_buf_dev_alloc(process, buff_bsize, dest_daddr_p))
		return FLEXIO_STATUS_FAILED;
	return flexio_host2dev_memcpy(process, src_haddr, buff_bsize, *dest_daddr_p);
}

/* ------------------------------------------------------------------ mkeys and windows */

flexio_status flexio_device_mkey_create(struct flexio_process *process,
					struct flexio_mkey_attr *fattr, struct flexio_mkey **mkey)
{
	struct flexio_mkey *k;

	if (!process || !fattr || !fattr->pd || !mkey ||
	    !fxm_heap_range(process, fattr->daddr, fattr->len))
		return fxm_flexio_fail("flexio_device_mkey_create: %s", "range outside the DPA heap or no PD");
	k = calloc(1, sizeof(*k));
	if (!k)
		return FLEXIO_STATUS_FAILED;
	k->mr = fxm_mr_add(to_fxm_pd(fattr->pd), fattr->daddr, fattr->len, fattr->access, FXM_MR_DPA);
	if (!k->mr) {
		free(k);
		return FLEXIO_STATUS_FAILED;
	}
	*mkey = k;
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_device_mkey_destroy(struct flexio_mkey *mkey)
{
	if (!mkey)
		return FLEXIO_STATUS_SUCCESS;
	fxm_mr_remove(mkey->mr);
	free(mkey);
	return FLEXIO_STATUS_SUCCESS;
}

uint32_t flexio_mkey_get_id(struct flexio_mkey *mkey)
{
	return mkey ? mkey->mr->key : UINT32_MAX;
}

flexio_status flexio_window_create(struct flexio_process *process, struct ibv_pd *pd,
				   struct flexio_window **window)
{
	struct flexio_window *w;
	uint32_t id;

	if (!process || !pd || !window)
		return FLEXIO_STATUS_FAILED;
	pthread_mutex_lock(&process->lock);
	for (id = 0; id < FXM_MAX_WINDOWS && process->windows[id]; id++)
		;
	if (id == FXM_MAX_WINDOWS || !(w = calloc(1, sizeof(*w)))) {
		pthread_mutex_unlock(&process->lock);
		return FLEXIO_STATUS_FAILED;
	}
	w->id = id;
	w->pd = to_fxm_pd(pd);
	w->proc = process;
	process->windows[id] = w;
	pthread_mutex_unlock(&process->lock);
	pthread_mutex_lock(&fxm.lock);
	w->pd->refs++;
	pthread_mutex_unlock(&fxm.lock);
	*window = w;
	return FLEXIO_STATUS_SUCCESS;
}

flexio_status flexio_window_destroy(struct flexio_window *window)
{
	if (!window)
		return FLEXIO_STATUS_SUCCESS;
	pthread_mutex_lock(&window->proc->lock);
	window->proc->windows[window->id] = NULL;
	pthread_mutex_unlock(&window->proc->lock);
	pthread_mutex_lock(&fxm.lock);
	window->pd->refs--;
	pthread_mutex_unlock(&fxm.lock);
	free(window);
	return FLEXIO_STATUS_SUCCESS;
}

uint32_t flexio_window_get_id(struct flexio_window *window)
{
	return window ? window->id : UINT32_MAX;
}

void fxm_dump_dpa(void)
{
	pthread_mutex_lock(&apps_lock);
	for (uint32_t i = 0; i < 16; i++) {
		struct flexio_process *p = procs[i];

		if (!p)
			continue;
		fxm_log("process of %s: status %d", p->app->name, (int)p->err);
		for (struct fxm_eh *eh = p->ehs; eh; eh = eh->next)
			fxm_log("  thread %u: state %d triggered %d executing %d invocations %llu",
				eh->id, eh->state, eh->triggered, eh->executing,
				(unsigned long long)eh->invocations);
	}
	pthread_mutex_unlock(&apps_lock);
}

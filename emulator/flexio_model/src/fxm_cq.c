/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Completion queues as the NIC writes them: CQE64 in mlx5 layout, the owner bit written
 * last and flipped on every pass over the ring, an overrun checked against the consumer
 * index software left in the doorbell record, and one event per arm.
 *
 * Arming (mlx5 CQ doorbell, flexio_dev_cq_arm(ci, cqn) / ibv_req_notify_cq): the next
 * CQE raises one event and disarms the CQ; if CQEs past ci are already there, the event
 * is raised at once. An event runs the DPA thread the CQ is attached to, or wakes the
 * host CQ's completion channel.
 *
 * Overrun (the producer a whole ring ahead of the doorbell record): the CQ goes to error
 * and writes nothing more, unless it was created with overrun_ignore, in which case the
 * CQE is dropped and the event still raised. Which of the two a card does with an
 * ignored overrun is not documented; the model keeps what software already holds intact.
 */
#include <string.h>

#include "fxm.h"

static void be32_put(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t cq_ci(const struct fxm_cq *cq)
{
	return __builtin_bswap32(__atomic_load_n(cq->dbr, __ATOMIC_ACQUIRE)) & 0xffffffu;
}

static void cq_event(struct fxm_cq *cq)
{
	cq->events++;
	if (cq->eh)
		fxm_eh_trigger(cq->eh);
	if (cq->chan)
		fxm_chan_notify(cq);
}

void fxm_cq_push(struct fxm_cq *cq, const struct fxm_cqe_info *info)
{
	uint32_t size = 1u << cq->log_depth;
	uint8_t *cqe;
	int event = 0;

	pthread_mutex_lock(&cq->lock);
	if (cq->error) {
		pthread_mutex_unlock(&cq->lock);
		return;
	}
	if (((cq->pi - cq_ci(cq)) & 0xffffffu) >= size) {
		if (!cq->overrun_ignore) {
			cq->error = 1;
			fxm_log("CQ 0x%x overrun: %u CQEs not consumed (depth %u); the CQ is in error "
				"and completes nothing more", cq->cqn, size, size);
			pthread_mutex_unlock(&cq->lock);
			return;
		}
		event = cq->armed || cq->always_armed;
		cq->armed = 0;
		pthread_mutex_unlock(&cq->lock);
		if (event)
			cq_event(cq);
		return;
	}
	cqe = cq->ring + 64ull * (cq->pi & (size - 1));
	memset(cqe, 0, 63);
	be32_put(cqe + 0x20, info->user_index & 0xffffffu);
	memcpy(cqe + 0x24, &info->imm, 4);          /* immediate: as it travelled */
	be32_put(cqe + 0x2c, info->byte_cnt);
	cqe[0x36] = info->vendor_synd;
	cqe[0x37] = info->syndrome;
	be32_put(cqe + 0x38, info->qpn & 0xffffffu);
	cqe[0x3c] = (uint8_t)(info->wqe_counter >> 8);
	cqe[0x3d] = (uint8_t)info->wqe_counter;
	/* Body before the owner byte: software reads the body only once it sees the owner
	 * bit of this pass (pairs with the consumer's fence after reading op_own). */
	__atomic_store_n(&cqe[0x3f], (uint8_t)((info->opcode << 4) |
					       ((cq->pi >> cq->log_depth) & 1u)), __ATOMIC_RELEASE);
	cq->pi++;
	if (cq->armed || cq->always_armed) {
		cq->armed = 0;
		event = 1;
	}
	pthread_mutex_unlock(&cq->lock);
	if (event)
		cq_event(cq);
}

void fxm_cq_arm(struct fxm_cq *cq, uint32_t ci)
{
	int event = 0;

	pthread_mutex_lock(&cq->lock);
	if (!cq->error) {
		if (((cq->pi - ci) & 0xffffffu) != 0)
			event = 1;      /* CQEs past ci already: the event is due now */
		else
			cq->armed = 1;
	}
	pthread_mutex_unlock(&cq->lock);
	if (event)
		cq_event(cq);
}

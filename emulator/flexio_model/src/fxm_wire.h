/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's fabric: each port of each process listens on an abstract unix stream
 * socket named after its IPv4 address; a NIC sends to a peer port over a connection of
 * its own (in order, so a QP's requests arrive in order). Nothing lands in the file
 * system, and the kernel closes a dead process's sockets: its peers see the connection
 * refused or reset, and their requests go unanswered as they would on a wire.
 * NIC thread only, but for fxm_wire_wake().
 */
#ifndef FXM_WIRE_H
#define FXM_WIRE_H

#include <stdint.h>

typedef void (*fxm_wire_rx_fn)(uint8_t lport, const uint8_t *msg, uint32_t len);

int fxm_wire_open(void);
void fxm_wire_close(void);
/* Queue msg to the port with address dst from local port lport: 0, or -1 if it cannot go
 * (the local port is down, nobody listens at dst, the connection broke). */
int fxm_wire_send(uint8_t lport, uint32_t dst, const void *msg, uint32_t len);
/* Whether the connection lport -> dst is up (a request on it will be answered or
 * refused, not lost). */
int fxm_wire_alive(uint8_t lport, uint32_t dst);
/* Wait up to timeout_ms for messages or a wake; deliver each complete message. */
void fxm_wire_poll(int timeout_ms, fxm_wire_rx_fn rx);
void fxm_wire_wake(void);
/* Fault injection: the port stops listening and drops its connections. */
void fxm_wire_port_down(uint8_t lport);

#endif

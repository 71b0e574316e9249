/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <libflexio-dev/flexio_dev_err.h>. The SDK header documents user error
 * codes as both "129-255: User defined" and "in the range of 0x80 (128) to 0xFF (255)";
 * the model takes the narrower range, 129..255, and turns anything else into
 * FLEXIO_DEV_ERROR_ILLEGAL_ERR, as the SDK says it does for an illegal code.
 */
#ifndef _FLEXIO_DEV_ERR_H_
#define _FLEXIO_DEV_ERR_H_

#include <stdint.h>

typedef enum flexio_dev_errors {
	FLEXIO_DEV_ERROR_ILLEGAL_ERR = 0x42, /* Illegal user error code */
} flexio_dev_error_t;

/* Exit the process with a user (fatal) error code; the host reads it as the process
 * status. Does not return. */
__attribute__((__noreturn__)) void flexio_dev_error(uint8_t error);

#endif

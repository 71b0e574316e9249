/* SPDX-License-Identifier: Apache-2.0 */
/* FlexIO model: <libflexio-dev/flexio_dev_endianity.h>. The DPA is little endian and the
 * NIC's queues big endian (mlx5 layout); the model's host is little endian too. */
#ifndef _FLEXIO_DEV_ENDIANITY_H_
#define _FLEXIO_DEV_ENDIANITY_H_

#include <stdint.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the FlexIO model assumes a little-endian host, as the DPA is"
#endif

#define cpu_to_be16(x) __builtin_bswap16((uint16_t)(x))
#define be16_to_cpu(x) __builtin_bswap16((uint16_t)(x))
#define cpu_to_be32(x) __builtin_bswap32((uint32_t)(x))
#define be32_to_cpu(x) __builtin_bswap32((uint32_t)(x))
#define cpu_to_be64(x) __builtin_bswap64((uint64_t)(x))
#define be64_to_cpu(x) __builtin_bswap64((uint64_t)(x))

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <libflexio/flexio_ver.h>, as the SDK's (checked against a stored copy of
 * NVIDIA's header): FLEXIO_VER(major, minor, sub_minor) packs major << 24 | minor << 16 |
 * sub_minor; host code defines FLEXIO_VER_USED before including <libflexio/flexio.h> and
 * passes it to flexio_version_set().
 */
#ifndef _FLEXIO_VER_H_
#define _FLEXIO_VER_H_

#define FLEXIO_VER_MAJOR_OFFS 24
#define FLEXIO_VER_MINOR_OFFS 16

#define FLEXIO_VER(_major, _minor, _sub_minor) \
	(((_major) << FLEXIO_VER_MAJOR_OFFS) | ((_minor) << FLEXIO_VER_MINOR_OFFS) | (_sub_minor))

#define FLEXIO_VER_LATEST FLEXIO_VER(0xFF, 0xFF, 0xFFFF)

#endif

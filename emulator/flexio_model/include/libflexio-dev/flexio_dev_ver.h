/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FlexIO model: <libflexio-dev/flexio_dev_ver.h>. Same encoding as the SDK's
 * <libflexio/flexio_ver.h> (major << 24 | minor << 16 | sub-minor; checked against the
 * stored FlexIO SDK header), which flexio_dev.h compares FLEXIO_DEV_VER_USED against.
 */
#ifndef _FLEXIO_DEV_VER_H_
#define _FLEXIO_DEV_VER_H_

#define FLEXIO_DEV_VER_MAJOR_OFFS 24
#define FLEXIO_DEV_VER_MINOR_OFFS 16

#define FLEXIO_DEV_VER(_major, _minor, _sub_minor) \
	(((_major) << FLEXIO_DEV_VER_MAJOR_OFFS) | ((_minor) << FLEXIO_DEV_VER_MINOR_OFFS) | \
	 (_sub_minor))

#define FLEXIO_DEV_VER_LATEST FLEXIO_DEV_VER(0xFF, 0xFF, 0xFFFF)

#endif

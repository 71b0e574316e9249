#!/bin/sh
# Build the FlexIO hardware binding (needs DOCA: dpacc, libflexio, libibverbs):
#   1. the DPA image: dpa_firmware/src/*.c + dpa_firmware/hal/flexio/*.c, compiled by dpacc
#      into a host-linkable archive that embeds the device ELF (app dpa_offload_app);
#   2. build/flexio/libdpaoffload_flexio.so: host/src/flexio/*.c linked with that
#      archive, libflexio and libibverbs, exporting only dpaoffload_flexio_{ops,abi,params_version,probe}().
# The pip build never compiles these files; host_ctx dlopens the .so when backend=flexio.
#
# Environment: DOCA_DIR (default /opt/mellanox/doca), FLEXIO_DIR (default
# /opt/mellanox/flexio), DPACC (default: dpacc on PATH, else $DOCA_DIR/tools/dpacc),
# DPA_MCPU (default nv-dpa-bf3; empty for a dpacc without -mcpu), CC (default gcc),
# OUT_DIR (default build/flexio).
# Versions: the SDK decides, not a version string (as NVIDIA's DOCA samples decide):
# -mcpu only where dpacc --help lists it (DOCA 2.7 predates it); --dpa-proc-attr, with the
# blob dpa-app-attributes2blob makes of dpa_firmware/hal/flexio/dpa_app_attributes.yaml,
# where the SDK ships that converter (DOCA 3.2 and later require it). The host backend
# picks the FlexIO host API version itself (flexio_ver.h, see flexio_backend.c).
# Exit status: 0 built, 2 the SDK is missing (one line says what and where we looked),
# anything else a compile or link error.
set -eu

ROOT=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
DOCA_DIR=${DOCA_DIR:-/opt/mellanox/doca}
FLEXIO_DIR=${FLEXIO_DIR:-/opt/mellanox/flexio}
DPA_MCPU=${DPA_MCPU-nv-dpa-bf3}
CC=${CC:-gcc}
OUT_DIR=${OUT_DIR:-$ROOT/build/flexio}
APP_NAME=dpa_offload_app

missing() {
	echo "build_flexio.sh: missing $1 (looked in: $2)" >&2
	exit 2
}

# First directory of the list ($2...) that holds file $1, or nothing.
find_dir() {
	want=$1
	shift
	for dir in "$@"; do
		if [ -e "$dir/$want" ]; then
			echo "$dir"
			return 0
		fi
	done
	return 0
}

MULTIARCH=$("$CC" -print-multiarch 2>/dev/null || true)
[ -n "$MULTIARCH" ] || MULTIARCH=$(uname -m)-linux-gnu

# ---- tools and SDK -------------------------------------------------------------------------
DPACC=${DPACC:-}
if [ -z "$DPACC" ]; then
	DPACC=$(command -v dpacc 2>/dev/null || true)
fi
if [ -z "$DPACC" ] && [ -x "$DOCA_DIR/tools/dpacc" ]; then
	DPACC=$DOCA_DIR/tools/dpacc
fi
if [ -z "$DPACC" ] || [ ! -x "$DPACC" ]; then
	missing "dpacc" "\$DPACC, PATH, $DOCA_DIR/tools"
fi
if ! command -v "$CC" >/dev/null 2>&1; then
	missing "host C compiler $CC" "PATH"
fi
DPACC_VERSION=$("$DPACC" --version 2>&1 | head -n 1 || true)
ATTR2BLOB=""
for tool in "$(dirname -- "$DPACC")/dpa-app-attributes2blob" "$DOCA_DIR/tools/dpa-app-attributes2blob"; do
	if [ -x "$tool" ]; then
		ATTR2BLOB=$tool
		break
	fi
done

INC_DIRS="$FLEXIO_DIR/include $DOCA_DIR/include /usr/include"
# shellcheck disable=SC2086 # word splitting of the directory lists is intended
FLEXIO_INC=$(find_dir libflexio/flexio.h $INC_DIRS)
[ -n "$FLEXIO_INC" ] || missing "libflexio/flexio.h" "$INC_DIRS"
# shellcheck disable=SC2086
FLEXIO_DEV_INC=$(find_dir libflexio-dev/flexio_dev_queue_access.h $INC_DIRS)
[ -n "$FLEXIO_DEV_INC" ] || missing "libflexio-dev/flexio_dev_queue_access.h" "$INC_DIRS"
# shellcheck disable=SC2086
VERBS_INC=$(find_dir infiniband/verbs.h $INC_DIRS)
[ -n "$VERBS_INC" ] || missing "infiniband/verbs.h (libibverbs-dev)" "$INC_DIRS"

LIB_DIRS="$FLEXIO_DIR/lib $FLEXIO_DIR/lib/$MULTIARCH $DOCA_DIR/lib/$MULTIARCH $DOCA_DIR/lib64 \
$DOCA_DIR/lib /usr/lib/$MULTIARCH /usr/lib64 /usr/lib"
# shellcheck disable=SC2086
FLEXIO_LIB=$(find_dir libflexio.so $LIB_DIRS)
if [ -z "$FLEXIO_LIB" ]; then
	# shellcheck disable=SC2086
	FLEXIO_LIB=$(find_dir libflexio.a $LIB_DIRS)
fi
[ -n "$FLEXIO_LIB" ] || missing "libflexio (.so or .a)" "$LIB_DIRS"
# shellcheck disable=SC2086
VERBS_LIB=$(find_dir libibverbs.so $LIB_DIRS)
[ -n "$VERBS_LIB" ] || missing "libibverbs.so (libibverbs-dev)" "$LIB_DIRS"
# libflexio needs the mlx5 provider; name it when a static libflexio cannot pull it in.
# shellcheck disable=SC2086
MLX5_LIB=$(find_dir libmlx5.so $LIB_DIRS)
MLX5_LINK=""
if [ -n "$MLX5_LIB" ]; then
	MLX5_LINK="-L$MLX5_LIB -lmlx5"
fi

mkdir -p "$OUT_DIR"

# ---- 1. the DPA image ----------------------------------------------------------------------
# dpacc compiles the device sources with dpa-clang and the generated host stubs with
# -hostcc; -fPIC because the stubs end up in a shared object. Experimental FlexIO symbols
# are allowed explicitly (the SDK marks most of the device API so).
# The sources come from the one build definition (build_defs.py), as setup.py's do.
PYTHON=${PYTHON:-python3}
DEV_SRCS=$("$PYTHON" "$ROOT/build_defs.py" list firmware; "$PYTHON" "$ROOT/build_defs.py" list flexio_hal)
HOST_SRCS=$("$PYTHON" "$ROOT/build_defs.py" list flexio_host)
[ -n "$DEV_SRCS" ] && [ -n "$HOST_SRCS" ] || missing "the source lists of build_defs.py" "$PYTHON"
# So do the flags (the device's keep the reductions' rounding order: see build_defs.py).
DEV_FLAGS=$("$PYTHON" "$ROOT/build_defs.py" flags flexio_device)
HOST_STUB_FLAGS=$("$PYTHON" "$ROOT/build_defs.py" flags flexio_host_stubs)
HOST_FLAGS=$("$PYTHON" "$ROOT/build_defs.py" flags flexio_host)
[ -n "$DEV_FLAGS" ] && [ -n "$HOST_STUB_FLAGS" ] && [ -n "$HOST_FLAGS" ] || \
	missing "the flag sets of build_defs.py" "$PYTHON"
DEV_ARCHIVE=$OUT_DIR/$APP_NAME.a

set -- -o "$DEV_ARCHIVE" -hostcc="$CC" -hostcc-options="$HOST_STUB_FLAGS" \
	--devicecc-options="$DEV_FLAGS" --app-name="$APP_NAME" -flto
if [ -n "$DPA_MCPU" ] && "$DPACC" --help 2>&1 | grep -q -- "-mcpu"; then
	set -- "$@" -mcpu="$DPA_MCPU"
fi
if [ -n "$ATTR2BLOB" ]; then
	BLOB=$OUT_DIR/${APP_NAME}_attributes.blob
	"$ATTR2BLOB" "$ROOT/dpa_firmware/hal/flexio/dpa_app_attributes.yaml" "$BLOB"
	set -- "$@" --dpa-proc-attr="$BLOB"
fi
rm -f "$DEV_ARCHIVE"
echo "build_flexio.sh: dpacc ($DPACC_VERSION) -> $DEV_ARCHIVE${ATTR2BLOB:+ (with DPA attributes)}"
# shellcheck disable=SC2086 # DEV_SRCS: repository paths, split on purpose
"$DPACC" $DEV_SRCS "$@"

# ---- 2. the host backend -------------------------------------------------------------------
EXPORTS=$OUT_DIR/exports.map
printf '{\n  global: dpaoffload_flexio_*;\n  local: *;\n};\n' >"$EXPORTS"
SO=$OUT_DIR/libdpaoffload_flexio.so
echo "build_flexio.sh: $CC -> $SO"
# shellcheck disable=SC2086 # MLX5_LINK: empty or two words, HOST_SRCS and HOST_FLAGS: split on purpose
"$CC" $HOST_FLAGS -shared \
	-isystem "$FLEXIO_INC" -isystem "$FLEXIO_DEV_INC" -isystem "$VERBS_INC" \
	$HOST_SRCS "$DEV_ARCHIVE" \
	-Wl,--version-script="$EXPORTS" -Wl,-z,defs \
	-L"$FLEXIO_LIB" -L"$VERBS_LIB" -Wl,-rpath,"$FLEXIO_LIB" \
	-lflexio $MLX5_LINK -libverbs -lpthread \
	-o "$SO"
echo "build_flexio.sh: built $SO"

#!/bin/sh
# Build the FlexIO model as an SDK tree that scripts/build_flexio.sh builds the hardware
# binding against, unchanged (DOCA_DIR=FLEXIO_DIR=<out>/sdk):
#   <out>/sdk/include   the model's libflexio, libflexio-dev, dpaintrin and verbs headers
#   <out>/sdk/lib       libfxm-model.so (host libflexio, libibverbs, the DPA runtime and the
#                       emulated NIC), with libflexio.so, libibverbs.so and libmlx5.so
#                       naming it, so that -lflexio -libverbs -lmlx5 link against the model
#   <out>/sdk/tools     dpacc and dpa-app-attributes2blob of the model
# Usage: emulator/flexio_model/build.sh [OUT_DIR] (default build/flexio_model). CC: gcc.
set -eu

HERE=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
ROOT=$(CDPATH='' cd -- "$HERE/../.." && pwd)
OUT=${1:-$ROOT/build/flexio_model}
CC=${CC:-gcc}
SDK=$OUT/sdk

mkdir -p "$SDK/lib" "$SDK/tools"
rm -rf "$SDK/include"
cp -R "$HERE/include" "$SDK/include"
# shellcheck disable=SC2046 # the source list is split on purpose
"$CC" -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared \
	-DFLEXIO_DEV_ALLOW_EXPERIMENTAL_API -DFLEXIO_ALLOW_EXPERIMENTAL_API \
	-I"$HERE/include" -I"$HERE/src" $(ls "$HERE"/src/*.c) \
	-Wl,-soname,libfxm-model.so -Wl,-z,defs -lpthread -ldl \
	-o "$SDK/lib/libfxm-model.so.tmp"
mv "$SDK/lib/libfxm-model.so.tmp" "$SDK/lib/libfxm-model.so"
for name in libflexio.so libibverbs.so libmlx5.so; do
	ln -sf libfxm-model.so "$SDK/lib/$name"
done
for tool in dpacc dpa-app-attributes2blob; do
	cp "$HERE/tools/$tool" "$SDK/tools/$tool"
	chmod +x "$SDK/tools/$tool"
done
echo "flexio model: built $SDK"

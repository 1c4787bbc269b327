#!/bin/sh
# usage: install_and_consume.sh BUILD_DIR CONSUMER_SRC CC
set -eu
build=$1 src=$2 cc=$3
prefix=$(mktemp -d "${TMPDIR:-/tmp}/ks-install-XXXXXX")
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(find "$prefix" -name keepsake.pc -printf '%h\n' | head -n 1)
[ -n "$libdir" ] || { echo "keepsake.pc was not installed"; exit 1; }
test -f "$prefix/include/keepsake/keepsake.h" || { echo "headers were not installed"; exit 1; }
test -f "$prefix/include/keepsake/version.h" || { echo "version.h was not installed"; exit 1; }

# pkg-config, shared library
export PKG_CONFIG_PATH="$libdir"
"$cc" -std=c11 -o "$prefix/consumer-pc" "$src/consumer.c" $(pkg-config --cflags --libs keepsake)
LD_LIBRARY_PATH="$(dirname "$libdir")" "$prefix/consumer-pc" "$prefix/out.keepsake"

# CMake package
cmake -S "$src" -B "$prefix/cbuild" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/cbuild" >/dev/null
LD_LIBRARY_PATH="$(dirname "$libdir")" "$prefix/cbuild/consumer" "$prefix/out2.keepsake"
echo "installed package works through pkg-config and find_package"

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
test -f "$prefix/include/keepsake/binding.h" || { echo "binding.h was not installed"; exit 1; }
archive=$(find "$prefix" -name libkeepsake.a | head -n 1)
[ -n "$archive" ] || { echo "libkeepsake.a was not installed"; exit 1; }

# pkg-config, shared library
export PKG_CONFIG_PATH="$libdir"
"$cc" -std=c11 -o "$prefix/consumer-pc" "$src/consumer.c" $(pkg-config --cflags --libs keepsake)
LD_LIBRARY_PATH="$(dirname "$libdir")" "$prefix/consumer-pc" "$prefix/out.keepsake"

# pkg-config, static library: binding.h's calls are there (and only there)
"$cc" -std=c11 -o "$prefix/consumer-static" "$src/consumer_binding.c" $(pkg-config --cflags keepsake) \
  -L"$(dirname "$archive")" -Wl,-Bstatic -lkeepsake -Wl,-Bdynamic \
  $(pkg-config --static --libs keepsake | sed 's/-lkeepsake\b//; s/-L[^ ]*//g')
"$prefix/consumer-static" "$prefix/out3.keepsake"
# ... and a program that calls them does not link against the shared library.
if "$cc" -std=c11 -o "$prefix/consumer-shared-binding" "$src/consumer_binding.c" \
     $(pkg-config --cflags --libs keepsake) 2>"$prefix/link.log"; then
  echo "consumer_binding.c linked against libkeepsake.so: binding.h's calls are exported"; exit 1
fi

# CMake package: keepsake::keepsake (shared) and keepsake::keepsake_static
cmake -S "$src" -B "$prefix/cbuild" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/cbuild" >/dev/null
LD_LIBRARY_PATH="$(dirname "$libdir")" "$prefix/cbuild/consumer" "$prefix/out2.keepsake"
"$prefix/cbuild/consumer_binding" "$prefix/out4.keepsake"
echo "installed package works through pkg-config and find_package, shared and static (binding.h)"

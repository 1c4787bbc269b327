#!/bin/sh
# The shared library exports exactly the public API: every defined dynamic
# symbol is a public ks_ name (never an internal ks__ one, never anything else),
# and every function the public headers declare is exported.
# Usage: exports.sh LIBKEEPSAKE_SO INCLUDE_DIR
set -eu
so=$1
inc=$2
exported=$(nm -D --defined-only "$so" | awk '{print $NF}' | sed 's/@.*//' | sort -u)
fail=0
for sym in $exported; do
  case $sym in
    ks__*) echo "exports: internal symbol exported: $sym"; fail=1 ;;
    ks_*) ;;
    _init | _fini | _edata | _end | __bss_start) ;;  # added by the linker on some toolchains
    *) echo "exports: non-keepsake symbol exported: $sym"; fail=1 ;;
  esac
done
# Functions declared in the public headers: `name(` at the start of a declaration, after its return type.
declared=$(cat "$inc"/keepsake/*.h | sed 's,/\*.*\*/,,g' | grep -v '^\s*\*' |
  grep -oE '^[A-Za-z_][A-Za-z0-9_ \*]*[ \*](ks_[a-z0-9_]+)\(' | grep -oE 'ks_[a-z0-9_]+\($' | tr -d '(' | sort -u)
for fn in $declared; do
  printf '%s\n' "$exported" | grep -qx "$fn" || { echo "exports: declared but not exported: $fn"; fail=1; }
done
n=$(printf '%s\n' "$exported" | grep -c '^ks_' || true)
nd=$(printf '%s\n' "$declared" | grep -c . || true)
[ "$nd" -gt 50 ] || { echo "exports: found only $nd declarations in $inc (parser broken?)"; fail=1; }
[ $fail -eq 0 ] && echo "exports: $n public ks_ symbols exported, $nd declared functions, no internal symbol"
exit $fail

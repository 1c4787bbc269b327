#!/bin/sh
# The shared library exports exactly the public API: every defined dynamic
# symbol is a public ks_ name (never an internal ks__ one, never anything else),
# every function the public headers declare is exported, and no more of them
# than the budget. The functions of the binding header (binding.h) are NOT
# exported, and are in the static library.
# Usage: exports.sh LIBKEEPSAKE_SO INCLUDE_DIR [LIBKEEPSAKE_A] [BUDGET]
set -eu
so=$1
inc=$2
ar=${3:-}
budget=${4:-290}
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
# Functions declared in headers: `name(` at the start of a declaration, after its return type.
declarations() {
  cat "$@" | sed 's,/\*.*\*/,,g' | grep -v '^\s*\*' |
    grep -oE '^[A-Za-z_][A-Za-z0-9_ \*]*[ \*](ks_[a-z0-9_]+)\(' | grep -oE 'ks_[a-z0-9_]+\($' | tr -d '(' | sort -u
}
public_headers=$(ls "$inc"/keepsake/*.h | grep -v '/binding\.h$')
declared=$(declarations $public_headers)
for fn in $declared; do
  printf '%s\n' "$exported" | grep -qx "$fn" || { echo "exports: declared but not exported: $fn"; fail=1; }
done
binding=$(declarations "$inc"/keepsake/binding.h "$inc"/keepsake/binding/*.h)
nb=$(printf '%s\n' "$binding" | grep -c . || true)
[ "$nb" -gt 0 ] || { echo "exports: found no declaration in binding.h (parser broken?)"; fail=1; }
if [ -n "$ar" ]; then
  in_static=$(nm --defined-only "$ar" 2>/dev/null | awk '$2 == "T" {print $3}' | sort -u)
fi
for fn in $binding; do
  printf '%s\n' "$declared" | grep -qx "$fn" && { echo "exports: $fn is declared in binding.h and a public header"; fail=1; }
  printf '%s\n' "$exported" | grep -qx "$fn" && { echo "exports: binding function exported: $fn"; fail=1; }
  if [ -n "$ar" ]; then
    printf '%s\n' "$in_static" | grep -qx "$fn" || { echo "exports: binding function not in $ar: $fn"; fail=1; }
  fi
done
n=$(printf '%s\n' "$exported" | grep -c '^ks_' || true)
nd=$(printf '%s\n' "$declared" | grep -c . || true)
[ "$nd" -gt 50 ] || { echo "exports: found only $nd declarations in $inc (parser broken?)"; fail=1; }
# The count rule (docs/DESIGN.md, ABI): the exported API is a budget. A new public function
# comes with the removal of another, or goes into binding.h, or the budget is raised here on
# purpose (tests/abi/CMakeLists.txt) with the reason in CHANGELOG.md.
[ "$n" -le "$budget" ] || { echo "exports: $n public ks_ functions exported, over the budget of $budget"; fail=1; }
[ $fail -eq 0 ] &&
  echo "exports: $n public ks_ symbols exported (budget $budget), $nd declared functions, $nb binding functions hidden, no internal symbol"
exit $fail

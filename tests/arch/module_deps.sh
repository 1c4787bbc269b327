#!/bin/sh
# Checks the module graph of docs/DESIGN.md against the #include lines:
#   - a module under src/ includes internal headers only of itself and of core;
#   - it includes only the public headers of the modules it depends on;
#   - the CLI (tools/) includes no internal header at all.
# Usage: module_deps.sh SOURCE_DIR
set -eu
src=$1/src
fail=0
# binding.h declares the binding calls of several modules; each module includes it to define its own.
core_pub="alloc binding binding/structure dtype io io_cache layout statedict status tensor version"
allowed_pub() {
  case $1 in
    core) echo "$core_pub" ;;
    format) echo "$core_pub format" ;;
    metrics) echo "$core_pub metric" ;;
    train) echo "$core_pub train" ;;
    state) echo "$core_pub state train metric format" ;;
    manager) echo "$core_pub manager state train format shard" ;;
    torch) echo "$core_pub torch shard binding/dcpvalue format" ;;
    import) echo "$core_pub import torch metric format" ;;
    convert) echo "$core_pub convert import torch metric format" ;;
    shard) echo "$core_pub shard binding/dcpvalue format metric" ;;
    dist) echo "$core_pub dist shard format metric manager state train" ;;
    remote) echo "$core_pub storage" ;;
    *) echo "" ;;
  esac
}
for dir in "$src"/*/; do
  m=$(basename "$dir")
  pub=$(allowed_pub "$m")
  if [ -z "$pub" ]; then
    echo "module_deps: src/$m is not in the module graph (add it here and to docs/DESIGN.md)"
    fail=1
    continue
  fi
  for f in "$dir"*.c "$dir"*.h; do
    [ -e "$f" ] || continue
    for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
      case $inc in */*) ;; *) continue ;; esac  # same-folder header
      top=${inc%%/*}
      name=${inc#*/}
      name=${name%.h}
      case $top in
        "$m" | core) ;;
        keepsake)
          case " $pub " in
            *" $name "*) ;;
            *) echo "module_deps: src/$m/$(basename "$f") includes keepsake/$name.h"; fail=1 ;;
          esac ;;
        *) echo "module_deps: src/$m/$(basename "$f") includes $inc (internal header of $top)"; fail=1 ;;
      esac
    done
  done
done
for f in "$1"/tools/*.c "$1"/tools/*.h; do
  for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
    case $inc in
      keepsake/*) ;;
      */*) echo "module_deps: tools/$(basename "$f") includes internal header $inc"; fail=1 ;;
    esac
  done
done
[ $fail -eq 0 ] && echo "module_deps: the includes match the module graph"
exit $fail

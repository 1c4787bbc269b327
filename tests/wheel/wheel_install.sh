#!/usr/bin/env bash
# The Python package as a user gets it: scripts/build-sdist makes the sdist; a clean venv that sees
# only the build tools (scikit-build-core, through a .pth to the test venv) builds it into a wheel,
# as `pip install keepsake-*.tar.gz` does; a second venv with no C compiler on PATH installs that
# wheel and runs the Python tests against it, and the `keepsake` console command on its files.
#   usage: wheel_install.sh SOURCE_DIR WORK_DIR VENV_PYTHON
# KS_TEST_WHEEL=path/to.whl tests that wheel (e.g. scripts/build-wheel's manylinux one) instead of
# building one from the sdist:  KS_TEST_WHEEL=$PWD/dist/keepsake-...whl ctest -L wheel
set -euo pipefail
src=$1 work=$2 py=$3
rm -rf "$work" && mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
pip() { "$py" -m pip --disable-pip-version-check --no-input "$@"; }   # the test venv's pip, run for other venvs with --python
venv_site=$(site_of "$py")

# 1. The sdist: every C source it needs, and xxhash.h (compiled in), with the package.
sdist=$(PYTHON=$py "$src/scripts/build-sdist" "$work/dist" | tail -n 1)
[ -f "$sdist" ] || fail "build-sdist made no sdist"
listing=$(tar tzf "$sdist")
for f in CMakeLists.txt LICENSE pyproject.toml PKG-INFO third_party/xxhash/xxhash.h src/format/header_build.c \
         tools/main.c python/CMakeLists.txt keepsake/__init__.py keepsake/_cli.py; do
  grep -qx "keepsake-[^/]*/$f" <<<"$listing" || fail "the sdist lacks $f"
done
! grep -Eq '/(tests|build[^/]*|\.venv[^/]*)/|__pycache__|\.so$' <<<"$listing" || fail "the sdist carries build or test files"

# 2. sdist -> wheel in a clean venv that sees the build tools only.
if [ -n "${KS_TEST_WHEEL:-}" ]; then
  whl=$KS_TEST_WHEEL
  echo "testing the given $(basename "$whl")"
else
  "$py" -m venv --without-pip venv-build
  echo "$venv_site" > "$(site_of venv-build/bin/python)/ks-build-tools.pth"
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} pip --python venv-build/bin/python wheel \
    --no-deps --no-build-isolation --no-index --no-cache-dir -w "$work/dist" "$sdist" > build.log 2>&1 ||
    { tail -n 40 build.log; fail "the sdist did not build"; }
  whl=$(ls "$work"/dist/keepsake-*.whl)
  echo "built $(basename "$whl") from $(basename "$sdist")"
fi

# 3. What the wheel's binaries link: never libxxhash (compiled in); jansson not by the extension once
#    its sources no longer use it.
rm -rf unpacked && "$py" -m zipfile -e "$whl" unpacked
ext=$(ls unpacked/keepsake/_keepsake*.so) cli=unpacked/keepsake/bin/keepsake
"$py" -c 'import sys, zipfile
mode = zipfile.ZipFile(sys.argv[1]).getinfo("keepsake/bin/keepsake").external_attr >> 16
sys.exit(0 if mode & 0o111 else 1)' "$whl" || fail "the wheel has no executable keepsake/bin/keepsake"
for f in "$ext" "$cli"; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ')
  echo "$(basename "$f") needs: $needed"
  ! grep -q xxhash <<<"$needed" || fail "$(basename "$f") links libxxhash"
done
if ! grep -qs jansson "$src"/python/src/*.c; then
  ! readelf -d "$ext" | grep -q 'jansson' || fail "the extension links jansson, which its sources do not use"
fi

# 4. The wheel in a venv with no C compiler on PATH; torch, numpy, pytest ... seen through a .pth.
"$py" -m venv --without-pip venv-test
echo "$venv_site" > "$(site_of venv-test/bin/python)/ks-test-deps.pth"
pip --python venv-test/bin/python install --no-deps --no-index --no-cache-dir "$whl" > install.log 2>&1 ||
  { cat install.log; fail "the wheel did not install"; }
mkdir -p path && for t in sh env cat grep; do ln -sf "$(command -v $t)" path/$t; done   # PATH: the venv, and these
export PATH=$work/venv-test/bin:$work/path
unset PYTHONPATH KS_CLI
export PYTHONDONTWRITEBYTECODE=1
vpy=$work/venv-test/bin/python
"$vpy" - "$work/venv-test" <<'PY'
import os, shutil, sys
for cc in ("cc", "gcc", "clang", "c99"):
    assert shutil.which(cc) is None, f"{cc} is on PATH: {shutil.which(cc)}"
import keepsake
where = os.path.realpath(keepsake.__file__)
assert where.startswith(os.path.realpath(sys.argv[1]) + os.sep), f"keepsake imported from {where}"
print("keepsake", keepsake.__version__, "from", os.path.dirname(where))
PY

# 5. The console command, on files the installed package wrote.
"$vpy" -c 'import torch, keepsake.torch as kt
kt.save_file({"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(4, dtype=torch.bfloat16)}, "t.keepsake")
m = torch.nn.Linear(4, 2); o = torch.optim.AdamW(m.parameters())
kt.save_checkpoint("ck.keepsake", model=m, optimizers=o, run_name="wheel")'
[ "$(command -v keepsake)" = "$work/venv-test/bin/keepsake" ] || fail "no keepsake command in the venv"
keepsake verify t.keepsake && keepsake verify ck.keepsake || fail "keepsake verify refused a good file"
keepsake inspect t.keepsake > inspect.txt && grep -Eq 'BF16|bfloat16' inspect.txt || { cat inspect.txt; fail "keepsake inspect"; }
keepsake inspect ck.keepsake > inspect-ck.txt && grep -q wheel inspect-ck.txt || { cat inspect-ck.txt; fail "keepsake inspect (run name)"; }
"$vpy" -m keepsake diff t.keepsake t.keepsake || fail "python -m keepsake diff of a file with itself"
"$vpy" -c 'import keepsake, sys; keepsake.convert("t.keepsake", "t.pt")' && keepsake verify t.keepsake
# One byte of the data flipped: verify must fail, with its own exit status passed through.
"$vpy" -c 'import sys
with open("t.keepsake", "r+b") as f:
    f.seek(-1, 2); b = f.read(1); f.seek(-1, 2); f.write(bytes([b[0] ^ 0xFF]))'
set +e; keepsake verify t.keepsake > verify-bad.txt 2>&1; rc=$?; set -e
[ "$rc" -ne 0 ] || fail "keepsake verify accepted a corrupt file"
keepsake --no-such-command > /dev/null 2>&1 && fail "an unknown command succeeded"
echo "keepsake command: verify, inspect, diff and convert work; a corrupt file exits $rc"

# 6. The Python tests against the installed copy (from outside the source tree).
cd "$work"
"$vpy" -m pytest -q -p no:cacheprovider "$src/tests/python/test_tensors.py" "$src/tests/python/test_checkpoint.py" \
  "$src/tests/python/test_dropin.py"

#!/usr/bin/env bash
# The Python package by the conventional route, with no network (what a fresh CI machine has after
# scripts/install-deps):
#   1. `python -m build --sdist` at the repository root (pyproject.toml), with the test venv's build
#      and scikit-build-core (--no-isolation);
#   2. the sdist holds every source the build needs, xxhash.h included, and nothing of the tests,
#      data or build trees;
#   3. in a clean venv that sees only the test venv's packages (scikit-build-core for the build,
#      torch and numpy to use the package), pip builds the sdist into a wheel (--no-build-isolation,
#      --no-index) and installs it: the wheel is cp311-abi3, and abi3audit finds nothing in its
#      extension outside the stable ABI of CPython 3.11;
#   4. the installed package imports from that venv, saves and loads a file, and its `keepsake`
#      command runs.
# The wheel stays in WORK_DIR/dist for tests/wheel/wheel_install.sh (the ctest fixture python_wheel).
#   usage: sdist_install.sh SOURCE_DIR WORK_DIR VENV_PYTHON
set -euo pipefail
src=$1 work=$2 py=$3
rm -rf "$work" && mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
pip() { "$py" -m pip --disable-pip-version-check --no-input "$@"; }   # the test venv's pip, run for the new venv with --python
dist=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$src/pyproject.toml" | head -n 1)
[ -n "$dist" ] || fail "pyproject.toml names no project"
start=$SECONDS

# 1. The sdist, from the repository root.
"$py" -m build --sdist --no-isolation --outdir "$work/dist" "$src" > build-sdist.log 2>&1 ||
  { cat build-sdist.log; fail "python -m build --sdist failed"; }
sdist=$(ls "$work"/dist/*.tar.gz)
echo "sdist: $(basename "$sdist") ($((SECONDS - start)) s)"

# 2. What it holds.
listing=$(tar tzf "$sdist")
top=$(head -n 1 <<<"$listing" | cut -d/ -f1)
[ "$top" = "${dist//-/_}-$(sed -n 's/^project(keepsake VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")" ] ||
  fail "the sdist's folder is $top"
for f in pyproject.toml PKG-INFO CMakeLists.txt LICENSE cmake/optional.cmake include/keepsake/keepsake.h \
         include/keepsake/version.h.in src/format/header_build.c src/core/nosync third_party/xxhash/xxhash.h \
         third_party/xxhash/LICENSE tools/main.c python/CMakeLists.txt python/src/ksmodule.c \
         python/keepsake/__init__.py python/keepsake/_cli.py python/keepsake/py.typed python/README.md; do
  grep -q "^$top/$f" <<<"$listing" || fail "the sdist lacks $f"
done
# Every C source and header of the library, the CLI and the extension, and every module of the
# Python package (its layer folders too), as git (or the tree) has them.
cd "$src"
if git rev-parse --git-dir > /dev/null 2>&1; then
  sources=$(git ls-files --cached --others --exclude-standard -- 'src/*.[ch]' 'include/*.h' 'tools/*.[ch]' \
            'python/src/*.[ch]' 'python/keepsake/*.py' 'python/keepsake/*.pyi')
else
  sources=$(find src include tools python/src -name '*.[ch]'; find python/keepsake -name '*.py' -o -name '*.pyi')
fi
cd "$work"
n=0
while IFS= read -r f; do
  [ -f "$src/$f" ] || continue
  grep -qx "$top/$f" <<<"$listing" || fail "the sdist lacks $f"
  n=$((n + 1))
done <<<"$sources"
! grep -Eq "^$top/(tests|data|docs|bench|examples|scripts|build[^/]*|\.venv[^/]*)/|__pycache__|\.so$" <<<"$listing" ||
  fail "the sdist carries test, data or build files: $(grep -E "^$top/(tests|data|docs|bench|examples|scripts|build|\.venv)" <<<"$listing" | head -n 3)"
grep -q "^Name: $dist$" <(tar xzOf "$sdist" "$top/PKG-INFO") || fail "PKG-INFO does not name $dist"
echo "the sdist: $(wc -l <<<"$listing") files, all $n C sources, headers and Python modules"

# 3. sdist -> wheel -> installed, in a clean venv that sees only the test venv's packages.
"$py" -m venv --without-pip venv
echo "$(site_of "$py")" > "$(site_of venv/bin/python)/ks-test-venv.pth"
t=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} pip --python venv/bin/python wheel \
  --no-deps --no-build-isolation --no-index --no-cache-dir -w "$work/dist" "$sdist" > build-wheel.log 2>&1 ||
  { tail -n 40 build-wheel.log; fail "the sdist did not build"; }
whl=$(ls "$work"/dist/*.whl)
echo "built $(basename "$whl") ($((SECONDS - t)) s)"
case "$(basename "$whl")" in
  "${dist//-/_}"-*-cp311-abi3-*.whl) ;;
  *) fail "$(basename "$whl") is not one cp311-abi3 wheel for every CPython from 3.11 on" ;;
esac
"$py" -m abi3audit --strict --summary "$whl" > abi3audit.log 2>&1 || { cat abi3audit.log; fail "abi3audit: $(basename "$whl")"; }
grep -q "0 ABI violations" abi3audit.log || { cat abi3audit.log; fail "abi3audit found violations"; }
echo "abi3audit: $(tr -s ' \n' ' ' < abi3audit.log | grep -o '[0-9]* extensions scanned.*found')"
pip --python venv/bin/python install --no-deps --no-index --no-cache-dir "$whl" > install.log 2>&1 ||
  { cat install.log; fail "the wheel did not install"; }

# 4. The installed copy: from the venv, saving and loading a file, its command.
unset PYTHONPATH
export PYTHONDONTWRITEBYTECODE=1
venv/bin/python - "$work/venv" "$dist" "$src/python/keepsake" <<'PY' || fail "the installed package does not work"
import importlib.metadata, os, pathlib, sys
import torch
import keepsake, keepsake.torch as kt
where = os.path.realpath(keepsake.__file__)
assert where.startswith(os.path.realpath(sys.argv[1]) + os.sep), f"keepsake imported from {where}"
def modules(d):  # every module of the package, its layer folders' too, relative to keepsake/
    return {str(p.relative_to(d)) for p in pathlib.Path(d).rglob("*.py*") if p.suffix in (".py", ".pyi")}
missing = modules(sys.argv[3]) - modules(os.path.dirname(where))
assert not missing, f"the installed package lacks {sorted(missing)}"
assert importlib.metadata.version(sys.argv[2]) == keepsake.__version__
assert os.path.basename(keepsake._native.__file__) == "_keepsake.abi3.so", keepsake._native.__file__
t = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(4, dtype=torch.bfloat16)}
kt.save_file(t, "t.keepsake")
back = kt.load_file("t.keepsake")
assert back.keys() == t.keys() and all(torch.equal(back[k], t[k]) for k in t)
keepsake.verify("t.keepsake")
print(f"{sys.argv[2]} {keepsake.__version__} from {os.path.dirname(where)}: saved and loaded t.keepsake")
PY
out=$(venv/bin/keepsake --version) || fail "the keepsake command"
[ "$out" = "keepsake $(venv/bin/python -c 'import keepsake; print(keepsake.__version__)') ($dist)" ] ||
  fail "keepsake --version: $out"
venv/bin/keepsake verify t.keepsake > /dev/null || fail "keepsake verify"
echo "$out; keepsake verify t.keepsake: ok ($((SECONDS - start)) s in all)"

# 5. The same wheel under every other CPython from 3.12 on that this machine has (python3.1X on PATH
#    that runs, or KS_EXTRA_PYTHONS="path ..."): installed in a venv of its own, it imports and saves,
#    verifies and reads a file through the extension alone (no torch or numpy there).
others=${KS_EXTRA_PYTHONS:-}
if [ -z "$others" ]; then
  for v in 12 13 14 15 16; do
    p=$(command -v "python3.$v" 2> /dev/null) && "$p" -c 'import venv' 2> /dev/null && others="$others $p"
  done
fi
for p in $others; do
  ver=$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  "$p" -m venv --without-pip "venv-$ver"
  pip --python "venv-$ver/bin/python" install --no-deps --no-index --no-cache-dir "$whl" > "install-$ver.log" 2>&1 ||
    { cat "install-$ver.log"; fail "the wheel did not install for CPython $ver"; }
  "venv-$ver/bin/python" - <<'PY' || fail "the wheel does not work under CPython $ver"
import ctypes, os, sys
import keepsake, keepsake._keepsake as n
assert os.path.basename(n.__file__) == "_keepsake.abi3.so"
w = (ctypes.c_float * 6)(*range(6))
f32 = [name for name, _size in n.dtypes()].index("F32")
n.save_file("v.keepsake", [("w", f32, (2, 3), ctypes.addressof(w), ctypes.sizeof(w)), ("step", 7)])
keepsake.verify("v.keepsake")
r = n.Reader("v.keepsake")
code, shape, data = r.tensor("w")
assert shape == (2, 3) and bytes(data) == bytes(w) and dict(r.scalars())["step"] == 7
print(f"CPython {sys.version.split()[0]}: keepsake {keepsake.__version__} saved, verified and read v.keepsake")
PY
done
[ -n "$others" ] || echo "no other CPython (3.12+) on PATH: the wheel ran under $("$py" -c 'import sys; print(sys.version.split()[0])') only"

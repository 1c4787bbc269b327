#!/usr/bin/env bash
# The Python package as a user gets it: the wheel tests/wheel/sdist_install.sh built from the sdist
# (`python -m build --sdist`, then pip in a clean venv) goes into a venv with no C compiler on PATH,
# which runs the whole Python test suite (tests/python/test_*.py) against it, and the `keepsake`
# console command on its files.
#   usage: wheel_install.sh SOURCE_DIR WORK_DIR VENV_PYTHON WHEEL_DIR
# KS_TEST_WHEEL=path/to.whl tests that wheel (e.g. scripts/build-wheel's manylinux one) instead of
# the one in WHEEL_DIR:  KS_TEST_WHEEL=$PWD/dist/keepsake_ckpt-...whl ctest -L wheel
# KS_WHEEL_REMOTE=1 (set by ctest when the build has the curl backend): the wheel must have s3:// and
# http(s):// storage, loading libcurl.so.4 at run time (KS_CURL_RUNTIME) and linking none; the
# remote tests then run against it (KS_REMOTE_ENV, the remote_servers fixture), and, where a user
# namespace can hide the system's libcurl, a remote location must fail with the clear error.
set -euo pipefail
src=$1 work=$2 py=$3 wheel_dir=$4
rm -rf "$work" && mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
pip() { "$py" -m pip --disable-pip-version-check --no-input "$@"; }   # the test venv's pip, run for other venvs with --python
venv_site=$(site_of "$py")

if [ -n "${KS_TEST_WHEEL:-}" ]; then
  whl=$KS_TEST_WHEEL
  echo "testing the given $(basename "$whl")"
else
  whl=$(ls "$wheel_dir"/*.whl 2> /dev/null | head -n 1)
  [ -f "$whl" ] || fail "no wheel in $wheel_dir (python_sdist_install makes it)"
  echo "testing $(basename "$whl") (python_sdist_install's, built from the sdist)"
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
# The curl backend, built against curl's headers, loads libcurl at run time: no binary links it.
if [ "${KS_WHEEL_REMOTE:-0}" = 1 ]; then
  for f in "$ext" "$cli"; do
    ! readelf -d "$f" | grep -q 'NEEDED.*curl' || fail "$(basename "$f") links libcurl (KS_CURL_RUNTIME should load it)"
    grep -q 'libcurl.so.4' "$f" || fail "$(basename "$f") has no curl backend (built without curl's headers?)"
  done
  echo "no libcurl linked; the curl backend loads libcurl.so.4 at run time"
fi

# 4. The wheel in a venv with no C compiler on PATH; torch, numpy, pytest ... seen through a .pth.
"$py" -m venv --without-pip venv-test
echo "$venv_site" > "$(site_of venv-test/bin/python)/ks-test-deps.pth"
pip --python venv-test/bin/python install --no-deps --no-index --no-cache-dir "$whl" > install.log 2>&1 ||
  { cat install.log; fail "the wheel did not install"; }
# The test venv's older torchmetrics (extra/, which test_metrics finds beside sys.executable).
venv_root=$(dirname "$(dirname "$py")")
[ ! -d "$venv_root/extra" ] || ln -sfn "$venv_root/extra" venv-test/extra
# PATH: the venv, and these (curl: the remote tests' helpers; mount: test_manager's small tmpfs, where allowed).
mkdir -p path && for t in sh env cat grep curl mount umount unshare; do
  if command -v $t > /dev/null; then ln -sf "$(command -v $t)" path/$t; fi
done
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

# 6. The whole Python suite against the installed copy (from outside the source tree): the CLI is the
#    wheel's; the older torchmetrics of the test venv (extra/, found beside sys.executable) seen too.
cd "$work"
if [ "${KS_WHEEL_REMOTE:-0}" = 1 ]; then
  [ -n "${KS_REMOTE_ENV:-}" ] || fail "KS_WHEEL_REMOTE=1 without KS_REMOTE_ENV (run through ctest: fixture remote_servers)"
  command -v curl > /dev/null || fail "the remote tests need the curl program"
fi
# A plugin checks, once the suite ran, that every keepsake module it imported is the wheel's.
cat > ks_wheel_only.py <<'PY'
import os, sys

def pytest_sessionfinish(session, exitstatus):
    root = os.path.realpath(os.environ["KS_WHEEL_VENV"]) + os.sep
    mods = {n: m for n, m in sys.modules.items() if n == "keepsake" or n.startswith("keepsake.")}
    bad = [f"{n}: {getattr(m, '__file__', None)}" for n, m in mods.items()
           if getattr(m, "__file__", None) and not os.path.realpath(m.__file__).startswith(root)]
    if "keepsake._keepsake" not in mods or bad:
        print(f"\nFAIL: keepsake not (only) from the wheel: {bad or 'keepsake._keepsake never imported'}")
        session.exitstatus = 1
    else:
        print(f"\n{len(mods)} keepsake modules, all from {root}")
PY
set +e
KS_WHEEL_VENV=$work/venv-test KS_SOURCE_DIR=$src KS_CLI=$work/venv-test/bin/keepsake \
  "$vpy" -m pytest -q -rs -p no:cacheprovider -p ks_wheel_only "$src"/tests/python/test_*.py > pytest.log 2>&1
rc=$?
set -e
cat pytest.log
[ "$rc" -eq 0 ] || fail "the Python suite failed against the installed wheel (pytest exit $rc)"
if [ "${KS_WHEEL_REMOTE:-0}" = 1 ]; then
  ! grep -E '^SKIPPED .*test_remote_py' pytest.log || fail "the remote tests were skipped"
  grep -Eq '^[0-9]+ passed' pytest.log || fail "no pytest summary"
fi

# 7. Where libcurl.so.4 cannot be loaded, a remote location fails with KS_E_UNSUPPORTED saying what to
#    install, never a crash; local files still work. The system's libcurl is hidden by bind-mounting
#    /dev/null over the files the loader maps for it, in a user + mount namespace (unshare -rm), when
#    this machine allows one.
if [ "${KS_WHEEL_REMOTE:-0}" = 1 ]; then
  if unshare -rm sh -c : 2> /dev/null; then
    curl_files=$("$vpy" -c 'import ctypes
for n in ("libcurl.so.4", "libcurl-gnutls.so.4"):
    try:
        ctypes.CDLL(n)
    except OSError:
        pass
print("\n".join(sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libcurl" in l})))')
    [ -n "$curl_files" ] || fail "libcurl.so.4 does not load here, yet the remote tests passed"
    echo "hiding: $(echo $curl_files)"
    # shellcheck disable=SC2086
    unshare -rm sh -c 'vpy=$1 cli=$2; shift 2
      for f in "$@"; do mount --bind /dev/null "$f" || exit 1; done
      exec "$vpy" - "$cli"' sh "$vpy" "$work/venv-test/bin/keepsake" $curl_files <<'PY' || fail "no clear error without libcurl"
import ctypes, subprocess, sys, threading
for name in ("libcurl.so.4", "libcurl-gnutls.so.4"):
    try:
        ctypes.CDLL(name)
    except OSError:
        continue
    sys.exit(f"{name} still loads: the test hides nothing")
import torch, keepsake, keepsake.torch as kt
kt.save_file({"w": torch.ones(2)}, "local.keepsake")            # the local backend needs no libcurl
assert torch.equal(kt.load_file("local.keepsake")["w"], torch.ones(2))
errors = []
def attempt(url):
    try:
        kt.save_file({"w": torch.ones(2)}, url) if url.startswith("s3") else kt.load_file(url)
    except keepsake.KeepsakeError as e:
        errors.append(e)
urls = ["s3://bucket/run/w.keepsake", "http://127.0.0.1:1/w.keepsake", "https://example.invalid/w.keepsake"] * 3
threads = [threading.Thread(target=attempt, args=(u,)) for u in urls]   # the one-time load, raced
for t in threads: t.start()
for t in threads: t.join()
assert len(errors) == len(urls), f"{len(urls) - len(errors)} remote operations did not raise KeepsakeError"
for e in errors:
    msg = str(e)
    assert "libcurl.so.4" in msg and "apt install libcurl4" in msg and "dnf install libcurl" in msg, msg
    assert isinstance(e, keepsake.UnsupportedError) and e.status_name == "KS_E_UNSUPPORTED", (type(e), e.status_name)
r = subprocess.run([sys.argv[1], "verify", "s3://bucket/run/w.keepsake"], capture_output=True, text=True)
assert r.returncode != 0 and "libcurl.so.4" in r.stderr and "KS_E_UNSUPPORTED" in r.stderr, (r.returncode, r.stderr)
print("without libcurl:", str(errors[0]).splitlines()[0])
PY
  else
    echo "SKIP: no user + mount namespace here (unshare -rm): the missing-libcurl error is not exercised"
  fi
fi

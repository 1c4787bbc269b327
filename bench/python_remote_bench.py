"""The Python package's remote reads and writes against the C library's, on the same loopback servers.

usage: python_remote_bench.py [--build DIR] [--mb N] [--reps N]
Run by `make bench` when the package was built (BUILD/python-pkg on PYTHONPATH). Uses the servers
of $KS_REMOTE_ENV when set, else starts its own (tests/remote/servers.py: moto_server for S3, nginx
for HTTP, the fault proxy) on 127.0.0.1 and stops them at exit; prints "skipped" and exits 0 when
they cannot start or the package was built without libcurl.

The checkpoint is bench_remote's (bench/bench_remote.c): 16 F32 tensors of N/16 MiB (N = --mb,
default 64) plus one of 4 KiB. Rows, best of --reps (3), ratios Python time / C time (< 1: Python
is faster):
- save_file to s3:// (one PUT below 64 MiB, multipart above) against bench_remote's ks_save of the
  same tensors to the same server (BUILD/bench/bench_remote, run with the same size and reps);
- load_file(verify=True) from s3:// and http:// (the object read whole into memory the tensors own,
  every checksum verified) against bench_remote's ks_load (lazy mode, parallel ranged GETs,
  verified on arrival), and against the CLI's `keepsake verify` of the very object Python wrote;
- safe_open + get_tensor of one tensor over http:// (the header, then that tensor's range).
"""
import argparse
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "remote"))

import remote_env  # noqa: E402


def servers():
    """The servers' environment: $KS_REMOTE_ENV's, or ones started here (None when they cannot start)."""
    if os.environ.get("KS_REMOTE_ENV"):
        try:
            return remote_env.load()
        except (RuntimeError, OSError) as e:
            print(f"python_remote_bench: {e}")
            return None
    d = tempfile.mkdtemp(prefix="ks-pyremote-")
    script = os.path.join(REPO, "tests", "remote", "servers.py")
    started = subprocess.run([sys.executable, script, "start", "--dir", d], stdout=subprocess.DEVNULL).returncode == 0

    def stop():
        subprocess.run([sys.executable, script, "stop", "--dir", d], stdout=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)

    atexit.register(stop)
    if not started:
        return None
    os.environ["KS_REMOTE_ENV"] = os.path.join(d, "servers.env")
    return remote_env.load()


def best(fn, reps):
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        out = t if out is None else min(out, t)
    return out


def c_bench(build, mb, reps):
    """bench_remote's keepsake MiB/s per row ({"upload, S3 (moto)": MiB/s, ...}), or {} without it."""
    exe = os.path.join(build, "bench", "bench_remote")
    if not os.access(exe, os.X_OK):
        return {}
    env = dict(os.environ, KS_BENCH_REMOTE_MB=str(mb), KS_BENCH_REPS=str(reps), KS_BENCH_LAZY_MB=str(mb))
    env.pop("AWS_ENDPOINT_URL", None)  # bench_remote names its endpoint itself
    p = subprocess.run([exe], env=env, capture_output=True, text=True)
    rows = {}
    for line in p.stdout.splitlines():
        m = re.match(r"\s+(.+?)\s+keepsake\s+([\d.]+) MiB/s", line)
        if m:
            rows[m.group(1)] = float(m.group(2))
    if p.returncode or not rows:
        print(f"  (bench_remote failed: {p.stderr.strip()[-300:] or p.stdout.strip()[-300:]})")
    return rows


def row(what, mib, py_s, c_s, c_name):
    line = f"  {what:<46} python {py_s * 1e3:8.1f} ms ({mib / py_s:7.1f} MiB/s)"
    if c_s:
        line += f"   {c_name} {c_s * 1e3:8.1f} ms ({mib / c_s:7.1f} MiB/s)   python/C {py_s / c_s:5.2f}"
    print(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=None, help="the build tree (default: the parent of the package on PYTHONPATH)")
    ap.add_argument("--mb", type=int, default=int(os.environ.get("KS_BENCH_REMOTE_MB", "64")))
    ap.add_argument("--reps", type=int, default=int(os.environ.get("KS_BENCH_REPS", "3")))
    a = ap.parse_args()

    import torch

    import keepsake
    import keepsake.torch as kt

    build = a.build or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(keepsake.__file__))))
    env = servers()
    if env is None:
        print("python_remote_bench: skipped (no test servers)")
        return 0
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_S3_ENDPOINT"]
    bucket = f"pybench-{uuid.uuid4().hex[:8]}"
    try:
        remote_env.make_bucket(bucket)
    except (RuntimeError, OSError) as e:
        print(f"python_remote_bench: skipped (no S3 server answers: {e})")
        return 0
    count, elems = 16, a.mb * 1024 * 1024 // 4 // 16
    g = torch.Generator().manual_seed(0)
    tensors = {f"layer{i:03d}.weight": torch.rand(elems, generator=g) for i in range(count)}
    tensors["small"] = torch.rand(1024, generator=g)
    url = f"s3://{bucket}/py.keepsake"
    try:
        kt.save_file(tensors, url)
    except keepsake.UnsupportedError:
        print("python_remote_bench: skipped (the package was built without libcurl)")
        return 0
    local = os.path.join(env["KS_TEST_HTTP_ROOT"], f"py-{bucket}.keepsake")
    kt.save_file(tensors, local, fsync=False)
    size = os.path.getsize(local)
    mib = size / (1 << 20)
    http = f"{env['KS_TEST_HTTP_URL']}/py-{bucket}.keepsake"
    print(f"checkpoint of {mib:.0f} MiB ({count + 1} tensors), best of {a.reps}, loopback servers")

    c = c_bench(build, a.mb, a.reps)
    c_time = {k: size / (1 << 20) / v for k, v in c.items()}

    row("save_file -> S3 (moto)", mib, best(lambda: kt.save_file(tensors, url), a.reps),
        c_time.get("upload, S3 (moto)"), "C ks_save")
    py_s3 = best(lambda: kt.load_file(url, verify=True), a.reps)
    row("load_file(verify) <- S3 (moto)", mib, py_s3, c_time.get("download + verify, S3 (moto)"), "C ks_load")
    py_http = best(lambda: kt.load_file(http, verify=True), a.reps)
    row("load_file(verify) <- HTTP (nginx)", mib, py_http, c_time.get("download + verify, HTTP (nginx)"),
        "C ks_load")

    cli = os.path.join(build, "keepsake")
    if os.access(cli, os.X_OK):
        def verify(loc):
            subprocess.run([cli, "verify", loc], check=True, capture_output=True)
        row("the same object: load_file vs CLI verify, S3", mib, py_s3, best(lambda: verify(url), a.reps),
            "keepsake verify")
        row("the same object: load_file vs CLI verify, HTTP", mib, py_http, best(lambda: verify(http), a.reps),
            "keepsake verify")

    def one_tensor():
        with keepsake.safe_open(http) as f:
            f.get_tensor("layer007.weight")
    t = best(one_tensor, a.reps)
    print(f"  {'safe_open + one tensor <- HTTP (lazy)':<46} python {t * 1e3:8.1f} ms "
          f"({elems * 4 / (1 << 20):.0f} MiB tensor of a {mib:.0f} MiB object)")
    os.remove(local)
    return 0


if __name__ == "__main__":
    sys.exit(main())

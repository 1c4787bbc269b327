#!/usr/bin/env python3
"""A rank file of a sharded directory truncated by another process while `keepsake verify DIR`,
`diff DIR DIR` and `reshard` read it: each must fail with an error naming the file, never die of
SIGBUS. The CLI reads every input (README: "read, never mapped"), so the truncation, made
deterministic by an LD_PRELOAD shim (truncate_shim.c: the file is cut right after a program maps
it, or right before a read past its first 64 KiB), is a short read and an error.

  shard_truncate.py KEEPSAKE MAKE_SHARDED SHIM WORKDIR

Standard library only.
"""
import os
import shutil
import subprocess
import sys

RANK1 = "rank-00001-of-00003.keepsake"


def main():
    cli, make, shim, work = (os.path.abspath(a) for a in sys.argv[1:5])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    valid = os.path.join(work, "valid")
    subprocess.check_call([make, valid, "--pad-mib", "4"])  # 4 MiB of data per rank file
    failures = []
    for name, argv, want in (("verify", ["verify", "{d}"], 1), ("diff", ["diff", "{d}", valid], 2),
                             ("reshard", ["reshard", "{d}", "--world-size", "2", os.path.join(work, "out")], 1)):
        d = os.path.join(work, name)
        shutil.copytree(valid, d)
        shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
        log = os.path.join(work, name + ".log")
        env = dict(os.environ, LD_PRELOAD=shim, KS_SHIM_TRUNCATE=os.path.join(d, RANK1), KS_SHIM_LOG=log,
                   ASAN_OPTIONS="verify_asan_link_order=0")
        p = subprocess.run([cli] + [a.format(d=d) for a in argv], env=env, capture_output=True, text=True,
                           timeout=120)
        out = p.stdout + p.stderr
        how = open(log).read().split() if os.path.exists(log) else []
        print("%-7s exit %d, the file cut after: %s" % (name, p.returncode, " ".join(how) or "nothing"))
        if p.returncode < 0:
            failures.append("%s: killed by signal %d (the file cut after %s)" % (name, -p.returncode, how))
        elif p.returncode != want:
            failures.append("%s: exit %d, want %d\n%s" % (name, p.returncode, want, out[-800:]))
        elif RANK1 not in out:
            failures.append("%s: the output does not name %s\n%s" % (name, RANK1, out[-800:]))
        if how != ["pread"]:  # the shim cut it, during a read, not a mapping
            failures.append("%s: the file was cut after %s, not during a read" % (name, how or "nothing"))
        if os.path.getsize(os.path.join(d, RANK1)) != 4096:
            failures.append("%s: the rank file was not truncated" % name)
        if os.path.exists(os.path.join(work, "out", "model.safetensors.index.json")):
            failures.append("%s: wrote an index" % name)
    for f in failures:
        print("FAIL:", f)
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A file truncated by another process while `keepsake verify`, `convert` and
`diff` read it: the commands must fail cleanly or succeed, never die of a
signal (SIGBUS from a mapping whose pages vanished).

  truncate_race.py KEEPSAKE WORKDIR [RUNS]

Makes a 64 MiB keepsake file and a 64 MiB torch .pt, then RUNS times (default
100, split across the commands) copies one to a victim, starts a command on
it and truncates the victim after a random delay. Standard library only.
"""
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import zipfile

MIB = 1 << 20


def torch_file(path, nbytes):
    """A torch.save-style archive holding one U8 tensor of nbytes."""
    def ustr(s):
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    def tup(*xs):
        return b"(" + b"".join(xs) + b"t"

    def pint(v):
        return b"J" + struct.pack("<i", v)

    pid = tup(ustr("storage"), b"ctorch\nByteStorage\n", ustr("0"), ustr("cpu"), pint(nbytes)) + b"Q"
    args = tup(pid, pint(0), tup(pint(nbytes)), tup(pint(1)), b"\x89", b"ccollections\nOrderedDict\n)R")
    pkl = b"\x80\x02}" + ustr("w") + b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"Rs."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", random.Random(1).randbytes(nbytes))
        z.writestr("archive/version", "3\n")


def main():
    ks, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    os.makedirs(work, exist_ok=True)
    pt, kf = os.path.join(work, "master.pt"), os.path.join(work, "master.keepsake")
    torch_file(pt, 64 * MIB)
    subprocess.run([ks, "convert", pt, kf], check=True, capture_output=True)
    rng = random.Random(9)
    signals, outcomes = [], {}
    for i in range(runs):
        kind = ("verify", "convert", "convert-pt", "diff")[i % 4]
        master = pt if kind == "convert-pt" else kf
        victim = os.path.join(work, "victim" + os.path.splitext(master)[1])
        shutil.copyfile(master, victim)
        out = os.path.join(work, "out.keepsake")
        cmd = {"verify": [ks, "verify", victim], "convert": [ks, "convert", victim, out],
               "convert-pt": [ks, "convert", victim, out], "diff": [ks, "diff", victim, kf]}[kind]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0, 0.06))
        os.truncate(victim, rng.choice((0, 4096, 32 * MIB, 64 * MIB - 4096)))
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            signals.append(f"run {i} ({kind}): hang")
            continue
        if p.returncode < 0:
            signals.append(f"run {i} ({kind}): signal {-p.returncode}")
        outcomes[(kind, p.returncode)] = outcomes.get((kind, p.returncode), 0) + 1
    for (kind, rc), n in sorted(outcomes.items()):
        print(f"{kind:10s} exit {rc}: {n}")
    for s in signals:
        print("FAIL", s)
    print(f"{runs} truncation runs, {len(signals)} killed by a signal")
    if not signals:
        shutil.rmtree(work, ignore_errors=True)  # 200 MB of files; kept when something failed
    return 1 if signals else 0


if __name__ == "__main__":
    sys.exit(main())

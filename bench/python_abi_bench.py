"""CPU time of keepsake.torch's save_file and load_file, for comparing two builds of the extension.

usage: PYTHONPATH=DIR python python_abi_bench.py [--reps N] [--dir DIR]

Prints the CPU time (this process, user + system: time.process_time) of each row, best of N: wall
time on a shared machine moves by up to 2x between runs (docs/BENCHMARKS.md), CPU time much less.
Run it alternately under two PYTHONPATHs (e.g. build/python-pkg and a copy of it made before a
change), several times each, to compare what the extension costs per call and per entry: the rows
with 100,000 tiny tensors are almost all per-entry work in the extension and the library, the
GPT-2 shapes (148 tensors, 475 MiB) almost all copying and hashing.
"""
import argparse
import gc
import os
import sys
import tempfile
import time

import torch

import keepsake
import keepsake.torch as kt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_bench import gpt2_small_shapes  # noqa: E402


def best(fn, reps, setup=None):
    times = []
    for _ in range(reps):
        if setup:
            setup()
        gc.collect()
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def rows(name, tensors, folder, reps):
    path = os.path.join(folder, "abi.keepsake")

    def rm():
        if os.path.exists(path):
            os.remove(path)
    out = {"save_file (fsync=False)": best(lambda: kt.save_file(tensors, path, fsync=False), reps, rm)}
    out["load_file"] = best(lambda: kt.load_file(path), reps)
    out["load_file(backend='read')"] = best(lambda: kt.load_file(path, backend="read"), reps)
    out["save (to bytes)"] = best(lambda: kt.save(tensors), reps)
    data = kt.save(tensors)
    out["load (from bytes)"] = best(lambda: kt.load(data), reps)
    for what, sec in out.items():
        print(f"  {name:<28} {what:<28} {sec * 1e3:9.1f} ms CPU", flush=True)
    rm()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=os.environ.get("KS_BENCH_TMP") or tempfile.gettempdir())
    a = ap.parse_args()
    torch.manual_seed(0)
    ext = os.path.basename(keepsake._native.__file__)
    print(f"keepsake {keepsake.__version__} ({ext}), torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"best of {a.reps}")
    rows("100,000 x 16 F32", {f"t/{i}": torch.rand(16) for i in range(100_000)}, a.dir, a.reps)
    rows("2,000 x 64 KiB F32", {f"t/{i}": torch.rand(16384) for i in range(2000)}, a.dir, a.reps)
    rows("GPT-2 small shapes (475 MiB)", {n: torch.rand(s) for n, s in gpt2_small_shapes()}, a.dir, a.reps)


if __name__ == "__main__":
    main()

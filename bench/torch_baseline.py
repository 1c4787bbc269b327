"""torch.save / torch.load baseline for bench_io: the same tensors as the C benchmark.

usage: torch_baseline.py COUNT ELEMS DIR REPS
Prints one line: "save_s=<best> load_s=<best> first_load_s=<first> bytes=<payload bytes>".
The first load lands in fresh memory (page faults included, as in a new process); later
loads reuse the memory the previous one freed, which the best-of time reflects.
torch.save gets an fsync too, so both sides pay for the same durability.
"""
import os
import sys
import time

import torch


def main():
    count, elems, folder, reps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    gen = torch.Generator().manual_seed(1)
    tensors = {f"t/{i}": torch.rand(elems, generator=gen) for i in range(count)}
    path = os.path.join(folder, "torch_baseline.pt")
    best_save = best_load = float("inf")
    first_load = None
    for _ in range(reps):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(tensors, f)
            f.flush()
            os.fsync(f.fileno())
        best_save = min(best_save, time.perf_counter() - t0)
        t0 = time.perf_counter()
        loaded = torch.load(path)
        took = time.perf_counter() - t0
        first_load = took if first_load is None else first_load
        best_load = min(best_load, took)
        del loaded
    os.unlink(path)
    print(f"save_s={best_save:.6f} load_s={best_load:.6f} first_load_s={first_load:.6f} bytes={count * elems * 4}")


if __name__ == "__main__":
    main()

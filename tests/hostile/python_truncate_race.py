#!/usr/bin/env python3
"""A checkpoint truncated and rewritten in place by another process while Python reads it:
`keepsake.torch.load_checkpoint` and `load_file(backend="read")` must raise
or succeed, never kill the process with a signal (SIGBUS from a mapping whose pages vanished).

  python_truncate_race.py WORKDIR [RUNS] [--mapped]

A writer process truncates the file to a random length, holds it there a moment, then writes
the original bytes back in 1 MiB pieces at their place (never a rename), in a loop. RUNS
reader processes (default 100, forked from this one so that torch is imported once) each call
load_checkpoint into a model and load_file(backend="read"), touching every byte of every
tensor. KeepsakeError is expected (the file is short, or half rewritten); any other exception
or a signal fails the test. --mapped reads through the mapping instead (the default backend
of load_file, and what load_checkpoint did before): it shows the test catches the SIGBUS.
Run with the venv's Python and PYTHONPATH at the built package.
"""
import os
import random
import signal
import sys
import time
import traceback

import torch

import keepsake
import keepsake.torch as kt
from keepsake._core import native as _native_api

MIB = 1 << 20


def make_model():
    torch.manual_seed(0)
    # about 4 MiB of parameters, in a few tensors of various sizes
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 256), torch.nn.Linear(256, 1024),
                               torch.nn.Linear(1024, 8))


def writer(path, master, seed):
    """Truncate, wait, rewrite in place, wait; forever (the parent kills it)."""
    rng = random.Random(seed)
    n = len(master)
    fd = os.open(path, os.O_RDWR)
    while True:
        os.ftruncate(fd, rng.choice((0, 8, 4096, n // 2, n - 4096)))
        time.sleep(rng.uniform(0, 0.004))
        for off in range(0, n, MIB):
            os.pwrite(fd, master[off:off + MIB], off)
        time.sleep(rng.uniform(0, 0.004))


def touch(tensors):
    """Reads every byte (a mapped page that is gone raises SIGBUS here)."""
    total = 0
    for t in tensors:
        if t.numel():
            total += int(t.detach().contiguous().reshape(-1).view(torch.uint8).sum())
    return total


OUTCOMES = {10: "both raised", 11: "load_file loaded", 12: "load_checkpoint loaded", 13: "both loaded"}


def reader(path, model, mapped):
    """One run: the exit status says what happened (10-13 as OUTCOMES, 3 an unexpected exception)."""
    status = 10
    try:
        for bit, step in ((2, "checkpoint"), (1, "file")):
            try:
                if step == "checkpoint":
                    kt.load_checkpoint(path, model=model, rng=False)
                    touch(list(model.parameters()))
                else:
                    touch(kt.load_file(path, backend="mmap" if mapped else "read").values())
                status += bit
            except keepsake.KeepsakeError:
                pass  # the file was short or half rewritten: an error, as it should be
    except BaseException:  # noqa: BLE001 - anything else is a failure of the test
        traceback.print_exc()
        os._exit(3)
    os._exit(status)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    mapped = "--mapped" in sys.argv
    work = os.path.abspath(args[0])
    runs = int(args[1]) if len(args) > 1 else 100
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(1)  # no intra-op pool in the parent: the readers are forked
    if mapped:  # load_checkpoint as it was: through the mapping
        real = _native_api.Reader
        _native_api.Reader = lambda *a, **k: real(*a, **{**k, "backend": "mmap"})
    path = os.path.join(work, "victim.keepsake")
    model = make_model()
    kt.save_checkpoint(path, model=model, rng=False, fsync=False)
    with open(path, "rb") as f:
        master = f.read()
    wpid = os.fork()
    if wpid == 0:
        try:
            writer(path, master, 7)
        finally:
            os._exit(0)
    statuses, failures = {}, []
    t0 = time.monotonic()
    try:
        for i in range(runs):
            pid = os.fork()
            if pid == 0:
                reader(path, model, mapped)
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                what = f"signal {signal.Signals(os.WTERMSIG(status)).name}"
                failures.append(f"run {i}: killed by {what}")
            else:
                what = OUTCOMES.get(os.WEXITSTATUS(status), f"exit {os.WEXITSTATUS(status)}")
                if os.WEXITSTATUS(status) not in OUTCOMES:
                    failures.append(f"run {i}: {what} (unexpected exception, traceback above)")
            statuses[what] = statuses.get(what, 0) + 1
    finally:
        os.kill(wpid, signal.SIGKILL)
        os.waitpid(wpid, 0)
    for what, n in sorted(statuses.items()):
        print(f"{what}: {n}")
    for f in failures:
        print("FAIL", f)
    killed = sum(1 for f in failures if "killed" in f)
    print(f"{runs} reader runs ({'mapped' if mapped else 'copying read'}) in {time.monotonic() - t0:.1f} s "
          f"against a writer truncating and rewriting in place: {killed} killed by a signal, "
          f"{len(failures) - killed} other failures")
    if not failures:
        os.unlink(path)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

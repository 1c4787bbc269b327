"""keepsake.CheckpointManager's background saves and load_checkpoint's verification, measured
against baselines taken in the same run.

usage: python_manager_bench.py [--gib G] [--dir DIR]
Run by `make bench` when the package was built. Prints best-of-N times and ratios:
  - blocked: how long save(blocking=False) holds the training loop, against a torch memcpy of
    the same tensors into preallocated buffers (ratio = keepsake / memcpy; lower is better);
  - background write: bytes per second of the background write (from save()'s return: the file,
    fsync, rename, latest), against raw write + fsync of the same bytes from Python (ratio =
    keepsake / raw), and the same with the snapshot (the blocked part) counted in;
  - loop: a training loop that saves in the background every few steps, against the same loop
    with no saves (ratio = with / without; lower is better), with the CPU time each used, the
    same with torch on one thread (a core left to the saver, as when a GPU does the compute), and
    the same three saves over a loop four times as long. Each loop's manager is made (and its
    staging reserved) before the loop starts. The floor is the loop alone plus one background
    write: the last save's write, which ends after the last step whatever the saver;
  - staging: save(blocking=False) through a keepsake.torch.HostStaging, CPU tensors standing in
    for CUDA ones: a caller's staging (copied into, then copied out of by the library) against
    the manager's own, exclusive one (the snapshot itself: one copy);
  - verify: load_checkpoint with verify=True (every checksum first) against verify=False;
  - peer: the same background saves against torch-checkpointing's async CheckpointManager (Meta's
    torch_checkpointing, pinned in scripts/requirements-bench.txt; the row is skipped when it is
    not installed) on the same state: blocked time (keepsake: save(blocking=False) until it
    returns; the peer: save() until its stage_future is done, before which the state may not
    change) and time until written (from the call: keepsake's file durable, fsync'd and renamed,
    checksummed; the peer's write_future done, its files in the page cache, not fsync'd, no
    checksums; and the peer followed by an fsync of its files and directories).
"""
import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

import torch

try:
    import torch_checkpointing  # optional peer (scripts/requirements-bench.txt)
except ImportError:
    torch_checkpointing = None

import keepsake
import keepsake.torch as kt


def state(gib):
    """A model of 64 MiB tensors adding up to `gib` GiB."""
    n = max(1, int(gib * 16))
    m = torch.nn.Module()
    for i in range(n):
        m.register_parameter(f"w{i}", torch.nn.Parameter(torch.randn(4096, 4096)))
    return m


def best(fn, reps=3):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def cpu_seconds():
    """User + system CPU time of this process (every thread), in seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def raw_write(path, tensors):
    with open(path, "wb") as f:
        for t in tensors:
            f.write(memoryview(t.numpy()).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def fsync_tree(root):
    """fsync every file under root, then every directory, bottom up (what durability costs the peer)."""
    for d, _, files in os.walk(root, topdown=False):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def peer_saves(model, root, reps=5):
    """torch-checkpointing's async CheckpointManager on model's state_dict: per save, (save() returned,
    stage_future done, write_future done, then fsync'd), each from the call; the first save (which
    spawns the writer process and allocates the staging) is left out."""
    from torch_checkpointing import CheckpointManager
    from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig
    # Its default O_DIRECT stream fails at close (EINVAL) on a file whose size is not a multiple of
    # the block size (every torch.save zip): buffered writes, as its own fallback would do.
    cfg = CheckpointManager.Config(storage_config=LocalFileSystemStorageConfig(use_direct_io=False))
    mgr = CheckpointManager(cfg)
    out = []
    try:
        for i in range(reps + 1):
            where = os.path.join(root, f"peer{i}")
            t0 = time.perf_counter()
            write_future = mgr.save(where, {"model": model.state_dict()})
            t1 = time.perf_counter()
            mgr._staging_future.result()  # the stage_future AsyncCheckpointSaver.save returns
            t2 = time.perf_counter()
            write_future.result()
            t3 = time.perf_counter()
            fsync_tree(where)
            t4 = time.perf_counter()
            if i:
                out.append((t1 - t0, t2 - t0, t3 - t0, t4 - t0))
            shutil.rmtree(os.path.join(root, f"peer{i - 1}"), ignore_errors=True)
    finally:
        mgr.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ks-mgr-bench-", dir=a.dir)
    try:
        model = state(a.gib)
        tensors = [p.detach() for p in model.parameters()]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        print(f"state: {len(tensors)} tensors, {nbytes / 2**30:.2f} GiB, in {root}")

        bufs = [torch.empty_like(t) for t in tensors]
        memcpy = best(lambda: [b.copy_(t) for b, t in zip(bufs, tensors)])
        del bufs

        ts = keepsake.Timestamp()
        blocked, written, cpu = [], [], []
        with keepsake.CheckpointManager(os.path.join(root, "run"), model=model, timestamp=ts, keep_last=1,
                                        rng=False, preemption_signals=()) as mgr:
            for i in range(5):  # the first saves grow the staging buffer (page faults); later ones reuse it
                ts.batch += 1
                c0, t0 = cpu_seconds(), time.perf_counter()
                mgr.save(blocking=False)
                t1 = time.perf_counter()
                mgr.wait()
                blocked.append(t1 - t0)
                written.append(time.perf_counter() - t1)
                cpu.append(cpu_seconds() - c0)
        save_cpu = min(cpu[1:]) / (nbytes / 2**30)
        cores = len(os.sched_getaffinity(0))
        raw = best(lambda: raw_write(os.path.join(root, "raw.bin"), tensors))
        os.remove(os.path.join(root, "raw.bin"))
        print(f"blocked by save(blocking=False): {min(blocked):.3f} s   torch memcpy into buffers: {memcpy:.3f} s"
              f"   ratio {min(blocked) / memcpy:.2f}x (goal <= 1.2x)")
        bg = min(written)
        print(f"background write (from save()'s return to durable + latest): {nbytes / bg / 2**30:.2f} GiB/s   "
              f"raw write+fsync: {nbytes / raw / 2**30:.2f} GiB/s   ratio {raw / bg:.2f}x (goal >= 0.8x)")
        whole = min(b + w for b, w in zip(blocked, written))
        print(f"  with the snapshot (save() called to durable + latest): {nbytes / whole / 2**30:.2f} GiB/s   "
              f"ratio {raw / whole:.2f}x")

        # Device tensors go through a HostStaging: with a caller's (not exclusive), into it, then the
        # library copies them into its snapshot; with the manager's own kind (exclusive), straight
        # into the snapshot. Measured with CPU tensors standing in for device ones (the staging's
        # copy is then a memcpy, where a GPU's is a device-to-host copy): the copy saved is the second.
        marked = {t.untyped_storage().data_ptr() for t in tensors}

        def through_staging(exclusive):
            st = kt.HostStaging(alloc=lambda n: torch.empty(n, dtype=torch.uint8),
                                is_device=lambda t: t.untyped_storage().data_ptr() in marked, sync=lambda d: None,
                                exclusive=exclusive)
            times = []
            with keepsake.CheckpointManager(os.path.join(root, f"staged{int(exclusive)}"), model=model, keep_last=1,
                                            rng=False, preemption_signals=(), staging=st) as m:
                for i in range(4):
                    t0 = time.perf_counter()
                    m.save(blocking=False)
                    times.append(time.perf_counter() - t0)
                    m.wait()
            return min(times[1:])

        shared, exclusive = through_staging(False), through_staging(True)
        print(f"save(blocking=False) through a HostStaging (CPU tensors standing in for CUDA ones): caller's "
              f"staging {shared:.3f} s, the manager's own (exclusive: the snapshot itself) {exclusive:.3f} s   "
              f"ratio {exclusive / shared:.2f}x (one host copy of the state instead of two)")

        # A loop of "training steps" (a matmul per tensor group) with a background save every 8 steps.
        # Timed from the first step to the last, then the close() that waits for the last save
        # (which nothing overlaps): both are reported, and the ratio is of the sum. The manager is
        # made, and its staging reserved, before the loop, as a program does once before training.
        x = torch.randn(512, 4096)
        setup = []

        def loop(save_every, steps=24):
            t = keepsake.Timestamp()
            r0 = time.perf_counter()
            m = keepsake.CheckpointManager(os.path.join(root, f"loop{save_every}"), model=model, timestamp=t,
                                           save_every=f"{save_every}ba", keep_last=1, async_save=True, rng=False,
                                           preemption_signals=())
            if save_every <= steps:
                m.reserve()
                setup.append(time.perf_counter() - r0)
            c0, t0 = cpu_seconds(), time.perf_counter()
            for _ in range(steps):
                for w in tensors[:4]:
                    x @ w
                t.batch += 1
                m.step()
            t1 = time.perf_counter()
            m.close()
            return t1 - t0, time.perf_counter() - t1, cpu_seconds() - c0

        def loops(threads, every=8, steps=24):
            old = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                plain = min((loop(10**9, steps) for _ in range(2)), key=lambda r: r[0] + r[1])
                saving = min((loop(every, steps) for _ in range(2)), key=lambda r: r[0] + r[1])
            finally:
                torch.set_num_threads(old)
            return plain, saving

        threads = torch.get_num_threads()
        plain, saving = loops(threads)
        print(f"loop with background saves every 8 steps ({threads} torch threads): {sum(saving[:2]):.2f} s "
              f"(steps {saving[0]:.2f} s + waiting for the last save at close {saving[1]:.2f} s)   without saves: "
              f"{sum(plain[:2]):.2f} s   ratio {sum(saving[:2]) / sum(plain[:2]):.2f}x (goal <= 1.1x; "
              f"steps alone {saving[0] / plain[0]:.2f}x)")
        print(f"  floor: the loop alone plus one background write of the state (the last save's, which no "
              f"saver can overlap with a step): {sum(plain[:2]) + bg:.2f} s, {(sum(plain[:2]) + bg) / sum(plain[:2]):.2f}x")
        print(f"  CPU time: loop alone {plain[2]:.2f} s, with its 3 saves {saving[2]:.2f} s; one background save "
              f"{save_cpu:.2f} CPU s per GiB (copy, hash, write; the kernel's writeback not counted)")
        print(f"  before the loop, once: manager made and reserve() {min(setup):.2f} s (the staging buffer's "
              f"pages faulted in; without it, the first save(blocking=False) of each run waits for them)")
        if cores > 1:
            plain1, saving1 = loops(1)
            print(f"loop with background saves every 8 steps (1 torch thread, {cores} cores): "
                  f"{sum(saving1[:2]):.2f} s (steps {saving1[0]:.2f} s + waiting for the last save at close "
                  f"{saving1[1]:.2f} s)   without saves: {sum(plain1[:2]):.2f} s   "
                  f"ratio {sum(saving1[:2]) / sum(plain1[:2]):.2f}x (steps alone {saving1[0] / plain1[0]:.2f}x)")
        # The same three saves over a loop four times as long: the last save's wait, which nothing
        # overlaps, then weighs a quarter as much.
        plain4, saving4 = loops(threads, 32, 96)
        print(f"loop with background saves every 32 steps (96 steps, {threads} torch threads): "
              f"{sum(saving4[:2]):.2f} s (steps {saving4[0]:.2f} s + waiting for the last save at close "
              f"{saving4[1]:.2f} s)   without saves: {sum(plain4[:2]):.2f} s   "
              f"ratio {sum(saving4[:2]) / sum(plain4[:2]):.2f}x (goal <= 1.1x; steps alone {saving4[0] / plain4[0]:.2f}x)")
        print(f"  floor: the loop alone plus one background write {(sum(plain4[:2]) + bg) / sum(plain4[:2]):.2f}x")

        if torch_checkpointing is None:
            print("torch-checkpointing: not installed (scripts/requirements-bench.txt): peer row skipped")
        else:
            peer = peer_saves(model, root)
            ks_whole = min(b + w for b, w in zip(blocked[1:], written[1:]))
            p_blocked = min(p[1] for p in peer)
            p_written = min(p[2] for p in peer)
            p_durable = min(p[3] for p in peer)
            print(f"background save vs torch-checkpointing {torch_checkpointing.__version__} async CheckpointManager "
                  f"({nbytes / 2**30:.2f} GiB, CPU tensors, best of {len(peer)}):")
            print(f"  blocked: keepsake {min(blocked[1:]):.3f} s   torch-checkpointing {p_blocked:.3f} s (save() "
                  f"returns after {min(p[0] for p in peer):.3f} s; stage_future done)   ratio "
                  f"{p_blocked / min(blocked[1:]):.2f}x (> 1: keepsake blocks less)")
            print(f"  until written: keepsake {ks_whole:.3f} s (durable, checksummed)   torch-checkpointing "
                  f"{p_written:.3f} s (write_future; page cache, no fsync, no checksum)   ratio {p_written / ks_whole:.2f}x"
                  f"   its files then fsync'd: {p_durable:.3f} s, ratio {p_durable / ks_whole:.2f}x")

        path = os.path.join(root, "ck.keepsake")
        # Durable first: pages still being written back would slow whichever load runs first.
        kt.save_checkpoint(path, model=model, rng=False)
        with_v = best(lambda: kt.load_checkpoint(path, model=model, rng=False, verify=True))
        without = best(lambda: kt.load_checkpoint(path, model=model, rng=False, verify=False))
        print(f"load_checkpoint verify=True: {with_v:.3f} s   verify=False: {without:.3f} s   "
              f"cost of verifying {with_v / without:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

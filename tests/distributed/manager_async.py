"""keepsake.CheckpointManager(distributed=True, async_save=True) under torchrun (gloo, CPU) when
training steps and background saves take different times: slower steps than saves, faster ones,
and times that differ per rank and change from batch to batch. Every rank must take the same
collective path at every step whatever it sees of its own background save; a rank that commits
(or forgets) a save the others still wait for deadlocks the next save.

    python manager_async.py N        the test: starts the jobs below at N ranks and checks them
    torchrun ... manager_async.py train ROOT RUN... [--kill-at K]
                                     each RUN (a profile, or PROFILE-NAME) in ROOT/RUN, one after another

Each profile trains a tiny FSDP2 model with AdamW, a train metric, per-rank data positions and
generators (torch, Python, numpy) for 8 batches, saving in the background every 2 (keep_last=2):

  slow   every step takes 0.3 s, longer than a save: each background save is done at the next step.
  fast   steps take no time, each rank's write 0.2 s: the next save waits for the one in flight.
  mixed  step times per rank and batch from 0 to 0.2 s; each rank's write (0 or 0.1 s) and the
         moment its save's future completes (0 or 0.25 s after DCP's) alternate between ranks, so at
         some steps one rank's save is done while another's is not.
  warn   on_save_error="warn": rank 1's write of the save at batch 4 fails; every rank warns once
         (save_errors == 1), goes on, and the later saves commit.

The test (N ranks, two jobs):
  1  mixed-resumed: rank 1 is SIGKILLed inside its background write of ep0-ba6 (its file written,
     no index): ep0-ba2 and ep0-ba4 are the committed ones.
  2  mixed-resumed restarts, resumes from ep0-ba4 and finishes; then the four profiles run
     uninterrupted. Each finishes (a watchdog dumps every thread's stack and fails the job when a
     step takes over 45 s: a deadlock fails, it does not hang), keeps ep0-ba6 and ep0-ba8, `latest`
     -> ep0-ba8; the steps saw what the profile is for (a finished save at a step when slow, one
     in flight when fast, ranks disagreeing at some step when mixed). Every rank's parameters,
     AdamW state, metric state, data position and generators after mixed-resumed equal mixed's
     bit for bit.
Exit 77 when torch.distributed, gloo or torchmetrics is unavailable.
"""
from __future__ import annotations

import os
import shutil
import sys

import launch  # this folder: how its tests start jobs

INDEX = "model.safetensors.index.json"
STEPS = 8
WATCHDOG_S = 45  # one step (a save included) takes well under a second here

# profile -> (seconds of rank r's step at batch b, of its write of the save at b, from DCP's future
# completing to its own at b)
PROFILES = {
    "slow": (lambda r, b: 0.3, lambda r, b: 0.0, lambda r, b: 0.0),
    "fast": (lambda r, b: 0.0, lambda r, b: 0.2, lambda r, b: 0.0),
    "mixed": (lambda r, b: (0.0, 0.05, 0.2)[(b + r) % 3], lambda r, b: (0.0, 0.1)[(b // 2 + r) % 2],
              lambda r, b: (0.0, 0.25)[(b // 2 + r + 1) % 2]),
    "warn": (lambda r, b: 0.1, lambda r, b: 0.0, lambda r, b: 0.0),
}


# ----------------------------------------------------------------------------------------------
# The worker (under torchrun)
# ----------------------------------------------------------------------------------------------

class Loader:
    """A data position per rank: each rank advances by its own stride."""

    def __init__(self, rank: int) -> None:
        self.rank, self.pos = rank, 0

    def next(self):
        import torch
        g = torch.Generator().manual_seed(1000 * self.pos + self.rank)
        self.pos += 1 + self.rank
        return torch.randn(4, 8, generator=g)

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, d: dict) -> None:
        self.pos = int(d["pos"])


class Timing:
    """What the profile does to the saves: delays (and a failure or a kill) inside each rank's
    write, and a delay between DCP's future completing and the one the manager holds."""

    def __init__(self, rank: int) -> None:
        self.rank, self.profile, self.kill_at, self.fail_at = rank, "slow", -1, -1

    def batch_of(self, path: str) -> int:
        return int(os.path.basename(str(path)).rsplit("ba", 1)[1])

    def install(self) -> None:
        import concurrent.futures
        import signal
        import threading
        import time

        import torch.distributed.checkpoint as dcp
        from keepsake._distributed import manager as _dist_manager
        timing = self
        writer = _dist_manager._writer_class()
        write_data = writer.write_data

        def timed_write(w, plan, planner):
            b = timing.batch_of(w.path)
            time.sleep(PROFILES[timing.profile][1](timing.rank, b))
            if b == timing.fail_at and timing.rank == 1:
                raise OSError(f"injected write failure of {os.path.basename(w.path)} on rank 1")
            fut = write_data(w, plan, planner)  # this rank's file is written ...
            if b == timing.kill_at and timing.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # ... and the job dies before the index
            return fut

        writer.write_data = timed_write
        async_save = dcp.async_save

        def late_async_save(state_dict, *a, storage_writer=None, **kw):
            inner = async_save(state_dict, *a, storage_writer=storage_writer, **kw)
            delay = PROFILES[timing.profile][2](timing.rank, timing.batch_of(storage_writer.path))
            if not delay:
                return inner
            outer: concurrent.futures.Future = concurrent.futures.Future()

            def settle(f):
                e = f.exception()
                outer.set_exception(e) if e is not None else outer.set_result(f.result())

            inner.add_done_callback(lambda f: threading.Timer(delay, settle, (f,)).start())
            return outer

        dcp.async_save = late_async_save


def train(label: str, root: str, timing: Timing) -> None:
    import faulthandler
    import random
    import time

    import numpy as np
    import torch
    import torch.distributed as dist
    import torchmetrics
    from torch.distributed.fsdp import fully_shard

    import keepsake

    rank, world = dist.get_rank(), dist.get_world_size()
    profile = label.split("-")[0]
    step_s = PROFILES[profile][0]
    timing.profile = profile
    timing.fail_at = 4 if profile == "warn" else -1
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    fully_shard(model)
    torch.manual_seed(100 + rank)
    random.seed(rank)
    np.random.seed(rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metric = torchmetrics.MeanMetric()
    loader = Loader(rank)
    ts = keepsake.Timestamp()
    run = os.path.join(root, label)
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    mgr = keepsake.CheckpointManager(os.path.join(run, "run"), model=model, optimizers=opt,
                                     train_metrics={"loss": metric}, timestamp=ts, dataset_state={"loader": loader},
                                     save_every="2ba", keep_last=2, async_save=True, preemption_signals=(),
                                     on_save_error="warn" if profile == "warn" else "raise", distributed=True)
    if mgr.autoresume() and rank == 0:
        print(f"{label}: resumed from {os.path.basename(mgr.last_resumed)} at batch {ts.batch}", flush=True)
    saved, split, states = [], 0, []
    t0 = time.monotonic()
    while ts.batch < STEPS:
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
        opt.zero_grad()
        x = loader.next() + 0.1 * torch.randn(4, 8) + random.random() + float(np.random.rand())
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        metric.update(loss.detach())
        ts.batch += 1
        ts.batch_in_epoch += 1
        time.sleep(step_s(rank, ts.batch))
        # What this rank sees of its background save before the step (0 none, 1 in flight, 2 done),
        # gathered on the default group (not the manager's): at some steps of `mixed` they differ.
        pending = getattr(mgr, "_pending", None)
        mine = 0 if pending is None else (2 if pending[0].done() else 1)
        seen = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(seen, torch.tensor([mine]))
        seen_set = {int(s.item()) for s in seen}
        states.append(mine)
        split += int({1, 2} <= seen_set)
        path = mgr.step()
        if path is not None:
            saved.append(os.path.basename(path))
    mgr.close()
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        print(f"{label}: saved {' '.join(saved)}; done-at-step {states.count(2)} in-flight-at-step "
              f"{states.count(1)} split-steps {split}; save_errors {mgr.save_errors}; "
              f"{time.monotonic() - t0:.2f} s", flush=True)
    errors = torch.tensor([mgr.save_errors])
    dist.all_reduce(errors, op=dist.ReduceOp.MIN)
    assert int(errors) == mgr.save_errors, "the ranks counted different save errors"
    write_final(model, opt, metric, loader, os.path.join(run, f"final-{rank}.keepsake"))
    dist.barrier()


def write_final(model, opt, metric, loader, path: str) -> None:
    """This rank's state after training: local parameter shards, AdamW state, metric state, data
    position and the next draw of each generator."""
    import random

    import numpy as np
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    import keepsake.torch as kt
    msd, osd = get_state_dict(model, opt)
    final = {}
    for k, v in msd.items():
        final[f"model/{k}"] = v.to_local() if isinstance(v, DTensor) else v
    for k, st in osd["state"].items():
        for name, v in st.items():
            final[f"optim/{k}/{name}"] = v.to_local() if isinstance(v, DTensor) else torch.as_tensor(v)
    final["metric"] = torch.stack([metric.mean_value, metric.weight]).to(torch.float64)
    final["metric_count"] = torch.tensor([metric._update_count])
    final["loader_pos"] = torch.tensor([loader.pos])
    final["rng_torch"] = torch.rand(4)
    final["rng_python_numpy"] = torch.tensor([random.random(), float(np.random.rand())], dtype=torch.float64)
    kt.save_file({k: v.detach().contiguous() for k, v in final.items()}, path)


def worker(argv: list) -> None:
    import torch.distributed as dist
    root = argv[0]
    runs = [a for a in argv[1:] if a.split("-")[0] in PROFILES]
    dist.init_process_group("gloo")
    timing = Timing(dist.get_rank())
    if "--kill-at" in argv:
        timing.kill_at = int(argv[argv.index("--kill-at") + 1])
    timing.install()
    for label in runs:
        train(label, root, timing)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# The test (plain python)
# ----------------------------------------------------------------------------------------------

def torchrun(n: int, *args: str, expect_ok: bool = True):
    return launch.torchrun(n, __file__, "train", *args, expect_ok=expect_ok, timeout=240)


def committed(run: str) -> list:
    names = [n for n in os.listdir(run) if n.startswith("ep") and os.path.exists(os.path.join(run, n, INDEX))]
    return sorted(names, key=lambda n: int(n.rsplit("ba", 1)[1]))


def report(out: str, label: str) -> dict:
    """The numbers rank 0 printed for a run."""
    line = next((x for x in out.splitlines() if x.startswith(f"{label}: saved ")), None)
    assert line is not None, out
    saved, rest = line[len(f"{label}: saved "):].split("; done-at-step ")
    words = rest.replace(";", "").split()
    return dict(saved=saved.split(), done=int(words[0]), in_flight=int(words[2]), split=int(words[4]),
                save_errors=int(words[6]), seconds=float(words[7]), line=line)


def compare_finals(a: str, b: str, n: int) -> int:
    import torch
    import keepsake.torch as kt
    count = 0
    for r in range(n):
        fa = kt.load_file(os.path.join(a, f"final-{r}.keepsake"))
        fb = kt.load_file(os.path.join(b, f"final-{r}.keepsake"))
        assert fa.keys() == fb.keys() and len(fa) >= 12, sorted(fa.keys() ^ fb.keys())
        for k in fa:
            x, y = fa[k].reshape(-1).view(torch.uint8), fb[k].reshape(-1).view(torch.uint8)
            assert torch.equal(x, y), f"rank {r}: the resumed run differs at {k}: {fa[k]} vs {fb[k]}"
            count += 1
    return count


def test(n: int) -> None:
    from keepsake import _keepsake as native
    work = launch.workdir(f"dist-async-{n}-")
    try:
        killed = torchrun(n, work, "mixed-resumed", "--kill-at", "6", expect_ok=False)
        assert "exitcode  : -9" in killed.stderr, killed.stderr[-4000:]  # the kill, not a failure
        run = os.path.join(work, "mixed-resumed", "run")
        dead = os.path.join(run, "ep0-ba6")
        assert committed(run) == ["ep0-ba2", "ep0-ba4"], committed(run)
        assert os.path.exists(os.path.join(dead, f"rank-00001-of-{n:05d}.keepsake")), sorted(os.listdir(dead))
        assert not os.path.exists(os.path.join(dead, INDEX))

        job = torchrun(n, work, "mixed-resumed", *PROFILES)
        out = job.stdout
        assert "mixed-resumed: resumed from ep0-ba4 at batch 4" in out, out
        assert report(out, "mixed-resumed")["saved"] == ["ep0-ba6", "ep0-ba8"], out
        assert committed(run) == ["ep0-ba6", "ep0-ba8"], committed(run)
        reports = {p: report(out, p) for p in PROFILES}
        for p, rep in reports.items():
            run = os.path.join(work, p, "run")
            # warn: the save at batch 4 starts (step() returns it) and fails in the background
            assert rep["saved"] == ["ep0-ba2", "ep0-ba4", "ep0-ba6", "ep0-ba8"], rep["line"]
            assert rep["save_errors"] == (1 if p == "warn" else 0), rep["line"]
            assert committed(run) == ["ep0-ba6", "ep0-ba8"], (p, committed(run))
            assert sorted(os.listdir(run)) == [".keepsake.lock", "ep0-ba6", "ep0-ba8", "latest"], \
                (p, sorted(os.listdir(run)))
            assert os.readlink(os.path.join(run, "latest")) == "ep0-ba8", p
            idx = native.shard_index(os.path.join(run, "ep0-ba8"))
            assert idx["world_size"] == n and idx["batch"] == 8, idx
        warned = job.stderr.count("keepsake: warning: checkpoint save failed")
        assert warned == n, (warned, job.stderr[-4000:])  # once on every rank
        # The profiles did what they are for (rank 0's view; `split`: the ranks' views differed).
        assert reports["slow"]["done"] >= 1, reports["slow"]["line"]
        assert reports["fast"]["in_flight"] >= 1, reports["fast"]["line"]
        assert reports["mixed"]["split"] >= 1, reports["mixed"]["line"]
        k = compare_finals(os.path.join(work, "mixed"), os.path.join(work, "mixed-resumed"), n)
        for p in PROFILES:
            print(f"  {reports[p]['line']}")
        print(f"dist manager, background saves at {n} ranks: OK (slow, fast, mixed and warn profiles finish; "
              f"killed in a background write and resumed from ep0-ba4: {k} final tensors bit-identical)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        worker(sys.argv[2:])
    else:
        launch.require("torch.distributed.checkpoint", "torchmetrics", "numpy")
        test(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

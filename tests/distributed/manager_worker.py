"""keepsake.CheckpointManager(distributed=True) under torchrun (gloo, CPU): FSDP2 + AdamW + an LR
scheduler + a callback + a torchmetrics train metric and an eval metric, per-rank generators and
data positions, saved every 3 batches into sharded checkpoint directories that the C manager names,
prunes and resumes from.

    python manager_worker.py N              the test: starts the runs below at N ranks and checks them
    torchrun ... manager_worker.py train RUN STEPS [--kill-at K] [--preempt-at P] [--async] [--best]

The test (N ranks):
  A   12 batches uninterrupted (keep_last=2): ep0-ba9 and ep0-ba12 remain, every other is gone.
  B1  the same run; rank 1 is SIGKILLed inside the save at batch 9 (its file written, no index).
  B2  restarted with async saves: resumes from ep0-ba6, not from the newer ep0-ba9 that has no
      index (removed by the C manager); rank 1 alone gets SIGUSR1 after batch 10, so every rank
      saves ep0-ba10 and exits 75 (Preempted).
  B3  restarted: resumes from ep0-ba10 and finishes.
  Every rank's final parameters, AdamW moments, scheduler state, callback state, generator, data
  position and train and eval metric states equal A's bit for bit; B keeps the newest 2 and the best
  1 by the eval metric stored in rank 0's files (keep_best=1 on "eval_metrics/val/score", min: the
  lowest mean |x|, an early one), as computed here from the values each save logged.
Exit 77 when torch.distributed, gloo or torchmetrics is unavailable.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import launch  # this folder: how its tests start jobs

HERE = os.path.dirname(os.path.abspath(__file__))
INDEX = "model.safetensors.index.json"
STEPS = 12


# ----------------------------------------------------------------------------------------------
# The worker (under torchrun)
# ----------------------------------------------------------------------------------------------

class Loader:
    """A data position per rank: each rank advances by its own stride, so positions differ."""

    def __init__(self, rank: int) -> None:
        self.rank, self.pos = rank, 0

    def next(self):
        import torch
        g = torch.Generator().manual_seed(1000 * self.pos + self.rank)
        self.pos += 1 + self.rank
        return torch.randn(6, 12, generator=g)

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, d: dict) -> None:
        self.pos = int(d["pos"])


class LrLog:
    """A callback with replicated state: plain values, a list and a tensor (the same on every rank)."""

    def __init__(self) -> None:
        import torch
        self.seen, self.history, self.ema = 0, [], torch.zeros(2, dtype=torch.float64)

    def on_batch(self, lr: float) -> None:
        self.seen += 1
        self.history.append(lr)
        self.ema = 0.9 * self.ema + 0.1 * lr

    def state_dict(self) -> dict:
        return {"seen": self.seen, "history": list(self.history), "ema": self.ema.clone()}

    def load_state_dict(self, d: dict) -> None:
        self.seen, self.history, self.ema = int(d["seen"]), list(d["history"]), d["ema"].clone()


def worker(argv: list) -> None:
    import random

    import torch
    import torch.distributed as dist
    import torchmetrics
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    import keepsake
    import keepsake.torch as kt
    from keepsake._distributed import manager as _dist_manager
    from keepsake.distributed import synced

    run, steps = argv[0], int(argv[1])
    opt_args = argv[2:]
    kill_at = int(opt_args[opt_args.index("--kill-at") + 1]) if "--kill-at" in opt_args else -1
    preempt_at = int(opt_args[opt_args.index("--preempt-at") + 1]) if "--preempt-at" in opt_args else -1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)  # each rank's own generators: restored per rank
    random.seed(rank)

    if kill_at > 0 and rank == 1:
        writer = _dist_manager._writer_class()
        original = writer.write_data

        def dying(self, plan, planner):
            fut = original(self, plan, planner)  # this rank's file is written ...
            if os.path.basename(self.path) == f"ep0-ba{kill_at}":
                os.kill(os.getpid(), signal.SIGKILL)  # ... and the job dies before the index
            return fut

        writer.write_data = dying

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(12, 30), torch.nn.ReLU(), torch.nn.Linear(30, 7))
    fully_shard(model)
    torch.manual_seed(100 + rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
    callback = LrLog()
    metric = torchmetrics.MeanMetric()
    score = torchmetrics.MeanMetric()  # an eval metric: a per-rank local state, like the train one
    idle = torchmetrics.MeanMetric()  # an evaluator that never ran: saved without a value, restored empty
    loader = Loader(rank)
    ts = keepsake.Timestamp()
    best = dict(keep_best=1, best_metric="eval_metrics/val/score", best_mode="min") if "--best" in opt_args else {}
    try:  # the C manager uploads checkpoint files, not sharded directories: refused up front
        keepsake.CheckpointManager(os.path.join(run, "run"), upload_to=os.path.join(run, "up"), distributed=True)
        raise AssertionError("upload_to with distributed=True was accepted")
    except keepsake.UnsupportedError as e:
        assert "upload_to" in str(e), e
    evals = {"val": {"score": score}, "test": {"idle": idle}}
    mgr = keepsake.CheckpointManager(os.path.join(run, "run"), model=model, optimizers=opt, schedulers=sched,
                                     train_metrics={"loss": metric}, eval_metrics=evals,
                                     callbacks={"lrlog": callback}, timestamp=ts, dataset_state={"loader": loader},
                                     save_every="3ba", keep_last=2, async_save="--async" in opt_args,
                                     preemption_signals=(signal.SIGUSR1,), distributed=True, **best)
    assert isinstance(mgr, keepsake.CheckpointManager) and type(mgr).__name__ == "DistributedCheckpointManager"
    if mgr.autoresume():
        assert ts.batch > 0 and mgr.last_resumed.endswith(f"ep0-ba{ts.batch}"), (ts.batch, mgr.last_resumed)
        if rank == 0:
            print(f"resumed from {os.path.basename(mgr.last_resumed)} at batch {ts.batch}", flush=True)
    else:
        assert ts.batch == 0
    while ts.batch < steps:
        opt.zero_grad()
        x = loader.next() + 0.1 * torch.randn(6, 12)  # the global generator: its state matters
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        callback.on_batch(sched.get_last_lr()[0])
        metric.update(loss.detach())
        score.update(x.abs().mean())
        ts.batch += 1
        ts.batch_in_epoch += 1
        if ts.batch == preempt_at and rank == 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # one rank only: the all-reduce makes every rank save
        try:
            saved = mgr.step()
        except keepsake.Preempted as p:
            if rank == 0:
                print(f"preempted: saved {os.path.basename(p.path)}", flush=True)
            raise
        if saved is not None:  # every rank saved: the sync below is collective
            with synced(score):
                value = float(score.compute())
            if rank == 0:
                print(f"saved {os.path.basename(saved)} value {value!r}", flush=True)
    mgr.close()
    # This rank's final state: local shards of the parameters and AdamW moments, the next draw of
    # its generator, its data position and its metric states.
    msd, osd = get_state_dict(model, opt)
    final = {}
    for k, v in msd.items():
        final[f"model/{k}"] = v.to_local() if isinstance(v, DTensor) else v
    for k, st in osd["state"].items():
        for name, v in st.items():
            final[f"optim/{k}/{name}"] = v.to_local() if isinstance(v, DTensor) else torch.as_tensor(v)
    final["rng"] = torch.rand(4)
    final["loader_pos"] = torch.tensor([loader.pos])
    final["metric_value"] = metric.mean_value.clone()
    final["metric_weight"] = metric.weight.clone()
    final["metric_count"] = torch.tensor([metric._update_count])
    final["score_value"] = score.mean_value.clone()
    final["score_weight"] = score.weight.clone()
    final["score_count"] = torch.tensor([score._update_count])
    final["idle_count"] = torch.tensor([idle._update_count, int(idle.weight)])
    final["lr"] = torch.tensor(sched.get_last_lr() + [opt.param_groups[0]["lr"]], dtype=torch.float64)
    final["sched_epoch"] = torch.tensor([sched.last_epoch, sched._step_count])
    final["callback_history"] = torch.tensor(callback.history + [float(callback.seen)], dtype=torch.float64)
    final["callback_ema"] = callback.ema.clone()
    kt.save_file({k: v.detach().contiguous() for k, v in final.items()}, os.path.join(run, f"final-{rank}.keepsake"))
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# The test (plain python)
# ----------------------------------------------------------------------------------------------

def torchrun(n: int, *args: str, expect: int = 0, timeout: int = 100) -> str:
    p = launch.torchrun(n, __file__, "train", *args, expect_ok=expect == 0, timeout=timeout)
    if expect and expect != 1:  # a worker's own exit status, as torchrun reports it
        assert f"exitcode  : {expect}" in p.stderr, p.stderr[-4000:]
    return p.stdout


def committed(run: str) -> list:
    """The checkpoint directories with an index, oldest first by batch."""
    d = os.path.join(run, "run")
    names = [n for n in os.listdir(d) if n.startswith("ep") and os.path.exists(os.path.join(d, n, INDEX))]
    return sorted(names, key=lambda n: int(n.rsplit("ba", 1)[1]))


def saved_values(out: str) -> dict:
    vals = {}
    for line in out.splitlines():
        if line.startswith("saved ") and " value " in line:
            name, value = line[len("saved "):].split(" value ")
            vals[name] = float(value)
    return vals


def expected_retention(order: list, values: dict, keep_last: int, keep_best: int) -> set:
    """What keep_last + keep_best (min) leave, applied after each commit as the C manager does."""
    present: list = []
    for name in order:
        if name not in present:
            present.append(name)
        present.sort(key=lambda n: int(n.rsplit("ba", 1)[1]))
        keep = set(present[-keep_last:])
        if keep_best:
            keep |= set(sorted((n for n in present if n in values), key=lambda n: values[n])[:keep_best])
        present = [n for n in present if n in keep]
    return set(present)


def compare_finals(a: str, b: str, n: int) -> int:
    import torch
    import keepsake.torch as kt
    count = 0
    for r in range(n):
        fa = kt.load_file(os.path.join(a, f"final-{r}.keepsake"))
        fb = kt.load_file(os.path.join(b, f"final-{r}.keepsake"))
        assert fa.keys() == fb.keys() and len(fa) >= 20, sorted(fa.keys() ^ fb.keys())
        for k in fa:
            x, y = fa[k].reshape(-1).view(torch.uint8), fb[k].reshape(-1).view(torch.uint8)
            assert torch.equal(x, y), f"rank {r}: the resumed run differs at {k}: {fa[k]} vs {fb[k]}"
            count += 1
    return count


def test(n: int) -> None:
    from keepsake import _keepsake as native
    work = launch.workdir(f"dist-manager-{n}-")
    try:
        a, b = os.path.join(work, "a"), os.path.join(work, "b")
        out_a = torchrun(n, a, str(STEPS))
        assert committed(a) == ["ep0-ba9", "ep0-ba12"], committed(a)
        assert sorted(os.listdir(os.path.join(a, "run"))) == [".keepsake.lock", "ep0-ba12", "ep0-ba9", "latest"], \
            sorted(os.listdir(os.path.join(a, "run")))
        assert os.readlink(os.path.join(a, "run", "latest")) == "ep0-ba12"
        idx = native.shard_index(os.path.join(a, "run", "ep0-ba12"))
        assert idx["world_size"] == n and idx["batch"] == 12, idx
        values = saved_values(out_a)
        assert sorted(values, key=lambda s: int(s.rsplit("ba", 1)[1])) == ["ep0-ba3", "ep0-ba6", "ep0-ba9",
                                                                            "ep0-ba12"], out_a

        torchrun(n, b, str(STEPS), "--best", "--kill-at", "9", expect=1)
        runb = os.path.join(b, "run")
        dead = os.path.join(runb, "ep0-ba9")
        assert committed(b) == ["ep0-ba3", "ep0-ba6"], committed(b)
        assert os.path.isdir(dead) and not os.path.exists(os.path.join(dead, INDEX)), sorted(os.listdir(runb))
        assert os.path.exists(os.path.join(dead, f"rank-00001-of-{n:05d}.keepsake")), sorted(os.listdir(dead))

        out = torchrun(n, b, str(STEPS), "--best", "--async", "--preempt-at", "10", expect=75)
        assert "resumed from ep0-ba6 at batch 6" in out, out  # not the newer ep0-ba9 without an index
        assert "preempted: saved ep0-ba10" in out, out
        assert os.path.exists(os.path.join(runb, "ep0-ba10", INDEX)), committed(b)

        out = torchrun(n, b, str(STEPS), "--best", "--async")
        assert "resumed from ep0-ba10 at batch 10" in out, out
        order = ["ep0-ba3", "ep0-ba6", "ep0-ba9", "ep0-ba10", "ep0-ba12"]
        # ep0-ba10's value: the preempted save logs no value line; every save's value is the same
        # in A and B (bit-identical runs), except ba10 which A never saved: read it from its file.
        import keepsake
        r0 = os.path.join(runb, "ep0-ba10", f"rank-00000-of-{n:05d}.keepsake")
        with keepsake.safe_open(r0, "pt") as f:
            values["ep0-ba10"] = float(f.get_tensor("state/eval_metrics/val/score/_computed"))
            assert f.get_tensor("state/train_metrics/loss/_computed").numel() == 1
            assert "state/eval_metrics/test/idle/_computed" not in f.keys(), sorted(f.keys())
        want = expected_retention(order, values, keep_last=2, keep_best=1)
        got = set(committed(b))
        assert got == want, (got, want, values)
        assert len(got) == 3 and {"ep0-ba10", "ep0-ba12"} <= got, got  # the best is an older one
        assert sorted(x for x in os.listdir(runb) if x.startswith("ep")) == sorted(got), os.listdir(runb)
        k = compare_finals(a, b, n)
        cli = os.environ.get("KS_CLI")
        if cli:
            v = subprocess.run([cli, "verify", os.path.join(runb, "ep0-ba12")], capture_output=True, text=True,
                               timeout=60)
            assert v.returncode == 0 and "OK" in v.stdout, (v.stdout, v.stderr)
        print(f"dist manager at {n} ranks: OK (kept {sorted(got)}; dead save skipped; preemption on rank 1 "
              f"saved every rank; {k} final tensors bit-identical)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        worker(sys.argv[2:])
    else:
        launch.require("torch.distributed.checkpoint", "torchmetrics")
        test(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

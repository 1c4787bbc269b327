"""The torchrun side of the DCP tests (run_dcp.py starts it): one scenario per invocation.

    torchrun --nproc-per-node N dcp_worker.py SCENARIO WORKDIR [ARGS...]

Each scenario asserts on every rank; a failure exits nonzero, which torchrun reports.
Scenarios:
  roundtrip WORKDIR              model + AdamW (replicated and FSDP2-sharded), dcp.save then dcp.load
                                 into fresh objects: every tensor and value bit-identical; also
                                 dcp.async_save, and the directories left for the CLI / HF checks.
  reshard-save WORKDIR           FSDP2 model + AdamW after two steps saved at this world size, with the
                                 expected full tensors in WORKDIR/expected.keepsake (rank 0).
  reshard-load WORKDIR           the same program at another world size loads it: every full tensor
                                 equals the expected one, and one more step runs.
  train WORKDIR STEPS [KILL]     the resumable training loop of the kill-and-resume test (below).
  remote WORKDIR URL             (test_dcp_remote.py) FSDP2 model + AdamW saved to an s3:// URL: a save
                                 whose rank 1 fails after rank 0's file is uploaded leaves no index;
                                 then a save, a load bit-identical, and the expected full tensors in
                                 WORKDIR/expected.keepsake (rank 0).
"""
from __future__ import annotations

import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import keepsake
import keepsake.torch as kt
from keepsake import _keepsake as native
from keepsake.distributed import KeepsakeReader, KeepsakeWriter


def rank() -> int:
    return dist.get_rank()


def make_model(seed: int = 0, sharded: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(12, 30), torch.nn.ReLU(), torch.nn.Linear(30, 7, bias=True))
    m.register_buffer("counter", torch.arange(5, dtype=torch.int64) * (seed + 1))
    if sharded:
        fully_shard(m)
    return m


def batch(step: int) -> torch.Tensor:
    """Each rank's data for a step: a pure function of (step, rank), so a resumed run sees the same."""
    g = torch.Generator().manual_seed(1000 * step + rank())
    return torch.randn(6, 12, generator=g)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    opt.zero_grad()
    loss = model(batch(step)).pow(2).mean()
    loss.backward()
    if not any(isinstance(p, DTensor) for p in model.parameters()):
        for p in model.parameters():  # replicated: average the gradients as DDP would
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    opt.step()


def local(t: object) -> object:
    return t.to_local() if isinstance(t, DTensor) else t


def flat(sd: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in sd.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for i, x in enumerate(v):
                out.update(flat(x, f"{key}.{i}."))
        else:
            out[key] = v
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so that NaNs and signed zeros compare exactly."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same(a: dict, b: dict, what: str) -> int:
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys(), f"{what}: keys differ: {sorted(fa.keys() ^ fb.keys())}"
    n = 0
    for k in fa:
        x, y = local(fa[k]), local(fb[k])
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape, f"{what}: {k}"
            assert torch.equal(bits(x), bits(y)), f"{what}: {k} bits differ"
            n += 1
        else:
            assert type(x) is type(y) and x == y, f"{what}: {k}: {x!r} != {y!r}"
    return n


def trained(sharded: bool, steps: int = 2, seed: int = 0):
    model = make_model(seed, sharded)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.01)
    for s in range(steps):
        train_step(model, opt, s)
    return model, opt


def state(model, opt) -> dict:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "extra": {"epoch": 3, "name": "run-ä", "lr_hist": [0.1, 1e-300, float("inf")],
                                                  "pair": (1, None), "blob": b"\x00\xff"}}


def fresh_state(sharded: bool) -> tuple:
    model = make_model(seed=7, sharded=sharded)  # other weights: a load that does nothing fails
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    sd = state(model, opt)
    sd["extra"] = {"epoch": 0, "name": "", "lr_hist": [], "pair": (), "blob": b""}
    return model, opt, sd


def roundtrip(work: str) -> None:
    for sharded in (False, True):
        tag = "fsdp" if sharded else "repl"
        model, opt = trained(sharded)
        before = state(model, opt)
        path = os.path.join(work, f"ckpt-{tag}")
        dcp.save(before, storage_writer=KeepsakeWriter(path))
        assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
        m2, o2, after = fresh_state(sharded)
        dcp.load(after, storage_reader=KeepsakeReader(path))
        set_state_dict(m2, o2, model_state_dict=after["model"], optim_state_dict=after["optim"])
        n = assert_same(state(model, opt), state(m2, o2) | {"extra": after["extra"]}, f"{tag} round trip")
        assert n >= 12, n
        # Training goes on identically from the loaded copy.
        train_step(model, opt, 5)
        train_step(m2, o2, 5)
        assert_same(state(model, opt), state(m2, o2), f"{tag} step after load")
        # dcp.async_save: the staged copy is what is saved, even though training changes the model.
        snap = state(model, opt)
        snap_copy = {"model": {k: local(v).clone() for k, v in snap["model"].items()}}
        apath = os.path.join(work, f"async-{tag}")
        # Its collectives run on a thread: a group of their own keeps them apart from training's.
        fut = dcp.async_save(snap, storage_writer=KeepsakeWriter(apath), process_group=ckpt_group())
        train_step(model, opt, 6)
        fut.result()
        m3, o3, got = fresh_state(sharded)
        dcp.load(got, storage_reader=KeepsakeReader(apath))
        for k, v in snap_copy["model"].items():
            assert torch.equal(local(got["model"][k]), v), f"async {tag}: {k}"
        # A second save into a committed directory is refused with overwrite=False, on every rank...
        try:
            dcp.save(before, storage_writer=KeepsakeWriter(path, overwrite=False))
        except CheckpointException as e:  # the coordinator's failure, on every rank
            assert [type(x) for x, _tb in e.failures.values()] == [keepsake.ExistsError], e
        else:
            raise AssertionError("a second save into a committed directory succeeded")
        # ... and replaces the checkpoint by default, as torch's FileSystemWriter does.
        dcp.save(before, storage_writer=KeepsakeWriter(path))
        dist.barrier()


_CKPT_GROUP = None


def ckpt_group():
    global _CKPT_GROUP
    if _CKPT_GROUP is None:
        _CKPT_GROUP = dist.new_group(backend="gloo")
    return _CKPT_GROUP


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def reshard_save(work: str) -> None:
    model, opt = trained(sharded=True, steps=2)
    sd = state(model, opt)
    dcp.save(sd, storage_writer=KeepsakeWriter(os.path.join(work, "ckpt")))
    expected = {k: full(v).contiguous() for k, v in flat({"model": sd["model"], "optim": sd["optim"]}).items()
                if isinstance(v, torch.Tensor)}
    if rank() == 0:
        kt.save_file(expected, os.path.join(work, "expected.keepsake"))
    dist.barrier()


def reshard_load(work: str) -> None:
    model, opt, sd = fresh_state(sharded=True)
    dcp.load(sd, storage_reader=KeepsakeReader(os.path.join(work, "ckpt")))
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    got = {k: full(v) for k, v in flat({"model": sd["model"], "optim": sd["optim"]}).items()
           if isinstance(v, torch.Tensor)}
    expected = kt.load_file(os.path.join(work, "expected.keepsake"))
    assert got.keys() == expected.keys(), sorted(got.keys() ^ expected.keys())
    for k, v in expected.items():
        assert torch.equal(got[k], v), f"reshard: {k} differs"
    sharded = [k for k, v in flat(sd).items() if isinstance(v, DTensor)]
    assert len(sharded) >= 8, sharded  # the FSDP2 parameters and their AdamW moments
    assert sd["extra"]["lr_hist"][2] == float("inf") and sd["extra"]["pair"] == (1, None)
    train_step(model, opt, 9)  # the loaded state trains


class DyingWriter(KeepsakeWriter):
    """Writes its rank file, then dies before the commit: a save a SIGKILL interrupts."""

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        if rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return fut


class FailingWriter(KeepsakeWriter):
    """Rank 1 fails inside write_data, after rank 0 has written (uploaded) its file."""

    def write_data(self, plan, planner):
        if rank() == 1:
            dist.barrier(group=ckpt_group())  # rank 0's write_data has returned
            raise OSError("rank 1 lost its storage")
        fut = super().write_data(plan, planner)
        dist.barrier(group=ckpt_group())
        return fut


def remote(work: str, url: str) -> None:
    model, opt = trained(sharded=True)
    before = state(model, opt)
    failed = url + "-failed"
    try:
        dcp.save(before, storage_writer=FailingWriter(failed))
    except CheckpointException as e:
        assert [type(x) for x, _tb in e.failures.values()] == [OSError], e
    else:
        raise AssertionError("a save whose rank 1 failed succeeded")
    assert not native.shard_committed(failed) and not KeepsakeReader.validate_checkpoint_id(failed)
    dcp.save(before, storage_writer=KeepsakeWriter(url))
    index = native.shard_index(url)
    assert index["world_size"] == dist.get_world_size() and len(index["sharded"]) >= 8, index
    m2, o2, after = fresh_state(sharded=True)
    dcp.load(after, storage_reader=KeepsakeReader(url))
    set_state_dict(m2, o2, model_state_dict=after["model"], optim_state_dict=after["optim"])
    assert_same(state(model, opt), state(m2, o2) | {"extra": after["extra"]}, "s3 round trip")
    expected = {k: full(v).contiguous() for k, v in flat({"model": before["model"], "optim": before["optim"]}).items()
                if isinstance(v, torch.Tensor)}
    if rank() == 0:
        kt.save_file(expected, os.path.join(work, "expected.keepsake"))
    dist.barrier()


def newest_committed(run_dir: str):
    """The newest step-* directory that holds a valid index whose files match it (headers, sizes, hashes)."""
    names = sorted((n for n in os.listdir(run_dir) if n.startswith("step-")), reverse=True) \
        if os.path.isdir(run_dir) else []
    for n in names:
        path = os.path.join(run_dir, n)
        if not KeepsakeReader.validate_checkpoint_id(path):
            continue
        try:
            native.shard_index(path)
            native.shard_verify(path)
        except keepsake.KeepsakeError:
            continue
        return path
    return None


def train(work: str, steps: int, kill_at: int) -> None:
    """Saves every 3 steps into WORKDIR/run/step-NNNN; rank 1 dies inside the save at step `kill_at`."""
    run_dir = os.path.join(work, "run")
    model = make_model(seed=3, sharded=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    resume = newest_committed(run_dir)
    if resume is not None:
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd, "step": -1}
        dcp.load(sd, storage_reader=KeepsakeReader(resume))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        start = sd["step"]
        assert start > 0 and resume.endswith(f"step-{start:04d}"), (start, resume)
        if rank() == 0:
            print(f"resumed from {resume} at step {start}", flush=True)
    for step in range(start, steps):
        train_step(model, opt, step)
        done = step + 1
        if done % 3 == 0 and done < steps:
            msd, osd = get_state_dict(model, opt)
            writer = (DyingWriter if done == kill_at else KeepsakeWriter)(os.path.join(run_dir, f"step-{done:04d}"))
            dcp.save({"model": msd, "optim": osd, "step": done}, storage_writer=writer)
    final = {k: full(v) for k, v in get_state_dict(model, opt)[0].items()}
    if rank() == 0:
        kt.save_file(final, os.path.join(work, "final.keepsake"))
    dist.barrier()


def main() -> None:
    dist.init_process_group("gloo")
    scenario, work = sys.argv[1], sys.argv[2]
    if scenario == "roundtrip":
        roundtrip(work)
    elif scenario == "reshard-save":
        reshard_save(work)
    elif scenario == "reshard-load":
        reshard_load(work)
    elif scenario == "train":
        train(work, int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else -1)
    elif scenario == "remote":
        remote(work, sys.argv[3])
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    dist.barrier()
    dist.destroy_process_group()
    # Every check has passed. Skip the interpreter's teardown, where torch's gloo and async-save
    # threads have been seen (once, under a loaded -j2 run) to abort a finished worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

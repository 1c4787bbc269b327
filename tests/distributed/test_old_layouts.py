"""Directories of keepsake 0.2's torch.distributed front end keep loading, per-rank items included.

tests/fixtures/dcp/manager_v02 (made by make_manager_v02.py with the 0.2 package: each rank's own
items as DCP items under ``rank<r>/``) holds a CheckpointManager(distributed=True) run directory
and a plain dcp.save with keepsake.distributed.local_items, both written at 2 ranks. Each is loaded
under torchrun at 2 ranks and at 1 and 3 (a copy: autoresume takes the run directory's lock):

  run    CheckpointManager(distributed=True).autoresume(): the model, AdamW, StepLR, the callback,
         the timestamp and `extra` as saved; each rank's data position and generators those of the
         first saved rank it takes (ks_shard_assigned: saved rank s goes to rank floor(s*M/N); saved
         rank r mod N when it takes none), its train and eval metric states the fold of the saved
         ranks it takes (an uncatalogued metric's too; defaults when it takes none).
  plain  dcp.load with local_items(checkpoint=...) and restore_local: the same per-rank rule.

    python test_old_layouts.py                    the test
    torchrun ... test_old_layouts.py load WORK run|plain

Exit 77 when torch.distributed, gloo or torchmetrics is unavailable.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import launch  # this folder: how its tests start jobs

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "dcp", "manager_v02")
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "dcp"))


def close(a, b, what):
    import torch
    a, b = torch.as_tensor(a, dtype=torch.float64).reshape(-1), torch.as_tensor(b, dtype=torch.float64).reshape(-1)
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-7), f"{what}: {a.tolist()} vs {b.tolist()}"


def worker(work: str, how: str) -> None:
    import torch
    import torch.distributed as dist

    import keepsake
    from keepsake import distributed as kd
    import make_manager_v02 as gen

    exp = json.load(open(os.path.join(FIXTURE, "expected.json")))
    n = exp["world_size"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [s for s in range(n) if s * world // n == rank]  # the rule, stated here independently
    first = mine[0] if mine else rank % n
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
    train, evals = gen.make_metrics()
    gen.feed(train, evals, 5)  # stale local states the load must replace
    loader = gen.Loader(-1)
    torch.manual_seed(12345)
    if how == "run":
        ts = keepsake.Timestamp()
        callback = {"seen": 0, "history": []}
        extra = {"note": "", "scale": torch.zeros(2)}  # the keys and types the save had
        mgr = keepsake.CheckpointManager(os.path.join(work, "run"), model=model, optimizers=opt, schedulers=sched,
                                         train_metrics=train, eval_metrics=evals, callbacks={"log": callback},
                                         timestamp=ts, dataset_state={"loader": loader}, rng=True, extra=extra,
                                         distributed=True)
        assert mgr.autoresume(), "nothing to resume"
        mgr.close()
        assert os.path.basename(mgr.last_resumed) == "ep0-ba2", mgr.last_resumed
        assert ts.batch == exp["timestamp_batch"], ts.batch
        assert callback == exp["callback"], callback
        assert extra["note"] == "v02", extra
        close(extra["scale"], exp["extra_scale"], "extra")
        close(opt.state[model.weight]["exp_avg"], exp["exp_avg"], "exp_avg")
        assert opt.param_groups[0]["lr"] == exp["lr"] and sched.last_epoch == exp["sched_last_epoch"]
    else:
        import torch.distributed.checkpoint as dcp
        parts = dict(metrics=train, eval_metrics=evals, dataset_state={"loader": loader}, rng=True)
        plain = os.path.join(work, "plain")
        sd = {"model": model.state_dict(), "step": 0, **kd.local_items(checkpoint=plain, **parts)}
        dcp.load(sd, storage_reader=kd.KeepsakeReader(plain))
        assert sd["step"] == 17, sd["step"]
        kd.restore_local(sd, checkpoint=plain, **parts)
    for k, v in model.state_dict().items():
        close(v, exp["model"][k], f"model.{k}")
    saved = exp["ranks"][first]
    assert loader.pos == saved["loader_pos"], (rank, loader.pos, saved["loader_pos"])
    got = gen.draws()
    close(got["torch"], saved["draws"]["torch"], f"rank {rank}: torch generator (saved rank {first})")
    assert got["python"] == saved["draws"]["python"] and got["numpy"] == saved["draws"]["numpy"], (rank, got)
    ref_train, ref_evals = gen.make_metrics()
    for s in mine:  # the fold of the saved ranks this rank takes is one metric fed their data in order
        gen.feed(ref_train, ref_evals, s)
    for group, ref, what in ((train, ref_train, "train"), (evals["val"], ref_evals["val"], "eval")):
        for k, m in group.items():
            g, w = gen.states(m), gen.states(ref[k])
            assert g["update_count"] == w["update_count"], (rank, what, k, g, w)
            for s in w["states"]:
                close(g["states"][s], w["states"][s], f"rank {rank} {what} {k}.{s}")
    if rank == 0:
        print(f"{how}: {n} -> {world} ranks ok")
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        worker(sys.argv[2], sys.argv[3])
        return
    launch.require("torch.distributed.checkpoint", "torchmetrics")
    for how in ("run", "plain"):
        for m in (2, 1, 3):
            work = launch.workdir(f"old_layouts_{how}_{m}-")
            try:
                shutil.copytree(os.path.join(FIXTURE, how), os.path.join(work, how), symlinks=True)
                sys.stdout.write(launch.torchrun(m, __file__, "load", work, how).stdout)
            finally:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

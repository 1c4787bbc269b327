"""Per-rank metric states at another world size: a checkpoint that keepsake.CheckpointManager
(distributed=True) saved at N ranks resumes at M ranks with each rank's local metric states
folded by the C library's rule (ks_shard_assigned + ks_metric_fold, as ks_dist_load at M != N).
With --plain, the same through the public per-rank helpers and a plain dcp.save / dcp.load
(keepsake.distributed.local_items / restore_local) instead of the manager.

    python metric_reshard.py [--plain] N M [M ...]   the test: saves at N ranks, then loads at each M
    torchrun ... metric_reshard.py save|load RUN N manager|plain

Each saved rank s updates every metric on its contiguous shard of one data set, in two batches. At
M ranks, rank r must hold exactly the states of one process fed the shards of saved ranks
[lo, hi) (saved rank s goes to rank floor(s*M/N)), or the metric's defaults when none is assigned;
its generator and data position must be those of saved rank lo (rank mod N when none); and
compute() after keepsake.distributed.sync must equal one process over the whole data set.
Metrics: MulticlassAccuracy, MeanSquaredError, MulticlassAUROC (list states), CatMetric, and a
metric the catalogue lacks (sum, max and list states) as train metrics; and as eval metrics (label
"val") a MetricCollection of the first three and the uncatalogued one, fed other data.
Exit 77 when torch.distributed, gloo or torchmetrics is unavailable.
"""
from __future__ import annotations

import os
import shutil
import sys
import time

import launch  # this folder: how its tests start jobs

ROWS = 60  # not a multiple of 4 or 3: shards of different lengths


def data(seed: int = 11):
    import torch
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(ROWS, 5, generator=g).softmax(-1), torch.randint(0, 5, (ROWS,), generator=g),
            torch.randn(ROWS, generator=g))


def shard(s: int, n: int) -> slice:
    return slice(s * ROWS // n, (s + 1) * ROWS // n)


def make():
    import torchmetrics
    import torchmetrics.classification as tc
    from metric_sync import Spread  # outside keepsake's catalogue: a sum, a max and a list state
    ms = {"acc": tc.MulticlassAccuracy(num_classes=5, average="macro"),
          "mse": torchmetrics.MeanSquaredError(),
          "auroc": tc.MulticlassAUROC(num_classes=5),
          "cat": torchmetrics.CatMetric(),
          "spread": Spread()}
    for m in ms.values():
        m.sync_on_compute = m._to_sync = False  # keepsake syncs, not torchmetrics
    return ms


def make_eval():
    """The eval metrics: a MetricCollection (no compute groups: each metric keeps its own states)."""
    import torchmetrics
    import torchmetrics.classification as tc
    from metric_sync import Spread
    ms = torchmetrics.MetricCollection({"acc": tc.MulticlassAccuracy(num_classes=5, average="macro"),
                                        "mse": torchmetrics.MeanSquaredError(),
                                        "auroc": tc.MulticlassAUROC(num_classes=5),
                                        "spread": Spread()}, compute_groups=False)
    for _name, m in ms.items(keep_base=True, copy_state=False):
        m.sync_on_compute = m._to_sync = False
    return ms


def eval_dict(ms) -> dict:
    return dict(ms.items(keep_base=True, copy_state=False))


def feed_eval(ms, rows: slice) -> None:
    feed(eval_dict(ms), rows, seed=23)


def feed(ms, rows: slice, seed: int = 11) -> None:
    """Two updates per saved rank's shard (every shard has 15 rows or more)."""
    preds, target, x = data(seed)
    idx = list(range(ROWS))[rows]
    half = len(idx) // 2
    for part in (idx[:half], idx[half:]):
        p, t, v = preds[part], target[part], x[part]
        ms["acc"].update(p, t)
        ms["mse"].update(v, v * 0.5)
        ms["auroc"].update(p, t)
        if "cat" in ms:
            ms["cat"].update(v)
        ms["spread"].update(v)


class Loader:
    """A data position per rank."""

    def __init__(self, pos: int) -> None:
        self.pos = pos

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, d: dict) -> None:
        self.pos = int(d["pos"])


def states(m):
    """Each state as (is a list state, one tensor: list states concatenated), and the update count."""
    import torch
    out = {}
    for s, default in m._defaults.items():
        v = getattr(m, s)
        if isinstance(v, list):
            v = torch.cat([t.reshape(-1) if t.ndim == 0 else t for t in v]) if v else None
        out[s] = (isinstance(default, list), v)
    return out, int(m._update_count)


def same(got, want, what: str) -> None:
    import torch
    (gs, gc), (ws, wc) = got, want
    assert gc == wc, f"{what}: update count {gc}, want {wc}"
    assert gs.keys() == ws.keys(), what
    for k in gs:
        (listed, a), (_, b) = gs[k], ws[k]
        if a is None or b is None:
            assert a is None and b is None, f"{what}.{k}: {a} vs {b}"
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, \
            f"{what}.{k}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if a.is_floating_point() and not listed:  # float sums: folded in another association
            assert torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-7), f"{what}.{k}: {a} vs {b}"
        else:  # counts and list rows: exact
            assert torch.equal(a, b), f"{what}.{k}: {a} vs {b}"


def worker(argv: list) -> None:
    import torch
    import torch.distributed as dist

    import keepsake
    from keepsake import distributed as kd

    mode, run, n, how = argv[0], argv[1], int(argv[2]), argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ms, ev = make(), make_eval()
    loader = Loader(100 + 7 * rank)
    torch.manual_seed(1000 + rank)
    if mode == "save":
        feed(ms, shard(rank, world))
        feed_eval(ev, shard(rank, world))
    else:
        feed(ms, slice(0, 5))  # stale local states the resume must replace
        feed_eval(ev, slice(7, 12))
        torch.manual_seed(55)
    parts = dict(metrics=ms, eval_metrics={"val": ev}, dataset_state={"loader": loader}, rng=True)
    t0 = time.monotonic()
    if how == "plain":  # the public helpers around a plain dcp.save / dcp.load
        import torch.distributed.checkpoint as dcp
        model = torch.nn.Linear(3, 2)
        if mode == "save":
            torch.manual_seed(1000 + rank)  # the generator state saved
            sd = {"model": model.state_dict(), "step": 17, **kd.local_items(**parts)}
            assert all(k.startswith(f"rank{rank}/") for k in sd if k.startswith("rank")), sorted(sd)
            dcp.save(sd, storage_writer=kd.KeepsakeWriter(run))
            dist.destroy_process_group()
            return
        sd = {"model": model.state_dict(), "step": 0, **kd.local_items(checkpoint=run, **parts)}
        dcp.load(sd, storage_reader=kd.KeepsakeReader(run))
        assert sd["step"] == 17, sd["step"]
        kd.restore_local(sd, checkpoint=run, **parts)
    else:
        mgr = keepsake.CheckpointManager(run, train_metrics=ms, eval_metrics={"val": ev},
                                         dataset_state={"loader": loader}, rng=True, distributed=True)
        if mode == "save":
            torch.manual_seed(1000 + rank)  # the generator state saved (synced compute above used none)
            mgr.save()
            mgr.close()
            dist.destroy_process_group()
            return
        assert mgr.autoresume(), "nothing to resume"
        mgr.close()
    took = time.monotonic() - t0
    # The rule, stated here independently of the library: saved rank s goes to floor(s*M/N).
    mine = [s for s in range(n) if s * world // n == rank]
    first = mine[0] if mine else rank % n
    assert loader.pos == 100 + 7 * first, f"rank {rank}: data position {loader.pos}, want saved rank {first}'s"
    got_rng = torch.get_rng_state()
    torch.manual_seed(1000 + first)
    assert torch.equal(got_rng, torch.get_rng_state()), f"rank {rank}: the generator is not saved rank {first}'s"
    ref, ref_ev = make(), make_eval()
    for s in mine:
        feed(ref, shard(s, n))
        feed_eval(ref_ev, shard(s, n))
    evs, ref_evs = eval_dict(ev), eval_dict(ref_ev)
    for k, m in ms.items():
        same(states(m), states(ref[k]), f"rank {rank} {k}")
    for k, m in evs.items():
        same(states(m), states(ref_evs[k]), f"rank {rank} eval {k}")
    whole, whole_ev = make(), make_eval()
    for s in range(n):  # one process, the same updates in saved-rank order
        feed(whole, shard(s, n))
        feed_eval(whole_ev, shard(s, n))
    whole.update({"val/" + k: m for k, m in eval_dict(whole_ev).items()})
    for k, m in list(ms.items()) + [("val/" + k, m) for k, m in evs.items()]:
        m._computed = None
        with kd.synced(m):
            got = m.compute()
            want = whole[k].compute()
            got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
            for a, b in zip(got, want):
                assert a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-7), \
                    (rank, k, a, b)
    if rank == 0:
        print(f"metric reshard ({how}): {n} -> {world} ranks ok (load {took:.2f} s)")
    dist.destroy_process_group()


def torchrun(n: int, *args: str, timeout: int = 100) -> str:
    return launch.torchrun(n, __file__, *args, timeout=timeout).stdout


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("save", "load"):
        worker(sys.argv[1:])
        return
    args = sys.argv[1:]
    how = "plain" if "--plain" in args else "manager"
    args = [a for a in args if a != "--plain"]
    launch.require("torch.distributed.checkpoint", "torchmetrics")
    n, targets = int(args[0]), [int(a) for a in args[1:]]
    work = launch.workdir(f"metric_reshard_{n}-")
    try:
        run = os.path.join(work, "run")
        t0 = time.monotonic()
        torchrun(n, "save", run, str(n), how)
        print(f"saved at {n} ranks ({time.monotonic() - t0:.1f} s)")
        for m in targets:
            t0 = time.monotonic()
            sys.stdout.write(torchrun(m, "load", run, str(n), how))
            print(f"loaded at {m} ranks ({time.monotonic() - t0:.1f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

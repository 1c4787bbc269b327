"""Metrics across ranks (run under torchrun, gloo, CPU): each rank updates on its shard of the
data, keepsake's sync folds every rank's states by the library's rule, and compute() equals a
single process over the union of the data; every rank gets the same bits; unsync() brings the
local states back. Catalogue metrics, list states and a metric the catalogue lacks.
Usage: torchrun --nproc-per-node N metric_sync.py
"""
import os

import torch
import torch.distributed as dist
import torchmetrics
import torchmetrics.classification as tc

from keepsake import distributed as kd


class Spread(torchmetrics.Metric):
    """Not in the catalogue: a sum, a max and a list state."""

    def __init__(self):
        super().__init__()
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("peak", torch.tensor(float("-inf")), dist_reduce_fx="max")
        self.add_state("seen", [], dist_reduce_fx="cat")

    def update(self, x):
        self.total += x.double().sum()
        self.peak = torch.maximum(self.peak, x.max())
        self.seen.append(x.clone())

    def compute(self):
        seen = torch.cat(self.seen) if isinstance(self.seen, list) and self.seen else self.seen
        return self.total, self.peak, seen


def make():
    return {"acc": tc.MulticlassAccuracy(num_classes=5, average="macro"),
            "auroc": tc.MulticlassAUROC(num_classes=5),
            "mse": torchmetrics.MeanSquaredError(),
            "cat": torchmetrics.CatMetric(),
            "spread": Spread()}


def data(n=64):
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, 5, generator=g).softmax(-1), torch.randint(0, 5, (n,), generator=g), \
        torch.randn(n, generator=g)


def update(ms, preds, target, x):
    ms["acc"].update(preds, target)
    ms["auroc"].update(preds, target)
    ms["mse"].update(x, x * 0.5)
    ms["cat"].update(x)
    ms["spread"].update(x)


def flat(v):
    return [t.detach().reshape(-1) for t in (v if isinstance(v, tuple) else (v,))]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    preds, target, x = data()
    shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    mine = make()
    for m in mine.values():
        m.sync_on_compute = m._to_sync = False  # keepsake syncs, not torchmetrics
    update(mine, preds[shard], target[shard], x[shard])
    local = {k: flat(m.compute()) for k, m in mine.items()}
    whole = make()  # one process over the union of the data
    for m in whole.values():
        m.sync_on_compute = m._to_sync = False
    update(whole, preds, target, x)
    counts = torch.tensor([m._update_count for m in mine.values()])
    every_count = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(every_count, counts)
    for j, (k, m) in enumerate(mine.items()):
        m._computed = None
        local_count = m._update_count
        with kd.synced(m):
            total = sum(int(c[j]) for c in every_count)  # the fold's update count, as ks_dist_sync's
            assert m._update_count == total, f"{k}: synced update count {m._update_count}, want {total}"
            got, want = flat(m.compute()), flat(whole[k].compute())
            for a, b in zip(got, want):
                assert a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-7), (k, a, b)
            blob = torch.cat([a.double() for a in got])
            every = [torch.empty_like(blob) for _ in range(world)]
            dist.all_gather(every, blob)
            assert all(torch.equal(e, every[0]) for e in every), f"{k}: ranks disagree"
        assert m._update_count == local_count, f"{k}: unsync did not restore the update count"
        m._computed = None
        back = flat(m.compute())
        assert all(torch.equal(a, b) for a, b in zip(back, local[k])), f"{k}: unsync did not restore"
    if rank == 0:
        print(f"metric sync: {len(mine)} metrics equal a single process over the union at world size {world}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

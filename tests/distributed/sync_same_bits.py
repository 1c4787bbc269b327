"""The Python metric sync and the C MPI metric sync give the same bits.

    python sync_same_bits.py N MPIEXEC SYNC_BITS    the test, at N ranks
    torchrun ... sync_same_bits.py worker DIR        the Python half

The Python half (torchrun, gloo, N ranks): each rank updates torchmetrics catalogue metrics on its
shard of one data set (the last rank of a multi-rank job sees none: empty list states, default
maxima), writes its local states as keepsake.distributed.sync encodes them
(DIR/local-<rank>-<name>.keepsake), runs keepsake.distributed.sync, and writes the synced states
the same way (DIR/synced-<rank>-<name>.keepsake). The C half (tests/mpi/sync_bits.c, mpirun with N
ranks) loads each rank's local states into the C library's catalogue metrics, runs ks_dist_sync,
and requires every state's dtype, shape and bytes, and every update count, to equal Python's.
Exit 77 when torch.distributed, gloo or torchmetrics is unavailable.
"""
from __future__ import annotations

import os
import shutil
import sys
import time

import launch  # this folder: how its tests start jobs

ROWS = 50


def make():
    import torchmetrics
    import torchmetrics.classification as tc
    # Keep in step with `metrics` in tests/mpi/sync_bits.c.
    ms = {"acc": tc.MulticlassAccuracy(num_classes=5),
          "mse": torchmetrics.MeanSquaredError(),
          "auroc": tc.MulticlassAUROC(num_classes=5),
          "cat": torchmetrics.CatMetric(),
          "mean": torchmetrics.MeanMetric(),
          "max": torchmetrics.MaxMetric()}
    for m in ms.values():
        m.sync_on_compute = m._to_sync = False
    return ms


def worker(out: str) -> None:
    import torch
    import torch.distributed as dist

    from keepsake._distributed import sync as _sync
    from keepsake import distributed as kd

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(3)
    preds = torch.randn(ROWS, 5, generator=g).softmax(-1)
    target = torch.randint(0, 5, (ROWS,), generator=g)
    x = torch.randn(ROWS, generator=g)
    w = torch.rand(ROWS, generator=g)
    feeders = max(world - 1, 1)  # the last rank of a multi-rank job sees no data
    ms = make()
    if rank < feeders:
        rows = list(range(ROWS))[rank * ROWS // feeders:(rank + 1) * ROWS // feeders]
        for part in (rows[: len(rows) // 3], rows[len(rows) // 3:]):  # two updates per rank
            ms["acc"].update(preds[part], target[part])
            ms["mse"].update(x[part], x[part] * 0.3 + 0.1)
            ms["auroc"].update(preds[part], target[part])
            ms["cat"].update(x[part])
            ms["mean"].update(x[part], w[part])
            ms["max"].update(x[part])

    def dump(what: str) -> None:
        for name, m in ms.items():
            with open(os.path.join(out, f"{what}-{rank}-{name}.keepsake"), "wb") as f:
                f.write(_sync._encode(m))

    dump("local")
    for m in ms.values():
        kd.sync(m)
    dump("synced")
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        worker(sys.argv[2])
        return
    launch.require("torchmetrics")
    n, mpiexec, prog = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    work = launch.workdir(f"sync_same_bits_{n}-")
    try:
        t0 = time.monotonic()
        launch.torchrun(n, __file__, "worker", work)
        files = sorted(os.listdir(work))
        assert len(files) == 2 * n * len(make()), files
        print(f"Python sync at {n} ranks ({time.monotonic() - t0:.1f} s)")
        t0 = time.monotonic()
        sys.stdout.write(launch.run([mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(n), prog, work]).stdout)
        print(f"C MPI sync at {n} ranks ({time.monotonic() - t0:.1f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

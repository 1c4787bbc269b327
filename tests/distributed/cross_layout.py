"""One sharded layout for both front ends: each one's loader and tools read the other's directories,
per-rank items included (docs/FORMAT.md section 9).

  torch -> C   a plain dcp.save at 2 ranks (torchrun) with keepsake.distributed.local_items: each
               rank's metric states, data position and generators. The C tools read it: `keepsake
               verify` checks it; `keepsake reshard` and the MPI loader itself (ks_dist_load under
               mpirun, tests/mpi/dist_load_dump.c) at 2 ranks give each rank its own data position
               and metric states under the names a C program gives them (state/dataset_state/...,
               state/train_metrics/<n>/state_dict/..., rng/0/...), and at 1 rank the fold of both ranks' metric states (sum, cat in rank
               order) and saved rank 0's data position.
  C -> torch   test_mpi_ckpt (tests/mpi) saves at 3 ranks (mpirun); restore_local at 3 ranks gives
               each rank its own data position and metric states, and at 2 ranks saved ranks 0 and 1
               folded on rank 0, saved rank 2 on rank 1 (saved rank s goes to floor(s*M/N)).
  records      both directories' index, shard and metric records and metric state entries agree.
  same         tests/mpi/same_components.c (mpirun) and the torchrun half here save the same
               components through ks_dist_save and local_items + KeepsakeWriter: a 4 -> 2 linear
               model, AdamW stepped once and the C warmup-cosine scheduler (replicated), run name
               and seed, a timestamp, and per rank a data position, the Python program's generators
               (Python's, numpy's and torch's, seeded with 100 + r), train metrics (a MeanMetric, a
               CatMetric, a MinMaxMetric wrapper over a MeanMetric) and an eval metric under "val"
               (MeanSquaredError): every rank file has the same tensors (dtypes, shapes), scalars
               (values, wall-clock ones aside) and metadata records, the replicated components in
               rank 0's file only, and the indexes are equal; the two directories are the same
               bytes. Then ks_dist_load reads the torchrun directory and restore_local the
               MPI one, the replicated components and generators on every rank. (The model and
               optimizer as DCP items keep DCP's keys: docs/FORMAT.md 9.2.)

    python cross_layout.py KEEPSAKE_CLI MPIEXEC TEST_MPI_CKPT DIST_LOAD_DUMP SAME_COMPONENTS    the test
    torchrun ... cross_layout.py save DIR | restore DIR OUT | same DIR | restore-same DIR OUT

Exit 77 when torch.distributed, gloo or torchmetrics is unavailable.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import launch  # this folder: how its tests start jobs

METRICS = ("MeanMetric", "SumMetric", "MaxMetric", "CatMetric")


def save_worker(d: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torchmetrics

    from keepsake import distributed as kd
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 3)
    mean, cat = torchmetrics.MeanMetric(), torchmetrics.CatMetric()
    mean.update(torch.tensor([rank + 1.0, rank + 2.0]))
    cat.update(torch.tensor([rank * 10.0, rank * 10.0 + 1]))
    torch.manual_seed(100 + rank)
    sd = {"model": model.state_dict(),
          **kd.local_items(metrics={"mean": mean, "cat": cat}, dataset_state={"loader": {"pos": 10 + rank}}, rng=True)}
    dcp.save(sd, storage_writer=kd.KeepsakeWriter(d))
    dist.destroy_process_group()


def restore_worker(d: str, out: str) -> None:
    import torch.distributed as dist
    import torchmetrics

    from keepsake import distributed as kd
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    metrics = {name: getattr(torchmetrics, name)() for name in METRICS}
    data = {"epoch": -1}
    kd.restore_local({}, metrics=metrics, dataset_state={"train": data}, checkpoint=d)
    got = {"data": data, "counts": {n: int(m._update_count) for n, m in metrics.items()}}
    got["states"] = {n: {s: getattr(m, s).reshape(-1).tolist() if hasattr(getattr(m, s), "reshape")
                         else [float(x) for t in getattr(m, s) for x in t.reshape(-1).tolist()]
                         for s in m._defaults} for n, m in metrics.items()}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


def same_worker(d: str) -> None:
    """The torchrun half of same_components (tests/mpi/same_components.c is the C half): the same
    components handed to KeepsakeWriter as this rank's keepsake entries (local_items), the replicated
    ones (model, AdamW, scheduler, timestamp, run name and seed) the same on every rank, the
    generators seeded with 100 + r."""
    import random

    import numpy
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torchmetrics

    import keepsake
    from keepsake import distributed as kd
    dist.init_process_group("gloo")
    r = dist.get_rank()
    net, opt, sched = same_replicated(torch)
    mean, cat, mse = torchmetrics.MeanMetric(), torchmetrics.CatMetric(), torchmetrics.MeanSquaredError()
    mean.update(torch.tensor([r + 1.0, r + 2.0]))
    cat.update(torch.tensor([r * 10.0, r * 10.0 + 1]))
    mse.update(torch.tensor([r + 0.5, r + 1.0, r + 2.0]), torch.tensor([r + 0.0, r + 1.0, r + 2.5]))
    minmax = torchmetrics.wrappers.MinMaxMetric(torchmetrics.MeanMetric())
    minmax.update(torch.tensor([r + 1.0, r + 2.0]))
    random.seed(100 + r)
    numpy.random.seed(100 + r)
    torch.manual_seed(100 + r)
    items = kd.local_items(model=net, optimizers={"AdamW": opt}, schedulers={"Sched": sched},
                           timestamp=keepsake.Timestamp(epoch=1, batch=5, sample=50),
                           metrics={"mean": mean, "cat": cat, "minmax": minmax}, eval_metrics={"val": {"mse": mse}},
                           dataset_state={"loader": {"epoch": 1, "sample_in_epoch": 100 + r, "shuffle_seed": 7}},
                           rng=True, run_name="cross", rank_zero_seed=0)
    dcp.save(items, storage_writer=kd.KeepsakeWriter(d))
    refuses_shards(torch, kd)
    dist.destroy_process_group()


def refuses_shards(torch, kd) -> None:
    """A keepsake entry is a whole tensor: local_items refuses a sharded model (FSDP2's DTensors), which
    dcp.save takes as an item."""
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    import keepsake
    dt = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (2,)), [Shard(0)])
    try:
        kd.local_items(model={"w": dt})
    except keepsake.UnsupportedError as e:
        assert "DTensor" in str(e), e
    else:
        raise AssertionError("local_items took a DTensor model")


WEIGHT = [[0.1, -0.2, 0.3, 0.4], [-0.5, 0.6, 0.7, -0.8]]
BIAS = [0.01, -0.02]


def same_replicated(torch):
    """same_components.c's replicated components: the model, AdamW stepped once (lr 0.01, gradients
    of ones), then the C warmup-cosine scheduler (warmup 2, t_max 10) stepped once: a component with
    its entries (tests/python/test_state_header_c.py) and the lr 0.005 it sets."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

    net = Net()
    with torch.no_grad():
        net.fc.weight.copy_(torch.tensor(WEIGHT))
        net.fc.bias.copy_(torch.tensor(BIAS))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.01)
    net.fc.weight.grad, net.fc.bias.grad = torch.ones(2, 4), torch.ones(2)
    opt.step()
    sched = {"base_lrs": [0.01], "last_epoch": 1, "_step_count": 2, "_last_lr": [0.01 * 0.5], "t_warmup": 2,
             "t_max": 10, "alpha_f": 0.0}
    opt.param_groups[0]["lr"] = 0.01 * 0.5
    return net, opt, sched


def restore_same_worker(d: str, out: str) -> None:
    """restore_local of same_components.c's MPI directory: the replicated components (rank 0's file)
    and this rank's own items, its generators included, installed into the program's objects, written
    to OUT/rank<r>.json."""
    import random

    import numpy
    import torch
    import torch.distributed as dist
    import torchmetrics

    import keepsake
    from keepsake import distributed as kd
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = torch.nn.Sequential()
    net.fc = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=1.0)
    sched, data, ts = {}, {}, keepsake.Timestamp()
    mean, cat, mse = torchmetrics.MeanMetric(), torchmetrics.CatMetric(), torchmetrics.MeanSquaredError()
    minmax = torchmetrics.wrappers.MinMaxMetric(torchmetrics.MeanMetric())
    kd.restore_local({}, checkpoint=d, model=net, optimizers={"AdamW": opt}, schedulers={"Sched": sched},
                     timestamp=ts, metrics={"mean": mean, "cat": cat, "minmax": minmax},
                     eval_metrics={"val": {"mse": mse}}, dataset_state={"loader": data}, rng=True)
    restored = (random.getstate(), numpy.random.get_state()[1].tolist(), torch.get_rng_state())
    random.seed(100 + rank)
    numpy.random.seed(100 + rank)
    torch.manual_seed(100 + rank)  # the generators the C program describes for this rank
    seeded = (random.getstate(), numpy.random.get_state()[1].tolist(), torch.get_rng_state())
    osd = opt.state_dict()
    got = {"weight": net.fc.weight.tolist(), "bias": net.fc.bias.tolist(), "lr": osd["param_groups"][0]["lr"],
           "exp_avg": osd["state"][0]["exp_avg"].tolist(), "step": float(osd["state"][0]["step"]),
           "sched": sched, "data": data, "ts": [ts.epoch, ts.batch, ts.sample],
           "mean": [float(mean.mean_value), float(mean.weight)], "cat": torch.cat(cat.value).tolist(),
           "mse": [float(mse.sum_squared_error), int(mse.total)],
           "minmax": [float(minmax._base_metric.mean_value), float(minmax._base_metric.weight)],
           "generators": [restored[0] == seeded[0], restored[1] == seeded[1], bool((restored[2] == seeded[2]).all())]}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


def header(path: str) -> dict:
    """A rank file's header as a comparison sees it: each tensor's dtype and shape, each scalar's
    value (wall-clock values masked), every metadata record (JSON ones parsed)."""
    from keepsake import _keepsake as native
    r = native.Reader(path)
    out = {"tensors": {n: (code, tuple(shape)) for n, code, shape, _b, _e in r.entries()},
           "scalars": {n: (type(v).__name__, None if n.endswith("_wct") else v) for n, v in r.scalars()}}
    meta = {}
    for k, v in r.metadata().items():
        try:
            meta[k] = json.loads(v)
        except ValueError:
            meta[k] = v
    out["metadata"] = meta
    return out


ADAMW_GROUP = "state/optimizers/AdamW/param_groups/0/"
WRAPPED = "state/train_metrics/minmax/"  # torchmetrics' MinMaxMetric over a MeanMetric
REPLICATED = ("state/model/", "state/optimizers/", "state/schedulers/", "state/timestamp/", "state/run_name",
              "state/rank_zero_seed")


def same_components(mpiexec: str, same: str, dump: str, work: str) -> None:
    c, t = os.path.join(work, "same-mpi"), os.path.join(work, "same-torch")
    launch.run([mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", same, c])
    launch.torchrun(2, __file__, "same", t)
    for r in range(2):
        name = f"rank-{r:05d}-of-00002.keepsake"
        hc, ht = header(os.path.join(c, name)), header(os.path.join(t, name))
        # What the two languages' objects once held differently is the same: Python's, numpy's and
        # torch's generators, the wrapper's parts, torch 2.13's AdamW fields.
        want = {"rng/0/torch", "rng/0/python/state", "rng/0/numpy/keys", WRAPPED + "attrs/min_val",
                WRAPPED + "inner/_base_metric/state_dict/mean_value"}
        want_scalars = {"rng/0/numpy/pos", WRAPPED + "inner/_base_metric/update_count"}
        if r == 0:
            want_scalars |= {ADAMW_GROUP + f for f in ("differentiable", "fused", "decoupled_weight_decay")}
        assert want <= set(hc["tensors"]) and want_scalars <= set(hc["scalars"]), (r, sorted(hc["tensors"]),
                                                                                   sorted(hc["scalars"]))
        for part in ("tensors", "scalars", "metadata"):
            assert hc[part] == ht[part], (r, part, {k: (hc[part].get(k), ht[part].get(k))
                                                    for k in set(hc[part]) | set(ht[part])
                                                    if hc[part].get(k) != ht[part].get(k)})
        # The replicated components are in rank 0's file only, in both directories (ks_shard_write_rank).
        rep = [k for k in list(hc["tensors"]) + list(hc["scalars"]) if k.startswith(REPLICATED)]
        assert (len(rep) >= 25) if r == 0 else not rep, (r, rep)
    ic, it = (json.load(open(os.path.join(d, "model.safetensors.index.json"))) for d in (c, t))
    assert ic == it, (ic, it)
    assert ic["weight_map"]["state/model/fc.weight"] == "rank-00000-of-00002.keepsake", ic["weight_map"]
    # More than the headers: the same bytes. Every tensor too (the C AdamW's step is torch's bit for bit,
    # the generators are seeded alike) and no wall-clock value differs (both timestamps hold 0 s).
    for name in sorted(os.listdir(c)):
        with open(os.path.join(c, name), "rb") as fc, open(os.path.join(t, name), "rb") as ft:
            assert fc.read() == ft.read(), f"{name}: the MPI and the torchrun file differ"
    assert sorted(os.listdir(c)) == sorted(os.listdir(t)), (os.listdir(c), os.listdir(t))
    print("same components: the MPI and the torchrun directory have the same headers and index, "
          "and the same bytes")
    same_loads(mpiexec, dump, c, t, work)


def same_loads(mpiexec: str, dump: str, c: str, t: str, work: str) -> None:
    """Each directory loads through the other front end: the torchrun one through the MPI loader
    (ks_dist_load), the MPI one through restore_local, replicated components (rank 0's file) on every
    rank and each rank's own items."""
    out = os.path.join(work, "same-torch-mpi")
    os.makedirs(out)
    launch.run([mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", dump, t, out])
    saved = file_entries(os.path.join(t, "rank-00000-of-00002.keepsake"))
    for r in range(2):
        e = file_entries(os.path.join(out, f"rank{r}.keepsake"))
        for k in ("state/model/fc.weight", "state/model/fc.bias", "state/optimizers/AdamW/state/0/exp_avg"):
            close(e[k], saved[k], f"ks_dist_load: rank {r} {k}")
        assert e[ADAMW_GROUP + "lr"] == 0.005 and e["state/schedulers/Sched/t_max"] == 10, (r, sorted(e))
        assert e["state/timestamp/Timestamp/batch"] == 5 and e["state/run_name"] == "cross", (r, sorted(e))
        assert e["state/dataset_state/loader/sample_in_epoch"] == 100 + r and "rng/0/torch" in e, (r, sorted(e))
        close(e[WRAPPED + "inner/_base_metric/state_dict/mean_value"], 2 * r + 3, f"ks_dist_load: rank {r} minmax")
        close(e["state/eval_metrics/val/mse/state_dict/sum_squared_error"], 0.5, f"ks_dist_load: rank {r} mse")
    out = os.path.join(work, "same-mpi-torch")
    os.makedirs(out)
    launch.torchrun(2, __file__, "restore-same", c, out)
    saved = file_entries(os.path.join(c, "rank-00000-of-00002.keepsake"))
    for r in range(2):
        got = json.load(open(os.path.join(out, f"rank{r}.json")))
        close(got["weight"], saved["state/model/fc.weight"], f"restore_local: rank {r} weight")
        close(got["bias"], saved["state/model/fc.bias"], f"restore_local: rank {r} bias")
        close(got["exp_avg"], saved["state/optimizers/AdamW/state/0/exp_avg"], f"restore_local: rank {r} exp_avg")
        assert got["lr"] == 0.005 and got["step"] == 1.0, got
        assert got["sched"] == {"base_lrs": [0.01], "last_epoch": 1, "_step_count": 2, "_last_lr": [0.005],
                                "t_warmup": 2, "t_max": 10, "alpha_f": 0.0}, got["sched"]
        assert got["ts"] == [1, 5, 50] and got["data"] == {"epoch": 1, "sample_in_epoch": 100 + r,
                                                           "shuffle_seed": 7}, got
        assert got["mean"] == [2 * r + 3, 2] and got["cat"] == [10 * r, 10 * r + 1] and got["mse"] == [0.5, 3], got
        assert got["minmax"] == [2 * r + 3, 2] and got["generators"] == [True, True, True], got
    print("same components: ks_dist_load reads the torchrun directory and restore_local the MPI one, "
          "model, AdamW, scheduler, timestamp and generators on every rank")


def file_entries(path: str) -> dict:
    import keepsake.torch as kt
    from keepsake import _keepsake as native
    out = dict(kt.load_file(path))
    out.update(native.Reader(path).scalars())
    return out


def close(a, b, what: str) -> None:
    import torch
    a, b = torch.as_tensor(a, dtype=torch.float64).reshape(-1), torch.as_tensor(b, dtype=torch.float64).reshape(-1)
    assert a.shape == b.shape and torch.allclose(a, b), f"{what}: {a.tolist()} vs {b.tolist()}"


def torch_to_c(cli: str, mpiexec: str, dump: str, work: str) -> None:
    d = os.path.join(work, "torch2")
    launch.torchrun(2, __file__, "save", d)
    v = launch.run([cli, "verify", d])
    assert "OK" in v.stdout, v.stdout
    for how in ("reshard", "ks_dist_load"):
        per_rank = {}
        for m in (2, 1):
            out = os.path.join(work, f"torch2-to-{m}" + ("" if how == "reshard" else "-mpi"))
            if how == "reshard":
                launch.run([cli, "reshard", d, "--world-size", str(m), out])
                names = [f"rank-{r:05d}-of-{m:05d}.keepsake" for r in range(m)]
            else:  # the MPI loader itself, under mpirun
                os.makedirs(out)
                launch.run([mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(m), dump, d, out])
                names = [f"rank{r}.keepsake" for r in range(m)]
            per_rank[m] = [file_entries(os.path.join(out, n)) for n in names]
        check_torch2(per_rank, how)


def check_torch2(per_rank: dict, how: str) -> None:
    prefix = "state/train_metrics/"
    for r, e in enumerate(per_rank[2]):  # each rank its own, named as a C program names them
        assert e["state/dataset_state/loader/pos"] == 10 + r, (how, sorted(e))
        close(e[prefix + "mean/state_dict/mean_value"], 2 * r + 3, f"{how}: rank {r} mean")
        close(e[prefix + "mean/state_dict/weight"], 2, f"{how}: rank {r} weight")
        close(e[prefix + "cat/state_dict/value"], [r * 10, r * 10 + 1], f"{how}: rank {r} cat")
        assert "rng/0/torch" in e and "rng/0/python/state" in e, (how, sorted(e))
    assert not any(k.startswith("rank") for k in per_rank[2][1]), (how, sorted(per_rank[2][1]))
    assert not (per_rank[2][0]["rng/0/torch"] == per_rank[2][1]["rng/0/torch"]).all(), "both ranks' generators"
    [one] = per_rank[1]  # both ranks folded, saved rank 0's data position and generators
    assert one["state/dataset_state/loader/pos"] == 10, (how, one["state/dataset_state/loader/pos"])
    close(one[prefix + "mean/state_dict/mean_value"], 3 + 5, f"{how}: folded mean")
    close(one[prefix + "mean/state_dict/weight"], 4, f"{how}: folded weight")
    close(one[prefix + "cat/state_dict/value"], [0, 1, 10, 11], f"{how}: folded cat")
    assert (one["rng/0/torch"] == per_rank[2][0]["rng/0/torch"]).all()
    assert one["model.weight"].shape == (3, 4) and one["model.bias"].shape == (3,), (how, sorted(one))


def cli_diff(cli: str, work: str) -> None:
    d = os.path.join(work, "torch2")
    # keepsake diff reads a directory as one rank loads it: the same state as its 1-rank reshard
    diff = launch.run([cli, "diff", d, os.path.join(work, "torch2-to-1")]).stdout
    assert "identical" in diff and "state/train_metrics/mean" in diff and "state/dataset_state/loader" in diff, diff
    print("torch -> C: verify, diff, reshard and ks_dist_load at 2 and 1 ranks read every rank's items")


def c_to_torch(mpiexec: str, mpi_ckpt: str, work: str) -> None:
    import torch
    d = os.path.join(work, "mpi3")
    launch.run([mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "3", mpi_ckpt, d])
    saved = [file_entries(os.path.join(d, f"rank-{s:05d}-of-00003.keepsake")) for s in range(3)]
    state = {"MeanMetric": ("mean_value", "weight"), "SumMetric": ("sum_value",), "MaxMetric": ("max_value",),
             "CatMetric": ("value",)}

    def saved_state(s: int, name: str, st: str):
        return saved[s].get(f"state/train_metrics/{name}/state_dict/{st}")

    for m, takes in ((3, [[0], [1], [2]]), (2, [[0, 1], [2]])):
        out = os.path.join(work, f"mpi3-to-{m}")
        os.makedirs(out)
        launch.torchrun(m, __file__, "restore", d, out)
        for r in range(m):
            got = json.load(open(os.path.join(out, f"rank{r}.json")))
            first = takes[r][0]
            want = {k[len("state/dataset_state/train/"):]: v for k, v in saved[first].items()
                    if k.startswith("state/dataset_state/train/")}
            assert got["data"] == want and want, (r, got["data"], want)
            for name, states in state.items():
                for st in states:
                    parts = [saved_state(s, name, st) for s in takes[r]]
                    if name == "MaxMetric":
                        want_v = torch.stack([p.reshape(()) for p in parts]).max()
                    elif name == "CatMetric":
                        want_v = torch.cat([p.reshape(-1) for p in parts if p is not None] + [torch.zeros(0)])
                    else:
                        want_v = sum(p.double() for p in parts)
                    close(got["states"][name][st], want_v, f"{m} ranks, rank {r}: {name}.{st}")
            assert got["counts"]["MeanMetric"] > 0 or r > 0, got["counts"]
    print("C -> torch: restore_local at 3 and 2 ranks read the MPI directory's per-rank items")


def same_records(work: str) -> None:
    """The two directories' records agree: the index's keys and per-rank globs, every rank file's
    metadata records (the torch one adds keepsake.dcp), its shard record's keys and globs, and each
    metric's keepsake.metrics record and state entries (names, dtypes, shapes) for a class both hold."""
    from keepsake import _keepsake as native
    t, c = os.path.join(work, "torch2"), os.path.join(work, "mpi3")
    it, ic = (json.load(open(os.path.join(d, "model.safetensors.index.json")))["keepsake"] for d in (t, c))
    assert sorted(it) == sorted(ic) and it["per_rank"] == ic["per_rank"], (it, ic)
    rt, rc = (native.Reader(os.path.join(d, f)) for d, f in ((t, "rank-00001-of-00002.keepsake"),
                                                              (c, "rank-00001-of-00003.keepsake")))
    mt, mc = rt.metadata(), rc.metadata()
    assert sorted(set(mt) - {"keepsake.dcp"}) == sorted(mc), (sorted(mt), sorted(mc))
    st, sc = json.loads(mt["keepsake.shard"]), json.loads(mc["keepsake.shard"])
    assert sorted(st) == sorted(sc) and st["per_rank"] == sc["per_rank"], (st, sc)
    rec_t, rec_c = json.loads(mt["keepsake.metrics"]), json.loads(mc["keepsake.metrics"])
    entries_t = {n: (code, tuple(shape)) for n, code, shape, _b, _e in rt.entries()}
    entries_c = {n: (code, tuple(shape)) for n, code, shape, _b, _e in rc.entries()}
    for mine, theirs in (("mean", "MeanMetric"), ("cat", "CatMetric")):
        a, b = rec_t["state/train_metrics/" + mine], rec_c["state/train_metrics/" + theirs]
        assert sorted(a) == sorted(b) and a["class"] == b["class"] == theirs, (a, b)
        pa, pb = f"state/train_metrics/{mine}/", f"state/train_metrics/{theirs}/"
        sa = {k[len(pa):]: v for k, v in entries_t.items() if k.startswith(pa + "state_dict/")}
        sb = {k[len(pb):]: v for k, v in entries_c.items() if k.startswith(pb + "state_dict/")}
        assert sorted(sa) == sorted(sb) and sa, (sa, sb)
        for k in sa:  # the same dtype; scalars the same shape (a cat state's length is the data's)
            assert sa[k][0] == sb[k][0] and (theirs == "CatMetric" or sa[k][1] == sb[k][1]), (k, sa[k], sb[k])
    print("same records: index, shard and metric records and metric state entries agree")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "save":
        return save_worker(sys.argv[2])
    if len(sys.argv) > 1 and sys.argv[1] == "same":
        return same_worker(sys.argv[2])
    if len(sys.argv) > 1 and sys.argv[1] == "restore":
        return restore_worker(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 1 and sys.argv[1] == "restore-same":
        return restore_same_worker(sys.argv[2], sys.argv[3])
    launch.require("torch", "torch.distributed.checkpoint", "torchmetrics")
    cli, mpiexec, mpi_ckpt, dump, same = sys.argv[1:6]
    work = launch.workdir("cross-layout-")
    try:
        torch_to_c(cli, mpiexec, dump, work)
        cli_diff(cli, work)
        c_to_torch(mpiexec, mpi_ckpt, work)
        same_records(work)
        same_components(mpiexec, same, dump, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

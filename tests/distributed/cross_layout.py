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
  same         tests/mpi/same_components.c (mpirun) and the torchrun half here save the same state
               (run name and seed, a timestamp, a data position, a MeanMetric and a CatMetric per
               rank) through ks_dist_save and KeepsakeWriter: every rank file has the same tensors
               (dtypes, shapes), scalars (values, wall-clock ones aside) and metadata records, and the
               indexes are equal apart from the header hashes. (What DCP itself saves, the model and
               optimizer, is stored under DCP's keys: docs/FORMAT.md 9.2.)

    python cross_layout.py KEEPSAKE_CLI MPIEXEC TEST_MPI_CKPT DIST_LOAD_DUMP SAME_COMPONENTS    the test
    torchrun ... cross_layout.py save DIR | restore DIR OUT | same DIR

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
    state handed to KeepsakeWriter as a rank's own entries, the way local_items and the distributed
    manager hand theirs."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torchmetrics

    import keepsake
    from keepsake import _keepsake as native
    from keepsake import distributed as kd
    from keepsake._distributed import local as kl
    dist.init_process_group("gloo")
    r = dist.get_rank()
    mean, cat = torchmetrics.MeanMetric(), torchmetrics.CatMetric()
    mean.update(torch.tensor([r + 1.0, r + 2.0]))
    cat.update(torch.tensor([r * 10.0, r * 10.0 + 1]))
    items = kl.state_items(timestamp=keepsake.Timestamp(epoch=1, batch=5, sample=50),
                           train_metrics={"mean": mean, "cat": cat},
                           dataset_state={"loader": {"epoch": 1, "sample_in_epoch": 100 + r, "shuffle_seed": 7}},
                           rng=False, run_name="cross", rank_zero_seed=0)
    dcp.save({native.shard_names()["local"] + str(r): items}, storage_writer=kd.KeepsakeWriter(d))
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


def same_components(mpiexec: str, same: str, work: str) -> None:
    c, t = os.path.join(work, "same-mpi"), os.path.join(work, "same-torch")
    launch.run([mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", same, c])
    launch.torchrun(2, __file__, "same", t)
    for r in range(2):
        name = f"rank-{r:05d}-of-00002.keepsake"
        hc, ht = header(os.path.join(c, name)), header(os.path.join(t, name))
        for part in ("tensors", "scalars", "metadata"):
            assert hc[part] == ht[part], (r, part, {k: (hc[part].get(k), ht[part].get(k))
                                                    for k in set(hc[part]) | set(ht[part])
                                                    if hc[part].get(k) != ht[part].get(k)})
    ic, it = (json.load(open(os.path.join(d, "model.safetensors.index.json"))) for d in (c, t))
    for i in (ic, it):  # each file's size and header hash follow its bytes (wall-clock values)
        for f in i["keepsake"]["files"]:
            f.pop("header_xxh3")
    assert ic == it, (ic, it)
    print("same components: the MPI and the torchrun directory have the same headers and index")


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
    launch.require("torch", "torch.distributed.checkpoint", "torchmetrics")
    cli, mpiexec, mpi_ckpt, dump, same = sys.argv[1:6]
    work = launch.workdir("cross-layout-")
    try:
        torch_to_c(cli, mpiexec, dump, work)
        cli_diff(cli, work)
        c_to_torch(mpiexec, mpi_ckpt, work)
        same_records(work)
        same_components(mpiexec, same, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

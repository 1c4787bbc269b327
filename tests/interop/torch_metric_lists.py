"""List ("cat") states of torchmetrics through keepsake's .pt export, with real torchmetrics.

A .pt that `keepsake convert` writes must hand list states back to torchmetrics as lists,
so that metric.load_state_dict(...) followed by update() and compute() works, and gives
what a metric fed every batch gives.

A. torchmetrics metrics (CatMetric, exact BinaryAUROC, BinaryAveragePrecision and
   MulticlassAUROC, and a binned BinaryAUROC that keeps no list) are fed two batches and saved
   as Composer >= 0.14 does ({"state_dict", "_computed"} under state/train_metrics/<name>, list
   states as lists), then converted .pt -> keepsake -> .pt, and -> .pt directly. Each export is
   loaded with torch.load(weights_only=True) into a fresh metric, which gets a third batch;
   compute() must equal that of a metric fed all three. The lists must stay lists.
B. The golden catalogue (states written by keepsake's own metrics) exported to .pt: each
   metric with a cat state is built from its keepsake.metrics class and args, loaded, updated
   with a new batch, and compared with a metric fed the stored rows and that batch.

usage: torch_metric_lists.py KEEPSAKE_CLI CATALOGUE_KEEPSAKE
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torchmetrics
    from torchmetrics import CatMetric
    from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision, MulticlassAUROC
except ImportError as e:
    print(f"skipped: {sys.executable} lacks torch or torchmetrics ({e})")
    sys.exit(77)

KS, CATALOGUE = sys.argv[1], sys.argv[2]
NUM_CLASSES = 4
FAILURES = []
CHECKS = [0]


def check(ok, what):
    CHECKS[0] += 1
    if not ok:
        FAILURES.append(what)
        print("FAIL:", what)


def convert(src, dst):
    r = subprocess.run([KS, "convert", src, dst], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"keepsake convert {src} {dst}: exit {r.returncode}\n{r.stderr}")


def metrics():
    return {
        "CatMetric": lambda: CatMetric(),
        "BinaryAUROC": lambda: BinaryAUROC(thresholds=None),
        "auroc_exact": lambda: BinaryAUROC(thresholds=None),  # a name that is no catalogue class
        "BinaryAveragePrecision": lambda: BinaryAveragePrecision(thresholds=None),
        "MulticlassAUROC": lambda: MulticlassAUROC(num_classes=NUM_CLASSES, thresholds=None),
        "auroc_binned": lambda: BinaryAUROC(thresholds=5),
    }


def batch(name, i):
    g = torch.Generator().manual_seed(1000 + i)
    n = 6 + i
    if name == "CatMetric":
        return (torch.randn(n, generator=g),)
    if name == "MulticlassAUROC":
        return (torch.randn(n, NUM_CLASSES, generator=g).softmax(-1),
                torch.randint(0, NUM_CLASSES, (n,), generator=g))
    return torch.rand(n, generator=g), torch.randint(0, 2, (n,), generator=g)


def same(a, b):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-7, equal_nan=True))


def list_states(m):
    return [s for s, d in m._defaults.items() if isinstance(d, list)]


def composer_checkpoint(path):
    """Two batches into each metric, saved the way Composer >= 0.14 saves train metrics."""
    saved = {}
    for name, make in metrics().items():
        m = make()
        m.persistent(True)
        for i in range(2):
            m.update(*batch(name, i))
        saved[name] = {"state_dict": m.state_dict(), "_computed": None}
    torch.save({"state": {"train_metrics": saved, "timestamp": {"batch": 2}}}, path)


def check_export(pt, how):
    ck = torch.load(pt, weights_only=True)
    for name, make in metrics().items():
        sd = ck["state"]["train_metrics"][name]["state_dict"]
        m = make()
        for s in list_states(m):
            check(isinstance(sd.get(s), list) and len(sd[s]) == 1, f"{how}: {name}.{s} is {type(sd.get(s)).__name__}")
        for s in set(m._defaults) - set(list_states(m)):
            check(isinstance(sd.get(s), torch.Tensor), f"{how}: {name}.{s} is {type(sd.get(s)).__name__}")
        m.load_state_dict(sd)
        m.update(*batch(name, 2))  # torchmetrics appends to list states: they must be lists
        ref = make()
        for i in range(3):
            ref.update(*batch(name, i))
        check(same(m.compute(), ref.compute()), f"{how}: {name} compute {m.compute()} != {ref.compute()}")


def part_a(tmp):
    src = os.path.join(tmp, "composer.pt")
    composer_checkpoint(src)
    direct, ks, back = (os.path.join(tmp, n) for n in ("direct.pt", "trip.keepsake", "trip.pt"))
    convert(src, direct)
    check_export(direct, ".pt -> .pt")
    convert(src, ks)
    convert(ks, back)
    check_export(back, ".pt -> keepsake -> .pt")
    again_ks, again = os.path.join(tmp, "again.keepsake"), os.path.join(tmp, "again.pt")
    convert(back, again_ks)
    convert(again_ks, again)
    check_export(again, "twice round")


def keepsake_metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def build(cls, args):
    mod = torchmetrics.classification if hasattr(torchmetrics.classification, cls) else torchmetrics
    return getattr(mod, cls)(**args)


# The catalogue classes that can have cat states (with thresholds=None for the curve metrics).
CAT_CLASSES = ("CatMetric", "BinaryAUROC", "BinaryAveragePrecision", "MulticlassAUROC")


def catalogue_batch(cls, args, i):
    g = torch.Generator().manual_seed(2000 + i)
    if cls == "CatMetric":
        return (torch.randn(5, generator=g),)
    if cls == "MulticlassAUROC":
        c = args["num_classes"]
        return torch.randn(5, c, generator=g).softmax(-1), torch.randint(0, c, (5,), generator=g)
    return torch.rand(5, generator=g), torch.randint(0, 2, (5,), generator=g)


def part_b(tmp):
    pt = os.path.join(tmp, "cat.pt")
    convert(CATALOGUE, pt)
    ck = torch.load(pt, weights_only=True)
    described = json.loads(keepsake_metadata(CATALOGUE)["keepsake.metrics"])
    n = 0
    for path, rec in described.items():
        cls, args = rec["class"], rec.get("args", {})
        if cls not in CAT_CLASSES:
            continue
        m = build(cls, args)
        cats = list_states(m)
        if not cats:
            continue
        n += 1
        node = ck
        for part in path.split("/"):
            node = node[part]
        sd = node["state_dict"]
        for s in cats:
            check(isinstance(sd[s], list) and len(sd[s]) == 1, f"catalogue {path}.{s} is {type(sd[s]).__name__}")
        stored = [sd[s][0] for s in cats]
        m.load_state_dict(sd)
        new = catalogue_batch(cls, args, 0)
        m.update(*new)
        ref = build(cls, args)
        ref.update(*stored)
        ref.update(*new)
        check(same(m.compute(), ref.compute()), f"catalogue {path}: compute {m.compute()} != {ref.compute()}")
    check(n == 4, f"catalogue metrics with cat states: {n}, expected 4")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        part_a(tmp)
        part_b(tmp)
    print(f"torch {torch.__version__}, torchmetrics {torchmetrics.__version__}: {CHECKS[0]} checks, "
          f"{len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())

"""torchmetrics round trips through save_checkpoint / load_checkpoint, over many metric classes."""
import copy
import json
import warnings

import pytest
import torch

tm = pytest.importorskip("torchmetrics")
import torchmetrics.classification as tc  # noqa: E402

import keepsake  # noqa: E402
import keepsake.torch as kt  # noqa: E402

N, C, L = 40, 4, 3


def binary(g):
    return torch.rand(N, generator=g), torch.randint(0, 2, (N,), generator=g)


def multiclass(g):
    return torch.randn(N, C, generator=g), torch.randint(0, C, (N,), generator=g)


def multilabel(g):
    return torch.rand(N, L, generator=g), torch.randint(0, 2, (N, L), generator=g)


def regression(g):
    t = torch.randn(N, generator=g)
    return t + 0.3 * torch.randn(N, generator=g), t


def values(g):
    return (torch.randn(N, generator=g),)


# (name, factory, inputs): the first 21 are classes the C catalogue implements too.
METRICS = [
    ("BinaryAccuracy", lambda: tc.BinaryAccuracy(), binary),
    ("BinaryPrecision", lambda: tc.BinaryPrecision(), binary),
    ("BinaryRecall", lambda: tc.BinaryRecall(), binary),
    ("BinaryF1Score", lambda: tc.BinaryF1Score(), binary),
    ("BinaryConfusionMatrix", lambda: tc.BinaryConfusionMatrix(), binary),
    ("BinaryAUROC", lambda: tc.BinaryAUROC(), binary),  # exact: list states
    ("BinaryAveragePrecision", lambda: tc.BinaryAveragePrecision(), binary),
    ("MulticlassAccuracy", lambda: tc.MulticlassAccuracy(num_classes=C), multiclass),
    ("MulticlassPrecision", lambda: tc.MulticlassPrecision(num_classes=C, average="micro"), multiclass),
    ("MulticlassRecall", lambda: tc.MulticlassRecall(num_classes=C), multiclass),
    ("MulticlassF1Score", lambda: tc.MulticlassF1Score(num_classes=C, average="weighted"), multiclass),
    ("MulticlassConfusionMatrix", lambda: tc.MulticlassConfusionMatrix(num_classes=C), multiclass),
    ("MulticlassAUROC", lambda: tc.MulticlassAUROC(num_classes=C), multiclass),  # exact: list states
    ("MulticlassJaccardIndex", lambda: tc.MulticlassJaccardIndex(num_classes=C), multiclass),
    ("MultilabelAccuracy", lambda: tc.MultilabelAccuracy(num_labels=L), multilabel),
    ("MultilabelF1Score", lambda: tc.MultilabelF1Score(num_labels=L), multilabel),
    ("MeanSquaredError", lambda: tm.MeanSquaredError(), regression),
    ("MeanAbsoluteError", lambda: tm.MeanAbsoluteError(), regression),
    ("R2Score", lambda: tm.R2Score(), regression),
    ("MeanMetric", lambda: tm.MeanMetric(), values),
    ("CatMetric", lambda: tm.CatMetric(), values),  # list state
    ("SumMetric", lambda: tm.SumMetric(), values),
    ("MaxMetric", lambda: tm.MaxMetric(), values),
    ("MinMetric", lambda: tm.MinMetric(), values),
    # Classes outside the C catalogue: saved and restored by state name all the same.
    ("BinaryAUROCBinned", lambda: tc.BinaryAUROC(thresholds=11), binary),
    ("BinaryROC", lambda: tc.BinaryROC(), binary),  # list states, tuple result
    ("BinaryStatScores", lambda: tc.BinaryStatScores(), binary),
    ("MulticlassCalibrationError", lambda: tc.MulticlassCalibrationError(num_classes=C), multiclass),
    ("PearsonCorrCoef", lambda: tm.PearsonCorrCoef(), regression),
    ("SpearmanCorrCoef", lambda: tm.SpearmanCorrCoef(), regression),  # list states
    ("ExplainedVariance", lambda: tm.ExplainedVariance(), regression),
    ("MultilabelAUROC", lambda: tc.MultilabelAUROC(num_labels=L), multilabel),
]
CATALOGUE = {n for n, _, _ in METRICS[:24]}



def close(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-6, equal_nan=True)


def states(m):
    out = {}
    for s in m._defaults:
        v = getattr(m, s)
        out[s] = torch.cat([x.reshape(-1) if x.ndim == 0 else x for x in v]) if isinstance(v, list) and v else v
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    g = torch.Generator().manual_seed(7)
    metrics, batches = {}, {}
    for name, make, inputs in METRICS:
        m = make()
        for _ in range(2):
            m.update(*inputs(g))
        m.compute()  # a cached _computed goes into the file too
        metrics[name] = m
        batches[name] = inputs(g)
    path = tmp_path_factory.mktemp("m") / "metrics.keepsake"
    evals = {"val": {"MeanMetric": tm.MeanMetric()}}
    evals["val"]["MeanMetric"].update(torch.tensor([1.0, 2.0]))
    kt.save_checkpoint(path, train_metrics=metrics, eval_metrics=evals, rng=False)
    return path, metrics, batches


def test_at_least_twenty_classes():
    assert len(METRICS) >= 20 and len({type(f()) for _, f, _ in METRICS}) >= 20


@pytest.mark.parametrize("name", [n for n, _, _ in METRICS])
def test_round_trip_then_update_again(saved, name):
    path, metrics, batches = saved
    src = copy.deepcopy(metrics[name])  # the fixture's metrics stay as saved
    make = next(f for n, f, _ in METRICS if n == name)
    dst = make()
    report = kt.load_checkpoint(path, train_metrics={name: dst}, rng=False)
    assert report.find(f"state/train_metrics/{name}").kind == "loaded", str(report)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert close(dst.compute(), src.compute())
    assert not [x for x in w if "before the ``update``" in str(x.message)], [str(x.message) for x in w]
    assert dst._update_count == src._update_count == 2
    for s, v in states(src).items():
        got = states(dst)[s]
        assert isinstance(getattr(dst, s), list) == isinstance(getattr(src, s), list), s
        assert close(got, v), s
    # update() keeps working and accumulates on top of the restored states
    dst.update(*batches[name])
    src.update(*batches[name])
    assert close(dst.compute(), src.compute())


def test_catalogue_metrics_get_class_args_and_compute_in_c(saved):
    path, metrics, _ = saved
    with keepsake.safe_open(path) as f:
        meta = json.loads(f.raw_metadata()["keepsake.metrics"])
    c = keepsake.compute_metrics(path)
    report = {p: (kind, why) for kind, p, why in c["__report__"]}
    for name in CATALOGUE:
        p = f"state/train_metrics/{name}"
        assert meta[p]["class"] == name and "args" in meta[p] and meta[p]["update_count"] == 2, meta[p]
        # "migrated": torchmetrics 1.9 keeps MSE/MAE/R2 sums 0-d, which the C loader reshapes
        assert report[p][0] in ("loaded", "migrated") and c[p]["error"] == "", (name, c[p], report[p])
        want = metrics[name].compute()
        assert close(c[p]["value"].to(want.dtype).reshape(want.shape), want), (name, c[p]["value"], want)
    assert "args" not in meta["state/train_metrics/PearsonCorrCoef"]
    assert meta["state/train_metrics/PearsonCorrCoef"]["update_count"] == 2


def test_load_semantics(saved, tmp_path):
    path, metrics, _ = saved
    other = tc.MulticlassAccuracy(num_classes=C + 2)  # other args: never mixed
    other.update(torch.randn(3, C + 2), torch.tensor([0, 1, 2]))
    wrong_class = tm.SumMetric()
    absent = tm.MeanMetric()
    absent.update(torch.ones(2))
    r = kt.load_checkpoint(path, train_metrics={"MulticlassAccuracy": other, "MeanMetric": wrong_class,
                                                "NotThere": absent}, rng=False)
    assert r.find("state/train_metrics/MulticlassAccuracy").kind == "mismatched"
    assert other._update_count == 0  # reset to defaults
    assert r.find("state/train_metrics/MeanMetric").kind == "mismatched"
    assert r.find("state/train_metrics/NotThere").kind == "missing" and absent._update_count == 0
    assert r.find("state/train_metrics/CatMetric").kind == "skipped"
    assert r.find("state/eval_metrics/val/MeanMetric").kind == "skipped"
    ev = tm.MeanMetric()
    r = kt.load_checkpoint(path, eval_metrics={"val": {"MeanMetric": ev}}, rng=False)
    assert r.find("state/eval_metrics/val/MeanMetric").kind == "loaded" and float(ev.compute()) == 1.5


def test_dtype_widening_and_narrowing(tmp_path):
    m = tm.SumMetric()
    m.update(torch.tensor([1.5, 2.5]))
    m.sum_value = m.sum_value.to(torch.float16)
    p = tmp_path / "w.keepsake"
    kt.save_checkpoint(p, train_metrics={"SumMetric": m}, rng=False)
    d = tm.SumMetric()
    r = kt.load_checkpoint(p, train_metrics={"SumMetric": d}, rng=False)
    assert r.find("state/train_metrics/SumMetric").kind == "converted" and d.sum_value.dtype == torch.float32
    m.sum_value = m.sum_value.to(torch.float64)
    kt.save_checkpoint(p, train_metrics={"SumMetric": m}, rng=False)
    r = kt.load_checkpoint(p, train_metrics={"SumMetric": d}, rng=False)
    assert r.find("state/train_metrics/SumMetric").kind == "mismatched"
    r = kt.load_checkpoint(p, train_metrics={"SumMetric": d}, rng=False, allow_narrowing=True)
    assert r.find("state/train_metrics/SumMetric").kind == "converted" and float(d.compute()) == 4.0


def test_metric_collection(tmp_path):
    def make():
        return tm.MetricCollection([tc.MulticlassAccuracy(num_classes=C), tc.MulticlassPrecision(num_classes=C),
                                    tm.CatMetric()])
    g = torch.Generator().manual_seed(1)
    a, b = make(), make()
    x, y = multiclass(g)
    a["MulticlassAccuracy"].update(x, y)
    a["MulticlassPrecision"].update(x, y)
    a["CatMetric"].update(torch.arange(3.0))
    p = tmp_path / "c.keepsake"
    kt.save_checkpoint(p, train_metrics=a, rng=False)
    r = kt.load_checkpoint(p, train_metrics=b, rng=False)
    assert len(r.loaded) == 3, str(r)
    assert close(b.compute(), a.compute())


def test_old_torchmetrics_schema_is_migrated(tmp_path):
    """A checkpoint saved under torchmetrics 0.11 (aggregation state `value`, 0-d MSE sum) loads
    into the current torchmetrics: states renamed/reshaped and reported migrated."""
    import os
    import subprocess
    import sys
    old = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "extra", "torchmetrics-0.11.4")
    if not os.path.isdir(old):
        pytest.skip("no torchmetrics 0.11.4 in the test venv")
    path = tmp_path / "old.keepsake"
    code = ("import torch, torchmetrics as tm, keepsake.torch as kt\n"
            "assert tm.__version__ == '0.11.4'\n"
            "m = tm.MeanMetric(); m.update(torch.tensor([1.0, 2.0, 4.0]))\n"
            "s = tm.MeanSquaredError(); s.update(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]))\n"
            f"kt.save_checkpoint({str(path)!r}, train_metrics={{'MeanMetric': m, 'MeanSquaredError': s}}, rng=False)\n")
    env = dict(os.environ, PYTHONPATH=old + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    with keepsake.safe_open(path) as f:
        meta = json.loads(f.raw_metadata()["keepsake.metrics"])
    assert meta["state/train_metrics/MeanMetric"]["schema_version"] == 1
    m, s = tm.MeanMetric(), tm.MeanSquaredError()
    r = kt.load_checkpoint(path, train_metrics={"MeanMetric": m, "MeanSquaredError": s}, rng=False)
    assert [i.kind for i in r] == ["migrated", "migrated"], str(r)
    assert float(m.compute()) == pytest.approx(7 / 3) and float(s.compute()) == 2.5
    m.update(torch.tensor([0.0]))
    assert float(m.compute()) == pytest.approx(7 / 4)
    c = keepsake.compute_metrics(path)  # and the C library migrates them the same way
    assert float(c["state/train_metrics/MeanMetric"]["value"]) == pytest.approx(7 / 3)
    assert float(c["state/train_metrics/MeanSquaredError"]["value"]) == pytest.approx(2.5)

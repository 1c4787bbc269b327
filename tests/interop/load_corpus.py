"""Cross-language load corpus: Python's load_checkpoint and a C program agree item by item.

Each case saves a checkpoint (keepsake.torch.save_checkpoint from real torchmetrics objects and
PyTorch modules, or a hand-crafted file written with keepsake.torch.save_file for old and odd
layouts), then loads it twice into the same program:

- Python: keepsake.torch.load_checkpoint with fresh objects (a model, optimizers, schedulers, data
  positions, callbacks, a Timestamp, the RNGs, torchmetrics metrics), often of other classes,
  arguments, dtypes or shapes than the saved ones;
- C: load_corpus.c (public library only) given that program described as JSON: the model's
  tensors by name, dtype and shape, the components by root and name, every metric as
  keepsake._state.load.describe_metric sees it, and the same load options.

The two reports must be identical item by item: (kind, path, reason), or the error's status name
and key when the load fails. A difference prints both reports as a diff.

A case may also name the report kind it is about (`expect`), which the Python report must hold,
so that the corpus cannot pass by both sides failing alike; and every kind must occur somewhere.
A case marked `xfail` is a known disagreement (a bug to fix; the mark says which): it must still
differ, and fails the run once it agrees, so that the mark is removed with the fix.

usage: load_corpus.py LOAD_CORPUS_BINARY   (exit 77 without torch, torchmetrics or keepsake)
       KS_CORPUS_VERBOSE=1 prints every case's Python report.
"""
import collections
import difflib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

try:
    import torch
    import torchmetrics as tm
    from torchmetrics import classification as tmc
    from torchmetrics import regression as tmr
    from torchmetrics.wrappers import ClasswiseWrapper, MinMaxMetric, MultitaskWrapper
    import keepsake
    import keepsake.torch as kt
    from keepsake._core import tensors as _tensors
    from keepsake._state import load as _load
except ImportError as e:  # the venv lacks something: not this test's business
    print(f"skipped: {e}")
    sys.exit(77)

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

# ks_dtype codes (include/keepsake/dtype.h) -> safetensors names, as load_corpus.c parses them.
DTYPES = ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64",
          "F8_E4M3", "F8_E5M2", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"]
ROOTS = {"optimizers": 1, "schedulers": 2, "callbacks": 3, "dataset_state": 4, "rng": 5}
TRAIN = "state/train_metrics/"


# ---------------------------------------------------------------------------------------------
# The program's objects
# ---------------------------------------------------------------------------------------------

class Net(torch.nn.Module):
    """The model: parameters, F32 buffers and an I64 buffer (num_batches_tracked)."""

    def __init__(self, hidden=3, extra=False, with_bn=True, dtype=None):
        super().__init__()
        self.fc = torch.nn.Linear(4, hidden)
        if with_bn:
            self.bn = torch.nn.BatchNorm1d(hidden)
        if extra:
            self.head = torch.nn.Linear(hidden, 2)
        if dtype is not None:
            self.to(dtype)


class Stopper:
    """A callback with state_dict / load_state_dict (state/callbacks/<name>)."""

    def __init__(self, best=0.0, wait=0):
        self.best, self.wait = best, wait

    def state_dict(self):
        return {"best": torch.tensor(self.best), "wait": self.wait}

    def load_state_dict(self, d):
        self.best, self.wait = float(d["best"]), int(d["wait"])


def optimizer_set(kind="AdamW", step=True):
    """An optimizer over a module of its own (never the checked model, so a model that differs
    does not change what the optimizer accepts), with one step taken when saving."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 2)
    opt = (torch.optim.AdamW(lin.parameters(), lr=0.01) if kind == "AdamW"
           else torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9))
    if step:
        lin(torch.ones(3, 2)).sum().backward()
        opt.step()
    return opt


def components(optimizers=("AdamW",), schedulers=("StepLR",), dataset=("train",), callbacks=("stopper",),
               saving=False):
    """Optimizers, schedulers, data positions and callbacks by name (dicts, as load_checkpoint takes)."""
    opts = {n: optimizer_set("SGD" if n.startswith("SGD") else "AdamW", step=saving) for n in optimizers}
    scheds = {}
    for n in schedulers:
        base = optimizer_set("AdamW", step=False)
        s = torch.optim.lr_scheduler.StepLR(base, step_size=2)
        if saving:
            base.step()
            s.step()
        scheds[n] = s
    data = {n: ({"epoch": 2, "sample_in_epoch": 7} if saving else {}) for n in dataset}
    cbs = {n: (Stopper(0.5, 3) if saving else Stopper()) for n in callbacks}
    return {"optimizers": opts, "schedulers": scheds, "dataset_state": data, "callbacks": cbs}


def timestamp(saving=False):
    ts = keepsake.Timestamp()
    if saving:
        ts.epoch, ts.batch, ts.sample, ts.total_wct = 1, 10, 80, 3.5
    return ts


# ---------------------------------------------------------------------------------------------
# Metrics: (constructor, data) for many torchmetrics classes of the base install
# ---------------------------------------------------------------------------------------------

def _gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def d_agg(g):
    return (torch.rand(6, generator=g) * 4,)


def d_bin(g):
    return torch.rand(10, generator=g), torch.randint(0, 2, (10,), generator=g)


def d_mc(g):
    return torch.randn(10, 3, generator=g).softmax(-1), torch.randint(0, 3, (10,), generator=g)


def d_ml(g):
    return torch.rand(10, 3, generator=g), torch.randint(0, 2, (10, 3), generator=g)


def d_reg(g):
    t = torch.rand(10, generator=g) + 0.5
    return t + 0.1 * torch.randn(10, generator=g), t


def d_pos(g):
    t = torch.rand(10, generator=g) + 0.5
    return t + 0.1 * torch.rand(10, generator=g), t


def d_vec(g):
    return torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)


def d_dist(g):
    return torch.rand(6, 4, generator=g).softmax(-1), torch.rand(6, 4, generator=g).softmax(-1)


MC = {"num_classes": 3}
ML = {"num_labels": 3}
METRICS = collections.OrderedDict([
    ("MeanMetric", (lambda: tm.MeanMetric(), d_agg)),
    ("SumMetric", (lambda: tm.SumMetric(), d_agg)),
    ("MaxMetric", (lambda: tm.MaxMetric(), d_agg)),
    ("MinMetric", (lambda: tm.MinMetric(), d_agg)),
    ("CatMetric", (lambda: tm.CatMetric(), d_agg)),
    ("BinaryAccuracy", (lambda: tmc.BinaryAccuracy(), d_bin)),
    ("BinaryPrecision", (lambda: tmc.BinaryPrecision(), d_bin)),
    ("BinaryRecall", (lambda: tmc.BinaryRecall(), d_bin)),
    ("BinaryF1Score", (lambda: tmc.BinaryF1Score(), d_bin)),
    ("BinaryFBetaScore", (lambda: tmc.BinaryFBetaScore(beta=2.0), d_bin)),
    ("BinarySpecificity", (lambda: tmc.BinarySpecificity(), d_bin)),
    ("BinaryStatScores", (lambda: tmc.BinaryStatScores(), d_bin)),
    ("BinaryConfusionMatrix", (lambda: tmc.BinaryConfusionMatrix(), d_bin)),
    ("BinaryAUROC", (lambda: tmc.BinaryAUROC(), d_bin)),
    ("BinaryAUROC_binned", (lambda: tmc.BinaryAUROC(thresholds=5), d_bin)),
    ("BinaryAveragePrecision", (lambda: tmc.BinaryAveragePrecision(), d_bin)),
    ("BinaryROC", (lambda: tmc.BinaryROC(), d_bin)),
    ("BinaryPrecisionRecallCurve", (lambda: tmc.BinaryPrecisionRecallCurve(thresholds=4), d_bin)),
    ("BinaryMatthewsCorrCoef", (lambda: tmc.BinaryMatthewsCorrCoef(), d_bin)),
    ("BinaryCohenKappa", (lambda: tmc.BinaryCohenKappa(), d_bin)),
    ("BinaryHammingDistance", (lambda: tmc.BinaryHammingDistance(), d_bin)),
    ("BinaryCalibrationError", (lambda: tmc.BinaryCalibrationError(), d_bin)),
    ("BinaryJaccardIndex", (lambda: tmc.BinaryJaccardIndex(), d_bin)),
    ("MulticlassAccuracy", (lambda: tmc.MulticlassAccuracy(**MC), d_mc)),
    ("MulticlassPrecision", (lambda: tmc.MulticlassPrecision(**MC), d_mc)),
    ("MulticlassRecall", (lambda: tmc.MulticlassRecall(**MC), d_mc)),
    ("MulticlassF1Score", (lambda: tmc.MulticlassF1Score(**MC), d_mc)),
    ("MulticlassConfusionMatrix", (lambda: tmc.MulticlassConfusionMatrix(**MC), d_mc)),
    ("MulticlassAUROC", (lambda: tmc.MulticlassAUROC(**MC), d_mc)),
    ("MulticlassJaccardIndex", (lambda: tmc.MulticlassJaccardIndex(**MC), d_mc)),
    ("MulticlassCohenKappa", (lambda: tmc.MulticlassCohenKappa(**MC), d_mc)),
    ("MulticlassMatthewsCorrCoef", (lambda: tmc.MulticlassMatthewsCorrCoef(**MC), d_mc)),
    ("MulticlassStatScores", (lambda: tmc.MulticlassStatScores(**MC), d_mc)),
    ("MulticlassSpecificity", (lambda: tmc.MulticlassSpecificity(**MC), d_mc)),
    ("MulticlassHammingDistance", (lambda: tmc.MulticlassHammingDistance(**MC), d_mc)),
    ("MulticlassAveragePrecision", (lambda: tmc.MulticlassAveragePrecision(**MC), d_mc)),
    ("MultilabelAccuracy", (lambda: tmc.MultilabelAccuracy(**ML), d_ml)),
    ("MultilabelF1Score", (lambda: tmc.MultilabelF1Score(**ML), d_ml)),
    ("MultilabelPrecision", (lambda: tmc.MultilabelPrecision(**ML), d_ml)),
    ("MultilabelHammingDistance", (lambda: tmc.MultilabelHammingDistance(**ML), d_ml)),
    ("MeanSquaredError", (lambda: tm.MeanSquaredError(), d_reg)),
    ("MeanAbsoluteError", (lambda: tm.MeanAbsoluteError(), d_reg)),
    ("R2Score", (lambda: tm.R2Score(), d_reg)),
    ("PearsonCorrCoef", (lambda: tmr.PearsonCorrCoef(), d_reg)),
    ("SpearmanCorrCoef", (lambda: tmr.SpearmanCorrCoef(), d_reg)),
    ("ExplainedVariance", (lambda: tmr.ExplainedVariance(), d_reg)),
    ("MeanSquaredLogError", (lambda: tmr.MeanSquaredLogError(), d_pos)),
    ("MeanAbsolutePercentageError", (lambda: tmr.MeanAbsolutePercentageError(), d_pos)),
    ("SymmetricMeanAbsolutePercentageError", (lambda: tmr.SymmetricMeanAbsolutePercentageError(), d_pos)),
    ("WeightedMeanAbsolutePercentageError", (lambda: tmr.WeightedMeanAbsolutePercentageError(), d_pos)),
    ("ConcordanceCorrCoef", (lambda: tmr.ConcordanceCorrCoef(), d_reg)),
    ("LogCoshError", (lambda: tmr.LogCoshError(), d_reg)),
    ("MinkowskiDistance", (lambda: tmr.MinkowskiDistance(p=3), d_reg)),
    ("TweedieDevianceScore", (lambda: tmr.TweedieDevianceScore(), d_pos)),
    ("RelativeSquaredError", (lambda: tmr.RelativeSquaredError(), d_reg)),
    ("CosineSimilarity", (lambda: tmr.CosineSimilarity(), d_vec)),
    ("KLDivergence", (lambda: tmr.KLDivergence(), d_dist)),
    ("MinMaxMetric", (lambda: MinMaxMetric(tmc.BinaryAccuracy()), d_bin)),
    ("ClasswiseWrapper", (lambda: ClasswiseWrapper(tmc.MulticlassAccuracy(num_classes=3, average=None)), d_mc)),
    ("MultitaskWrapper", (lambda: MultitaskWrapper({"a": tm.MeanSquaredError(), "b": tm.MeanAbsoluteError()}), None)),
])


def metric(key, updates=2, seed=0):
    """A metric of the table, updated `updates` times with deterministic data."""
    ctor, data = METRICS[key]
    m = ctor()
    g = _gen(seed)
    for _ in range(updates):
        if key == "MultitaskWrapper":
            m.update({"a": torch.rand(4, generator=g), "b": torch.rand(4, generator=g)},
                     {"a": torch.rand(4, generator=g), "b": torch.rand(4, generator=g)})
        else:
            m.update(*data(g))
        if key == "MinMaxMetric":
            m.compute()
    return m


def tensor_states(m):
    return [s for s, d in m._defaults.items() if not isinstance(d, list)]


def list_states(m):
    return [s for s, d in m._defaults.items() if isinstance(d, list)]


def recast(m, kind, dtype):
    """Casts the current tensor states of `m` whose dtype is of `kind` ("float" / "int") to dtype;
    returns how many it changed."""
    n = 0
    for s in tensor_states(m):
        v = getattr(m, s)
        if (v.is_floating_point() if kind == "float" else (not v.is_floating_point() and v.dtype != torch.bool)):
            setattr(m, s, v.to(dtype))
            n += 1
    return n


def redeclare(m, kind, dtype):
    """The program's metric declares its `kind` states as `dtype` (its _defaults and states)."""
    n = 0
    for s in tensor_states(m):
        d = m._defaults[s]
        if (d.is_floating_point() if kind == "float" else (not d.is_floating_point() and d.dtype != torch.bool)):
            m._defaults[s] = d.to(dtype)
            setattr(m, s, getattr(m, s).to(dtype))
            n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

class Case:
    def __init__(self, cat, name, save, program, opts=None, xfail=None, expect=None):
        self.cat, self.name, self.save, self.program = cat, name, save, program
        self.opts = dict(opts or {})
        self.xfail = xfail  # why C and Python are known to disagree here (a bug to fix), or None
        self.expect = expect  # a report kind the case is about: some item must have it


CASES = []


def case(cat, name, save, program, xfail=None, expect=None, **opts):
    CASES.append(Case(cat, name, save, program, opts, xfail, expect))


def saver(train=None, evals=None, model=True, comps=True, ts=True, rng=True, **comp_kw):
    """save_checkpoint of a whole program; `train` / `evals` are thunks so that every file gets
    fresh metrics."""
    def save(path):
        kw = dict(components(saving=True, **comp_kw)) if comps else {}
        kt.save_checkpoint(path, model=Net() if model is True else (model() if model else None),
                           train_metrics=train() if train else None, eval_metrics=evals() if evals else None,
                           timestamp=timestamp(True) if ts else None, rng=rng, fsync=False, run_name="corpus",
                           rank_zero_seed=5, **kw)
    return save


def program(train=None, evals=None, model=True, comps=True, ts=True, rng=True, **comp_kw):
    def build():
        kw = dict(components(**comp_kw)) if comps else {}
        return dict(kw, model=Net() if model is True else (model() if model else None),
                    train_metrics=train() if train else None, eval_metrics=evals() if evals else None,
                    timestamp=timestamp() if ts else None, rng=rng)
    return build


def crafted(tensors, metrics=None, extra_meta=None):
    """A hand-written file: tensors (a thunk giving name -> tensor) and a keepsake.metrics record."""
    def save(path):
        meta = dict(extra_meta or {})
        if metrics is not None:
            meta["keepsake.metrics"] = json.dumps(metrics)
        kt.save_file(tensors(), path, metadata=meta, fsync=False)
    return save


def one(key, **kw):
    """A thunk giving {key: fresh metric}."""
    return lambda: {key: metric(key, **kw)}


def build_cases():
    keys = list(METRICS)
    plain = [k for k in keys if k not in ("MinMaxMetric", "ClasswiseWrapper", "MultitaskWrapper")]

    # -- roundtrip: every class saved after updates, loaded into a fresh one of the same class
    for k in keys:
        case("roundtrip", k, saver(one(k)), program(lambda k=k: {k: METRICS[k][0]()}))
    # -- eval metrics under a label, and a label the program names differently
    for i, k in enumerate(plain[::3]):
        case("eval", f"{k}/val", saver(evals=lambda k=k, i=i: {"val": {k: metric(k, seed=i)}}),
             program(evals=lambda k=k: {"val": {k: METRICS[k][0]()}}))
    for k in ("MeanMetric", "BinaryAccuracy", "MulticlassF1Score", "CatMetric"):
        case("eval", f"{k}/label-differs", saver(evals=lambda k=k: {"val": {k: metric(k)}}),
             program(evals=lambda k=k: {"test": {k: METRICS[k][0]()}}))
        case("eval", f"{k}/train-and-eval", saver(one(k), evals=lambda k=k: {"val": {k: metric(k, seed=3)}}),
             program(lambda k=k: {k: METRICS[k][0]()}, evals=lambda k=k: {"val": {k: METRICS[k][0]()}}))
    # -- never updated: zero updates, empty list states
    for k in keys[::2]:
        case("empty", k, saver(lambda k=k: {k: metric(k, updates=0)}), program(lambda k=k: {k: METRICS[k][0]()}))

    # -- widening: stored F16 / BF16 floats, I32 ints into the declared F32 / I64
    for i, k in enumerate(plain):
        probe = METRICS[k][0]()
        floats = any(probe._defaults[s].is_floating_point() for s in tensor_states(probe))
        ints = any(not probe._defaults[s].is_floating_point() for s in tensor_states(probe))
        if floats:
            dt = torch.float16 if i % 2 == 0 else torch.bfloat16
            case("widening", f"{k}/{str(dt)[6:]}", saver(lambda k=k, dt=dt: {k: _cast(metric(k), "float", dt)}),
                 program(lambda k=k: {k: METRICS[k][0]()}), expect="converted")
        if ints and i % 2 == 1:
            case("widening", f"{k}/int32", saver(lambda k=k: {k: _cast(metric(k), "int", torch.int32)}),
                 program(lambda k=k: {k: METRICS[k][0]()}), expect="converted")
    # the program declares F64 states (a metric built with set_dtype(float64)): F32 stored widens
    for k in ("MeanMetric", "MeanSquaredError", "PearsonCorrCoef", "ExplainedVariance", "R2Score"):
        case("widening", f"{k}/into-f64", saver(one(k)),
             program(lambda k=k: {k: _declare(METRICS[k][0](), "float", torch.float64)}), expect="converted")

    # -- narrowing: stored F64 (and I64 into a declared I32) refused, accepted with allow_narrowing
    for k in plain[::2]:
        probe = METRICS[k][0]()
        if not any(probe._defaults[s].is_floating_point() for s in tensor_states(probe)):
            continue
        for allow in (False, True):
            case("narrowing", f"{k}/f64/{'allow' if allow else 'refuse'}",
                 saver(lambda k=k: {k: _cast(metric(k), "float", torch.float64)}),
                 program(lambda k=k: {k: METRICS[k][0]()}), allow_narrowing=allow,
                 expect="converted" if allow else "mismatched")
    for k in ("BinaryAccuracy", "MulticlassConfusionMatrix", "MeanSquaredError"):
        for allow in (False, True):
            case("narrowing", f"{k}/i64-into-i32/{'allow' if allow else 'refuse'}", saver(one(k)),
                 program(lambda k=k: {k: _declare(METRICS[k][0](), "int", torch.int32)}), allow_narrowing=allow,
                 expect="converted" if allow else "mismatched")
    for allow in (False, True):
        case("narrowing", f"mixed/{'allow' if allow else 'refuse'}",
             saver(lambda: {"MeanMetric": _cast(metric("MeanMetric"), "float", torch.float64),
                            "SumMetric": _cast(metric("SumMetric"), "float", torch.float16)}),
             program(lambda: {"MeanMetric": tm.MeanMetric(), "SumMetric": tm.SumMetric()}), allow_narrowing=allow)

    reshape_cases()
    schema_cases()
    list_cases()
    definition_cases()
    ignore_cases()
    weights_only_cases()
    model_cases()
    component_cases()
    wrapper_cases()
    form_cases()
    record_cases()


def _cast(m, kind, dt):
    recast(m, kind, dt)
    return m


def _declare(m, kind, dt):
    redeclare(m, kind, dt)
    return m


def _reshape(m, state, shape):
    setattr(m, state, getattr(m, state).reshape(shape))
    return m


def _redefault(m, state, shape):
    m._defaults[state] = m._defaults[state].reshape(shape)
    setattr(m, state, getattr(m, state).reshape(shape))
    return m


def reshape_cases():
    """The () <-> (1,) sums of MSE (torchmetrics < 1.x), MAE and R2Score (1.4 <-> 1.5+), and
    shapes no rule joins."""
    for k, st, old, kind in (("MeanSquaredError", "sum_squared_error", (), "migrated"),
                             ("MeanAbsoluteError", "sum_abs_error", (), "migrated"),
                             ("R2Score", "sum_squared_error", (1,), "migrated"),
                             ("R2Score", "sum_error", (1,), "migrated"),
                             ("R2Score", "residual", (1,), "migrated"),
                             ("MeanSquaredError", "sum_squared_error", (1, 1), "mismatched"),
                             ("PearsonCorrCoef", "mean_x", (), "mismatched"),
                             ("ExplainedVariance", "sum_error", (1,), "mismatched")):
        case("reshape", f"{k}/{st}{old}", saver(lambda k=k, st=st, old=old: {k: _reshape(metric(k), st, old)}),
             program(lambda k=k: {k: METRICS[k][0]()}), expect=kind)
        case("reshape", f"{k}/{st}{old}/f16", saver(lambda k=k, st=st, old=old: {
            k: _cast(_reshape(metric(k), st, old), "float", torch.float16)}),
            program(lambda k=k: {k: METRICS[k][0]()}), expect=kind)
        # the other way round: the program is the one with the other shape
        case("reshape", f"{k}/{st}/program{old}", saver(one(k)),
             program(lambda k=k, st=st, old=old: {k: _redefault(METRICS[k][0](), st, old)}), expect=kind)
    # MSE with num_outputs=2: (2,) sums; a () stored sum cannot fill it
    case("reshape", "MeanSquaredError/outputs2-from-scalar",
         saver(lambda: {"MeanSquaredError": _reshape(metric("MeanSquaredError"), "sum_squared_error", ())}),
         program(lambda: {"MeanSquaredError": tm.MeanSquaredError(num_outputs=2)}))


AGG = {"MeanMetric": ("mean_value", "weight"), "SumMetric": ("sum_value",), "MaxMetric": ("max_value",),
       "MinMetric": ("min_value",)}


def legacy_file(cls, version, name="value", dtype=torch.float32, args=True, count=3, record=True, computed=True,
                extra=None):
    """A metric written by torchmetrics < 1.1 (its aggregation state named `value`), as an old
    keepsake wrote it: keepsake.metrics gives schema_version `version` (None: no such field)."""
    path = TRAIN + cls

    def tensors():
        t = {f"{path}/state_dict/{name}": torch.tensor(2.5, dtype=dtype)}
        if cls == "MeanMetric":
            t[f"{path}/state_dict/weight"] = torch.tensor(2.0, dtype=dtype)
        if computed:
            t[f"{path}/_computed"] = torch.tensor(1.25)
        t["state/model/fc.weight"] = torch.zeros(3, 4)
        t.update(extra or {})
        return t
    rec = {"class": cls, "update_count": count}
    if args:
        rec["args"] = {"nan_strategy": "warn"}
    if version is not None:
        rec["schema_version"] = version
    return crafted(tensors, {path: rec} if record else None)


def schema_cases():
    prog = lambda cls: program(lambda: {cls: METRICS[cls][0]()}, model=lambda: Net(with_bn=False), comps=False,
                               ts=False, rng=False)
    nonstrict = {"strict": False}
    for cls in AGG:
        case("schema", f"{cls}/v1-legacy", legacy_file(cls, 1), prog(cls), expect="migrated", **nonstrict)
        case("schema", f"{cls}/v1-legacy-f16", legacy_file(cls, 1, dtype=torch.float16), prog(cls),
             expect="migrated", **nonstrict)
        case("schema", f"{cls}/v1-legacy-f64", legacy_file(cls, 1, dtype=torch.float64), prog(cls),
             expect="mismatched", **nonstrict)
        case("schema", f"{cls}/v1-legacy-f64-allow", legacy_file(cls, 1, dtype=torch.float64), prog(cls),
             allow_narrowing=True, expect="migrated", **nonstrict)
        case("schema", f"{cls}/v99", legacy_file(cls, 99, name=AGG[cls][0]), prog(cls), expect="mismatched",
             **nonstrict)
        case("schema", f"{cls}/v2-legacy-name", legacy_file(cls, 2), prog(cls), **nonstrict)
        case("schema", f"{cls}/v1-current-name", legacy_file(cls, 1, name=AGG[cls][0]), prog(cls), **nonstrict)
        case("schema", f"{cls}/no-version", legacy_file(cls, None), prog(cls), **nonstrict)
        case("schema", f"{cls}/no-record", legacy_file(cls, 1, record=False), prog(cls), **nonstrict)
        case("schema", f"{cls}/v0", legacy_file(cls, 0), prog(cls), **nonstrict)
    case("schema", "CatMetric/v1-value", legacy_file("CatMetric", 1, args=False), prog("CatMetric"), **nonstrict)
    case("schema", "MeanMetric/v1-no-args-no-computed", legacy_file("MeanMetric", 1, args=False, computed=False),
         prog("MeanMetric"), **nonstrict)
    case("schema", "MeanMetric/v1-count0", legacy_file("MeanMetric", 1, count=0), prog("MeanMetric"), **nonstrict)
    # a v1 file with an MSE of the old () sum
    mse = TRAIN + "MeanSquaredError"
    case("schema", "MeanSquaredError/v1-scalar-sum",
         crafted(lambda: {f"{mse}/state_dict/sum_squared_error": torch.tensor(4.0),
                          f"{mse}/state_dict/total": torch.tensor(8), "state/model/fc.weight": torch.zeros(3, 4)},
                 {mse: {"class": "MeanSquaredError", "args": {"num_outputs": 1, "squared": True},
                        "schema_version": 1, "update_count": 2}}),
         prog("MeanSquaredError"), **nonstrict)
    case("schema", "MeanSquaredError/no-record-scalar-sum",
         crafted(lambda: {f"{mse}/state_dict/sum_squared_error": torch.tensor(4.0),
                          f"{mse}/state_dict/total": torch.tensor(8), "state/model/fc.weight": torch.zeros(3, 4)}),
         prog("MeanSquaredError"), **nonstrict)


def cat_of(values, dtype=torch.float32, name="CatMetric", cls=tm.CatMetric, **kw):
    def build():
        m = cls(**kw)
        for v in values:
            m.update(torch.as_tensor(v, dtype=dtype))
        return {name: m}
    return build


def _lists_as(m, dtype):
    for s in list_states(m):
        setattr(m, s, [v.to(dtype) for v in getattr(m, s)])
    return m


def list_cases():
    cat = lambda: {"CatMetric": tm.CatMetric()}
    for nm, vals, dt in (("empty", [], torch.float32), ("1d", [[1.0, 2.0], [3.0]], torch.float32),
                         ("scalars", [1.0, 2.0, 3.0], torch.float32), ("2d-rows", [[[1.0, 2.0]], [[3.0, 4.0]]],
                                                                          torch.float32),
                         ("int64", [[1, 2, 3]], torch.int64), ("f64", [[1.5, 2.5]], torch.float64),
                         ("f16", [[1.5, 2.5]], torch.float16), ("bool", [[True, False]], torch.bool),
                         ("many", [[float(i)] for i in range(40)], torch.float32)):
        case("lists", f"CatMetric/{nm}", saver(cat_of(vals, dt), comps=False), program(cat, comps=False))
    for k in ("BinaryAUROC", "BinaryAveragePrecision", "BinaryROC", "MulticlassAUROC", "SpearmanCorrCoef",
              "BinaryCalibrationError", "MulticlassAveragePrecision"):
        case("lists", f"{k}/updated", saver(one(k), comps=False),
             program(lambda k=k: {k: METRICS[k][0]()}, comps=False))
        case("lists", f"{k}/empty", saver(one(k, updates=0), comps=False),
             program(lambda k=k: {k: METRICS[k][0]()}, comps=False))
        case("lists", f"{k}/f64-rows", saver(lambda k=k: {k: _lists_as(metric(k), torch.float64)}, comps=False),
             program(lambda k=k: {k: METRICS[k][0]()}, comps=False))
    # a list state the program declares as a tensor (binned AUROC) and the other way round
    case("lists", "BinaryAUROC/list-into-binned", saver(lambda: {"AUROC": metric("BinaryAUROC")}, comps=False),
         program(lambda: {"AUROC": tmc.BinaryAUROC(thresholds=5)}, comps=False), strict=False)
    case("lists", "BinaryAUROC/binned-into-list", saver(lambda: {"AUROC": metric("BinaryAUROC_binned")}, comps=False),
         program(lambda: {"AUROC": tmc.BinaryAUROC()}, comps=False))
    # hand-crafted list states without a record (a converted Composer file)
    p = TRAIN + "BinaryAUROC"
    case("lists", "BinaryAUROC/no-record",
         crafted(lambda: {f"{p}/state_dict/preds": torch.rand(5),
                          f"{p}/state_dict/target": torch.ones(5, dtype=torch.long),
                          "state/model/fc.weight": torch.zeros(3, 4)}),
         program(lambda: {"BinaryAUROC": tmc.BinaryAUROC()}, model=lambda: Net(with_bn=False), comps=False, ts=False,
                 rng=False), strict=False)
    case("lists", "BinaryAUROC/no-record-missing-target",
         crafted(lambda: {f"{p}/state_dict/preds": torch.rand(5), "state/model/fc.weight": torch.zeros(3, 4)}),
         program(lambda: {"BinaryAUROC": tmc.BinaryAUROC()}, model=lambda: Net(with_bn=False), comps=False, ts=False,
                 rng=False), strict=False)


def definition_cases():
    """Unknown, missing and mismatched metrics: another class, other arguments."""
    pairs = [("MeanMetric", "SumMetric"), ("MaxMetric", "MinMetric"), ("BinaryAccuracy", "BinaryPrecision"),
             ("BinaryF1Score", "BinaryFBetaScore"), ("MulticlassAccuracy", "MulticlassRecall"),
             ("MeanSquaredError", "MeanAbsoluteError"), ("PearsonCorrCoef", "ConcordanceCorrCoef"),
             ("CatMetric", "MeanMetric"), ("BinaryAUROC", "BinaryAveragePrecision"),
             ("MulticlassConfusionMatrix", "MulticlassStatScores"), ("SpearmanCorrCoef", "KLDivergence")]
    for a, b in pairs:
        case("definition", f"class/{a}->{b}", saver(lambda a=a: {"M": metric(a)}),
             program(lambda b=b: {"M": METRICS[b][0]()}))
    argsets = [("MulticlassAccuracy", dict(num_classes=3), dict(num_classes=4)),
               ("MulticlassAccuracy", dict(num_classes=3), dict(num_classes=3, average="micro")),
               ("MulticlassAccuracy", dict(num_classes=3), dict(num_classes=3, top_k=2)),
               ("MulticlassF1Score", dict(num_classes=3), dict(num_classes=3, ignore_index=0)),
               ("MulticlassConfusionMatrix", dict(num_classes=3), dict(num_classes=5)),
               ("MulticlassConfusionMatrix", dict(num_classes=3), dict(num_classes=3, normalize="true")),
               ("BinaryAccuracy", dict(), dict(threshold=0.7)),
               ("BinaryAUROC", dict(thresholds=5), dict(thresholds=7)),
               ("BinaryAUROC", dict(thresholds=5), dict()),
               ("MultilabelF1Score", dict(num_labels=3), dict(num_labels=4)),
               ("MeanSquaredError", dict(), dict(squared=False)),
               ("MeanMetric", dict(), dict(nan_strategy="ignore")),
               ("MulticlassJaccardIndex", dict(num_classes=3), dict(num_classes=2)),
               ("MinkowskiDistance", dict(p=3), dict(p=2))]
    for i, (cls, sa, pa) in enumerate(argsets):
        ctor = _class_of(cls)

        def save_m(ctor=ctor, sa=sa, cls=cls):
            m = ctor(**sa)
            data = METRICS[cls if cls in METRICS else "MeanMetric"][1]
            m.update(*data(_gen(1)))
            return {"M": m}
        case("definition", f"args/{i}/{cls}", saver(save_m), program(lambda ctor=ctor, pa=pa: {"M": ctor(**pa)}))
    # missing: the program has metrics the file lacks; unknown: the file has metrics the program lacks
    case("definition", "missing/one-of-two", saver(one("MeanMetric")),
         program(lambda: {"MeanMetric": tm.MeanMetric(), "BinaryAccuracy": tmc.BinaryAccuracy()}))
    case("definition", "missing/no-metrics-in-file", saver(),
         program(lambda: {"MeanMetric": tm.MeanMetric(), "CatMetric": tm.CatMetric()}))
    case("definition", "missing/eval", saver(one("MeanMetric")),
         program(one("MeanMetric"), evals=lambda: {"eval": {"MeanMetric": tm.MeanMetric()}}))
    case("definition", "unknown/program-has-none",
         saver(lambda: {"MeanMetric": metric("MeanMetric"), "R2Score": metric("R2Score")}), program())
    case("definition", "unknown/one-extra",
         saver(lambda: {"MeanMetric": metric("MeanMetric"), "R2Score": metric("R2Score")}),
         program(lambda: {"MeanMetric": tm.MeanMetric()}))
    case("definition", "unknown/eval-extra",
         saver(evals=lambda: {"val": {"MeanMetric": metric("MeanMetric")}, "test": {"SumMetric": metric("SumMetric")}}),
         program(evals=lambda: {"val": {"MeanMetric": tm.MeanMetric()}}))
    case("definition", "unknown/renamed", saver(lambda: {"acc": metric("BinaryAccuracy")}),
         program(lambda: {"accuracy": tmc.BinaryAccuracy()}))
    p = TRAIN + "Legacy"
    case("definition", "unknown/no-record",
         crafted(lambda p=p: {f"{p}/state_dict/total": torch.tensor(3.0), "state/model/fc.weight": torch.zeros(3, 4)}),
         program(model=lambda: Net(with_bn=False), comps=False, ts=False, rng=False), strict=False)
    case("definition", "collection", saver(lambda: tm.MetricCollection([tm.MeanMetric(), tm.SumMetric()])),
         program(lambda: tm.MetricCollection([tm.MeanMetric(), tm.MaxMetric()])))
    case("definition", "bare-metric", saver(lambda: tmc.BinaryRecall()), program(lambda: tmc.BinaryRecall()))
    # no record of the class: the shapes decide (num_classes 3 stored, 4 declared)
    p = TRAIN + "MulticlassConfusionMatrix"
    case("definition", "shape/no-record",
         crafted(lambda p=p: {f"{p}/state_dict/confmat": torch.zeros(3, 3, dtype=torch.long),
                          "state/model/fc.weight": torch.zeros(3, 4)}),
         program(lambda: {"MulticlassConfusionMatrix": tmc.MulticlassConfusionMatrix(num_classes=4)},
                 model=lambda: Net(with_bn=False), comps=False, ts=False, rng=False), strict=False)
    case("definition", "shape/no-record-fits",
         crafted(lambda p=p: {f"{p}/state_dict/confmat": torch.zeros(3, 3, dtype=torch.long),
                          "state/model/fc.weight": torch.zeros(3, 4)}),
         program(lambda: {"MulticlassConfusionMatrix": tmc.MulticlassConfusionMatrix(num_classes=3)},
                 model=lambda: Net(with_bn=False), comps=False, ts=False, rng=False), strict=False)
    case("definition", "record/class-only",
         crafted(lambda p=p: {f"{p}/state_dict/confmat": torch.zeros(3, 3, dtype=torch.long)},
                 {p: {"class": "MulticlassConfusionMatrix", "update_count": 4}}),
         program(lambda: {"MulticlassConfusionMatrix": tmc.MulticlassConfusionMatrix(num_classes=3)}, model=False,
                 comps=False, ts=False, rng=False))


def _class_of(cls):
    for mod in (tm, tmc, tmr):
        if hasattr(mod, cls):
            return getattr(mod, cls)
    raise KeyError(cls)


def ignore_cases():
    two = lambda: {"MeanMetric": metric("MeanMetric"), "BinaryAccuracy": metric("BinaryAccuracy")}
    two_p = lambda: {"MeanMetric": tm.MeanMetric(), "BinaryAccuracy": tmc.BinaryAccuracy()}
    ev = lambda: {"val": {"CatMetric": metric("CatMetric")}}
    ev_p = lambda: {"val": {"CatMetric": tm.CatMetric()}}
    globs = [["state/train_metrics/*"], ["state/train_metrics/MeanMetric"], ["state/train_metrics/Mean*"],
             ["state/train_metrics"], ["rng"], ["state/optimizers/*"], ["state/optimizers/AdamW"],
             ["state/schedulers"], ["state/model/fc.bias"], ["state/model"], ["*_wct"],
             ["state/timestamp/Timestamp"], ["state/eval_metrics/val"], ["state/eval_metrics/*/CatMetric"],
             ["state/dataset_state/*", "state/callbacks/stopper"], ["*/state_dict/weight"], ["state/*"],
             ["state/train_metrics/?inaryAccuracy", "rng/0"], ["nothing/matches"],
             ["state/train_metrics/MeanMetric/_computed"]]
    for g in globs:
        case("ignore", ",".join(g), saver(two, ev), program(two_p, ev_p), ignore=g)
    # an ignored model tensor that would fail the strict check
    case("ignore", "strict-shape-ignored", saver(), program(model=lambda: Net(hidden=5)),
         ignore=["state/model/fc.*", "state/model/bn.*"])
    case("ignore", "strict-extra-ignored", saver(), program(model=lambda: Net(with_bn=False)),
         ignore=["state/model/bn.*"])
    case("ignore", "weights-only", saver(two), program(two_p), ignore=["state/model/bn.*"], weights_only=True,
         strict=False)


def weights_only_cases():
    for i, (train, evals) in enumerate(((None, None), (one("MeanMetric"), None),
                                        (one("CatMetric"), lambda: {"val": {"SumMetric": metric("SumMetric")}}))):
        for strict in (True, False):
            case("weights_only", f"{i}/{'strict' if strict else 'nonstrict'}", saver(train, evals),
                 program(train, evals), weights_only=True, strict=strict)
    case("weights_only", "model-mismatch-nonstrict", saver(), program(model=lambda: Net(hidden=5)), weights_only=True,
         strict=False)
    case("weights_only", "model-mismatch-strict", saver(), program(model=lambda: Net(hidden=5)), weights_only=True)
    case("weights_only", "no-components", saver(), program(comps=False, ts=False, rng=False), weights_only=True)
    case("weights_only", "no-model", saver(), program(model=False), weights_only=True)


MODELS = {
    "same": lambda: Net(),
    "missing-tensor": lambda: Net(extra=True),
    "wrong-shape": lambda: Net(hidden=5),
    "wrong-dtype": lambda: Net(dtype=torch.float64),
    "wrong-dtype-f16": lambda: Net(dtype=torch.float16),
    "extra-in-file": lambda: Net(with_bn=False),
    "no-model": None,
}


# Expected failure: load_checkpoint(model=None) adds an ignore glob "state/model" of its own
# (python/keepsake/_state/checkpoint.py: "No model given: the file's model is none of this load's business"),
# so Python reports nothing about the file's model tensors. The engine has no such rule: a program
# that registers no model tensors (load_corpus.c, any C program) gets KS_E_MISMATCH on the first
# state/model/ key in strict mode, and one `skipped` item per tensor otherwise. One side must change.


def model_cases():
    for name, mk in MODELS.items():
        for strict in (True, False):
            case("model", f"{name}/{'strict' if strict else 'nonstrict'}", saver(one("MeanMetric")),
                 program(one("MeanMetric"), model=mk if mk else False), strict=strict)
    # a file without a model
    for strict in (True, False):
        case("model", f"file-without-model/{'strict' if strict else 'nonstrict'}", saver(model=False),
             program(), strict=strict)
    # a model dict with an I32 buffer stored as I64
    case("model", "int-buffer-dtype", saver(model=lambda: {"step": torch.tensor(3), "w": torch.ones(2)}),
         program(model=lambda: {"step": torch.tensor(0, dtype=torch.int32), "w": torch.zeros(2)}), strict=False)


def component_cases():
    full = dict(optimizers=("AdamW",), schedulers=("StepLR",))
    variants = [
        ("missing-optimizer", dict(optimizers=()), dict(optimizers=("AdamW", "SGD"))),
        ("extra-optimizer", dict(optimizers=("AdamW", "SGD")), dict(optimizers=("AdamW",))),
        ("renamed-optimizer", dict(optimizers=("AdamW",)), dict(optimizers=("Adam2",))),
        ("no-optimizers-in-program", full, dict(optimizers=())),
        ("missing-scheduler", dict(schedulers=()), full),
        ("extra-scheduler", dict(schedulers=("StepLR", "Other")), full),
        ("missing-dataset", dict(dataset=()), {}),
        ("extra-dataset", dict(dataset=("train", "val")), {}),
        ("missing-callback", dict(callbacks=()), {}),
        ("extra-callback", dict(callbacks=("stopper", "logger")), {}),
        ("nothing-in-file", dict(optimizers=(), schedulers=(), dataset=(), callbacks=()), {}),
        ("nothing-in-program", {}, dict(optimizers=(), schedulers=(), dataset=(), callbacks=())),
    ]
    for name, skw, pkw in variants:
        for strict in (True, False):
            case("components", f"{name}/{'strict' if strict else 'nonstrict'}", saver(**skw), program(**pkw),
                 strict=strict)
    case("components", "timestamp-missing", saver(ts=False), program())
    case("components", "timestamp-not-in-program", saver(), program(ts=False))
    case("components", "rng-missing", saver(rng=False), program())
    case("components", "rng-not-in-program", saver(), program(rng=False))
    case("components", "everything-missing", saver(model=False, comps=False, ts=False, rng=False), program(),
         strict=False)


def wrapper_cases():
    def minmax(base):
        def build():
            m = MinMaxMetric(base())
            m.update(*d_bin(_gen(4)))
            m.compute()
            return m
        return build
    cases = [
        ("MinMaxMetric/into-plain", lambda: {"M": metric("MinMaxMetric")}, lambda: {"M": tmc.BinaryAccuracy()}),
        ("MinMaxMetric/plain-into", lambda: {"M": metric("BinaryAccuracy")},
         lambda: {"M": MinMaxMetric(tmc.BinaryAccuracy())}),
        # both sides load it: the wrapper's record is compared, not its inner metric's class
        ("MinMaxMetric/base-differs", lambda: {"M": minmax(tmc.BinaryAccuracy)()},
         lambda: {"M": MinMaxMetric(tmc.BinaryPrecision())}),
        ("MinMaxMetric/base-int32", lambda: {"M": _minmax_cast(minmax(tmc.BinaryAccuracy)(), torch.int32)},
         lambda: {"M": MinMaxMetric(tmc.BinaryAccuracy())}),
        ("MinMaxMetric/empty", lambda: {"M": MinMaxMetric(tmc.BinaryAccuracy())},
         lambda: {"M": MinMaxMetric(tmc.BinaryAccuracy())}),
        ("MinMaxMetric/mean", lambda: {"M": _minmax_mean()}, lambda: {"M": MinMaxMetric(tm.MeanMetric())}),
        ("ClasswiseWrapper/num-classes", lambda: {"C": metric("ClasswiseWrapper")},
         lambda: {"C": ClasswiseWrapper(tmc.MulticlassAccuracy(num_classes=4, average=None))}),
        ("ClasswiseWrapper/labels", lambda: {"C": metric("ClasswiseWrapper")},
         lambda: {"C": ClasswiseWrapper(tmc.MulticlassAccuracy(num_classes=3, average=None), labels=["a", "b", "c"])}),
        ("ClasswiseWrapper/into-plain", lambda: {"C": metric("ClasswiseWrapper")},
         lambda: {"C": tmc.MulticlassAccuracy(num_classes=3, average=None)}),
        ("MultitaskWrapper/task-differs", lambda: {"T": metric("MultitaskWrapper")},
         lambda: {"T": MultitaskWrapper({"a": tm.MeanSquaredError(), "b": tmr.LogCoshError()})}),
        ("MultitaskWrapper/extra-task", lambda: {"T": metric("MultitaskWrapper")},
         lambda: {"T": MultitaskWrapper({"a": tm.MeanSquaredError(), "b": tm.MeanAbsoluteError(),
                                         "c": tmr.LogCoshError()})}),
        ("eval/MinMaxMetric", lambda: {"M": metric("MinMaxMetric"), "C": metric("ClasswiseWrapper")},
         lambda: {"M": MinMaxMetric(tmc.BinaryAccuracy()), "C": METRICS["ClasswiseWrapper"][0]()}),
    ]
    for name, s, p in cases:
        case("wrappers", name, saver(s, comps=False), program(p, comps=False))
    case("wrappers", "MinMaxMetric/ignored-inner", saver(lambda: {"M": metric("MinMaxMetric")}, comps=False),
         program(lambda: {"M": MinMaxMetric(tmc.BinaryAccuracy())}, comps=False),
         ignore=["state/train_metrics/M/inner/*"])
    case("wrappers", "MinMaxMetric/narrowing", saver(lambda: {"M": _minmax_mean(torch.float64)}, comps=False),
         program(lambda: {"M": MinMaxMetric(tm.MeanMetric())}, comps=False))
    case("wrappers", "MinMaxMetric/narrowing-allowed", saver(lambda: {"M": _minmax_mean(torch.float64)}, comps=False),
         program(lambda: {"M": MinMaxMetric(tm.MeanMetric())}, comps=False), allow_narrowing=True)


def _minmax_cast(m, dt):
    for _n, sub in m.named_modules():
        if sub is not m and hasattr(sub, "_defaults"):
            recast(sub, "int", dt)
    return m


def _minmax_mean(dt=None):
    m = MinMaxMetric(tm.MeanMetric())
    m.update(torch.tensor([1.0, 3.0]))
    m.compute()
    if dt is not None:
        recast(m._base_metric, "float", dt)
    return m


def form_cases():
    """The shapes load_checkpoint accepts its objects in: bare objects and lists named by class,
    eval metrics as a bare metric or a dict of metrics (label "eval"), names holding '/'."""
    def forms(**kw):
        def build():
            d = dict(model=Net(), rng=True, timestamp=None)
            d.update({k: v() for k, v in kw.items()})
            return d
        return build
    adamw = lambda: optimizer_set("AdamW", step=False)
    sgd = lambda: optimizer_set("SGD", step=False)
    case("forms", "optimizer-bare", saver(), forms(optimizers=adamw))
    case("forms", "optimizer-list", saver(optimizers=("AdamW", "SGD")), forms(optimizers=lambda: [adamw(), sgd()]))
    case("forms", "scheduler-bare", saver(),
         forms(schedulers=lambda: torch.optim.lr_scheduler.StepLR(adamw(), step_size=2)))
    case("forms", "eval-bare-metric", saver(evals=lambda: metric("MeanMetric")),
         forms(eval_metrics=lambda: tm.MeanMetric()))
    case("forms", "eval-dict-of-metrics", saver(evals=lambda: {"MeanMetric": metric("MeanMetric")}),
         forms(eval_metrics=lambda: {"MeanMetric": tm.MeanMetric(), "SumMetric": tm.SumMetric()}))
    case("forms", "eval-collection", saver(evals=lambda: {"eval": {"MeanMetric": metric("MeanMetric")}}),
         forms(eval_metrics=lambda: tm.MetricCollection([tm.MeanMetric(), tm.MaxMetric()])))
    case("forms", "eval-two-labels", saver(evals=lambda: {"a": {"M": metric("MeanMetric")},
                                                          "b": {"M": metric("SumMetric")}}),
         forms(eval_metrics=lambda: {"b": {"M": tm.SumMetric()}, "a": {"M": tm.MeanMetric()}}))
    case("forms", "collection-prefix", saver(lambda: tm.MetricCollection([metric("MeanMetric")], prefix="train_")),
         forms(train_metrics=lambda: tm.MetricCollection([tm.MeanMetric()], prefix="val_")))
    case("forms", "slash-in-name", saver(lambda: {"a/b": metric("MeanMetric"), "a": metric("SumMetric")}),
         forms(train_metrics=lambda: {"a/b": tm.MeanMetric()}))
    case("forms", "slash-in-name-both", saver(lambda: {"a/b": metric("MeanMetric"), "a": metric("SumMetric")}),
         forms(train_metrics=lambda: {"a": tm.SumMetric(), "a/b": tm.MeanMetric()}))
    case("forms", "slash-in-label", saver(evals=lambda: {"val/x": {"M": metric("MeanMetric")}}),
         forms(eval_metrics=lambda: {"val/x": {"M": tm.MeanMetric()}, "val": {"x": tm.MeanMetric()}}))
    case("forms", "unicode-names", saver(lambda: {"précision é": metric("BinaryPrecision")},
                                         evals=lambda: {"évaluation": {"M": metric("MeanMetric")}}),
         forms(train_metrics=lambda: {"précision é": tmc.BinaryPrecision()},
               eval_metrics=lambda: {"évaluation": {"M": tm.SumMetric()}}))
    case("forms", "model-dict-with-scalar", saver(model=lambda: {"w": torch.ones(2), "n": 3}),
         forms(model=lambda: {"w": torch.zeros(2), "n": 0}))
    case("forms", "model-dict-with-scalar-nonstrict", saver(model=lambda: {"w": torch.ones(2), "n": 3}),
         forms(model=lambda: {"w": torch.zeros(2), "n": 0}), strict=False)
    case("forms", "model-noncontiguous", saver(model=lambda: {"w": torch.ones(3, 2)}),
         forms(model=lambda: {"w": torch.zeros(2, 3).t()}))
    case("forms", "model-empty-tensor", saver(model=lambda: {"w": torch.ones(0, 4), "b": torch.ones(())}),
         forms(model=lambda: {"w": torch.zeros(0, 4), "b": torch.zeros(())}))
    case("forms", "timestamp-dict", saver(), forms(timestamp=lambda: {}))


def record_cases():
    """Odd keepsake.metrics records: entries without a record, a record without entries, fields
    of the wrong type; the engine decides, both sides must report alike."""
    m = TRAIN + "MeanMetric"
    ents = lambda: {f"{m}/state_dict/mean_value": torch.tensor(3.0), f"{m}/state_dict/weight": torch.tensor(2.0)}
    prog = lambda: {"MeanMetric": tm.MeanMetric()}
    base = {"class": "MeanMetric", "args": {"nan_strategy": "warn"}, "schema_version": 2, "update_count": 2}
    variants = [
        ("ok", base),
        ("class-qualified", dict(base, **{"class": "torchmetrics.aggregation.MeanMetric"})),
        ("class-not-string", dict(base, **{"class": 7})),
        ("args-null", dict(base, args=None)),
        ("args-not-object", dict(base, args=[1, 2])),
        ("args-extra-key", dict(base, args={"nan_strategy": "warn", "foo": 1})),
        ("count-negative", dict(base, update_count=-3)),
        ("count-string", dict(base, update_count="2")),
        ("version-string", dict(base, schema_version="1")),
        ("version-float", dict(base, schema_version=1.0)),
        ("version-huge", dict(base, schema_version=2 ** 40)),
        ("record-empty", {}),
    ]
    for name, rec in variants:
        case("records", name, crafted(ents, {m: rec}), program(prog, model=False, comps=False, ts=False, rng=False))
    case("records", "record-without-entries", crafted(lambda: {"x": torch.zeros(1)}, {m: base}),
         program(prog, model=False, comps=False, ts=False, rng=False))
    case("records", "record-without-entries-not-in-program", crafted(lambda: {"x": torch.zeros(1)}, {m: base}),
         program(model=False, comps=False, ts=False, rng=False))
    case("records", "record-for-eval", crafted(lambda: {"x": torch.zeros(1)},
                                               {"state/eval_metrics/val/M": base, "state/eval_metrics/val": base}),
         program(evals=lambda: {"val": {"N": tm.MeanMetric()}}, model=False, comps=False, ts=False, rng=False))
    for name, txt in (("not-json", "{nope"), ("array", "[]"), ("string", '"x"'), ("empty-object", "{}")):
        case("records", f"metadata-{name}", crafted(ents, extra_meta={"keepsake.metrics": txt}),
             program(prog, model=False, comps=False, ts=False, rng=False))


# ---------------------------------------------------------------------------------------------
# Running a case on both sides
# ---------------------------------------------------------------------------------------------

def named_metrics(obj):
    """A metric is named by its class, a MetricCollection by its base names, a dict by its keys."""
    if obj is None:
        return []
    if isinstance(obj, tm.Metric):
        return [(type(obj).__name__, obj)]
    if isinstance(obj, tm.MetricCollection):
        return list(obj.items(keep_base=True, copy_state=False))
    return list(obj.items())


def eval_groups(obj):
    """A dict label -> metrics, or metrics (a metric, a collection, a dict of metrics) under "eval"."""
    if obj is None:
        return []
    if isinstance(obj, dict) and not any(isinstance(v, tm.Metric) for v in obj.values()):
        return list(obj.items())
    return [("eval", obj)]


def named_objects(obj):
    """Components: a dict keeps its names, an object or a list of them is named by class."""
    if obj is None:
        return []
    if isinstance(obj, dict):
        return list(obj)
    return [type(o).__name__ for o in (obj if isinstance(obj, (list, tuple)) else [obj])]


def metric_json(desc):
    name, cls, attrs, states, inner, kept = desc
    return {"name": name, "class": cls, "attrs": attrs,
            "kept": [{"name": a, "dtype": DTYPES[code] if code >= 0 else None, "shape": list(shape), "min": lo,
                      "max": hi} for a, code, shape, lo, hi in kept],
            "states": [{"name": s, "reduce": red, "dtype": DTYPES[code] if code >= 0 else None, "shape": list(shape)}
                       for s, red, code, shape in states],
            "inner": [{"name": n, "metric": metric_json(d)} for n, d in inner]}


def describe_program(prog, opts):
    """The program load_checkpoint is given, as load_corpus.c reads it."""
    codes = _tensors.torch_maps()[0]
    model = None  # no model given: the engine leaves the file's model alone (model_absent)
    if prog.get("model") is not None:
        sd = prog["model"].state_dict() if hasattr(prog["model"], "state_dict") else prog["model"]
        model = [{"name": k, "dtype": DTYPES[codes[v.dtype]], "shape": list(v.shape)} for k, v in sd.items()
                 if isinstance(v, torch.Tensor)]
    comps = [{"root": ROOTS[kind], "name": n} for kind in ("optimizers", "schedulers", "dataset_state", "callbacks")
             for n in named_objects(prog.get(kind))]
    if prog.get("rng", True):
        comps.append({"root": ROOTS["rng"], "name": "0"})
    return {"model": model, "components": comps, "timestamp": prog.get("timestamp") is not None,
            "train": [metric_json(_load.describe_metric(n, m)) for n, m in named_metrics(prog.get("train_metrics"))],
            "evals": [{"label": lab,
                       "metrics": [metric_json(_load.describe_metric(n, m)) for n, m in named_metrics(ms)]}
                      for lab, ms in eval_groups(prog.get("eval_metrics"))],
            "strict": opts.get("strict", True), "weights_only": opts.get("weights_only", False),
            "allow_narrowing": opts.get("allow_narrowing", False), "ignore": list(opts.get("ignore", []))}


def python_side(path, prog, opts):
    try:
        rep = kt.load_checkpoint(path, **prog, **opts)
    except keepsake.KeepsakeError as e:
        return [("error", e.status_name, e.key)]
    except Exception as e:  # not the engine's answer: a bug on the Python side, shown as such
        return [("exception", type(e).__name__, str(e).replace("\n", " "))]
    return [(i.kind, i.path, i.reason) for i in rep]


def c_side(binary, desc_path, path):
    r = subprocess.run([binary, desc_path, path], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return [("c-failed", str(r.returncode), r.stderr.strip().replace("\n", " "))]
    return [tuple((line.split("\t") + ["", ""])[:3]) for line in r.stdout.splitlines()]


def fmt(items):
    return ["\t".join(i) for i in items]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = sys.argv[1]
    t0 = time.time()
    build_cases()
    names = collections.Counter((c.cat, c.name) for c in CASES)
    dup = [n for n, k in names.items() if k > 1]
    assert not dup, f"duplicate case names: {dup}"
    per_cat = collections.Counter(c.cat for c in CASES)
    kinds = collections.Counter()
    failures, xfails, xpasses = [], [], []
    with tempfile.TemporaryDirectory(prefix="ks-load-corpus-") as tmp:
        for i, c in enumerate(CASES):
            path = os.path.join(tmp, f"{i}.keepsake")
            torch.manual_seed(i)
            c.save(path)
            prog = c.program()
            desc = describe_program(prog, c.opts)
            dpath = os.path.join(tmp, f"{i}.json")
            with open(dpath, "w") as f:
                json.dump(desc, f)
            py = python_side(path, prog, c.opts)
            cc = c_side(binary, dpath, path)
            kinds.update(k for k, _p, _r in py)
            if os.environ.get("KS_CORPUS_VERBOSE"):
                print(f"[{c.cat}] {c.name} {c.opts}\n  " + "\n  ".join(fmt(py)))
            same = py == cc
            if c.expect and c.expect not in [k for k, _p, _r in py]:
                failures.append((c, f"expected a '{c.expect}' item; Python reported:\n" + "\n".join(fmt(py))))
            if same and c.xfail:
                xpasses.append(c)
            elif not same:
                diff = "\n".join(difflib.unified_diff(fmt(py), fmt(cc), "python", "c", lineterm="", n=20))
                (xfails if c.xfail else failures).append((c, diff))
    dt = time.time() - t0
    print(f"{len(CASES)} cases in {dt:.1f} s")
    for cat, n in sorted(per_cat.items()):
        print(f"  {cat:<14} {n}")
    print("report items by kind (Python side): " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    for c, diff in xfails:
        print(f"expected failure [{c.cat}] {c.name}: {c.xfail}")
    for c in xpasses:
        print(f"UNEXPECTED PASS [{c.cat}] {c.name} (marked: {c.xfail}): remove the mark")
    for c, diff in failures:
        print(f"\nFAIL [{c.cat}] {c.name} options={c.opts}\n{diff}")
    absent = [k for k in ("loaded", "migrated", "converted", "skipped", "missing", "mismatched", "error")
              if not kinds[k]]
    if absent:
        print(f"FAIL: no case gave a report item of kind {absent}")
        return 1
    if len(CASES) < 200:
        print(f"FAIL: only {len(CASES)} cases (at least 200 expected)")
        return 1
    if failures or xpasses:
        print(f"\n{len(failures)} of {len(CASES)} cases differ between Python and C")
        return 1
    print("all reports identical" + (f", apart from {len(xfails)} expected failures" if xfails else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

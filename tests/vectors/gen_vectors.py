#!/usr/bin/env python3
"""Metric reference vectors, computed by real torchmetrics, for `keepsake eval-vectors`.

Usage (from the repository root):

    $KS_VENV/bin/python tests/vectors/gen_vectors.py tests/vectors/metrics-tm1.9.0.json
    PYTHONPATH=$KS_VENV/extra/torchmetrics-1.4.3 \
        $KS_VENV/bin/python tests/vectors/gen_vectors.py tests/vectors/metrics-tm1.4.3-full.json

The torchmetrics that is importable decides the version; the output names it in "generator" and
"torchmetrics". Every case is seeded from its own name (crc32), so a case's inputs never depend on
the cases around it. Each case gives: the metric class, the keepsake constructor arguments ("args"),
the torchmetrics constructor arguments when they differ ("tm_args"), the update() batches, compute()
after every batch (null when torchmetrics raises), and the final state (list states as lists of
tensors). Cases whose torchmetrics behaviour keepsake does not follow in this torchmetrics version
are left out and listed under "omitted" with the reason (see README.md).

LanguageCrossEntropy / LanguagePerplexity are Composer's metrics; Composer is not installed, so
the class below reproduces Composer's update (CrossEntropyLoss(reduction="sum", ignore_index))
on the torchmetrics Metric base.
"""
import inspect
import json
import math
import sys
import warnings
import zlib

import numpy
import torch
import torchmetrics
from torchmetrics import Metric
from torchmetrics import aggregation as agg
from torchmetrics import classification as cls
from torchmetrics import regression as reg

warnings.filterwarnings("ignore")
TM = tuple(int(x) for x in torchmetrics.__version__.split(".")[:3])

# ---- Composer's language metrics ----


class LanguageCrossEntropy(Metric):
    full_state_update = False

    def __init__(self, ignore_index=-100, **kw):
        super().__init__(**kw)
        self.ignore_index = ignore_index
        self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=ignore_index, reduction="sum")
        self.add_state("sum_loss", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total_items", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, output, target):
        target = target.view(-1)
        logits = output.view(target.shape[0], -1)
        self.sum_loss += self.loss_fn(logits, target)
        self.total_items += (target != self.ignore_index).sum()

    def compute(self):
        return self.sum_loss / self.total_items


class LanguagePerplexity(LanguageCrossEntropy):
    def compute(self):
        return torch.exp(super().compute())


CLASSES = {
    "MeanMetric": agg.MeanMetric, "SumMetric": agg.SumMetric, "MaxMetric": agg.MaxMetric,
    "MinMetric": agg.MinMetric, "CatMetric": agg.CatMetric,
    "BinaryAccuracy": cls.BinaryAccuracy, "BinaryPrecision": cls.BinaryPrecision,
    "BinaryRecall": cls.BinaryRecall, "BinaryF1Score": cls.BinaryF1Score,
    "BinaryConfusionMatrix": cls.BinaryConfusionMatrix, "BinaryAUROC": cls.BinaryAUROC,
    "BinaryAveragePrecision": cls.BinaryAveragePrecision,
    "MulticlassAccuracy": cls.MulticlassAccuracy, "MulticlassPrecision": cls.MulticlassPrecision,
    "MulticlassRecall": cls.MulticlassRecall, "MulticlassF1Score": cls.MulticlassF1Score,
    "MulticlassConfusionMatrix": cls.MulticlassConfusionMatrix, "MulticlassAUROC": cls.MulticlassAUROC,
    "MulticlassJaccardIndex": cls.MulticlassJaccardIndex,
    "MultilabelAccuracy": cls.MultilabelAccuracy, "MultilabelF1Score": cls.MultilabelF1Score,
    "MeanSquaredError": reg.MeanSquaredError, "MeanAbsoluteError": reg.MeanAbsoluteError,
    "R2Score": reg.R2Score,
    "LanguageCrossEntropy": LanguageCrossEntropy, "LanguagePerplexity": LanguagePerplexity,
}

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}


def num(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


def short(v):
    # The shortest decimal of a float32 (the double's repr is twice as long), kept only when
    # decimal -> double -> float32, the way keepsake reads it, gives the same float32 back.
    if not math.isfinite(v):
        return v
    d = float(repr(numpy.float32(v)).split("(")[-1].rstrip(")"))
    return d if numpy.float32(d) == numpy.float32(v) else v


def tensor_json(t):
    t = t.detach().cpu()
    data = t.flatten().tolist() if t.dtype != torch.bfloat16 else t.float().flatten().tolist()
    if t.dtype == torch.float32:
        data = [short(v) for v in data]
    return {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data": [num(v) for v in data]}


def state_json(v):
    if isinstance(v, list):
        return [tensor_json(x) for x in v]
    return tensor_json(v)


# ---- input makers: each takes a torch.Generator and returns the update() arguments ----


def rand(g, *shape, lo=0.0, hi=1.0):
    return torch.rand(*shape, generator=g) * (hi - lo) + lo


def randn(g, *shape):
    return torch.randn(*shape, generator=g)


def ints(g, hi, *shape):
    return torch.randint(0, hi, shape, generator=g)


def sizes(g, n, lo=4, hi=40):
    return [int(torch.randint(lo, hi, (1,), generator=g)) for _ in range(n)]


def with_ignored(g, t, ignore, frac=0.2):
    t = t.clone()
    t[rand(g, *t.shape) < frac] = ignore
    return t


class Case:
    def __init__(self, name, metric, args=None, make=None, n_batches=3, note="", tm_args=None, skip=None):
        self.name, self.metric, self.args = name, metric, dict(args or {})
        self.make, self.n_batches, self.note = make, n_batches, note
        self.tm_args = dict(self.args if tm_args is None else tm_args)
        self.skip = skip  # callable(TM) -> reason or None


CASES = []


def add(*a, **kw):
    CASES.append(Case(*a, **kw))


# ---- aggregation ----

NAN_STRATEGIES = [("default", None), ("warn", "warn"), ("ignore", "ignore"), ("error", "error"),
                  ("value", 2.5), ("zero", 0.0), ("disable", "disable")]


def has_disable(tm):
    try:
        agg.SumMetric(nan_strategy="disable")
        return None
    except ValueError:
        return f"nan_strategy='disable' does not exist in torchmetrics {torchmetrics.__version__}"


def agg_plain(g, b, shape=None):
    n = sizes(g, 1)[0]
    return (randn(g, *(shape or (n,))),)


def agg_nan(g, b):
    v = randn(g, sizes(g, 1)[0])
    v[rand(g, *v.shape) < 0.25] = float("nan")
    return (v,)


def agg_2d(g, b):
    return (randn(g, sizes(g, 1, 2, 6)[0], 3),)


def agg_scalar(g, b):
    return (randn(g, ()),)


def agg_f64(g, b):
    return (randn(g, sizes(g, 1)[0]).double(),)


def agg_int(g, b):
    return (ints(g, 9, sizes(g, 1)[0]) - 4,)


def agg_f16(g, b):
    return (randn(g, sizes(g, 1)[0]).half(),)


AGG_INPUTS = [("plain", agg_plain), ("2d", agg_2d), ("scalar", agg_scalar), ("f64", agg_f64), ("int", agg_int),
              ("f16", agg_f16), ("nan", agg_nan)]

def newer_nan_weight(tm):
    if tm < (1, 5, 0):
        return "MeanMetric with a numeric nan_strategy gives a NaN value or weight the weight nan_strategy " \
               "before torchmetrics 1.5, weight 1 since; keepsake follows 1.5+"
    return None


for metric in ["MeanMetric", "SumMetric", "MaxMetric", "MinMetric", "CatMetric"]:
    for sname, strat in NAN_STRATEGIES:
        args = {} if strat is None else {"nan_strategy": strat}
        for iname, fn in AGG_INPUTS:
            if iname == "nan" and strat == "error":
                continue  # torchmetrics raises: nothing to record
            if sname not in ("default", "value") and iname not in ("plain", "nan"):
                continue
            if metric == "CatMetric" and iname == "scalar" and sname != "default":
                continue
            late = metric == "MeanMetric" and iname == "nan" and sname in ("value", "zero")
            skip = has_disable if sname == "disable" else newer_nan_weight if late else None
            add(f"{metric}_{sname}_{iname}", metric, args, fn, skip=skip)


def mean_weighted(g, b):
    n = sizes(g, 1)[0]
    return (randn(g, n), rand(g, n))


def mean_weight_scalar(g, b):
    return (randn(g, sizes(g, 1)[0]), torch.tensor(float(b + 1) / 2))


def mean_weight_bcast(g, b):
    n = sizes(g, 1, 2, 8)[0]
    return (randn(g, n, 4), rand(g, n, 1))


def mean_weight_row(g, b):
    n = sizes(g, 1, 2, 8)[0]
    return (randn(g, n, 4), rand(g, 4))


def mean_weight_nan(g, b):
    n = sizes(g, 1)[0]
    v, w = randn(g, n), rand(g, n)
    v[rand(g, n) < 0.2] = float("nan")
    w[rand(g, n) < 0.2] = float("nan")
    return (v, w)


for sname, strat in NAN_STRATEGIES:
    args = {} if strat is None else {"nan_strategy": strat}
    if sname in ("default", "warn", "ignore", "value", "zero", "disable"):
        add(f"MeanMetric_{sname}_weights_nan", "MeanMetric", args, mean_weight_nan,
            skip=has_disable if sname == "disable" else newer_nan_weight if sname in ("value", "zero") else None)
add("MeanMetric_disable_weighted", "MeanMetric", {"nan_strategy": "disable"}, mean_weighted, skip=has_disable,
    note="torchmetrics 1.9 replaces every weight by 1 under nan_strategy='disable'")
for iname, fn in [("weighted", mean_weighted), ("weight_scalar", mean_weight_scalar),
                  ("weight_bcast_col", mean_weight_bcast), ("weight_bcast_row", mean_weight_row)]:
    add(f"MeanMetric_{iname}", "MeanMetric", {}, fn)

add("SumMetric_float32_order", "SumMetric", {},
    lambda g, b: (torch.cat([torch.tensor([1e8 if b == 0 else 1.0]), torch.ones(2000) * 0.25]),),
    note="float32 state; each batch's sum is added once (state += batch.sum())")
add("SumMetric_large_batch", "SumMetric", {}, lambda g, b: (rand(g, 4096, hi=3.0),))
add("CatMetric_rows", "CatMetric", {}, lambda g, b: (randn(g, 3, 2),))

# ---- binary classification ----


def bin_probs(g, b, n=None):
    n = n or sizes(g, 1)[0]
    return (rand(g, n), ints(g, 2, n))


def bin_logits(g, b):
    n = sizes(g, 1)[0]
    return (randn(g, n) * 3, ints(g, 2, n))


def bin_labels(g, b):
    n = sizes(g, 1)[0]
    return (ints(g, 2, n), ints(g, 2, n))


def bin_2d(g, b):
    n = sizes(g, 1, 2, 8)[0]
    return (rand(g, n, 5), ints(g, 2, n, 5))


def bin_f64(g, b):
    p, t = bin_probs(g, b)
    return (p.double(), t)


def bin_f16(g, b):
    p, t = bin_probs(g, b)
    return (p.half(), t)


def bin_bool_target(g, b):
    p, t = bin_probs(g, b)
    return (p, t.bool())


def bin_int32_target(g, b):
    p, t = bin_probs(g, b)
    return (p, t.int())


def bin_ties(g, b):
    n = sizes(g, 1)[0]
    return ((ints(g, 5, n).float() / 4), ints(g, 2, n))


def bin_ignore(ignore):
    def make(g, b):
        p, t = bin_probs(g, b)
        return (p, with_ignored(g, t, ignore))
    return make


def bin_ignore_logits(ignore):
    def make(g, b):
        p, t = bin_logits(g, b)
        return (p, with_ignored(g, t, ignore))
    return make


def bin_no_pos(g, b):
    n = sizes(g, 1)[0]
    return (rand(g, n), torch.zeros(n, dtype=torch.int64))


def bin_all_pos(g, b):
    n = sizes(g, 1)[0]
    return (rand(g, n), torch.ones(n, dtype=torch.int64))


BIN_INPUTS = [("probs", bin_probs), ("logits", bin_logits), ("labels", bin_labels), ("2d", bin_2d), ("f64", bin_f64),
              ("f16", bin_f16), ("bool_target", bin_bool_target), ("i32_target", bin_int32_target)]

for metric in ["BinaryAccuracy", "BinaryPrecision", "BinaryRecall", "BinaryF1Score"]:
    for iname, fn in BIN_INPUTS:
        add(f"{metric}_{iname}", metric, {}, fn)
    add(f"{metric}_threshold_0.3", metric, {"threshold": 0.3}, bin_probs)
    add(f"{metric}_threshold_0.8_logits", metric, {"threshold": 0.8}, bin_logits)
    add(f"{metric}_ignore_-1", metric, {"ignore_index": -1}, bin_ignore(-1))
    add(f"{metric}_ignore_0", metric, {"ignore_index": 0}, bin_ignore(0))
    add(f"{metric}_multidim_global", metric, {"multidim_average": "global"}, bin_2d)
add("BinaryPrecision_no_positive_preds", "BinaryPrecision", {"threshold": 0.99}, bin_probs)
add("BinaryRecall_no_positives", "BinaryRecall", {}, bin_no_pos)

for norm in [None, "true", "pred", "all", "none"]:
    args = {} if norm is None else {"normalize": norm}
    for iname, fn in [("probs", bin_probs), ("logits", bin_logits), ("labels", bin_labels)]:
        if norm not in (None, "true") and iname != "probs":
            continue
        add(f"BinaryConfusionMatrix_{norm or 'default'}_{iname}", "BinaryConfusionMatrix", args, fn)
add("BinaryConfusionMatrix_threshold_0.2", "BinaryConfusionMatrix", {"threshold": 0.2}, bin_probs)
add("BinaryConfusionMatrix_ignore_-1_logits", "BinaryConfusionMatrix", {"ignore_index": -1}, bin_ignore_logits(-1))
add("BinaryConfusionMatrix_ignore_0", "BinaryConfusionMatrix", {"ignore_index": 0, "normalize": "true"},
    bin_ignore(0))
add("BinaryConfusionMatrix_2d", "BinaryConfusionMatrix", {}, bin_2d)
add("BinaryConfusionMatrix_normalize_null", "BinaryConfusionMatrix", {"normalize": None}, bin_probs)
add("BinaryAccuracy_base_options", "BinaryAccuracy", {"validate_args": True, "compute_with_cache": False}, bin_probs)

def ap_nan_rule(metric, thresholds):
    def rule(tm):
        if tm < (1, 0, 0):
            return "torchmetrics < 1.0 gives NaN for exact average precision without positive targets; 1.x gives 0"
        return None
    return rule if metric == "BinaryAveragePrecision" and thresholds is None else None


CURVE_THRESHOLDS = [("exact", None), ("binned_5", 5), ("binned_11", 11), ("binned_100", 100),
                    ("list_sorted", [0.1, 0.25, 0.5, 0.75, 0.9]), ("list_unsorted", [0.7, 0.1, 0.5, 0.3, 0.9]),
                    ("list_dupes", [0.5, 0.2, 0.5, 0.8]), ("list_one", [0.4]),
                    ("list_unsorted_above_all", [0.3, 1.0, 0.6, 0.97, 0.1])]

for metric in ["BinaryAUROC", "BinaryAveragePrecision"]:
    for tname, thr in CURVE_THRESHOLDS:
        args = {} if thr is None else {"thresholds": thr}
        add(f"{metric}_{tname}", metric, args, bin_probs)
        if tname in ("exact", "binned_11", "list_unsorted", "list_unsorted_above_all"):
            add(f"{metric}_{tname}_logits", metric, args, bin_logits)
            add(f"{metric}_{tname}_ignore", metric, dict(args, ignore_index=-1), bin_ignore(-1))
            add(f"{metric}_{tname}_no_positives", metric, args, bin_no_pos, skip=ap_nan_rule(metric, thr),
                note="no positive targets: torchmetrics warns and sets recall to 1 (exact)")
            add(f"{metric}_{tname}_all_positive", metric, args, bin_all_pos)
            add(f"{metric}_{tname}_2d", metric, args, bin_2d)
    add(f"{metric}_exact_ties", metric, {}, bin_ties)
    add(f"{metric}_exact_f64", metric, {}, bin_f64)
    add(f"{metric}_binned_ties", metric, {"thresholds": 5}, bin_ties)
    add(f"{metric}_exact_one_batch_no_positives", metric, {}, bin_no_pos, n_batches=1, skip=ap_nan_rule(metric, None))

# ---- multiclass ----
C = 5


def mc_logits(g, b, c=C):
    n = sizes(g, 1)[0]
    return (randn(g, n, c), ints(g, c, n))


def mc_probs(g, b):
    p, t = mc_logits(g, b)
    return (p.softmax(1), t)


def mc_labels(g, b):
    n = sizes(g, 1)[0]
    return (ints(g, C, n), ints(g, C, n))


def mc_tied(g, b):
    n = sizes(g, 1)[0]
    return (ints(g, 3, n, C).float(), ints(g, C, n))


def mc_extra(g, b):
    n = sizes(g, 1, 2, 6)[0]
    return (randn(g, n, C, 3), ints(g, C, n, 3))


def mc_f64(g, b):
    p, t = mc_logits(g, b)
    return (p.double(), t)


def mc_ignore(ignore, maker=mc_logits):
    def make(g, b):
        p, t = maker(g, b)
        return (p, with_ignored(g, t, ignore))
    return make


def mc_sparse(g, b):
    n = sizes(g, 1)[0]
    return (randn(g, n, C), ints(g, 2, n))  # classes 2..4 never appear as targets


def topk_rule(tm):
    if tm < (1, 7, 0):
        return "the top_k > 1 stat-score update (one prediction per sample: the target if it is in the top k, " \
               "else the top 1) is torchmetrics 1.7+; keepsake follows it, so precision and F1 differ"
    return None


def macro_all_classes(tm):
    if tm < (1, 0, 0):
        return "torchmetrics < 1.0 averages macro scores over every class; 1.x (and keepsake) over the classes " \
               "that occur in preds or target"
    return None


def topk_rule_for(metric):
    # Accuracy and recall read only tp and fn, which both rules count alike; the replay leaves out fp/tn.
    return topk_rule if metric in ("MulticlassPrecision", "MulticlassF1Score") else None


MC_INPUTS = [("logits", mc_logits), ("probs", mc_probs), ("labels", mc_labels), ("extra_dims", mc_extra),
             ("f64", mc_f64), ("ignore_-100", mc_ignore(-100)), ("ignore_0", mc_ignore(0)),
             ("ignore_-1_labels", mc_ignore(-1, mc_labels)), ("sparse_targets", mc_sparse), ("tied", mc_tied)]

for metric in ["MulticlassAccuracy", "MulticlassPrecision", "MulticlassRecall", "MulticlassF1Score"]:
    for avg in ["micro", "macro", "weighted", "none"]:
        for iname, fn in MC_INPUTS:
            args = {"num_classes": C, "average": avg}
            if iname.startswith("ignore"):
                args["ignore_index"] = int(iname.split("_")[1])
            if avg in ("weighted", "none") and iname in ("probs", "f64", "ignore_-1_labels"):
                continue
            add(f"{metric}_{avg}_{iname}", metric, args, fn, skip=macro_all_classes if avg == "macro" else None)
        for k in (2, 3):
            for iname, fn in [("logits", mc_logits), ("tied", mc_tied), ("extra_dims", mc_extra),
                              ("ignore_-100", mc_ignore(-100)), ("ignore_1", mc_ignore(1))]:
                if k == 3 and iname not in ("logits", "tied"):
                    continue
                args = {"num_classes": C, "average": avg, "top_k": k}
                if iname.startswith("ignore"):
                    args["ignore_index"] = int(iname.split("_")[1])
                rule = topk_rule_for(metric)
                if avg == "macro":
                    rule = (lambda r: lambda tm: macro_all_classes(tm) or (r(tm) if r else None))(rule)
                add(f"{metric}_{avg}_top{k}_{iname}", metric, args, fn, skip=rule)
add("MulticlassAccuracy_default_args", "MulticlassAccuracy", {"num_classes": C}, mc_logits, skip=macro_all_classes)
add("MulticlassRecall_average_null", "MulticlassRecall", {"num_classes": C, "average": None}, mc_logits)
add("MulticlassF1Score_multidim_global", "MulticlassF1Score", {"num_classes": C, "multidim_average": "global"}, mc_extra, skip=macro_all_classes)
add("MulticlassAccuracy_base_options", "MulticlassAccuracy",
    {"num_classes": C, "validate_args": False, "dist_sync_on_step": False, "sync_on_compute": True,
     "compute_on_cpu": False, "compute_with_cache": True}, mc_logits, skip=macro_all_classes,
    note="torchmetrics base-class options that do not change the state")
add("MulticlassAccuracy_top2_wide_tied", "MulticlassAccuracy", {"num_classes": 200, "top_k": 2, "average": "micro"},
    lambda g, b: (ints(g, 2, 12, 200).float(), ints(g, 200, 12)),
    note="C >= 64 k: torch.topk takes its partial_sort path")
add("MulticlassPrecision_top2_wide_tied", "MulticlassPrecision", {"num_classes": 130, "top_k": 2},
    lambda g, b: (ints(g, 3, 10, 130).float(), ints(g, 130, 10)), skip=topk_rule)
add("MulticlassF1Score_top4_c40_tied", "MulticlassF1Score", {"num_classes": 40, "top_k": 4, "average": "micro"},
    lambda g, b: (ints(g, 2, 16, 40).float(), ints(g, 40, 16)), skip=topk_rule)
add("MulticlassAccuracy_top2_nan", "MulticlassAccuracy", {"num_classes": C, "top_k": 2, "average": "micro"},
    lambda g, b: (torch.where(rand(g, 20, C) < 0.1, torch.tensor(float("nan")), randn(g, 20, C)), ints(g, C, 20)),
    note="NaN ranks above every number in torch.topk")

for norm in [None, "true", "pred", "all"]:
    args = {"num_classes": C} if norm is None else {"num_classes": C, "normalize": norm}
    for iname, fn in [("logits", mc_logits), ("labels", mc_labels), ("extra_dims", mc_extra),
                      ("sparse_targets", mc_sparse)]:
        if norm not in (None, "true") and iname not in ("logits", "sparse_targets"):
            continue
        add(f"MulticlassConfusionMatrix_{norm or 'default'}_{iname}", "MulticlassConfusionMatrix", args, fn)
add("MulticlassConfusionMatrix_ignore_-100", "MulticlassConfusionMatrix", {"num_classes": C, "ignore_index": -100},
    mc_ignore(-100))
add("MulticlassConfusionMatrix_ignore_2", "MulticlassConfusionMatrix", {"num_classes": C, "ignore_index": 2},
    mc_ignore(2, mc_labels))

for avg in ["macro", "weighted", "none"]:
    for tname, thr in [("exact", None), ("binned_7", 7), ("list_unsorted", [0.6, 0.1, 0.35, 0.9])]:
        args = {"num_classes": C, "average": avg}
        if thr is not None:
            args["thresholds"] = thr
        add(f"MulticlassAUROC_{avg}_{tname}_logits", "MulticlassAUROC", args, mc_logits)
        if avg == "macro":
            add(f"MulticlassAUROC_{avg}_{tname}_probs", "MulticlassAUROC", args, mc_probs)
            add(f"MulticlassAUROC_{avg}_{tname}_ignore", "MulticlassAUROC", dict(args, ignore_index=-1),
                mc_ignore(-1))
            add(f"MulticlassAUROC_{avg}_{tname}_extra_dims", "MulticlassAUROC", args, mc_extra)
    add(f"MulticlassAUROC_{avg}_exact_sparse", "MulticlassAUROC", {"num_classes": C, "average": avg}, mc_sparse,
        note="classes that never occur have an undefined ROC area")
add("MulticlassAUROC_default_args", "MulticlassAUROC", {"num_classes": C}, mc_logits)

for avg in ["micro", "macro", "weighted", "none"]:
    for iname, fn in [("logits", mc_logits), ("labels", mc_labels), ("ignore_0", mc_ignore(0)),
                      ("ignore_-100", mc_ignore(-100)), ("sparse_targets", mc_sparse), ("extra_dims", mc_extra)]:
        args = {"num_classes": C, "average": avg}
        if iname.startswith("ignore"):
            args["ignore_index"] = int(iname.split("_")[1])
        add(f"MulticlassJaccardIndex_{avg}_{iname}", "MulticlassJaccardIndex", args, fn)

# ---- multilabel ----
L = 4


def ml_probs(g, b):
    n = sizes(g, 1)[0]
    return (rand(g, n, L), ints(g, 2, n, L))


def ml_logits(g, b):
    n = sizes(g, 1)[0]
    return (randn(g, n, L) * 2, ints(g, 2, n, L))


def ml_labels(g, b):
    n = sizes(g, 1)[0]
    return (ints(g, 2, n, L), ints(g, 2, n, L))


def ml_extra(g, b):
    n = sizes(g, 1, 2, 6)[0]
    return (rand(g, n, L, 3), ints(g, 2, n, L, 3))


def ml_ignore(g, b):
    p, t = ml_probs(g, b)
    return (p, with_ignored(g, t, -1))


for metric in ["MultilabelAccuracy", "MultilabelF1Score"]:
    for avg in ["micro", "macro", "weighted", "none"]:
        for iname, fn in [("probs", ml_probs), ("logits", ml_logits), ("labels", ml_labels), ("extra_dims", ml_extra),
                          ("ignore_-1", ml_ignore)]:
            args = {"num_labels": L, "average": avg}
            if iname == "ignore_-1":
                args["ignore_index"] = -1
            add(f"{metric}_{avg}_{iname}", metric, args, fn)
        add(f"{metric}_{avg}_threshold_0.3", metric, {"num_labels": L, "average": avg, "threshold": 0.3}, ml_probs)
    add(f"{metric}_default_args", metric, {"num_labels": L}, ml_probs)
    add(f"{metric}_multidim_global", metric, {"num_labels": L, "multidim_average": "global"}, ml_extra)

# ---- regression ----


def reg_pair(g, b, k=None, dtype=torch.float32):
    n = sizes(g, 1)[0]
    shape = (n,) if k is None else (n, k)
    t = randn(g, *shape)
    return ((t + 0.5 * randn(g, *shape)).to(dtype), t.to(dtype))


def reg_multi(k):
    return lambda g, b: reg_pair(g, b, k)


def reg_f64(g, b):
    return reg_pair(g, b, dtype=torch.float64)


def reg_2d_single(g, b):
    n = sizes(g, 1, 2, 8)[0]
    t = randn(g, n, 3)
    return (t + 0.3 * randn(g, n, 3), t)


def mae_outputs(tm):
    return "MeanAbsoluteError takes num_outputs since torchmetrics 1.5" if tm < (1, 5, 0) else None


def mse_outputs(tm):
    if "num_outputs" not in inspect.signature(reg.MeanSquaredError.__init__).parameters:
        return f"MeanSquaredError takes no num_outputs in torchmetrics {torchmetrics.__version__}"
    return None


for squared in [None, True, False]:
    args = {} if squared is None else {"squared": squared}
    tag = {None: "default", True: "squared", False: "rmse"}[squared]
    add(f"MeanSquaredError_{tag}", "MeanSquaredError", args, reg_pair)
    add(f"MeanSquaredError_{tag}_outputs3", "MeanSquaredError", dict(args, num_outputs=3), reg_multi(3),
        skip=mse_outputs)
    add(f"MeanSquaredError_{tag}_f64", "MeanSquaredError", args, reg_f64)
add("MeanSquaredError_2d_single_output", "MeanSquaredError", {}, reg_2d_single)
add("MeanSquaredError_large_batch", "MeanSquaredError", {}, lambda g, b: reg_pair(g, b) if b else
    (randn(g, 2000), randn(g, 2000)))
add("MeanAbsoluteError_default", "MeanAbsoluteError", {}, reg_pair)
add("MeanAbsoluteError_f64", "MeanAbsoluteError", {}, reg_f64)
add("MeanAbsoluteError_2d_single_output", "MeanAbsoluteError", {}, reg_2d_single)
add("MeanAbsoluteError_outputs1", "MeanAbsoluteError", {"num_outputs": 1}, reg_pair, skip=mae_outputs)
add("MeanAbsoluteError_outputs3", "MeanAbsoluteError", {"num_outputs": 3}, reg_multi(3), skip=mae_outputs)


def r2_tm_args(k):
    takes = "num_outputs" in inspect.signature(reg.R2Score.__init__).parameters
    return {"num_outputs": k} if takes else {}


add("R2Score_default", "R2Score", {}, reg_pair)
add("R2Score_f64", "R2Score", {}, reg_f64)
add("R2Score_outputs1", "R2Score", {"num_outputs": 1}, reg_pair, tm_args=r2_tm_args(1))
add("R2Score_outputs2", "R2Score", {"num_outputs": 2}, reg_multi(2), tm_args=r2_tm_args(2),
    note="torchmetrics >= 1.5 infers the outputs from the input; keepsake is told num_outputs")
add("R2Score_outputs3", "R2Score", {"num_outputs": 3}, reg_multi(3), tm_args=r2_tm_args(3))
add("R2Score_first_batch_one_sample", "R2Score", {},
    lambda g, b: reg_pair(g, b) if b else (torch.tensor([0.5]), torch.tensor([1.0])),
    note="compute() with one sample raises")
add("R2Score_perfect", "R2Score", {}, lambda g, b: (lambda t: (t.clone(), t))(randn(g, 10)))
add("R2Score_constant_target", "R2Score", {}, lambda g, b: (randn(g, 10), torch.full((10,), 2.0)))

# ---- language (Composer) ----
V = 7


def lm_flat(g, b):
    n = sizes(g, 1)[0]
    t = with_ignored(g, ints(g, V, n), -100, 0.15)
    return (randn(g, n, V) * 2, t)


def lm_seq(g, b):
    bs = sizes(g, 1, 2, 5)[0]
    t = with_ignored(g, ints(g, V, bs, 6), -100, 0.15)
    return (randn(g, bs, 6, V), t)


def lm_ignore0(g, b):
    n = sizes(g, 1)[0]
    return (randn(g, n, V), ints(g, V, n))


for metric in ["LanguageCrossEntropy", "LanguagePerplexity"]:
    add(f"{metric}_flat", metric, {}, lm_flat, note="Composer semantics; ignore_index=-100")
    add(f"{metric}_seq", metric, {}, lm_seq)
    add(f"{metric}_ignore_0", metric, {"ignore_index": 0}, lm_ignore0)
    add(f"{metric}_f64", metric, {}, lambda g, b: (lambda x: (x[0].double(), x[1]))(lm_flat(g, b)))

# ---- running ----


def run(case):
    g = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    m = CLASSES[case.metric](**case.tm_args)
    batches, computes = [], []
    for b in range(case.n_batches):
        inputs = case.make(g, b)
        batches.append([tensor_json(x) for x in inputs])
        m.update(*[x.clone() for x in inputs])
        try:
            computes.append(tensor_json(m.compute()))
        except Exception:  # noqa: BLE001 - a compute that raises is recorded as null
            computes.append(None)
        m._computed = None
    states = {name: state_json(getattr(m, name)) for name in m._defaults}
    out = {"name": case.name, "metric": case.metric, "args": case.args, "note": case.note, "batches": batches,
           "compute_after_each_batch": computes, "state_dict": states}
    if case.tm_args != case.args:
        out["tm_args"] = case.tm_args
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_vectors.py OUT.json")
    names = [c.name for c in CASES]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        sys.exit(f"duplicate case names: {sorted(dupes)}")
    cases, omitted = [], []
    for c in CASES:
        reason = c.skip(TM) if c.skip else None
        if reason:
            omitted.append({"name": c.name, "reason": reason})
            continue
        try:
            cases.append(run(c))
        except Exception as e:  # noqa: BLE001 - an older torchmetrics that cannot run the case
            if TM >= (1, 9, 0):
                raise
            omitted.append({"name": c.name, "reason": f"torchmetrics {torchmetrics.__version__} raised "
                                                      f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"})
    doc = {
        "generator": f"tests/vectors/gen_vectors.py: torchmetrics {torchmetrics.__version__} on torch "
                     f"{torch.__version__}, seed crc32(case name)",
        "torchmetrics": torchmetrics.__version__,
        "format": "each case: metric class, keepsake constructor args (tm_args: torchmetrics' when they differ); "
                  "batches of update() arguments as tensors {dtype, shape, data (row-major)}; compute() after each "
                  "batch (null: torchmetrics raised); final state_dict (list states as lists of tensors). "
                  "Non-finite floats are the strings 'nan', 'inf', '-inf'.",
        "omitted": omitted,
        "cases": cases,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} cases, {len(omitted)} omitted -> {sys.argv[1]}")


if __name__ == "__main__":
    main()

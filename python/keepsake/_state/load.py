"""Loads through the C engine: Python describes the program's objects, ``ks_state_load_state_dict``
decides, Python installs what it staged.

No load rule lives here. Which entries fit which object, widening and refused narrowing,
reshapes, schema versions and legacy state names, list states, missing / mismatched / skipped
components and metrics, ignore globs and the report's text are the C library's
(``src/state/load.c``, ``load_metrics.c``, ``src/metrics/state_io.c``, ``described.c``). This
module turns live objects into a description (dtypes, shapes, the memory of the model's tensors,
callables for the components) and copies the engine's staged values into the objects.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._core import layout as _layout, native as _n, tensors as _tensors, tree as _tree
from .._core.report import LoadReport
from . import metrics as _metrics

FILLED = ("loaded", "migrated", "converted")


def _reduction(m: Any, state: str) -> Optional[str]:
    """The name of a state's dist_reduce_fx (the library reads it: ks_reduce_parse)."""
    fn = getattr(m, "_reductions", {}).get(state)
    return getattr(fn, "__name__", None)


def describe_metric(name: str, m: Any, top: bool = True) -> tuple:
    """(name, class, attributes JSON, states, inner metrics, kept attributes): a torchmetrics metric
    as the engine sees it (ks_metric_describe). List states are cat states of any dtype; a tensor
    state keeps its default's dtype and shape; a wrapper's kept attributes (_num_vals_seen,
    min_val, ...) are declared with their dtype, shape and range (ks_metric_describe_attr)."""
    codes = _tensors.torch_maps()[0]
    states = []
    for s, d in m._defaults.items():
        if isinstance(d, list):
            states.append((s, _reduction(m, s), -1, ()))
        else:
            code = codes.get(d.dtype)
            if code is None:
                raise TypeError(f"metric state '{s}' has dtype {d.dtype}, which keepsake does not store")
            states.append((s, _reduction(m, s), code, tuple(d.shape)))
    # Every inner metric at any depth, by dotted name, under the top metric (the saved layout).
    inner = [(n, describe_metric(n, sub, False)) for n, sub in _metrics.inner_metrics(m)] if top else []
    return (name, type(m).__name__, json.dumps(_metrics.arg_attrs(m)), states, inner, _metrics.attr_decls(m))


def _install_states(m: Any, values: Dict[str, Any]) -> None:
    for state, default in m._defaults.items():
        v = _tensors.torch_from_copy(values["states"][state])
        if isinstance(default, list):
            setattr(m, state, [v] if v.ndim and v.shape[0] > 0 else [])
        else:
            setattr(m, state, v.to(default.device))


def install_metric(m: Any, path: str, values: Optional[Dict[str, Any]], kind: Optional[str],
                   items: Dict[str, Any], kinds: _tree.Records) -> None:
    """Copies what the engine staged for one metric (and its inner metrics) into it, or resets it
    when the engine left it at its defaults."""
    if values is None or kind not in FILLED:
        m.reset()
        return
    parts = [(m, path, values)] + [(sub, _layout.key(_layout.METRIC_INNER, n, base=path), values["inner"][n])
                                   for n, sub in _metrics.inner_metrics(m)]
    for metric, mpath, vals in parts:
        _install_states(metric, vals)
        metric._computed = _metrics.computed(items, kinds, mpath)
        _metrics.install_attrs(metric, vals["attrs"])
        metric._update_count = int(vals["update_count"])


def component_loader(obj: Any, items: Dict[str, Any], kinds: _tree.Records, leaf: Callable) -> Callable[[str], None]:
    """What the engine calls with a component's prefix when the file has it: the object's own
    load_state_dict (or a dict's update) with the saved tree. Raising refuses it."""
    def load(prefix: str) -> None:
        template = obj.state_dict() if hasattr(obj, "state_dict") else None
        install_tree(obj, _tree.unflatten(items, kinds, prefix, template, leaf))
    return load


def install_tree(obj: Any, value: Any) -> None:
    """Gives a component its saved tree: its own load_state_dict, or a dict's contents replaced."""
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(value)
    elif isinstance(obj, dict):
        obj.clear()
        obj.update(value)
    else:
        raise TypeError(f"a {type(obj).__name__} has no load_state_dict()")


def model_entries(model: Any, targets: Optional[Dict[str, Any]] = None) -> Tuple[List[tuple], List[Tuple[Any, Any, str]]]:
    """The model's tensors for the engine, which fills them in place: (name, dtype, shape,
    address). A tensor whose memory the engine cannot write (not on the CPU, not contiguous)
    gets a staging tensor, copied in afterwards: (program tensor, staging, key) in the 2nd list.
    `targets` gets each key's tensor whose memory the engine writes (the tensor or its staging)."""
    import torch
    sd = model.state_dict() if hasattr(model, "state_dict") else model
    codes = _tensors.torch_maps()[0]
    out, staged = [], []
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor) or codes.get(t.dtype) is None:
            continue
        target = t
        if t.device.type != "cpu" or not t.is_contiguous() or t.layout != torch.strided:
            target = torch.empty(tuple(t.shape), dtype=t.dtype)
            staged.append((t, target, _layout.key(_layout.MODEL, name)))
        out.append((name, codes[t.dtype], tuple(t.shape), target.data_ptr()))
        if targets is not None:
            targets[_layout.key(_layout.MODEL, name)] = target
    return out, staged


def run(source: Any, spec: Dict[str, Any]) -> Dict[str, Any]:
    """ks_state_load_state_dict over `source` (a Reader, or (entries, metadata)) and `spec`."""
    with _no_grad():
        return _n.load_state(source, spec)


class _no_grad:
    """torch.no_grad when torch is importable (the engine writes the model's tensors in place)."""

    def __enter__(self) -> None:
        try:
            import torch
            self._g = torch.no_grad()
            self._g.__enter__()
        except ImportError:
            self._g = None

    def __exit__(self, *exc: Any) -> None:
        if self._g is not None:
            self._g.__exit__(*exc)


def metric_groups(train_metrics: Any, eval_groups: Sequence[Tuple[str, Any]]) -> Tuple[list, list, list]:
    """The engine's metric descriptions, and (path, metric) pairs to install."""
    train = [describe_metric(n, m) for n, m in _metrics.named_metrics(train_metrics)]
    pairs = [(_layout.key(_layout.TRAIN_METRIC, n), m) for n, m in _metrics.named_metrics(train_metrics)]
    evals = []
    for label, ms in eval_groups:
        evals.append((label, [describe_metric(n, m) for n, m in _metrics.named_metrics(ms)]))
        pairs += [(_layout.key(_layout.EVAL_METRIC, n, base=label), m) for n, m in _metrics.named_metrics(ms)]
    return train, evals, pairs


def install_metrics(pairs: Sequence[Tuple[str, Any]], result: Dict[str, Any], items: Dict[str, Any],
                    kinds: _tree.Records) -> None:
    kind_of = {}
    for kind, path, _why in result["report"]:
        kind_of.setdefault(path, kind)
    for path, m in pairs:
        install_metric(m, path, result["metrics"].get(path), kind_of.get(path), items, kinds)


def load_metrics_from(items: Dict[str, Any], metrics_meta: Dict[str, Any], kinds: _tree.Records,
                      metrics: Dict[str, Any], root: str, report: LoadReport, allow_narrowing: bool) -> None:
    """Fills `metrics` (name -> metric, saved under `root`) from flat entries held in memory (a
    Lightning checkpoint dict), through the C engine as load_checkpoint does."""
    assert root == _layout.folder(_layout.TRAIN_METRIC), root
    fl = _tree.Flattener(_tensors.torch_entry)
    for k, v in items.items():
        if v is not None and (k.startswith(root) or k.startswith(_layout.folder(_layout.EVAL_METRIC))):
            fl.add(k, v)
    meta = {"keepsake.metrics": json.dumps(metrics_meta)} if metrics_meta else {}
    train = [describe_metric(n, m) for n, m in metrics.items()]
    res = run((fl.entries, meta), {"train": train, "allow_narrowing": allow_narrowing})
    for kind, path, why in res["report"]:
        report.add(kind, path, why)
    install_metrics([(root + n, m) for n, m in metrics.items()], res, items, kinds)

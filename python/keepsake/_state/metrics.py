"""Any torchmetrics Metric or MetricCollection, saved and filled by state name.

Layout: the C library's (ks_state_key, through keepsake._core.layout, names every key): every
state in the metric's ``_defaults`` (the part METRIC_STATE), list states concatenated along dim 0
(stored as cat states, restored as one-item lists), the cached result (METRIC_COMPUTED: a tensor,
nested entries for tuple/dict results, or null), a wrapper's kept attributes (METRIC_ATTR) and
inner metrics (METRIC_INNER, each with its METRIC_UPDATE_COUNT). The
update count goes into the ``keepsake.metrics`` metadata with the class; metrics the C catalogue
implements also get their canonical args and schema version there, derived by the C library
itself (ks_metric_from_attributes, as ``keepsake convert`` does for pickled metrics), so a C
program can rebuild and compute them.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from .._core import layout as _layout, tensors as _tensors, tree as _tree

# Constructor arguments the C catalogue takes that torchmetrics keeps as attributes.
ARG_ATTRS = ("average", "ignore_index", "multidim_average", "nan_strategy", "normalize", "num_classes",
             "num_labels", "num_outputs", "squared", "threshold", "thresholds", "top_k")


def is_metric(obj: Any) -> bool:
    return hasattr(obj, "_defaults") and hasattr(obj, "_update_count") and hasattr(obj, "_reductions")


def is_collection(obj: Any) -> bool:
    return type(obj).__name__ == "MetricCollection" or (hasattr(obj, "items") and hasattr(obj, "_modules")
                                                        and not is_metric(obj))


def named_metrics(obj: Any) -> List[Tuple[str, Any]]:
    """(name, metric) pairs of a Metric, a MetricCollection or a dict of them."""
    if obj is None:
        return []
    if is_metric(obj):
        return [(type(obj).__name__, obj)]
    if type(obj).__name__ == "MetricCollection" or (is_collection(obj) and hasattr(obj, "keys")):
        try:
            return list(obj.items(keep_base=True, copy_state=False))
        except TypeError:  # older torchmetrics
            return list(obj.items(keep_base=True))
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            if not is_metric(v):
                raise TypeError(f"metric {k!r} is a {type(v).__name__}, not a torchmetrics Metric")
            out.append((str(k), v))
        return out
    raise TypeError(f"expected a torchmetrics Metric, MetricCollection or dict of metrics, not {type(obj).__name__}")


def _json_attr(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
        return [float(x) for x in v]
    raise ValueError


def describe(path: str, name: str, m: Any) -> Dict[str, Any]:
    """The description the extension turns into keepsake.metrics for one metric."""
    attrs = arg_attrs(m)
    cls = type(m)
    desc = {"path": path, "name": name, "class": f"{cls.__module__}.{cls.__name__}",
            "update_count": int(m._update_count), "attrs": attrs}
    lists = [s for s, d in m._defaults.items() if isinstance(d, list)]
    if lists:  # recorded in keepsake.metrics, so that a .pt export gives them back as lists
        desc["lists"] = lists
    inner = {n: type(sub).__name__ for n, sub in inner_metrics(m)}
    if inner:  # a load refuses a wrapper around other metrics
        desc["inner"] = inner
    return desc  # the C library derives the record (ks_metric_records_json)


def _cat(v: list):
    import torch
    items = [x.reshape(1) if x.ndim == 0 else x for x in v]
    if not items:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat([x.detach() for x in items], dim=0)


# Plain integer attributes of torchmetrics wrappers that they need besides the states, with the
# values they can take: Running* writes its next update into slot ``_num_vals_seen % window`` and
# hands the count to its base metric as the update count, so it is a count, never negative.
# Tensor attributes that are not states (MinMaxMetric's min_val and max_val) are kept too: see
# _tensor_attrs. The load engine checks each against this description (ks_metric_describe_attr).
WRAPPER_ATTRS = {"_num_vals_seen": (0, 2**63 - 1)}
_NOT_ATTRS = (_layout.COMPUTED, "_forward_cache")


def _tensor_attrs(m: Any) -> List[str]:
    """A metric's tensor attributes that are not states: what wrappers keep between computes."""
    import torch
    return sorted(k for k, v in vars(m).items()
                  if isinstance(v, torch.Tensor) and k not in m._defaults and k not in _NOT_ATTRS)


def inner_metrics(m: Any) -> List[Tuple[str, Any]]:
    """The metrics inside a wrapper (MinMaxMetric's base, MultitaskWrapper's tasks, the two
    sides of ``m1 + m2``, ...), by dotted module name, at every depth; [] for a plain metric."""
    return [(n, sub) for n, sub in m.named_modules() if n and is_metric(sub)]


def _clone(v: Any) -> Any:
    if hasattr(v, "detach"):
        return v.detach().clone()
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(x) for x in v)
    return v


def _states_of(m: Any, copy: bool) -> Dict[str, Any]:
    """What one metric holds: states (list states joined), _computed and kept attributes."""
    c = _clone if copy else (lambda v: v)
    out: Dict[str, Any] = {"state_dict": {s: c(_cat(v) if isinstance(v, list) else v)
                                          for s, v in ((s, getattr(m, s)) for s in m._defaults)},
                           _layout.COMPUTED: c(getattr(m, _layout.COMPUTED, None))}
    attrs = {a: int(getattr(m, a)) for a in WRAPPER_ATTRS if _int_attr(m, a)}
    attrs.update({a: c(getattr(m, a)) for a in _tensor_attrs(m)})
    if attrs:
        out["attrs"] = attrs
    return out


def snapshot(m: Any, name: str, path: str, copy: bool = True) -> Dict[str, Any]:
    """A metric as plain tensors and containers (what torch.load(weights_only=True) accepts):
    its states, _computed, kept attributes, update count, every inner metric of a wrapper, and
    the description keepsake.metrics is made from. ``copy`` clones every tensor, so the snapshot
    is the metric at this moment whatever the metric does next (a background save)."""
    snap = _states_of(m, copy)
    snap["update_count"] = int(m._update_count)
    inner = {n: dict(_states_of(sub, copy), update_count=int(sub._update_count)) for n, sub in inner_metrics(m)}
    if inner:
        snap["inner"] = inner
    snap["describe"] = describe(path, name, m)
    return snap


def _add_snapshot_states(fl: _tree.Flattener, path: str, part: Dict[str, Any]) -> None:
    for state, v in part["state_dict"].items():
        fl.add(_layout.key(_layout.METRIC_STATE, state, base=path), v)
    fl.add(_layout.key(_layout.METRIC_COMPUTED, base=path), part[_layout.COMPUTED])
    for a, v in part.get("attrs", {}).items():
        fl.add(_layout.key(_layout.METRIC_ATTR, a, base=path), v)


def add_snapshot(fl: _tree.Flattener, path: str, snap: Dict[str, Any]) -> Dict[str, Any]:
    """Adds a snapshot's entries under `path` (the layout of add_metric); returns its description."""
    _add_snapshot_states(fl, path, snap)
    for name, part in snap.get("inner", {}).items():
        ipath = _layout.key(_layout.METRIC_INNER, name, base=path)
        _add_snapshot_states(fl, ipath, part)
        fl.add(_layout.key(_layout.METRIC_UPDATE_COUNT, base=ipath), int(part["update_count"]))
    return dict(snap["describe"], path=path)


def add_metric(fl: _tree.Flattener, path: str, name: str, m: Any) -> Dict[str, Any]:
    """Adds every state of `m` and its ``_computed`` under `path`; a wrapper's inner metrics go
    in their folders (METRIC_INNER, by module name) the same way, with their update counts. Returns the
    metric's description (for keepsake.metrics)."""
    return add_snapshot(fl, path, snapshot(m, name, path, copy=False))


def snapshot_items(path: str, snap: Dict[str, Any]) -> Dict[str, Any]:
    """The flat entries a snapshot stands for (as a keepsake file holds them), for load_metric."""
    items: Dict[str, Any] = {}

    def part(p: str, d: Dict[str, Any]) -> None:
        for s, v in d.get("state_dict", {}).items():
            items[_layout.key(_layout.METRIC_STATE, s, base=p)] = v
        for a, v in d.get("attrs", {}).items():
            items[_layout.key(_layout.METRIC_ATTR, a, base=p)] = v
        if not isinstance(d.get(_layout.COMPUTED), (dict, list, tuple)):
            items[_layout.key(_layout.METRIC_COMPUTED, base=p)] = d.get(_layout.COMPUTED)

    part(path, snap)
    for n, d in snap.get("inner", {}).items():
        ipath = _layout.key(_layout.METRIC_INNER, n, base=path)
        part(ipath, d)
        items[_layout.key(_layout.METRIC_UPDATE_COUNT, base=ipath)] = d.get("update_count")
    return items


def metrics_meta(descs: List[Dict[str, Any]]) -> Optional[str]:
    return json.dumps({"layout": "state-dict", "metrics": descs}) if descs else None


# ---- loading (the rules are the C engine's: see keepsake._state.load, which builds on this module) ----

def arg_attrs(m: Any) -> Dict[str, Any]:
    """The catalogue's constructor arguments that the metric keeps as attributes, as JSON values."""
    attrs = {}
    for a in ARG_ATTRS:
        if hasattr(m, a):
            try:
                attrs[a] = _json_attr(getattr(m, a))
            except (ValueError, TypeError):
                pass
    return attrs


def computed(items: Dict[str, Any], kinds: _tree.Records, path: str) -> Any:
    """The saved ``_computed`` of the metric at `path` (a tensor, a rebuilt tuple/dict, or None)."""
    key = _layout.key(_layout.METRIC_COMPUTED, base=path)
    if key in items:
        v = items[key]
        return v.clone() if hasattr(v, "clone") else v
    if _tree.entries_under(items, key + "/"):
        return _tree.unflatten(items, kinds, key + "/", leaf=lambda p, v, k: v.clone() if hasattr(v, "clone") else v)
    return None


def attr_decls(m: Any) -> List[tuple]:
    """The attributes a wrapper keeps besides its states, as the engine checks them: (name, dtype
    code or -1 for an int, shape, min, max), what snapshot() saves under ``attrs/``."""
    codes = _tensors.torch_maps()[0]
    out = [(a, -1, (), lo, hi) for a, (lo, hi) in WRAPPER_ATTRS.items() if _int_attr(m, a)]
    for a in _tensor_attrs(m):
        t = getattr(m, a)
        if codes.get(t.dtype) is None:
            raise TypeError(f"metric attribute '{a}' has dtype {t.dtype}, which keepsake does not store")
        out.append((a, codes[t.dtype], tuple(t.shape), 0, 0))
    return out


def _int_attr(m: Any, a: str) -> bool:
    v = getattr(m, a, None)
    return isinstance(v, int) and not isinstance(v, bool)


def install_attrs(metric: Any, values: Dict[str, Any]) -> None:
    """Sets the attributes the engine checked and staged (ks_metric_load_attrs): every declared one."""
    for a, v in values.items():
        if isinstance(v, int):
            setattr(metric, a, v)
        else:
            setattr(metric, a, _tensors.torch_from_copy(v).to(getattr(metric, a).device))


def file_metric_paths(items: Dict[str, Any], meta: Dict[str, Any]) -> List[str]:
    """Every metric path the file holds (from its entries and from keepsake.metrics)."""
    paths = set(p for p in meta if isinstance(p, str))
    train = _layout.folder(_layout.TRAIN_METRIC)
    for k in items:
        for root in (train, _layout.folder(_layout.EVAL_METRIC)):
            if k.startswith(root):
                parts = k[len(root):].split("/")
                n = 1 if root == train else 2
                if len(parts) > n:
                    paths.add(root + "/".join(parts[:n]))
    return sorted(paths)

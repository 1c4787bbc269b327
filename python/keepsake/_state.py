"""save_checkpoint / load_checkpoint: a whole training run in one keepsake file.

The key layout and the load semantics are the C library's (docs/DESIGN.md, "Key layout" and
"Load semantics"), so files move freely between Python and C programs and the CLI.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import _errors, _metrics, _rng, _tensors, _tree
from . import _native_api as _n
from ._paths import PathLike, fspath
from ._report import LoadReport, Timestamp

TIMESTAMP = "state/timestamp/Timestamp/"


def _named(objs: Any, what: str) -> List[Tuple[str, Any]]:
    """(name, object) pairs: a mapping keeps its names, anything else is named by its class."""
    if objs is None:
        return []
    if isinstance(objs, Mapping):
        return [(str(k), v) for k, v in objs.items()]
    seq = list(objs) if isinstance(objs, (list, tuple)) else [objs]
    names = [type(o).__name__ for o in seq]
    if len(set(names)) != len(names):
        raise _errors.error(_errors.ExistsError, f"two {what} of the same class: pass a dict of name -> {what[:-1]}")
    return list(zip(names, seq))


def _eval_groups(eval_metrics: Any) -> List[Tuple[str, Any]]:
    """(label, metrics) pairs: a dict of label -> metrics, or metrics saved under the label "eval"."""
    if eval_metrics is None:
        return []
    if isinstance(eval_metrics, Mapping) and not any(_metrics.is_metric(v) for v in eval_metrics.values()):
        return [(str(k), v) for k, v in eval_metrics.items()]
    return [("eval", eval_metrics)]


def _timestamp_dict(ts: Any) -> Dict[str, Any]:
    if isinstance(ts, Timestamp):
        return ts.state_dict()
    if isinstance(ts, Mapping):
        return dict(ts)
    if hasattr(ts, "state_dict"):
        return ts.state_dict()
    raise TypeError("timestamp must be a keepsake.Timestamp, a dict or have state_dict()")


def _state_of(obj: Any) -> Any:
    return obj.state_dict() if hasattr(obj, "state_dict") else obj


def checkpoint_entries(model: Any = None, optimizers: Any = None, schedulers: Any = None, train_metrics: Any = None,
                       eval_metrics: Any = None, timestamp: Any = None, rng: bool = True, extra: Any = None,
                       dataset_state: Any = None, callbacks: Any = None, run_name: str = "",
                       rank_zero_seed: int = 0) -> Tuple[_tree.Flattener, List[Dict[str, Any]]]:
    """Flattens the components into entries, in the C library's order."""
    fl = _tree.Flattener(_tensors.torch_entry)
    if model is not None:
        sd = model.state_dict() if hasattr(model, "state_dict") else model
        for k, v in sd.items():
            fl.add(f"state/model/{k}", v)
    for name, opt in _named(optimizers, "optimizers"):
        fl.add(f"state/optimizers/{name}", _state_of(opt))
    for name, s in _named(schedulers, "schedulers"):
        fl.add(f"state/schedulers/{name}", _state_of(s))
    if timestamp is not None:
        for k, v in _timestamp_dict(timestamp).items():
            fl.add(TIMESTAMP + k, v)
    for name, d in _named(dataset_state, "dataset states"):
        fl.add(f"state/dataset_state/{name}", _state_of(d))
    for name, cb in _named(callbacks, "callbacks"):
        fl.add(f"state/callbacks/{name}", _state_of(cb))
    descs = []
    groups = [("state/train_metrics/", train_metrics)] + [(f"state/eval_metrics/{lab}/", ms)
                                                          for lab, ms in _eval_groups(eval_metrics)]
    for root, ms in groups:
        for name, m in _metrics.named_metrics(ms):
            descs.append(_metrics.add_metric(fl, root + name, name, m))
    if extra:
        for k, v in extra.items():
            fl.add(f"state/extra/{k}", v)
    fl.add("state/rank_zero_seed", int(rank_zero_seed))
    fl.add("state/run_name", str(run_name))
    if rng:
        for k, v in _rng.state_entries().items():
            fl.add(k, v)
    return fl, descs


def save_checkpoint(path: PathLike, model: Any = None, optimizers: Any = None, schedulers: Any = None,
                    train_metrics: Any = None, eval_metrics: Any = None, timestamp: Any = None, rng: bool = True,
                    extra: Optional[Mapping[str, Any]] = None, *, dataset_state: Any = None, callbacks: Any = None,
                    run_name: str = "", rank_zero_seed: int = 0, metadata: Optional[Mapping[str, str]] = None,
                    fsync: bool = True) -> None:
    """Saves a whole training state to one keepsake file, atomically and durably.

    Args:
        path: destination; replaced only once the new file is complete and synced.
        model: an ``nn.Module`` (or a state dict): ``state/model/<name>``.
        optimizers: an optimizer, a list, or a dict name -> optimizer (default names: the class,
            e.g. ``AdamW``): ``state/optimizers/<name>/...`` as ``optimizer.state_dict()``.
        schedulers: likewise, ``state/schedulers/<name>/...``.
        train_metrics: a torchmetrics ``Metric``, ``MetricCollection`` or dict of metrics:
            ``state/train_metrics/<name>/state_dict/<state>`` and ``.../_computed``.
        eval_metrics: a dict evaluator label -> metrics, or metrics (label ``"eval"``):
            ``state/eval_metrics/<label>/<name>/...``.
        timestamp: a :class:`keepsake.Timestamp` or dict: ``state/timestamp/Timestamp/<field>``.
        rng: save the torch (CPU and CUDA), numpy and Python ``random`` generators: ``rng/0/...``.
        extra: any nested dicts/lists of tensors and scalars: ``state/extra/<key>/...``.
        dataset_state: dict name -> object with state_dict() (or a dict): ``state/dataset_state/<name>``.
        callbacks: dict name -> object with state_dict(): ``state/callbacks/<name>``.
        run_name, rank_zero_seed: the run's identity (``state/run_name``, ``state/rank_zero_seed``).
        metadata: extra ``__metadata__`` pairs.
        fsync: False skips the fsyncs (not durable).

    Every metric's class and update count go into ``keepsake.metrics``; metrics the C catalogue
    implements also get their arguments and schema version, so the C library can rebuild them.
    """
    fl, descs = checkpoint_entries(model, optimizers, schedulers, train_metrics, eval_metrics, timestamp, rng, extra,
                                   dataset_state, callbacks, run_name, rank_zero_seed)
    meta = dict(metadata or {})
    if fl.kinds:
        meta[_tree.PYTREE_KEY] = fl.kinds_json()
    meta.setdefault("keepsake.state", '{"layout_version":1}')
    _n.save_file(fspath(path), fl.entries, meta, _metrics.metrics_meta(descs), fsync)
    del fl


# ---- loading ----

def _read(path: str, verify: bool, ignore: Sequence[str]) -> Tuple[Dict[str, Any], Dict[str, str], List[str]]:
    # Copied into memory, never mapped: every value is copied into the program's objects anyway,
    # and a file that another program truncates meanwhile must give an error, not SIGBUS.
    reader = _n.Reader(path, verify=verify, backend="read")
    items: Dict[str, Any] = {e[0]: _tensors.torch_from(reader, *e[1:]) for e in reader.entries()}
    items.update(reader.scalars())
    meta = reader.metadata(True)
    ignored: List[str] = []
    if ignore:
        for k in list(items):  # the C library's glob (ks_path_match), as ks_convert's --ignore
            if any(_n.path_match(g, k) for g in ignore):
                del items[k]
                ignored.append(k)
    return items, meta, ignored


def _clone_leaf(path: str, v: Any, kind: Optional[str]) -> Any:
    if kind == "ndarray" and hasattr(v, "numpy"):
        return v.numpy().copy()
    if kind == "bytes" and hasattr(v, "numpy"):
        return bytes(v.numpy().tobytes())
    if kind == "bigint" and isinstance(v, str):
        return int(v)
    return v.clone() if hasattr(v, "clone") else v


def _load_model(model: Any, items: Dict[str, Any], strict: bool, report: LoadReport, path: str) -> None:
    import torch
    sd = model.state_dict()
    file_keys = {k[len("state/model/"):] for k in items if k.startswith("state/model/")}
    ok, problems = [], []
    for name, t in sd.items():
        key = f"state/model/{name}"
        v = items.get(key)
        if v is None or not isinstance(v, torch.Tensor):
            problems.append((_errors.NotFoundError, "missing", key, "not in the checkpoint"))
        elif v.dtype != t.dtype:
            problems.append((_errors.DTypeError, "mismatched", key, f"checkpoint {v.dtype}, program {t.dtype}"))
        elif tuple(v.shape) != tuple(t.shape):
            problems.append((_errors.ShapeError, "mismatched", key,
                             f"checkpoint shape {list(v.shape)}, program {list(t.shape)}"))
        else:
            ok.append((t, v, key))
    for name in sorted(file_keys - set(sd)):
        problems.append((_errors.MismatchError, "skipped", f"state/model/{name}", "the program has no such tensor"))
    if strict and problems:
        cls, _kind, key, why = problems[0]
        raise _errors.error(cls, f"model does not match the checkpoint ({len(problems)} problem(s); first: {why}); "
                            "nothing was loaded (pass strict=False to load the rest)", file=path, key=key)
    with torch.no_grad():
        for t, v, key in ok:
            t.copy_(v)
    for _cls, kind, key, why in problems:
        report.add(kind, key, why)
    if ok:
        report.add("loaded", "state/model", f"{len(ok)} tensors")


def _load_component(obj: Any, prefix: str, items: Dict[str, Any], kinds: Dict[str, Any], strict: bool,
                    report: LoadReport, path: str) -> None:
    """Fills an object with load_state_dict() from the entries under `prefix`."""
    root = prefix.rstrip("/")
    if not _tree.entries_under(items, prefix):
        report.add("missing", root, "not in the checkpoint: kept as is")
        return
    template = obj.state_dict() if hasattr(obj, "state_dict") else None
    try:
        value = _tree.unflatten(items, kinds, prefix, template, _clone_leaf)
        if hasattr(obj, "load_state_dict"):
            obj.load_state_dict(value)
        elif isinstance(obj, dict):
            obj.clear()
            obj.update(value)
        else:
            raise TypeError(f"a {type(obj).__name__} has no load_state_dict()")
    except Exception as e:  # noqa: BLE001 - any refusal of the component is reported the same way
        if strict:
            raise _errors.error(_errors.MismatchError, f"{root}: {type(e).__name__}: {e}", file=path, key=root) from e
        report.add("mismatched", root, f"{type(e).__name__}: {e}")
        return
    report.add("loaded", root)


def _skip_unclaimed(items: Dict[str, Any], root: str, depth: int, claimed: Iterable[str], report: LoadReport) -> None:
    seen = set()
    claimed = set(claimed)
    for k in items:
        if k.startswith(root):
            parts = k[len(root):].split("/")
            if len(parts) >= depth:
                p = root + "/".join(parts[:depth])
                if p not in claimed and p not in seen:
                    seen.add(p)
                    report.add("skipped", p, "the program has no such component")


def load_checkpoint(path: PathLike, model: Any = None, optimizers: Any = None, schedulers: Any = None,
                    train_metrics: Any = None, eval_metrics: Any = None, timestamp: Any = None, rng: bool = True,
                    *, dataset_state: Any = None, callbacks: Any = None, strict: bool = True,
                    weights_only: bool = False, ignore: Sequence[str] = (), allow_narrowing: bool = False,
                    verify: bool = True) -> LoadReport:
    """Fills the program's components from a checkpoint, by name, and reports what happened.

    The program's components are walked, never the file's (docs/DESIGN.md "Load semantics"):

    1. Model: strict (default) needs every program tensor with the same dtype and shape and no
       extra ``state/model/`` keys, else NotFoundError / DTypeError / ShapeError / MismatchError
       is raised before anything is written. ``strict=False`` reports them and loads the rest.
    2. ``weights_only=True`` stops there; everything else is reported skipped.
    3. Optimizers, schedulers, dataset states, callbacks, the timestamp and the RNGs are filled
       from the entries under their prefix; absent ones are reported missing and kept as they are.
    4. Metrics, each by name: absent -> missing and reset; another class or other arguments in
       ``keepsake.metrics`` -> mismatched and reset (never mixed); old state names migrated, dtypes
       widened (narrowing refused unless ``allow_narrowing``); then ``_computed`` and the update
       count are restored, so compute() gives the saved value without a warning and update()
       goes on accumulating. Metrics of the file the program lacks are skipped.

    Args:
        ignore: globs (``*``, ``?``) over '/' paths; a glob matching a '/'-prefix ignores the subtree.
        verify: check every checksum before any object is changed (default; a damaged file raises
            ChecksumError and changes nothing). ``verify=False`` skips the check: XXH3 hashes near
            memory speed, so it costs little (docs/BENCHMARKS.md), and a resume should not skip it.
        timestamp: a :class:`keepsake.Timestamp` to fill in place (the report has it too).
    Returns:
        a :class:`keepsake.LoadReport`.
    """
    spath = fspath(path)
    items, meta, ignored = _read(spath, verify, ignore)
    report = LoadReport(spath)
    report.metadata = {k: v for k, v in meta.items() if not k.startswith("keepsake.")}
    kinds = _tree.load_kinds(meta)
    for k in ignored:
        report.add("skipped", k, "ignored")
    if model is not None:
        _load_model(model, items, strict, report, spath)
    if weights_only:
        roots = sorted({"/".join(k.split("/")[:2]) for k in items if not k.startswith("state/model/")})
        for r in roots:
            report.add("skipped", r, "weights_only")
        return report
    for name, opt in _named(optimizers, "optimizers"):
        _load_component(opt, f"state/optimizers/{name}/", items, kinds, strict, report, spath)
    _skip_unclaimed(items, "state/optimizers/", 1, [f"state/optimizers/{n}" for n, _ in _named(optimizers, "o")],
                    report)
    for name, s in _named(schedulers, "schedulers"):
        _load_component(s, f"state/schedulers/{name}/", items, kinds, strict, report, spath)
    _skip_unclaimed(items, "state/schedulers/", 1, [f"state/schedulers/{n}" for n, _ in _named(schedulers, "s")],
                    report)
    for name, d in _named(dataset_state, "dataset states"):
        _load_component(d, f"state/dataset_state/{name}/", items, kinds, strict, report, spath)
    for name, cb in _named(callbacks, "callbacks"):
        _load_component(cb, f"state/callbacks/{name}/", items, kinds, strict, report, spath)
    _load_timestamp(items, timestamp, report)
    _load_metrics(items, meta, kinds, train_metrics, eval_metrics, report, allow_narrowing)
    if rng:
        try:
            _rng.load(items, report)
        except (TypeError, ValueError, RuntimeError, AttributeError, KeyError, OverflowError) as e:
            report.add("mismatched", _rng.PREFIX.rstrip("/"), f"the random states do not fit: {e}")
    if _tree.entries_under(items, "state/extra/"):
        report.extra = _tree.rebuild_or_raise(items, kinds, "state/extra/", _clone_leaf, spath)
    if isinstance(items.get("state/run_name"), str):
        report.run_name = items["state/run_name"]
    if isinstance(items.get("state/rank_zero_seed"), int):
        report.rank_zero_seed = items["state/rank_zero_seed"]
    return report


def _load_timestamp(items: Dict[str, Any], timestamp: Any, report: LoadReport) -> None:
    fields = {k[len(TIMESTAMP):]: v for k, v in items.items() if k.startswith(TIMESTAMP)}
    if not fields:
        if timestamp is not None:
            report.add("missing", TIMESTAMP.rstrip("/"), "not in the checkpoint: kept as is")
        return
    ts = Timestamp()
    try:
        ts.load_state_dict(fields)
    except (TypeError, ValueError, RuntimeError) as e:
        report.add("mismatched", TIMESTAMP.rstrip("/"), f"not a timestamp: {e}")
        return
    report.timestamp = ts
    if timestamp is None:
        return
    if isinstance(timestamp, dict):
        timestamp.update(ts.state_dict())
    else:
        timestamp.load_state_dict(fields)
    report.add("loaded", TIMESTAMP.rstrip("/"))


def _load_metrics(items: Dict[str, Any], meta: Dict[str, str], kinds: Dict[str, Any], train_metrics: Any,
                  eval_metrics: Any, report: LoadReport, allow_narrowing: bool) -> None:
    try:
        mj = json.loads(meta.get("keepsake.metrics", "{}"))
    except ValueError as e:
        raise _errors.error(_errors.FormatError, f"metadata 'keepsake.metrics' is not JSON: {e}",
                            key="keepsake.metrics") from e
    if not isinstance(mj, dict):
        raise _errors.error(_errors.FormatError, "metadata 'keepsake.metrics' is not a JSON object",
                            key="keepsake.metrics")
    claimed = []
    groups = [("state/train_metrics/", train_metrics)] + [(f"state/eval_metrics/{lab}/", ms)
                                                          for lab, ms in _eval_groups(eval_metrics)]
    for root, ms in groups:
        for name, m in _metrics.named_metrics(ms):
            p = root + name
            claimed.append(p)
            _metrics.load_metric(m, name, p, items, mj, kinds, report, allow_narrowing)
    for p in _metrics.file_metric_paths(items, mj):
        if p not in claimed and _tree.entries_under(items, p + "/"):
            report.add("skipped", p, "the program does not define this metric")

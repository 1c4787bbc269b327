"""save_checkpoint / load_checkpoint: a whole training run in one keepsake file.

The key layout and the load semantics are the C library's (docs/DESIGN.md, "Key layout" and
"Load semantics"): every key comes from ks_state_key (keepsake._core.layout), the name
ks_state_save gives the same part of a C program's state, so files move freely between Python
and C programs and the CLI.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .._core import errors as _errors, layout as _layout, native as _n, tensors as _tensors, tree as _tree
from .._core.paths import PathLike, fspath
from .._core.report import LoadReport, Timestamp
from . import inplace as _inplace, load as _load, metrics as _metrics, rng as _rng

TIMESTAMP = _layout.folder(_layout.TIMESTAMP)
MODEL = _layout.folder(_layout.MODEL)
EXTRA = _layout.folder(_layout.EXTRA)


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
                       rank_zero_seed: int = 0, staging: Any = None,
                       identity: bool = True) -> Tuple[_tree.Flattener, List[Dict[str, Any]]]:
    """Flattens the components into entries, in the C library's order. With `staging` (a
    :class:`keepsake._state.staging.HostStaging`, or any object with its ``entry``) device tensors'
    entries wait for its ``stage(entries)``, which copies them into its host buffer, before they go
    to the library. ``identity=False`` leaves out the run's name and seed (a rank's own items only)."""
    fl = _tree.Flattener(staging.entry if staging is not None else _tensors.torch_entry)
    if model is not None:
        sd = model.state_dict() if hasattr(model, "state_dict") else model
        for k, v in sd.items():
            fl.add(_layout.key(_layout.MODEL, k), v)
    for name, opt in _named(optimizers, "optimizers"):
        fl.add(_layout.key(_layout.OPTIMIZER, name), _state_of(opt))
    for name, s in _named(schedulers, "schedulers"):
        fl.add(_layout.key(_layout.SCHEDULER, name), _state_of(s))
    if timestamp is not None:
        for k, v in _timestamp_dict(timestamp).items():
            fl.add(_layout.key(_layout.TIMESTAMP, k), v)
    for name, d in _named(dataset_state, "dataset states"):
        fl.add(_layout.key(_layout.DATASET_STATE, name), _state_of(d))
    for name, cb in _named(callbacks, "callbacks"):
        fl.add(_layout.key(_layout.CALLBACK, name), _state_of(cb))
    descs = []
    groups = [(_layout.TRAIN_METRIC, None, train_metrics)] + [(_layout.EVAL_METRIC, lab, ms)
                                                             for lab, ms in _eval_groups(eval_metrics)]
    for part, label, ms in groups:
        for name, m in _metrics.named_metrics(ms):
            descs.append(_metrics.add_metric(fl, _layout.key(part, name, base=label), name, m))
    if extra:
        fl.add(_layout.key(_layout.EXTRA), dict(extra))  # its keys named by the library's rule, like every dict's
    if identity:
        fl.add(_layout.key(_layout.RANK_ZERO_SEED), int(rank_zero_seed))
        fl.add(_layout.key(_layout.RUN_NAME), str(run_name))
    if rng:
        for k, v in _rng.state_entries().items():
            fl.add(k, v)
        fl.sequence(_layout.key(_layout.RNG), "list", 1)  # one item per rank, as the C state layer records it
    return fl, descs


def save_checkpoint(path: PathLike, model: Any = None, optimizers: Any = None, schedulers: Any = None,
                    train_metrics: Any = None, eval_metrics: Any = None, timestamp: Any = None, rng: bool = True,
                    extra: Optional[Mapping[str, Any]] = None, *, dataset_state: Any = None, callbacks: Any = None,
                    run_name: str = "", rank_zero_seed: int = 0, metadata: Optional[Mapping[str, str]] = None,
                    fsync: bool = True, staging: Any = None) -> None:
    """Saves a whole training state to one keepsake file, atomically and durably.

    Args:
        path: destination; replaced only once the new file is complete and synced.
        model: an ``nn.Module`` (or a state dict): ``state/model/<name>``.
        optimizers: an optimizer, a list, or a dict name -> optimizer (default names: the class,
            e.g. ``AdamW``): ``state/optimizers/<name>/...`` as ``optimizer.state_dict()``.
        schedulers: likewise, ``state/schedulers/<name>/...``.
        train_metrics: a torchmetrics ``Metric``, ``MetricCollection`` or dict of metrics:
            ``state/train_metrics/<name>/...``, its states and its ``_computed`` (the library's
            metric layout: include/keepsake/layout.h).
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
        staging: a :class:`keepsake.torch.HostStaging` kept from one call to the next: CUDA tensors
            are copied into its page-locked buffer (non-blocking copies, one wait per device)
            and written from there. None: each is copied with ``.cpu()``.

    Every metric's class and update count go into ``keepsake.metrics``; metrics the C catalogue
    implements also get their arguments and schema version, so the C library can rebuild them.
    """
    try:
        fl, descs = checkpoint_entries(model, optimizers, schedulers, train_metrics, eval_metrics, timestamp, rng,
                                       extra, dataset_state, callbacks, run_name, rank_zero_seed, staging)
        if staging is not None:
            staging.stage(fl.entries)
        meta = fl.record(dict(metadata or {}))
        meta.setdefault(*_layout.STATE_RECORD)
        _n.save_file(fspath(path), fl.entries, meta, _metrics.metrics_meta(descs), fsync)
        del fl
    finally:
        if staging is not None:
            staging.done()


# ---- loading ----

def _read(path: str, verify: bool, ignore: Sequence[str], cache_dir: Optional[str] = None,
          offer: Optional[Callable[[Any], None]] = None) -> Tuple[Any, Dict[str, Any], Dict[str, str], Any]:
    """(what the engine reads, the file's values by name, its metadata, the in-place plan or None).
    Never mapped: every value goes into the program's objects anyway, and a file that another
    program truncates meanwhile must give an error, not SIGBUS. A remote object is read through
    the library's read cache in `cache_dir` when given. `offer(plan)` names the program's tensors
    that can take their entries' bytes in place (a verified local read)."""
    if verify and not _n.is_remote(path):  # a remote object is read whole: one request, not one per tensor
        reader = _n.Reader(path, lazy=True)
        if all(_tensors.torch_maps()[1][e[1]] is not None for e in reader.entries()):
            return _read_verified(reader, ignore, offer)
        # a dtype this torch lacks (torch 1.13: U16, U32, U64): the widening reader below
    reader = _n.Reader(path, verify=verify, backend="read", cache_dir=cache_dir)
    items: Dict[str, Any] = {e[0]: _tensors.torch_from(reader, *e[1:]) for e in reader.entries()}
    items.update(reader.scalars())
    items = _without_ignored(items, ignore)
    return reader, items, reader.metadata(True), None


def _without_ignored(items: Dict[str, Any], ignore: Sequence[str]) -> Dict[str, Any]:
    """What the engine ignores (ks_path_match), the installers must not see either."""
    if not ignore:
        return items
    return {k: v for k, v in items.items() if not any(_n.path_match(g, k) for g in ignore)}


def _read_verified(reader: Any, ignore: Sequence[str],
                   offer: Optional[Callable[[Any], None]]) -> Tuple[Any, Dict[str, Any], Dict[str, str], Any]:
    """Every tensor checked against its checksum before any object changes, in one parallel pass
    (_state/inplace.py): the program's own tensors that can take their bytes in place are only
    checked now (and read into later, by `Plan.fill`), the others read into one new block their
    tensors keep, verified as they land, so an optimizer takes them as they are. An ignored
    tensor is checked too: its checksum counts."""
    plan = _inplace.Plan(reader, reader.entries())
    if offer is not None:
        offer(plan)
    items = plan.read()
    items.update(reader.scalars())
    items = _without_ignored(items, ignore)
    entries, keep = plan.entries(items)
    meta = reader.metadata(True)
    return (entries, meta, keep), items, meta, plan


def _clone_leaf(path: str, v: Any, kind: Optional[str]) -> Any:
    if kind == "ndarray" and hasattr(v, "numpy"):
        return v.numpy().copy()
    if kind == "bytes" and hasattr(v, "numpy"):
        return bytes(v.numpy().tobytes())
    if kind == "bigint" and isinstance(v, str):
        return int(v)
    return v.clone() if hasattr(v, "clone") else v


def _own_leaf(path: str, v: Any, kind: Optional[str]) -> Any:
    """_clone_leaf for values read into tensors of their own (_read_verified): no copy."""
    return v if hasattr(v, "clone") and kind is None else _clone_leaf(path, v, kind)


def _components(optimizers: Any, schedulers: Any, dataset_state: Any, callbacks: Any, rng: bool,
                items: Dict[str, Any], kinds: _tree.Records, leaf: Any = None, plan: Any = None,
                templates: Optional[Dict[int, Any]] = None) -> List[tuple]:
    leaf = leaf or _clone_leaf
    out = []
    for kind, objs in (("optimizers", optimizers), ("schedulers", schedulers), ("dataset_state", dataset_state),
                       ("callbacks", callbacks)):
        for name, obj in _named(objs, kind.replace("_state", " states") if kind == "dataset_state" else kind):
            if templates is not None and id(obj) in templates:  # an optimizer resumed in place
                fn = _inplace.component_loader(obj, templates[id(obj)], plan, items, kinds, leaf)
            else:
                fn = _load.component_loader(obj, items, kinds, leaf)
            out.append((kind, name, fn))
    if rng:
        out.append(("rng", "0", lambda prefix: _rng.load(items)))
    return out


def _offer(model_targets: Dict[str, Any], optimizers: Any, templates: Dict[int, Any]) -> Callable[[Any], None]:
    """What can take its bytes in place: the model's tensors the engine writes (the parameters and
    buffers, or their staging tensors), and each optimizer's existing state tensors (whose
    state_dict() is kept in `templates` for its loader)."""
    def offer(plan: Any) -> None:
        plan.offer(model_targets)
        for name, opt in _named(optimizers, "optimizers"):
            if hasattr(opt, "state_dict") and hasattr(opt, "load_state_dict"):
                templates[id(opt)] = opt.state_dict()
                plan.offer(_inplace.template_tensors(_layout.key(_layout.OPTIMIZER, name), templates[id(opt)]))
    return offer


def load_checkpoint(path: PathLike, model: Any = None, optimizers: Any = None, schedulers: Any = None,
                    train_metrics: Any = None, eval_metrics: Any = None, timestamp: Any = None, rng: bool = True,
                    *, dataset_state: Any = None, callbacks: Any = None, strict: bool = True,
                    weights_only: bool = False, ignore: Sequence[str] = (), allow_narrowing: bool = False,
                    verify: bool = True, cache_dir: Optional[PathLike] = None) -> LoadReport:
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
        cache_dir: a local directory for the library's read cache: a remote checkpoint (``s3://``,
            ``http(s)://``) read through it once is not read from the server again (as
            ``load_file``'s; a local file is never cached).
    Returns:
        a :class:`keepsake.LoadReport`.
    """
    spath = fspath(path)
    targets: Dict[str, Any] = {}
    prepared = _load.model_entries(model, targets) if model is not None else ([], [])
    templates: Dict[int, Any] = {}
    source, items, meta, plan = _read(spath, verify, ignore, fspath(cache_dir) if cache_dir is not None else None,
                                      _offer(targets, optimizers, templates))
    return load_read(spath, source, items, meta, plan is not None, model=model, optimizers=optimizers,
                     schedulers=schedulers, train_metrics=train_metrics, eval_metrics=eval_metrics, timestamp=timestamp,
                     rng=rng, dataset_state=dataset_state, callbacks=callbacks, strict=strict,
                     weights_only=weights_only, ignore=ignore, allow_narrowing=allow_narrowing, plan=plan,
                     templates=templates, prepared=prepared)


def load_entries(path: str, values: Any, meta: Dict[str, str], **components: Any) -> LoadReport:
    """:func:`load_checkpoint` over a checkpoint's entries already in memory: `values`, (name, value)
    pairs whose tensors are ``(dtype code, shape, bytearray)`` copies the extension made (what
    ``_keepsake.shard_load_local`` returns for one rank of a sharded directory), and the metadata.
    `path` names the checkpoint in the report and in errors; ``components`` are load_checkpoint's."""
    items: Dict[str, Any] = {}
    for k, v in values:
        items[k] = _tensors.torch_from_copy(v) if isinstance(v, tuple) else v
    items = _without_ignored(items, components.get("ignore", ()))
    keep: list = []
    entries = [_tensors.torch_entry(k, v, keep) if hasattr(v, "data_ptr") else (k, v) for k, v in items.items()]
    return load_read(path, (entries, meta), items, meta, True, **components)


def load_read(spath: str, source: Any, items: Dict[str, Any], meta: Dict[str, str], owned: bool, *, model: Any = None,
              optimizers: Any = None, schedulers: Any = None, train_metrics: Any = None, eval_metrics: Any = None,
              timestamp: Any = None, rng: bool = True, dataset_state: Any = None, callbacks: Any = None,
              strict: bool = True, weights_only: bool = False, ignore: Sequence[str] = (),
              allow_narrowing: bool = False, plan: Any = None, templates: Optional[Dict[int, Any]] = None,
              prepared: Optional[Tuple[List[tuple], List[Tuple[Any, Any, str]]]] = None) -> LoadReport:
    """The engine's load (ks_state_load_state_dict) of what :func:`_read` (or load_entries) read, and the
    installation of what it staged into the program's objects: load_checkpoint's rules, whatever the source.
    With an in-place `plan` (_state/inplace.py), `prepared` is the model's entries it was offered and
    `templates` the optimizers' state_dict()s whose tensors it reads into."""
    leaf = _own_leaf if owned else _clone_leaf
    if prepared is None:
        prepared = _load.model_entries(model) if model is not None else ([], [])
    model_desc, staged = prepared
    report = LoadReport(spath)
    report.metadata = {k: v for k, v in meta.items() if not k.startswith("keepsake.")}
    kinds = _tree.load_kinds(meta)
    train, evals, pairs = _load.metric_groups(train_metrics, _eval_groups(eval_metrics))
    spec = {"path": spath, "model": model_desc, "strict": strict, "weights_only": weights_only, "ignore": [str(g) for g in ignore], "model_absent": model is None,
            "allow_narrowing": allow_narrowing, "timestamp": timestamp is not None, "train": train, "evals": evals,
            "components": _components(optimizers, schedulers, dataset_state, callbacks, rng, items, kinds, leaf,
                                      plan, templates)}
    res = _load.run(source[:2] if isinstance(source, tuple) else source, spec)
    for kind, p, why in res["report"]:
        report.add(kind, p, why)
    problems = set(report.paths("missing") + report.paths("mismatched") + report.paths("skipped"))
    if plan is not None:  # the model's tensors the engine accepted, read into place (the engine copied none)
        plan.fill([k for k in plan.under(MODEL) if k not in problems])
    for t, staging, key in staged:  # tensors the engine could not write in place
        if key not in problems:
            t.copy_(staging)
    report.timestamp = _file_timestamp(items)
    if res["timestamp"] is not None and timestamp is not None:
        if isinstance(timestamp, dict):
            timestamp.update(res["timestamp"])
        else:
            timestamp.load_state_dict(res["timestamp"])
    if weights_only:
        return report
    _load.install_metrics(pairs, res, items, kinds)
    if _tree.entries_under(items, EXTRA):
        report.extra = _tree.rebuild_or_raise(items, kinds, EXTRA, leaf, spath)
    run_name, seed = items.get(_layout.key(_layout.RUN_NAME)), items.get(_layout.key(_layout.RANK_ZERO_SEED))
    if isinstance(run_name, str):
        report.run_name = run_name
    if isinstance(seed, int):
        report.rank_zero_seed = seed
    return report


def _file_timestamp(items: Dict[str, Any]) -> Optional[Timestamp]:
    """The timestamp the file records (report.timestamp), whatever the program passed."""
    fields = {k[len(TIMESTAMP):]: v for k, v in items.items() if k.startswith(TIMESTAMP)}
    if not fields:
        return None
    ts = Timestamp()
    try:
        ts.load_state_dict(fields)
    except (TypeError, ValueError, RuntimeError):
        return None
    return ts

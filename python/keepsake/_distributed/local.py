"""Each rank's own items in a torch.distributed checkpoint: its local metric states, data positions
and random generators, saved by a plain ``dcp.save`` and restored after a plain ``dcp.load`` at any
world size (re-exported by :mod:`keepsake.distributed`); and, when given, the replicated components
(a whole-tensor model, optimizers, schedulers, callbacks, timestamp, run name and seed) as keepsake
entries, which the C library keeps in rank 0's file as an MPI program's (docs/FORMAT.md 9.2).

Nothing here decides a layout or a load rule; it describes the program's objects and installs what
the C library staged. The items go into each rank's own file under the names every keepsake writer
gives them (the generators, data positions and train and eval metric states of a C program's
state: docs/FORMAT.md section 9.2), so an MPI program's loader reads them too. Which saved ranks a rank takes
at another world size, and the fold of their metrics, are the C library's (``ks_shard_load_local``:
``ks_shard_assigned``, ``ks_metric_fold``), as ``ks_dist_load`` applies them; it also reads the
layout keepsake 0.2 wrote.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

from .._core import errors as _errors, native as _n, tensors as _tensors
from .._core.paths import PathLike, fspath
from .._state import checkpoint as _state, load as _load, metrics as _metrics

__all__ = ["local_items", "restore_local"]


def _rank_world(group: Any) -> Tuple[int, int]:
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise _errors.error(_errors.StateError, "per-rank items need an initialised torch.distributed process "
                            "group (dist.init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


class LocalItems:
    """A rank's per-rank entries for the writer: the flattened entries (tensors copied, so the save
    holds this moment's values whatever the program does next), their metadata records and the
    metric description ``keepsake.metrics`` is made from. A plain object: DCP's planner carries it
    as one item, which :class:`keepsake.distributed.KeepsakeWriter` stores as these entries."""

    def __init__(self, entries: List[tuple], metadata: Dict[str, str], metrics: Optional[str], keep: Any) -> None:
        self.entries, self.metadata, self.metrics, self._keep = entries, metadata, metrics, keep

    def __deepcopy__(self, memo: Dict[int, Any]) -> "LocalItems":
        return self  # already a copy (DCP's async staging copies its state dict)


class _Snapshot:
    """Entries of tensor copies (the Flattener's `staging` protocol: ``entry``)."""

    @staticmethod
    def entry(name: str, t: Any, keep: list) -> tuple:
        return _tensors.torch_entry(name, t.detach().clone(), keep)


def state_items(*, copy: bool = True, metadata: Optional[Dict[str, str]] = None, **components: Any) -> LocalItems:
    """A rank's state as the writer takes it: the components flattened as a keepsake file names them
    (``checkpoint_entries``), tensors copied when `copy`."""
    fl, descs = _state.checkpoint_entries(staging=_Snapshot() if copy else None, **components)
    meta = fl.record(dict(metadata or {}))
    return LocalItems(fl.entries, meta, _metrics.metrics_meta(descs), fl)


def local_items(*, metrics: Any = None, eval_metrics: Any = None, dataset_state: Any = None, rng: bool = False,
                checkpoint: Optional[PathLike] = None, group: Any = None, model: Any = None, optimizers: Any = None,
                schedulers: Any = None, callbacks: Any = None, timestamp: Any = None, run_name: Optional[str] = None,
                rank_zero_seed: int = 0) -> Dict[str, Any]:
    """This rank's items, to merge into the state dict given to ``dcp.save`` or ``dcp.load``.

    Saving (``checkpoint=None``): one item that hands :class:`keepsake.distributed.KeepsakeWriter`
    this rank's keepsake entries, which the C library places (ks_shard_dcp_write_rank): its own items
    into this rank's file: each metric's local states, update count and ``_computed`` (``metrics``: a
    Metric, a MetricCollection or a dict name -> metric, as ``train_metrics``; ``eval_metrics``: a
    dict label -> metrics, or metrics for the label ``"eval"``), each ``dataset_state`` (dict name ->
    object with ``state_dict()``, or a dict) and, with ``rng=True``, the torch, Python and numpy
    generators (r: its rank in `group`, default the whole job); and the replicated components, when
    given, into rank 0's file only, as an MPI program's (``ks_dist_save``): a ``model`` whose tensors
    are whole on every rank (not FSDP2/DTensor shards: hand those to DCP as items), ``optimizers``,
    ``schedulers``, ``callbacks``, the ``timestamp``, and the run's name and seed (with ``run_name``).
    Every rank passes the same replicated components; rank 0's are stored. Their values are copied now.

    Loading (``checkpoint``: the directory about to be loaded): nothing (an empty dict): the items
    are read by :func:`restore_local`, not by ``dcp.load``; kept so that a program merging
    ``local_items(checkpoint=...)`` into its state dict works unchanged. Not collective."""
    rank, _world = _rank_world(group)
    if checkpoint is not None:
        return {}
    _refuse_sharded(model, optimizers)
    items = state_items(train_metrics=metrics, eval_metrics=eval_metrics, dataset_state=dataset_state, rng=rng,
                        model=model, optimizers=optimizers, schedulers=schedulers, callbacks=callbacks,
                        timestamp=timestamp, run_name=run_name or "", rank_zero_seed=rank_zero_seed,
                        identity=run_name is not None)
    return {_n.shard_names()["local"] + str(rank): items}


def _refuse_sharded(model: Any, optimizers: Any) -> None:
    """A keepsake entry is a whole tensor: a DTensor or ShardedTensor (FSDP2, tensor parallel) is a
    DCP item, which DCP's planner saves and reshards."""
    tensors: List[Tuple[str, Any]] = []
    if model is not None:
        sd = model.state_dict() if hasattr(model, "state_dict") else model
        tensors += list(sd.items())
    for name, opt in _state._named(optimizers, "optimizers"):
        st = opt.state_dict() if hasattr(opt, "state_dict") else opt
        tensors += [(f"{name}/{i}/{k}", v) for i, s in dict(st.get("state", {})).items() for k, v in s.items()]
    for key, t in tensors:
        if type(t).__name__ in ("DTensor", "ShardedTensor"):
            raise _errors.error(_errors.UnsupportedError, f"local_items: {key} is a {type(t).__name__}: hand a "
                                "sharded model and its optimizer to dcp.save as items (get_state_dict)", key=key)


def install_state(obj: Any, value: Any, what: str) -> None:
    """Puts a loaded state into an object with ``load_state_dict``, or a mutable mapping."""
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(value)
    elif isinstance(obj, MutableMapping):
        value = dict(value)  # it may be obj itself (filled in place by dcp.load)
        obj.clear()
        obj.update(value)
    else:
        raise TypeError(f"{what}: a {type(obj).__name__} has no load_state_dict() and is not a dict")


def descriptions(metrics: Any, eval_metrics: Any) -> Tuple[list, list]:
    """The metrics as the C library's loader takes them (``train``, ``evals``: their descriptions)."""
    train, evals, _pairs = _load.metric_groups(metrics, _state._eval_groups(eval_metrics))
    return train, evals


def staged(checkpoint: PathLike, rank: int, world: int, metrics: Any, eval_metrics: Any,
           verify: bool = False) -> Tuple[List[tuple], Dict[str, str]]:
    """Rank `rank` of `world`'s keepsake entries of a sharded directory, staged by the C library
    (ks_shard_load_local): replicated entries and this rank's per-rank entries, without DCP's items."""
    train, evals = descriptions(metrics, eval_metrics)
    return _n.shard_load_local(fspath(checkpoint), rank, world, train, evals, verify)


def restore_local(state_dict: Mapping[str, Any], *, metrics: Any = None, eval_metrics: Any = None,
                  dataset_state: Any = None, rng: bool = False, checkpoint: PathLike, group: Any = None,
                  model: Any = None, optimizers: Any = None, schedulers: Any = None, callbacks: Any = None,
                  timestamp: Any = None) -> None:
    """After ``dcp.load`` from `checkpoint`, installs this rank's own items, which the C library reads
    from the directory at any world size (ks_shard_load_local): each metric's local states become
    the fold of the saved ranks this rank takes, in saved-rank order (``ks_shard_assigned``,
    ``ks_metric_fold``; the metric's defaults when it takes none), so a sync still gives what one
    process computes over every rank's data; the data positions and generators are those of the
    first saved rank it takes (saved rank ``rank mod N`` when none). Takes the components of
    :func:`local_items`; `state_dict` is not read (the items are not DCP's). Each rank file it reads
    is verified against the index first (its tensors' checksums: ChecksumError for a damaged one). A
    directory keepsake 0.2 wrote (its items as DCP items of each rank's) is read too. The replicated
    components :func:`local_items` saves as keepsake entries (``model``, ``optimizers``,
    ``schedulers``, ``callbacks``, ``timestamp``: rank 0's file, as an MPI program saves them) are
    installed when given, as ``load_checkpoint`` installs them. Not collective."""
    del state_dict
    restore(checkpoint, metrics=metrics, eval_metrics=eval_metrics, dataset_state=dataset_state, rng=rng,
            group=group, verify=True, model=model, optimizers=optimizers, schedulers=schedulers,
            callbacks=callbacks, timestamp=timestamp)


def restore(checkpoint: PathLike, *, metrics: Any, eval_metrics: Any, dataset_state: Any, rng: bool, group: Any,
            verify: bool, **replicated: Any) -> None:
    """:func:`restore_local`; ``verify=False`` for a directory whose files were verified already (the
    distributed manager's autoresume takes one that ks_ckpt_manager_dir_latest verified). `replicated`:
    load_checkpoint's model, optimizers, schedulers, callbacks and timestamp, when given."""
    rank, world = _rank_world(group)
    path = fspath(checkpoint)
    values, meta = staged(path, rank, world, metrics, eval_metrics, verify)
    report = _state.load_entries(path, values, meta, train_metrics=metrics, eval_metrics=eval_metrics,
                                 dataset_state=dataset_state, rng=rng, **replicated)
    _raise_unloaded(report, _reset_unassigned(path, rank, world, metrics, eval_metrics, report))


def _reset_unassigned(checkpoint: str, rank: int, world: int, metrics: Any, eval_metrics: Any,
                      report: Any) -> set:
    """A rank that takes no saved rank (ks_shard_assigned: at a larger world size) gets none of the
    program's metrics from the C library: each starts from its defaults (``reset()``, which only the
    program's object knows). Returns the paths reset."""
    saved = int(_n.shard_index(checkpoint, check=False)["world_size"])
    lo, hi, _first = _n.shard_assigned(saved, world, rank)
    if lo != hi:
        return set()
    _train, _evals, pairs = _load.metric_groups(metrics, _state._eval_groups(eval_metrics))
    missing = {r.path for r in report.missing}
    done = set()
    for path, m in pairs:
        if path in missing:
            m.reset()
            done.add(path)
    return done


def _raise_unloaded(report: Any, reset: set) -> None:
    """Anything of the program the checkpoint lacks, or that does not fit it, is an error here, not a
    note of the report: a resumed rank must not go on with another run's generator or data position.
    The metrics in `reset` are not errors (they start from their defaults)."""
    bad = [r for r in report.missing if r.path not in reset] + report.mismatched
    if bad:
        raise _errors.error(_errors.NotFoundError if bad[0].kind == "missing" else _errors.MismatchError,
                            f"restore_local: {bad[0].path}: {bad[0].kind} ({bad[0].reason})", key=bad[0].path)

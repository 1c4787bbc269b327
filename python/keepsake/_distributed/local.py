"""Each rank's own items in a torch.distributed checkpoint: its local metric states, data positions
and random generators, saved under ``rank<r>/`` by plain ``dcp.save`` and restored after a plain
``dcp.load`` at any world size (re-exported by :mod:`keepsake.distributed`).

The layout is the distributed checkpoint manager's (keepsake._distributed.manager, which uses these
functions): ``rank<r>/metrics/<name>/<i>`` and ``rank<r>/eval_metrics/<label>/<name>/<i>`` (part i
of a metric: 0 is the metric, then a wrapper's inner metrics; each one rank's local states and
update count as keepsake bytes), ``rank<r>/dataset_state/<name>`` and ``rank<r>/rng/...``. Only
rank r saves its ``rank<r>/`` items, so they lie in its own rank file.

Which saved ranks a rank takes when it loads at another world size is the C library's rule
(``ks_shard_assigned``, asked through ``_keepsake.shard_assigned``): saved rank s goes to rank
floor(s*M/N). A rank's metric states become the fold of the saved ranks it takes
(``ks_metric_fold``, through :func:`keepsake._distributed.sync.restore_local`; the metric's defaults when it
takes none); its generators and data positions are those of the first of them (saved rank
``rank mod N`` when none).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Iterator, List, Mapping, MutableMapping, Optional, Tuple

from .._core import errors as _errors, native as _n
from .._core.paths import PathLike, fspath
from .._state import checkpoint as _state, metrics as _metrics, rng as _rng

__all__ = ["local_items", "restore_local"]


def _rank_world(group: Any) -> Tuple[int, int]:
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise _errors.error(_errors.StateError, "per-rank items need an initialised torch.distributed process "
                            "group (dist.init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


def _assignment(checkpoint: PathLike, rank: int, world: int) -> Tuple[int, int, int, int]:
    """(lo, hi, first, saved world size): this rank takes saved ranks [lo, hi); its generators and
    data positions come from saved rank `first` (the C library's ks_shard_assigned)."""
    saved = int(_n.shard_index(fspath(checkpoint), check=False)["world_size"])
    lo, hi, first = _n.shard_assigned(saved, world, rank)
    return int(lo), int(hi), int(first), saved


def _metric_parts(metrics: Any, eval_metrics: Any) -> Iterator[Tuple[str, Any]]:
    """(key below rank<r>/, metric part): every metric, and every inner metric of a wrapper."""
    groups = [("metrics/", metrics)]
    groups += [(f"eval_metrics/{label}/", ms) for label, ms in _state._eval_groups(eval_metrics)]
    for root, ms in groups:
        for name, m in _metrics.named_metrics(ms):
            parts = [m] + [sub for _sub_name, sub in _metrics.inner_metrics(m)]
            for i, part in enumerate(parts):
                yield f"{root}{name}/{i}", part


def _own_values(dataset_state: Any, rng: bool) -> Dict[str, Any]:
    """This rank's generators and data positions, by key below rank<r>/ (current values)."""
    import torch
    out: Dict[str, Any] = {}
    if rng:
        for k, v in _rng.state_entries().items():
            if type(v).__module__ == "numpy":
                v = torch.from_numpy(v.copy())
            out["rng/" + k[len(_rng.PREFIX):]] = v
    for name, d in _state._named(dataset_state, "dataset states"):
        # a copy: dcp.load fills the value it is given in place, and restore_local installs it into d
        out[f"dataset_state/{name}"] = copy.deepcopy(_state._state_of(d))
    return out


def local_items(*, metrics: Any = None, eval_metrics: Any = None, dataset_state: Any = None, rng: bool = False,
                checkpoint: Optional[PathLike] = None, group: Any = None) -> Dict[str, Any]:
    """This rank's own items, to merge into the state dict given to ``dcp.save`` or ``dcp.load``.

    Saving (``checkpoint=None``): this rank's items under ``rank<r>/`` (r: its rank in `group`,
    default the whole job): each metric's local states and update count (``metrics``: a Metric, a
    MetricCollection or a dict name -> metric, as ``train_metrics``; ``eval_metrics``: a dict
    label -> metrics, or metrics for the label ``"eval"``), each ``dataset_state`` (dict name ->
    object with ``state_dict()``, or a dict) and, with ``rng=True``, the torch, Python and numpy
    generators.

    Loading (``checkpoint``: the directory about to be loaded, at any world size): placeholders
    for the items of the saved ranks this rank takes (``ks_shard_assigned``). Give the same
    components as the save did; after ``dcp.load``, :func:`restore_local` installs them.
    Not collective (every rank reads the checkpoint's index on its own)."""
    rank, world = _rank_world(group)
    from . import sync as _sync
    if checkpoint is None:
        mine = f"rank{rank}/"
        sd = {mine + k: _sync._encode(part) for k, part in _metric_parts(metrics, eval_metrics)}
        sd.update({mine + k: v for k, v in _own_values(dataset_state, rng).items()})
        return sd
    lo, hi, first, _saved = _assignment(checkpoint, rank, world)
    sd = {}
    for k, _part in _metric_parts(metrics, eval_metrics):
        for s in range(lo, hi):
            sd[f"rank{s}/{k}"] = b""  # a bytes item: dcp.load replaces it with the saved bytes
    sd.update({f"rank{first}/{k}": v for k, v in _own_values(dataset_state, rng).items()})
    return sd


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


def restore_local(state_dict: Mapping[str, Any], *, metrics: Any = None, eval_metrics: Any = None,
                  dataset_state: Any = None, rng: bool = False, checkpoint: PathLike, group: Any = None) -> None:
    """After ``dcp.load`` of a state dict holding :func:`local_items` (``checkpoint=...``), installs
    this rank's share: each metric's local states become the fold of the saved ranks this rank
    takes, in saved-rank order (``ks_metric_fold``; the metric's defaults when it takes none), so
    a sync still gives what one process computes over every rank's data; the data positions and
    generators are those of the first saved rank it takes (saved rank ``rank mod N`` when none).
    Takes the same components and `checkpoint` as :func:`local_items`. Not collective."""
    rank, world = _rank_world(group)
    lo, hi, first, _saved = _assignment(checkpoint, rank, world)
    from . import sync as _sync
    parts: List[Tuple[str, Any]] = list(_metric_parts(metrics, eval_metrics))
    src = f"rank{first}/"
    need = [f"rank{s}/{k}" for k, _p in parts for s in range(lo, hi)]
    need += [src + f"dataset_state/{name}" for name, _d in _state._named(dataset_state, "dataset states")]
    missing = [k for k in need if k not in state_dict]
    if missing:
        raise _errors.error(_errors.NotFoundError, f"restore_local: the state dict lacks {missing[0]!r} (merge "
                            "local_items(..., checkpoint=...) with the same components into it before dcp.load)")
    if rng:
        _rng.load({_rng.PREFIX + k[len(src + "rng/"):]: v for k, v in state_dict.items() if k.startswith(src + "rng/")})
    for name, d in _state._named(dataset_state, "dataset states"):
        install_state(d, state_dict[src + f"dataset_state/{name}"], f"dataset state {name!r}")
    for k, part in parts:
        _sync.restore_local(part, [state_dict[f"rank{s}/{k}"] for s in range(lo, hi)])

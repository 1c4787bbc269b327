"""Metrics across ranks: every rank's states travel as keepsake bytes over torch.distributed, and
every rank folds them with the library's rule (``ks_metric_fold``: the MPI sync's), so every rank
gets the same bits, for any torchmetrics metric, catalogue or not, by its states' declared
reductions. No pickle: the states go as a keepsake file's bytes in a uint8 tensor.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional

from .._core import errors as _errors, native as _n, tensors as _tensors, tree as _tree
from .._state import load as _load, metrics as _metrics


def _encode(m: Any) -> bytes:
    """One rank's states of `m` (list states concatenated) and its update count, named as the
    library's decoder (fold_metric) reads them: the extension's SYNC_STATES and SYNC_UPDATE_COUNT,
    a metric folder's names (include/keepsake/layout.h)."""
    fl = _tree.Flattener(_tensors.torch_entry)
    for s in m._defaults:
        v = getattr(m, s)
        fl.add(_n.SYNC_STATES + s, _metrics._cat(v) if isinstance(v, list) else v)
    fl.add(_n.SYNC_UPDATE_COUNT, int(m._update_count))
    return bytes(_n.save_bytes(fl.entries))


def _all_gather_bytes(data: bytes, group: Any) -> List[bytes]:
    """Every rank's bytes, in rank order (lengths may differ)."""
    import torch
    import torch.distributed as dist
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    world = dist.get_world_size(group)
    mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64, device=device), group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:mine.numel()] = mine
    outs = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(outs, padded, group=group)
    return [bytes(o[:int(s.item())].cpu().numpy()) for o, s in zip(outs, sizes)]


def _parts(m: Any) -> List[Any]:
    return [m] + [sub for _n_, sub in _metrics.inner_metrics(m)]


def sync(metric: Any, group: Optional[Any] = None) -> None:
    """Replaces the states of `metric` (a torchmetrics Metric or MetricCollection; a wrapper's inner
    metrics too) by the fold of every rank's, in rank order, and its update count by the sum of
    every rank's (as the C MPI sync does). Collective: every rank of `group` calls it.
    ``metric.unsync()`` (torchmetrics' own) puts the local states and update count back."""
    if _metrics.is_metric(metric):
        todo = _parts(metric)
    else:
        todo = [p for _name, m in _metrics.named_metrics(metric) for p in _parts(m)]
    for m in todo:
        if getattr(m, "_is_synced", False):
            raise _errors.error(_errors.StateError, f"{type(m).__name__} is already synced: unsync() it first")
    for m in todo:  # the same order on every rank: the collectives pair up
        desc = _load.describe_metric(type(m).__name__, m, top=False)
        values = _n.fold_metric(desc, _all_gather_bytes(_encode(m), group))
        # What torchmetrics' unsync() restores (by setattr): the states, and the local update count.
        m._cache = {s: getattr(m, s) for s in m._defaults}
        m._cache["_update_count"] = m._update_count
        _load._install_states(m, values)
        m._update_count = int(values["update_count"])  # the fold's: every rank's added up, as ks_dist_sync
        m._computed = None
        m._is_synced = True


def restore_local(m: Any, blobs: List[bytes]) -> None:
    """Installs into one metric (not its inner ones) the local states of a rank that takes the saved
    ranks whose :func:`_encode` bytes are `blobs` (in saved-rank order; ``ks_shard_assigned`` says
    which): their fold by the library's rule, or the metric's defaults when there are none."""
    if not blobs:
        m.reset()
        return
    values = _n.fold_metric(_load.describe_metric(type(m).__name__, m, top=False), [bytes(b) for b in blobs])
    _load._install_states(m, values)
    m._update_count = int(values["update_count"])
    m._computed = None


def unsync(metric: Any) -> None:
    """Puts back the local states :func:`sync` replaced."""
    todo = _parts(metric) if _metrics.is_metric(metric) else [
        p for _name, m in _metrics.named_metrics(metric) for p in _parts(m)]
    for m in todo:
        if getattr(m, "_is_synced", False):
            m.unsync()
            m._computed = None


@contextlib.contextmanager
def synced(metric: Any, group: Optional[Any] = None) -> Iterator[Any]:
    """``with synced(m): m.compute()`` computes over every rank's data (torchmetrics' own sync on
    compute is turned off meanwhile), then the local states come back."""
    sync(metric, group)
    todo = _parts(metric) if _metrics.is_metric(metric) else [
        p for _name, m in _metrics.named_metrics(metric) for p in _parts(m)]
    saved = [(m, getattr(m, "_to_sync", None)) for m in todo]
    for m, _ in saved:
        m._to_sync = False
    try:
        yield metric
    finally:
        for m, flag in saved:
            m._to_sync = flag
        unsync(metric)

"""The implementation of :mod:`keepsake.lightning` (its docstring says what each class does).

Lightning's ``CheckpointIO`` over the C library's save (the model and the rest of Lightning's dict
in the folders ks_state_key names, keepsake._core.layout),
``load_from_checkpoint`` for keepsake files (``pl_load``, patched at import), the torchmetrics
states and the train dataloaders' positions as callbacks, and ``ModelParallelStrategy`` over
keepsake's DCP storage (keepsake._distributed.storage). Every rule is the C library's or
keepsake._state's: this module maps Lightning's checkpoint dict onto them.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from typing import Any, Dict, Optional

from .. import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from .._core import errors as _errors, layout as _layout, native as _n, tensors as _tensors, tree as _tree
from .._core.paths import fspath
from .._core.report import LoadReport
from .._state import load as _load, metrics as _metrics

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - pytorch_lightning only
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO  # type: ignore
    from pytorch_lightning.callbacks import Callback  # type: ignore

METRICS_KEY = "keepsake_metrics"
MODEL = _layout.folder(_layout.MODEL)
REST = _layout.folder(_layout.LIGHTNING)
METRICS = _layout.folder(_layout.TRAIN_METRIC)
DATA_KEY = "keepsake_data_position"

__all__ = ["KeepsakeCheckpointIO", "KeepsakeMetrics", "KeepsakeDataPosition", "METRICS_KEY", "DATA_KEY"]

# Plugins with a background writer: at interpreter exit, each save in flight is finished (its
# error printed), so a program that never reached teardown() loses no committed work.
_open_ios: "weakref.WeakSet[KeepsakeCheckpointIO]" = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    for io in list(_open_ios):
        try:
            io.wait()
        except Exception as e:  # noqa: BLE001 - at exit, reported rather than raised
            print(f"keepsake: warning: background checkpoint save failed: {e}", file=sys.stderr)


class _MetricStates:
    """The metric entries of a loaded checkpoint, handed to KeepsakeMetrics.on_load_checkpoint."""

    def __init__(self, items: Dict[str, Any], meta: Dict[str, Any], kinds: _tree.Records) -> None:
        self.items, self.meta, self.kinds = items, meta, kinds

    def load_into(self, metrics: Dict[str, Any], allow_narrowing: bool = False) -> LoadReport:
        report = LoadReport()
        _load.load_metrics_from(self.items, self.meta, self.kinds, dict(metrics), METRICS, report, allow_narrowing)
        return report


class KeepsakeCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` plugin that saves and loads keepsake files.

    Args:
        fsync: False skips the fsyncs of each save (faster, not durable).
        verify: check every tensor's checksum before anything is returned (default: a resume
            from a damaged file raises ChecksumError); False skips it.
        async_save: save in the background, through the library's background writer (the
            checkpoint manager's): :meth:`save_checkpoint` returns once every tensor of the dict
            (and the metric snapshots) has been copied, so training may change them at once; the
            file is written on the library's thread, atomically and durably, without the GIL. At
            most one save is in flight. A save's error is raised by the next
            :meth:`save_checkpoint`, :meth:`load_checkpoint`, :meth:`remove_checkpoint` or
            :meth:`teardown` (Lightning calls it when fit ends), never swallowed; each of them
            first waits for the save in flight.
        when_busy: with ``async_save``, a save asked for while one is in flight: ``"wait"`` for
            it (default) or ``"fail"`` (StateError, nothing saved).
    """

    def __init__(self, fsync: bool = True, verify: bool = True, async_save: bool = False,
                 when_busy: str = "wait") -> None:
        super().__init__()
        self.fsync, self.verify = fsync, verify
        self._saver = _n.AsyncSaver(when_busy=when_busy) if async_save else None
        if self._saver is not None:
            _open_ios.add(self)

    @property
    def async_save(self) -> bool:
        """True when saves go through the library's background writer."""
        return self._saver is not None

    def wait(self) -> None:
        """Waits for a background save; raises its error."""
        if self._saver is not None:
            self._saver.wait()

    def teardown(self) -> None:
        """Finishes a background save (raising its error). The plugin stays usable."""
        self.wait()

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        """Writes Lightning's checkpoint dict to `path`, atomically and durably."""
        if storage_options is not None:
            raise TypeError("KeepsakeCheckpointIO takes no storage_options")
        path = fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fl = _tree.Flattener(_tensors.torch_entry)
        descs = []
        for k, v in (checkpoint.get("state_dict") or {}).items():
            fl.add(_layout.key(_layout.MODEL, k), v)
        for name, m in (checkpoint.get(METRICS_KEY) or {}).items():
            # KeepsakeMetrics hands snapshots (plain tensors, taken when the dict was built);
            # a live Metric put there by other code is snapshotted here.
            mpath = _layout.key(_layout.TRAIN_METRIC, name)
            snap = m if isinstance(m, dict) else _metrics.snapshot(m, name, mpath, copy=False)
            descs.append(_metrics.add_snapshot(fl, mpath, snap))
        rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", METRICS_KEY)}
        fl.add(_layout.key(_layout.LIGHTNING), rest)
        meta = fl.record(dict([_layout.LIGHTNING_RECORD]))
        if self._saver is not None:  # the bytes are copied before start() returns
            self._saver.start(path, fl.entries, meta, _metrics.metrics_meta(descs), self.fsync)
        else:
            _n.save_file(path, fl.entries, meta, _metrics.metrics_meta(descs), self.fsync)

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """Reads a checkpoint written by :meth:`save_checkpoint` (nothing is unpickled, whatever
        `weights_only` says). `map_location` may be a device or a device string."""
        self.wait()  # a background save of this path must be whole first
        # Read into memory, not mapped: every leaf is cloned anyway, and a file truncated by
        # another program must raise, not kill the process with SIGBUS.
        reader = _n.Reader(fspath(path), verify=self.verify, backend="read")
        items: Dict[str, Any] = {e[0]: _tensors.torch_from(reader, *e[1:]) for e in reader.entries()}
        items.update(reader.scalars())
        meta = reader.metadata(True)
        kinds = _tree.load_kinds(meta)
        move = map_location if isinstance(map_location, str) or type(map_location).__name__ == "device" else None

        def leaf(p: str, v: Any, kind: Optional[str]) -> Any:
            from .._state.checkpoint import _clone_leaf
            v = _clone_leaf(p, v, kind)
            return v.to(move) if move is not None and hasattr(v, "to") else v

        out: Dict[str, Any] = (_tree.rebuild_or_raise(items, kinds, REST, leaf, fspath(path))
                               if _tree.entries_under(items, REST) else {})
        if not isinstance(out, dict):
            raise _errors.error(_errors.FormatError, "not a Lightning checkpoint", file=fspath(path))
        out["state_dict"] = {k[len(MODEL):]: leaf(k, v, None) for k, v in items.items() if k.startswith(MODEL)}
        metric_items = {k: v for k, v in items.items() if k.startswith(METRICS)}
        if metric_items:
            try:
                mj = json.loads(meta.get("keepsake.metrics", "{}"))
            except ValueError as e:
                raise _errors.error(_errors.FormatError, f"metadata 'keepsake.metrics' is not JSON: {e}",
                                    file=fspath(path), key="keepsake.metrics") from e
            out[METRICS_KEY] = _MetricStates(metric_items, mj if isinstance(mj, dict) else {}, kinds)
        return out

    def remove_checkpoint(self, path: Any) -> None:
        """Removes a checkpoint file (no error when it is already gone)."""
        self.wait()  # never beside a background save, which could be this file's
        try:
            os.remove(fspath(path))
        except FileNotFoundError:
            pass


def _snapshots_into(saved: Dict[str, Any], mine: Dict[str, Any], allow_narrowing: bool) -> LoadReport:
    """Fills the module's metrics from snapshots by the same rules as from a keepsake file."""
    items: Dict[str, Any] = {}
    descs = []
    for name, snap in saved.items():
        if isinstance(snap, dict) and "state_dict" in snap and isinstance(snap.get("describe"), dict):
            items.update(_metrics.snapshot_items(_layout.key(_layout.TRAIN_METRIC, name), snap))
            descs.append(dict(snap["describe"], path=_layout.key(_layout.TRAIN_METRIC, name)))
    meta = json.loads(_n.metric_info(json.dumps({"metrics": descs}))) if descs else {}
    report = LoadReport()
    _load.load_metrics_from(items, meta, {}, dict(mine), METRICS, report, allow_narrowing)
    for name, m in mine.items():
        snap = saved.get(name)
        item = report.find(_layout.key(_layout.TRAIN_METRIC, name))
        if isinstance(snap, dict) and item is not None and item.kind in ("loaded", "migrated", "converted"):
            m._computed = _metrics._clone(snap.get(_layout.COMPUTED))  # nested results too, as saved
            for iname, sub in _metrics.inner_metrics(m):
                sub._computed = _metrics._clone(snap.get("inner", {}).get(iname, {}).get(_layout.COMPUTED))
    return report


def is_keepsake_file(path: Any) -> bool:
    """Whether `path` is a local keepsake / safetensors file (an 8-byte header length, then '{')."""
    try:
        with open(fspath(path), "rb") as f:
            head = f.read(9)
    except (OSError, TypeError, ValueError):
        return False
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") < (1 << 40)


def _install_pl_load() -> None:
    """Teaches Lightning's checkpoint loader (``pl_load``: ``LightningModule.load_from_checkpoint``,
    ``LightningDataModule.load_from_checkpoint`` and anything else that reads a checkpoint without
    the Trainer's CheckpointIO) to read keepsake files, through :class:`KeepsakeCheckpointIO`.
    Any other file goes to Lightning's own loader unchanged."""
    targets = []
    for mod_name in ("lightning.fabric.utilities.cloud_io", "lightning.pytorch.core.saving",
                     "lightning_fabric.utilities.cloud_io", "pytorch_lightning.core.saving"):
        try:
            mod = __import__(mod_name, fromlist=["_"])
        except ImportError:
            continue
        attr = "_load" if mod_name.endswith("cloud_io") else "pl_load"
        if hasattr(mod, attr) and not getattr(getattr(mod, attr), "_keepsake", False):
            targets.append((mod, attr))
    for mod, attr in targets:
        original = getattr(mod, attr)

        def load(path_or_url: Any, map_location: Any = None, weights_only: Optional[bool] = None,
                 _original: Any = original) -> Any:
            if isinstance(path_or_url, (str, os.PathLike)) and is_keepsake_file(path_or_url):
                return KeepsakeCheckpointIO().load_checkpoint(path_or_url, map_location=map_location)
            return _original(path_or_url, map_location=map_location, weights_only=weights_only)

        load._keepsake = True  # type: ignore[attr-defined]
        setattr(mod, attr, load)


_install_pl_load()


def module_metrics(pl_module: Any) -> Dict[str, Any]:
    """Every torchmetrics Metric of a module, by module path (``train_acc``, ``metrics.MulticlassAccuracy``)."""
    return {name: m for name, m in pl_module.named_modules() if name and _metrics.is_metric(m)}


class KeepsakeMetrics(Callback):
    """Saves every torchmetrics ``Metric`` of the LightningModule in the checkpoint and restores it.

    States, ``_computed`` and the update count come back, so a run resumed mid-epoch computes the
    same epoch value as an uninterrupted one. The checkpoint dict gets a snapshot of each metric,
    taken when the dict is built (so an ``AsyncCheckpointIO`` writes the states of that moment),
    made of plain tensors and containers: :class:`KeepsakeCheckpointIO` stores it in keepsake's
    metric layout, and any other CheckpointIO (Lightning's default ``TorchCheckpointIO``
    included) stores it as it stores tensors, which ``torch.load(weights_only=True)`` reads.
    """

    def __init__(self, allow_narrowing: bool = False) -> None:
        self.allow_narrowing = allow_narrowing
        self.last_report: Optional[LoadReport] = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        """Puts a snapshot of every torchmetrics metric of ``pl_module`` into ``checkpoint``.

        The snapshots are copies made now, of plain tensors and containers, so a background save
        writes the states of this moment and any CheckpointIO can store them.
        """
        # Snapshots, not the Metric objects: copies taken now (an AsyncCheckpointIO writes them
        # later, while training goes on) made of plain tensors and containers, which any
        # CheckpointIO stores and torch.load(weights_only=True) reads back.
        checkpoint[METRICS_KEY] = {name: _metrics.snapshot(m, name, _layout.key(_layout.TRAIN_METRIC, name))
                                   for name, m in module_metrics(pl_module).items()}

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        """Fills the module's metrics from ``checkpoint`` by name; the report is ``last_report``.

        Reads the states :class:`KeepsakeCheckpointIO` loaded, or the snapshots another CheckpointIO
        gave back; a checkpoint without metrics leaves them as they are.
        """
        saved = checkpoint.get(METRICS_KEY)
        mine = module_metrics(pl_module)
        if isinstance(saved, _MetricStates):
            self.last_report = saved.load_into(mine, self.allow_narrowing)
        elif isinstance(saved, dict):  # snapshots, as another CheckpointIO gives them back
            self.last_report = _snapshots_into(saved, mine, self.allow_narrowing)


def _train_loaders(trainer: Any) -> list:
    """The fit loop's train dataloaders that have ``state_dict``/``load_state_dict``, in the order
    of Lightning's CombinedLoader (a loader, or a list or dict of them)."""
    try:
        from lightning.pytorch.utilities import CombinedLoader
    except ImportError:  # pragma: no cover - pytorch_lightning only
        from pytorch_lightning.utilities import CombinedLoader  # type: ignore
    iterables = trainer.train_dataloader
    if iterables is None:
        return []
    return [dl for dl in CombinedLoader(iterables).flattened
            if callable(getattr(dl, "state_dict", None)) and callable(getattr(dl, "load_state_dict", None))]


class KeepsakeDataPosition(Callback):
    """Resumes each stateful train dataloader (torchdata's ``StatefulDataLoader``, workers
    included) at the exact sample where the checkpoint left it, with the epoch's shuffle.

    Lightning 2.6 keeps such a loader's ``state_dict()`` in the checkpoint's loop state but loses
    it in two cases: a checkpoint written at an epoch's end (``ModelCheckpoint``'s default) does
    not count as a restart, so the state is never loaded and the rebuilt loader's first epoch
    is a fresh shuffle, the first epoch's order again when the run is seeded; and a
    ``configure_optimizers`` that reads ``trainer.estimated_stepping_batches`` builds the loader
    before the loop state is restored, so the state is never loaded either. A checkpoint saved
    at the last batch's end is loaded, but as the end of that epoch: the next epoch then has no
    batches. This callback saves every stateful train dataloader's ``state_dict()`` (under
    ``keepsake_data_position``) and whether its epoch was finished; when ``fit`` resumes, before
    the first batch, it loads each state into the loader, starts the next epoch's iterator when
    the saved one was finished, and makes the fit loop iterate the loaders afresh. The remaining
    batches are those of the run that never stopped.
    """

    def __init__(self) -> None:
        self._pending: Optional[Dict[str, Any]] = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Forgets a state loaded for an earlier fit: a state is for the fit that loaded it."""
        self._pending = None  # a state is for the fit that loaded it

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        """Puts every stateful train dataloader's ``state_dict()`` into ``checkpoint``, and whether
        its epoch was finished (the last batch done).
        """
        loaders = _train_loaders(trainer)
        if loaders:
            done = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
            checkpoint[DATA_KEY] = {"loaders": [dl.state_dict() for dl in loaders], "epoch_finished": done}

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        """Keeps the saved data position until the fit starts (:meth:`on_train_start`)."""
        self._pending = checkpoint.get(DATA_KEY)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Loads the saved states into the train dataloaders before the first batch, starts the next
        epoch where the saved one was finished, and has the fit loop iterate the loaders afresh.

        Raises MismatchError when the checkpoint holds the positions of a different number of
        stateful loaders than the trainer has.
        """
        # The fit loop has built the loaders and an iterator over them (setup_data), and fetched
        # nothing yet: the saved states go in now, and the loop's iterator is made again.
        saved, self._pending = self._pending, None
        if not isinstance(saved, dict):
            return
        loaders, states = _train_loaders(trainer), list(saved.get("loaders") or [])
        if len(loaders) != len(states):
            raise _errors.error(_errors.MismatchError, f"the checkpoint has the positions of {len(states)} "
                                f"train dataloaders, the trainer has {len(loaders)} stateful ones", key=DATA_KEY)
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if fetcher is None:
            raise _errors.error(_errors.UnsupportedError, "this Lightning's fit loop has no data fetcher "
                                "to restart: the data position cannot be restored", key=DATA_KEY)
        for dl, state in zip(loaders, states):
            dl.load_state_dict(state)
            # The first iter() after load_state_dict resumes the saved epoch. Lightning stops
            # at an epoch's last batch without asking for one more, so a finished epoch's state
            # still says "not finished": that iterator is made here, and the fit loop's iter()
            # below starts the next epoch, as in the run that never stopped. (A state saved after
            # StopIteration says finished, and torchdata starts the next epoch by itself.)
            if saved.get("epoch_finished") and not (isinstance(state, dict) and state.get("_iterator_finished")):
                iter(dl)
        iter(fetcher)  # what Lightning does at each epoch's start: iter() of every loader


try:
    from lightning.pytorch.strategies import ModelParallelStrategy as _ModelParallelStrategy
except ImportError:  # pragma: no cover - older Lightning
    _ModelParallelStrategy = None

if _ModelParallelStrategy is not None:
    class KeepsakeModelParallelStrategy(_ModelParallelStrategy):  # type: ignore[misc, valid-type]
        """Lightning's ``ModelParallelStrategy`` (FSDP2 ``fully_shard`` / tensor parallel, CPU with gloo
        included) whose checkpoints are keepsake sharded directories (docs/FORMAT.md section 9).

        Each checkpoint path is a directory: the model and optimizer shards go through DCP into
        keepsake's layout (:class:`keepsake.distributed.KeepsakeWriter`, the index written last: the
        commit), and the rest of Lightning's dict (loops, schedulers, callbacks, ...) into
        ``lightning.keepsake`` inside it, written by rank 0 before the save starts, through
        :class:`KeepsakeCheckpointIO` (no pickle). ``fit(ckpt_path=dir)`` loads both on every rank.
        Lightning's own strategy writes DCP's format plus a pickled ``meta.pt`` and bypasses the
        CheckpointIO. Only ``save_distributed_checkpoint=True`` (the default) is supported.
        """

        META = "lightning.keepsake"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not kwargs.get("save_distributed_checkpoint", True):
                raise ValueError("KeepsakeModelParallelStrategy saves sharded directories: "
                                 "save_distributed_checkpoint=False is not supported")
            super().__init__(*args, **kwargs)

        def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any,
                            storage_options: Optional[Any] = None) -> None:
            """Saves ``checkpoint`` as a keepsake sharded directory at ``filepath`` (on every rank).

            Rank 0 writes the non-tensor part of Lightning's dict to ``lightning.keepsake`` first; then
            the model and optimizer shards go through DCP and :class:`keepsake.distributed.KeepsakeWriter`,
            whose index, written last, commits the checkpoint. ``storage_options`` is refused.
            """
            import torch.distributed.checkpoint as dcp
            from .._distributed.storage import KeepsakeWriter
            if storage_options is not None:
                raise TypeError("KeepsakeModelParallelStrategy.save_checkpoint takes no storage_options")
            path = os.fspath(self.broadcast(fspath(filepath)))
            state = {"state_dict": checkpoint.pop("state_dict")}
            state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
            if self.global_rank == 0:
                if os.path.isfile(path):
                    os.remove(path)
                _n.shard_prepare_dir(path)
                _n.shard_uncommit(path)  # a directory rewritten is no checkpoint until its new index
                KeepsakeCheckpointIO().save_checkpoint(checkpoint, os.path.join(path, self.META))
            self.barrier("keepsake_save_checkpoint")
            dcp.save(state, storage_writer=KeepsakeWriter(path))

        def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> Dict[str, Any]:
            """Loads a sharded directory saved by :meth:`save_checkpoint` into the model and optimizers.

            The shards are read through :class:`keepsake.distributed.KeepsakeReader` at this run's world
            size; returns the rest of Lightning's dict. A directory without an index raises NotFoundError.
            """
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                                 get_optimizer_state_dict, set_model_state_dict,
                                                                 set_optimizer_state_dict)
            from .._distributed.storage import KeepsakeReader
            path = os.fspath(self.broadcast(fspath(checkpoint_path)))
            if not _n.shard_committed(path):
                raise _errors.error(_errors.NotFoundError, f"{path}: not a keepsake sharded checkpoint directory "
                                    "(no index)", file=path)
            assert self.model is not None and self.lightning_module is not None
            opts = [getattr(o, "_optimizer", o) for o in self.optimizers]
            state: Dict[str, Any] = {"state_dict": get_model_state_dict(self.model)}
            state.update({f"optimizer_{i}": get_optimizer_state_dict(self.model, o) for i, o in enumerate(opts)})
            dcp.load(state, storage_reader=KeepsakeReader(path))
            set_model_state_dict(self.model, state["state_dict"],
                                 options=StateDictOptions(strict=self.lightning_module.strict_loading))
            for i, o in enumerate(opts):
                set_optimizer_state_dict(self.model, o, optim_state_dict=state[f"optimizer_{i}"])
            rest = KeepsakeCheckpointIO().load_checkpoint(os.path.join(path, self.META))
            rest.pop("state_dict", None)
            return rest

    __all__.append("KeepsakeModelParallelStrategy")

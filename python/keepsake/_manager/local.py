"""The checkpoint manager of one process: the C checkpoint manager for a PyTorch training loop.

Every decision is the C library's (``ks_ckpt_manager``, docs/DESIGN.md): when to save (every N
batches or epochs, every S seconds, a preemption signal), file names and ``latest``, the
retention policies (keep the latest N, the best N by a metric stored in each checkpoint, every
N-th, one per time period), the run directory's lock, which checkpoint autoresume takes (the
newest that fully verifies; corrupt ones are set aside) and background saves (the state is copied
before ``save(blocking=False)`` returns; the write, ``latest`` and retention run on the library's
thread, without the GIL). This module only flattens the program's objects, as
``save_checkpoint`` does, and fills them back with ``load_checkpoint``.
"""
from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any, Dict, MutableMapping, Optional, Tuple

from .._core import errors as _errors
from .._core import layout as _layout, native as _n
from .._core.paths import PathLike, fspath
from .._state import checkpoint as _state, metrics as _metrics, staging as _staging
from .base import ManagerBase, Preempted

# Managers still open at interpreter exit: their background save is finished (committed, or its
# temporary file removed) before the process ends, which module teardown alone does not promise.
_open: "weakref.WeakSet[LocalCheckpointManager]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for mgr in list(_open):
        try:
            mgr.close()
        except Exception as e:  # noqa: BLE001 - an exiting process can only report it
            print(f"keepsake: warning: at exit, a background save failed: {e}", file=sys.stderr)


class LocalCheckpointManager(ManagerBase):
    """Saves a training run's checkpoints into a run directory and resumes from them: what
    ``keepsake.CheckpointManager(run_dir, ...)`` makes (without ``distributed=True``).

    Args:
        run_dir: a directory, or an ``s3://bucket/prefix`` location (when the package has libcurl).
        components and policy: as :class:`keepsake.CheckpointManager` takes them
            (keepsake._manager.options).
        staging: the :class:`keepsake.torch.HostStaging` that CUDA tensors are copied into at each
            save (a page-locked host buffer the manager reuses from save to save and frees on
            :meth:`close`); None: one of its own, allocated at the first save with CUDA tensors.
            An ``exclusive`` staging (the manager's own is) is the background save's snapshot
            itself: the tensors are copied once, from the device into the file's image.
    """

    def __init__(self, run_dir: PathLike, *, staging: Optional[_staging.HostStaging] = None, **kw: Any) -> None:
        super().__init__(run_dir, **kw)
        o = self.options
        self._staging = staging if staging is not None else _staging.HostStaging(exclusive=True)
        # The file image background saves go through (ks_image, made by the library): over an
        # exclusive staging's buffer once device tensors were staged into it (_image_at: that
        # buffer's span), else in memory of its own (reserve()); None: the library saver's own.
        self._image: Optional[Any] = None
        self._image_at: Optional[Tuple[int, int]] = None
        # autoresume loads a remote checkpoint through the cache the manager's own reads filled
        self._run_cache = f"{fspath(o.cache_dir)}/run" if o.cache_dir is not None and self._url else None
        self._native = self._native_manager(upload_to=fspath(o.upload_to) if o.upload_to is not None else None,
                                            upload_retention=o.upload_retention,
                                            cache_dir=fspath(o.cache_dir) if o.cache_dir is not None else None,
                                            metrics=self._metric_paths())
        self._install_preemption()
        _open.add(self)

    def _metric_paths(self) -> list:
        """Where the program's metrics are saved: the library refuses a best_metric naming none."""
        return [path for path, _m in self._named_metrics()]

    @property
    def run_dir(self) -> str:
        """The run directory or remote location, as the C manager resolved it."""
        return self._native.path

    # ---- saving ----

    def save(self, blocking: bool = True) -> str:
        """Saves a checkpoint now; returns its path.

        ``blocking=False`` returns once every tensor, optimizer state and metric state has been
        copied: training may change them at once. The write, ``latest`` and retention follow on
        the library's thread with the same durability and order as a blocking save; its error is
        raised by the next call (``save``, ``step``, ``wait``, ``close``), never swallowed.
        """
        try:
            fl, meta, metrics = self._flatten()
            path = self._location(self._native.save(fl.entries, meta, metrics, self._ts(), blocking,
                                                    None if blocking else self._image))
            del fl  # the tensors may go: the library has copied (or written) them
        finally:
            self._staging.done()  # the staging is the next save's again
        self.last_saved = path
        return path

    def reserve(self) -> None:
        """Prepares background saves of the state as it is now: the library's staging buffer
        (and, for CUDA tensors, the page-locked host staging) is allocated and its pages touched
        here, instead of inside the first ``save(blocking=False)``, which would otherwise hold the
        training loop while a fresh buffer as large as the state is faulted in. Call it before
        training, once the optimizers have their state (after a first step, or after
        :meth:`autoresume`, which calls it when ``async_save`` is set). Later saves reuse the
        buffer; a state that grows past it gets a larger one at its next save. Waits for a save
        in flight first. The buffer is a file image (``ks_image_create``): the library lays the
        state out once, and background saves copy into it and write the file from it."""
        try:
            fl, meta, metrics = self._flatten()
            self._native.wait()  # a save in flight may write from the image: its error surfaces here
            if self._image_at is None:  # not the staging's buffer (device tensors are copied there)
                if self._image is None:
                    self._image = _n.Image(fl.entries, meta, metrics)
                else:  # the same state keeps its layout; another one is laid out anew (its memory grows)
                    self._native.place(self._image, fl.entries, meta, metrics)
            del fl
        finally:
            self._staging.done()

    def _flatten(self) -> Tuple[Any, Dict[str, str], Optional[str]]:
        """The state as the library saves it: (the flattened entries, their metadata, the metrics'
        descriptions). CUDA tensors are copied into the host staging (release with
        ``self._staging.done()``)."""
        c = self.components
        fl, descs = _state.checkpoint_entries(c["model"], c["optimizers"], c["schedulers"], c["train_metrics"],
                                              c["eval_metrics"], self.timestamp, self.rng, self.extra,
                                              c["dataset_state"], c["callbacks"], self.run_name,
                                              self.rank_zero_seed, self._staging)
        meta = fl.record(dict([_layout.STATE_RECORD]))
        metrics = _metrics.metrics_meta(descs)
        if self._staging.exclusive:  # CUDA tensors: copied where the snapshot wants them, waited for
            self._staging.stage_image(fl.entries, lambda address, size: self._place(
                fl.entries, meta, metrics, address, size))
        else:
            self._staging.stage(fl.entries)  # CUDA tensors: copied into the host staging, waited for
        return fl, meta, metrics

    def _place(self, entries: list, meta: Dict[str, str], metrics: Optional[str], address: int,
               size: int) -> Tuple[int, Optional[Dict[str, int]]]:
        """HostStaging.stage_image's ``place``: the file image over the staging's buffer at
        (address, size), made when the buffer is new (a layout-only image says how much it
        needs first), then ``ks_image_get`` for this state, after a save writing from it:
        (bytes the image wants, {name: offset}), or (bytes, None) when the buffer is too small.
        An image replaced here stays alive while the library's save in flight holds it."""
        if self._image is None or self._image_at != (address, size):
            need = _n.Image(entries, meta, metrics, layout_only=True).need
            if not address or size < need:
                return need, None
            self._image = _n.Image(entries, meta, metrics, address, size, self._staging.buffer)
            self._image_at = (address, size)
        return self._native.place(self._image, entries, meta, metrics)

    def step(self, epoch_end: bool = False) -> Optional[str]:
        """Call at each batch end (and with ``epoch_end=True`` at each epoch end), after the
        timestamp counts it. Saves when a trigger says so; after a preemption signal, saves,
        waits until it is durable and raises :class:`Preempted`. Returns the path saved, or None.
        """
        # The trigger first, then the signal: should_save also says yes to a signal, so one that
        # arrives between the two reads must still take the preemption path (one save, then exit),
        # never a trigger's background save followed by a second, preemption save.
        due = self._native.should_save(self._ts(), epoch_end)
        signum = _n.preemption_signal()
        if signum and not epoch_end:
            path = self.save(blocking=True)
            self.wait()
            raise Preempted(path, signum)
        if not due:
            return None
        try:
            return self.save(blocking=not self.async_save)
        except _errors.KeepsakeError as e:
            if self.on_save_error == "raise":
                raise
            self._warn_save_failed(e)
            return None

    def wait(self) -> None:
        """Waits for a background save; raises its error."""
        self._native.wait()

    def close(self) -> None:
        """Finishes a save in flight (raising its error), then releases the run directory.
        Managers left open are closed at interpreter exit."""
        _open.discard(self)
        try:
            self._native.close()
        finally:
            self._image = self._image_at = None  # the library's save from it has ended
            self._staging.close()
            self._uninstall_preemption()

    # ---- resuming ----

    def autoresume(self, **load_kw: Any) -> bool:
        """Fills the components from the newest checkpoint that fully verifies.

        Corrupt or partial checkpoints are skipped with a warning and set aside (``.corrupt``).
        Returns False when there is none. ``self.last_report`` is the :class:`LoadReport`;
        ``load_kw`` goes to :func:`keepsake.torch.load_checkpoint` (``strict``, ``ignore``, ...).
        """
        path, self.skipped = self._native.resume_path()
        if path is None:
            return False
        path = self._location(path)
        load_kw.setdefault("cache_dir", self._run_cache)
        c = self.components
        self.last_report = _state.load_checkpoint(path, model=c["model"], optimizers=c["optimizers"],
                                                  schedulers=c["schedulers"], train_metrics=c["train_metrics"],
                                                  eval_metrics=c["eval_metrics"], timestamp=self.timestamp,
                                                  rng=self.rng, dataset_state=c["dataset_state"],
                                                  callbacks=c["callbacks"], **load_kw)
        if isinstance(self.extra, MutableMapping) and self.last_report.extra:  # filled in place, as the rest
            self.extra.clear()
            self.extra.update(self.last_report.extra)
        if self.async_save:
            self.reserve()  # the state is whole now (optimizer state included): staged saves start warm
        return True

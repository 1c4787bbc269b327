"""keepsake.CheckpointManager: the C checkpoint manager for a PyTorch training loop.

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
import signal as _signal
import sys
import weakref
from typing import Any, Dict, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

from . import _errors, _metrics, _staging, _state, _tree
from . import _native_api as _n
from ._paths import PathLike, fspath
from ._report import LoadReport, Timestamp

#: Exit status of a run that saved on preemption and stopped ("try again", as the C demo uses).
EXIT_PREEMPTED = 75

# Managers still open at interpreter exit: their background save is finished (committed, or its
# temporary file removed) before the process ends, which module teardown alone does not promise.
_open: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for mgr in list(_open):
        try:
            mgr.close()
        except Exception as e:  # noqa: BLE001 - an exiting process can only report it
            print(f"keepsake: warning: at exit, a background save failed: {e}", file=sys.stderr)


class Preempted(SystemExit):
    """Raised by :meth:`CheckpointManager.step` after the preemption save is durable.

    A ``SystemExit`` with code 75: uncaught, the process exits with that status, which a
    scheduler can read as "requeue me"; catch it to clean up first. ``path`` is the checkpoint.
    """

    def __init__(self, path: str, signum: int) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.path, self.signum = path, signum


class CheckpointManager:
    """Saves a training run's checkpoints into a run directory and resumes from them.

    Args:
        run_dir: a directory, or an ``s3://bucket/prefix`` location (when the package has libcurl).
        model, optimizers, schedulers, train_metrics, eval_metrics, timestamp, dataset_state,
            callbacks, extra, rng: the components, as :func:`keepsake.torch.save_checkpoint` takes
            them. ``timestamp`` (a :class:`keepsake.Timestamp`) names the files and drives the triggers.
        save_every: ``"50ba"`` (every 50 batches), ``"1ep"``, or an int (batches: ``50`` is
            ``"50ba"``); ``save_every_seconds`` adds a clock. :meth:`step` counts on the timestamp
            advancing: the library warns (once, on stderr) when 3 batch ends (or epoch ends) in a row
            see the same one, since no interval would ever come due.
        keep_last: keep the N newest (0 keeps all). ``keep_best``, ``best_metric``
            (``"train_metrics/acc"``, ``"eval_metrics/val/acc"``, ``"eval/acc"``) and ``best_mode``
            (``"max"``/``"min"``): keep the N best by the value stored in each checkpoint. A
            ``best_metric`` that names none of ``train_metrics`` / ``eval_metrics`` is refused
            (InvalidError, naming them); a save whose metric was never computed (so it cannot
            rank) is warned about once, on stderr.
            ``keep_every`` (``"5ep"``) and ``keep_period_seconds`` keep more. The policies combine.
        filename: the name template (``{epoch}``, ``{batch}``, ``{sample}``).
        async_save: :meth:`step` saves in the background (``save(blocking=False)``).
        on_save_error: ``"raise"`` (stop) or ``"warn"``: a failed save from :meth:`step` is
            reported on stderr and the next trigger tries again.
        preemption_signals: signals that ask for a save at the next :meth:`step`, which then
            raises :class:`Preempted` (``()`` installs none). Only signals received while the
            manager is open count; a handler the program installed before still runs (chained),
            and :meth:`close` puts it back (or the default: SIGTERM ends the process again).
        lock: ``"auto"`` (lock the run directory where the storage can), ``"require"``, ``"off"``.
        upload_to: save locally, then upload each checkpoint there (``s3://...``).
        cache_dir: a local directory for the C library's read cache over a remote ``run_dir`` and
            ``upload_to`` (``<cache_dir>/run``, ``<cache_dir>/upload``): bytes read once, by
            autoresume's verification or an upload-mode download, are not read from the server again;
            autoresume's load of a remote checkpoint reads through the same cache.
        when_busy: a background save asked for while one is still in flight: ``"wait"`` for it
            (default; at most one is ever in flight) or ``"fail"`` (StateError, nothing saved).
        distributed: True in a torch.distributed run: every rank constructs the manager, which
            saves sharded checkpoint directories with DCP (a :class:`DistributedCheckpointManager`,
            ``keepsake._dist_manager``; docs/PYTHON.md, "torch.distributed").
        staging: the :class:`keepsake.torch.HostStaging` that CUDA tensors are copied into at each
            save (a page-locked host buffer the manager reuses from save to save and frees on
            :meth:`close`); None: one of its own, allocated at the first save with CUDA tensors.
            An ``exclusive`` staging (the manager's own is) is the background save's snapshot
            itself: the tensors are copied once, from the device into the file's image.
    """

    def __new__(cls, *args: Any, distributed: bool = False, **kw: Any) -> "CheckpointManager":
        if distributed:
            from ._dist_manager import DistributedCheckpointManager
            if not issubclass(cls, DistributedCheckpointManager):
                cls = DistributedCheckpointManager
        return super().__new__(cls)

    def __init__(self, run_dir: PathLike, *, model: Any = None, optimizers: Any = None, schedulers: Any = None,
                 train_metrics: Any = None, eval_metrics: Any = None, timestamp: Optional[Timestamp] = None,
                 dataset_state: Any = None, callbacks: Any = None, extra: Optional[Mapping[str, Any]] = None,
                 rng: bool = True, run_name: str = "", rank_zero_seed: int = 0,
                 save_every: Union[str, int, None] = None, save_every_seconds: float = 0.0,
                 filename: Optional[str] = None,
                 keep_last: int = 0, keep_best: int = 0, best_metric: Optional[str] = None, best_mode: str = "max",
                 keep_every: Optional[str] = None, keep_period_seconds: float = 0.0, async_save: bool = False,
                 on_save_error: str = "raise", preemption_signals: Sequence[int] = (_signal.SIGTERM, _signal.SIGUSR1),
                 lock: str = "auto", upload_to: Optional[PathLike] = None, upload_retention: bool = False,
                 retention_log: bool = False, when_busy: str = "wait", distributed: bool = False,
                 cache_dir: Optional[PathLike] = None, staging: Optional[_staging.HostStaging] = None) -> None:
        if on_save_error not in ("raise", "warn"):
            raise ValueError("on_save_error: 'raise' or 'warn'")
        self.components = dict(model=model, optimizers=optimizers, schedulers=schedulers,
                               train_metrics=train_metrics, eval_metrics=eval_metrics, dataset_state=dataset_state,
                               callbacks=callbacks)
        self.timestamp = timestamp if timestamp is not None else Timestamp()
        self.extra, self.rng, self.run_name, self.rank_zero_seed = extra, rng, run_name, rank_zero_seed
        self.async_save, self.on_save_error = async_save, on_save_error
        self.last_report: Optional[LoadReport] = None
        self.last_saved: Optional[str] = None
        self.save_errors = 0
        self._staging = staging if staging is not None else _staging.HostStaging(exclusive=True)
        loc = fspath(run_dir)
        # s3:// and http(s):// run directories: the library's paths there are keys of the store;
        # Python names checkpoints by URL, which every keepsake function takes.
        self._url = loc.rstrip("/") if _n.is_remote(loc) else None
        # autoresume loads a remote checkpoint through the cache the manager's own reads filled
        self._run_cache = f"{fspath(cache_dir)}/run" if cache_dir is not None and self._url else None
        self._native = _n.Manager(loc, save_interval=save_every, filename=filename, keep=keep_last,
                                  keep_best=keep_best, best_metric=best_metric, best_mode=best_mode,
                                  keep_every=keep_every, keep_period_seconds=keep_period_seconds,
                                  save_every_seconds=save_every_seconds, lock=lock, async_busy=when_busy,
                                  upload_to=fspath(upload_to) if upload_to is not None else None,
                                  upload_retention=upload_retention, retention_log=retention_log,
                                  cache_dir=fspath(cache_dir) if cache_dir is not None else None,
                                  metrics=self._metric_paths())
        # Until close(): the handlers the signals had still run, and close() puts them back.
        self._preempt = _n.preemption_install(list(preemption_signals)) if preemption_signals else ()
        _open.add(self)

    def _metric_paths(self) -> list:
        """Where the program's metrics are saved: the library refuses a best_metric naming none."""
        c = self.components
        paths = [f"state/train_metrics/{n}" for n, _ in _metrics.named_metrics(c["train_metrics"])]
        for label, ms in _state._eval_groups(c["eval_metrics"]):
            paths += [f"state/eval_metrics/{label}/{n}" for n, _ in _metrics.named_metrics(ms)]
        return paths

    # ---- the context-manager protocol ----

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def run_dir(self) -> str:
        """The run directory or remote location, as the C manager resolved it."""
        return self._native.path

    def _ts(self) -> dict:
        return self.timestamp.state_dict() if hasattr(self.timestamp, "state_dict") else dict(self.timestamp)

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
            path = self._location(self._native.save(fl.entries, meta, metrics, self._ts(), blocking))
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
        in flight first."""
        try:
            fl, meta, metrics = self._flatten()
            self._native.reserve(fl.entries, meta, metrics)
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
        meta = fl.record({"keepsake.state": '{"layout_version":1}'})
        metrics = _metrics.metrics_meta(descs)
        if self._staging.exclusive:  # CUDA tensors: copied where the snapshot wants them, waited for
            self._staging.stage_image(fl.entries, lambda address, size: self._native.stage_into(
                fl.entries, meta, metrics, address, size, self._staging.buffer))
        else:
            self._staging.stage(fl.entries)  # CUDA tensors: copied into the host staging, waited for
        return fl, meta, metrics

    def _location(self, path: str) -> str:
        return f"{self._url}/{path.rsplit('/', 1)[-1]}" if self._url else path

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
            self.save_errors += 1
            print(f"keepsake: warning: checkpoint save failed, training goes on: {e}", file=sys.stderr)
            return None

    def wait(self) -> None:
        """Waits for a background save; raises its error."""
        self._native.wait()

    def close(self) -> None:
        """Finishes a save in flight (raising its error), then releases the run directory.
        Managers left open are closed at interpreter exit."""
        _open.discard(self)
        preempt, self._preempt = self._preempt, ()
        try:
            self._native.close()
        finally:
            self._staging.close()
            _n.preemption_uninstall(preempt)  # SIGTERM ends the process again (or reaches the program's handler)

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

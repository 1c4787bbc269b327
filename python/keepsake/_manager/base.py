"""What every checkpoint manager is: its components, its options, and the logic the local and the
distributed manager share.

:class:`ManagerBase` takes ``CheckpointManager``'s arguments (the components, and the policy as
``options=`` or keywords: keepsake._manager.options), holds them, and gives both managers the C
manager with that policy, the preemption signals, the timestamp and metric paths, the warning for
a failed save and the context-manager protocol. Each manager writes its own save, step, wait,
close and autoresume: :class:`keepsake._manager.local.LocalCheckpointManager` (one process, one
file per checkpoint) and ``keepsake._distributed.manager.DistributedCheckpointManager`` (every
rank, one sharded directory per checkpoint). ``keepsake.CheckpointManager`` picks one of them;
neither knows it.
"""
from __future__ import annotations

import abc
import sys
from typing import Any, List, Optional, Tuple

from .._core import layout as _layout, native as _n
from .._core.paths import PathLike, fspath
from .._core.report import LoadReport, Timestamp
from .._state import checkpoint as _state, metrics as _metrics
from .options import OBJECTS, CheckpointOptions, from_keywords

#: Exit status of a run that saved on preemption and stopped ("try again", as the C demo uses).
EXIT_PREEMPTED = 75

#: The folders of the train and eval metrics, as the library names them (ks_state_key).
TRAIN_METRICS = _layout.folder(_layout.TRAIN_METRIC)
EVAL_METRICS = _layout.folder(_layout.EVAL_METRIC)


class Preempted(SystemExit):
    """Raised by :meth:`CheckpointManager.step` after the preemption save is durable.

    A ``SystemExit`` with code 75: uncaught, the process exits with that status, which a
    scheduler can read as "requeue me"; catch it to clean up first. ``path`` is the checkpoint.
    """

    def __init__(self, path: str, signum: int) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.path, self.signum = path, signum


class ManagerBase(abc.ABC):
    """A checkpoint manager: the components it saves, its :class:`CheckpointOptions`, and the
    operations every manager has (the subclasses say how).

    Attributes:
        options: the :class:`CheckpointOptions`.
        components: the program's objects by kind (``model``, ``optimizers``, ``schedulers``,
            ``train_metrics``, ``eval_metrics``, ``dataset_state``, ``callbacks``).
        timestamp, extra, rng, run_name, rank_zero_seed: the other components.
        last_saved: the last checkpoint saved; ``last_report``: the last resume's LoadReport (local);
        ``skipped``: how many checkpoints the last resume passed over; ``save_errors``: the save
        failures ``on_save_error="warn"`` reported.
    """

    def __init__(self, run_dir: PathLike, *, options: Optional[CheckpointOptions] = None, **keywords: Any) -> None:
        parts, self.options = from_keywords(type(self).__name__, options, keywords)
        self.components = {k: getattr(parts, k) for k in OBJECTS}
        self.timestamp = parts.timestamp if parts.timestamp is not None else Timestamp()
        self.extra, self.rng, self.run_name, self.rank_zero_seed = parts.extra, parts.rng, parts.run_name, \
            parts.rank_zero_seed
        self.last_report: Optional[LoadReport] = None
        self.last_saved: Optional[str] = None
        self.save_errors = 0
        self.skipped = 0
        self._preempt: Any = ()
        self._location_text = fspath(run_dir)
        # s3:// and http(s):// run directories: the library's paths there are keys of the store;
        # Python names checkpoints by URL, which every keepsake function (and DCP's storage) takes.
        self._url = self._location_text.rstrip("/") if _n.is_remote(self._location_text) else None

    @property
    def async_save(self) -> bool:
        """Whether :meth:`step` saves in the background (``options.async_save``)."""
        return self.options.async_save

    @property
    def on_save_error(self) -> str:
        """``"raise"`` or ``"warn"`` (``options.on_save_error``)."""
        return self.options.on_save_error

    # ---- for the subclasses ----

    def _native_manager(self, owner: bool = True, **more: Any) -> Any:
        """The C manager (``ks_ckpt_manager``) over the run directory with this policy. ``owner``:
        this process owns the run directory (its lock, retention); the other ranks of a
        distributed run only name directories (``ks_ckpt_manager_dir_path``). ``more``: the
        manager's own settings (``sharded``, ``upload_to``, ...)."""
        o = self.options
        return _n.Manager(self._location_text, save_interval=o.save_every, filename=o.filename,
                          save_every_seconds=o.save_every_seconds, best_mode=o.best_mode, async_busy=o.when_busy,
                          keep=o.keep_last if owner else 0, keep_best=o.keep_best if owner else 0,
                          best_metric=o.best_metric if owner else None,
                          keep_every=o.keep_every if owner else None,
                          keep_period_seconds=o.keep_period_seconds if owner else 0.0,
                          lock=o.lock if owner else "off", retention_log=o.retention_log and owner, **more)

    def _install_preemption(self) -> None:
        """Until close(): the handlers the signals had still run, and close() puts them back."""
        signals = self.options.preemption_signals
        self._preempt = _n.preemption_install(list(signals)) if signals else ()

    def _uninstall_preemption(self) -> None:
        """SIGTERM ends the process again (or reaches the program's handler). Once."""
        preempt, self._preempt = self._preempt, ()
        _n.preemption_uninstall(preempt)

    def _named_metrics(self) -> List[Tuple[str, Any]]:
        """(where it is saved, metric): train metrics, then eval metrics by label."""
        c = self.components
        out = [(_layout.key(_layout.TRAIN_METRIC, name), m) for name, m in _metrics.named_metrics(c["train_metrics"])]
        for label, ms in _state._eval_groups(c["eval_metrics"]):
            out += [(_layout.key(_layout.EVAL_METRIC, name, base=label), m) for name, m in _metrics.named_metrics(ms)]
        return out

    def _ts(self) -> dict:
        return _state._timestamp_dict(self.timestamp)

    def _location(self, path: str) -> str:
        """The location of a checkpoint the C manager named (its URL for a remote run directory)."""
        return f"{self._url}/{path.rsplit('/', 1)[-1]}" if self._url else path

    def _warn_save_failed(self, e: BaseException) -> None:
        """on_save_error="warn": the failure is counted and reported; training goes on."""
        self.save_errors += 1
        print(f"keepsake: warning: checkpoint save failed, training goes on: {e}", file=sys.stderr)

    # ---- the context-manager protocol ----

    def __enter__(self) -> "ManagerBase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- what every manager does ----

    @property
    @abc.abstractmethod
    def run_dir(self) -> str:
        """The run directory or remote location."""

    @abc.abstractmethod
    def save(self, blocking: bool = True) -> str:
        """Saves a checkpoint now; returns its path. ``blocking=False`` saves in the background."""

    @abc.abstractmethod
    def reserve(self) -> None:
        """Prepares background saves of the state as it is now."""

    @abc.abstractmethod
    def step(self, epoch_end: bool = False) -> Optional[str]:
        """Call at each batch end (and with ``epoch_end=True`` at each epoch end): saves when a
        trigger says so, or after a preemption signal (then raises :class:`Preempted`)."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Waits for a background save; raises its error."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finishes a save in flight (raising its error), then releases the run directory."""

    @abc.abstractmethod
    def autoresume(self, **load_kw: Any) -> bool:
        """Fills the components from the newest checkpoint that verifies; False when there is none."""

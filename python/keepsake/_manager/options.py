"""What a checkpoint manager saves, and its policy: two objects, each field declared once.

:class:`CheckpointOptions` is the policy (when to save, what to keep, how to write), as Orbax's
``CheckpointManagerOptions`` is: one value, shared by the local and the distributed manager, which
a program can build once and pass around. :class:`Components` are the program's objects the
manager saves and fills back. ``CheckpointManager(run_dir, model=..., save_every=...)`` takes the
fields of both as keywords (:func:`from_keywords` sorts them); ``options=CheckpointOptions(...)``
gives the policy as one value instead.
"""
from __future__ import annotations

import dataclasses
import signal as _signal
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from .._core.paths import PathLike
from .._core.report import Timestamp


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """The policy of a :class:`keepsake.CheckpointManager`: when it saves, what it keeps, how it writes.

    Every rule is the C library's (``ks_ckpt_opts``); these are its settings. Frozen: derive
    another with ``dataclasses.replace(options, keep_last=3)``.

    Attributes:
        save_every: ``"50ba"`` (every 50 batches), ``"1ep"``, or an int (batches: ``50`` is
            ``"50ba"``); None saves only when asked (``save()``) or on preemption.
            :meth:`~keepsake.CheckpointManager.step` counts on the timestamp advancing: the
            library warns (once, on stderr) when 3 batch ends (or epoch ends) in a row see the
            same one, since no interval would ever come due.
        save_every_seconds: a clock besides the interval (0: none).
        filename: the name template (``{epoch}``, ``{batch}``, ``{sample}``); None: the library's.
        keep_last: keep the N newest (0 keeps all).
        keep_best, best_metric, best_mode: keep the N best by the value stored in each checkpoint
            (``best_metric``: ``"train_metrics/acc"``, ``"eval_metrics/val/acc"``, ``"eval/acc"``;
            ``best_mode``: ``"max"`` or ``"min"``). A ``best_metric`` that names none of the
            manager's ``train_metrics`` / ``eval_metrics`` is refused (InvalidError, naming them);
            a save whose metric was never computed (so it cannot rank) is warned about once.
        keep_every: also keep every N-th (``"5ep"``); ``keep_period_seconds``: one per period.
            The retention policies combine.
        async_save: ``step()`` saves in the background (``save(blocking=False)``).
        when_busy: a background save asked for while one is still in flight: ``"wait"`` for it
            (at most one is ever in flight) or ``"fail"`` (StateError, nothing saved).
        on_save_error: ``"raise"`` (stop) or ``"warn"``: a failed save from ``step()`` is
            reported on stderr and counted (``save_errors``); the next trigger tries again.
        preemption_signals: signals that ask for a save at the next ``step()``, which then
            raises :class:`keepsake.Preempted` (``()`` installs none). Only signals received
            while the manager is open count; a handler the program installed before still runs
            (chained), and ``close()`` puts it back (or the default: SIGTERM ends the process again).
        lock: ``"auto"`` (lock the run directory where the storage can), ``"require"``, ``"off"``.
        upload_to: save locally, then upload each checkpoint there (``s3://...``); with
            ``upload_retention`` the retention policies delete uploaded copies too (by default
            they are never deleted). Not for a distributed manager.
        retention_log: after each save the library prints (stdout) one line per checkpoint:
            kept (and why) or deleted.
        cache_dir: a local directory for the C library's read cache over a remote run directory
            and ``upload_to`` (``<cache_dir>/run``, ``<cache_dir>/upload``): bytes read once, by
            autoresume's verification or an upload-mode download, are not read from the server
            again; autoresume's load of a remote checkpoint reads through the same cache. Not for
            a distributed manager.
    """

    save_every: Union[str, int, None] = None
    save_every_seconds: float = 0.0
    filename: Optional[str] = None
    keep_last: int = 0
    keep_best: int = 0
    best_metric: Optional[str] = None
    best_mode: str = "max"
    keep_every: Optional[str] = None
    keep_period_seconds: float = 0.0
    async_save: bool = False
    when_busy: str = "wait"
    on_save_error: str = "raise"
    preemption_signals: Sequence[int] = (_signal.SIGTERM, _signal.SIGUSR1)
    lock: str = "auto"
    upload_to: Optional[PathLike] = None
    upload_retention: bool = False
    retention_log: bool = False
    cache_dir: Optional[PathLike] = None

    def __post_init__(self) -> None:
        # What the manager does with a failed save is Python's (the library reports the failure).
        if self.on_save_error not in ("raise", "warn"):
            raise ValueError("on_save_error: 'raise' or 'warn'")


@dataclasses.dataclass
class Components:
    """What a checkpoint manager saves and fills back, as :func:`keepsake.torch.save_checkpoint`
    takes it: ``model``, ``optimizers``, ``schedulers``, ``train_metrics``, ``eval_metrics``,
    ``timestamp`` (a :class:`keepsake.Timestamp`: it names the files and drives the triggers; None:
    a new one), ``dataset_state``, ``callbacks``, ``extra`` (a dict), ``rng`` (save and restore
    the generators), ``run_name`` and ``rank_zero_seed`` (the run's identity)."""

    model: Any = None
    optimizers: Any = None
    schedulers: Any = None
    train_metrics: Any = None
    eval_metrics: Any = None
    timestamp: Optional[Timestamp] = None
    dataset_state: Any = None
    callbacks: Any = None
    extra: Optional[Mapping[str, Any]] = None
    rng: bool = True
    run_name: str = ""
    rank_zero_seed: int = 0


#: The components that are the program's objects (the manager's ``components`` dict).
OBJECTS = ("model", "optimizers", "schedulers", "train_metrics", "eval_metrics", "dataset_state", "callbacks")
COMPONENT_FIELDS = tuple(f.name for f in dataclasses.fields(Components))
POLICY_FIELDS = tuple(f.name for f in dataclasses.fields(CheckpointOptions))


def from_keywords(owner: str, options: Optional[CheckpointOptions],
                  keywords: Dict[str, Any]) -> Tuple[Components, CheckpointOptions]:
    """Sorts a manager's keywords into its components and its policy: the policy comes from
    ``options`` or from the keywords named as its fields, never from both. Unknown keywords raise
    TypeError, as a signature would."""
    for k in keywords:
        if k not in COMPONENT_FIELDS and k not in POLICY_FIELDS:
            raise TypeError(f"{owner}() got an unexpected keyword argument {k!r}")
    policy = {k: v for k, v in keywords.items() if k in POLICY_FIELDS}
    if options is None:
        options = CheckpointOptions(**policy)
    elif not isinstance(options, CheckpointOptions):
        raise TypeError(f"{owner}(): options is a keepsake.CheckpointOptions, not a {type(options).__name__}")
    elif policy:
        raise TypeError(f"{owner}(): the policy is options= or keywords, not both ({', '.join(policy)} "
                        "given beside options=; use dataclasses.replace(options, ...))")
    parts = Components(**{k: v for k, v in keywords.items() if k in COMPONENT_FIELDS})
    return parts, options

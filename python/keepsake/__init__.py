"""keepsake: pickle-free, checksummed, atomic checkpoints for PyTorch, torchmetrics and Lightning.

The C library does the work (format, checksums, atomic durable writes, the non-executing torch
reader, the metric catalogue); this package is a thin layer over it:

* tensor files with safetensors' API: :func:`keepsake.torch.save_file` / :func:`load_file`,
  :func:`keepsake.numpy.save_file` / :func:`load_file`, :class:`safe_open`, ``save`` / ``load``;
* the whole training state: :func:`keepsake.torch.save_checkpoint` / :func:`load_checkpoint`,
  with any torchmetrics metric, the RNGs and a :class:`LoadReport`;
* torch.save / Composer files without unpickling: :func:`keepsake.torch.load_pt`, :func:`convert`;
* a training run's checkpoints: :class:`CheckpointManager`, its policy a :class:`CheckpointOptions`;
* Lightning: :class:`keepsake.lightning.KeepsakeCheckpointIO`.

Errors are :class:`KeepsakeError` subclasses carrying the file, key, byte offset and message.

The package's folders are its layers, each importing only the ones before it (docs/DESIGN.md,
"The Python package"; tests/arch/py_imports.py checks it): ``_core`` (errors, paths, the
extension's API, reports, dtypes, the value tree), ``_files`` (tensor files), ``_state`` (a
training run's state), ``_manager`` (the checkpoint manager), ``_distributed`` (torch.distributed)
and ``_integrations`` (Lightning); the public modules (this one, ``keepsake.torch``, ``.numpy``,
``.lightning``, ``.distributed``, ``.distributed_import``) gather what users import.
"""
from __future__ import annotations

# The distribution's name on the package index, whose `keepsake` is another project: _collision
# refuses to run beside that one's files (it checks this name to know the __init__ is this one).
__distribution__ = "keepsake-ckpt"

import dataclasses as _dataclasses  # noqa: E402
import inspect as _inspect  # noqa: E402
from typing import Any as _Any  # noqa: E402

from . import _collision  # noqa: E402

try:
    from . import _keepsake as _native
except ImportError as e:
    raise ImportError("keepsake: " + _collision.missing_extension(e)) from e
from ._core import errors as _errors  # noqa: E402
from ._core.errors import (ChecksumError, DTypeError, ExistsError, FileNotFoundError_, FormatError, InvalidError,
                           IOError_, KeepsakeError, LimitError, LockedError, MismatchError, NetError, NoMemoryError,
                           NotDurableError, NotFoundError, ShapeError, StateError, UnsafeError, UnsupportedError,
                           ValueError_, VersionError)
from ._core.paths import PathLike, fspath  # noqa: F401 - names the package has always had
from ._core.report import LoadItem, LoadReport, Timestamp
from ._files.safe_open import TensorSlice, safe_open
from ._files.tools import compute_metrics, convert, metric_catalogue, verify
from ._manager.base import EXIT_PREEMPTED, ManagerBase as _ManagerBase, Preempted
from ._manager.early import EarlyStopping
from ._manager.local import LocalCheckpointManager as _Local
from ._manager.options import CheckpointOptions, Components as _Components
from ._distributed.manager import DistributedCheckpointManager as _Distributed

_errors._install(_native)

__version__: str = _native.version
FORMAT_VERSION: int = _native.format_version

__all__ = [
    "KeepsakeError", "NoMemoryError", "IOError_", "FileNotFoundError_", "FormatError", "LimitError", "InvalidError",
    "NotFoundError", "DTypeError", "ShapeError", "ChecksumError", "VersionError", "MismatchError", "UnsupportedError",
    "ExistsError", "StateError", "ValueError_", "UnsafeError", "NetError", "NotDurableError", "LockedError",
    "safe_open", "TensorSlice", "LoadReport", "LoadItem", "Timestamp",
    "CheckpointManager", "CheckpointOptions", "Preempted", "EXIT_PREEMPTED", "EarlyStopping",
    "convert", "verify", "compute_metrics", "metric_catalogue", "__version__", "FORMAT_VERSION",
]


class CheckpointManager(_ManagerBase):
    """Saves a training run's checkpoints into a run directory and resumes from them.

    ::

        options = keepsake.CheckpointOptions(save_every="1ep", keep_last=3, async_save=True)
        with keepsake.CheckpointManager("runs/x", model=model, optimizers=opt, timestamp=ts,
                                        options=options) as mgr:
            mgr.autoresume()
            ...
            mgr.step()

    Args:
        run_dir: a directory, or an ``s3://bucket/prefix`` location (when the package has libcurl).
        model, optimizers, schedulers, train_metrics, eval_metrics, timestamp, dataset_state,
            callbacks, extra, rng, run_name, rank_zero_seed: the components, as
            :func:`keepsake.torch.save_checkpoint` takes them. ``timestamp`` (a
            :class:`keepsake.Timestamp`) names the files and drives the triggers.
        options: the policy, a :class:`keepsake.CheckpointOptions` (when to save, what to keep,
            how to write). Its fields are also taken as keywords (``save_every="1ep"``,
            ``keep_last=3``, ...), as before options existed; one or the other, not both.
        distributed: True in a torch.distributed run: every rank constructs the manager, which
            saves sharded checkpoint directories with DCP (docs/PYTHON.md, "torch.distributed"),
            and takes ``process_group`` and ``sync_files`` besides.
        staging: (one process) the :class:`keepsake.torch.HostStaging` that CUDA tensors are
            copied into at each save (a page-locked host buffer the manager reuses from save to
            save and frees on :meth:`close`); None: one of its own, allocated at the first save
            with CUDA tensors. An ``exclusive`` staging (the manager's own is) is the background
            save's snapshot itself: the tensors are copied once, from the device into the file's image.

    This class chooses: what it returns is a ``LocalCheckpointManager`` (keepsake._manager.local) or,
    with ``distributed=True``, a ``DistributedCheckpointManager`` (keepsake._distributed.manager),
    and ``isinstance(mgr, keepsake.CheckpointManager)`` holds for both. Their methods: ``save``,
    ``step``, ``reserve``, ``wait``, ``close``, ``autoresume`` and ``run_dir`` (keepsake._manager.base).
    """

    def __new__(cls, run_dir: _Any, *, distributed: bool = False, **keywords: _Any) -> "CheckpointManager":
        manager = (_Distributed if distributed else _Local)(run_dir, **keywords)
        return manager  # type: ignore[return-value] - registered below: an instance for isinstance()


CheckpointManager.register(_Local)
CheckpointManager.register(_Distributed)


def _signature() -> _inspect.Signature:
    """CheckpointManager's parameters, from where each is declared: the components' and the
    options' dataclasses, and each manager's own keywords (staging; process_group, sync_files)."""
    P = _inspect.Parameter

    def fields(cls: type) -> list:
        return [P(f.name, P.KEYWORD_ONLY, default=f.default) for f in _dataclasses.fields(cls)]

    def own(cls: type) -> list:
        return [p.replace(annotation=P.empty) for p in _inspect.signature(cls.__init__).parameters.values()
                if p.kind is P.KEYWORD_ONLY]

    return _inspect.Signature([P("run_dir", P.POSITIONAL_OR_KEYWORD), *fields(_Components),
                               P("options", P.KEYWORD_ONLY, default=None), *fields(CheckpointOptions),
                               P("distributed", P.KEYWORD_ONLY, default=False), *own(_Local), *own(_Distributed)])


CheckpointManager.__signature__ = _signature()  # type: ignore[attr-defined]

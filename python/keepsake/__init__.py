"""keepsake: pickle-free, checksummed, atomic checkpoints for PyTorch, torchmetrics and Lightning.

The C library does the work (format, checksums, atomic durable writes, the non-executing torch
reader, the metric catalogue); this package is a thin layer over it:

* tensor files with safetensors' API: :func:`keepsake.torch.save_file` / :func:`load_file`,
  :func:`keepsake.numpy.save_file` / :func:`load_file`, :class:`safe_open`, ``save`` / ``load``;
* the whole training state: :func:`keepsake.torch.save_checkpoint` / :func:`load_checkpoint`,
  with any torchmetrics metric, the RNGs and a :class:`LoadReport`;
* torch.save / Composer files without unpickling: :func:`keepsake.torch.load_pt`, :func:`convert`;
* Lightning: :class:`keepsake.lightning.KeepsakeCheckpointIO`.

Errors are :class:`KeepsakeError` subclasses carrying the file, key, byte offset and message.
"""
from __future__ import annotations

# The distribution's name on the package index, whose `keepsake` is another project: _collision
# refuses to run beside that one's files (it checks this name to know the __init__ is this one).
__distribution__ = "keepsake-ckpt"

from typing import Any, Dict, Iterable, Tuple  # noqa: E402

from . import _collision  # noqa: E402
from . import _errors  # noqa: E402

try:
    from . import _keepsake as _native
except ImportError as e:
    raise ImportError("keepsake: " + _collision.missing_extension(e)) from e
from ._errors import (ChecksumError, DTypeError, ExistsError, FileNotFoundError_, FormatError, InvalidError, IOError_,
                      KeepsakeError, LimitError, LockedError, MismatchError, NetError, NoMemoryError, NotDurableError,
                      NotFoundError, ShapeError, StateError, UnsafeError, UnsupportedError, ValueError_, VersionError)
from ._paths import PathLike, fspath
from ._report import LoadItem, LoadReport, Timestamp
from ._safe_open import TensorSlice, safe_open
from ._manager import EXIT_PREEMPTED, CheckpointManager, Preempted
from ._early import EarlyStopping

_errors._install(_native)

__version__: str = _native.version
FORMAT_VERSION: int = _native.format_version

__all__ = [
    "KeepsakeError", "NoMemoryError", "IOError_", "FileNotFoundError_", "FormatError", "LimitError", "InvalidError", "NotFoundError",
    "DTypeError", "ShapeError", "ChecksumError", "VersionError", "MismatchError", "UnsupportedError",
    "ExistsError", "StateError", "ValueError_", "UnsafeError", "NetError", "NotDurableError", "LockedError",
    "safe_open", "TensorSlice", "LoadReport", "LoadItem", "Timestamp",
    "CheckpointManager", "Preempted", "EXIT_PREEMPTED", "EarlyStopping",
    "convert", "verify", "compute_metrics", "metric_catalogue", "__version__", "FORMAT_VERSION",
]


def convert(src: PathLike, dst: PathLike,
            ignore: Iterable[str] = (), salvage: bool = False, torch_compat: bool = False) -> Tuple[int, int]:
    """Converts a checkpoint, exactly as ``keepsake convert SRC DST [--ignore GLOB]...`` does.

    A zip input is a torch.save / Composer file, read without executing anything; anything else is
    a keepsake or safetensors file. ``dst`` ending in ``.pt``/``.pth`` gets a torch.save-compatible
    file that ``torch.load(dst, weights_only=True)`` accepts; any other name a keepsake file, with
    Composer metrics mapped onto keepsake's layout. Globs (``*``, ``?``, '/'-prefix aware) leave
    entries out. The input's integrity is checked first (zip CRC32s, keepsake checksums): a
    corrupt input raises ChecksumError and nothing is written, unless ``salvage=True`` (each
    problem converted despite is issued as a ``RuntimeWarning``). ``dst`` is replaced only when it
    is absent or a writable regular file. A ``.pt`` output gets the lists, tuples and typed keys
    the torch input recorded (``keepsake.torch_structure``), and torchmetrics list ("cat") states
    as lists, so ``metric.load_state_dict`` and the next ``update()`` work;
    ``torch_compat=True`` writes what torch 1.13's ``torch.load(weights_only=True)`` reads.
    The conversion is the C library's ``ks_convert``, the same call the CLI makes.

    Returns:
        (entries written, entries ignored).
    Raises:
        KeepsakeError: the input could not be read or ``dst`` not written (``dst`` is then unchanged).
    """
    return _native.convert(fspath(src), fspath(dst), list(ignore), salvage, torch_compat)


def verify(path: PathLike) -> None:
    """Checks a keepsake file's structure and every checksum, as ``keepsake verify``.

    Raises:
        FormatError, ChecksumError, VersionError, ...: the first problem found.
    """
    _native.Reader(fspath(path), verify=True, backend="read")


def compute_metrics(path: PathLike) -> Dict[str, Dict[str, Any]]:
    """Rebuilds and computes, with the C library alone, every metric a checkpoint records.

    Each metric the ``keepsake.metrics`` metadata gives a catalogue class and arguments for is
    built in C, filled by ``ks_state_load`` (the C load semantics) and computed. This shows what a
    C program loading the file sees.

    Returns:
        ``{metric path: {"class", "value" (a torch tensor, or None), "update_count", "error"}}``
        plus the C load report under the key ``"__report__"`` as a list of (kind, path, reason).
    """
    res = _native.compute_metrics(fspath(path))
    out: Dict[str, Any] = {}
    from ._tensors import torch_from_copy
    for p, m in res["metrics"].items():
        m = dict(m)
        m["value"] = torch_from_copy(m["value"]) if m["value"] is not None else None
        out[p] = m
    out["__report__"] = res["report"]
    return out


def metric_catalogue() -> list:
    """The metric classes the C library implements (and can rebuild from a file)."""
    return _native.catalogue()

"""The command-line tool's file operations as functions: convert, verify, compute_metrics.

Each is one call of the C library (``ks_convert``, a verifying read, ``ks_state_load`` of the
catalogue metrics), the same the ``keepsake`` CLI makes; the package exports them as
``keepsake.convert``, ``keepsake.verify``, ``keepsake.compute_metrics`` and
``keepsake.metric_catalogue``.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Tuple

from .._core import native as _n, tensors as _tensors
from .._core.paths import PathLike, fspath


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
    return _n.convert(fspath(src), fspath(dst), list(ignore), salvage, torch_compat)


def verify(path: PathLike) -> None:
    """Checks a keepsake file's structure and every checksum, as ``keepsake verify``.

    Raises:
        FormatError, ChecksumError, VersionError, ...: the first problem found.
    """
    _n.Reader(fspath(path), verify=True, backend="read")


def compute_metrics(path: PathLike) -> Dict[str, Dict[str, Any]]:
    """Rebuilds and computes, with the C library alone, every metric a checkpoint records.

    Each metric the ``keepsake.metrics`` metadata gives a catalogue class and arguments for is
    built in C, filled by ``ks_state_load`` (the C load semantics) and computed. This shows what a
    C program loading the file sees.

    Returns:
        ``{metric path: {"class", "value" (a torch tensor, or None), "update_count", "error"}}``
        plus the C load report under the key ``"__report__"`` as a list of (kind, path, reason).
    """
    res = _n.compute_metrics(fspath(path))
    out: Dict[str, Any] = {}
    for p, m in res["metrics"].items():
        m = dict(m)
        m["value"] = _tensors.torch_from_copy(m["value"]) if m["value"] is not None else None
        out[p] = m
    out["__report__"] = res["report"]
    return out


def metric_catalogue() -> list:
    """The metric classes the C library implements (and can rebuild from a file)."""
    return _n.catalogue()

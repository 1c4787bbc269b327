"""Tensor files from numpy with safetensors.numpy's API: save_file, load_file, save, load.

The bodies behind :mod:`keepsake.numpy`'s functions of the same names.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from .._core import tensors as _tensors
from .._core.native import Reader, save_bytes, save_file as _save_file
from .._core.paths import PathLike, fspath


def _entries(tensors: Dict[str, Any]) -> tuple:
    keep: list = []
    entries = [_tensors.numpy_entry(k, v, keep) for k, v in tensors.items()]
    return entries, keep


def save_file(tensor_dict: Dict[str, Any], filename: PathLike, metadata: Optional[Dict[str, str]] = None,
              *, fsync: bool = True) -> None:
    """Writes arrays to a keepsake file (a safetensors file with checksums), atomically and durably.

    Args:
        tensor_dict: name -> array; names are kept as given, in order.
        filename: destination; its directory must exist. Replaced only once the new file is complete.
        metadata: extra ``__metadata__`` str -> str pairs.
        fsync: False skips the two fsyncs (faster, not durable).
    Raises:
        KeepsakeError: InvalidError (bad name or metadata), DTypeError, IOError (the old file is then intact).
    """
    entries, keep = _entries(tensor_dict)
    _save_file(fspath(filename), entries, metadata, None, fsync)
    del keep


def load_file(filename: PathLike, *, verify: bool = False, backend: str = "mmap",
              cache_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """Reads every tensor of a keepsake or safetensors file as zero-copy arrays over the mapped file.

    The arrays are writable; writes go to private copies of the pages, never to the file.
    ``backend="read"`` copies the file into memory instead (no mapping: a file truncated by another
    program gives an error, never SIGBUS; see keepsake.torch.load_file). ``verify=True`` checks
    every checksum first. A remote file (``s3://``, ``http(s)://``) is read whole; ``cache_dir``
    keeps its bytes in that local directory, so that a second read reads nothing from the server.
    """
    reader = Reader(fspath(filename), verify=verify, backend=backend,
                    cache_dir=fspath(cache_dir) if cache_dir is not None else None)
    return {e[0]: _tensors.numpy_from(reader, *e[1:], e[0]) for e in reader.entries()}


def save(tensor_dict: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of the file :func:`save_file` would write."""
    entries, keep = _entries(tensor_dict)
    data = save_bytes(entries, metadata)
    del keep
    return data


def load(data: bytes) -> Dict[str, Any]:
    """Reads arrays from the bytes of a keepsake or safetensors file (one copy of the bytes is made)."""
    reader = Reader(data=data)
    return {e[0]: _tensors.numpy_from(reader, *e[1:], e[0]) for e in reader.entries()}

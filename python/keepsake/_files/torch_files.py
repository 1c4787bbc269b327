"""Tensor files from torch with safetensors.torch's API: save_file, load_file, save, load.

The bodies behind :mod:`keepsake.torch`'s functions of the same names; the C writer and reader do
the work, this module turns tensors into the writer's entries and the reader's bytes into views.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Union

from .._core import tensors as _tensors
from .._core.native import Reader, save_bytes, save_file as _save_file
from .._core.paths import PathLike, fspath


def _entries(tensors: Dict[str, Any]) -> tuple:
    import torch
    if not isinstance(tensors, dict):
        raise TypeError(f"expected a dict of name -> tensor, not a {type(tensors).__name__}")
    keep: list = []
    for k, v in tensors.items():  # what safetensors refuses, refused the same way, naming the key
        if not isinstance(k, str):
            raise TypeError(f"tensor names are str, not {type(k).__name__} ({k!r})")
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"'{k}' is a {type(v).__name__}, not a torch.Tensor (save_checkpoint stores any value)")
    entries = [_tensors.torch_entry(k, v, keep) for k, v in tensors.items()]
    return entries, keep


def save_file(tensors: Dict[str, Any], filename: PathLike, metadata: Optional[Dict[str, str]] = None,
              *, fsync: bool = True) -> None:
    """Writes tensors to a keepsake file (a safetensors file with checksums), atomically and durably.

    Args:
        tensors: name -> tensor (any device; non-contiguous tensors are made contiguous).
        filename: destination (str, bytes or os.PathLike, as ``os`` functions take); its directory must exist. The previous file is replaced only once
            the new one is complete and synced (temp file, fsync, rename, fsync of the directory).
        metadata: extra ``__metadata__`` str -> str pairs.
        fsync: False skips the two fsyncs (faster, not durable).
    Raises:
        KeepsakeError: InvalidError (bad name or metadata), DTypeError (complex128, float8_e8m0fnu...),
        IOError (the old file is then intact).
    """
    entries, keep = _entries(tensors)
    _save_file(fspath(filename), entries, metadata, None, fsync)
    del keep


def load_file(filename: PathLike, device: Union[str, int] = "cpu", *, verify: bool = False,
              backend: str = "mmap", cache_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """Reads every tensor of a keepsake or safetensors file.

    ``filename`` is a path (str, bytes or os.PathLike); the bytes of a file go to :func:`load`.
    ``backend="mmap"`` (the default, as safetensors'): on the CPU the tensors are zero-copy views of
    the file, mapped copy-on-write: writing to them never changes the file, and each tensor keeps
    the mapping alive. A mapping is only as stable as the file: if another program truncates or
    rewrites the file in place while the tensors are in use, touching them can kill the process
    with SIGBUS (keepsake's own writers replace files atomically and never do this).
    ``backend="read"`` (safetensors' ``"pread"``) reads the file into memory the tensors own, with
    no mapping: a file changed under it gives a KeepsakeError, never a signal.
    ``verify=True`` checks every checksum first (ChecksumError on a mismatch).
    A remote file (``s3://``, ``http(s)://``) is read whole into memory the tensors own;
    ``cache_dir`` keeps its bytes in that local directory (the C library's read cache), so that
    reading it again reads nothing from the server.
    """
    reader = Reader(fspath(filename), verify=verify, backend=backend,
                    cache_dir=fspath(cache_dir) if cache_dir is not None else None)
    view = _tensors.torch_from
    out = {e[0]: view(reader, e[1], e[2], e[3], e[4]) for e in reader.entries()}
    if device not in ("cpu", None):
        dev = f"cuda:{device}" if isinstance(device, int) else device
        out = {k: v.to(dev) for k, v in out.items()}
    return out


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of the file :func:`save_file` would write (the same writer, into memory)."""
    entries, keep = _entries(tensors)
    data = save_bytes(entries, metadata)
    del keep
    return data


def load(data: bytes) -> Dict[str, Any]:
    """Reads tensors from the bytes of a keepsake or safetensors file (the bytes are copied once)."""
    reader = Reader(data=data)
    return {e[0]: _tensors.torch_from(reader, e[1], e[2], e[3], e[4]) for e in reader.entries()}

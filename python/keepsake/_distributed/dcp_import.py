"""torch.distributed.checkpoint (DCP) directories into keepsake files, without executing their pickles.

::

    from keepsake.distributed_import import convert_dcp
    convert_dcp("ckpt/step_1000", "step_1000.keepsake")   # a directory written by dcp.save
    tensors = keepsake.torch.load_file("step_1000.keepsake")

The conversion is the C library's (``ks_convert``, the same call as ``keepsake convert DIR OUT``);
nothing here reads the checkpoint. See docs/FORMAT.md, "Importing torch DCP checkpoints", for what is
read and what is refused.
"""
from __future__ import annotations

from typing import Iterable, Tuple

from .. import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from .._core.paths import PathLike, fspath

__all__ = ["convert_dcp"]


def convert_dcp(src: PathLike, dst: PathLike, ignore: Iterable[str] = (), salvage: bool = False,
                torch_compat: bool = False) -> Tuple[int, int]:
    """Converts a DCP checkpoint directory into one keepsake file (or a ``.pt`` file), as ``keepsake convert``.

    ``src`` is a directory holding ``.metadata`` and the ``__<rank>_<n>.distcp`` files that torch's
    ``FileSystemWriter`` wrote (any number of ranks; the default ``SerializationFormat.TORCH_SAVE``).
    Every tensor is assembled whole from its chunks, which must cover it exactly once. Non-tensor
    values that are plain data (None, bool, int, float, str, bytes and lists, tuples and dicts of
    them) become keepsake scalars; other objects are left out and listed in the output's
    ``keepsake.dcp_import`` metadata. Entries are named as a ``torch.save`` of the same state dict is:
    ``{"model": {"w": t}}`` gives ``model/w``. Nothing pickled is executed: a ``.metadata`` naming any
    global besides DCP's own classes, ``torch.Size``, dtypes and layouts is refused (UnsafeError).

    Args:
        src: the DCP directory (a path, or a storage location as ``keepsake convert`` takes).
        dst: the output file; ``.pt``/``.pth`` gives a file ``torch.load(weights_only=True)`` reads.
        ignore: globs of entries to leave out, as ``keepsake.convert``.
        salvage: convert despite zip CRC mismatches (each is issued as a ``RuntimeWarning``).
        torch_compat: with a ``.pt`` output, what torch 1.13's ``weights_only`` loader reads.
    Returns:
        (entries written, entries ignored).
    Raises:
        KeepsakeError: UnsafeError (a hostile ``.metadata``), FormatError (malformed metadata, chunks
        that do not tile a tensor, a truncated ``.distcp``), UnsupportedError (the SAFETENSORS
        serialization format, transform extensions), IOError_ (a missing file); ``dst`` is then unchanged.
    """
    from .._files.tools import convert

    return convert(fspath(src), fspath(dst), ignore=ignore, salvage=salvage, torch_compat=torch_compat)

"""Checkpoint directories into keepsake files, and keepsake checkpoints into Hugging Face's layout, without
executing any pickle.

::

    from keepsake.distributed_import import convert_dcp
    convert_dcp("ckpt/step_1000", "step_1000.keepsake")   # a directory written by dcp.save
    tensors = keepsake.torch.load_file("step_1000.keepsake")
    convert_dcp("ckpt/step_1000", "hf/step_1000", hf=True)  # what HuggingFaceStorageReader reads

The conversion is the C library's (``ks_convert``, the same call as ``keepsake convert DIR OUT``);
nothing here reads the checkpoint. See docs/FORMAT.md, "Importing torch DCP checkpoints", for what is
read and what is refused.
"""
from __future__ import annotations

from typing import Iterable, Tuple

from .. import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from .._core import native as _n
from .._core.paths import PathLike, fspath

__all__ = ["convert_dcp"]


def convert_dcp(src: PathLike, dst: PathLike, ignore: Iterable[str] = (), salvage: bool = False,
                torch_compat: bool = False, hf: bool = False, hf_shard_bytes: int = 0) -> Tuple[int, int]:
    """Converts a checkpoint directory into one keepsake file (or a ``.pt`` file, or a Hugging Face layout),
    as ``keepsake convert``.

    ``src`` is a directory holding one of:

    - ``.metadata`` and the ``__<rank>_<n>.distcp`` files that torch's ``FileSystemWriter`` wrote (any
      number of ranks; the default ``SerializationFormat.TORCH_SAVE``);
    - a checkpoint :class:`keepsake.distributed.KeepsakeWriter` wrote (every file verified against its
      index and checksums first);
    - a Hugging Face safetensors layout: ``model.safetensors.index.json`` and the files its ``weight_map``
      names, or ``*.safetensors`` files (what torch's ``HuggingFaceStorageWriter`` writes, chunks of one
      tensor in several files put together by their ``DCP_SHARDING_INFO`` offsets).

    Every tensor is assembled whole from its chunks, which must cover it exactly once. Non-tensor values
    that are plain data (None, bool, int, float, str, bytes and lists, tuples and dicts of them) become
    keepsake scalars; other objects are left out and listed in the output's import record (the metadata
    key ``KS_META_DCP_IMPORT`` of include/keepsake/layout.h). Entries of both kinds of DCP checkpoint
    are named alike, as a ``torch.save`` of the same state dict is: ``{"model": {"w": t}}`` gives
    ``model/w`` (DCP's key ``model.w`` has that path in planner_data). Nothing pickled is executed:
    a ``.metadata`` naming any global besides DCP's own classes, ``torch.Size``, dtypes and layouts
    is refused (UnsafeError).

    Args:
        src: the directory (a path, or a storage location as ``keepsake convert`` takes).
        dst: the output file; ``.pt``/``.pth`` gives a file ``torch.load(weights_only=True)`` reads.
            With ``hf=True``, a directory (absent or empty) that gets the Hugging Face layout torch's
            ``HuggingFaceStorageReader`` and transformers' ``from_pretrained`` read: ``model.safetensors``,
            or ``model-0000i-of-0000N.safetensors`` and ``model.safetensors.index.json``; tensors whole
            under DCP's names (``model.w``), each file a keepsake file (checksums kept in its header).
        ignore: globs of entries to leave out, as ``keepsake.convert``.
        salvage: convert despite zip CRC mismatches (each is issued as a ``RuntimeWarning``).
        torch_compat: with a ``.pt`` output, what torch 1.13's ``weights_only`` loader reads.
        hf: write the Hugging Face layout into the directory ``dst``.
        hf_shard_bytes: with ``hf``, the most tensor bytes per file (0: 5 GB, as transformers).
    Returns:
        (entries written, entries ignored).
    Raises:
        KeepsakeError: UnsafeError (a hostile ``.metadata``), FormatError (malformed metadata, chunks
        that do not tile a tensor, a truncated file), ChecksumError (a keepsake checksum or zip CRC-32
        that does not match), UnsupportedError (a directory holding none of the above, the SAFETENSORS
        serialization format of ``FileSystemWriter``, transform extensions), ExistsError (``hf`` into a
        directory that is not empty); ``dst`` is then unchanged.
    """
    return _n.convert(fspath(src), fspath(dst), list(ignore), salvage, torch_compat, hf, hf_shard_bytes)

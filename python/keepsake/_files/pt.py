"""torch.save files: read without executing anything, written so weights_only=True accepts them."""
from __future__ import annotations

import os
from typing import Any, Dict, Union

from .._core import native as _n
from .._core import tensors as _tensors, tree as _tree
from .._core.paths import PathLike, fspath


def load_pt(source: Union[PathLike, bytes], *, verify_crc: bool = False, flat: bool = False) -> Any:
    """Reads a ``torch.save`` or Composer checkpoint with keepsake's non-executing unpickler.

    Nothing named by the pickle is imported or called: known constructors (tensors, storages,
    OrderedDict, numpy RNG arrays, sets...) are interpreted and every other object becomes inert,
    flattened to its attributes plus ``__class__`` = ``"module.Name"``. So this loads what
    ``torch.load(weights_only=True)`` refuses (Composer files with pickled torchmetrics objects),
    and a malicious file's payload never runs.

    Args:
        source: a path (str or os.PathLike), or the file's bytes (bytes, bytearray, memoryview):
            unlike the other functions, which take bytes as a path, this one keeps its documented
            meaning of bytes as contents, as ``torch.load`` of an in-memory file.
        verify_crc: check the CRC32 of every zip entry read.
        flat: return the flat ``{'/'-joined path: value}`` dict instead of nested containers.
    Returns:
        The saved value rebuilt from the reader's structure document: dicts (with their int,
        bool, None and float keys), lists, tuples, sets, numbers, strings, None and CPU torch
        tensors.
    Raises:
        KeepsakeError: FormatError (not a zip / bad pickle), UnsupportedError, LimitError, ...
    """
    src = source if isinstance(source, (bytes, bytearray, memoryview)) else fspath(source)
    items: Dict[str, Any] = {}
    entries, structure = _n.torch_load(src, verify_crc)
    for name, value in entries:
        items[name] = _tensors.torch_from_copy(value) if isinstance(value, tuple) else value
    if flat:
        return items
    if "" in items:  # a bare value named by the empty path
        return items.get("value", items[""])
    return _tree.unflatten(items, _tree.structure_kinds(structure))  # torch.save(tensor): the entry "value"


def save_pt(obj: Dict[str, Any], path: PathLike, *, fsync: bool = True) -> None:
    """Writes nested dicts of tensors and scalars as a ``torch.save`` file, atomically and durably.

    ``torch.load(path, weights_only=True)`` accepts the result (torch >= 1.13). Lists and tuples
    are written as dicts keyed by index; floats become 0-d float64 tensors; U16/U32 tensors are
    widened and float8 tensors refused (DTypeError), as the C writer documents.
    """
    fl = _tree.Flattener(_tensors.torch_entry)
    for k, v in obj.items():
        fl.add(str(k), v)
    _n.torch_save(fspath(path), fl.entries, fsync)

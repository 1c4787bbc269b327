"""save_model / load_model: a module's state dict with shared tensors stored once, as
safetensors' functions of the same names do, so files move between the two unchanged.

Tied weights (an embedding and an output layer holding one tensor) appear in ``state_dict()``
under several names over one storage. A file holds each storage once, under one name; loading
fills the others through the module itself, since they are the same tensor.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from .._core.paths import PathLike


def _shared_groups(sd: Dict[str, Any]) -> List[List[str]]:
    """Names whose tensors share one storage (on one device), groups of two or more, sorted."""
    import torch
    by_storage: Dict[Tuple[int, str], List[str]] = {}
    for name, t in sd.items():
        if t.device == torch.device("meta"):
            continue
        by_storage.setdefault((t.untyped_storage().data_ptr(), str(t.device)), []).append(name)
    return sorted(sorted(g) for g in by_storage.values() if len(g) > 1)


def _covers_storage(t: Any) -> bool:
    s = t.untyped_storage()
    return t.data_ptr() == s.data_ptr() and t.nelement() * t.element_size() == s.nbytes()


def duplicate_names(sd: Dict[str, Any], preferred: Iterable[str] = ()) -> Dict[str, List[str]]:
    """For each group of names sharing a storage: the name kept -> the names left out.

    The name kept covers the whole storage (a view of part of it cannot stand for the rest); among
    those, one of `preferred` (the names a file holds) wins, else the first in sorted order.
    """
    preferred_set: Set[str] = set(preferred)
    out: Dict[str, List[str]] = {}
    for group in _shared_groups(sd):
        whole = [n for n in group if _covers_storage(sd[n])]
        if not whole:
            raise ValueError(f"tensors {group} share memory and none of them covers all of it; "
                             "save a copy of the one you need (clone()) instead")
        keep = next((n for n in whole if n in preferred_set), whole[0])
        out[keep] = [n for n in group if n != keep]
    return out


def save_model(model: Any, filename: PathLike, metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = False, *, fsync: bool = True) -> None:
    """Saves ``model.state_dict()`` with each shared storage once (safetensors' ``save_model``).

    Args:
        force_contiguous: save non-contiguous tensors as contiguous copies (keepsake always writes
            them contiguously; the flag is accepted for safetensors' signature).
    """
    from .torch_files import save_file
    sd = model.state_dict()
    for names in duplicate_names(sd).values():
        for n in names:
            del sd[n]
    if force_contiguous:
        sd = {k: v.contiguous() for k, v in sd.items()}
    save_file(sd, filename, metadata, fsync=fsync)


def load_model(model: Any, filename: PathLike, strict: bool = True,
               device: Union[str, int] = "cpu") -> Tuple[Set[str], List[str]]:
    """Fills a module from a file written by ``save_model`` (keepsake's or safetensors').

    Names left out because they share a storage with one the file holds are not missing.
    Returns (missing, unexpected); with ``strict`` (default) either being non-empty raises
    RuntimeError (the matching tensors are loaded by then, as safetensors' ``load_model`` does).
    """
    from .torch_files import load_file
    sd = load_file(filename, device=device, backend="read")
    dropped = duplicate_names(model.state_dict(), preferred=sd.keys())
    missing_list, unexpected = model.load_state_dict(sd, strict=False)
    missing, unexpected = set(missing_list), list(unexpected)
    for names in dropped.values():
        for n in names:
            if n in missing:
                missing.remove(n)
            else:
                unexpected.append(n)
    if strict and (missing or unexpected):
        raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}: missing keys "
                           f"{sorted(missing)}, unexpected keys {sorted(unexpected)}")
    return missing, unexpected

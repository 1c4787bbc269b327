"""Nested Python containers <-> keepsake's flat '/'-joined entries.

Flattening follows the library's key layout: each dict key names one component by the library's
rule (ks_key_text: str keys with '%' and '/' escaped, ints in decimal, True/False/None, floats as
%.17g), list, tuple and set items by index, tensors and scalars as leaves. What the names alone
cannot tell - that a node was a list, a tuple or a dict with int keys, an empty container, a numpy
array, bytes, a big int - the library records in the structure document (``keepsake.torch_structure``,
docs/FORMAT.md section 10) that every writer, C or Python, writes. Python walks its objects and
hands each container to ``_keepsake.Structure``, which names every dict key; what Python still does
itself is join the names with '/' and number sequence items in decimal (FORMAT.md section 10).

Reading is the library's: ks_structure_plan (include/keepsake/binding.h) reads the structure
document, or the ``keepsake.pytree`` table of files written by keepsake 0.1.0's Python package, and
the entry names, and says what every folder is and what every key is (typed, unescaped). Rebuilder
maps that plan onto Python objects. The one comparison left here is with the program's own object
(the template), for folders of files with neither record (old C files, converted ones): a list or
tuple there takes decimal names as items, a dict without int keys takes names as str keys, and an
OrderedDict stays one; where the template says nothing the library's default holds (int keys for
decimal names, str keys otherwise).
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import errors as _errors
from . import native as _n
from .._keepsake import Structure

PYTREE_KEY = "keepsake.pytree"
STRUCTURE_KEY = "keepsake.torch_structure"


def _is_tensor(v: Any) -> bool:
    t = type(v)
    return t.__module__.startswith("torch") and hasattr(v, "data_ptr") and hasattr(v, "is_contiguous")


def _is_ndarray(v: Any) -> bool:
    return type(v).__module__ == "numpy" and hasattr(v, "__array_interface__") and hasattr(v, "dtype")


class Flattener:
    """Collects entries for the C writer, and the structure document through the library."""

    def __init__(self, tensor_entry: Callable[[str, Any, list], tuple]) -> None:
        self.entries: List[tuple] = []
        self.keep: List[Any] = []
        self.structure = Structure()
        self._tensor_entry = tensor_entry

    def add(self, path: str, value: Any) -> None:
        """Adds `value` (a container or a leaf) under `path`."""
        if _is_tensor(value):
            self.entries.append(self._tensor_entry(path, value, self.keep))
        elif isinstance(value, bool) or value is None or isinstance(value, (float, str)):
            self.entries.append((path, value))
        elif isinstance(value, int):
            if -(1 << 63) <= value < (1 << 63):
                self.entries.append((path, int(value)))
            else:
                self.structure.leaf(path, "bigint")
                self.entries.append((path, str(value)))
        elif isinstance(value, dict):
            for seg, v in zip(self.structure.dict(path, list(value)), value.values()):
                self.add(f"{path}/{seg}" if path else seg, v)
        elif isinstance(value, (list, tuple)):
            self._seq(path, value, "tuple" if isinstance(value, tuple) else "list")
        elif isinstance(value, (set, frozenset)):
            self._seq(path, sorted(value, key=repr), "set")
        elif _is_ndarray(value):
            from .tensors import numpy_entry
            self.structure.leaf(path, "ndarray")
            self.entries.append(numpy_entry(path, value, self.keep))
        elif isinstance(value, (bytes, bytearray)):
            import numpy as np
            from .tensors import numpy_entry
            self.structure.leaf(path, "bytes")
            self.entries.append(numpy_entry(path, np.frombuffer(bytes(value), dtype=np.uint8), self.keep))
        elif hasattr(value, "item") and hasattr(value, "dtype") and type(value).__module__ == "numpy":
            self.add(path, value.item())  # numpy scalars
        else:
            raise _errors.error(_errors.UnsupportedError, f"cannot store a {type(value).__module__}."
                                f"{type(value).__qualname__} (tensors, numbers, strings, None, bytes and "
                                "dicts/lists/tuples of them are stored)", key=path)

    def _seq(self, path: str, seq: Any, kind: str) -> None:
        self.structure.seq(path, kind, len(seq))
        for i, v in enumerate(seq):
            self.add(f"{path}/{i}" if path else str(i), v)

    def sequence(self, path: str, kind: str, n: int) -> None:
        """Records that the folder at `path`, filled by add() calls of its own, is a `kind` of n items."""
        self.structure.seq(path, kind, n)

    def record(self, meta: Dict[str, str]) -> Dict[str, str]:
        """Sets the structure document in `meta` when there is anything to say; returns meta."""
        doc = self.structure.dump()
        if doc is not None:
            meta[STRUCTURE_KEY] = doc
        return meta


Records = Tuple[Optional[str], Optional[str]]
"""A file's records of its containers: (structure document, 0.1.0 ``keepsake.pytree`` table)."""

LEAF, LIST, TUPLE, SET, DICT, KEYED, GUESS, NONE = range(8)  # ks_plan_tag (include/keepsake/binding.h)


def load_kinds(meta: Dict[str, str]) -> Records:
    """The records the library reads a file's containers from: its structure document, else the
    ``keepsake.pytree`` table of files keepsake 0.1.0's Python package wrote."""
    if STRUCTURE_KEY in meta:
        return (meta[STRUCTURE_KEY] or "", None)
    return (None, meta.get(PYTREE_KEY))


def structure_kinds(structure: Optional[str]) -> Records:
    """The records of a value whose structure document is `structure` (None: an empty one)."""
    return (structure or "", None)


class Rebuilder:
    """Maps the library's plan (ks_structure_plan) onto Python objects.

    The library decides what every folder is and what every key is. The one comparison left here
    is with the program's own object (`template`), for folders no record describes (files with
    neither record, ks_plan_tag KS_PLAN_GUESS): a list or tuple there takes decimal names as its
    items, a dict without int keys takes the names as str keys, and an OrderedDict stays one."""

    def __init__(self, leaf: Optional[Callable[[str, Any, Optional[str]], Any]] = None) -> None:
        self._leaf = leaf or (lambda path, v, kind: v)

    def build(self, plan: tuple, template: Any = None) -> Any:
        tag = plan[0]
        if tag == LEAF:
            return self._leaf(plan[1], plan[2], plan[3])
        if tag in (LIST, TUPLE, SET):
            items = [self.build(c, _index(template, k)) for k, c in plan[1]]
            return items if tag == LIST else tuple(items) if tag == TUPLE else set(items)
        if tag == KEYED:
            return {k: self.build(c) for k, c in plan[1]}
        if tag == NONE:
            return None
        kids = plan[1]
        if tag == GUESS and isinstance(template, (list, tuple)) and all(c[3] is not None for c in kids):
            items = [self.build(c[1], _index(template, c[3])) for c in sorted(kids, key=lambda c: c[3])]
            return tuple(items) if isinstance(template, tuple) else items
        use_text = tag == GUESS and not (plan[2] and (template is None or _has_int_keys(template)))
        out: Dict[Any, Any] = {} if not isinstance(template, collections.OrderedDict) else collections.OrderedDict()
        sub = template if isinstance(template, dict) else None
        for c in kids:
            key = c[2] if use_text else c[0]
            out[key] = self.build(c[1], sub.get(key) if sub is not None else None)
        return out


def _has_int_keys(template: Any) -> bool:
    return isinstance(template, dict) and (not template or all(isinstance(k, int) for k in template))


def _index(template: Any, i: int) -> Any:
    return template[i] if isinstance(template, (list, tuple)) and i < len(template) else None


def unflatten(items: Dict[str, Any], kinds: Optional[Records] = None, prefix: str = "",
              template: Any = None, leaf: Optional[Callable[[str, Any, Optional[str]], Any]] = None) -> Any:
    """The object saved under `prefix` (which ends with '/' or is empty), as the library plans it."""
    document, table = kinds or (None, None)
    return Rebuilder(leaf).build(_n.structure_plan(document, table, items, prefix), template)


def entries_under(items: Dict[str, Any], prefix: str) -> bool:
    """Whether any entry lies under `prefix` (a folder path ending with '/') or is `prefix` itself."""
    root = prefix.rstrip("/")
    return any(k == root or k.startswith(prefix) for k in items)


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


def rebuild_or_raise(items: Dict[str, Any], kinds: Records, prefix: str, leaf: Any, path: str) -> Any:
    """unflatten, with a malformed container table reported as a FormatError."""
    try:
        return unflatten(items, kinds, prefix, leaf=leaf)
    except _errors.FormatError as e:
        raise _errors.error(_errors.FormatError, f"metadata '{PYTREE_KEY if kinds[0] is None else STRUCTURE_KEY}' "
                            f"does not describe the entries under '{prefix}': {e}", file=path,
                            key=PYTREE_KEY if kinds[0] is None else STRUCTURE_KEY) from e

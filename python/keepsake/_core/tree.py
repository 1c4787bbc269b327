"""Nested Python containers <-> keepsake's flat '/'-joined entries.

Flattening follows the library's key layout: each dict key names one component by the library's
rule (ks_key_text: str keys with '%' and '/' escaped, ints in decimal, True/False/None, floats as
%.17g), list, tuple and set items by index, tensors and scalars as leaves. What the names alone
cannot tell - that a node was a list, a tuple or a dict with int keys, an empty container, a numpy
array, bytes, a big int - the library records in the structure document (``keepsake.torch_structure``,
docs/FORMAT.md section 10) that every writer, C or Python, writes. Python walks its objects and
hands each container to ``_keepsake.Structure``; it keeps no naming rule of its own.

Reading takes the structure document, or the ``keepsake.pytree`` table of files written by
keepsake 0.1.0's Python package. Files with neither (old C files, converted ones) are rebuilt from a
template (the program's own object) and, where the template says nothing, as dicts with int keys
for decimal names and str keys otherwise.
"""
from __future__ import annotations

import collections
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import errors as _errors
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


class _Node(dict):
    """A folder of the name trie; `leaf` holds the value when a name ends here.

    Class-level defaults keep creating a node as cheap as creating a dict (one per folder of a
    100,000-entry checkpoint)."""
    has_leaf = False
    leaf: Any = None


def trie(items: Dict[str, Any], prefix: str = "") -> _Node:
    """The entries under `prefix` as a trie of '/' segments."""
    root = _Node()
    n = len(prefix)
    for name, value in items.items():
        if prefix and not name.startswith(prefix):
            continue
        node = root
        rest = name[n:]
        for seg in rest.split("/") if rest else []:
            child = node.get(seg)
            if child is None:
                child = node[seg] = _Node()
            node = child
        node.has_leaf, node.leaf = True, value
    return root


class Rebuilder:
    """Rebuilds objects from a trie, the container table and an optional template."""

    def __init__(self, kinds: Optional[Dict[str, Any]] = None,
                 leaf: Optional[Callable[[str, Any, Optional[str]], Any]] = None) -> None:
        self.kinds = kinds or {}
        self.unescape = bool(self.kinds.get("__unescape__"))
        self._leaf = leaf or (lambda path, v, kind: v)

    def build(self, node: _Node, path: str = "", template: Any = None) -> Any:
        kind = self.kinds.get(path)
        if node.has_leaf and not node:
            return self._leaf(path, node.leaf, kind if isinstance(kind, str) else None)
        if isinstance(kind, dict) and "keymap" in kind:  # the torch reader's typed keys, by name component
            keymap = kind["keymap"]
            return {keymap[seg] if seg in keymap else self._seg_key(seg): self.build(child, self._child(path, seg))
                    for seg, child in node.items()}
        if isinstance(kind, dict):
            keys = kind.get("keys", [])
            return {self._key(c, k): self.build(node[str(i)], self._child(path, str(i)))
                    for i, (c, k) in enumerate(keys) if str(i) in node}
        if kind in ("list", "tuple", "set") or (kind is None and isinstance(template, (list, tuple))
                                                and _all_digits(node)):
            items = [self.build(node[s], self._child(path, s), _index(template, int(s)))
                     for s in sorted(node, key=int)] if _all_digits(node) else []
            if kind == "tuple" or (kind is None and isinstance(template, tuple)):
                return tuple(items)
            return set(items) if kind == "set" else items
        if kind == "dict" and not node:
            return {}
        # A structure document lists every dict that has a key other than str: the others have
        # str keys. Without one (older files) decimal names are taken for int keys.
        int_keys = kind == "intdict" or (kind is None and not self.unescape and _all_digits(node) and node
                                         and (template is None or _has_int_keys(template)))
        out: Dict[Any, Any] = {} if not isinstance(template, collections.OrderedDict) else collections.OrderedDict()
        for seg, child in node.items():
            key: Any = int(seg) if int_keys else self._seg_key(seg)
            sub = template.get(key) if isinstance(template, dict) else None
            out[key] = self.build(child, self._child(path, seg), sub)
        return out

    def _seg_key(self, seg: str) -> str:
        """A str key from its name component ('%2F' and '%25' unescaped in torch reader names)."""
        return seg.replace("%2F", "/").replace("%25", "%") if self.unescape else seg

    @staticmethod
    def _child(path: str, seg: str) -> str:
        return f"{path}/{seg}" if path else seg

    @staticmethod
    def _key(code: str, k: Any) -> Any:
        return {"i": int, "f": float, "b": bool, "s": str}.get(code, lambda x: x)(k) if code != "n" else None


def _all_digits(node: _Node) -> bool:
    return all(s.isdigit() for s in node)


def _has_int_keys(template: Any) -> bool:
    return isinstance(template, dict) and (not template or all(isinstance(k, int) for k in template))


def _index(template: Any, i: int) -> Any:
    return template[i] if isinstance(template, (list, tuple)) and i < len(template) else None


def load_kinds(meta: Dict[str, str]) -> Dict[str, Any]:
    """The container table of a file: from its structure document, else from the ``keepsake.pytree``
    table of files keepsake 0.1.0's Python package wrote (empty when it has neither, or it is
    malformed)."""
    if STRUCTURE_KEY in meta:
        return structure_kinds(meta[STRUCTURE_KEY])
    try:
        kinds = json.loads(meta.get(PYTREE_KEY, "{}"))
    except ValueError:
        return {}
    return kinds if isinstance(kinds, dict) else {}


def structure_kinds(structure: Any) -> Dict[str, Any]:
    """The structure document (docs/FORMAT.md section 10) as the rebuilder's container table: names
    are escaped key texts, and a dict it does not list has str keys."""
    try:
        doc = json.loads(structure) if structure else {}
    except ValueError:
        return {}
    doc = doc if isinstance(doc, dict) else {}
    containers, leaves = doc.get("containers", {}), doc.get("leaves", {})
    kinds: Dict[str, Any] = {}
    for path, c in containers.items() if isinstance(containers, dict) else ():
        kind = c.get("kind") if isinstance(c, dict) else None
        if kind in ("list", "tuple", "set", "value"):
            kinds[path] = kind
        elif kind == "dict":
            keys = c.get("keys")
            kinds[path] = {"keymap": keys} if isinstance(keys, dict) and keys else "dict"
    for path, kind in leaves.items() if isinstance(leaves, dict) else ():
        if kind in ("bigint", "ndarray", "bytes"):
            kinds[path] = kind
    kinds["__unescape__"] = True
    return kinds


def sub_kinds(kinds: Dict[str, Any], prefix: str) -> Dict[str, Any]:
    """The table entries under `prefix` ('a/b/'), with the prefix removed ('' for the prefix itself)."""
    root = prefix.rstrip("/")
    out = {"__unescape__": True} if kinds.get("__unescape__") else {}  # how names are written: file-wide
    for k, v in kinds.items():
        if k == root:
            out[""] = v
        elif k.startswith(prefix):
            out[k[len(prefix):]] = v
    return out


def unflatten(items: Dict[str, Any], kinds: Optional[Dict[str, Any]] = None, prefix: str = "",
              template: Any = None, leaf: Optional[Callable[[str, Any, Optional[str]], Any]] = None) -> Any:
    """The object saved under `prefix` (which ends with '/' or is empty)."""
    node = trie(items, prefix)
    sub = sub_kinds(kinds or {}, prefix) if prefix else (kinds or {})
    for path, kind in sub.items():  # empty containers have no entries: only the table knows them
        if path and path != "__unescape__" and (kind in ("dict", "list", "tuple", "set", "intdict")
                                                or isinstance(kind, dict)):
            n = node
            for seg in path.split("/"):
                n = n.setdefault(seg, _Node())
    return Rebuilder(sub_kinds(kinds or {}, prefix) if prefix else kinds, leaf).build(node, "", template)


def entries_under(items: Dict[str, Any], prefix: str) -> bool:
    """Whether any entry lies under `prefix` (a folder path ending with '/') or is `prefix` itself."""
    root = prefix.rstrip("/")
    return any(k == root or k.startswith(prefix) for k in items)


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


def rebuild_or_raise(items: Dict[str, Any], kinds: Dict[str, Any], prefix: str, leaf: Any, path: str) -> Any:
    """unflatten, with a malformed container table reported as a FormatError."""
    try:
        return unflatten(items, kinds, prefix, leaf=leaf)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise _errors.error(_errors.FormatError, f"metadata '{PYTREE_KEY}' does not describe the entries under "
                            f"'{prefix}': {type(e).__name__}: {e}", file=path, key=PYTREE_KEY) from e

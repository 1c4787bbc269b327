"""Resume in place: load_checkpoint reads a checkpoint's tensors into the tensors the program has.

The model's parameters and buffers (or the staging tensors of those the engine cannot write) and
an optimizer's existing state tensors are read straight into their own memory
(``Reader.fetch_into``: a few threads, no GIL), so they stay the same Python objects and no
buffer of the file is allocated for them. A tensor the program does not have yet (a new
optimizer's state, metric states, the RNG states, extras) is read into one block allocated once
at its final size, whose views the objects then keep: nothing is copied out of it.

Nothing may change before every checksum has passed. So the program's own tensors are read
twice: first only checked (each piece hashed in a small scratch piece of the C library's, nothing
kept), in the same parallel pass that reads and verifies the new ones; then, once the engine has
accepted the model (strictness, dtypes, shapes, ignore globs) and a component has taken its
state, read into place, verified again as the bytes land. A damaged file raises ChecksumError in
the first pass, before any object changed. The second pass can only fail if the file itself
changes between the two passes (keepsake's writers replace a file, never rewrite it in place);
the objects read into by then keep the new bytes, and the error says which tensor.

Why two passes and not a copy to roll back from: keeping the old values means writing 1.4 GiB
(GPT-2 small + AdamW) into fresh memory, whose first touch costs more than reading the page
cache once more into a piece that stays in the CPU's cache.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._core import tensors as _tensors, tree as _tree
from . import load as _load

Entry = Tuple[str, int, Tuple[int, ...], int, int]  # the reader's (name, code, shape, begin, end)


def _placeable(t: Any, torch: Any) -> bool:
    """A tensor whose own memory the file's bytes can be read into: dense, contiguous, on the CPU."""
    return (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided
            and t.is_contiguous() and not t.is_conj() and not t.is_neg())


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def template_tensors(prefix: str, template: Any) -> Dict[str, Any]:
    """The tensors of a component's state_dict() by the keys its saved entries have (the writer's
    naming, through the same Flattener); {} for a state the writer could not store. An optimizer's
    ``state`` (int parameter ids -> {name: tensor}) with plain names is named directly: an int is
    its decimal, a plain name itself, as the Flattener names them; a key that does not name an
    entry of the file only means that tensor is not read in place."""
    found: Dict[str, Any] = {}
    state = template.get("state") if isinstance(template, dict) else None
    if isinstance(state, dict) and all(type(i) is int and isinstance(st, dict) and all(
            type(k) is str and k and _PLAIN.issuperset(k) for k in st) for i, st in state.items()):
        for i, st in state.items():
            for k, v in st.items():
                if hasattr(v, "data_ptr"):
                    found[f"{prefix}/state/{i}/{k}"] = v
        return found

    def record(path: str, t: Any, keep: list) -> tuple:
        found[path] = t
        return (path,)

    try:
        _tree.Flattener(record).add(prefix, template)
    except Exception:  # not storable as it is: no tensor of it is a destination
        return {}
    return found


class Plan:
    """Where each tensor of the file goes: into a program tensor (``dest``), or into the new block."""

    def __init__(self, reader: Any, ents: Sequence[Entry]) -> None:
        self.reader = reader
        self.ents = {e[0]: e for e in ents}
        self.dest: Dict[str, Any] = {}
        self._claimed: set = set()

    def offer(self, tensors: Dict[str, Any]) -> None:
        """Each tensor (by entry name) takes the bytes of its entry in place if it has the entry's
        dtype, shape and size and no other destination holds its memory (tied weights: the first
        one; the engine copies the others, or they are installed as before)."""
        import torch
        codes = _tensors.torch_maps()[0]
        for key, t in tensors.items():
            e = self.ents.get(key)
            if e is None or not _placeable(t, torch):
                continue
            ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
            if (codes.get(t.dtype) != e[1] or nbytes == 0 or nbytes != e[4] - e[3] or tuple(t.shape) != tuple(e[2])
                    or ptr in self._claimed):
                continue
            self._claimed.add(ptr)
            self.dest[key] = t

    def entries(self, items: Dict[str, Any]) -> Tuple[List[tuple], list]:
        """The engine's entries of `items` (the file's values, the ignored left out): a tensor's
        dtype, shape and size are its file entry's; its memory, the block's or the program's."""
        keep: list = []
        out: List[tuple] = []
        for k, v in items.items():
            e = self.ents.get(k)
            if e is not None and hasattr(v, "data_ptr"):
                out.append((k, e[1], tuple(e[2]), v.data_ptr() if e[4] > e[3] else 0, e[4] - e[3]))
            elif hasattr(v, "data_ptr"):
                out.append(_tensors.torch_entry(k, v, keep))
            else:
                out.append((k, v))
        return out, keep

    def read(self) -> Dict[str, Any]:
        """The first pass: every tensor of the file checked, the new ones read into one block
        (verified as they land), on a few threads (Reader.fetch_block). Returns the file's tensors
        by name: the program's own (not read yet) for the placed ones, views of the block, each
        with a storage of its own size (torch.save of one saves its bytes alone), for the others."""
        new = [name for name in self.ents if name not in self.dest]
        buf, offsets = self.reader.fetch_block(new, list(self.dest))
        at = dict(zip(new, offsets))
        items: Dict[str, Any] = {}
        for name, (_, code, shape, begin, end) in self.ents.items():  # in file order
            off = at.get(name)
            items[name] = self.dest[name] if off is None else _tensors.torch_from(buf, code, shape, off,
                                                                                 off + end - begin)
        return items

    def fill(self, keys: Sequence[str]) -> None:
        """The second pass: the placed tensors of `keys` read into their memory, verified again."""
        jobs = [(k, self.dest[k].data_ptr(), self.dest[k].numel() * self.dest[k].element_size())
                for k in keys if k in self.dest]
        if jobs:
            jobs.sort(key=lambda j: self.ents[j[0]][3])
            self.reader.fetch_into(jobs)

    def under(self, prefix: str) -> List[str]:
        return [k for k in self.dest if k.startswith(prefix)]


class _ParamIds(list):
    """A saved param group's parameter ids, answering ``in`` from a set.

    torch's ``Optimizer.load_state_dict`` asks ``param_id in group["params"]`` of every group for
    every state it casts (``_process_value_according_to_param_policy``): a linear search each
    time, quadratic in the parameters (most of a 100,000-entry resume). The answer is the same;
    only the search is not. A deep copy (torch copies the saved groups) is a plain list."""

    __slots__ = ("_ids",)

    def __contains__(self, x: object) -> bool:
        ids = getattr(self, "_ids", None)
        if ids is None:
            ids = self._ids = frozenset(self)
        try:
            return x in ids
        except TypeError:  # unhashable: as a list answers
            return list.__contains__(self, x)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (list(self),))


def _fast_groups(value: Any) -> Any:
    """The saved state with each group's int parameter ids in a _ParamIds (an optimizer's)."""
    groups = value.get("param_groups") if isinstance(value, dict) else None
    if isinstance(groups, list):
        for g in groups:
            ids = g.get("params") if isinstance(g, dict) else None
            if type(ids) is list and all(type(i) is int for i in ids):
                g["params"] = _ParamIds(ids)
    return value


def _tensor_ids(obj: Any, out: set) -> set:
    """The ids of every tensor in a state_dict() tree."""
    if hasattr(obj, "data_ptr"):
        out.add(id(obj))
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensor_ids(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensor_ids(v, out)
    return out


def component_loader(obj: Any, template: Any, plan: Optional[Plan], items: Dict[str, Any], kinds: _tree.Records,
                     leaf: Callable) -> Callable[[str], None]:
    """What the engine calls with a component's prefix: its load_state_dict with the saved tree, in
    which the component's own tensors (placed in the plan) stand for themselves; once the object
    took the state, their bytes are read into them. An object that kept a copy of one instead
    (a cast, another device) is given the filled tree once more, so it holds the file's values."""
    import torch

    def load(prefix: str) -> None:
        value = _tree.unflatten(items, kinds, prefix, template, leaf)
        if isinstance(obj, torch.optim.Optimizer):
            value = _fast_groups(value)
        _load.install_tree(obj, value)
        mine = [k for k in plan.under(prefix) if k in items] if plan is not None else []  # not the ignored
        if not mine:
            return
        plan.fill(mine)
        held = _tensor_ids(obj.state_dict() if hasattr(obj, "state_dict") else obj, set())
        if any(id(plan.dest[k]) not in held for k in mine) and hasattr(obj, "load_state_dict"):
            obj.load_state_dict(value)
    return load

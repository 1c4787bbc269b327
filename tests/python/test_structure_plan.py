"""The library plans the read side of the value tree (ks_structure_plan, include/keepsake/binding.h):
which folders are lists, tuples, sets or dicts, typed keys, unescaped str keys and leaf kinds, from
the structure document or keepsake 0.1.0's ``keepsake.pytree`` table. Python maps the plan onto its
objects and keeps only the comparison with the program's own object (the template)."""
import collections
import json

import pytest

import keepsake
from keepsake import _keepsake
from keepsake._core import tree

LEAF, LIST, TUPLE, SET, DICT, KEYED, GUESS, NONE = range(8)


def test_the_library_types_keys_and_folders():
    doc = json.dumps({"version": 1, "containers": {"s": {"kind": "dict", "keys": {"0": 0, "True": True, "None": None}},
                                                   "t": {"kind": "tuple", "len": 2}, "e": {"kind": "set", "len": 0}},
                      "leaves": {"big": "bigint"}})
    items = {"s/0": "a", "s/True": "b", "s/None": "c", "t/1": 1, "t/0": 0, "a%2Fb%25": 5, "big": "12345678901234567890"}
    plan = _keepsake.structure_plan(doc, None, items, "")
    assert plan[0] == GUESS and not plan[2]
    kids = {c[2]: c for c in plan[1]}
    assert set(kids) == {"s", "t", "a/b%", "big", "e"}  # unescaped by the library; the empty set listed
    s = kids["s"][1]
    assert s[0] == KEYED and [k for k, _ in s[1]] == [0, True, None]
    t = kids["t"][1]
    assert t[0] == TUPLE and [c[2] for _, c in t[1]] == [0, 1]  # index order, not entry order
    assert kids["big"][1] == (LEAF, "big", "12345678901234567890", "bigint")
    assert tree.unflatten(items, tree.load_kinds({tree.STRUCTURE_KEY: doc})) == {
        "s": {0: "a", True: "b", None: "c"}, "t": (0, 1), "a/b%": 5, "big": "12345678901234567890", "e": set()}


def test_010_tables_and_templates():
    table = json.dumps({"d": "intdict", "k": {"keys": [["i", "3"], ["f", 2], ["n", None]]}, "l": "list"})
    items = {"d/-2": 1, "k/0": 2, "k/1": 3, "k/2": 4, "l/1": "y", "l/0": "x", "g/1": 5, "g/0": 6}
    kinds = tree.load_kinds({tree.PYTREE_KEY: table})
    assert tree.unflatten(items, kinds) == {"d": {-2: 1}, "k": {3: 2, 2.0: 3, None: 4}, "l": ["x", "y"],
                                            "g": {1: 5, 0: 6}}
    od = tree.unflatten({"p/g/1": 5, "p/g/0": 6, "p/h/0": 7}, (None, None), "p/",
                        collections.OrderedDict(g=(0, 0), h={"0": 1}))
    assert isinstance(od, collections.OrderedDict) and od == {"g": (6, 5), "h": {"0": 7}}


def test_records_that_do_not_fit_are_format_errors():
    with pytest.raises(keepsake.FormatError, match="int-keyed"):
        _keepsake.structure_plan(None, json.dumps({"d": "intdict"}), {"d/x": 1}, "")
    with pytest.raises(keepsake.LimitError):
        _keepsake.structure_plan(None, None, {"/".join(["a"] * 300): 1}, "")

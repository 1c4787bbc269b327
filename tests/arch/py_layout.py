#!/usr/bin/env python3
"""The Python package spells no checkpoint key layout: the C library names every key.

Every line of python/keepsake (sub-packages included, docstrings and comments too) is searched
for the literals of the layout (docs/DESIGN.md "One engine"): ``"state/``, ``/state_dict/``,
``_computed"``, ``/inner/``, ``/attrs/``, ``keepsake.dcp``, ``layout_version`` and the per-rank
prefix ``rank<r>/`` (or ``rank{r}/`` in an f-string). The package asks the library for keys
instead (keepsake._core.layout: ks_state_key, ks_layout_record).

EXCEPTIONS lists, line by line, the literals still spelled in the torch.distributed layer (the
sharded layout, which moves into the library on its own). The check fails on a hit that is not
listed, and on a listed line that no longer has a hit (delete it from the list: the list only
shrinks). It first checks that the pattern finds each literal in a sample.
Usage: py_layout.py SOURCE_DIR
"""
import pathlib
import re
import sys

PATTERN = re.compile(r'"state/|/state_dict/|_computed"|/inner/|/attrs/|keepsake\.dcp|layout_version'
                     r'|rank(<r>|\{[A-Za-z_]*\})/')

# (file under python/keepsake, the line's text stripped): the sharded layout's literals, to be
# removed when keepsake._distributed asks the library for its keys.
EXCEPTIONS = {
    ("_distributed/storage.py", 'OBJECT_PREFIX = "keepsake.dcp.object/"'),
    ("_distributed/storage.py", 'META_KEY = "keepsake.dcp"'),
    ("_distributed/storage.py", '_RANK_FILE_FQN = "keepsake.dcp.rank_file/"'),
    ("_distributed/manager.py", "``rank<r>/`` (keepsake._distributed.local): ``rank<r>/rng/...`` (that rank's torch, "
                                "Python and numpy"),
    ("_distributed/manager.py", "generators), ``rank<r>/dataset_state/<name>``, ``rank<r>/metrics/<name>/<i>`` and"),
    ("_distributed/manager.py", "``rank<r>/eval_metrics/<label>/<name>/<i>`` (that rank's local metric states, as "
                                "keepsake"),
    ("_distributed/manager.py", "bytes). Each rank is the only one that saves its ``rank<r>/`` items, so they are in "
                                "its own"),
    ("_distributed/manager.py", 'TIMESTAMP = "state/timestamp/Timestamp/"'),
    ("_distributed/manager.py", 'out[f"{path}/_computed"] = v.detach().reshape(()).to(torch.float64).cpu().clone()'),
    ("_distributed/dcp_import.py", "keepsake scalars; other objects are left out and listed in the output's "
                                   "``keepsake.dcp_import``"),
    ("_distributed/local.py", "and random generators, saved under ``rank<r>/`` by plain ``dcp.save`` and restored "
                              "after a plain"),
    ("_distributed/local.py", "functions): ``rank<r>/metrics/<name>/<i>`` and "
                              "``rank<r>/eval_metrics/<label>/<name>/<i>`` (part i"),
    ("_distributed/local.py", "update count as keepsake bytes), ``rank<r>/dataset_state/<name>`` and "
                              "``rank<r>/rng/...``. Only"),
    ("_distributed/local.py", "rank r saves its ``rank<r>/`` items, so they lie in its own rank file."),
    ("_distributed/local.py",
     '"""(key below rank<r>/, metric part): every metric, and every inner metric of a wrapper."""'),
    ("_distributed/local.py",
     '"""This rank\'s generators and data positions, by key below rank<r>/ (current values)."""'),
    ("_distributed/local.py", "Saving (``checkpoint=None``): this rank's items under ``rank<r>/`` (r: its rank in "
                              "`group`,"),
    ("_distributed/local.py", 'mine = f"rank{rank}/"'),
    ("_distributed/local.py", 'sd[f"rank{s}/{k}"] = b""  # a bytes item: dcp.load replaces it with the saved bytes'),
    ("_distributed/local.py", 'sd.update({f"rank{first}/{k}": v for k, v in _own_values(dataset_state, rng).items()})'),
    ("_distributed/local.py", 'src = f"rank{first}/"'),
    ("_distributed/local.py", 'need = [f"rank{s}/{k}" for k, _p in parts for s in range(lo, hi)]'),
    ("_distributed/local.py", '_sync.restore_local(part, [state_dict[f"rank{s}/{k}"] for s in range(lo, hi)])'),
}

SAMPLES = ['fl.add(f"state/model/{k}", v)', 'f"{path}/state_dict/{s}"', 'items["x/_computed"]', 'p + "/inner/" + n',
           'f"{p}/attrs/{a}"', '"keepsake.dcp.object/"', "'{\"layout_version\":1}'", "``rank<r>/rng``",
           'f"rank{rank}/"']


def hits(root: pathlib.Path):
    for path in sorted(root.rglob("*.py")) + sorted(root.rglob("*.pyi")):
        rel = path.relative_to(root).as_posix()
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PATTERN.search(line):
                yield rel, no, line.strip()


def main() -> int:
    missed = [s for s in SAMPLES if not PATTERN.search(s)]
    if missed:
        print(f"py_layout: the pattern misses {missed}")
        return 1
    root = pathlib.Path(sys.argv[1]) / "python" / "keepsake"
    found = list(hits(root))
    bad = [(rel, no, text) for rel, no, text in found if (rel, text) not in EXCEPTIONS]
    stale = EXCEPTIONS - {(rel, text) for rel, _no, text in found}
    for rel, no, text in bad:
        print(f"python/keepsake/{rel}:{no}: a key layout literal (ask keepsake._core.layout): {text}")
    for rel, text in sorted(stale):
        print(f"py_layout.py: EXCEPTIONS lists a line that has no literal any more (remove it): {rel}: {text}")
    if not bad and not stale:
        print(f"py_layout: no layout literal outside the {len(EXCEPTIONS)} listed lines of keepsake._distributed")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())

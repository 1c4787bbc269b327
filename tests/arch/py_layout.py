#!/usr/bin/env python3
"""The Python package spells no checkpoint key layout: the C library names every key.

Every line of python/keepsake (sub-packages included, docstrings and comments too) is searched
for the literals of the layout (docs/DESIGN.md "One engine"): ``"state/``, ``/state_dict/`` (or a
key that starts with ``state_dict/``, as a metric-sync blob's),
``_computed"``, ``/inner/``, ``/attrs/``, ``keepsake.dcp``, ``layout_version`` and the per-rank
prefix ``rank<r>/`` (or ``rank{r}/`` in an f-string). The package asks the library for keys
instead (keepsake._core.layout: ks_state_key, ks_layout_record).

EXCEPTIONS lists, line by line, literals the package may still spell; it is empty: the
torch.distributed layer asks the library for the sharded layout too (ks_shard_dcp_write_rank,
ks_shard_local_layout). The check fails on a hit that is not listed, and on a listed line that no
longer has a hit (the list only shrinks). It first checks that the pattern finds each literal in a sample.
Usage: py_layout.py SOURCE_DIR
"""
import pathlib
import re
import sys

PATTERN = re.compile(r'"state/|/state_dict/|"state_dict/|_computed"|/inner/|/attrs/|keepsake\.dcp|layout_version'
                     r'|rank(<r>|\{[A-Za-z_]*\})/')

# (file under python/keepsake, the line's text stripped). Empty: nothing in the package spells the layout.
EXCEPTIONS: set = set()

SAMPLES = ['fl.add(f"state/model/{k}", v)', 'f"{path}/state_dict/{s}"', 'fl.add(f"state_dict/{s}", v)',
           'items["x/_computed"]', 'p + "/inner/" + n',
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
        print(f"py_layout: no layout literal in python/keepsake ({len(EXCEPTIONS)} listed exceptions)")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())

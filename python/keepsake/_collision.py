"""This package is the ``keepsake-ckpt`` distribution; ``keepsake`` on the package index is another.

``pip install keepsake`` installs Replicate's "Version control for machine learning" (0.4.x), which
also has an import package named ``keepsake`` and a ``keepsake`` command. pip puts both projects'
files into the same ``site-packages/keepsake/`` folder: the one installed last overwrites the
other's ``__init__.py`` and command, and uninstalling either removes files the other needs. Neither
works after that, so this package refuses to run beside the other and says how to fix it.

Importing this module checks, once per process (the package's ``__init__`` and every public module
import it first):

* that ``keepsake/__init__.py`` is this package's (another project's, installed over it, does not
  set ``__distribution__``);
* that no other distribution installed in the folder that holds the package claims ``keepsake``
  (a ``*.dist-info`` or ``*.egg-info`` there whose ``top_level.txt`` or ``RECORD`` names it). One
  directory listing; only the entries named ``keepsake*`` are read.
"""
from __future__ import annotations

import os
import re
import sys
from typing import List, Optional, Tuple

DISTRIBUTION = "keepsake-ckpt"
_FIX = (f"To use this package (pip install {DISTRIBUTION}), remove both and reinstall it:\n"
        f"    pip uninstall -y keepsake {DISTRIBUTION} && pip install {DISTRIBUTION}\n"
        "or give each project a virtual environment of its own.")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _field(metadata: str, key: str) -> str:
    m = re.search(rf"^{key}: *(.*)$", metadata, re.M)
    return m.group(1).strip() if m else ""


def _claims_keepsake(info: str) -> bool:
    top = _read(os.path.join(info, "top_level.txt"))
    if top:
        return "keepsake" in top.split()
    record = _read(os.path.join(info, "RECORD")) or _read(os.path.join(info, "installed-files.txt"))
    if record:
        return re.search(r"^(\.\./)*keepsake/", record, re.M) is not None
    return True  # a distribution named keepsake that lists nothing: assume it has what its name says


def foreign_distributions(package_dir: str) -> List[Tuple[str, str, str]]:
    """(name, version, summary) of each other distribution beside ``package_dir`` that claims ``keepsake``."""
    parent = os.path.dirname(os.path.abspath(package_dir))
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    found = []
    for entry in sorted(entries):
        stem, dot, kind = entry.rpartition(".")
        if not dot or kind not in ("dist-info", "egg-info") or not entry.lower().startswith("keepsake"):
            continue
        info = os.path.join(parent, entry)
        meta = _read(os.path.join(info, "METADATA")) or _read(os.path.join(info, "PKG-INFO"))
        name = _field(meta, "Name") or stem.split("-")[0]
        if _normalize(name) == DISTRIBUTION or not _claims_keepsake(info):
            continue
        version = _field(meta, "Version") or (stem.split("-") + [""])[1]
        found.append((name, version, _field(meta, "Summary")))
    return found


def _describe(dists: List[Tuple[str, str, str]]) -> str:
    return "\n".join(f"    {n} {v}" + (f' ("{s}")' if s else "") for n, v, s in dists)


def problem(package: Optional[object] = None) -> Optional[str]:
    """What is wrong with the installed ``keepsake`` package, or None when it is this one, alone."""
    pkg = sys.modules.get(__package__) if package is None else package
    where = os.path.dirname(os.path.abspath(__file__))
    if getattr(pkg, "__distribution__", None) != DISTRIBUTION:
        init = getattr(pkg, "__file__", None) or where
        others = foreign_distributions(where)
        return (f"the `keepsake` package imported from {os.path.dirname(init)} is not {DISTRIBUTION}'s: its "
                "__init__.py belongs to another project that installs a `keepsake` package too"
                + (":\n" + _describe(others) if others else
                   " (on the package index, `keepsake` is Replicate's \"Version control for machine learning\")")
                + f"\nwhile the rest of the folder is {DISTRIBUTION}'s. " + _FIX)
    others = foreign_distributions(where)
    if others:
        return (f"{DISTRIBUTION} and another distribution that also installs a `keepsake` package share "
                f"{os.path.dirname(where)}:\n" + _describe(others) + "\n"
                "Each overwrote files of the other when it was installed, and uninstalling one removes files "
                f"the other needs. (On the package index, `keepsake` is another project; this one is {DISTRIBUTION}.) "
                + _FIX)
    return None


def missing_extension(error: BaseException) -> str:
    """The message for a package whose C extension keepsake._keepsake does not import."""
    where = os.path.dirname(os.path.abspath(__file__))
    return (f"{DISTRIBUTION}'s C extension keepsake._keepsake does not import from {where} ({error}). The installation "
            f"is incomplete: reinstall it (pip install --force-reinstall {DISTRIBUTION}); in a clone of the "
            "repository, build it (make build) and use build/python-pkg (PYTHONPATH), or pip install the clone.")


_problem = problem()
if _problem:
    raise ImportError("keepsake: " + _problem)

"""The ``keepsake`` command: the C command-line tool that ships inside the package.

The wheel carries the CLI built from ``tools/`` as ``keepsake/bin/keepsake``; the console script
``keepsake`` (``[project.scripts]``) and ``python -m keepsake`` replace the Python process with it,
so its exit status, standard streams and signals are the tool's own.
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional

from . import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)


def executable() -> str:
    """The path of the bundled ``keepsake`` CLI."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "keepsake")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``keepsake ARGV...`` (default: this process's arguments); returns only on failure."""
    exe = executable()
    args = sys.argv[1:] if argv is None else list(argv)
    if not os.access(exe, os.X_OK):
        print(f"keepsake: the command-line tool is missing from this installation ({exe})", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["keepsake", *args])
    return 127  # not reached: execv replaces the process or raises OSError

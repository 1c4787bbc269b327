"""Paths as ``os`` functions take them: str, bytes or os.PathLike, never the file's contents.

Every function of the package that takes a file name goes through :func:`fspath`, so
``load_file(b"run.keepsake")`` opens the file named by those bytes (before, a bytes object was
taken for the file's contents); contents are given only to ``load(data)``. Names are decoded as
``os.fsdecode`` does (surrogateescape), which the extension encodes back to the same bytes.
"""
from __future__ import annotations

import os
from typing import Union

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


def fspath(path: PathLike) -> str:
    """The path as str; TypeError for anything ``os.fspath`` refuses (bytearray, memoryview, int...)."""
    return os.fsdecode(path)

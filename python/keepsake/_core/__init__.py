"""Layer 1, the core: what every other part of the package builds on, built on nothing of ours
but the C extension (``keepsake._keepsake``, which only this layer and the package's
``__init__`` import).

``errors`` (the exception classes, one per C status code), ``paths`` (file names as ``os``
takes them), ``native`` (the extension's API as the rest of the package sees it), ``report``
(:class:`LoadReport`, :class:`Timestamp`), ``tensors`` (dtype codes, tensors into the C writer's
entries and the reader's bytes back into zero-copy views) and ``tree`` (nested containers to and
from the library's flat '/'-joined entries and structure document).

The layers, lowest first (each imports only its own and those before it; tests/arch/py_imports.py):
_core, _files, _state, _manager, _distributed, _integrations, then the public modules.
"""

"""torch.distributed: DCP storage in keepsake's sharded layout, metrics across ranks, per-rank items.

``dcp.save(sd, storage_writer=KeepsakeWriter(path))``, ``dcp.async_save(...)`` and
``dcp.load(sd, storage_reader=KeepsakeReader(path))`` write and read keepsake sharded checkpoint
directories (docs/FORMAT.md section 9); :func:`sync` / :func:`synced` / :func:`unsync` fold
metric states across ranks with the library's rule; :func:`local_items` / :func:`restore_local`
save and restore each rank's own items at any world size. docs/PYTHON.md, "torch.distributed".

This module exports keepsake's names only (``__all__``): the implementation is
keepsake._distributed (``storage``, ``sync``, ``local``).
"""
from .. import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from .._distributed import storage as _storage
from .._distributed.storage import *  # noqa: F401,F403 - exactly its __all__

__all__ = list(_storage.__all__)

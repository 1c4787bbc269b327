"""torch.distributed.checkpoint (DCP) directories into keepsake files, without executing their pickles.

::

    from keepsake.distributed_import import convert_dcp
    convert_dcp("ckpt/step_1000", "step_1000.keepsake")   # a directory written by dcp.save

The conversion is the C library's (``ks_convert``, as ``keepsake convert DIR OUT``); the
function is keepsake._distributed.dcp_import's. docs/FORMAT.md, "Importing torch DCP checkpoints".
"""
from .. import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from .._distributed import dcp_import as _dcp_import
from .._distributed.dcp_import import *  # noqa: F401,F403 - exactly its __all__

__all__ = list(_dcp_import.__all__)

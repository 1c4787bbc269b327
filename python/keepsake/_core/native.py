"""The native API shim: the C extension keepsake._keepsake as the rest of the package sees it.

Only keepsake._core and the package's __init__ import the extension itself
(tests/arch/py_imports.py); every other module goes through this one.
"""
from .._keepsake import *  # noqa: F401,F403
from .._keepsake import Reader, catalogue, compute_metrics, convert, metric_info, save_bytes, save_file  # noqa: F401
from .._keepsake import torch_load, torch_save, load_state, fold_metric  # noqa: F401
from .._keepsake import AsyncSaver, EarlyStop, Manager, dtype_widens, is_remote, path_match, preemption_install, preemption_signal  # noqa: F401
from .._keepsake import Image, preemption_uninstall  # noqa: F401

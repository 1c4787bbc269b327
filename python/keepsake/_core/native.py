"""The extension module, imported once (kept separate so modules import it without cycles)."""
from .._keepsake import *  # noqa: F401,F403
from .._keepsake import Reader, catalogue, compute_metrics, convert, metric_info, save_bytes, save_file  # noqa: F401
from .._keepsake import torch_load, torch_save, load_state, fold_metric  # noqa: F401
from .._keepsake import AsyncSaver, EarlyStop, Manager, dtype_widens, is_remote, path_match, preemption_install, preemption_signal  # noqa: F401
from .._keepsake import preemption_uninstall  # noqa: F401

"""PyTorch: tensor files with safetensors.torch's API, whole training checkpoints, torch.save files.

Tensor files (switch from safetensors by changing the import)::

    from keepsake.torch import save_file, load_file
    save_file({"w": torch.ones(2, 2)}, "w.keepsake")
    tensors = load_file("w.keepsake")          # zero-copy views of the mapped file

Training state::

    keepsake.torch.save_checkpoint("ck.keepsake", model=model, optimizers=opt, schedulers=sched,
                                   train_metrics=metrics, timestamp=ts)
    report = keepsake.torch.load_checkpoint("ck.keepsake", model=model, optimizers=opt, ...)

torch.save / Composer files, without executing their pickles::

    state = keepsake.torch.load_pt("composer.pt")

The functions live in the package's layers (docs/DESIGN.md, "The Python package"): tensor files in
``keepsake._files``, training state in ``keepsake._state``; this module only gathers them.
"""
from . import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from ._files.model import load_model, save_model
from ._files.pt import load_pt, save_pt
from ._files.torch_files import load, load_file, save, save_file
from ._state.checkpoint import load_checkpoint, save_checkpoint
from ._state.staging import HostStaging

__all__ = ["save_file", "load_file", "save", "load", "save_model", "load_model", "save_checkpoint", "load_checkpoint",
           "load_pt", "save_pt", "HostStaging"]

"""Lightning integration: keepsake files as Lightning checkpoints.

::

    from keepsake.lightning import KeepsakeCheckpointIO, KeepsakeMetrics
    trainer = Trainer(plugins=[KeepsakeCheckpointIO()], callbacks=[KeepsakeMetrics()])
    trainer.fit(model, ckpt_path="last.ckpt")      # resume, mid-epoch included

:class:`KeepsakeCheckpointIO` implements Lightning's ``CheckpointIO``: the checkpoint dict is
written with the C library's atomic, durable save - the model's ``state_dict`` under
``state/model/`` (so ``keepsake inspect`` / ``diff`` read it like any keepsake checkpoint), the
rest of Lightning's dict under ``lightning/`` - and comes back exactly (dicts, lists, tuples, int
keys, empty containers). No pickle is written or read.

Importing this module also lets ``LightningModule.load_from_checkpoint(path)`` (Lightning's
``pl_load``) read keepsake checkpoints, hyperparameters included; other files go to Lightning's
own loader unchanged.

torchmetrics states are not in a LightningModule's ``state_dict`` (they are not persistent), so a
resumed run would start its metrics from zero. :class:`KeepsakeMetrics` adds every torchmetrics
``Metric`` of the module to the checkpoint (``state/train_metrics/<module path>``, with
``_computed`` and the update count) and fills them back by name on resume.

Lightning drops a stateful train dataloader's position in some resumes (a checkpoint written at
an epoch's end, or ``trainer.estimated_stepping_batches`` read in ``configure_optimizers``): the
loader then starts over with a fresh shuffle. :class:`KeepsakeDataPosition` saves each train
dataloader's ``state_dict()`` and puts it back before the first batch of a resumed ``fit``.
"""
from . import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from ._integrations import lightning as _impl
from ._integrations.lightning import (DATA_KEY, METRICS, METRICS_KEY, MODEL, REST, KeepsakeCheckpointIO,  # noqa: F401
                                      KeepsakeDataPosition, KeepsakeMetrics, is_keepsake_file, module_metrics)

if hasattr(_impl, "KeepsakeModelParallelStrategy"):  # a Lightning with ModelParallelStrategy
    KeepsakeModelParallelStrategy = _impl.KeepsakeModelParallelStrategy

__all__ = list(_impl.__all__)

"""keepsake.EarlyStopping: the C library's early stopping (ks_early_stop) as a checkpoint component."""
from __future__ import annotations

from .._core import native as _n


class EarlyStopping(_n.EarlyStop):
    """Stops training when a monitored value has not improved for ``patience`` epochs in a row.

    The rule is the library's (``ks_early_stop``, as Lightning's EarlyStopping): a value improves
    when it beats the best by more than ``min_delta`` in the mode's direction (``"min"`` for a
    loss, ``"max"`` for an accuracy); NaN never improves. Give it to a checkpoint as a callback,
    ``callbacks={"EarlyStopping": es}``: it is saved under ``state/callbacks/EarlyStopping/``
    exactly as a C program's ``ks_early_stop_stateful`` saves it, so a run resumed in the middle
    of its patience stops at the same epoch as one never interrupted, and C and Python programs
    read each other's. A checkpoint of another monitor or mode is refused with MismatchError,
    the stopper unchanged.

    ::

        es = keepsake.EarlyStopping("eval_metrics/val/loss", mode="min", patience=3)
        with keepsake.CheckpointManager("runs/x", model=model, callbacks={"EarlyStopping": es}, ...) as mgr:
            mgr.autoresume()
            for epoch in range(ts.epoch, epochs):
                ...
                if es.update(val_loss, epoch):   # True when training should stop now
                    break

    Args: ``monitor`` (a name, recorded and checked on load), ``mode``, ``patience`` (>= 1),
    ``min_delta`` (>= 0). Attributes: ``best_score`` (None before the first value),
    ``wait_count``, ``stopped_epoch`` (-1 while running), :attr:`should_stop`.
    """

    @property
    def should_stop(self) -> bool:
        """True once it has fired (also after a resume from a checkpoint saved after that)."""
        return self.stopped_epoch >= 0

"""The key layout of a training state, as the C library names it: every key the package writes
or looks up comes from ``ks_state_key`` and every layout record from ``ks_layout_record``
(include/keepsake/binding.h), the functions ``ks_state_save`` names a C program's parts with.
The package spells no part of the layout itself (tests/arch/py_layout.py checks that)."""
from __future__ import annotations

from typing import Optional

from . import native as _n

MODEL, OPTIMIZER, SCHEDULER, CALLBACK = _n.PART_MODEL, _n.PART_OPTIMIZER, _n.PART_SCHEDULER, _n.PART_CALLBACK
DATASET_STATE, RNG, TIMESTAMP, EXTRA = _n.PART_DATASET_STATE, _n.PART_RNG, _n.PART_TIMESTAMP, _n.PART_EXTRA
TRAIN_METRIC, EVAL_METRIC, LIGHTNING = _n.PART_TRAIN_METRIC, _n.PART_EVAL_METRIC, _n.PART_LIGHTNING
RANK_ZERO_SEED, RUN_NAME = _n.PART_RANK_ZERO_SEED, _n.PART_RUN_NAME
METRIC_STATE, METRIC_COMPUTED, METRIC_ATTR = _n.PART_METRIC_STATE, _n.PART_METRIC_COMPUTED, _n.PART_METRIC_ATTR
METRIC_INNER, METRIC_UPDATE_COUNT = _n.PART_METRIC_INNER, _n.PART_METRIC_UPDATE_COUNT


def key(part: int, name: Optional[str] = None, base: Optional[str] = None) -> str:
    """The key of a part: ``key(OPTIMIZER, "AdamW")``, ``key(METRIC_INNER, "_base_metric", base=path)``;
    with no name, the folder of every such part (``key(MODEL)``)."""
    return _n.state_key(part, base, name)


def folder(part: int, base: Optional[str] = None) -> str:
    """The prefix of every key of a part, '/'-terminated (``key(part)`` + '/')."""
    return _n.state_key(part, base, None) + "/"


#: The name of a metric's cached result inside its folder: torchmetrics' attribute ``_computed``,
#: which the layout stores under the same name (the last component of its key).
COMPUTED = key(METRIC_COMPUTED, base="m")[2:]
#: The layout records: metadata key -> the value keepsake writes.
STATE_RECORD = (_n.META_STATE, _n.layout_record(_n.META_STATE))
LIGHTNING_RECORD = (_n.META_LIGHTNING, _n.layout_record(_n.META_LIGHTNING))

"""The load report and the timestamp, as plain Python objects."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

KINDS = ("loaded", "migrated", "converted", "skipped", "missing", "mismatched")


@dataclasses.dataclass(frozen=True)
class LoadItem:
    """One line of a load report.

    Attributes:
        kind: ``"loaded"``, ``"migrated"`` (old schema renamed/reshaped), ``"converted"`` (dtype
            widened, or narrowed when allowed), ``"skipped"`` (in the file, not used), ``"missing"``
            (in the program, not in the file: kept at its defaults) or ``"mismatched"`` (in both but
            incompatible: left at defaults).
        path: the component's '/' path, e.g. ``state/train_metrics/MulticlassAccuracy``.
        reason: human-readable detail.
    """
    kind: str
    path: str
    reason: str = ""


class LoadReport:
    """What :func:`keepsake.torch.load_checkpoint` did with every component.

    Iterate it for :class:`LoadItem` s, or read the per-kind lists (``report.missing`` ...), the
    paths of one kind (``report.paths("mismatched")``), or ``str(report)`` for the same text
    ``ks_load_report_print`` prints. ``timestamp``, ``run_name``, ``rank_zero_seed`` and ``extra``
    hold what the file recorded.
    """

    def __init__(self, path: str = "") -> None:
        self.path = path
        self.items: List[LoadItem] = []
        self.timestamp: Optional["Timestamp"] = None
        self.run_name: Optional[str] = None
        self.rank_zero_seed: Optional[int] = None
        self.extra: Dict[str, Any] = {}
        self.metadata: Dict[str, str] = {}

    def add(self, kind: str, path: str, reason: str = "") -> None:
        """Appends one item: ``kind`` is one of :data:`KINDS`, ``path`` the component's '/' path."""
        assert kind in KINDS, kind
        self.items.append(LoadItem(kind, path, reason))

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def of(self, kind: str) -> List[LoadItem]:
        """The items of one kind."""
        return [i for i in self.items if i.kind == kind]

    def paths(self, kind: str) -> List[str]:
        """The paths of the items of one kind."""
        return [i.path for i in self.items if i.kind == kind]

    def find(self, path: str) -> Optional[LoadItem]:
        """The first item for `path`, or None."""
        return next((i for i in self.items if i.path == path), None)

    loaded = property(lambda self: self.of("loaded"), doc="items loaded as they were")
    migrated = property(lambda self: self.of("migrated"), doc="items loaded after a schema migration")
    converted = property(lambda self: self.of("converted"), doc="items loaded after a dtype conversion")
    skipped = property(lambda self: self.of("skipped"), doc="file entries not used")
    missing = property(lambda self: self.of("missing"), doc="program components the file lacks")
    mismatched = property(lambda self: self.of("mismatched"), doc="components in both that do not fit")

    def __str__(self) -> str:
        # The library's printer itself (ks_load_report_print), so the text is a C program's.
        from .. import _keepsake
        return _keepsake.report_text([(i.kind, i.path, i.reason or "") for i in self.items]).rstrip("\n")

    def __repr__(self) -> str:
        return f"<LoadReport {self.path!r}: " + ", ".join(f"{len(self.of(k))} {k}" for k in KINDS) + ">"


@dataclasses.dataclass
class Timestamp:
    """Composer's training timestamp, saved as ``state/timestamp/Timestamp/<field>``.

    Counters are ints; the ``*_wct`` wall-clock totals (seconds) are floats and the only fields
    that differ between two identical runs.
    """
    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0
    total_wct: float = 0.0
    epoch_wct: float = 0.0
    batch_wct: float = 0.0

    def state_dict(self) -> Dict[str, Any]:
        """The fields as a dict: counters as ints, the ``*_wct`` wall-clock totals as floats."""
        return {f.name: (float if f.name.endswith("_wct") else int)(getattr(self, f.name))
                for f in dataclasses.fields(self)}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        """Sets the fields ``d`` has (ints and floats as in :meth:`state_dict`); the others are kept."""
        for f in dataclasses.fields(self):
            if f.name in d:
                setattr(self, f.name, (float if f.name.endswith("_wct") else int)(d[f.name]))

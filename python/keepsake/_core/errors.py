"""Exceptions: one subclass of :class:`KeepsakeError` per C status code."""
from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "KeepsakeError", "NoMemoryError", "IOError_", "FormatError", "LimitError", "InvalidError",
    "NotFoundError", "DTypeError", "ShapeError", "ChecksumError", "VersionError", "MismatchError",
    "UnsupportedError", "ExistsError", "StateError", "ValueError_", "UnsafeError", "NetError",
]


class KeepsakeError(Exception):
    """An error reported by the keepsake C library.

    Attributes:
        status: the numeric status code (stable, append-only; see ``include/keepsake/status.h``).
        status_name: its symbolic name, e.g. ``"KS_E_FORMAT"``.
        message: what failed, with the expected and the found value.
        file: the file (or ``"<buffer>"``) the error concerns, or ``""``.
        key: the tensor, state or metadata name concerned, or ``""``.
        offset: the byte offset in the input, or ``-1`` when unknown.
    """

    status: int = -1
    status_name: str = "KS_E_UNKNOWN"

    def __init__(self, status: Optional[int] = None, message: str = "", file: str = "", key: str = "",
                 offset: int = -1) -> None:
        if status is not None:
            self.status = status
            self.status_name = _NAMES.get(status, "KS_E_UNKNOWN")
        self.message, self.file, self.key, self.offset = message, file, key, offset
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file)
        if self.key:
            parts.append(f"key '{self.key}'")
        if self.offset is not None and self.offset >= 0:
            parts.append(f"at byte {self.offset}")
        where = " ".join(parts)
        return f"{where + ': ' if where else ''}{self.message} ({self.status_name})"

    def __reduce__(self):  # keep the fields through pickling (multiprocessing, DCP's gather of rank errors)
        # By class name through _rebuild: IOError_, ValueError_ and FileNotFoundError_ are named after
        # the builtins they extend, which the keepsake module does not export under those names.
        return (_rebuild, (type(self).__name__, self.status, self.message, self.file, self.key, self.offset))


def _make(name: str, code: int, doc: str, bases: tuple = (KeepsakeError,)) -> Type[KeepsakeError]:
    cls = type(name, bases, {"__doc__": doc, "status": code, "__module__": "keepsake"})
    return cls


NoMemoryError = _make("NoMemoryError", 1, "Out of memory (KS_E_NOMEM).", (KeepsakeError, MemoryError))
IOError_ = _make("IOError", 2, "Input/output error (KS_E_IO).", (KeepsakeError, OSError))
FormatError = _make("FormatError", 3, "Data breaks the file format (KS_E_FORMAT).")
LimitError = _make("LimitError", 4, "A size or count exceeds a hard limit (KS_E_LIMIT).")
InvalidError = _make("InvalidError", 5, "Invalid argument (KS_E_INVALID).", (KeepsakeError, ValueError))
NotFoundError = _make("NotFoundError", 6, "No such entry (KS_E_NOTFOUND).", (KeepsakeError, KeyError))
DTypeError = _make("DTypeError", 7, "Dtype mismatch or unsupported dtype (KS_E_DTYPE).", (KeepsakeError, TypeError))
ShapeError = _make("ShapeError", 8, "Shape mismatch (KS_E_SHAPE).", (KeepsakeError, ValueError))
ChecksumError = _make("ChecksumError", 9, "Checksum mismatch (KS_E_CHECKSUM).")
VersionError = _make("VersionError", 10, "Unsupported format or schema version (KS_E_VERSION).")
MismatchError = _make("MismatchError", 11, "Incompatible definitions (KS_E_MISMATCH).")
UnsupportedError = _make("UnsupportedError", 12, "Unsupported feature (KS_E_UNSUPPORTED).")
ExistsError = _make("ExistsError", 13, "Entry already exists (KS_E_EXISTS).")
StateError = _make("StateError", 14, "Operation not valid in the current state (KS_E_STATE).")
ValueError_ = _make("ValueError", 15, "Invalid value in input data (KS_E_VALUE).", (KeepsakeError, ValueError))
UnsafeError = _make("UnsafeError", 16, "Refused: input asks for code execution (KS_E_UNSAFE).")
NetError = _make("NetError", 17, "Network or remote storage error (KS_E_NET).")
NotDurableError = _make("NotDurableError", 18, "Saved, but the directory fsync failed: durability unknown "
                        "(KS_E_NOT_DURABLE).", (KeepsakeError, OSError))
LockedError = _make("LockedError", 19, "Held by another process: a run directory another checkpoint manager "
                    "holds (KS_E_LOCKED).", (KeepsakeError, BlockingIOError))

# A missing file: an IOError_ that is also Python's FileNotFoundError (what `except
# FileNotFoundError:` around safetensors or open() catches).
FileNotFoundError_ = _make("FileNotFoundError", 2, "No such file (KS_E_IO): also a builtin FileNotFoundError.",
                           (IOError_, FileNotFoundError))

ERRORS: Dict[int, Type[KeepsakeError]] = {
    c.status: c for c in (NoMemoryError, IOError_, FormatError, LimitError, InvalidError, NotFoundError,
                          DTypeError, ShapeError, ChecksumError, VersionError, MismatchError, UnsupportedError,
                          ExistsError, StateError, ValueError_, UnsafeError, NetError, NotDurableError,
                          LockedError)
}
_NAMES: Dict[int, str] = {}
_BY_NAME: Dict[str, Type[KeepsakeError]] = {c.__name__: c for c in (*ERRORS.values(), FileNotFoundError_)}


def _rebuild(name: str, status: int, message: str, file: str, key: str, offset: int) -> KeepsakeError:
    """An unpickled keepsake exception (KeepsakeError for a class this version does not have)."""
    return _BY_NAME.get(name, KeepsakeError)(status, message, file, key, offset)


def _install(native) -> None:
    """Registers the classes with the extension and learns the status names from it."""
    for code, (name, _text) in native.status_names().items():
        _NAMES[code] = name
    for code, cls in ERRORS.items():
        cls.status_name = _NAMES.get(code, cls.status_name)
    table: dict = dict(ERRORS)
    table["default"] = KeepsakeError
    FileNotFoundError_.status_name = _NAMES.get(2, FileNotFoundError_.status_name)
    table["ENOENT"] = FileNotFoundError_
    native._register_errors(table)


def error(cls: Type[KeepsakeError], message: str, file: str = "", key: str = "", offset: int = -1) -> KeepsakeError:
    """Builds an exception of one of the classes above from Python code."""
    return cls(cls.status, message, file, key, offset)

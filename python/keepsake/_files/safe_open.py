"""``safe_open``: lazy, zero-copy access to a keepsake or safetensors file, as in safetensors.

A remote file (``s3://``, ``http(s)://``) is opened by the C library in its lazy mode: the header
on open, then each tensor's byte range when it is asked for, verified against its checksum
(``Reader.tensor``); this module only turns the bytes into tensors.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

from .._core import errors as _errors, tensors as _tensors
from .._core.native import Reader, is_remote
from .._core.paths import PathLike, fspath


class TensorSlice:
    """A tensor not yet read: its shape and dtype, and ``[...]`` to take part of it.

    Indexing returns a copy of the selected part, like safetensors' ``get_slice``.
    """

    def __init__(self, handle: "safe_open", name: str) -> None:
        self._handle, self._name = handle, name
        self._entry = handle._r().entry(name)
        self._full: Any = None  # a lazily opened file's tensor, fetched at the first index

    def get_shape(self) -> List[int]:
        """The tensor's shape."""
        return list(self._entry[2])

    def get_dtype(self) -> str:
        """The safetensors dtype name, e.g. ``"F32"``."""
        return _tensors.DTYPE_NAMES[self._entry[1]]

    def __len__(self) -> int:
        shape = self._entry[2]
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def __getitem__(self, index: Any) -> Any:
        if self._handle._r().lazy:  # fetched (and verified) once, then sliced as often as asked
            if self._full is None:
                self._full = self._handle._view(self._entry)
            full = self._full
        else:
            full = self._handle._view(self._entry)
        part = full[index]
        return part.copy() if self._handle._framework == "np" else part.clone()


class safe_open:  # noqa: N801 - safetensors' name
    """Opens a keepsake or safetensors file for lazy reading.

    Args:
        filename: the file (str, bytes or os.PathLike). Its structure is checked on open.
        backend: ``"mmap"`` (the default): the file is mapped copy-on-write and tensors are
            zero-copy views; a file truncated or rewritten in place by another program can then
            kill the process with SIGBUS when a tensor is touched. ``"read"``: the file is read into
            memory the tensors own, no mapping (safetensors' ``"pread"``): never a signal.
        framework: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
        device: where ``get_tensor`` puts torch tensors (``"cpu"``, ``"cuda:0"``, an int...).
        verify: check every tensor's checksum on open (keepsake files); raises ChecksumError.
        cache_dir: a local directory where the bytes read from a remote file are kept, so that
            reading them again reads nothing from the server (the C library's read cache).

    A remote file (``s3://bucket/key``, ``http(s)://...``, with a libcurl build) is opened lazily:
    open reads its header only, and ``get_tensor`` / ``get_slice`` read only that tensor's bytes,
    verified against its checksum (ChecksumError when they do not match); each call returns a
    tensor owning its memory. ``backend="read"`` reads the whole file on open instead.

    Use as a context manager::

        with keepsake.safe_open("model.keepsake", framework="pt") as f:
            w = f.get_tensor("fc.weight")       # zero-copy view of the mapping

    Tensors returned stay valid after the file is closed: each keeps the mapping alive.
    """

    def __init__(self, filename: PathLike, framework: str = "pt", device: Union[str, int] = "cpu",
                 verify: bool = False, backend: str = "mmap", cache_dir: Optional[PathLike] = None) -> None:
        if framework in ("pt", "torch", "pytorch"):
            self._framework = "pt"
        elif framework in ("np", "numpy"):
            self._framework = "np"
        else:
            raise _errors.error(_errors.UnsupportedError, f"framework {framework!r}: use 'pt' or 'np'")
        if self._framework == "np" and device not in ("cpu", None):
            raise _errors.error(_errors.InvalidError, "numpy arrays live on the CPU: device must be 'cpu'")
        self._device = f"cuda:{device}" if isinstance(device, int) else device
        loc = fspath(filename)
        self._reader = Reader(loc, verify=verify, backend=backend, lazy=is_remote(loc),  # a local file maps
                              cache_dir=fspath(cache_dir) if cache_dir is not None else None)

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: object) -> None:
        self._reader = None  # tensors handed out keep the mapping alive by themselves

    def _r(self) -> Reader:
        if self._reader is None:
            raise _errors.error(_errors.StateError, "the file was closed")
        return self._reader

    def keys(self) -> List[str]:
        """Tensor names, sorted, as safetensors' ``safe_open(...).keys()`` returns them."""
        return sorted(self._r().keys())

    def file_keys(self) -> List[str]:
        """Tensor names in the header's order (the order keepsake saved them in)."""
        return self._r().keys()

    def offset_keys(self) -> List[str]:
        """Tensor names in the order of their data in the file."""
        return [e[0] for e in sorted(self._r().entries(), key=lambda e: e[3])]

    def metadata(self) -> Optional[Dict[str, str]]:
        """The caller's ``__metadata__`` pairs (keepsake's own writer keys left out), or None."""
        meta = self._r().metadata()
        return meta or None

    def raw_metadata(self) -> Dict[str, str]:
        """Every ``__metadata__`` pair, keepsake's own included."""
        return self._r().metadata(True)

    def scalars(self) -> Dict[str, Any]:
        """keepsake's typed non-tensor entries (ints, floats, bools, strings, None)."""
        return dict(self._r().scalars())

    def verify(self) -> None:
        """Checks every checksum now; raises ChecksumError or FormatError."""
        self._r().verify()

    def _view(self, entry: Tuple[str, int, Tuple[int, ...], int, int]) -> Any:
        _name, code, shape, begin, end = entry
        if self._r().lazy:  # this tensor's bytes only, read and verified by the library
            code, shape, data = self._r().tensor(_name)
            if self._framework == "np":
                return _tensors.numpy_from(data, code, shape, 0, len(data), _name)
            return _tensors.torch_from(data, code, shape, 0, len(data))
        if self._framework == "np":
            return _tensors.numpy_from(self._r(), code, shape, begin, end, _name)
        return _tensors.torch_from(self._r(), code, shape, begin, end)

    def get_tensor(self, name: str) -> Any:
        """The tensor `name`: a zero-copy view on the CPU, or a copy on another device."""
        t = self._view(self._r().entry(name))
        if self._framework == "pt" and self._device not in ("cpu", None):
            t = t.to(self._device)
        return t

    def get_slice(self, name: str) -> TensorSlice:
        """A :class:`TensorSlice` of `name`, to read its shape and dtype or index part of it."""
        return TensorSlice(self, name)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, as load_file returns them."""
        reader = self._r()
        if reader.lazy:
            out = {e[0]: self._view(e) for e in reader.entries()}
        else:
            view = _tensors.numpy_from if self._framework == "np" else _tensors.torch_from
            out = {e[0]: view(reader, *e[1:]) for e in reader.entries()}
        if self._framework == "pt" and self._device not in ("cpu", None):
            out = {k: v.to(self._device) for k, v in out.items()}
        return out

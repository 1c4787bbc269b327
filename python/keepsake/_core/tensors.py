"""Tensors across the C boundary: dtype codes, entries going out, zero-copy views coming back.

Going out, a tensor becomes ``(name, dtype code, shape, address, nbytes)``: the C writer borrows
the memory, which the caller keeps alive (``keep``) until the call returns. Coming back, a
:class:`~keepsake._keepsake.Reader` exports the mapped file through the buffer protocol and each
tensor is a ``torch.frombuffer`` / ``numpy.frombuffer`` view of it, which keeps the mapping alive.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import errors as _errors
from .._keepsake import dtypes as _dtypes

# keepsake dtype codes (include/keepsake/dtype.h): their safetensors names and element sizes, as
# the library has them.
DTYPE_NAMES = [name for name, _ in _dtypes()]
DTYPE_SIZES = [size for _, size in _dtypes()]
CODES = {n: i for i, n in enumerate(DTYPE_NAMES)}

Entry = tuple


def _torch():
    import torch
    return torch


_torch_maps: Optional[Tuple[Dict[Any, int], List[Any]]] = None


def torch_maps() -> Tuple[Dict[Any, int], List[Any]]:
    """(torch dtype -> code, code -> torch dtype); dtypes this torch lacks map to None."""
    global _torch_maps
    if _torch_maps is None:
        torch = _torch()
        names = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16",
                 "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "complex64", "float8_e4m3fnuz",
                 "float8_e5m2fnuz"]
        by_code = [getattr(torch, n, None) for n in names]
        _torch_maps = ({dt: i for i, dt in enumerate(by_code) if dt is not None}, by_code)
    return _torch_maps


_numpy_maps: Optional[Tuple[Dict[Any, int], List[Any]]] = None


def numpy_maps() -> Tuple[Dict[Any, int], List[Any]]:
    """(numpy dtype -> code, code -> numpy dtype or None for BF16 and the F8 types, FNUZ included).

    C64 is numpy's complex64. numpy has no FP8 dtype, so F8_E4M3FNUZ and F8_E5M2FNUZ, like BF16 and
    F8_E4M3/F8_E5M2, load only as torch tensors (a view of the bytes; DTypeError with numpy)."""
    global _numpy_maps
    if _numpy_maps is None:
        import numpy as np
        names = ["bool", "uint8", "int8", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", None, "<f4", "<f8", None,
                 None, "<c8", None, None]
        by_code = [np.dtype(n) if n else None for n in names]
        _numpy_maps = ({dt: i for i, dt in enumerate(by_code) if dt is not None}, by_code)
    return _numpy_maps


def torch_code(name: str, t: Any) -> int:
    """The keepsake dtype code of a tensor that can be stored (DTypeError, UnsupportedError otherwise)."""
    codes, _ = torch_maps()
    code = codes.get(t.dtype)
    if code is None:
        raise _errors.error(_errors.DTypeError, f"dtype {t.dtype} has no keepsake/safetensors equivalent that "
                            "keepsake stores (BOOL, U8..U64, I8..I64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2, C64, "
                            "F8_E4M3FNUZ, F8_E5M2FNUZ)",
                            key=name)
    if t.layout != _torch().strided:
        raise _errors.error(_errors.UnsupportedError, f"{t.layout} tensors are not stored; call .to_dense()",
                            key=name)
    return code


def torch_entry(name: str, t: Any, keep: list) -> Entry:
    """The C entry of a torch tensor; the (possibly copied) CPU tensor goes into `keep`."""
    code = torch_code(name, t)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    keep.append(t)
    return (name, code, tuple(t.shape), t.data_ptr(), t.numel() * t.element_size())


def numpy_entry(name: str, a: Any, keep: list) -> Entry:
    """The C entry of a numpy array (little-endian, C-contiguous copy when needed)."""
    import numpy as np
    codes, _ = numpy_maps()
    a = np.asarray(a)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    code = codes.get(dt)
    if code is None:
        raise _errors.error(_errors.DTypeError, f"numpy dtype {a.dtype} has no keepsake equivalent", key=name)
    if a.dtype.byteorder == ">" or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=dt)
    keep.append(a)
    return (name, code, tuple(a.shape), a.__array_interface__["data"][0] if a.size else 0, a.nbytes)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def torch_from(reader: Any, code: int, shape: Tuple[int, ...], begin: int, end: int) -> Any:
    """A zero-copy torch view of bytes [begin, end) of the reader's buffer."""
    torch = _torch()
    dt = torch_maps()[1][code]
    if dt is None:
        return _torch_widened(reader, code, shape, begin, end)
    if end == begin:
        return torch_empty(dt, shape)
    try:
        flat = torch.frombuffer(reader, dtype=dt, count=(end - begin) // DTYPE_SIZES[code], offset=begin)
    except (TypeError, ValueError, RuntimeError):  # dtypes frombuffer does not take: view the bytes
        flat = torch.frombuffer(reader, dtype=torch.uint8, count=end - begin, offset=begin).view(dt)
    return flat.view(shape)


def torch_empty(dt: Any, shape: Tuple[int, ...]) -> Any:
    """A tensor of no elements with `shape`, as safetensors 0.8.0's load_file makes it.

    ``torch.empty([0, 2**32, 2**32])`` raises "Stride calculation overflowed" (it computes the
    contiguous strides of the non-zero dims, whose product exceeds int64); a view of an empty
    tensor takes the strides torch allows for zero elements, which is what safetensors returns:
    the same shape, dtype and strides.
    """
    torch = _torch()
    try:
        return torch.empty(0, dtype=dt).view(shape)
    except RuntimeError as e:
        raise _errors.error(_errors.ShapeError, f"torch cannot represent an empty tensor of shape {list(shape)}: {e}") \
            from e


def _torch_widened(reader: Any, code: int, shape: Tuple[int, ...], begin: int, end: int) -> Any:
    """U16/U32/U64 for a torch without unsigned dtypes (1.13): widened copies, as ks_torch_save does."""
    import numpy as np
    torch = _torch()
    name = DTYPE_NAMES[code]
    wide = {"U16": np.int32, "U32": np.int64, "U64": np.int64}.get(name)
    if wide is None:
        raise _errors.error(_errors.DTypeError, f"this torch has no {name} dtype")
    if end == begin:
        return torch_empty(torch.int32 if wide is np.int32 else torch.int64, shape)
    a = np.frombuffer(reader, dtype=numpy_maps()[1][code], count=(end - begin) // DTYPE_SIZES[code], offset=begin)
    if name == "U64" and a.size and int(a.max()) >= 1 << 63:
        raise _errors.error(_errors.DTypeError, "U64 values beyond int64: this torch has no uint64")
    return torch.from_numpy(a.astype(wide)).reshape(shape)


def numpy_from(reader: Any, code: int, shape: Tuple[int, ...], begin: int, end: int, name: str = "") -> Any:
    """A zero-copy numpy view of bytes [begin, end) of the reader's buffer."""
    import numpy as np
    dt = numpy_maps()[1][code]
    if dt is None:
        raise _errors.error(_errors.DTypeError, f"numpy has no {DTYPE_NAMES[code]} dtype; load this tensor "
                            "with framework='pt'", key=name)
    if end == begin:
        try:
            return np.empty(shape, dtype=dt)
        except ValueError as e:  # numpy caps the product of all dims, zero or not ("array is too big")
            raise _errors.error(_errors.ShapeError, f"numpy cannot represent an empty array of shape {list(shape)}: {e}; "
                                "load this tensor with framework='pt'", key=name) from e
    return np.frombuffer(reader, dtype=dt, count=(end - begin) // DTYPE_SIZES[code], offset=begin).reshape(shape)


def torch_from_copy(value: Tuple[int, Tuple[int, ...], bytearray]) -> Any:
    """A torch tensor over the bytearray the extension returned (torch.frombuffer keeps it alive)."""
    code, shape, data = value
    return torch_from(data, code, shape, 0, len(data))

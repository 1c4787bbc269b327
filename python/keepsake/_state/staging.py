"""Page-locked host staging of a state's device (CUDA) tensors, reused from one save to the next.

A CUDA tensor handed to ``.cpu()`` is copied into fresh pageable memory, one synchronous copy per
tensor. :class:`HostStaging` keeps one page-locked ("pinned") host buffer instead, grown when a
save needs more and reused otherwise, as the library's own background-save staging is. A save
lays its device tensors out in it (each at a 64-byte aligned offset, in the order of the
entries), queues one ``non_blocking`` copy per tensor, then waits once per device; the C entries
point into the buffer, so the library writes (or, for a background save, snapshots) the bytes
from there with no further copy in Python. A state of the same layout lands at the same
addresses every save, so after the first save nothing is allocated. :meth:`close` frees the
buffer. Tensors that are not on a device become entries through
:func:`keepsake._core.tensors.torch_entry`, unchanged.

The allocator, the device predicate, the copy and the wait are arguments, so the bookkeeping runs
(and is tested) without a GPU: give ``alloc`` a plain allocator and mark test tensors as "device"
with ``is_device``. No file rule lives here: the entries go to the C writer or manager exactly as
``torch_entry``'s do.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._core import tensors as _tensors

ALIGN = 64
IMAGE_ALIGN = 4096  # KS_IMAGE_ALIGN: where a file image's memory must start (ks_image_create refuses others)
GRAIN = 1 << 21  # sizes are rounded up to 2 MiB; a buffer that must grow gets 1/8 more room


def _unregister(ptr: int) -> None:
    try:
        import torch
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:  # noqa: BLE001 - at interpreter exit CUDA may be gone; the memory is freed all the same
        pass


def pinned(nbytes: int) -> Any:
    """`nbytes` of page-locked host memory as a 1-D uint8 tensor, exactly that size: pageable
    memory registered with CUDA (unregistered when the tensor goes), or, where registering is not
    available, torch's pinned allocator (which rounds sizes up to a power of two)."""
    import torch
    buf = torch.empty(nbytes, dtype=torch.uint8)
    try:
        rt = torch.cuda.cudart()
        ok = int(rt.cudaHostRegister(buf.data_ptr(), nbytes, 1)) == 0  # cudaHostRegisterPortable
    except (AttributeError, RuntimeError, TypeError):
        ok = False
    if not ok:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    weakref.finalize(buf, _unregister, buf.data_ptr())
    return buf


def torch_uint8() -> Any:
    import torch
    return torch.uint8


def _is_cuda(t: Any) -> bool:
    return t.is_cuda


def _copy_async(dst: Any, src: Any) -> None:
    dst.copy_(src, non_blocking=True)


def _sync_stream(device: Any) -> None:
    import torch
    torch.cuda.current_stream(device).synchronize()  # the stream the copies were queued on


class HostStaging:
    """A page-locked host buffer for the device tensors of a save, reused across saves.

    Args:
        alloc: ``alloc(nbytes)`` -> a 1-D ``uint8`` CPU tensor of at least ``nbytes`` (default
            :func:`pinned`).
        is_device: which tensors are staged (default: CUDA tensors); the others become entries
            as ``save_file`` makes them.
        copy: ``copy(dst, src)`` queues the device-to-host copy (default ``dst.copy_(src,
            non_blocking=True)``).
        sync: ``sync(device)`` waits for the copies queued for that device (default: its current
            stream's ``synchronize()``), once per device per save.
        exclusive: the staging serves one :class:`keepsake.CheckpointManager` only (as the one a
            manager makes for itself): its buffer becomes the manager's background-save snapshot
            (:meth:`stage_image`), so device tensors are copied once, into the file's image, and
            the library copies them no further. Not for ``save_checkpoint(staging=)`` or a second
            manager: a background save may still be writing from the buffer.

    One save at a time: :meth:`entry` for each tensor while the state is flattened, then
    :meth:`stage` with the entries (the copies and the wait), the library call, then :meth:`done`.
    """

    def __init__(self, alloc: Optional[Callable[[int], Any]] = None,
                 is_device: Optional[Callable[[Any], bool]] = None,
                 copy: Optional[Callable[[Any, Any], None]] = None,
                 sync: Optional[Callable[[Any], None]] = None, exclusive: bool = False) -> None:
        self.exclusive = exclusive
        self._alloc = alloc or pinned
        self._is_device = is_device or _is_cuda
        self._copy = copy or _copy_async
        self._sync = sync or _sync_stream
        self._buf: Any = None
        self._given = False  # the buffer is the library's staging (stage_image)
        self._retired: List[Any] = []
        self._jobs: Dict[int, Tuple[tuple, Any]] = {}  # id(placeholder entry) -> (placeholder, source)
        self._closed = False
        self.allocations = 0  # buffers allocated over the staging's life

    @property
    def nbytes(self) -> int:
        """Bytes of host memory held."""
        return 0 if self._buf is None else self._buf.numel()

    @property
    def buffer(self) -> Any:
        """The staging buffer (a 1-D uint8 tensor), or None before the first save with device tensors."""
        return self._buf

    # ---- one save ----

    def entry(self, name: str, t: Any, keep: list) -> tuple:
        """The C entry of tensor `t`. A device tensor's entry is a placeholder until :meth:`stage`
        copies it; any other's is ``torch_entry``'s."""
        if not self._is_device(t) or t.numel() == 0:
            return _tensors.torch_entry(name, t, keep)
        if self._closed:
            raise RuntimeError("keepsake: the host staging is closed")
        code = _tensors.torch_code(name, t)
        t = t.detach()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        placeholder = (name, code, tuple(t.shape), 0, t.numel() * t.element_size())
        self._jobs[id(placeholder)] = (placeholder, t)
        return placeholder

    def stage(self, entries: List[tuple]) -> None:
        """Copies the device tensors of `entries` into the buffer (grown first when too small),
        waits once per device, and points their entries at the copies (in place)."""
        if not self._jobs:
            return
        if self._given:
            raise RuntimeError("keepsake: this HostStaging is a manager's exclusive staging (its buffer is the "
                               "manager's background-save snapshot); give other saves a staging of their own")
        slots, size = [], 0
        for i, e in enumerate(entries):
            job = self._jobs.get(id(e))
            if job is not None and job[0] is e:
                slots.append((i, size, job[1]))
                size = (size + e[4] + ALIGN - 1) // ALIGN * ALIGN
        if self.nbytes < size:
            want = (size + (size // 8 if self._buf is not None else 0) + GRAIN - 1) // GRAIN * GRAIN
            self._buf = None  # the old buffer goes before the new one is taken
            self._buf = self._alloc(want)
            self.allocations += 1
        devices: Dict[str, Any] = {}
        try:
            for i, off, t in slots:
                name, code, shape, _, n = entries[i]
                dst = self._buf[off:off + n].view(t.dtype).view(t.shape)
                self._copy(dst, t)
                devices.setdefault(str(t.device), t.device)
                entries[i] = (name, code, shape, dst.data_ptr(), n)
        finally:
            for d in devices.values():  # even after a failed copy: none may still be writing
                self._sync(d)

    def stage_image(self, entries: List[tuple], place: Callable[[int, int], Tuple[int, Optional[Dict[str, int]]]]
                    ) -> None:
        """:meth:`stage` straight into a background save's snapshot: the buffer is the save's
        image, and each device tensor is copied to the offset the library gives it there, so the
        library copies none of them again (one host copy of the state, not two).

        ``place(address, size)`` is ``ks_image_get`` for this state on the file image over the
        buffer (the manager makes one, ``ks_image_create``, when the buffer is new): it waits for
        a save in flight (which may still be writing from the buffer), then returns (the bytes the
        image takes, ``{name: offset}``), or (bytes, None) when the buffer is too small, which is
        then grown and given again. The image holds the buffer while a save may write from it."""
        if not self._jobs:
            return
        need, offsets = place(*self._image_span())
        if offsets is None:
            if self._closed:
                raise RuntimeError("keepsake: the host staging is closed")
            want = (need + need // 8 + IMAGE_ALIGN + GRAIN - 1) // GRAIN * GRAIN
            old = self._buf  # still the library's until the new one is given: freed after that
            self._buf = self._alloc(want)
            self.allocations += 1
            need, offsets = place(*self._image_span())
            if offsets is not None:
                del old
            elif old is not None:
                self._retired.append(old)
            if offsets is None:
                raise RuntimeError(f"keepsake: the staging does not fit a {need}-byte image")
        self._given = True
        base = self._image_span()[0] - self._buf.data_ptr()
        devices: Dict[str, Any] = {}
        try:
            for i, e in enumerate(entries):
                job = self._jobs.get(id(e))
                if job is None or job[0] is not e:
                    continue
                name, code, shape, _, n = e
                at = base + offsets[name]
                # As bytes: the image packs tensors, so a slice need not be aligned for the dtype.
                src = job[1] if job[1].is_contiguous() else job[1].contiguous()
                dst = self._buf[at:at + n]
                self._copy(dst, src.reshape(-1).view(torch_uint8()))
                devices.setdefault(str(job[1].device), job[1].device)
                entries[i] = (name, code, shape, dst.data_ptr(), n)
        finally:
            for d in devices.values():
                self._sync(d)

    def _image_span(self) -> Tuple[int, int]:
        """(address, size) of the buffer from its first IMAGE_ALIGN boundary; (0, 0) when none."""
        if self._buf is None:
            return 0, 0
        ptr = self._buf.data_ptr()
        skip = -ptr % IMAGE_ALIGN
        return ptr + skip, max(0, self._buf.numel() - skip)

    def done(self) -> None:
        """The library has the bytes (written, or copied by a background save): the buffer is the
        next save's again. Safe after a failed save."""
        self._jobs.clear()

    def close(self) -> None:
        """Frees the buffer; the staging stages nothing afterwards."""
        self._buf = None
        self._retired.clear()
        self._jobs.clear()
        self._closed = True

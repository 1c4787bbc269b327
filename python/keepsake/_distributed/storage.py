"""torch.distributed.checkpoint (DCP) storage in keepsake's sharded layout.

``dcp.save(sd, storage_writer=KeepsakeWriter(path))``, ``dcp.async_save(...)`` and
``dcp.load(sd, storage_reader=KeepsakeReader(path))`` work unchanged. What is written is a keepsake
sharded checkpoint directory (docs/FORMAT.md section 9): one ``rank-XXXXX-of-YYYYY.keepsake`` per
rank, written durably and hashed by the C library, then ``model.safetensors.index.json``, written
last and durably by the coordinator in ``finish``: the commit. A job that dies before that leaves
no index, so no checkpoint.

``path`` is a local directory, ``s3://bucket/prefix`` (write and read) or ``http(s)://...`` (read
only): every file goes through the C library's storage layer (ks_storage_open). On S3 each file is
staged in memory and uploaded whole when the library renames it onto its name, so the commit
order holds there too: rank objects first, the index object last.

Nothing is pickled: DCP's ``Metadata`` is rebuilt on read from the index and rank 0's header, and
non-tensor values are stored in a typed JSON form (section 9.1), handed back to the planner as
bytes that ``torch.save`` made from the decoded plain value.

The layout, the index, the commit and every check are the C library's (``keepsake._keepsake``'s
``shard_*`` functions, include/keepsake/binding.h's ``ks_shard_dcp_*``): which items are replicated
entries and which are chunks, how non-tensor values and per-rank entries are named, the names DCP's
keys may not take, the record of DCP's planner data, and what a load can ask for. This module maps
DCP's plans onto them.

A rank's own items (its generators, data positions and local metric states: ``local_items``) are
not DCP items: each rank hands them to the writer, which stores them in its own rank file under the
names a C program gives them (``rng/0/...``, ``state/dataset_state/<name>/...``,
``state/train_metrics/<name>/...``), so an MPI program's loader reads them too.
"""
from __future__ import annotations

import dataclasses
import io
import os
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.futures import Future
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan,
                                                  SavePlanner, WriteItem, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from .._core import errors as _errors, tensors as _tensors
from .._core import native as _native
from .._core.paths import PathLike, fspath
from .sync import sync, synced, unsync  # noqa: F401 - metrics across ranks (ks_metric_fold)
from .local import LocalItems, local_items, restore_local  # noqa: F401 - per-rank items at any world size

_LOCAL = _native.shard_names()["local"]


def _local_key(fqn: Any) -> bool:
    return isinstance(fqn, str) and fqn.startswith(_LOCAL)


def _carries_local(item: WriteItem) -> bool:
    """Whether a plan item is the one by which a rank hands the writer its per-rank entries."""
    return item.type == WriteItemType.BYTE_IO and _local_key(item.index.fqn)

__all__ = ["KeepsakeWriter", "KeepsakeReader", "encode_object", "decode_object", "OBJECT_PREFIX", "INDEX_NAME",
           "sync", "unsync", "synced", "local_items", "restore_local"]

INDEX_NAME = "model.safetensors.index.json"
#: Tensor name prefix of a non-tensor value: ``OBJECT_PREFIX + fqn`` is a 1-d U8 tensor of typed JSON
#: (the C library's name: docs/FORMAT.md 9.1).
OBJECT_PREFIX = _native.shard_names()["object"]


# ----------------------------------------------------------------------------------------------
# Non-tensor values: typed JSON (docs/FORMAT.md section 9.1), never pickle. The rules (type tags,
# limits, what is refused) are the C library's (include/keepsake/binding/dcpvalue.h).
# ----------------------------------------------------------------------------------------------

def encode_object(value: Any) -> bytes:
    """The typed JSON (ASCII) keepsake stores for a non-tensor value; raises UnsupportedError (or LimitError)."""
    return _native.dcp_encode(value)


def decode_object(data: bytes, key: str = "") -> Any:
    """The value of encode_object's bytes; FormatError (or LimitError) for anything else. Never unpickles."""
    return _native.dcp_decode(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data, key)


def _torch_save_bytes(value: Any) -> io.BytesIO:
    """What DCP's planners expect for a non-tensor value: torch.save's bytes (of a value we decoded)."""
    buf = io.BytesIO()
    torch.save(value, buf)
    buf.seek(0)
    return buf


# ----------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _RankPlan:
    """What the coordinator tells each rank in its global plan (travels over the process group)."""
    rank: int
    world_size: int
    planner_data: Optional[str]  # typed JSON of the merged planner data, for rank 0's file only
    per_rank: bool = False  # some rank hands the writer per-rank entries: every file records the globs
    dcp: bool = True  # the save has DCP items: every file records DCP's record


@dataclasses.dataclass(frozen=True)
class _RankFile:
    """A rank's file as the index records it, returned to the coordinator in a WriteResult."""
    rank: int
    size: int
    xxh3: int  # of its length and header (docs/FORMAT.md section 9, item 3)


def _location(checkpoint_id: PathLike, write: bool) -> str:
    """The checkpoint's location as the C library opens it: a local path (file:// taken off), s3://
    or http(s):// (UnsupportedError when writing: read only)."""
    path = fspath(checkpoint_id)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return _native.shard_location(path, write=write)


class KeepsakeWriter(StorageWriter):
    """A DCP ``StorageWriter`` that writes a keepsake sharded checkpoint directory.

    Args:
        path: the checkpoint directory (created with its parents when missing), or
            ``s3://bucket/prefix`` (each file uploaded whole when complete, the index last).
            ``http(s)://`` is read only: refused with UnsupportedError.
        sync_files: fsync every file and directory (the default). False is faster and not durable.
        overwrite: a directory that already holds a committed checkpoint is overwritten, as torch's
            ``FileSystemWriter`` overwrites (the default): its index is removed durably before any
            rank writes, and the new one is written last, so a save that dies midway leaves no
            checkpoint rather than a mix of two. False refuses such a directory (ExistsError).

    Its state reads back under the same names as torch's own DCP checkpoint of that state
    (``keepsake convert``, ``keepsake diff``: each key's path in the saved state dict). For torch's
    ``HuggingFaceStorageReader`` and transformers, write its Hugging Face layout with
    ``keepsake convert DIR OUT --hf`` (:func:`keepsake.distributed_import.convert_dcp` with ``hf=True``).
    """

    def __init__(self, path: PathLike, *, sync_files: bool = True, overwrite: bool = True) -> None:
        super().__init__()
        self.path = _location(path, write=True)
        self.sync_files = sync_files
        self.overwrite = overwrite
        self.save_id = str(uuid.uuid4())
        self.is_coordinator = False
        self.use_collectives = True

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        """Starts a new save, into ``checkpoint_id`` when given (DCP calls this before each save)."""
        if checkpoint_id is not None:
            self.path = _location(checkpoint_id, write=True)
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Records whether this rank coordinates and whether DCP uses collectives."""
        self.is_coordinator = is_coordinator
        self.use_collectives = kwargs.get("use_collectives", True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Creates the checkpoint directory (and its parents); the plan is unchanged."""
        _native.shard_prepare_dir(self.path, fsync=self.sync_files)
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """On the coordinator: refuses or uncommits an existing checkpoint, then gives each rank its
        place (rank, world size), whether the save has per-rank entries and DCP items (which every
        file records), and rank 0 the merged planner data to record.
        """
        if not self.use_collectives:
            raise _errors.error(_errors.UnsupportedError, "a keepsake checkpoint is committed once for all ranks: "
                                "save with use_collectives=True")
        if _native.shard_committed(self.path):
            if not self.overwrite:
                raise _errors.error(_errors.ExistsError, f"{self.path} already holds a checkpoint (and "
                                    "KeepsakeWriter(..., overwrite=False) refuses to replace it)", file=self.path)
            _native.shard_uncommit(self.path, fsync=self.sync_files)  # before any rank writes
        carriers = [any(_carries_local(it) for it in p.items) for p in plans]
        per_rank = self._per_rank_entries or any(carriers)
        has_dcp = any(not _carries_local(it) for p in plans for it in p.items)
        merged: Dict[Any, Any] = {}
        for p in plans:
            if isinstance(p.planner_data, dict):
                merged.update({k: v for k, v in p.planner_data.items() if not _local_key(k)})
        try:
            planner_data = encode_object(merged).decode("ascii") if merged else None
        except _errors.KeepsakeError:
            planner_data = None  # a custom planner's data: only its flattening mappings are kept
        return [dataclasses.replace(p, storage_data=_RankPlan(i, len(plans), planner_data if i == 0 else None,
                                                              per_rank, has_dcp))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        """Writes this rank's file: DCP's items of its plan, and the per-rank entries it was handed
        (``local_items``, or a subclass's ``_local_state``), placed by the C library
        (ks_shard_dcp_write_rank); the future holds the WriteResults, this rank's file size and hash last.
        """
        where = plan.storage_data
        if not isinstance(where, _RankPlan):
            raise _errors.error(_errors.StateError, "write_data before prepare_global_plan")
        items: List[tuple] = []
        keep: List[Any] = []
        results: List[WriteResult] = []
        local = self._local_state(where.rank)
        for item in plan.items:
            if _carries_local(item):
                carried = planner.lookup_object(item.index)
                if not isinstance(carried, LocalItems):
                    raise _errors.error(_errors.InvalidError, f"{item.index.fqn}: a name keepsake keeps for the "
                                        "items local_items() returns", key=item.index.fqn)
                if local is not None:
                    raise _errors.error(_errors.InvalidError, "a rank's per-rank items were given twice",
                                        key=item.index.fqn)
                local = carried
                results.append(WriteResult(index=item.index, size_in_bytes=0, storage_data=None))
                continue
            items.append(self._item(item, planner, keep))
            results.append(WriteResult(index=item.index, size_in_bytes=items[-1][0][4], storage_data=None))
        entries = local.entries if local is not None else []
        size, xxh3 = _native.shard_dcp_write_rank(
            self.path, where.rank, where.world_size, items, entries, local.metadata if local is not None else None,
            local.metrics if local is not None else None, where.per_rank, where.dcp, where.planner_data,
            self.sync_files)
        del keep
        results.append(WriteResult(index=MetadataIndex(self.save_id, index=where.rank), size_in_bytes=size,
                                   storage_data=_RankFile(where.rank, size, xxh3)))
        fut: Future = Future()
        fut.set_result(results)
        return fut

    #: Whether this writer's saves hand the writer per-rank entries on every rank (the distributed
    #: manager's); a plain save has them when some rank's state dict holds ``local_items()``.
    _per_rank_entries = False

    def _local_state(self, rank: int) -> Optional["LocalItems"]:
        """The per-rank entries rank `rank` adds to its file beside DCP's items (none; the distributed
        manager's subclass gives its whole state, named as a C program names it)."""
        return None

    @staticmethod
    def _item(item: WriteItem, planner: SavePlanner, keep: list) -> tuple:
        """One plan item as ks_shard_dcp_write_rank takes it: (entry, object, whole, global_shape, offsets)."""
        fqn = item.index.fqn
        if item.type == WriteItemType.BYTE_IO:
            lookup = getattr(planner, "lookup_object", None)
            if lookup is None:
                raise _errors.error(_errors.UnsupportedError, f"{fqn}: the planner has no lookup_object, so the "
                                    "value could only be stored pickled", key=fqn)
            data = torch.frombuffer(bytearray(encode_object(lookup(item.index))), dtype=torch.uint8)
            return (_tensors.torch_entry(fqn, data, keep), True, True, (), ())
        t = planner.resolve_data(item)
        if not isinstance(t, torch.Tensor) or item.tensor_data is None:
            raise _errors.error(_errors.InvalidError, f"{fqn}: a tensor item resolved to a {type(t).__name__}", key=fqn)
        td = item.tensor_data
        return (_tensors.torch_entry(fqn, t, keep), False, item.type == WriteItemType.TENSOR, tuple(td.size),
                tuple(td.chunk.offsets))

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """On the coordinator: writes the index over every rank's file (size and hash), which commits
        the checkpoint.
        """
        files: Dict[int, Tuple[int, int]] = {}
        for per_rank in results:
            for wr in per_rank:
                if isinstance(wr.storage_data, _RankFile):
                    files[wr.storage_data.rank] = (wr.storage_data.size, wr.storage_data.xxh3)
        world = len(results)
        if sorted(files) != list(range(world)):
            raise _errors.error(_errors.StateError, f"finish: {len(files)} rank files reported for {world} ranks")
        _native.shard_write_index(self.path, [files[r] for r in range(world)], fsync=self.sync_files)

    def storage_meta(self) -> Optional[StorageMeta]:
        """The checkpoint's location and this save's id."""
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint directory or remote location being written."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        """True when ``checkpoint_id`` is a location this writer can write to."""
        try:
            _location(checkpoint_id, write=True)
        except (TypeError, _errors.KeepsakeError):
            return False
        return True


# ----------------------------------------------------------------------------------------------
# Reader
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Stored:
    """Where one stored item is: the saved rank whose file holds it and its entry there."""
    file: int
    name: str
    kind: str  # "tensor", "object" (typed JSON tensor) or "scalar" (a keepsake scalar of a C-written file)
    dtype: int = -1
    shape: Tuple[int, ...] = ()
    value: Any = None


def _torch_dtype(code: int, name: str) -> Any:
    by_code = _tensors.torch_maps()[1]
    dt = by_code[code] if 0 <= code < len(by_code) else None
    if dt is None:
        raise _errors.error(_errors.DTypeError, f"{name}: dtype code {code} has no torch dtype here", key=name)
    return dt


class KeepsakeReader(StorageReader):
    """A DCP ``StorageReader`` for keepsake sharded checkpoint directories (written by
    :class:`KeepsakeWriter` or by the C library).

    On ``read_metadata`` the index is validated and held against every rank file's size and header
    (ks_shard_check: the length and header hash to the index's header_xxh3, so a header edited in
    place or a rank file swapped for another of the same size is a ChecksumError, and the header
    agrees with the index); each tensor a plan asks for is read alone (pread of its byte range, or
    one ranged GET) and its checksum verified before it is used. A checkpoint written at any world
    size loads at any other: DCP's planner asks for the regions each rank needs.

    Args:
        path: the checkpoint directory, ``s3://bucket/prefix`` or ``http(s)://host/path``. On a
            remote location the header check costs a few ranged reads per rank file, never its data.
        verify_files: also hash every rank file, whole, against the index in ``read_metadata``
            (every rank reads every file once): a damaged byte anywhere is then a ChecksumError
            before anything is planned, not only in the tensors a plan reads.

    What a C-written checkpoint exposes: its sharded tensors, and rank 0's replicated tensors and
    scalars. Per-rank entries (RNG, data positions, local metric states) have no DCP equivalent and
    are left out; load those with keepsake's own sharded loader.
    """

    def __init__(self, path: PathLike, *, verify_files: bool = False) -> None:
        super().__init__()
        self.path = _location(path, write=False)
        self.verify_files = verify_files
        self.load_id = str(uuid.uuid4())
        self.storage_data: Dict[MetadataIndex, _Stored] = {}
        self._files: List[str] = []

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        """Starts a new load, from ``checkpoint_id`` when given (DCP calls this before each load)."""
        if checkpoint_id is not None:
            self.path = _location(checkpoint_id, write=False)
        self.load_id = str(uuid.uuid4())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata for the checkpoint: the index checked against every rank file's size and
        header (and hashed whole with ``verify_files``), and what a load can ask for (the C library's
        ks_shard_dcp_list: the sharded tensors, and rank 0's other entries, objects and scalars).
        """
        if kwargs.get("rank") is not None:
            raise _errors.error(_errors.NotFoundError, "keepsake checkpoints have no rank-local metadata",
                                file=self.path)
        # Sizes and headers (one or two ranged reads per remote rank file, never its tensors).
        listed, planner_data, files = _native.shard_dcp_list(self.path)
        if self.verify_files:
            _native.shard_verify(self.path)
        self._files = list(files)
        md: Dict[str, Any] = {}
        storage: Dict[MetadataIndex, _Stored] = {}
        for fqn, name, kind, code, gshape, chunks, value in listed:
            if kind == "scalar":
                md[fqn] = BytesStorageMetadata()
                storage[MetadataIndex(fqn)] = _Stored(0, name, "scalar", value=value)
                continue
            if chunks is None:  # a whole entry of rank 0's file
                chunks = [(0, (0,) * len(gshape), gshape)]
            if kind == "object":
                file, _offsets, shape = chunks[0]
                md[fqn] = BytesStorageMetadata()
                storage[MetadataIndex(fqn)] = _Stored(file, name, "object", code, tuple(shape))
                continue
            md[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_torch_dtype(code, name)), size=torch.Size(gshape),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(sz)) for _f, o, sz in chunks])
            for file, offsets, shape in chunks:
                storage[MetadataIndex(fqn, offsets)] = _Stored(file, name, "tensor", code, tuple(shape))
        pd = decode_object(planner_data.encode("utf-8"), key="planner_data") if planner_data is not None else None
        return Metadata(state_dict_metadata=md, planner_data=pd, storage_data=storage,
                        storage_meta=StorageMeta(checkpoint_id=self.path, load_id=self.load_id))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Keeps where each stored item is (from the metadata) for :meth:`read_data`."""
        self.storage_data = metadata.storage_data
        if not self._files:  # metadata read elsewhere: the file names come from the index
            self._files = [f for f, _size, _hash in _native.shard_index(self.path, check=False)["files"]]

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Returns the plan unchanged: every rank reads what it needs itself."""
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        """Returns the plans unchanged."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        """Reads each stored tensor or object the plan asks for once, verifying its checksum, and
        hands it to the planner; the future is already done.
        """
        by_entry: Dict[Tuple[int, str], List[ReadItem]] = {}
        for req in plan.items:
            where = self.storage_data[req.storage_index]
            by_entry.setdefault((where.file, where.name), []).append(req)
        files: Dict[int, Any] = {}
        try:
            for (file, name), reqs in sorted(by_entry.items()):
                where = self.storage_data[reqs[0].storage_index]
                if where.kind == "scalar":
                    for req in reqs:
                        planner.load_bytes(req, _torch_save_bytes(where.value))
                    continue
                if file not in files:
                    files[file] = _native.ShardFile(os.path.join(self.path, self._files[file]))
                self._read_entry(files[file], where, reqs, planner)
        finally:
            for f in files.values():
                f.close()
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @staticmethod
    def _read_entry(f: Any, where: _Stored, reqs: List[ReadItem], planner: LoadPlanner) -> None:
        """Reads one stored tensor once (verified) and serves every request of the plan for it."""
        dt = _torch_dtype(where.dtype, where.name)
        if where.kind == "tensor" and len(reqs) == 1 and KeepsakeReader._read_into(f, where, dt, reqs[0], planner):
            return
        stored = torch.empty(where.shape, dtype=dt)
        if stored.numel():
            f.fetch(where.name, stored.reshape(-1).view(torch.uint8).numpy())
        if where.kind == "object":
            value = decode_object(stored.numpy().tobytes(), key=where.name)
            for req in reqs:
                planner.load_bytes(req, _torch_save_bytes(value))
            return
        for req in reqs:
            if req.type != LoadItemType.TENSOR:
                raise _errors.error(_errors.MismatchError, f"{where.name}: a tensor is asked for as bytes",
                                    key=where.name)
            part = stored
            for d, (off, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                part = part.narrow(d, off, n)
            target = planner.resolve_tensor(req).detach()
            if target.size() != part.size():
                raise _errors.error(_errors.ShapeError, f"{where.name}: the plan asks for {tuple(part.size())} into "
                                    f"{tuple(target.size())}", key=where.name)
            target.copy_(part)
            planner.commit_tensor(req, target)

    @staticmethod
    def _read_into(f: Any, where: _Stored, dt: Any, req: ReadItem, planner: LoadPlanner) -> bool:
        """The common case of a load at the saved layout: the plan wants the whole stored tensor in a
        contiguous CPU tensor of its dtype, so its bytes are read straight into it (no staging tensor,
        no copy). False, having done nothing, when the request is anything else."""
        if req.type != LoadItemType.TENSOR or tuple(req.lengths) != where.shape or any(req.storage_offsets):
            return False
        target = planner.resolve_tensor(req).detach()
        if (target.dtype != dt or tuple(target.shape) != where.shape or target.device.type != "cpu"
                or not target.is_contiguous()):
            return False
        if target.numel():
            # Verified as it is read; on a ChecksumError the load fails (as it would after the copy).
            f.fetch(where.name, target.reshape(-1).view(torch.uint8).numpy())
        planner.commit_tensor(req, target)
        return True

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint directory or remote location being read."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        """True when ``checkpoint_id`` holds a committed keepsake sharded checkpoint."""
        try:
            path = _location(checkpoint_id, write=False)
            return bool(_native.shard_committed(path))
        except (TypeError, _errors.KeepsakeError):
            return False

"""keepsake.CheckpointManager(run_dir, ..., distributed=True): the C checkpoint manager over the
sharded checkpoint directories a torch.distributed run writes with DCP (a
:class:`DistributedCheckpointManager`, the local manager's sibling: keepsake._manager.base).

Every rule is the C library's sharded manager (``ks_ckpt_opts.sharded``, include/keepsake/manager.h),
as the MPI programs use it (``ks_dist_ckpt_*``, src/dist/manager.c): the directory names (the
template, ``ep{epoch}-ba{batch}`` by default), which directories are checkpoints (an index that
validates), removing the directories of saves that died (no index), ``latest``, the retention
policies (keep the newest N, the best N by a metric stored in rank 0's file, every N-th, one per
period), the run directory's lock (rank 0 holds it), the save triggers, and which directory
autoresume takes (the newest whose rank files all verify against the index). This module makes the
same collective decisions over torch.distributed that src/dist/manager.c makes over MPI, and
writes and reads each directory with ``dcp.save`` / ``dcp.async_save`` / ``dcp.load`` through
keepsake's DCP storage (:mod:`keepsake.distributed`, keepsake._distributed.storage).

What a directory holds (docs/PYTHON.md, "torch.distributed"):

- DCP items: ``model`` and ``optim`` (``get_state_dict``: FSDP2 / DTensor shards stay sharded),
  the replicated ``extra``, ``schedulers/<name>`` and ``callbacks/<name>`` (their
  ``state_dict()``; names as ``save_checkpoint`` gives them).
- keepsake entries, not DCP items, that each rank hands the writer (keepsake._distributed.local's
  ``state_items``), named and placed by the C library as an MPI program's
  (``ks_shard_dcp_write_rank``, docs/FORMAT.md section 9): the timestamp, run name and seed
  (replicated: in rank 0's file; the timestamp also in every rank file's shard record, which the
  index checks), and this rank's own items
  in its own file: its generators, data positions and local train and eval metric states. In rank
  0's file each metric's ``_computed`` is its value over every rank
  (``keepsake.distributed.synced``) when that is a finite scalar: what ``keep_best`` ranks by.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, MutableMapping, Optional, Tuple

from .._core import errors as _errors
from .._core import native as _n
from .._core.paths import PathLike
from .._manager.base import EVAL_METRICS, TRAIN_METRICS, ManagerBase, Preempted  # noqa: F401 - the constants' home
from .._state import checkpoint as _state
from . import local as _dist_local

TIMESTAMP = _state.TIMESTAMP


def _dist() -> Any:
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise _errors.error(_errors.StateError, "CheckpointManager(distributed=True) needs an initialised "
                            "torch.distributed process group (dist.init_process_group)")
    return dist


def _writer_class() -> type:
    """KeepsakeWriter that hands each rank's keepsake entries (its state, named as a C program names
    it) to the C writer beside DCP's items. Built lazily: keepsake.distributed imports torch."""
    global _Writer
    if _Writer is not None:
        return _Writer
    from . import storage as _d

    class ManagedWriter(_d.KeepsakeWriter):
        """``local`` (a keepsake._distributed.local.LocalItems) is this rank's state: the C writer keeps
        its per-rank entries in this rank's file and its replicated ones (the timestamp) in rank
        0's, and records the timestamp in every file's shard record."""

        _per_rank_entries = True

        def __init__(self, path: PathLike, local: Any, **kw: Any) -> None:
            super().__init__(path, **kw)
            self.local = local

        def _local_state(self, rank: int) -> Any:
            return self.local

    _Writer = ManagedWriter
    return _Writer


_Writer: Optional[type] = None


def _checkpoint_exception() -> type:
    from torch.distributed.checkpoint.api import CheckpointException
    return CheckpointException


def _save_failure(e: BaseException) -> bool:
    """A failure of the save itself (storage, keepsake), which ``on_save_error="warn"`` reports and
    goes on from: a KeepsakeError, an OSError, or DCP's CheckpointException whose every rank's
    failure is one. Anything else (a bug, an interrupt) stops the run."""
    if isinstance(e, (_errors.KeepsakeError, OSError)):
        return True
    return isinstance(e, _checkpoint_exception()) and bool(e.failures) and \
        all(_save_failure(f[0]) for f in e.failures.values())


class DistributedCheckpointManager(ManagerBase):
    """The checkpoint manager of a torch.distributed run: every rank constructs it, with the same
    arguments, and calls :meth:`step`, :meth:`save`, :meth:`autoresume`, :meth:`wait` and
    :meth:`close` at the same points (they are collective).

    Args (the components and the :class:`keepsake.CheckpointOptions` of
    :class:`keepsake.CheckpointManager`, plus):
        model: the (FSDP2, DDP or plain) module; ``optimizers``: an optimizer or a list of them:
            saved and loaded with ``get_state_dict`` / ``set_state_dict``.
        schedulers: an LR scheduler, a list or a dict name -> scheduler; ``callbacks``: a dict
            name -> object with ``state_dict()`` / ``load_state_dict()`` (or a dict), or a list:
            replicated (rank 0's is what is kept), named as ``save_checkpoint`` names them.
        train_metrics: torchmetrics metrics; ``eval_metrics``: a dict label -> metrics, or metrics
            (label ``"eval"``). Each rank's local states are saved and restored, and the value
            computed over every rank goes into rank 0's file for ``keep_best``
            (``best_metric="train_metrics/<name>"``, ``"eval_metrics/<label>/<name>"``).
        dataset_state: dict name -> object with ``state_dict()`` (or a dict), per rank.
        rng: save and restore each rank's generators.
        extra: a replicated dict of tensors and plain values (rank 0's is what is kept).
        options: ``upload_to`` and ``cache_dir`` are not supported (UnsupportedError): the C
            manager uploads and caches checkpoint files, not sharded directories.
        process_group: the ranks that save (default: the whole job). The manager's collectives
            run on two gloo groups of its own over those ranks (one for async saves).
        sync_files: fsync every rank file and the index (default).
    """

    def __init__(self, run_dir: PathLike, *, process_group: Any = None, sync_files: bool = True, **kw: Any) -> None:
        dist = _dist()
        super().__init__(run_dir, **kw)
        o = self.options
        for name in ("upload_to", "cache_dir"):
            if getattr(o, name) is not None:
                raise _errors.error(_errors.UnsupportedError, f"CheckpointManager(distributed=True): {name} is not "
                                    "supported: the C checkpoint manager uploads and caches checkpoint files, not "
                                    "sharded checkpoint directories (ks_ckpt_opts.upload_io with sharded); give an "
                                    "s3:// run_dir to save straight to the bucket")
        for kind in ("schedulers", "callbacks"):  # refused now (two of one class), not at the first save
            _state._named(self.components[kind], kind)
        self.sync_files = sync_files
        self.last_resumed: Optional[str] = None
        # The background save in flight: (its future, its directory). Every rank holds one or none
        # at the same call: save() starts it on every rank, _finish_pending ends it on every rank.
        self._pending: Optional[Tuple[Any, str]] = None
        # The exception _agree last raised when every failing rank's was a save failure (_save_failure):
        # the one step() may turn into a warning, on every rank alike.
        self._warnable: Optional[BaseException] = None
        self._ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        # Control collectives (decisions, agreement, blocking DCP) and async DCP on groups of their
        # own: gloo (CPU tensors, whatever the training backend), never interleaved with training's.
        self._ctl = dist.new_group(ranks=self._ranks, backend="gloo")
        self._async_group = dist.new_group(ranks=self._ranks, backend="gloo") if o.async_save else None
        self.rank = dist.get_rank(self._ctl)
        self.world_size = dist.get_world_size(self._ctl)
        # Rank 0 owns the run directory (lock, dead saves, `latest`, retention, the choice of what to
        # resume); the other ranks' managers only name directories (ks_ckpt_manager_dir_path).
        err = None
        try:
            self._native = self._native_manager(owner=self.rank == 0, sharded=True)
        except _errors.KeepsakeError as e:
            err = e
        self._agree(err, "creating the checkpoint manager")
        self._install_preemption()

    # ---- collectives ----

    def _agree(self, err: Optional[BaseException], what: str) -> None:
        """Every rank raises when any rank failed (the failing one its own error, the others a
        StateError), as ks_dist_agree. Whether the failure is a save failure (every failing rank's
        error is one, _save_failure) is agreed too: then the exception raised is ``self._warnable``
        on every rank, so step()'s on_save_error takes the same branch on every rank."""
        import torch
        dist = _dist()
        flag = torch.tensor([0 if err is None else self.rank + 1, int(err is not None and not _save_failure(err))],
                            dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._ctl)
        failed, fatal = int(flag[0].item()), bool(flag[1].item())
        if not failed:
            return
        exc = err if err is not None else _errors.error(_errors.StateError, f"{what} failed on rank {failed - 1}")
        self._warnable = None if fatal else exc
        raise exc

    def _broadcast_choice(self, s: Optional[str], *ints: int) -> Tuple[Optional[str], List[int]]:
        """Rank 0's string (or None) and integers, on every rank."""
        import torch
        dist = _dist()
        data = s.encode("utf-8", "surrogateescape") if (self.rank == 0 and s is not None) else b""
        n = torch.tensor([len(data) if (self.rank == 0 and s is not None) else -1, *ints], dtype=torch.int64)
        dist.broadcast(n, group_src=0, group=self._ctl)
        k, got = int(n[0].item()), [int(v) for v in n[1:].tolist()]
        if k < 0:
            return None, got
        buf = torch.zeros(k, dtype=torch.uint8)
        if self.rank == 0 and k:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, group_src=0, group=self._ctl)
        return bytes(buf.numpy()).decode("utf-8", "surrogateescape"), got

    # ---- what is saved ----

    def _replicated(self) -> Dict[str, Any]:
        """The DCP state dict without this rank's items: model and optimizer (get_state_dict),
        extra, schedulers and callbacks."""
        from torch.distributed.checkpoint.state_dict import get_state_dict
        sd: Dict[str, Any] = {}
        model, opts = self.components["model"], self.components["optimizers"]
        if model is not None:
            msd, osd = get_state_dict(model, opts if opts is not None else [])
            sd["model"] = msd
            if opts is not None:
                sd["optim"] = osd
        if self.extra:
            sd["extra"] = dict(self.extra)
        for kind in ("schedulers", "callbacks"):
            for name, obj in _state._named(self.components[kind], kind):
                sd[f"{kind}/{name}"] = _state._state_of(obj)
        return sd

    def _local_items(self, computed: Dict[str, Any]) -> Any:
        """This rank's keepsake entries beside the DCP items (copied now): the timestamp and the run's
        name and seed (replicated: kept in rank 0's file, as a C program's), its generators, data
        positions and metric states; on rank 0 each metric's ``_computed`` is ``computed``'s value
        over every rank where it has one."""
        c = self.components
        shown = [(path, m, m._computed) for path, m in self._named_metrics() if self.rank == 0 and path in computed]
        try:  # rank 0's metric objects show the value over every rank while their state is copied
            for path, m, _own in shown:
                m._computed = computed[path]
            return _dist_local.state_items(timestamp=self.timestamp, train_metrics=c["train_metrics"],
                                           eval_metrics=c["eval_metrics"], dataset_state=c["dataset_state"],
                                           rng=self.rng, run_name=self.run_name, rank_zero_seed=self.rank_zero_seed)
        finally:
            for _path, m, own in shown:
                m._computed = own

    def _synced_values(self) -> Dict[str, Any]:
        """The value of each train and eval metric over every rank, by where it is saved, when it is a
        finite scalar (collective; a metric no rank updated has none)."""
        import torch
        from .sync import synced
        out: Dict[str, Any] = {}
        for path, m in self._named_metrics():
            with synced(m, self._ctl):
                v = m.compute() if m._update_count else None  # the sum of every rank's
            if isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point() and bool(torch.isfinite(v)):
                out[path] = v.detach().reshape(()).cpu().clone()  # its own dtype, as every rank file holds it
        return out

    # ---- saving ----

    def save(self, blocking: bool = True) -> str:
        """Saves a checkpoint directory now on every rank (collective); returns its path.

        Blocking: ``dcp.save``, then (once every rank's returned) rank 0 commits it: ``latest``
        and retention, which deletes pruned directories. ``blocking=False``: ``dcp.async_save``
        (staged before it returns) on the manager's own group; it is committed at the first
        :meth:`step` at which every rank's save is done, or at the next :meth:`save`, :meth:`wait`
        or :meth:`close`, which raise its error on every rank.

        Every step that can fail on some ranks only is agreed (every rank raises) before the next
        collective, so no rank is left waiting in one the others skipped."""
        import torch.distributed.checkpoint as dcp
        caught = (Exception, _checkpoint_exception())  # DCP's CheckpointException is a BaseException
        self._finish_pending()  # at most one save in flight; dir_begin needs none
        ts = self._ts()
        path, err = None, None
        try:
            if self.rank == 0:
                path, _removed = self._native.dir_begin(ts)  # removes dead saves (no index)
            else:
                path = self._native.dir_path(ts)
        except _errors.KeepsakeError as e:
            err = e
        self._agree(err, "starting the save")
        where = self._location(path)
        computed = self._synced_values()  # collective (the metrics over every rank)
        sd, writer, err = None, None, None
        try:  # the components' state_dict(): a rank whose fails must not leave the others in DCP
            writer = _writer_class()(where, self._local_items(computed), sync_files=self.sync_files)
            sd = self._replicated()
        except Exception as e:  # noqa: BLE001 - agreed, then raised on every rank
            err = e
        self._agree(err, f"preparing the save of {where}")
        if blocking:
            try:
                dcp.save(sd, storage_writer=writer, process_group=self._ctl)
            except caught as e:
                err = e
            self._agree(err, f"writing {where}")  # also: every rank's write returned before the commit
            self._commit(path)
        else:
            fut = None
            try:
                fut = dcp.async_save(sd, storage_writer=writer, process_group=self._async_group)
            except caught as e:
                err = e
            try:
                self._agree(err, f"starting the background save of {where}")
            except BaseException:
                # The ranks whose save started have a background thread waiting on the async group
                # for the ranks whose did not: the next background save goes on a fresh one.
                self._async_group = _dist().new_group(ranks=self._ranks, backend="gloo")
                raise
            self._pending = (fut, path)
        self.last_saved = where
        return where

    def _commit(self, path: str) -> None:
        """After every rank's save returned (agreed): rank 0 points `latest` at it and applies
        retention; its error is raised on every rank."""
        err = None
        if self.rank == 0:
            try:
                self._native.dir_commit(path)
            except _errors.KeepsakeError as e:
                err = e
        self._agree(err, f"committing {path}")

    def _finish_pending(self) -> None:
        """Collective: waits for the background save in flight, commits it, raises its error on
        every rank. Every rank holds one or none at the same call (``self._pending``), so every
        rank makes the same collectives here, or none."""
        if self._pending is None:
            return
        fut, path = self._pending
        self._pending = None
        err = None
        try:
            fut.result()
        except (Exception, _checkpoint_exception()) as e:  # DCP's CheckpointException is a BaseException
            err = e
        self._agree(err, f"the background save of {path}")
        self._commit(path)

    def _or_warn(self, save: Any) -> Optional[str]:
        """``save()``; with on_save_error="warn", a save failure agreed by every rank
        (``self._warnable``) is reported and counted instead, on every rank alike."""
        self._warnable = None
        try:
            return save()
        except BaseException as e:
            if self.on_save_error == "raise" or e is not self._warnable:
                raise
            self._warn_save_failed(e)
            return None
        finally:
            self._warnable = None

    def step(self, epoch_end: bool = False) -> Optional[str]:
        """Call on every rank at each batch end (and with ``epoch_end=True`` at each epoch end),
        after the timestamp counts it. Collective: one all-reduce carries rank 0's decision (the
        interval and clock triggers), a preemption signal on any rank and whether each rank's
        background save is still in flight, so every rank takes every branch below at the same
        step: a background save that every rank finished is committed (its error raised, or with
        on_save_error="warn" reported, on every rank); a due save is made. After a preemption
        signal every rank saves, waits until it is committed and raises :class:`Preempted`.
        Returns the directory saved, or None."""
        import torch
        dist = _dist()
        mine, err = False, None
        if self.rank == 0:
            try:
                mine = self._native.should_save(self._ts(), epoch_end)
            except Exception as e:  # noqa: BLE001 - raised on every rank below
                err = e
        sig = 0 if epoch_end else _n.preemption_signal()
        busy = self._pending is not None and not self._pending[0].done()
        flags = torch.tensor([int(bool(mine)), sig, int(busy), int(err is not None)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._ctl)
        due, signum, busy = bool(flags[0].item()), int(flags[1].item()), bool(flags[2].item())
        if flags[3].item():
            raise err if err is not None else _errors.error(_errors.StateError, "the save trigger failed on rank 0")
        if self._pending is not None and (not busy or signum):  # done on every rank (or waited for)
            self._or_warn(self._finish_pending)
        if signum:
            path = self.save(blocking=True)
            self.close()  # the process is about to exit: our groups go now, not in its teardown
            raise Preempted(path, signum)
        if not due:
            return None
        return self._or_warn(lambda: self.save(blocking=not self.async_save))

    def reserve(self) -> None:
        """Nothing to prepare: background saves go through ``dcp.async_save``, which stages
        each rank's shards itself."""

    def wait(self) -> None:
        """Collective: waits for a background save, commits it; raises its error on every rank."""
        self._finish_pending()

    def close(self) -> None:
        """Collective: finishes a save in flight (raising its error), then releases the run directory
        and destroys the manager's own process groups. A preemption closes the manager itself.
        Call it (or :meth:`wait`) before the process group goes: a save still in flight at exit is
        not committed by the manager (its index, DCP's commit, is written all the same)."""
        if self._ctl is None:  # closed already
            return
        try:
            self._finish_pending()
        finally:
            self._native.close()
            self._destroy_groups()
            self._uninstall_preemption()

    def _destroy_groups(self) -> None:
        """Destroys the manager's own gloo groups (collective). Left to the interpreter's teardown
        at exit, gloo's worker threads may still be joinable when their objects go, and the process
        then aborts (SIGABRT) instead of exiting with its status."""
        dist = _dist()
        groups, self._ctl, self._async_group = (self._async_group, self._ctl), None, None
        for g in groups:
            if g is not None and dist.is_initialized():
                dist.destroy_process_group(g)

    @property
    def run_dir(self) -> str:
        """The run directory: its URL for a remote one, else the path the C manager resolved."""
        return self._url or self._native.path

    # ---- resuming ----

    def autoresume(self, **load_kw: Any) -> bool:
        """Collective: loads the newest checkpoint directory whose index validates and whose rank
        files all verify (rank 0's choice through ks_ckpt_manager_dir_latest, which first removes
        the directories of saves that died), on every rank: model and optimizer (``set_state_dict``),
        timestamp, extra, schedulers, callbacks, and this rank's generators, dataset states and
        train and eval metric states.

        Per-rank items follow the C library's rule (``ks_shard_assigned``, as ks_dist_load applies
        it; keepsake._distributed.local.restore_local): at the saved world size each rank gets its own; at
        another one, saved rank s goes to rank floor(s*M/N), each rank's metric states become the
        fold of the saved ranks assigned to it (``ks_metric_fold``; defaults when none is), so they
        still fold to the saved global metric, and its generators and data positions come from the
        first of them (saved rank rank mod N when none). Returns False when there is none;
        ``self.last_resumed`` is the directory, ``self.skipped`` how many failed to verify."""
        import torch.distributed.checkpoint as dcp
        from .storage import KeepsakeReader
        self._finish_pending()
        path, saved_world, err = None, 0, None
        if self.rank == 0:  # rank 0 chooses, and reads the index it verified: every rank then loads it
            try:
                path, self.skipped = self._native.dir_latest()
                if path is not None:
                    saved_world = int(_n.shard_index(self._location(path), check=False)["world_size"])
            except _errors.KeepsakeError as e:
                err = e
        self._agree(err, "choosing the checkpoint to resume")
        path, (saved_world, self.skipped) = self._broadcast_choice(path, saved_world, self.skipped)
        if path is None:
            return False
        path = self._location(path)
        if saved_world != self.world_size and self.rank == 0:
            print(f"keepsake: note: {path} was saved by {saved_world} ranks, this run has {self.world_size}: "
                  "each rank's metric states are the fold of the saved ranks assigned to it, its generators "
                  "and data positions those of the first of them (ks_shard_assigned)", file=sys.stderr)
        sd: Dict[str, Any] = {}
        fields = self._ts()
        try:  # a rank that cannot describe what it loads must not leave the others in dcp.load
            sd = self._replicated()  # this rank's own items are read by restore_local, not by dcp.load
        except Exception as e:  # noqa: BLE001 - agreed, then raised on every rank
            err = e
        self._agree(err, f"preparing the load of {path}")
        for k, v in fields.items():
            sd[TIMESTAMP + k] = v
        dcp.load(sd, storage_reader=KeepsakeReader(path), process_group=self._ctl, **load_kw)  # DCP agrees its errors
        try:
            self._install(sd, fields, path)
        except Exception as e:  # noqa: BLE001 - agreed: no rank trains on while another raised
            err = e
        self._agree(err, f"installing {path}")
        self.last_resumed = path
        return True

    def _install(self, sd: Dict[str, Any], fields: Dict[str, Any], path: str) -> None:
        """Installs what dcp.load filled into the components (local to this rank)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict
        c = self.components
        if c["model"] is not None:
            set_state_dict(c["model"], c["optimizers"] if c["optimizers"] is not None else [],
                           model_state_dict=sd["model"], optim_state_dict=sd.get("optim", {}))
        ts = {k: sd[TIMESTAMP + k] for k in fields}
        if hasattr(self.timestamp, "load_state_dict"):
            self.timestamp.load_state_dict(ts)
        elif isinstance(self.timestamp, MutableMapping):
            self.timestamp.update(ts)
        if isinstance(self.extra, MutableMapping) and "extra" in sd:
            extra = dict(sd["extra"])
            self.extra.clear()
            self.extra.update(extra)
        for kind in ("schedulers", "callbacks"):
            for name, obj in _state._named(c[kind], kind):
                _dist_local.install_state(obj, sd[f"{kind}/{name}"], f"{kind[:-1]} {name!r}")
        # rank 0 chose a directory whose files ks_ckpt_manager_dir_latest verified: not hashed again
        _dist_local.restore(path, metrics=c["train_metrics"], eval_metrics=c["eval_metrics"],
                            dataset_state=c["dataset_state"], rng=self.rng, group=self._ctl, verify=False)

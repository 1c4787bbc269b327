"""The package's shape: what the public modules export, and the checkpoint manager's two parts
(its components, and its policy: keepsake.CheckpointOptions).
"""
import dataclasses
import inspect
import os
import types

import pytest
import torch

import keepsake
import keepsake.distributed
import keepsake.distributed_import
import keepsake.lightning
import keepsake.numpy
import keepsake.torch


def foreign_names(mod):
    """The public names of `mod` that are not keepsake's: modules, and classes or functions
    defined outside the package (a constant has no __module__ and is the module's own)."""
    out = []
    for name in dir(mod):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name)
        if isinstance(obj, types.ModuleType):
            out.append(name)
        elif inspect.isclass(obj) or callable(obj):
            if not (getattr(obj, "__module__", "") or "").startswith("keepsake"):
                out.append(name)
    return sorted(out)


def test_keepsake_distributed_exports_only_keepsakes_names():
    mod = keepsake.distributed
    for torch_name in ("StorageWriter", "StorageReader", "Future", "Metadata", "SavePlan", "WriteResult", "torch"):
        assert not hasattr(mod, torch_name), torch_name
    assert foreign_names(mod) == []
    public = sorted(n for n in dir(mod) if not n.startswith("_"))
    assert public == sorted(mod.__all__)
    ours = {"KeepsakeWriter", "KeepsakeReader", "sync", "synced", "unsync", "local_items", "restore_local"}
    assert ours <= set(public)


@pytest.mark.parametrize("mod", [keepsake.distributed_import, keepsake.torch, keepsake.numpy, keepsake.lightning],
                         ids=lambda m: m.__name__)
def test_the_other_public_modules_export_only_keepsakes_names(mod):
    assert foreign_names(mod) == []
    assert set(mod.__all__) <= set(dir(mod))


def make(tmp, **kw):
    ts = keepsake.Timestamp()
    mgr = keepsake.CheckpointManager(tmp, model=torch.nn.Linear(2, 2), timestamp=ts, rng=False,
                                     preemption_signals=(), **kw) if "options" not in kw else \
        keepsake.CheckpointManager(tmp, model=torch.nn.Linear(2, 2), timestamp=ts, rng=False, **kw)
    return mgr, ts


def run_batches(mgr, ts, n):
    with mgr:
        run = mgr.run_dir
        for _ in range(n):
            ts.batch += 1
            mgr.step()
    return sorted(f for f in os.listdir(run) if f.endswith(".keepsake"))


def test_options_are_the_keywords_policy(tmp_path):
    policy = dict(save_every="2ba", keep_last=2, filename="b{batch}.keepsake")
    by_keywords, ts1 = make(tmp_path / "kw", **policy)
    opts = keepsake.CheckpointOptions(**policy, preemption_signals=())
    by_options, ts2 = make(tmp_path / "opts", options=opts)
    assert by_keywords.options == opts and by_options.options is opts
    assert run_batches(by_keywords, ts1, 7) == run_batches(by_options, ts2, 7) == ["b4.keepsake", "b6.keepsake"]


def test_the_manager_is_a_checkpoint_manager_and_takes_each_part_once(tmp_path):
    mgr, _ = make(tmp_path)
    with mgr:
        assert isinstance(mgr, keepsake.CheckpointManager)
        assert type(mgr).__name__ == "LocalCheckpointManager"
    from keepsake._distributed.manager import DistributedCheckpointManager
    assert issubclass(DistributedCheckpointManager, keepsake.CheckpointManager)
    params = inspect.signature(keepsake.CheckpointManager).parameters
    from keepsake._manager.options import Components
    for f in dataclasses.fields(keepsake.CheckpointOptions) + dataclasses.fields(Components):
        assert params[f.name].default == f.default, f.name
    assert {"options", "distributed", "staging", "process_group", "sync_files"} <= set(params)


def test_the_policy_is_options_or_keywords_not_both(tmp_path):
    opts = keepsake.CheckpointOptions(save_every="1ba")
    with pytest.raises(TypeError, match="not both"):
        keepsake.CheckpointManager(tmp_path, options=opts, keep_last=1)
    with pytest.raises(TypeError, match="keep_lats"):
        keepsake.CheckpointManager(tmp_path, keep_lats=1)
    with pytest.raises(TypeError, match="CheckpointOptions"):
        keepsake.CheckpointManager(tmp_path, options={"save_every": "1ba"})
    with pytest.raises(ValueError, match="on_save_error"):
        keepsake.CheckpointOptions(on_save_error="ignore")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.keep_last = 3  # derive another: dataclasses.replace
    assert dataclasses.replace(opts, keep_last=3).keep_last == 3 and opts.keep_last == 0
    assert not os.listdir(tmp_path)  # nothing was created by a refused manager


def test_the_distributed_manager_takes_the_same_options(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        opts = keepsake.CheckpointOptions(save_every="2ba", keep_last=1, preemption_signals=())
        ts = keepsake.Timestamp()
        mgr = keepsake.CheckpointManager(tmp_path / "run", model=torch.nn.Linear(2, 2), timestamp=ts, rng=False,
                                         options=opts, distributed=True)
        assert type(mgr).__name__ == "DistributedCheckpointManager" and isinstance(mgr, keepsake.CheckpointManager)
        assert mgr.options is opts
        with mgr:
            for _ in range(5):
                ts.batch += 1
                mgr.step()
        assert sorted(f for f in os.listdir(tmp_path / "run") if not f.startswith(".")) == ["ep0-ba4", "latest"]
        for name, value in (("cache_dir", str(tmp_path / "cache")), ("upload_to", str(tmp_path / "up"))):
            with pytest.raises(keepsake.UnsupportedError, match=name):
                keepsake.CheckpointManager(tmp_path / "run2", options=dataclasses.replace(opts, **{name: value}),
                                           distributed=True)
    finally:
        dist.destroy_process_group()

"""One structure document (docs/FORMAT.md section 10) whoever writes the file: the Python package
writes `keepsake.torch_structure` through the library (no `keepsake.pytree`), names dict keys by
the library's rule, records the same containers as the torch import does for the same value, and
still loads the files keepsake 0.1.0 wrote with its own table."""
import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest
import torch

import keepsake
import keepsake.torch as kt

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("KS_CLI", "")
FIX = os.path.join(SRC, "tests", "fixtures", "python")


def fixture_module():
    spec = importlib.util.spec_from_file_location("make_pytree_files", os.path.join(FIX, "make_pytree_files.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def same(a, b):
    """Equal values of the same types, all the way down (tuple vs list, int vs str keys...)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(map(repr, a)) == list(map(repr, b)) or set(map(repr, a)) == set(map(repr, b)), (a, b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


def meta_of(path):
    with keepsake.safe_open(path) as f:
        return f.metadata()


def test_python_writes_the_structure_document_not_its_own_table(tmp_path):
    p = str(tmp_path / "c.keepsake")
    model = torch.nn.Linear(2, 3)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    kt.save_checkpoint(p, model=model, optimizers=opt, extra=fixture_module().expected())
    meta = meta_of(p)
    assert "keepsake.pytree" not in meta
    doc = json.loads(meta["keepsake.torch_structure"])
    c = doc["containers"]
    assert c["state/optimizers/AdamW/state"] == {"kind": "dict", "keys": {"0": 0, "1": 1}}
    assert c["state/optimizers/AdamW/param_groups"] == {"kind": "list", "len": 1}
    assert c["state/optimizers/AdamW/param_groups/0/betas"] == {"kind": "tuple", "len": 2}
    assert c["state/extra/mixed"] == {"kind": "dict", "keys": {"1": 1}}  # "0" and "a/b" are str keys
    assert c["state/extra/floatkey"] == {"kind": "dict", "keys": {"1.5": 1.5, "None": None, "True": True}}
    assert c["state/extra/empty_dict"] == {"kind": "dict"}
    assert c["state/extra/st"] == {"kind": "set", "len": 3}
    assert c["rng"] == {"kind": "list", "len": 1}
    assert doc["leaves"] == {"state/extra/big": "bigint", "state/extra/arr": "ndarray", "state/extra/raw": "bytes",
                             "rng/0/numpy/keys": "ndarray"}
    names = set(kt.load_file(p)) | set(keepsake.safe_open(p).scalars())
    assert "state/extra/mixed/a%2Fb" in names and "state/extra/mixed/0" in names and "state/extra/mixed/1" in names


def test_every_kind_round_trips(tmp_path):
    p = str(tmp_path / "c.keepsake")
    want = fixture_module().expected()
    want["slashes"] = {"a/b": 1, "a%2Fb": 2, "a": {"b": 3}, "%": 4}
    kt.save_checkpoint(p, extra=want, rng=False)
    same(kt.load_checkpoint(p).extra, want)


def test_keys_that_name_alike_are_refused_and_nothing_is_written(tmp_path):
    p = str(tmp_path / "c.keepsake")
    with pytest.raises(keepsake.ExistsError, match="same name '1'"):
        kt.save_checkpoint(p, extra={"d": {1: "int", "1": "str"}}, rng=False)
    with pytest.raises(keepsake.ValueError_, match="not finite"):
        kt.save_checkpoint(p, extra={"d": {float("nan"): 1}}, rng=False)
    with pytest.raises(keepsake.UnsupportedError, match="tuple"):
        kt.save_checkpoint(p, extra={"d": {(1, 2): 1}}, rng=False)
    assert not os.path.exists(p)


def test_same_document_as_the_torch_import(tmp_path):
    """The containers Python records for a value are the ones `keepsake convert` records for the
    same value saved by torch.save."""
    value = {k: v for k, v in fixture_module().expected().items() if k not in ("big", "arr", "raw", "st")}
    value["opt"] = {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"params": [0], "betas": (0.9, 0.99)}]}
    pt, ks, py = str(tmp_path / "v.pt"), str(tmp_path / "v.keepsake"), str(tmp_path / "p.keepsake")
    torch.save(value, pt)
    keepsake.convert(pt, ks)
    kt.save_checkpoint(py, extra=value, rng=False)
    imported = json.loads(meta_of(ks)["keepsake.torch_structure"])["containers"]
    mine = json.loads(meta_of(py)["keepsake.torch_structure"])["containers"]
    ours = {k[len("state/extra/"):]: v for k, v in mine.items() if k.startswith("state/extra/")}
    assert ours == imported
    assert set(kt.load_file(py)) == {"state/extra/" + k for k in kt.load_file(ks)}


def test_files_written_with_the_old_table_still_load():
    mod = fixture_module()
    path = os.path.join(FIX, "pytree-0.1.0.keepsake")
    assert "keepsake.pytree" in meta_of(path) and "keepsake.torch_structure" not in meta_of(path)
    model = mod.model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    report = kt.load_checkpoint(path, model=model, optimizers=opt, schedulers=sched, rng=False)
    same(report.extra, mod.expected())
    # what the fixture script did, again: the loaded objects are that state
    ref = mod.model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    ref(torch.ones(5, 3)).sum().backward()
    ref_opt.step()
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2)
    with pytest.warns(UserWarning):
        ref_sched.step()
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)
    same(opt.state_dict(), ref_opt.state_dict())
    same(sched.state_dict(), ref_sched.state_dict())


def test_python_checkpoint_exports_with_its_own_document(tmp_path):
    if not CLI:
        pytest.skip("KS_CLI not set (run through ctest)")
    model = torch.nn.Linear(2, 3)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    ks, pt = str(tmp_path / "c.keepsake"), str(tmp_path / "c.pt")
    kt.save_checkpoint(ks, model=model, optimizers=opt, extra={"t": (1, 2), "k": {3: "x"}})
    out = subprocess.run([CLI, "convert", ks, pt], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    d = torch.load(pt)
    assert d["state"]["extra"] == {"t": (1, 2), "k": {3: "x"}}
    fresh = torch.optim.AdamW(torch.nn.Linear(2, 3).parameters())
    fresh.load_state_dict(d["state"]["optimizers"]["AdamW"])
    same(fresh.state_dict(), opt.state_dict())

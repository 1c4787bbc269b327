"""save_checkpoint / load_checkpoint: layout, load semantics, RNGs, atomicity."""
import random

import numpy as np
import pytest
import torch

import keepsake
import keepsake.torch as kt


def setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    return model, opt, sched


def train(model, opt, sched, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def test_layout_is_the_c_librarys(tmp_path):
    model, opt, sched = setup()
    train(model, opt, sched, 2)
    p = tmp_path / "c.keepsake"
    kt.save_checkpoint(p, model=model, optimizers=opt, schedulers=sched, timestamp=keepsake.Timestamp(epoch=2),
                       run_name="r", rank_zero_seed=9)
    with keepsake.safe_open(p) as f:
        keys = set(f.keys())
        scalars = f.scalars()
        meta = f.raw_metadata()
    assert "state/model/0.weight" in keys and "state/model/1.running_mean" in keys
    assert "state/optimizers/SGD/state/0/momentum_buffer" in keys
    assert scalars["state/optimizers/SGD/param_groups/0/lr"] == opt.param_groups[0]["lr"]
    assert scalars["state/optimizers/SGD/param_groups/0/params/5"] == 5
    assert scalars["state/schedulers/CosineAnnealingLR/last_epoch"] == 2
    assert scalars["state/timestamp/Timestamp/epoch"] == 2
    assert isinstance(scalars["state/timestamp/Timestamp/total_wct"], float)
    assert scalars["state/run_name"] == "r" and scalars["state/rank_zero_seed"] == 9
    assert {"rng/0/torch", "rng/0/python/state", "rng/0/numpy/keys"} <= keys
    assert meta["keepsake.state"] == '{"layout_version":1}' and meta["keepsake.format"] == "keepsake"


def test_resume_continues_exactly(tmp_path):
    ref = setup()
    train(*ref, 6)
    model, opt, sched = setup()
    train(model, opt, sched, 3)
    p = tmp_path / "mid.keepsake"
    kt.save_checkpoint(p, model=model, optimizers=opt, schedulers=sched)
    m2, o2, s2 = setup(seed=123)  # other initial weights: everything must come from the file
    r = kt.load_checkpoint(p, model=m2, optimizers=o2, schedulers=s2)
    assert not r.mismatched and not r.missing, str(r)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # the same batches the reference saw in steps 4..6
        torch.randn(16, 4, generator=g)
    for _ in range(3):
        x = torch.randn(16, 4, generator=g)
        loss = m2(x).pow(2).mean()
        o2.zero_grad()
        loss.backward()
        o2.step()
        s2.step()
    for a, b in zip(ref[0].state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert ref[2].state_dict() == s2.state_dict()


def test_rng_states_come_back(tmp_path):
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    p = tmp_path / "r.keepsake"
    kt.save_checkpoint(p)
    want = (torch.rand(3), random.random(), np.random.rand(), random.gauss(0, 1))
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    r = kt.load_checkpoint(p)
    assert "rng/0" in r.paths("loaded")  # one component, as a C program's rng/0 (the engine reports it)
    got = (torch.rand(3), random.random(), np.random.rand(), random.gauss(0, 1))
    assert torch.equal(want[0], got[0]) and want[1:] == got[1:]


def test_strict_model_errors_write_nothing(tmp_path):
    model, opt, sched = setup()
    p = tmp_path / "m.keepsake"
    kt.save_checkpoint(p, model=model)
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    before = [t.clone() for t in other.state_dict().values()]
    with pytest.raises(keepsake.ShapeError) as e:
        kt.load_checkpoint(p, model=other)
    assert e.value.key == "state/model/2.weight" and e.value.file == str(p)
    assert all(torch.equal(a, b) for a, b in zip(before, other.state_dict().values()))
    r = kt.load_checkpoint(p, model=other, strict=False)
    assert set(r.paths("mismatched")) == {"state/model/2.weight", "state/model/2.bias"}
    assert torch.equal(other[0].weight, model[0].weight)
    bigger = torch.nn.Sequential(*setup()[0], torch.nn.Linear(2, 2))
    with pytest.raises(keepsake.NotFoundError):
        kt.load_checkpoint(p, model=bigger)
    smaller = torch.nn.Sequential(torch.nn.Linear(4, 8))
    with pytest.raises(keepsake.MismatchError):
        kt.load_checkpoint(p, model=smaller)
    half = setup()[0].half()
    with pytest.raises(keepsake.DTypeError):
        kt.load_checkpoint(p, model=half)


def test_missing_skipped_weights_only_and_ignore(tmp_path):
    model, opt, sched = setup()
    train(model, opt, sched, 1)
    p = tmp_path / "s.keepsake"
    kt.save_checkpoint(p, model=model, optimizers={"main": opt}, extra={"step": 7, "hist": [1.0, 2.0]})
    m2, o2, s2 = setup(1)
    r = kt.load_checkpoint(p, model=m2, optimizers={"other": o2}, schedulers=s2)
    assert r.find("state/optimizers/other").kind == "missing"
    assert r.find("state/optimizers/main").kind == "skipped"
    assert r.find("state/schedulers/CosineAnnealingLR").kind == "missing"
    assert r.extra == {"step": 7, "hist": [1.0, 2.0]}
    m3, o3, _ = setup(2)
    r = kt.load_checkpoint(p, model=m3, optimizers={"main": o3}, weights_only=True)
    assert r.find("state/optimizers/main").kind == "skipped" and not o3.state
    assert r.find("state/optimizers/main").reason == "weights-only load; kept as is"
    assert torch.equal(m3[0].weight, model[0].weight)
    r = kt.load_checkpoint(p, model=m3, optimizers={"main": o3}, ignore=["state/optimizers/*", "rng"])
    assert r.find("state/optimizers/main").kind == "skipped" and not o3.state
    assert r.find("state/optimizers/main").reason == "ignored by an ignore glob; kept as is"
    assert r.find("rng/0").kind == "skipped" and r.find("rng/0").reason == "ignored by an ignore glob; kept as is"


def test_component_refusal_strict_and_not(tmp_path):
    model, opt, _ = setup()
    train(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), 1)
    p = tmp_path / "o.keepsake"
    kt.save_checkpoint(p, optimizers=opt)
    lonely = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)  # 1 parameter, not 6
    with pytest.raises(keepsake.MismatchError) as e:
        kt.load_checkpoint(p, optimizers=lonely)
    assert e.value.key == "state/optimizers/SGD"
    r = kt.load_checkpoint(p, optimizers=lonely, strict=False)
    assert r.find("state/optimizers/SGD").kind == "mismatched"


def test_save_is_atomic(tmp_path):
    model, opt, sched = setup()
    p = tmp_path / "a.keepsake"
    kt.save_checkpoint(p, model=model)
    before = p.read_bytes()
    with pytest.raises(keepsake.UnsupportedError) as e:
        kt.save_checkpoint(p, model=model, extra={"bad": object()})
    assert e.value.key == "state/extra/bad"
    with pytest.raises(keepsake.DTypeError):
        kt.save_checkpoint(p, model=model, extra={"c": torch.zeros(2, dtype=torch.complex128)})
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.keepsake"]  # no temporary left


def test_report_object(tmp_path):
    model, opt, sched = setup()
    p = tmp_path / "rep.keepsake"
    kt.save_checkpoint(p, model=model, optimizers=opt, rng=False)
    r = kt.load_checkpoint(p, model=setup()[0], optimizers=setup()[1], schedulers=setup()[2], rng=False)
    assert isinstance(r, keepsake.LoadReport) and len(r) == len(list(r))
    assert r.find("state/model").kind == "loaded" and r.find("state/model").reason == "9 of 9 tensors"
    text = str(r)
    assert "missing    state/schedulers/CosineAnnealingLR" in text
    assert text.splitlines()[-1].startswith("  summary: 2 loaded") and "1 missing" in text

"""Files move between Python and C: C-written checkpoints load in Python, Python-written ones in
C (ks_state_load through keepsake.compute_metrics, and the CLI), torch.save files through the
non-executing reader, and keepsake.convert mirrors `keepsake convert`."""
import json
import os
import subprocess

import pytest
import torch

tm = pytest.importorskip("torchmetrics")
import torchmetrics.classification as tc  # noqa: E402

import keepsake  # noqa: E402
import keepsake.torch as kt  # noqa: E402

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("KS_CLI", "")
GOLDEN = os.path.join(SRC, "tests", "golden", "v1")
FIXTURES = os.path.join(SRC, "tests", "fixtures")


class Digits(torch.nn.Module):
    """The model of examples/digits (C): the same parameter names and shapes."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def digits_metrics():
    train = {"MulticlassAccuracy": tc.MulticlassAccuracy(num_classes=10, average="micro")}
    evals = {"eval": {"MulticlassAccuracy": tc.MulticlassAccuracy(num_classes=10, average="micro"),
                      "MulticlassF1Score": tc.MulticlassF1Score(num_classes=10),
                      "MulticlassConfusionMatrix": tc.MulticlassConfusionMatrix(num_classes=10)}}
    return train, evals


def cli(*args, ok=(0,)):
    if not CLI:
        pytest.skip("KS_CLI not set (run through ctest)")
    p = subprocess.run([CLI, *args], capture_output=True, text=True)
    assert p.returncode in ok, (args, p.returncode, p.stdout, p.stderr)
    return p.stdout


def test_c_checkpoint_loads_in_python():
    path = os.path.join(GOLDEN, "digits-demo.keepsake")
    model = Digits()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    train, evals = digits_metrics()
    report = kt.load_checkpoint(path, model=model, optimizers=opt, train_metrics=train, eval_metrics=evals)
    f = kt.load_file(path)
    assert torch.equal(model.fc1.weight, f["state/model/fc1.weight"])
    assert report.find("state/model").kind == "loaded"
    assert report.find("state/optimizers/AdamW").kind == "loaded"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0002) and opt.param_groups[0]["betas"] == (0.9, 0.999)
    assert torch.equal(opt.state[model.fc2.weight]["exp_avg"], f["state/optimizers/AdamW/state/2/exp_avg"])
    assert report.find("state/train_metrics/LanguageCrossEntropy").kind == "skipped"  # a Composer metric
    assert report.find("state/schedulers/CosineAnnealingWithWarmupScheduler").kind == "skipped"
    # rng/0 holds the C program's xoshiro256** only: the Python generators are left as they are.
    assert report.find("rng/0").kind == "loaded"
    assert report.run_name and report.timestamp is not None and report.timestamp.epoch > 0
    m = train["MulticlassAccuracy"]
    assert report.find("state/train_metrics/MulticlassAccuracy").kind == "loaded"
    assert torch.equal(m.compute(), f["state/train_metrics/MulticlassAccuracy/_computed"])
    for name, metric in evals["eval"].items():
        assert report.find(f"state/eval_metrics/eval/{name}").kind == "loaded"
        want = f[f"state/eval_metrics/eval/{name}/_computed"]
        assert torch.equal(metric.compute().to(want.dtype), want), name
        metric.reset()  # states too: recomputing from them gives the C library's value
        kt.load_checkpoint(path, eval_metrics={"eval": {name: metric}}, rng=False)
        metric._computed = None
        assert torch.allclose(metric.compute().double(), want.double(), atol=1e-6), name
    # training goes on from the loaded optimizer state
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    assert float(opt.state[model.fc1.weight]["step"]) == float(f["state/optimizers/AdamW/state/0/step"]) + 1


def python_checkpoint(path):
    torch.manual_seed(1)
    model = Digits()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    train, evals = digits_metrics()
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
        out = model(x)
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()
        opt.zero_grad()
        train["MulticlassAccuracy"].update(out, y)
        for mm in evals["eval"].values():
            mm.update(out, y)
    kt.save_checkpoint(path, model=model, optimizers=opt, train_metrics=train, eval_metrics=evals,
                       timestamp=keepsake.Timestamp(epoch=1, batch=3, sample=48), run_name="py-run",
                       rank_zero_seed=5)
    return model, opt, train, evals


def test_python_checkpoint_loads_in_c(tmp_path):
    path = tmp_path / "py.keepsake"
    model, opt, train, evals = python_checkpoint(path)
    c = keepsake.compute_metrics(path)
    report = {p: k for k, p, _ in c["__report__"]}
    groups = [("state/train_metrics/", train)] + [("state/eval_metrics/eval/", evals["eval"])]
    for root, ms in groups:
        for name, m in ms.items():
            p = root + name
            assert report[p] == "loaded", (p, c["__report__"])
            want = m.compute()
            got = c[p]["value"]
            assert got is not None and c[p]["update_count"] == 3
            assert torch.allclose(got.double().reshape(want.shape), want.double(), atol=1e-6), (p, got, want)
    keepsake.verify(path)
    out = cli("verify", str(path))
    assert "ok" in out.lower() or out == "" or "verified" in out.lower()
    info = json.loads(cli("inspect", "--json", str(path)))
    assert info["run_name"] == "py-run" and info["rank_zero_seed"] == 5
    assert info["timestamp"]["epoch"] == 1 and info["timestamp"]["sample"] == 48
    assert info["metrics"]["state/train_metrics/MulticlassAccuracy"]["class"] == "MulticlassAccuracy"
    # diff against the C-written checkpoint of the same layout: both files are read
    diff = cli("diff", str(path), os.path.join(GOLDEN, "digits-demo.keepsake"), ok=(0, 1))
    assert "state/model/fc1.weight" in diff or "state/model" in diff


def test_python_checkpoint_exports_to_pt_and_back(tmp_path):
    path = tmp_path / "py.keepsake"
    model, *_ = python_checkpoint(path)
    kept, ignored = keepsake.convert(path, tmp_path / "py.pt", ignore=["rng"])
    assert ignored > 0 and kept > 0
    sd = torch.load(tmp_path / "py.pt", weights_only=True)
    assert torch.equal(sd["state"]["model"]["fc1.weight"], model.fc1.weight.detach())
    assert "rng" not in sd
    back = kt.load_pt(tmp_path / "py.pt")
    assert torch.equal(back["state"]["model"]["fc2.bias"], model.fc2.bias.detach())
    assert back["state"]["optimizers"]["AdamW"]["param_groups"][0]["lr"] == 0.01


def test_convert_mirrors_the_cli(tmp_path):
    src = os.path.join(FIXTURES, "composer", "composer-0.13.5-pickled-metrics.pt")
    a, b = tmp_path / "py.keepsake", tmp_path / "cli.keepsake"
    kept, ignored = keepsake.convert(src, a, ignore=["state/optimizers/*"])
    out = cli("convert", src, str(b), "--ignore", "state/optimizers/*")
    assert f"{kept} entries ({ignored} ignored)" in out
    fa, fb = kt.load_file(a), kt.load_file(b)
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)
    with keepsake.safe_open(a) as x, keepsake.safe_open(b) as y:
        assert x.raw_metadata() == y.raw_metadata() and x.scalars() == y.scalars()
    # the converted Composer metrics load into torchmetrics by name
    acc = tc.MulticlassAccuracy(num_classes=10, average="micro")
    r = kt.load_checkpoint(a, train_metrics={"MulticlassAccuracy": acc}, rng=False)
    assert r.find("state/train_metrics/MulticlassAccuracy").kind == "loaded"
    assert acc._update_count == 4 and float(acc.compute()) == pytest.approx(0.0625)
    with pytest.raises(keepsake.KeepsakeError) as e:
        keepsake.convert(os.path.join(FIXTURES, "torch", "nope.pt"), tmp_path / "x.keepsake")
    assert "nope.pt" in e.value.file
    assert not (tmp_path / "x.keepsake").exists()


def test_convert_exports_cat_states_as_lists_and_warns_what_it_salvaged(tmp_path):
    out = tmp_path / "cat.pt"
    keepsake.convert(os.path.join(GOLDEN, "catalogue.keepsake"), out)
    sd = torch.load(out, weights_only=True)["state"]["train_metrics"]["CatMetric"]["state_dict"]
    assert isinstance(sd["value"], list) and len(sd["value"]) == 1
    cat = tm.CatMetric()
    cat.load_state_dict(sd)
    cat.update(torch.tensor([1.5, 2.5]))  # torchmetrics appends: a Tensor here would raise
    assert torch.equal(cat.compute()[-2:], torch.tensor([1.5, 2.5]))
    # salvaged problems: RuntimeWarnings, the input converted anyway
    bad = tmp_path / "bad.keepsake"
    raw = bytearray(open(os.path.join(GOLDEN, "digits-demo.keepsake"), "rb").read())
    raw[-1] ^= 1
    bad.write_bytes(bytes(raw))
    with pytest.raises(keepsake.KeepsakeError):
        keepsake.convert(bad, tmp_path / "no.keepsake")
    with pytest.warns(RuntimeWarning, match="salvaged despite: .*bad.keepsake"):
        kept, _ = keepsake.convert(bad, tmp_path / "yes.keepsake", salvage=True)
    assert kept > 0 and (tmp_path / "yes.keepsake").exists()


def test_python_list_states_export_as_lists_for_any_class(tmp_path):
    """A metric the C catalogue does not have (exact MulticlassAveragePrecision, BinaryROC): the
    Python package records its list states in keepsake.metrics, and the .pt export keeps them."""
    def make():
        return {"MulticlassAveragePrecision": tc.MulticlassAveragePrecision(num_classes=3, thresholds=None),
                "roc": tc.BinaryROC(thresholds=None), "CatMetric": tm.CatMetric()}

    def batch(i):
        g = torch.Generator().manual_seed(40 + i)
        p, y = torch.randn(5, 3, generator=g).softmax(-1), torch.randint(0, 3, (5,), generator=g)
        return {"MulticlassAveragePrecision": (p, y), "roc": (p[:, 0], (y == 0).long()), "CatMetric": (p[:, 1],)}

    ms = make()
    for i in range(2):
        for k, m in ms.items():
            m.update(*batch(i)[k])
    path, pt = tmp_path / "lists.keepsake", tmp_path / "lists.pt"
    kt.save_checkpoint(path, model=torch.nn.Linear(2, 2), train_metrics=ms)
    with keepsake.safe_open(path) as f:
        recorded = json.loads(f.raw_metadata()["keepsake.metrics"])
    assert recorded["state/train_metrics/roc"]["lists"] == ["preds", "target"]
    keepsake.convert(path, pt)
    sd = torch.load(pt, weights_only=True)["state"]["train_metrics"]
    ref = make()
    for i in range(3):
        for k, m in ref.items():
            m.update(*batch(i)[k])
    for k, m in make().items():
        states = sd[k]["state_dict"]
        assert all(isinstance(states[s], list) for s in m._defaults), (k, {s: type(v) for s, v in states.items()})
        m.load_state_dict(states)
        m.update(*batch(2)[k])
        got, want = m.compute(), ref[k].compute()
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.allclose(a, b), k


def test_convert_torch_compat_writes_what_torch_1_13_reads(tmp_path):
    src = os.path.join(FIXTURES, "torch213", "training_state.pt")
    a, b = tmp_path / "new.pt", tmp_path / "old.pt"
    keepsake.convert(src, a)
    keepsake.convert(src, b, torch_compat=True)
    assert a.read_bytes() != b.read_bytes()  # floats as 0-d float64 tensors for torch 1.13
    cli("convert", src, str(tmp_path / "cli.pt"), "--torch-compat", "1.13")
    assert (tmp_path / "cli.pt").read_bytes() == b.read_bytes()


def test_load_pt_is_a_safe_drop_in(tmp_path):
    pwned = "/tmp/keepsake-pwned"
    if os.path.exists(pwned):
        os.remove(pwned)
    flat = kt.load_pt(os.path.join(FIXTURES, "torch", "malicious.pt"), flat=True)
    assert not os.path.exists(pwned)
    assert flat["payload/__class__"] == "posix.system" and torch.equal(flat["model/w"], torch.ones(2))
    composer = os.path.join(FIXTURES, "composer", "composer-0.13.5-pickled-metrics.pt")
    with pytest.raises(Exception):
        torch.load(composer, weights_only=True)  # pickled torchmetrics objects: refused
    ck = kt.load_pt(composer)
    acc = ck["state"]["train_metrics"]["MulticlassAccuracy"]
    assert acc["__class__"].endswith("MulticlassAccuracy") and acc["_update_count"] == 4
    assert torch.equal(acc["tp"], torch.tensor([8]))
    mlp = os.path.join(FIXTURES, "torch", "mlp_state_dict.pt")
    ref = torch.load(mlp, weights_only=True)
    got = kt.load_pt(mlp)
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    adamw = os.path.join(FIXTURES, "torch", "adamw_state_dict.pt")
    ref = torch.load(adamw, weights_only=True)
    got = kt.load_pt(adamw)
    assert list(got["state"]) == list(ref["state"])  # int keys stay ints
    assert got["param_groups"] == ref["param_groups"]  # a list of dicts, betas a tuple, params a list
    assert isinstance(got["param_groups"][0]["betas"], tuple)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(s.shape)) for s in
                             (ref["state"][i]["exp_avg"] for i in sorted(ref["state"]))])
    opt.load_state_dict(got)  # what torch.load gave, torch takes from load_pt too
    torch.save({"a/b": 1, "t": (1, [2, 3]), "e": {}, "l": [], 5: "x", None: 2.5}, tmp_path / "s.pt")
    assert kt.load_pt(tmp_path / "s.pt") == {"a/b": 1, "t": (1, [2, 3]), "e": {}, "l": [], 5: "x", None: 2.5}
    torch.save(torch.arange(3), tmp_path / "v.pt")
    assert torch.equal(kt.load_pt(tmp_path / "v.pt"), torch.arange(3))
    assert torch.equal(got["state"][0]["exp_avg"], ref["state"][0]["exp_avg"])
    with open(mlp, "rb") as fh:
        assert kt.load_pt(fh.read()).keys() == torch.load(mlp, weights_only=True).keys()  # from bytes too
    kt.save_pt({"a": {"b": torch.arange(3)}, "n": 3, "s": "x"}, tmp_path / "w.pt")
    w = torch.load(tmp_path / "w.pt", weights_only=True)
    assert torch.equal(w["a"]["b"], torch.arange(3)) and w["n"] == 3 and w["s"] == "x"


def test_convert_checks_input_integrity_and_output(tmp_path):
    src = tmp_path / "in.keepsake"
    kt.save_file({"a": torch.ones(4), "b": torch.zeros(4)}, src)
    raw = bytearray(src.read_bytes())
    raw[-1] ^= 0x01
    src.write_bytes(bytes(raw))
    out = tmp_path / "out.keepsake"
    with pytest.raises(keepsake.ChecksumError):
        keepsake.convert(src, out)
    assert not out.exists()  # nothing laundered into a valid file
    assert keepsake.convert(src, out, salvage=True) == (2, 0)
    cli("convert", str(src), str(tmp_path / "cli.keepsake"), ok=(1,))
    (tmp_path / "dir.keepsake").mkdir()
    os.symlink(out, tmp_path / "link.keepsake")
    for bad in ("dir.keepsake", "link.keepsake"):
        with pytest.raises(keepsake.InvalidError):
            keepsake.convert(out, tmp_path / bad)
    assert os.path.islink(tmp_path / "link.keepsake") and (tmp_path / "dir.keepsake").is_dir()


def test_python_checkpoint_exports_to_a_pt_that_torch_resumes(tmp_path):
    """keepsake.pytree (what the Python package records) becomes the .pt structure on export:
    torch.load's default reads the file, and AdamW, the scheduler and the model resume from it
    exactly as from the objects themselves."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = torch.randn(16, 4)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()
    src, dst = tmp_path / "py.keepsake", tmp_path / "py.pt"
    kt.save_checkpoint(src, model=model, optimizers=opt, schedulers=sched)
    keepsake.convert(src, dst)
    ck = torch.load(dst)  # weights_only=True, the default
    st = ck["state"]
    assert isinstance(st["optimizers"]["AdamW"]["param_groups"], list)
    assert isinstance(ck["rng"], list) and len(ck["rng"]) == 1
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    m2.load_state_dict(st["model"])
    o2 = torch.optim.AdamW(m2.parameters(), lr=0.5)
    o2.load_state_dict(st["optimizers"]["AdamW"])
    s2 = torch.optim.lr_scheduler.StepLR(o2, step_size=1, gamma=0.5)
    s2.load_state_dict(st["schedulers"]["StepLR"])
    for m, o, s in ((model, opt, sched), (m2, o2, s2)):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
        s.step()
    for a, b in zip(model.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert s2.get_last_lr() == sched.get_last_lr()

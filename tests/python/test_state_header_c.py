"""A C program and a Python program that describe the same components write the same header.

tests/interop/state_header_c.c saves, through the C state layer (ks_state_save): a 4 -> 2 linear
model, AdamW stepped once, the warmup-cosine scheduler stepped once (lr 0.01 -> 0.005), a
timestamp after one batch of 3 samples, a dataset position, MulticlassAccuracy and
MinMaxMetric(MeanMetric) under the train metrics and MeanSquaredError under the eval label "val",
run name and seed, and the generators a Python program has (Python's and numpy's Mersenne
Twisters seeded with 7, torch's CPU generator), registered as a component under rng/0/. This test
saves the same components with keepsake.torch.save_checkpoint: torch's Linear and AdamW (its lr
set to the scheduler's 0.005), torchmetrics' metrics updated and computed as the C program does,
keepsake.Timestamp with the C counters, the generators seeded with 7 (the C scheduler has no
torch class, so the Python program describes it as a component with the scheduler's entries).

The two headers are compared whole: the same tensor keys, dtypes and shapes in the same order;
the same scalar keys in the same order, with the same types and values; every metadata record
byte for byte, keepsake.writer included ("keepsake <version>": both files are written by the one C
library). Both programs start from the same weights and gradients, and the C AdamW computes as
torch's does, op for op; the C program seeds Python's and numpy's Mersenne Twisters and torch's
CPU generator state as CPython, numpy and torch.manual_seed do. So here even keepsake.checksums,
which depends on the tensor bytes, is the same: the two files are the same bytes. What would differ in
two real programs, and is therefore not asked of the scalars: the timestamp's wall-clock totals
(``*_wct``, compared by type there; both programs hold 0.5 here).

Each file also loads in the other language: the C file into torchmetrics' MinMaxMetric (bounds
and base metric) and Python's and numpy's generators; the Python file into the C program
(``state_header_c --resume``: every component loaded, the wrapper's bounds and base metric).
"""
import json
import os
import random
import subprocess

import pytest

torch = pytest.importorskip("torch")
torchmetrics = pytest.importorskip("torchmetrics")
np = pytest.importorskip("numpy")

import keepsake  # noqa: E402
import keepsake.torch as kt  # noqa: E402

C_PROGRAM = os.environ.get("KS_STATE_HEADER_C")
SEED = 7
# The metadata whose value depends on tensor bytes (compared entry by entry below).
BYTES_RECORDS = {"keepsake.checksums"}


def _header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        doc = json.loads(f.read(n))
    meta = doc.pop("__metadata__")
    ents = sorted(doc.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["dtype"], v["shape"]) for k, v in ents], meta


def _minmax():
    return torchmetrics.wrappers.MinMaxMetric(torchmetrics.MeanMetric())


def _python_program(path):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

    net = Net()
    with torch.no_grad():  # the C program's weights and gradients
        net.fc.weight.copy_(torch.tensor([[0.1, -0.2, 0.3, 0.4], [-0.5, 0.6, 0.7, -0.8]]))
        net.fc.bias.copy_(torch.tensor([0.01, -0.02]))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.01)
    net.fc.weight.grad = torch.arange(1.0, 9.0).reshape(2, 4)
    net.fc.bias.grad = torch.tensor([0.5, -0.5])
    opt.step()
    # The C scheduler (train.h's ks_scheduler, saved as a torch LambdaLR with Composer's fields),
    # stepped once: warmup 1 of 2 steps, so the optimizer's lr is half the base lr.
    sched = {"base_lrs": [0.01], "last_epoch": 1, "_step_count": 2, "_last_lr": [0.005], "t_warmup": 2,
             "t_max": 10, "alpha_f": 0.0}
    opt.param_groups[0]["lr"] = 0.005
    acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2)
    acc.update(torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), torch.tensor([0, 1, 1]))
    acc.compute()
    minmax = _minmax()
    for v in (2.0, 6.0):
        minmax.update(torch.tensor(v))
        minmax.compute()
    mse = torchmetrics.MeanSquaredError()
    mse.update(torch.tensor([0.5, 1.0, 2.0]), torch.tensor([0.0, 1.0, 2.5]))
    # ks_timestamp_batch_done(3 samples, 0 tokens, 0.5 s)
    ts = keepsake.Timestamp(batch=1, sample=3, batch_in_epoch=1, sample_in_epoch=3, total_wct=0.5, epoch_wct=0.5,
                            batch_wct=0.5)
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    kt.save_checkpoint(path, net, {"AdamW": opt}, {"Sched": sched}, {"acc": acc, "minmax": minmax},
                       {"val": {"mse": mse}}, ts, rng=True,
                       dataset_state={"loader": {"epoch": 1, "sample_in_epoch": 5, "shuffle_seed": 7}},
                       run_name="run-1", rank_zero_seed=42)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    if not C_PROGRAM:
        pytest.skip("KS_STATE_HEADER_C (the C program tests/interop/state_header_c.c) is not set")
    d = tmp_path_factory.mktemp("state_header_c")
    c_path, py_path = str(d / "c.keepsake"), str(d / "py.keepsake")
    subprocess.run([C_PROGRAM, c_path], check=True)
    _python_program(py_path)
    return c_path, py_path


@pytest.fixture(scope="module")
def headers(files):
    return _header(files[0]), _header(files[1])


def test_same_tensor_keys_dtypes_shapes_in_order(headers):
    (c_ents, _), (py_ents, _) = headers
    assert c_ents == py_ents
    keys = [e[0] for e in c_ents]
    assert "state/train_metrics/minmax/attrs/max_val" in keys  # the wrapper's parts
    assert "state/train_metrics/minmax/inner/_base_metric/state_dict/mean_value" in keys
    assert [k for k in keys if k.startswith("rng/")] == ["rng/0/python/state", "rng/0/numpy/keys", "rng/0/torch"]


def test_same_scalars_in_order_with_the_same_types_and_values(headers):
    (_, c_meta), (_, py_meta) = headers
    c_sc, py_sc = json.loads(c_meta["keepsake.scalars"]), json.loads(py_meta["keepsake.scalars"])
    assert list(c_sc) == list(py_sc)
    assert [type(v).__name__ for v in c_sc.values()] == [type(v).__name__ for v in py_sc.values()]
    wct = [k for k in c_sc if k.endswith("_wct")]
    assert len(wct) == 3
    assert {k: v for k, v in c_sc.items() if k not in wct} == {k: v for k, v in py_sc.items() if k not in wct}
    # torch 2.13's AdamW fields, in its order, and the scheduler's lr in both.
    group = [k.rsplit("/", 1)[1] for k in c_sc if k.startswith("state/optimizers/AdamW/param_groups/0/")
             and "/betas/" not in k and "/params/" not in k]
    assert group == ["lr", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable", "differentiable",
                     "fused", "decoupled_weight_decay"]
    assert c_sc["state/optimizers/AdamW/param_groups/0/lr"] == 0.005
    assert c_sc["state/train_metrics/minmax/_computed"] is None
    assert c_sc["state/train_metrics/minmax/inner/_base_metric/update_count"] == 2


def test_every_metadata_record_is_identical(headers):
    (_, c_meta), (_, py_meta) = headers
    assert list(c_meta) == list(py_meta)
    for k in c_meta:
        if k not in BYTES_RECORDS:
            assert c_meta[k] == py_meta[k], k
    # The tensor bytes too: the model after AdamW's step (torch's arithmetic in C), the generators,
    # every metric state and result.
    c_ck, py_ck = json.loads(c_meta["keepsake.checksums"]), json.loads(py_meta["keepsake.checksums"])
    assert list(c_ck) == list(py_ck)
    assert [k for k in c_ck if c_ck[k] != py_ck[k]] == []
    records = json.loads(c_meta["keepsake.metrics"])
    assert records["state/train_metrics/minmax"] == {"class": "MinMaxMetric", "inner": {"_base_metric": "MeanMetric"},
                                                     "schema_version": 2, "update_count": 0}
    assert json.loads(c_meta["keepsake.torch_structure"])["leaves"] == {"rng/0/numpy/keys": "ndarray"}


def test_the_two_files_are_the_same_bytes(files):
    """The header as text, then the data: with every value held alike the files are one file."""
    c_path, py_path = files
    with open(c_path, "rb") as c, open(py_path, "rb") as p:
        c_bytes, py_bytes = c.read(), p.read()
    n = int.from_bytes(c_bytes[:8], "little")
    assert c_bytes[:8 + n] == py_bytes[:8 + n]
    assert c_bytes == py_bytes


def test_a_c_file_loads_into_torchmetrics_and_the_generators(files):
    """The C program's wrapper fills torchmetrics' MinMaxMetric: its bounds and its base metric."""
    c_path, _ = files
    minmax = _minmax()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    rep = kt.load_checkpoint(c_path, train_metrics={"minmax": minmax}, rng=True, strict=False)
    assert rep.find("state/train_metrics/minmax").kind == "loaded", str(rep)
    assert rep.find("rng/0").kind == "loaded", str(rep)
    assert float(minmax.max_val) == 4.0 and float(minmax.min_val) == 2.0
    base = minmax._base_metric
    assert float(base.mean_value) == 8.0 and float(base.weight) == 2.0 and base._update_count == 2
    minmax.update(torch.tensor(0.5))  # mean (2 + 6 + 0.5) / 3
    out = minmax.compute()
    assert float(out["raw"]) == pytest.approx(8.5 / 3) and float(out["max"]) == 4.0 and float(out["min"]) == 2.0
    # The C program's Mersenne Twister words are CPython's and numpy's for seed 7.
    state = random.getstate()
    random.seed(SEED)
    assert state == random.getstate()
    np_state = np.random.get_state()
    np.random.seed(SEED)
    assert (np_state[1] == np.random.get_state()[1]).all() and np_state[2] == 624
    torch_state = torch.get_rng_state()
    torch.manual_seed(SEED)
    assert torch.equal(torch_state, torch.get_rng_state())


def test_a_python_file_resumes_the_c_program(files):
    """The C program loads the Python program's file: every component loaded, the wrapper's bounds and
    base metric filled, the generators the seed-7 ones."""
    _, py_path = files
    out = subprocess.run([C_PROGRAM, "--resume", py_path], check=True, capture_output=True, text=True).stdout
    assert "summary: 9 loaded, 0 migrated, 0 converted, 0 skipped, 0 missing, 0 mismatched" in out, out
    assert "loaded     state/train_metrics/minmax" in out
    assert "minmax max_val=4 min_val=2 mean_value=8 weight=2 update_count=2" in out, out
    assert "generators seed7 python=1 numpy=1 torch=1" in out, out

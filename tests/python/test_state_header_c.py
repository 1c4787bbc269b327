"""A C program and a Python program that describe the same components write the same header.

tests/interop/state_header_c.c saves, through the C state layer (ks_state_save): a 4 -> 2 linear
model, AdamW stepped once, the warmup-cosine scheduler, a timestamp, a dataset position, the
RNG, MulticlassAccuracy under the train metrics and MeanSquaredError under the eval label "val",
run name and seed. This test saves the same components with keepsake.torch.save_checkpoint
(torch's Linear and AdamW, torchmetrics' metrics; the C scheduler has no torch class, so the
Python program describes it as a component with the scheduler's entries) and compares the
headers: the same tensor keys, dtypes and shapes in the same order, the same scalar keys of the
same types, the same metric records and layout record, the same structure document. What the
two languages' objects hold differently is named, not skipped: the generators (C's xoshiro256**
against torch's, numpy's and Python's, each under rng/0/) and the three param_group fields torch
2.x's AdamW has and the C AdamW does not write.
"""
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
torchmetrics = pytest.importorskip("torchmetrics")

import keepsake  # noqa: E402
import keepsake.torch as kt  # noqa: E402

C_PROGRAM = os.environ.get("KS_STATE_HEADER_C")
TORCH_ONLY_GROUP_FIELDS = {"differentiable", "fused", "decoupled_weight_decay"}
OPT_GROUP = "state/optimizers/AdamW/param_groups/0/"


def _header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        doc = json.loads(f.read(n))
    meta = doc.pop("__metadata__")
    ents = sorted(doc.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["dtype"], v["shape"]) for k, v in ents], meta


def _python_program(path):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.01)
    net.fc.weight.grad, net.fc.bias.grad = torch.ones(2, 4), torch.ones(2)
    opt.step()
    # The C scheduler (train.h's ks_scheduler, saved as a torch LambdaLR with Composer's fields).
    sched = {"base_lrs": [0.01], "last_epoch": 1, "_step_count": 2, "_last_lr": [0.005], "t_warmup": 2,
             "t_max": 10, "alpha_f": 0.0}
    acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2)
    acc.update(torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), torch.tensor([0, 1, 1]))
    acc.compute()
    mse = torchmetrics.MeanSquaredError()
    mse.update(torch.tensor([0.5, 1.0, 2.0]), torch.tensor([0.0, 1.0, 2.5]))
    ts = keepsake.Timestamp()
    kt.save_checkpoint(path, net, {"AdamW": opt}, {"Sched": sched}, {"acc": acc}, {"val": {"mse": mse}}, ts,
                       rng=True, dataset_state={"loader": {"epoch": 1, "sample_in_epoch": 5, "shuffle_seed": 7}},
                       run_name="run-1", rank_zero_seed=42)


@pytest.fixture(scope="module")
def headers(tmp_path_factory):
    if not C_PROGRAM:
        pytest.skip("KS_STATE_HEADER_C (the C program tests/interop/state_header_c.c) is not set")
    d = tmp_path_factory.mktemp("state_header_c")
    c_path, py_path = str(d / "c.keepsake"), str(d / "py.keepsake")
    subprocess.run([C_PROGRAM, c_path], check=True)
    _python_program(py_path)
    return _header(c_path), _header(py_path)


def _not_rng(entries):
    return [e for e in entries if not e[0].startswith("rng/")]


def test_same_tensor_keys_dtypes_shapes_in_order(headers):
    (c_ents, _), (py_ents, _) = headers
    assert _not_rng(c_ents) == _not_rng(py_ents)
    assert len(_not_rng(c_ents)) >= 12  # model, AdamW moments and steps, metric states, _computed
    # Each language's generators, under rank 0's folder.
    assert {e[0] for e in c_ents if e[0].startswith("rng/")} == {"rng/0/xoshiro256starstar"}
    assert all(e[0].startswith("rng/0/") for e in py_ents if e[0].startswith("rng/"))


def test_same_scalar_keys_and_types(headers):
    (_, c_meta), (_, py_meta) = headers
    c_sc, py_sc = json.loads(c_meta["keepsake.scalars"]), json.loads(py_meta["keepsake.scalars"])
    torch_only = {OPT_GROUP + f for f in TORCH_ONLY_GROUP_FIELDS}
    assert torch_only <= set(py_sc)
    py_sc = {k: v for k, v in py_sc.items() if k not in torch_only and not k.startswith("rng/")}
    c_sc = {k: v for k, v in c_sc.items() if not k.startswith("rng/")}
    assert sorted(c_sc) == sorted(py_sc)  # (AdamW's param_group fields come in another order)
    assert {k: type(v).__name__ for k, v in c_sc.items()} == {k: type(v).__name__ for k, v in py_sc.items()}


def test_same_metric_and_layout_records(headers):
    (_, c_meta), (_, py_meta) = headers
    assert json.loads(c_meta["keepsake.metrics"]) == json.loads(py_meta["keepsake.metrics"])
    assert c_meta["keepsake.state"] == py_meta["keepsake.state"]
    extra = set(py_meta) ^ set(c_meta)
    assert not extra, extra


def test_same_structure_document(headers):
    (_, c_meta), (_, py_meta) = headers
    c_doc, py_doc = json.loads(c_meta["keepsake.torch_structure"]), json.loads(py_meta["keepsake.torch_structure"])
    assert c_doc["containers"] == py_doc["containers"]
    # numpy's generator keys are an ndarray: a leaf only the Python program's generators have.
    assert set(py_doc.get("leaves", {})) <= {"rng/0/numpy/keys"} and "leaves" not in c_doc

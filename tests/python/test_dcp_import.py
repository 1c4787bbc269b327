"""keepsake.distributed_import.convert_dcp and `keepsake convert DIR OUT` on torch.distributed.checkpoint directories.

Checkpoints are written here by torch's own dcp.save (FileSystemWriter, one process), and read from the
fixtures of tests/fixtures/dcp/ (made by make_dcp.py, including 2 ranks and hostile metadata). Values
must come back bit for bit.
"""
import os
import shutil
import subprocess

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

import keepsake
import keepsake.torch as kt
from keepsake.distributed_import import convert_dcp

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(SRC, "tests", "fixtures", "dcp")
CLI = os.environ.get("KS_CLI")

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def bits(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same_tensor(a, b, name):
    assert a.dtype == b.dtype, name
    assert tuple(a.shape) == tuple(b.shape), name
    assert torch.equal(bits(a), bits(b)), name


def state():
    g = torch.Generator().manual_seed(99)
    return {
        "model": {"fc.weight": torch.randn(7, 5, generator=g), "fc.bias": torch.randn(7, generator=g),
                  "emb": torch.randn(4, 3, generator=g).to(torch.bfloat16),
                  "nan": torch.tensor([float("nan"), -0.0, float("-inf")]),
                  "steps": torch.tensor([1, 2, 3], dtype=torch.int64)},
        "optim": {"state": {"0": {"exp_avg": torch.randn(7, 5, generator=g)}}, "lr": 0.0003},
        "layers": [torch.ones(2, dtype=torch.float16), torch.zeros(1, dtype=torch.int32)],
        "epoch": 3,
        "tag": "run-β",
        "flags": {"amp": True, "clip": None},
        "sizes": [8, 16],
    }


WANT_TENSORS = {
    "model/fc.weight": ("model", "fc.weight"), "model/fc.bias": ("model", "fc.bias"), "model/emb": ("model", "emb"),
    "model/nan": ("model", "nan"), "model/steps": ("model", "steps"),
    "optim/state/0/exp_avg": ("optim", "state", "0", "exp_avg"), "layers/0": ("layers", 0), "layers/1": ("layers", 1),
}
WANT_SCALARS = {"optim/lr": 0.0003, "epoch": 3, "tag": "run-β", "flags/amp": True, "flags/clip": None,
                "sizes/0": 8, "sizes/1": 16}


def pick(sd, path):
    for p in path:
        sd = sd[p]
    return sd


@pytest.fixture
def dcp_dir(tmp_path):
    d = tmp_path / "ckpt"
    dcp.save(state(), storage_writer=FileSystemWriter(str(d)))
    return d


def check(out):
    sd = state()
    tensors = kt.load_file(out)
    assert set(tensors) == set(WANT_TENSORS)
    for name, path in WANT_TENSORS.items():
        assert_same_tensor(tensors[name], pick(sd, path), name)
    with keepsake.safe_open(out, framework="pt") as f:
        scalars = f.scalars()
        meta = f.metadata()
    assert scalars == WANT_SCALARS
    assert isinstance(scalars["epoch"], int) and isinstance(scalars["flags/amp"], bool)
    assert '"skipped":{}' in meta["keepsake.dcp_import"]


def test_convert_dcp_bit_exact(dcp_dir, tmp_path):
    out = tmp_path / "out.keepsake"
    written, ignored = convert_dcp(dcp_dir, out)
    assert (written, ignored) == (len(WANT_TENSORS) + len(WANT_SCALARS), 0)
    check(out)
    keepsake.verify(out)


@pytest.mark.skipif(not CLI, reason="KS_CLI not set")
def test_cli_convert(dcp_dir, tmp_path):
    out = tmp_path / "cli.keepsake"
    r = subprocess.run([CLI, "convert", str(dcp_dir), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "15 entries" in r.stdout
    check(out)


def test_pt_export_loads_as_original(dcp_dir, tmp_path):
    out = tmp_path / "out.pt"
    convert_dcp(dcp_dir, out)
    got = torch.load(out, weights_only=True)
    want = state()
    assert isinstance(got["layers"], list) and isinstance(got["sizes"], list)
    for name, path in WANT_TENSORS.items():
        assert_same_tensor(pick(got, path), pick(want, path), name)
    assert got["epoch"] == 3 and got["tag"] == "run-β" and got["flags"] == {"amp": True, "clip": None}


def test_two_rank_fixture():
    """2 ranks (torchrun): Shard(0) uneven, Shard(1), Replicate; equals the whole tensors rank 0 saved."""
    want = torch.load(os.path.join(FIX, "two_rank.pt"), weights_only=True)
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ks-dcp-two-{os.getpid()}.keepsake")
    try:
        convert_dcp(os.path.join(FIX, "two_rank"), out)
        got = kt.load_file(out)
        for k, v in want["model"].items():
            assert_same_tensor(got[f"model/{k}"], v, k)
        with keepsake.safe_open(out, framework="pt") as f:
            assert f.scalars() == {"step": 9, "tags/0": "a", "tags/1": "b"}
    finally:
        if os.path.exists(out):
            os.unlink(out)


def test_hostile_metadata_never_runs(tmp_path, monkeypatch):
    d = tmp_path / "evil"
    shutil.copytree(os.path.join(FIX, "basic"), d)
    shutil.copy(os.path.join(FIX, "hostile.metadata"), d / ".metadata")
    monkeypatch.chdir(tmp_path)  # where its payloads would create the marker
    with pytest.raises(keepsake.UnsafeError, match="posix.system"):
        convert_dcp(d, tmp_path / "out.keepsake")
    assert not (tmp_path / "ks_dcp_pwned_marker").exists()
    assert not (tmp_path / "out.keepsake").exists()


def test_hostile_object_left_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.keepsake"
    convert_dcp(os.path.join(FIX, "evil_object"), out)
    assert not (tmp_path / "ks_dcp_pwned_marker").exists()
    assert set(kt.load_file(out)) == {"w"}
    with keepsake.safe_open(out, framework="pt") as f:
        assert '"payload":"an object of class posix.system"' in f.metadata()["keepsake.dcp_import"]


def test_malformed(tmp_path):
    d = tmp_path / "bad"
    shutil.copytree(os.path.join(FIX, "two_rank"), d)
    with open(d / "__1_0.distcp", "r+b") as f:
        f.truncate(100)
    with pytest.raises(keepsake.FormatError, match="passes the end of the file"):
        convert_dcp(d, tmp_path / "out.keepsake")
    (d / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(keepsake.KeepsakeError):
        convert_dcp(d, tmp_path / "out.keepsake")
    with pytest.raises(keepsake.UnsupportedError, match="SAFETENSORS"):
        convert_dcp(os.path.join(FIX, "safetensors"), tmp_path / "out.keepsake")
    assert not (tmp_path / "out.keepsake").exists()

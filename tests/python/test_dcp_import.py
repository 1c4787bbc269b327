"""keepsake.distributed_import.convert_dcp and `keepsake convert DIR OUT` on torch.distributed.checkpoint directories.

Checkpoints are written here by torch's own dcp.save (FileSystemWriter, one process), and read from the
fixtures of tests/fixtures/dcp/ (made by make_dcp.py, including 2 ranks and hostile metadata). Values
must come back bit for bit.
"""
import json
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


# ---- keepsake's own DCP directories: the same state under the same names ----

def entries(path):
    """Every entry of a keepsake file: tensors (as bytes with dtype and shape) and scalars."""
    out = {k: (str(v.dtype), tuple(v.shape), bits(v).tolist()) for k, v in kt.load_file(path).items()}
    with keepsake.safe_open(path, framework="pt") as f:
        out.update(f.scalars())
        structure = json.loads(f.metadata()["keepsake.torch_structure"])
    return out, structure


def test_keepsake_writer_converts_as_torch_dcp(tmp_path):
    """A model, its AdamW state and plain values, saved by torch's FileSystemWriter and by KeepsakeWriter:
    both convert to the same entries (each key's path in the state dict, plain values as scalars) and the
    same structure document."""
    from keepsake.distributed import KeepsakeWriter

    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        model(torch.tensor([1, 2])).sum().backward()
        opt.step()
        return {"net": model.state_dict(), "adamw": opt.state_dict(), **state()}

    dcp.save(train(), storage_writer=FileSystemWriter(str(tmp_path / "torch")))
    dcp.save(train(), storage_writer=KeepsakeWriter(str(tmp_path / "ks")))
    a, b = tmp_path / "torch.keepsake", tmp_path / "ks.keepsake"
    convert_dcp(tmp_path / "torch", a)
    convert_dcp(tmp_path / "ks", b)
    ea, sa = entries(a)
    eb, sb = entries(b)
    assert ea == eb
    assert sa == sb
    assert eb["adamw/param_groups/0/lr"] == 0.01 and eb["model/fc.weight"][1] == (7, 5)
    assert eb["net/0.weight"][1] == (5, 3) and eb["adamw/state/0/exp_avg"][1] == (5, 3)
    assert eb["epoch"] == 3 and eb["tag"] == "run-β" and eb["adamw/param_groups/0/params/2"] == 2
    assert sb["containers"]["adamw/param_groups/0/betas"] == {"kind": "tuple", "len": 2}


@pytest.mark.parametrize("ks_dir, torch_dir", [("keepsake_writer", "basic"), ("keepsake_writer_two_rank", "two_rank")])
def test_keepsake_0_1_directories_keep_loading(tmp_path, ks_dir, torch_dir):
    """Directories keepsake 0.1.0's KeepsakeWriter wrote (fixtures): KeepsakeReader loads them as before,
    and they convert to what their torch twins convert to."""
    from keepsake.distributed import KeepsakeReader
    convert_dcp(os.path.join(FIX, ks_dir), tmp_path / "k.keepsake")
    convert_dcp(os.path.join(FIX, torch_dir), tmp_path / "t.keepsake")
    assert entries(tmp_path / "k.keepsake") == entries(tmp_path / "t.keepsake")
    md = KeepsakeReader(os.path.join(FIX, ks_dir)).read_metadata()
    want = torch.load(os.path.join(FIX, torch_dir + ".pt"), weights_only=True)
    if torch_dir == "two_rank":
        target = {"model": {k: torch.zeros_like(v) for k, v in want["model"].items()}, "step": 0, "tags": []}
    else:
        target = {"model": {k: torch.zeros_like(v) for k, v in want["model"].items()}, "step": 0, "big": 0,
                  "cfg": {"sizes": None, "pair": None, "nested": {"k": None}}}
    dcp.load(target, storage_reader=KeepsakeReader(os.path.join(FIX, ks_dir), verify_files=True), no_dist=True)
    for k, v in want["model"].items():
        assert_same_tensor(target["model"][k], v, k)
    assert target["step"] == want["step"] and "model.bias" in md.state_dict_metadata or torch_dir == "basic"
    if torch_dir == "basic":
        assert target["big"] == 2 ** 70 and target["cfg"] == want["cfg"]


# ---- Hugging Face layouts ----

def hf_state():
    g = torch.Generator().manual_seed(5)
    return {"model.emb.weight": torch.randn(5, 3, generator=g),
            "model.lin.weight": torch.randn(2, 3, generator=g).bfloat16(),
            "model.lin.bias": torch.arange(2)}


@pytest.mark.parametrize("mapping", [None, {"model.emb.weight": 1, "model.lin.weight": 2, "model.lin.bias": 2}])
def test_hf_storage_writer_directory_imports(tmp_path, mapping):
    """What torch's HuggingFaceStorageWriter writes (safetensors files and model.safetensors.index.json, no
    .metadata) imports: every tensor, under its key."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    d = tmp_path / "hf"
    dcp.save(hf_state(), storage_writer=HuggingFaceStorageWriter(str(d), fqn_to_index_mapping=mapping), no_dist=True)
    out = tmp_path / "hf.keepsake"
    assert convert_dcp(d, out) == (3, 0)
    got = kt.load_file(out)
    for k, v in hf_state().items():
        assert_same_tensor(got[k], v, k)
    with keepsake.safe_open(out, framework="pt") as f:
        info = json.loads(f.metadata()["keepsake.dcp_import"])
    assert info["format"] == "safetensors" and info["files"] == (2 if mapping else 1) and info["checksummed"] == 0


def test_hf_model_layouts_import(tmp_path):
    """transformers' layouts: one model.safetensors, or shards and an index whose weight_map names them."""
    from safetensors.torch import save_file
    sd = hf_state()
    one = tmp_path / "one"
    one.mkdir()
    save_file(sd, str(one / "model.safetensors"), metadata={"format": "pt"})
    two = tmp_path / "two"
    two.mkdir()
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file({"model.emb.weight": sd["model.emb.weight"]}, str(two / names[0]), metadata={"format": "pt"})
    save_file({k: sd[k] for k in ("model.lin.weight", "model.lin.bias")}, str(two / names[1]),
              metadata={"format": "pt"})
    wm = {"model.emb.weight": names[0], "model.lin.weight": names[1], "model.lin.bias": names[1]}
    (two / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}))
    (two / "stray.safetensors").write_bytes(b"not read: the index does not name it")
    for d in (one, two):
        out = tmp_path / (d.name + ".keepsake")
        convert_dcp(d, out)
        got = kt.load_file(out)
        assert set(got) == set(sd)
        for k, v in sd.items():
            assert_same_tensor(got[k], v, k)


def test_hf_chunks_put_together(tmp_path):
    """HuggingFaceStorageWriter(save_distributed=True): each rank's file holds its chunk of a tensor, placed by
    DCP_SHARDING_INFO; chunks that do not cover the tensor exactly once are refused."""
    from safetensors.torch import save_file
    w = torch.arange(15, dtype=torch.float32).reshape(5, 3)

    def write(d, second_offset):
        d.mkdir()
        save_file({"w": w[:3].clone()}, str(d / "shard-00001-model-00001-of-00001.safetensors"),
                  metadata={"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": [0, 0]}})})
        save_file({"w": w[3:].clone()}, str(d / "shard-00002-model-00001-of-00001.safetensors"),
                  metadata={"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": second_offset}})})

    write(tmp_path / "good", [3, 0])
    convert_dcp(tmp_path / "good", tmp_path / "good.keepsake")
    assert_same_tensor(kt.load_file(tmp_path / "good.keepsake")["w"], w, "w")
    write(tmp_path / "gap", [4, 0])
    with pytest.raises(keepsake.FormatError, match="exactly once"):
        convert_dcp(tmp_path / "gap", tmp_path / "gap.keepsake")
    assert not (tmp_path / "gap.keepsake").exists()


def test_directories_without_a_checkpoint_are_unsupported(tmp_path):
    """A directory that holds nothing keepsake reads is UnsupportedError, not an I/O error; a Hugging Face
    index is not a keepsake sharded checkpoint (KeepsakeReader says so)."""
    from keepsake.distributed import KeepsakeReader
    (tmp_path / "empty").mkdir()
    with pytest.raises(keepsake.UnsupportedError, match="not a checkpoint directory"):
        convert_dcp(tmp_path / "empty", tmp_path / "out.keepsake")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')
    with pytest.raises(keepsake.UnsupportedError, match="Hugging Face index"):
        KeepsakeReader(str(hf)).read_metadata()

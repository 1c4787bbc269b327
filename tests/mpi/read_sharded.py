"""Reads a keepsake sharded checkpoint with the reference safetensors library only.

Usage: read_sharded.py DIR ROWS COLS

Checks what other tooling relies on: every rank file opens with safetensors, the
index's weight_map names a file holding each whole tensor, and each sharded
tensor reassembles from the chunks' DCP_SHARDING_INFO["saved_offsets"] (torch
DCP's schema) into the global shape the index records, with the values the
test program saved (w[i][j] = i*COLS + j + 0.5). Then, when torch is there,
torch DCP's own HuggingFaceStorageReader loads the model tensors from the same
files (through `.safetensors` links, the only names it lists), with
torch.distributed.checkpoint.load(no_dist=True). Exits 77 when safetensors or
numpy is missing.
"""
import json
import os
import sys
import tempfile

try:
    import numpy as np
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)


def main():
    d, rows, cols = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    ks = idx["keepsake"]
    assert ks["format"] == "keepsake-sharded" and ks["world_size"] >= 1
    for name, fname in idx["weight_map"].items():
        with safe_open(os.path.join(d, fname), framework="numpy") as f:
            assert name in f.keys(), (name, fname)
    for name, info in ks["sharded"].items():
        whole = np.full(info["global_shape"], np.nan, dtype=np.float32)
        seen = 0
        for entry in ks["files"]:
            with safe_open(os.path.join(d, entry["file"]), framework="numpy") as f:
                meta = f.metadata()
                dcp = json.loads(meta["DCP_SHARDING_INFO"])
                assert meta["DCP_VERSION"] == "1.0" and meta["format"] == "pt"
                if name not in dcp:
                    continue
                chunk = f.get_tensor(name)
                off = dcp[name]["saved_offsets"]
                assert dcp[name]["global_shape"] == info["global_shape"]
                sl = tuple(slice(o, o + s) for o, s in zip(off, chunk.shape))
                whole[sl] = chunk
                seen += chunk.size
        assert seen == whole.size, (name, seen, whole.size)
        if name == "state/model/w":
            want = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + 0.5
            assert np.array_equal(whole, want), (whole, want)
    print(f"read_sharded: {len(idx['weight_map'])} whole tensors, {len(ks['sharded'])} sharded, "
          f"{ks['world_size']} files: ok")
    torch_dcp(d, idx, rows, cols)


def torch_dcp(d, idx, rows, cols):
    try:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader
    except ImportError as e:
        print(f"torch DCP reader not tried: {e}")
        return
    ks = idx["keepsake"]
    with tempfile.TemporaryDirectory() as links:
        for entry in ks["files"]:
            stem = entry["file"].rsplit(".", 1)[0]
            os.symlink(os.path.join(os.path.abspath(d), entry["file"]), os.path.join(links, stem + ".safetensors"))
        want = {name: torch.zeros(info["global_shape"]) for name, info in ks["sharded"].items()}
        for name in idx["weight_map"]:
            if name.startswith("state/model/"):
                with safe_open(os.path.join(d, idx["weight_map"][name]), framework="numpy") as f:
                    want[name] = torch.from_numpy(f.get_tensor(name).copy())
        got = {name: torch.full_like(t, float("nan")) for name, t in want.items()}
        dcp.load(got, storage_reader=HuggingFaceStorageReader(path=links), no_dist=True)
    expect_w = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) + 0.5
    assert torch.equal(got["state/model/w"], expect_w), got["state/model/w"]
    expect_v = torch.arange(24, dtype=torch.float32).reshape(4, 6)  # the column-sharded tensor
    assert torch.equal(got["state/model/v"], expect_v), got["state/model/v"]
    for name, t in want.items():
        if name not in ks["sharded"]:
            assert torch.equal(got[name], t), name
    print(f"torch {torch.__version__} DCP HuggingFaceStorageReader: {len(got)} model tensors: ok")


main()

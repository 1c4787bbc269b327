"""Reads a keepsake sharded checkpoint with the reference safetensors library only.

Usage: read_sharded.py DIR ROWS COLS

Checks what other tooling relies on: every rank file opens with safetensors, the
index's weight_map names a file holding each whole tensor, and each sharded
tensor reassembles from the chunks' DCP_SHARDING_INFO["saved_offsets"] (torch
DCP's schema) into the global shape the index records, with the values the
test program saved (w[i][j] = i*COLS + j + 0.5). Exits 77 when safetensors or
numpy is missing.
"""
import json
import os
import sys

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


main()

"""An independent safetensors reader, written from the specification alone, reads keepsake files.

It parses the 8-byte length, the JSON header and the data section with nothing but the
standard library and numpy, checks every rule of the specification (offsets tile the data
section exactly, sizes match shapes, metadata values are strings, data starts 64-byte
aligned as keepsake promises), and compares every tensor's bytes with what real torch
loads from the same file exported by `keepsake convert FILE out.pt --ignore rng`. The RNG
words are left out of the torch comparison only: version-1 files store them as U64, which torch
does not have; the spec reader still reads and checks them.

usage: safetensors_spec_reader.py KEEPSAKE_CLI FILE...
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    print("numpy or torch is not importable: skipping")
    sys.exit(77)

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4,
         "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
         "C64": 8, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1}


def read_spec(path):
    """Returns ({name: (dtype, shape, bytes)}, metadata, data_start) per the safetensors spec."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n <= 100_000_000 and 8 + n <= len(blob), "header length out of range"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    assert all(isinstance(v, str) for v in meta.values()), "metadata values must be strings"
    data = blob[8 + n:]
    spans, out = [], {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        numel = int(np.prod(e["shape"], dtype=np.int64)) if e["shape"] else 1
        assert end - begin == numel * SIZES[e["dtype"]], f"{name}: size does not match shape"
        spans.append((begin, end))
        out[name] = (e["dtype"], e["shape"], data[begin:end])
    pos = 0
    for begin, end in sorted(spans):
        assert begin == pos, f"offsets do not tile the data section at {pos}"
        pos = end
    assert pos == len(data), "trailing bytes after the last tensor"
    return out, meta, 8 + n


def torch_leaf(tree, name):
    node = tree
    for part in name.split("/"):
        node = node[part]
    return node


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def check(cli, path, tmp):
    tensors, meta, data_start = read_spec(path)
    assert data_start % 64 == 0, "keepsake data section must start 64-byte aligned"
    if meta.get("keepsake.format") == "keepsake":
        json.loads(meta["keepsake.checksums"])  # component entries are JSON strings
    exported = os.path.join(tmp, "export.pt")
    subprocess.run([cli, "convert", path, exported, "--ignore", "rng"], check=True, stdout=subprocess.DEVNULL)
    tree = torch.load(exported, weights_only=True)
    assert "rng" not in tree, "--ignore rng left the rng entries in"
    for name, (dtype, shape, data) in tensors.items():
        if name.startswith("rng/"):
            continue
        t = torch_leaf(tree, name)
        if isinstance(t, list):  # a metric's list ("cat") state: exported as [tensor], or [] without rows
            assert len(t) == (1 if shape[0] else 0), f"{name}: a list of {len(t)} items for shape {shape}"
            if not t:
                continue
            t = t[0]
        assert list(t.shape) == list(shape), f"{name}: shape {list(t.shape)} != {shape}"
        assert raw_bytes(t) == data, f"{name}: bytes differ"
    return len(tensors)


def main():
    cli, files = sys.argv[1], sys.argv[2:]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            try:
                n = check(cli, path, tmp)
                print(f"ok   {os.path.basename(path)}: {n} tensors read from the spec match torch")
                passed += 1
            except (AssertionError, KeyError, ValueError, subprocess.CalledProcessError) as e:
                print(f"FAIL {os.path.basename(path)}: {e}")
                failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()

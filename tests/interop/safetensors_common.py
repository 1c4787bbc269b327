"""Shared pieces of the safetensors differential suite (safetensors_*.py).

Every script takes the same leading arguments: HELPER (safetensors_helper, built from
safetensors_helper.c), CLI (the keepsake command) and SOURCE_DIR (the repository root).
Scripts exit 77, with the reason printed, when torch, numpy or safetensors is missing.
"""
import json
import os
import struct
import subprocess
import sys

try:
    import numpy as np
    import safetensors
    import safetensors.numpy
    import safetensors.torch
    import torch
except ImportError as e:
    print(f"the differential suite needs numpy, torch and safetensors: {e}: skipping")
    sys.exit(77)

# In keepsake's order (the ks_dtype values), which safetensors_helper relies on.
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
         "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8, "F8_E4M3FNUZ": 1,
         "F8_E5M2FNUZ": 1}
DTYPES = list(SIZES)

TORCH_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "U16": torch.uint16,
                "I16": torch.int16, "U32": torch.uint32, "I32": torch.int32, "U64": torch.uint64,
                "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
                "C64": torch.complex64, "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz}
TORCH_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
# numpy has no bfloat16 and no 8-bit floats, so safetensors' numpy framework cannot hold those.
NUMPY_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
                "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
                "F16": np.float16, "F32": np.float32, "F64": np.float64, "C64": np.complex64}
NUMPY_NAMES = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}
NOT_IN_NUMPY = [d for d in DTYPES if d not in NUMPY_DTYPES]

MASK = (1 << 64) - 1


def splitmix_bytes(seed, n, dtype):
    """The bytes safetensors_helper writes for a tensor: the splitmix64 stream of `seed`."""
    out, s = bytearray(), seed
    while len(out) < n:
        s = (s + 0x9E3779B97F4A7C15) & MASK
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out += struct.pack("<Q", z ^ (z >> 31))
    out = bytes(out[:n])
    return bytes(b & 1 for b in out) if dtype == "BOOL" else out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def args():
    if len(sys.argv) < 4:
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} HELPER CLI SOURCE_DIR ...")
    return sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]


def helper_read(helper, paths):
    """{path: what the keepsake library loads}: status, message, tensors (name -> (dtype, shape, bytes)), metadata."""
    out = {}
    for i in range(0, len(paths), 200):
        chunk = paths[i:i + 200]
        res = subprocess.run([helper, "read", *chunk], capture_output=True, check=True)
        for line in res.stdout.decode("utf-8").splitlines():
            r = json.loads(line)
            r["tensors"] = {t["name"]: (t["dtype"], t["shape"], bytes.fromhex(t["hex"])) for t in r.get("tensors", [])}
            r["metadata"] = dict(r.get("metadata", []))
            out[r["file"]] = r
    return out


def spec_tensors(path):
    """(tensors, metadata) read by hand from the raw file: name -> (dtype, shape, bytes)."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None) or {}
    data = blob[8 + n:]
    return {k: (e["dtype"], e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]])
            for k, e in header.items()}, meta


def torch_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def torch_entry(t):
    return TORCH_NAMES[t.dtype], list(t.shape), torch_bytes(t)


def numpy_entry(a):
    return NUMPY_NAMES[a.dtype], list(a.shape), np.ascontiguousarray(a).tobytes()


class Checks:
    """Counts checks; a failed one is printed and counted, the run goes on."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL {what}")
        return ok

    def same(self, got, want, what):
        """Compares two {name: (dtype, shape, bytes)} maps, naming the first difference."""
        if got.keys() != want.keys():
            missing, extra = sorted(want.keys() - got.keys())[:3], sorted(got.keys() - want.keys())[:3]
            return self.check(False, f"{what}: names differ (missing {missing}, extra {extra})")
        for k in want:
            if tuple(got[k][:2]) != tuple(want[k][:2]) or got[k][2] != want[k][2]:
                detail = f"{got[k][:2]} vs {want[k][:2]}" if tuple(got[k][:2]) != tuple(want[k][:2]) else "bytes differ"
                return self.check(False, f"{what}: tensor {k!r}: {detail}")
        return self.check(True, what)

    def finish(self, summary):
        print(f"{summary}: {self.passed} checks passed, {self.failed} failed")
        sys.exit(1 if self.failed or not self.passed else 0)

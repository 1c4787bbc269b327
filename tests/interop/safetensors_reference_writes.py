"""Every file the reference safetensors implementation writes opens in keepsake, value for value.

safetensors.torch.save_file and safetensors.numpy.save_file write files with and without
metadata, with every dtype each framework has, 0-d and empty tensors, and 20,000 tensors. For
each file, `keepsake inspect --json` must list the tensors (dtype, shape, size, offset) and the
metadata the reference reports, `keepsake verify` must pass, and the library (through
safetensors_helper) must load the exact bytes that were saved and the same metadata.

The reference also writes dtypes keepsake does not represent (float8_e8m0fnu,
float4_e2m1fn_x2): keepsake must refuse those files with
KS_E_DTYPE and a message naming the dtype (docs/FORMAT.md, section 5.1).

usage: safetensors_reference_writes.py HELPER CLI SOURCE_DIR
"""
import json
import os
import subprocess
import tempfile

from safetensors_common import (NUMPY_DTYPES, TORCH_DTYPES, Checks, args, helper_read, np, numpy_entry, safetensors,
                                torch, torch_entry)

SHAPES = [(), (0,), (1,), (5,), (2, 3), (3, 0, 2), (1, 2, 1, 2)]
META = {"format": "pt", "note": "caf\u00e9 \U0001F600 \"quoted\" \\ {\"json\": [1]}", "empty": ""}
MANY = 20_000
# Dtypes the reference writes that keepsake refuses on purpose, with the name safetensors gives them.
FOREIGN = {"F8_E8M0": torch.float8_e8m0fnu, "F4": torch.float4_e2m1fn_x2}


def random_bytes(rng, n, dtype_name):
    b = rng.integers(0, 256, size=n, dtype=np.uint8)
    return (b & 1 if dtype_name == "BOOL" else b).tobytes()


def torch_tensor(rng, name, shape):
    n = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=TORCH_DTYPES[name]).element_size()
    raw = torch.frombuffer(bytearray(random_bytes(rng, n, name)) or bytearray(1), dtype=torch.uint8)[:n]
    return raw.view(TORCH_DTYPES[name]).reshape(shape).clone()


def numpy_array(rng, name, shape):
    dt = np.dtype(NUMPY_DTYPES[name])
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    return np.frombuffer(random_bytes(rng, n, name), dtype=dt).reshape(shape).copy()


def torch_files(tmp, rng):
    sd = {f"{dt.lower()}.{i}": torch_tensor(rng, dt, s) for dt in TORCH_DTYPES for i, s in enumerate(SHAPES)}
    out = []
    for meta in (None, META):
        p = os.path.join(tmp, f"torch-{'meta' if meta else 'plain'}.safetensors")
        safetensors.torch.save_file(sd, p, metadata=meta)
        out.append((p, {k: torch_entry(t) for k, t in sd.items()}, meta or {}))
    many = {f"model.layers.{i}.weight": torch_tensor(rng, "F32", (i % 4,)) for i in range(MANY // 2)}
    p = os.path.join(tmp, "torch-many.safetensors")
    safetensors.torch.save_file(many, p, metadata={"n": str(len(many))})
    out.append((p, {k: torch_entry(t) for k, t in many.items()}, {"n": str(len(many))}))
    return out


def numpy_files(tmp, rng):
    sd = {f"{dt.lower()}.{i}": numpy_array(rng, dt, s) for dt in NUMPY_DTYPES for i, s in enumerate(SHAPES)}
    out = []
    for meta in (None, META):
        p = os.path.join(tmp, f"numpy-{'meta' if meta else 'plain'}.safetensors")
        safetensors.numpy.save_file(sd, p, metadata=meta)
        out.append((p, {k: numpy_entry(a) for k, a in sd.items()}, meta or {}))
    many = {f"t{i}": numpy_array(rng, ["I64", "U8", "F16", "BOOL"][i % 4], (i % 3, 2)) for i in range(MANY // 2)}
    p = os.path.join(tmp, "numpy-many.safetensors")
    safetensors.numpy.save_file(many, p)
    out.append((p, {k: numpy_entry(a) for k, a in many.items()}, {}))
    return out


def check_inspect(c, cli, path, want, meta):
    res = subprocess.run([cli, "inspect", path, "--json"], capture_output=True)
    if not c.check(res.returncode == 0, f"{path}: keepsake inspect: {res.stderr.decode()[:200]}"):
        return
    doc = json.loads(res.stdout)
    with safetensors.safe_open(path, framework="numpy") as f:
        ref_meta = f.metadata() or {}
    c.check(doc["metadata"] == meta == ref_meta, f"{path}: inspect metadata {doc['metadata']} vs {ref_meta}")
    got = {t["name"]: (t["dtype"], t["shape"], t["bytes"]) for t in doc["tensors"]}
    c.check(got == {k: (v[0], v[1], len(v[2])) for k, v in want.items()}, f"{path}: inspect tensors")
    # Offsets: the tensors tile the data section in the order the reference wrote them.
    spans = sorted((t["offset"], t["offset"] + t["bytes"]) for t in doc["tensors"])
    c.check(all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and (not spans or spans[-1][1] == doc["file_bytes"]),
            f"{path}: inspect offsets tile the file")


def check_foreign(c, tmp, helper, cli):
    for name, dt in FOREIGN.items():
        p = os.path.join(tmp, f"foreign-{name}.safetensors")
        t = torch.zeros(4, dtype=torch.uint8).view(dt) if dt != torch.complex64 else torch.zeros(2, dtype=dt)
        safetensors.torch.save_file({"x": t, "ok": torch.ones(2)}, p)
        with safetensors.safe_open(p, framework="pt") as f:
            c.check(f.get_slice("x").get_dtype() == name, f"{name}: the reference names the dtype {name}")
        r = helper_read(helper, [p])[p]
        c.check(r["status"] == "KS_E_DTYPE" and f"'{name}'" in r["message"],
                f"{name}: keepsake refuses it naming the dtype: {r['status']} {r['message']}")
        res = subprocess.run([cli, "verify", p], capture_output=True)
        c.check(res.returncode == 1 and name in res.stdout.decode() + res.stderr.decode(),
                f"{name}: keepsake verify refuses it naming the dtype")
    print(f"ok   {len(FOREIGN)} dtypes keepsake does not represent ({', '.join(FOREIGN)}) refused with KS_E_DTYPE")


def main():
    helper, cli, _, _ = args()
    c = Checks()
    rng = np.random.default_rng(20260)
    with tempfile.TemporaryDirectory() as tmp:
        files = torch_files(tmp, rng) + numpy_files(tmp, rng)
        loaded = helper_read(helper, [p for p, _, _ in files])
        for path, want, meta in files:
            lib = loaded[path]
            if not c.check(lib["status"] == "KS_OK", f"{path}: keepsake refuses it: {lib['message']}"):
                continue
            c.same(lib["tensors"], want, f"{path}: keepsake loads the saved bytes")
            c.check(lib["metadata"] == meta, f"{path}: keepsake metadata {lib['metadata']} vs {meta}")
            check_inspect(c, cli, path, want, meta)
            res = subprocess.run([cli, "verify", path], capture_output=True)
            c.check(res.returncode == 0, f"{path}: keepsake verify: {res.stdout.decode()[:200]}")
            dts = sorted({v[0] for v in want.values()})
            print(f"ok   {os.path.basename(path)}: {len(want)} tensors ({', '.join(dts)}), {len(meta)} metadata "
                  f"pairs: inspect, verify and the library agree with what was saved")
        check_foreign(c, tmp, helper, cli)
    c.finish(f"safetensors writes, keepsake reads: {len(files)} files")


if __name__ == "__main__":
    main()

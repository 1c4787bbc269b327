"""Every file keepsake writes opens in the reference safetensors implementation, byte for byte.

Files: every dtype in 0-d, empty and n-d shapes (written through the library by
safetensors_helper), the same restricted to the dtypes numpy holds, 100,000 tensors, a
torch.save file converted by `keepsake convert`, the golden files under tests/golden/v1, and a
fresh demo run of keepsake-digits. Each is opened with safetensors.safe_open and load_file in
both the numpy and the torch frameworks; names, dtypes, shapes, bytes and metadata must be what
was written. numpy has no bfloat16 or 8-bit floats, so for BF16, F8_E4M3 and F8_E5M2 the numpy
framework must refuse the tensor (and numpy.load_file the file) instead of misreading it.

usage: safetensors_keepsake_writes.py HELPER CLI SOURCE_DIR DIGITS
"""
import glob
import os
import subprocess
import tempfile

from safetensors_common import (DTYPES, NOT_IN_NUMPY, NUMPY_DTYPES, SIZES, TORCH_DTYPES, Checks, args, helper_read,
                                numel, numpy_entry, safetensors, spec_tensors, splitmix_bytes, torch, torch_entry)

SHAPES = [[], [0], [7], [3, 5], [2, 0, 4], [2, 3, 4]]  # as in safetensors_helper.c
MANY = 100_000


def dtypes_expected(only=None):
    want = {}
    for d, dt in enumerate(DTYPES):
        if only and dt not in only:
            continue
        for k, shape in enumerate(SHAPES):
            want[f"{dt}/s{k}"] = (dt, shape, splitmix_bytes(d * len(SHAPES) + k + 1, numel(shape) * SIZES[dt], dt))
    return want


def many_expected():
    want = {}
    for i in range(MANY):
        dt, rank = DTYPES[i % len(DTYPES)], i % 3
        shape = [i % 3, 1 + i % 2][:rank]
        want[f"layers.{i}/w"] = (dt, shape, splitmix_bytes(i + 1, numel(shape) * SIZES[dt], dt))
    return want


def convert_source(tmp, cli):
    """A nested torch state dict saved by torch.save and converted by the CLI."""
    g = torch.Generator().manual_seed(3)
    sd = {"model": {"w": torch.randn(3, 4, generator=g), "empty": torch.zeros(0, 5), "step": torch.tensor(9)},
          "bf16": torch.randn(4, generator=g).to(torch.bfloat16), "f16": torch.randn(2, 2, generator=g).half(),
          "f64": torch.randn(3, generator=g, dtype=torch.float64), "i64": torch.arange(-3, 3),
          "i32": torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32), "i16": torch.tensor([-7], dtype=torch.int16),
          "i8": torch.tensor([-128, 127], dtype=torch.int8), "u8": torch.tensor([0, 255], dtype=torch.uint8),
          "bool": torch.tensor([[True, False]])}
    pt, out = os.path.join(tmp, "source.pt"), os.path.join(tmp, "converted.keepsake")
    torch.save(sd, pt)
    subprocess.run([cli, "convert", pt, out], check=True, stdout=subprocess.DEVNULL)
    want = {}
    for k, v in sd.items():
        for k2, t in (v.items() if isinstance(v, dict) else [(None, v)]):
            want[k if k2 is None else f"{k}/{k2}"] = torch_entry(t)
    return out, want


def demo_files(tmp, digits):
    run = os.path.join(tmp, "demo")
    subprocess.run([digits, "--run-dir", run, "--epochs", "1", "--save-interval", "20ba", "--keep", "2",
                    "--seed", "11"], check=True, stdout=subprocess.DEVNULL)
    files = sorted(glob.glob(os.path.join(run, "*.keepsake")))
    assert len(files) >= 2, f"the demo wrote {files}"
    return files


def check_numpy(c, path, want, meta):
    cannot = 0
    with safetensors.safe_open(path, framework="numpy") as f:
        c.check(set(f.keys()) == set(want), f"{path}: safe_open(numpy) names")
        c.check((f.metadata() or {}) == meta, f"{path}: safe_open(numpy) metadata")
        got = {}
        for k in f.keys():
            s = f.get_slice(k)
            c.check((s.get_dtype(), list(s.get_shape())) == tuple(want[k][:2]), f"{path}: {k}: slice dtype/shape")
            if want[k][0] in NUMPY_DTYPES:
                got[k] = numpy_entry(f.get_tensor(k))
                continue
            try:
                f.get_tensor(k)
                c.check(False, f"{path}: {k}: numpy framework returned a {want[k][0]} tensor numpy cannot hold")
            except (TypeError, AttributeError):
                cannot += 1
    c.same(got, {k: v for k, v in want.items() if v[0] in NUMPY_DTYPES}, f"{path}: safe_open(numpy) tensors")
    if any(v[0] in NOT_IN_NUMPY for v in want.values()):
        try:
            safetensors.numpy.load_file(path)
            c.check(False, f"{path}: numpy.load_file read dtypes numpy cannot hold")
        except (TypeError, AttributeError):
            c.check(True, "numpy.load_file refuses")
    else:
        c.same({k: numpy_entry(a) for k, a in safetensors.numpy.load_file(path).items()}, want,
               f"{path}: numpy.load_file")
    return cannot


def check_torch(c, path, want, meta):
    with safetensors.safe_open(path, framework="pt") as f:
        c.check((f.metadata() or {}) == meta, f"{path}: safe_open(pt) metadata")
        c.same({k: torch_entry(f.get_tensor(k)) for k in f.keys()}, want, f"{path}: safe_open(pt) tensors")
    c.same({k: torch_entry(t) for k, t in safetensors.torch.load_file(path).items()}, want,
           f"{path}: torch.load_file")


def main():
    helper, cli, src, rest = args()
    c = Checks()
    with tempfile.TemporaryDirectory() as tmp:
        files = []  # (label, path, expected tensors or None for "as the file's own header says")
        p = os.path.join(tmp, "dtypes.keepsake")
        subprocess.run([helper, "write-dtypes", p], check=True)
        files.append(("all dtypes", p, dtypes_expected()))
        p = os.path.join(tmp, "dtypes-numpy.keepsake")
        subprocess.run([helper, "write-dtypes", p, *NUMPY_DTYPES], check=True)
        files.append(("numpy dtypes", p, dtypes_expected(NUMPY_DTYPES)))
        p = os.path.join(tmp, "many.keepsake")
        subprocess.run([helper, "write-many", p, str(MANY)], check=True)
        files.append((f"{MANY} tensors", p, many_expected()))
        files.append(("convert from torch.save", *convert_source(tmp, cli)))
        for g in sorted(glob.glob(os.path.join(src, "tests", "golden", "v1", "*.keepsake"))):
            files.append(("golden " + os.path.basename(g), g, None))
        for d in demo_files(tmp, rest[0]):
            files.append(("demo " + os.path.basename(d), d, None))

        loaded = helper_read(helper, [p for _, p, _ in files])
        cannot = 0
        for label, path, want in files:
            raw, raw_meta = spec_tensors(path)
            lib = loaded[path]
            if want is not None:
                c.same(raw, want, f"{label}: the file holds what was written")
            want = raw
            # The library reads back what it wrote; future-version.keepsake is refused on purpose.
            if lib["status"] == "KS_OK":
                c.same(lib["tensors"], want, f"{label}: keepsake reads its own file")
                c.check(lib["metadata"] == raw_meta, f"{label}: keepsake metadata")
            else:
                c.check(os.path.basename(path) == "future-version.keepsake" and lib["status"] == "KS_E_VERSION",
                        f"{label}: keepsake refuses its own file: {lib['message']}")
            cannot += check_numpy(c, path, want, raw_meta)
            check_torch(c, path, want, raw_meta)
            ntensors = len(want)
            dts = sorted({v[0] for v in want.values()}, key=DTYPES.index)
            print(f"ok   {label}: {ntensors} tensors ({', '.join(dts)}) read identically by safe_open and "
                  f"load_file, numpy and torch")
        meta = safetensors.safe_open(files[0][1], framework="numpy").metadata()
        c.check(meta.get("note") == "h\u00e9llo, \U0001F600 {\"json\": [1]}" and meta.get("empty") == "",
                "caller metadata survives as written")
        c.check(set(TORCH_DTYPES) == set(DTYPES), "torch holds every keepsake dtype")
        print(f"numpy cannot hold {', '.join(NOT_IN_NUMPY)}: refused {cannot} times by the numpy framework, as expected")
        c.finish(f"keepsake writes, safetensors reads: {len(files)} files")


if __name__ == "__main__":
    main()

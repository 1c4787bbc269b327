#!/usr/bin/env python3
"""Mutation fuzzer for the Python package's readers (the extension and its modules).

libFuzzer cannot drive these in-process: they run inside CPython with torch loaded, so a
coverage-guided target would have to embed both in an instrumented binary. What the extension
parses itself is nothing: every byte goes to the library (ks_reader_open_buffer, ks_reader_open,
ks_torch_load of bytes in memory), whose own libFuzzer targets (fuzz_safetensors, fuzz_torch,
fuzz_zip, fuzz_pickle, ...) run with coverage. This fuzzer covers the rest: the extension's
conversion of what the library accepted into Python and torch objects (shapes, strides, dtypes,
metadata, scalars), safe_open, load_checkpoint into live objects, compute_metrics, convert and
load_pt, on mutants of the seed corpora and of files the package writes itself.

A worker process loads one mutant after another; before each it writes the input to disk, so a
worker killed by a signal leaves the input that killed it (saved as crash-py-<hash> in the
current directory). Any exception other than a KeepsakeError is a finding too (saved as
finding-py-<hash>). Runs for SECONDS (default 60); exits 1 on any finding.
    py_readers.py SRC_DIR [SECONDS]        (PYTHONPATH must hold the built package)
"""
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

WORKER_BATCH = 400  # inputs per worker: bounds the damage a leak could do


def seeds(src, tmp):
    out = []
    for sub in ("safetensors", "zip", "torch", "convert_lists"):
        d = os.path.join(src, "tests", "fuzz", "corpus", sub)
        for dirpath, _dirs, names in sorted(os.walk(d)):
            out += [os.path.join(dirpath, f) for f in sorted(names)]
    for rel in ("torch/tensors.pt", "torch/adamw_state_dict.pt", "composer/composer-0.14-dict-metrics.pt"):
        p = os.path.join(src, "tests", "fixtures", rel)
        if os.path.exists(p):
            out.append(p)
    out.append(own_checkpoint(tmp))
    data = []
    for p in out:
        with open(p, "rb") as f:
            b = f.read()
        if b:
            data.append(b)
    return data


def own_checkpoint(tmp):
    import torch
    import torchmetrics as tm
    import keepsake.torch as kt
    m = tm.CatMetric()
    m.update(torch.arange(3.0))
    path = os.path.join(tmp, "seed.keepsake")
    model = torch.nn.Linear(3, 2)
    kt.save_checkpoint(path, model=model, optimizers=torch.optim.AdamW(model.parameters()),
                       train_metrics={"CatMetric": m, "MeanMetric": tm.MeanMetric()},
                       extra={"t": (1, [2.5, None]), "e": {}, "big": torch.zeros(0, 3, dtype=torch.int16)}, rng=True)
    return path


def mutate(data, rng):
    b = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:  # a few random bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:  # truncation
        del b[rng.randrange(len(b)):]
    elif kind == 2 and len(b) > 8:  # inside a safetensors header
        end = min(len(b), 8 + int.from_bytes(data[:8], "little"))
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(max(1, end))] = rng.choice(b"0123456789[]{},:\"-e.")
    elif kind == 3:  # a number in the text made huge or negative
        digits = [i for i in range(len(b)) if 48 <= b[i] <= 57]
        if digits:
            i = rng.choice(digits)
            b[i:i + 1] = rng.choice([b"18446744073709551615", b"4294967296", b"-1", b"9223372036854775807"])
    elif kind == 4:  # a slice duplicated
        i, j = sorted(rng.randrange(len(b)) for _ in range(2))
        b[i:i] = b[i:j][:4096]
    else:  # bit flips
        for _ in range(rng.randint(1, 16)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def exercise(path, data, tmp):
    """Every reader on one input; returns normally or raises a non-Keepsake exception."""
    import torch
    import torchmetrics as tm
    import keepsake
    import keepsake.torch as kt

    def clean(fn, *a, **kw):
        try:
            r = fn(*a, **kw)
            return r
        except keepsake.KeepsakeError:
            return None

    def touch(value):
        # a dict of tensors, or whatever one value a torch file held (load_pt returns it as saved)
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor) and v.numel():
                v.flatten()[-1]
                v.contiguous().view(-1).view(torch.uint8).sum()  # every byte, whatever the dtype

    touch(clean(kt.load_file, path))
    touch(clean(kt.load_file, path, backend="read", verify=True))
    touch(clean(kt.load, data))

    def lazy():
        with keepsake.safe_open(path, framework="pt") as f:
            for k in f.keys():
                f.get_slice(k).get_shape()
                touch({k: f.get_tensor(k)})
            f.metadata()
    clean(lazy)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    metrics = {"CatMetric": tm.CatMetric(), "MeanMetric": tm.MeanMetric()}
    clean(kt.load_checkpoint, path, model=model, optimizers=opt, train_metrics=metrics, strict=False)
    clean(keepsake.compute_metrics, path)
    clean(keepsake.verify, path)
    out = os.path.join(tmp, "out.pt")
    clean(keepsake.convert, path, out)
    touch(clean(kt.load_pt, path))
    clean(keepsake.convert, path, os.path.join(tmp, "out.keepsake"))


def worker(src, tmp, seed, count):
    rng = random.Random(seed)
    corpus = seeds(src, tmp)
    cur = os.path.join(tmp, "current")
    path = os.path.join(tmp, "input")
    for _ in range(count):
        data = mutate(rng.choice(corpus), rng)
        with open(cur, "wb") as f:  # what a dead worker leaves behind
            f.write(data)
        with open(path, "wb") as f:
            f.write(data)
        try:
            exercise(path, data, tmp)
        except Exception:  # noqa: BLE001 - anything but a KeepsakeError is a finding
            name = "finding-py-" + hashlib.sha1(data).hexdigest()[:12]
            with open(name, "wb") as f:
                f.write(data)
            sys.stderr.write(f"py_readers: {name}:\n{traceback.format_exc()}")
            return 1
    return 0


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _, _, src, tmp, seed, count = sys.argv
        sys.exit(worker(src, tmp, int(seed), int(count)))
    src = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    end = time.time() + secs
    runs = findings = workers = 0
    seed = int(os.environ.get("KS_FUZZ_SEED", "1"))
    t0 = time.time()
    while time.time() < end:
        tmp = tempfile.mkdtemp(prefix="ks-pyfuzz-")
        batch = WORKER_BATCH
        p = subprocess.run([sys.executable, __file__, "--worker", src, tmp, str(seed), str(batch)],
                           stdout=subprocess.DEVNULL, timeout=max(60.0, end - time.time() + 600))
        workers += 1
        seed += 1
        if p.returncode < 0:  # killed by a signal: the input it was reading is the finding
            data = open(os.path.join(tmp, "current"), "rb").read()
            name = "crash-py-" + hashlib.sha1(data).hexdigest()[:12]
            shutil.copy(os.path.join(tmp, "current"), name)
            print(f"py_readers: worker killed by {signal.Signals(-p.returncode).name}; input saved as {name}")
            findings += 1
        elif p.returncode:
            findings += 1
        else:
            runs += batch
        shutil.rmtree(tmp, ignore_errors=True)
        if findings:
            break
    rate = runs / max(time.time() - t0, 1e-9)
    print(f"py_readers: {runs} inputs in {time.time() - t0:.0f} s ({rate:.1f}/s), {workers} workers, {findings} findings")
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()

"""The extension never crashes the interpreter.

- paths are taken as ``os`` functions take them (str, bytes, os.PathLike); only ``load(data)``
  (and ``load_pt``, documented so) takes a file's contents;
- ``backend="read"`` copies the file into memory the tensors own (no mapping);
- tensors with no elements and a huge shape load as safetensors 0.8.0 loads them;
- a bad ``keepsake.metrics`` record makes ``compute_metrics`` raise, never crash (it freed an
  eval collection twice), and its arguments cannot ask for unbounded memory.

The race of a writer truncating a file in place under readers is tests/hostile/python_truncate_race.py.
"""
import json
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import keepsake
import keepsake.numpy as kn
import keepsake.torch as kt


@pytest.fixture
def tensors():
    return {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.tensor([1, 2, 3], dtype=torch.int64)}


def same(d1, d2):
    return list(d1) == list(d2) and all(torch.equal(d1[k], d2[k]) for k in d1)


# ---- 8c: bytes and os.PathLike paths ----

def test_bytes_and_pathlike_paths_everywhere(tmp_path, tensors):
    p = tmp_path / "t.keepsake"
    b = os.fsencode(p)
    kt.save_file(tensors, b)                                    # bytes path on save
    assert p.exists() and not os.path.exists(b"\x00")
    assert same(kt.load_file(b), tensors)                       # was: the bytes taken as contents
    assert same(kt.load_file(p), tensors)
    assert same(kt.load_file(b, backend="read"), tensors)
    with keepsake.safe_open(b, framework="pt") as f:
        assert f.keys() == ["a", "b"] and torch.equal(f.get_tensor("a"), tensors["a"])
    with keepsake.safe_open(p, framework="np", backend="read") as f:
        assert (f.get_tensor("b") == np.array([1, 2, 3])).all()
    kn.save_file({"x": np.ones(3, np.float32)}, os.fsencode(tmp_path / "n.keepsake"))
    assert (kn.load_file(os.fsencode(tmp_path / "n.keepsake"))["x"] == 1).all()
    keepsake.verify(b)
    out = os.fsencode(tmp_path / "c.keepsake")
    assert keepsake.convert(b, out) == (2, 0)
    assert same(kt.load_file(pathlib.Path(os.fsdecode(out))), tensors)
    kt.save_pt(tensors, os.fsencode(tmp_path / "t.pt"))
    assert torch.equal(kt.load_pt(tmp_path / "t.pt")["a"], tensors["a"])


def test_checkpoint_bytes_path(tmp_path):
    model = torch.nn.Linear(3, 2)
    ck = os.fsencode(tmp_path / "ck.keepsake")
    kt.save_checkpoint(ck, model=model, rng=False)
    other = torch.nn.Linear(3, 2)
    rep = kt.load_checkpoint(ck, model=other, rng=False)
    assert torch.equal(other.weight, model.weight) and isinstance(rep.path, str)
    assert keepsake.compute_metrics(ck)["__report__"] is not None


def test_contents_only_through_load(tensors):
    data = kt.save(tensors)
    assert same(kt.load(data), tensors)                       # load(data) keeps taking contents
    assert (kn.load(kn.save({"x": np.zeros(2, np.float32)}))["x"] == 0).all()
    with pytest.raises(keepsake.IOError_):                      # bytes to load_file: a (missing) path,
        kt.load_file(b"no-such-file.keepsake")                  # was a FormatError on the name's bytes
    with pytest.raises(TypeError):                              # as os.open: no bytearray paths
        kt.load_file(bytearray(b"t.keepsake"))


def test_non_utf8_bytes_path(tmp_path, tensors):
    """A name that is not UTF-8: opened by its bytes, and an error on it is an exception, not a
    NULL path handed to C (the reader used PyUnicode_AsUTF8 of the decoded path)."""
    d = os.fsencode(tmp_path)
    p = d + b"/\xff\xfe.keepsake"
    kt.save_file(tensors, p)
    assert same(kt.load_file(p), tensors) and same(kt.load_file(p, backend="read"), tensors)
    with keepsake.safe_open(p) as f:
        with pytest.raises(keepsake.NotFoundError) as e:
            f.get_tensor("nope")
    assert os.fsencode(e.value.file) == p
    with pytest.raises(keepsake.IOError_):
        kt.load_file(d + b"/\xff-missing", backend="read")


# ---- 4: the copying backend ----

def test_read_backend_owns_its_memory(tmp_path, tensors):
    p = tmp_path / "t.keepsake"
    kt.save_file(tensors, p)
    mapped, copied = kt.load_file(p), kt.load_file(p, backend="read")
    assert same(mapped, copied)
    size = p.stat().st_size
    with open(p, "r+b") as f:                                   # in place: what keepsake never does
        f.truncate(0)
        f.write(b"\x00" * size)
    assert same(copied, tensors)                                # untouched by the file's new bytes
    copied["a"] += 1                                            # and writable
    with pytest.raises(keepsake.KeepsakeError):
        kt.load_file(p, backend="read")


def test_read_backend_verify_and_errors(tmp_path, tensors):
    p = tmp_path / "t.keepsake"
    kt.save_file(tensors, p)
    assert same(kt.load_file(p, backend="read", verify=True), tensors)
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(keepsake.ChecksumError):
        kt.load_file(p, backend="read", verify=True)
    with pytest.raises(keepsake.InvalidError):
        kt.load_file(p, backend="pread")
    with pytest.raises(keepsake.IOError_):                      # a directory, read as a file
        kt.load_file(tmp_path, backend="read")
    empty = tmp_path / "empty.keepsake"
    empty.write_bytes(b"")
    with pytest.raises(keepsake.FormatError):
        kt.load_file(empty, backend="read")
    kt.save_file({}, tmp_path / "none.keepsake")
    assert kt.load_file(tmp_path / "none.keepsake", backend="read") == {}


# ---- 8d: no elements, huge shape ----

def raw_file(path, shape, dtype="F32"):
    h = json.dumps({"z": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}}).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h)


@pytest.mark.parametrize("shape", [[0, 2**32, 2**32], [0, 2**40, 2**40, 2**40], [2**62, 0, 4], [0, 2**63 - 1]])
def test_huge_empty_shape_like_safetensors(tmp_path, shape):
    from safetensors.torch import load_file as st_load_file
    p = tmp_path / "z.safetensors"
    raw_file(p, shape)
    ref = st_load_file(str(p))["z"]
    for backend in ("mmap", "read"):
        t = kt.load_file(p, backend=backend)["z"]               # was: RuntimeError "Stride calculation overflowed"
        assert (t.shape, t.stride(), t.dtype) == (ref.shape, ref.stride(), ref.dtype)
    with keepsake.safe_open(p) as f:
        assert f.get_tensor("z").shape == ref.shape
        assert f.get_slice("z").get_shape() == shape
    assert kt.load(p.read_bytes())["z"].shape == ref.shape


def test_huge_empty_shape_numpy_is_a_keepsake_error(tmp_path):
    p = tmp_path / "z.safetensors"
    raw_file(p, [0, 2**32, 2**32])
    with pytest.raises(keepsake.ShapeError, match="numpy cannot represent"):
        kn.load_file(p)
    raw_file(p, [0, 3])
    assert kn.load_file(p)["z"].shape == (0, 3)


# ---- item 2: ownership of metric collections built from a file's records ----

def checkpoint_with_metrics(path):
    import torchmetrics
    acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
    acc.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    ev = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
    ev.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
    ev2 = torchmetrics.MeanMetric()
    ev2.update(torch.tensor([1.0, 2.0]))
    kt.save_checkpoint(path, train_metrics={"MulticlassAccuracy": acc},
                       eval_metrics={"eval": {"MulticlassAccuracy": ev}, "test": {"MeanMetric": ev2}},
                       rng=False, fsync=False)


def rewrite_metrics(path, edit):
    """Rewrites the keepsake.metrics record of a file in its header (the data is kept as is)."""
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    rec = json.loads(h["__metadata__"]["keepsake.metrics"])
    rec = edit(rec)
    h["__metadata__"]["keepsake.metrics"] = rec if isinstance(rec, str) else json.dumps(rec)
    nh = json.dumps(h).encode()
    nh += b" " * (-len(nh) % 8)
    path.write_bytes(struct.pack("<Q", len(nh)) + nh + b[8 + n:])


def compute_in_child(path):
    """compute_metrics in a fresh interpreter: (exit status, exception class or 'ok', message)."""
    code = ("import sys, keepsake\n"
            "try:\n"
            "    keepsake.compute_metrics(sys.argv[1]); print('ok')\n"
            "except keepsake.KeepsakeError as e:\n"
            "    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout.strip(), r.stderr


def set_record(key, **fields):
    def edit(rec):
        rec[key].update(fields)
        return rec
    return edit


EVAL = "state/eval_metrics/eval/MulticlassAccuracy"
TEST = "state/eval_metrics/test/MeanMetric"
TRAIN = "state/train_metrics/MulticlassAccuracy"


def test_compute_metrics_good_record(tmp_path):
    p = tmp_path / "m.keepsake"
    checkpoint_with_metrics(p)
    rewrite_metrics(p, lambda rec: rec)                         # the helper alone changes nothing
    res = keepsake.compute_metrics(p)
    assert float(res[EVAL]["value"]) == 1.0 and float(res[TEST]["value"]) == 1.5
    assert float(res[TRAIN]["value"]) == pytest.approx(0.5)


@pytest.mark.parametrize("case,edit,expect", [
    ("eval unknown class", set_record(EVAL, **{"class": "NoSuchMetric"}), "NotFoundError"),
    ("second eval label unknown class", set_record(TEST, **{"class": "NoSuchMetric"}), "NotFoundError"),
    ("eval args refused", set_record(EVAL, args={"num_classes": "three"}), "Error"),
    ("eval negative classes", set_record(EVAL, args={"num_classes": -4}), "Error"),
    ("train unknown class", set_record(TRAIN, **{"class": "NoSuchMetric"}), "NotFoundError"),
    ("eval asks for 8 TB", set_record(EVAL, **{"class": "MulticlassConfusionMatrix",
                                                 "args": {"num_classes": 1 << 20}}), "LimitError"),
    ("record not JSON", lambda rec: "{not json", "FormatError"),
])
def test_compute_metrics_bad_record_raises(tmp_path, case, edit, expect):
    p = tmp_path / "m.keepsake"
    checkpoint_with_metrics(p)
    rewrite_metrics(p, edit)
    rc, out, err = compute_in_child(p)
    assert rc == 0, f"{case}: the interpreter died (status {rc}): {err[-2000:]}"
    assert out.split()[0].endswith(expect) and out.split()[0] != "ok", f"{case}: {out}"
    with pytest.raises(keepsake.KeepsakeError):
        keepsake.compute_metrics(p)


def test_compute_metrics_generated_records(tmp_path):
    """150 generated hostile records (metric_records.py) in one child: only KeepsakeErrors."""
    p = tmp_path / "m.keepsake"
    checkpoint_with_metrics(p)
    gen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metric_records.py")
    r = subprocess.run([sys.executable, gen, str(p), "18", "150"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"status {r.returncode}: {r.stderr[-3000:]}"
    counts = json.loads(r.stdout)
    assert sum(counts.values()) == 150 and counts.get("ok") and len(counts) > 1, counts


def test_every_error_class_survives_pickling(tmp_path):
    """Exceptions cross process boundaries (multiprocessing, DCP gathering a rank's error):
    each class comes back as itself with its fields, those named after builtins included."""
    import pickle
    from keepsake._core import errors as _errors
    classes = list(_errors.ERRORS.values()) + [_errors.FileNotFoundError_, keepsake.KeepsakeError]
    assert keepsake.IOError_ in classes and keepsake.ValueError_ in classes
    for cls in classes:
        e = cls(cls.status, "what failed", "f.keepsake", "k", 12)
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls
        assert (back.status, back.message, back.file, back.key, back.offset) == (cls.status, "what failed",
                                                                                 "f.keepsake", "k", 12)
        assert str(back) == str(e)
    with pytest.raises(keepsake.IOError_) as info:  # one raised by the library, too
        kt.load_file(str(tmp_path / "missing.keepsake"))
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is type(info.value) and str(back) == str(info.value)

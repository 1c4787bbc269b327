"""Hostile inputs: the fuzz corpora and mutants of valid files raise KeepsakeError, never crash.

Every loader is run on every input: tensor files (safe_open, load_file with verification,
numpy), checkpoints (load_checkpoint with a model and metrics, the Lightning CheckpointIO),
torch.save files (load_pt, from a path and from bytes) and convert. Anything other than success
or a KeepsakeError fails the test; a crash would end the interpreter and fail it too.
"""
import io
import os
import random
import zipfile
import zlib

import pytest
import torch

import keepsake
import keepsake.numpy as kn
import keepsake.torch as kt

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.join(SRC, "tests", "fuzz", "corpus")
FIXTURES = os.path.join(SRC, "tests", "fixtures")
MUTANTS = 100  # per seed file and per kind of mutation
SEED = int(os.environ.get("KS_HOSTILE_SEED", "0"))  # other values explore other mutants


def files(folder):
    d = os.path.join(CORPUS, folder)
    return sorted(os.path.join(d, f) for f in os.listdir(d))


def expect_clean(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except keepsake.KeepsakeError as e:
        assert e.status > 0 and e.message, repr(e)
        return e
    return None


def tensor_loaders(path):
    expect_clean(kt.load_file, path, verify=True)
    expect_clean(kt.load_file, path, backend="read")
    expect_clean(kn.load_file, path)

    def lazy():
        with keepsake.safe_open(path, framework="pt") as f:
            for k in f.keys():
                f.get_slice(k).get_shape()
                f.get_tensor(k)
            f.metadata()
            f.scalars()
    expect_clean(lazy)


def checkpoint_loaders(path, tmp):
    import torchmetrics as tm
    model = torch.nn.Linear(3, 2)
    metrics = {"MeanMetric": tm.MeanMetric(), "CatMetric": tm.CatMetric()}
    expect_clean(kt.load_checkpoint, path, model=model, train_metrics=metrics, strict=False, rng=False)
    expect_clean(kt.load_checkpoint, path, train_metrics=metrics, rng=True, verify=True)
    try:
        from keepsake.lightning import KeepsakeCheckpointIO
        expect_clean(KeepsakeCheckpointIO().load_checkpoint, path)
    except ImportError:
        pass
    expect_clean(keepsake.convert, path, os.path.join(tmp, "out.pt"))
    expect_clean(keepsake.compute_metrics, path)  # metric records of the file rebuilt in C


def pt_loaders(path, tmp):
    expect_clean(kt.load_pt, path, verify_crc=True)
    with open(path, "rb") as f:
        expect_clean(kt.load_pt, f.read())
    expect_clean(keepsake.convert, path, os.path.join(tmp, "out.keepsake"))


def test_safetensors_corpus(tmp_path):
    for p in files("safetensors"):
        tensor_loaders(p)
        checkpoint_loaders(p, str(tmp_path))


def test_zip_corpus(tmp_path):
    for p in files("zip"):
        pt_loaders(p, str(tmp_path))


def test_pickle_corpus_inside_archives(tmp_path):
    for p in files("pickle"):
        with open(p, "rb") as f:
            pkl = f.read()
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", pkl)
            z.writestr("archive/version", "3\n")
        path = tmp_path / (os.path.basename(p) + ".pt")
        path.write_bytes(buf.getvalue())
        pt_loaders(str(path), str(tmp_path))


def mutants(data, rng):
    for _ in range(MUTANTS):
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        yield bytes(b)
    for _ in range(MUTANTS // 3):
        yield data[:rng.randrange(len(data))]
    for _ in range(MUTANTS // 3):  # the header, where the structure lives
        b = bytearray(data)
        end = min(len(b), 8 + int.from_bytes(data[:8], "little")) if len(b) > 8 else len(b)
        b[rng.randrange(min(end, len(b)))] = rng.randrange(256)
        yield bytes(b)


def keepsake_seed(tmp):
    import torchmetrics as tm
    m = tm.CatMetric()
    m.update(torch.arange(3.0))
    path = os.path.join(tmp, "seed.keepsake")
    kt.save_checkpoint(path, model=torch.nn.Linear(3, 2), optimizers=torch.optim.SGD([torch.zeros(1)], lr=0.1),
                       train_metrics={"CatMetric": m, "MeanMetric": tm.MeanMetric()},
                       extra={"t": (1, [2.5, None]), "e": {}}, rng=True)
    return path


def test_mutated_keepsake_files(tmp_path):
    rng = random.Random(11 ^ SEED)
    seed = keepsake_seed(str(tmp_path))
    with open(seed, "rb") as f:
        data = f.read()
    p = str(tmp_path / "mutant.keepsake")
    for i, b in enumerate(mutants(data, rng)):
        with open(p, "wb") as f:
            f.write(b)
        tensor_loaders(p)
        checkpoint_loaders(p, str(tmp_path))
        expect_clean(kt.load, b)


@pytest.mark.parametrize("fixture", ["torch/tensors.pt", "torch/adamw_state_dict.pt",
                                     "composer/composer-0.14-dict-metrics.pt"])
def test_mutated_pt_files(tmp_path, fixture):
    rng = random.Random(zlib.crc32(fixture.encode()) ^ SEED)
    with open(os.path.join(FIXTURES, fixture), "rb") as f:
        data = f.read()
    p = str(tmp_path / "mutant.pt")
    for b in mutants(data, rng):
        with open(p, "wb") as f:
            f.write(b)
        pt_loaders(p, str(tmp_path))


def test_not_regular_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for fn in (kt.load_file, kt.load_pt, keepsake.verify, keepsake.compute_metrics,
               lambda p: kt.load_file(p, backend="read")):
        e = expect_clean(fn, str(fifo))
        assert e is not None
    for backend in ("mmap", "read"):
        e = expect_clean(kt.load_file, str(tmp_path), backend=backend)
        assert e is not None and isinstance(e, keepsake.IOError_)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert isinstance(expect_clean(kt.load_file, str(empty)), keepsake.FormatError)

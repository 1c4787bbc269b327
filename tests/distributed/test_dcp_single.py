"""keepsake.distributed in one process: hostile index and rank files (truncated, a flipped byte)
give keepsake errors, never a crash; the typed JSON of non-tensor values; a directory the C
library wrote (tests/hostile/make_sharded.c) loads through KeepsakeReader.

Run: PYTHONPATH=build-dcp/python-pkg .venv/bin/python -m pytest -q tests/distributed/test_dcp_single.py
"""
from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import warnings

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import keepsake  # noqa: E402
from keepsake import _keepsake as native  # noqa: E402
from keepsake.distributed import (INDEX_NAME, OBJECT_PREFIX, KeepsakeReader, KeepsakeWriter,  # noqa: E402
                                  decode_object, encode_object)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RANK0 = "rank-00000-of-00001.keepsake"

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def state() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.arange(7, dtype=torch.int32),
            "h": torch.randn(3, 5, generator=g).to(torch.bfloat16), "flag": torch.tensor(True),
            "step": 12, "cfg": {"betas": (0.9, 0.999), "eps": 1e-8, "name": "adamw", "none": None}}


def empty() -> dict:
    return {"w": torch.zeros(64, 32), "b": torch.zeros(7, dtype=torch.int32),
            "h": torch.zeros(3, 5, dtype=torch.bfloat16),
            "flag": torch.tensor(False), "step": 0, "cfg": {"betas": None, "eps": 0.0, "name": "", "none": 1}}


@pytest.fixture()
def ckpt(tmp_path):
    path = str(tmp_path / "ckpt")
    dcp.save(state(), storage_writer=KeepsakeWriter(path), no_dist=True)
    return path


def failures(e: CheckpointException) -> list:
    return [x for x, _tb in e.failures.values()]


def test_round_trip(ckpt):
    out = empty()
    dcp.load(out, storage_reader=KeepsakeReader(ckpt, verify_files=True), no_dist=True)
    want = state()
    for k in ("w", "b", "h", "flag"):
        assert out[k].dtype == want[k].dtype and torch.equal(out[k], want[k]), k
    assert out["step"] == 12 and out["cfg"] == want["cfg"] and type(out["cfg"]["betas"]) is tuple
    assert sorted(os.listdir(ckpt)) == [INDEX_NAME, RANK0]
    index = json.load(open(os.path.join(ckpt, INDEX_NAME)))
    assert index["keepsake"]["world_size"] == 1 and index["weight_map"]["w"] == RANK0
    assert OBJECT_PREFIX + "step" in index["weight_map"]


def test_index_records_header_hashes(ckpt):
    """The index (version 2) records each file's length-and-header XXH3, not a whole-file one (C's
    test_shard holds version 1 indexes, which still verify); damage anywhere is still caught."""
    index = json.load(open(os.path.join(ckpt, INDEX_NAME)))
    [f] = index["keepsake"]["files"]
    assert index["keepsake"]["version"] == 2 and "xxh3" not in f and len(f["header_xxh3"]) == 16
    p = os.path.join(ckpt, RANK0)
    raw = open(p, "rb").read()
    header_end = 8 + int.from_bytes(raw[:8], "little")
    native.shard_verify(ckpt)
    for offset in (3, header_end - 1, header_end, len(raw) - 1):  # length, header padding, data
        corrupt(p, offset, "flip")
        with pytest.raises(keepsake.ChecksumError):
            native.shard_verify(ckpt)
        corrupt(p, offset, "flip")
    native.shard_verify(ckpt)


def test_loads_into_targets_of_another_layout(ckpt):
    """A target the stored bytes cannot be read straight into (not contiguous, another dtype) is
    filled through a staging copy, and one that can is read into directly: the same values."""
    direct = empty()
    w_ptr = direct["w"].data_ptr()
    dcp.load(direct, storage_reader=KeepsakeReader(ckpt), no_dist=True)
    assert direct["w"].data_ptr() == w_ptr and torch.equal(direct["w"], state()["w"])
    out = empty()
    out["w"] = torch.zeros(32, 64).t()  # a (64, 32) view, not contiguous
    out["b"] = torch.zeros(7, dtype=torch.int64)
    dcp.load(out, storage_reader=KeepsakeReader(ckpt), no_dist=True)
    assert not out["w"].is_contiguous() and torch.equal(out["w"], state()["w"])
    assert out["b"].dtype == torch.int64 and torch.equal(out["b"], torch.arange(7))


def test_metadata_without_pickle(ckpt):
    md = KeepsakeReader(ckpt).read_metadata()
    assert tuple(md.state_dict_metadata["w"].size) == (64, 32)
    assert md.state_dict_metadata["h"].properties.dtype == torch.bfloat16
    assert type(md.state_dict_metadata["step"]).__name__ == "BytesStorageMetadata"
    assert md.planner_data["cfg.betas"] == ("cfg", "betas")
    # the stored value is typed JSON, not a pickle (which would start with 0x80)
    r = native.Reader(os.path.join(ckpt, RANK0), backend="read")
    _n, _code, shape, begin, end = r.entry(OBJECT_PREFIX + "cfg.betas")
    assert bytes(memoryview(r)[begin:end]) == b'{"tuple":[0.9,0.999]}'


@pytest.mark.parametrize("value", [0, -2**63, 2**70, 0.1, -0.0, 1e300, math.inf, -math.inf, "ä\udc80", b"\x00",
                                   [1, (2, 3)], {1: "a", "1": "b", (1, 2): None}, (), [], {}, True, None])
def test_object_codec(value):
    got = decode_object(encode_object(value))
    assert type(got) is type(value) and repr(got) == repr(value)
    b = decode_object(encode_object(io.BytesIO(b"raw")))
    assert isinstance(b, io.BytesIO) and b.getvalue() == b"raw"
    assert math.isnan(decode_object(encode_object(math.nan)))


def test_object_codec_reads_what_pythons_json_wrote():
    """Before the rules moved into the C library, Python's json wrote the typed JSON (spacing,
    escapes of lone surrogates); such bytes still decode."""
    old = json.dumps({"dict": [["lr", 0.0003], ["betas", {"tuple": [0.9, 0.95]}], ["s", "\u00e4\udc80"],
                               ["b", {"bytes": "AAE="}], ["n", {"float": "-inf"}]]}).encode()
    assert b" " in old and b"\\udc80" in old
    assert decode_object(old) == {"lr": 0.0003, "betas": (0.9, 0.95), "s": "\u00e4\udc80", "b": b"\x00\x01",
                                  "n": -math.inf}
    assert encode_object({"lr": 0.0003, "t": (1,)}) == b'{"dict":[["lr",0.0003],["t",{"tuple":[1]}]]}'


def test_object_codec_limits():
    deep = []
    for _ in range(100):
        deep = [deep]
    assert decode_object(encode_object(deep)) == deep  # the innermost list at level 100
    with pytest.raises(keepsake.LimitError):
        encode_object([deep])
    loop: list = []
    loop.append(loop)
    with pytest.raises(keepsake.LimitError):
        encode_object(loop)
    with pytest.raises(keepsake.LimitError):
        decode_object(b"9" * 4301)
    assert decode_object(b"-" + b"9" * 4300) == -int("9" * 4300)
    with pytest.raises(keepsake.UnsupportedError):
        encode_object(bytearray(b"x"))


def test_object_codec_refuses():
    with pytest.raises(keepsake.UnsupportedError):
        encode_object({1, 2})
    with pytest.raises(keepsake.UnsupportedError):
        encode_object(object())
    for bad in (b"\xff", b"{", b'{"set": [1]}', b'{"float": "1"}', b'{"bytes": "!!"}', b'{"dict": [[[1], 2]]}',
                b"[" * 100000 + b"]" * 100000):
        with pytest.raises((keepsake.FormatError, keepsake.LimitError)):
            decode_object(bad)


# JSON of a key and a factory of the Python value it stands for (a new NaN object each time, as a
# decoder makes one per NaN it reads).
KEY_ATOMS = [("null", lambda: None), ("true", lambda: True), ("false", lambda: False), ("0", lambda: 0),
             ("1", lambda: 1), ("-1", lambda: -1), ("2", lambda: 2), ("0.0", lambda: 0.0), ("-0.0", lambda: -0.0),
             ("1.0", lambda: 1.0), ("2.0", lambda: 2.0), ("1.5", lambda: 1.5),
             ("9223372036854775808", lambda: 2 ** 63), ("9.223372036854776e18", lambda: 2.0 ** 63),
             ("9223372036854775807", lambda: 2 ** 63 - 1), ("-9223372036854775808", lambda: -2 ** 63),
             ('{"float":"nan"}', lambda: float("nan")), ('{"float":"inf"}', lambda: math.inf),
             ('{"float":"-inf"}', lambda: -math.inf), ('"a"', lambda: "a"), ('"1"', lambda: "1"), ('""', lambda: ""),
             ('{"bytes":"YQ=="}', lambda: b"a"), ('{"bytes":""}', lambda: b"")]


def test_object_dict_keys_are_distinct_as_python_compares_them():
    """A dict whose keys a Python dict would fold into fewer (1 and True and 1.0, 0 and -0.0, 2**63 and
    2.0**63, equal tuples) is refused naming the key; any other is decoded whole. 4,000 random dicts
    of 1 to 5 keys, tuples of keys included, against dict.fromkeys."""
    import random
    rng = random.Random(29)

    def key():
        if rng.random() < 0.25:
            parts = [rng.choice(KEY_ATOMS) for _ in range(rng.randint(0, 2))]
            return ('{"tuple":[' + ",".join(j for j, _ in parts) + "]}",
                    lambda parts=parts: tuple(f() for _, f in parts))
        return rng.choice(KEY_ATOMS)

    refused = 0
    for _ in range(4000):
        keys = [key() for _ in range(rng.randint(1, 5))]
        text = '{"dict":[' + ",".join("[%s,%d]" % (j, i) for i, (j, _) in enumerate(keys)) + "]}"
        values = [f() for _, f in keys]
        if len(dict.fromkeys(values)) == len(values):
            got = decode_object(text.encode())
            assert list(got.values()) == list(range(len(keys))), text
        else:
            refused += 1
            with pytest.raises(keepsake.FormatError, match="a dict holds"):
                decode_object(text.encode(), key="x")
    assert 400 < refused < 3600, refused


def test_object_base64_must_be_canonical():
    """Padding bits must be zero (what b64encode writes): 'QR==' and 'QUJ=' are refused, naming the
    character, though Python's b64decode(validate=True) would read them as b'A' and b'AB'."""
    import base64
    for bad, at in ((b"QR==", 1), (b"QUJ=", 2), (b"AAAAQf==", 5)):
        assert base64.b64decode(bad, validate=True)  # Python reads them
        for tag in (b"bytes", b"bytesio"):
            with pytest.raises(keepsake.FormatError, match="character %d" % at):
                decode_object(b'{"%s":"%s"}' % (tag, bad))
    for raw in (b"", b"A", b"AB", b"ABC", bytes(range(256))):
        enc = base64.b64encode(raw)
        assert decode_object(b'{"bytes":"%s"}' % enc) == raw


def test_unsupported_value_is_a_keepsake_error(tmp_path):
    with pytest.raises(CheckpointException) as e:
        dcp.save({"s": {1, 2}}, storage_writer=KeepsakeWriter(str(tmp_path / "c")), no_dist=True)
    assert [type(x) for x in failures(e.value)] == [keepsake.UnsupportedError]
    assert not os.path.exists(tmp_path / "c" / INDEX_NAME)


def test_overwrite(ckpt):
    """A second save into one directory replaces the checkpoint, as torch's FileSystemWriter does; the
    old index is gone before any rank writes. overwrite=False refuses instead."""
    with pytest.raises(CheckpointException) as e:
        dcp.save(state(), storage_writer=KeepsakeWriter(ckpt, overwrite=False), no_dist=True)
    assert [type(x) for x in failures(e.value)] == [keepsake.ExistsError]
    sd = state()
    sd["w"] += 1
    dcp.save(sd, storage_writer=KeepsakeWriter(ckpt), no_dist=True)
    out = empty()
    dcp.load(out, storage_reader=KeepsakeReader(ckpt), no_dist=True)
    assert torch.equal(out["w"], sd["w"])


def test_save_twice_into_one_directory(tmp_path):
    """Code ported from torch: the same writer's directory saved again (a training loop's checkpoint_id
    reused); each load gets the last save."""
    path = str(tmp_path / "ckpt")
    for step in (1, 2, 3):
        sd = state()
        sd["step"] = step
        sd["w"] *= step
        dcp.save(sd, storage_writer=KeepsakeWriter(path), no_dist=True)
        out = empty()
        dcp.load(out, storage_reader=KeepsakeReader(path, verify_files=True), no_dist=True)
        assert out["step"] == step and torch.equal(out["w"], state()["w"] * step)
    assert sorted(os.listdir(path)) == [INDEX_NAME, RANK0]


class DiesWriting(KeepsakeWriter):
    def write_data(self, plan, planner):
        raise RuntimeError("killed")


def test_overwrite_removes_the_old_index_first(ckpt):
    """The overwrite protocol: a save that dies after the plan leaves no checkpoint, never the old one
    under a half-written new one."""
    with pytest.raises(CheckpointException):
        dcp.save(state(), storage_writer=DiesWriting(ckpt), no_dist=True)
    assert not os.path.exists(os.path.join(ckpt, INDEX_NAME))
    with pytest.raises(Exception):
        KeepsakeReader(ckpt).read_metadata()


def test_hf_form_loads_in_torch_hf_reader(ckpt, tmp_path):
    """keepsake's checkpoint in the Hugging Face layout (convert_dcp(hf=True), keepsake convert --hf):
    torch's HuggingFaceStorageReader reads it as written, tensors equal; each file is a keepsake file
    whose checksums still guard its tensors."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from keepsake.distributed_import import convert_dcp
    out = str(tmp_path / "hf")
    convert_dcp(ckpt, out, hf=True, hf_shard_bytes=4096)
    files = sorted(os.listdir(out))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", INDEX_NAME], files
    index = json.load(open(os.path.join(out, INDEX_NAME)))
    assert index["weight_map"] == {"w": files[0], "b": files[1], "h": files[1], "flag": files[1]}
    meta = HuggingFaceStorageReader(out).read_metadata().state_dict_metadata
    assert sorted(meta) == ["b", "flag", "h", "w"]
    got = {k: v for k, v in empty().items() if isinstance(v, torch.Tensor)}
    dcp.load(got, storage_reader=HuggingFaceStorageReader(out), no_dist=True)
    want = state()
    for k, v in got.items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
    for f in files[:2]:
        keepsake.verify(os.path.join(out, f))
    # back: the same state, plain values and all
    back = str(tmp_path / "back.keepsake")
    convert_dcp(out, back)
    import keepsake.torch as kt
    assert torch.equal(kt.load_file(back)["w"], want["w"])
    with keepsake.safe_open(back, framework="pt") as f:
        assert f.scalars()["step"] == 12 and f.scalars()["cfg/betas/1"] == 0.999


def corrupt(path: str, offset: int, mode: str) -> None:
    with open(path, "r+b") as f:
        if mode == "truncate":
            f.truncate(offset)
            return
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def data_offset(path: str, name: str) -> int:
    r = native.Reader(path, backend="read")
    return r.entry(name)[3]


def test_missing_index(ckpt):
    os.unlink(os.path.join(ckpt, INDEX_NAME))
    with pytest.raises(keepsake.NotFoundError):
        KeepsakeReader(ckpt).read_metadata()
    assert not KeepsakeReader.validate_checkpoint_id(ckpt)


@pytest.mark.parametrize("cut", [0, 1, 30, -2])
def test_truncated_index(ckpt, cut):
    p = os.path.join(ckpt, INDEX_NAME)
    corrupt(p, cut if cut >= 0 else os.path.getsize(p) + cut, "truncate")
    with pytest.raises(keepsake.FormatError):
        KeepsakeReader(ckpt).read_metadata()


def test_index_flipped_byte_everywhere(ckpt):
    """Every single flipped byte of the index is refused or harmless, and never a crash."""
    p = os.path.join(ckpt, INDEX_NAME)
    good = open(p, "rb").read()
    outcomes = set()
    for i in range(len(good)):
        with open(p, "wb") as f:
            f.write(good[:i] + bytes([good[i] ^ 0x20]) + good[i + 1:])
        try:
            KeepsakeReader(ckpt).read_metadata()
            outcomes.add("ok")
        except keepsake.KeepsakeError as e:
            outcomes.add(type(e).__name__)
    assert "FormatError" in outcomes and len(outcomes) >= 2, outcomes


@pytest.mark.parametrize("cut", [4, 100, -1])
def test_truncated_rank_file(ckpt, cut):
    p = os.path.join(ckpt, RANK0)
    corrupt(p, cut if cut >= 0 else os.path.getsize(p) + cut, "truncate")
    with pytest.raises(keepsake.FormatError):
        KeepsakeReader(ckpt).read_metadata()


def test_flipped_data_byte_is_a_checksum_error(ckpt):
    p = os.path.join(ckpt, RANK0)
    corrupt(p, data_offset(p, "w") + 77, "flip")
    md_ok = KeepsakeReader(ckpt).read_metadata()  # headers and sizes still agree with the index
    assert "w" in md_ok.state_dict_metadata
    with pytest.raises(CheckpointException) as e:
        dcp.load(empty(), storage_reader=KeepsakeReader(ckpt), no_dist=True)
    [err] = failures(e.value)
    assert isinstance(err, keepsake.ChecksumError) and err.key == "w", err
    # a load that does not ask for the damaged tensor reads none of it, and succeeds
    out = {"b": torch.zeros(7, dtype=torch.int32)}
    dcp.load(out, storage_reader=KeepsakeReader(ckpt), no_dist=True)
    assert torch.equal(out["b"], torch.arange(7, dtype=torch.int32))
    # verify_files hashes every file against the index when the metadata is read
    with pytest.raises(keepsake.ChecksumError):
        KeepsakeReader(ckpt, verify_files=True).read_metadata()


def test_flipped_object_byte_is_a_checksum_error(ckpt):
    p = os.path.join(ckpt, RANK0)
    corrupt(p, data_offset(p, OBJECT_PREFIX + "step") + 1, "flip")
    with pytest.raises(CheckpointException) as e:
        dcp.load({"step": 0}, storage_reader=KeepsakeReader(ckpt), no_dist=True)
    assert [type(x) for x in failures(e.value)] == [keepsake.ChecksumError]


def load_outcome(ckpt: str, verify_files: bool) -> str:
    """'ok' (values exact), a keepsake error's class name, or DCP's own report of a key the file lacks."""
    try:
        # metadata first: dcp.load reports a failed read_metadata as its own AssertionError
        KeepsakeReader(ckpt, verify_files=verify_files).read_metadata()
        out = empty()
        dcp.load(out, storage_reader=KeepsakeReader(ckpt, verify_files=verify_files), no_dist=True)
    except keepsake.KeepsakeError as e:
        return type(e).__name__
    except CheckpointException as e:
        [x] = failures(e)
        if isinstance(x, keepsake.KeepsakeError):
            return type(x).__name__
        assert isinstance(x, RuntimeError) and "Missing key in checkpoint" in str(x), repr(x)
        return "missing key"
    assert torch.equal(out["w"], state()["w"]) and out["cfg"] == state()["cfg"] and out["step"] == 12
    return "ok"


def test_flipped_header_byte_everywhere(ckpt):
    """Each byte of the rank file's length and header flipped, never a crash, and never loaded: with
    or without verify_files the header no longer hashes to the index's header_xxh3 (checked on every
    read_metadata, so a flip in the padding or in a replicated tensor's name is caught too)."""
    p = os.path.join(ckpt, RANK0)
    good = open(p, "rb").read()
    end = native.Reader(p, backend="read").data_offset
    kinds = set()
    for i in range(0, end, 3):
        with open(p, "wb") as f:
            f.write(good[:i] + bytes([good[i] ^ 0x04]) + good[i + 1:])
        strict = load_outcome(ckpt, True)
        assert strict in ("ChecksumError", "FormatError", "MismatchError", "NotFoundError", "DTypeError",
                          "ShapeError", "LimitError", "ExistsError", "VersionError"), (i, strict)
        kinds.add(load_outcome(ckpt, False))
    assert kinds == {"ChecksumError"}, kinds


def test_bad_object_json_is_a_format_error(tmp_path):
    """A rank file whose object entry is valid bytes (checksum and all) but not typed JSON."""
    d = str(tmp_path / "c")
    os.makedirs(d)
    junk = torch.frombuffer(bytearray(b'{"set":[1]}'), dtype=torch.uint8)
    entry = (OBJECT_PREFIX + "x", 1, (junk.numel(),), junk.data_ptr(), junk.numel())
    info = native.shard_write_rank(d, 0, 1, [entry], [], {}, False)
    native.shard_write_index(d, [info], fsync=False)
    with pytest.raises(CheckpointException) as e:
        dcp.load({"x": 0}, storage_reader=KeepsakeReader(d), no_dist=True)
    assert [type(x) for x in failures(e.value)] == [keepsake.FormatError]


def make_sharded_binary() -> str:
    for p in (os.environ.get("KS_MAKE_SHARDED"), os.path.join(ROOT, "build-dcp", "tests", "hostile", "make_sharded")):
        if p and os.access(p, os.X_OK):
            return p
    pytest.skip("make_sharded not built")


def test_c_written_directory_loads(tmp_path):
    d = str(tmp_path / "c")
    subprocess.run([make_sharded_binary(), d], check=True, timeout=60)
    md = KeepsakeReader(d).read_metadata().state_dict_metadata
    assert tuple(md["state/model/w"].size) == (7, 2) and len(md["state/model/w"].chunks) == 3
    assert not [k for k in md if k.startswith(("rng", "state/train_metrics"))]  # per-rank entries: not DCP's
    out = {"state/model/w": torch.zeros(7, 2), "state/model/v": torch.zeros(4, 6), "state/model/b": torch.zeros(4),
           "state/run_name": ""}
    dcp.load(out, storage_reader=KeepsakeReader(d, verify_files=True), no_dist=True)
    for name, (g0, g1) in (("state/model/w", (7, 2)), ("state/model/v", (4, 6))):
        want = torch.arange(g0 * g1, dtype=torch.float32).reshape(g0, g1)  # value = global index
        assert torch.equal(out[name], want), name
    assert isinstance(out["state/run_name"], str) and out["state/run_name"]
    shutil.rmtree(d)


# ---- the index's header_xxh3 is held against every rank file's header on every open ----

def scalar_dir(d: str, lr: float, name: str, world: int = 1, seed: int = 0) -> None:
    """A directory as the C library writes one: rank 0 holds `w` whole and the scalars lr and name in
    its header (keepsake.scalars); at world 2 rank 1 holds the one chunk of `v`. Values that differ
    only in `seed`, `lr` and `name` give files of the same sizes."""
    from keepsake._core import tensors as _tensors
    os.makedirs(d)
    keep: list = []
    g = torch.Generator().manual_seed(seed)
    w, v = torch.randn(6, 4, generator=g), torch.randn(5, generator=g)
    files = [native.shard_write_rank(d, 0, world, [_tensors.torch_entry("w", w, keep), ("lr", lr), ("name", name)],
                                     [], {}, False)]
    if world == 2:
        files.append(native.shard_write_rank(d, 1, 2, [_tensors.torch_entry("v", v, keep)], [("v", (5,), (0,))],
                                             {}, False))
    native.shard_write_index(d, files, fsync=False)


def scalar_target(world: int) -> dict:
    out = {"w": torch.zeros(6, 4), "lr": 0.0, "name": ""}
    if world == 2:
        out["v"] = torch.zeros(5)
    return out


def dcp_load_error(d: str, out: dict):
    """The keepsake error dcp.load with KeepsakeReader raises (directly or in DCP's report), else None."""
    try:
        dcp.load(out, storage_reader=KeepsakeReader(d), no_dist=True)
    except keepsake.KeepsakeError as e:
        return e
    except CheckpointException as e:
        [x] = failures(e)
        if isinstance(x, keepsake.KeepsakeError):
            return x
        # DCP reports a failed read_metadata as its own AssertionError carrying the message: the typed error
        assert "global metadata read failed" in str(x), repr(x)
        try:
            KeepsakeReader(d).read_metadata()
        except keepsake.KeepsakeError as k:
            assert str(k) in str(x), (str(k), str(x))
            return k
        raise
    return None


def edit_header(path: str, old: bytes, new: bytes) -> None:
    """Replaces `old` by `new` (same length) in the file's header, in place: the size stays."""
    raw = bytearray(open(path, "rb").read())
    end = 8 + int.from_bytes(raw[:8], "little")
    at = raw.find(old, 8, end)
    assert at > 0 and len(old) == len(new), (old, new)
    raw[at:at + len(old)] = new
    with open(path, "r+b") as f:
        f.write(bytes(raw))


@pytest.mark.parametrize("world", [1, 2])
def test_scalars_load_from_an_untouched_directory(tmp_path, world):
    d = str(tmp_path / "c")
    scalar_dir(d, 0.125, "alpha", world)
    out = scalar_target(world)
    assert dcp_load_error(d, out) is None
    assert out["lr"] == 0.125 and out["name"] == "alpha"


@pytest.mark.parametrize("world", [1, 2])
def test_header_edited_in_place_is_refused(tmp_path, world):
    """Two scalars edited in rank 0's header (same lengths, so the size and every tensor checksum
    still match): the header no longer hashes to the index's header_xxh3."""
    d = str(tmp_path / "c")
    scalar_dir(d, 0.125, "alpha", world)
    p = os.path.join(d, native.shard_file_name(0, world))
    edit_header(p, b"0.125", b"9.125")
    edit_header(p, b'\\"alpha\\"', b'\\"omega\\"')  # inside the keepsake.scalars string
    out = scalar_target(world)
    err = dcp_load_error(d, out)
    assert isinstance(err, keepsake.ChecksumError) and "header XXH3" in str(err), (err, out)
    assert out["lr"] == 0.0 and out["name"] == ""
    with pytest.raises(keepsake.ChecksumError):
        KeepsakeReader(d).read_metadata()


@pytest.mark.parametrize("world", [1, 2])
def test_one_bit_lie_in_the_index_header_hash_is_refused(tmp_path, world):
    d = str(tmp_path / "c")
    scalar_dir(d, 0.125, "alpha", world)
    p = os.path.join(d, INDEX_NAME)
    index = json.load(open(p))
    f = index["keepsake"]["files"][world - 1]
    f["header_xxh3"] = "%016x" % (int(f["header_xxh3"], 16) ^ 1)
    with open(p, "w") as fh:
        json.dump(index, fh)
    err = dcp_load_error(d, scalar_target(world))
    assert isinstance(err, keepsake.ChecksumError), err
    assert native.shard_file_name(world - 1, world) in str(err.file), err.file


@pytest.mark.parametrize("world", [1, 2])
def test_rank_file_swapped_for_one_of_the_same_size_is_refused(tmp_path, world):
    """Another checkpoint's rank file of the same size (lr 9.125, name omega, other tensors): its
    own tensor checksums match, only the index's header hash tells it from the one written."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    scalar_dir(a, 0.125, "alpha", world, seed=0)
    scalar_dir(b, 9.125, "omega", world, seed=1)
    for r in range(world):
        name = native.shard_file_name(r, world)
        mine = open(os.path.join(a, name), "rb").read()
        assert len(mine) == os.path.getsize(os.path.join(b, name))
        shutil.copyfile(os.path.join(b, name), os.path.join(a, name))
        err = dcp_load_error(a, scalar_target(world))
        assert isinstance(err, keepsake.ChecksumError) and name in str(err.file), (r, err)
        with open(os.path.join(a, name), "wb") as f:
            f.write(mine)
    out = scalar_target(world)
    assert dcp_load_error(a, out) is None and out["lr"] == 0.125 and out["name"] == "alpha"
    out = scalar_target(world)
    assert dcp_load_error(b, out) is None and out["lr"] == 9.125 and out["name"] == "omega"


def cli() -> str:
    for p in (os.environ.get("KS_CLI"), os.path.join(ROOT, "build", "keepsake")):
        if p and os.access(p, os.X_OK):
            return p
    pytest.skip("the keepsake CLI is not built")


@pytest.mark.parametrize("entry", [
    {"dtype": "U8", "global_shape": [0], "chunks": []},  # no chunk at all: nothing holds the value
    {"dtype": "U8", "global_shape": [4, 0], "chunks": [{"rank": 0, "offsets": [0, 0], "shape": [4, 0]}]},
    {"dtype": "F32", "global_shape": [0], "chunks": [{"rank": 0, "offsets": [0], "shape": [0]}]},
])
def test_object_entry_without_its_one_chunk_is_refused_alike(ckpt, entry):
    """An index entry for a DCP value that is not one whole 1-d U8 chunk (here with a global shape
    of no volume, which the tiling alone accepts): the C index check refuses it, naming the entry,
    so read_metadata raises a FormatError (not an IndexError) and `keepsake verify DIR` agrees."""
    name = OBJECT_PREFIX + "ghost"
    p = os.path.join(ckpt, INDEX_NAME)
    index = json.load(open(p))
    index["keepsake"]["sharded"][name] = entry
    with open(p, "w") as f:
        json.dump(index, f)
    with pytest.raises(keepsake.FormatError) as e:
        KeepsakeReader(ckpt).read_metadata()
    assert e.value.key == name, (e.value.key, str(e.value))
    err = dcp_load_error(ckpt, empty())
    assert isinstance(err, keepsake.FormatError) and err.key == name, err
    r = subprocess.run([cli(), "verify", ckpt], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and name in r.stdout and "BAD" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_many_per_rank_globs_and_long_names_load_fast(tmp_path):
    """The hostile case of per-rank globs (tests/hostile/make_sharded.c --long-names/--globs: a 170 KB
    index of 4,096 globs, a name with 500 '/' boundaries): every name is matched against every glob,
    in one pass over the name each time. A matcher that ran each glob over every '/'-prefix took
    7.5 s of CPU here (4.3 s read_metadata, 3.2 s dcp.load); one pass takes 0.04 s: at most 1 s."""
    import time
    d = str(tmp_path / "c")
    subprocess.run([make_sharded_binary(), d, "--long-names", "1", "1000", "--globs", "4092"], check=True, timeout=60)
    t0 = time.process_time()
    md = KeepsakeReader(d).read_metadata().state_dict_metadata
    long_name = [k for k in md if k.startswith("state/long/")]
    assert len(long_name) == 1 and len(long_name[0]) == 1000, long_name
    out = {"state/model/w": torch.zeros(7, 2), long_name[0]: -1}
    dcp.load(out, storage_reader=KeepsakeReader(d), no_dist=True)
    cpu = time.process_time() - t0
    assert torch.equal(out["state/model/w"], torch.arange(14, dtype=torch.float32).reshape(7, 2))
    assert out[long_name[0]] == 0
    assert cpu < 1.0, f"read_metadata and dcp.load took {cpu:.2f} s of CPU"


@pytest.mark.parametrize("key", [OBJECT_PREFIX + "x", native.shard_names()["local"] + "0"])
def test_reserved_keys_are_refused(tmp_path, key):
    """The names keepsake keeps for itself (a non-tensor value's entry, the item that carries a rank's
    own entries) are refused as DCP keys, whatever the value, and nothing is committed."""
    path = str(tmp_path / "ckpt")
    for value in (torch.zeros(3), 5):
        with pytest.raises(CheckpointException) as e:
            dcp.save({key: value, "w": torch.ones(2)}, storage_writer=KeepsakeWriter(path), no_dist=True)
        [err] = failures(e.value)
        assert isinstance(err, keepsake.InvalidError), err
        assert not os.path.exists(os.path.join(path, INDEX_NAME))


def test_restore_local_verifies_the_rank_files_it_reads(tmp_path):
    """restore_local reads each rank's own items from its file (not through DCP's checksummed reads):
    the files it reads are verified first, so a flipped byte in a generator's state is a
    ChecksumError, never a silently restored generator."""
    import torch.distributed as dist
    torchmetrics = pytest.importorskip("torchmetrics")
    from keepsake.distributed import local_items, restore_local
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        path = str(tmp_path / "ckpt")
        mean = torchmetrics.MeanMetric()
        mean.update(torch.tensor([2.0, 4.0]))
        mine = dict(metrics={"mean": mean}, dataset_state={"loader": {"pos": 7}}, rng=True)
        dcp.save({"w": torch.ones(3), **local_items(**mine)}, storage_writer=KeepsakeWriter(path))
        back = torchmetrics.MeanMetric()
        data = {"pos": -1}
        restore_local({}, metrics={"mean": back}, dataset_state={"loader": data}, rng=True, checkpoint=path)
        assert data == {"pos": 7} and float(back.compute()) == 3.0
        p = os.path.join(path, RANK0)
        corrupt(p, data_offset(p, "rng/0/torch") + 100, "flip")
        with pytest.raises(keepsake.ChecksumError):
            restore_local({}, metrics={"mean": back}, dataset_state={"loader": data}, rng=True, checkpoint=path)
    finally:
        dist.destroy_process_group()

"""Remote reads from Python, measured at the server: lazy safe_open over s3:// (moto) and http://
(nginx), the read cache (cache_dir=) and the checkpoint manager's upload mode.

Reads go through the fault proxy of the remote_servers fixture, whose request log gives every
request's method, path, Range and the body bytes it sent back: what the server really transferred,
whatever the client believes. The proxy is shared, so this file holds the fixture's
remote_fault_proxy lock (tests/python/CMakeLists.txt) and never clears its log or sets a fault; it
only reads the entries of its own (uniquely named) objects. Run by ctest (KS_REMOTE_ENV).
"""
import os
import shutil
import sys
import uuid

import pytest
import torch

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "remote"))
if not os.environ.get("KS_REMOTE_ENV"):
    pytest.skip("needs the remote_servers fixture (run through ctest)", allow_module_level=True)

import remote_env  # noqa: E402

import keepsake  # noqa: E402
import keepsake.numpy as kn  # noqa: E402
import keepsake.torch as kt  # noqa: E402

MIB = 1 << 20
N_TENSORS = 16
TENSOR_BYTES = 4 * MIB  # 16 x 4 MiB: a 64 MiB object


@pytest.fixture(scope="module")
def env():
    return remote_env.load()


@pytest.fixture(scope="module")
def bucket(env):
    name = f"lazy-{uuid.uuid4().hex[:12]}"
    remote_env.make_bucket(name)
    return name


def direct(env):
    """S3 requests straight to moto (writes: they need not be counted)."""
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_S3_ENDPOINT"]


def via_proxy(env):
    """S3 requests through the proxy, whose log counts them."""
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_PROXY_S3"]




def of(log, path):
    """The entries of requests for `path` (the object's URL path)."""
    return [e for e in log if e["path"] == path]


def body_bytes(entries):
    return sum(e["resp_bytes"] or 0 for e in entries)


def big_tensors():
    g = torch.Generator().manual_seed(1)
    return {f"layer{i:02d}.weight": torch.randn(TENSOR_BYTES // 4, generator=g) for i in range(N_TENSORS)}


@pytest.fixture(scope="module")
def big_s3(env, bucket):
    """A 64 MiB object of 16 tensors on S3: (URL, its path at the proxy, the tensors)."""
    t = big_tensors()
    direct(env)
    kt.save_file(t, f"s3://{bucket}/big.keepsake")
    return f"s3://{bucket}/big.keepsake", f"/{bucket}/big.keepsake", t


@pytest.fixture(scope="module")
def big_http(env, tmp_path_factory):
    """The same on nginx: (URL through the proxy, its path, the tensors)."""
    t = big_tensors()
    name = f"lazy-{uuid.uuid4().hex[:12]}.keepsake"
    kt.save_file(t, os.path.join(env["KS_TEST_HTTP_ROOT"], name))
    return f"{env['KS_TEST_PROXY_HTTP']}/{name}", f"/{name}", t


def check_one_tensor_read(url, path, tensors, start):
    name = "layer07.weight"
    with keepsake.safe_open(url, framework="pt") as f:
        assert len(f.keys()) == N_TENSORS and f.metadata() is None
        assert f.get_slice(name).get_shape() == [TENSOR_BYTES // 4]
        opened = body_bytes(of(remote_env.settled_log(start), path))
        assert opened < MIB  # the header only
        got = f.get_tensor(name)
    assert torch.equal(got, tensors[name])
    seen = of(remote_env.settled_log(start), path)
    total = body_bytes(seen)
    # the tensor, once, and the header: far less than the 64 MiB object
    assert TENSOR_BYTES <= total < 2 * TENSOR_BYTES + MIB, total
    assert len([e for e in seen if e["method"] == "GET"]) <= 3
    assert all(e["status"] in (200, 206) for e in seen)
    return got


def test_s3_safe_open_reads_the_header_then_one_tensor(env, big_s3):
    url, path, t = big_s3
    via_proxy(env)
    start = len(remote_env.proxy_log())
    got = check_one_tensor_read(url, path, t, start)
    got.add_(1)  # owns its memory: writable, and nothing else changes
    assert got.data_ptr() != 0


def test_http_safe_open_reads_the_header_then_one_tensor(big_http):
    url, path, t = big_http
    start = len(remote_env.proxy_log())
    check_one_tensor_read(url, path, t, start)


def test_get_slice_fetches_its_tensor_once(env, big_s3):
    url, path, t = big_s3
    via_proxy(env)
    start = len(remote_env.proxy_log())
    with keepsake.safe_open(url, framework="pt") as f:
        s = f.get_slice("layer03.weight")
        assert torch.equal(s[10:20], t["layer03.weight"][10:20])
        assert torch.equal(s[-5:], t["layer03.weight"][-5:])
    total = body_bytes(of(remote_env.settled_log(start), path))
    assert TENSOR_BYTES <= total < 2 * TENSOR_BYTES + MIB, total


def test_numpy_framework_lazy(env, big_s3):
    url, path, t = big_s3
    via_proxy(env)
    start = len(remote_env.proxy_log())
    with keepsake.safe_open(url, framework="np") as f:
        a = f.get_tensor("layer11.weight")
    assert (a == t["layer11.weight"].numpy()).all()
    assert body_bytes(of(remote_env.settled_log(start), path)) < 2 * TENSOR_BYTES + MIB


def corrupt_copy(tensors, victim):
    """The file's bytes with one byte of `victim`'s data flipped."""
    data = bytearray(kt.save(tensors))
    r = keepsake._core.native.Reader(data=bytes(data))
    _name, _code, _shape, begin, end = r.entry(victim)
    data[(begin + end) // 2] ^= 0x40
    return bytes(data)


def small_tensors():
    return {"a": torch.arange(1000, dtype=torch.float32), "b": torch.arange(500, dtype=torch.int64),
            "c": torch.ones(7, 3)}


def test_corrupt_s3_tensor_raises_checksum_error(env, bucket):
    t = small_tensors()
    rc, status, _ = remote_env.s3("PUT", f"{bucket}/bad.keepsake", data=corrupt_copy(t, "b"))
    assert rc == 0 and status == 200
    direct(env)
    with keepsake.safe_open(f"s3://{bucket}/bad.keepsake") as f:  # the header is intact
        assert f.keys() == ["a", "b", "c"]
        assert torch.equal(f.get_tensor("a"), t["a"])
        with pytest.raises(keepsake.ChecksumError) as e:
            f.get_tensor("b")
        assert e.value.key == "b" and e.value.file == f"s3://{bucket}/bad.keepsake" and e.value.offset > 0
        with pytest.raises(keepsake.ChecksumError):
            f.get_slice("b")[0:3]
        assert torch.equal(f.get_tensor("c"), t["c"])
    with pytest.raises(keepsake.ChecksumError):
        kt.load_file(f"s3://{bucket}/bad.keepsake", verify=True)


def test_missing_remote_object(env, bucket, tmp_path):
    direct(env)
    for loc in (f"s3://{bucket}/missing.keepsake", f"{env['KS_TEST_HTTP_URL']}/missing.keepsake"):
        with pytest.raises(keepsake.FileNotFoundError_) as e:
            keepsake.safe_open(loc, cache_dir=tmp_path / "c")
        assert e.value.file == loc


def test_corrupt_http_tensor_raises_checksum_error(env):
    t = small_tensors()
    name = f"bad-{uuid.uuid4().hex[:12]}.keepsake"
    with open(os.path.join(env["KS_TEST_HTTP_ROOT"], name), "wb") as f:
        f.write(corrupt_copy(t, "a"))
    with keepsake.safe_open(f"{env['KS_TEST_HTTP_URL']}/{name}", framework="np") as f:
        with pytest.raises(keepsake.ChecksumError):
            f.get_tensor("a")
        assert (f.get_tensor("c") == t["c"].numpy()).all()


def test_lazy_tensors_of_every_kind(env):
    t = {"empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5, dtype=torch.float64),
         "bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "flags": torch.tensor([True, False, True]),
         "u8": torch.arange(200, dtype=torch.uint8)}
    name = f"kinds-{uuid.uuid4().hex[:12]}.keepsake"
    kt.save_file(t, os.path.join(env["KS_TEST_HTTP_ROOT"], name), metadata={"k": "v"})
    with keepsake.safe_open(f"{env['KS_TEST_HTTP_URL']}/{name}") as f:
        assert f._reader.lazy and f.metadata() == {"k": "v"}
        got = f.get_tensors()
        assert f.get_slice("bf16").get_dtype() == "BF16" and f.get_slice("bf16")[1].tolist() == [3.0, 4.0, 5.0]
        with pytest.raises(keepsake.NotFoundError):
            f.get_tensor("missing")
        f.verify()
    for k, v in t.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
    with keepsake.safe_open(f"{env['KS_TEST_HTTP_URL']}/{name}", framework="np") as f:
        with pytest.raises(keepsake.DTypeError):
            f.get_tensor("bf16")
        assert f.get_tensor("u8").tolist() == list(range(200))


def test_local_safe_open_still_maps(tmp_path):
    kt.save_file(small_tensors(), tmp_path / "x.keepsake")
    with keepsake.safe_open(tmp_path / "x.keepsake") as f:
        assert not f._reader.lazy
        memoryview(f._reader)  # the mapping is exported, as before


# ---- the read cache ----

def test_safe_open_cache_reads_nothing_the_second_time(env, big_s3, tmp_path):
    url, path, t = big_s3
    via_proxy(env)
    cache = tmp_path / "cache"
    start = len(remote_env.proxy_log())
    with keepsake.safe_open(url, cache_dir=cache) as f:
        assert torch.equal(f.get_tensor("layer05.weight"), t["layer05.weight"])
        st = f._reader.cache_stats()
    assert st["miss_bytes"] >= TENSOR_BYTES and st["hit_bytes"] == 0 and st["stored"] >= 2
    first = of(remote_env.settled_log(start), path)
    assert body_bytes(first) >= TENSOR_BYTES
    start = len(remote_env.proxy_log())
    with keepsake.safe_open(url, cache_dir=cache) as f:
        assert torch.equal(f.get_tensor("layer05.weight"), t["layer05.weight"])
        st = f._reader.cache_stats()
    again = of(remote_env.settled_log(start), path)
    assert [e for e in again if e["method"] == "GET"] == []  # the size (HEAD) is asked; no byte is read
    assert body_bytes(again) == 0
    assert st["miss_bytes"] == 0 and st["hit_bytes"] >= TENSOR_BYTES


def test_load_file_cache_reads_nothing_the_second_time(env, bucket, tmp_path):
    t = small_tensors()
    direct(env)
    url = f"s3://{bucket}/cached.keepsake"
    kt.save_file(t, url)
    via_proxy(env)
    cache = tmp_path / "cache"
    start = len(remote_env.proxy_log())
    first = kt.load_file(url, verify=True, cache_dir=cache)
    assert body_bytes(of(remote_env.settled_log(start), f"/{bucket}/cached.keepsake")) > 0
    start = len(remote_env.proxy_log())
    second = kn.load_file(url, verify=True, cache_dir=cache)
    assert body_bytes(of(remote_env.settled_log(start), f"/{bucket}/cached.keepsake")) == 0
    for k in t:
        assert torch.equal(first[k], t[k]) and (second[k] == t[k].numpy()).all()
    # a damaged piece is never trusted: it is dropped and the bytes read again
    pieces = [os.path.join(d, n) for d, _, ns in os.walk(cache) for n in ns]
    assert pieces
    for p in pieces:
        with open(p, "r+b") as f:
            f.seek(os.path.getsize(p) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 1]))
    start = len(remote_env.proxy_log())
    third = kt.load_file(url, verify=True, cache_dir=cache)
    assert body_bytes(of(remote_env.settled_log(start), f"/{bucket}/cached.keepsake")) > 0
    assert all(torch.equal(third[k], t[k]) for k in t)


# ---- upload mode ----

def train(model, ts, mgr, steps):
    for _ in range(steps):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.5)
        ts.batch += 1
        ts.batch_in_epoch += 1
        mgr.step()


def test_upload_mode_uploads_and_autoresumes(env, bucket, tmp_path):
    via_proxy(env)
    run, up = tmp_path / "run", f"s3://{bucket}/uploaded"
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    ts = keepsake.Timestamp()
    with keepsake.CheckpointManager(run, model=model, optimizers=opt, timestamp=ts, save_every="2ba", keep_last=2,
                                    upload_to=up, async_save=True, preemption_signals=()) as mgr:
        train(model, ts, mgr, 6)
    local = sorted(p for p in os.listdir(run) if p.endswith(".keepsake"))
    assert local == ["ep0-ba4.keepsake", "ep0-ba6.keepsake"]  # keep_last=2 locally
    keys = remote_env.list_keys(bucket, "uploaded/")
    # every checkpoint uploaded whole (no upload_retention: none deleted there), and `latest`
    assert sorted(keys) == ["uploaded/ep0-ba2.keepsake", "uploaded/ep0-ba4.keepsake", "uploaded/ep0-ba6.keepsake",
                            "uploaded/latest"]
    for n in ("ep0-ba4", "ep0-ba6"):
        assert keys[f"uploaded/{n}.keepsake"] == os.path.getsize(run / f"{n}.keepsake")

    # the machine is gone: a new one with an empty run directory resumes from the upload
    cache = tmp_path / "cache"
    for attempt in range(2):
        shutil.rmtree(run, ignore_errors=True)
        start = len(remote_env.proxy_log())
        fresh = torch.nn.Linear(6, 3)
        fopt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
        ts2 = keepsake.Timestamp()
        with keepsake.CheckpointManager(run, model=fresh, optimizers=fopt, timestamp=ts2, upload_to=up,
                                        cache_dir=cache, preemption_signals=()) as mgr:
            assert mgr.autoresume()
        assert ts2.batch == 6
        assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
        assert torch.equal(fopt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
        assert os.path.exists(run / "ep0-ba6.keepsake")  # downloaded under its name
        got = [e for e in remote_env.settled_log(start)
               if e["method"] == "GET" and e["path"] == f"/{bucket}/uploaded/ep0-ba6.keepsake"]
        if attempt == 0:
            assert body_bytes(got) >= os.path.getsize(run / "ep0-ba6.keepsake")
        else:  # the second download comes from the cache: not one byte of the object from the server
            assert body_bytes(got) == 0


def test_remote_run_dir_with_cache_autoresumes(env, bucket, tmp_path):
    via_proxy(env)
    run = f"s3://{bucket}/direct"
    model, ts = torch.nn.Linear(4, 4), keepsake.Timestamp()
    with keepsake.CheckpointManager(run, model=model, timestamp=ts, save_every="3ba", keep_last=1,
                                    cache_dir=tmp_path / "c", preemption_signals=()) as mgr:
        train(model, ts, mgr, 6)
    assert sorted(remote_env.list_keys(bucket, "direct/")) == ["direct/ep0-ba6.keepsake", "direct/latest"]
    fresh, ts2 = torch.nn.Linear(4, 4), keepsake.Timestamp()
    with keepsake.CheckpointManager(run, model=fresh, timestamp=ts2, cache_dir=tmp_path / "c",
                                    preemption_signals=()) as mgr:
        assert mgr.autoresume()
    assert ts2.batch == 6 and torch.equal(fresh.weight, model.weight)
    assert os.listdir(tmp_path / "c") == ["run"]  # the run directory's reads went through the cache

"""keepsake.distributed on remote locations, against the remote test servers (ctest fixture
remote_servers: moto for S3, nginx for HTTP, the fault proxy whose log counts what a load reads):
KeepsakeWriter writes s3://bucket/prefix (each object uploaded whole, the index last), and
KeepsakeReader reads s3:// and http(s):// through the C library's storage layer, with ranged reads
verified as they arrive. One process (dcp.save / dcp.load with no_dist), and one 2-rank torchrun
job (dcp_worker.py remote) that saves FSDP2-sharded state to S3 and loads it back.

This file reads the proxy's log but sets no fault on it; ctest gives it the remote_fault_proxy lock
so that no test that does runs meanwhile. Run by ctest (KS_REMOTE_ENV).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "remote"))
sys.path.insert(0, HERE)
if not os.environ.get("KS_REMOTE_ENV"):
    pytest.skip("needs the remote_servers fixture (run through ctest)", allow_module_level=True)

import remote_env  # noqa: E402

import keepsake  # noqa: E402
import keepsake.distributed  # noqa: E402
import keepsake.torch as kt  # noqa: E402
from keepsake import _keepsake as native  # noqa: E402
from keepsake._core import tensors as _tensors  # noqa: E402
from keepsake.distributed import INDEX_NAME, OBJECT_PREFIX, KeepsakeReader, KeepsakeWriter  # noqa: E402

RANK0 = "rank-00000-of-00001.keepsake"
MIB = 1 << 20

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed is disabled.*")


@pytest.fixture(scope="module")
def env():
    e = remote_env.load()
    os.environ["AWS_ENDPOINT_URL"] = e["KS_TEST_S3_ENDPOINT"]
    return e


@pytest.fixture(scope="module")
def bucket(env):
    name = f"dcp-{uuid.uuid4().hex[:12]}"
    remote_env.make_bucket(name)
    return name


@pytest.fixture()
def direct(env):
    """S3 requests straight to moto (and back there after a test that went through the proxy)."""
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_S3_ENDPOINT"]
    yield
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_S3_ENDPOINT"]


def state() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.arange(7, dtype=torch.int32),
            "h": torch.randn(3, 5, generator=g).to(torch.bfloat16), "flag": torch.tensor(True),
            "step": 12, "cfg": {"betas": (0.9, 0.999), "eps": 1e-8, "name": "adamw", "none": None, "raw": b"\x00\xff"}}


def empty() -> dict:
    return {"w": torch.zeros(64, 32), "b": torch.zeros(7, dtype=torch.int32),
            "h": torch.zeros(3, 5, dtype=torch.bfloat16), "flag": torch.tensor(False), "step": 0,
            "cfg": {"betas": None, "eps": 0.0, "name": "", "none": 1, "raw": b""}}


def assert_loaded(out: dict) -> None:
    want = state()
    for k in ("w", "b", "h", "flag"):
        assert out[k].dtype == want[k].dtype and torch.equal(out[k], want[k]), k
    assert out["step"] == 12 and out["cfg"] == want["cfg"] and type(out["cfg"]["betas"]) is tuple


def failures(e: CheckpointException) -> list:
    return [x for x, _tb in e.failures.values()]


def keys(bucket: str, prefix: str) -> dict:
    """{name under prefix: size} of the objects in moto."""
    return {k[len(prefix) + 1:]: n for k, n in remote_env.list_keys(bucket, prefix + "/").items()}


def get(bucket: str, key: str) -> bytes:
    rc, status, body = remote_env.s3("GET", f"{bucket}/{key}")
    assert rc == 0 and status == 200, (rc, status)
    return body


def put(bucket: str, key: str, data: bytes) -> None:
    rc, status, _ = remote_env.s3("PUT", f"{bucket}/{key}", data=data)
    assert rc == 0 and status == 200, (rc, status)


def saved(bucket: str, name: str) -> str:
    url = f"s3://{bucket}/{name}"
    dcp.save(state(), storage_writer=KeepsakeWriter(url), no_dist=True)
    return url


def test_round_trip_on_s3(direct, bucket, tmp_path):
    url = saved(bucket, "run/step-1")
    assert keys(bucket, "run/step-1").keys() == {INDEX_NAME, RANK0}
    out = empty()
    dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
    assert_loaded(out)
    out = empty()
    dcp.load(out, storage_reader=KeepsakeReader(url, verify_files=True), no_dist=True)
    assert_loaded(out)
    assert KeepsakeReader.validate_checkpoint_id(url) and KeepsakeWriter.validate_checkpoint_id(url)
    # The C library reads the objects: the index held against every header, every byte verified.
    index = native.shard_index(url, check=True)
    assert index["world_size"] == 1 and [f for f, _n, _h in index["files"]] == [RANK0]
    native.shard_verify(url)
    # The CLI reads the bucket's directory as a local one: verify, inspect, and diff against a copy.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (INDEX_NAME, RANK0):
        (copy / name).write_bytes(get(bucket, f"run/step-1/{name}"))
    v = cli("verify", url)
    assert v.returncode == 0 and f"{url}: OK (sharded checkpoint, 1 rank file" in v.stdout, (v.stdout, v.stderr)
    v = cli("inspect", url)
    assert v.returncode == 0 and "format:     keepsake sharded, 1 rank" in v.stdout and RANK0 in v.stdout, v.stdout
    v = cli("diff", url, str(copy))
    assert v.returncode == 0 and "identical" in v.stdout, (v.stdout, v.stderr)
    v = cli("verify", f"s3://{bucket}/run/missing")
    assert v.returncode != 0 and "BAD" in v.stdout, (v.stdout, v.stderr)


def cli(*args: str) -> subprocess.CompletedProcess:
    """The keepsake CLI (KS_CLI, set by ctest) on `args`."""
    exe = os.environ.get("KS_CLI")
    if not exe:
        pytest.skip("KS_CLI is not set (run through ctest)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_bucket_root_and_checkpoint_id(direct, env):
    """A checkpoint at the root of a bucket, named through dcp's checkpoint_id."""
    root = f"dcp-root-{uuid.uuid4().hex[:8]}"
    remote_env.make_bucket(root)
    dcp.save(state(), checkpoint_id=f"s3://{root}", storage_writer=KeepsakeWriter("unused"), no_dist=True)
    assert set(remote_env.list_keys(root)) == {INDEX_NAME, RANK0}
    out = empty()
    dcp.load(out, checkpoint_id=f"s3://{root}/", storage_reader=KeepsakeReader("unused"), no_dist=True)
    assert_loaded(out)


def test_chunks_of_two_ranks_on_s3(direct, bucket):
    """Rank files written through the shard functions as two ranks would (a row-sharded tensor, the
    replicated entries on rank 0), committed by the index; a one-process load puts the chunks together."""
    url = f"s3://{bucket}/chunks"
    w = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    step = torch.frombuffer(bytearray(keepsake.distributed.encode_object(5)), dtype=torch.uint8)
    keep: list = []
    infos = []
    for r, rows in enumerate((w[:6], w[6:])):
        entries = [_tensors.torch_entry("w", rows, keep)]
        if r == 0:
            entries.append(_tensors.torch_entry(OBJECT_PREFIX + "step", step, keep))
        infos.append(native.shard_write_rank(url, r, 2, entries, [("w", (10, 4), (6 * r, 0))], None, True))
        # before the index there is no checkpoint
        assert not native.shard_committed(url) and not KeepsakeReader.validate_checkpoint_id(url)
    with pytest.raises(keepsake.NotFoundError):
        native.shard_index(url)
    native.shard_write_index(url, infos)
    index = native.shard_index(url)
    assert index["world_size"] == 2 and index["sharded"][0][0] == "w"
    assert [c[0] for c in index["sharded"][0][3]] == [0, 1]
    native.shard_verify(url, [0, 1])
    out = {"w": torch.zeros(10, 4), "step": 0}
    dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
    assert torch.equal(out["w"], w) and out["step"] == 5
    out = {"w": torch.zeros(10, 4)}
    dcp.load(out, storage_reader=KeepsakeReader(url, verify_files=True), no_dist=True)
    assert torch.equal(out["w"], w)


def test_damaged_rank_object_is_a_checksum_error(direct, bucket):
    url = saved(bucket, "damaged")
    key = f"damaged/{RANK0}"
    data = bytearray(get(bucket, key))
    _name, _code, _shape, begin, end = native.Reader(data=bytes(data)).entry("w")
    data[(begin + end) // 2] ^= 0x40
    put(bucket, key, bytes(data))
    KeepsakeReader(url).read_metadata()  # sizes agree with the index
    with pytest.raises(CheckpointException) as e:
        dcp.load(empty(), storage_reader=KeepsakeReader(url), no_dist=True)
    [err] = failures(e.value)
    assert isinstance(err, keepsake.ChecksumError) and err.key == "w", err
    assert err.file == f"{url}/{RANK0}", err.file
    out = {"b": torch.zeros(7, dtype=torch.int32)}  # the damaged tensor is not read: the load succeeds
    dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
    assert torch.equal(out["b"], torch.arange(7, dtype=torch.int32))
    with pytest.raises(keepsake.ChecksumError):
        KeepsakeReader(url, verify_files=True).read_metadata()
    with pytest.raises(keepsake.ChecksumError):
        native.shard_verify(url)
    v = cli("verify", url)
    assert v.returncode != 0 and "KS_E_CHECKSUM" in v.stdout and f"{url}: BAD" in v.stdout, (v.stdout, v.stderr)


class DiesBeforeCommit(KeepsakeWriter):
    """Every rank file written (uploaded), then the job dies before the index."""

    def finish(self, metadata, results):
        raise keepsake.IOError_(message="the coordinator died")


def test_failed_save_leaves_no_index(direct, bucket):
    url = f"s3://{bucket}/dies"
    with pytest.raises(CheckpointException):
        dcp.save(state(), storage_writer=DiesBeforeCommit(url), no_dist=True)
    assert keys(bucket, "dies").keys() == {RANK0}  # uploaded whole, and no index
    assert not native.shard_committed(url) and not KeepsakeReader.validate_checkpoint_id(url)
    with pytest.raises(keepsake.NotFoundError):
        native.shard_index(url)
    # A value that cannot be stored fails the save before anything is uploaded.
    with pytest.raises(CheckpointException) as e:
        dcp.save({"s": {1, 2}}, storage_writer=KeepsakeWriter(f"s3://{bucket}/nothing"), no_dist=True)
    assert isinstance(failures(e.value)[0], keepsake.UnsupportedError)
    assert keys(bucket, "nothing") == {}


def test_overwrite_removes_the_index_first(direct, bucket):
    url = saved(bucket, "over")
    with pytest.raises(CheckpointException) as e:
        dcp.save(state(), storage_writer=KeepsakeWriter(url, overwrite=False), no_dist=True)
    assert [type(x) for x in failures(e.value)] == [keepsake.ExistsError]
    # overwriting (the default) removes the index before any rank writes: a save that then dies leaves none
    with pytest.raises(CheckpointException):
        dcp.save(state(), storage_writer=DiesBeforeCommit(url), no_dist=True)
    assert keys(bucket, "over").keys() == {RANK0} and not KeepsakeReader.validate_checkpoint_id(url)
    sd = state()
    sd["w"] = sd["w"] * 2
    dcp.save(sd, storage_writer=KeepsakeWriter(url), no_dist=True)
    out = empty()
    dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
    assert torch.equal(out["w"], state()["w"] * 2)


def test_http_is_read_only(env, tmp_path):
    for url in (f"{env['KS_TEST_HTTP_URL']}/x/ckpt", "https://example.invalid/ckpt"):
        with pytest.raises(keepsake.UnsupportedError) as e:
            KeepsakeWriter(url)
        assert "reads this location only" in str(e.value)
        assert not KeepsakeWriter.validate_checkpoint_id(url)
    assert KeepsakeWriter.validate_checkpoint_id(str(tmp_path / "c"))
    assert KeepsakeWriter.validate_checkpoint_id(f"file://{tmp_path}/c")
    assert not KeepsakeWriter.validate_checkpoint_id("ftp://host/c")


def test_read_over_http(env, tmp_path):
    """A checkpoint written to a local directory and served by nginx loads over http://."""
    name = f"dcp-{uuid.uuid4().hex[:12]}"
    local = os.path.join(env["KS_TEST_HTTP_ROOT"], name)
    dcp.save(state(), storage_writer=KeepsakeWriter(local), no_dist=True)
    try:
        url = f"{env['KS_TEST_HTTP_URL']}/{name}"
        assert KeepsakeReader.validate_checkpoint_id(url)
        assert not KeepsakeReader.validate_checkpoint_id(f"{env['KS_TEST_HTTP_URL']}/missing-{name}")
        out = empty()
        dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
        assert_loaded(out)
        out = empty()
        dcp.load(out, storage_reader=KeepsakeReader(url, verify_files=True), no_dist=True)
        assert_loaded(out)
        assert native.shard_index(url)["world_size"] == 1
        native.shard_verify(url)
        v = cli("verify", url)
        assert v.returncode == 0 and f"{url}: OK" in v.stdout, (v.stdout, v.stderr)
    finally:
        shutil.rmtree(local)


def test_rank_file_swapped_over_http_is_refused(env):
    """A rank file replaced by another checkpoint's of the same size (lr 9.125 for 0.125, other
    weights; every tensor checksum in its header matches its data): read_metadata hashes each
    header against the index's header_xxh3 through ranged GETs, so nothing of it loads."""
    name = f"dcp-{uuid.uuid4().hex[:12]}"
    a, b = (os.path.join(env["KS_TEST_HTTP_ROOT"], name + s) for s in ("-a", "-b"))
    try:
        for d, seed, lr in ((a, 0, 0.125), (b, 1, 9.125)):
            g = torch.Generator().manual_seed(seed)
            dcp.save({"w": torch.randn(64, 32, generator=g), "lr": lr}, storage_writer=KeepsakeWriter(d),
                     no_dist=True)
        assert os.path.getsize(os.path.join(a, RANK0)) == os.path.getsize(os.path.join(b, RANK0))
        shutil.copyfile(os.path.join(b, RANK0), os.path.join(a, RANK0))
        url = f"{env['KS_TEST_HTTP_URL']}/{name}-a"
        with pytest.raises(keepsake.ChecksumError) as e:
            KeepsakeReader(url).read_metadata()
        assert "header XXH3" in str(e.value), str(e.value)
        out = {"w": torch.zeros(64, 32), "lr": 0.0}
        with pytest.raises(CheckpointException):
            dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
        assert out["lr"] == 0.0 and not out["w"].any()
        v = cli("verify", url)
        assert v.returncode == 1 and "header XXH3" in v.stdout, (v.stdout, v.stderr)
    finally:
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# What a load reads, counted at the fault proxy.
# ----------------------------------------------------------------------------------------------



def test_load_reads_only_the_requested_ranges(env, direct, bucket):
    big = {f"layer{i}": torch.full((MIB // 4,), float(i)) for i in range(8)}  # 8 x 1 MiB
    url = f"s3://{bucket}/big"
    dcp.save(big, storage_writer=KeepsakeWriter(url), no_dist=True)
    path = f"/{bucket}/big/{RANK0}"
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_PROXY_S3"]
    start = len(remote_env.proxy_log())
    out = {"layer5": torch.zeros(MIB // 4)}
    dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
    assert torch.equal(out["layer5"], big["layer5"])
    seen = [e for e in remote_env.settled_log(start) if e["path"] == path]
    gets = [e for e in seen if e["method"] == "GET"]
    total = sum(e["resp_bytes"] or 0 for e in gets)
    # one tensor and the header (read twice: the metadata, then the file the plan reads), not 8 MiB
    assert MIB <= total < MIB + 256 * 1024, total
    assert gets and all(e["range"] for e in gets), gets
    assert all(e["status"] in (200, 206) for e in seen)


# ----------------------------------------------------------------------------------------------
# Two ranks under torchrun.
# ----------------------------------------------------------------------------------------------

def nested(flat: dict) -> dict:
    """{"a.b.c": t} as {"a": {"b": {"c": t}}}: DCP flattens both to the same names."""
    out: dict = {}
    for fqn, t in flat.items():
        *parents, leaf = fqn.split(".")
        d = out
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = t
    return out


def test_two_ranks_save_to_s3_and_load(direct, bucket, tmp_path):
    import run_dcp
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo unavailable")
    url = f"s3://{bucket}/torchrun/step-2"
    run_dcp.torchrun(2, "remote", str(tmp_path), url, timeout=240)
    files = {"rank-00000-of-00002.keepsake", "rank-00001-of-00002.keepsake"}
    assert keys(bucket, "torchrun/step-2").keys() == files | {INDEX_NAME}
    # rank 1 failed that save: rank 0's object was uploaded, and there is no index
    assert keys(bucket, "torchrun/step-2-failed").keys() == {"rank-00000-of-00002.keepsake"}
    native.shard_verify(url)
    # Loaded back in one process: each FSDP2 tensor put together from the chunks of both rank objects.
    expected = kt.load_file(str(tmp_path / "expected.keepsake"))
    assert len(expected) >= 12
    out = nested({k: torch.zeros_like(t) for k, t in expected.items()})
    dcp.load(out, storage_reader=KeepsakeReader(url), no_dist=True)
    for fqn, t in expected.items():
        d = out
        for p in fqn.split("."):
            d = d[p]
        assert torch.equal(d, t), fqn


def test_distributed_manager_on_s3(direct, bucket, tmp_path):
    """CheckpointManager(distributed=True) with an s3:// run directory (a one-rank gloo group):
    each directory is written to the bucket through DCP, keep_last prunes there, a background
    save commits, and a fresh manager autoresumes from the bucket."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        run = f"s3://{bucket}/dist-run"
        torch.manual_seed(3)
        model = torch.nn.Linear(6, 4)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        ts = keepsake.Timestamp()
        saved = []
        with keepsake.CheckpointManager(run, model=model, optimizers=opt, timestamp=ts, keep_last=2,
                                        distributed=True, preemption_signals=()) as mgr:
            assert mgr.run_dir == run
            for i in range(4):
                model(torch.randn(3, 6)).sum().backward()
                opt.step()
                opt.zero_grad()
                ts.batch += 1
                saved.append(mgr.save(blocking=i != 3))
        assert saved == [f"{run}/ep0-ba{i}" for i in range(1, 5)]
        assert [bool(native.shard_committed(p)) for p in saved] == [False, False, True, True]  # keep_last=2
        fresh = torch.nn.Linear(6, 4)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.05)
        ts2 = keepsake.Timestamp()
        with keepsake.CheckpointManager(run, model=fresh, optimizers=fresh_opt, timestamp=ts2,
                                        distributed=True, preemption_signals=()) as mgr:
            assert mgr.autoresume() and mgr.last_resumed == saved[-1]
        assert ts2.batch == 4 and torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
        assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
        assert not os.path.exists("dist-run")  # nothing was written to a local path of that name
    finally:
        dist.destroy_process_group()

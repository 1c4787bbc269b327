"""load_checkpoint(cache_dir=) and the manager's autoresume over a remote run directory, measured at
the server: a checkpoint loaded a second time through the read cache is not read again.

Reads go through the fault proxy of the remote_servers fixture, whose request log gives each
request's method, path and the body bytes the server sent (see test_remote_lazy.py). The proxy is
shared: this file holds the remote_fault_proxy lock (tests/python/CMakeLists.txt), never clears
its log or sets a fault, and only reads the entries of its own (uniquely named) objects.
"""
import os
import sys
import uuid

import pytest
import torch
import torchmetrics as tm

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "remote"))
if not os.environ.get("KS_REMOTE_ENV"):
    pytest.skip("needs the remote_servers fixture (run through ctest)", allow_module_level=True)

import remote_env  # noqa: E402

import keepsake  # noqa: E402
import keepsake.torch as kt  # noqa: E402


@pytest.fixture(scope="module")
def env():
    return remote_env.load()


@pytest.fixture(scope="module")
def bucket(env):
    name = f"cacheload-{uuid.uuid4().hex[:12]}"
    remote_env.make_bucket(name)
    return name


def direct(env):
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_S3_ENDPOINT"]


def via_proxy(env):
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_PROXY_S3"]




def gets(log, path):
    return [e for e in log if e["path"] == path and e["method"] == "GET"]


def body_bytes(entries):
    return sum(e["resp_bytes"] or 0 for e in entries)


def make_run(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    metric = tm.MeanMetric()
    return model, opt, metric


def trained(seed=0):
    model, opt, metric = make_run(seed)
    for _ in range(2):
        loss = model(torch.randn(4, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        metric.update(loss.detach())
    metric.compute()
    return model, opt, metric


def check_same(model, opt, metric, fresh, fopt, fmetric):
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(opt.state[p]["exp_avg"], fopt.state[q]["exp_avg"])
    assert torch.equal(metric.compute(), fmetric.compute())


def s3_size(bucket, url):
    key = url[len(f"s3://{bucket}/"):]
    return remote_env.list_keys(bucket, key)[key]


def load_twice(url, path, size, tmp_path, want, verify=True):
    """Two loads through one cache: the first reads the object, the second reads none of it."""
    cache = tmp_path / "cache"
    for attempt in range(2):
        fresh, fopt, fmetric = make_run(seed=9)
        ts = keepsake.Timestamp()
        start = len(remote_env.proxy_log())
        rep = kt.load_checkpoint(url, model=fresh, optimizers=fopt, train_metrics={"loss": fmetric}, timestamp=ts,
                                 verify=verify, cache_dir=cache)
        assert not rep.missing and not rep.mismatched and ts.batch == 3
        check_same(*want, fresh, fopt, fmetric)
        got = body_bytes(gets(remote_env.settled_log(start), path))
        if attempt == 0:
            assert size <= got < 2 * size, (got, size)  # the whole object, once
        else:
            assert got == 0, got  # not one byte of the object from the server
    assert os.listdir(cache)


def test_s3_load_checkpoint_through_the_cache(env, bucket, tmp_path):
    want = trained()
    url = f"s3://{bucket}/ck-{uuid.uuid4().hex[:8]}.keepsake"
    direct(env)
    kt.save_checkpoint(url, model=want[0], optimizers=want[1], train_metrics={"loss": want[2]},
                       timestamp=keepsake.Timestamp(batch=3))
    via_proxy(env)
    load_twice(url, "/" + url[len("s3://"):], s3_size(bucket, url), tmp_path, want)


def test_s3_unverified_load_through_the_cache(env, bucket, tmp_path):
    want = trained(1)
    url = f"s3://{bucket}/nv-{uuid.uuid4().hex[:8]}.keepsake"
    direct(env)
    kt.save_checkpoint(url, model=want[0], optimizers=want[1], train_metrics={"loss": want[2]},
                       timestamp=keepsake.Timestamp(batch=3))
    via_proxy(env)
    load_twice(url, "/" + url[len("s3://"):], s3_size(bucket, url), tmp_path, want, verify=False)


def test_http_load_checkpoint_through_the_cache(env, tmp_path):
    want = trained(2)
    name = f"ck-{uuid.uuid4().hex[:12]}.keepsake"
    local = os.path.join(env["KS_TEST_HTTP_ROOT"], name)
    kt.save_checkpoint(local, model=want[0], optimizers=want[1], train_metrics={"loss": want[2]},
                       timestamp=keepsake.Timestamp(batch=3))
    load_twice(f"{env['KS_TEST_PROXY_HTTP']}/{name}", f"/{name}", os.path.getsize(local), tmp_path, want)


def test_without_cache_every_load_reads(env, bucket, tmp_path):
    want = trained(3)
    url = f"s3://{bucket}/nc-{uuid.uuid4().hex[:8]}.keepsake"
    direct(env)
    kt.save_checkpoint(url, model=want[0], timestamp=keepsake.Timestamp(batch=3))
    via_proxy(env)
    for _ in range(2):
        fresh = make_run(9)[0]
        start = len(remote_env.proxy_log())
        kt.load_checkpoint(url, model=fresh)
        assert body_bytes(gets(remote_env.settled_log(start), "/" + url[len("s3://"):])) >= s3_size(bucket, url)


def test_local_file_is_never_cached(tmp_path):
    want = trained(4)
    kt.save_checkpoint(tmp_path / "ck.keepsake", model=want[0], timestamp=keepsake.Timestamp(batch=3))
    fresh = make_run(9)[0]
    kt.load_checkpoint(tmp_path / "ck.keepsake", model=fresh, cache_dir=tmp_path / "cache")
    assert torch.equal(fresh[0].weight, want[0][0].weight)
    assert not os.path.exists(tmp_path / "cache") or not any(files for _, _, files in os.walk(tmp_path / "cache"))


def test_a_damaged_cached_piece_is_read_again(env, bucket, tmp_path):
    want = trained(5)
    url = f"s3://{bucket}/dmg-{uuid.uuid4().hex[:8]}.keepsake"
    direct(env)
    kt.save_checkpoint(url, model=want[0], timestamp=keepsake.Timestamp(batch=3))
    via_proxy(env)
    cache = tmp_path / "cache"
    kt.load_checkpoint(url, model=make_run(9)[0], cache_dir=cache)
    pieces = [os.path.join(d, n) for d, _, ns in os.walk(cache) for n in ns]
    assert pieces
    for p in pieces:
        with open(p, "r+b") as f:
            f.seek(os.path.getsize(p) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 1]))
    fresh = make_run(9)[0]
    start = len(remote_env.proxy_log())
    kt.load_checkpoint(url, model=fresh, cache_dir=cache)
    assert body_bytes(gets(remote_env.settled_log(start), "/" + url[len("s3://"):])) >= s3_size(bucket, url)
    assert torch.equal(fresh[0].weight, want[0][0].weight)


def test_autoresume_loads_a_remote_checkpoint_through_the_managers_cache(env, bucket, tmp_path):
    via_proxy(env)
    run = f"s3://{bucket}/run-{uuid.uuid4().hex[:8]}"
    model, opt, metric = trained(6)
    ts = keepsake.Timestamp()
    with keepsake.CheckpointManager(run, model=model, optimizers=opt, train_metrics={"loss": metric}, timestamp=ts,
                                    save_every="3ba", keep_last=1, preemption_signals=()) as mgr:
        for _ in range(3):
            ts.batch += 1
            mgr.step()
    obj = f"/{run[len('s3://'):]}/ep0-ba3.keepsake"
    cache = tmp_path / "cache"
    read = []
    for attempt in range(2):
        fresh, fopt, fmetric = make_run(9)
        ts2 = keepsake.Timestamp()
        start = len(remote_env.proxy_log())
        with keepsake.CheckpointManager(run, model=fresh, optimizers=fopt, train_metrics={"loss": fmetric},
                                        timestamp=ts2, cache_dir=cache, preemption_signals=()) as mgr:
            assert mgr.autoresume()
        assert ts2.batch == 3 and not mgr.last_report.missing
        check_same(model, opt, metric, fresh, fopt, fmetric)
        read.append(body_bytes(gets(remote_env.settled_log(start), obj)))
    size = s3_size(bucket, f"{run}/ep0-ba3.keepsake")
    # The first resume reads the object once: for the choice (the library's ranged, verified
    # reads, each kept as a piece); the load's larger reads are assembled from those pieces. The
    # second resume finds everything in the cache and reads none of it.
    assert size <= read[0] <= size + (1 << 16), (read, size)
    assert read[1] == 0, read


# ---- an object replaced on the server by another of the same size ----
# The cache keys its pieces by the validator the server gives (the ETag), checked on every open: the
# replaced object is read anew, never served from the pieces of the one before.

def same_size_versions(seed):
    """Two checkpoints of one model with different values: files of the same size."""
    a = trained(seed)
    b = trained(seed + 100)
    return a, b


def replaced_load_checkpoint(url, path, size_of, replace, want_a, want_b, tmp_path):
    cache = tmp_path / "cache"
    fresh, fopt, fmetric = make_run(9)
    kt.load_checkpoint(url, model=fresh, optimizers=fopt, train_metrics={"loss": fmetric}, cache_dir=cache)
    check_same(*want_a, fresh, fopt, fmetric)
    size = size_of()
    replace()
    assert size_of() == size  # the same size: the path and the size alone cannot tell them apart
    fresh, fopt, fmetric = make_run(9)
    start = len(remote_env.proxy_log())
    kt.load_checkpoint(url, model=fresh, optimizers=fopt, train_metrics={"loss": fmetric}, cache_dir=cache)
    check_same(*want_b, fresh, fopt, fmetric)  # the new values, not the cached old ones
    assert body_bytes(gets(remote_env.settled_log(start), path)) >= size  # read anew from the server
    assert len(os.listdir(cache)) == 1  # and the old version's pieces are gone


def save_ck(url, want):
    kt.save_checkpoint(url, model=want[0], optimizers=want[1], train_metrics={"loss": want[2]},
                       timestamp=keepsake.Timestamp(batch=3))


def test_s3_replaced_object_is_not_served_from_the_cache(env, bucket, tmp_path):
    a, b = same_size_versions(20)
    url = f"s3://{bucket}/rep-{uuid.uuid4().hex[:8]}.keepsake"
    direct(env)
    save_ck(url, a)
    via_proxy(env)

    def replace():
        direct(env)
        save_ck(url, b)  # another writer, straight to the store
        via_proxy(env)

    replaced_load_checkpoint(url, "/" + url[len("s3://"):], lambda: s3_size(bucket, url), replace, a, b, tmp_path)


def test_http_replaced_file_is_not_served_from_the_cache(env, tmp_path):
    a, b = same_size_versions(30)
    name = f"rep-{uuid.uuid4().hex[:12]}.keepsake"
    local = os.path.join(env["KS_TEST_HTTP_ROOT"], name)
    save_ck(local, a)

    def replace():
        st = os.stat(local)
        save_ck(local, b)
        # nginx's ETag is the mtime in seconds and the size: a file replaced within the same second as
        # the one before would look the same to any HTTP client; a later one does not.
        os.utime(local, (st.st_mtime + 7, st.st_mtime + 7))

    replaced_load_checkpoint(f"{env['KS_TEST_PROXY_HTTP']}/{name}", f"/{name}", lambda: os.path.getsize(local),
                             replace, a, b, tmp_path)


def test_load_file_and_safe_open_see_a_replaced_object(env, bucket, tmp_path):
    url = f"s3://{bucket}/files-{uuid.uuid4().hex[:8]}.keepsake"
    one = {"w": torch.full((64, 64), 1.0), "b": torch.arange(64)}
    two = {"w": torch.full((64, 64), 2.0), "b": torch.arange(64) * 2}
    direct(env)
    kt.save_file(one, url)
    cache = tmp_path / "cache"
    got = kt.load_file(url, cache_dir=cache)
    assert torch.equal(got["w"], one["w"])
    with keepsake.safe_open(url, framework="pt", cache_dir=cache) as f:
        assert torch.equal(f.get_tensor("b"), one["b"])
    size = s3_size(bucket, url)
    kt.save_file(two, url)
    assert s3_size(bucket, url) == size
    got = kt.load_file(url, cache_dir=cache)
    assert torch.equal(got["w"], two["w"]) and torch.equal(got["b"], two["b"])
    with keepsake.safe_open(url, framework="pt", cache_dir=cache) as f:
        assert torch.equal(f.get_tensor("w"), two["w"]) and torch.equal(f.get_tensor("b"), two["b"])

"""Storage locations from Python, against moto_server (S3) on 127.0.0.1: save_file, load_file,
safe_open, save_checkpoint, load_checkpoint and CheckpointManager (retention and autoresume)
take s3:// URLs. Run by ctest with the remote_servers fixture (KS_REMOTE_ENV)."""
import os
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
import keepsake.torch as kt  # noqa: E402


@pytest.fixture(scope="module")
def bucket():
    env = remote_env.load()
    os.environ["AWS_ENDPOINT_URL"] = env["KS_TEST_S3_ENDPOINT"]
    name = f"py-{uuid.uuid4().hex[:12]}"
    remote_env.make_bucket(name)
    return name


def test_tensor_files_on_s3(bucket):
    url = f"s3://{bucket}/t/w.keepsake"
    t = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3, dtype=torch.int64)}
    kt.save_file(t, url, metadata={"who": "py"})
    back = kt.load_file(url, verify=True)
    assert torch.equal(back["w"], t["w"]) and torch.equal(back["b"], t["b"])
    with keepsake.safe_open(url, framework="pt") as f:
        assert f.keys() == ["b", "w"] and f.metadata()["who"] == "py"
        assert torch.equal(f.get_tensor("w"), t["w"])
    with pytest.raises(keepsake.KeepsakeError):
        kt.load_file(f"s3://{bucket}/t/missing.keepsake")


def test_checkpoint_round_trip_on_s3(bucket):
    model = torch.nn.Linear(3, 2)
    url = f"s3://{bucket}/ck/one.keepsake"
    kt.save_checkpoint(url, model=model)
    other = torch.nn.Linear(3, 2)
    rep = kt.load_checkpoint(url, model=other)
    assert rep.find("state/model").kind == "loaded"
    assert torch.equal(other.weight, model.weight)


def test_manager_on_s3_keeps_the_last_and_autoresumes(bucket):
    run = f"s3://{bucket}/run"
    model = torch.nn.Linear(4, 4)
    ts = keepsake.Timestamp()
    with keepsake.CheckpointManager(run, model=model, timestamp=ts, save_every="2ba", keep_last=2) as mgr:
        saved = []
        for _ in range(8):
            with torch.no_grad():
                model.weight.add_(1.0)
            ts.batch += 1
            p = mgr.step()
            if p:
                saved.append(p)
    assert saved[-1] == f"{run}/ep0-ba8.keepsake"
    with pytest.raises(keepsake.KeepsakeError):  # keep_last deleted the older ones in the bucket
        kt.load_file(saved[0])
    fresh, ts2 = torch.nn.Linear(4, 4), keepsake.Timestamp()
    with keepsake.CheckpointManager(run, model=fresh, timestamp=ts2) as mgr:
        assert mgr.autoresume()
    assert ts2.batch == 8 and torch.equal(fresh.weight, model.weight)


def test_convert_between_s3_and_local(bucket, tmp_path):
    model = torch.nn.Linear(3, 2)
    src = f"s3://{bucket}/conv/ck.keepsake"
    kt.save_checkpoint(src, model=model, rng=False)
    kept, ignored = keepsake.convert(src, tmp_path / "ck.pt")  # an S3 input, a local .pt output
    assert kept > 0 and ignored == 0
    back = torch.load(tmp_path / "ck.pt")
    assert torch.equal(back["state"]["model"]["weight"], model.weight.detach())
    keepsake.convert(tmp_path / "ck.pt", f"s3://{bucket}/conv/again.keepsake")  # and a local input to S3
    assert torch.equal(kt.load_file(f"s3://{bucket}/conv/again.keepsake")["state/model/weight"],
                       model.weight.detach())


# ---- http(s):// (nginx on 127.0.0.1 serving KS_TEST_HTTP_ROOT): read-only locations ----

@pytest.fixture(scope="module")
def served():
    """(directory nginx serves, its URL, a subdirectory of both for this module)."""
    env = remote_env.load()
    sub = f"py-{uuid.uuid4().hex[:12]}"
    os.makedirs(os.path.join(env["KS_TEST_HTTP_ROOT"], sub))
    return os.path.join(env["KS_TEST_HTTP_ROOT"], sub), f"{env['KS_TEST_HTTP_URL']}/{sub}"


def _trained():
    torch.manual_seed(7)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def test_http_checkpoint_loads_and_converts(served, tmp_path):
    root, url = served
    model, opt = _trained()
    kt.save_checkpoint(os.path.join(root, "ck.keepsake"), model=model, optimizers=opt, rng=False,
                       extra={"note": "served"})
    fresh = torch.nn.Linear(4, 3)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    rep = kt.load_checkpoint(f"{url}/ck.keepsake", model=fresh, optimizers=fresh_opt)
    assert rep.find("state/model").kind == "loaded"
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].equal(opt.state_dict()["state"][0]["exp_avg"])
    flat = kt.load_file(f"{url}/ck.keepsake", verify=True)
    assert torch.equal(flat["state/model/weight"], model.weight.detach())
    kept, _ = keepsake.convert(f"{url}/ck.keepsake", tmp_path / "ck.pt")
    assert kept > 0
    assert torch.equal(torch.load(tmp_path / "ck.pt")["state"]["model"]["weight"], model.weight.detach())


def test_http_damaged_checkpoint_is_refused(served):
    root, url = served
    model, _ = _trained()
    path = os.path.join(root, "bad.keepsake")
    kt.save_checkpoint(path, model=model, rng=False)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 3)
        f.write(b"\xff\xfe\xfd")
    before = model.weight.detach().clone()
    with pytest.raises(keepsake.ChecksumError):
        kt.load_checkpoint(f"{url}/bad.keepsake", model=model)
    assert torch.equal(model.weight, before)  # verified before anything changed


def test_http_is_read_only(served):
    _root, url = served
    model, _ = _trained()
    with pytest.raises(keepsake.KeepsakeError):
        kt.save_file({"w": torch.ones(2)}, f"{url}/new.keepsake")
    with pytest.raises(keepsake.KeepsakeError):
        kt.save_checkpoint(f"{url}/new.keepsake", model=model)
    with pytest.raises(keepsake.UnsupportedError, match="read-only"):
        keepsake.CheckpointManager(f"{url}/run", model=model)


def test_docs_remote_example_runs(bucket, served, tmp_path, monkeypatch, capsys):
    """The worked example of docs/PYTHON.md "Remote files", with this module's bucket and the
    nginx URL: run twice, the second run resumes from the bucket."""
    import re
    import shutil
    text = open(os.path.join(SRC, "docs", "PYTHON.md"), encoding="utf-8").read()
    code = re.search(r"```python\n(.*?)```", text.split("## Remote files", 1)[1], re.S).group(1)
    root, url = served
    code = code.replace("s3://my-bucket/", f"s3://{bucket}/").replace("https://example.com/ckpts", url)
    model = torch.nn.Linear(16, 4)
    kt.save_checkpoint(tmp_path / "one.keepsake", model=model)
    shutil.copy(tmp_path / "one.keepsake", os.path.join(root, "one.keepsake"))  # what nginx serves
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/PYTHON.md", "exec"), {"__name__": "example"})
    assert f"resumed: False last: s3://{bucket}/runs/docs/managed/ep0-ba3.keepsake" in capsys.readouterr().out
    assert os.listdir(tmp_path / "ks-cache")  # the cache kept what the first load read
    exec(compile(code, "docs/PYTHON.md", "exec"), {"__name__": "example"})
    assert f"resumed: True last: s3://{bucket}/runs/docs/managed/ep0-ba6.keepsake" in capsys.readouterr().out
    kept = [f"s3://{bucket}/runs/docs/managed/ep0-ba{b}.keepsake" for b in (5, 6)]
    for u in kept:
        keepsake.verify(u)
    with pytest.raises(keepsake.KeepsakeError):  # keep_last=2 deleted the older objects
        keepsake.verify(f"s3://{bucket}/runs/docs/managed/ep0-ba4.keepsake")


# ---- the run directory lock on S3: a lease object written with conditional writes ----

def test_second_manager_on_one_prefix_is_refused_naming_the_holder(bucket):
    run = f"s3://{bucket}/locked-{uuid.uuid4().hex[:8]}"
    first = keepsake.CheckpointManager(run, model=torch.nn.Linear(2, 2), preemption_signals=())
    try:
        with pytest.raises(keepsake.LockedError) as ei:
            keepsake.CheckpointManager(run, model=torch.nn.Linear(2, 2), preemption_signals=())
        assert f"pid {os.getpid()} on host " in str(ei.value)
    finally:
        first.close()
    # released on close: another takes it
    with keepsake.CheckpointManager(run, model=torch.nn.Linear(2, 2), preemption_signals=()):
        pass


def test_killed_holders_lease_is_taken_over(bucket):
    import subprocess
    import textwrap
    run = f"s3://{bucket}/killed-{uuid.uuid4().hex[:8]}"
    holder = textwrap.dedent(f"""
        import os, sys, torch, keepsake
        m = keepsake.CheckpointManager({run!r}, model=torch.nn.Linear(2, 2), preemption_signals=())
        print("holding", flush=True)
        sys.stdin.read()  # until killed
    """)
    p = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ)
    try:
        assert p.stdout.readline().strip() == b"holding"
        with pytest.raises(keepsake.LockedError, match=f"pid {p.pid} on host"):
            keepsake.CheckpointManager(run, model=torch.nn.Linear(2, 2), preemption_signals=())
    finally:
        p.kill()
        p.wait()
    # its lease would live a minute more without renewal; a holder of this machine that is gone is known dead
    with keepsake.CheckpointManager(run, model=torch.nn.Linear(2, 2), preemption_signals=()):
        pass


def test_expired_lease_of_another_machine_is_taken_over(bucket):
    import json
    import time
    prefix = f"expired-{uuid.uuid4().hex[:8]}"
    lease = {"owner": "pid 4242 on host elsewhere since 2020-01-01T00:00:00Z", "host": "elsewhere", "pid": 4242,
             "ttl_ms": 1000}
    rc, status, _ = remote_env.s3("PUT", f"{bucket}/{prefix}/.keepsake.lock", data=json.dumps(lease).encode())
    assert rc == 0 and status == 200
    run = f"s3://{bucket}/{prefix}"
    with pytest.raises(keepsake.LockedError, match="pid 4242 on host elsewhere"):
        keepsake.CheckpointManager(run, model=torch.nn.Linear(2, 2), preemption_signals=())
    time.sleep(3.2)  # its second to live, a second for the server's clock, and some
    with keepsake.CheckpointManager(run, model=torch.nn.Linear(2, 2), preemption_signals=()):
        rc, status, body = remote_env.s3("GET", f"{bucket}/{prefix}/.keepsake.lock")
        assert status == 200 and json.loads(body)["pid"] == os.getpid()


# ---- failures name the s3:// object and the endpoint ----

def test_unreachable_endpoint_is_named_in_the_error(bucket, monkeypatch):
    import socket
    with socket.socket() as s:  # a port of 127.0.0.1 nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(keepsake.KeepsakeError) as ei:
        kt.save_file({"w": torch.ones(3)}, f"s3://{bucket}/gone/w.keepsake")
    msg = str(ei.value)
    assert "cannot rename into place" in msg and f"s3://{bucket}/gone/w.keepsake" in msg and endpoint in msg, msg
    with pytest.raises(keepsake.KeepsakeError) as ei:
        keepsake.CheckpointManager(f"s3://{bucket}/gone", model=torch.nn.Linear(2, 2), preemption_signals=())
    assert f"s3://{bucket}/gone" in str(ei.value) and endpoint in str(ei.value), str(ei.value)

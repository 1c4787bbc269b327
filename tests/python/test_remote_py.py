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

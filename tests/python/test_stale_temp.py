"""A killed save's temporary file is removed by the next save from Python, as it is from C.

The extension passes the library a copy of the POSIX table (with or without fsync). The
library once recognised its own table by address, so a copy never cleaned up; it now decides
by the table's capabilities (io.h), and these tests hold that from the Python side.
"""
import os
import signal
import subprocess
import sys
import time

import torch

import keepsake
import keepsake.torch as kt

TEMP = ".ck.keepsake.tmp-Ab12Cd"  # the name a killed writer of ck.keepsake leaves


def _old(path, seconds=3600):
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_save_checkpoint_removes_a_killed_writers_temp_file(tmp_path):
    stale, young = tmp_path / TEMP, tmp_path / ".ck.keepsake.tmp-Young9"
    stale.write_bytes(b"half a checkpoint")
    young.write_bytes(b"a live writer's, maybe")
    _old(stale)
    model = torch.nn.Linear(3, 2)
    kt.save_checkpoint(tmp_path / "ck.keepsake", model=model)
    assert not stale.exists()  # abandoned and unlocked: removed
    assert young.exists()  # recent: may belong to a writer without a lock, so kept


def test_save_file_without_fsync_cleans_too(tmp_path):
    stale = tmp_path / ".w.keepsake.tmp-Zz99Yy"
    stale.write_bytes(b"x")
    _old(stale)
    kt.save_file({"w": torch.ones(2)}, tmp_path / "w.keepsake", fsync=False)
    assert not stale.exists()


def test_a_sigkilled_python_save_leaves_nothing_after_the_next_save(tmp_path):
    """A real kill: a child saves a large checkpoint in a loop and is SIGKILLed mid-write."""
    code = (
        "import sys, torch, keepsake.torch as kt\n"
        "big = {'w': torch.zeros(32 * 1024 * 1024 // 4)}\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    kt.save_file(big, sys.argv[1])\n"
    )
    target = tmp_path / "big.keepsake"
    left = []
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        deadline = time.time() + 20
        while time.time() < deadline and not any(n.startswith(".big.keepsake.tmp-") for n in os.listdir(tmp_path)):
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
        p.wait()
        left += [n for n in os.listdir(tmp_path) if n.startswith(".big.keepsake.tmp-")]
    assert left, "no save was caught mid-write (the test proves nothing)"
    for n in set(left):
        if (tmp_path / n).exists():
            _old(tmp_path / n)  # the age rule protects live writers; these are dead
    kt.save_file({"w": torch.ones(1)}, target)
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


def test_locked_and_not_durable_have_classes():
    assert keepsake.LockedError.status == 19 and issubclass(keepsake.LockedError, keepsake.KeepsakeError)
    assert keepsake.NotDurableError.status == 18 and issubclass(keepsake.NotDurableError, OSError)


def test_load_checkpoint_verifies_by_default(tmp_path):
    """A resume checks every checksum before it changes an object: one flipped data byte is refused."""
    model = torch.nn.Linear(4, 3)
    path = tmp_path / "ck.keepsake"
    kt.save_checkpoint(path, model=model)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last data byte (a model tensor)
    path.write_bytes(bytes(data))
    target = torch.nn.Linear(4, 3)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    try:
        kt.load_checkpoint(path, model=target)
    except keepsake.ChecksumError as e:
        assert "ck.keepsake" in str(e)
    else:
        raise AssertionError("a damaged checkpoint loaded without verify=")
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # nothing changed
    kt.load_checkpoint(path, model=target, verify=False)  # the opt-out still loads it


def test_load_report_prints_with_the_c_printer(tmp_path):
    """str(LoadReport) is ks_load_report_print's text: item lines by kind, then the summary line."""
    import re
    import torchmetrics as tm
    path = tmp_path / "ck.keepsake"
    kt.save_checkpoint(path, model=torch.nn.Linear(2, 2), train_metrics={"MeanMetric": tm.MeanMetric()})
    rep = kt.load_checkpoint(path, model=torch.nn.Linear(2, 2), train_metrics={"SumMetric": tm.SumMetric()})
    lines = str(rep).split("\n")
    assert lines[-1].startswith("  summary: ") and lines[-1].endswith("mismatched"), lines[-1]
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (\w+)", lines[-1]))
    assert counts == {k: len(rep.of(k)) for k in ("loaded", "migrated", "converted", "skipped", "missing",
                                                  "mismatched")}
    kinds = [re.match(r"  (\w+) +(\S.*?): (.*)$", ln).group(1) for ln in lines[:-1]]
    assert kinds == sorted(kinds, key=["loaded", "migrated", "converted", "skipped", "missing",
                                       "mismatched"].index)  # grouped by kind, in the C order
    assert "missing" in kinds and "skipped" in kinds

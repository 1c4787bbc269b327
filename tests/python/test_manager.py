"""keepsake.CheckpointManager: the C checkpoint manager from a PyTorch training loop.

Triggers, retention, autoresume past a corrupt newest checkpoint, the run directory lock,
background saves that snapshot the state, the save-failure policy, preemption by SIGTERM and a
SIGKILL during a background write.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torchmetrics as tm

import keepsake
import keepsake.torch as kt


def make_run(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    return model, opt, tm.MeanMetric(), keepsake.Timestamp()


def train_batch(model, opt, metric, ts, value):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    metric.update(value)
    metric.compute()
    ts.batch += 1
    ts.batch_in_epoch += 1
    ts.sample += 8


def names(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".keepsake"))


def test_batch_trigger_and_keep_last(tmp_path):
    model, opt, m, ts = make_run()
    with keepsake.CheckpointManager(tmp_path, model=model, optimizers=opt, train_metrics={"m": m}, timestamp=ts,
                                    save_every="3ba", keep_last=2) as mgr:
        saved = []
        for b in range(10):
            train_batch(model, opt, m, ts, 1.0)
            p = mgr.step()
            if p:
                saved.append(os.path.basename(p))
    assert saved == ["ep0-ba3.keepsake", "ep0-ba6.keepsake", "ep0-ba9.keepsake"]
    assert names(tmp_path) == ["ep0-ba6.keepsake", "ep0-ba9.keepsake"]
    assert os.readlink(tmp_path / "latest") == "ep0-ba9.keepsake"


def test_epoch_and_clock_triggers(tmp_path):
    model, opt, m, ts = make_run()
    with keepsake.CheckpointManager(tmp_path / "ep", model=model, timestamp=ts, save_every="2ep") as mgr:
        for e in range(4):
            train_batch(model, opt, m, ts, 1.0)
            assert mgr.step() is None  # a batch end never satisfies an epoch interval
            ts.epoch += 1
            ts.batch_in_epoch = 0
            mgr.step(epoch_end=True)
    assert names(tmp_path / "ep") == ["ep2-ba2.keepsake", "ep4-ba4.keepsake"]
    with keepsake.CheckpointManager(tmp_path / "clock", model=model, timestamp=ts, save_every="1000ba",
                                    save_every_seconds=1.0) as mgr:
        assert mgr.step() is None  # the clock starts when the manager is made
        time.sleep(1.1)
        assert mgr.step() is not None


def test_keep_best_survives_a_resume_and_a_new_run_directory(tmp_path):
    vals = [0.5, 0.9, 0.2, 0.95, 0.1, 0.3]
    model, opt, m, ts = make_run()
    run = tmp_path / "run"

    def manager(path):
        return keepsake.CheckpointManager(path, model=model, optimizers=opt, train_metrics={"m": m}, timestamp=ts,
                                          save_every="1ba", keep_last=1, keep_best=2,
                                          best_metric="train_metrics/m", best_mode="max")
    mgr = manager(run)
    for i, v in enumerate(vals):
        if i == 3:  # a resume: a new manager, nothing carried over but the files
            mgr.close()
            mgr = manager(run)
        m.reset()
        train_batch(model, opt, m, ts, v)
        mgr.step()
    mgr.close()
    # kept: the newest (batch 6) and the two best by the stored value (0.95 at 4, 0.9 at 2)
    assert names(run) == ["ep0-ba2.keepsake", "ep0-ba4.keepsake", "ep0-ba6.keepsake"]


def test_keep_best_naming_no_metric_of_the_program_is_refused(tmp_path):
    model, opt, m, ts = make_run()
    with pytest.raises(keepsake.InvalidError) as e:
        keepsake.CheckpointManager(tmp_path / "run", model=model, train_metrics={"acc": m},
                                   eval_metrics={"val": {"loss": tm.MeanMetric()}}, timestamp=ts,
                                   keep_best=1, best_metric="train_metrics/accuracy")
    assert "'train_metrics/accuracy'" in str(e.value)
    assert "train_metrics/acc, eval_metrics/val/loss" in str(e.value)  # what exists
    assert not (tmp_path / "run").exists()
    with pytest.raises(keepsake.InvalidError, match="no metrics"):
        keepsake.CheckpointManager(tmp_path / "run", model=model, timestamp=ts, keep_best=1,
                                   best_metric="train_metrics/acc")
    for spelling in ("train_metrics/acc", "train/acc", "val/loss", "eval_metrics/val/loss"):
        keepsake.CheckpointManager(tmp_path / "run", train_metrics={"acc": m},
                                   eval_metrics={"val": {"loss": tm.MeanMetric()}}, timestamp=ts, keep_best=1,
                                   best_metric=spelling, preemption_signals=()).close()


def test_keep_best_warns_once_when_the_metric_was_never_computed(tmp_path, capfd):
    model, opt, m, ts = make_run()
    with keepsake.CheckpointManager(tmp_path, model=model, train_metrics={"acc": m}, timestamp=ts, save_every="1ba",
                                    keep_best=1, best_metric="train_metrics/acc") as mgr:
        for _ in range(3):
            m.update(1.0)  # updated, never computed: _computed is None in every checkpoint
            ts.batch += 1
            assert mgr.step() is not None
    err = capfd.readouterr().err
    assert err.count("keep_best cannot rank") == 1, err
    assert "ep0-ba1.keepsake by 'train_metrics/acc': the metric was never computed" in err
    with keepsake.CheckpointManager(tmp_path / "computed", model=model, train_metrics={"acc": m}, timestamp=ts,
                                    save_every="1ba", keep_best=1, best_metric="train_metrics/acc") as mgr:
        for v in (0.1, 0.2):
            train_batch(model, opt, m, ts, v)
            mgr.step()
    assert "keep_best" not in capfd.readouterr().err


def test_save_every_takes_an_int_of_batches(tmp_path):
    model, opt, m, ts = make_run()
    with keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts, save_every=2) as mgr:
        saved = []
        for b in range(5):
            train_batch(model, opt, m, ts, 1.0)
            saved.append(mgr.step())
    assert [p and os.path.basename(p) for p in saved] == [None, "ep0-ba2.keepsake", None, "ep0-ba4.keepsake", None]
    with pytest.raises(TypeError):
        keepsake.CheckpointManager(tmp_path / "b", timestamp=ts, save_every=True)
    with pytest.raises(keepsake.InvalidError):
        keepsake.CheckpointManager(tmp_path / "c", timestamp=ts, save_every=0)


def test_a_timestamp_that_never_advances_is_warned_about_once(tmp_path, capfd):
    model, opt, m, ts = make_run()
    with keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts, save_every="2ba") as mgr:
        for _ in range(4):  # a healthy loop says nothing
            train_batch(model, opt, m, ts, 1.0)
            mgr.step()
        assert capfd.readouterr().err == ""
        ts.batch += 1
        for _ in range(10):  # the loop forgot ts.batch += 1
            assert mgr.step() is None
    err = capfd.readouterr().err
    assert err.count("saw the same timestamp") == 1, err
    assert "3 batch ends in a row saw the same timestamp (epoch 0, batch 5)" in err


def test_autoresume_skips_a_corrupt_newest_and_restores_everything(tmp_path):
    model, opt, m, ts = make_run()
    with keepsake.CheckpointManager(tmp_path, model=model, optimizers=opt, train_metrics={"m": m}, timestamp=ts,
                                    save_every="2ba") as mgr:
        for b in range(4):
            train_batch(model, opt, m, ts, float(b))
            if mgr.step() and b == 1:
                good = ({k: v.clone() for k, v in model.state_dict().items()}, m.compute().clone())
    newest = tmp_path / "ep0-ba4.keepsake"
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0x40
    newest.write_bytes(bytes(data))
    m2, o2, me2, ts2 = make_run(seed=1)
    with keepsake.CheckpointManager(tmp_path, model=m2, optimizers=o2, train_metrics={"m": me2},
                                    timestamp=ts2) as mgr:
        assert mgr.autoresume() is True
        assert mgr.skipped == 1
    assert ts2.batch == 2
    assert all(torch.equal(v, m2.state_dict()[k]) for k, v in good[0].items())
    assert torch.equal(me2.compute(), good[1])
    assert (tmp_path / "ep0-ba4.keepsake.corrupt").exists() and not newest.exists()
    assert len(o2.state) == 2  # AdamW moments came back for both parameters


def test_nothing_to_resume(tmp_path):
    model, _, _, ts = make_run()
    with keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts) as mgr:
        assert mgr.autoresume() is False


def test_a_second_manager_is_refused_and_deletes_nothing(tmp_path):
    model, opt, m, ts = make_run()
    a = keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts, save_every="1ba", keep_last=1)
    train_batch(model, opt, m, ts, 1.0)
    a.step()
    before = names(tmp_path)
    with pytest.raises(keepsake.LockedError) as e:
        keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts, keep_last=1)
    assert f"pid {os.getpid()} on host" in str(e.value)
    assert names(tmp_path) == before
    a.close()
    keepsake.CheckpointManager(tmp_path, model=model).close()  # free again once closed


def test_background_save_snapshots_the_state(tmp_path):
    """Tensors, optimizer state and metric states changed right after save(blocking=False)
    returns do not reach the file."""
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    m = tm.SumMetric()
    m.update(torch.tensor(3.0))
    ts = keepsake.Timestamp(batch=7)
    with keepsake.CheckpointManager(tmp_path, model=model, optimizers=opt, train_metrics={"m": m},
                                    timestamp=ts) as mgr:
        want_w = model.weight.detach().clone()
        want_avg = opt.state[model.weight]["exp_avg"].clone()
        path = mgr.save(blocking=False)
        with torch.no_grad():  # at once, while the write may still run
            model.weight.fill_(-1.0)
            opt.state[model.weight]["exp_avg"].fill_(-2.0)
        m.update(torch.tensor(100.0))
        ts.batch = 99
        mgr.wait()
    sd = kt.load_file(path, backend="read", verify=True)
    assert torch.equal(sd["state/model/weight"], want_w)
    assert torch.equal(sd["state/optimizers/AdamW/state/0/exp_avg"], want_avg)
    assert float(sd["state/train_metrics/m/state_dict/sum_value"]) == 3.0
    assert os.path.basename(path) == "ep0-ba7.keepsake"


def test_reserve_takes_the_staging_before_the_first_background_save(tmp_path):
    """reserve() allocates and touches the background saves' staging: the first
    save(blocking=False) then copies into memory that is already there (few page faults, where
    without it every page of a fresh buffer as large as the state faults in), and its file is
    the state's."""
    import resource

    def faults_of_first_save(run, reserve):
        model = torch.nn.Linear(2048, 4096, bias=False)  # 32 MiB: 8192 pages
        with keepsake.CheckpointManager(run, model=model, rng=False, async_save=True,
                                        preemption_signals=()) as mgr:
            if reserve:
                mgr.reserve()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            path = mgr.save(blocking=False)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            mgr.wait()
            mgr.reserve()  # again, for the same state (and after a save): the buffer is kept
            mgr.save(blocking=False)
        sd = kt.load_file(path, backend="read", verify=True)
        assert torch.equal(sd["state/model/weight"], model.weight.detach())
        return faults

    pages = 2048 * 4096 * 4 // resource.getpagesize()
    cold = faults_of_first_save(tmp_path / "cold", False)
    warm = faults_of_first_save(tmp_path / "warm", True)
    assert cold > pages // 2, (cold, pages)
    assert warm < pages // 8, (warm, pages)
    print(f"first background save of 32 MiB: {cold} page faults cold, {warm} after reserve()")


def test_save_failure_policies(tmp_path):
    model, opt, m, ts = make_run()
    (tmp_path / "ep0-ba1.keepsake").mkdir()  # the first save's destination is a directory: it fails
    with keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts, save_every="1ba",
                                    on_save_error="warn") as mgr:
        train_batch(model, opt, m, ts, 1.0)
        assert mgr.step() is None and mgr.save_errors == 1  # reported, training goes on
        train_batch(model, opt, m, ts, 1.0)
        assert mgr.step().endswith("ep0-ba2.keepsake")  # the next trigger saves
    ts.batch = 0
    with keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts, save_every="1ba") as mgr:
        train_batch(model, opt, m, ts, 1.0)
        with pytest.raises(keepsake.InvalidError):
            mgr.step()


CHILD = textwrap.dedent("""
    import os, signal, sys, time, torch, keepsake
    model = torch.nn.Linear(512, 512)
    ts = keepsake.Timestamp()
    mgr = keepsake.CheckpointManager(sys.argv[1], model=model, timestamp=ts, save_every=sys.argv[2],
                                     async_save=True, keep_last=3)
    print("ready", flush=True)
    while True:
        with torch.no_grad():
            model.weight.add_(1.0)
        ts.batch += 1
        mgr.step()
        time.sleep(0.002)
""")


def run_child(run, every):
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(run), every], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    return p


def test_sigterm_saves_at_the_next_step_and_exits_75(tmp_path):
    p = run_child(tmp_path, "1000000ba")
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == keepsake.EXIT_PREEMPTED
    (ck,) = names(tmp_path)
    keepsake.verify(tmp_path / ck)
    assert os.readlink(tmp_path / "latest") == ck
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


def run_signal_program(tmp_path, body):
    """Runs `body` in a fresh interpreter (run directory in `run`); its exit status and stdout lines."""
    code = "import os, signal, sys, time, keepsake\nrun = sys.argv[1]\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout.split(), r.stderr


def test_after_close_sigterm_ends_the_process_again(tmp_path):
    rc, out, err = run_signal_program(tmp_path, """
        with keepsake.CheckpointManager(run, timestamp=keepsake.Timestamp()) as mgr:
            pass
        print("closed", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        print("survived", flush=True)
    """)
    assert (rc, out) == (-signal.SIGTERM, ["closed"]), err


def test_the_programs_handler_runs_while_open_and_is_back_after_close(tmp_path):
    rc, out, err = run_signal_program(tmp_path, """
        calls = []
        signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
        ts = keepsake.Timestamp()
        mgr = keepsake.CheckpointManager(run, timestamp=ts, save_every="1000ba")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("open", len(calls), flush=True)
        ts.batch += 1
        try:
            mgr.step()
        except keepsake.Preempted as e:  # the manager acted on it too
            print("preempted", e.code, flush=True)
        mgr.close()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("closed", len(calls), flush=True)
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    """)
    assert rc == 0, err
    assert out == ["open", "1", "preempted", "75", "closed", "2"], err


def test_a_signal_no_open_manager_received_is_not_acted_on(tmp_path):
    rc, out, err = run_signal_program(tmp_path, """
        signal.signal(signal.SIGTERM, lambda s, f: None)  # the process lives through SIGTERM
        ts = keepsake.Timestamp()
        with keepsake.CheckpointManager(run, timestamp=ts, save_every="1000ba") as mgr:
            os.kill(os.getpid(), signal.SIGTERM)  # received while open, never stepped on
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)  # received while no manager is open
        time.sleep(0.2)
        for i in range(3):
            with keepsake.CheckpointManager(run, timestamp=ts, save_every="1000ba") as mgr:
                ts.batch += 1
                print("step", mgr.step(), flush=True)  # never Preempted (exit 75)
    """)
    assert (rc, out) == (0, ["step", "None"] * 3), err
    assert os.listdir(tmp_path / "run") == [".keepsake.lock"]


def test_two_open_managers_share_the_handler(tmp_path):
    rc, out, err = run_signal_program(tmp_path, """
        a = keepsake.CheckpointManager(run + "/a", timestamp=keepsake.Timestamp())
        ts = keepsake.Timestamp()
        b = keepsake.CheckpointManager(run + "/b", timestamp=ts, save_every="1000ba")
        a.close()  # b still listens
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        ts.batch += 1
        try:
            b.step()
        except keepsake.Preempted as e:
            print("preempted", os.path.basename(e.path), flush=True)
        b.close()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    """)
    assert (rc, out) == (-signal.SIGTERM, ["preempted", "ep0-ba1.keepsake"]), err


WRITER = textwrap.dedent("""
    import sys, torch, keepsake
    model = torch.nn.Linear(64, 64)
    ts = keepsake.Timestamp()
    with keepsake.CheckpointManager(sys.argv[1], model=model, timestamp=ts, save_every="1ba", keep_last=1,
                                    rng=False, preemption_signals=()) as mgr:
        while True:  # every step saves, and retention deletes the checkpoint `latest` named before
            with torch.no_grad():
                model.weight.fill_(float(ts.batch + 1))
            ts.batch += 1
            mgr.step()
            if ts.batch == 2:
                print("ready", flush=True)
""")


def test_readers_of_latest_beside_a_run_never_fail(tmp_path):
    import threading
    run = tmp_path / "run"
    w = subprocess.Popen([sys.executable, "-c", WRITER, str(run)], stdout=subprocess.PIPE)
    try:
        assert w.stdout.readline().strip() == b"ready"
        failures, loads = [], []
        first = int(os.readlink(run / "latest").split("ba")[1].split(".")[0])

        def reader(kind):
            model = torch.nn.Linear(64, 64)
            for _ in range(150):
                try:
                    if kind == "checkpoint":
                        kt.load_checkpoint(run / "latest", model=model, rng=False)
                        w0 = model.weight[0, 0].item()
                    else:
                        with keepsake.safe_open(run / "latest", framework="pt") as f:
                            w0 = f.get_tensor("state/model/weight")[0, 0].item()
                    assert w0 >= 1.0  # a whole checkpoint of the run
                    loads.append(w0)
                except Exception as e:  # noqa: BLE001 - every failure counts
                    failures.append(f"{kind}: {type(e).__name__}: {e}")
        threads = [threading.Thread(target=reader, args=(k,)) for k in ("checkpoint", "checkpoint", "safe_open")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert w.poll() is None, "the writer stopped: the readers raced nothing"
        saves = int(os.readlink(run / "latest").split("ba")[1].split(".")[0]) - first
    finally:
        w.kill()
        w.wait()
    assert failures == [], failures[:5]
    assert len(loads) == 450
    assert saves >= 3, f"only {saves} saves beside the readers: the test proves little"
    print(f"{len(loads)} loads of latest beside {saves} saves, {len(failures)} failures")


def test_sigkill_during_background_writes_loses_nothing_committed(tmp_path):
    for trial in range(3):
        run = tmp_path / f"r{trial}"
        p = run_child(run, "5ba")
        time.sleep(0.4 + 0.15 * trial)
        p.kill()
        p.wait()
        kept = names(run)
        assert kept, "nothing was committed before the kill (the test proves nothing)"
        for n in kept:
            keepsake.verify(run / n)  # every file under a checkpoint name is complete
        latest = os.readlink(run / "latest")
        assert latest in kept
        model = torch.nn.Linear(512, 512)
        ts = keepsake.Timestamp()
        with keepsake.CheckpointManager(run, model=model, timestamp=ts) as mgr:  # the dead run's lock is gone
            assert mgr.autoresume()
        assert f"ep0-ba{ts.batch}.keepsake" == max(kept, key=lambda n: int(n.split("ba")[1].split(".")[0]))


def test_interpreter_exit_finishes_a_background_save(tmp_path):
    code = textwrap.dedent("""
        import sys, torch, keepsake
        model = torch.nn.Linear(2048, 2048)
        mgr = keepsake.CheckpointManager(sys.argv[1], model=model, timestamp=keepsake.Timestamp(batch=3))
        mgr.save(blocking=False)  # then exit at once, never closing the manager
    """)
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    assert names(tmp_path) == ["ep0-ba3.keepsake"]
    keepsake.verify(tmp_path / "ep0-ba3.keepsake")
    assert os.readlink(tmp_path / "latest") == "ep0-ba3.keepsake"
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs (root only: skipped elsewhere, with the reason)."""
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.parametrize("blocking", [True, False])
def test_a_full_disk_loses_nothing_saved(small_fs, blocking):
    """ENOSPC: the failed save raises (or, with on_save_error='warn', is reported and training goes
    on); the checkpoint saved before stays whole and `latest` points at it; no temp file is left."""
    model = torch.nn.Linear(1024, 768)  # 3 MiB of weights: one checkpoint fits, a second beside it does not
    ts = keepsake.Timestamp()
    with keepsake.CheckpointManager(small_fs / "run", model=model, timestamp=ts, keep_last=1, save_every="1ba",
                                    async_save=not blocking, on_save_error="warn") as mgr:
        ts.batch = 1
        mgr.save(blocking=True)
        ts.batch = 2
        mgr.step()  # the second save runs out of space
        if not blocking:  # a background failure surfaces at the next call, never swallowed
            with pytest.raises(keepsake.KeepsakeError) as e:
                mgr.wait()
            assert "No space left" in str(e.value)
        else:
            assert mgr.save_errors == 1
        with pytest.raises(keepsake.KeepsakeError):
            mgr.save(blocking=True)  # policy "raise" for an explicit save
    run = small_fs / "run"
    assert names(run) == ["ep0-ba1.keepsake"]
    keepsake.verify(run / "ep0-ba1.keepsake")
    assert os.readlink(run / "latest") == "ep0-ba1.keepsake"
    assert [n for n in os.listdir(run) if ".tmp-" in n] == []


def test_one_background_save_in_flight_and_the_busy_policy(tmp_path):
    model = torch.nn.Linear(2048, 2048)  # 16 MiB: the first write is still running when the second comes
    ts = keepsake.Timestamp(batch=1)
    with keepsake.CheckpointManager(tmp_path / "fail", model=model, timestamp=ts, when_busy="fail") as mgr:
        mgr.save(blocking=False)
        refused = 0
        for _ in range(50):  # a second one while the first is in flight is refused, never queued
            try:
                ts.batch += 1
                mgr.save(blocking=False)
                break
            except keepsake.StateError:
                refused += 1
        mgr.wait()
    assert refused >= 1
    with keepsake.CheckpointManager(tmp_path / "wait", model=model, timestamp=ts) as mgr:
        for _ in range(3):
            ts.batch += 1
            mgr.save(blocking=False)  # waits for the previous one: all three land
    assert len(names(tmp_path / "wait")) == 3
    with pytest.raises(ValueError):
        keepsake.CheckpointManager(tmp_path / "bad", model=model, when_busy="queue")


def scalars(path):
    """The scalar entries of a checkpoint (load_file gives the tensors)."""
    return dict(keepsake._keepsake.Reader(str(path), verify=True, backend="read").scalars())


VALUES = [0.9, 0.7, 0.72, 0.65, 0.66, 0.67, 0.647, 0.70, 0.71, 0.72, 0.73]  # a validation loss, epoch by epoch


def early_run(run, stop_after=None):
    """Epochs of a run that saves at each epoch end and stops early on VALUES; returns (epoch it
    stopped at, the stopper) or, with stop_after, ends there as a killed run would."""
    model = torch.nn.Linear(2, 2)
    ts = keepsake.Timestamp()
    es = keepsake.EarlyStopping("eval_metrics/val/loss", mode="min", patience=3, min_delta=0.005)
    with keepsake.CheckpointManager(run, model=model, timestamp=ts, callbacks={"EarlyStopping": es}, rng=False,
                                    save_every="1ep", preemption_signals=()) as mgr:
        mgr.autoresume()
        for epoch in range(ts.epoch, len(VALUES)):
            stop = es.update(VALUES[epoch], epoch)
            ts.epoch += 1
            mgr.step(epoch_end=True)
            if stop or (stop_after is not None and epoch == stop_after):
                return epoch, es
    return None, es


def test_early_stopping_resumed_mid_patience_stops_at_the_same_epoch(tmp_path):
    whole, es_whole = early_run(tmp_path / "whole")
    assert whole == 6 and es_whole.should_stop and es_whole.best_score == 0.65  # 0.647 is not 0.005 better
    early_run(tmp_path / "cut", stop_after=4)  # ends with a wait count of 1
    cut, es_cut = early_run(tmp_path / "cut")
    assert cut == whole and es_cut.state_dict() == es_whole.state_dict()
    saved = scalars(tmp_path / "cut" / "ep5-ba0.keepsake")
    assert saved["state/callbacks/EarlyStopping/wait_count"] == 1
    assert saved["state/callbacks/EarlyStopping/monitor"] == "eval_metrics/val/loss"
    other = keepsake.EarlyStopping("eval_metrics/val/acc", mode="max")
    before = other.state_dict()
    with pytest.raises(keepsake.MismatchError, match="monitor"):
        kt.load_checkpoint(tmp_path / "cut" / "ep5-ba0.keepsake", model=torch.nn.Linear(2, 2),
                           callbacks={"EarlyStopping": other}, rng=False)
    assert other.state_dict() == before  # unchanged
    with pytest.raises(ValueError):
        keepsake.EarlyStopping("x", mode="sideways")
    with pytest.raises(keepsake.InvalidError):
        keepsake.EarlyStopping("x", patience=0)


@pytest.mark.skipif(not os.environ.get("KS_DIGITS"), reason="the C demo (KS_DIGITS) is not built")
def test_early_stopping_reads_what_the_c_demo_saved(tmp_path):
    """A C program's ks_early_stop (keepsake-digits --early-stop) loads into keepsake.EarlyStopping:
    one saved form, one rule."""
    run = tmp_path / "c-run"
    r = subprocess.run([os.environ["KS_DIGITS"], "--run-dir", str(run), "--epochs", "2", "--save-interval", "1ep",
                        "--early-stop", "eval/MulticlassAccuracy:5:max"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ck = sorted(run.glob("*.keepsake"))[-1]
    saved = scalars(ck)
    es = keepsake.EarlyStopping("eval/MulticlassAccuracy", mode="max", patience=5)
    es.load_state_dict({k.rsplit("/", 1)[1]: v for k, v in saved.items() if k.startswith("state/callbacks/EarlyStopping/")})
    assert es.best_score == saved["state/callbacks/EarlyStopping/best_score"] and es.best_score > 0
    assert es.wait_count == saved["state/callbacks/EarlyStopping/wait_count"] and es.stopped_epoch == -1


def test_the_extension_image_is_held_while_a_background_save_may_write_from_it(tmp_path):
    """keepsake._keepsake.Image (ks_image): a layout-only image says how much memory a state
    needs; caller memory smaller than that is refused; Manager.place gives each tensor's offset
    there; an image a background save went through cannot be closed (the library may still write
    from it) until the manager saves through another or is closed; the file is the state's."""
    from keepsake._core import native as _n, tensors as _tensors
    keep = []
    w = torch.arange(1 << 16, dtype=torch.float32)
    entries = [_tensors.torch_entry("w", w, keep)]
    need = _n.Image(entries, layout_only=True).need
    assert need % 4096 == 0 and need >= w.numel() * 4 + (1 << 20)  # the data, and room for a header that grows
    buf = torch.zeros(need + 4096, dtype=torch.uint8)
    addr = buf.data_ptr() + (-buf.data_ptr() % 4096)
    with pytest.raises(keepsake.LimitError):
        _n.Image(entries, None, None, addr, 4096, buf)
    with pytest.raises(keepsake.InvalidError):  # direct I/O needs aligned memory
        _n.Image(entries, None, None, addr + 64, need, buf)
    im = _n.Image(entries, None, None, addr, need, buf)
    mgr = _n.Manager(str(tmp_path), lock="off")
    got, offsets = mgr.place(im, entries)
    assert got == need and set(offsets) == {"w"} and offsets["w"] % 8 == 0
    placed = buf[addr - buf.data_ptr() + offsets["w"]:][:w.numel() * 4].view(torch.float32)
    placed.copy_(w)  # where the save finds it: copied no further
    path = mgr.save([("w",) + entries[0][1:3] + (placed.data_ptr(), entries[0][4])], blocking=False, image=im)
    with pytest.raises(keepsake.StateError):
        im.close()
    mgr.wait()
    with pytest.raises(keepsake.StateError):  # held until the next save or close
        im.close()
    mgr.close()
    im.close()
    assert im.closed
    with pytest.raises(keepsake.StateError):
        _n.Manager(str(tmp_path / "other"), lock="off").save(entries, image=im)
    assert torch.equal(kt.load_file(path, verify=True)["w"], w)

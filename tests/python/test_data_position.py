"""Exact data position across a real kill: a torchdata StatefulDataLoader(shuffle=True,
num_workers=2), reshuffled every epoch, is SIGKILLed mid-epoch after a checkpoint, and a fresh
process resumes from it. The batches it then trains on (their sample indices, in order) and the
final model are exactly those of a run that never stopped: through save_checkpoint /
load_checkpoint(dataset_state=), through CheckpointManager(dataset_state=) with autoresume, and
through Lightning with KeepsakeCheckpointIO, KeepsakeMetrics and KeepsakeDataPosition, from a
checkpoint mid-epoch, at an epoch's last batch, at an epoch's end, and with a
configure_optimizers that reads trainer.estimated_stepping_batches. A last test shows what
Lightning 2.6 does alone from an epoch-end checkpoint: the next epoch replays the first epoch's
shuffle."""
import json
import shutil
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

import keepsake.torch as kt  # noqa: E402

# 24 samples, 4 a batch: 6 batches an epoch, 3 epochs. Log lines are [batches done before this
# batch, its sample indices].
CHILD = r'''
import json, os, signal, sys
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
import keepsake, keepsake.torch as kt

kind, role, d = sys.argv[1], sys.argv[2], sys.argv[3]
ckpt, seed, flags = (sys.argv[4], int(sys.argv[5]), sys.argv[6:]) if role == "resume" else (None, 0, sys.argv[4:])
EPOCHS, KILL = 3, 10


class Samples(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor(i), torch.tensor([i / 24.0, 1.0 - i / 24.0, (i % 5) / 5.0])


def loader():
    return StatefulDataLoader(Samples(), batch_size=4, shuffle=True, num_workers=2)


def loss_of(model, idx, x, log, done):
    log.write(json.dumps([done, idx.tolist()]) + "\n")
    log.flush()
    return (model(x).squeeze(1) - x[:, 0]).pow(2).mean()


def save_model(model, name):
    kt.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(d, name + ".keepsake"))


def kill_at(done):
    if role == "run" and done == KILL:
        os.kill(os.getpid(), signal.SIGKILL)


if kind in ("torch", "manager"):
    def objects(s):
        torch.manual_seed(s)
        model = torch.nn.Linear(3, 1)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), loader(), keepsake.Timestamp()

    def train(model, opt, dl, ts, log, after_batch=lambda: None, after_epoch=lambda: None):
        while ts.epoch < EPOCHS:
            for idx, x in dl:
                loss = loss_of(model, idx, x, log, ts.batch)
                opt.zero_grad()
                loss.backward()
                opt.step()
                ts.batch += 1
                ts.batch_in_epoch += 1
                after_batch()
            ts.epoch, ts.batch_in_epoch = ts.epoch + 1, 0
            after_epoch()

    if role == "run":  # the run that never stops, then the one that is killed, from the same seed
        model, opt, dl, ts = objects(0)
        train(model, opt, dl, ts, open(os.path.join(d, "ref.log"), "w"))
        save_model(model, "ref")
    model, opt, dl, ts = objects(seed)
    log = open(os.path.join(d, "run.log" if role == "run" else "resumed.log"), "w")
    if kind == "torch":
        def after_batch():
            if role == "run" and ts.batch % 3 == 0:  # batches 3, 6 (an epoch's last) and 9
                kt.save_checkpoint(os.path.join(d, f"ck-{ts.batch}.keepsake"), model=model, optimizers=opt,
                                   timestamp=ts, dataset_state={"loader": dl}, fsync=False)
            kill_at(ts.batch)
        if role == "resume":
            kt.load_checkpoint(ckpt, model=model, optimizers=opt, timestamp=ts, dataset_state={"loader": dl})
        train(model, opt, dl, ts, log, after_batch)
    else:
        with keepsake.CheckpointManager(os.path.join(d, "run"), model=model, optimizers=opt, timestamp=ts,
                                        dataset_state={"loader": dl}, save_every="4ba") as mgr:
            if role == "resume":
                assert mgr.autoresume()
                print("resumed from", os.path.basename(mgr.last_report.path))

            def after_batch():
                mgr.step()
                kill_at(ts.batch)
            train(model, opt, dl, ts, log, after_batch, lambda: mgr.step(epoch_end=True))
    save_model(model, "resumed")
else:
    import lightning.pytorch as pl
    import torchmetrics
    from lightning.pytorch.callbacks import ModelCheckpoint
    from keepsake.lightning import KeepsakeCheckpointIO, KeepsakeDataPosition, KeepsakeMetrics

    class Module(pl.LightningModule):
        def __init__(self, log):
            super().__init__()
            self.net = torch.nn.Linear(3, 1)
            self.mean_loss = torchmetrics.MeanMetric()  # its states come back through KeepsakeMetrics
            self.log_file = log

        def training_step(self, batch, i):
            idx, x = batch
            loss = loss_of(self.net, idx, x, self.log_file, self.global_step)
            self.mean_loss.update(loss.detach())
            return loss

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            if "esb" not in flags:
                return opt
            # OneCycleLR's usual setup reads the number of steps, which builds the loader early
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2,
                                                        total_steps=self.trainer.estimated_stepping_batches)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def train_dataloader(self):
            return loader()

    class Kill(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            kill_at(trainer.global_step)

    def fit(name, root, checkpoints, ckpt_path=None):
        pl.seed_everything(seed, verbose=False)
        module = Module(open(os.path.join(d, name + ".log"), "w"))
        callbacks = [KeepsakeMetrics()] + ([] if "plain" in flags else [KeepsakeDataPosition()])
        if checkpoints:  # every 3 steps (3, 6: an epoch's last batch, 9) and at each epoch's end
            callbacks += [Kill(), ModelCheckpoint(dirpath=os.path.join(root, "ck"), every_n_train_steps=3,
                                                  save_top_k=-1, save_last=True, filename="{step}"),
                          ModelCheckpoint(dirpath=os.path.join(root, "ck-epoch"), every_n_epochs=1,
                                          save_top_k=-1, filename="end-{epoch}")]
        trainer = pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, enable_checkpointing=checkpoints,
                             plugins=[KeepsakeCheckpointIO(fsync=False)], callbacks=callbacks)
        trainer.fit(module, ckpt_path=ckpt_path)
        save_model(module, name)
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump({"mean_loss": module.mean_loss.compute().item(), "step": trainer.global_step}, f)

    if role == "run":
        fit("ref", d, False)
        fit("run", d, True)
    else:  # the checkpoint directories were copied to d: "last" is found there
        fit("resumed", d, True, ckpt_path=ckpt)
'''


def _child(d, *args, killed=False):
    script = d.parent / "child.py"
    if not script.exists():
        script.write_text(CHILD)
    r = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=180)
    if killed:
        assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    else:
        assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _log(path):
    return [tuple(json.loads(line)) for line in open(path)]


def _model(path):
    return kt.load_file(str(path))


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """kind -> the directory of a run of that kind killed after 10 batches (mid-epoch 2), whose
    process first ran the same training uninterrupted (ref.log, ref.keepsake); made once."""
    _runs = {}

    def get(kind, *flags):
        key = (kind,) + flags
        if key not in _runs:
            d = tmp_path_factory.mktemp("-".join(key))
            _child(d, kind, "run", d, *flags, killed=True)
            ref, run = _log(d / "ref.log"), _log(d / "run.log")
            assert len(ref) == 18 and [s for s, _ in ref] == list(range(18))
            assert run == ref[:10]  # the killed run did what the uninterrupted one did, until killed
            # every epoch is a new permutation of the 24 samples
            epochs = [sum((b for _, b in ref[6 * e:6 * e + 6]), []) for e in range(3)]
            assert all(sorted(e) == list(range(24)) for e in epochs) and len({tuple(e) for e in epochs}) == 3
            _runs[key] = d
        return _runs[key]
    return get


def _resume(killed, tmp_path, kind, ckpt, *flags, seed=1):
    """Resumes a copy of the killed run's directory from `ckpt` in a fresh process seeded
    otherwise (the checkpoint decides); returns (ref log, resumed log, stdout, directory)."""
    d = tmp_path / "resume"
    shutil.copytree(killed, d)
    out = _child(d, kind, "resume", d, ckpt if ckpt in ("last", "-") else d / ckpt, seed, *flags)
    return _log(d / "ref.log"), _log(d / "resumed.log"), out, d


def _assert_exact(ref, resumed, d, first):
    assert resumed and resumed[0][0] == first, resumed[:1]
    assert resumed == ref[first:]  # the same batches, in the same order, to the end
    a, b = _model(d / "ref.keepsake"), _model(d / "resumed.keepsake")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("ckpt,first", [("ck-9.keepsake", 9), ("ck-6.keepsake", 6)], ids=["mid-epoch", "epoch-end"])
def test_save_checkpoint_resumes_at_the_exact_sample(killed_run, tmp_path, ckpt, first):
    ref, resumed, _, d = _resume(killed_run("torch"), tmp_path, "torch", ckpt)
    _assert_exact(ref, resumed, d, first)


def test_checkpoint_manager_autoresume_resumes_at_the_exact_sample(killed_run, tmp_path):
    ref, resumed, out, d = _resume(killed_run("manager"), tmp_path, "manager", "-")
    assert "resumed from ep1-ba8.keepsake" in out  # the newest checkpoint: mid-epoch 2
    _assert_exact(ref, resumed, d, 8)


def _lightning_exact(killed_run, tmp_path, ckpt, first, *flags):
    pytest.importorskip("lightning.pytorch")
    ref, resumed, _, d = _resume(killed_run("lightning", *flags), tmp_path, "lightning", ckpt, *flags)
    _assert_exact(ref, resumed, d, first)
    r, s = (json.loads((d / f"{n}.json").read_text()) for n in ("ref", "resumed"))
    assert s == r and r["step"] == 18  # the mean loss metric too: its states and the batches both exact


@pytest.mark.parametrize("ckpt,first", [("last", 9), ("ck/step=6.ckpt", 6), ("ck-epoch/end-epoch=0.ckpt", 6)],
                         ids=["last-mid-epoch", "last-batch-of-an-epoch", "epoch-end"])
def test_lightning_resumes_at_the_exact_sample(killed_run, tmp_path, ckpt, first):
    _lightning_exact(killed_run, tmp_path, ckpt, first)


def test_lightning_with_estimated_stepping_batches_resumes_at_the_exact_sample(killed_run, tmp_path):
    _lightning_exact(killed_run, tmp_path, "last", 9, "esb")


def test_lightning_alone_replays_the_first_epochs_shuffle(killed_run, tmp_path):
    """What KeepsakeDataPosition fixes: Lightning 2.6.6 alone, resumed from an epoch-end checkpoint
    in a process seeded as the first, trains the second epoch on the first epoch's order."""
    pytest.importorskip("lightning.pytorch")
    ref, resumed, _, d = _resume(killed_run("lightning"), tmp_path, "lightning", "ck-epoch/end-epoch=0.ckpt",
                                 "plain", seed=0)
    assert [s for s, _ in resumed] == list(range(6, 18))
    assert [b for _, b in resumed[:6]] == [b for _, b in ref[:6]] != [b for _, b in ref[6:12]]

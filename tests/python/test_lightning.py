"""Lightning resume: stop mid-epoch, resume with ckpt_path=, end equal to an uninterrupted run."""
import os
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
torchmetrics = pytest.importorskip("torchmetrics")

import keepsake  # noqa: E402
from keepsake.lightning import METRICS_KEY, KeepsakeCheckpointIO, KeepsakeMetrics  # noqa: E402

N, BATCH, EPOCHS, STOP_AT = 96, 8, 3, 17  # 12 batches an epoch; stop in the middle of the 2nd epoch


class Batches:
    """A deterministic, stateful loader: Lightning saves its position and restores it on resume."""

    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(N, 5, generator=g)
        self.y = (self.x[:, 0] + 0.5 * self.x[:, 1] > 0).long() + (self.x[:, 2] > 1).long()
        self.pos = 0

    def __len__(self):
        return N // BATCH

    def __iter__(self):
        start = self.pos if self.pos < len(self) else 0  # Lightning stops at len() without exhausting us
        for i in range(start, len(self)):
            self.pos = i + 1
            yield self.x[i * BATCH:(i + 1) * BATCH], self.y[i * BATCH:(i + 1) * BATCH]

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.pos = sd["pos"]


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
        self.loss_mean = torchmetrics.MeanMetric()   # never reset: accumulates over the whole run
        self.losses = torchmetrics.CatMetric()       # a list state
        self.epoch_acc = []

    def training_step(self, batch, i):
        x, y = batch
        out = self.net(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        self.acc.update(out, y)
        self.log("train_acc", self.acc, on_step=False, on_epoch=True)
        self.loss_mean.update(loss.detach())
        self.losses.update(loss.detach())
        return loss

    def on_train_epoch_end(self):
        self.epoch_acc.append(float(self.acc.compute()))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.05)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)}

    def train_dataloader(self):
        return self.loader

    def setup(self, stage):
        self.loader = Batches()


class StopAt(pl.Callback):
    def __init__(self, path):
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        if trainer.global_step == STOP_AT:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True  # the run ends here; only the checkpoint above carries on


def checkpoint_io(kind):
    """keepsake's CheckpointIO, Lightning's default (TorchCheckpointIO: None), or keepsake's behind
    Lightning's AsyncCheckpointIO (the write on a thread, after training has moved on)."""
    if kind == "keepsake":
        return KeepsakeCheckpointIO(fsync=False)
    if kind == "async":
        from lightning.pytorch.plugins.io import AsyncCheckpointIO
        return AsyncCheckpointIO(KeepsakeCheckpointIO(fsync=False))
    if kind == "keepsake-async":
        return KeepsakeCheckpointIO(async_save=True)
    return None


def trainer(tmp_path, callbacks=(), io="keepsake"):
    plugin = checkpoint_io(io)
    return pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      plugins=[plugin] if plugin else [], callbacks=[KeepsakeMetrics(), *callbacks],
                      default_root_dir=str(tmp_path))


def metric_states(m):
    out = {}
    for name, metric in m.named_modules():
        if isinstance(metric, torchmetrics.Metric):
            for s in metric._defaults:
                v = getattr(metric, s)
                out[f"{name}.{s}"] = torch.cat([t.reshape(-1) for t in v]) if isinstance(v, list) else v
            out[f"{name}._update_count"] = metric._update_count
    return out


@pytest.mark.parametrize("io", ["keepsake", "torch", "async", "keepsake-async"])
def test_resume_mid_epoch_equals_uninterrupted(tmp_path, io):
    ref = Tiny()
    trainer(tmp_path / "ref").fit(ref)

    ckpt = str(tmp_path / "mid.keepsake")
    first = Tiny()
    t1 = trainer(tmp_path / "a", [StopAt(ckpt)], io=io)
    t1.fit(first)
    assert t1.global_step == STOP_AT
    assert os.path.exists(ckpt)
    if io == "torch":  # Lightning's own format: metric snapshots are plain tensors weights_only reads
        plain = torch.load(ckpt, weights_only=True)
        assert plain["keepsake_metrics"]["losses"]["update_count"] == STOP_AT
    else:  # the file is an ordinary keepsake checkpoint
        with keepsake.safe_open(ckpt, framework="pt") as f:
            assert "state/model/net.0.weight" in f.keys()
            assert "state/train_metrics/losses/state_dict/value" in f.keys()
        keepsake.verify(ckpt)

    resumed = Tiny()
    t2 = trainer(tmp_path / "b", io=io)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*compute.*before.*update.*")
        t2.fit(resumed, ckpt_path=ckpt)

    assert t2.global_step == EPOCHS * (N // BATCH)
    for (k, a), (k2, b) in zip(ref.state_dict().items(), resumed.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    o_ref, o_res = t_opt(ref), t_opt(resumed)
    assert o_ref["param_groups"] == o_res["param_groups"]
    for i, st in o_ref["state"].items():
        for name, v in st.items():
            assert torch.equal(v, o_res["state"][i][name]), (i, name)
    sr, ss = metric_states(ref), metric_states(resumed)
    assert sr.keys() == ss.keys()
    for k in sr:
        assert (torch.equal(sr[k], ss[k]) if isinstance(sr[k], torch.Tensor) else sr[k] == ss[k]), k
    assert ss["losses._update_count"] == EPOCHS * (N // BATCH)
    # the epoch interrupted in the middle computed the same accuracy as the uninterrupted one
    assert resumed.epoch_acc == ref.epoch_acc[1:]
    assert t2.lr_scheduler_configs[0].scheduler.state_dict() == ref.trainer.lr_scheduler_configs[0].scheduler.state_dict()


def t_opt(m):
    return m.trainer.optimizers[0].state_dict()


def test_checkpoint_dict_round_trip(tmp_path):
    io = KeepsakeCheckpointIO(fsync=False)
    ck = {"epoch": 3, "global_step": 7, "pytorch-lightning_version": "2.6.6",
          "state_dict": {"w": torch.arange(4.0), "b": torch.zeros(2, dtype=torch.int64)},
          "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1}}}},
          "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [
              {"lr": 0.1, "betas": (0.9, 0.999), "params": [0]}]}],
          "callbacks": {"Cb{'a/b': 1}": {"seen": [1, 2.5, None, True, "x"]}},
          "hparams": {1: "int key", "2": "str key", None: 0, "big": 1 << 70, "raw": b"\x00\x01"}}
    p = tmp_path / "d.keepsake"
    io.save_checkpoint(ck, p)
    back = io.load_checkpoint(p)
    assert back.keys() == ck.keys()
    assert torch.equal(back["state_dict"]["w"], ck["state_dict"]["w"])
    assert back["loops"] == ck["loops"]
    g = back["optimizer_states"][0]["param_groups"][0]
    assert g == ck["optimizer_states"][0]["param_groups"][0] and isinstance(g["betas"], tuple)
    assert list(back["optimizer_states"][0]["state"]) == [0]
    assert back["callbacks"] == ck["callbacks"]
    assert back["hparams"] == ck["hparams"]
    io.remove_checkpoint(p)
    assert not p.exists()
    # 1 and "1" would both be named "1" (FORMAT.md section 10): refused, nothing written
    ck["hparams"] = {1: "int key", "1": "str key"}
    with pytest.raises(keepsake.ExistsError, match="lightning/hparams"):
        io.save_checkpoint(ck, p)
    assert not p.exists()


def test_metric_states_are_those_of_the_moment_the_checkpoint_dict_was_built(tmp_path):
    """An AsyncCheckpointIO writes the dict later, while training goes on: the metric states in
    the file must be those of the save, not of the write."""
    m = Tiny()
    m.acc.update(torch.randn(8, 3), torch.randint(0, 3, (8,)))
    want = {k: v.clone() for k, v in ((s, getattr(m.acc, s)) for s in m.acc._defaults)}
    ck = {"state_dict": m.state_dict()}
    KeepsakeMetrics().on_save_checkpoint(None, m, ck)
    for _ in range(3):  # training moves on before the background write happens
        m.acc.update(torch.randn(8, 3), torch.randint(0, 3, (8,)))
    p = tmp_path / "later.keepsake"
    KeepsakeCheckpointIO(fsync=False).save_checkpoint(ck, p)
    import keepsake.torch as kt
    sd = kt.load_file(p)
    for s, v in want.items():
        assert torch.equal(sd[f"state/train_metrics/acc/state_dict/{s}"], v), s


class WithHparams(pl.LightningModule):
    def __init__(self, hidden=16, lr=0.05, name="tiny"):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(5, hidden)

    def training_step(self, batch, i):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def test_load_from_checkpoint_reads_a_keepsake_ckpt_with_its_hyperparameters(tmp_path):
    m = WithHparams(hidden=7, lr=0.25, name="seven")
    t = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, plugins=[KeepsakeCheckpointIO(fsync=False)],
                   default_root_dir=str(tmp_path))
    x = torch.randn(16, 5)
    t.fit(m, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x), batch_size=4))
    path = tmp_path / "m.ckpt"
    t.save_checkpoint(path)
    keepsake.verify(path)  # a keepsake file, not a pickle
    back = WithHparams.load_from_checkpoint(path)  # Lightning's documented way
    assert back.hparams.hidden == 7 and back.hparams.lr == 0.25 and back.hparams.name == "seven"
    assert torch.equal(back.net.weight, m.net.weight)
    back2 = WithHparams.load_from_checkpoint(str(path), map_location="cpu", lr=0.5)  # overrides still work
    assert back2.hparams.lr == 0.5


def test_background_saves_of_the_plugin_hold_the_moment_of_the_save(tmp_path):
    """KeepsakeCheckpointIO(async_save=True): save_checkpoint returns once the dict's tensors and
    metric snapshots are copied; changed at once, in place, they do not reach the file, and each
    file is whole when a later call (here load_checkpoint and teardown) returns."""
    m = Tiny()
    big = torch.randn(1024, 1024)  # 4 MiB: the write is still running when the state changes
    m.acc.update(torch.randn(8, 3), torch.randint(0, 3, (8,)))
    ck = {"state_dict": {**m.state_dict(), "big": big}, "epoch": 1}
    KeepsakeMetrics().on_save_checkpoint(None, m, ck)
    want_big, want_w = big.clone(), m.net[0].weight.detach().clone()
    want_tp = m.acc.tp.clone()
    io = KeepsakeCheckpointIO(async_save=True)
    assert io.async_save
    p = tmp_path / "a.ckpt"
    io.save_checkpoint(ck, p)
    big.fill_(-1.0)
    with torch.no_grad():
        m.net[0].weight.fill_(7.0)
    ck[METRICS_KEY]["acc"]["state_dict"]["tp"].fill_(123)  # even the snapshot in the dict itself
    m.acc.update(torch.randn(8, 3), torch.randint(0, 3, (8,)))
    ck["epoch"] = 2
    q = tmp_path / "b.ckpt"
    io.save_checkpoint(ck, q)  # waits for the first, then snapshots the changed state
    back = io.load_checkpoint(p)  # waits for the second
    assert torch.equal(back["state_dict"]["big"], want_big) and back["epoch"] == 1
    assert torch.equal(back["state_dict"]["net.0.weight"], want_w)
    import keepsake.torch as kt
    assert torch.equal(kt.load_file(p)["state/train_metrics/acc/state_dict/tp"], want_tp)
    later = io.load_checkpoint(q)
    assert torch.equal(later["state_dict"]["big"], big) and later["epoch"] == 2
    io.teardown()


def test_a_background_save_error_is_raised_by_the_next_call_and_leaves_nothing(tmp_path):
    io = KeepsakeCheckpointIO(async_save=True)
    ck = {"state_dict": {"w": torch.ones(3)}, "epoch": 0}
    good = tmp_path / "good.ckpt"
    io.save_checkpoint(ck, good)
    blocked = tmp_path / "blocked.ckpt"  # a non-empty directory: the final rename cannot replace it
    blocked.mkdir()
    (blocked / "x").write_text("x")
    io.save_checkpoint(ck, blocked)  # snapshotted; the write fails on the library's thread
    with pytest.raises(keepsake.KeepsakeError) as e:
        io.teardown()
    assert "blocked.ckpt" in str(e.value)
    io.teardown()  # raised once, not again
    assert sorted(os.listdir(tmp_path)) == ["blocked.ckpt", "good.ckpt"]  # no temporary file left
    assert torch.equal(io.load_checkpoint(good)["state_dict"]["w"], torch.ones(3))
    busy = KeepsakeCheckpointIO(async_save=True, when_busy="fail")
    big = {"state_dict": {"w": torch.randn(2048, 2048)}}  # 16 MiB: still being written at the next save
    busy.save_checkpoint(big, tmp_path / "one.ckpt")
    refused = 0
    for i in range(50):
        try:
            busy.save_checkpoint(big, tmp_path / f"two{i}.ckpt")
            break
        except keepsake.StateError:
            refused += 1
    busy.teardown()
    assert refused >= 1
    with pytest.raises(ValueError):
        KeepsakeCheckpointIO(async_save=True, when_busy="later")

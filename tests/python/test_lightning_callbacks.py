"""ModelCheckpoint(save_top_k, monitor) and EarlyStopping across a SIGKILL and a resume behave
exactly as they do with Lightning's own checkpoint IO: the same files kept, the same best-k
scores, the same early-stopping counters and stopping epoch."""
import json
import os
import signal
import subprocess
import sys

import pytest

import keepsake

pytest.importorskip("lightning.pytorch")

RUN = r'''
import os, sys, signal, json, torch
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint, EarlyStopping
from keepsake.lightning import KeepsakeCheckpointIO, KeepsakeMetrics

io_kind, ckdir, kill_epoch, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"

class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, b, i):
        x, y = b
        return torch.nn.functional.mse_loss(self.net(x), y)
    def validation_step(self, b, i):
        x, y = b
        # a loss that improves, then worsens: top-k and patience both matter
        loss = torch.nn.functional.mse_loss(self.net(x), y) + 0.05 * abs(self.current_epoch - 3)
        self.log("val_loss", loss)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

g = torch.Generator().manual_seed(1)
x = torch.randn(64, 4, generator=g); y = x.sum(1, keepdim=True)
dl = lambda: torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)

class Kill(pl.Callback):
    def on_train_epoch_end(self, trainer, m):
        if trainer.current_epoch == kill_epoch and not resume:
            os.kill(os.getpid(), signal.SIGKILL)

mc = ModelCheckpoint(dirpath=ckdir, save_top_k=2, monitor="val_loss", save_last=True, filename="{epoch}")
es = EarlyStopping(monitor="val_loss", patience=2)
plugins = {"keepsake": [KeepsakeCheckpointIO(fsync=False)], "keepsake-async": [KeepsakeCheckpointIO(async_save=True)],
           "torch": []}[io_kind]
t = pl.Trainer(max_epochs=12, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
               callbacks=[mc, es, Kill(), KeepsakeMetrics()], plugins=plugins, num_sanity_val_steps=0)
t.fit(M(), dl(), dl(), ckpt_path=os.path.join(ckdir, "last.ckpt") if resume else None)
print(json.dumps({"files": sorted(os.listdir(ckdir)), "best": {os.path.basename(k): round(float(v), 6) for k, v in mc.best_k_models.items()},
                  "best_model": os.path.basename(mc.best_model_path), "es_wait": es.wait_count, "stopped": es.stopped_epoch,
                  "epoch": t.current_epoch}))
'''


def run(tmp_path, io, resume):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    return subprocess.run([sys.executable, str(script), io, str(tmp_path / io), "4", "1" if resume else "0"],
                          capture_output=True, text=True, timeout=300)


def test_top_k_and_early_stopping_survive_a_kill_as_with_lightnings_own_io(tmp_path):
    out = {}
    for io in ("torch", "keepsake", "keepsake-async"):
        killed = run(tmp_path, io, False)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        resumed = run(tmp_path, io, True)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        out[io] = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert out["keepsake"] == out["torch"]
    assert out["torch"]["stopped"] > 0 and len(out["torch"]["best"]) == 2  # both callbacks did act
    # Background saves: a kill during one loses that save. Its temporary file is never a .ckpt (the
    # library removes it once it is 60 s old and unlocked), and the run resumes from the save
    # before, one epoch earlier, which can leave that epoch's top-k file twice (Lightning's "-v1"),
    # as with Lightning's own AsyncCheckpointIO. Training, top-k scores and early stopping end the same.
    a, t = out["keepsake-async"], out["torch"]
    assert {k: a[k] for k in ("epoch", "stopped", "es_wait")} == {k: t[k] for k in ("epoch", "stopped", "es_wait")}
    assert sorted(a["best"].values()) == sorted(t["best"].values())
    assert a["best"][a["best_model"]] == t["best"][t["best_model"]]
    for f in a["files"]:
        assert f.endswith(".ckpt") or ".tmp-" in f, f
        if f.endswith(".ckpt"):
            keepsake.verify(tmp_path / "keepsake-async" / f)

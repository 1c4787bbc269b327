#!/usr/bin/env python3
"""The Python twin of keepsake-digits: a PyTorch MLP on the UCI digits, checkpointed by
keepsake.CheckpointManager with background saves, keep-last and keep-best, and autoresume.

    digits_train.py --run-dir runs/a --epochs 8                     # uninterrupted
    digits_train.py --run-dir runs/b --epochs 8 --kill-after 130    # SIGKILLs itself mid-epoch
    digits_train.py --run-dir runs/b --epochs 8 --autoresume        # picks up where it stopped

Everything a resumed run needs comes back from the checkpoint: the model, AdamW, the learning
rate schedule, the torchmetrics MetricCollection half-way through an epoch, the timestamp (which
batch of which epoch) and the torch, numpy and Python RNGs. The data order of each epoch is a
function of (seed, epoch), and the batches an epoch already did are skipped, so a run killed at
any moment and resumed ends bit-identical to one that never stopped. The end state is written to
RUN_DIR/final.keepsake, which `keepsake diff` compares.
"""
import argparse
import gzip
import os
import random
import signal
import sys

import numpy as np
import torch
import torchmetrics as tm

import keepsake
import keepsake.torch as kt

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "data", "digits.csv.gz")
BATCH = 32


def load_digits():
    """The fixed split of the C demo: every 5th row evaluates, the rest train."""
    with gzip.open(DATA, "rt") as f:
        rows = np.array([[int(v) for v in line.split(",")] for line in f if line.strip()], dtype=np.float32)
    x, y = torch.from_numpy(rows[:, :64] / 16.0), torch.from_numpy(rows[:, 64].astype(np.int64))
    ev = torch.arange(len(rows)) % 5 == 0
    return (x[~ev], y[~ev]), (x[ev], y[ev])


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def build(seed, epochs, batches_per_epoch):
    torch.manual_seed(seed)  # every generator a checkpoint restores starts from the seed
    np.random.seed(seed)
    random.seed(seed)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * batches_per_epoch)
    train = tm.MetricCollection({"MulticlassAccuracy": tm.classification.MulticlassAccuracy(num_classes=10),
                                 "Loss": tm.MeanMetric()})
    evals = tm.MetricCollection({"MulticlassAccuracy": tm.classification.MulticlassAccuracy(num_classes=10),
                                 "MulticlassF1Score": tm.classification.MulticlassF1Score(num_classes=10)})
    return model, opt, sched, train, evals


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--save-every", default="25ba")
    ap.add_argument("--kill-after", type=int, default=0, help="SIGKILL this process after that many batches")
    ap.add_argument("--autoresume", action="store_true")
    a = ap.parse_args()

    (xt, yt), (xe, ye) = load_digits()
    per_epoch = (len(xt) + BATCH - 1) // BATCH
    model, opt, sched, train_m, eval_m = build(a.seed, a.epochs, per_epoch)
    ts = keepsake.Timestamp()
    mgr = keepsake.CheckpointManager(a.run_dir, model=model, optimizers=opt, schedulers=sched,
                                     train_metrics=train_m, eval_metrics={"eval": eval_m}, timestamp=ts,
                                     run_name="digits-py", rank_zero_seed=a.seed, save_every=a.save_every,
                                     keep_last=2, keep_best=2, best_metric="eval_metrics/eval/MulticlassAccuracy",
                                     best_mode="max", async_save=True)
    with mgr:
        if a.autoresume and mgr.autoresume():
            r = mgr.last_report
            print(f"keepsake: resumed from {os.path.basename(mgr.last_report.path)} at epoch {ts.epoch} batch "
                  f"{ts.batch_in_epoch} ({len(r.loaded)} loaded, {len(r.missing)} missing, "
                  f"{len(r.mismatched)} mismatched; {mgr.skipped} set aside)")
        while ts.epoch < a.epochs:
            order = torch.randperm(len(xt), generator=torch.Generator().manual_seed(a.seed * 1000 + ts.epoch))
            for i in range(ts.batch_in_epoch, per_epoch):
                idx = order[i * BATCH:(i + 1) * BATCH]
                out = model(xt[idx])
                loss = torch.nn.functional.cross_entropy(out, yt[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                train_m["MulticlassAccuracy"].update(out.detach(), yt[idx])
                train_m["Loss"].update(loss.detach())
                ts.batch += 1
                ts.batch_in_epoch += 1
                ts.sample += len(idx)
                saved = mgr.step()
                if saved:
                    print(f"keepsake: saving {os.path.basename(saved)} in the background")
                if a.kill_after and ts.batch == a.kill_after:
                    print(f"killing myself (SIGKILL) after batch {ts.batch}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            eval_m.reset()
            with torch.no_grad():
                eval_m.update(model(xe), ye)
            acc = float(eval_m["MulticlassAccuracy"].compute())
            print(f"epoch {ts.epoch + 1:2d}  train_loss {float(train_m['Loss'].compute()):.4f}  "
                  f"train_acc {float(train_m['MulticlassAccuracy'].compute()):.4f}  eval_acc {acc:.4f}")
            train_m.reset()
            ts.epoch += 1
            ts.batch_in_epoch = 0
            ts.sample_in_epoch = 0
            if mgr.step(epoch_end=True):
                print("keepsake: saved at the end of the epoch")
        mgr.wait()
    kt.save_checkpoint(os.path.join(a.run_dir, "final.keepsake"), model=model, optimizers=opt, schedulers=sched,
                       train_metrics=train_m, eval_metrics={"eval": eval_m}, timestamp=ts, run_name="digits-py",
                       rank_zero_seed=a.seed)
    print(f"final eval accuracy {float(eval_m['MulticlassAccuracy'].compute()):.4f} "
          f"({os.path.join(a.run_dir, 'final.keepsake')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Lightning's distributed strategies with keepsake's CheckpointIO, under torchrun (gloo, CPU).

    python lightning_worker.py STRATEGY      the test (STRATEGY: ddp, or fsdp: FSDP2 through
                                             keepsake.lightning.KeepsakeModelParallelStrategy)
    torchrun ... lightning_worker.py run STRATEGY WORKDIR EPOCHS [CKPT]

The test: an uninterrupted 4-epoch run at 2 ranks; a run of 2 epochs that leaves a checkpoint at
each epoch end (ModelCheckpoint, written by KeepsakeCheckpointIO on rank 0); a new job that resumes
from the 2nd with ``fit(ckpt_path=...)`` and trains to epoch 4. The resumed job's final weights and
AdamW moments equal the uninterrupted run's bit for bit, and the checkpoints are keepsake files.
Exit 77 when lightning or gloo is unavailable.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import launch  # this folder: how its tests start jobs

WORLD = 2


def worker(strategy: str, work: str, epochs: int, ckpt: str) -> None:
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    import keepsake.torch as kt
    from keepsake.lightning import KeepsakeCheckpointIO

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

        def configure_model(self) -> None:
            if strategy == "fsdp":
                from torch.distributed.fsdp import fully_shard
                fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=0.05)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)}

        def train_dataloader(self):
            g = torch.Generator().manual_seed(3)
            x = torch.randn(96, 5, generator=g)
            y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 1).long()
            # Lightning puts a DistributedSampler in (shuffled by seed and epoch): each rank its half.
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)

    ckpts = os.path.join(work, "ckpts")
    strat: object = strategy
    if strategy == "fsdp":
        from keepsake.lightning import KeepsakeModelParallelStrategy
        strat = KeepsakeModelParallelStrategy(data_parallel_size=WORLD, tensor_parallel_size=1)
    trainer = pl.Trainer(accelerator="cpu", devices=WORLD, strategy=strat, max_epochs=epochs,
                         plugins=[KeepsakeCheckpointIO()], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=work, deterministic=True,
                         callbacks=[ModelCheckpoint(dirpath=ckpts, filename="ep{epoch}", save_top_k=-1,
                                                    auto_insert_metric_name=False, every_n_epochs=1)])
    model = Net()
    trainer.fit(model, ckpt_path=ckpt or None)
    assert trainer.current_epoch == epochs, trainer.current_epoch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    # Full tensors (collective for FSDP2's shards), keyed by parameter name.
    msd, osd = get_state_dict(model, trainer.optimizers[0], options=StateDictOptions(full_state_dict=True))
    if trainer.global_rank == 0:
        final = {f"model/{k}": v.detach().clone() for k, v in msd.items()}
        for pid, st in osd["state"].items():
            for name, v in st.items():
                final[f"optim/{pid}/{name}"] = torch.as_tensor(v).clone()
        final["lr"] = torch.tensor(trainer.optimizers[0].param_groups[0]["lr"], dtype=torch.float64)
        kt.save_file(final, os.path.join(work, "final.keepsake"))
        print(f"global step {trainer.global_step}", flush=True)
    trainer.strategy.barrier()
    # Lightning leaves its process groups (FSDP2's mesh adds more) for the program to destroy. Left
    # to interpreter exit, a gloo group's thread can still be joinable when its object goes, and the
    # rank aborts ("terminate called without an active exception") after all its work is done.
    torch.distributed.destroy_process_group()


def torchrun(*args: str, timeout: int = 100) -> str:
    return launch.torchrun(WORLD, __file__, "run", *args, timeout=timeout).stdout


def test(strategy: str) -> None:
    import torch
    import keepsake.torch as kt
    from keepsake.lightning import is_keepsake_file

    work = launch.workdir(f"lightning-{strategy}-")
    try:
        full, part = os.path.join(work, "full"), os.path.join(work, "part")
        out_full = torchrun(strategy, full, "4")
        torchrun(strategy, part, "2")
        ckpts = sorted(os.listdir(os.path.join(part, "ckpts")))
        assert ckpts == ["ep0.ckpt", "ep1.ckpt"], ckpts
        for c in ckpts:
            p = os.path.join(part, "ckpts", c)
            if strategy == "fsdp":  # a sharded directory: rank files, the index, Lightning's rest
                assert sorted(os.listdir(p)) == ["lightning.keepsake", "model.safetensors.index.json"] + [
                    f"rank-{r:05d}-of-{WORLD:05d}.keepsake" for r in range(WORLD)], sorted(os.listdir(p))
                assert is_keepsake_file(os.path.join(p, "lightning.keepsake"))
            else:
                assert is_keepsake_file(p), f"{c} is not a keepsake file"
        cli = os.environ.get("KS_CLI")
        if cli:
            v = subprocess.run([cli, "verify", os.path.join(part, "ckpts", "ep1.ckpt")], capture_output=True,
                               text=True, timeout=60)
            assert v.returncode == 0 and "OK" in v.stdout, (v.stdout, v.stderr)
        before = kt.load_file(os.path.join(part, "final.keepsake"))
        out_resumed = torchrun(strategy, part, "4", os.path.join(part, "ckpts", "ep1.ckpt"))
        assert out_full.strip().splitlines()[-1] == out_resumed.strip().splitlines()[-1], (out_full, out_resumed)
        fa = kt.load_file(os.path.join(full, "final.keepsake"))
        fb = kt.load_file(os.path.join(part, "final.keepsake"))
        assert fa.keys() == fb.keys() and len(fa) >= 9, sorted(fa.keys() ^ fb.keys())
        assert not torch.equal(before["model/net.0.weight"], fa["model/net.0.weight"])  # epochs 3-4 trained
        for k in fa:
            x, y = fa[k].reshape(-1).view(torch.uint8), fb[k].reshape(-1).view(torch.uint8)
            assert torch.equal(x, y), f"{strategy}: the resumed run differs at {k}"
        print(f"lightning {strategy}: OK (resumed at epoch 2 from a keepsake checkpoint; {len(fa)} tensors "
              "bit-identical to the uninterrupted run)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "")
    else:
        launch.require("lightning.pytorch")
        test(sys.argv[1] if len(sys.argv) > 1 else "ddp")

"""A C program's checkpoint, exported to .pt, restores a PyTorch training loop.

The C demo (keepsake-digits) trains its MLP with AdamW and a warmup-cosine scheduler for one
epoch and saves final.keepsake through the C state layer. `keepsake convert` exports it to .pt,
which must load with torch's default torch.load (weights_only=True) and hold what PyTorch's own
objects take back: the model's state dict, an AdamW state dict (param_groups a list, betas a
tuple, params a list, state keyed by int) that AdamW.load_state_dict accepts, the scheduler's
per-group values as lists and the RNG as Composer's list with one item per rank.

The restored AdamW then takes steps exactly as the C optimizer would from the same moments: the
test checks that one step with a known gradient moves the weights by the AdamW update computed
from the exported exp_avg, exp_avg_sq and step, and that `step` advances.

usage: c_checkpoint_to_torch.py KEEPSAKE_DIGITS KEEPSAKE_CLI
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skipped: torch is not installed")
    sys.exit(77)


class MLP(torch.nn.Module):
    """The demo's model: 64 -> 128 -> 10, named fc1 and fc2 as the C program names them."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    digits, cli = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        subprocess.run([digits, "--run-dir", run, "--epochs", "1", "--save-interval", "50ba", "--keep", "1",
                        "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
        src, pt = os.path.join(run, "final.keepsake"), os.path.join(tmp, "final.pt")
        subprocess.run([cli, "convert", src, pt], check=True, stdout=subprocess.DEVNULL)
        ck = torch.load(pt)  # torch's default: weights_only=True
        st = ck["state"]

        model = MLP()
        model.load_state_dict(st["model"])  # strict: every name, shape and dtype
        osd = st["optimizers"]["AdamW"]
        assert isinstance(osd["param_groups"], list) and len(osd["param_groups"]) == 1, osd["param_groups"]
        g = osd["param_groups"][0]
        assert isinstance(g["params"], list) and g["params"] == [0, 1, 2, 3], g["params"]
        assert isinstance(g["betas"], tuple) and len(g["betas"]) == 2, g["betas"]
        assert sorted(osd["state"]) == [0, 1, 2, 3], list(osd["state"])
        opt = torch.optim.AdamW(model.parameters(), lr=1.0)
        opt.load_state_dict(osd)
        assert opt.param_groups[0]["lr"] == g["lr"]

        # One AdamW step from the exported moments, against the update computed by hand.
        w = model.fc1.weight
        s = opt.state[w]
        step0 = float(s["step"])
        m, v = s["exp_avg"].clone(), s["exp_avg_sq"].clone()
        before = w.detach().clone()
        grad = torch.full_like(w, 0.01)
        b1, b2 = g["betas"]
        lr, eps, wd = g["lr"], g["eps"], g["weight_decay"]
        t = step0 + 1
        m1 = b1 * m + (1 - b1) * grad
        v1 = b2 * v + (1 - b2) * grad * grad
        expect = before * (1 - lr * wd) - lr * (m1 / (1 - b1 ** t)) / ((v1 / (1 - b2 ** t)).sqrt() + eps)
        opt.zero_grad()
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        w.grad = grad
        opt.step()
        assert float(opt.state[w]["step"]) == t
        err = (w.detach() - expect).abs().max().item()
        assert err < 1e-6, f"AdamW step from the exported state differs by {err}"

        sched = st["schedulers"]["CosineAnnealingWithWarmupScheduler"]
        assert isinstance(sched["base_lrs"], list) and isinstance(sched["_last_lr"], list), sched
        assert isinstance(ck["rng"], list) and len(ck["rng"]) == 1, type(ck["rng"])
        assert st["timestamp"]["Timestamp"]["epoch"] == 1
        print("ok: the C checkpoint's .pt export restores model, AdamW (stepped), scheduler lists and rng list")


if __name__ == "__main__":
    main()

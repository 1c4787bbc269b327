"""A training run restored from a keepsake export continues bit-identically.

A small model trains with AdamW, a StepLR scheduler, dropout (torch RNG),
numpy noise and Python-random shuffling; its checkpoint (model, optimizer,
scheduler, the three RNG states, a wall-clock timedelta, the step) is saved
with torch.save. It goes through `keepsake convert` to a keepsake file and
back to .pt, which must load with torch's default torch.load
(weights_only=True). Two runs then resume: one from the original .pt, one
from the export. Their losses, learning rates, random draws, parameters and
optimizer states must be bitwise equal after 12 more steps.

usage: torch_training_resume.py KEEPSAKE_CLI
"""
import datetime
import os
import random
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    print("skipped: %s has no torch/numpy" % sys.executable)
    sys.exit(77)

if int(torch.__version__.split(".")[0]) < 2:
    print("skipped: torch %s; export of Python floats, typed containers and uint32 needs torch >= 2.4"
          % torch.__version__)
    sys.exit(77)


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.25), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.85, 0.99), weight_decay=0.05, amsgrad=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    return model, opt, sched


DATA_X = torch.linspace(-1, 1, 64 * 6).reshape(64, 6)
DATA_Y = torch.sin(DATA_X[:, :3] * 3)


def train(model, opt, sched, steps, log):
    model.train()
    for _ in range(steps):
        idx = random.sample(range(64), 8)  # Python RNG
        noise = torch.from_numpy(np.random.normal(0, 0.01, (8, 6)).astype(np.float32))  # numpy RNG
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(DATA_X[idx] + noise), DATA_Y[idx])  # dropout: torch RNG
        loss.backward()
        opt.step()
        sched.step()
        log.append((loss.item(), sched.get_last_lr()[0], idx, noise.sum().item()))


def checkpoint(model, opt, sched, step):
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
            "elapsed": datetime.timedelta(seconds=754, microseconds=12), "step": step}


def restore(ck):
    """Restores from either file; the export holds the documented forms (see docs/FORMAT.md)."""
    model, opt, sched = build()
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    sched.load_state_dict(ck["scheduler"])
    torch.set_rng_state(ck["rng"]["torch"])
    name, keys, pos, has_gauss, cached = ck["rng"]["numpy"]  # the export: keys is a uint32 tensor
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(ck["rng"]["python"])
    elapsed = ck["elapsed"]
    if isinstance(elapsed, dict):  # the export: {"__class__": "datetime.timedelta", "__args__": (d, s, us)}
        assert elapsed["__class__"] == "datetime.timedelta"
        elapsed = datetime.timedelta(*elapsed["__args__"])
    return model, opt, sched, elapsed, ck["step"]


def bits(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same_tree(a, b, path="optimizer"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(bits(a), bits(b)), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, list(a), list(b))
        for k in a:
            same_tree(a[k], b[k], "%s/%r" % (path, k))
    elif isinstance(a, (list, tuple)):
        assert type(a) == type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same_tree(x, y, "%s/%d" % (path, i))
    else:
        assert type(a) == type(b) and a == b, (path, a, b)


def main():
    cli = sys.argv[1]
    random.seed(11)
    np.random.seed(11)
    model, opt, sched = build()
    train(model, opt, sched, 7, [])
    with tempfile.TemporaryDirectory() as tmp:
        orig, ks, export = (os.path.join(tmp, n) for n in ("orig.pt", "ck.keepsake", "export.pt"))
        torch.save(checkpoint(model, opt, sched, 7), orig)
        for src, dst in ((orig, ks), (ks, export)):
            r = subprocess.run([cli, "convert", src, dst], capture_output=True, text=True)
            if r.returncode:
                raise SystemExit("keepsake convert %s %s failed: %s" % (src, dst, r.stderr))
        from_export = torch.load(export)  # the default: weights_only=True
        from_orig = torch.load(orig, weights_only=False)  # the original holds numpy arrays
    runs = []
    for ck in (from_orig, from_export):
        model, opt, sched, elapsed, step = restore(ck)
        log = []
        train(model, opt, sched, 12, log)
        runs.append((model, opt, log, elapsed, step, torch.rand(4), np.random.rand(2), random.random()))
    (m1, o1, log1, e1, s1, t1, n1, p1), (m2, o2, log2, e2, s2, t2, n2, p2) = runs
    assert log1 == log2, "losses / lr / draws differ:\n%s\n%s" % (log1[:2], log2[:2])
    assert e1 == e2 == datetime.timedelta(seconds=754, microseconds=12) and s1 == s2 == 7
    assert torch.equal(bits(t1), bits(t2)) and np.array_equal(n1, n2) and p1 == p2
    for (k, a), (k2, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and torch.equal(bits(a), bits(b)), k
    same_tree(o1.state_dict(), o2.state_dict())
    print("ok: 12 steps after restoring from the keepsake export match the original bit for bit "
          "(final loss %.9g, lr %.3g)" % (log1[-1][0], log1[-1][1]))


if __name__ == "__main__":
    main()

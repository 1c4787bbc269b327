"""keepsake's Python package against safetensors 0.8 and torch.save/torch.load, side by side.

usage: python_bench.py [--quick] [--reps N] [--slow-reps N] [--only NAME] [--dir DIR]
Run by `make bench` when the package was built (build/python-pkg on PYTHONPATH). Prints best-of-N
wall times and ratios (> 1.0x means keepsake is faster), the CPU time of the process (all threads,
getrusage) in the best repetition of each side, and the 1-minute load average after the row.
Every row times both sides in the same run.

- Tensor files: GPT-2-small shapes (148 F32 tensors, 475 MiB), 256 x 4 MiB F32 and 100,000 tiny
  tensors. `save_file` is timed twice: without fsync on both sides (keepsake's fsync=False against
  safetensors' save_file, which never fsyncs), and durable on both sides (keepsake's default
  against safetensors' save_file followed by os.fsync of the file and of its directory). Each
  timed save writes a new file: the previous one is removed outside the timed region on both
  sides, so neither side times the kernel freeing the replaced file's blocks.
- Loads are timed warm (the file in the page cache) for every reader alike: load_file plus a read
  of every byte (mmap on both sides; keepsake's default, then with verify=True, which hashes every
  tensor first, against safetensors, which checks nothing), and a load into memory the tensors own
  (keepsake's backend="read" against safetensors' backend="pread").
- Checkpoints: save_checkpoint/load_checkpoint (verify on, the default) against torch.save (+ fsync
  of the file)/torch.load + load_state_dict, on GPT-2-small with AdamW (stepped once) and on
  100,000 entries (50,000 tiny parameters with SGD momentum; torch's side of that load, most of a
  minute a repetition, is the best of --slow-reps). Both sides load into the same model and
  optimizer, whose state exists (stepped once): keepsake reads into it in place.
"""
import argparse
import gc
import os
import resource
import sys
import tempfile
import time

import torch

import keepsake
import keepsake.torch as kt

try:
    import safetensors.torch as st
    from safetensors import safe_open as st_open
except ImportError:  # the comparison needs it; keepsake's numbers alone are still printed
    st = None


def gpt2_small_shapes():
    """The 148 tensors of GPT-2 small (124M parameters) as Hugging Face saves it (475 MiB of F32)."""
    d, ff, vocab, ctx = 768, 3072, 50257, 1024
    shapes = [("wte.weight", (vocab, d)), ("wpe.weight", (ctx, d))]
    for i in range(12):
        p = f"h.{i}."
        shapes += [(p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)),
                   (p + "attn.c_attn.weight", (d, 3 * d)), (p + "attn.c_attn.bias", (3 * d,)),
                   (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)),
                   (p + "ln_2.weight", (d,)), (p + "ln_2.bias", (d,)),
                   (p + "mlp.c_fc.weight", (d, ff)), (p + "mlp.c_fc.bias", (ff,)),
                   (p + "mlp.c_proj.weight", (ff, d)), (p + "mlp.c_proj.bias", (d,))]
    return shapes + [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]


def cpu_seconds():
    """CPU time of the process, every thread's (the machine is shared: wall time follows the CPU left over)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def best(fn, reps, setup=None):
    """(wall, CPU) of the repetition with the best wall time."""
    times = []
    for _ in range(reps):
        if setup:
            setup()
        gc.collect()
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0, cpu_seconds() - c0))
        del out
    return min(times)


def load_average():
    return os.getloadavg()[0]


def row(what, ks, other, other_name):
    """One side-by-side row: best wall times, their ratio (> 1: keepsake faster) and CPU times."""
    ks_wall, ks_cpu = ks
    other_wall, other_cpu = other
    ratio = other_wall / ks_wall if ks_wall > 0 else float("inf")
    print(f"  {what:<48} keepsake {ks_wall * 1e3:9.1f} ms   {other_name} {other_wall * 1e3:9.1f} ms   {ratio:6.2f}x"
          f"   cpu {ks_cpu * 1e3:8.1f} / {other_cpu * 1e3:8.1f} ms   load {load_average():.1f}", flush=True)
    return ratio


def remover(*paths):
    def setup():
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
    return setup


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def st_save_durable(tensors, path):
    """safetensors' save_file made durable the way keepsake's is: fsync of the file and of its directory."""
    st.save_file(tensors, path)
    fsync_path(path)
    fsync_path(os.path.dirname(path) or ".")


def read_all(tensors):
    return sum(float(t.sum()) for t in tensors.values())


def tensor_files(name, tensors, folder, reps):
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"\n{name}: {len(tensors)} tensors, {nbytes / 2**20:.0f} MiB", flush=True)
    ks_path, st_path = os.path.join(folder, "t.keepsake"), os.path.join(folder, "t.safetensors")
    one = next(iter(tensors))
    res = {}
    ks_fast = best(lambda: kt.save_file(tensors, ks_path, fsync=False), reps, remover(ks_path))
    if st is None:
        print(f"  save_file keepsake {ks_fast[0] * 1e3:.1f} ms (safetensors not installed)")
        return res
    res["save_file"] = row("save_file, no fsync on either side", ks_fast,
                           best(lambda: st.save_file(tensors, st_path), reps, remover(st_path)), "safetensors")
    res["save_file_durable"] = row("save_file, durable on both sides",
                                   best(lambda: kt.save_file(tensors, ks_path), reps, remover(ks_path)),
                                   best(lambda: st_save_durable(tensors, st_path), reps, remover(st_path)),
                                   "safetensors")
    res["load_file"] = row("load_file", best(lambda: kt.load_file(ks_path), reps),
                           best(lambda: st.load_file(st_path), reps), "safetensors")
    res["load_file_sum"] = row("load_file + read every byte (sum)",
                               best(lambda: read_all(kt.load_file(ks_path)), reps),
                               best(lambda: read_all(st.load_file(st_path)), reps), "safetensors")
    res["load_file_verify_sum"] = row("load_file(verify=True) + read every byte",
                                      best(lambda: read_all(kt.load_file(ks_path, verify=True)), reps),
                                      best(lambda: read_all(st.load_file(st_path)), reps), "safetensors")
    res["load_copy"] = row("load into owned memory (read / pread)",
                           best(lambda: kt.load_file(ks_path, backend="read"), reps),
                           best(lambda: st.load_file(st_path, backend="pread"), reps), "safetensors")

    def ks_one():
        with keepsake.safe_open(ks_path, framework="pt") as f:
            return f.get_tensor(one)

    def st_one():
        with st_open(st_path, framework="pt") as f:
            return f.get_tensor(one)
    res["get_tensor"] = row("safe_open().get_tensor(one)", best(ks_one, reps), best(st_one, reps), "safetensors")
    os.remove(ks_path)
    os.remove(st_path)
    return res


class Shapes(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        self.p = torch.nn.ParameterList([torch.nn.Parameter(torch.rand(s)) for _, s in shapes])


def torch_save_fsync(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def checkpoints(name, shapes, optimizer, folder, reps, load_reps=None):
    print(f"\n{name}", flush=True)
    model = Shapes(shapes)
    opt = optimizer(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    model.zero_grad(set_to_none=True)
    sd_opt = opt.state_dict()
    entries = len(model.state_dict()) + sum(len(s) for s in sd_opt["state"].values())
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in sd_opt["state"].values() for v in s.values())
    print(f"  {entries} entries, {nbytes / 2**20:.0f} MiB", flush=True)
    ks_path, pt_path = os.path.join(folder, "c.keepsake"), os.path.join(folder, "c.pt")
    ks_save = best(lambda: kt.save_checkpoint(ks_path, model=model, optimizers=opt, rng=True), reps,
                   remover(ks_path))
    pt_save = best(lambda: torch_save_fsync({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                             "rng": torch.get_rng_state()}, pt_path), reps, remover(pt_path))
    res = {"save": row("save_checkpoint vs torch.save (+fsync)", ks_save, pt_save, "torch")}

    def pt_load():
        ck = torch.load(pt_path, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])

    res["load"] = row("load_checkpoint vs torch.load + load_state_dict",
                      best(lambda: kt.load_checkpoint(ks_path, model=model, optimizers=opt), reps),
                      best(pt_load, load_reps or reps), "torch")
    os.remove(ks_path)
    os.remove(pt_path)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per row; the best is printed")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--slow-reps", type=int, default=2,
                    help="repetitions of the 100,000-entry checkpoint load (about a minute each, both sides)")
    ap.add_argument("--dir", default=os.environ.get("KS_BENCH_TMP") or tempfile.gettempdir())
    a = ap.parse_args()
    torch.manual_seed(0)
    print(f"keepsake {keepsake.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"best of {a.reps}, dir {a.dir}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    gpt2 = gpt2_small_shapes()
    if a.quick:
        gpt2 = [(n, tuple(max(1, d // 16) for d in s)) for n, s in gpt2]
    big_n, big_elems, small_n = (16, 1 << 18, 2000) if a.quick else (256, 1 << 20, 100_000)
    cases = [
        ("GPT-2 small shapes", lambda: tensor_files("GPT-2 small shapes (F32)",
                                                    {n: torch.rand(s) for n, s in gpt2}, a.dir, a.reps)),
        ("4 MiB", lambda: tensor_files(f"{big_n} x {big_elems * 4 >> 20} MiB F32",
                                       {f"t/{i}": torch.rand(big_elems) for i in range(big_n)}, a.dir, a.reps)),
        ("small tensors", lambda: tensor_files(f"{small_n} small tensors (16 x F32)",
                                               {f"t/{i}": torch.rand(16) for i in range(small_n)}, a.dir, a.reps)),
        ("checkpoint GPT-2", lambda: checkpoints("checkpoint GPT-2 small + AdamW (stepped once)", gpt2,
                                                 lambda ps: torch.optim.AdamW(ps, lr=1e-4), a.dir, a.reps)),
        ("checkpoint 100,000", lambda: checkpoints(
            f"checkpoint {small_n:,} entries: {small_n // 2:,} parameters + SGD momentum",
            [(str(i), (16,)) for i in range(small_n // 2)],
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), a.dir, a.reps, min(a.reps, a.slow_reps))),
    ]
    for name, run in cases:
        if a.only in name:
            run()
            gc.collect()


if __name__ == "__main__":
    main()

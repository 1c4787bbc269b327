"""keepsake's Python package against safetensors 0.8 and torch.save/torch.load, side by side.

usage: python_bench.py [--quick] [--dir DIR]
Run by `make bench` when the package was built (build/python-pkg on PYTHONPATH). Prints best-of-N
wall times and ratios (> 1.0x means keepsake is faster). Loads are timed warm (the file in the page
cache) for every reader alike. Tensor-file saves are timed without fsync on both sides (safetensors
does not fsync); checkpoint saves with an fsync on both sides (torch.save gets one too).
"""
import argparse
import gc
import os
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


def best(fn, reps):
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        del out
    return min(times)


def row(what, ks, other, other_name):
    ratio = other / ks if ks > 0 else float("inf")
    print(f"  {what:<44} keepsake {ks * 1e3:9.1f} ms   {other_name} {other * 1e3:9.1f} ms   {ratio:6.2f}x")
    return ratio


def tensor_files(name, tensors, folder, reps):
    print(f"\n{name}")
    ks_path, st_path = os.path.join(folder, "t.keepsake"), os.path.join(folder, "t.safetensors")
    one = next(iter(tensors))
    res = {}
    ks_save = best(lambda: kt.save_file(tensors, ks_path, fsync=False), reps)
    if st is None:
        print(f"  save_file keepsake {ks_save * 1e3:.1f} ms (safetensors not installed)")
        return res
    st_save = best(lambda: st.save_file(tensors, st_path), reps)
    res["save_file"] = row("save_file", ks_save, st_save, "safetensors")
    res["load_file"] = row("load_file", best(lambda: kt.load_file(ks_path), reps),
                           best(lambda: st.load_file(st_path), reps), "safetensors")

    def ks_one():
        with keepsake.safe_open(ks_path, framework="pt") as f:
            return f.get_tensor(one)

    def st_one():
        with st_open(st_path, framework="pt") as f:
            return f.get_tensor(one)
    res["get_tensor"] = row("safe_open().get_tensor(one)", best(ks_one, reps), best(st_one, reps), "safetensors")
    res["load_file_sum"] = row("load_file + read every byte (sum)",
                               best(lambda: sum(float(t.sum()) for t in kt.load_file(ks_path).values()), reps),
                               best(lambda: sum(float(t.sum()) for t in st.load_file(st_path).values()), reps),
                               "safetensors")
    os.remove(ks_path)
    os.remove(st_path)
    return res


class Flat(torch.nn.Module):
    def __init__(self, n, elems):
        super().__init__()
        self.p = torch.nn.ParameterList([torch.nn.Parameter(torch.rand(elems)) for _ in range(n)])


def torch_save_fsync(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def checkpoints(name, n_params, elems, momentum, folder, reps):
    print(f"\n{name}")
    model = Flat(n_params, elems)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9 if momentum else 0.0)
    if momentum:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    entries = len(model.state_dict()) + sum(len(s) for s in opt.state_dict()["state"].values())
    print(f"  {entries} tensors, {sum(p.numel() for p in model.parameters()) * 4 * (2 if momentum else 1) / 2**20:.0f} MiB")
    ks_path, pt_path = os.path.join(folder, "c.keepsake"), os.path.join(folder, "c.pt")
    ks_save = best(lambda: kt.save_checkpoint(ks_path, model=model, optimizers=opt, rng=True), reps)
    pt_save = best(lambda: torch_save_fsync({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                             "rng": torch.get_rng_state()}, pt_path), reps)
    res = {"save": row("save_checkpoint vs torch.save (+fsync)", ks_save, pt_save, "torch")}

    def pt_load():
        ck = torch.load(pt_path, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])

    res["load"] = row("load_checkpoint vs torch.load + load_state_dict",
                      best(lambda: kt.load_checkpoint(ks_path, model=model, optimizers=opt), reps), best(pt_load, reps),
                      "torch")
    os.remove(ks_path)
    os.remove(pt_path)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--dir", default=os.environ.get("KS_BENCH_TMP") or tempfile.gettempdir())
    a = ap.parse_args()
    torch.manual_seed(0)
    print(f"keepsake {keepsake.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")
    big_n, big_elems, small_n, reps = (16, 1 << 18, 2000, 2) if a.quick else (256, 1 << 20, 100_000, 3)
    big = {f"t/{i}": torch.rand(big_elems) for i in range(big_n)}
    tensor_files(f"{big_n} x {big_elems * 4 >> 20} MiB F32", big, a.dir, reps)
    del big
    small = {f"t/{i}": torch.rand(16) for i in range(small_n)}
    tensor_files(f"{small_n} small tensors (16 x F32)", small, a.dir, reps)
    del small
    checkpoints(f"training state: {small_n // 2} parameters + SGD momentum", small_n // 2, 16, True, a.dir, reps)
    checkpoints(f"training state: {big_n} x {big_elems * 4 >> 20} MiB parameters", big_n, big_elems, False, a.dir,
                2)


if __name__ == "__main__":
    main()

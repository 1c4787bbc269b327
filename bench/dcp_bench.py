"""dcp.save / dcp.load / dcp.async_save through keepsake.distributed vs torch's FileSystemWriter/Reader.

    PYTHONPATH=build-dcp/python-pkg .venv/bin/torchrun --nproc-per-node 2 \\
        --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:0 bench/dcp_bench.py [--gib 1] [--repeat 3] [--dir DIR]

The state is `--gib` GiB of float32 DTensors sharded along dimension 0 (Shard(0)) over the ranks,
plus a few non-tensor values, as a FSDP2 model's would be. Each measurement is the best of
`--repeat` runs into a fresh directory (both writers fsync their files). Printed: seconds per
backend and keepsake / torch ratios (below 1: keepsake is faster). Not part of `make test`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from keepsake.distributed import KeepsakeReader, KeepsakeWriter


def make_state(gib: float, mesh) -> dict:
    n_tensors = 16
    rows = max(1, int(gib * 2**30 / 4 / n_tensors / 1024))
    g = torch.Generator().manual_seed(0)
    sd = {f"layer{i}.weight": distribute_tensor(torch.randn(rows, 1024, generator=g), mesh, [Shard(0)])
          for i in range(n_tensors)}
    sd["step"] = 1000
    sd["config"] = {"lr": 3e-4, "betas": (0.9, 0.95), "name": "bench"}
    return sd


def timed(fn) -> float:
    dist.barrier()
    t = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t


def fresh(root: str, tag: str) -> str:
    path = os.path.join(root, tag)
    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    return path


def bench(args, sd: dict, group) -> dict:
    res = {}
    writers = {"keepsake": lambda p: KeepsakeWriter(p), "torch": lambda p: FileSystemWriter(p)}
    readers = {"keepsake": KeepsakeReader, "torch": FileSystemReader}
    for name in writers:
        save, load, block, total = [], [], [], []
        for i in range(args.repeat):
            path = fresh(args.dir, f"{name}-{i}")
            save.append(timed(lambda: dcp.save(sd, storage_writer=writers[name](path))))
            target = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
            load.append(timed(lambda: dcp.load(target, storage_reader=readers[name](path))))
            for k, v in sd.items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(target[k].to_local(), v.to_local()), k
            apath = fresh(args.dir, f"{name}-async-{i}")
            dist.barrier()
            t = time.perf_counter()
            fut = dcp.async_save(sd, storage_writer=writers[name](apath), process_group=group)
            block.append(time.perf_counter() - t)
            fut.result()
            total.append(time.perf_counter() - t)
            dist.barrier()
            if dist.get_rank() == 0:
                shutil.rmtree(path, ignore_errors=True)
                shutil.rmtree(apath, ignore_errors=True)
        res[name] = {"save": min(save), "load": min(load), "async block": min(block), "async total": min(total)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    group = dist.new_group(backend="gloo")  # async saves' collectives run on a thread of their own
    own_dir = args.dir is None
    if own_dir:
        d = [tempfile.mkdtemp(prefix="dcp-bench-") if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(d)
        args.dir = d[0]
    sd = make_state(args.gib, mesh)
    res = bench(args, sd, group)
    if dist.get_rank() == 0:
        nbytes = sum(v.numel() * v.element_size() for v in sd.values() if isinstance(v, torch.Tensor))
        print(f"state: {nbytes / 2**30:.2f} GiB over {dist.get_world_size()} ranks, best of {args.repeat}")
        print(f"{'':14}{'keepsake s':>12}{'torch s':>10}{'ratio':>8}")
        for k in ("save", "load", "async block", "async total"):
            a, b = res["keepsake"][k], res["torch"][k]
            print(f"{k:14}{a:12.3f}{b:10.3f}{a / b:8.2f}")
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

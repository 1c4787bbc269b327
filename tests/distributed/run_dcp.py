"""DCP tests of keepsake.distributed: starts dcp_worker.py under torchrun (gloo, CPU) and checks
what it leaves with the C CLI and torch's own HuggingFaceStorageReader.

    python run_dcp.py roundtrip N        save + load (+ async_save) at N ranks, then CLI and HF reader
    python run_dcp.py reshard N M        saved at N ranks, loaded at M
    python run_dcp.py kill-resume        a rank SIGKILLed inside a save; the restarted job resumes
                                         from the newest committed directory and ends bit-identical

Environment: KS_CLI (the keepsake binary; default build-dcp/keepsake), KS_DCP_WORK (scratch root).
Exit 77 when torch.distributed (or gloo) is unavailable.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import launch  # this folder: how its tests start jobs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "dcp_worker.py")


def torchrun(n: int, *args: str, expect_ok: bool = True, timeout: int = 110) -> subprocess.CompletedProcess:
    return launch.torchrun(n, WORKER, *args, expect_ok=expect_ok, timeout=timeout)


def cli() -> str:
    return os.environ.get("KS_CLI") or os.path.join(ROOT, "build-dcp", "keepsake")


def check_cli(path: str, world: int) -> None:
    v = subprocess.run([cli(), "verify", path], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and "OK" in v.stdout, (v.returncode, v.stdout, v.stderr)
    i = subprocess.run([cli(), "inspect", path], capture_output=True, text=True, timeout=60)
    assert i.returncode == 0, (i.returncode, i.stdout, i.stderr)
    assert f"keepsake sharded, {world} rank" in i.stdout, i.stdout
    for r in range(world):
        assert f"rank-{r:05d}-of-{world:05d}.keepsake" in i.stdout, i.stdout


def check_hf_reader(path: str) -> int:
    """The directory in its Hugging Face layout (keepsake convert DIR OUT --hf: tensors consolidated,
    DCP's names, model-0000i-of-0000N.safetensors and the index): torch's HuggingFaceStorageReader loads
    the model tensors, equal to what KeepsakeReader loads, and the layout diffs equal to the directory.
    Returns the number of tensors compared."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from keepsake.distributed import KeepsakeReader

    out = path + "-hf"
    shutil.rmtree(out, ignore_errors=True)
    c = subprocess.run([cli(), "convert", path, out, "--hf", "--hf-shard-size", "4096"], capture_output=True,
                       text=True, timeout=60)
    assert c.returncode == 0, (c.stdout, c.stderr)
    assert "model.safetensors.index.json" in os.listdir(out), os.listdir(out)
    meta = HuggingFaceStorageReader(out).read_metadata().state_dict_metadata
    model_keys = sorted(k for k in meta if k.startswith("model."))
    assert len(model_keys) >= 5, model_keys
    hf = {k: torch.full(tuple(meta[k].size), -7, dtype=meta[k].properties.dtype) for k in model_keys}
    ks = {k: torch.zeros_like(v) for k, v in hf.items()}
    dcp.load(hf, storage_reader=HuggingFaceStorageReader(out), no_dist=True)
    dcp.load(ks, storage_reader=KeepsakeReader(path), no_dist=True)
    for k in model_keys:
        assert torch.equal(hf[k], ks[k]), f"HF reader: {k} differs"
        assert not torch.equal(hf[k], torch.full_like(hf[k], -7)), f"HF reader: {k} not loaded"
    d = subprocess.run([cli(), "diff", path, out], capture_output=True, text=True, timeout=60)
    assert d.returncode == 0 and "identical" in d.stdout, (d.stdout, d.stderr)
    return len(model_keys)


def roundtrip(work: str, n: int) -> None:
    torchrun(n, "roundtrip", work)
    for d in ("ckpt-repl", "ckpt-fsdp", "async-repl", "async-fsdp"):
        check_cli(os.path.join(work, d), n)
    k = check_hf_reader(os.path.join(work, "ckpt-fsdp"))
    print(f"roundtrip at {n} ranks: OK (CLI verify/inspect on 4 directories, HF reader {k} tensors)")


def reshard(work: str, n: int, m: int) -> None:
    torchrun(n, "reshard-save", work)
    check_cli(os.path.join(work, "ckpt"), n)
    torchrun(m, "reshard-load", work)
    print(f"reshard {n} -> {m}: OK")


def kill_resume(work: str) -> None:
    import torch
    import keepsake.torch as kt

    steps = "12"
    torchrun(2, "train", os.path.join(work, "a"), steps)
    b = os.path.join(work, "b")
    torchrun(2, "train", b, steps, "9", expect_ok=False)  # rank 1 dies inside the save at step 9
    run = os.path.join(b, "run")
    assert os.path.exists(os.path.join(run, "step-0006", "model.safetensors.index.json"))
    dead = os.path.join(run, "step-0009")
    assert os.path.isdir(dead) and not os.path.exists(os.path.join(dead, "model.safetensors.index.json")), \
        sorted(os.listdir(run))
    assert not os.path.exists(os.path.join(b, "final.keepsake"))
    p = torchrun(2, "train", b, steps)
    assert "resumed from" in p.stdout and "step-0006 at step 6" in p.stdout, p.stdout
    fa = kt.load_file(os.path.join(work, "a", "final.keepsake"))
    fb = kt.load_file(os.path.join(b, "final.keepsake"))
    assert fa.keys() == fb.keys() and len(fa) >= 4
    for k in fa:
        a, b = fa[k].reshape(-1).view(torch.uint8), fb[k].reshape(-1).view(torch.uint8)
        assert torch.equal(a, b), f"resumed run differs at {k}"
    print("kill-resume: OK (resumed from step 6 past a dead save at step 9; final parameters bit-identical)")


def main() -> None:
    launch.require("torch.distributed.checkpoint")
    scenario = sys.argv[1]
    work = launch.workdir(f"dcp-{scenario}-")
    try:
        if scenario == "roundtrip":
            roundtrip(work, int(sys.argv[2]))
        elif scenario == "reshard":
            reshard(work, int(sys.argv[2]), int(sys.argv[3]))
        elif scenario == "kill-resume":
            kill_resume(work)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The CLI on checkpoint directories torch writes, and on keepsake's of the same state.

A small model (Embedding + Linear) after one AdamW step, the optimizer's state and plain values are
saved twice in this test: by torch's own dcp.save with FileSystemWriter (`.metadata` + `__0_0.distcp`)
and by keepsake.distributed.KeepsakeWriter. Then:

- `keepsake inspect` and `keepsake verify` read torch's directory (through the import: the `.metadata`
  pickle is never run) and say what they found, verify that DCP records no checksums;
- `keepsake diff` of the two directories finds nothing (exit 0): both name each item by its path in
  the saved state dict, with plain values as scalars; it does find a changed value (exit 1);
- a byte flipped inside a tensor of torch's directory makes verify BAD (the item's zip CRC-32);
- a directory torch's HuggingFaceStorageWriter wrote is inspected, verified and converted;
- `keepsake convert DIR OUT --hf` writes the Hugging Face layout, which torch's HuggingFaceStorageReader
  loads with equal tensors and which diffs equal to the directory it came from.

Usage: dcp_cli.py KEEPSAKE_CLI (the Python package on PYTHONPATH). Exits 77 when torch or the package
is missing.
"""
import json
import os
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
try:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import (FileSystemWriter, HuggingFaceStorageReader,
                                              HuggingFaceStorageWriter)
    from keepsake.distributed import KeepsakeWriter
except ImportError as e:  # pragma: no cover - environment
    print(f"skipped: {e}")
    sys.exit(77)

CLI = sys.argv[1]


def run(*args, want=0):
    p = subprocess.run([CLI, *args], capture_output=True, text=True)
    if p.returncode != want:
        sys.exit(f"keepsake {' '.join(args)}: exit {p.returncode}, wanted {want}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def train_state(lr=0.5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.tensor([1, 2])).sum().backward()
    opt.step()
    return model, {"model": model.state_dict(), "optim": opt.state_dict(), "step": 7, "lr": lr, "done": False,
                   "name": "run-β", "none": None, "extra": {"a/b": 1, "xs": [1, 2, 3], "t": (1.5, "x")}}


def flip_tensor_byte(path, t):
    """Flips a byte of tensor t's data inside __0_0.distcp (a torch.save archive per item)."""
    data = bytearray(open(path, "rb").read())
    at = data.find(t.numpy().tobytes())
    assert at > 0 and data.find(t.numpy().tobytes(), at + 1) < 0
    data[at + 5] ^= 0x01
    open(path, "wb").write(bytes(data))


def main():
    tmp = tempfile.mkdtemp(prefix="ks-dcp-cli-")
    tdir, kdir = os.path.join(tmp, "torch"), os.path.join(tmp, "keepsake")
    model, sd = train_state()
    dcp.save(sd, storage_writer=FileSystemWriter(tdir), no_dist=True)
    dcp.save(train_state()[1], storage_writer=KeepsakeWriter(kdir), no_dist=True)

    # inspect: what the import found (tensors, values, sizes), never running the pickle
    out = run("inspect", tdir)
    for want in ("torch.distributed.checkpoint", "model/0.weight", "optim/state/0/exp_avg", "optim/param_groups/0/lr",
                 "extra/a%2Fb", "12 tensors (288 bytes"):
        assert want in out, (want, out)
    doc = json.loads(run("inspect", "--json", tdir))
    names = {t["name"]: t for t in doc["tensors"]}
    assert names["model/0.weight"]["shape"] == [5, 3] and names["model/0.weight"]["bytes"] == 60
    assert doc["values"]["step"] == 7 and doc["values"]["name"] == "run-β" and doc["values"]["extra/xs/2"] == 3
    # verify: what can be checked, and that DCP has no checksums
    out = run("verify", tdir)
    assert out.startswith(tdir + ": OK (") and "no checksums" in out and "CRC-32" in out, out
    # diff: both routes name and type everything alike
    for a, b in ((kdir, tdir), (tdir, kdir)):
        out = run("diff", a, b)
        assert "identical: 38 keys compared, 0 differ" in out, out
    # ... and a real difference is found
    other = os.path.join(tmp, "other")
    dcp.save(train_state(lr=0.25)[1], storage_writer=FileSystemWriter(other), no_dist=True)
    out = run("diff", kdir, other, want=1)
    assert "~ lr: 0.5 -> 0.25" in out and "1 differ" in out, out
    # a damaged tensor byte: the item's zip CRC-32 says so
    flip_tensor_byte(os.path.join(other, "__0_0.distcp"), model.state_dict()["0.weight"])
    out = run("verify", other, want=1)
    assert "BAD" in out and "KS_E_CHECKSUM" in out, out

    # torch's HuggingFaceStorageWriter: safetensors files and an index, no .metadata
    hf = os.path.join(tmp, "hf_writer")
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(hf, fqn_to_index_mapping={
        "model.0.weight": 1, "model.1.weight": 2, "model.1.bias": 2}), no_dist=True)
    out = run("inspect", hf)
    assert "Hugging Face safetensors layout" in out and "model.1.bias" in out, out
    out = run("verify", hf)
    assert ": OK (" in out and "no checksums" in out, out
    run("convert", hf, os.path.join(tmp, "hf.keepsake"))

    # keepsake's checkpoint in the Hugging Face layout, read by torch's own reader
    out_hf = os.path.join(tmp, "as_hf")
    run("convert", kdir, out_hf, "--hf", "--hf-shard-size", "100")
    files = sorted(os.listdir(out_hf))
    assert files[-1] == "model.safetensors.index.json" and files[0] == "model-00001-of-00004.safetensors", files
    index = json.load(open(os.path.join(out_hf, files[-1])))
    assert index["weight_map"]["model.0.weight"] in files and index["metadata"]["total_size"] == 288
    target = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    dcp.load(target, storage_reader=HuggingFaceStorageReader(out_hf), no_dist=True)
    for k, v in model.state_dict().items():
        assert torch.equal(target["model"][k], v), k
    out = run("verify", out_hf)
    assert "every tensor's keepsake checksum" in out, out
    assert "identical: 38 keys compared, 0 differ" in run("diff", kdir, out_hf)
    # hostile layouts: an error with its file named, never a crash; diff of an unreadable side exits 2
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    open(os.path.join(bad, "model.safetensors"), "wb").write(b"\xff" * 8 + b"{}")
    for cmd, code in (("inspect", 1), ("verify", 1)):
        p = subprocess.run([CLI, cmd, bad], capture_output=True, text=True)
        assert p.returncode == code and "model.safetensors" in p.stdout + p.stderr, (cmd, p.returncode, p.stdout, p.stderr)
    p = subprocess.run([CLI, "diff", bad, tdir], capture_output=True, text=True)
    assert p.returncode == 2 and "KS_E_LIMIT" in p.stderr, (p.returncode, p.stderr)
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    p = subprocess.run([CLI, "convert", empty, os.path.join(tmp, "e.keepsake")], capture_output=True, text=True)
    assert p.returncode == 1 and "KS_E_UNSUPPORTED" in p.stderr and "not a checkpoint directory" in p.stderr, p.stderr
    print("dcp_cli: OK")


if __name__ == "__main__":
    main()

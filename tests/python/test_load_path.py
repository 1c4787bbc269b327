"""How load_checkpoint reads (verify=True, the default): each tensor once, into a new buffer,
checked against its checksum before any object changes; the optimizer keeps those tensors (no
buffer of the whole file pinned, no copy out of one). And Reader.fetch_block's errors."""
import os

import pytest
import torch

import keepsake
import keepsake.torch as kt
from keepsake import _keepsake


def trained():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    return model, opt


def fresh():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=0.5)


def test_optimizer_keeps_tensors_of_their_own(tmp_path):
    p = str(tmp_path / "c.keepsake")
    model, opt = trained()
    kt.save_checkpoint(p, model=model, optimizers=opt)
    m2, o2 = fresh()
    kt.load_checkpoint(p, model=m2, optimizers=o2)
    for a, b in zip(m2.parameters(), model.parameters()):
        assert torch.equal(a, b)
    storages = set()
    for st in o2.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.numel() > 1:
                assert v.untyped_storage().nbytes() == v.nbytes, k  # its own bytes, not a view of the file
                storages.add(v.untyped_storage().data_ptr())
    assert len(storages) == 2 * len(o2.state)
    for (pa, sa), (pb, sb) in zip(opt.state.items(), o2.state.items()):
        for k in sa:
            assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k])), k
    assert o2.param_groups[0]["lr"] == 0.1


def flip_last_tensor_byte(path):
    """Flips the last data byte of the file (entries() gives absolute offsets); returns its tensor."""
    name, _, _, _, end = max(_keepsake.Reader(path, lazy=True).entries(), key=lambda e: e[4])
    with open(path, "r+b") as fh:
        fh.seek(end - 1)
        b = fh.read(1)
        fh.seek(end - 1)
        fh.write(bytes([b[0] ^ 0x01]))
    return name


def test_a_damaged_last_tensor_changes_nothing(tmp_path):
    p = str(tmp_path / "c.keepsake")
    model, opt = trained()
    kt.save_checkpoint(p, model=model, optimizers=opt, rng=False)
    name = flip_last_tensor_byte(p)
    m2, o2 = fresh()
    before = [t.clone() for t in m2.state_dict().values()]
    with pytest.raises(keepsake.ChecksumError) as e:
        kt.load_checkpoint(p, model=m2, optimizers=o2, rng=False)
    assert name in str(e.value)
    for a, b in zip(m2.state_dict().values(), before):
        assert torch.equal(a, b)
    assert not o2.state and o2.param_groups[0]["lr"] == 0.5
    # verify=False reads the same file without the check
    kt.load_checkpoint(p, model=m2, optimizers=o2, rng=False, verify=False)
    assert o2.param_groups[0]["lr"] == 0.1


def test_fetch_block_reads_verifies_and_fails_cleanly(tmp_path):
    p = str(tmp_path / "t.keepsake")
    kt.save_file({"a": torch.arange(4.0), "b": torch.arange(3, dtype=torch.int16), "e": torch.zeros(0)}, p)
    r = _keepsake.Reader(p, lazy=True)
    buf, offsets = r.fetch_block(["b", "e", "a"])
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    assert all((base + o) % 64 == 0 for o in offsets)  # aligned for any dtype
    assert bytes(buf[offsets[2]:offsets[2] + 16]) == torch.arange(4.0).numpy().tobytes()
    assert bytes(buf[offsets[0]:offsets[0] + 6]) == torch.arange(3, dtype=torch.int16).numpy().tobytes()
    with pytest.raises(keepsake.NotFoundError):
        r.fetch_block(["a", "nope"])
    with pytest.raises(TypeError):
        r.fetch_block([3])
    assert r.fetch_block([])[1] == []
    big = str(tmp_path / "big.keepsake")  # past the 64 KiB that open reads with the header
    kt.save_file({"a": torch.arange(100_000.0)}, big)
    r = _keepsake.Reader(big, lazy=True)
    with open(big, "r+b") as fh:  # the file shrinks under the reader: an error, never a signal
        fh.truncate(os.path.getsize(big) - 4)
    with pytest.raises(keepsake.IOError_):
        r.fetch_block(["a"])

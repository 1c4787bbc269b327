"""The package under Debian's Python and torch 1.13 (a second tested target), without pytest.

Exit 0 when every check passes, 77 (skipped) when this Python has no torch or cannot import the
extension (another CPython version).
"""
import os
import random
import sys
import tempfile

try:
    import numpy as np
    import torch

    import keepsake  # built for the venv's CPython: another version cannot import it
    import keepsake.numpy as kn
    import keepsake.torch as kt
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    d = tempfile.mkdtemp()
    t = {"f": torch.randn(3, 4), "h": torch.randn(5).half(), "b": torch.randn(2).bfloat16(), "i": torch.arange(7),
         "q": torch.tensor([True, False])}
    kt.save_file(t, os.path.join(d, "t.keepsake"))
    back = kt.load_file(os.path.join(d, "t.keepsake"), verify=True)
    assert all(torch.equal(back[k], v) for k, v in t.items())
    assert all(torch.equal(v, t[k]) for k, v in kt.load(kt.save(t)).items())
    kn.save_file({"u": np.arange(4, dtype=np.uint32)}, os.path.join(d, "u.keepsake"))
    assert kt.load_file(os.path.join(d, "u.keepsake"))["u"].tolist() == [0, 1, 2, 3]  # widened to int64

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    random.seed(4)
    np.random.seed(4)
    ck = os.path.join(d, "ck.keepsake")
    kt.save_checkpoint(ck, model=model, optimizers=opt, timestamp=keepsake.Timestamp(epoch=1), extra={"k": (1, 2)})
    want = (random.random(), np.random.rand(), torch.rand(1))
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    o2 = torch.optim.AdamW(m2.parameters(), lr=0.5)
    r = kt.load_checkpoint(ck, model=m2, optimizers=o2)
    assert not r.missing and not r.mismatched, str(r)
    assert (random.random(), np.random.rand()) == want[:2] and torch.equal(torch.rand(1), want[2])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), m2.state_dict().values()))
    assert o2.param_groups[0]["lr"] == 0.01 and r.extra == {"k": (1, 2)} and r.timestamp.epoch == 1

    fixtures = os.path.join(SRC, "tests", "fixtures", "torch")
    ref = torch.load(os.path.join(fixtures, "mlp_state_dict.pt"))
    got = kt.load_pt(os.path.join(fixtures, "mlp_state_dict.pt"))
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    keepsake.convert(ck, os.path.join(d, "ck.pt"))
    assert torch.equal(torch.load(os.path.join(d, "ck.pt"))["state"]["model"]["0.weight"], model[0].weight.detach())
    try:
        kt.load_file(os.path.join(fixtures, "malicious.pt"))
        raise AssertionError("a zip file opened as a keepsake file")
    except keepsake.KeepsakeError as e:
        assert e.file.endswith("malicious.pt")
    print(f"torch {torch.__version__}: ok")


if __name__ == "__main__":
    main()

"""C64, F8_E4M3FNUZ and F8_E5M2FNUZ: round trips with safetensors 0.8.0 both ways, numpy, safe_open,
checkpoints of a model holding such buffers, and the widening rule against torch's conversions."""
import numpy as np
import pytest
import torch

import keepsake
import keepsake.numpy as kn
import keepsake.torch as kt
from keepsake._core import native as _native_api, tensors as _tensors

safetensors = pytest.importorskip("safetensors")
import safetensors.numpy as sn  # noqa: E402
import safetensors.torch as st  # noqa: E402

NEW = {"C64": torch.complex64, "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz}
FNUZ = [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def complex_sample():
    """Ordinary values, and parts that are NaN, infinite, -0.0 and subnormal."""
    g = torch.Generator().manual_seed(3)
    t = torch.complex(torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g))
    t[0, 0] = complex(float("nan"), 1.0)
    t[0, 1] = complex(float("inf"), float("-inf"))
    t[0, 2] = complex(-0.0, -0.0)
    t[0, 3] = complex(1e-45, -3.4e38)
    return t


def sample(dtype):
    if dtype == torch.complex64:
        return complex_sample()
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).reshape(16, 16)  # every byte, NaN too


def tensors():
    out = {}
    for name, dt in NEW.items():
        out[name] = sample(dt)
        out[f"{name}/scalar"] = sample(dt).reshape(-1)[5].clone()
        out[f"{name}/empty"] = torch.zeros((0, 3), dtype=dt)
        out[f"{name}/odd"] = sample(dt).reshape(-1)[:7].clone()  # the next tensor starts unaligned
    out["f32"] = torch.ones(3)
    return out


def same(a, b):
    """Bit equality: view_as_real for complex, the bytes for FNUZ; dtype and shape too."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.complex64:
        ra, rb = torch.view_as_real(a), torch.view_as_real(b)
        return torch.equal(ra.view(torch.int32), rb.view(torch.int32))
    if a.dtype in FNUZ:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def assert_same_dicts(want, got):
    assert set(got) == set(want)
    for k in want:
        assert same(want[k], got[k]), k


def test_dtype_table_matches_safetensors():
    for name, dt in NEW.items():
        code = _tensors.CODES[name]
        assert _tensors.torch_maps()[1][code] == dt and _tensors.torch_maps()[0][dt] == code
        assert _tensors.DTYPE_SIZES[code] == torch.empty(0, dtype=dt).element_size()
    assert [_tensors.CODES[n] for n in NEW] == [15, 16, 17]  # appended after F8_E5M2 (14)
    assert _tensors.numpy_maps()[1][_tensors.CODES["C64"]] == np.dtype(np.complex64)
    assert _tensors.numpy_maps()[1][_tensors.CODES["F8_E4M3FNUZ"]] is None


def test_complex_sample_needs_bit_comparison():
    """NaN parts defeat torch.equal, so `same` compares bits; the NaN-free rows compare either way."""
    t = complex_sample()
    assert not torch.equal(torch.view_as_real(t), torch.view_as_real(t))  # NaN: bits are compared instead
    assert torch.equal(torch.view_as_real(t[1:]), torch.view_as_real(t[1:].clone()))


def test_keepsake_writes_safetensors_reads(tmp_path):
    t = tensors()
    p = tmp_path / "ks.safetensors"
    kt.save_file(t, p, metadata={"who": "keepsake"})
    back = st.load_file(p)
    assert_same_dicts(t, back)
    for name in NEW:
        assert torch.equal(back[name].view(torch.uint8), t[name].view(torch.uint8))
    assert torch.equal(torch.view_as_real(back["C64"][1:]), torch.view_as_real(t["C64"][1:]))
    with safetensors.safe_open(p, framework="pt") as f:
        assert {k: f.get_slice(k).get_dtype() for k in NEW} == {k: k for k in NEW}
        assert f.metadata()["keepsake.format"] == "keepsake"
        assert same(f.get_slice("C64")[1:3], t["C64"][1:3])


def test_safetensors_writes_keepsake_reads(tmp_path):
    t = tensors()
    p = tmp_path / "ref.safetensors"
    st.save_file(t, p, metadata={"who": "reference"})
    assert_same_dicts(t, kt.load_file(p))
    assert_same_dicts(t, kt.load_file(p, verify=True))  # structure only: no checksums in the file
    with keepsake.safe_open(p, framework="pt") as f:
        assert f.metadata() == {"who": "reference"}
        for k in t:
            assert same(f.get_tensor(k), t[k]), k
        assert f.get_slice("C64").get_dtype() == "C64"
        assert f.get_slice("F8_E5M2FNUZ").get_dtype() == "F8_E5M2FNUZ"
        assert same(f.get_slice("F8_E4M3FNUZ")[2:5], t["F8_E4M3FNUZ"][2:5])
    # Saved again by keepsake, the bytes of every tensor are unchanged and checksummed.
    q = tmp_path / "again.keepsake"
    kt.save_file(kt.load_file(p), q)
    assert_same_dicts(t, kt.load_file(q, verify=True))
    assert_same_dicts(t, st.load_file(q))


def test_numpy_holds_complex64_but_not_fnuz(tmp_path):
    c = complex_sample().numpy()
    p = tmp_path / "np.keepsake"
    kn.save_file({"c": c, "w": np.ones(2, np.float32)}, p)
    got = sn.load_file(p)["c"]
    assert got.dtype == np.complex64 and got.tobytes() == c.tobytes()
    q = tmp_path / "np.safetensors"
    sn.save_file({"c": c}, q)
    got = kn.load_file(q)["c"]
    assert got.dtype == np.complex64 and got.tobytes() == c.tobytes()
    assert kn.load_file(q)["c"][1, 2] == c[1, 2]
    r = tmp_path / "fnuz.keepsake"
    kt.save_file({"e4": sample(torch.float8_e4m3fnuz)}, r)
    with pytest.raises(keepsake.DTypeError) as e:
        kn.load_file(r)
    assert e.value.key == "e4" and "F8_E4M3FNUZ" in str(e.value)
    with keepsake.safe_open(r, framework="np") as f:
        with pytest.raises(keepsake.DTypeError):
            f.get_tensor("e4")
    with keepsake.safe_open(r, framework="pt") as f:  # the same file as torch: a view of the bytes
        assert same(f.get_tensor("e4"), sample(torch.float8_e4m3fnuz))


def test_conjugate_and_noncontiguous_complex_are_saved_by_value(tmp_path):
    c = complex_sample()
    views = {"conj": c.conj(), "t": c.t(), "slice": c[:, ::2]}
    p = tmp_path / "v.keepsake"
    kt.save_file(views, p)
    back = st.load_file(p)
    for k, v in views.items():
        assert same(back[k], v.resolve_conj().contiguous()), k
    assert back["conj"][1, 1] == c[1, 1].conj()


class Net(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.fc = torch.nn.Linear(3, 2)
        self.register_buffer("phase", torch.complex(torch.randn(4, generator=g), torch.randn(4, generator=g)))
        self.register_buffer("q", torch.randn(6, generator=g).to(torch.float8_e4m3fnuz))
        self.register_buffer("r", torch.randn(6, generator=g).to(torch.float8_e5m2fnuz))


def test_checkpoint_of_a_model_with_complex_and_fnuz_buffers(tmp_path):
    src = Net(1)
    p = tmp_path / "m.keepsake"
    kt.save_checkpoint(p, model=src, extra={"z": torch.tensor([1 + 2j], dtype=torch.complex64)})
    with keepsake.safe_open(p) as f:
        assert f.get_slice("state/model/phase").get_dtype() == "C64"
        assert f.get_slice("state/model/q").get_dtype() == "F8_E4M3FNUZ"
    dst = Net(2)
    assert not same(dst.phase, src.phase)
    kt.load_checkpoint(p, model=dst)
    for k, v in src.state_dict().items():
        assert same(dst.state_dict()[k], v), k
    assert dst.phase.dtype == torch.complex64 and torch.equal(torch.view_as_real(dst.phase),
                                                              torch.view_as_real(src.phase))
    assert same(st.load_file(p)["state/extra/z"], torch.tensor([1 + 2j], dtype=torch.complex64))


def test_checkpoint_refuses_complex_into_a_real_buffer(tmp_path):
    p = tmp_path / "m.keepsake"
    kt.save_checkpoint(p, model=Net(1))
    dst = Net(2)
    dst.phase = torch.zeros(4)  # the program's buffer is F32 now: C64 does not widen to it
    before = dst.phase.clone()
    with pytest.raises(keepsake.DTypeError) as e:
        kt.load_checkpoint(p, model=dst)
    assert e.value.key == "state/model/phase" and "C64" in str(e.value)
    assert torch.equal(dst.phase, before)


def torch_exact(src, wide):
    """Every non-NaN byte of FNUZ `src` survives `wide` and back, and NaN stays NaN (torch's conversions)."""
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(src)
    w = x.to(wide)
    nan = torch.isnan(x.to(torch.float32))
    if wide in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool):
        return False
    back = w.to(src).view(torch.uint8)
    same_value = torch.equal(w.to(torch.float64)[~nan], x.to(torch.float64)[~nan])
    return same_value and torch.equal(torch.isnan(w.to(torch.float32)), nan) and \
        torch.equal(back[~nan], x.view(torch.uint8)[~nan])


@pytest.mark.parametrize("src", FNUZ, ids=str)
def test_widening_rule_matches_torch(src):
    codes = _tensors.torch_maps()[0]
    for to, code in codes.items():
        if to == torch.complex64:
            assert _native_api.dtype_widens(codes[src], code) is False
            continue
        assert _native_api.dtype_widens(codes[src], code) == torch_exact(src, to), (src, to)
    assert _native_api.dtype_widens(codes[torch.complex64], codes[torch.complex64]) is True
    assert not any(_native_api.dtype_widens(codes[torch.complex64], c) for d, c in codes.items()
                   if d != torch.complex64)


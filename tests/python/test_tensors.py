"""Tensor files: every dtype, safetensors interop both ways, zero-copy views, bytes, errors."""
import os

import numpy as np
import pytest
import torch

import keepsake
import keepsake.numpy as kn
import keepsake.torch as kt

safetensors = pytest.importorskip("safetensors")
import safetensors.numpy as sn  # noqa: E402
import safetensors.torch as st  # noqa: E402

# Every torch dtype safetensors stores that the keepsake format has (docs/FORMAT.md §2).
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
          torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
          torch.float8_e5m2]
# safetensors holds this too; the keepsake format has no code for it (C64 and the FNUZ float8
# types are in the format: test_dtypes_new.py).
NOT_IN_FORMAT = [torch.float8_e8m0fnu]


def sample(dtype, shape=(3, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float32) * 10).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(1 << 62)), min(info.max, 1 << 62)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def bits(t):
    """Raw bytes of a tensor, so NaN and -0.0 compare exactly."""
    return t.contiguous().reshape(-1).view(torch.uint8).tolist() if t.numel() else []


def all_tensors():
    out = {}
    for i, dt in enumerate(DTYPES):
        name = str(dt).replace("torch.", "")
        out[name] = sample(dt, seed=i)
        out[f"{name}/scalar"] = sample(dt, shape=(), seed=i + 100)
        out[f"{name}/empty"] = torch.zeros((0, 4), dtype=dt)
        out[f"{name}/odd"] = sample(dt, shape=(7,), seed=i + 200)  # leaves the next tensor unaligned
    return out


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert bits(a[k]) == bits(b[k]), k


def test_every_dtype_round_trips(tmp_path):
    t = all_tensors()
    p = tmp_path / "all.keepsake"
    kt.save_file(t, p, metadata={"who": "test"})
    back = kt.load_file(p, verify=True)
    assert_same(t, back)
    assert list(back) == list(t)  # file order is save order
    with keepsake.safe_open(p, framework="pt") as f:
        assert f.metadata() == {"who": "test"}
        for k in t:
            assert bits(f.get_tensor(k)) == bits(t[k])


def test_keepsake_files_open_with_safetensors(tmp_path):
    t = all_tensors()
    p = tmp_path / "ks.safetensors"
    kt.save_file(t, p)
    assert_same(t, st.load_file(p))
    with safetensors.safe_open(p, framework="pt") as f:
        assert f.metadata()["keepsake.format"] == "keepsake"
        assert bits(f.get_slice("float32")[1:3]) == bits(t["float32"][1:3])


def test_safetensors_files_open_with_keepsake(tmp_path):
    t = all_tensors()
    p = tmp_path / "ref.safetensors"
    st.save_file(t, p, metadata={"format": "pt"})
    assert_same(t, kt.load_file(p))
    with keepsake.safe_open(p, framework="pt") as f:
        assert sorted(f.keys()) == sorted(t)
        assert f.metadata() == {"format": "pt"}
        sl = f.get_slice("int64")
        assert sl.get_shape() == [3, 5] and sl.get_dtype() == "I64"
        assert torch.equal(sl[:, 2:4], t["int64"][:, 2:4])
        assert torch.equal(sl[-1], t["int64"][-1])
        f.verify()  # a plain safetensors file: structure only
    assert_same(t, kt.load(st.save(t)))
    assert_same(t, st.load(kt.save(t)))


def test_bytes_equal_the_file(tmp_path):
    t = all_tensors()
    p = tmp_path / "b.keepsake"
    kt.save_file(t, p, metadata={"m": "1"})
    data = kt.save(t, metadata={"m": "1"})
    assert data == p.read_bytes()
    assert_same(t, kt.load(data))


def test_numpy_api(tmp_path):
    arrays = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.array([-1, 2], dtype=">i8"),
              "b": np.array([True, False]), "u": np.arange(5, dtype=np.uint16), "s": np.float64(2.5) * np.ones(()),
              "nc": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2]}
    p = tmp_path / "n.keepsake"
    kn.save_file(arrays, p)
    back = kn.load_file(p)
    for k, v in arrays.items():
        assert np.array_equal(back[k], v) and back[k].dtype == v.dtype.newbyteorder("<"), k
    ref = sn.load_file(str(p))
    for k, v in arrays.items():
        assert np.array_equal(ref[k], v), k
    sn.save_file({"x": np.ones((2, 3), np.float16)}, str(tmp_path / "r.safetensors"))
    assert np.array_equal(kn.load_file(tmp_path / "r.safetensors")["x"], np.ones((2, 3), np.float16))
    assert np.array_equal(kn.load(kn.save(arrays))["f"], arrays["f"])
    kt.save_file({"bf": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "bf.keepsake")
    with keepsake.safe_open(tmp_path / "bf.keepsake", framework="np") as f:
        with pytest.raises(keepsake.DTypeError):
            f.get_tensor("bf")


def test_loads_are_zero_copy_views_that_never_touch_the_file(tmp_path):
    p = tmp_path / "z.keepsake"
    kt.save_file({"w": torch.arange(1 << 16, dtype=torch.float32)}, p)
    before = p.read_bytes()
    with keepsake.safe_open(p, framework="pt") as f:
        a = f.get_tensor("w")
        b = f.get_tensor("w")
    assert a.data_ptr() == b.data_ptr()  # both views of the one mapping
    a[0] = 42.0  # copy on write: private to this process
    assert b[0] == 42.0 and p.read_bytes() == before
    os.remove(p)  # the mapping outlives the name and the closed handle
    assert float(a[-1]) == float((1 << 16) - 1)
    with pytest.raises(keepsake.StateError):
        f.keys()


def test_other_devices_and_layouts(tmp_path):
    t = {"nc": torch.arange(12).reshape(3, 4).t(), "neg": torch.arange(3.0).neg()}
    kt.save_file(t, tmp_path / "l.keepsake")
    back = kt.load_file(tmp_path / "l.keepsake")
    assert torch.equal(back["nc"], t["nc"]) and torch.equal(back["neg"], t["neg"])
    with pytest.raises(keepsake.UnsupportedError):
        kt.save_file({"sp": torch.eye(3).to_sparse()}, tmp_path / "sp.keepsake")


@pytest.mark.parametrize("dtype", NOT_IN_FORMAT, ids=str)
def test_dtypes_outside_the_format_are_refused_clearly(tmp_path, dtype):
    p = tmp_path / "x.keepsake"
    kt.save_file({"keep": torch.ones(1)}, p)
    with pytest.raises(keepsake.DTypeError) as e:
        kt.save_file({"keep": torch.ones(1), "x": torch.zeros(2, dtype=dtype)}, p)
    assert e.value.key == "x" and e.value.status == 7
    assert torch.equal(kt.load_file(p)["keep"], torch.ones(1))  # the old file is intact
    q = tmp_path / "ref.safetensors"
    st.save_file({"x": torch.zeros(2, dtype=dtype)}, q)
    with pytest.raises(keepsake.DTypeError) as e:
        kt.load_file(q)
    assert e.value.file == str(q)


def test_errors_carry_file_key_offset(tmp_path):
    p = tmp_path / "c.keepsake"
    kt.save_file({"a": torch.ones(4), "b": torch.zeros(4)}, p)
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF  # last byte of "b"
    p.write_bytes(bytes(raw))
    kt.load_file(p)  # structure is fine; checksums are verified on request
    with pytest.raises(keepsake.ChecksumError) as e:
        kt.load_file(p, verify=True)
    err = e.value
    assert isinstance(err, keepsake.KeepsakeError)
    assert err.file == str(p) and err.key == "b" and err.offset == len(raw) - 16
    assert err.status_name == "KS_E_CHECKSUM" and "stored checksum" in err.message
    assert str(p) in str(err) and "KS_E_CHECKSUM" in str(err)
    with pytest.raises(keepsake.NotFoundError):
        keepsake.safe_open(p).get_tensor("nope")
    with pytest.raises(keepsake.IOError_):
        kt.load_file(tmp_path / "missing.keepsake")
    with pytest.raises(keepsake.InvalidError):
        kt.save_file({"__metadata__": torch.ones(1)}, tmp_path / "m.keepsake")
    with pytest.raises(keepsake.InvalidError):
        kt.save_file({"a": torch.ones(1)}, tmp_path / "m.keepsake", metadata={"keepsake.format": "x"})
    with pytest.raises(keepsake.IOError_):
        kt.save_file({"a": torch.ones(1)}, tmp_path / "no-such-dir" / "m.keepsake")

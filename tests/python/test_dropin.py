"""keepsake as a safetensors drop-in: what a user switching imports relies on."""
import torch

import keepsake
import keepsake.torch as kt


def test_safe_open_keys_are_sorted_as_safetensors_gives_them(tmp_path):
    from safetensors import safe_open as st_open
    path = tmp_path / "t.keepsake"
    kt.save_file({"zeta": torch.ones(2), "alpha": torch.zeros(3), "mid.b": torch.ones(1), "mid.a": torch.ones(1)},
                 path, fsync=False)
    with st_open(str(path), framework="pt") as ref, keepsake.safe_open(path, framework="pt") as f:
        assert f.keys() == list(ref.keys()) == ["alpha", "mid.a", "mid.b", "zeta"]
        assert f.file_keys() == ["zeta", "alpha", "mid.b", "mid.a"]  # the saved order stays available


def test_a_missing_file_is_a_builtin_file_not_found_error(tmp_path):
    import pytest
    for fn in (kt.load_file, lambda p: keepsake.safe_open(p, framework="pt"), kt.load_checkpoint, keepsake.verify):
        with pytest.raises(FileNotFoundError) as e:
            fn(tmp_path / "nope.keepsake")
        assert isinstance(e.value, keepsake.KeepsakeError) and "nope.keepsake" in str(e.value)
    with pytest.raises(keepsake.IOError_) as e:  # other I/O errors stay IOError_ only
        kt.load_file(tmp_path)
    assert not isinstance(e.value, FileNotFoundError)


def test_a_value_that_is_not_a_tensor_is_a_type_error_naming_its_key(tmp_path):
    import pytest
    with pytest.raises(TypeError, match="'scores' is a list"):
        kt.save_file({"w": torch.ones(1), "scores": [1, 2]}, tmp_path / "x.keepsake")
    with pytest.raises(TypeError, match="names are str"):
        kt.save_file({3: torch.ones(1)}, tmp_path / "x.keepsake")


class Tied(torch.nn.Module):
    """A language-model shape: the output layer's weight is the embedding's (tied)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.mid = torch.nn.Linear(6, 6)
        self.out = torch.nn.Linear(6, 11, bias=False)
        self.out.weight = self.emb.weight


def test_save_model_and_load_model_agree_with_safetensors_on_tied_weights(tmp_path):
    import pytest
    from safetensors.torch import load_model as st_load_model
    from safetensors.torch import save_model as st_save_model
    torch.manual_seed(0)
    src = Tied()
    ks_path, st_path = tmp_path / "k.keepsake", tmp_path / "s.safetensors"
    kt.save_model(src, ks_path)
    st_save_model(src, str(st_path))
    with keepsake.safe_open(ks_path, framework="pt") as f:  # the shared storage stored once, same name
        from safetensors import safe_open as st_open
        with st_open(str(st_path), framework="pt") as g:
            assert f.keys() == list(g.keys())
    for loader, path in ((kt.load_model, st_path), (st_load_model, ks_path), (kt.load_model, ks_path)):
        dst = Tied()
        missing, unexpected = loader(dst, str(path))
        assert not missing and not unexpected
        for k, v in src.state_dict().items():
            assert torch.equal(dst.state_dict()[k], v), (loader, k)
        assert dst.out.weight is dst.emb.weight  # still tied
    other = torch.nn.Linear(6, 6)
    with pytest.raises(RuntimeError, match="missing keys|unexpected keys"):
        kt.load_model(other, ks_path)
    missing, unexpected = kt.load_model(other, ks_path, strict=False)
    assert sorted(missing) == ["bias", "weight"] and "emb.weight" in unexpected

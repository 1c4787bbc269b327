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

"""Tensor files from numpy, with safetensors.numpy's API.

>>> import numpy as np, keepsake.numpy
>>> keepsake.numpy.save_file({"w": np.ones((2, 2), np.float32)}, "w.keepsake")
>>> keepsake.numpy.load_file("w.keepsake")["w"].shape
(2, 2)

numpy has no bfloat16 or float8 dtypes: such tensors raise DTypeError here (load them with
``keepsake.torch``). The functions are ``keepsake._files.numpy_files``'.
"""
from . import _collision  # noqa: F401  (first: refuses another project's `keepsake` package)
from ._files.numpy_files import load, load_file, save, save_file

__all__ = ["save_file", "load_file", "save", "load"]

"""The random number generators of a Python training run, saved under ``rng/0/``.

Layout (rank 0; a C program's xoshiro256** state lives beside them as ``rng/0/xoshiro256starstar``):

====================================  ==========================================================
``rng/0/python/version``              int, ``random.getstate()[0]``
``rng/0/python/state``                I64 [625], the Mersenne Twister words and position
``rng/0/python/gauss_next``           float or None
``rng/0/numpy/kind``                  ``"MT19937"`` (numpy's legacy global generator)
``rng/0/numpy/keys``                  I64 [624] (the uint32 words; every torch reads I64)
``rng/0/numpy/pos``, ``has_gauss``    ints
``rng/0/numpy/cached_gaussian``       float
``rng/0/torch``                       U8, ``torch.get_rng_state()``
``rng/0/cuda/<device>``               U8, ``torch.cuda.get_rng_state(device)``, when CUDA is in use
====================================  ==========================================================
"""
from __future__ import annotations

import random
from typing import Any, Dict

from .._core import layout as _layout

PREFIX = _layout.key(_layout.RNG, "0") + "/"  # rank 0's folder, named by the library


def state_entries() -> Dict[str, Any]:
    """The current state of every generator, as flat entries."""
    import torch
    out: Dict[str, Any] = {}
    version, words, gauss = random.getstate()
    out[PREFIX + "python/version"] = int(version)
    out[PREFIX + "python/state"] = torch.tensor(words, dtype=torch.int64)
    out[PREFIX + "python/gauss_next"] = gauss
    try:
        import numpy as np
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        out[PREFIX + "numpy/kind"] = str(kind)
        out[PREFIX + "numpy/keys"] = np.ascontiguousarray(keys, dtype="<i8")
        out[PREFIX + "numpy/pos"] = int(pos)
        out[PREFIX + "numpy/has_gauss"] = int(has_gauss)
        out[PREFIX + "numpy/cached_gaussian"] = float(cached)
    except ImportError:
        pass
    out[PREFIX + "torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            out[f"{PREFIX}cuda/{i}"] = torch.cuda.get_rng_state(i)
    return out


def load(items: Dict[str, Any]) -> None:
    """Restores every generator the file has a state for (the entries under ``rng/0/``); the C
    engine decides whether this runs and reports it. Raises when a saved state does not fit."""
    import torch
    p = PREFIX + "python/"
    if p + "state" in items and p + "version" in items:
        words = tuple(int(x) for x in items[p + "state"].tolist())
        random.setstate((int(items[p + "version"]), words, items.get(p + "gauss_next")))
    p = PREFIX + "numpy/"
    try:
        import numpy as np
        if p + "keys" in items:
            keys = np.asarray(items[p + "keys"].numpy() if hasattr(items[p + "keys"], "numpy")
                              else items[p + "keys"], dtype=np.uint32)
            np.random.set_state((str(items.get(p + "kind", "MT19937")), keys, int(items[p + "pos"]),
                                 int(items[p + "has_gauss"]), float(items[p + "cached_gaussian"])))
    except ImportError:
        pass
    if PREFIX + "torch" in items:
        torch.set_rng_state(items[PREFIX + "torch"].clone().to(torch.uint8))
    if torch.cuda.is_available():  # devices this machine lacks are left out, as torch.load's map_location
        for k in sorted(k for k in items if k.startswith(PREFIX + "cuda/")):
            dev = int(k.rsplit("/", 1)[1])
            if dev < torch.cuda.device_count():
                torch.cuda.set_rng_state(items[k].clone().to(torch.uint8), dev)

"""The dtypes features are stored in (``--store-dtype``): float32, float16 or bfloat16.

HDF5 and numpy have no bfloat16, so its values are kept as their 16 bits: a ``uint16`` dataset whose
attribute ``encoding`` says ``bfloat16``, widened exactly to float32 by every reader here
(:func:`as_float32`). A float32 value is rounded to the nearest (ties to even), as torch rounds, so a
bfloat16 run's features stored as bfloat16 lose nothing.
"""

from __future__ import annotations

import numpy as np

#: numpy's dtype on disk of each ``--store-dtype``
STORED = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16)}


def store_of(identity: dict) -> str:
    """The ``--store-dtype`` a run identity records (float32 where it records none)."""
    return identity.get("store_dtype", "float32")


def to_stored(features: np.ndarray, store: str) -> np.ndarray:
    """``features`` in the dtype ``store`` keeps them in (as they are when already in it; a bfloat16
    run's features come as int16 bits from torch, read as the same bits)."""
    want = STORED[store]
    if features.dtype == want:
        return features
    if store == "bfloat16" and features.dtype == np.int16:
        return features.view(np.uint16)
    import torch

    from reservoir.runtime.runner import stored  # the one rounding, as the runner does it on the device

    rounded = stored(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)), store).numpy()
    return to_stored(rounded, store)  # bfloat16's int16 bits read as uint16


def as_float32(stored: np.ndarray) -> np.ndarray:
    """Stored features as float32 (bfloat16 bits widened exactly; float32 as it is)."""
    if stored.dtype == np.uint16:
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32, copy=False)


def finite(stored: np.ndarray) -> np.ndarray:
    """Which stored values are finite (bfloat16 bits: those whose exponent is not all ones)."""
    if stored.dtype == np.uint16:
        return (stored & 0x7F80) != 0x7F80
    return np.isfinite(stored)

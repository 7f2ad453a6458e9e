"""Reading the data formats that are pickles (CIFAR-10's python batches, TAPE's LMDB records)
without running code from them.

A pickle can name any importable callable and have it called while loading. The official files hold
only dicts, lists, tuples, bytes, strings, numbers and numpy arrays and scalars, which the unpickler
below admits; any other reference is refused before it is called.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

from reservoir.errors import DataError

#: the only globals a data pickle may name: numpy arrays, dtypes and scalars (numpy 1 and 2), and the
#: codec protocol-2 pickles use for ``bytes``
ALLOWED = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }
)


class UnsafePickle(pickle.UnpicklingError):
    """A pickle named a global outside :data:`ALLOWED` (``where`` is ``module.name``)."""

    def __init__(self, where: str):
        super().__init__(f"a reference to {where}")
        self.where = where


class DataUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only the globals in :data:`ALLOWED`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        raise UnsafePickle(f"{module}.{name}")


def loads(data: bytes, source: Path | str, what: str, fix: str, **kwargs: Any) -> Any:
    """Unpickle ``data`` read from ``source``; a reference outside :data:`ALLOWED` raises
    :class:`~reservoir.errors.DataError` naming ``source``, the reference and ``fix``."""
    try:
        return DataUnpickler(io.BytesIO(data), **kwargs).load()
    except UnsafePickle as e:
        raise DataError(
            f"{source} holds a reference to {e.where}, which {what} never holds; refused without "
            f"running it (only dicts, lists, bytes, strings, numbers and numpy arrays are read); "
            f"{fix}"
        ) from None


def refused_by_torch(e: BaseException) -> str | None:
    """What ``torch.load(weights_only=True)`` refused to unpickle, in a few words (``a reference to
    posix.system``); ``None`` when ``e`` is not such a refusal (a truncated or foreign file)."""
    found = re.search(r"GLOBAL ([\w.]+)", str(e)) if isinstance(e, pickle.UnpicklingError) else None
    return f"a reference to {found.group(1)}" if found else None


def torch_load_reason(e: BaseException) -> str:
    """Why ``torch.load`` could not read a file, in one line (without torch's advice to load unsafely)."""
    found = re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(e))
    reason = " ".join(found.group(1).split()) if found else (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {reason}"

"""Feature files read back: arrays (and an xarray Dataset) of a split, and a torch ``Dataset`` of one
depth, through the store's verified readers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from reservoir.config import select_depths
from reservoir.errors import StoreError, UsageError, optional
from reservoir.extract.stored import as_float32


def read_features(
    path: str | Path,
    split: str,
    depth: int | None = None,
    *,
    depths: str | int | Sequence[int] | None = None,
    as_xarray: bool = False,
) -> Any:
    """Features and labels of one split of a feature file, read through the store's verified readers
    (every depth read is checked against the digests recorded when the file was completed).

    Parameters
    ----------
    path : str or Path
        A complete feature file (what [`extract`][reservoir.api.extract] returns).
    split : str
        A split it holds (``"train"``, ``"test"``, ...).
    depth : int, optional
        One depth: returns ``(X, y)``, ``X`` of shape ``(N, n_readout * d_model)`` (the readout
        tokens side by side) and the labels ``y``.
    depths : str, int or sequence of int, optional
        Several depths (``"all"``, the default without ``depth``; ``"0,6"``; a list; negative counts
        from the last stored one): returns ``(X, y, depths)``.
    as_xarray : bool
        Return an ``xarray.Dataset`` instead (either form; needs ``pip install xarray``):
        ``features`` on the dimensions ``(row, depth, readout, feature)``, ``labels`` on ``(row,)``
        (bit tasks: ``(row, readout, output)``), the coordinate ``depth``, and the file's task,
        backbone, dtype, readout, seed and identity hash as attributes.

    Returns
    -------
    tuple or xarray.Dataset
        ``(X, y)`` for one ``depth``; else ``(X, y, depths)`` with ``X`` float32 of shape
        ``(N, n_depths, n_readout, d_model)``, ``y`` the labels ``(N,)`` or ``(N, n_readout, bits)``
        (``-1`` for each row of data read without labels, ``predict=true``), and ``depths`` the stored depths
        along ``X``'s second axis; a Dataset with ``as_xarray``.

    Raises
    ------
    ValueError
        Both ``depth`` and ``depths``, a split or depth the file lacks
        ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.StoreError
        A file that is unfinished, damaged or fails verification.
    ImportError
        ``as_xarray`` without xarray installed.

    Examples
    --------
    >>> X, y = read_features(path, "test", depth=2)                  # doctest: +SKIP
    >>> X, y, depths = read_features(path, "test")                   # doctest: +SKIP
    >>> X.shape, depths                                               # doctest: +SKIP
    ((100, 3, 1, 32), [0, 1, 2])
    >>> read_features(path, "test", as_xarray=True).features.sel(depth=2)   # doctest: +SKIP
    """
    from reservoir.extract.store import (
        depth_index,
        feature_splits,
        open_features,
        read_depth,
        read_depths,
        verify,
    )

    if depth is not None and depths is not None:
        raise UsageError(
            f"give depth ({depth!r}: one depth, flattened features) or depths ({depths!r}: several, "
            "(N, n_depths, n_readout, d_model)), not both"
        )
    xr = optional("xarray", "read_features(..., as_xarray=True)") if as_xarray else None
    path = Path(path)
    with open_features(path) as f:
        if depth is not None and xr is None:  # the single-depth form
            if split in f:  # a negative depth counts from the last: the stored depth it names is verified
                depth = [int(d) for d in f.attrs["depths"]][depth_index(f, depth)]
                verify(f, [depth], [split])
            X, y = read_depth(f, split, depth)
            return X.reshape(len(X), -1), y
        if split not in f:
            raise UsageError(f"split {split!r} is not in {path}; it holds {feature_splits(f)}")
        wanted = [depth] if depth is not None else ("all" if depths is None else depths)
        chosen = select_depths(wanted, [int(d) for d in f.attrs["depths"]], f"in {path}")
        verify(f, chosen, [split])
        X, y = read_depths(f, split, chosen)
        attrs = {
            "path": str(path),
            "split": split,
            "identity_hash": str(f.attrs["identity_hash"]),
            **{
                k: (f.attrs[k].item() if hasattr(f.attrs[k], "item") else f.attrs[k])
                for k in ("task", "backbone", "dtype", "readout", "seed")
                if k in f.attrs
            },
        }
    if xr is None:
        return X, y, chosen
    if y.ndim == 1:
        label_dims: tuple[str, ...] = ("row",)
    elif y.ndim == 3 and y.shape[1] == X.shape[2]:
        label_dims = ("row", "readout", "output")
    else:
        label_dims = ("row", *(f"label_axis{i}" for i in range(1, y.ndim)))
    return xr.Dataset(
        {"features": (("row", "depth", "readout", "feature"), X), "labels": (label_dims, y)},
        coords={"row": np.arange(len(X)), "depth": np.asarray(chosen, dtype=np.int64)},
        attrs=attrs,
    )


class FeatureDataset(torch.utils.data.Dataset):
    """One depth of one split of a feature file as a torch ``Dataset`` of ``(features, label)``.

    Rows are read lazily: the file is opened on the first read in each process (so every
    ``DataLoader`` worker opens its own handle; an HDF5 handle never crosses a fork), and a read
    fetches the chunk holding the row, checked by its Fletcher-32 checksum, keeping it for the rows
    after it: reading in order reads each chunk once, while fully random access (``shuffle=True``)
    reads a chunk a row; for a split that fits in memory,
    [`read_features`][reservoir.api.read_features] and a ``TensorDataset`` are faster. ``features``
    is a float32 tensor ``(n_readout * d_model,)`` (as [`read_features`][reservoir.api.read_features]
    with ``depth`` gives a row), ``label`` an int64 tensor (a scalar, or ``(n_readout, bits)``).

    Parameters
    ----------
    path : str or Path
        A complete feature file.
    split : str
        A split it holds.
    depth : int
        A depth it holds.
    verify : bool
        Check the depth and labels against the digests recorded when the file was completed
        before the first row is served (one pass over the depth; ``False`` skips it).

    Raises
    ------
    ValueError
        A split or depth the file lacks ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.StoreError
        A file that fails verification, or a row that cannot be read or is not finite.

    Examples
    --------
    >>> from torch.utils.data import DataLoader
    >>> data = FeatureDataset(path, "train", depth=2)                # doctest: +SKIP
    >>> for X, y in DataLoader(data, batch_size=64, shuffle=True, num_workers=2):  # doctest: +SKIP
    ...     loss = torch.nn.functional.cross_entropy(model(X), y)
    """

    def __init__(self, path: str | Path, split: str, depth: int, *, verify: bool = True):
        from reservoir.extract.store import depth_index, feature_splits, open_features
        from reservoir.extract.store import verify as verify_file

        self.path, self.split = Path(path), split
        with open_features(self.path) as f:
            if split not in f:
                raise UsageError(f"split {split!r} is not in {self.path}; it holds {feature_splits(f)}")
            self._k = depth_index(f, depth)
            self.depth = int(f.attrs["depths"][self._k])  # a negative depth, as the file's depth it names
            if verify:
                verify_file(f, [self.depth], [split])
            ds = f[split]["features"]
            self.labels = f[split]["labels"][:]
            self._rows = ds.chunks[0] if ds.chunks else 1
        self._file = self._pid = self._block = None

    def __len__(self) -> int:
        return len(self.labels)

    def _features(self):
        if self._file is None or self._pid != os.getpid():  # first read in this process (a worker)
            from reservoir.extract.store import open_features

            self._file, self._pid, self._block = open_features(self.path), os.getpid(), None
        return self._file[self.split]["features"]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.labels)
        i = int(index) + (n if int(index) < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"row {index} is out of range: split {self.split!r} of {self.path} has {n} rows")
        ds = self._features()
        start = i // self._rows * self._rows
        if self._block is None or self._block[0] != start:
            where = f"{self.path}: split {self.split!r}, depth {self.depth}"
            try:
                block = as_float32(ds[start : start + self._rows, self._k])
            except OSError as e:
                raise StoreError(
                    f"{where} cannot be read ({str(e).splitlines()[0]}); the file is corrupt: delete "
                    "it and extract again"
                ) from None
            if not np.isfinite(block).all():
                raise StoreError(f"{where} holds NaN or inf features; delete the file and extract again")
            self._block = (start, block)
        row = self._block[1][i - start]
        return torch.from_numpy(np.array(row, dtype=np.float32).reshape(-1)), torch.as_tensor(self.labels[i])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # a pickled copy (spawned worker) opens its own
        state["_file"] = state["_pid"] = state["_block"] = None
        return state

    def close(self) -> None:
        """Close this process's handle (a later read opens it again)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = self._pid = self._block = None

"""The HDF5 feature store: one file per (task, backbone).

Layout::

    /                      attrs: task, backbone, seed, dtype, depths, config (JSON), version, complete
    /input_layer/<name>    float32 tensors of the frozen input layer
    /<split>/features      (N, n_depths, n_readout, d_model) float32, chunked (rows, 1, R, d):
                           one depth of a row block is one chunk, so a depth reads contiguously
    /<split>/labels        (N, *label_shape) int64
    /<split>/lengths       (N,) real tokens per example
    /<split>/done          (N,) bool, rows written so far; attrs rows_done

A run writes ``FILE.partial`` and renames it to ``FILE`` only when every row of every
split is written (``complete`` set), so a half-written file is never taken for a
complete one; a killed run resumes from the ``.partial`` file. Datasets are created
without timestamps, so the same command with the same seed writes the same bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np

from reservoir import __version__

CHUNK_BYTES = 1 << 20
#: config keys that must match for a ``.partial`` file to be resumed
IDENTITY_KEYS = ("task", "task_options", "backbone", "seed", "dtype", "depths", "limit", "readout", "splits")


class StoreError(RuntimeError):
    pass


def partial_path(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


class FeatureWriter:
    """Incremental, resumable writer. Use :meth:`open`, then ``split``/``write``, then :meth:`finish`."""

    def __init__(self, path: Path, f: h5py.File):
        self.path, self.f = path, f

    @classmethod
    def open(cls, path: Path, config: dict[str, Any], input_layer: dict[str, Any]) -> "FeatureWriter":
        """Open ``path.partial`` for writing, resuming it when its identity matches ``config``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = partial_path(path)
        if tmp.exists():
            try:
                f = h5py.File(tmp, "r+")
                old = json.loads(f.attrs["config"])
            except (OSError, KeyError, ValueError):
                os.remove(tmp)  # unreadable leftovers of a killed run hold nothing to resume
            else:
                diff = [k for k in IDENTITY_KEYS if old.get(k) != config.get(k)]
                if diff:
                    f.close()
                    raise StoreError(
                        f"{tmp} is an unfinished run with different settings ({', '.join(f'{k}={old.get(k)!r}' for k in diff)}); "
                        "rerun with the same options to resume it, or delete it to start over")
                return cls(path, f)
        f = h5py.File(tmp, "w", track_order=False)
        f.attrs.update({k: config[k] for k in ("task", "backbone", "seed", "dtype")})
        f.attrs["depths"] = np.asarray(config["depths"], dtype=np.int64)
        f.attrs["config"] = json.dumps(config, sort_keys=True)
        f.attrs["version"] = __version__
        f.attrs["complete"] = False
        g = f.create_group("input_layer")
        for name, tensor in input_layer.items():
            g.create_dataset(name, data=np.asarray(tensor, dtype=np.float32), track_times=False)
        return cls(path, f)

    def split(self, name: str, labels: np.ndarray, lengths: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
        """Create (or reopen) a split; returns its ``done`` mask."""
        if name in self.f:
            return self.f[name]["done"][:]
        n = len(labels)
        g = self.f.create_group(name)
        rows = max(1, min(n, CHUNK_BYTES // (4 * shape[1] * shape[2])))
        g.create_dataset("features", shape=(n, *shape), dtype=np.float32, chunks=(rows, 1, *shape[1:]),
                         track_times=False)
        g.create_dataset("labels", data=labels, track_times=False)
        g.create_dataset("lengths", data=lengths, track_times=False)
        g.create_dataset("done", shape=(n,), dtype=bool, fillvalue=False, track_times=False)
        g.attrs["rows_done"] = 0
        return np.zeros(n, dtype=bool)

    def write(self, split: str, rows: np.ndarray, features: np.ndarray) -> None:
        """Write ``features`` for the (increasing) row indices ``rows``, then mark them done."""
        g = self.f[split]
        if len(rows) and np.all(np.diff(rows) == 1):
            sel = slice(int(rows[0]), int(rows[-1]) + 1)
        else:
            sel = rows
        g["features"][sel] = features
        g["done"][sel] = True
        g.attrs["rows_done"] = int(g.attrs["rows_done"]) + len(rows)
        self.f.flush()

    def finish(self) -> Path:
        """Mark complete and move into place; returns the final path."""
        for name, g in self.f.items():
            if name != "input_layer" and not g["done"][:].all():
                raise StoreError(f"split {name!r} of {self.path} is not fully written")
        self.f.attrs["complete"] = True
        self.f.close()
        os.replace(partial_path(self.path), self.path)
        return self.path

    def close(self) -> None:
        if self.f.id.valid:
            self.f.close()


def open_features(path: Path) -> h5py.File:
    """Open a complete feature file read-only; raises StoreError otherwise."""
    path = Path(path)
    if not path.exists():
        hint = f" (an unfinished run left {partial_path(path)}: rerun extract to resume it)" if partial_path(path).exists() else ""
        raise StoreError(f"feature file {path} does not exist{hint}; run `reservoir extract` first")
    f = h5py.File(path, "r")
    if not f.attrs.get("complete", False):
        f.close()
        raise StoreError(f"feature file {path} is not complete; rerun `reservoir extract` to finish it")
    return f


def file_config(f: h5py.File) -> dict[str, Any]:
    return json.loads(f.attrs["config"])


def depth_index(f: h5py.File, depth: int) -> int:
    depths = [int(d) for d in f.attrs["depths"]]
    if depth not in depths:
        raise ValueError(f"depth {depth} is not in {f.filename}; it holds depths {depths}")
    return depths.index(depth)


def read_depth(f: h5py.File, split: str, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Features ``(N, n_readout, d_model)`` and labels of one depth of one split."""
    if split not in f:
        raise ValueError(f"split {split!r} is not in {f.filename}; it holds {[k for k in f if k != 'input_layer']}")
    return f[split]["features"][:, depth_index(f, depth)], f[split]["labels"][:]


def iter_depth(f: h5py.File, split: str, depth: int, rows: int = 4096,
               select: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream one depth in blocks of ``rows`` (memory stays flat for out-of-core heads); with
    ``select`` (increasing row indices) only those rows."""
    k = depth_index(f, depth)
    ds, labels = f[split]["features"], f[split]["labels"]
    for start in range(0, ds.shape[0] if select is None else len(select), rows):
        index = slice(start, start + rows) if select is None else select[start:start + rows]
        yield ds[index, k], labels[index]


def dask_features(f: h5py.File, split: str):
    """The features of a split as a dask array with the file's chunking (lazy, out of core)."""
    import dask.array as da

    ds = f[split]["features"]
    return da.from_array(ds, chunks=ds.chunks)

"""Your own data as a task: ``--task file:PATH`` with an ``.npz`` or ``.h5``/``.hdf5`` file.

Arrays (names are case-sensitive):

- ``x``: ``(N, T, d)`` floats (dense tokens of ``d`` values) or ``(N, T)`` integers (token ids,
  0 reserved for padding when ``lengths`` is given),
- ``y``: ``(N,)`` integer class labels in ``0..n_classes-1``,
- ``lengths`` (optional): ``(N,)`` real tokens per example, for right-padded variable-length
  data (the readout is then the last real token, never padding),
- splits (optional), either ``split``: ``(N,)`` strings naming each row's split (``train``,
  ``test`` and optionally ``val``; any others are kept too), or separate arrays ``x_train``,
  ``y_train``, ``x_test``, ``y_test`` (and ``x_val``/``y_val``, ``lengths_<split>``) as in
  Keras' ``mnist.npz``. Without either, a seeded stratified ``test_fraction`` of the rows
  (0.2 by default) becomes ``test``.

Options (``--task-opt key=value``): ``n_classes`` (default: largest label + 1 over every
split), ``test_fraction``, ``seed``. The file is checked when the task is built (shapes,
dtypes, finite values, ids >= 0, labels in range, lengths in ``1..T``, both ``train`` and
``test`` present), and each problem raises a DataError naming the file, the array and what
to change.

Example::

    np.savez("mine.npz", x=np.random.rand(100, 20, 3).astype("float32"), y=np.arange(100) % 4)
    reservoir extract --task file:mine.npz --backbone gpt2-random
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from reservoir.errors import UsageError, unreadable
from reservoir.tasks import (
    MAX_SEED,
    DataError,
    SplitData,
    Task,
    TaskSpec,
    _convert,
    check_value,
    option,
    pad_ids,
)

SUFFIXES = (".npz", ".h5", ".hdf5")
#: the largest class id and token id a user file may hold (an output layer, one-hot targets and an
#: embedding table are sized by them: a stray id like 2**40 would ask for terabytes)
MAX_ID = 2**20 - 1
FIX = "see `reservoir data where` for the file layout"


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        raise DataError(f"{path} does not exist; give --task file:PATH with an existing .npz or .h5 file")
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"{path} is not an .npz or .h5 file; save x and y with numpy.savez or h5py ({FIX})")
    import zipfile
    import zlib

    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        import h5py

        with h5py.File(path, "r", locking=False) as f:
            out = {k: f[k][()] for k in f if isinstance(f[k], h5py.Dataset)}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise unreadable(path, e, "write it again") from None
    return {k: _strings(v) if v.dtype.kind in "SO" else v for k, v in out.items()}


#: what a split may be called: it names a group of the feature file
SPLIT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _check_split_names(path: Path, where: str, names) -> None:
    for name in names:
        if not SPLIT_NAME.fullmatch(name) or name == "input_layer":
            raise DataError(
                f"{path}: {where} names a split {name!r}; split names are letters, digits, _ . - "
                "(not starting with . or -), other than 'input_layer': rename it (train, val, test, ...)"
            )


def _strings(v: np.ndarray) -> np.ndarray:
    """h5py gives fixed-length strings as bytes and variable-length ones as objects: make both str."""
    flat = [x.decode() if isinstance(x, bytes) else str(x) for x in v.ravel()]
    return np.array(flat, dtype=str).reshape(v.shape)


@dataclass(init=False)
class FileTask(Task):
    """A task read from a user's .npz/.h5 file (``--task file:PATH``)."""

    name: ClassVar[str] = "file"
    path: str = ""
    n_classes: int = option(0, low=0, high=MAX_ID + 1)
    test_fraction: float = option(0.2, above=0, below=1)
    seed: int = option(0, low=0, high=MAX_SEED)

    def __init__(self, path: str, **options: Any):
        fields = {f.name: f for f in dataclasses.fields(self) if f.name != "path"}
        for key in options:
            if key not in fields:
                raise UsageError(f"unknown option {key!r} for task file:PATH; choose from {sorted(fields)}")
        self.path = str(path)
        for key, f in fields.items():
            setattr(self, key, _convert(options[key], f.type, key) if key in options else f.default)
            check_value("file:PATH", key, getattr(self, key), f.metadata)
        self._splits = self._read(Path(self.path))

    def identity_options(self) -> dict[str, Any]:
        """Where the file lies is not part of the identity; its contents are (the data fingerprint)."""
        return {k: v for k, v in self.options().items() if k != "path"}

    # -- reading and checking -------------------------------------------------------------
    def _read(self, path: Path) -> dict[str, SplitData]:
        arrays = _read_arrays(path)
        if "x" in arrays or "y" in arrays:
            x, y = self._need(arrays, "x", path), self._need(arrays, "y", path)
            lengths = arrays.get("lengths")
            self._check(path, "x", "y", "lengths", x, y, lengths)
            rows = self._split_rows(path, arrays, y)
            splits = {
                s: self._split(x[r], y[r], None if lengths is None else lengths[r]) for s, r in rows.items()
            }
        else:
            names = sorted(k[2:] for k in arrays if k.startswith("x_"))
            if not names:
                raise DataError(
                    f"{path} has arrays {sorted(arrays)}; it needs x and y (or x_train, y_train, "
                    f"x_test, y_test) ({FIX})"
                )
            _check_split_names(path, "an x_<split> array", names)
            splits = {}
            for s in names:
                x, y = arrays[f"x_{s}"], self._need(arrays, f"y_{s}", path)
                lengths = arrays.get(f"lengths_{s}")
                self._check(path, f"x_{s}", f"y_{s}", f"lengths_{s}", x, y, lengths)
                splits[s] = self._split(x, y, lengths)
        for s in ("train", "test"):
            if s not in splits or not len(splits[s]):
                raise DataError(
                    f"{path} has no (or an empty) {s!r} split; splits found: {sorted(splits)}. "
                    "Give a split array with 'train' and 'test' rows, x_train/x_test arrays, or neither"
                )
        dims = {self._dim(d) for d in splits.values()}
        if len(dims) > 1:
            raise DataError(
                f"{path}: the splits disagree on the token width ({sorted(dims)}); every x_<split> "
                "must have the same last dimension (or all be integer ids)"
            )
        self._kind = "ids" if self._dim(next(iter(splits.values()))) == 0 else "dense"
        labels = np.concatenate([d.labels for d in splits.values()])
        top = int(labels.max()) + 1
        if self.n_classes and top > self.n_classes:
            split, row = next(
                (s, int(np.argmax(d.labels >= self.n_classes)))
                for s, d in splits.items()
                if (d.labels >= self.n_classes).any()
            )
            raise DataError(
                f"{path}: label {splits[split].labels[row]} (split {split!r}, row {row}) is out of range "
                f"for n_classes={self.n_classes}; labels must be in 0..{self.n_classes - 1}"
            )
        self._n_classes = self.n_classes or top
        self._seq_len = max(int(d.lengths.max()) for d in splits.values())
        self._vocab = (
            max(int(max(s.max() for s in d.inputs)) for d in splits.values()) + 1
            if self._kind == "ids"
            else 0
        )
        return splits

    @staticmethod
    def _need(arrays: dict[str, np.ndarray], key: str, path: Path) -> np.ndarray:
        if key not in arrays:
            raise DataError(f"{path} has no array {key!r} (it has {sorted(arrays)}); {FIX}")
        return arrays[key]

    @staticmethod
    def _check(path, xname, yname, lname, x, y, lengths) -> None:
        shape = "(N, T, d) floats or (N, T) integer ids"
        if (
            x.dtype.kind not in "fiu"
            or x.ndim not in (2, 3)
            or (x.ndim == 3 and x.dtype.kind != "f")
            or (x.ndim == 2 and x.dtype.kind == "f")
        ):
            raise DataError(
                f"{path}: {xname} is {x.dtype} with shape {x.shape}; expected {shape} "
                "(integer ids need an integer dtype; a single feature per token is (N, T, 1))"
            )
        if 0 in x.shape:
            raise DataError(f"{path}: {xname} is empty (shape {x.shape}); {FIX}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise DataError(f"{path}: {xname} holds NaN or infinite values; replace them before extracting")
        if x.dtype.kind in "iu" and x.min() < 0:
            raise DataError(f"{path}: {xname} holds negative token ids (min {x.min()}); ids must be >= 0")
        if x.dtype.kind in "iu" and x.max() > MAX_ID:
            raise DataError(
                f"{path}: {xname} holds token id {x.max()}; ids must be at most {MAX_ID:,d} (the input "
                "layer holds a vector per id): renumber them 0..V-1"
            )
        if y.ndim != 1 or len(y) != len(x):
            raise DataError(
                f"{path}: {yname} has shape {y.shape}; expected ({len(x)},), one label per row of {xname}"
            )
        if y.dtype.kind == "f" and not (np.isfinite(y).all() and (y == np.round(y)).all()):
            raise DataError(
                f"{path}: {yname} holds non-integer values; give class ids 0..C-1 "
                "(sklearn.preprocessing.LabelEncoder turns names into ids)"
            )
        if y.dtype.kind not in "fiub":
            raise DataError(
                f"{path}: {yname} is {y.dtype}; give integer class ids 0..C-1 "
                "(sklearn.preprocessing.LabelEncoder turns names into ids)"
            )
        if y.min() < 0:
            raise DataError(
                f"{path}: {yname} has label {y.min()} (row {int(np.argmin(y))}); labels must be in 0..C-1"
            )
        if y.max() > MAX_ID:
            raise DataError(
                f"{path}: {yname} has label {y.max()} (row {int(np.argmax(y))}), not a class id: labels must "
                f"be 0..C-1 with C at most {MAX_ID + 1:,d}; relabel them (sklearn.preprocessing.LabelEncoder)"
            )
        if lengths is not None:
            if lengths.shape != (len(x),) or lengths.dtype.kind not in "iu":
                raise DataError(
                    f"{path}: {lname} is {lengths.dtype} {lengths.shape}; expected ({len(x)},) integers"
                )
            if lengths.min() < 1 or lengths.max() > x.shape[1]:
                raise DataError(
                    f"{path}: {lname} must lie in 1..{x.shape[1]} (the T of {xname}); "
                    f"found {lengths.min()}..{lengths.max()}"
                )

    def _split_rows(self, path: Path, arrays: dict[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        if "split" in arrays:
            split = np.asarray(arrays["split"]).astype(str)
            if split.shape != y.shape:
                raise DataError(
                    f"{path}: split has shape {split.shape}; expected ({len(y)},), one name per row"
                )
            order = ["train", "val", "test"] + sorted(str(s) for s in set(split) - {"train", "val", "test"})
            _check_split_names(path, "the split array", order[3:])
            return {s: np.flatnonzero(split == s) for s in order if (split == s).any()}
        from sklearn.model_selection import train_test_split

        rows = np.arange(len(y))
        n_test = int(np.ceil(self.test_fraction * len(y)))  # as scikit-learn rounds a fraction
        if n_test >= len(y):
            raise DataError(
                f"{path} has {len(y)} rows without a split array: holding out test_fraction "
                f"{self.test_fraction:g} leaves none to train on; give more rows, a lower test_fraction, "
                "or a split array naming each row's split"
            )
        counts = np.bincount(y.astype(np.int64))
        classes = int((counts > 0).sum())
        # stratified when every class can go to both sides (scikit-learn refuses otherwise)
        strat = y if counts[counts > 0].min() >= 2 and classes <= min(n_test, len(y) - n_test) else None
        train, test = train_test_split(rows, test_size=n_test, random_state=self.seed, stratify=strat)
        return {"train": np.sort(train), "test": np.sort(test)}

    @staticmethod
    def _split(x: np.ndarray, y: np.ndarray, lengths: np.ndarray | None) -> SplitData:
        y = y.astype(np.int64)
        if lengths is None:
            return SplitData(x, y, np.full(len(y), x.shape[1], dtype=np.int64))
        lengths = lengths.astype(np.int64)
        inputs = np.empty(len(y), dtype=object)
        inputs[:] = [row[:n] for row, n in zip(x, lengths)]
        return SplitData(inputs, y, lengths)

    @staticmethod
    def _dim(d: SplitData) -> int:
        first = d.inputs[0]
        return 0 if np.asarray(first).dtype.kind in "iu" else np.asarray(first).shape[-1]

    # -- the Task interface ---------------------------------------------------------------
    @property
    def spec(self) -> TaskSpec:
        variable = any(d.inputs.dtype == object for d in self._splits.values())
        dim = self._dim(next(iter(self._splits.values())))
        return TaskSpec(
            f"file:{self.path}",
            self._kind,
            seq_len=self._seq_len,
            n_classes=self._n_classes,
            token_dim=dim,
            vocab_size=self._vocab,
            splits=tuple(self._splits),
            variable_length=variable,
            pad_id=0,
        )

    def options(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "n_classes": self.n_classes,
            "test_fraction": self.test_fraction,
            "seed": self.seed,
        }

    def load(self, split: str, data_dir: Path, limit: int | None = None) -> SplitData:
        self.check_split(split)
        return self._splits[split].head(limit)

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        if inputs.dtype != object:
            return inputs.astype(np.int64) if self._kind == "ids" else inputs.astype(np.float32)
        if self._kind == "ids":
            return pad_ids(list(inputs), 0)
        width = max(len(s) for s in inputs)
        out = np.zeros((len(inputs), width, inputs[0].shape[-1]), dtype=np.float32)
        for i, s in enumerate(inputs):
            out[i, : len(s)] = s
        return out

"""Your own data as a task: ``--task file:PATH`` with an ``.npz`` or ``.h5``/``.hdf5`` file (or a table
or image source: :mod:`reservoir.tasks.streams`).

Arrays (names are case-sensitive): ``x``, ``(N, T, d)`` floats or ``(N, T)`` integer token ids (0 is the
padding id when ``lengths`` is given); ``y``, ``(N,)`` class ids ``0..n_classes-1`` or class names
(numbered in natural order over every split, ``2`` before ``10``, and kept as the task's class names);
optionally ``lengths``, ``(N,)`` real tokens of right-padded rows (the readout is then the last real
token); optionally the splits, as a ``split`` array of names or as Keras-style ``x_train``, ``y_train``,
``x_test``, ``y_test`` (and ``val``, ``lengths_<split>``). Without either, a seeded stratified
``test_fraction`` of the rows becomes ``test``. An ``.npz`` is read whole, an ``.h5`` file's ``x`` arrays
a chunk at a time. Every problem raises a DataError naming the file, the array and what to change.

Data to predict on (``predict=true``, what ``reservoir predict --data PATH`` reads): every row of the
source is one split, ``predict``, in input order (``x_<split>`` arrays, split files and folders follow
each other in the order train, val, test, then the others). Labels are optional: without them the task
is unlabeled (its ``unlabeled`` says why) and stores ``-1`` as each label. Such a task has no ``train``
or ``test`` split, so ``fit`` and ``train`` refuse it.

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
from reservoir.paths import FILE_TASK
from reservoir.settings import Interval, OneOf, setting
from reservoir.tasks import (
    MAX_SEED,
    PREFIXED,
    DataError,
    SplitData,
    Task,
    TaskSpec,
    _convert,
    check_value,
    pad_ids,
    patches,
)
from reservoir.tasks.labels import MAX_ID, as_text, check_labels, class_ids, common_names, renumbered_as
from reservoir.tasks.layouts import Part, image_parts, kind_of, ordered, table_parts
from reservoir.tasks.streams import (
    UNREADABLE_FLOATS,
    ChainedChunks,
    Chunks,
    H5Chunks,
    ImageChunks,
    Images,
    Rows,
    parse_size,
    readable_floats,
    scan,
)

FIX = "see `reservoir data where` for the file layout"
#: the split of a task read to predict on (``predict=true``): every row, in input order
PREDICT_SPLIT = "predict"
#: the label stored for each row of data without labels (``predict=true``)
NO_LABEL = -1


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, byte strings (``dtype S``) as text, as an ``.h5`` file's are read."""
    import zipfile
    import zlib

    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        return {k: as_text(v) if v.dtype.kind == "S" else v for k, v in arrays.items()}
    except ValueError as e:
        if "Object arrays" in str(e):  # read only with pickle, which runs code: never
            raise DataError(
                f"{path} holds an array of Python objects (pandas' .values of text, mixed types); save each array "
                "with a plain dtype: y.astype(str) for class names, x.astype('float32') or ids as integers"
            ) from None
        raise unreadable(path, e, "write it again") from None
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise unreadable(path, e, "write it again") from None


def _read_h5(path: Path) -> tuple[dict[str, np.ndarray], dict[str, tuple[tuple[int, ...], np.dtype]]]:
    """An ``.h5`` file's small arrays, read, and the shapes and dtypes of its ``x`` and ``x_<split>`` arrays."""
    import h5py

    try:
        with h5py.File(path, "r", locking=False) as f:
            if "identity" in f.attrs and "input_layer" in f:
                raise DataError(
                    f"{path} is a feature file `reservoir extract` wrote, not data: pass it as --features (to "
                    "fit, predict or export), and the data it was made of as --task file:PATH or --data"
                )
            sets = {k: f[k] for k in f if isinstance(f[k], h5py.Dataset)}
            big = {k: (v.shape, v.dtype) for k, v in sets.items() if k == "x" or k.startswith("x_")}
            out = {k: v[()] for k, v in sets.items() if k not in big}
    except (OSError, ValueError, EOFError, KeyError) as e:
        raise unreadable(path, e, "write it again") from None
    return {k: as_text(v) if v.dtype.kind in "SO" else v for k, v in out.items()}, big


#: what a split may be called: it names a group of the feature file
SPLIT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def no_x_arrays(path: Path, arrays) -> DataError:
    """The error for a file holding neither ``x`` nor any ``x_<split>`` array."""
    return DataError(
        f"{path} has arrays {sorted(arrays)}; it needs x and y (or x_train, y_train, x_test, y_test) ({FIX})"
    )


def _check_split_names(path: Path, where: str, names) -> None:
    for name in names:
        if not SPLIT_NAME.fullmatch(name) or name == "input_layer":
            raise DataError(
                f"{path}: {where} names a split {name!r}; split names are letters, digits, _ . - "
                "(not starting with . or -), other than 'input_layer': rename it (train, val, test, ...)"
            )


def _h5(chunks: Chunks) -> bool:
    """Rows of .h5 arrays (whose labels and lengths are checked with the file's small arrays)."""
    parts = chunks.parts if isinstance(chunks, ChainedChunks) else [chunks]
    return all(isinstance(c, H5Chunks) for c in parts)


@PREFIXED.register(FILE_TASK)
@dataclass(init=False)
class FileTask(Task):
    """A task read from a user's file or folder (``--task file:PATH``): .npz, .h5, Parquet, Arrow, a
    datasets folder or an image folder."""

    name: ClassVar[str] = "file"
    path: str = ""
    n_classes: int = setting(0, Interval(0, MAX_ID + 1))
    test_fraction: float = setting(0.2, Interval(0, 1, closed="neither"))
    seed: int = setting(0, Interval(0, MAX_SEED))
    input: str = ""
    target: str = ""
    split: str = ""
    patch: int = setting(4, Interval(1, 1024))
    image_size: str = ""
    mode: str = setting("", OneOf(("", "RGB", "L")))
    regression: bool = False
    predict: bool = False
    vocab_size: int = setting(0, Interval(0, MAX_ID + 1))

    #: options every identity records; the others only when set (older files keep their identity)
    RECORDED: ClassVar[tuple[str, ...]] = ("n_classes", "test_fraction", "seed")
    #: class names labels must be among, numbered by their place here (:meth:`to_predict`)
    _known: ClassVar[list[str] | None] = None
    #: the options the user gave, which must each change how the data is read; ``None``: every one passed
    _given: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def named(cls, path: str, **options: Any) -> FileTask:
        """The task of ``file:PATH`` (:data:`reservoir.tasks.PREFIXED`)."""
        return cls(path, **options)

    @classmethod
    def to_predict(
        cls, path: str, classes: list[str] | None = None, given: Any = None, **options: Any
    ) -> FileTask:
        """Every row of ``file:PATH`` as data to predict on (``predict=true``, module docstring), labels where
        it has them. ``classes`` (a probe's class names) numbers labels given as names and class folders by
        their place in it, so that an id means the probe's class; a name outside it is refused. ``given``:
        the options the user gave (the rest are the probe's, passed over where the data does not read them);
        ``None``: all of them."""
        task = cls.__new__(cls)
        task._known = [str(c) for c in classes] if classes else None
        task._given = tuple(options) if given is None else tuple(given)
        task.__init__(path, **{**options, "predict": True})
        return task

    @classmethod
    def recorded(cls, path: str, **options: Any) -> FileTask:
        """The task a feature file's identity records (its ``task_options``), read as it was extracted."""
        task = cls.__new__(cls)
        task._given = ()
        task.__init__(path, **options)
        return task

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
        given = options if self._given is None else self._given
        self._refuse_unread([k for k in given if getattr(self, k) != fields[k].default])

    def identity_options(self) -> dict[str, Any]:
        """Where the file lies is not part of the identity; its contents are (the data fingerprint)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {
            k: v
            for k, v in self.options().items()
            if k != "path" and (k in self.RECORDED or v != defaults[k])
        }

    # -- reading and checking -------------------------------------------------------------
    def _read(self, path: Path) -> dict[str, SplitData]:
        kind = kind_of(path)
        self._images = Images(parse_size(self.image_size), self.mode)
        self._image = False
        self._names: list[str] | None = None
        self._files: list[str] | None = None
        #: why the data has no labels (``predict=true`` only); ``None`` where it has them
        self.unlabeled: str | None = None
        self._kind_read, self._drawn = kind, False
        if kind == "npz":
            arrays = _read_arrays(path)
            splits = self._read_npz(path, self._named(path, self._joined_arrays(path, arrays)))
            dims = {s: self._dim(d) for s, d in splits.items()}
            ids = not any(dims.values())
            tops = {s: max(int(r.max()) for r in d.inputs) if ids else 0 for s, d in splits.items()}
            self.took = [f"{path}: arrays {', '.join(sorted(arrays))}"]
        else:
            parts = self._h5_parts(path) if kind == "h5" else self._source_parts(path, kind)
            #: where the inputs and labels were read, each source in words (``reservoir data verify`` says it)
            self.took = list(dict.fromkeys(f"{p.where}, labels: {p.target}" for p in parts))
            splits, dims, tops = self._read_parts(path, self._joined(path, parts) if self.predict else parts)
        for s in (PREDICT_SPLIT,) if self.predict else ("train", "test"):
            if s not in splits or not len(splits[s]):
                raise DataError(
                    f"{path} has no (or an empty) {s!r} split; splits found: {sorted(splits)}. "
                    "Give a split array with 'train' and 'test' rows, x_train/x_test arrays, or neither (to "
                    "predict on every row of it with a fitted probe: `reservoir predict --probe P --data PATH`)"
                )
        if len(set(dims.values())) > 1:
            raise DataError(
                f"{path}: the splits disagree on the token width ({sorted(set(dims.values()))}); every x_<split> "
                "must have the same last dimension (or all be integer ids)"
            )
        self._token_dim = next(iter(dims.values()))
        self._kind = "ids" if self._token_dim == 0 else "dense"
        self._seq_len = max(int(d.lengths.max()) for d in splits.values())
        first = next(iter(splits.values())).labels
        self._outputs = first.shape[2] if first.ndim == 3 else 1
        self._vocab = max(tops.values()) + 1 if self._kind == "ids" else 0
        if self.vocab_size and self._kind == "ids":
            if self._vocab > self.vocab_size:
                raise DataError(
                    f"{path} holds token id {self._vocab - 1}, beyond vocab_size={self.vocab_size} (ids "
                    f"0..{self.vocab_size - 1}, a vector each in the input layer; a probe reads its training data's "
                    "ids alone): "
                    + (
                        "predict on data of the probe's ids"
                        if self.predict and (self._given is None or "vocab_size" not in self._given)
                        else "renumber the ids, or leave vocab_size out to size it by the data"
                    )
                )
            self._vocab = self.vocab_size
        if self.unlabeled is not None:
            self._n_classes = max(self.n_classes, len(self._names or ()), 1)
            return splits
        if self.regression:
            if self.n_classes:
                raise DataError(
                    f"{path}: n_classes={self.n_classes} was given with regression=true; regression targets "
                    "have no classes: drop n_classes"
                )
            self._n_classes = 1
            return splits
        labels = np.concatenate([d.labels for d in splits.values()])
        top = max(int(labels.max()) + 1, len(self._names or ()))
        if self.n_classes and top > self.n_classes and int(labels.max()) < self.n_classes:
            raise DataError(
                f"{path} names {len(self._names or ())} classes ({', '.join((self._names or [])[:10])}), more than "
                f"n_classes={self.n_classes}; drop n_classes (the names number the classes) or give "
                f"n_classes={len(self._names or ())}"
            )
        if self.n_classes and top > self.n_classes:
            split, row = next(
                (s, int(np.argmax((d.labels >= self.n_classes).reshape(len(d.labels), -1).any(1))))
                for s, d in splits.items()
                if (d.labels >= self.n_classes).any()
            )
            raise DataError(
                f"{path}: label {splits[split].labels[row]} (split {split!r}, row {row}) is out of range "
                f"for n_classes={self.n_classes}; labels must be in 0..{self.n_classes - 1}"
            )
        self._n_classes = self.n_classes or top
        return splits

    #: the options some data do not read: what each needs of the data (``table``: a table's columns,
    #: ``images``, ``ids``: token ids, ``drawn``: a test split drawn from rows without splits) and what it does
    READS: ClassVar[dict[str, tuple[str, str]]] = {
        "input": ("table", "names a table's input column (Parquet, Arrow, datasets)"),
        "target": ("table", "names a table's label column (Parquet, Arrow, datasets)"),
        "split": ("table", "names a table's split column (Parquet, Arrow, datasets)"),
        "patch": ("images", "cuts images into patches"),
        "image_size": ("images", "resizes images"),
        "mode": ("images", "converts images"),
        "vocab_size": ("ids", "sizes a vocabulary of token ids"),
        "test_fraction": ("drawn", "sizes the test split drawn from rows without splits"),
        "seed": ("drawn", "seeds the test split drawn from rows without splits"),
    }

    def _refuse_unread(self, given: list[str]) -> None:
        """Refuse an option given for data that does not read it: it would change nothing but the feature
        file's name."""
        path, kind = self.path, self._kind_read
        has = {
            "table": kind in ("table", "dataset"),
            "images": self._image,
            "ids": self._kind == "ids",
            "drawn": self._drawn,
        }
        held = "images" if self._image else "token ids" if self._kind == "ids" else "tokens of real values"
        lacks = {
            "table": f"an .{kind} file's arrays are read by their names (x, y, split, or x_<split>, y_<split>)"
            if kind in ("npz", "h5")
            else "an image folder's images are the inputs, their class folders the labels and split folders "
            "the splits",
            "images": f"it holds {held}",
            "ids": f"it holds {held}",
            "drawn": "data to predict on is read whole, every row in input order"
            if self.predict
            else f"it gives its splits ({', '.join(self._splits)})",
        }
        for key in given:
            need, does = self.READS.get(key, (None, ""))
            if need is not None and not has[need]:
                raise DataError(
                    f"--task-opt {key}={getattr(self, key)} {does} and does not apply to {path}: {lacks[need]}; "
                    f"drop the option ({FIX})"
                )

    def _joined_arrays(self, path: Path, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """An .npz's arrays to predict on: the ``x_<split>`` (and ``y_<split>``) arrays joined in split order."""
        names = ordered([k[2:] for k in arrays if k.startswith("x_")])
        if not self.predict or "x" in arrays or "y" in arrays or not names:
            return arrays
        xs = [arrays[f"x_{s}"] for s in names]
        if len({(x.dtype.kind, x.shape[1:]) for x in xs}) > 1:
            raise DataError(
                f"{path}: the x_<split> arrays differ past their rows ({[x.shape for x in xs]}); predicting "
                "reads every row as one split: save the rows to predict on as one array x"
            )
        out = {"x": np.concatenate(xs)}
        if all(f"y_{s}" in arrays for s in names):
            out["y"] = np.concatenate([arrays[f"y_{s}"] for s in names])
        if any(f"lengths_{s}" in arrays for s in names):
            out["lengths"] = np.concatenate(
                [arrays.get(f"lengths_{s}", np.full(len(x), x.shape[1])) for s, x in zip(names, xs)]
            )
        return out

    def _array_names(self, path: Path, arrays) -> dict[str | None, tuple[str, str, str]]:
        """The x, y and lengths arrays of a file holding ``arrays`` (their names): ``x``, ``y``, ``lengths``
        under ``None`` (rows the split array or the seeded split divides), else those of each ``x_<split>``."""
        if "x" in arrays or "y" in arrays:
            self._need(dict.fromkeys(arrays), "x", path)
            split_arrays = sorted(k for k in arrays if k.startswith(("x_", "y_")))
            if split_arrays:
                raise DataError(
                    f"{path} holds both x (rows the split array or a drawn test split divides) and split arrays "
                    f"({', '.join(split_arrays)}), which would be passed over; keep one layout: x and y, or "
                    "x_<split> and y_<split> arrays"
                )
            return {None: ("x", "y", "lengths")}
        found = (ordered if self.predict else sorted)([k[2:] for k in arrays if k.startswith("x_")])
        if not found:
            raise no_x_arrays(path, arrays)
        _check_split_names(path, "an x_<split> array", found)
        return {s: (f"x_{s}", f"y_{s}", f"lengths_{s}") for s in found}

    def _read_npz(self, path: Path, arrays: dict[str, np.ndarray]) -> dict[str, SplitData]:
        splits = {}
        for split, (xname, yname, lname) in self._array_names(path, arrays).items():
            x, lengths = arrays[xname], arrays.get(lname)
            y = arrays.get(yname) if self.predict else self._need(arrays, yname, path)
            if y is None:
                self.unlabeled = f"{path} has no array {yname!r}"
            self._check(path, xname, yname, lname, x, y, lengths)
            if split is not None:
                splits[split] = self._split(x, y, lengths)
                continue
            rows = {PREDICT_SPLIT: np.arange(len(x))} if self.predict else self._split_rows(path, arrays, y)
            for s, r in rows.items():
                splits[s] = self._split(
                    x[r], None if y is None else y[r], None if lengths is None else lengths[r]
                )
        return splits

    def _h5_parts(self, path: Path) -> list[Part]:
        """An .h5 file's x (or each x_<split>) as a part read a chunk at a time, its small arrays checked."""
        arrays, big = _read_h5(path)
        arrays = self._named(path, arrays)
        parts = []
        for split, (xname, yname, lname) in self._array_names(path, [*arrays, *big]).items():
            shape, dtype = big[xname]
            y = arrays.get(yname) if self.predict else self._need(arrays, yname, path)
            lengths = arrays.get(lname)
            self._check_x(f"{path}: {xname}", dtype, shape)
            if y is not None:
                check_labels(path, xname, yname, y, shape[0], self.regression)
            self._check_lengths(path, xname, lname, lengths, shape)
            if (
                split is None
                and "split" in arrays
                and arrays["split"].shape != (shape[0],)
                and not self.predict
            ):
                raise DataError(
                    f"{path}: split has shape {arrays['split'].shape}; expected ({shape[0]},), one name per row"
                )
            parts.append(
                Part(
                    H5Chunks(path, xname, shape, dtype),
                    y,
                    f"{path}: {xname}",
                    yname if y is not None else f"{path} has no array {yname!r}",
                    split,
                    arrays.get("split") if split is None else None,
                    cut=None if lengths is None else lengths.astype(np.int64),
                )
            )
        return parts

    def _joined(self, path: Path, parts: list[Part]) -> list[Part]:
        """The parts of a source to predict on as one part, labelled only where every part is."""
        if len(parts) == 1:
            return parts
        bare = [p for p in parts if p.labels is None]
        shapes = {p.labels.shape[1:] for p in parts if p.labels is not None}
        if len(shapes) > 1:
            raise DataError(
                f"{path}: the parts' labels differ in shape ({sorted(shapes)}); give one kind of label"
            )
        cut = None
        if any(p.cut is not None for p in parts):
            cut = np.concatenate(
                [p.cut if p.cut is not None else np.full(len(p.chunks), p.chunks.shape[1]) for p in parts]
            )
        return [
            Part(
                ChainedChunks([p.chunks for p in parts]),
                None if bare else np.concatenate([p.labels for p in parts]),
                str(path),
                bare[0].target if bare else parts[0].target,
                image=parts[0].image,
                cut=cut,
                names=parts[0].names,
            )
        ]

    def _source_parts(self, path: Path, kind: str) -> list[Part]:
        if kind == "images":
            parts = image_parts(path, self._images, whole=self.predict, known=self._known)
        else:
            parts = table_parts(
                path,
                input=self.input,
                target=self.target,
                split=self.split,
                images=self._images,
                whole=self.predict,
            )
        # class ids a source names (a ClassLabel): renumbered as the probe's, or, where its splits list their
        # names in other orders, as the names of every split in natural order (an id means one class throughout)
        named_parts = [part for part in parts if part.names and part.labels is not None]
        common = self._known
        if common is None and not self.regression:
            common = common_names([part.names for part in named_parts])
        if common is not None:
            for part in named_parts:
                if list(part.names) != common:
                    part.labels, part.names = (
                        renumbered_as(path, part.labels, part.names, common),
                        list(common),
                    )
        labeled = {str(k): part.labels for k, part in enumerate(parts) if part.labels is not None}
        named = self._named(path, labeled, {str(k) for k, part in enumerate(parts) if part.names})
        for k, part in enumerate(parts):
            part.labels = named.get(str(k))
        given = {tuple(part.names) for part in parts if part.names}
        if self._names is None and len(given) == 1 and not self.regression:
            self._names = list(given.pop())
        return parts

    def _named(self, path: Path, arrays: dict[str, np.ndarray], ids_named: Any = frozenset()) -> dict:
        """Label arrays as class ids (:func:`reservoir.tasks.labels.class_ids`, the probe's classes ``_known``),
        the class names they number kept as the task's; a regression's targets as they are."""
        if self.regression:
            return arrays
        out, names = class_ids(path, arrays, self._known, ids_named)
        if names is not None:
            self._names = names
        return out

    def _read_parts(
        self, path: Path, parts: list[Part]
    ) -> tuple[dict[str, SplitData], dict[str, int], dict[str, int]]:
        """The splits of the parts, read once (:func:`reservoir.tasks.streams.scan`), with per split the token
        width (0 for ids) and the largest id."""
        splits, dims, tops = {}, {}, {}
        for part in parts:
            y = part.labels
            if not len(part.chunks):
                raise DataError(f"{part.where} holds no rows; drop it or give it rows")
            if y is None:
                self.unlabeled = part.target
            elif not _h5(part.chunks):  # an .h5 file's labels are checked with its arrays
                check_labels(path, part.where, part.target, y, len(y), self.regression)
            if self.predict:
                rows = {PREDICT_SPLIT: np.arange(len(part.chunks))}
                if isinstance(part.chunks, ImageChunks):
                    self._files = [f.relative_to(path).as_posix() for f in part.chunks.files]
            elif part.split is not None:
                _check_split_names(path, "a split folder or file", [part.split])
                rows = {part.split: np.arange(len(y))}
            else:
                arrays = {} if part.split_names is None else {"split": part.split_names}
                rows = self._split_rows(path, arrays, y)
            fixed = part.image or _h5(part.chunks)
            found = scan(part.chunks, rows, where=part.where, cut=part.cut, objects=not fixed)
            if part.image:
                dim, seq = self._check_image(path, found.row_shape)
                self._image = True
            else:
                shape = (len(part.chunks), *(found.row_shape or ("T", *found.token_shape)))
                self._check_x(part.where, found.dtype, shape)
                if found.dtype.kind in "iu":
                    self._check_ids(part.where, int(found.low), int(found.high))
                dim = 0 if found.dtype.kind in "iu" else int(found.token_shape[-1])
            variable = part.cut is not None or not found.uniform
            for s, pos in rows.items():
                inputs = Rows(
                    part.chunks,
                    pos,
                    found.dtype,
                    found.row_shape,
                    cut=None if part.cut is None else part.cut[pos],
                    sha256=found.objects[s] if variable else found.fixed[s],
                )
                lengths = (
                    np.full(len(pos), seq)
                    if part.image
                    else (part.cut if part.cut is not None else found.lengths)[pos]
                )
                labels = self._labels(y[pos]) if y is not None else np.full(len(pos), NO_LABEL, np.int64)
                splits[s] = SplitData(inputs, labels, lengths.astype(np.int64))
                dims[s], tops[s] = dim, int(found.top) if found.dtype.kind in "iu" and len(pos) else 0
        return splits, dims, tops

    def _check_image(self, path: Path, shape: tuple[int, int, int]) -> tuple[int, int]:
        """Token width and tokens per image of ``(H, W, C)`` images cut into ``patch`` patches."""
        h, w, c = shape
        p = self.patch
        if h % p or w % p:
            raise DataError(
                f"{path}: images are {h}x{w}, which patch={p} does not divide; pass --task-opt patch=P "
                f"with P dividing both, or --task-opt image_size=HxW to resize them"
            )
        self._image_shape = shape
        return p * p * c, (h // p) * (w // p)

    @staticmethod
    def _need(arrays: dict[str, np.ndarray], key: str, path: Path) -> np.ndarray:
        if key not in arrays:
            raise DataError(f"{path} has no array {key!r} (it has {sorted(arrays)}); {FIX}")
        return arrays[key]

    def _check(self, path, xname, yname, lname, x, y, lengths) -> None:
        """An in-memory file's arrays: x's type and values, the labels and the lengths."""
        self._check_x(f"{path}: {xname}", x.dtype, x.shape)
        if x.dtype.kind == "f" and not readable_floats(x):
            raise DataError(f"{path}: {xname} holds {UNREADABLE_FLOATS}; replace them before extracting")
        if x.dtype.kind in "iu":
            self._check_ids(f"{path}: {xname}", int(x.min()), int(x.max()))
        if y is not None:
            check_labels(path, xname, yname, y, len(x), self.regression)
        self._check_lengths(path, xname, lname, lengths, x.shape)

    @staticmethod
    def _check_x(where: str, dtype: np.dtype, shape: tuple) -> None:
        kinds = "(N, T, d) floats or (N, T) integer ids"
        ndim = len(shape)
        if (
            dtype.kind not in "fiu"
            or ndim not in (2, 3)
            or (ndim == 3 and dtype.kind != "f")
            or (ndim == 2 and dtype.kind == "f")
        ):
            raise DataError(
                f"{where} is {dtype} with shape {shape}; expected {kinds} "
                "(integer ids need an integer dtype; a single feature per token is (N, T, 1))"
            )
        if 0 in shape:
            raise DataError(f"{where} is empty (shape {shape}); {FIX}")

    @staticmethod
    def _check_ids(where: str, low: int, high: int) -> None:
        """Token ids, from ``low`` to ``high``, lie in ``0..MAX_ID``."""
        if low < 0:
            raise DataError(f"{where} holds negative token ids (min {low}); ids must be >= 0")
        if high > MAX_ID:
            raise DataError(
                f"{where} holds token id {high}; ids must be at most {MAX_ID:,d} (the input "
                "layer holds a vector per id): renumber them 0..V-1"
            )

    @staticmethod
    def _check_lengths(path, xname, lname, lengths, shape) -> None:
        if lengths is None:
            return
        if lengths.shape != (shape[0],) or lengths.dtype.kind not in "iu":
            raise DataError(
                f"{path}: {lname} is {lengths.dtype} {lengths.shape}; expected ({shape[0]},) integers"
            )
        if lengths.min() < 1 or lengths.max() > shape[1]:
            raise DataError(
                f"{path}: {lname} must lie in 1..{shape[1]} (the T of {xname}); "
                f"found {lengths.min()}..{lengths.max()}"
            )

    def _split_rows(self, path: Path, arrays: dict[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        if "split" in arrays:
            split = np.asarray(arrays["split"]).astype(str)
            if split.shape != (len(y),):  # one name a row, of one label or of k (multi-label, k targets)
                raise DataError(
                    f"{path}: split has shape {split.shape}; expected ({len(y)},), one name per row"
                )
            order = ["train", "val", "test"] + sorted(str(s) for s in set(split) - {"train", "val", "test"})
            _check_split_names(path, "the split array", order[3:])
            return {s: np.flatnonzero(split == s) for s in order if (split == s).any()}
        from sklearn.model_selection import train_test_split

        self._drawn = True

        rows = np.arange(len(y))
        n_test = int(np.ceil(self.test_fraction * len(y)))  # as scikit-learn rounds a fraction
        if n_test >= len(y):
            raise DataError(
                f"{path} has {len(y)} rows without a split array: holding out test_fraction "
                f"{self.test_fraction:g} leaves none to train on; give more rows, a lower test_fraction, "
                "or a split array naming each row's split"
            )
        if self.regression or y.ndim > 1:  # real values, or several labels a row: no one class to stratify by
            train, test = train_test_split(rows, test_size=n_test, random_state=self.seed)
            return {"train": np.sort(train), "test": np.sort(test)}
        counts = np.bincount(y.astype(np.int64))
        classes = int((counts > 0).sum())
        # stratified when every class can go to both sides (scikit-learn refuses otherwise)
        strat = y if counts[counts > 0].min() >= 2 and classes <= min(n_test, len(y) - n_test) else None
        train, test = train_test_split(rows, test_size=n_test, random_state=self.seed, stratify=strat)
        return {"train": np.sort(train), "test": np.sort(test)}

    def _labels(self, y: np.ndarray) -> np.ndarray:
        """Labels as stored: int64 ids or float32 targets; ``k`` labels a row as ``(n, 1, k)``."""
        y = y.astype(np.float32 if self.regression else np.int64)
        return y[:, None, :] if y.ndim == 2 else y

    def _split(self, x: np.ndarray, y: np.ndarray | None, lengths: np.ndarray | None) -> SplitData:
        y = self._labels(y) if y is not None else np.full(len(x), NO_LABEL, np.int64)
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

    def pad_to(self, width: int) -> None:
        """Read as rows of up to ``width`` tokens, which the padded readout pads them to (a padded-readout probe's
        data's length); DataError where a row is longer."""
        if width < self._seq_len:
            raise DataError(
                f"{self.path} holds rows of up to {self._seq_len:,d} tokens; the probe reads rows padded to "
                f"{width:,d} tokens (the padded readout): give rows of at most {width:,d} tokens"
            )
        self._seq_len, self._padded = width, True

    # -- the Task interface ---------------------------------------------------------------
    @property
    def spec(self) -> TaskSpec:
        variable = any(d.inputs.dtype == object for d in self._splits.values()) or getattr(
            self, "_padded", False
        )
        return TaskSpec(
            f"file:{self.path}",
            self._kind,
            seq_len=self._seq_len,
            n_classes=self._n_classes,
            token_dim=self._token_dim,
            vocab_size=self._vocab,
            splits=tuple(self._splits),
            variable_length=variable,
            pad_id=0,
            outputs_per_token=self._outputs,
            target="regression" if self.regression else "class",
        )

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """``(H, W, C)`` of the images the file holds (as read: resized where ``image_size`` says); else
        ``None``."""
        return tuple(self._image_shape) if self._image else None

    @property
    def class_names(self) -> list[str] | None:
        """The class names the file gives (class folders, label names, a ``ClassLabel``), by id; else ``None``."""
        return None if self._names is None else list(self._names)

    @property
    def files(self) -> list[str] | None:
        """Data to predict on from an image folder: each row's file, relative to the folder; else ``None``."""
        return None if self._files is None else list(self._files)

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        return self._splits[split].head(n)

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        """Raw rows (an array, or lazy rows read now) -> tokens; images are cut into patches in [0, 1]."""
        inputs = np.asarray(inputs) if isinstance(inputs, Rows) else inputs
        if self._image:
            return patches(inputs, self.patch).astype(np.float32) / 255.0
        dtype = np.int64 if self._kind == "ids" else np.float32
        return inputs.astype(dtype) if inputs.dtype != object else pad_ids(list(inputs), 0, dtype)

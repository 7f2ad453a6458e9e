"""Your own data, read a chunk at a time: the sources ``--task file:PATH`` accepts besides ``.npz``.

``PATH`` may be an ``.h5``/``.hdf5`` file (``x`` or ``x_<split>`` streamed in blocks of rows, holding
the arrays :mod:`reservoir.tasks.userfile` describes), a Parquet or Arrow file or a folder of them
(files named by split give the splits), a Hugging Face ``datasets`` folder written by ``save_to_disk``
(read without the ``datasets`` package), or an image folder in torchvision's ``ImageFolder`` layout
(``root/CLASS/*.png``, or ``root/SPLIT/CLASS/*.png``). :data:`LAYOUTS` lists them with their options.

Class names (class folders, string labels), splits and data to predict on are as
:mod:`reservoir.tasks.userfile` says; an image folder whose images lie in it, not in class folders, is
unlabeled. Images are decoded with Pillow and cut into ``patch`` x ``patch`` tokens as
:func:`reservoir.tasks.patches` does (row-major, channel innermost, in ``[0, 1]``).

Only labels, lengths and split names are held in memory; inputs are read a chunk at a time when a batch
asks for them (a Parquet row group, an Arrow record batch, :data:`H5_CHUNK_BYTES` of HDF5 rows,
:data:`IMAGE_CHUNK` images), at most :data:`CACHED` chunks kept (:data:`CACHED_BYTES` for variable-length
rows). Building the task reads every row once and refuses bad data with a DataError before any feature
file exists; the same pass computes the data digest (:func:`reservoir.identity.data_fingerprint`), equal
to the digest of the same rows in memory.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import DataError, UsageError, optional, unreadable
from reservoir.identity import rows_header, update_rows

#: bytes of HDF5 rows read at a time
H5_CHUNK_BYTES = 16 * 2**20
#: images decoded at a time
IMAGE_CHUNK = 64
#: chunks kept decoded for the batches that ask for them
CACHED = 2
#: bytes of chunks kept for variable-length rows, whose length-sorted batches spread over a block of rows
CACHED_BYTES = 256 * 2**20
PARQUET = (".parquet", ".pq")
ARROW = (".arrow", ".feather", ".ipc")
IMAGES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
INPUTS = ("x", "input", "inputs", "image", "img", "pixel_values", "sequence")
TARGETS = ("y", "label", "labels", "target")
FIX = "see `reservoir data where` for the layouts --task file:PATH accepts"

#: what ``reservoir data where`` prints about ``--task file:PATH`` (the module docstring in short)
LAYOUTS = (
    "your own data: --task file:PATH, where PATH is",
    "  an .npz or .h5 file: x (N, T, d) floats or (N, T) integer ids, y (N,) class ids, optional lengths (N,)",
    "    and split (N,) names (train/val/test), or x_train/y_train/x_test/y_test (.h5 x arrays are streamed)",
    "  a Parquet (.parquet) or Arrow (.arrow/.feather) file, or a folder of them (train.parquet, test.parquet,",
    "    train-00000-of-00002.parquet or mnist_train.parquet: files named by split; training and testing name",
    "    train and test), streamed a row group / record batch at a time",
    "  a Hugging Face datasets folder written by save_to_disk (a Dataset, or a DatasetDict: one folder per split)",
    "  an image folder: PATH/CLASS/*.png|jpg (classes numbered in natural order: 2 before 10) or PATH/train/CLASS/...,",
    "    PATH/test/CLASS/... (and val; or training, testing); names starting with . are passed over",
    "  table columns: --task-opt input=COLUMN (default x, input, inputs, image, img, pixel_values or sequence),",
    "    target=COLUMN (default y, label, labels or target), split=COLUMN (default split, when present); an input",
    "    holds per row a list of token ids (T,), a list of tokens (T, d) of floats, or an image (datasets Image)",
    "  images: --task-opt patch=P (default 4: P x P patches as tokens), image_size=HxW (resize all), mode=RGB|L",
    "  without splits a seeded stratified test_fraction (0.2; --task-opt test_fraction=F seed=S) becomes test",
    "  labels are class ids 0..C-1 (a (N, 1) column or one-hot rows too), class names (numbered in natural order),",
    "    or real-valued targets with --task-opt regression=true; splits: train, val/valid/validation/dev, test, test_*",
    "  to predict on (reservoir predict --data PATH; --task-opt predict=true): any of these, every row as one",
    "    split in input order, labels optional; images lying in PATH itself (PATH/*.png) are unlabeled",
)


def readable_floats(values: np.ndarray) -> bool:
    """Whether float ``values`` are finite and within float32's range: inputs are read in float32, where a
    larger value is infinite."""
    values = np.asarray(values)
    if not np.isfinite(values).all():
        return False
    return (
        values.dtype.itemsize <= 4
        or not values.size
        or float(np.abs(values).max()) <= float(np.finfo(np.float32).max)
    )


#: what :func:`readable_floats` refuses, in words
UNREADABLE_FLOATS = "NaN, infinite or beyond float32's range (3.4e38) values"


def natural_key(name: str) -> tuple:
    """Sort key of a name in natural order: digits as numbers (``2`` before ``10``), text case-insensitively."""
    parts = re.split(r"(\d+)", str(name))
    return tuple(int(p) if i % 2 else p.casefold() for i, p in enumerate(parts)), str(name)


def natural(names) -> list:
    """``names`` in natural order (:func:`natural_key`); paths by their names."""
    return sorted(names, key=lambda n: natural_key(getattr(n, "name", n)))


def need(module: str, what: str) -> Any:
    """Import an optional module of the ``data`` extra, or raise a DataError saying how to install it."""
    return optional(module, f"reading {what}", "'reservoir[data]'", DataError)


# -- chunked sources --------------------------------------------------------------------------


class Chunks:
    """Rows of one input, read a chunk at a time: chunk ``i`` holds rows ``starts[i]:starts[i+1]``.

    Subclasses set ``starts`` and ``name`` and implement :meth:`read` (an array, or an object array of rows)."""

    name: str = ""
    starts: np.ndarray

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, i: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def get(self, i: int, keep_bytes: int = 0) -> np.ndarray:
        """Chunk ``i``, from a cache of the chunks last read (thread-safe): at least :data:`CACHED`, more
        while they hold fewer than ``keep_bytes``."""
        with self._lock:
            cache = self.__dict__.setdefault("_cache", OrderedDict())
            if i in cache:
                cache.move_to_end(i)
                return cache[i]
        block = self.read(i)
        with self._lock:
            sizes = self.__dict__.setdefault("_sizes", {})
            cache[i], sizes[i] = block, _nbytes(block)
            while len(cache) > CACHED and sum(sizes.values()) > keep_bytes:
                sizes.pop(cache.popitem(last=False)[0])
        return block

    @property
    def _lock(self) -> threading.Lock:
        return self.__dict__.setdefault("_lock_", threading.Lock())

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_sizes", "_lock_")}


class H5Chunks(Chunks):
    """An HDF5 dataset's rows, about :data:`H5_CHUNK_BYTES` at a time."""

    def __init__(self, path: Path, dataset: str, shape: tuple[int, ...], dtype: np.dtype):
        self.path, self.dataset, self.name = path, dataset, f"{path}: {dataset}"
        self.shape = tuple(shape)
        per = max(1, H5_CHUNK_BYTES // max(1, int(np.prod(shape[1:])) * dtype.itemsize))
        self.starts = np.append(np.arange(0, shape[0], per), shape[0]).astype(np.int64)

    def read(self, i: int) -> np.ndarray:
        import h5py

        try:
            with h5py.File(self.path, "r", locking=False) as f:
                return f[self.dataset][self.starts[i] : self.starts[i + 1]]
        except (OSError, ValueError, KeyError) as e:
            raise unreadable(self.path, e, "write it again") from None


class ChainedChunks(Chunks):
    """Several sources' rows one after the other (an .h5 file's ``x_<split>`` arrays, to predict on)."""

    def __init__(self, parts: list[Chunks]):
        self.parts, self.name = parts, ", ".join(dict.fromkeys(p.name for p in parts))
        self.index = [(k, i) for k, p in enumerate(parts) for i in range(len(p.starts) - 1)]
        counts = [int(parts[k].starts[i + 1] - parts[k].starts[i]) for k, i in self.index]
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)

    def read(self, i: int) -> np.ndarray:
        k, j = self.index[i]
        return self.parts[k].read(j)


class TableChunks(Chunks):
    """One column of Parquet or Arrow files (a row group or record batch a chunk), converted to numpy
    rows by ``convert(arrow_array, first_row)``."""

    def __init__(self, files: list[Path], column: str, convert: Callable[[Any, int], np.ndarray]):
        self.files, self.column, self.convert = files, column, convert
        self.name = f"{files[0] if len(files) == 1 else files[0].parent}: column {column!r}"
        self.pieces: list[tuple[int, tuple[str, int]]] = []  # (file, where in it: see table_pieces)
        counts = []
        for k, f in enumerate(files):
            for where, n in table_pieces(f):
                self.pieces.append((k, where))
                counts.append(n)
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)

    def table(self, i: int, columns: list[str]):
        """Chunk ``i``'s ``columns`` as a pyarrow Table."""
        k, where = self.pieces[i]
        return read_piece(self.files[k], where, columns)

    def read(self, i: int) -> np.ndarray:
        col = self.table(i, [self.column]).column(0).combine_chunks()
        return self.convert(col, int(self.starts[i]))


def table_pieces(path: Path) -> list[tuple[Any, int]]:
    """The chunks of a Parquet or Arrow file: ``[(where, rows), ...]``, ``where`` a row group, batch or offset."""
    pa = need("pyarrow", "Parquet and Arrow files")
    try:
        if path.suffix.lower() in PARQUET:
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            return [(("parquet", g), meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        import pyarrow.ipc as ipc

        with pa.memory_map(str(path)) as mm:  # batch headers only: no body is read
            if mm.read(6) == b"ARROW1":
                reader = ipc.open_file(mm)
                return [(("file", i), reader.get_batch(i).num_rows) for i in range(reader.num_record_batches)]
            mm.seek(0)
            reader = ipc.open_stream(mm)
            out, offset = [], mm.tell()
            for batch in reader:
                out.append((("stream", offset), batch.num_rows))
                offset = mm.tell()
            return out
    except (OSError, pa.ArrowException) as e:
        raise unreadable(path, e, "write it again (pyarrow.parquet.write_table, pyarrow.feather)") from None


def read_piece(path: Path, where: tuple[str, int], columns: list[str]):
    """One chunk of a Parquet or Arrow file (:func:`table_pieces`), only ``columns`` kept."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    kind, at = where
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).read_row_group(at, columns=columns)
        with pa.OSFile(str(path)) as f:  # read into memory (a memory map would outlive the arrays)
            if kind == "file":
                batch = ipc.open_file(f).get_batch(at)
            else:
                schema = ipc.open_stream(f).schema
                f.seek(at)
                batch = ipc.read_record_batch(ipc.read_message(f), schema)
        return pa.Table.from_batches([batch]).select(columns)
    except (OSError, pa.ArrowException) as e:
        raise unreadable(path, e, "write it again") from None


class ImageChunks(Chunks):
    """Image files, :data:`IMAGE_CHUNK` decoded at a time."""

    def __init__(self, files: list[Path], decode: Images):
        self.files, self.decode, self.name = files, decode, str(files[0].parent.parent) if files else ""
        self.starts = np.append(np.arange(0, len(files), IMAGE_CHUNK), len(files)).astype(np.int64)

    def read(self, i: int) -> np.ndarray:
        files = self.files[self.starts[i] : self.starts[i + 1]]
        return np.stack([self.decode(f, f) for f in files])


# -- images -----------------------------------------------------------------------------------


def parse_size(text: str) -> tuple[int, int] | None:
    """``"HxW"`` -> ``(H, W)``; ``""`` -> None; a UsageError otherwise."""
    if not text:
        return None
    h, sep, w = text.lower().partition("x")
    if not (sep and h.isdigit() and w.isdigit() and 0 < int(h) <= 2**15 and 0 < int(w) <= 2**15):
        raise UsageError(
            f"The 'image_size' option of task file:PATH must be HEIGHTxWIDTH in pixels (e.g. 32x32, each at "
            f"most {2**15}). Got {text!r} instead."
        )
    return int(h), int(w)


@dataclass
class Images:
    """Decodes images to ``uint8`` ``(H, W, C)``, resized and converted when asked, else as the first one."""

    size: tuple[int, int] | None = None
    mode: str = ""
    #: the (H, W, C) and the mode every image has, and the name of the first image decoded (which set them)
    shape: tuple[int, int, int] | None = None
    seen_mode: str = ""
    first: str = ""

    def __call__(self, data: Any, name: Any) -> np.ndarray:
        Image = need("PIL.Image", "images")
        import io

        if data is None:
            raise DataError(f"image {name} is missing (neither bytes nor a path); fill or drop that row")
        try:
            with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as im:
                im.load()
                if im.mode in ("I", "F") or im.mode.startswith("I;16"):
                    raise DataError(
                        f"image {name} has mode {im.mode}: values of more than 8 bits, which converting to an 8-bit "
                        "mode clips at 255; rescale the images to 8 bits (e.g. a 16-bit one: value // 256) and "
                        "save them again"
                    )
                if self.mode:
                    im = im.convert(self.mode)
                elif im.mode not in ("RGB", "L"):
                    raise DataError(
                        f"image {name} has mode {im.mode}; pass --task-opt mode=RGB (or mode=L) to convert "
                        "every image"
                    )
                elif self.seen_mode and im.mode != self.seen_mode:
                    raise DataError(
                        f"image {name} has mode {im.mode} but image {self.first} has mode {self.seen_mode}; pass --task-opt "
                        f"mode={self.seen_mode} (or mode={im.mode}) to convert every image"
                    )
                if self.size:
                    im = im.resize(self.size[::-1], Image.Resampling.BILINEAR)
                pixels = np.asarray(im, dtype=np.uint8)
        except DataError:
            raise
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            raise DataError(
                f"image {name} is unreadable ({type(e).__name__}: {e}); replace or delete it"
            ) from None
        pixels = pixels[..., None] if pixels.ndim == 2 else pixels
        if self.shape is None:
            self.shape, self.seen_mode, self.first = pixels.shape, self.mode or im.mode, str(name)
        elif pixels.shape != self.shape:
            h, w = self.shape[:2]
            raise DataError(
                f"image {name} is {pixels.shape[0]}x{pixels.shape[1]} but image {self.first} is {h}x{w}; pass "
                f"--task-opt image_size={h}x{w} to resize every image to one size"
            )
        return pixels


# -- arrow columns to numpy rows ---------------------------------------------------------------


def refuse_nulls(col: Any, first: int | None, where: str) -> Any:
    """``col`` (an Arrow array) when it holds no missing value; else a DataError naming the first one's row
    (``first``: the column's first row number; ``None``: values inside a column's lists)."""
    if not col.null_count:
        return col
    if first is None:
        raise DataError(f"{where} has missing values inside its lists; fill or drop them")
    row = first + int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
    raise DataError(f"{where} has a missing value in row {row}; fill or drop it")


def arrow_rows(col: Any, first: int, *, where: str, images: Images) -> np.ndarray:
    """An Arrow column's rows as numpy: ``(n, T)`` ids or ``(n, T, d)`` floats (an object array of rows when
    lengths differ), or images ``(n, H, W, C)`` uint8; ``first`` is the column's first row number."""
    import pyarrow as pa

    t = col.type
    if isinstance(t, pa.ExtensionType):
        if hasattr(col, "to_numpy_ndarray"):  # an Arrow fixed-shape tensor
            return _numbers(col.to_numpy_ndarray(), where)
        col, t = col.storage, t.storage_type  # datasets' Array2D: nested lists
    refuse_nulls(col, first, where)
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:  # datasets' Image: bytes and path
        data, paths = (
            col.field("bytes").to_pylist(),
            col.field("path").to_pylist() if t.get_field_index("path") >= 0 else [None] * len(col),
        )
        return np.stack(
            [
                images(b if b is not None else p, p or f"row {first + i} of {where}")
                for i, (b, p) in enumerate(zip(data, paths))
            ]
        )
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return np.stack([images(b, f"row {first + i} of {where}") for i, b in enumerate(col.to_pylist())])
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        kind = "text" if pa.types.is_string(t) or pa.types.is_large_string(t) else str(t)
        raise DataError(
            f"{where} holds {kind}, one value per row; each row must be a list of token ids, a list of "
            "tokens (lists of floats) or an image (tokenize text into ids first; " + FIX + ")"
        )
    lengths = _list_lengths(col)
    inner = refuse_nulls(col.flatten(), None, where)
    width = None
    if isinstance(inner.type, pa.ExtensionType):
        inner = inner.storage
    if (
        pa.types.is_list(inner.type)
        or pa.types.is_large_list(inner.type)
        or pa.types.is_fixed_size_list(inner.type)
    ):
        widths = _list_lengths(inner)
        if len(widths) and (widths != widths[0]).any():
            raise DataError(
                f"{where}: the tokens of a row have different widths ({sorted(set(widths.tolist()))[:5]}); "
                "every token must be a list of the same number of floats"
            )
        width = int(widths[0]) if len(widths) else 0
        if not width:
            raise DataError(f"{where}: its tokens are empty lists; every token needs at least one value")
        inner = refuse_nulls(inner.flatten(), None, where)
        if pa.types.is_list(inner.type) or pa.types.is_large_list(inner.type):
            raise DataError(f"{where} nests lists three deep; rows must be (T,) ids or (T, d) floats ({FIX})")
    if not (pa.types.is_integer(inner.type) or pa.types.is_floating(inner.type)):
        raise DataError(
            f"{where} holds lists of {inner.type}; rows must be (T,) integer ids or (T, d) floats"
        )
    values = inner.to_numpy(zero_copy_only=False)
    values = values.reshape(-1, width) if width is not None else values
    if len(lengths) and (lengths == lengths[0]).all():
        return _numbers(values.reshape(len(lengths), int(lengths[0]), *values.shape[1:]), where)
    out = np.empty(len(lengths), dtype=object)
    out[:] = np.split(values, np.cumsum(lengths)[:-1])
    return out


def _nbytes(block: np.ndarray) -> int:
    return sum(r.nbytes for r in block) if block.dtype == object else block.nbytes


def _list_lengths(arr: Any) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_fixed_size_list(arr.type):
        return np.full(len(arr), arr.type.list_size, dtype=np.int64)
    return arr.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)


def _numbers(a: np.ndarray, where: str) -> np.ndarray:
    if a.dtype.kind not in "fiu":
        raise DataError(f"{where} holds {a.dtype}; rows must be (T,) integer ids or (T, d) floats")
    return a


# -- lazy rows ------------------------------------------------------------------------------------


class Rows:
    """One split's inputs, read when asked: ``rows[index_array]`` reads the chunks holding those rows,
    ``rows[a:b]`` is a lazy view. ``positions`` are the split's rows in the source, ascending; ``cut`` the
    real tokens of each right-padded row; ``sha256`` the digest state the scan computed, if any."""

    def __init__(
        self,
        chunks: Chunks,
        positions: np.ndarray,
        value_dtype: np.dtype,
        row_shape: tuple[int, ...] | None,
        cut: np.ndarray | None = None,
        sha256: Any = None,
    ):
        self.chunks, self.positions, self.value_dtype = chunks, np.asarray(positions, np.int64), value_dtype
        self.row_shape, self.cut, self.sha256 = row_shape, cut, sha256

    @property
    def variable(self) -> bool:
        return self.row_shape is None or self.cut is not None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(object) if self.variable else self.value_dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self),) if self.variable else (len(self), *self.row_shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return len(self.positions)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[np.arange(len(self))]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            cut = None if self.cut is None else self.cut[key]
            full = key == slice(None) or self.positions[key].shape == self.positions.shape
            return Rows(
                self.chunks,
                self.positions[key],
                self.value_dtype,
                self.row_shape,
                cut,
                self.sha256 if full else None,
            )
        if np.isscalar(key):
            return self[np.array([key])][0]
        return self.take(np.asarray(key, dtype=np.int64))

    def subset(self, idx: np.ndarray) -> Rows:
        """The rows at ``idx`` (ascending positions in this split) as lazy rows; nothing is read."""
        idx = np.asarray(idx, dtype=np.int64)
        cut = None if self.cut is None else self.cut[idx]
        return Rows(self.chunks, self.positions[idx], self.value_dtype, self.row_shape, cut)

    def take(self, idx: np.ndarray) -> np.ndarray:
        """The rows at ``idx`` (positions in this split, any order), read from their chunks."""
        pos = self.positions[idx]
        starts = self.chunks.starts
        which = np.searchsorted(starts, pos, side="right") - 1
        variable = self.variable
        out = (
            np.empty(len(idx), dtype=object)
            if variable
            else np.empty((len(idx), *self.row_shape), self.value_dtype)
        )
        for c in np.unique(which):
            sel = np.flatnonzero(which == c)
            block = self.chunks.get(int(c), CACHED_BYTES if variable else 0)
            part = block[pos[sel] - starts[c]]
            if not variable:
                out[sel] = part
                continue
            for k, j in enumerate(sel):
                row = part[k]
                out[j] = row if self.cut is None else row[: self.cut[idx[j]]]
        return out

    def chunks_in_order(self, rows: int = 4096) -> Iterator[np.ndarray]:
        """The rows in order, a few thousand at a time (the digest of a view streams them)."""
        for a in range(0, len(self), rows):
            yield self.take(np.arange(a, min(a + rows, len(self))))


# -- the scan: every row once, checked and digested -----------------------------------------------


@dataclass
class Scan:
    """What one pass over a source found: per source row the length (tokens); the value dtype and
    row shape (``None`` where rows differ in length); value extremes; per split the digest states."""

    dtype: np.dtype | None = None
    row_shape: tuple[int, ...] | None = None
    uniform: bool = True
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    low: float = np.inf
    high: float = -np.inf
    top: float = -np.inf  # the largest value among real tokens (cut rows)
    token_shape: tuple[int, ...] = ()
    fixed: dict[str, Any] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)


def scan(
    chunks: Chunks,
    splits: dict[str, np.ndarray],
    *,
    where: str,
    cut: np.ndarray | None = None,
    objects: bool = True,
) -> Scan:
    """Read every chunk once, in order: check values, find each row's length and the extremes, and feed
    each split's rows (``splits``: source rows, ascending) into its digests, as object rows (cut to
    ``cut`` when given; only when ``objects``) and, while every row has one shape, as fixed-shape rows."""
    s = Scan(lengths=np.zeros(len(chunks), np.int64))
    if objects or cut is not None:
        s.objects = {k: hashlib.sha256(rows_header(np.dtype(object), (len(p),))) for k, p in splits.items()}
    for i in range(len(chunks.starts) - 1):
        a, b = int(chunks.starts[i]), int(chunks.starts[i + 1])
        block = chunks.read(i)
        if len(block) != b - a:
            raise DataError(f"{chunks.name}: chunk {i} holds {len(block)} rows, its header says {b - a}")
        if not len(block):
            continue
        ragged = block.dtype == object
        rows = list(block) if ragged else None
        shapes = {r.shape for r in rows} if ragged else {block.shape[1:]}
        _layout(s, (rows[0] if ragged else block).dtype, shapes, chunks.name, a)
        s.lengths[a:b] = [len(r) for r in rows] if ragged else block.shape[1]
        if ragged and not s.lengths[a:b].all():
            row = a + int(np.flatnonzero(s.lengths[a:b] == 0)[0])
            raise DataError(f"{where}: row {row} is empty; every row needs at least one token")
        values = np.concatenate([r.reshape(-1) for r in rows]) if ragged else block
        if values.dtype.kind == "f" and not readable_floats(values):
            bad = a + next(k for k, r in enumerate(block) if not readable_floats(r))
            raise DataError(f"{where} holds {UNREADABLE_FLOATS} (row {bad}); replace them before extracting")
        if values.size:
            s.low, s.high = min(s.low, float(values.min())), max(s.high, float(values.max()))
        for name, pos in splits.items():
            lo, hi = np.searchsorted(pos, [a, b])
            if hi == lo:
                continue
            part = block[pos[lo:hi] - a]
            if cut is not None:
                part = _objects([r[: cut[p]] for r, p in zip(part, pos[lo:hi])])
            real = [r for r in part if r.size] if part.dtype == object else [part] if part.size else []
            s.top = max([s.top, *(float(r.max()) for r in real)])
            if s.objects:
                update_rows(s.objects[name], part if part.dtype == object else _objects(list(part)))
            if s.uniform and not ragged and cut is None:
                if name not in s.fixed:
                    s.fixed[name] = hashlib.sha256(rows_header(s.dtype, (len(pos), *s.row_shape)))
                update_rows(s.fixed[name], part)
    if not s.uniform:
        s.fixed = {}
    return s


def _objects(rows: list[np.ndarray]) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    for k, r in enumerate(rows):
        out[k] = r
    return out


def _layout(s: Scan, dtype: np.dtype, shapes: set[tuple[int, ...]], name: str, first: int) -> None:
    """One dtype and one token layout (the row shape past its length) for the whole source; rows of
    one shape throughout keep ``s.uniform``."""
    if s.dtype is None:
        s.dtype, s.row_shape = dtype, next(iter(shapes))
    if dtype != s.dtype:
        raise DataError(f"{name}: rows from {first} on are {dtype}, earlier ones {s.dtype}; give one dtype")
    tokens = {shape[1:] for shape in shapes}
    known = s.row_shape[1:] if s.row_shape is not None else s.token_shape
    if len(tokens) > 1 or next(iter(tokens)) != known:
        raise DataError(
            f"{name}: rows from {first} on have tokens of shape {sorted(tokens)}, earlier ones {known}; "
            "every token needs the same number of values"
        )
    s.token_shape = known
    if s.row_shape is not None and shapes != {s.row_shape}:
        s.uniform, s.row_shape = False, None

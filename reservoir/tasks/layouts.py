"""The layouts ``--task file:PATH`` reads: which kind a path is (Parquet or Arrow files, a ``datasets``
folder, an image folder ``root/CLASS/*``, an ``.npz`` or ``.h5`` of arrays), its parts (one per split and
file), their input and target columns, and the names of their classes. The rows themselves are read by
:mod:`reservoir.tasks.streams`."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import DataError, unreadable
from reservoir.tasks.labels import common_names, renumbered
from reservoir.tasks.streams import (
    ARROW,
    FIX,
    IMAGES,
    INPUTS,
    PARQUET,
    TARGETS,
    Chunks,
    ImageChunks,
    Images,
    TableChunks,
    arrow_rows,
    natural,
    natural_key,
    need,
    refuse_nulls,
)

# -- naming a source ------------------------------------------------------------------------------


@dataclass
class Part:
    """Rows of a source that share one reader: their inputs, labels and split (``split`` for all of them,
    ``split_names`` a name per row, or neither)."""

    chunks: Chunks
    #: ``None``: the source gives none (read to predict on, ``predict=true``; ``target`` then says why)
    labels: np.ndarray | None
    where: str
    target: str
    split: str | None = None
    split_names: np.ndarray | None = None
    image: bool = False
    #: real tokens of each right-padded row (an .h5 file's ``lengths``)
    cut: np.ndarray | None = None
    #: the name of each class id, where the source names them (an image folder's class folders, a ``ClassLabel``)
    names: list[str] | None = None


#: words that name a split in a folder's or file's name, and the split each names
SPLIT_WORDS = {
    "train": "train",
    "training": "train",
    "test": "test",
    "testing": "test",
    "val": "val",
    "valid": "valid",
    "validation": "validation",
}


def split_of(name: str) -> str | None:
    """The split a folder or file name names by a word of it (``mnist_train.parquet``, ``training``), else
    ``None``."""
    words = re.split(r"[._\-\s]+", name.lower())
    return next((SPLIT_WORDS[w] for w in words if w in SPLIT_WORDS), None)


def shown(paths) -> list[Path]:
    """``paths`` without hidden ones (a name starting with ``.``: macOS's ``._x.png``, ``.ipynb_checkpoints``)."""
    return [p for p in paths if not p.name.startswith(".")]


def ordered(names) -> list[Any]:
    """Split names in the order a task lists them: train, val, valid, test, then the others sorted."""
    first = ("train", "val", "valid", "test")
    return [n for n in first if n in names] + sorted(n for n in names if n not in first)


def kind_of(path: Path) -> str:
    """What ``path`` holds: ``npz``, ``h5``, ``table``, ``dataset`` (a folder of tables) or ``images``."""
    if not path.exists():
        raise DataError(f"{path} does not exist; pass an existing file or folder ({FIX})")
    suffix = path.suffix.lower()
    if path.is_file():
        if suffix == ".npz":
            return "npz"
        if suffix in (".h5", ".hdf5"):
            return "h5"
        if suffix in PARQUET + ARROW:
            return "table"
        raise DataError(
            f"{path} is not a file --task file:PATH reads: give an .npz, .h5, .parquet or .arrow file, a "
            f"datasets folder (save_to_disk) or an image folder ({FIX})"
        )
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists() or _table_files(path):
        return "dataset"
    if any(p.is_dir() or p.suffix.lower() in IMAGES for p in shown(path.iterdir())):
        return "images"
    raise DataError(
        f"{path} is a folder without Parquet or Arrow files, a datasets save_to_disk folder or class "
        f"folders of images ({FIX})"
    )


def _table_files(folder: Path) -> list[Path]:
    for place in (folder, folder / "data"):
        files = (
            natural(p for p in shown(place.glob("*")) if p.suffix.lower() in PARQUET + ARROW)
            if place.is_dir()
            else []
        )
        if files:
            return files
    return []


def table_parts(
    path: Path, *, input: str, target: str, split: str, images: Images, whole: bool = False
) -> list[Part]:
    """The parts of a table source, their labels and split names read; ``whole`` (data to predict on): one
    part of every file in split order."""
    need("pyarrow", "Parquet, Arrow and datasets folders")
    if path.is_file():
        groups = {None: [path]}
    elif (path / "dataset_dict.json").exists():
        try:
            names = json.loads((path / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise unreadable(path / "dataset_dict.json", e, "save the DatasetDict again") from None
        groups = {s: _dataset_files(path / s) for s in ordered(names)}
    elif (path / "state.json").exists():
        groups = {None: _dataset_files(path)}
    else:
        files = _table_files(path)
        by_name: dict[str, list[Path]] = {}
        for f in files:
            by_name.setdefault(split_of(f.name) or f.name.split(".")[0].split("-")[0], []).append(f)
        groups = {k: by_name[k] for k in ordered(by_name)} if "train" in by_name else {None: files}
    if whole:
        groups = {None: [f for files in groups.values() for f in files]}
    parts = []
    for name, files in groups.items():
        columns = _schema(files[0])
        x = _pick(files[0], columns, input, INPUTS, "input", "the examples")
        y = _pick(files[0], columns, target, TARGETS, "target", "the labels", optional=whole)
        lacking = None
        for f in files[1:]:  # every file of a part holds its columns (a labeled train, an unlabeled test)
            has = _schema(f)
            if x not in has or (y is not None and y not in has and not whole):
                raise DataError(
                    f"{f} has no column {x if x not in has else y!r} that {files[0]} has (columns: {has}); give "
                    "every file the same columns"
                )
            lacking = lacking or (f if y is not None and y not in has else None)
        base = files[0] if len(files) == 1 else files[0].parent
        where = f"{base}: column {x!r}"
        rows = functools.partial(arrow_rows, where=where, images=images)
        image = _is_image(files[0], x)
        if y is None or lacking is not None:  # data to predict on: labeled only where every file is
            looked = repr(y or target) if (y or target) else " / ".join(TARGETS)
            why = f"{lacking or base} has no column {looked} of labels"
            parts.append(Part(TableChunks(files, x, rows), None, where, why, None, None, image))
            continue
        s = "" if whole else split or ("split" if "split" in columns and name is None else "")
        if s and s not in columns:
            raise DataError(
                f"{files[0]} has no column {s!r} (columns: {columns}); pass --task-opt split=COLUMN"
            )
        chunks = TableChunks(files, x, rows)
        labels, names = [], []
        # files whose ClassLabel lists its names in other orders: their ids renumbered as one list, by name
        of_file = [class_label_names(f, y) for f in files]
        classes = common_names(of_file) if all(of_file) else of_file[0]
        for i in range(len(chunks.pieces)):
            t = chunks.table(i, [y] + ([s] if s else []))
            ids = _column(t.column(0), f"{base}: column {y!r}", int(chunks.starts[i]))
            own = of_file[chunks.pieces[i][0]]
            labels.append(
                ids if own == classes else renumbered(ids, own, classes, files[chunks.pieces[i][0]])
            )
            if s:
                split_column = refuse_nulls(t.column(1), int(chunks.starts[i]), f"{base}: column {s!r}")
                names.append(np.asarray(split_column.to_pylist(), dtype=str))
        y_all = np.concatenate(labels) if labels else np.zeros(0, np.int64)
        parts.append(
            Part(
                chunks,
                y_all,
                where,
                f"column {y!r}",
                name,
                np.concatenate(names) if s else None,
                image,
                names=classes,
            )
        )
    return parts


def _dataset_files(folder: Path) -> list[Path]:
    try:
        state = json.loads((folder / "state.json").read_text())
        files = [folder / f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise unreadable(folder / "state.json", e, "save the dataset again (Dataset.save_to_disk)") from None
    if not files:
        raise DataError(f"{folder} holds no data files (state.json lists none); save the dataset again")
    return files


def _arrow_schema(path: Path):
    import pyarrow as pa

    try:
        if path.suffix.lower() in PARQUET:
            import pyarrow.parquet as pq

            return pq.read_schema(path)
        import pyarrow.ipc as ipc

        with pa.memory_map(str(path)) as mm:
            file_format = mm.read(6) == b"ARROW1"
            mm.seek(0)
            return (ipc.open_file(mm) if file_format else ipc.open_stream(mm)).schema
    except (OSError, pa.ArrowException) as e:
        raise unreadable(path, e, "write it again") from None


def _schema(path: Path) -> list[str]:
    return list(_arrow_schema(path).names)


def class_label_names(path: Path, column: str) -> list[str] | None:
    """The names of a ``datasets`` ``ClassLabel`` column, by class id, from the ``huggingface`` metadata of the
    file's schema, else the ``dataset_info.json`` beside it; ``None`` for a column that is not one."""
    found = []
    meta = _arrow_schema(path).metadata or {}
    if b"huggingface" in meta:
        with contextlib.suppress(ValueError, AttributeError):  # not datasets' metadata: no names
            found.append(json.loads(meta[b"huggingface"]).get("info", {}).get("features", {}))
    info = path.parent / "dataset_info.json"
    if info.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(json.loads(info.read_text()).get("features", {}))
    for features in found:
        feature = features.get(column) if isinstance(features, dict) else None
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and feature.get("names"):
            return [str(n) for n in feature["names"]]
    return None


def _is_image(path: Path, column: str) -> bool:
    import pyarrow as pa

    t = _arrow_schema(path).field(column).type
    return (pa.types.is_struct(t) and t.get_field_index("bytes") >= 0) or pa.types.is_binary(t)


def _pick(
    path: Path,
    columns: list[str],
    given: str,
    defaults: tuple[str, ...],
    option: str,
    what: str,
    optional: bool = False,
) -> str | None:
    """The column of ``what``: ``given``, else the one of ``defaults`` present; DataError when it is missing
    (unless ``optional``) or ambiguous."""
    if given:
        if given not in columns and optional:
            return None
        if given not in columns:
            raise DataError(
                f"{path} has no column {given!r} (columns: {columns}); pass --task-opt {option}=COLUMN naming "
                f"the column of {what}"
            )
        return given
    found = [c for c in defaults if c in columns]
    if len(found) == 1:
        return found[0]
    if found:
        raise DataError(
            f"{path}: more than one column could hold {what} ({found}); pass --task-opt {option}=COLUMN "
            "naming the one to use"
        )
    if optional:
        return None
    raise DataError(
        f"{path} has no column named {' / '.join(defaults)} for {what} (columns: {columns}); pass "
        f"--task-opt {option}=COLUMN naming it"
    )


def _column(col: Any, where: str, first: int) -> np.ndarray:
    """A label column as numpy (ints, floats, bools; strings as str), refusing missing values."""
    import pyarrow as pa

    col = refuse_nulls(col.combine_chunks() if hasattr(col, "combine_chunks") else col, first, where)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return np.asarray(col.to_pylist(), dtype=str)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)):
        raise DataError(
            f"{where} holds {col.type}; labels must be integer class ids 0..C-1 "
            "(sklearn.preprocessing.LabelEncoder turns names into ids)"
        )
    return col.to_numpy(zero_copy_only=False)


def _images_below(folder: Path) -> list[Path]:
    """The image files under ``folder``, at any depth, hidden ones and those in hidden folders left out."""
    return [
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in IMAGES
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]


def image_parts(
    root: Path, images: Images, *, whole: bool = False, known: list[str] | None = None
) -> list[Part]:
    """The parts of an image folder (``root/CLASS/*`` or ``root/SPLIT/CLASS/*``), classes numbered in natural
    order across splits. ``whole`` (images to predict on): one part of every image; ``known``: the class
    names (a probe's) to number class folders by."""
    if whole and any(p.is_file() and p.suffix.lower() in IMAGES for p in shown(root.iterdir())):
        files = natural_paths(p for p in _images_below(root))
        why = f"the images lie in {root} itself, not in class folders"
        return [Part(ImageChunks(files, images), None, str(root), why, None, None, True)]
    subfolders = natural(p for p in shown(root.iterdir()) if p.is_dir())
    named = {split_of(p.name) or p.name: p for p in subfolders}
    # the split layout: a train folder (train, training) of class folders; a class may be called train
    train = named.get("train")
    split_layout = train is not None and any(p.is_dir() for p in shown(train.iterdir()))
    if not split_layout and train is not None and all(split_of(p.name) for p in subfolders):
        raise DataError(
            f"{root} holds split folders ({', '.join(p.name for p in subfolders)}) with images but no class "
            f"folders; put each split's images in {root}/SPLIT/CLASS/ ({FIX})"
        )
    by_split = {k: named[k] for k in ordered(named)} if split_layout else {None: root}
    classes_of = {}
    for name, folder in by_split.items():
        classes_of[name] = natural(p for p in shown(folder.iterdir()) if p.is_dir())
        if not classes_of[name]:
            raise DataError(
                f"{folder} holds no class folders; put each class's images in {folder}/CLASS/ (images to "
                f"predict on may lie in the folder itself: `reservoir predict --data {folder}`) ({FIX})"
            )
    classes = natural({c.name for cs in classes_of.values() for c in cs}) if known is None else list(known)
    parts = []
    for name, folder in by_split.items():
        files, labels = [], []
        for c in classes_of[name]:
            found = natural_paths(_images_below(c))
            if not found:
                raise DataError(
                    f"class folder {c} holds no images (files ending {' '.join(IMAGES)}); add images or "
                    "delete the folder"
                )
            if c.name not in classes:
                raise DataError(
                    f"class folder {c} names no class the probe knows (its classes: {', '.join(classes[:10])}"
                    f"{', ...' if len(classes) > 10 else ''}); rename it, or predict on its images unlabeled "
                    "(in a folder of their own)"
                )
            files += found
            labels += [classes.index(c.name)] * len(found)
        parts.append(
            Part(
                ImageChunks(files, images),
                np.asarray(labels, np.int64),
                str(folder),
                "class folders",
                name,
                None,
                True,
                names=classes,
            )
        )
    if whole and len(parts) > 1:  # one part of every split's images, in split order
        files = [f for part in parts for f in part.chunks.files]
        labels = np.concatenate([part.labels for part in parts])
        return [
            replace(parts[0], chunks=ImageChunks(files, images), labels=labels, where=str(root), split=None)
        ]
    return parts


def natural_paths(paths) -> list[Path]:
    """Files in natural order of their paths' parts (a class folder's subfolders, then their files)."""
    return sorted(paths, key=lambda p: tuple(natural_key(part) for part in p.parts))

"""Labels of user data (``--task file:PATH``) as class ids: names numbered, ids renumbered by name, labels of one
class a row given as a column or one-hot, and the checks every label array passes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import DataError
from reservoir.tasks.streams import natural

#: the largest class id and token id a user file may hold (output layers and embedding tables are sized by them)
MAX_ID = 2**20 - 1


def as_text(v: np.ndarray) -> np.ndarray:
    """Strings as text: h5py and numpy give fixed-length ones as bytes and variable-length ones as objects."""
    flat = [x.decode() if isinstance(x, bytes) else str(x) for x in v.ravel()]
    return np.array(flat, dtype=str).reshape(v.shape)


def listed(names: list[str]) -> str:
    """The first ten of ``names``, joined (``, ...`` where there are more)."""
    return f"{', '.join(names[:10])}{', ...' if len(names) > 10 else ''}"


def one_class_a_row(arrays: dict[str, np.ndarray], keys: list[str]) -> dict[str, np.ndarray]:
    """Class labels of one class a row given as a column ``(n, 1)`` (Keras' CIFAR-10) or one-hot ``(n, C)``
    (every row of every label array a single 1, as ``to_categorical`` writes them), as class ids ``(n,)``;
    other arrays, and labels of several classes a row, as they are."""
    out = dict(arrays)
    wide = [k for k in keys if np.ndim(arrays[k]) == 2 and np.shape(arrays[k])[1] > 1]
    for k in keys:
        if np.ndim(arrays[k]) == 2 and np.shape(arrays[k])[1] == 1:
            out[k] = np.asarray(arrays[k])[:, 0]

    def one_hot(y: np.ndarray) -> bool:
        y = np.asarray(y)
        return (
            y.dtype.kind in "biuf" and y.size > 0 and bool(np.isin(y, (0, 1)).all() and (y.sum(1) == 1).all())
        )

    if (
        wide
        and len(wide) == len([k for k in keys if np.ndim(arrays[k]) == 2])
        and all(one_hot(arrays[k]) for k in wide)
    ):
        for k in wide:
            out[k] = np.asarray(arrays[k]).argmax(1)
    return out


def common_names(lists: list[list[str]]) -> list[str] | None:
    """One list of class names for sources that each list theirs: the list where they agree, else every
    name of them all in natural order (``None`` without any)."""
    if not lists:
        return None
    return list(lists[0]) if all(list(n) == list(lists[0]) for n in lists) else natural(set().union(*lists))


def renumbered(labels: np.ndarray, names: list[str], common: list[str], where: Any) -> np.ndarray:
    """Class ids of a source whose classes are ``names`` as the ids of the same names in ``common`` (which
    holds them all); negative ids (unlabeled rows) kept."""
    order = np.array([common.index(n) for n in names], dtype=np.int64)
    labels = np.asarray(labels)
    if labels.size and labels.max() >= len(order):
        raise DataError(
            f"{where} has label {int(labels.max())}, past the {len(order)} classes its ClassLabel names"
        )
    return np.where(labels >= 0, order[np.clip(labels, 0, None)], labels)


def renumbered_as(path: Path, labels: np.ndarray, names: list[str], known: list[str]) -> np.ndarray:
    """Class ids of a source whose classes are ``names`` (a ClassLabel's) as the ids of the same names in
    ``known`` (a probe's classes, or every split's names); a name outside them is refused."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DataError(
            f"{path} names a class {unknown[0]!r} that the probe does not know (its classes: {listed(known)}); "
            "predict on data of its classes"
        )
    return renumbered(labels, names, known, path)


def ids_by_name(
    path: Path, arrays: dict[str, np.ndarray], keys: list[str], known: list[str]
) -> dict[str, np.ndarray]:
    """Class ids ``arrays[keys]`` given to a probe whose classes are named ``known``: read as the class of that
    number's name where every name is a number (class folders ``0``..``9``, labels ``"1"``, ``"2"``), refused
    otherwise, since an id does not say which named class it means."""
    if not all(re.fullmatch(r"-?\d+", n) for n in known):
        raise DataError(
            f"{path} gives its labels as class ids and the probe's classes are named ({listed(known)}): an id does "
            "not say which of them it means; give the labels as those names, or predict on the data without its "
            "labels"
        )
    number = {int(n): i for i, n in enumerate(known)}
    out = dict(arrays)
    for k in keys:
        y = np.asarray(arrays[k])
        given = y[y >= 0]
        if given.size and (given != np.round(given)).any():
            continue  # not class ids: refused as such where labels are checked
        unknown = sorted(set(given.astype(np.int64).tolist()) - number.keys())
        if unknown:
            raise DataError(
                f"{path}: label {unknown[0]} names no class the probe knows (its classes: {listed(known)}); correct "
                "it, or predict on the data without its labels"
            )
        mapped = np.vectorize(lambda v: number.get(int(v), -1), otypes=[np.int64])(y) if y.size else y
        out[k] = np.where(y >= 0, mapped, y).astype(y.dtype if y.dtype.kind in "iu" else np.int64)
    return out


def class_ids(
    path: Path, arrays: dict[str, np.ndarray], known: list[str] | None = None, ids_named: Any = frozenset()
) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """The label arrays of ``arrays`` (``y``, ``y_<split>``, or digits: a source's parts) as class ids, and the
    class names they number (``None`` where the labels name none). Labels of one class a row given as a
    column or one-hot become ids (:func:`one_class_a_row`); names are numbered together over every split in
    natural order, or by their place in ``known`` (a probe's classes); ids given to a probe of named classes
    are read by name (:func:`ids_by_name`; ``ids_named``: arrays whose ids a source names, a ClassLabel's,
    already the probe's)."""
    keys = [k for k in arrays if k == "y" or k.startswith("y_") or k.isdigit()]
    arrays = one_class_a_row(arrays, keys)
    named = [k for k in keys if np.asarray(arrays[k]).dtype.kind in "US"]
    if not named:
        ids = [k for k in keys if k not in ids_named]
        if known is not None and ids:
            return ids_by_name(path, arrays, ids, known), list(known)
        return arrays, None
    numbers = [k for k in keys if k not in named]
    if numbers:
        raise DataError(
            f"{path}: labels {', '.join(named)} hold class names and {', '.join(numbers)} numbers; give every "
            "split's labels the same way (names, or class ids 0..C-1)"
        )
    flat = [k for k in named if np.asarray(arrays[k]).ndim != 1]
    if flat:
        raise DataError(
            f"{path}: {flat[0]} holds class names {np.asarray(arrays[flat[0]]).shape[1:]} a row; names are one "
            "a row (several labels a row must be 0/1 or class ids)"
        )
    names = natural(set().union(*(np.unique(arrays[k]).tolist() for k in named)))
    if known is not None:
        other = [n for n in names if n not in known]
        if other:
            raise DataError(
                f"{path}: label(s) {', '.join(map(repr, other[:5]))} name no class the probe knows (its "
                f"classes: {listed(known)}); correct them, or predict on the data without its labels"
            )
        names = list(known)
    number = {name: i for i, name in enumerate(names)}
    out = dict(arrays)
    for k in named:
        distinct, inverse = np.unique(arrays[k], return_inverse=True)
        out[k] = np.array([number[v] for v in distinct.tolist()], dtype=np.int64)[inverse.reshape(-1)]
    return out, [str(name) for name in names]


def check_labels(path, xname, yname, y, n, regression: bool = False) -> None:
    """Labels: one per row, or ``(n, k)``; class ids ``0..MAX_ID``, or finite numbers for ``regression``."""
    if y.ndim not in (1, 2) or len(y) != n or (y.ndim == 2 and y.shape[1] == 0):
        raise DataError(
            f"{path}: {yname} has shape {y.shape}; expected ({n},), one label per row of {xname}, or "
            f"({n}, k), k labels a row (multi-label 0/1 targets, or k real values with regression=true)"
        )
    if regression and y.dtype.kind not in "fiub":
        raise DataError(f"{path}: {yname} is {y.dtype}; regression targets must be numbers")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        row = int(np.flatnonzero(~np.isfinite(y).reshape(len(y), -1).all(1))[0])
        kind = "targets" if regression else "labels"
        raise DataError(f"{path}: {yname} holds NaN or infinite {kind} (row {row}); replace or drop them")
    if regression:
        return
    if y.dtype.kind == "f" and not (y == np.round(y)).all():
        raise DataError(
            f"{path}: {yname} holds non-integer values; give class ids 0..C-1 "
            "(sklearn.preprocessing.LabelEncoder turns names into ids), or pass --task-opt regression=true "
            "for real-valued targets"
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

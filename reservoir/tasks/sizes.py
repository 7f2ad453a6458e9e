"""How much data a head or a training run needs, checked before anything runs.

A validation split held out of train must hold at least one example per class, and so must what is
left to train on; ``fit`` and ``train`` refuse smaller data up front, naming ``--limit`` and the
smallest value that works.

Train must hold every class the other splits hold (:func:`check_classes`): a class that test holds and
train lacks caps the accuracy without a word. A test split may lack classes of train (they are only not
scored).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from reservoir.errors import DataError, UsageError


def stratify_by(labels: np.ndarray) -> np.ndarray | None:
    """``labels`` to stratify a split by, when they are class ids of which each class held has two rows or more
    (scikit-learn's stratified split needs them; ids need not be contiguous); else ``None``."""
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) == 0:
        return None
    counts = np.unique(labels, return_counts=True)[1]
    return labels if len(counts) > 1 and counts.min() >= 2 else None


def holdout(labels: np.ndarray, size: float | int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted row indices of the fit part and of a seeded validation part of ``labels`` of ``size`` rows (a share,
    or a count), stratified where the labels are class ids (:func:`stratify_by`). A class of a single row stays in
    the fit part, and the other rows are stratified (so one rare class neither leaves training without a row of it
    nor turns stratification off for every class)."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(len(labels))
    single = np.zeros(len(labels), dtype=bool)
    if labels.ndim == 1 and labels.dtype.kind in "iu" and len(labels):
        values, counts = np.unique(labels, return_counts=True)
        single = np.isin(labels, values[counts == 1])
    n_val = int(size) if isinstance(size, (int, np.integer)) else math.ceil(size * len(labels))
    rest = rows[~single]
    by = stratify_by(labels[rest])
    if by is not None and min(n_val, len(rest) - n_val) < len(np.unique(by)):
        by = None  # too few rows held out (or left) for one of every class: a plain seeded draw
    if not single.any():  # the share as given (the same rows as a count of it)
        fit, val = train_test_split(rows, test_size=size, random_state=seed, stratify=by)
        return np.sort(fit), np.sort(val)
    fit, val = train_test_split(rest, test_size=n_val, random_state=seed, stratify=by)
    return np.sort(np.concatenate([fit, rows[single]])), np.sort(val)


def holdout_minimum(classes: int, n_val: Callable[[int], int]) -> int:
    """The fewest train examples from which holding out ``n_val(n)`` leaves at least ``classes``
    for validation and ``classes`` for training."""

    def enough(n: int) -> bool:
        return n_val(n) >= classes and n - n_val(n) >= classes

    high = 2 * classes
    while not enough(high):  # doubling, then bisection
        high *= 2
    low = high // 2  # not enough: fewer than 2 * classes, or the last doubling's
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def _more(limit: int | None, need: int | None, n: int, extracted: bool = False) -> str:
    """What to do about a train split of ``n`` examples, ``need`` wanted: raise ``--limit`` where it cut the
    split (``extracted``: the features' extraction's), else give more data."""
    if limit is not None and n >= limit:
        how = "extract the features again with" if extracted else "pass"
        return (
            f"{how} --limit {need} or more (now {limit}), or leave --limit out"
            if need
            else f"{'extract the features again with a larger --limit' if extracted else 'raise --limit'} "
            f"(now {limit}) or leave it out"
        )
    short = f" (the data holds fewer than --limit {limit}; a task option may set its size)" if limit else ""
    return (f"give at least {need} training examples" if need else "give more examples") + short


def check_train_split(
    where: str,
    labels: np.ndarray,
    *,
    limit: int | None,
    n_val: Callable[[int], int] | None,
    val_fraction: float,
    n_classes: int = 0,
    extracted: bool = False,
    default_fraction: float | None = None,
) -> None:
    """Refuse a train split too small to mean anything (UsageError naming ``--limit`` and the minimum;
    ``extracted``: the limit is the features' extraction's, so the fix is to extract again).

    ``n_val(n)``: the validation examples held out of ``n`` (``None``: the task has its own validation
    split). ``n_classes``: the task's classes (the classes present when larger). ``default_fraction``: the
    default ``val_fraction``; another, given for data with its own validation split, would change nothing
    but the run's name, and is refused."""
    if n_val is None and default_fraction is not None and val_fraction != default_fraction:
        raise UsageError(
            f"{where} has a validation split of its own, which is used: --val-fraction {val_fraction:g} (the "
            "share of train held out where there is none) would change nothing; drop it"
        )
    n = len(labels)
    if labels.dtype.kind == "f":  # real-valued targets (regression): no classes to cover, rows on each side
        held = n_val(n) if n_val is not None else 0
        if n - held >= 2 and (n_val is None or held >= 1):
            return
        raise UsageError(
            f"{where}: the train split has {n} examples of real-valued targets, too few to fit a head"
            f"{' and hold out a validation part' if n_val is not None else ''}: {_more(limit, None, n, extracted)}"
        )
    if labels.ndim == 1:
        present = len(np.unique(labels))
        if present < 2:
            raise UsageError(
                f"{where}: the train split holds {'no examples' if n == 0 else f'a single class in its {n} examples'}; "
                f"a head needs at least two classes: {_more(limit, None, n, extracted)}"
            )
    else:
        present = min(max(int(np.unique(labels).size), 1), max(n_classes, 2))
    if n_val is None:
        return
    held = n_val(n)
    if held >= present and n - held >= present:
        return
    need = holdout_minimum(max(present, n_classes), n_val)
    kind = "examples" if labels.ndim == 1 else "examples (of several outputs each)"
    short, fix = ("validation", "raise") if held < present else ("training", "lower")
    raise UsageError(
        f"{where}: the train split has {n} {kind} of {present} classes; holding out --val-fraction "
        f"{val_fraction:g} leaves {held} for validation and {n - held} to train on, fewer than one per "
        f"class for {short}: {_more(limit, need, n, extracted)}, or {fix} --val-fraction"
    )


def _classes_text(classes: Sequence[int], names: Sequence[str] | None, most: int = 10) -> str:
    """``class 2 ('frog')``, ``classes 0, 2 ('cat', 'frog')``: the classes, by id and name, the first ``most``."""
    shown = [int(c) for c in classes[:most]]
    words = ", ".join(str(c) for c in shown)
    if names:
        words += " (" + ", ".join(repr(names[c]) if c < len(names) else "-" for c in shown) + ")"
    more = f" and {len(classes) - most} more" if len(classes) > most else ""
    return f"class{'es' if len(classes) > 1 else ''} {words}{more}"


def _class_sets(labels: Mapping[str, np.ndarray]) -> dict[str, set[int]]:
    """The classes of each split whose labels are one class id a row (other splits are not compared)."""
    return {
        s: set(np.unique(y).tolist())
        for s, y in labels.items()
        if np.asarray(y).ndim == 1 and np.asarray(y).dtype.kind in "iub" and len(y)
    }


def _lacking(sets: dict[str, set[int]]) -> set[int]:
    """The classes another split holds and ``train`` lacks (none without a train split)."""
    if "train" not in sets:
        return set()
    return set().union(*sets.values()) - sets["train"]


def check_sample(
    where: str,
    labels: Mapping[str, np.ndarray],
    *,
    limit: int | None,
    names: Sequence[str] | None,
    full: Callable[[str], np.ndarray] | None,
) -> list[int]:
    """:func:`check_classes`, then the classes of the whole train split (``full("train")``) that a ``--limit``
    sample's splits hold none of, said on stderr (its results are of fewer classes) and returned."""
    full = functools.cache(full) if full is not None else None
    check_classes(where, labels, limit=limit, names=names, full=full)
    if limit is None or full is None or "train" not in labels:
        return []
    sets = _class_sets({**labels, "whole": full("train")})
    lost = sorted(sets.pop("whole", set()) - set().union(*sets.values()))
    if lost:
        kept = len(sets.get("train", ()))
        print(
            f"note: {where}: the sample of --limit {limit} holds {kept} of train's {kept + len(lost)} classes, "
            f"{_classes_text(lost, names)} left out of every split: its results are of {kept} classes; pass "
            f"--limit {keeps_every_class(full('train'))} or more to keep them all",
            file=sys.stderr,
        )
    return lost


def keeps_every_class(labels: np.ndarray) -> int:
    """The smallest ``--limit`` from which a stratified sample of a split keeps every class of it: where
    :func:`reservoir.tasks.class_quota` has a row left over for each class whose share is below one (which
    its seeded order does not change); the split's size at most."""
    total = len(labels)
    if not total:
        return 0
    _, counts = np.unique(labels, return_counts=True)
    for n in range(len(counts), min(total, math.ceil(total / int(counts.min()))) + 1):
        base = n * counts // total
        if int((base == 0).sum()) <= n - int(base.sum()):
            return n
    return total


def check_classes(
    where: str,
    labels: Mapping[str, np.ndarray],
    *,
    limit: int | None = None,
    names: Sequence[str] | None = None,
    full: Callable[[str], np.ndarray] | None = None,
    fix: str | None = None,
) -> None:
    """Refuse a train split that lacks classes another split holds: DataError naming them, the splits and
    the fix. ``full(split)``: that split's labels without ``limit`` (read only to choose the fix); ``fix``
    replaces the fix."""
    sets = _class_sets(labels)
    missing = _lacking(sets)
    if not missing:
        return
    holders = [t for t in sets if t != "train" and sets[t] & missing]
    problem = (
        f"split 'train' lacks {_classes_text(sorted(missing), names)}, which "
        f"{' and '.join(repr(t) for t in holders)} hold{'s' if len(holders) == 1 else ''}"
    )
    if fix is None:
        data_fix = (
            "give the train split examples of every class the other splits hold (move rows between the splits: "
            "the split column, the split folders or the x_<split>/y_<split> arrays), or drop the rows of the "
            "classes train lacks"
        )
        if limit is None:
            fix = data_fix
        elif full is None:
            fix = f"pass a larger --limit (now {limit}) or leave it out, or {data_fix}"
        else:
            whole = {s: full(s) for s in sets}
            if _lacking(_class_sets(whole)):
                fix = f"the splits lack them without --limit too, so {data_fix}"
            else:
                need = keeps_every_class(whole["train"])
                fix = (
                    f"the sample of --limit {limit} leaves them out: pass --limit {need} or more (the smallest "
                    "sample that keeps a row of every class of train) or leave --limit out"
                )
    raise DataError(f"{where}: {problem}. A head never predicts a class it has not seen in train; {fix}")

"""How much data a head or a training run needs, checked before anything runs.

A validation split held out of train must hold at least one example per class, and so must
what is left to train on; a train split of one class teaches nothing. ``fit`` and ``train``
refuse smaller data up front, naming ``--limit`` and the smallest value that works, instead of
failing inside scikit-learn ("test_size = 6 should be greater or equal to the number of
classes = 10") or "training" to a meaningless number.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reservoir.errors import UsageError


def holdout_minimum(classes: int, n_val: Callable[[int], int]) -> int:
    """The fewest train examples from which holding out ``n_val(n)`` leaves at least ``classes``
    for validation and ``classes`` for training."""

    def enough(n: int) -> bool:
        return n_val(n) >= classes and n - n_val(n) >= classes

    high = 2 * classes
    while not enough(high):  # doubling, then bisection: a few dozen evaluations for any class count
        high *= 2
    low = high // 2  # not enough: fewer than 2 * classes, or the last doubling's
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def _more(limit: int | None, need: int | None) -> str:
    if limit is not None:
        return (
            f"pass --limit {need} or more (now {limit}), or leave --limit out"
            if need
            else f"raise --limit (now {limit}) or leave it out"
        )
    return f"give at least {need} training examples" if need else "give more examples"


def check_train_split(
    where: str,
    labels: np.ndarray,
    *,
    limit: int | None,
    n_val: Callable[[int], int] | None,
    val_fraction: float,
    n_classes: int = 0,
) -> None:
    """Refuse a train split too small to mean anything (UsageError naming ``--limit`` and the minimum).

    ``labels`` are the train split's, one class per example (1-D) or several outputs per example
    (bit tasks: each output one of ``n_classes``). ``n_val(n)``: the validation examples held out of
    ``n`` (``None``: the task has its own validation split, nothing is held out). ``n_classes``: the
    task's classes, for the minimum (the classes present when larger)."""
    n = len(labels)
    if labels.dtype.kind == "f":  # real-valued targets (regression): no classes to cover, rows on each side
        held = n_val(n) if n_val is not None else 0
        if n - held >= 2 and (n_val is None or held >= 1):
            return
        raise UsageError(
            f"{where}: the train split has {n} examples of real-valued targets, too few to fit a head"
            f"{' and hold out a validation part' if n_val is not None else ''}: {_more(limit, None)}"
        )
    if labels.ndim == 1:
        present = len(np.unique(labels))
        if present < 2:
            raise UsageError(
                f"{where}: the train split holds {'no examples' if n == 0 else f'a single class in its {n} examples'}; "
                f"a head needs at least two classes: {_more(limit, None)}"
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
    raise UsageError(
        f"{where}: the train split has {n} {kind} of {present} classes; holding out --val-fraction "
        f"{val_fraction:g} leaves {held} for validation and {n - held} to train on, fewer than one per "
        f"class: {_more(limit, need)}, or raise --val-fraction"
    )

"""Rows of one split for a head: blocks of ``(X (n, d), y)`` streamed from a feature file or held in
memory, and what a head computes over them in one pass (moments, accuracy)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _outputs(y: np.ndarray) -> np.ndarray:
    return y[:, None] if y.ndim == 1 else y


class Rows:
    """Rows of one split for a head: ``(X (n, d), y (n,) | (n, m))`` blocks, as :func:`rows` gives.

    :meth:`blocks` streams them; :meth:`load` gathers them for heads that need every row at once.
    ``labels`` (per example) and ``n`` (examples) are known without reading features.
    """

    labels: np.ndarray
    #: all rows are held in memory (``load`` costs nothing)
    in_memory: bool = False

    def blocks(self):  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def outputs(self) -> int:
        """Outputs per row, as :func:`rows` makes rows of the labels: ``(N,)`` and ``(N, R)`` give 1,
        ``(N, R, m)`` give ``m``."""
        return self.labels.shape[2] if self.labels.ndim == 3 else 1

    @property
    def y_ndim(self) -> int:
        """Dimensions of a block's labels: 1 (a class a row) or 2 (``m`` outputs a row)."""
        return 1 if self.labels.ndim == 1 else 2

    @property
    def n(self) -> int:
        return len(self.labels)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        parts = list(self.blocks())
        return np.concatenate([X for X, _ in parts]), np.concatenate([y for _, y in parts])

    @property
    def nbytes(self) -> int:  # pragma: no cover - abstract
        """Bytes of features these rows hold (what loading them costs)."""
        raise NotImplementedError


class Concat(Rows):
    """Several row sources one after another (the refit on train and validation)."""

    def __init__(self, *sources: Rows):
        self.sources = sources
        self.labels = np.concatenate([s.labels for s in sources])
        self.in_memory = all(s.in_memory for s in sources)

    def blocks(self):
        for source in self.sources:
            yield from source.blocks()

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sources)


def check_finite(X: np.ndarray) -> None:
    """ValueError naming the first row of features ``X`` holding NaN or an infinity (scikit-learn's estimators
    refuse them too; a head would fit or predict them as some class)."""
    X = np.asarray(X)
    if X.dtype.kind in "fc" and not np.isfinite(X).all():
        row = int(np.flatnonzero(~np.isfinite(X).reshape(len(X), -1).all(1))[0])
        raise ValueError(
            f"features hold NaN or infinite values (row {row}); replace them or extract them again"
        )


class ArrayRows(Rows):
    """Rows held in memory: readout features ``(N, R, d)`` and their labels, or rows already flat as a
    head's ``fit(X, y)`` gets them (``X (n, d)``, ``y (n,) | (n, m)``)."""

    in_memory = True

    def __init__(self, X: np.ndarray, y: np.ndarray):
        check_finite(X)
        self.X, self.labels = X, y

    @property
    def flat(self) -> bool:
        return self.X.ndim == 2

    def blocks(self):
        yield (self.X, self.labels) if self.flat else rows(self.X, self.labels)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        return (self.X, self.labels) if self.flat else rows(self.X, self.labels)

    def take(self, index: np.ndarray) -> ArrayRows:
        taken = ArrayRows.__new__(ArrayRows)  # rows of checked rows: not checked again
        taken.X, taken.labels = self.X[index], self.labels[index]
        return taken

    @property
    def outputs(self) -> int:
        if self.flat:
            return self.labels.shape[1] if self.labels.ndim == 2 else 1
        return super().outputs

    @property
    def y_ndim(self) -> int:
        return self.labels.ndim if self.flat else super().y_ndim

    @property
    def nbytes(self) -> int:
        return int(self.X.nbytes)


def rows(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Readout tokens become rows: ``X (N, R, d)``, ``y (N,) | (N, R, m)`` -> 2-D X, 1-D or 2-D y."""
    n, r, d = X.shape
    if r == 1 and y.ndim == 1:
        return X[:, 0], y
    return X.reshape(n * r, d), y.reshape(n * r, -1)


def shape_of(source: Rows) -> tuple[int, int]:
    """Outputs per row and classes per output, as :func:`rows` makes rows of the labels."""
    return source.outputs, int(source.labels.max()) + 1


def standard_scale(
    var: np.ndarray, mean_square: np.ndarray, n: int, mean: np.ndarray | float = 0.0
) -> np.ndarray:
    """``StandardScaler``'s scale of features of variance ``var`` over ``n`` rows: the standard deviation, and 1 where
    the variance is within the rounding noise of sums of squares of mean ``mean_square`` about a shift from which
    the features' mean is ``mean`` (scikit-learn's bound: a constant feature)."""
    eps = np.finfo(np.float64).eps
    constant = var <= n * eps * mean_square + (n * eps * mean) ** 2
    return np.where(constant, 1.0, np.sqrt(var))


def moments(source: Rows) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean and scale of the features (``StandardScaler``'s: :func:`standard_scale`) and the number of rows, in
    one pass, summed about the first block's mean (so a mean far above the spread keeps its digits)."""
    n, shift, total, squares = 0, None, None, None
    for X, _ in source.blocks():
        if not len(X):
            continue
        x = X.astype(np.float64)
        shift = x.mean(0) if shift is None else shift
        x -= shift
        total = x.sum(0) if total is None else total + x.sum(0)
        squares = (x * x).sum(0) if squares is None else squares + (x * x).sum(0)
        n += len(x)
    mean = total / n
    var = np.maximum(squares / n - mean * mean, 0.0)
    return mean + shift, standard_scale(var, squares / n, n, mean), n


def stream_accuracy(predict: Callable[[np.ndarray], np.ndarray], source: Rows) -> float:
    """Fraction correct over every output of ``source``, predicted block by block."""
    correct, total = 0.0, 0
    for X, y in source.blocks():
        pred = predict(X)
        correct += float(np.sum((pred[:, 0] if y.ndim == 1 else pred) == y))
        total += y.size
    return correct / total

"""The ridge head: a closed-form readout from statistics accumulated block by block (reservoirpy's
shape: count, sums, ``X^T X`` and ``X^T Y``), one eigendecomposition of the standardized Gram matrix
giving the solution for every alpha."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from reservoir.probe.heads import HeadKind, Search, best_value, register_head
from reservoir.probe.metrics import metric
from reservoir.probe.predictors import REGRESSION, Predictor, array, predict_ids
from reservoir.probe.rows import Concat, Rows, _outputs, check_finite, standard_scale
from reservoir.settings import Interval, validate

#: the ridge penalties searched for real-valued targets (a forecast often wants far less than a classifier)
REGRESSION_GRID = (1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0)


def _classes(Y: np.ndarray, n_classes: int | None) -> int:
    """Classes per output: ``n_classes``, else :data:`REGRESSION` for float targets, else the largest id + 1; two
    at least (one score per class: a single class would be read as one logit's sign)."""
    if Y.dtype.kind == "f":
        return REGRESSION
    return max(2, n_classes or int(Y.max()) + 1)


def _onehot(Y: np.ndarray, n_classes: int) -> np.ndarray:
    """``(n, m)`` class ids -> ``(n, m * n_classes)`` uint8 0/1 targets; real targets as they are."""
    if n_classes == REGRESSION:
        return Y
    if Y.size and (Y.min() < 0 or Y.max() >= n_classes):
        raise ValueError(
            f"class ids must be in [0, {n_classes - 1}]. Got {int(Y.min())}..{int(Y.max())} instead."
        )
    out = np.zeros((len(Y), Y.shape[1], n_classes), np.uint8)
    np.put_along_axis(out, Y[:, :, None], 1, axis=2)
    return out.reshape(len(Y), -1)


@dataclass
class RidgeStats:
    """Sufficient statistics of a ridge readout, all float64, summed over chunks of rows.

    :meth:`add` folds in one chunk; ``a + b`` holds the rows of both (train is fit plus validation,
    without reading a row again). Standardization and the intercept are derived from the sums in
    :meth:`decompose`. The feature sums are of ``X - shift``, ``shift`` the first chunk's mean (the shifted-data
    algorithm): centring them afterwards keeps float64's digits where a feature's mean is far above its spread.

    Parameters
    ----------
    n
        rows seen.
    sum_x, sum_y
        column sums of the shifted features ``(d,)`` and of the targets ``(k,)``.
    xtx, xty
        ``(X - shift)^T (X - shift)`` ``(d, d)`` and ``(X - shift)^T Y`` ``(d, k)``.
    shift
        ``(d,)``, set by the first :meth:`add`.

    Examples
    --------
    >>> stats = RidgeStats.zeros(768, 10)                        # doctest: +SKIP
    >>> for X, Y in chunks:                                      # doctest: +SKIP
    ...     stats.add(X, Y)
    >>> coef, intercept = stats.decompose().coef(alpha=10.0)     # doctest: +SKIP
    >>> scores = X_test @ coef + intercept                       # doctest: +SKIP
    """

    n: int
    sum_x: np.ndarray
    sum_y: np.ndarray
    xtx: np.ndarray
    xty: np.ndarray
    shift: np.ndarray

    #: rows converted to float64 at a time by :meth:`add` (bounds its extra memory)
    chunk_rows = 4096

    @classmethod
    def zeros(cls, d: int, k: int) -> RidgeStats:
        return cls(0, np.zeros(d), np.zeros(k), np.zeros((d, d)), np.zeros((d, k)), np.zeros(d))

    def add(self, X: np.ndarray, Y: np.ndarray) -> RidgeStats:
        """Fold in rows ``X (n, d)`` with targets ``Y (n, k)`` (in place; returns self)."""
        if X.shape[1:] != self.sum_x.shape or Y.shape[1:] != self.sum_y.shape or len(X) != len(Y):
            raise ValueError(
                f"expected X (n, {len(self.sum_x)}) and Y (n, {len(self.sum_y)}); got {X.shape} and {Y.shape}"
            )
        buffer = None if X.dtype == np.float64 else np.empty((min(len(X), self.chunk_rows), X.shape[1]))
        for i in range(0, len(X), self.chunk_rows):
            x = X[i : i + self.chunk_rows]
            if buffer is not None:  # one float64 buffer for every chunk: no fresh pages per chunk
                x = buffer[: len(x)]
                x[...] = X[i : i + self.chunk_rows]
            y = np.asarray(Y[i : i + self.chunk_rows], dtype=np.float64)
            if self.n == 0:
                self.shift = np.asarray(x.mean(0), dtype=np.float64)
            x = x - self.shift
            self.n += len(x)
            self.sum_x += x.sum(0)
            self.sum_y += y.sum(0)
            self.xtx += x.T @ x
            self.xty += x.T @ y
        return self

    def __add__(self, other: RidgeStats) -> RidgeStats:
        if self.n == 0 or other.n == 0:
            return replace(other if self.n == 0 else self)  # a copy, as a sum is
        d = other.shift - self.shift  # other's sums moved to this shift: x - s = (x - s') + d
        sum_x = other.sum_x + other.n * d
        xtx = other.xtx + np.outer(other.sum_x, d) + np.outer(d, other.sum_x) + other.n * np.outer(d, d)
        return RidgeStats(
            self.n + other.n,
            self.sum_x + sum_x,
            self.sum_y + other.sum_y,
            self.xtx + xtx,
            self.xty + other.xty + np.outer(d, other.sum_y),
            self.shift,
        )

    def decompose(self) -> RidgePath:
        """Standardize as ``StandardScaler`` would, centre the targets and eigendecompose the Gram matrix once."""
        if self.n == 0:
            raise ValueError("RidgeStats holds no rows; add some before decomposing")
        n = self.n
        mean_x, mean_y = self.sum_x / n, self.sum_y / n  # mean_x of the shifted features
        scatter = self.xtx - n * np.outer(mean_x, mean_x)
        var = np.maximum(np.diag(scatter) / n, 0.0)
        scale = standard_scale(var, np.diag(self.xtx) / n, n, mean_x)
        gram = scatter / np.outer(scale, scale)
        cross = (self.xty - n * np.outer(mean_x, mean_y)) / scale[:, None]
        eigvals, eigvecs = np.linalg.eigh(gram)
        return RidgePath(
            np.maximum(eigvals, 0.0), eigvecs, eigvecs.T @ cross, mean_x + self.shift, scale, mean_y
        )


@dataclass(frozen=True)
class RidgePath:
    """Ridge solutions for every alpha from one eigendecomposition.

    With ``Z = (X - mean_x) / scale`` and ``Z^T Z = V diag(eigvals) V^T``, the weights are
    ``W(alpha) = V diag(1 / (eigvals + alpha)) proj`` with ``proj = V^T Z^T (Y - mean_y)``, and the
    unpenalised intercept is ``mean_y``.
    """

    eigvals: np.ndarray
    eigvecs: np.ndarray
    proj: np.ndarray
    mean_x: np.ndarray
    scale: np.ndarray
    mean_y: np.ndarray

    @classmethod
    def from_rows(cls, X: np.ndarray, Y: np.ndarray) -> RidgePath:
        """The same path computed from the rows through their ``n x n`` Gram matrix, for when features
        outnumber rows. With the thin SVD ``Z = U S V^T``, ``eigvals = S^2``, ``V = Z^T U / S`` and
        ``proj = S U^T (Y - mean_y)``; directions with ``S = 0`` carry no weight in either form."""
        X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)
        mean_x, mean_y = X.mean(0), Y.mean(0)
        var = X.var(0)
        scale = standard_scale(var, var, len(X), mean_x)
        Z = (X - mean_x) / scale
        eigvals, U = np.linalg.eigh(Z @ Z.T)
        keep = eigvals > eigvals.max(initial=0.0) * len(X) * np.finfo(np.float64).eps
        S, U = np.sqrt(eigvals[keep]), U[:, keep]
        return cls(S**2, (Z.T @ U) / S, S[:, None] * (U.T @ (Y - mean_y)), mean_x, scale, mean_y)

    def coef(self, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """``(coef (d, k), intercept (k,))`` on raw features: scores are ``X @ coef + intercept``."""
        weights = self.eigvecs @ (self.proj / (self.eigvals + alpha)[:, None])
        coef = weights / self.scale[:, None]
        return coef, self.mean_y - self.mean_x @ coef


def search_ridge(
    kind: HeadKind,
    fit: Rows,
    val: Rows,
    *,
    refit_with_val: bool,
    seed: int,
    device: str = "cpu",
    memory_bytes: int | None = None,
) -> Search:
    """The ridge head's :func:`~reservoir.probe.heads.search_refit`: one pass over ``fit`` and one
    eigendecomposition score every alpha; the refit adds ``val`` and decomposes once more. Class targets
    are scored by accuracy over ``kind.grid``, float targets by NRMSE over :data:`REGRESSION_GRID`."""
    regression = fit.labels.dtype.kind == "f"
    c = REGRESSION if regression else _classes(np.concatenate([fit.labels.ravel(), val.labels.ravel()]), None)
    head = RidgeHead(n_classes=c).fit_blocks(fit)

    def scores_of(alphas, source: Rows) -> dict[float, float]:
        coefs = {}
        for alpha in alphas:
            head.solve(alpha)
            coefs[alpha] = (head.coef_, head.intercept_)
        hits, total = dict.fromkeys(alphas, 0.0), 0
        sum_y, sum_yy = 0.0, 0.0
        for X, y in source.blocks():
            for alpha in alphas:
                coef, intercept = coefs[alpha]
                pred = predict_ids(X @ coef + intercept, head.n_outputs_, c, y.ndim)
                hits[alpha] += float(np.sum((pred - y) ** 2)) if regression else float(np.sum(pred == y))
            if regression:
                yy = np.asarray(y, np.float64).reshape(len(y), -1)
                sum_y, sum_yy = sum_y + yy.sum(0), sum_yy + (yy * yy).sum(0)
            total += len(y) if regression else y.size
        if not regression:
            return {alpha: hits[alpha] / total for alpha in alphas}
        sst = float(np.sum(sum_yy - sum_y * sum_y / total))
        return {alpha: (float(np.sqrt(hits[alpha] / sst)) if sst > 0 else float("nan")) for alpha in alphas}

    grid = REGRESSION_GRID if regression else kind.grid
    scores = scores_of(grid, val)
    best = best_value(grid, scores, metric("nrmse" if regression else "accuracy"))
    refit = RidgeHead(n_classes=c).fit_blocks(Concat(fit, val)) if refit_with_val else head
    refit.solve(best)
    return (
        scores,
        best,
        RidgePredictor(
            refit.coef_, refit.intercept_, refit.n_outputs_, c, refit.path_.mean_x, refit.path_.scale
        ),
    )


@register_head(
    "ridge",
    param="alpha",
    grid=(0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0),
    search=search_ridge,
    regression=True,
)
class RidgeHead(ClassifierMixin, BaseEstimator):
    """Closed-form ridge regression on one-hot targets; predicts the argmax per output. Float
    targets are regressed as they are (``n_classes_`` is then :data:`REGRESSION`) and predicted as values.

    Features are standardized and the intercept is not penalised (:class:`RidgeStats`).

    Parameters
    ----------
    alpha
        L2 penalty on the standardized features.
    n_classes
        classes per output (inferred from the first chunk's ``y`` when None).

    Examples
    --------
    >>> head = RidgeHead(alpha=1.0).fit(X_train, y_train)  # doctest: +SKIP
    >>> head.predict(X_test)                                # doctest: +SKIP
    >>> for X, y in chunks:                                 # doctest: +SKIP
    ...     head.partial_fit(X, y)
    >>> head.solve(10.0).predict(X_test)                    # doctest: +SKIP
    """

    parameter_constraints = {"alpha": (Interval(0, None),), "n_classes": (None, Interval(0, None))}

    def __init__(self, alpha: float = 1.0, *, n_classes: int | None = None):
        self.alpha = alpha
        self.n_classes = n_classes

    def partial_fit(self, X: np.ndarray, y: np.ndarray) -> RidgeHead:
        """Add one chunk to the statistics (no solve: call :meth:`solve`)."""
        validate(self, "RidgeHead")
        check_finite(X)
        Y = _outputs(y)
        if not hasattr(self, "stats_"):
            self.n_outputs_, self.n_classes_ = Y.shape[1], _classes(Y, self.n_classes)
            self.stats_ = RidgeStats.zeros(X.shape[1], self.n_outputs_ * max(self.n_classes_, 1))
        self.y_ndim_ = y.ndim
        self.stats_.add(X, _onehot(Y, self.n_classes_))
        self.path_ = None  # the decomposition of the previous statistics is stale
        return self

    def solve(self, alpha: float | None = None) -> RidgeHead:
        """Coefficients for ``alpha`` (default ``self.alpha``), reusing these statistics' eigendecomposition."""
        if getattr(self, "path_", None) is None:
            check_is_fitted(self, "stats_")
            self.path_ = self.stats_.decompose()
        self.coef_, self.intercept_ = self.path_.coef(self.alpha if alpha is None else alpha)
        return self

    def fit(self, X: np.ndarray, y: np.ndarray) -> RidgeHead:
        """All rows at once (through :meth:`RidgePath.from_rows` when features outnumber rows)."""
        validate(self, "RidgeHead")
        self.__dict__.pop("stats_", None)
        if X.shape[0] >= X.shape[1]:
            return self.partial_fit(X, y).solve()
        check_finite(X)
        Y = _outputs(y)
        self.n_outputs_, self.n_classes_, self.y_ndim_ = (
            Y.shape[1],
            _classes(Y, self.n_classes),
            y.ndim,
        )
        self.path_ = RidgePath.from_rows(X, _onehot(Y, self.n_classes_))
        return self.solve()

    def fit_blocks(self, source: Rows) -> RidgeHead:
        """Rows read block by block, statistics accumulated (rows in memory may take :meth:`fit`'s path)."""
        if source.in_memory:
            X, y = source.load()
            if X.shape[0] < X.shape[1]:
                return self.fit(X, y)
        self.__dict__.pop("stats_", None)
        for X, y in source.blocks():
            self.partial_fit(X, y)
        return self.solve()

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "coef_")
        check_finite(X)
        return predict_ids(X @ self.coef_ + self.intercept_, self.n_outputs_, self.n_classes_, self.y_ndim_)


class RidgePredictor(Predictor):
    """The ridge head: ``argmax(X @ coef + intercept)`` per output, the standardisation folded in."""

    kind = "ridge"
    min_classes = REGRESSION

    def __init__(
        self,
        coef: np.ndarray,
        intercept: np.ndarray,
        m: int,
        c: int,
        mean: np.ndarray | None = None,
        scale: np.ndarray | None = None,
    ):
        self.coef, self.intercept, self.n_outputs, self.n_classes = coef, intercept, int(m), int(c)
        self.mean = np.zeros(len(coef)) if mean is None else mean
        self.scale = np.ones(len(coef)) if scale is None else scale

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return predict_ids(X @ self.coef + self.intercept, self.n_outputs, self.n_classes)

    def state(self):
        return (
            {"kind": self.kind, "n_outputs": self.n_outputs, "n_classes": self.n_classes},
            {"coef": self.coef, "intercept": self.intercept, "mean": self.mean, "scale": self.scale},
        )

    @classmethod
    def from_state(cls, meta, arrays, m, c):
        coef = array(arrays, "coef", 2)
        d = coef.shape[0]
        intercept = array(arrays, "intercept", 1, (coef.shape[1],))
        return cls(coef, intercept, m, c, array(arrays, "mean", 1, (d,)), array(arrays, "scale", 1, (d,)))

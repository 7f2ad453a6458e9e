"""Linear heads on cached features, with the scikit-learn estimator contract.

Labels are ``(n,)`` class ids or ``(n, m)`` for ``m`` outputs (bits) sharing one head;
``predict`` returns the same shape. :func:`fit_depth` standardizes, chooses the
regularisation on a validation split, refits on all of train and scores the test split,
with BLAS and OpenMP limited to :func:`head_threads` threads.

- ``logreg``: multinomial logistic regression per output, scikit-learn's objective minimised by
  L-BFGS over the rows block by block (:func:`streaming_logistic`).
- ``ridge``: closed-form ridge readout on one-hot targets from accumulated statistics
  (:class:`RidgeStats`: count, sums, ``X^T X`` and ``X^T Y`` added chunk by chunk,
  reservoirpy's shape); one eigendecomposition of the standardized Gram matrix gives the
  solution for every alpha (:class:`RidgePath`).
- ``torch``: a linear layer trained with Adam in mini-batches read block by block
  (:func:`streaming_linear`), or full-batch LBFGS in memory.

Each head has one implementation: ``fit(X, y)`` on rows in memory is ``fit_blocks`` on those
rows, the same code that reads a feature file block by block when it does not fit in memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from reservoir.config import POSITIVE, Interval, OneOf, check, validate
from reservoir.probe.metrics import Metric, accuracy, metric, result_scores, target_kind
from reservoir.probe.metrics import scores as metric_scores
from reservoir.registry import HEADS


def head_threads() -> int:
    """BLAS and OpenMP threads while a head fits: one, whatever the number of cores.

    :func:`fit_depth` holds this limit (threadpoolctl) for the whole fit of a depth. Threads
    pay off only while every core stays free for the whole fit, which a shared machine does not
    promise; the measurements behind the choice are in docs/benchmarks.md, section "Heads".

    Returns
    -------
    int
        The thread count, always 1.
    """
    return 1


#: ``n_classes`` of a head whose outputs are real values (float targets: ridge regression)
REGRESSION = 0
#: the ridge penalties searched for real-valued targets: forecasting a smooth series from a reservoir's
#: states often wants far less regularisation than classifying (reservoirpy's examples use 1e-8 to 1e-6)
REGRESSION_GRID = (1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0)


def _outputs(y: np.ndarray) -> np.ndarray:
    return y[:, None] if y.ndim == 1 else y


def _classes(Y: np.ndarray, n_classes: int | None) -> int:
    """Classes per output: ``n_classes`` when given, :data:`REGRESSION` for float targets, else the
    largest id + 1."""
    if Y.dtype.kind == "f":
        return REGRESSION
    return n_classes or int(Y.max()) + 1


def _onehot(Y: np.ndarray, n_classes: int) -> np.ndarray:
    """``(n, m)`` class ids -> ``(n, m * n_classes)`` 0/1 targets (uint8; widened per chunk); real
    targets (``n_classes`` :data:`REGRESSION`) are their own targets."""
    if n_classes == REGRESSION:
        return Y
    if Y.size and (Y.min() < 0 or Y.max() >= n_classes):
        raise ValueError(
            f"class ids must be in [0, {n_classes - 1}]. Got {int(Y.min())}..{int(Y.max())} instead."
        )
    out = np.zeros((len(Y), Y.shape[1], n_classes), np.uint8)
    np.put_along_axis(out, Y[:, :, None], 1, axis=2)
    return out.reshape(len(Y), -1)


def _predict(scores: np.ndarray, m: int, k: int, y_ndim: int = 2) -> np.ndarray:
    """Scores ``(n, m * k)`` -> class ids ``(n, m)`` (``(n,)`` for ``y_ndim == 1``): the argmax of
    each output's ``k`` class scores, or the sign of its one logit when ``k == 1`` (binary); for
    ``k`` :data:`REGRESSION` the scores ``(n, m)`` are the predicted values."""
    if k == REGRESSION:
        pred = scores.reshape(len(scores), m)
        return pred[:, 0] if y_ndim == 1 else pred
    z = scores.reshape(len(scores), m, k)
    pred = (z[:, :, 0] > 0).astype(np.int64) if k == 1 else z.argmax(-1)
    return pred[:, 0] if y_ndim == 1 else pred


@dataclass
class RidgeStats:
    """Sufficient statistics of a ridge readout, all float64, summed over chunks of rows.

    :meth:`add` folds in one chunk; ``a + b`` holds the rows of both, so the statistics of
    all of train are those of the fit part plus those of the validation part, without
    reading a row again. Standardization and the intercept are derived from the sums in
    :meth:`decompose`, so no pass over the data is needed before accumulating. (Centring
    ``X^T X`` afterwards loses about ``log10(mean^2 / variance)`` of float64's 16 digits
    per feature: harmless unless a feature's mean is many orders above its spread.)

    Parameters
    ----------
    n
        rows seen.
    sum_x, sum_y
        column sums of the features ``(d,)`` and of the targets ``(k,)``.
    xtx, xty
        ``X^T X`` ``(d, d)`` and ``X^T Y`` ``(d, k)``.

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

    #: rows converted to float64 at a time by :meth:`add` (bounds its extra memory)
    chunk_rows = 4096

    @classmethod
    def zeros(cls, d: int, k: int) -> RidgeStats:
        return cls(0, np.zeros(d), np.zeros(k), np.zeros((d, d)), np.zeros((d, k)))

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
            self.n += len(x)
            self.sum_x += x.sum(0)
            self.sum_y += y.sum(0)
            self.xtx += x.T @ x
            self.xty += x.T @ y
        return self

    def __add__(self, other: RidgeStats) -> RidgeStats:
        return RidgeStats(
            self.n + other.n,
            self.sum_x + other.sum_x,
            self.sum_y + other.sum_y,
            self.xtx + other.xtx,
            self.xty + other.xty,
        )

    def decompose(self) -> RidgePath:
        """Standardize (as ``StandardScaler`` would on these rows), centre the targets and
        eigendecompose the Gram matrix once: the ridge solution for any alpha follows."""
        if self.n == 0:
            raise ValueError("RidgeStats holds no rows; add some before decomposing")
        n = self.n
        mean_x, mean_y = self.sum_x / n, self.sum_y / n
        scatter = self.xtx - n * np.outer(mean_x, mean_x)
        var = np.maximum(np.diag(scatter) / n, 0.0)
        constant = var <= n * np.finfo(np.float64).eps * np.diag(self.xtx) / n  # rounding noise only
        scale = np.where(constant, 1.0, np.sqrt(var))
        gram = scatter / np.outer(scale, scale)
        cross = (self.xty - n * np.outer(mean_x, mean_y)) / scale[:, None]
        eigvals, eigvecs = np.linalg.eigh(gram)
        return RidgePath(np.maximum(eigvals, 0.0), eigvecs, eigvecs.T @ cross, mean_x, scale, mean_y)


@dataclass(frozen=True)
class RidgePath:
    """Ridge solutions for every alpha from one eigendecomposition.

    With standardized features ``Z = (X - mean_x) / scale``, centred targets ``Y - mean_y``
    and ``Z^T Z = V diag(eigvals) V^T``, the weights are
    ``W(alpha) = V diag(1 / (eigvals + alpha)) V^T Z^T (Y - mean_y)`` and the unpenalised
    intercept is ``mean_y``; ``proj`` holds ``V^T Z^T (Y - mean_y)``.
    """

    eigvals: np.ndarray
    eigvecs: np.ndarray
    proj: np.ndarray
    mean_x: np.ndarray
    scale: np.ndarray
    mean_y: np.ndarray

    @classmethod
    def from_rows(cls, X: np.ndarray, Y: np.ndarray) -> RidgePath:
        """The same path computed from the rows through their ``n x n`` Gram matrix: cheaper than
        :class:`RidgeStats` when features outnumber rows (raw-input baselines). With the thin SVD
        ``Z = U S V^T``, ``eigvals = S^2``, ``V = Z^T U / S`` and ``proj = S U^T (Y - mean_y)``;
        directions with ``S = 0`` carry no weight in either form."""
        X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)
        mean_x, mean_y = X.mean(0), Y.mean(0)
        var = X.var(0)
        constant = var <= np.finfo(np.float64).eps * np.einsum("ij,ij->j", X, X)  # as RidgeStats.decompose
        scale = np.where(constant, 1.0, np.sqrt(var))
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


@dataclass(frozen=True)
class HeadKind:
    """A registered head: its estimator, the hyperparameter searched on validation and its grid,
    how the grid is searched (``None``: :func:`search_refit`, one fit per value; a head that solves
    the grid faster gives its own, as ridge does) and whether it fits real-valued targets."""

    estimator: Any
    param: str
    grid: tuple[float, ...]
    search: Callable[..., Search] | None = field(default=None, repr=False)
    regression: bool = False


def register_head(
    name: str,
    *,
    param: str,
    grid: tuple[float, ...],
    search: Callable[..., Search] | None = None,
    regression: bool = False,
):
    """Class decorator: register an estimator class (the scikit-learn contract, a ``predict_``
    :class:`Predictor` once fitted) as the head ``name`` of ``fit --head``, searched over ``grid``
    values of its parameter ``param``; the class's first docstring line is its help."""

    def add(cls):
        kind = HeadKind(cls(), param, tuple(grid), search, regression)
        HEADS.register(name, kind, help=(cls.__doc__ or "").strip().splitlines()[0])
        return cls

    return add


def _best(grid: tuple[float, ...], scores: dict[float, float], by: Metric | None = None) -> float:
    """The best-scoring value by metric ``by`` (default: accuracy, greater is better); ties and NaN
    scores go to the first in the grid."""
    sign = 1.0 if by is None or by.greater_is_better else -1.0
    return max(grid, key=lambda v: (-np.inf if np.isnan(scores[v]) else sign * scores[v], -grid.index(v)))


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
    """The ridge head's :func:`search_refit`, by :class:`RidgeHead` itself: one pass over ``fit``
    (block by block, :meth:`RidgeHead.fit_blocks`) and one eigendecomposition score every alpha of
    the grid; the refit adds ``val`` and decomposes once more. Same results as a standardized ridge
    per alpha. Class targets are scored by accuracy over ``kind.grid``, float targets by NRMSE over
    :data:`REGRESSION_GRID` (:mod:`.metrics`)."""
    regression = fit.labels.dtype.kind == "f"
    c = REGRESSION if regression else int(max(fit.labels.max(), val.labels.max())) + 1
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
                pred = _predict(X @ coef + intercept, head.n_outputs_, c, y.ndim)
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
    best = _best(grid, scores, metric("nrmse" if regression else "accuracy"))
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

    Features are standardized and the intercept is not penalised, both from the
    accumulated :class:`RidgeStats` (so ``alpha`` is comparable across datasets).

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
        Y = _outputs(y)
        if not hasattr(self, "stats_"):
            self.n_outputs_, self.n_classes_ = Y.shape[1], _classes(Y, self.n_classes)
            self.stats_ = RidgeStats.zeros(X.shape[1], self.n_outputs_ * max(self.n_classes_, 1))
        self.y_ndim_ = y.ndim
        self.stats_.add(X, _onehot(Y, self.n_classes_))
        self.path_ = None  # the decomposition of the previous statistics is stale
        return self

    def solve(self, alpha: float | None = None) -> RidgeHead:
        """Coefficients for ``alpha`` (default ``self.alpha``); the eigendecomposition is
        computed once per set of statistics and reused for every further alpha."""
        if getattr(self, "path_", None) is None:
            check_is_fitted(self, "stats_")
            self.path_ = self.stats_.decompose()
        self.coef_, self.intercept_ = self.path_.coef(self.alpha if alpha is None else alpha)
        return self

    def fit(self, X: np.ndarray, y: np.ndarray) -> RidgeHead:
        """All rows at once: through their ``n x n`` Gram matrix when features outnumber rows
        (:meth:`RidgePath.from_rows`), else through the accumulated statistics."""
        validate(self, "RidgeHead")
        self.__dict__.pop("stats_", None)
        if X.shape[0] >= X.shape[1]:
            return self.partial_fit(X, y).solve()
        Y = _outputs(y)
        self.n_outputs_, self.n_classes_, self.y_ndim_ = (
            Y.shape[1],
            _classes(Y, self.n_classes),
            y.ndim,
        )
        self.path_ = RidgePath.from_rows(X, _onehot(Y, self.n_classes_))
        return self.solve()

    def fit_blocks(self, source: Rows) -> RidgeHead:
        """Rows read block by block (one block in memory at a time), statistics accumulated; rows held
        in memory and fewer than the features take :meth:`fit`'s Gram-matrix path."""
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
        return _predict(X @ self.coef_ + self.intercept_, self.n_outputs_, self.n_classes_, self.y_ndim_)


@register_head("torch", param="weight_decay", grid=(0.0, 1e-4, 1e-3, 1e-2))
class TorchHead(ClassifierMixin, BaseEstimator):
    """A linear layer trained with cross-entropy per output.

    Parameters
    ----------
    weight_decay
        L2 penalty added to the loss.
    optimizer
        ``"adam"`` (mini-batches, ``epochs`` passes) or ``"lbfgs"`` (full batch).
    lr, epochs, batch_size, seed
        optimisation settings; ``seed`` fixes init and order.
    device
        where the layer trains (``auto``, ``cpu``, ``cuda[:N]``, ``mps``; as ``--device``).
    """

    parameter_constraints = {
        "weight_decay": (Interval(0, None),),
        "optimizer": (OneOf(("adam", "lbfgs")),),
        "lr": (Interval(0, None, closed="neither"),),
        "epochs": (POSITIVE,),
        "batch_size": (POSITIVE,),
    }

    def __init__(
        self,
        weight_decay: float = 0.0,
        *,
        optimizer: str = "adam",
        lr: float = 1e-2,
        epochs: int = 30,
        batch_size: int = 256,
        seed: int = 0,
        device: str = "cpu",
    ):
        self.weight_decay = weight_decay
        self.optimizer = optimizer
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.seed = seed
        self.device = device

    def fit(self, X: np.ndarray, y: np.ndarray) -> TorchHead:
        from reservoir.model.devices import resolve_device

        validate(self, "TorchHead")
        self.device_ = resolve_device(self.device)
        if self.optimizer == "adam":  # the same implementation as a fit on rows read block by block
            return self.fit_blocks(FlatRows(X, y))
        Y = torch.from_numpy(_outputs(y).astype(np.int64)).to(self.device_)
        self.y_ndim_, self.n_outputs_ = y.ndim, Y.shape[1]
        self.n_classes_ = int(Y.max()) + 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.linear_ = torch.nn.Linear(X.shape[1], self.n_outputs_ * self.n_classes_).to(self.device_)
        Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(self.device_)

        def loss_on(xb, yb):
            logits = self.linear_(xb).view(len(xb), self.n_outputs_, self.n_classes_)
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), yb)
            return loss + self.weight_decay * self.linear_.weight.pow(2).sum()

        opt = torch.optim.LBFGS(
            self.linear_.parameters(), lr=1.0, max_iter=200, line_search_fn="strong_wolfe"
        )

        def closure():
            opt.zero_grad()
            loss = loss_on(Xt, Y)
            loss.backward()
            return loss

        opt.step(closure)
        self.predict_ = _linear_predictor(
            self.linear_, None, None, self.n_outputs_, self.n_classes_, self.device_
        )
        return self

    def fit_blocks(self, source: Rows) -> TorchHead:
        """Adam on rows read block by block (:func:`streaming_linear`): the one implementation of
        the ``adam`` head, in memory or not."""
        validate(self, "TorchHead")
        check(
            "TorchHead",
            "optimizer",
            self.optimizer,
            OneOf(("adam",)),
            note=" to fit rows read block by block",
        )
        self.y_ndim_ = source.y_ndim
        self.predict_ = streaming_linear(
            self.weight_decay,
            source,
            seed=self.seed,
            device=self.device,
            lr=self.lr,
            epochs=self.epochs,
            batch_size=self.batch_size,
        )
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "predict_")
        pred = self.predict_(X)
        return pred[:, 0] if self.y_ndim_ == 1 else pred


@register_head("logreg", param="C", grid=(0.001, 0.01, 0.1, 1.0, 10.0))
class LogRegHead(ClassifierMixin, BaseEstimator):
    """Multinomial logistic regression per output (one logit for two classes), scikit-learn's
    objective (``C`` times the summed log loss plus half the squared weights, intercept
    unpenalised, standardized features) minimised by L-BFGS: :func:`streaming_logistic`, the one
    implementation whether the rows are in memory or read block by block.

    Parameters
    ----------
    C
        inverse L2 penalty.
    max_iter
        L-BFGS iterations.
    """

    parameter_constraints = {"C": (Interval(0, None, closed="neither"),), "max_iter": (POSITIVE,)}

    def __init__(self, C: float = 1.0, *, max_iter: int = 300):
        self.C = C
        self.max_iter = max_iter

    def fit(self, X: np.ndarray, y: np.ndarray) -> LogRegHead:
        return self.fit_blocks(FlatRows(X, y))

    def fit_blocks(self, source: Rows) -> LogRegHead:
        validate(self, "LogRegHead")
        self.y_ndim_ = source.y_ndim
        self.predict_ = streaming_logistic(self.C, source, max_iter=self.max_iter)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "predict_")
        pred = self.predict_(X)
        return pred[:, 0] if self.y_ndim_ == 1 else pred


class Rows:
    """Rows of one split for a head: ``(X (n, d), y (n,) | (n, m))`` blocks, as :func:`rows` gives.

    :meth:`blocks` streams them (a feature file is read a block at a time, so heads that
    accumulate, like ridge, keep memory flat as the split grows); :meth:`load` gathers them
    for heads that need every row at once. ``labels`` (per example) and ``n`` (examples) are
    known without reading features.
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


class FlatRows(Rows):
    """Rows already flat, as a head's ``fit(X, y)`` gets them: ``X (n, d)``, ``y (n,) | (n, m)``."""

    in_memory = True

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.X, self.labels = X, y

    def blocks(self):
        yield self.X, self.labels

    @property
    def outputs(self) -> int:
        return self.labels.shape[1] if self.labels.ndim == 2 else 1

    @property
    def y_ndim(self) -> int:
        return self.labels.ndim

    @property
    def nbytes(self) -> int:
        return int(self.X.nbytes)


class ArrayRows(Rows):
    """Rows held in memory: readout features ``(N, R, d)`` and their labels."""

    in_memory = True

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.X, self.labels = X, y

    def blocks(self):
        yield rows(self.X, self.labels)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        return rows(self.X, self.labels)

    def take(self, index: np.ndarray) -> ArrayRows:
        return ArrayRows(self.X[index], self.labels[index])

    @property
    def nbytes(self) -> int:
        return int(self.X.nbytes)


# -- streaming heads: every pass reads the rows block by block -------------------------------------


def _shape(source: Rows) -> tuple[int, int]:
    """Outputs per row and classes per output, as :func:`rows` makes rows of the labels."""
    return source.outputs, int(source.labels.max()) + 1


def moments(source: Rows) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean and scale of the features (``StandardScaler``'s, a constant feature scaled by 1) and the
    number of rows, in one pass."""
    n, total, squares = 0, None, None
    for X, _ in source.blocks():
        x = X.astype(np.float64)
        total = x.sum(0) if total is None else total + x.sum(0)
        squares = (x * x).sum(0) if squares is None else squares + (x * x).sum(0)
        n += len(x)
    mean = total / n
    var = np.maximum(squares / n - mean * mean, 0.0)
    return mean, np.where(var > 0, np.sqrt(var), 1.0), n


def stream_accuracy(predict: Callable[[np.ndarray], np.ndarray], source: Rows) -> float:
    """Fraction correct over every output of ``source``, predicted block by block."""
    correct, total = 0.0, 0
    for X, y in source.blocks():
        pred = predict(X)
        correct += float(np.sum((pred[:, 0] if y.ndim == 1 else pred) == y))
        total += y.size
    return correct / total


def streaming_logistic(
    C: float, source: Rows, *, seed: int = 0, device: str = "cpu", max_iter: int = 300, tol: float = 1e-4
) -> Callable[[np.ndarray], np.ndarray]:
    """Logistic regression out of core: scikit-learn's objective (``C`` times the summed log loss
    plus half the squared weights, intercept unpenalised, on standardized features; softmax over
    the classes, or one logit for two classes, per output) minimised by SciPy's L-BFGS, each
    loss and gradient computed over the rows block by block. Returns a predictor ``X -> (n, m)``."""
    from scipy.optimize import minimize

    mean, scale, n = moments(source)
    m, c = _shape(source)
    k = 1 if c == 2 else c
    d = len(mean)

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        W, b = theta[: d * m * k].reshape(d, m * k), theta[d * m * k :]
        loss, gW, gb = 0.0, np.zeros_like(W), np.zeros_like(b)
        for X, y in source.blocks():
            Z = (X.astype(np.float64) - mean) / scale
            Y = _outputs(y)
            logits = (Z @ W + b).reshape(len(Z), m, k)
            if k == 1:
                z = logits[:, :, 0]
                loss += float(np.sum(np.logaddexp(0, z) - Y * z))
                G = (1 / (1 + np.exp(-z)) - Y)[:, :, None]
            else:
                top = logits.max(-1, keepdims=True)
                lse = top[..., 0] + np.log(np.exp(logits - top).sum(-1))
                loss += float(np.sum(lse - np.take_along_axis(logits, Y[:, :, None], -1)[..., 0]))
                G = np.exp(logits - lse[..., None])
                np.put_along_axis(G, Y[:, :, None], np.take_along_axis(G, Y[:, :, None], -1) - 1, -1)
            G = G.reshape(len(Z), m * k)
            gW += Z.T @ G
            gb += G.sum(0)
        value = (C * loss + 0.5 * float(np.sum(W * W))) / n
        return value, np.concatenate([(C * gW + W).ravel(), C * gb]) / n

    result = minimize(
        objective,
        np.zeros(d * m * k + m * k),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "gtol": tol / n, "maxls": 50},
    )
    W, b = result.x[: d * m * k].reshape(d, m * k), result.x[d * m * k :]
    return LogisticPredictor(mean, scale, W, b, m, c)


def streaming_linear(
    weight_decay: float,
    source: Rows,
    *,
    seed: int = 0,
    device: str = "cpu",
    lr: float = 1e-2,
    epochs: int = 30,
    batch_size: int = 256,
) -> Callable[[np.ndarray], np.ndarray]:
    """:class:`TorchHead` out of core: the same layer, loss and Adam, on standardized features,
    with mini-batches drawn block by block (blocks in file order, rows shuffled within a block)."""
    from reservoir.model.devices import resolve_device

    dev = resolve_device(device)
    mean, scale, _ = moments(source)
    m, c = _shape(source)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        linear = torch.nn.Linear(len(mean), m * c).to(dev)
    opt = torch.optim.Adam(linear.parameters(), lr=lr)
    shift = torch.from_numpy(mean.astype(np.float32)).to(dev)
    div = torch.from_numpy(scale.astype(np.float32)).to(dev)
    for _ in range(epochs):
        for X, y in source.blocks():
            Xt = (torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(dev) - shift) / div
            Yt = torch.from_numpy(_outputs(y).astype(np.int64)).to(dev)
            for idx in torch.randperm(len(Xt), generator=g).to(dev).split(batch_size):
                opt.zero_grad()
                logits = linear(Xt[idx]).view(len(idx), m, c)
                loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), Yt[idx])
                (loss + weight_decay * linear.weight.pow(2).sum()).backward()
                opt.step()

    return _linear_predictor(linear, shift, div, m, c, dev)


def _linear_predictor(linear: torch.nn.Linear, shift, div, m: int, c: int, dev) -> LinearLayerPredictor:
    """``X -> (n, m)`` class ids of a trained linear layer (features standardized by ``shift`` and ``div``
    when given)."""
    return LinearLayerPredictor(linear.weight.detach(), linear.bias.detach(), shift, div, m, c, dev)


# -- fitted state: a head's predictor as arrays and numbers, so a saved probe predicts as the fit did ------


class Predictor:
    """What a fitted head predicts with: ``X (n, d) -> (n, m)`` class ids, and its state.

    :meth:`state` gives the numbers (``meta``, JSON) and arrays (numeric ``arrays``) that
    :func:`predictor_from_state` turns back into a predictor computing the same operations in
    the same dtypes, so its predictions equal the fit's exactly (on the same device).
    ``n_outputs`` (``m``) and ``n_classes`` (per output) describe its labels.

    Examples
    --------
    >>> meta, arrays = predictor.state()                            # doctest: +SKIP
    >>> again = predictor_from_state(meta, arrays)                  # doctest: +SKIP
    >>> (again(X) == predictor(X)).all()                            # doctest: +SKIP
    True
    """

    kind = ""
    n_outputs: int
    n_classes: int

    def __call__(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:  # pragma: no cover - abstract
        raise NotImplementedError


class RidgePredictor(Predictor):
    """The ridge head: ``argmax(X @ coef + intercept)`` per output on raw features (the
    standardisation ``mean``/``scale`` is folded into ``coef`` and ``intercept``; kept for reference)."""

    kind = "ridge"

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
        return _predict(X @ self.coef + self.intercept, self.n_outputs, self.n_classes)

    def state(self):
        return (
            {"kind": self.kind, "n_outputs": self.n_outputs, "n_classes": self.n_classes},
            {"coef": self.coef, "intercept": self.intercept, "mean": self.mean, "scale": self.scale},
        )


class LogisticPredictor(Predictor):
    """The logistic head (:func:`streaming_logistic`): features standardized by ``mean`` and ``scale``
    in float64, then ``W`` and ``b``; one logit per output for two classes, else one per class."""

    kind = "logistic"

    def __init__(self, mean: np.ndarray, scale: np.ndarray, W: np.ndarray, b: np.ndarray, m: int, c: int):
        self.mean, self.scale, self.W, self.b = mean, scale, W, b
        self.n_outputs, self.n_classes = int(m), int(c)
        self.k = 1 if self.n_classes == 2 else self.n_classes

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return _predict(
            ((X.astype(np.float64) - self.mean) / self.scale) @ self.W + self.b, self.n_outputs, self.k
        )

    def state(self):
        return (
            {"kind": self.kind, "n_outputs": self.n_outputs, "n_classes": self.n_classes},
            {"mean": self.mean, "scale": self.scale, "W": self.W, "b": self.b},
        )


class LinearLayerPredictor(Predictor):
    """The torch head: a linear layer (``weight (m * c, d)``, ``bias``, float32) on features
    standardized by ``shift`` and ``div`` (float32, when given), argmax per output."""

    kind = "torch-linear"

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor,
        shift: torch.Tensor | None,
        div: torch.Tensor | None,
        m: int,
        c: int,
        dev: Any = "cpu",
    ):
        self.weight, self.bias, self.shift, self.div, self.dev = weight, bias, shift, div, dev
        self.n_outputs, self.n_classes = int(m), int(c)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(self.dev)
            if self.shift is not None:
                Xt = (Xt - self.shift) / self.div
            logits = torch.nn.functional.linear(Xt, self.weight, self.bias)
            return logits.view(len(Xt), self.n_outputs, self.n_classes).argmax(-1).cpu().numpy()

    def state(self):
        arrays = {"weight": self.weight.cpu().numpy(), "bias": self.bias.cpu().numpy()}
        if self.shift is not None:
            arrays.update(shift=self.shift.cpu().numpy(), div=self.div.cpu().numpy())
        return {"kind": self.kind, "n_outputs": self.n_outputs, "n_classes": self.n_classes}, arrays


class ScaledPredictor(Predictor):
    """A fitted ``StandardScaler`` (``scaler.transform``, as the in-memory search's pipeline applies it)
    before an inner predictor."""

    kind = "standardized"

    def __init__(self, scaler: StandardScaler, inner: Predictor):
        self.scaler, self.inner = scaler, inner
        self.n_outputs, self.n_classes = inner.n_outputs, inner.n_classes

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return self.inner(self.scaler.transform(X))

    def state(self):
        meta, arrays = self.inner.state()
        s = self.scaler
        return (
            {
                "kind": self.kind,
                "n_outputs": self.n_outputs,
                "n_classes": self.n_classes,
                "inner": meta,
                "n_samples_seen": int(s.n_samples_seen_),
            },
            {
                "scaler.mean": s.mean_,
                "scaler.scale": s.scale_,
                "scaler.var": s.var_,
                **{f"inner.{k}": v for k, v in arrays.items()},
            },
        )


def _pipeline_predictor(model) -> Callable[[np.ndarray], np.ndarray]:
    """The predictor of a fitted ``StandardScaler`` + head pipeline: a :class:`ScaledPredictor` when the
    head predicts with a :class:`Predictor` (the same operations as ``model.predict``), else ``model.predict``."""
    scaler, est = model[0], model[-1]
    inner = getattr(est, "predict_", None)
    if isinstance(scaler, StandardScaler) and isinstance(inner, Predictor):
        return ScaledPredictor(scaler, inner)
    return lambda X: _outputs(model.predict(X))


def _array(arrays: dict[str, np.ndarray], name: str, ndim: int, shape: tuple | None = None) -> np.ndarray:
    if name not in arrays:
        raise ValueError(f"the probe's state lacks the array {name!r}")
    a = np.asarray(arrays[name])
    if a.ndim != ndim or a.dtype.kind != "f" or (shape is not None and a.shape != shape):
        raise ValueError(
            f"the probe's array {name!r} is {a.dtype} {a.shape}, expected {ndim}-D floats"
            f"{f' of shape {shape}' if shape else ''}"
        )
    return a


def predictor_from_state(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Predictor:
    """The predictor :meth:`Predictor.state` describes (ValueError naming what is missing or malformed)."""
    kind = meta.get("kind")
    try:
        m, c = int(meta["n_outputs"]), int(meta["n_classes"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("the probe's state lacks n_outputs and n_classes") from None
    if m < 1 or c < (REGRESSION if kind == "ridge" else 1):
        raise ValueError(f"the probe's state has {m} outputs of {c} classes")
    if kind == "ridge":
        coef = _array(arrays, "coef", 2)
        d = coef.shape[0]
        return RidgePredictor(
            coef,
            _array(arrays, "intercept", 1, (coef.shape[1],)),
            m,
            c,
            _array(arrays, "mean", 1, (d,)),
            _array(arrays, "scale", 1, (d,)),
        )
    if kind == "logistic":
        W = _array(arrays, "W", 2)
        d, k = W.shape[0], 1 if c == 2 else c
        if W.shape[1] != m * k:
            raise ValueError(f"the probe's W has {W.shape[1]} columns for {m} outputs of {c} classes")
        return LogisticPredictor(
            _array(arrays, "mean", 1, (d,)),
            _array(arrays, "scale", 1, (d,)),
            W,
            _array(arrays, "b", 1, (m * k,)),
            m,
            c,
        )
    if kind == "torch-linear":
        weight = _array(arrays, "weight", 2)
        if weight.shape[0] != m * c:
            raise ValueError(f"the probe's weight has {weight.shape[0]} rows for {m} outputs of {c} classes")
        d = weight.shape[1]
        bias = _array(arrays, "bias", 1, (m * c,))
        shift = div = None
        if "shift" in arrays:
            shift = torch.from_numpy(_array(arrays, "shift", 1, (d,)).astype(np.float32))
            div = torch.from_numpy(_array(arrays, "div", 1, (d,)).astype(np.float32))
        return LinearLayerPredictor(
            torch.from_numpy(weight.astype(np.float32)),
            torch.from_numpy(bias.astype(np.float32)),
            shift,
            div,
            m,
            c,
        )
    if kind == "standardized":
        inner = predictor_from_state(
            meta.get("inner") or {}, {k[6:]: v for k, v in arrays.items() if k.startswith("inner.")}
        )
        mean = _array(arrays, "scaler.mean", 1)
        scaler = StandardScaler()
        scaler.mean_, scaler.scale_ = mean, _array(arrays, "scaler.scale", 1, mean.shape)
        scaler.var_ = _array(arrays, "scaler.var", 1, mean.shape)
        scaler.n_features_in_, scaler.n_samples_seen_ = len(mean), int(meta.get("n_samples_seen", 0))
        return ScaledPredictor(scaler, inner)
    raise ValueError(
        f"unknown predictor kind {kind!r}; choose from ridge, logistic, torch-linear, standardized"
    )


#: what a grid search returns: validation accuracy per value, the best value, and the refitted
#: head's predictor ``X (n, d) -> (n, m)`` class ids, which scores every test split
Search = tuple[dict[float, float], float, Callable[[np.ndarray], np.ndarray]]


def _estimator(kind: HeadKind, value: float, seed: int, device: str):
    """The head's estimator at one grid value (seed and device set where it takes them)."""
    est = clone(kind.estimator).set_params(**{kind.param: value})
    if "seed" in est.get_params():
        est.set_params(seed=seed)
    if "device" in est.get_params():
        est.set_params(device=device)
    return est


def search_streaming(
    kind: HeadKind, fit: Rows, val: Rows, *, refit_with_val: bool, seed: int, device: str = "cpu"
) -> Search:
    """:func:`search_refit` for rows that do not fit in memory: the head's ``fit_blocks`` (the same
    implementation as its ``fit``) reads the rows block by block; validation is scored block by block."""

    def trained(value, source):
        return _estimator(kind, value, seed, device).fit_blocks(source).predict_

    scores = {value: stream_accuracy(trained(value, fit), val) for value in kind.grid}
    best = _best(kind.grid, scores)
    return scores, best, trained(best, Concat(fit, val) if refit_with_val else fit)


def search_refit(
    kind: HeadKind,
    fit: Rows,
    val: Rows,
    *,
    refit_with_val: bool,
    seed: int,
    device: str = "cpu",
    memory_bytes: int | None = None,
) -> Search:
    """Any head: fit a standardize-then-estimate pipeline per grid value on ``fit``, score it on
    ``val``, refit the best on ``fit`` (+ ``val`` when ``refit_with_val``). The rows are loaded
    into memory, unless the training rows hold more than ``memory_bytes`` of features: then
    :func:`search_streaming` reads them block by block.
    """
    train_bytes = fit.nbytes + (val.nbytes if refit_with_val else 0)
    if memory_bytes is not None and train_bytes > memory_bytes and hasattr(kind.estimator, "fit_blocks"):
        return search_streaming(kind, fit, val, refit_with_val=refit_with_val, seed=seed, device=device)
    fit, val = fit.load(), val.load()

    def make(value):
        return make_pipeline(StandardScaler(), _estimator(kind, value, seed, device))

    scores = {value: accuracy(make(value).fit(*fit).predict(val[0]), val[1]) for value in kind.grid}
    best = _best(kind.grid, scores)
    train = tuple(np.concatenate([a, b]) for a, b in zip(fit, val)) if refit_with_val else fit
    model = make(best).fit(*train)
    return scores, best, _pipeline_predictor(model)


def check_head_fits(head: str, labels: np.ndarray) -> None:
    """ValueError when ``labels`` are real values and ``head`` fits classes only, naming the heads that
    regress (those registered with ``regression=True``)."""
    if target_kind(labels) == "regression" and not HEADS[head].regression:
        able = " or ".join(f"--head {n}" for n in HEADS.names() if HEADS[n].regression)
        raise ValueError(f"real-valued targets (regression); --head {head} fits classes: use {able}")


def evaluate(predict: Callable[[np.ndarray], np.ndarray], source: Rows) -> dict[str, float]:
    """Every metric of ``source``'s target kind (:func:`reservoir.probe.metrics.scores`) of the
    predictions of ``predict``, made block by block; the predictions and labels of the split are
    gathered (one value per output per row), never its features."""
    preds, ys = [], []
    for X, y in source.blocks():
        pred = predict(X)
        preds.append(pred[:, 0] if (y.ndim == 1 and pred.ndim == 2) else pred)
        ys.append(y)
    return metric_scores(np.concatenate(preds), np.concatenate(ys), target_kind(source.labels))


def rows(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Readout tokens become rows: ``X (N, R, d)``, ``y (N,) | (N, R, m)`` -> 2-D X, 1-D or 2-D y."""
    n, r, d = X.shape
    if r == 1 and y.ndim == 1:
        return X[:, 0], y
    return X.reshape(n * r, d), y.reshape(n * r, -1)


def fit_depth(
    head: str,
    X_train,
    y_train,
    X_test,
    y_test,
    *,
    X_val=None,
    y_val=None,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """:func:`fit_rows` on arrays: ``X_*`` are ``(N, R, d)`` readout features."""
    return fit_rows(
        head,
        ArrayRows(X_train, y_train),
        {"test": ArrayRows(X_test, y_test)},
        val=None if X_val is None else ArrayRows(X_val, y_val),
        val_fraction=val_fraction,
        seed=seed,
    )


def holdout(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted row indices of the fit part and of a seeded (stratified for single-label tasks)
    validation part of ``val_fraction``."""
    strat = (
        labels if labels.ndim == 1 and labels.dtype.kind in "iu" and np.bincount(labels).min() >= 2 else None
    )
    fit, val = train_test_split(
        np.arange(len(labels)), test_size=val_fraction, random_state=seed, stratify=strat
    )
    return np.sort(fit), np.sort(val)


def fit_rows(
    head: str,
    train: Rows,
    tests: dict[str, Rows],
    *,
    val: Rows | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    device: str = "cpu",
    memory_bytes: int | None = None,
) -> dict[str, Any]:
    """The scores of :func:`fit_probe` (its docstring), without the fitted predictor."""
    return fit_probe(
        head,
        train,
        tests,
        val=val,
        val_fraction=val_fraction,
        seed=seed,
        device=device,
        memory_bytes=memory_bytes,
    )[0]


def fit_probe(
    head: str,
    train: Rows,
    tests: dict[str, Rows],
    *,
    val: Rows | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    device: str = "cpu",
    memory_bytes: int | None = None,
) -> tuple[dict[str, Any], Callable[[np.ndarray], np.ndarray]]:
    """Choose the head's regularisation on validation, refit on all of train, score every test
    split with that one head (``test_accuracy`` and ``n_test`` are the first split's;
    ``test_accuracies`` and ``n_tests`` hold each).

    Without an explicit ``val``, a seeded (stratified for single-label tasks) ``val_fraction``
    of train is held out (``train`` must then offer ``take(index)``) and the refit uses train
    and validation; with one, the refit uses train. BLAS and OpenMP run :func:`head_threads`
    threads meanwhile. ``device`` is where the torch head trains. With ``memory_bytes``,
    training rows holding more features than that are never loaded at once: ridge always
    accumulates block by block, the logistic and torch heads then stream (:func:`search_streaming`).

    Returns the scores and the refitted head's predictor ``X (n, d) -> (n, m)``, the one that scored
    the test splits: for the registered heads a :class:`Predictor`, whose state a saved probe keeps
    (:mod:`reservoir.probe.saved`).
    """
    kind = HEADS[head]  # UsageError naming the registered heads
    target = target_kind(train.labels)
    check_head_fits(head, train.labels)
    start = time.perf_counter()
    held_out = val is None
    if held_out:
        fit_index, val_index = holdout(train.labels, val_fraction, seed)
        fit, val = train.take(fit_index), train.take(val_index)
    else:
        fit = train
    with threadpool_limits(limits=head_threads()):
        scores, best, predict = (kind.search or search_refit)(
            kind, fit, val, refit_with_val=held_out, seed=seed, device=device, memory_bytes=memory_bytes
        )
        metrics = {name: evaluate(predict, test) for name, test in tests.items()}
    first = next(iter(tests))
    out = {
        **result_scores(target, scores[best], metrics),
        "n_train": train.n,
        "n_val": val.n,
        "n_test": tests[first].n,
        "n_tests": {k: t.n for k, t in tests.items()},
        "hyperparameters": {kind.param: best},
        "val_scores": {str(k): v for k, v in scores.items()},
        "seconds": time.perf_counter() - start,
    }
    return out, predict

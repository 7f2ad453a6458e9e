"""The scores a probe reports, by the kind of target it predicts.

A task's labels say what is predicted (:func:`target_kind`): one class id per example (``"class"``),
several integer outputs per example (``"multi"``), or floats (``"regression"``). Each kind's first metric
(:data:`METRICS_BY_TARGET`) is the primary one, which a fit chooses its depth and regularisation by.

Regression metrics pool every output of every row: ``r2`` is ``1 - SSE / SST``, ``SST`` the squared
deviations of each output from its mean (scikit-learn's ``r2_score`` with
``multioutput="variance_weighted"``); ``nrmse`` is ``sqrt(SSE / SST)``, the RMSE over the targets'
standard deviation (0 is perfect, 1 is predicting the mean; reservoirpy's default divides by the range
instead); ``rmse`` is in the targets' units.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import balanced_accuracy_score, f1_score


def target_kind(labels: np.ndarray) -> str:
    """``"regression"`` for float labels, ``"class"`` for one integer label per example, else ``"multi"``."""
    if labels.dtype.kind == "f":
        return "regression"
    return "class" if labels.ndim == 1 else "multi"


def _sse_sst(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    p = np.asarray(pred, np.float64).reshape(len(y), -1)
    t = np.asarray(y, np.float64).reshape(len(y), -1)
    return float(np.sum((p - t) ** 2)), float(np.sum((t - t.mean(0)) ** 2))


def r2(pred: np.ndarray, y: np.ndarray) -> float:
    """``1 - SSE / SST`` over every output (module docstring); NaN when the targets are constant."""
    sse, sst = _sse_sst(pred, y)
    return 1.0 - sse / sst if sst > 0 else float("nan")


def nrmse(pred: np.ndarray, y: np.ndarray) -> float:
    """``sqrt(SSE / SST)``: RMSE over the targets' standard deviation; NaN when they are constant."""
    sse, sst = _sse_sst(pred, y)
    return float(np.sqrt(sse / sst)) if sst > 0 else float("nan")


def rmse(pred: np.ndarray, y: np.ndarray) -> float:
    """Root-mean-square error over every output, in the targets' units."""
    return float(np.sqrt(np.mean((np.asarray(pred, np.float64) - np.asarray(y, np.float64)) ** 2)))


def accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    """Fraction correct, over every output (every bit for bit tasks)."""
    return float(np.mean(pred == y))


def balanced_accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    """Mean recall over the classes present in ``y`` (every output's ids pooled); a class predicted but
    absent from ``y`` lowers no recall (scikit-learn's warning about it is not passed on)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return float(balanced_accuracy_score(np.ravel(y), np.ravel(pred)))


def macro_f1(pred: np.ndarray, y: np.ndarray) -> float:
    """F1 averaged with equal weight: per class for one label per example, per output for several
    0/1 outputs (multi-label), per class over every output's ids pooled otherwise."""
    y, pred = np.asarray(y), np.asarray(pred)
    if y.ndim > 1 and y.size and int(max(y.max(), pred.max())) <= 1:
        return float(
            f1_score(y.reshape(len(y), -1), pred.reshape(len(y), -1), average="macro", zero_division=0)
        )
    return float(f1_score(np.ravel(y), np.ravel(pred), average="macro", zero_division=0))


@dataclass(frozen=True)
class Metric:
    """A score of predictions against labels: its name, function and direction; ``percent``: shown as one."""

    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    greater_is_better: bool = True
    percent: bool = True

    def __call__(self, pred: np.ndarray, y: np.ndarray) -> float:
        return self.fn(pred, y)

    def format(self, value: float | None) -> str:
        if value is None or np.isnan(value):
            return "-"
        return f"{100 * value:.2f}%" if self.percent else f"{value:.4g}"  # an error near 0 keeps its digits


METRICS = {
    m.name: m
    for m in (
        Metric("accuracy", accuracy),
        Metric("balanced_accuracy", balanced_accuracy),
        Metric("macro_f1", macro_f1),
        Metric("nrmse", nrmse, greater_is_better=False, percent=False),
        Metric("r2", r2, percent=False),
        Metric("rmse", rmse, greater_is_better=False, percent=False),
    )
}

#: each target kind's metrics, the primary one first
METRICS_BY_TARGET = {
    "class": ("accuracy", "balanced_accuracy", "macro_f1"),
    "multi": ("accuracy", "macro_f1"),
    "regression": ("nrmse", "r2", "rmse"),
}


def metric(name: str) -> Metric:
    """The registered metric ``name`` (ValueError naming the choices)."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose from {sorted(METRICS)}")
    return METRICS[name]


def scores(pred: np.ndarray, y: np.ndarray, kind: str) -> dict[str, float]:
    """Every metric of target ``kind`` (:data:`METRICS_BY_TARGET`) of ``pred`` against ``y``."""
    return {name: METRICS[name](pred, y) for name in METRICS_BY_TARGET[kind]}


def score_line(result: dict) -> str:
    """A fit's scores on one line, each split in the result's primary metric: ``test 91.2% (val 90.1%, 1.2s)``."""
    m = METRICS[result.get("metric", "accuracy")]
    label = "" if m.name == "accuracy" else f"{m.name} "
    tests = ", ".join(f"{name} {label}{m.format(v)}" for name, v in result["test_scores"].items())
    return f"{tests} (val {m.format(result['val_score'])}, {result['seconds']:.1f}s)"


def result_scores(kind: str, val_score: float, tests: dict[str, dict[str, float]]) -> dict:
    """The score fields of a result (:mod:`reservoir.results`): ``metric``, ``val_score``, ``test_score`` and
    ``test_metrics`` of the first test split, ``test_scores`` of each, and for accuracy the ``test_accuracy``,
    ``test_accuracies`` and ``val_accuracy`` fields. ``tests``: every metric (:func:`scores`) per test split."""
    primary = METRICS_BY_TARGET[kind][0]
    first = next(iter(tests))
    out = {
        "metric": primary,
        "test_score": tests[first][primary],
        "val_score": val_score,
        "test_scores": {name: m[primary] for name, m in tests.items()},
        "test_metrics": tests[first],
    }
    if primary == "accuracy":
        out |= {
            "test_accuracy": out["test_score"],
            "test_accuracies": out["test_scores"],
            "val_accuracy": val_score,
        }
    return out


def memory_capacity(
    fit: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], alpha: float = 0.0
) -> np.ndarray:
    """Memory capacity per delay (Jaeger 2001): for each column ``k`` of the delayed inputs ``U``, the
    squared correlation on ``test`` between ``U[:, k]`` and its linear readout from the states ``X``, fitted
    on ``fit`` to scikit-learn's ``Ridge(alpha)`` objective (``alpha`` 0 is least squares, the minimum-norm
    solution), solved through the singular values of the centred states as its ``svd`` solver does (the normal
    equations square the condition number of a linear reservoir's states and lose a quarter of its capacity). ``fit`` and
    ``test`` are ``(X (n, d), U (n, K))``; returns ``(K,)`` float64, each in [0, 1]. ValueError for
    non-finite values."""
    X, U = (np.asarray(a, np.float64) for a in fit)
    X_test, U_test = (np.asarray(a, np.float64) for a in test)
    if not all(np.isfinite(a).all() for a in (X, U, X_test, U_test)):
        raise ValueError("memory capacity of states or inputs holding NaN or infinite values has no meaning")
    x_mean, u_mean = X.mean(0), U.mean(0)
    left, s, right = np.linalg.svd(X - x_mean, full_matrices=False)
    if alpha > 0:
        d = s / (s * s + alpha)
    else:  # least squares: directions below the rounding of the largest singular value carry nothing
        kept = s > s.max(initial=0.0) * max(X.shape) * np.finfo(np.float64).eps
        d = np.divide(1.0, s, out=np.zeros_like(s), where=kept)
    W = right.T @ (d[:, None] * (left.T @ (U - u_mean)))
    pred = (X_test - x_mean) @ W + u_mean
    p, t = pred - pred.mean(0), U_test - U_test.mean(0)
    cov, pp, tt = (p * t).sum(0), (p * p).sum(0), (t * t).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((pp > 1e-24 * tt) & (tt > 0), cov**2 / (pp * tt), 0.0)

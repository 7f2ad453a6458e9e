"""The logistic head: scikit-learn's multinomial objective minimised by L-BFGS over rows read block by
block, in memory or not."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning

from reservoir.config import POSITIVE
from reservoir.probe.heads import register_head
from reservoir.probe.predictors import Predictor, PredictsThrough, array, predict_ids
from reservoir.probe.rows import ArrayRows, Rows, _outputs, moments, shape_of
from reservoir.settings import Interval, validate


@register_head("logreg", param="C", grid=(0.001, 0.01, 0.1, 1.0, 10.0))
class LogRegHead(PredictsThrough, ClassifierMixin, BaseEstimator):
    """Multinomial logistic regression per output (one logit for two classes), scikit-learn's
    objective minimised by L-BFGS (:func:`streaming_logistic`, in memory or not).

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
        return self.fit_blocks(ArrayRows(X, y))

    def fit_blocks(self, source: Rows) -> LogRegHead:
        validate(self, "LogRegHead")
        self.y_ndim_ = source.y_ndim
        self.predict_ = streaming_logistic(self.C, source, max_iter=self.max_iter)
        return self


def streaming_logistic(
    C: float, source: Rows, *, max_iter: int = 300, tol: float = 1e-4
) -> Callable[[np.ndarray], np.ndarray]:
    """Logistic regression out of core: scikit-learn's objective (the mean log loss plus the squared weights
    over ``2 C n``, intercept unpenalised, on standardized features) minimised by SciPy's L-BFGS with
    scikit-learn's stopping rules, each loss and gradient computed block by block. Returns a predictor
    ``X -> (n, m)``; a :class:`~sklearn.exceptions.ConvergenceWarning` when ``max_iter`` iterations end
    before the optimum, as scikit-learn's ``LogisticRegression`` warns."""
    from scipy.optimize import minimize

    mean, scale, n = moments(source)
    m, c = shape_of(source)
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
        value = (loss + 0.5 * float(np.sum(W * W)) / C) / n
        return value, np.concatenate([(gW + W / C).ravel(), gb]) / n

    result = minimize(
        objective,
        np.zeros(d * m * k + m * k),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "gtol": tol, "ftol": 64 * np.finfo(float).eps, "maxls": 50},
    )
    if result.status:  # the iteration limit, or a line search that failed: scikit-learn warns of both
        why = (
            f"reached its limit of {max_iter} L-BFGS iterations"
            if result.status == 1
            else f"stopped ({result.message})"
        )
        warnings.warn(
            f"the logistic head (C={C:g}) {why} before converging", ConvergenceWarning, stacklevel=2
        )
    W, b = result.x[: d * m * k].reshape(d, m * k), result.x[d * m * k :]
    return LogisticPredictor(mean, scale, W, b, m, c)


class LogisticPredictor(Predictor):
    """The logistic head (:func:`streaming_logistic`): features standardized by ``mean`` and ``scale``
    in float64, then ``W`` and ``b``; one logit per output for two classes, else one per class."""

    kind = "logistic"

    def __init__(self, mean: np.ndarray, scale: np.ndarray, W: np.ndarray, b: np.ndarray, m: int, c: int):
        self.mean, self.scale, self.W, self.b = mean, scale, W, b
        self.n_outputs, self.n_classes = int(m), int(c)
        self.k = 1 if self.n_classes == 2 else self.n_classes

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return predict_ids(
            ((X.astype(np.float64) - self.mean) / self.scale) @ self.W + self.b, self.n_outputs, self.k
        )

    def state(self):
        return (
            {"kind": self.kind, "n_outputs": self.n_outputs, "n_classes": self.n_classes},
            {"mean": self.mean, "scale": self.scale, "W": self.W, "b": self.b},
        )

    @classmethod
    def from_state(cls, meta, arrays, m, c):
        W = array(arrays, "W", 2)
        d, k = W.shape[0], 1 if c == 2 else c
        if W.shape[1] != m * k:
            raise ValueError(f"the probe's W has {W.shape[1]} columns for {m} outputs of {c} classes")
        return cls(
            array(arrays, "mean", 1, (d,)),
            array(arrays, "scale", 1, (d,)),
            W,
            array(arrays, "b", 1, (m * k,)),
            m,
            c,
        )

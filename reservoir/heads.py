"""Linear heads on cached features, with the scikit-learn estimator contract.

Labels are ``(n,)`` class ids or ``(n, m)`` for ``m`` outputs (bits) sharing one head;
``predict`` returns the same shape. :func:`fit_depth` standardizes, chooses the
regularisation on a validation split, refits on all of train and scores the test split.

- ``logreg``: scikit-learn ``LogisticRegression`` (one per output when ``m > 1``).
- ``ridge``: closed-form ridge readout on one-hot targets, accumulated chunk by chunk
  (``partial_fit`` sums ``X^T X`` and ``X^T Y``, reservoirpy's shape), solved once per alpha.
- ``torch``: a linear layer trained with Adam or LBFGS in mini-batches.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.multioutput import MultiOutputClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted


def _outputs(y: np.ndarray) -> np.ndarray:
    return y[:, None] if y.ndim == 1 else y


class RidgeHead(ClassifierMixin, BaseEstimator):
    """Closed-form ridge regression on one-hot targets; predicts the argmax per output.

    Parameters
    ----------
    alpha : L2 penalty (on standardized features it is comparable across datasets).
    n_classes : classes per output (inferred from ``y`` when None).

    Examples
    --------
    >>> head = RidgeHead(alpha=1.0).fit(X_train, y_train)  # doctest: +SKIP
    >>> head.predict(X_test)                                # doctest: +SKIP
    """

    def __init__(self, alpha: float = 1.0, *, n_classes: int | None = None):
        self.alpha = alpha
        self.n_classes = n_classes

    def _reset(self, d: int, m: int, c: int) -> None:
        self.xtx_, self.xty_ = np.zeros((d + 1, d + 1)), np.zeros((d + 1, m * c))
        self.n_outputs_, self.n_classes_ = m, c

    def partial_fit(self, X: np.ndarray, y: np.ndarray) -> "RidgeHead":
        """Add one chunk's ``X^T X`` and ``X^T Y`` (no solve: call :meth:`solve`)."""
        Y = _outputs(y)
        if not hasattr(self, "xtx_"):
            self._reset(X.shape[1], Y.shape[1], self.n_classes or int(Y.max()) + 1)
        self.y_ndim_ = y.ndim
        Xb = np.hstack([X, np.ones((len(X), 1), X.dtype)]).astype(np.float64)
        onehot = np.zeros((len(Y), self.n_outputs_, self.n_classes_))
        np.put_along_axis(onehot, Y[:, :, None], 1.0, axis=2)
        self.xtx_ += Xb.T @ Xb
        self.xty_ += Xb.T @ onehot.reshape(len(Y), -1)
        return self

    def solve(self, alpha: float | None = None) -> "RidgeHead":
        reg = np.eye(len(self.xtx_)) * (self.alpha if alpha is None else alpha)
        reg[-1, -1] = 0.0  # no penalty on the bias
        self.coef_ = np.linalg.solve(self.xtx_ + reg, self.xty_)
        return self

    def fit(self, X: np.ndarray, y: np.ndarray) -> "RidgeHead":
        for name in ("xtx_", "xty_"):
            self.__dict__.pop(name, None)
        return self.partial_fit(X, y).solve()

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "coef_")
        scores = np.hstack([X, np.ones((len(X), 1), X.dtype)]) @ self.coef_
        pred = scores.reshape(len(X), self.n_outputs_, self.n_classes_).argmax(-1)
        return pred[:, 0] if self.y_ndim_ == 1 else pred


class TorchHead(ClassifierMixin, BaseEstimator):
    """A linear layer trained with cross-entropy per output.

    Parameters
    ----------
    weight_decay : L2 penalty added to the loss.
    optimizer : ``"adam"`` (mini-batches, ``epochs`` passes) or ``"lbfgs"`` (full batch).
    lr, epochs, batch_size, seed : optimisation settings; ``seed`` fixes init and order.
    """

    def __init__(self, weight_decay: float = 0.0, *, optimizer: str = "adam", lr: float = 1e-2, epochs: int = 30,
                 batch_size: int = 256, seed: int = 0):
        self.weight_decay = weight_decay
        self.optimizer = optimizer
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.seed = seed

    def fit(self, X: np.ndarray, y: np.ndarray) -> "TorchHead":
        if self.optimizer not in ("adam", "lbfgs"):
            raise ValueError(f"The 'optimizer' parameter of TorchHead must be 'adam' or 'lbfgs'. Got {self.optimizer!r} instead.")
        Y = torch.from_numpy(_outputs(y).astype(np.int64))
        self.y_ndim_, self.n_outputs_ = y.ndim, Y.shape[1]
        self.n_classes_ = int(Y.max()) + 1
        g = torch.Generator().manual_seed(self.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.linear_ = torch.nn.Linear(X.shape[1], self.n_outputs_ * self.n_classes_)
        Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))

        def loss_on(xb, yb):
            logits = self.linear_(xb).view(len(xb), self.n_outputs_, self.n_classes_)
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), yb)
            return loss + self.weight_decay * self.linear_.weight.pow(2).sum()

        if self.optimizer == "lbfgs":
            opt = torch.optim.LBFGS(self.linear_.parameters(), lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = loss_on(Xt, Y)
                loss.backward()
                return loss

            opt.step(closure)
        else:
            opt = torch.optim.Adam(self.linear_.parameters(), lr=self.lr)
            for _ in range(self.epochs):
                for idx in torch.randperm(len(Xt), generator=g).split(self.batch_size):
                    opt.zero_grad()
                    loss_on(Xt[idx], Y[idx]).backward()
                    opt.step()
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "linear_")
        with torch.no_grad():
            logits = self.linear_(torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)))
        pred = logits.view(len(X), self.n_outputs_, self.n_classes_).argmax(-1).numpy()
        return pred[:, 0] if self.y_ndim_ == 1 else pred


class LogRegHead(ClassifierMixin, BaseEstimator):
    """scikit-learn ``LogisticRegression`` (lbfgs), one per output for multi-output labels.

    Parameters
    ----------
    C : inverse L2 penalty.
    max_iter : lbfgs iterations.
    """

    def __init__(self, C: float = 1.0, *, max_iter: int = 300):
        self.C = C
        self.max_iter = max_iter

    def fit(self, X: np.ndarray, y: np.ndarray) -> "LogRegHead":
        base = LogisticRegression(C=self.C, max_iter=self.max_iter)
        self.y_ndim_ = y.ndim
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.model_ = (MultiOutputClassifier(base) if y.ndim == 2 else base).fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "model_")
        return self.model_.predict(X)


@dataclass(frozen=True)
class HeadKind:
    """A head family: its estimator and the regularisation grid searched on validation."""

    estimator: Any
    param: str
    grid: tuple[float, ...]


HEADS = {
    "logreg": HeadKind(LogRegHead(), "C", (0.001, 0.01, 0.1, 1.0, 10.0)),
    "ridge": HeadKind(RidgeHead(), "alpha", (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)),
    "torch": HeadKind(TorchHead(), "weight_decay", (0.0, 1e-4, 1e-3, 1e-2)),
}


def accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    """Fraction correct, over every output (every bit for bit tasks)."""
    return float(np.mean(pred == y))


def rows(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Readout tokens become rows: ``X (N, R, d)``, ``y (N,) | (N, R, m)`` -> 2-D X, 1-D or 2-D y."""
    n, r, d = X.shape
    if r == 1 and y.ndim == 1:
        return X[:, 0], y
    return X.reshape(n * r, d), y.reshape(n * r, -1)


def fit_depth(head: str, X_train, y_train, X_test, y_test, *, X_val=None, y_val=None, val_fraction: float = 0.1,
              seed: int = 0) -> dict[str, Any]:
    """Choose the head's regularisation on validation, refit on all of train, score test.

    ``X_*`` are ``(N, R, d)`` readout features. Without an explicit validation split, a
    seeded (stratified for single-label tasks) ``val_fraction`` of train is held out.
    """
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose from {sorted(HEADS)}")
    kind = HEADS[head]
    start = time.perf_counter()
    if X_val is None:
        strat = y_train if y_train.ndim == 1 and np.bincount(y_train).min() >= 2 else None
        X_fit, X_val, y_fit, y_val = train_test_split(X_train, y_train, test_size=val_fraction, random_state=seed,
                                                      stratify=strat)
    else:
        X_fit, y_fit = X_train, y_train

    def make(value):
        est = clone(kind.estimator).set_params(**{kind.param: value})
        if "seed" in est.get_params():
            est.set_params(seed=seed)
        return make_pipeline(StandardScaler(), est)

    scores = {}
    for value in kind.grid:
        scores[value] = accuracy(make(value).fit(*rows(X_fit, y_fit)).predict(rows(X_val, y_val)[0]), rows(X_val, y_val)[1])
    best = max(kind.grid, key=lambda v: (scores[v], -kind.grid.index(v)))
    X_all = X_train if X_fit is X_train else np.concatenate([X_fit, X_val])
    y_all = y_train if X_fit is X_train else np.concatenate([y_fit, y_val])
    model = make(best).fit(*rows(X_all, y_all))
    Xt, yt = rows(X_test, y_test)
    return {
        "test_accuracy": accuracy(model.predict(Xt), yt),
        "val_accuracy": scores[best],
        "n_train": len(X_all), "n_val": len(X_val), "n_test": len(X_test),
        "hyperparameters": {kind.param: best}, "val_scores": {str(k): v for k, v in scores.items()},
        "seconds": time.perf_counter() - start,
    }

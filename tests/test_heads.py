"""Heads keep the scikit-learn contract and learn what they should."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from reservoir.heads import HEADS, LogRegHead, RidgeHead, TorchHead, fit_depth


def blobs(n=300, d=8, classes=3, seed=0, outputs=None):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, d)) * 3
    y = rng.integers(0, classes, n if outputs is None else (n, outputs))
    X = (centers[y] if outputs is None else centers[y].sum(1)) + rng.normal(size=(n, d))
    return X, y


@pytest.mark.parametrize("head", [LogRegHead(), RidgeHead(alpha=1.0), TorchHead(epochs=40, lr=1e-2)])
def test_head_contract_and_learning(head):
    X, y = blobs()
    with pytest.raises(NotFittedError):
        clone(head).predict(X)
    fitted = clone(head).fit(X[:200], y[:200])
    assert fitted.__class__ is head.__class__
    assert np.mean(fitted.predict(X[200:]) == y[200:]) > 0.9


def test_torch_head_lbfgs_and_bad_optimizer():
    X, y = blobs()
    assert np.mean(TorchHead(optimizer="lbfgs").fit(X, y).predict(X) == y) > 0.9
    with pytest.raises(ValueError, match="'optimizer' parameter of TorchHead must be 'adam' or 'lbfgs'. Got 'sgd'"):
        TorchHead(optimizer="sgd").fit(X, y)


def test_ridge_partial_fit_equals_fit():
    X, y = blobs(400)
    whole = RidgeHead(alpha=3.0).fit(X, y)
    chunked = RidgeHead(alpha=3.0)
    for i in range(0, 400, 64):
        chunked.partial_fit(X[i:i + 64], y[i:i + 64])
    np.testing.assert_allclose(chunked.solve().coef_, whole.coef_, rtol=1e-8, atol=1e-10)


def test_multi_output_bits_shared_head():
    """Bit tasks: every readout token is a row, every bit an output."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 5, 6))
    y = (X[:, :, :2] > 0).astype(np.int64)  # (N, R=5, 2 bits)
    for head in HEADS:
        res = fit_depth(head, X[:150], y[:150], X[150:], y[150:], seed=0)
        assert res["test_accuracy"] > 0.9, head
        assert res["n_test"] == 50


def test_fit_depth_selects_on_validation():
    X, y = blobs(300, d=5, classes=4)
    res = fit_depth("ridge", X[:250, None], y[:250], X[250:, None], y[250:], val_fraction=0.2, seed=0)
    assert res["n_train"] == 250 and res["n_val"] == 50
    assert res["hyperparameters"]["alpha"] in HEADS["ridge"].grid
    assert res["val_accuracy"] == max(res["val_scores"].values())

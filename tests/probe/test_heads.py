"""Heads keep the scikit-learn contract and learn what they should."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import Ridge
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_info

from reservoir.probe import heads
from reservoir.probe.heads import HEADS, HeadKind, fit_depth, head_threads
from reservoir.probe.logistic import LogRegHead
from reservoir.probe.ridge import RidgeHead, RidgeStats
from reservoir.probe.rows import ArrayRows, rows
from reservoir.probe.torch_head import TorchHead


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
    with pytest.raises(
        ValueError,
        match=r"The 'optimizer' parameter of TorchHead must be one of \['adam', 'lbfgs'\]. Got 'sgd' instead",
    ):
        TorchHead(optimizer="sgd").fit(X, y)
    with pytest.raises(
        ValueError, match="'optimizer' parameter of TorchHead must be 'adam' to fit rows read"
    ):
        TorchHead(optimizer="lbfgs").fit_blocks(ArrayRows(X, y))


@pytest.mark.parametrize(
    "head, message",
    [
        (LogRegHead(C=0.0), "The 'C' parameter of LogRegHead must be > 0. Got 0.0 instead."),
        (RidgeHead(alpha=-1.0), "The 'alpha' parameter of RidgeHead must be >= 0. Got -1.0 instead."),
        (TorchHead(epochs=0), "The 'epochs' parameter of TorchHead must be an integer >= 1. Got 0 instead."),
    ],
)
def test_heads_check_their_declared_constraints(head, message):
    X, y = blobs()
    with pytest.raises(ValueError) as caught:
        head.fit(X, y)
    assert str(caught.value) == message


def test_heads_are_registered_and_unknown_heads_named():
    assert {"logreg", "ridge", "torch"} <= set(HEADS.names())
    assert isinstance(HEADS["ridge"].estimator, RidgeHead) and HEADS["ridge"].regression
    X, y = blobs()
    with pytest.raises(ValueError, match=r"unknown head 'lasso'; choose from \[.*'logreg', 'ridge', 'torch'"):
        fit_depth("lasso", X[:200, None], y[:200], X[200:, None], y[200:])


def test_ridge_partial_fit_equals_fit():
    X, y = blobs(400)
    whole = RidgeHead(alpha=3.0).fit(X, y)
    chunked = RidgeHead(alpha=3.0)
    for i in range(0, 400, 64):
        chunked.partial_fit(X[i : i + 64], y[i : i + 64])
    np.testing.assert_allclose(chunked.solve().coef_, whole.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(chunked.intercept_, whole.intercept_, rtol=1e-8, atol=1e-10)
    path = chunked.path_
    assert chunked.solve(30.0).path_ is path  # a new alpha reuses the decomposition
    with pytest.raises(ValueError, match=r"class ids must be in \[0, 1\]. Got 0..2 instead"):
        RidgeHead(n_classes=2).partial_fit(X, y)


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


def raw_problem(n=400, d=12, classes=4, outputs=None, seed=0):
    """Blobs on features with offsets and scales far from standardized, and one constant feature."""
    X, y = blobs(n, d, classes, seed, outputs)
    rng = np.random.default_rng(seed + 1)
    X = X * rng.uniform(0.1, 20, d) + rng.uniform(-50, 50, d)
    X[:, 3] = 7.0
    return X, y


def onehot(y, classes):
    Y = y[:, None] if y.ndim == 1 else y
    return np.concatenate([np.eye(classes)[Y[:, j]] for j in range(Y.shape[1])], axis=1)


def direct_ridge(X, Y, alpha):
    """The pre-accumulator head: StandardScaler, then one linear solve with an unpenalised bias."""
    scaler = StandardScaler().fit(X)
    Zb = np.hstack([scaler.transform(X), np.ones((len(X), 1))])
    reg = alpha * np.eye(Zb.shape[1])
    reg[-1, -1] = 0.0
    return scaler, np.linalg.solve(Zb.T @ Zb + reg, Zb.T @ Y)


@pytest.mark.parametrize("outputs", [None, 3])
def test_ridge_path_equals_direct_solve_and_sklearn(outputs):
    X, y = raw_problem(outputs=outputs)
    Y = onehot(y, 4)
    path = RidgeStats.zeros(X.shape[1], Y.shape[1]).add(X, Y).decompose()
    for alpha in HEADS["ridge"].grid:
        coef, intercept = path.coef(alpha)
        scaler, W = direct_ridge(X, Y, alpha)
        np.testing.assert_allclose(
            X @ coef + intercept,
            np.hstack([scaler.transform(X), np.ones((len(X), 1))]) @ W,
            rtol=1e-6,
            atol=1e-9,
        )
        ref = Ridge(alpha=alpha).fit(scaler.transform(X), Y)
        np.testing.assert_allclose(coef * path.scale[:, None], ref.coef_.T, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(intercept + path.mean_x @ coef, ref.intercept_, rtol=1e-6, atol=1e-9)


def test_ridge_stats_chunks_and_sums_equal_one_pass(monkeypatch):
    X, y = raw_problem(300)
    X, Y = X.astype(np.float32), onehot(y, 4)  # float32 like cached features
    one = RidgeStats.zeros(12, 4).add(X.astype(np.float64), Y)
    summed = RidgeStats.zeros(12, 4).add(X[:250], Y[:250]) + RidgeStats.zeros(12, 4).add(X[250:], Y[250:])
    monkeypatch.setattr(RidgeStats, "chunk_rows", 64)  # add() widens float32 chunk by chunk
    chunked = RidgeStats.zeros(12, 4).add(X[:100], Y[:100]).add(X[100:], Y[100:])
    for other in (chunked, summed):
        assert other.n == one.n == 300
        mine, theirs = other.decompose(), one.decompose()
        for name in ("mean_x", "scale", "mean_y", "eigvals"):
            np.testing.assert_allclose(
                getattr(mine, name), getattr(theirs, name), rtol=1e-9, atol=1e-12, err_msg=name
            )
        np.testing.assert_allclose(mine.coef(1.0)[0], theirs.coef(1.0)[0], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="holds no rows"):
        RidgeStats.zeros(12, 4).decompose()


def old_fit_depth_ridge(X_train, y_train, X_test, y_test, X_val=None, y_val=None, val_fraction=0.1, seed=0):
    """fit_depth's ridge path before accumulation: a standardized ridge solved per alpha."""
    if X_val is None:
        strat = y_train if y_train.ndim == 1 else None
        X_fit, X_val, y_fit, y_val = train_test_split(
            X_train, y_train, test_size=val_fraction, random_state=seed, stratify=strat
        )
        X_all, y_all = np.concatenate([X_fit, X_val]), np.concatenate([y_fit, y_val])
    else:
        X_fit, y_fit, X_all, y_all = X_train, y_train, X_train, y_train

    def predict(X, y, Xp, alpha):
        X, y = rows(X, y)
        classes = int(y.max()) + 1
        scaler, W = direct_ridge(X, onehot(y, classes), alpha)
        scores = np.hstack([scaler.transform(Xp), np.ones((len(Xp), 1))]) @ W
        pred = scores.reshape(len(Xp), -1, classes).argmax(-1)
        return pred[:, 0] if y.ndim == 1 else pred

    grid = HEADS["ridge"].grid
    Xv, yv = rows(X_val, y_val)
    scores = {a: float(np.mean(predict(X_fit, y_fit, Xv, a) == yv)) for a in grid}
    best = max(grid, key=lambda a: (scores[a], -grid.index(a)))
    Xt, yt = rows(X_test, y_test)
    return best, scores, float(np.mean(predict(X_all, y_all, Xt, best) == yt))


@pytest.mark.parametrize("tokens, outputs, explicit_val", [(1, None, False), (1, None, True), (3, 2, False)])
def test_fit_depth_ridge_equals_per_alpha_solves(tokens, outputs, explicit_val):
    """Same alpha, validation scores and test accuracy as the per-alpha solve, on a noisy problem;
    ``tokens > 1``: readout tokens become rows and every bit an output."""
    X, y = raw_problem(600 * tokens, d=10, classes=5, outputs=outputs, seed=3)
    X = X + np.random.default_rng(4).normal(scale=40.0, size=X.shape)  # hard enough for alpha to matter
    X, y = X.reshape(600, tokens, 10), (y if outputs is None else y.reshape(600, tokens, outputs))
    n_train = 400 if explicit_val else 500
    val = dict(X_val=X[400:500], y_val=y[400:500]) if explicit_val else {}
    new = fit_depth("ridge", X[:n_train], y[:n_train], X[500:], y[500:], seed=0, **val)
    best, scores, test = old_fit_depth_ridge(
        X[:n_train], y[:n_train], X[500:], y[500:], val.get("X_val"), val.get("y_val")
    )
    assert new["hyperparameters"] == {"alpha": best}
    assert new["val_scores"] == {str(a): s for a, s in scores.items()}
    assert new["test_accuracy"] == test
    assert new["n_train"] == n_train and new["n_val"] == (100 if explicit_val else 50)
    assert len(set(scores.values())) > 1  # the grid is not degenerate on this problem


class ThreadProbe(ClassifierMixin, BaseEstimator):
    """Records the BLAS/OpenMP limits in force while it fits."""

    seen: list[dict[str, int]] = []

    def __init__(self, C: float = 1.0):
        self.C = C

    def fit(self, X, y):
        limits = {(lib["user_api"], lib["prefix"]): lib["num_threads"] for lib in threadpool_info()}
        ThreadProbe.seen.append({**limits, ("torch", "intra-op"): torch.get_num_threads()})
        self.fitted_ = True
        return self

    def predict(self, X):
        return np.zeros(len(X), np.int64)


def test_fit_depth_limits_threads(monkeypatch):
    registered = {**{name: HEADS[name] for name in HEADS}, "probe": HeadKind(ThreadProbe(), "C", (1.0, 2.0))}
    monkeypatch.setattr(HEADS, "_entries", registered)  # a head registered for this test only
    ThreadProbe.seen.clear()
    before = {(lib["user_api"], lib["prefix"]): lib["num_threads"] for lib in threadpool_info()}
    X, y = blobs()
    fit_depth("probe", X[:200, None], y[:200], X[200:, None], y[200:])
    assert len(ThreadProbe.seen) == 3  # two grid values and the refit
    assert all(set(seen.values()) == {head_threads()} for seen in ThreadProbe.seen)
    assert {(lib["user_api"], lib["prefix"]): lib["num_threads"] for lib in threadpool_info()} == before

    decompositions = []
    original = RidgeStats.decompose
    monkeypatch.setattr(
        RidgeStats,
        "decompose",
        lambda self: (
            decompositions.append({lib["num_threads"] for lib in threadpool_info()}) or original(self)
        ),
    )
    fit_depth("ridge", X[:200, None], y[:200], X[200:, None], y[200:])
    assert decompositions == [{head_threads()}, {head_threads()}]  # one for the grid, one for the refit


# -- out of core: the logistic and torch heads on rows read block by block ---------------------------


from reservoir.probe.rows import Rows  # noqa: E402


class BlockRows(Rows):
    """ArrayRows that hand out their rows in small blocks (as a feature file does)."""

    def __init__(self, X, y, block=37):

        self.inner, self.block = ArrayRows(X, y), block
        self.labels = y

    @property
    def nbytes(self):
        return self.inner.nbytes

    def blocks(self):

        for i in range(0, len(self.labels), self.block):
            yield rows(self.inner.X[i : i + self.block], self.labels[i : i + self.block])

    def take(self, index):
        return BlockRows(self.inner.X[index], self.labels[index], self.block)


def separable(n=600, d=24, classes=4, seed=0, outputs=None):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d))
    y = rng.integers(0, classes, n if outputs is None else (n, 1, outputs))
    first = y if outputs is None else y[:, 0, 0]
    X = (centres[first] + 1.5 * rng.normal(size=(n, d)) + 5.0)[:, None, :].astype(np.float32)
    return X, y


@pytest.mark.parametrize("classes", [4, 2])
def test_streaming_logistic_matches_scikit_learn(classes):
    from sklearn.linear_model import LogisticRegression

    from reservoir.probe.logistic import streaming_logistic

    X, y = separable(classes=classes)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=1000, tol=1e-8)).fit(X[:, 0], y)
    predict = streaming_logistic(0.1, BlockRows(X, y), tol=1e-8, max_iter=1000)
    agree = np.mean(predict(X[:, 0])[:, 0] == ref.predict(X[:, 0]))
    assert agree >= 0.995, agree


def test_streaming_logistic_handles_bits_as_independent_outputs():
    from sklearn.linear_model import LogisticRegression

    from reservoir.probe.logistic import streaming_logistic

    X, y = separable(classes=2, outputs=3)
    y[:, 0, 1] = 1 - y[:, 0, 0]  # outputs that differ
    predict = streaming_logistic(1.0, BlockRows(X, y))
    pred = predict(X[:, 0])
    assert pred.shape == (600, 3) and np.mean(pred == y[:, 0]) > 0.8
    for j in range(2):
        ref = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000)).fit(
            X[:, 0], y[:, 0, j]
        )
        assert np.mean(pred[:, j] == ref.predict(X[:, 0])) >= 0.99


@pytest.mark.parametrize("head", ["logreg", "torch"])
def test_over_the_memory_budget_heads_stream_instead_of_loading(head, monkeypatch):

    X, y = separable(n=800)
    train, test = BlockRows(X[:600], y[:600]), BlockRows(X[600:], y[600:])
    in_memory, _ = heads.fit_probe(head, train, {"test": test}, seed=0)
    monkeypatch.setattr(heads.Rows, "load", lambda self: pytest.fail("rows were loaded"))
    monkeypatch.setattr(heads.ArrayRows, "load", lambda self: pytest.fail("rows were loaded"))
    streamed, _ = heads.fit_probe(head, train, {"test": test}, seed=0, memory_bytes=1)
    assert streamed["n_train"] == 600 and streamed["n_test"] == 200
    assert abs(streamed["test_accuracy"] - in_memory["test_accuracy"]) <= 0.03
    assert streamed["test_accuracy"] > 0.8  # 4 classes: chance is 0.25


def test_the_validation_holdout_is_stratified_whatever_the_class_ids():
    """Class ids that skip values (3 and 7: classes a file's other splits hold) are stratified as 0 and 1 are:
    the held-out part keeps each class's share."""
    from reservoir.tasks.sizes import holdout

    labels = np.array([3] * 90 + [7] * 10)
    for seed in range(5):
        _, val = holdout(labels, 0.2, seed)
        assert sorted(labels[val].tolist()) == [3] * 18 + [7] * 2, seed


@pytest.mark.parametrize("classes", [2, 4])
@pytest.mark.parametrize("C", [0.001, 0.1, 10.0])
def test_the_logistic_head_stops_where_scikit_learns_logistic_regression_does(classes, C):
    """The same objective and stopping rules (gradient tolerance, relative decrease): the weights equal
    LogisticRegression's at its defaults, whatever C (a scaled objective stopped small C early and large C late)."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(1500, 32)).astype(np.float32)
    y = (X[:, :classes] + rng.normal(size=(1500, classes))).argmax(1)
    ours = LogRegHead(C=C).fit(X, y).predict_
    Z = StandardScaler().fit_transform(X)
    theirs = LogisticRegression(C=C, max_iter=300).fit(Z, y)
    assert np.abs(ours.W - theirs.coef_.T).max() <= 3e-5 * np.abs(theirs.coef_).max()
    assert np.allclose(ours.b, theirs.intercept_, atol=3e-5 * np.abs(theirs.intercept_).max() + 1e-9)


def test_a_logistic_head_out_of_iterations_says_so_once_per_fit(capsys):
    """Like LogisticRegression, the head warns when its iterations end first; a fit turns the warnings of its grid
    into one note naming where, and lets other warnings through."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    X, y = blobs()
    with pytest.warns(ConvergenceWarning, match="limit of 2 L-BFGS iterations"):
        LogRegHead(max_iter=2).fit(X, y)
    with pytest.warns(UserWarning, match="other"), heads.noting_convergence("depth 3"):
        LogRegHead(C=0.5, max_iter=2).fit(X, y)
        LogRegHead(C=0.5, max_iter=2).fit(X, y)
        warnings.warn("other", UserWarning, stacklevel=2)
    err = capsys.readouterr().err
    assert err.count("note: depth 3: the logistic head (C=0.5) reached its limit of 2") == 1
    assert err.count("\n") == 1


def test_ridge_standardizes_a_feature_far_above_its_spread_as_scikit_learn_does():
    """A feature of mean 1e5 and spread 0.1 over 20,000 rows keeps its scale (summed raw, its centred variance was
    rounding noise and it was taken for constant), so a strong penalty still fits as StandardScaler + Ridge."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20000, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=20000)
    X[:, 2] = 1e5 + 0.1 * X[:, 2]
    X = X.astype(np.float32)
    path = RidgeStats.zeros(4, 1).add(X, y[:, None]).decompose()
    ref = StandardScaler().fit(X.astype(np.float64))
    np.testing.assert_allclose(path.scale, ref.scale_, rtol=1e-6)
    coef, intercept = path.coef(1e4)
    theirs = make_pipeline(StandardScaler(), Ridge(alpha=1e4)).fit(X.astype(np.float64), y)
    np.testing.assert_allclose(
        (X @ coef + intercept)[:, 0], theirs.predict(X.astype(np.float64)), rtol=1e-6, atol=1e-6
    )


def test_heads_refuse_features_holding_nan_as_scikit_learn_estimators_do():
    """A NaN in train, validation or test features, or in those a saved probe's predict gets, is refused naming its
    row: the logistic head fitted it as class 0 everywhere and scored NaN test rows as class 0."""
    X, y = blobs()
    bad = X.copy()
    bad[5, 3] = np.nan
    for head in ("logreg", "ridge", "torch"):
        with pytest.raises(ValueError, match=r"NaN or infinite values \(row 5\)"):
            fit_depth(head, bad[:, None], y, X[:, None], y)
        with pytest.raises(ValueError, match=r"NaN or infinite values \(row 5\)"):
            fit_depth(head, X[:, None], y, bad[:, None], y)
    for head in (LogRegHead(), RidgeHead(), TorchHead(epochs=2)):
        with pytest.raises(ValueError, match=r"row 5"):
            clone(head).fit(bad, y)
        with pytest.raises(ValueError, match=r"row 5"):  # predicted as class 0, before
            clone(head).fit(X, y).predict(bad)


def test_a_ridge_head_of_one_class_predicts_that_class():
    """Labels of one class (an API user's; the command line refuses them) are predicted as that class, not as the
    class a one-logit sign rule reads."""
    X, _ = blobs()
    for c in (0, 1, 2):
        assert set(RidgeHead().fit(X, np.full(len(X), c)).predict(X)) == {c}
    assert (
        fit_depth("ridge", X[:, None], np.zeros(len(X), int), X[:, None], np.zeros(len(X), int))[
            "test_accuracy"
        ]
        == 1.0
    )


def test_every_head_scales_features_as_standard_scaler_constant_and_far_above_their_spread():
    """The logistic and torch heads' one-pass moments and ridge's path through the rows (more features than rows)
    give StandardScaler's scales: 1 for a constant feature (not its rounding noise), its spread for a feature of
    mean 1e5 and spread 0.1."""
    from reservoir.probe.ridge import RidgePath
    from reservoir.probe.rows import moments

    rng = np.random.default_rng(1)
    X = rng.normal(size=(20000, 3))
    X[:, 1] = 1e5 + 0.1 * X[:, 1]
    X[:, 2] = 0.1
    X = X.astype(np.float32)
    ref = StandardScaler().fit(X.astype(np.float64))
    mean, scale, n = moments(ArrayRows(X, np.zeros(len(X), int)))
    np.testing.assert_allclose(scale, ref.scale_, rtol=1e-6)
    np.testing.assert_allclose(mean, ref.mean_, rtol=1e-12)
    few = np.repeat(X[:8], 4, axis=1)  # 8 rows of 12 features
    np.testing.assert_allclose(
        RidgePath.from_rows(few, np.ones((8, 1))).scale,
        StandardScaler().fit(few.astype(np.float64)).scale_,
        rtol=1e-6,
    )


def test_a_class_of_one_row_stays_in_the_fit_part_and_the_others_stay_stratified():
    """A class with a single train row is never held out for validation alone (training would lack it), and it
    no longer turns stratification off for the other classes; the part held out keeps its size."""
    from reservoir.tasks.sizes import holdout

    labels = np.array([0] * 20 + [1] * 19 + [2])
    for seed in range(10):
        fit, val = holdout(labels, 0.25, seed)
        assert 39 in fit and len(val) == 10 and sorted(np.bincount(labels[val], minlength=3)) == [0, 5, 5]
        assert np.array_equal(np.sort(np.concatenate([fit, val])), np.arange(40))


def test_a_holdout_of_too_few_rows_for_every_class_is_drawn_plainly():
    """Five classes of seven rows and five classes of one: four rows held out cannot hold one of each class, so the
    draw is plain (scikit-learn's stratified split refuses it), and the single rows stay in the fit part."""
    from reservoir.tasks.sizes import holdout

    labels = np.array([c for c in range(5) for _ in range(7)] + list(range(5, 10)))
    fit, val = holdout(labels, 0.1, 0)
    assert len(val) == 4 and set(range(35, 40)) <= set(fit)

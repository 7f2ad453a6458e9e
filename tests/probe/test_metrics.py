"""Memory capacity (Jaeger 2001): a linear echo state network holds about as many past inputs as it has
units, a tanh one fewer, and our estimator equals rcbench's on the same states and split."""

import numpy as np
import pytest

from reservoir.model.backbones.esn import ESNConfig, series_states
from reservoir.probe.metrics import memory_capacity
from reservoir.tasks.memory import delayed

UNITS, DELAYS = 20, 60


def states(activation: str, steps: int = 6000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    u = np.random.default_rng(seed).uniform(-1, 1, steps)
    cfg = ESNConfig(
        units=UNITS,
        sr=0.95,
        lr=1.0,
        input_scaling=0.1,
        activation=activation,
        input_connectivity=1.0,
        rc_connectivity=1.0,
    )
    return series_states(cfg, u[:, None], seed=1), u


def capacity(X: np.ndarray, u: np.ndarray, alpha: float = 0.0) -> np.ndarray:
    steps = np.arange(200, len(u))
    X, U = X[steps], delayed(u, steps, DELAYS)
    return memory_capacity((X[:3800], U[:3800]), (X[4000:], U[4000:]), alpha)


def test_a_linear_reservoir_holds_about_its_number_of_units():
    mc = capacity(*states("identity"))
    assert UNITS - 2 < mc.sum() <= UNITS + 1  # Jaeger's bound, up to the estimator's chance correlations
    assert np.all(mc[:10] > 0.99) and np.all((mc >= 0) & (mc <= 1))
    assert mc[UNITS + 10 :].sum() < 1  # nothing older than the reservoir can hold


def test_tanh_holds_less_than_linear_and_a_constant_readout_holds_nothing():
    assert capacity(*states("tanh")).sum() < capacity(*states("identity")).sum()
    X, u = states("identity")
    assert capacity(np.zeros_like(X), u).sum() == 0


def test_ours_equals_rcbench_on_the_same_states():
    pytest.importorskip("rcbench")
    from rcbench.tasks.memorycapacity import MemoryCapacityEvaluator

    X, u = states("tanh", steps=2000)
    alpha = 1e-6
    theirs = MemoryCapacityEvaluator(u, X, max_delay=30).calculate_total_memory_capacity(
        feature_selection_method="kbest", num_features="all", regression_alpha=alpha, train_ratio=0.8
    )
    steps = np.arange(30, len(u))
    split = int(0.8 * len(steps))
    U = delayed(u, steps, 30)
    ours = memory_capacity((X[steps][:split], U[:split]), (X[steps][split:], U[split:]), alpha)
    per_delay = np.array([theirs["delay_results"][k] for k in range(1, 31)])
    np.testing.assert_allclose(ours, per_delay, atol=1e-6)
    assert abs(ours.sum() - theirs["total_memory_capacity"]) < 1e-5


def test_non_finite_states_are_refused_not_scored_zero():
    X, u = states("identity", steps=1000)
    X[500, 3] = np.nan
    steps = np.arange(200, len(u))
    with pytest.raises(ValueError, match="NaN or infinite"):
        memory_capacity(
            (X[steps][:400], delayed(u, steps, 5)[:400]), (X[steps][400:], delayed(u, steps, 5)[400:])
        )


def test_an_ill_conditioned_linear_reservoir_is_read_as_a_stable_least_squares_solver_reads_it():
    """A linear reservoir of 100 units, read at a penalty of 1e-12 of its states' variance: the normal equations
    (its condition number squared) lost capacity; the estimator equals scikit-learn's Ridge solved by SVD."""
    from sklearn.linear_model import Ridge

    u = np.random.default_rng(0).uniform(-1, 1, 5200)
    cfg = ESNConfig(
        units=100, sr=0.95, lr=1.0, input_scaling=0.1, activation="identity", input_connectivity=1.0
    )
    steps = np.arange(200, len(u))
    X, U = series_states(cfg, u[:, None], seed=1)[steps], delayed(u, steps, 150)
    alpha = 1e-12 * float(np.mean(np.var(X, axis=0)))
    ours = memory_capacity((X[:4000], U[:4000]), (X[4000:], U[4000:]), alpha)
    pred = Ridge(alpha=alpha, solver="svd").fit(X[:4000], U[:4000]).predict(X[4000:])
    theirs = np.array([np.corrcoef(pred[:, k], U[4000:, k])[0, 1] ** 2 for k in range(U.shape[1])])
    np.testing.assert_allclose(ours, theirs, atol=1e-6)

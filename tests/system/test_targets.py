"""Targets beyond one class per example in your own file: multi-label 0/1 rows and real values, through
extract and fit, each scored by its kind's metrics."""

from __future__ import annotations

import numpy as np
import pytest

from reservoir import api
from reservoir.probe.metrics import macro_f1, nrmse

pytestmark = pytest.mark.usefixtures("home", "one_thread")


def rows(n=160, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6, 3)).astype(np.float32)
    return x, (x.mean(1) > 0).astype(np.int64)  # (n, 3): one label per token value's sign


def test_multi_label_rows_are_fitted_per_label_and_scored_by_accuracy_and_macro_f1(tmp_path, tiny_gpt2):
    x, y = rows()
    np.savez(tmp_path / "ml.npz", x=x, y=y)
    task = f"file:{tmp_path / 'ml.npz'}"
    path = api.extract(task, str(tiny_gpt2), depths="0,2", dtype="float32", compile=False)
    X, labels = api.read_features(path, "test", depth=2)
    assert labels.shape == (len(X), 1, 3) and labels.dtype == np.int64
    results = api.fit(task, str(tiny_gpt2), features=str(path), head="ridge")
    deep = next(r for r in results if r["depth"] == 2)
    assert deep["metric"] == "accuracy" and set(deep["test_metrics"]) == {"accuracy", "macro_f1"}
    predictions = api.predict(deep["probe"], path, "test")
    assert predictions.shape == labels.shape
    assert deep["test_accuracy"] == pytest.approx(float(np.mean(predictions == labels)))
    assert deep["test_metrics"]["macro_f1"] == pytest.approx(macro_f1(predictions, labels))
    raw = next(r for r in results if r["backbone"] == "baseline-raw")
    assert raw["test_accuracy"] > 0.75  # the signs are linear in the raw tokens


def test_several_real_targets_a_row_are_regressed_and_scored_by_nrmse(tmp_path, tiny_gpt2):
    x, _ = rows()
    y = np.stack([x[:, :, 0].mean(1), x[:, -1, 1]], 1)
    np.savez(tmp_path / "reg.npz", x=x, y=y)
    task = f"file:{tmp_path / 'reg.npz'}"
    path = api.extract(task, str(tiny_gpt2), depths="0,2", task_options={"regression": True}, compile=False)
    results = api.fit(task, str(tiny_gpt2), features=str(path), head="ridge")
    assert {r["metric"] for r in results} == {"nrmse"}
    raw = next(r for r in results if r["backbone"] == "baseline-raw")
    mean = next(r for r in results if r["backbone"] == "baseline-majority")
    assert raw["test_score"] < 0.2 < 0.9 < mean["test_score"]  # both targets are linear in the raw tokens
    deep = next(r for r in results if r["depth"] == 2)
    predictions = api.predict(deep["probe"], path, "test")
    _, labels = api.read_features(path, "test", depth=2)
    assert deep["test_score"] == pytest.approx(nrmse(predictions, labels), rel=1e-6)

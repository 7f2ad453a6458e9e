"""Reservoir computing's home tasks (Mackey-Glass, NARMA-10) and real-valued targets end to end:
generation equal to reservoirpy's, splits that never share a step, a ridge readout scored by NRMSE and
R^2 beside its baselines, the saved probe reproducing the fit, and the commands that cannot take real
targets refusing them in words."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reservoir.probe.metrics import nrmse, r2
from reservoir.tasks import DataError, make_task
from reservoir.tasks.series import mackey_glass, narma

pytestmark = pytest.mark.usefixtures("home", "one_thread")

SMALL = [
    "--task-opt",
    "n_train=300",
    "--task-opt",
    "n_val=100",
    "--task-opt",
    "n_test=150",
    "--task-opt",
    "window=12",
]


def test_series_equal_reservoirpys():
    datasets = pytest.importorskip("reservoirpy.datasets")
    np.testing.assert_array_equal(mackey_glass(700, 3), datasets.mackey_glass(700, seed=3)[:, 0])
    u, y = narma(500, 5)
    ur, yr = datasets.narma(500, order=10, a1=0.3, a2=0.05, b=1.5, c=0.1, seed=5)
    np.testing.assert_array_equal(u, ur[10:, 0])
    np.testing.assert_array_equal(y, yr[:, 0])


@pytest.mark.parametrize("name", ["mackey_glass", "narma10"])
def test_windows_advance_by_one_step_and_splits_never_share_a_step(name):
    task = make_task(name, {"n_train": 50, "n_val": 20, "n_test": 30, "window": 8, "washout": 10}, 0)
    inputs, targets = task.series(10 + 100 + 3 * 8)
    splits = {s: task.load(s, Path(".")) for s in ("train", "val", "test")}
    start = 10
    for split, d in splits.items():
        n = len(d)
        assert d.inputs.shape == (n, 8) and d.labels.shape == (n,) and d.labels.dtype == np.float32
        np.testing.assert_array_equal(d.inputs[1:, :-1], d.inputs[:-1, 1:])  # one step apart
        np.testing.assert_array_equal(d.inputs[:, 0], inputs[start : start + n].astype(np.float32))
        np.testing.assert_array_equal(d.labels, targets[start + 8 : start + 8 + n].astype(np.float32))
        np.testing.assert_array_equal(d.labels, targets[task.last_steps(split) + 1].astype(np.float32))
        # every step this split reads or predicts lies before the next split's first step
        start += n + 8
    assert task.spec.target == "regression" and task.spec.splits == ("train", "val", "test")
    assert np.all(np.abs(splits["train"].inputs) <= 1.0) if name == "mackey_glass" else True


def test_metrics_of_real_targets():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    assert r2(y, y) == 1.0 and nrmse(y, y) == 0.0
    assert nrmse(np.full(4, y.mean()), y) == pytest.approx(1.0) and r2(
        np.full(4, y.mean()), y
    ) == pytest.approx(0.0)
    pred = y + np.array([0.5, -0.5, 0.5, -0.5])
    assert nrmse(pred, y) == pytest.approx(np.sqrt(1 - r2(pred, y)))


def test_mackey_glass_through_extract_fit_and_predict(tmp_path, tiny_gpt2, cli, home):
    """Extract, fit a ridge readout at every depth and the baselines: each result scores NRMSE (its metric)
    and R^2 on the test split; the linear readout of the raw window forecasts Mackey-Glass far better than
    the train mean; the saved probe's predictions equal the fit's score on the file."""
    r = cli("extract", "--task", "mackey_glass", "--backbone", str(tiny_gpt2), *SMALL, "--dtype", "float32")
    assert r.exit_code == 0, r.output
    features = r.output.strip().splitlines()[-1]
    r = cli("fit", "--task", "mackey_glass", "--features", features, "--head", "ridge")
    assert r.exit_code == 0, r.output
    assert "nrmse" in r.output
    results = [json.loads(p.read_text()) for p in (home / "results" / "mackey_glass").rglob("*.json")]
    by = {(x["backbone"], x["depth"]): x for x in results}
    assert {x["metric"] for x in results} == {"nrmse"}
    for x in results:
        m = x["test_metrics"]
        assert set(m) == {"nrmse", "r2", "rmse"} and x["test_score"] == m["nrmse"]
        assert m["nrmse"] == pytest.approx(np.sqrt(max(0.0, 1 - m["r2"])), rel=1e-6)
        assert "test_accuracy" not in x
    mean, raw = by[("baseline-majority", None)], by[("baseline-raw", None)]
    assert mean["test_score"] > 0.9 and raw["test_score"] < 0.1
    depth = next(x for x in results if x["mode"] == "output-only" and x["depth"] == 2)
    out = tmp_path / "pred.csv"
    r = cli("predict", "--probe", depth["probe"], "--features", features, "--out", str(out))
    assert r.exit_code == 0, r.output
    assert f"nrmse {depth['test_score']:.4f}" in r.output
    rows = np.loadtxt(out, delimiter=",", skiprows=1)
    assert nrmse(rows[:, 1], rows[:, 2]) == pytest.approx(depth["test_score"], rel=1e-9)


def test_auto_dtype_is_float32_for_real_valued_targets(tiny_gpt2, cli):
    """bf16 keeps about three digits of a state, which bounds a forecast's error: ``--dtype auto`` takes
    float32 for a task with real-valued targets, whatever the CPU multiplies fastest."""
    import h5py

    r = cli("extract", "--task", "narma10", "--backbone", str(tiny_gpt2), *SMALL, "--depths", "0")
    assert r.exit_code == 0, r.output
    with h5py.File(r.output.strip().splitlines()[-1]) as f:
        assert f.attrs["dtype"] == "float32"


def test_auto_on_a_cpu_whose_fastest_dtype_is_float32_gives_that_reason(tiny_gpt2, cli, monkeypatch):
    """Where float32 is already the fastest dtype, real-valued targets change nothing, and the run says the
    CPU's reason, not "float32, not float32"."""
    import reservoir.runtime.dtypes as dtypes
    import reservoir.runtime.runner as runner

    fastest = ("float32", "float32: this CPU has no native bfloat16")
    monkeypatch.setattr(runner, "choose_dtype", lambda device="cpu": fastest)
    monkeypatch.setattr(dtypes, "choose", lambda device="cpu": fastest)
    r = cli("extract", "--task", "narma10", "--backbone", str(tiny_gpt2), *SMALL, "--depths", "0")
    assert r.exit_code == 0, r.output
    assert "float32 (float32: this CPU has no native bfloat16)" in r.output and "not float32" not in r.output


def test_real_targets_are_refused_where_classes_are_needed(tmp_path, tiny_gpt2, cli):
    r = cli("extract", "--task", "narma10", "--backbone", str(tiny_gpt2), *SMALL, "--dtype", "float32")
    assert r.exit_code == 0, r.output
    features = r.output.strip().splitlines()[-1]
    r = cli("fit", "--features", features, "--head", "logreg")
    assert r.exit_code == 1 and "real-valued targets (regression)" in r.output and "--head ridge" in r.output
    r = cli("train", "--task", "narma10", "--backbone", str(tiny_gpt2), "--steps", "2")
    assert r.exit_code == 1 and "real-valued targets" in r.output and "Traceback" not in r.output


def test_messages_of_a_forecast_say_what_ran(cli, home, tiny_gpt2):
    """Real-valued targets: the dtype line gives float32's own reason, the majority baseline is called the
    train mean on stderr as in the table, and an error near 0 keeps its digits."""
    from reservoir.probe.metrics import METRICS

    opts = ["--task-opt", "n_train=200", "--task-opt", "n_val=50", "--task-opt", "n_test=50"]
    r = cli("extract", "--task", "narma10", "--backbone", str(tiny_gpt2), "--depths", "0,1", *opts)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("extracting narma10"))
    assert ": float32 (" in line and "(auto: bfloat16" not in line
    r = cli("fit", "--task", "narma10", "--backbone", str(tiny_gpt2), "--depth", "1")
    assert r.exit_code == 0, r.output
    assert "baseline train mean" in r.output and "baseline majority" not in r.output
    assert METRICS["nrmse"].format(0.0000123) == "1.23e-05"


def test_a_narma_series_that_diverges_is_refused_naming_its_seed_and_step():
    """NARMA-10's recurrence grows without bound for some input draws (seed 270 at these sizes): refused in words,
    where it stored infinite labels and every score read nan."""
    from reservoir.tasks.series import narma

    u, y = narma(3706, 0)
    assert np.isfinite(y).all() and 0 < y.max() < 1 and len(u) == len(y) == 3706
    with pytest.raises(
        DataError, match=r"NARMA-10 of seed 270 diverges at step \d+ of 3706 .* choose another seed"
    ):
        narma(3706, 270)

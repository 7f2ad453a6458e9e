"""The tuned series pipeline: the same seeded search for every model, its trials kept in a ledger that a
rerun reads back instead of running again, a larger budget extending the earlier draws, and the table
rendered from the ledger alone, a search cut short said to be not run."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "pipelines"))  # series.py imports tuning.py beside it
spec = importlib.util.spec_from_file_location("tuning", ROOT / "pipelines" / "tuning.py")
tuning = sys.modules["tuning"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tuning)

from scipy.stats import loguniform, uniform  # noqa: E402


def test_a_rerun_reuses_every_trial_and_a_larger_budget_extends_the_draws(tmp_path):
    space = {"x": loguniform(0.01, 10.0)}
    calls = []

    def run(params, seed):
        calls.append((params["x"], seed))
        return {"val_nrmse": abs(params["x"] - 1) + seed, "test_nrmse": params["x"]}

    key = {"task": "t", "protocol": "windowed", "model": "m", "options": {"n_train": 10}}
    first = tuning.search(tuning.Ledger(tmp_path / "trials.jsonl"), key, space, run, trials=4, seeds=3)
    assert len(calls) == 4 + 2  # four draws on seed 0, the chosen one on seeds 1 and 2
    best = min(first["trials"], key=lambda r: r["val_nrmse"])["params"]
    assert first["best"] == best and [r["seed"] for r in first["seeds"]] == [0, 1, 2]

    again = tuning.search(tuning.Ledger(tmp_path / "trials.jsonl"), key, space, run, trials=4, seeds=3)
    assert len(calls) == 6 and again == first  # read back, nothing run

    more = tuning.search(tuning.Ledger(tmp_path / "trials.jsonl"), key, space, run, trials=6, seeds=3)
    assert [r["params"] for r in more["trials"][:4]] == [r["params"] for r in first["trials"]]
    assert len(calls) - 6 == 2 + (2 if more["best"] != first["best"] else 0)
    lines = (tmp_path / "trials.jsonl").read_text().splitlines()
    assert len(lines) == len({json.loads(line)["id"] for line in lines}) == len(calls)


def test_a_trial_scored_by_older_code_is_run_again_and_only_rendering_reads_it_back(tmp_path):
    """A ledger of scoring 2 holds trials of scoring 1 (records without the field): a search runs each again,
    records the new one with its scoring, and a rerun then reads it back; rendering (``keep_stale``) reads a
    stale trial without running it and :meth:`Ledger.stale` names it. A ledger without a scoring reuses all."""
    space = {"x": loguniform(0.01, 10.0)}
    calls = []

    def run(params, seed):
        calls.append(seed)
        return {"val_nrmse": params["x"] + len(calls), "test_nrmse": params["x"]}

    key = {"task": "t", "protocol": "windowed", "model": "m", "options": {}}
    path = tmp_path / "trials.jsonl"
    old = tuning.search(tuning.Ledger(path), key, space, run, trials=2, seeds=1)
    assert len(calls) == 2 and all("scoring" not in r for r in old["trials"])
    assert tuning.search(tuning.Ledger(path), key, space, run, trials=2, seeds=1) == old  # no scoring: reused
    rendering = tuning.Ledger(path, scoring=2)
    rendering.keep_stale = True
    assert tuning.search(rendering, key, space, run, trials=2, seeds=1) == old and len(calls) == 2
    assert all(rendering.stale(r) for r in old["trials"])
    new = tuning.search(tuning.Ledger(path, scoring=2), key, space, run, trials=2, seeds=1)
    assert len(calls) == 4 and [r["scoring"] for r in new["trials"]] == [2, 2]
    assert [r["val_nrmse"] for r in new["trials"]] != [r["val_nrmse"] for r in old["trials"]]
    assert tuning.search(tuning.Ledger(path, scoring=2), key, space, run, trials=2, seeds=1) == new
    assert len(calls) == 4  # the new trials read back


def test_a_diverged_trial_is_never_chosen_and_a_search_of_only_diverged_ones_says_so(tmp_path):
    """A trial scoring NaN (a diverged series, non-finite features) sorts after every number: the first draw's
    NaN is not taken as the best; a search whose every trial is NaN is refused in words."""
    space = {"x": loguniform(0.01, 10.0)}
    first = tuning.draws(space, 4)[0]

    def run(params, seed):
        return {"val_nrmse": float("nan") if params == first else abs(params["x"] - 1), "test_nrmse": 0.0}

    key = {"task": "t", "protocol": "windowed", "model": "m", "options": {}}
    got = tuning.search(tuning.Ledger(tmp_path / "a.jsonl"), key, space, run, trials=4, seeds=1)
    assert got["best"] != first and not np.isnan(got["seeds"][0]["val_nrmse"])
    with pytest.raises(ValueError, match="every trial of the search scored NaN"):
        tuning.search(
            tuning.Ledger(tmp_path / "b.jsonl"),
            key,
            space,
            lambda p, s: {"val_nrmse": float("nan")},
            trials=3,
            seeds=1,
        )


def test_a_choice_at_the_end_of_the_values_tried_and_of_the_range_is_flagged_as_an_edge():
    space = {"s": loguniform(0.005, 5.0), "u": uniform(0.0, 1.0)}
    tried = [{"s": 0.00704, "u": 0.5}, {"s": 0.07, "u": 0.95}, {"s": 0.006, "u": 0.02}]
    assert tuning.edges(space, {"s": 0.00704, "u": 0.5}, tried[:2]) == {"s": "low edge"}  # 5% up a log range
    assert tuning.edges(space, {"s": 0.00704, "u": 0.5}, tried) == {}  # a lower value was tried
    assert tuning.edges(space, {"s": 0.07, "u": 0.95}, tried) == {"u": "high edge"}
    assert tuning.edges(space, {"s": 0.5, "u": 0.1}, [{"s": 0.5, "u": 0.1}]) == {}  # the tenth is inside
    assert tuning.edges(space, {}, [{}]) == {}  # nothing tuned


def tiny_series(tmp_path, monkeypatch, *options: str):
    """series.py's module, set to run on tiny NARMA-10 series (windows of 8) with ``options``, and its --out."""
    spec = importlib.util.spec_from_file_location("series", ROOT / "pipelines" / "series.py")
    series = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "series", series)  # its dataclass looks its module up
    spec.loader.exec_module(series)
    out = tmp_path / "out"
    argv = [
        "series.py",
        *("--out", str(out), "--home", str(tmp_path / "home")),
        *("--seeds", "2", "--n-train", "120", "--n-val", "60", "--n-test", "60", "--window", "8"),
        *("--tasks", "narma10", *options),
    ]
    monkeypatch.setenv("RESERVOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "argv", argv)
    return series, out


def test_the_pipeline_runs_a_small_budget_then_reuses_it(tmp_path, monkeypatch):
    """series.py on tiny NARMA-10 series (an ESN, reservoirpy's and the baselines, both protocols): a second
    run adds no trial, and the table names what did not run."""
    series, out = tiny_series(
        tmp_path, monkeypatch, "--trials", "2", "--models", "esn-100", "reservoirpy", "raw", "mean"
    )
    series.main()
    trials = (out / "trials.jsonl").read_text()
    # esn-100: 2 draws + 1 seed, each protocol; reservoirpy: 2 + 1; raw and mean: one setting on 2 seeds
    assert len(trials.splitlines()) == 3 + 3 + 3 + 2 + 2
    series.main()
    assert (out / "trials.jsonl").read_text() == trials
    table = (out / "series.md").read_text()
    narma = table.split("**NARMA-10**")[1]
    assert "| GPT-2 small shape, random | not run | - |" in narma
    assert "± " in narma.split("| ESN, 100 units | ")[1].split("\n")[0]


def test_past_the_edges_runs_the_scales_beyond_a_choice_at_an_edge_once(tmp_path, monkeypatch):
    """With one trial the ESN's only draw is chosen, its input scaling (2.03) at the high edge of 0.01 to 3:
    --beyond-edges runs it one and two tenths of the range's span (300 ** 0.1) further on seed 0, once, and
    the table reports them; the choice and the seeds stand as searched."""
    series, out = tiny_series(
        tmp_path, monkeypatch, "--trials", "1", "--models", "esn-100", "raw", "--beyond-edges"
    )
    series.main()
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    past = [r for r in records if r["role"] == "past the edge"]
    # per protocol: a draw, a seed and two past the edge; raw: two seeds
    assert len(records) == 2 * (1 + 1 + 2) + 2
    assert sorted((r["protocol"], r["params"]["input_scaling"], r["seed"]) for r in past) == [
        (p, v, 0) for p in ("continuous", "windowed") for v in (3.59, 6.35)
    ]
    assert {r["params"]["sr"] for r in records if r["model"] == "esn-100"} == {0.61}  # only the scale moved
    series.main()
    assert len((out / "trials.jsonl").read_text().splitlines()) == len(records)  # nothing run again
    table = (out / "series.md").read_text().split("Past the edge")[1]
    for r in past:
        assert f"input_scaling {r['params']['input_scaling']}: {r['val_nrmse']:.3g}" in table


def test_nonlinear_memory_of_a_delay_line_holds_the_near_linear_targets_and_not_sin_10u():
    """A state that is the last 10 inputs (a perfect delay line) holds sin(nu u(t - tau)) for tau 1..8 when
    nu is small (the target is nearly linear: 8 of 8) and little of it at nu = 10, which a linear readout
    of the inputs cannot form (rcbench's nonlinear memory, as memory.py reports it)."""
    import numpy as np
    import pytest

    pytest.importorskip("rcbench")
    memory_spec = importlib.util.spec_from_file_location("memory", ROOT / "pipelines" / "memory.py")
    memory = importlib.util.module_from_spec(memory_spec)
    memory_spec.loader.exec_module(memory)
    u = np.random.default_rng(0).uniform(-1, 1, 3000)
    states = np.stack([np.roll(u, k) for k in range(10)], axis=1)
    got = memory.nonlinear_memory(states, u, alpha=1e-6)
    assert got["0.1"] > 7.99 and got["1.0"] > 7.9 and got["10.0"] < 0.5


def test_memory_capacity_runs_a_model_at_the_setting_its_series_search_chose(tmp_path, monkeypatch):
    """memory.py's tuned row of the 100-unit ESN (continuous) runs at the setting series.py's search chose on
    NARMA-10 and names it; a rerun runs nothing; a model whose search is not in the ledger is said not run."""
    series, out = tiny_series(tmp_path, monkeypatch, "--trials", "2", "--models", "esn-100")
    series.main()
    chosen = series.collected(
        tuning.Ledger(out / "trials.jsonl"),
        "narma10",
        "continuous",
        "esn-100",
        series.task_options("narma10", argparse.Namespace(n_val=60, n_test=60, window=8), 120),
        2,
        2,
    )["best"]
    spec = importlib.util.spec_from_file_location("memory", ROOT / "pipelines" / "memory.py")
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)
    argv = [
        "memory.py",
        *("--out", str(out), "--home", str(tmp_path / "home"), "--seeds", "2", "--trials", "2"),
        *("--n-val", "60", "--n-test", "60", "--window", "8", "--tuned-train", "120"),
        *("--long-train", "300", "--long-delays", "20", "--models", "esn-100-tuned", "lstm-tuned"),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    memory.main()
    records = json.loads((out / "memory.json").read_text())
    assert sorted(records) == ["esn-100-tuned/0", "esn-100-tuned/1"]
    assert all(r["params"] == chosen for r in records.values())
    default = memory.continuous("esn-100-tanh", 0, records["esn-100-tuned/0"]["options"])
    assert default["mc"] != records["esn-100-tuned/0"]["mc"]  # the setting reached the reservoir
    memory.main()
    assert json.loads((out / "memory.json").read_text()) == records  # read back, nothing run
    table = (out / "memory.md").read_text()
    setting = ", ".join(f"{k} {v}" for k, v in chosen.items())
    assert f"ESN, 100 units, continuous, tuned on NARMA-10 ({setting}) | 2 |" in table
    assert (
        "LSTM, 3 layers of 768, random, windowed, tuned on NARMA-10 (its search not complete) | 0 | not run"
        in table
    )
    # the search's trials scored by an earlier readout: nothing runs at a setting chosen from them, and the rows
    # run at the earlier choice stand, marked
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    (out / "trials.jsonl").write_text("".join(json.dumps({**t, "scoring": 1}) + "\n" for t in trials))
    memory.main()
    assert json.loads((out / "memory.json").read_text()) == records
    assert (
        f"ESN, 100 units, continuous, tuned on NARMA-10 ({setting}) † | 2 |"
        in (out / "memory.md").read_text()
    )


def test_rcbench_s_memory_capacity_equals_ours_on_float32_states_of_an_ill_conditioned_reservoir():
    """memory.py's check hands both estimators the states in float64: on float32 states of a linear reservoir
    (ill-conditioned), rcbench's capacity equals ours, where its solve of the float32 states differs."""
    pytest.importorskip("rcbench")
    spec = importlib.util.spec_from_file_location("memory", ROOT / "pipelines" / "memory.py")
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)
    rng = np.random.default_rng(0)
    u = rng.uniform(-1, 1, 2000)
    w = rng.normal(size=(60, 60))
    w *= 0.95 / np.abs(np.linalg.eigvals(w)).max()
    w_in, x, states = rng.uniform(-0.1, 0.1, 60), np.zeros(60), []
    for step in u:
        x = w @ x + w_in * step
        states.append(x.copy())
    check = memory.checked(np.asarray(states, dtype=np.float32), u, 30, 1e-10)
    assert check["ours"] > 10 and check["version"] == memory.CHECK
    assert check["rcbench"] == pytest.approx(check["ours"], abs=1e-6)


def test_memory_capacity_reports_the_depth_chosen_on_validation_of_this_commands_runs():
    """memory.py's table takes each seed's depth by its validation capacity, not its test capacity, and counts
    only the records of the command's options and seeds (a record of another window is not averaged in)."""
    spec = importlib.util.spec_from_file_location("memory", ROOT / "pipelines" / "memory.py")
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)
    args = argparse.Namespace(
        seeds=2, window=8, delays=5, n_train=50, n_val=20, n_test=20, long_delays=20, long_train=300,
        tuned_on="narma10", trials=2, tuned_train=120,
    )  # fmt: skip
    opts = memory.options("lstm", args)

    def record(test_sums, val, **extra):
        mc = [[s / 5] * 5 for s in test_sums]
        return {"depths": [0, 1, 2], "mc": mc, "val": val, "alpha": [1.0] * 3, "kernel_rank": [1] * 3,
                "nonlinear": [None] * 3, "options": opts, **extra}  # fmt: skip

    records = {
        "lstm/0": record([1.0, 4.0, 5.0], [0.5, 3.0, 2.0]),  # test peaks at depth 2, validation at 1
        "lstm/1": record([1.0, 6.0, 7.0], [0.5, 3.0, 2.0]),
        "lstm/2": record([9.0, 9.0, 9.0], [9.0, 1.0, 1.0]),  # a seed past --seeds
    }
    table = memory.render(records, args, {"lstm": ("LSTM", None)})
    assert "| LSTM | 2 | 5 ± 1.4 | 1 |" in table, table
    records["lstm/1"]["options"] = {**opts, "window": 16}  # a record of another command
    assert "| LSTM | 1 | 4 | 1 |" in memory.render(records, args, {"lstm": ("LSTM", None)})

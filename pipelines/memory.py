"""Linear memory capacity (Jaeger 2001) per depth: the ESN, the LSTM, the random GPT-2 and the SmolLM2
stand-ins, checked against rcbench's estimator on the same states.

    python memory.py --out ../docs/results/series      # part of make -C pipelines series

The ``memory_capacity`` task (i.i.d. inputs on [-1, 1], targets the ``--delays`` inputs before each step,
:mod:`reservoir.tasks.memory`). Windowed models (windows of ``--window`` steps): ``reservoir extract`` at
every depth; at each depth the linear readout of every delay is fitted on train with a ridge penalty chosen
on validation (the largest summed capacity over a grid relative to the states' mean variance) and the
capacity measured on test (:func:`reservoir.probe.metrics.memory_capacity`). Echo state networks also
run the continuous protocol (one run over the series, 100 units, tanh and linear), where a capacity up to
the number of units can show. A ridge on the raw window is the windowed reference: it holds exactly the
``window - 1`` inputs before the last.

Each model runs at its default setting and again at the setting its search in ``series.py`` chose on NARMA-10
(``--tuned-on``, ``--tuned-train`` training steps: the same number of trials for every model, read from the
ledger ``trials.jsonl`` beside ``--out``, its trials of the current scoring, ``series.SCORING``); a model whose
search is not complete there is not run: its rows run at an earlier search's choice stand, marked †, and
without any it is said not run.

With rcbench installed, its ``MemoryCapacityEvaluator`` (its 80/20 split of the train steps, the same penalty)
and ours on the same states (in float64) and split are set side by side at the depth chosen, and its linear
kernel rank
and nonlinear memory (``NonlinearMemoryEvaluator``: the capacity for ``sin(nu u(t - tau))``, summed over
``tau`` = 1..8, at each ``nu`` of :data:`NU`) are reported per depth. Each (model, seed) is kept in ``memory.json`` under ``--out`` and reused by a rerun;
``memory.md`` and ``memory_capacity.png`` are written from it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent

WINDOWED = {
    "raw": "ridge on the raw window",
    "esn": "ESN, 768 units (sr 0.9, leak 0.3), windowed",
    "lstm": "LSTM, 3 layers of 768, random",
    "gpt2-random": "GPT-2 small shape, random",
    "smollm2-135m": "SmolLM2-135M, language-pretrained",
    "smollm2-135m-random": "SmolLM2-135M shape, random",
}
#: the continuous protocol's ESNs: 100 units, no leak, spectral radius 0.95, input scaling 0.1, every unit
#: reading the input
CONTINUOUS = {
    "esn-100-linear": ("ESN, 100 units, linear (identity), continuous", "identity"),
    "esn-100-tanh": ("ESN, 100 units, tanh, continuous", "tanh"),
}
#: models measured again at the setting their series search chose (``--tuned-on``): name -> (the model of
#: ``series.MODELS``, its protocol)
TUNED = {
    "esn-tuned": ("esn", "windowed"),
    "lstm-tuned": ("lstm", "windowed"),
    "gpt2-random-tuned": ("gpt2-random", "windowed"),
    "gpt2-random-low-tuned": ("gpt2-random-low", "windowed"),
    "smollm2-135m-tuned": ("smollm2-135m", "windowed"),
    "smollm2-135m-random-tuned": ("smollm2-135m-random", "windowed"),
    "esn-100-tuned": ("esn-100", "continuous"),
}
#: ridge penalties, times the states' mean variance (none 0: an unregularised solve of ill-conditioned states depends on
#: the solver, scikit-learn's least squares and the normal equations disagreeing by a third of a linear ESN's capacity)
GRID = (1e-10, 1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
#: the version of rcbench's check a record holds (:func:`checked`): 2 since both estimators read the states in
#: float64 (rcbench's own solve of float32 states differed from ours by up to 0.13 on ill-conditioned ones)
CHECK = 2


def capacities(rows: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, float, float]:
    """Test capacity per delay at the penalty of the largest summed validation capacity, that penalty, and that
    validation capacity (what a model's depth is chosen by)."""
    from reservoir.probe.metrics import memory_capacity

    X = rows["train"][0].astype(np.float64)
    scale = float(np.mean(np.var(X, axis=0))) or 1.0
    val = {a: memory_capacity(rows["train"], rows["val"], a * scale).sum() for a in GRID}
    best = max(GRID, key=lambda a: (val[a], a))
    return memory_capacity(rows["train"], rows["test"], best * scale), best * scale, float(val[best])


def chosen(record: dict[str, Any]) -> int:
    """The index of a record's depth chosen on validation: the largest summed validation capacity."""
    return int(np.argmax(record["val"]))


def is_windowed(name: str) -> bool:
    """Whether a model's capacity is measured on windows (else over one continuous run)."""
    return name in WINDOWED or TUNED.get(name, ("", ""))[1] == "windowed"


def options(name: str, args) -> dict[str, Any]:
    """The task options a model's capacity is measured with: the windowed protocol's or the continuous one's."""
    if is_windowed(name):
        opts = {"n_train": args.n_train, "n_val": args.n_val, "n_test": args.n_test, "window": args.window}
        opts["delays"] = args.delays
    else:
        opts = {"n_train": args.long_train, "n_val": 500, "n_test": 1000, "window": args.window}
        opts["delays"] = args.long_delays
    return {**opts, "washout": max(100, opts["delays"])}


def runs_of(records: dict[str, Any], name: str, params: Any, args) -> list[dict[str, Any]]:
    """The records of ``name`` this command stands for: its setting, its options, seeds below ``--seeds``."""
    return [
        records[f"{name}/{seed}"]
        for seed in range(args.seeds)
        if f"{name}/{seed}" in records
        and records[f"{name}/{seed}"].get("params") == params
        and records[f"{name}/{seed}"]["options"] == options(name, args)
        and "val" in records[f"{name}/{seed}"]  # its depth chosen on validation
    ]


#: rcbench's nonlinear memory: the nonlinearities ``nu`` and delays ``tau`` of its targets ``sin(nu u(t - tau))``
#: (its defaults)
NU = (0.1, 0.3, 1.0, 3.0, 10.0)
TAUS = tuple(range(1, 9))


@contextlib.contextmanager
def quiet_ridge():
    """rcbench's unstandardized ridge warns of near-collinear states, which its penalty handles: not shown."""
    from scipy.linalg import LinAlgWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LinAlgWarning)
        yield


def nonlinear_memory(states: np.ndarray, inputs: np.ndarray, alpha: float) -> dict[str, float] | None:
    """rcbench's nonlinear memory of consecutive ``states`` driven by ``inputs``: per ``nu``, the capacity
    (its definition: 1 - NMSE of a ridge readout, penalty ``alpha``, of the states as they are, on the last 20% of
    the steps, floored at 0; not a squared correlation) summed over ``tau`` = 1..8 (``None`` without rcbench)."""
    try:
        from rcbench.tasks.nonlinearmemory import NonlinearMemoryEvaluator
    except ImportError:
        return None
    evaluator = NonlinearMemoryEvaluator(inputs, states, tau_values=list(TAUS), nu_values=list(NU))
    with quiet_ridge():
        return {
            str(nu): float(
                sum(
                    evaluator.run_evaluation(
                        tau, nu, feature_selection_method="kbest", num_features="all", regression_alpha=alpha
                    )["capacity"]
                    for tau in TAUS
                )
            )
            for nu in NU
        }


def kernel_rank(states: np.ndarray) -> int | None:
    """rcbench's linear kernel rank of ``states`` (``None`` without rcbench)."""
    try:
        from rcbench.tasks.kernelrank import KernelRankEvaluator
    except ImportError:
        return None
    return int(KernelRankEvaluator(states).run_evaluation()["kernel_rank"])


def checked(states: np.ndarray, inputs: np.ndarray, delays: int, alpha: float) -> dict[str, Any]:
    """rcbench's memory capacity and ours on the same consecutive ``states`` (its 80/20 split, penalty
    ``alpha``; both in float64) and rcbench's linear kernel rank; empty without rcbench."""
    try:
        from rcbench.tasks.memorycapacity import MemoryCapacityEvaluator
    except ImportError:
        return {}
    from reservoir.probe.metrics import memory_capacity
    from reservoir.tasks.memory import delayed

    rank = kernel_rank(states)  # of the states as the readout reads them
    states = states.astype(np.float64)
    with quiet_ridge():
        theirs = MemoryCapacityEvaluator(inputs, states, max_delay=delays).calculate_total_memory_capacity(
            feature_selection_method="kbest", num_features="all", regression_alpha=alpha, train_ratio=0.8
        )
    steps = np.arange(delays, len(inputs))
    split = delays + int(0.8 * len(steps))
    U = delayed(inputs, steps, delays)
    ours = memory_capacity(
        (states[delays:split], U[: split - delays]), (states[split:], U[split - delays :]), alpha
    )
    return {
        "rcbench": float(theirs["total_memory_capacity"]),
        "ours": float(ours.sum()),
        "kernel_rank": rank,
        "version": CHECK,
    }


def tuned_setting(args, name: str, ledger) -> dict[str, Any] | None:
    """The setting the series search chose for ``TUNED[name]`` on ``args.tuned_on``, as ``ledger`` (the series'
    ``tuning.Ledger``) holds it (``None`` where it does not hold the whole search)."""
    import series

    model, protocol = TUNED[name]
    sizes = argparse.Namespace(n_val=args.n_val, n_test=args.n_test, window=args.window)
    opts = series.task_options(args.tuned_on, sizes, args.tuned_train)
    got = series.collected(ledger, args.tuned_on, protocol, model, opts, args.trials, args.seeds)
    return None if "partial" in got else got["best"]


def windowed(
    name: str, seed: int, opts: dict[str, Any], backbone: str | None = None, input_scale: Any = None
) -> dict[str, Any]:
    """Capacity per depth of a windowed model (module docstring): ``backbone`` (default ``name``) at
    ``input_scale`` (default the backbone's)."""
    import h5py

    from reservoir.config import ExtractConfig
    from reservoir.extract.run import extract
    from reservoir.probe.baselines import raw_inputs
    from reservoir.tasks import make_task

    task = make_task("memory_capacity", opts, seed)
    if name == "raw":
        data = {s: task.read(s, Path(".")) for s in ("train", "val", "test")}
        per_depth = {None: {s: (raw_inputs(task, d), d.labels[:, 0]) for s, d in data.items()}}
    else:
        scale = {} if input_scale is None else {"input_scale": input_scale}
        cfg = ExtractConfig(
            task="memory_capacity",
            backbone=backbone or name,
            seed=seed,
            task_options=opts,
            dtype="float32",
            **scale,
        )
        path = Path(extract(cfg, progress=False))
        with h5py.File(path) as f:
            depths = [int(d) for d in f.attrs["depths"]]
            per_depth = {
                d: {
                    s: (f[s]["features"][:, i, 0, :], f[s]["labels"][:, 0, :])
                    for s in ("train", "val", "test")
                }
                for i, d in enumerate(depths)
            }
        path.unlink(missing_ok=True)
    out: dict[str, Any] = {"depths": [], "mc": [], "val": [], "alpha": [], "kernel_rank": [], "nonlinear": []}
    inputs = task.series(task.stretches()[1])[0][task.last_steps("train")]
    for depth, rows in per_depth.items():
        mc, alpha, val = capacities(rows)
        out["depths"].append(depth)
        out["mc"].append(mc.tolist())
        out["val"].append(val)
        out["alpha"].append(alpha)
        out["kernel_rank"].append(kernel_rank(rows["train"][0]))
        out["nonlinear"].append(nonlinear_memory(rows["train"][0].astype(np.float64), inputs, alpha))
    best = chosen(out)
    out["check"] = checked(
        per_depth[out["depths"][best]]["train"][0], inputs, opts["delays"], out["alpha"][best]
    )
    return out


def continuous(name: str, seed: int, opts: dict[str, Any], cfg: Any = None) -> dict[str, Any]:
    """Capacity of a continuous-protocol ESN (module docstring): ``cfg`` (an ``ESNConfig``; default the
    field's setting of :data:`CONTINUOUS`)."""
    from reservoir.model.backbones.esn import ESNConfig, series_states
    from reservoir.tasks import make_task
    from reservoir.tasks.memory import delayed

    task = make_task("memory_capacity", opts, seed)
    u = task.series(task.stretches()[1])[0]
    if cfg is None:
        cfg = ESNConfig(  # every unit reads the input, as in the continuous protocol's search (series.FIXED)
            units=100,
            lr=1.0,
            sr=0.95,
            input_scaling=0.1,
            input_connectivity=1.0,
            activation=CONTINUOUS[name][1],
        )
    states = series_states(cfg, u[:, None], seed)
    rows = {
        s: (states[i], delayed(u, i, opts["delays"]))
        for s in ("train", "val", "test")
        for i in [task.last_steps(s)]
    }
    mc, alpha, val = capacities(rows)
    train = task.last_steps("train")
    return {
        "depths": [1],
        "mc": [mc.tolist()],
        "val": [val],
        "alpha": [alpha],
        "kernel_rank": [kernel_rank(states[train])],
        "nonlinear": [nonlinear_memory(states[train], u[train], alpha)],
        "check": checked(states[train], u[train], opts["delays"], alpha),
    }


def tuned_run(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`windowed` or :func:`continuous` that run ``TUNED[name]`` at ``params``."""
    import series

    model, protocol = TUNED[name]
    if protocol == "windowed":
        backbone, scale = series.windowed_backbone(model, params)
        return {"backbone": backbone, "input_scale": scale}
    return {"cfg": series.esn_config(series.MODELS[model], params, series.FIXED[(protocol, model)])}


def labels(args, records: dict[str, Any]) -> tuple[dict[str, tuple[str, dict[str, Any] | None]], set[str]]:
    """Every model's row label and a tuned model's setting (as the series ledger's trials of the current scoring
    hold it; ``None`` else), and the tuned models whose search is not complete there but whose rows
    ``records`` holds, run at an earlier search's choice: their setting is that one, their label marked †."""
    import series
    from tuning import Ledger

    ledger = Ledger(args.out / "trials.jsonl", scoring=series.SCORING)
    out = {**{k: (v, None) for k, v in WINDOWED.items()}, **{k: (v[0], None) for k, v in CONTINUOUS.items()}}
    earlier = set()
    for name, (model, protocol) in TUNED.items():
        params, mark = tuned_setting(args, name, ledger), ""
        if params is None and f"{name}/0" in records:
            params, mark = records[f"{name}/0"].get("params"), " †"
            earlier.add(name)
        setting = ", ".join(f"{k} {v}" for k, v in params.items()) if params else "its search not complete"
        label = f"{series.MODELS[model].label}, {protocol}, tuned on {series.TASKS[args.tuned_on]} ({setting}){mark}"
        out[name] = (label, params)
    return out, earlier


def render(records: dict[str, Any], args, rows: dict[str, tuple[str, Any]]) -> str:
    """The memory capacity table (summed over delays, at each model's depth chosen on validation and per depth);
    ``rows``: :func:`labels`."""
    md = [
        "Linear memory capacity (Jaeger 2001): the sum over delays k = 1..K of the squared correlation, on test "
        "steps, between the input k steps back and its ridge readout from the state (penalty chosen on "
        "validation), i.i.d. inputs on [-1, 1]. Windowed: windows of "
        f"{args.window} steps, K = {args.delays}, {args.n_train} train, {args.n_val} validation and "
        f"{args.n_test} test windows (a window holds {args.window - 1} inputs before its last: no windowed model "
        f"can exceed {args.window - 1}). Continuous: one run, K = {args.long_delays}, {args.long_train} train steps; "
        "a linear reservoir of N units is bounded by N (here 100). Mean ± standard deviation over the seeds run; "
        "rcbench's estimator on the same states (its 80/20 split of the train steps, the same penalty) beside ours. "
        "Nonlinear memory (rcbench): the capacity for sin(nu u(t - tau)) summed over tau = 1..8 (at most 8), at "
        "nu = 1 / 3 / 10 (at 0.1 every model here holds all 8: the target is linear), at the depth of the linear capacity chosen on validation, the same penalty; rcbench's capacity is 1 - NMSE on its test steps, "
        "floored at 0, of a readout of the states as they are (not standardized), where the linear capacity is a "
        "squared correlation: a readout shrunk by the penalty or off in scale scores lower there (down to 0) than here. "
        f"'tuned on {args.tuned_on}': the setting the same {args.trials}-trial search chose for the model on "
        f"{args.tuned_on}'s validation NRMSE ({args.tuned_train} training steps, the series table's), every other "
        "row at its default setting; † a setting chosen by a search scored with the earlier ridge readout "
        "(series.md's †), its rows as run then, until the search is run again.",
        "",
        "| model | seeds | capacity (depth chosen on validation) | depth | capacity per depth (test) | ours, rcbench's split | rcbench | "
        "kernel rank per depth (rcbench) | nonlinear memory, nu 1 / 3 / 10 (rcbench) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    deep = [
        "",
        "Nonlinear memory per depth (rcbench, as above: at most 8), mean over the seeds run, for the models of "
        "more than one depth:",
        "",
        "| model | nu = 1, per depth | nu = 3, per depth |",
        "|---|---|---|",
    ]
    for name, (label, params) in rows.items():
        runs = runs_of(records, name, params, args)
        if len(runs) and len(runs[0]["depths"]) > 1 and all(all(r.get("nonlinear") or [None]) for r in runs):
            deep.append(
                f"| {label} | " + " | ".join(nonlinear_by_depth(runs, nu) for nu in (1.0, 3.0)) + " |"
            )
        if not runs:
            md.append(f"| {label} | 0 | not run | | | | | | |")
            continue
        sums = np.array([[sum(m) for m in r["mc"]] for r in runs])  # (seeds, depths)
        best = [chosen(r) for r in runs]
        at_best = [s[b] for s, b in zip(sums, best)]
        depths = sorted({str(runs[i]["depths"][b]) for i, b in enumerate(best)} - {"None"}) or ["-"]
        per_depth = ", ".join(
            f"{d}: {m:.3g}" for d, m in zip(runs[0]["depths"], sums.mean(0)) if d is not None
        )
        mean_sd = f"{np.mean(at_best):.3g}" + (f" ± {np.std(at_best, ddof=1):.2g}" if len(runs) > 1 else "")
        check = [r.get("check") or {} for r in runs]
        ours = f"{np.mean([c['ours'] for c in check]):.4g}" if all(check) else "rcbench absent"
        theirs = f"{np.mean([c['rcbench'] for c in check]):.4g}" if all(check) else ""
        ranks = ", ".join(str(k) for k in runs[0]["kernel_rank"] if k is not None)
        md.append(
            f"| {label} | {len(runs)} | {mean_sd} | {','.join(map(str, depths))} | {per_depth} | {ours} | {theirs} "
            f"| {ranks} | {nonlinear_text(runs, best)} |"
        )
    return "\n".join(md + deep) + "\n"


def nonlinear_by_depth(runs: list[dict[str, Any]], nu: float) -> str:
    """rcbench's nonlinear memory at ``nu`` per depth, mean over ``runs`` (depth 0, the input layer alone,
    left out)."""
    values = np.array([[n[str(nu)] for n in r["nonlinear"]] for r in runs]).mean(0)
    return ", ".join(f"{d}: {v:.2g}" for d, v in zip(runs[0]["depths"], values) if d)


def plot(records: dict[str, Any], args, rows: dict[str, tuple[str, Any]], path: Path) -> None:
    """Capacity per delay at each model's depth chosen on validation (seed 0), and summed capacity per depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 8.5))
    for i, (name, (label, params)) in enumerate(rows.items()):
        r = next((r for r in runs_of(records, name, params, args) if r is records.get(f"{name}/0")), None)
        if r is None:
            continue
        sums = [sum(m) for m in r["mc"]]
        best = chosen(r)
        style = {
            "color": plt.cm.tab20(i % 20),
            "ls": "--" if name == "raw" else "-." if name in TUNED else "-",
        }
        short = label.rsplit(" (", 1)[0] if name in TUNED else label  # the setting is in the table
        depth = "" if r["depths"][best] is None else f" (depth {r['depths'][best]})"
        left.plot(range(1, len(r["mc"][best]) + 1), r["mc"][best], label=short + depth, **style)
        if len(r["depths"]) > 1:
            right.plot(r["depths"], sums, marker="o", markersize=3, **style)
    left.axvline(args.window - 1, color="grey", ls=":", label=f"window ({args.window - 1} inputs back)")
    left.set(
        xlabel="delay k", ylabel="capacity (squared correlation)", title="memory capacity per delay (seed 0)"
    )
    right.axhline(100, color="black", ls="--", label="bound of a 100-unit linear ESN")
    right.axhline(args.window - 1, color="grey", ls=":", label="bound of a windowed model")
    right.set(xlabel="depth", ylabel="summed capacity", title="summed capacity per depth (windowed, seed 0)")
    handles = [h for ax in (left, right) for h in ax.get_legend_handles_labels()[0]]
    names = [n for ax in (left, right) for n in ax.get_legend_handles_labels()[1]]
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.27, 1, 1))
    fig.savefig(path, dpi=110)


def has_rcbench() -> bool:
    import importlib.util

    return importlib.util.find_spec("rcbench") is not None


def nonlinear_text(runs: list[dict[str, Any]], best: list[int]) -> str:
    """Nonlinear memory at nu = 1, 3 and 10 at each seed's linear depth chosen on validation: mean (± standard
    deviation) over seeds."""
    at = [r["nonlinear"][b] for r, b in zip(runs, best) if r.get("nonlinear") and r["nonlinear"][b]]
    if len(at) < len(runs):
        return "not run"
    values = [[a[str(nu)] for a in at] for nu in (1.0, 3.0, 10.0)]
    return " / ".join(
        f"{np.mean(v):.3g}" + (f" ± {np.std(v, ddof=1):.2g}" if len(v) > 1 else "") for v in values
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "results" / "series")
    parser.add_argument("--home", type=Path, default=HERE / "out" / "series")
    parser.add_argument("--seeds", type=int, default=3)
    every = [*WINDOWED, *CONTINUOUS, *TUNED]
    parser.add_argument("--models", nargs="+", default=every, choices=every)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--delays", type=int, default=40)
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--n-val", type=int, default=300)
    parser.add_argument("--n-test", type=int, default=500)
    parser.add_argument("--long-delays", type=int, default=150)
    parser.add_argument("--long-train", type=int, default=4000)
    parser.add_argument(
        "--tuned-on", default="narma10", help="the series task whose search sets the tuned rows"
    )
    parser.add_argument("--tuned-train", type=int, default=1000, help="training steps of that search")
    parser.add_argument("--trials", type=int, default=8, help="trials of that search")
    parser.add_argument("--render", action="store_true", help="write memory.md and the figure again (no run)")
    args = parser.parse_args()
    os.environ["RESERVOIR_HOME"] = str(args.home)
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "memory.json"
    records = json.loads(store.read_text()) if store.exists() else {}
    rows, earlier = labels(args, records)  # the series ledger read once: memory.py adds nothing to it
    for name in [] if args.render else args.models:
        params, how = rows[name][1], {}
        if name in TUNED:
            if params is None or name in earlier:
                print(
                    f"memory capacity {name}: not run, its {args.tuned_on} search is not complete",
                    file=sys.stderr,
                )
                continue
            how = tuned_run(name, params)
        opts = options(name, args)
        for seed in range(args.seeds):
            key = f"{name}/{seed}"
            if (
                key in records
                and records[key]["options"] == opts
                and records[key].get("params") == params
                and "val" in records[key]
                and has_rcbench()
                <= ("nonlinear" in records[key] and records[key].get("check", {}).get("version") == CHECK)
            ):
                continue  # kept (one from before validation, nonlinear memory or the float64 check is run again)
            print(f"memory capacity {key}", file=sys.stderr, flush=True)
            started = time.perf_counter()
            record = (windowed if is_windowed(name) else continuous)(name, seed, opts, **how)
            records[key] = {**record, "options": opts, "seconds": round(time.perf_counter() - started, 1)}
            if params is not None:
                records[key]["params"] = params
            store.write_text(json.dumps(records, indent=1) + "\n")
    (args.out / "memory.md").write_text(render(records, args, rows))
    plot(records, args, rows, args.out / "memory_capacity.png")
    print(args.out / "memory.md")


if __name__ == "__main__":
    main()

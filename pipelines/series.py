"""Reservoir computing's home tasks, every reservoir tuned with the same budget: Mackey-Glass and NARMA-10
one-step forecasting, and linear memory capacity (``memory.py``).

    python series.py --out ../docs/results/series --trials 8 --seeds 3      # make -C pipelines series

Two protocols, both reported:

- ``windowed``: the windows every backbone reads (``--window`` steps, one-step-ahead target),
  ``reservoir extract`` (float32, every depth) then ``reservoir fit --head ridge`` at every depth, the depth
  chosen on validation; the baselines (train mean, a ridge on the raw window, random tanh features of it)
  read the same windows. An ESN restarts from a zero state at every window.
- ``continuous``: the field's protocol for an echo state network: one run over the whole series from a zero
  state, its ``washout`` first steps (the task's) never read, the states at the same train, validation and
  test steps read by the same ridge head. Ours (:func:`reservoir.model.backbones.esn.series_states`, every
  unit reading the input) and reservoirpy's ``Reservoir`` (its defaults: a tenth of the units read it) run it.

NARMA-10's inputs are fed centred, ``4 u - 1`` (the task's ``centred`` option), Mackey-Glass is scaled to
[-1, 1] already. Every model's free settings (:data:`MODELS`) are searched with the same number of trials
(``--trials``, quasi-random: ``tuning.py``) on seed 0, chosen by the lowest validation NRMSE, and the chosen setting is
run on ``--seeds`` seeds (each its own series and weights; seed 0, the search's, among them: its score is the chosen
trial's); every ridge penalty is chosen on validation
from the head's grid, in every trial. Trials are kept in ``--out``'s ``trials.jsonl`` and reused by a rerun;
``--models``, ``--tasks``, ``--n-train`` and ``--protocols`` choose what runs, the tables are rendered from
every trial the ledger holds.

A choice at the end of the values tried and in the outer tenth of its range is marked an edge in the table;
``--beyond-edges`` runs the scales one and two tenths of the range past it on seed 0, as a check that chooses
nothing. Where that check found better scales (the random GPT-2's input scale on NARMA-10), the model is
searched again over a range that holds them, with the same number of trials, as a row of its own
(``gpt2-random-low``); the row searched over the common range stays.

Written to ``--out``: ``series.md`` (the tables), ``trials.jsonl`` (every trial) and ``series.json`` (the
command, the machine, the budget).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import loguniform, uniform
from tuning import Ledger, beyond, draws, edges, identity, lowest_first, search

HERE = Path(__file__).parent

#: the version of the scoring a trial ran (``tuning.Ledger``): 2 since the ridge head sums its statistics about a
#: shift (``reservoir.probe.ridge``), which changed the readout of features far from zero; trials of 1 are run again
SCORING = 2
#: an ESN's leak rate, spectral radius, input scaling and bias scaling
ESN_SPACE = {
    "lr": uniform(0.1, 0.9),
    "sr": uniform(0.1, 1.4),
    "input_scaling": loguniform(0.01, 3.0),
    "bias_scaling": uniform(0.0, 1.0),
}
#: the std of a backbone's frozen input layer (``--input-scale``; the paper's is about 0.05 a weight)
INPUT_SCALE_SPACE = {"input_scale": loguniform(0.005, 5.0)}
#: the std of the random tanh features' pre-activations
TANH_SPACE = {"scale": loguniform(0.03, 10.0)}


@dataclass(frozen=True)
class Model:
    label: str
    protocols: tuple[str, ...]
    space: dict[str, Any] = field(default_factory=dict)
    units: int | None = None  # an ESN's
    backbone: str | None = None  # what extract runs, where it is not the model's name


MODELS = {
    "esn-100": Model("ESN, 100 units", ("windowed", "continuous"), ESN_SPACE, 100),
    "esn": Model("ESN, 768 units (GPT-2 small's width)", ("windowed", "continuous"), ESN_SPACE, 768),
    "reservoirpy": Model(
        "reservoirpy's own ESN, 100 units, its defaults (a tenth of the units read the input)",
        ("continuous",),
        ESN_SPACE,
        100,
    ),
    "lstm": Model("LSTM, 3 layers of 768, random", ("windowed",), INPUT_SCALE_SPACE),
    "gpt2-random": Model("GPT-2 small shape, random", ("windowed",), INPUT_SCALE_SPACE),
    "gpt2-random-low": Model(
        "GPT-2 small shape, random; input scale searched over 1e-4 to 1",
        ("windowed",),
        {"input_scale": loguniform(1e-4, 1.0)},
        backbone="gpt2-random",
    ),
    "smollm2-135m": Model("SmolLM2-135M, language-pretrained", ("windowed",), INPUT_SCALE_SPACE),
    "smollm2-135m-random": Model("SmolLM2-135M shape, random", ("windowed",), INPUT_SCALE_SPACE),
    "tanh": Model(
        "baseline: random tanh features of the raw window (768 wide, with a bias)", ("windowed",), TANH_SPACE
    ),
    "raw": Model("baseline: ridge on the raw window", ("windowed",)),
    "mean": Model("baseline: train mean", ("windowed",)),
}
TASKS = {"mackey_glass": "Mackey-Glass (tau 17)", "narma10": "NARMA-10"}
PROTOCOLS = ("windowed", "continuous")
#: the published figures set beside ours: task -> (figure, protocol, source, how it compares)
LITERATURE = {
    "mackey_glass": [
        (
            "NRMSE about 0.0089 (R^2 0.99992)",
            "ESN of 100 units, sr 1.25, leak 0.3, ridge 1e-5; 2,000 steps, the last 20% tested, one step ahead",
            "reservoirpy's README",
            "the same series and definition of NRMSE (sqrt(1 - R^2)); 1,600 training steps, the first 100 a "
            "warmup, the setting fixed, not tuned",
        ),
    ],
    "narma10": [
        (
            "NRMSE about 0.1 to 0.35",
            "ESNs of 100 to 400 units, no leak, spectral radius below 1, tuned input scaling, one continuous "
            "run after a washout, several thousand training steps",
            "e.g. Rodan and Tino 2011 (IEEE TNN 22)",
            "the classic Atiya-Parlos statement (sum of y[t-9..t], u[t-9] u[t]); ours is reservoirpy's variant "
            "(module reservoir.tasks.series), so a level, not a digit, compares",
        ),
        (
            "NRMSE 0.15",
            "delay reservoir of 400 virtual nodes, continuous run",
            "Appeltant et al. 2011 (Nature Communications 2, 468)",
            "a physical-style single-node reservoir, not an ESN",
        ),
    ],
}


def task_options(task: str, args, n_train: int) -> dict[str, Any]:
    opts = {"n_train": n_train, "n_val": args.n_val, "n_test": args.n_test, "window": args.window}
    return {**opts, "centred": True} if task == "narma10" else opts


#: settings fixed, not searched, where they differ from the defaults (part of a trial's identity): under the
#: continuous protocol every unit of our ESN reads the input, as the field's ESNs do (one input through
#: reservoirpy's default sparse ``Win`` reaches a tenth of the units)
FIXED = {
    ("continuous", "esn-100"): {"input_connectivity": 1.0},
    ("continuous", "esn"): {"input_connectivity": 1.0},
    ("windowed", "tanh"): {"bias": "N(0, 1)"},  # trials of the features without a bias are not these
}


def esn_config(model: Model, params: dict[str, Any], fixed: dict[str, Any]):
    from reservoir.model.backbones.esn import ESNConfig

    return ESNConfig(units=model.units, **fixed, **params)


def esn_name(model: Model, params: dict[str, Any]) -> str:
    return f"esn:units={model.units}," + ",".join(f"{k}={v}" for k, v in sorted(params.items()))


def windowed_backbone(name: str, params: dict[str, Any]) -> tuple[str, Any]:
    """What ``extract`` runs for model ``name`` at ``params`` under the windowed protocol: the backbone and its
    input scale (an ESN's settings are in its name; a backbone's input scale is searched)."""
    from reservoir.config import parse_input_scale

    model = MODELS[name]
    if model.units:
        return esn_name(model, params), "paper"
    return model.backbone or name, parse_input_scale(params["input_scale"])


def scored(rows: dict[str, tuple[np.ndarray, np.ndarray]], seed: int) -> dict[str, Any]:
    """The ridge head on ``rows`` (split -> features, labels): penalty chosen on ``val``, scored on ``test``."""
    from reservoir.probe.heads import fit_probe
    from reservoir.probe.rows import ArrayRows

    train, val, test = (ArrayRows(*rows[s]) for s in ("train", "val", "test"))
    r, _ = fit_probe("ridge", train, {"test": test}, val=val, seed=seed)
    return {
        "val_nrmse": r["val_score"],
        "test_nrmse": r["test_score"],
        "test_r2": r["test_metrics"]["r2"],
        "alpha": r["hyperparameters"]["alpha"],
        "depth": None,
    }


def continuous_run(task: str, name: str, opts: dict[str, Any]):
    """A trial's run under the continuous protocol (module docstring)."""
    from reservoir.model.backbones.esn import series_states
    from reservoir.tasks import make_task

    model = MODELS[name]

    def run(params: dict[str, Any], seed: int) -> dict[str, Any]:
        t = make_task(task, opts, seed)
        inputs, targets = t.series(t.stretches()[1])
        if name == "reservoirpy":
            from reservoirpy.mat_gen import uniform as bias_draw
            from reservoirpy.nodes import Reservoir

            b = params["bias_scaling"]
            esn = Reservoir(
                units=model.units,
                lr=params["lr"],
                sr=params["sr"],
                input_scaling=params["input_scaling"],
                bias=bias_draw(low=-b, high=b),
                seed=seed,
            )
            states = esn.run(inputs[:, None])
        else:
            states = series_states(
                esn_config(model, params, FIXED[("continuous", name)]), inputs[:, None], seed
            )
        steps = {s: t.last_steps(s) for s in ("train", "val", "test")}
        return scored(
            {s: (states[i], targets[i + t.horizon].astype(np.float32)) for s, i in steps.items()}, seed
        )

    return run


def windowed_run(task: str, name: str, opts: dict[str, Any]):
    """A trial's run under the windowed protocol (module docstring): a baseline in memory, a backbone through
    ``extract`` and ``fit`` (its features file removed after the fit: the ledger keeps the trial)."""

    def baseline(params: dict[str, Any], seed: int) -> dict[str, Any]:
        from reservoir.probe.baselines import raw_inputs, tanh_features
        from reservoir.probe.metrics import nrmse, r2
        from reservoir.tasks import make_task

        t = make_task(task, opts, seed)
        data = {s: t.read(s, Path(".")) for s in ("train", "val", "test")}
        if name == "mean":
            mean = float(data["train"].labels.mean())
            pred = {s: np.full(len(d.labels), mean) for s, d in data.items()}
            return {
                "val_nrmse": nrmse(pred["val"], data["val"].labels),
                "test_nrmse": nrmse(pred["test"], data["test"].labels),
                "test_r2": r2(pred["test"], data["test"].labels),
                "alpha": None,
                "depth": None,
            }
        raw = {s: raw_inputs(t, d) for s, d in data.items()}
        X = raw if name == "raw" else tanh_features(raw, 768, seed, params["scale"])
        return scored({s: (X[s], d.labels) for s, d in data.items()}, seed)

    def backbone(params: dict[str, Any], seed: int) -> dict[str, Any]:
        from reservoir.config import ExtractConfig, FitConfig
        from reservoir.extract.run import extract
        from reservoir.probe.fit import fit

        bb, scale = windowed_backbone(name, params)
        cfg = ExtractConfig(
            task=task, backbone=bb, seed=seed, task_options=opts, dtype="float32", input_scale=scale
        )
        features = Path(extract(cfg, progress=False))
        fitted = fit(
            FitConfig(
                task=task, backbone=bb, features=str(features), head="ridge", seed=seed, baselines=False
            ),
            progress=False,
        )
        features.unlink(missing_ok=True)
        best = min(fitted, key=lambda r: (*lowest_first(r["val_score"]), r["depth"]))
        return {
            "val_nrmse": best["val_score"],
            "test_nrmse": best["test_score"],
            "test_r2": best["test_metrics"]["r2"],
            "alpha": best["hyperparameters"]["alpha"],
            "depth": best["depth"],
            "by_depth": {str(r["depth"]): [r["val_score"], r["test_score"]] for r in fitted},
        }

    return baseline if name in ("tanh", "raw", "mean") else backbone


def key_of(task: str, protocol: str, name: str, opts: dict[str, Any]) -> dict[str, Any]:
    """What names a model's trials besides their settings and seed (``tuning.identity``)."""
    fixed = FIXED.get((protocol, name))
    return {
        "task": task,
        "protocol": protocol,
        "model": name,
        "options": opts,
        **({"fixed": fixed} if fixed else {}),
    }


class Missing(Exception):
    """A trial the ledger does not hold (rendering runs nothing)."""


def collected(ledger: Ledger, task: str, protocol: str, name: str, opts, trials: int, seeds: int):
    """The search of one model as the ledger holds it (``None`` where a trial of it is missing)."""

    def absent(params, seed):
        raise Missing

    try:
        return search(
            ledger, key_of(task, protocol, name, opts), MODELS[name].space, absent, trials=trials, seeds=seeds
        )
    except Missing:
        done = sum(
            identity(key_of(task, protocol, name, opts), p, 0) in ledger.trials
            for p in draws(MODELS[name].space, trials)
        )
        return {"partial": done}


def past_edges(model: Model, got: dict[str, Any]) -> list[dict[str, Any]]:
    """The settings past the edges of a finished search's choice (:func:`tuning.beyond`), run on seed 0 by
    ``--beyond-edges``."""
    return beyond(
        model.space, got["best"], edges(model.space, got["best"], [r["params"] for r in got["trials"]])
    )


def edge_row(ledger: Ledger, key: dict[str, Any], where: str, got: dict[str, Any], past: list) -> str | None:
    """The row of the table "past the edge" (``where``: its first cells): the choice's validation NRMSE, then
    that of each setting ``past`` its edge, as the ledger holds them."""
    if not past:
        return None
    chosen = next(r for r in got["trials"] if r["params"] == got["best"])
    cells = []
    for p in past:
        moved = ", ".join(f"{k} {v}" for k, v in p.items() if v != got["best"].get(k))
        record = ledger.trials.get(identity(key, p, 0))
        cells.append(f"{moved}: " + (f"{record['val_nrmse']:.3g}" if record else "not run"))
    best = ", ".join(f"{k} {got['best'][k]}" for k in past[0] if past[0][k] != got["best"][k])
    return f"{where} {best}: {chosen['val_nrmse']:.3g} | " + " | ".join(cells) + " |"


def spread(values: list[float]) -> str:
    """Mean ± standard deviation over seeds, three significant digits."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return f"{mean:.3g}"
    return f"{mean:.3g} ± {float(np.std(values, ddof=1)):.2g}"


def columns(args) -> list[tuple[str, int]]:
    return [(p, n) for p in PROTOCOLS for n in args.n_train]


def render(ledger: Ledger, args) -> str:
    """The tables: test NRMSE per task, model, protocol and training size; the settings chosen and the
    search's spread; the literature."""
    md = [
        f"Test NRMSE (RMSE over the targets' standard deviation; 0 is perfect, 1 the train mean's level), mean "
        f"± standard deviation over {args.seeds} seeds (each its own series and random weights) of the setting "
        f"chosen on validation by a quasi-random (Sobol) search of {args.trials} trials on seed 0, the same number for every "
        "model with free settings (the ridge penalty chosen on validation in every trial, for every model; a "
        "backbone's depth too). Seed 0, the search's, is one of the seeds: its test score is that of the trial the "
        "search chose on validation, and so a little optimistic (over the 55 cells the ledger held on 2026-11-30, "
        "seeds 1 and 2 scored 15% worse than seed 0 on average; the median cell was level). "
        f"{args.n_val} validation and {args.n_test} test steps, one step ahead; windows of {args.window} steps. "
        "'not run': the search did not fit the time it was given (k/N: trials done); '-': the protocol does "
        "not apply.",
        "",
    ]
    cols = columns(args)
    header = "| model | " + " | ".join(f"{p}, {n} train" for p, n in cols) + " |"
    chosen: list[str] = []
    past: list[str] = []
    stale = 0
    for task in args.all_tasks:
        md += [f"**{TASKS[task]}**", "", header, "|---|" + "---|" * len(cols)]
        for name, model in MODELS.items():
            cells = []
            for protocol, n in cols:
                if protocol not in model.protocols:
                    cells.append("-")
                    continue
                got = collected(
                    ledger, task, protocol, name, task_options(task, args, n), args.trials, args.seeds
                )
                if "partial" in got:
                    budget = len(draws(model.space, args.trials))
                    cells.append(f"not run ({got['partial']}/{budget})" if got["partial"] else "not run")
                    continue
                tests = [r["test_nrmse"] for r in got["seeds"]]
                depths = sorted({r["depth"] for r in got["seeds"] if r.get("depth") is not None})
                note = f" (depth {','.join(map(str, depths))})" if depths else ""
                old = any(ledger.stale(r) for r in got["trials"] + got["seeds"])
                stale += old
                cells.append(
                    spread(tests)
                    + note
                    + ("" if len(tests) == args.seeds else f" [{len(tests)} seeds]")
                    + (" †" if old else "")
                )
                where = f"| {TASKS[task]} | {model.label} | {protocol}, {n} |"
                edge = edges(model.space, got["best"], [r["params"] for r in got["trials"]])
                key = key_of(task, protocol, name, task_options(task, args, n))
                row = edge_row(ledger, key, where, got, beyond(model.space, got["best"], edge))
                past += [row] if row else []
                vals = sorted((r["val_nrmse"] for r in got["trials"]), key=lowest_first)
                chosen.append(
                    f"{where} "
                    + (
                        ", ".join(
                            f"{k} {v}" + (f" ({edge[k]})" if k in edge else "")
                            for k, v in got["best"].items()
                        )
                        or "nothing to tune"
                    )
                    + f" | {vals[0]:.3g} / {vals[len(vals) // 2]:.3g} / {vals[-1]:.3g} |"
                )
            md.append(f"| {model.label} | " + " | ".join(cells) + " |")
        md.append("")
    md += [
        *(
            [
                f"†: {stale} cell(s) hold trials scored before the ridge head summed its statistics about a "
                "shift, which reads features far from zero more exactly (their NRMSE may differ from what the "
                "head gives now, and their search chose on those scores); the next `make -C pipelines series` "
                "runs them again.",
                "",
            ]
            if stale
            else []
        ),
        "Settings chosen on validation (seed 0) and the spread of the search: the validation NRMSE of its best, "
        "median and worst trial. '(low edge)' or '(high edge)': the chosen value is the lowest (highest) "
        "tried and lies in the outer tenth of the range searched (by its distribution's quantile), so a wider "
        "range might choose further out.",
        "",
        "| task | model | protocol, train steps | chosen | validation NRMSE: best / median / worst |",
        "|---|---|---|---|---|",
        *chosen,
        "",
        "Past the edge: where a choice is at an edge, the scale (a log-uniform setting) moved out by one and by "
        "two tenths of its range's span, the other settings kept, on seed 0 (`--beyond-edges`); validation "
        "NRMSE, lower is better. These trials choose nothing: the tables above stand as searched.",
        "",
        "| task | model | protocol, train steps | chosen: validation NRMSE | one tenth further | two tenths further |",
        "|---|---|---|---|---|---|",
        *past,
        "",
        "Published figures beside ours:",
        "",
        "| task | figure | protocol | source | how it compares with ours |",
        "|---|---|---|---|---|",
    ]
    for task in args.all_tasks:
        md += [f"| {TASKS[task]} | {' | '.join(row)} |" for row in LITERATURE[task]]
    return "\n".join(md) + "\n"


def threads_text(trials) -> str:
    """How many threads the trials ran on, as the ledger records it (trials before it recorded threads: unrecorded)."""
    counts = Counter(r.get("threads") for r in trials)
    said = [
        f"{n} on {k} thread{'s' if k > 1 else ''}" for k, n in sorted((k, n) for k, n in counts.items() if k)
    ]
    if counts.get(None):
        said.append(f"{counts[None]} with their threads unrecorded")
    return "trials: " + ", ".join(said)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "results" / "series")
    parser.add_argument("--home", type=Path, default=HERE / "out" / "series")
    parser.add_argument("--trials", type=int, default=8, help="trials of every model's search (its budget)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--n-train", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--n-val", type=int, default=300)
    parser.add_argument("--n-test", type=int, default=500)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    parser.add_argument(
        "--render", action="store_true", help="write series.md again from the ledger (no run)"
    )
    parser.add_argument(
        "--beyond-edges",
        action="store_true",
        help="after each finished search, run the scales past the edges of its choice on seed 0 (a check)",
    )
    args = parser.parse_args()
    args.all_tasks = list(TASKS)
    os.environ["RESERVOIR_HOME"] = str(args.home)
    ledger = Ledger(args.out / "trials.jsonl", scoring=SCORING)
    if not args.render:
        for task in args.tasks:
            for n in args.n_train:
                opts = task_options(task, args, n)
                for protocol in args.protocols:
                    for name in args.models:
                        if protocol not in MODELS[name].protocols:
                            continue
                        print(f"{task} {protocol} {n} {name}", file=sys.stderr, flush=True)
                        run = (continuous_run if protocol == "continuous" else windowed_run)(task, name, opts)
                        key = key_of(task, protocol, name, opts)
                        got = search(
                            ledger, key, MODELS[name].space, run, trials=args.trials, seeds=args.seeds
                        )
                        if args.beyond_edges:
                            for p in past_edges(MODELS[name], got):
                                ledger.trial(key, p, 0, run, "past the edge")
    args.out.mkdir(parents=True, exist_ok=True)
    ledger.keep_stale = True  # the tables hold what the ledger holds, stale trials marked
    (args.out / "series.md").write_text(render(ledger, args))
    about_path = args.out / "series.json"
    about = json.loads(about_path.read_text()) if about_path.exists() else {}
    if ledger.ran or "machine" not in about:
        from reservoir.runtime import machine

        about["machine"] = machine.on("cpu")
    seconds = sum(r["seconds"] for r in ledger.trials.values())
    about = {
        "command": "make -C pipelines series",
        "machine": about["machine"],
        "wall_time": f"Compute: {seconds / 60:.0f} min summed over the {len(ledger.trials)} trials of the ledger "
        f"(features extracted and fitted; {threads_text(ledger.trials.values())}), on {about['machine']}.",
        "trials": args.trials,
        "seeds": args.seeds,
    }
    about_path.write_text(json.dumps(about, indent=1) + "\n")
    print(args.out / "series.md")


if __name__ == "__main__":
    main()

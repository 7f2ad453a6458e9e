"""Reservoir computing's home tasks: Mackey-Glass and NARMA-10 one-step forecasting, every backbone.

    python series.py --out ../docs/results/series            # make -C pipelines series

For each task, seed and backbone: ``reservoir extract`` (windows of ``--window`` steps, float32, every
depth), ``reservoir fit --head ridge`` at every depth (the penalty chosen on the validation stretch) and
the baselines of the same data (the train mean, a ridge readout of the raw window, random tanh features
of the raw window). Each seed generates its own series and draws its own random weights. Beside them,
reservoirpy's own echo state network in its reference setting (``Reservoir(100, sr=1.25, lr=0.3)``, a
``Ridge`` readout whose penalty is chosen on the same validation steps), run the way reservoirpy runs it:
over the whole series in one pass, scored on the same test steps.

A setting's number is its test NRMSE at the depth chosen on validation (lowest validation NRMSE),
mean and standard deviation over the seeds. Written to ``--out``: ``series.md`` (the table),
``series.csv`` (one line per task, setting, seed and depth) and ``series.json`` (the command, the
machine and the wall time). Features and results go under ``--home`` (``RESERVOIR_HOME``), reused when
nothing changed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent

BACKBONES = {
    "esn:units=100,sr=1.25,lr=0.3": "ESN, reservoirpy's reference setting (100 units)",
    "esn": "ESN, 768 units (GPT-2 small's width)",
    "lstm": "LSTM, 3 layers of 768, random",
    "gpt2-random": "GPT-2 small shape, random",
    "smollm2-135m": "SmolLM2-135M, language-pretrained",
    "smollm2-135m-random": "SmolLM2-135M shape, random",
}
TASKS = {"mackey_glass": "Mackey-Glass (tau 17)", "narma10": "NARMA-10"}
BASELINES = {
    "baseline-majority": "baseline: train mean",
    "baseline-raw": "baseline: ridge on the raw window",
}


def task_options(args) -> dict[str, int]:
    return {"n_train": args.n_train, "n_val": args.n_val, "n_test": args.n_test, "window": args.window}


def run_backbone(task: str, backbone: str, seed: int, args) -> list[dict]:
    """Extract and fit one (task, backbone, seed); returns its results (depths, then baselines)."""
    from reservoir.config import ExtractConfig, FitConfig
    from reservoir.extract.run import extract
    from reservoir.probe.fit import fit

    cfg = ExtractConfig(
        task=task, backbone=backbone, seed=seed, task_options=task_options(args), dtype="float32"
    )
    features = extract(cfg, progress=False)
    return fit(
        FitConfig(task=task, backbone=backbone, features=str(features), head="ridge", seed=seed),
        progress=False,
    )


def reservoirpy_reference(task: str, seed: int, args) -> dict:
    """reservoirpy's ESN in its reference setting over the whole series in one pass: states of every
    step, a Ridge readout fitted on the train steps for each penalty, the penalty with the lowest NRMSE
    on the validation steps refitted on train and validation, scored on the test steps."""
    from reservoirpy.nodes import Reservoir, Ridge

    from reservoir.probe.metrics import nrmse, r2
    from reservoir.tasks import make_task

    t = make_task(task, task_options(args), seed)
    inputs, targets = t.series(t.stretches()[1])
    states = Reservoir(units=100, sr=1.25, lr=0.3, seed=seed).run(inputs[:, None])
    steps = {split: t.last_steps(split) for split in ("train", "val", "test")}  # the task's own label steps

    def fitted(ridge, names):
        rows = np.concatenate([steps[s] for s in names])
        return Ridge(ridge=ridge).fit(states[rows], targets[rows + t.horizon, None])

    def scored(model, split):
        return model.run(states[steps[split]])[:, 0], targets[steps[split] + t.horizon]

    grid = (1e-8, 1e-6, 1e-4, 1e-2, 1.0)
    val = {r: nrmse(*scored(fitted(r, ["train"]), "val")) for r in grid}
    best = min(grid, key=lambda r: val[r])
    pred, y = scored(fitted(best, ["train", "val"]), "test")
    return {"val": val[best], "test": nrmse(pred, y), "r2": r2(pred, y), "ridge": best}


def spread(values: list[float]) -> str:
    """Mean and standard deviation over seeds, three significant digits (NRMSE spans 1e-5 to 1)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return f"{mean:.3g}"
    return f"{mean:.3g} ± {float(np.std(values, ddof=1)):.2g}"


def by_setting(lines: list[dict]) -> dict[tuple[str, str], list[tuple[float, float, int | None]]]:
    """Per (task, setting), one ``(test NRMSE, test R^2, depth)`` a seed: a backbone's at the depth with the
    lowest validation NRMSE (the shallower on ties); a baseline's and reservoirpy's as they are (a baseline
    shared by several backbones' fits of one seed counted once)."""
    per: dict[tuple[str, str, int], list[dict]] = {}
    for line in lines:
        per.setdefault((line["task"], line["setting"], int(line["seed"])), []).append(line)
    table: dict[tuple[str, str], list[tuple[float, float, int | None]]] = {}
    for (task, setting, _seed), rows in sorted(per.items()):
        if rows[0]["depth"] in (None, ""):
            row, depth = rows[0], None
        else:
            row = min(rows, key=lambda r: (float(r["val_nrmse"]), int(r["depth"])))
            depth = int(row["depth"])
        table.setdefault((task, setting), []).append((float(row["test_nrmse"]), float(row["test_r2"]), depth))
    return table


def render(lines: list[dict], about: dict) -> str:
    """The markdown table of ``lines`` (the CSV's), with the sizes and seeds ``about`` records."""
    tasks = list(dict.fromkeys(line["task"] for line in lines))
    table = by_setting(lines)
    sizes = about["sizes"]
    md = [
        "Test NRMSE (the RMSE over the targets' standard deviation; 0 is perfect, 1 is the train mean's level) "
        f"at the depth chosen on validation, mean ± standard deviation over {about['seeds']} seeds (each seed "
        "its own series and its own random weights); R^2 beside it, and the depths chosen. "
        f"{sizes['n_train']} training, {sizes['n_val']} validation and {sizes['n_test']} test windows of "
        f"{sizes['window']} steps, one-step-ahead targets, float32 features, ridge readout.",
        "",
        "| setting | " + " | ".join(f"{TASKS[t]}: NRMSE | R^2 | depths chosen" for t in tasks) + " |",
        "|---|" + "---|---|---|" * len(tasks),
    ]
    settings = list(dict.fromkeys(line["setting"] for line in lines))
    order = [s for s in BACKBONES if s in settings] + ["reservoirpy"]
    order += [s for s in BASELINES if s in settings] + sorted(
        s for s in settings if s.startswith("baseline-tanh")
    )
    labels = {
        **BACKBONES,
        **BASELINES,
        "reservoirpy": "reservoirpy's own ESN (100 units, sr 1.25, lr 0.3), one pass",
    }
    for setting in order:
        label = labels.get(setting, f"baseline: random tanh features ({setting.rsplit('-', 1)[-1]} wide)")
        cells = []
        for task in tasks:
            got = table.get((task, setting), [])
            depths = sorted({d for _, _, d in got if d is not None})
            cells += (
                [spread([v for v, _, _ in got]), spread([r for _, r, _ in got]), ",".join(map(str, depths))]
                if got
                else ["", "", ""]
            )
        md.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(md) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "results" / "series")
    parser.add_argument("--home", type=Path, default=HERE / "out" / "series")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--n-val", type=int, default=300)
    parser.add_argument("--n-test", type=int, default=500)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--backbones", nargs="+", default=list(BACKBONES), help="backbone names")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--render", action="store_true", help="write series.md again from --out's series.csv")
    args = parser.parse_args()
    os.environ["RESERVOIR_HOME"] = str(args.home)

    if args.render:  # the table again from the kept CSV (no run)
        with open(args.out / "series.csv", newline="") as f:
            lines = list(csv.DictReader(f))
        about = json.loads((args.out / "series.json").read_text())
        (args.out / "series.md").write_text(render(lines, about))
        print(args.out / "series.md")
        return
    started = time.perf_counter()
    lines = []
    for task in args.tasks:
        for seed in range(args.seeds):
            for backbone in args.backbones:
                print(f"{task} seed {seed} {backbone}", file=sys.stderr, flush=True)
                for r in run_backbone(task, backbone, seed, args):
                    lines.append(
                        {
                            "task": task,
                            "setting": r["backbone"] if r["mode"] == "baseline" else backbone,
                            "seed": seed,
                            "depth": r["depth"],
                            "val_nrmse": r["val_score"],
                            "test_nrmse": r["test_score"],
                            "test_r2": r["test_metrics"]["r2"],
                            "hyperparameters": json.dumps(r["hyperparameters"]),
                        }
                    )
            ref = reservoirpy_reference(task, seed, args)
            lines.append(
                {
                    "task": task,
                    "setting": "reservoirpy",
                    "seed": seed,
                    "depth": None,
                    "val_nrmse": ref["val"],
                    "test_nrmse": ref["test"],
                    "test_r2": ref["r2"],
                    "hyperparameters": json.dumps({"ridge": ref["ridge"]}),
                }
            )
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "series.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)
    from reservoir.runtime import machine

    seconds = time.perf_counter() - started
    about = {
        "command": "make -C pipelines series",
        "wall_time": f"Wall time: {seconds / 60:.1f} min on {machine.on('cpu')}.",
        "seeds": args.seeds,
        "sizes": task_options(args),
    }
    (args.out / "series.json").write_text(json.dumps(about, indent=1) + "\n")
    (args.out / "series.md").write_text(render(lines, about))
    print(args.out / "series.md")


if __name__ == "__main__":
    main()

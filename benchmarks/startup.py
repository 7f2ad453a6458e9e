"""Start-up to the first batch of ``reservoir extract``, by phase, for two checkouts interleaved in one run.

    git worktree add ../before COMMIT
    .venv/bin/python benchmarks/startup.py --before ../before --after . --reps 3
    .venv/bin/python benchmarks/startup.py --after . --reps 3 -- --task digits --backbone esn

Each timing is a fresh process (``PYTHONPATH`` the checkout, ``OMP_NUM_THREADS`` ``--threads``) running
``reservoir extract`` with the arguments after ``--`` (default: ``--task digits --backbone gpt2-random
--limit 500``) into a temporary file, with ``--force``, so every run prepares from scratch on a warm
machine (the operating system's file cache and the reservoir cache filled by a first, untimed run). The
process stops once the first batch's features are in hand. Its phases:

- **interpreter**: from starting the process to the first line of the child (Python itself, ``site``);
- **imports**: importing the command line and the extraction module (``reservoir.cli``,
  ``reservoir.extract.run``) and parsing the options;
- **data**: making the task and loading its splits;
- **backbone**: building the backbone (its imports, the model's code, its weights);
- **decisions**: the rest of preparing (dtype, engine, identity, output file) and building the runner;
- **first batch**: from the runner built to the first batch's features.

The checkouts alternate (before, after, then after, before) in every repetition; each phase is reported
as the median over repetitions, with the ratio of the totals before/after. ``--json`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from child import tagged_json  # benchmarks/child.py, beside this script

DEFAULT = ["--task", "digits", "--backbone", "gpt2-random", "--limit", "500"]
PHASES = ["interpreter", "imports", "data", "backbone", "decisions", "first batch"]

CHILD = r"""
import json, os, sys, time
began = time.time()
marks = {"began": began}
from reservoir import cli
from reservoir.extract import run as run_module
marks["imports"] = time.time()

def wrap(owner, name, mark):
    real = getattr(owner, name)
    def timed(*a, **k):
        out = real(*a, **k)
        marks.setdefault(mark, time.time())
        return out
    setattr(owner, name, timed)

def parsed():
    marks.setdefault("parsed", time.time())

real_extract = run_module.extract
def extract(*a, **k):
    parsed()
    return real_extract(*a, **k)
run_module.extract = extract
wrap(run_module, "load_splits", "data")
wrap(run_module, "load_backbone", "backbone")
wrap(run_module.Run, "settled_runner", "runner")

def first(features):
    from reservoir.runtime.runner import resolve
    resolve(features)
    marks["first batch"] = time.time()
    print("MARKS " + json.dumps(marks), flush=True)
    os._exit(0)

from reservoir.runtime.runner import FeatureRunner
real_run = FeatureRunner.run_async
FeatureRunner.run_async = lambda self, batch, *store: first(real_run(self, batch, *store))
sys.argv = ["reservoir", "extract", *sys.argv[1:]]
cli.main(prog_name="reservoir")
"""


def timing(tree: Path, args: list[str], threads: int, home: Path) -> dict[str, float]:
    """One fresh process's phases, in seconds."""
    env = dict(
        os.environ,
        PYTHONPATH=str(tree.resolve()),
        OMP_NUM_THREADS=str(threads),
        RESERVOIR_HOME=str(home),
    )
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", CHILD, *args, "--out", f"{tmp}/f.h5", "--force"]
        start = time.time()
        m = tagged_json(
            cmd, "MARKS", env=env, cwd=tmp, what=f"{tree}: the run to its first batch", timeout=900
        )
    out = {
        "interpreter": m["began"] - start,
        "imports": m.get("parsed", m["imports"]) - m["began"],
        "data": m["data"] - m.get("parsed", m["imports"]),
        "backbone": m["backbone"] - m["data"],
        "decisions": m["runner"] - m["backbone"],
        "first batch": m["first batch"] - m["runner"],
    }
    out["to first batch"] = m["first batch"] - start
    return out


def table(results: dict[str, list[dict[str, float]]]) -> str:
    names = list(results)
    lines = [
        "| phase | " + " | ".join(f"{n} (s, median)" for n in names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for phase in [*PHASES, "to first batch"]:
        cells = [f"{statistics.median(r[phase] for r in results[n]):.2f}" for n in names]
        label = f"**{phase}**" if phase == "to first batch" else phase
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else DEFAULT
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, default=None, help="a checkout of the earlier code")
    p.add_argument("--after", type=Path, default=Path("."), help="a checkout of the later code")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--home", type=Path, default=None, help="RESERVOIR_HOME of the runs (default: a temporary one)"
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    trees = {"after": args.after} if args.before is None else {"before": args.before, "after": args.after}
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home or Path(tmp)
        for tree in trees.values():
            timing(tree, extra, args.threads, home)  # untimed: fills the caches a warm machine has
        load = os.getloadavg()[0]
        results: dict[str, list[dict[str, float]]] = {n: [] for n in trees}
        for rep in range(args.reps):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for name in order:
                results[name].append(timing(trees[name], extra, args.threads, home))
        load = (load, os.getloadavg()[0])
    print(
        f"reservoir extract {' '.join(extra)}; {args.threads} thread(s); {args.reps} reps; load {load[0]:.2f} -> {load[1]:.2f}"
    )
    print(table(results))
    if args.before is not None:
        total = {n: statistics.median(r["to first batch"] for r in results[n]) for n in results}
        print(f"\nbefore / after, to the first batch: {total['before'] / total['after']:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps({"args": extra, "threads": args.threads, "load": load, "runs": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

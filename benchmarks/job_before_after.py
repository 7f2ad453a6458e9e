"""``make gpu``'s whole-job step (``benchmarks/gpu.py --steps job``) for two checkouts, or for the feature
store's dtypes in one checkout, interleaved, by phase.

    git worktree add ../before COMMIT
    .venv/bin/python benchmarks/job_before_after.py --before ../before --after . --rows 60000 --reps 2
    .venv/bin/python benchmarks/job_before_after.py --before ../before --after . --full   # on a card
    .venv/bin/python benchmarks/job_before_after.py --store-dtypes float32,bfloat16 --rows 60000 --reps 2

Each repetition runs the job step in a fresh ``gpu.py`` for each checkout (this script's ``gpu.py``, the
checkout's ``reservoir``: ``RESERVOIR_CHECKOUT``), in alternating order. Without ``--full`` the step runs
in ``make gpu``'s CPU mode (``--small``: a 2-block GPT-2 of width 32 saved as a folder, MNIST-shaped
synthetic rows); ``--rows`` sets the job's rows. Printed: each phase's median over repetitions for
both checkouts, the whole job's best, its share of its limit (``gpu.py``'s ``job_limit``) and the load
average at the start and the end; ``--json`` keeps every repetition's ``job.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHOWN = [
    "preparing_s",
    "probe_and_decision_s",
    "first_batch_after_decision_s",
    "compiling_s",
    "steady_s",
    "waiting_for_writer_s",
    "finishing_s",
]


def job(tree: Path, rows: int, full: bool, threads: int, store: str = "float32") -> dict:
    """One job step of ``gpu.py`` with ``tree``'s reservoir, its features stored as ``store``; its ``job.json``."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, RESERVOIR_CHECKOUT=str(tree.resolve()), OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, str(HERE / "gpu.py"), "--steps", "job", "--job-rows", str(rows), "--out", out]
        cmd += ["--store-dtype", store]
        done = subprocess.run([*cmd, *([] if full else ["--small"])], env=env, capture_output=True, text=True)
        result = json.loads((Path(out) / "job.json").read_text()) if (Path(out) / "job.json").exists() else {}
    if result.get("status") != "ok":
        raise SystemExit(f"{tree}: the job step failed:\n{done.stdout[-2000:]}\n{result}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, default=None)
    p.add_argument("--after", type=Path, default=Path("."))
    p.add_argument(
        "--store-dtypes", default=None, help="compare these --store-dtype values (comma-separated) in --after"
    )
    p.add_argument("--rows", type=int, default=60_000)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--full", action="store_true", help="the full job (GPT-2 small's shape): on a card")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if (args.before is None) == (args.store_dtypes is None):
        p.error("give --before (two checkouts) or --store-dtypes (one checkout's store dtypes)")
    if args.before is not None:
        trees = {"before": (args.before, "float32"), "after": (args.after, "float32")}
    else:
        trees = {store: (args.after, store) for store in args.store_dtypes.split(",")}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    load = os.getloadavg()[0]
    for rep in range(args.reps):
        for name in list(trees) if rep % 2 == 0 else list(trees)[::-1]:
            runs[name].append(job(trees[name][0], args.rows, args.full, args.threads, trees[name][1]))
    print(
        f"{args.rows} rows, {'full' if args.full else 'CPU mode (--small)'}; {args.reps} reps; "
        f"load {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    print("| phase (s, median) | " + " | ".join(trees) + " |\n|---|" + "---|" * len(trees))
    for key in ["imports_s", *SHOWN]:
        cells = [f"{statistics.median(r['phases'].get(key, 0.0) for r in runs[n]):.2f}" for n in trees]
        print(f"| {key[:-2].replace('_', ' ')} | " + " | ".join(cells) + " |")
    best = {n: min(runs[n], key=lambda r: r["seconds"]) for n in trees}
    print("| **whole job (best)** | " + " | ".join(f"**{best[n]['seconds']:.2f}**" for n in trees) + " |")
    print("| share of its limit | " + " | ".join(f"{best[n]['limit']['share']:.3f}" for n in trees) + " |")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPT-2 extraction speed of two checkouts of reservoir, interleaved in one run.

    git worktree add ../before COMMIT
    .venv/bin/python benchmarks/before_after.py --before ../before --after . --reps 5

Each timing is a fresh process importing reservoir from one checkout (``PYTHONPATH``):
:class:`reservoir.runtime.runner.FeatureRunner` on ``gpt2-random`` (GPT-2 small's shape), engine
``torch``, eager, one thread, every depth, MNIST-shaped rows (``--rows`` rows of 64 tokens of 16
values in [0, 1]), one warm-up batch and ``--batches`` timed batches; it reports tokens/s of the
median batch and of the fastest. The checkouts alternate (before, after, then after, before) for
each dtype in every repetition, so that a load which drifts during the run falls on both; the
ratios after/before of the medians are printed, with the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, statistics, sys, time
import numpy as np
from reservoir.model.backbones import load_backbone
from reservoir.runtime.runner import FeatureRunner
from reservoir.tasks import TaskSpec

dtype, rows, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = TaskSpec(name="mnist-like", token_kind="dense", seq_len=64, n_classes=10, token_dim=16)
runner = FeatureRunner.build(spec, load_backbone("gpt2-random"), list(range(13)), seed=0, dtype=dtype, engine="torch")
rng = np.random.default_rng(0)
tokens = [rng.random((rows, 64, 16), dtype=np.float32) for _ in range(batches + 1)]
lengths = np.full(rows, 64, dtype=np.int64)
runner(tokens[0], lengths)
times = []
for x in tokens[1:]:
    start = time.perf_counter()
    runner(x, lengths)
    times.append(time.perf_counter() - start)
print(json.dumps({"median": rows * 64 / statistics.median(times), "fastest": rows * 64 / min(times)}))
"""


def timing(tree: Path, dtype: str, rows: int, batches: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", CHILD, dtype, str(rows), str(batches)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before")
    parser.add_argument("--after", type=Path, required=True, help="checkout of the code after")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    rates: dict[tuple[str, str, str], list[float]] = {}
    print("load average at start:", Path("/proc/loadavg").read_text().split()[:3], flush=True)
    for rep in range(args.reps):
        for dtype in ("float32", "bfloat16"):
            for name in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                result = timing(trees[name], dtype, args.rows, args.batches)
                for kind, rate in result.items():
                    rates.setdefault((dtype, kind, name), []).append(rate)
                print(rep, dtype, name, {k: round(v, 1) for k, v in result.items()}, flush=True)
    print("load average at end:", Path("/proc/loadavg").read_text().split()[:3])
    for dtype in ("float32", "bfloat16"):
        for kind in ("median", "fastest"):
            before, after = rates[(dtype, kind, "before")], rates[(dtype, kind, "after")]
            print(
                f"{dtype}, {kind} batch: before {statistics.median(before):.1f} tokens/s, after "
                f"{statistics.median(after):.1f}, after/before {statistics.median(after) / statistics.median(before):.3f}"
            )


if __name__ == "__main__":
    main()

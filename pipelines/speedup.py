"""Table 10's cost column: an output-only epoch on cached features against an end-to-end epoch.

    python speedup.py --features FILE --task mnist --backbone smollm2-135m --limit 1000 --data-dir DATA

Measured here, in one run, on the task's training rows (``--limit`` of them):

- the end-to-end epoch: ``reservoir train`` with the FPT's groups (input, positions, layer
  norms, output) for one pass over the training rows (steps of 32 examples, one validation
  pass at the end), its wall time as the command reports it;
- the extraction: ``reservoir extract`` of the same rows at every depth, wall time of the
  whole command (start-up, compile and writing included): paid once;
- an output-only epoch: a pass of the torch head (Adam, mini-batches of 256) over the cached
  features of the deepest block (20 epochs timed, set-up included, divided by 20), and the
  closed-form ridge head over every alpha of its grid.

Prints a markdown table. The extraction and the training run in a temporary folder, so the
pipeline's own files are never touched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent / "reservoir"


def timed(args: list[str], home: Path) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(
        [str(BIN), "-q", *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "RESERVOIR_HOME": str(home)},
    )
    return time.perf_counter() - start, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--features", type=Path, required=True, help="the pipeline's feature file of the task"
    )
    parser.add_argument("--task", required=True)
    parser.add_argument("--backbone", required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=32, help="end-to-end examples per step")
    args = parser.parse_args()

    from reservoir.api import read_features
    from reservoir.extract.store import open_features, stored_identity
    from reservoir.probe.heads import HEADS, fit_depth
    from reservoir.probe.torch_head import TorchHead

    with open_features(args.features) as f:
        identity = stored_identity(f)
    depth = identity["depths"][-1]
    X, y = read_features(args.features, "train", depth)
    n = len(y)
    common = [
        "--task",
        args.task,
        "--backbone",
        args.backbone,
        "--limit",
        str(args.limit),
        "--data-dir",
        str(args.data_dir),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        extract_s, _ = timed(["extract", *common, "--input-scale", identity["input_scale"]], Path(tmp))
        steps = math.ceil(n / args.batch_size)
        train_s, out = timed(
            [
                "train",
                *common,
                "--steps",
                str(steps),
                "--eval-every",
                str(steps),
                "--patience",
                "0",
                "--batch-size",
                str(args.batch_size),
                "--checkpoint-every",
                "0",
            ],
            Path(tmp),
        )
        result = json.loads(Path(out.strip().splitlines()[-1]).read_text())  # its last line names the result
    epochs = 20
    head = TorchHead(epochs=epochs, batch_size=256)
    start = time.perf_counter()
    head.fit(X, y)
    head_epoch_s = (time.perf_counter() - start) / epochs
    X3 = X[:, None, :]
    start = time.perf_counter()
    fit_depth("ridge", X3, y, X3[:1], y[:1])
    ridge_s = time.perf_counter() - start
    epoch_s = result["seconds"]
    from reservoir.runtime.machine import describe, load

    print(f"\n### Cost: output-only against end-to-end ({args.task}, {args.backbone}, {n} training rows)\n")
    print(f"Measured by `pipelines/speedup.py` on {describe()}; {load()}.\n")
    print("| step | seconds |\n|---|---|")
    print(
        f"| end-to-end: one epoch of `reservoir train` (FPT groups, batch {args.batch_size}, {steps} steps, one "
        f"validation pass), the run's own time | {epoch_s:.1f} |"
    )
    print(f"| the same, whole command (start-up and loading included) | {train_s:.1f} |")
    print(
        f"| extraction once: `reservoir extract`, every depth, train and test, whole command | {extract_s:.1f} |"
    )
    print(
        f"| output-only: one epoch of the torch head on cached features (depth {depth}; {epochs} epochs timed, "
        f"set-up included) | {head_epoch_s:.3f} |"
    )
    print(
        f"| output-only: ridge head, closed form, all {len(HEADS['ridge'].grid)} alphas (depth {depth}) "
        f"| {ridge_s:.3f} |"
    )
    print(
        f"\nPer epoch, the output-only head is {epoch_s / head_epoch_s:,.0f} times faster than end-to-end training; "
        f"with the extraction paid once, {10} epochs cost {extract_s + 10 * head_epoch_s:.0f} s output-only "
        f"against {10 * epoch_s:.0f} s end to end ({10 * epoch_s / (extract_s + 10 * head_epoch_s):.1f} times)."
    )


if __name__ == "__main__":
    main()

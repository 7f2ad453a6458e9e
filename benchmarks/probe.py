"""Does a faster dtype keep the probe's accuracy? MNIST or CIFAR-10 probes per compute dtype and engine.

    .venv/bin/python benchmarks/probe.py --data-dir DATA                      # 5,000 + 5,000 MNIST images
    .venv/bin/python benchmarks/probe.py --data-dir DATA --limit 10000 --runs float32:torch,int8:openvino
    .venv/bin/python benchmarks/probe.py --data-dir DATA --task cifar10                      # 5,000 + 5,000 CIFAR-10 images

For each run (``DTYPE:ENGINE``; by default float32 on PyTorch, the reference, then bf16 where
the CPU multiplies it natively, int8 and int8-static on OpenVINO) the script runs the whole
``reservoir extract --task TASK --limit N --backbone B`` command in a subprocess (every depth,
a fresh ``RESERVOIR_HOME``, so nothing is reused; its wall time and tokens/s are the job's,
start-up, conversion and writing included), then fits the same head per depth on each file
(``reservoir fit``, ``--head``, ridge by default) and reports the test accuracy at the depth
chosen on the validation split, beside float32's, and the features' relative error against
float32's per depth (norm-wise over the test split, worst depth).

The issue's rule: an int8 path may become a default only where its probe accuracy is within
0.5 points of float32's on at least 5,000 training examples.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reservoir import api  # noqa: E402
from reservoir.runtime.engines import relative_error  # noqa: E402
from reservoir.runtime.machine import describe, load  # noqa: E402
from reservoir.runtime.runner import resolve_dtype  # noqa: E402

#: tokens per example: MNIST's and CIFAR-10's 4 x 4 patches of a 32 x 32 image
TOKENS = 64


def default_runs() -> list[str]:
    runs = ["float32:torch", f"{resolve_dtype('auto')}:openvino"]  # the default float dtype, as measured here
    return runs + ["int8:openvino", "int8-static:openvino"]


def extract(run: str, args, home: Path) -> tuple[Path, float]:
    dtype, engine = run.split(":")
    env = {**os.environ, "RESERVOIR_HOME": str(home)}
    cmd = [
        str(Path(sys.executable).parent / "reservoir"),
        "--quiet",
        "extract",
        "--task",
        args.task,
        "--limit",
        str(args.limit),
        "--backbone",
        args.backbone,
        "--dtype",
        dtype,
        "--engine",
        engine,
        "--data-dir",
        str(args.data_dir),
    ]
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return Path(out.stdout.strip().splitlines()[-1]), seconds


def test_features(path: Path) -> np.ndarray:
    """The test split's features ``(N, n_depths, ...)``."""
    from reservoir.extract.store import open_features, read_depth

    with open_features(path) as f:
        return np.stack([read_depth(f, "test", int(k))[0] for k in f.attrs["depths"]], 1)


def probe(path: Path, args) -> tuple[int, float, float, dict[int, float]]:
    """(depth chosen on validation, its validation and test accuracy, test accuracy per depth)."""
    results = [
        r for r in api.fit(features=str(path), head=args.head, baselines=False) if r.get("depth") is not None
    ]
    best = max(results, key=lambda r: (r["val_accuracy"], -r["depth"]))
    return (
        best["depth"],
        best["val_accuracy"],
        best["test_accuracy"],
        {r["depth"]: r["test_accuracy"] for r in results},
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True, help="a data folder holding mnist/ or cifar10/")
    p.add_argument("--task", default="mnist", choices=["mnist", "cifar10"])
    p.add_argument("--limit", type=int, default=5000, help="images of each split (train and test)")
    p.add_argument("--backbone", default="gpt2-random")
    p.add_argument("--head", default="ridge")
    p.add_argument("--keep", type=Path, default=None, help="keep the feature files under this folder")
    p.add_argument(
        "--runs",
        default=None,
        help="comma-separated DTYPE:ENGINE (default: float32:torch, then the "
        "fastest float and int8 on OpenVINO)",
    )
    args = p.parse_args(argv)
    runs = args.runs.split(",") if args.runs else default_runs()
    print(
        f"# {describe()}\n# {load()}\n# {args.task} --limit {args.limit}, {args.backbone}, head {args.head}, "
        f"every depth; probe depth chosen on validation",
        flush=True,
    )
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            path, seconds = extract(run, args, (args.keep or Path(tmp)) / run.replace(":", "-"))
            depth, val, test, per_depth = probe(path, args)
            X = test_features(path)
            if reference is None:
                reference = (X, test, depth)
            error = relative_error(X, reference[0])
            tokens = 2 * args.limit * TOKENS
            rows.append(
                (run, seconds, tokens / seconds, depth, val, test, test - reference[1], error, per_depth)
            )
            print(
                f"{run}: {seconds:.1f} s, depth {depth}, val {val:.4f}, test {test:.4f}",
                file=sys.stderr,
                flush=True,
            )
    print(f"# {load()}\n")
    at = reference[2]
    print(
        f"| dtype:engine | job seconds | tokens/s | depth (val) | val acc | test acc | test - float32 (points) "
        f"| test acc at depth {at} (float32's) | its - float32 (points) | feature error vs float32 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run, seconds, rate, depth, val, test, delta, error, per_depth in rows:
        same = per_depth[at] - rows[0][8][at]
        print(
            f"| {run} | {seconds:.1f} | {rate:,.0f} | {depth} | {100 * val:.2f}% | {100 * test:.2f}% | "
            f"{100 * delta:+.2f} | {100 * per_depth[at]:.2f}% | {100 * same:+.2f} | {error:.1e} |"
        )
    print("\ntest accuracy per depth:")
    for run, *_, per_depth in rows:
        print(f"  {run}: " + " ".join(f"{k}:{100 * v:.2f}" for k, v in sorted(per_depth.items())))


if __name__ == "__main__":
    main()

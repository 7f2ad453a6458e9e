"""End-to-end training speed: steps per second of the FPT training step, fp32 eager against bf16 and compiled.

    .venv/bin/python benchmarks/train.py                                  # bit_xor on gpt2-random
    .venv/bin/python benchmarks/train.py --task digits --batch-size 32 --steps 10

Each mode builds the FPT of :mod:`reservoir.train` (paper groups trainable: input, pos,
ln, out) and times :func:`reservoir.train.train_step`, the exact step the training loop
runs (forward, cross-entropy, backward, gradient clipping, Adam), on fixed batches of
the task's training split:

- ``fp32-eager``: float32, no compilation (what the official code runs);
- ``bf16-eager``: the forward under CPU bf16 autocast (``--dtype bfloat16``);
- ``fp32-compile`` / ``bf16-compile``: the model wrapped in ``torch.compile`` (``--compile``).

Modes run in interleaved repetitions (a, b, c, d, a, b, ...) so that other jobs on the
machine slow them alike; the table gives the median steps/s, the median per-repetition
ratio to fp32-eager, and the one-off compile time (the first steps, untimed otherwise).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reservoir.config import TRAIN_DTYPES, TrainConfig  # noqa: E402
from reservoir.model.backbones import load_backbone  # noqa: E402
from reservoir.runtime.dtypes import candidates, fastest, rate  # noqa: E402
from reservoir.runtime.machine import describe  # noqa: E402
from reservoir.runtime.runner import CompiledOrEager  # noqa: E402
from reservoir.tasks import get_task  # noqa: E402
from reservoir.train import FPT, batch_tensors, select_trainable, train_step  # noqa: E402
from reservoir.train.step import optimizer  # noqa: E402

MODES = {
    "fp32-eager": ("float32", False),
    "bf16-eager": ("bfloat16", False),
    "fp32-compile": ("float32", True),
    "bf16-compile": ("bfloat16", True),
}


def build(args, mode: str):
    dtype, compile_ = MODES[mode]
    task = get_task(args.task)
    backbone = load_backbone(args.backbone, 0)
    blocks = backbone.n_layers if args.blocks is None else args.blocks
    model = FPT(task.spec, backbone, blocks=blocks, seed=0)
    params, _ = select_trainable(model, TrainConfig(args.task, args.backbone).trainable)
    opt = optimizer(params, lr=1e-3)  # the run's own (fused) Adam
    forward = CompiledOrEager(model, compile_, dynamic=task.spec.variable_length)
    data = task.load("train", Path(args.data_dir), args.batch_size * 4)
    batches = [
        batch_tensors(task, data, np.arange(i * args.batch_size, (i + 1) * args.batch_size) % len(data))
        for i in range(4)
    ]
    model.train()
    start = time.perf_counter()
    for b in batches[:2]:  # warm-up; compiles forward and backward graphs
        train_step(forward, params, opt, b, dtype, 1.0)
    warmup = time.perf_counter() - start
    return (forward, params, opt, batches, dtype), warmup


def timed(setup, steps: int) -> float:
    forward, params, opt, batches, dtype = setup
    start = time.perf_counter()
    for i in range(steps):
        loss, _ = train_step(forward, params, opt, batches[i % len(batches)], dtype, 1.0)
    float(loss)  # a step does not wait for the device: wait once for the last one before stopping the clock
    return steps / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="bit_xor")
    ap.add_argument("--backbone", default="gpt2-random")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=None, help="blocks of the backbone to run [default: all]")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data-dir", default=os.environ.get("RESERVOIR_HOME", ".") + "/data")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    print(f"# {' '.join(sys.argv)}")
    print(f"# {describe()}")
    print(
        f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"task {args.task}, backbone {args.backbone}, batch {args.batch_size}, load {os.getloadavg()[0]:.1f}"
    )
    native = candidates()
    roofline = {d: rate(d, threads=torch.get_num_threads()) for d in native}
    print(
        "# matrix products now, GFLOP/s: "
        + ", ".join(f"{d} {r:,.0f}" for d, r in roofline.items())
        + f"; train --dtype auto takes {fastest({d: r for d, r in roofline.items() if d in TRAIN_DTYPES})}"
    )
    for m in [m for m in modes if MODES[m][0] not in native]:
        print(f"# {m}: skipped, this CPU does not multiply {MODES[m][0]} natively (emulated, far slower)")
        modes.remove(m)
    setups, warm = {}, {}
    for m in modes:
        setups[m], warm[m] = build(args, m)
    rates = {m: [] for m in modes}
    for _ in range(args.reps):
        for m in modes:
            rates[m].append(timed(setups[m], args.steps))
    base = rates.get("fp32-eager")
    print("| mode | steps/s | examples/s | x fp32-eager | warm-up (2 steps, s) |")
    print("|---|---|---|---|---|")
    for m in modes:
        med = statistics.median(rates[m])
        ratio = statistics.median(r / b for r, b in zip(rates[m], base)) if base else float("nan")
        print(f"| {m} | {med:.2f} | {med * args.batch_size:.0f} | {ratio:.2f} | {warm[m]:.1f} |")
    print(f"# load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""Where a whole extraction job's time goes, against the roofline measured in the same run.

    .venv/bin/python benchmarks/where.py --data-dir DATA            # MNIST 2,000 + 2,000 rows, the defaults
    .venv/bin/python benchmarks/where.py --data-dir DATA --rows 500 # a quicker look

Two parts, each printed as a table:

- **the job**: ``reservoir extract --task mnist --split train --limit ROWS`` with the defaults, run
  in this process (imports timed from before ``reservoir.cli``), split into: start-up (imports),
  preparing (data and backbone), the first batch (OpenVINO's conversion, compile and check, or
  PyTorch's first call), the steady batches (the forward of every later batch), and the rest
  (writing, digests, closing the file). Each phase in seconds and in share of the job; tokens/s
  of the job and of its steady batches against the roofline.
- **the forward** (the default engine, OpenVINO): the compiled graph of the job's backbone (GPT-2
  small, random weights) on one full batch, profiled by OpenVINO per operation type: the share of
  the matrix products (``FullyConnected``, ``MatMul``) and their rate, from the model's FLOPs per
  token, against the roofline. If the matrix products run at the roofline and take a share ``s``
  of the forward, no schedule of the same operations reaches more than ``s`` of the roofline
  without making the other operations faster.

The roofline is the fastest float dtype's ``torch.mm`` rate (2048 x 2048) measured in this run,
as in ``benchmarks/extract.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--rows", type=int, default=4000, help="MNIST training rows of the job (2,000 + 2,000: 4,000)"
    )
    p.add_argument("--data-dir", default=None, help="data folder holding MNIST (default: reservoir's)")
    args = p.parse_args()

    import torch
    from extract import flops_per_token
    from matmul import matmul_rate

    from reservoir.runtime import openvino
    from reservoir.runtime import runner as runner_module
    from reservoir.runtime.dtypes import candidates
    from reservoir.runtime.machine import cpu

    batches: list[tuple[float, float, int]] = []  # (start, seconds, rows)
    prepared = {}
    run_async = runner_module.FeatureRunner.run_async

    def timed_run(self, batch, *store):
        t = time.perf_counter()
        out = run_async(self, batch, *store)
        batches.append((t, time.perf_counter() - t, batch.n))
        return out

    runner_module.FeatureRunner.run_async = timed_run

    models = {}
    compile_ = openvino.OpenVINOForward._compile

    def keep(self, model):
        models.setdefault("graph", model)
        models["forward"] = self
        return compile_(self, model)

    openvino.OpenVINOForward._compile = keep

    from reservoir.cli import main as cli
    from reservoir.extract import run as run_module

    prepare = run_module.prepare

    def timed_prepare(*a, **k):
        t = time.perf_counter()
        out = prepare(*a, **k)
        prepared["s"] = time.perf_counter() - t
        return out

    run_module.prepare = timed_prepare

    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "extract",
            "--task",
            "mnist",
            "--split",
            "train",
            "--limit",
            str(args.rows),
            "--out",
            f"{tmp}/f.h5",
        ]
        argv += ["--data-dir", args.data_dir] if args.data_dir else []
        job_start = time.perf_counter()
        try:
            cli(argv, prog_name="reservoir", standalone_mode=False)
        finally:
            job_end = time.perf_counter()
    floats = candidates()
    rates = {f: matmul_rate(dtype=getattr(torch, f)) for f in floats}
    peak_dtype = max(rates, key=rates.get)
    peak = rates[peak_dtype]

    T = 64  # MNIST's 64 tokens of 16 values, GPT-2 small
    flops = flops_per_token(12, 768, 4 * 768, T, 16)
    tokens = args.rows * T
    total = job_end - START
    first = batches[0][1]
    steady = sum(s for _, s, _ in batches[1:])
    steady_tokens = sum(n for _, _, n in batches[1:]) * T
    phases = [
        ("start-up (imports)", job_start - START),
        ("preparing (data, backbone)", prepared.get("s", 0.0)),
        ("first batch (convert, compile, check, forward)", first),
        ("steady batches (forward)", steady),
    ]
    phases.append(("the rest (writing, digests, closing)", total - sum(s for _, s in phases)))
    model, have = cpu()
    shown = [
        f
        for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8")
        if f in have
    ]
    print(
        f"cpu: {model}; flags: {', '.join(shown)}; threads {torch.get_num_threads()}; "
        f"load average (1 min) after the job: {os.getloadavg()[0]:.2f}"
    )
    print(
        f"roofline: {peak_dtype} torch.mm {peak / 1e9:,.0f} GFLOP/s ("
        + ", ".join(f"{f} {r / 1e9:,.0f}" for f, r in rates.items())
        + f"); {flops / 1e6:.1f} MFLOP per token "
        f"-> {peak / flops:,.0f} tokens/s"
    )
    print(f"\nthe job: reservoir {' '.join(argv[: -2 if not args.data_dir else -4])} ({tokens:,d} tokens)\n")
    print("| phase | s | share of the job |")
    print("|---|---|---|")
    for name, s in phases:
        print(f"| {name} | {s:.1f} | {100 * s / total:.0f}% |")
    print(
        f"| **the job** | **{total:.1f}** | {tokens / total:,.0f} tokens/s = **{100 * tokens / total / (peak / flops):.0f}%"
        f" of the roofline** |"
    )
    if steady_tokens:
        print(
            f"\nsteady batches alone: {steady_tokens / steady:,.0f} tokens/s = "
            f"{100 * steady_tokens / steady / (peak / flops):.0f}% of the roofline"
        )

    if "graph" in models:
        profile_forward(models, peak, flops, T)
    return 0


def profile_forward(models: dict, peak: float, flops: float, T: int) -> None:
    import numpy as np

    from reservoir.runtime.engines import import_openvino

    ov = import_openvino()
    forward = models["forward"]
    props = ov.properties
    config = {
        props.inference_num_threads: forward.threads,
        props.enable_profiling: True,
        props.hint.performance_mode: props.hint.PerformanceMode.LATENCY,
        props.hint.inference_precision: engines_precision(forward.dtype),
    }
    compiled = ov.Core().compile_model(models["graph"], "CPU", config)
    request = compiled.create_infer_request()
    rows = 256
    rng = np.random.default_rng(0)
    feed = {
        0: rng.random((rows, T, 16), dtype=np.float32),
        1: np.full(rows, T, dtype=np.int64),
        2: np.full((rows, 1), T - 1, dtype=np.int64),
    }
    for _ in range(2):
        request.infer(feed)
    walls, by_type = [], defaultdict(float)
    for _ in range(3):
        t = time.perf_counter()
        request.infer(feed)
        walls.append(time.perf_counter() - t)
        for node in request.profiling_info:
            by_type[node.node_type] += node.real_time.total_seconds()
    wall = float(np.median(walls))
    summed = sum(by_type.values())
    products = sum(v for k, v in by_type.items() if k in ("FullyConnected", "MatMul"))
    share = products / summed
    tokens = rows * T
    print(
        f"\nthe forward: OpenVINO {forward.dtype}, one batch of {rows} x {T} tokens, {tokens / wall:,.0f} tokens/s = "
        f"{100 * tokens / wall / (peak / flops):.0f}% of the roofline (median of 3 profiled calls)\n"
    )
    print("| operation type | share of the forward's time |")
    print("|---|---|")
    for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])[:10]:
        print(f"| {k} | {100 * v / summed:.1f}% |")
    rate = tokens * flops / (wall * share)
    print(
        f"\nmatrix products: {100 * share:.0f}% of the forward's time, at {rate / 1e9:,.0f} GFLOP/s "
        f"({100 * rate / peak:.0f}% of the roofline; FLOPs of the whole model, so the readout-only last block's "
        f"saving counts for them); every other operation: {100 * (1 - share):.0f}%"
    )


def engines_precision(dtype: str):
    from reservoir.runtime.engines import precision

    return precision(dtype)


if __name__ == "__main__":
    sys.exit(main())

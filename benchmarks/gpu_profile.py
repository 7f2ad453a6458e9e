"""Where a GPU's time goes in our extraction at the MNIST shape (GPT-2-small shape, 64 dense tokens, batch 256,
every depth): the compiled forward's CUDA kernels by time, the card's busy share of each call, and the rate of
variants measured in the same run.

    python benchmarks/gpu_profile.py --out DIR [--budget 90] [--small]

It writes ``profile.json`` into ``--out`` (default ``$OUT``):

- ``rates``: steady tokens/s and the share of the bf16 matrix-product roofline (measured now, as
  ``benchmarks/gpu.py`` does) of: the compiled forward called one batch at a time, as ``gpu.py``'s
  ``extract.json`` measures it (``compiled``); the same with batches in flight, as ``reservoir extract``
  runs them (``compiled-in-flight``: every batch queued with ``run_async``, then read); a batch of 512
  (``compiled-512``); CUDA graphs (``compiled-cudagraphs``, inductor's ``triton.cudagraphs``, as ``mode="reduce-overhead"``);
- ``profile``: ``torch.profiler`` over three compiled calls: CUDA kernel time per call against the wall
  time per call (the card's busy share) and the kernels that take the most time.

Each variant runs while the budget lasts, in that order; one that fails is recorded and the next runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import gpu  # noqa: E402  (benchmarks/gpu.py: the same runner, inputs, roofline and timing)


def rate(run, n_tokens: int, device, reps: int, left) -> float:
    times = gpu.measure_rows({"x": run}, device, reps, left)["x"]
    return n_tokens / statistics.median(times)


def kernels(runner, tokens, lengths, calls: int = 3) -> dict[str, Any]:
    """CUDA kernel time per call against wall time per call, and the ten kernels that take the most."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    runner(tokens, lengths)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            runner(tokens, lengths)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / calls
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in events) / 1e6 / calls
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:10]
    return {
        "wall_ms_per_call": round(1e3 * wall, 3),
        "cuda_kernel_ms_per_call": round(1e3 * total, 3),
        "busy_share": round(total / wall, 3),
        "top_kernels": [
            {
                "name": e.key[:120],
                "ms_per_call": round(e.self_device_time_total / 1e3 / calls, 3),
                "calls_per_call": e.count // calls,
            }
            for e in top
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=os.environ.get("OUT") or None)
    p.add_argument("--budget", type=float, default=90)
    p.add_argument("--small", action="store_true", help="a tiny model (runs on a CPU)")
    args = p.parse_args(argv)
    if args.out is None:
        print("no output folder: pass --out DIR, or set OUT", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    from reservoir.tasks import TaskSpec

    sizes = gpu.Sizes(args.small)
    device = gpu.device_of("auto")
    spec = TaskSpec("mnist", "dense", seq_len=64, n_classes=10, token_dim=16)
    shape, batch = sizes.shape, sizes.batch
    d = shape["n_embd"]
    from extract import flops_per_token

    flops = flops_per_token(shape["n_layer"], d, 4 * d, spec.seq_len, spec.token_dim)
    peak = gpu.roofline(device, sizes.matmul_n, sizes.matmul_s / 2)["bfloat16"]
    result: dict[str, Any] = {
        "device": str(device),
        "card": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "model": shape,
        "batch": batch,
        "roofline_bf16_tflops": round(peak / 1e12, 2),
        "flops_per_token": flops,
        "rates": {},
    }
    tokens, lengths = gpu.shape_inputs(spec, batch)
    n = batch * spec.seq_len
    reps = sizes.reps

    def build(rows: int = batch, **options):
        """Our compiled runner, ``options`` added to the inductor options it compiles with."""
        real = torch.compile

        def compile_with(fn, **kwargs):
            return real(fn, **{**kwargs, "options": {**kwargs.get("options", {}), **options}})

        torch.compile = compile_with
        try:
            return gpu.ours_runner(spec, shape, 0, device, rows, True)
        finally:
            torch.compile = real

    def record(name: str, tokens_per_s: float) -> None:
        result["rates"][name] = {
            "tokens_per_s": round(tokens_per_s),
            "of_roofline": round(tokens_per_s * flops / peak, 4),
        }
        print(f"{name}: {tokens_per_s:,.0f} tokens/s, {100 * tokens_per_s * flops / peak:.1f}% of roofline")

    with gpu.in_time(args.budget - 3) as left:
        compiled = build()
        variants = {
            "compiled": lambda: rate(lambda: compiled(tokens, lengths), n, device, reps, left),
            "compiled-in-flight": lambda: rate(
                gpu.in_flight(compiled, tokens, lengths, gpu.IN_FLIGHT), gpu.IN_FLIGHT * n, device, 3, left
            ),
            "profile": lambda: kernels(compiled, tokens, lengths) if device.type == "cuda" else None,
            "compiled-512": lambda: (lambda t, ln, r: rate(lambda: r(t, ln), 2 * n, device, reps, left))(
                *gpu.shape_inputs(spec, 2 * batch), build(2 * batch)
            ),
            "compiled-cudagraphs": lambda: (
                lambda r: rate(lambda: r(tokens, lengths), n, device, reps, left)
            )(build(**{"triton.cudagraphs": True})),
        }
        for name, measure in variants.items():
            if left() < 10:
                result.setdefault("skipped", []).append(name)
                continue
            try:
                value = measure()
            except Exception as e:  # noqa: BLE001 - one variant's failure is recorded, the next runs
                result.setdefault("failed", {})[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                continue
            if name == "profile":
                result["profile"] = value
                if value:
                    print(f"profile: {value['busy_share']:.0%} of each call's wall time in CUDA kernels")
            else:
                record(name, value)
    (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    print(args.out / "profile.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

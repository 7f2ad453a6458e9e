"""The machine's matrix-product rates: float32 against bf16, one thread against all.

    .venv/bin/python benchmarks/matmul.py

Prints GFLOP/s of ``a @ b`` for two n x n matrices (n = 1024, 2048, 4096), warm-up excluded.
The bf16/float32 ratio bounds what bf16 extraction can gain over a float32 baseline
(docs/benchmarks.md, "Why 8x cannot be shown here").
"""

from __future__ import annotations

import time

import torch


def rate(n: int, dtype: torch.dtype, flops: float = 2e10) -> float:
    """GFLOP/s of an n x n by n x n product in ``dtype``, about ``flops`` FLOPs timed."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    reps = max(2, int(flops / (2 * n**3)))
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def main() -> None:
    print("threads dtype     n     GFLOP/s")
    for threads in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.bfloat16):
            for n in (1024, 2048, 4096):
                print(f"{threads:<3} {str(dtype).removeprefix('torch.'):<9} {n:5d} {rate(n, dtype):6.0f}", flush=True)


if __name__ == "__main__":
    main()

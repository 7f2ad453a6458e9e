"""The machine's matrix-product rates: float32 against bf16, one thread against all.

    .venv/bin/python benchmarks/matmul.py

Prints GFLOP/s of ``a @ b`` for two n x n matrices (n = 1024, 2048, 4096), warm-up excluded.
The bf16/float32 ratio bounds what bf16 extraction can gain over a float32 baseline
(docs/benchmarks.md, "Why 8x cannot be shown here").
"""

from __future__ import annotations

import time

import torch


def sync(device: torch.device | str = "cpu") -> None:
    """Wait for queued kernels (GPU work is asynchronous; CPU work is not)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(
    n: int = 2048,
    dtype: torch.dtype = torch.bfloat16,
    seconds: float = 1.0,
    device: torch.device | str = "cpu",
) -> float:
    """FLOP/s of ``torch.mm`` on two ``n x n`` matrices in ``dtype`` on ``device``, timed over
    about ``seconds`` after one untimed product."""
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    torch.mm(a, b)
    sync(device)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        reps += 1
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def main() -> None:
    print("threads dtype     n     GFLOP/s")
    for threads in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.bfloat16):
            for n in (1024, 2048, 4096):
                print(
                    f"{threads:<3} {str(dtype).removeprefix('torch.'):<9} {n:5d} {matmul_rate(n, dtype) / 1e9:6.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""The compute dtype ``--dtype auto`` takes: the one this CPU multiplies fastest, measured.

Flags say only which float dtypes are native (:func:`candidates`), not whether they are faster, so each
is timed on a product of a transformer block's shape (:func:`rate`), once per CPU, threads and torch
version (kept in the cache), and a lower precision is taken only at :data:`MARGIN` times float32's
rate (docs/performance.md, "The compute dtype").

On a CUDA device ``auto`` takes bf16 where the card multiplies it natively (:func:`cuda_bf16_native`),
else float32, without measuring; float32 on CUDA is IEEE float32 (:func:`strict_float32`), so float32
features are the reference CPU and CUDA agree on.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable

import torch

from reservoir.model.devices import DTYPES
from reservoir.runtime import records
from reservoir.runtime.machine import bf16_native, cpu

#: a lower precision is taken only when it multiplies at least this many times float32's rate
MARGIN = 1.1
#: the timed product's shape: rows x width -> 4 width (a block's MLP), at the model's width
ROWS = 2048
REPEATS = 5


def candidates(flags: set[str] | None = None) -> list[str]:
    """Float dtypes whose products this CPU runs natively (float32 always)."""
    flags = cpu()[1] if flags is None else flags
    out = ["float32"]
    if bf16_native() or {"avx512_bf16", "amx_bf16"} & flags:
        out.append("bfloat16")
    if {"avx512_fp16", "amx_fp16"} & flags:
        out.append("float16")
    return out


def rate(dtype: str, width: int = 768, threads: int | None = None) -> float:
    """GFLOP/s of ``(ROWS, width) @ (width, 4 width)`` products in ``dtype`` on this CPU, now."""
    n = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(ROWS, width, generator=g).to(DTYPES[dtype])
        b = torch.randn(width, 4 * width, generator=g).to(DTYPES[dtype])
        with torch.inference_mode():
            return 2 * ROWS * width * 4 * width / best_of(lambda: torch.mm(a, b)) / 1e9
    finally:
        torch.set_num_threads(n)


def best_of(call: Callable[[], object]) -> float:
    """The fastest of :data:`REPEATS` calls, in seconds, after a warm-up call (where oneDNN or OpenVINO
    picks and packs its kernel)."""
    call()
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


#: rates this process has read or measured, by key
_MEASURED: dict[str, tuple[dict[str, float], bool]] = {}


def _key(width: int, threads: int) -> str:
    return json.dumps([*records.machine(threads), width, torch.__version__])


#: the rates' file in the cache folder (:mod:`reservoir.runtime.records`)
RATES = "dtype-rates.json"


def measured_rates(
    width: int = 768, threads: int | None = None, *, measure: Callable[[str, int, int], float] | None = None
) -> tuple[dict[str, float], bool]:
    """``({dtype: GFLOP/s}, cached)`` of every candidate on this CPU: read from the cache when this
    CPU, thread count, width and torch version were measured before, else measured and kept."""
    threads = threads or torch.get_num_threads()
    key = _key(width, threads)
    if measure is None and key in _MEASURED:  # the CPU does not change within a process
        return _MEASURED[key]
    kept = records.get(RATES, key)
    if isinstance(kept, dict) and set(kept) == set(candidates()):
        _MEASURED[key] = (kept, True)
        return kept, True
    rates = {d: (measure or rate)(d, width, threads) for d in candidates()}
    records.put(RATES, key, rates)
    if measure is None:
        _MEASURED[key] = (rates, False)  # measured by this run: "measured now" for the rest of it
    return rates, False


def fastest(rates: dict[str, float]) -> str:
    """The dtype ``auto`` takes from measured rates: the fastest, a lower precision only when it beats
    float32 by :data:`MARGIN`."""
    best = max(rates, key=rates.get)
    if best != "float32" and rates[best] < MARGIN * rates.get("float32", 0.0):
        return "float32"
    return best


#: the compute capability from which NVIDIA cards multiply bf16 natively (Ampere)
BF16_CAPABILITY = (8, 0)


def cuda_bf16_native(device: torch.device | str = "cuda") -> bool:
    """Whether the CUDA ``device`` multiplies bf16 natively: compute capability 8.0 or newer and, where
    torch can say so, ``is_bf16_supported(including_emulation=False)`` (emulated bf16 is slower than float32)."""
    device = torch.device(device)
    if tuple(torch.cuda.get_device_capability(device)) < BF16_CAPABILITY:
        return False
    check = torch.cuda.is_bf16_supported
    if "including_emulation" not in inspect.signature(check).parameters:  # older torch: capability alone
        return True
    with torch.cuda.device(device):
        return bool(check(including_emulation=False))


def strict_float32() -> None:
    """IEEE float32 products on CUDA from now on (TF32 off), so float32 features equal the CPU's to float32
    rounding. Process-wide, as torch's flags are."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def choose(
    device: torch.device | str = "cpu", width: int = 768, allowed: tuple[str, ...] | None = None
) -> tuple[str, str]:
    """``(dtype, why)`` for ``--dtype auto`` on ``device``, among ``allowed`` dtypes (default: every float)."""
    kind = torch.device(device).type
    if kind == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        card = f"{torch.cuda.get_device_name(device)}, compute capability {major}.{minor}"
        if cuda_bf16_native(device) and (allowed is None or "bfloat16" in allowed):
            return "bfloat16", f"auto on CUDA ({card}): bf16, native on this card"
        return "float32", f"auto on CUDA ({card}): float32 (IEEE, TF32 off), bf16 is not native here"
    if kind != "cpu":
        return "float32", f"auto on {kind}: float32"
    rates, cached = measured_rates(width)
    if allowed is not None:
        rates = {d: r for d, r in rates.items() if d in allowed}
    dtype = fastest(rates)
    shown = ", ".join(f"{d} {r:,.0f}" for d, r in sorted(rates.items(), key=lambda kv: -kv[1]))
    return dtype, (
        f"auto: {dtype} multiplies fastest on this CPU ({'measured before' if cached else 'measured now'}, "
        f"GFLOP/s: {shown})"
    )

"""When compiling pays: the compile decision from measured costs, and the persistent inductor cache.

With ``--compile`` left to auto, ``extract`` measures the eager rate on the run's first batch and takes
the compile time and speedup from the last run of the same shapes on the same device
(:func:`shape_key`, :func:`device_label`), or a first-time estimate, and compiles when that pays
(:func:`decide`). After a compiled run its measured costs update the record (:func:`write_record`).
Inductor's caches live in ``$RESERVOIR_CACHE/inductor`` (:func:`use_persistent_cache`), so a second run
of the same shapes compiles in seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reservoir.paths import cache_dir
from reservoir.runtime import records

# Both estimates are measured: docs/benchmarks.md, "Constants the code takes from these measurements".
#: a first compile's cost before any run measured it: COLD_SECONDS for the compiler's own start plus
#: COLD_SECONDS_PER_BLOCK per block run and batch shape
COLD_SECONDS, COLD_SECONDS_PER_BLOCK = 20.0, 1.5
#: compiled rate over eager rate assumed before a run measured it, by compute dtype
DEFAULT_SPEEDUP = {"bfloat16": 1.7, "float32": 1.3}


def use_persistent_cache() -> Path:
    """Point inductor's caches at ``cache_dir()/inductor`` (unless ``TORCHINDUCTOR_CACHE_DIR``
    is set) before anything compiles; returns the folder."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # unset, or torch's default rather than the user's
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


#: the compile records' file in the cache folder (:mod:`reservoir.runtime.records`)
COSTS = "compile-costs.json"


def device_label(device: Any) -> str:
    """The device a compile record was measured on: ``cuda: CARD (sm_XY)`` for a CUDA device, ``cpu: MODEL``
    for the CPU, the device type otherwise."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda: {torch.cuda.get_device_name(device)} (sm_{major}{minor})"
    if device.type == "cpu":
        from reservoir.runtime.machine import cpu

        return f"cpu: {cpu()[0]}"
    return device.type


def shape_key(
    backbone: Any, *, dtype: str, device: str, batch_size: int, widths: list[int], depths: list[int]
) -> str:
    """What a compiled graph depends on: torch, the architecture (not the weights), dtype,
    the device (:func:`device_label`), batch shape and depths."""
    import torch

    from reservoir.identity import digest

    return digest(
        {
            "torch": torch.__version__,
            **records.architecture(backbone),
            "dtype": dtype,
            "device": device,
            "batch": batch_size,
            "widths": sorted(set(widths)),
            "depths": list(depths),
        }
    )


def read_record(key: str) -> dict[str, float] | None:
    return records.get(COSTS, key)


def write_record(key: str, compile_seconds: float, speedup: float | None) -> None:
    """Remember a run's measured costs (best effort); ``speedup=None`` (a run forced to compile has no eager
    rate) keeps the recorded one."""
    old = records.get(COSTS, key)
    if speedup is None:
        speedup = old.get("speedup") if old else None
    elif old and old.get("speedup"):  # one run's speedup is noisy on a shared machine: blend it with the last
        speedup = (speedup + old["speedup"]) / 2
    records.put(
        COSTS,
        key,
        {
            "compile_seconds": round(compile_seconds, 2),
            "speedup": None if speedup is None else round(speedup, 3),
        },
    )


@dataclass(frozen=True)
class Decision:
    compile: bool
    reason: str


def decide(
    tokens_left: int,
    eager_rate: float,
    *,
    blocks: int,
    shapes: int,
    record: dict[str, float] | None,
    dtype: str = "float32",
) -> Decision:
    """Compile when the eager time of ``tokens_left`` exceeds the compile time plus the compiled time, both
    from ``record`` or else the first-time estimate; ``shapes`` distinct batch shapes each compile once."""
    if record:
        compile_s, source = record["compile_seconds"] * shapes, "measured last time"
        speedup = record.get("speedup") or DEFAULT_SPEEDUP.get(dtype, 1.3)
    else:
        compile_s, speedup, source = (
            COLD_SECONDS + COLD_SECONDS_PER_BLOCK * blocks * shapes,
            DEFAULT_SPEEDUP.get(dtype, 1.3),
            "first-time estimate",
        )
    eager_s = tokens_left / eager_rate
    compiled_s = compile_s + eager_s / max(speedup, 1e-6)
    verdict = eager_s > compiled_s
    reason = (
        f"{'compiled' if verdict else 'eager'}: eager {eager_rate:,.0f} tokens/s (measured now) needs "
        f"~{eager_s:.0f} s for the {tokens_left:,} tokens left; compiling ~{compile_s:.0f} s "
        f"({shapes} shape{'s' if shapes > 1 else ''}) then ~{eager_s / speedup:.0f} s at {speedup:.2f}x "
        f"({source})"
    )
    return Decision(verdict, reason)

"""What machine this is, in the words every speed figure needs: CPU model, the instruction-set
flags that decide the fast paths, usable cores and load (benchmarks and pipelines print it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

#: flags that decide the fast paths: AVX2 float32, AVX-512, native bf16, int8 dot products, AMX
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


def cpu() -> tuple[str, set[str]]:
    """``(model name, flags)`` from ``/proc/cpuinfo`` (the platform's processor name elsewhere)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
        platform.processor() or "unknown CPU",
    )
    flags = next(
        (set(ln.split(":", 1)[1].split()) for ln in text.splitlines() if ln.startswith("flags")), set()
    )
    return model, flags


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load() -> str:
    return "load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def describe() -> str:
    """One line: ``MODEL, N usable cores; avx2 yes, avx512f no, ...``."""
    model, flags = cpu()
    have = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in FLAGS)
    return f"{model}, {cores()} usable cores; {have}"


def bf16_native() -> bool:
    """Whether this CPU has native bf16 matrix products (oneDNN with AVX512-BF16 or AMX)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


def on(device: str | object = "cpu") -> str:
    """The machine a computation ran on, as results record it: :func:`describe` for the CPU, the card
    (``NVIDIA H100 80GB HBM3 (CUDA)``) for a CUDA device, the device type otherwise."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA)"
    return describe() if device.type == "cpu" else device.type

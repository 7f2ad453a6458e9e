"""Devices: ``--device auto|cpu|cuda[:N]|mps`` resolved to a torch device, or a clear error."""

from __future__ import annotations

import torch

#: the float compute dtypes of the PyTorch path, by the name the options use
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto`` -> the first CUDA device when one is present, else the CPU; ``cpu``, ``cuda``,
    ``cuda:N`` and ``mps`` as asked, or DeviceError naming what this machine has."""
    from reservoir.config import check_device
    from reservoir.errors import DeviceError

    check_device("--device", name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= found:
            raise DeviceError(absent_cuda(name, found))
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceError(
            "--device mps: Apple's Metal backend is not available here; use --device cpu or auto"
        )
    return torch.device(name)


def absent_cuda(name: str, found: int) -> str:
    """The message for ``--device NAME`` past the ``found`` CUDA devices: what there is and what to pass."""
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    if not found:
        return (
            f"--device {name}: this machine has 0 CUDA device(s) (torch {torch.__version__}, {build}); "
            "use --device cpu, or auto to take a GPU when there is one"
        )
    cards = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(found))
    return (
        f"--device {name}: this machine has {found} CUDA device(s) ({cards}; torch {torch.__version__}, {build}); "
        f"use --device cuda:0{f' to cuda:{found - 1}' if found > 1 else ''}, cuda (the first), or cpu"
    )

"""Devices: ``--device auto|cpu|cuda[:N]|mps`` resolved to a torch device, or a clear error."""

from __future__ import annotations

import torch

#: the float compute dtypes of the PyTorch path, by the name the options use
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto`` -> the first CUDA device when one is present, else the CPU; ``cpu``, ``cuda``,
    ``cuda:N`` and ``mps`` as asked, or DeviceError naming what this machine has."""
    from reservoir.config import DEVICE
    from reservoir.errors import DeviceError
    from reservoir.settings import check

    check("--device", "device", name, DEVICE)
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


def check_fits(module: torch.nn.Module, device: torch.device, dtype: str, what: str) -> None:
    """Refuse (DeviceError), before anything moves there, a model whose parameters and buffers in ``dtype``
    (:data:`DTYPES`; any other name counts as float32) exceed a CUDA device's free memory, naming
    both sizes and the ways out; other devices are not checked here (the host's memory is checked when the
    model is built)."""
    if device.type != "cuda":
        return
    from reservoir.errors import DeviceError

    free, total = torch.cuda.mem_get_info(device)
    n = sum(t.numel() for t in (*module.parameters(), *module.buffers()))
    size = n * torch.empty((), dtype=DTYPES.get(dtype, torch.float32)).element_size()
    if size > free:
        raise DeviceError(
            f"backbone {what} holds {n:,} values ({size / 2**30:,.1f} GiB in {dtype}), more than the "
            f"{free / 2**30:,.1f} GiB free on {device} ({total / 2**30:,.1f} GiB in all); keep its weights in half "
            "the memory with --load-dtype bfloat16, use a card with more memory, or --device cpu"
        )

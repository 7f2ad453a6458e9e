"""One training step and one scoring pass of an FPT, the run's Adam and its compute dtype.

A step's loss and gradient norm stay on the device until :func:`read_steps` reads them. A step whose
gradient norm is not finite is skipped on the device (fused Adam's ``found_inf``), and the read that finds
it stops the run, naming the step (:class:`Diverged`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from reservoir.config import TRAIN_DTYPES
from reservoir.errors import ReservoirError
from reservoir.runtime.dtypes import choose as choose_dtype
from reservoir.runtime.dtypes import cuda_bf16_native
from reservoir.tasks import SplitData, Task
from reservoir.train.data import Batch, batch_tensors


def autocast(dtype: str, device: torch.device | str = "cpu"):
    if dtype == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loss_and_correct(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = logits.float().reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    return nn.functional.cross_entropy(flat, y), (flat.argmax(-1) == y).sum()


def scores(
    forward: Callable,
    task: Task,
    d: SplitData,
    batch_size: int,
    dtype: str,
    device: torch.device | str = "cpu",
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy over every output (every bit for bit tasks) of the whole split."""
    correct, total, loss_sum = 0, 0, 0.0
    with torch.inference_mode(), autocast(dtype, device):
        for start in range(0, len(d), batch_size):
            rows = np.arange(start, min(start + batch_size, len(d)))
            tokens, lengths, labels = (t.to(device) for t in batch_tensors(task, d, rows))
            loss, c = loss_and_correct(forward(tokens, lengths), labels)
            correct += int(c)
            total += labels.numel()
            loss_sum += float(loss) * labels.numel()
    return correct / total, loss_sum / total


def evaluate(
    forward: Callable,
    task: Task,
    d: SplitData,
    batch_size: int,
    dtype: str,
    device: torch.device | str = "cpu",
) -> float:
    """Accuracy over every output (every bit for bit tasks) of the whole split."""
    return scores(forward, task, d, batch_size, dtype, device)[0]


def optimizer(params: list[nn.Parameter], lr: float) -> torch.optim.Adam:
    """The run's Adam: fused, so that :func:`train_step` can skip a step on the device (``found_inf``)."""
    return torch.optim.Adam(params, lr=lr, fused=True)


def train_step(
    forward: Callable,
    params: list[nn.Parameter],
    opt: torch.optim.Optimizer,
    batch: Batch,
    dtype: str,
    grad_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Adam step on one batch (the model must be in train mode). Returns the loss and the gradient norm as
    tensors on the device, without waiting for it."""
    device = params[0].device
    tokens, lengths, labels = (t.to(device, non_blocking=True) for t in batch)
    with autocast(dtype, device):
        logits = forward(tokens, lengths)
    loss, _ = loss_and_correct(logits, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), optimize(params, opt, grad_clip).detach()


def optimize(params: list[nn.Parameter], opt: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
    """The optimiser's step from the gradients of ``params``, clipped to the norm ``grad_clip`` (0: not clipped);
    returns their norm before clipping, on the device."""
    norm = nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if opt.defaults.get("fused"):
        opt.found_inf = (~torch.isfinite(norm)).to(torch.float32)
    opt.step()
    return norm


def read_steps(
    steps: list[tuple[torch.Tensor, torch.Tensor]], first: int, tag: str, lr: float
) -> list[float]:
    """The losses of ``steps`` (:func:`train_step`'s device tensors for steps ``first + 1, ...``), read in one
    synchronisation and checked (:func:`check_steps`)."""
    if not steps:
        return []
    losses, norms = torch.stack([torch.stack(s) for s in steps]).float().cpu().T.tolist()
    return check_steps(losses, norms, first, tag, lr)


def check_steps(losses: list[float], norms: list[float], first: int, tag: str, lr: float) -> list[float]:
    """``losses``, the training losses of steps ``first + 1, first + 2, ...`` read from the device beside their
    gradient norms ``norms``; Diverged naming the first step whose gradient norm or loss is not finite."""
    for i, (loss, norm) in enumerate(zip(losses, norms)):
        if not math.isfinite(norm) and math.isfinite(loss):
            raise Diverged(
                f"{tag} the gradients are not finite at step {first + i + 1} (gradient norm {norm} with a finite loss "
                f"{loss:.4g}): with a finite loss this is an overflow in the backward pass, not the learning rate. "
                "A known cause: a token whose hidden state is exactly zero (an all-zero input token in a backbone "
                "without biases, e.g. SmolLM2, whose position parameters were set to zero), where RMSNorm's "
                "derivative is 1/sqrt(eps) per block; the FPT draws position parameters that start at zero, so check "
                "the backbone's own positions and norms"
            )
        if not math.isfinite(loss):
            raise Diverged(
                f"{tag} the training loss became {loss} at step {first + i + 1}; lower --lr (now {lr:g}) "
                "or keep --grad-clip above 0"
            )
    return losses


def train_dtype(
    name: str, device: torch.device, width: int, log: Callable[[str], None], tag: str = ""
) -> str:
    """The compute dtype of a run: ``name``, or for ``auto`` the faster training dtype on ``device``
    (:func:`reservoir.runtime.dtypes.choose`), said in the log."""
    if name == "auto":
        dtype, why = choose_dtype(device, width, allowed=TRAIN_DTYPES)
        log(f"{tag} {why}".strip())
        return dtype
    if name == "bfloat16" and device.type == "cuda" and not cuda_bf16_native(device):
        log(
            f"{tag} --dtype bfloat16: {torch.cuda.get_device_name(device)} emulates bf16, slower than float32; "
            "--dtype auto runs float32 on it".strip()
        )
    return name


class Diverged(ReservoirError):
    """A run whose loss or gradients stopped being finite; in a sweep its learning rate is set aside."""

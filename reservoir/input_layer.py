"""The frozen input layer of the FPT: tokens -> model width, seeded and saved with the features.

Dense tokens: a linear layer with orthogonal weights (gain 1.41) and zero bias, as in the
FPT code. Id tokens: an embedding drawn from N(0, 1) (torch's default).
"""

from __future__ import annotations

import torch
from torch import nn

from reservoir.errors import UsageError
from reservoir.tasks import TaskSpec

ORTH_GAIN = 1.41


def make_input_layer(spec: TaskSpec, d_model: int, seed: int, scale: str = "paper") -> nn.Module:
    """The seeded input layer of a task at ``scale`` (``"paper"``: the FPT code's initialisation)."""
    if scale != "paper":
        raise UsageError(f"input scale {scale!r} is not supported; choose 'paper'")
    g = torch.Generator().manual_seed(seed)
    if spec.token_kind == "ids":
        layer = nn.Embedding(spec.vocab_size, d_model)
        with torch.no_grad():
            layer.weight.normal_(generator=g)
        return layer
    layer = nn.Linear(spec.token_dim, d_model)
    with torch.no_grad():
        nn.init.orthogonal_(layer.weight, gain=ORTH_GAIN, generator=g)
        layer.bias.zero_()
    return layer


def input_layer_tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu() for k, v in layer.state_dict().items()}

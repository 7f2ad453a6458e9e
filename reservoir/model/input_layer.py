"""The frozen input layer of the FPT: tokens -> model width, seeded and saved with the features.

Its scale (``--input-scale``) decides how strongly the input drives the frozen blocks:

- ``paper`` (default, reproduces the FPT code): dense tokens through a linear layer with
  orthogonal weights (gain 1.41) and zero bias; id tokens through an embedding drawn from
  N(0, 1) (torch's default), 50 times the std of GPT-2's own embeddings.
- ``matched``: the std of the backbone's own token embedding as loaded (for a random twin,
  its initialisation's, e.g. 0.02 for GPT-2; for an LSTM, which has none, its first layer's
  input weights'), :attr:`reservoir.model.backbones.Backbone.token_std`.
- a positive number: that std.

At a target std ``s``, an id embedding is drawn from N(0, s^2); a dense layer keeps its
orthogonal weights, with the gain that gives outputs of std ``s`` for inputs of unit
variance per coordinate (rows of squared norm ``min(1, token_dim / d_model)`` times the gain
squared).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from reservoir.errors import UsageError
from reservoir.tasks import TaskSpec

ORTH_GAIN = 1.41


def target_std(scale: str, token_std: float | None) -> float | None:
    """The std an input layer at ``scale`` is drawn at (``None``: the paper's initialisation)."""
    if scale == "paper":
        return None
    if scale == "matched":
        if token_std is None:
            raise UsageError(
                "--input-scale matched needs the backbone's token-embedding std, which this backbone "
                "does not report; pass a number (e.g. --input-scale 0.02) or paper"
            )
        return float(token_std)
    return float(scale)


def make_input_layer(
    spec: TaskSpec, d_model: int, seed: int, scale: str = "paper", token_std: float | None = None
) -> nn.Module:
    """The seeded input layer of a task at ``scale`` (module docstring); ``token_std`` is the
    backbone's, for ``"matched"``."""
    std = target_std(scale, token_std)
    g = torch.Generator().manual_seed(seed)
    if spec.token_kind == "ids":
        layer = nn.Embedding(spec.vocab_size, d_model)
        # drawn in whole blocks of 16 values, as torch draws them (a partial last block is drawn again), so an id's
        # row is the same whatever the vocabulary's size
        n = layer.weight.numel()
        drawn = torch.empty(max(16, -(-n // 16) * 16)).normal_(std=1.0 if std is None else std, generator=g)
        with torch.no_grad():
            layer.weight.copy_(drawn[:n].view_as(layer.weight))
        return layer
    layer = nn.Linear(spec.token_dim, d_model)
    gain = ORTH_GAIN if std is None else std / math.sqrt(min(1.0, spec.token_dim / d_model))
    with torch.no_grad():
        nn.init.orthogonal_(layer.weight, gain=gain, generator=g)
        layer.bias.zero_()
    return layer


def input_layer_tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu() for k, v in layer.state_dict().items()}

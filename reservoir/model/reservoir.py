"""The one forward path: frozen input layer -> backbone -> readout tokens at each depth.

``extract``, ``train`` and the scikit-learn transformer all build their model here, so the
features a file stores, the untrained end-to-end model and ``ReservoirFeatures`` are the
same numbers (tests check it).

- The **depth convention** is the backbones' (:mod:`reservoir.model.backbones`): depth ``k`` is
  the backbone truncated to its first ``k`` blocks, final norm included; depth 0 is the
  embedded input through that norm.
- The **readout rule** is :func:`readout_positions`: the last ``n_readout`` real tokens of
  each row, or with ``padded`` the last positions of rows padded to the task's length (the
  official FPT code's readout, which depends on padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from reservoir.errors import BackboneError
from reservoir.model.backbones import Backbone
from reservoir.model.input_layer import make_input_layer
from reservoir.tasks import TaskSpec


def readout_positions(lengths: torch.Tensor, n_readout: int, width: int | None = None) -> torch.Tensor:
    """The readout rule, defined once: positions ``(B, n_readout)`` of the last ``n_readout`` real
    tokens of each row, or (``width`` given, the padded readout) of the last ``n_readout``
    positions of rows padded to ``width``."""
    last = lengths if width is None else torch.full_like(lengths, width)
    return last[:, None] - n_readout + torch.arange(n_readout, device=lengths.device)[None, :]


def check_length(spec: TaskSpec, backbone: Backbone, backbone_name: str) -> None:
    """Refuse, before anything runs, a task longer than the backbone's positions."""
    limit = getattr(backbone, "max_positions", None)
    if limit is not None and spec.seq_len > limit:
        raise BackboneError(
            f"task {spec.name!r} has sequences of up to {spec.seq_len} tokens, but backbone {backbone_name!r} reads at "
            f"most {limit} positions; shorten the task (e.g. --task-opt max_len={limit} where the task has it) or "
            "choose a backbone with more positions"
        )


class Reservoir(nn.Module):
    """Frozen input layer -> dropout -> backbone -> hidden states of the readout tokens.

    Parameters
    ----------
    spec : the task's spec (token kind and width or vocabulary, readout count).
    backbone : the backbone (its blocks run up to the deepest requested depth).
    seed : seeds the input layer (:func:`reservoir.model.input_layer.make_input_layer`).
    input_scale : the input layer's scale (``"paper"``, ``"matched"`` or a std as text).
    dropout : after the input layer (training only; 0 for extraction).

    ``forward(tokens, lengths, depths, readout=None)`` returns ``(B, n_depths, n_readout, d)``
    in the backbone's dtype; ``readout=None`` reads the last real tokens.
    """

    def __init__(
        self,
        spec: TaskSpec,
        backbone: Backbone,
        *,
        seed: int,
        input_scale: str = "paper",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.spec = spec
        self.input_layer = make_input_layer(
            spec, backbone.input_width, seed, input_scale, getattr(backbone, "token_std", None)
        )
        self.dropout = nn.Dropout(dropout)
        self.backbone = backbone
        self.compute_dtype = torch.float32

    def to_compute(self, dtype: torch.dtype) -> Reservoir:
        """Run the backbone in ``dtype``; the input layer stays float32."""
        self.backbone.to(dtype)
        self.compute_dtype = dtype
        return self

    def forward(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        depths: Sequence[int],
        readout: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if readout is None:
            readout = readout_positions(lengths, self.spec.n_readout)
        x = self.dropout(self.input_layer(tokens)).to(self.compute_dtype)
        return self.backbone(x, lengths, depths, readout)


class FixedDepths(nn.Module):
    """``reservoir`` reading ``depths``, features as float32: ``(tokens, lengths, readout) -> (B,
    n_depths, n_readout, d)``, the module an engine runs."""

    def __init__(self, reservoir: Reservoir, depths: Sequence[int]):
        super().__init__()
        self.reservoir, self.depths = reservoir, tuple(depths)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
        return self.reservoir(tokens, lengths, self.depths, readout).float()

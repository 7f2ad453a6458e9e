"""LSTM reservoirs of the FPT paper (tables 3 to 5): 3 or 12 layers, 768 wide, optional
residual connections and learned positional embeddings. Depth ``k`` is the output of
layer ``k`` (no final norm); depth 0 is the embedded input (plus positions when used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from reservoir.model.backbones import Backbone, register_backbone, seeded, weight_std
from reservoir.model.backbones.base import Capabilities


@dataclass(frozen=True)
class LSTMConfig:
    n_layers: int = 3
    d_model: int = 768
    residual: bool = False
    positional: bool = False
    max_positions: int = 2048


LSTM_VARIANTS = {
    "lstm": LSTMConfig(),
    "lstm-12": LSTMConfig(n_layers=12),
    "lstm-12-residual": LSTMConfig(n_layers=12, residual=True),
    "lstm-12-residual-pos": LSTMConfig(n_layers=12, residual=True, positional=True),
    "lstm-pos": LSTMConfig(positional=True),
}


class LSTMBackbone(Backbone):
    family = "lstm"
    naming = ", ".join(LSTM_VARIANTS) + " (random init, the paper's tables 3 to 5)"
    example = "lstm"
    #: extraction batches of about this many tokens: each recurrent step is a product with one row per example
    batch_tokens = 32768
    #: no compile: torch.compile cannot capture nn.LSTM, so an automatic compile gains nothing
    capabilities = Capabilities(openvino=True)

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.d_model, self.n_layers = config.d_model, config.n_layers
        self.layers = nn.ModuleList(
            nn.LSTM(config.d_model, config.d_model, batch_first=True) for _ in range(config.n_layers)
        )
        self.wpe = nn.Embedding(config.max_positions, config.d_model) if config.positional else None
        self.max_positions = config.max_positions if config.positional else None
        # no token embedding: the std of the first layer's input weights, as initialised
        self.token_std = weight_std(self.layers[0].weight_ih_l0)

    def embed(self, x, lengths, readout, last):
        """``x``, plus the learned positions where the variant has them."""
        if self.wpe is None:
            return x, None
        return x + self.wpe(torch.arange(x.shape[1], device=x.device)).to(x.dtype), None

    def call_block(self, i, h, context):
        """Layer ``i``'s outputs, added to its input in a residual variant."""
        y, _ = self.layers[i](h)
        return h + y if self.config.residual else y

    @property
    def blocks(self) -> nn.ModuleList:
        return self.layers

    def param_groups(self):
        return {
            "pos": list(self.wpe.parameters()) if self.wpe is not None else [],
            "lstm": list(self.layers.parameters()),
        }


for _name, _cfg in LSTM_VARIANTS.items():
    _desc = (
        f"{_cfg.n_layers}-layer {_cfg.d_model}-wide LSTM"
        + (", residual" if _cfg.residual else "")
        + (", learned positions" if _cfg.positional else "")
        + ", random init"
    )

    def _factory(seed=0, _c=_cfg):
        with seeded(seed):
            return LSTMBackbone(_c)

    register_backbone(_name, help=_desc)(_factory)

"""GPT-2 family: hub ids or saved folders (pretrained), and ``-random`` twins built from the config."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from reservoir.backbones import (FAMILIES, Backbone, BackboneError, from_pretrained, gather, register_backbone,
                                 seeded, weight_std)

#: nanoGPT's table: shapes of the released GPT-2 sizes (hub id -> config arguments)
GPT2_SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}


class GPT2Backbone(Backbone):
    """A Hugging Face ``GPT2Model`` run block by block (learned positions ``wpe``, final ``ln_f``)."""

    family = "gpt2"

    def __init__(self, model):
        super().__init__()
        self.config = model.config
        self.wpe, self.drop, self.h, self.ln_f = model.wpe, model.drop, model.h, model.ln_f
        self.d_model, self.n_layers = model.config.n_embd, model.config.n_layer
        self.max_positions = model.config.n_positions
        self.token_std = weight_std(model.wte.weight)

    def states(self, x, lengths, depths: Sequence[int], readout):
        self.check_depths(depths)
        positions = torch.arange(x.shape[1], device=x.device)
        h = self.drop(x + self.wpe(positions).to(x.dtype))
        # keep only the readout rows of each wanted depth, not every hidden state
        out = {0: gather(h, readout)} if 0 in depths else {}
        for k, block in enumerate(self.h[: max(depths)], start=1):
            h = block(h)
            h = h[0] if isinstance(h, tuple) else h  # transformers < 5.3 returns (hidden, ...)
            if k in depths:
                out[k] = gather(h, readout)
        return [self.ln_f(out[d]) for d in depths]

    def param_groups(self):
        groups: dict[str, list[nn.Parameter]] = {"pos": list(self.wpe.parameters()), "ln": [], "attn": [], "ff": []}
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                groups["ln"] += list(module.parameters())
        for block in self.h:
            groups["attn"] += list(block.attn.parameters())
            groups["ff"] += list(block.mlp.parameters())
        return groups


def load_gpt2(path: str, seed: int = 0) -> GPT2Backbone:
    from transformers import GPT2Model

    try:
        model = from_pretrained(GPT2Model, path)
    except OSError as e:
        raise BackboneError(
            f"cannot load GPT-2 weights from {path!r} ({str(e).splitlines()[0]}); pass a folder saved with "
            "save_pretrained (the hub is unreachable here), or use gpt2-random") from None
    return GPT2Backbone(model)


def random_gpt2(seed: int = 0, **shape) -> GPT2Backbone:
    from transformers import GPT2Config, GPT2Model

    with seeded(seed):
        return GPT2Backbone(GPT2Model(GPT2Config(**shape)))


FAMILIES["gpt2"] = load_gpt2
for _name, _shape in GPT2_SIZES.items():
    register_backbone(_name, help=f"pretrained GPT-2 ({_shape['n_layer']} blocks x {_shape['n_embd']}), hub id or cache")(
        lambda seed=0, _n=_name: load_gpt2(_n, seed))
    register_backbone(f"{_name}-random", help=f"{_name} architecture, default random initialisation, no download")(
        lambda seed=0, _s=_shape: random_gpt2(seed, **_s))

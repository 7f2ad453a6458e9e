"""GPT-2 family: hub ids or saved folders (pretrained), and ``-random`` twins built from the config."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from reservoir.model.backbones import (FAMILIES, Backbone, BackboneError, at_readout, from_pretrained, gather, hooked,
                                 readout_attention, register_backbone, seeded, weight_std)

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
    openvino = True

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
        last = max(depths)
        for k, block in enumerate(self.h[:last], start=1):
            if k == last and self.readout_last_block and readout_block_supported(block):
                out[k] = readout_block(block, h, readout)
                break
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


def readout_block_supported(block: nn.Module) -> bool:
    """Whether :func:`readout_block` computes exactly what ``block`` does: a plain ``GPT2Block``
    self-attention block without ``reorder_and_upcast_attn`` (an eager-attention-only upcast
    not reproduced here) and without hooks on it or its attention."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    if type(block) is not GPT2Block:
        return False
    attn = block.attn
    return not (attn.is_cross_attention or attn.reorder_and_upcast_attn or hooked(block, attn))


def _columns(module: nn.Module, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Output features ``start:stop`` of a projection (transformers' ``Conv1D`` or ``nn.Linear``)
    without computing the others (a module with a ``columns(x, start, stop)`` method computes them
    itself); any other module, or one whose weight is not a plain tensor (a quantized one), runs
    whole and is sliced."""
    from transformers.pytorch_utils import Conv1D

    if hasattr(module, "columns"):
        return module.columns(x, start, stop)
    plain = type(getattr(module, "weight", None)) in (torch.Tensor, nn.Parameter)
    if type(module) is Conv1D and plain:  # x @ W + b with W (in, out), as Conv1D.forward computes it
        y = torch.addmm(module.bias[start:stop], x.reshape(-1, x.shape[-1]), module.weight[:, start:stop])
        return y.view(*x.shape[:-1], stop - start)
    if type(module) is nn.Linear and plain:
        bias = None if module.bias is None else module.bias[start:stop]
        return nn.functional.linear(x, module.weight[start:stop], bias)
    return module(x)[..., start:stop]


def readout_block(block: nn.Module, h: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """``gather(block(h), readout)`` computing only what the readout rows need: ``(B, R, d)``.

    ``ln_1`` and the key/value projections run on every position (the readout queries attend
    to them, causally); queries, attention output, residual, ``ln_2`` and the MLP run on the
    ``R`` readout rows only. The scale follows ``scale_attn_weights`` and
    ``scale_attn_by_inverse_layer_idx``; dropout acts as in the block (training only).
    """
    attn = block.attn
    d, hd = attn.embed_dim, attn.head_dim
    normed = block.ln_1(h)
    kv = _columns(attn.c_attn, normed, d, 3 * d)
    k, v = (t.reshape(*t.shape[:2], -1, hd).transpose(1, 2) for t in kv.split(d, dim=2))
    scale = hd ** -0.5 if attn.scale_attn_weights else 1.0
    if attn.scale_attn_by_inverse_layer_idx:
        scale /= float(attn.layer_idx + 1)
    with at_readout(block, readout):
        q = _columns(attn.c_attn, gather(normed, readout), 0, d)
        q = q.reshape(*q.shape[:2], -1, hd).transpose(1, 2)
        a = readout_attention(q, k, v, readout, scale, attn.attn_dropout.p if attn.training else 0.0)
        x = gather(h, readout) + attn.resid_dropout(attn.c_proj(a))
        return x + block.mlp(block.ln_2(x))


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

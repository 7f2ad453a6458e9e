"""GPT-2 family adapter: learned positions ``wpe``, blocks ``h``, final ``ln_f``; the readout-only
deepest block; the released sizes as registered names and their ``-random``/``-stats`` twins."""

from __future__ import annotations

import torch
from torch import nn

from reservoir.model.backbones.base import (
    Capabilities,
    at_readout,
    columns,
    first_output,
    gather,
    hooked,
    make_mask,
    readout_attention,
)
from reservoir.model.backbones.hf import HFBackbone, Parts, load_model, random_model, register_family

#: nanoGPT's table: shapes of the released GPT-2 sizes (hub id -> config arguments)
GPT2_SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}


@register_family
class GPT2Backbone(HFBackbone):
    """A Hugging Face ``GPT2Model`` run block by block (learned positions ``wpe``, final ``ln_f``)."""

    family = "gpt2"
    model_types = ("gpt2",)
    naming = "gpt2, gpt2-medium, gpt2-large, gpt2-xl (hub id or cache), or a GPT-2 save_pretrained folder"
    example = "gpt2-random"
    capabilities = Capabilities(readout_block=True, openvino=True, compile=True)
    by_hooks = False

    def locate(self) -> Parts:
        m = self.model
        return Parts(m.h, (m.ln_f,), m.wte, [m.wpe], m.config.n_positions)

    def embed(self, x, lengths, readout, last):
        """``x`` plus the learned positions, through the embedding dropout; the causal mask (``None``
        under SDPA, its own causal mask; an explicit one under eager attention, for attention maps)."""
        from transformers.masking_utils import create_causal_mask

        m = self.model
        positions = torch.arange(x.shape[1], device=x.device)
        h = m.drop(x + m.wpe(positions).to(x.dtype))
        mask = make_mask(
            create_causal_mask, h, positions, config=self.config, attention_mask=None, position_ids=None
        )
        return h, mask

    def call_block(self, i, h, mask):
        return first_output(
            self.blocks[i](h, attention_mask=mask)
        )  # transformers < 5.3 returns (hidden, ...)

    def readout_block(self, i, h, readout, mask):
        block = self.blocks[i]
        return readout_block(block, h, readout) if readout_block_supported(block) else None


def readout_block_supported(block: nn.Module) -> bool:
    """Whether :func:`readout_block` computes exactly what ``block`` does: a GPT-2 self-attention
    block (``ln_1``, ``attn.c_attn``/``c_proj``, ``ln_2``, ``mlp``) without
    ``reorder_and_upcast_attn`` (an eager-attention-only upcast not reproduced here), without
    cross-attention and without hooks on it or its attention."""
    attn = getattr(block, "attn", None)
    if (
        attn is None
        or not all(hasattr(block, n) for n in ("ln_1", "ln_2", "mlp"))
        or any(hasattr(block, n) for n in ("crossattention", "ln_cross_attn"))
    ):
        return False
    return not (attn.is_cross_attention or attn.reorder_and_upcast_attn or hooked(block, attn))


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
    kv = columns(attn.c_attn, normed, d, 3 * d)
    k, v = (t.reshape(*t.shape[:2], -1, hd).transpose(1, 2) for t in kv.split(d, dim=2))
    scale = hd**-0.5 if attn.scale_attn_weights else 1.0
    if attn.scale_attn_by_inverse_layer_idx:
        scale /= float(attn.layer_idx + 1)
    with at_readout(block, readout):
        q = columns(attn.c_attn, gather(normed, readout), 0, d)
        q = q.reshape(*q.shape[:2], -1, hd).transpose(1, 2)
        a = readout_attention(q, k, v, readout, scale, attn.attn_dropout.p if attn.training else 0.0)
        x = gather(h, readout) + attn.resid_dropout(attn.c_proj(a))
        return x + block.mlp(block.ln_2(x))


def load_gpt2(path: str, seed: int = 0) -> GPT2Backbone:
    return GPT2Backbone(load_model(path))


def random_gpt2(seed: int = 0, **shape) -> GPT2Backbone:
    from transformers import GPT2Config

    return GPT2Backbone(random_model(GPT2Config(**shape), seed))


def _register() -> None:
    """The released sizes by name; their ``-random`` twins are built from the size's config."""
    from reservoir.model.backbones import register_backbone

    for name, shape in GPT2_SIZES.items():
        register_backbone(
            name,
            help=f"pretrained GPT-2 ({shape['n_layer']} blocks x {shape['n_embd']}), hub id or cache",
            random=lambda seed=0, _s=shape: random_gpt2(seed, **_s),
            stats=True,
        )(lambda seed=0, _n=name: load_gpt2(_n, seed))


_register()

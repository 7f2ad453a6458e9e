"""Llama-shaped decoder adapter: Llama, Mistral, Qwen2, Qwen3 (rotary positions, RMSNorm, pre-norm).

Blocks ``layers``, final ``norm``, token embedding ``embed_tokens``; the FPT's positions are the added
``wpe`` (zero at the start), rotary positions still act inside attention. Causal, so right padding
needs no mask. Each block gets the mask of its attention kind as the model builds it: full causal, or
causal within a sliding window (``config.layer_types``, else ``config.sliding_window``).

The readout-only deepest block is chosen by the block's structure, not its class: a block
with exactly ``self_attn``, ``mlp``, ``input_layernorm`` and ``post_attention_layernorm``, whose
attention has ``q_proj``/``k_proj``/``v_proj``/``o_proj`` (and optionally per-head ``q_norm``/
``k_norm``, as Qwen3), no logit soft-capping and no hooks. Anything else runs the whole block.
"""

from __future__ import annotations

import torch
from torch import nn

from reservoir.model.backbones.base import (
    Capabilities,
    at_readout,
    first_output,
    gather,
    hooked,
    make_mask,
    readout_attention,
)
from reservoir.model.backbones.hf import HFBackbone, Parts, register_family

#: the children a block must have, exactly, for the readout-only path
LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj"}
OPTIONAL_ATTENTION_PARTS = {"q_norm", "k_norm"}


@register_family
class RotaryBackbone(HFBackbone):
    """A Llama-shaped decoder (``LlamaModel``, ``MistralModel``, ``Qwen2Model``, ``Qwen3Model``)."""

    family = "llama"
    model_types = ("llama", "mistral", "qwen2", "qwen3")
    naming = "a save_pretrained folder of Llama, Mistral, Qwen2 or Qwen3 (smollm2-135m is one)"
    example = "smollm2-135m-random"
    #: no OpenVINO for engine="auto": OpenVINO computes the pretrained SmolLM2-135M wrongly in bf16
    #: (docs/benchmarks.md, "Constants the code takes from these measurements")
    capabilities = Capabilities(readout_block=True, compile=True)
    by_hooks = False

    def locate(self) -> Parts:
        m = self.model
        return Parts(m.layers, (m.norm,), m.embed_tokens, [], None)

    def layer_kind(self, i: int) -> str:
        kinds = getattr(self.config, "layer_types", None)
        if kinds:
            return kinds[i]
        window = getattr(self.config, "sliding_window", None) and getattr(
            self.config, "use_sliding_window", True
        )
        return "sliding_attention" if window else "full_attention"

    def window(self, i: int) -> int | None:
        return self.config.sliding_window if self.layer_kind(i) == "sliding_attention" else None

    def masks(self, h: torch.Tensor, positions: torch.Tensor, kinds: set[str]) -> dict[str, object]:
        """The attention mask of each kind the blocks use (``None`` for SDPA's own causal mask)."""
        from transformers import masking_utils

        build = {
            "full_attention": masking_utils.create_causal_mask,
            "sliding_attention": masking_utils.create_sliding_window_causal_mask,
        }
        # no position_ids: they would only serve to detect packed sequences, which a traced graph cannot express
        return {
            kind: make_mask(
                build[kind], h, positions, config=self.config, attention_mask=None, position_ids=None
            )
            for kind in kinds
        }

    def embed(self, x, lengths, readout, last):
        """``x`` plus the added positions; what each block reads: the masks of the attention kinds
        the first ``last`` blocks use, the rotary embeddings and the positions."""
        h = self.add_positions(x)
        positions = torch.arange(x.shape[1], device=x.device)
        position_ids = positions[None]
        rotary = self.model.rotary_emb(h, position_ids=position_ids)
        masks = self.masks(h, positions, {self.layer_kind(i) for i in range(last)})
        return h, (masks, rotary, position_ids)

    def call_block(self, i, h, context):
        masks, rotary, position_ids = context
        return first_output(
            self.blocks[i](
                h,
                attention_mask=masks[self.layer_kind(i)],
                position_embeddings=rotary,
                position_ids=position_ids,
            )
        )

    def readout_block(self, i, h, readout, context):
        layer = self.blocks[i]
        if not readout_supported(layer, self.config):
            return None
        return readout_layer(layer, h, context[1], readout, self.window(i))


def _children(module: nn.Module) -> set[str]:
    return {name for name, _ in module.named_children()}


def readout_supported(layer: nn.Module, config) -> bool:
    """Whether :func:`readout_layer` computes exactly what ``layer`` does (module docstring)."""
    attn = getattr(layer, "self_attn", None)
    if _children(layer) != LAYER_PARTS or attn is None:
        return False
    extra = _children(attn) - ATTENTION_PARTS
    if not _children(attn) >= ATTENTION_PARTS or not extra <= OPTIONAL_ATTENTION_PARTS:
        return False
    if (
        getattr(config, "attn_logit_softcapping", None)
        or not hasattr(attn, "scaling")
        or not hasattr(attn, "head_dim")
    ):
        return False
    return not hooked(layer, attn)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x (B, heads, n, hd)`` with ``cos``, ``sin`` ``(B or 1, n, hd)``: Llama's
    ``apply_rotary_pos_emb`` for one tensor (queries and keys sit at different positions here)."""
    from transformers.models.llama.modeling_llama import rotate_half

    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def _heads(attn: nn.Module, proj: str, norm: str, x: torch.Tensor) -> torch.Tensor:
    """``proj(x)`` as ``(B, heads, n, hd)``, with the per-head norm where the attention has one (Qwen3)."""
    y = getattr(attn, proj)(x).view(*x.shape[:2], -1, attn.head_dim)
    if hasattr(attn, norm):
        y = getattr(attn, norm)(y)
    return y.transpose(1, 2)


def readout_layer(
    layer: nn.Module,
    h: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    readout: torch.Tensor,
    window: int | None = None,
) -> torch.Tensor:
    """``gather(layer(h), readout)`` computing only what the readout rows need: ``(B, R, d)``.

    ``input_layernorm`` and the key/value projections run on all positions; queries, ``o_proj``,
    residual, ``post_attention_layernorm`` and the MLP on the readout rows only.
    """
    attn = layer.self_attn
    cos, sin = rotary  # (1, T, hd)
    normed = layer.input_layernorm(h)
    k = _rotate(_heads(attn, "k_proj", "k_norm", normed), cos, sin)
    v = attn.v_proj(normed).view(*h.shape[:2], -1, attn.head_dim).transpose(1, 2)
    with at_readout(layer, readout):
        q = _rotate(
            _heads(attn, "q_proj", "q_norm", gather(normed, readout)), cos[0][readout], sin[0][readout]
        )
        a = readout_attention(
            q, k, v, readout, attn.scaling, attn.attention_dropout if attn.training else 0.0, window=window
        )
        x = gather(h, readout) + attn.o_proj(a)
        return x + layer.mlp(layer.post_attention_layernorm(x))

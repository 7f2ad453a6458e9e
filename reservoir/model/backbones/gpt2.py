"""GPT-2 family adapter: learned positions ``wpe``, blocks ``h``, final ``ln_f``; the readout-only
deepest block; the released sizes as registered names and their ``-random``/``-stats`` twins.

A ``-random`` twin of a released size is built natively (:class:`NativeGPT2`: GPT-2's blocks in plain
torch, with transformers' parameter names, initialisation and computation), so a job on random GPT-2
weights never imports transformers. Pretrained weights, folders and ``-stats`` twins load through
transformers' ``GPT2Model``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

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
    seeded,
)
from reservoir.model.backbones.hf import HFBackbone, Parts, load_model, model_from_config, register_family

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
        # transformers < 5.3 returns (hidden, ...)
        return first_output(self.blocks[i](h, attention_mask=mask))

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

    ``ln_1`` and the key/value projections run on every position; queries, attention output, residual,
    ``ln_2`` and the MLP on the ``R`` readout rows only.
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


@dataclass(frozen=True)
class GPT2Shape:
    """The settings of a native GPT-2 (transformers' ``GPT2Config`` names and defaults)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024
    vocab_size: int = 50257
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    model_type: str = "gpt2"

    @property
    def hidden_size(self) -> int:
        return self.n_embd


def _linear(n_in: int, n_out: int) -> nn.Linear:
    """An ``nn.Linear`` whose tensors are allocated, not drawn (:meth:`NativeGPT2.init_weights` draws them
    once: its own kaiming draw would be thrown away)."""
    m = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(m)
    m.in_features, m.out_features = n_in, n_out
    m.weight, m.bias = nn.Parameter(torch.empty(n_out, n_in)), nn.Parameter(torch.empty(n_out))
    return m


class GPT2Attention(nn.Module):
    """GPT-2's causal self-attention: fused ``c_attn`` (queries, keys, values), ``c_proj``, scaled by
    ``head_dim ** -0.5``. Returns ``(output, weights)``; the weights only when asked
    (``output_attentions=True``, as transformers' eager attention returns them)."""

    def __init__(self, shape: GPT2Shape, layer_idx: int):
        super().__init__()
        d = shape.n_embd
        self.embed_dim, self.num_heads, self.head_dim, self.layer_idx = (
            d,
            shape.n_head,
            d // shape.n_head,
            layer_idx,
        )
        self.scale_attn_weights, self.scale_attn_by_inverse_layer_idx = True, False
        self.reorder_and_upcast_attn = self.is_cross_attention = False
        self.c_attn, self.c_proj = _linear(d, 3 * d), _linear(d, d)
        self.attn_dropout, self.resid_dropout = nn.Dropout(shape.attn_pdrop), nn.Dropout(shape.resid_pdrop)

    def forward(self, h: torch.Tensor, attention_mask=None, output_attentions: bool = False, **_):
        q, k, v = (
            t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
            for t in self.c_attn(h).split(self.embed_dim, 2)
        )
        p = self.attn_dropout.p if self.training else 0.0
        if output_attentions:
            scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
            causal = torch.ones(h.shape[1], h.shape[1], dtype=torch.bool, device=h.device).tril()
            weights = torch.softmax(scores.masked_fill(~causal, torch.finfo(scores.dtype).min), -1).to(
                v.dtype
            )
            a = nn.functional.dropout(weights, p, self.training) @ v
        else:
            weights = None
            a = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_dropout(self.c_proj(a.transpose(1, 2).flatten(2))), weights


class GPT2MLP(nn.Module):
    def __init__(self, shape: GPT2Shape):
        super().__init__()
        self.c_fc, self.c_proj = (
            _linear(shape.n_embd, 4 * shape.n_embd),
            _linear(4 * shape.n_embd, shape.n_embd),
        )
        self.dropout = nn.Dropout(shape.resid_pdrop)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        """``gelu_new`` in one fused kernel (torch's tanh-approximated GELU): transformers' values within
        float32's rounding."""
        return nn.functional.gelu(x, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, shape: GPT2Shape, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.n_embd, eps=shape.layer_norm_epsilon)
        self.attn = GPT2Attention(shape, layer_idx)
        self.ln_2 = nn.LayerNorm(shape.n_embd, eps=shape.layer_norm_epsilon)
        self.mlp = GPT2MLP(shape)

    def forward(self, h: torch.Tensor, attention_mask=None, **_) -> torch.Tensor:
        h = h + self.attn(self.ln_1(h))[0]
        return h + self.mlp(self.ln_2(h))


def _transposed(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """A projection's weight in a state dict as transformers' ``Conv1D`` holds it, ``(in, out)``: the
    transpose of ``nn.Linear``'s, both ways (a state-dict post-hook and a load pre-hook)."""
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = state_dict[key].t()


class NativeGPT2(nn.Module):
    """GPT-2 without its token embedding (the FPT input layer replaces it), drawn as transformers
    initialises ``GPT2Model``: N(0, ``initializer_range``) weights, ``c_proj`` scaled by 1/sqrt(2 n_layer),
    zero biases, unit norms. Projections are ``nn.Linear``; its state dict holds their weights as
    transformers' ``Conv1D`` does (transposed), so it is ``GPT2Model``'s state dict less the token embedding."""

    def __init__(self, shape: GPT2Shape):
        super().__init__()
        self.config = shape
        self.wpe = nn.Embedding(shape.n_positions, shape.n_embd)
        self.drop = nn.Dropout(shape.embd_pdrop)
        self.h = nn.ModuleList(GPT2Block(shape, i) for i in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd, eps=shape.layer_norm_epsilon)
        for m in self.modules():
            if isinstance(m, nn.Linear):  # saved and loaded as transformers' Conv1D holds it
                m.register_state_dict_post_hook(_transposed)
                m.register_load_state_dict_pre_hook(_transposed)

    @torch.no_grad()
    def init_weights(self) -> NativeGPT2:
        std = self.config.initializer_range
        for name, m in self.named_modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight), nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.Linear, nn.Embedding)):
                scaled = name.endswith("c_proj")
                m.weight.normal_(0.0, std / math.sqrt(2 * self.config.n_layer) if scaled else std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        return self


class NativeGPT2Backbone(GPT2Backbone):
    """:class:`GPT2Backbone` over :class:`NativeGPT2` (a ``-random`` twin); nothing here imports transformers
    but saving as a folder, which writes transformers' ``GPT2Model``."""

    def __init__(self, model: NativeGPT2):
        super().__init__(model, quiet=True)
        self.d_input = model.config.n_embd
        self.token_std = model.config.initializer_range  # the std the token embedding is drawn with

    def locate(self) -> Parts:
        m = self.model
        return Parts(m.h, (m.ln_f,), None, [m.wpe], m.config.n_positions)

    def is_causal(self) -> bool:
        return True

    def embed(self, x, lengths, readout, last):
        positions = torch.arange(x.shape[1], device=x.device)
        return self.model.drop(x + self.model.wpe(positions).to(x.dtype)), None

    def eager_attention(self):
        return contextlib.nullcontext()  # its attention computes the weights whenever they are asked for

    def check_saveable(self) -> None:
        pass

    def to_transformers(self) -> nn.Module:
        """Transformers' ``GPT2Model`` of these weights (its token embedding drawn from seed 0)."""
        from transformers import GPT2Config

        shape = dataclasses.asdict(self.model.config)
        shape.pop("model_type")
        with seeded(0):
            model = model_from_config(GPT2Config(**shape))
        model.load_state_dict(self.model.state_dict(), strict=False)
        return model.to(next(self.model.parameters()).dtype)

    def save_pretrained(self, folder) -> None:
        """Write :meth:`to_transformers`'s model as :meth:`HFBackbone.save_pretrained` writes one."""
        hf = GPT2Backbone(self.to_transformers())
        hf.token_std = self.token_std
        hf.save_pretrained(folder)


def random_gpt2(seed: int = 0, **shape) -> NativeGPT2Backbone:
    """A GPT-2 of ``shape`` with its default initialisation drawn from ``seed``; built natively."""
    with seeded(seed):
        return NativeGPT2Backbone(NativeGPT2(GPT2Shape(**shape)).init_weights())


def _register() -> None:
    """The released sizes by name; their ``-random`` twins are built from the size's config."""
    from reservoir.model.backbones import register_backbone

    for name, shape in GPT2_SIZES.items():
        register_backbone(
            name,
            help=f"pretrained GPT-2 ({shape['n_layer']} blocks x {shape['n_embd']}), hub id or cache",
            random=lambda seed=0, _s=shape: random_gpt2(seed, **_s),
            stats=True,
        )(lambda seed=0, _n=name: GPT2Backbone(load_model(_n)))


_register()

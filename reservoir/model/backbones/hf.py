"""Generic Hugging Face backbones: Llama-family causal LMs and BERT-family encoders.

Hidden size, depth and attention come from the model's config; each family is the
Hugging Face model run block by block, so depth ``k`` equals the model with its layer list
cut to ``k`` blocks (a test checks this for every family).

- **Llama family** (rotary positions, RMSNorm, pre-norm): the FPT's position parameters
  become a learned additive embedding ``wpe`` added after the input layer, initialised to
  zero so that frozen features are exactly the pretrained model's; rotary positions still
  act inside attention. Causal, so right padding needs no mask. Final ``norm`` applied.
- **BERT family** (``bert``, ``roberta``; bidirectional, post-norm): the model's own
  embedding module adds positions and token type 0 to the input layer's output and
  normalises; an attention mask over padding keeps a row's features independent of how
  far the batch was padded. Every block ends in a LayerNorm, so there is no extra final
  norm. The readout token is the last real token, as for every family (DESIGN.md).

Random twins of the GPT-2 family are built here too (:data:`FROM_CONFIG`).
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch
from torch import nn

from reservoir.model.backbones import (FAMILIES, FROM_CONFIG, Backbone, BackboneError, at_readout, from_pretrained, gather,
                                 hooked, readout_attention, register_backbone, stats_init, weight_std)
from reservoir.model.backbones.gpt2 import GPT2_SIZES, GPT2Backbone, load_gpt2

#: longest sequence the learned additive position embedding of a rotary model covers
#: (the paper's longest inputs are 2,000 ListOps tokens); capped so that 128k-context
#: configs do not allocate gigabytes of zeros
MAX_ADDED_POSITIONS = 4096


def _check_length(x: torch.Tensor, limit: int, name: str) -> None:
    if x.shape[1] > limit:
        raise BackboneError(f"{name} reads at most {limit} tokens; got a batch of {x.shape[1]}. "
                            "Choose a task with shorter sequences or a backbone with more positions")


def _params(modules) -> list[nn.Parameter]:
    return [p for m in modules for p in m.parameters()]


def _without(params: list[nn.Parameter], exclude: list[nn.Parameter]) -> list[nn.Parameter]:
    ids = {id(p) for p in exclude}
    return [p for p in params if id(p) not in ids]


def _make_mask(fn, embeds, cache_position, **kwargs):
    """Call a ``transformers.masking_utils`` mask builder across versions: its embeddings argument
    was ``input_embeds`` before 5.2, and ``cache_position`` was required before 5.4 (later dropped)."""
    params = inspect.signature(fn).parameters
    kwargs["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = embeds
    if "cache_position" in params:
        kwargs["cache_position"] = cache_position
    return fn(**kwargs)


class RotaryBackbone(Backbone):
    """A Llama-family decoder (``LlamaModel``) without its token embedding.

    Parameters
    ----------
    model : a ``LlamaModel`` (or a causal-LM wrapper's ``.model``); its ``embed_tokens`` is
        dropped, since the FPT input layer replaces it.
    """

    family = "llama"
    #: not taken by engine="auto": in bf16, OpenVINO's features of the pretrained SmolLM2-135M differ
    #: from PyTorch float32's by 30% to 77% from block 3 on (PyTorch bf16's: at most 5%; the random
    #: twin's under OpenVINO: 0.5%); float32 agrees to 3e-6
    openvino = False

    def __init__(self, model):
        super().__init__()
        self.config = model.config
        self.layers, self.norm, self.rotary_emb = model.layers, model.norm, model.rotary_emb
        self.d_model, self.n_layers = model.config.hidden_size, model.config.num_hidden_layers
        n_pos = min(getattr(model.config, "max_position_embeddings", MAX_ADDED_POSITIONS), MAX_ADDED_POSITIONS)
        self.wpe = nn.Embedding(n_pos, self.d_model)
        self.max_positions = n_pos
        nn.init.zeros_(self.wpe.weight)
        self.token_std = weight_std(model.embed_tokens.weight)

    def states(self, x, lengths, depths: Sequence[int], readout):
        from transformers.masking_utils import create_causal_mask

        self.check_depths(depths)
        _check_length(x, self.wpe.num_embeddings, f"{self.config.model_type} (learned additive positions)")
        positions = torch.arange(x.shape[1], device=x.device)
        h = x + self.wpe(positions).to(x.dtype)
        position_ids = positions[None]
        rotary = self.rotary_emb(h, position_ids=position_ids)
        # None for SDPA (is_causal); an explicit causal mask for eager attention. No position_ids: they
        # would only serve to detect packed sequences, which a traced graph (OpenVINO) cannot express
        mask = _make_mask(create_causal_mask, h, positions, config=self.config, attention_mask=None,
                          past_key_values=None, position_ids=None)
        out = {0: gather(h, readout)} if 0 in depths else {}
        last = max(depths)
        for k, layer in enumerate(self.layers[:last], start=1):
            if k == last and self.readout_last_block and rotary_readout_supported(layer):
                out[k] = rotary_readout_layer(layer, h, rotary, readout)
                break
            h = layer(h, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids)
            h = h[0] if isinstance(h, tuple) else h
            if k in depths:
                out[k] = gather(h, readout)
        return [self.norm(out[d]) for d in depths]

    def param_groups(self):
        norm_type = type(self.norm)
        ln = _params(m for m in self.modules() if isinstance(m, (norm_type, nn.LayerNorm)))
        return {"pos": list(self.wpe.parameters()), "ln": ln,
                "attn": _params(layer.self_attn for layer in self.layers),
                "ff": _params(layer.mlp for layer in self.layers)}


def rotary_readout_supported(layer: nn.Module) -> bool:
    """Whether :func:`rotary_readout_layer` computes exactly what ``layer`` does: a plain
    ``LlamaDecoderLayer`` with ``LlamaAttention`` (no sliding window) and no hooks on either."""
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer

    if type(layer) is not LlamaDecoderLayer or type(layer.self_attn) is not LlamaAttention:
        return False
    return getattr(layer.self_attn.config, "sliding_window", None) is None and not hooked(layer, layer.self_attn)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x (B, heads, n, hd)`` with ``cos``, ``sin`` ``(B or 1, n, hd)``: Llama's
    ``apply_rotary_pos_emb`` for one tensor (queries and keys sit at different positions here)."""
    from transformers.models.llama.modeling_llama import rotate_half

    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def rotary_readout_layer(layer: nn.Module, h: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                         readout: torch.Tensor) -> torch.Tensor:
    """``gather(layer(h), readout)`` computing only what the readout rows need: ``(B, R, d)``.

    ``input_layernorm`` and the key/value projections (rotary at every position) run on all
    positions; queries (rotary at the readout positions), ``o_proj``, residual,
    ``post_attention_layernorm`` and the MLP on the readout rows only. Grouped key-value
    heads are shared as in ``repeat_kv``.
    """
    attn = layer.self_attn
    hd = attn.head_dim
    cos, sin = rotary  # (1, T, hd)
    normed = layer.input_layernorm(h)
    k = _rotate(attn.k_proj(normed).view(*h.shape[:2], -1, hd).transpose(1, 2), cos, sin)
    v = attn.v_proj(normed).view(*h.shape[:2], -1, hd).transpose(1, 2)
    with at_readout(layer, readout):
        q = attn.q_proj(gather(normed, readout)).view(*readout.shape, -1, hd).transpose(1, 2)
        q = _rotate(q, cos[0][readout], sin[0][readout])
        a = readout_attention(q, k, v, readout, attn.scaling, attn.attention_dropout if attn.training else 0.0)
        x = gather(h, readout) + attn.o_proj(a)
        return x + layer.mlp(layer.post_attention_layernorm(x))


class EncoderBackbone(Backbone):
    """A BERT-family encoder (``BertModel``, ``RobertaModel``) without word embeddings or pooler."""

    family = "bert"
    causal = False
    openvino = True

    def __init__(self, model):
        super().__init__()
        self.config = model.config
        self.embeddings, self.layers = model.embeddings, model.encoder.layer
        self.token_std = weight_std(self.embeddings.word_embeddings.weight)
        self.embeddings.word_embeddings = None  # the FPT input layer replaces it; inputs_embeds path never reads it
        self.d_model, self.n_layers = model.config.hidden_size, model.config.num_hidden_layers
        offset = model.config.pad_token_id + 1 if model.config.model_type == "roberta" else 0  # RoBERTa counts from pad+1
        self.max_positions = model.config.max_position_embeddings - offset

    def states(self, x, lengths, depths: Sequence[int], readout):
        try:
            from transformers.masking_utils import create_bidirectional_mask
        except ImportError:  # transformers < 5.0: the layers take an additive (B, 1, 1, T) mask
            create_bidirectional_mask = None

        self.check_depths(depths)
        _check_length(x, self.max_positions, self.config.model_type)
        h = self.embeddings(inputs_embeds=x)
        real = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
        if create_bidirectional_mask is None:
            mask = (1.0 - real[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        else:
            mask = _make_mask(create_bidirectional_mask, h, None, config=self.config, attention_mask=real.long())
        out = {0: h}
        for k, layer in enumerate(self.layers[: max(depths)], start=1):
            h = layer(h, attention_mask=mask)
            h = h[0] if isinstance(h, tuple) else h
            out[k] = h
        return [gather(out[d], readout) for d in depths]

    def param_groups(self):
        emb = self.embeddings
        ln = _params(m for m in self.modules() if isinstance(m, nn.LayerNorm))
        pos = list(emb.position_embeddings.parameters()) + list(emb.token_type_embeddings.parameters())
        return {"pos": pos, "ln": ln,
                "attn": _without(_params(layer.attention for layer in self.layers), ln),
                "ff": _without(_params(m for layer in self.layers for m in (layer.intermediate, layer.output)), ln)}


def _load(wrap, path: str):
    from transformers import AutoModel

    try:
        model = from_pretrained(AutoModel, path, dtype=torch.float32)
    except OSError as e:
        raise BackboneError(
            f"cannot load weights from {path!r} ({str(e).splitlines()[0]}); pass a folder saved with "
            "save_pretrained (the hub is unreachable here), or use the -random twin") from None
    return wrap(model)


def _from_config(wrap, config):
    from transformers import AutoModel

    return wrap(AutoModel.from_config(config, dtype=torch.float32))


#: model_type -> wrapper of the Hugging Face base model
WRAPPERS = {"llama": RotaryBackbone, "bert": EncoderBackbone, "roberta": EncoderBackbone}

for _type, _wrap in WRAPPERS.items():
    FAMILIES[_type] = lambda path, seed=0, _w=_wrap: _load(_w, path)
    FROM_CONFIG[_type] = lambda config, seed=0, _w=_wrap: _from_config(_w, config)

FROM_CONFIG["gpt2"] = lambda config, seed=0: _from_config(GPT2Backbone, config)

for _name in GPT2_SIZES:
    register_backbone(f"{_name}-stats", help=f"{_name} with each tensor redrawn from N(mean, std) of the pretrained one")(
        lambda seed=0, _n=_name: stats_init(load_gpt2(_n, seed), seed))

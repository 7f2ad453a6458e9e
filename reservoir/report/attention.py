"""Attention probabilities of one block of a frozen backbone for one example (FPT paper, figures 3 to 5).

The example goes through the project's own forward path (:class:`reservoir.runtime.runner.Reservoir`:
the seeded input layer, then the backbone's blocks as :mod:`reservoir.model.backbones` runs them);
a pre-hook on the attention module of block ``layer`` catches that module's inputs (the
block's normed hidden states and, for rotary models, the position embeddings), stops the
forward there, and the probabilities ``softmax(Q K^T * scale + mask)`` are computed from the
block's own projections. Tests check them against Hugging Face's ``output_attentions=True``.

Families with attention register a reader in :data:`READERS` (keyed by ``Backbone.family``):
``gpt2`` (``ln_1`` -> ``c_attn``), ``llama`` (``input_layernorm`` -> ``q_proj``/``k_proj`` with
rotary positions and grouped key-value heads) and ``bert`` (``query``/``key``; one example
has no padding, so no mask). An LSTM has no attention and is refused.

With ``checkpoint``, the input layer, positions and layer norms are the ones an end-to-end
``reservoir train`` run learned (its best-validation parameters), which is what the paper's
figures show: the frozen attention weights read differently once the FPT's small
parameter set is trained.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from reservoir.errors import BackboneError, IdentityError, UsageError

@dataclass(frozen=True)
class AttentionReader:
    """How to read attention probabilities from one backbone family.

    module : ``(backbone, layer) -> nn.Module``, the attention module of block ``layer``
        (its inputs are caught by a forward pre-hook).
    probs : ``(module, args, kwargs) -> (B, heads, T, T)`` float32 probabilities from the
        module's call arguments.
    causal : a query attends only to itself and earlier tokens.
    """

    module: Callable[[nn.Module, int], nn.Module]
    probs: Callable[[nn.Module, tuple, dict], torch.Tensor]
    causal: bool


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``(B, T, H * hd)`` -> ``(B, H, T, hd)``."""
    return x.view(*x.shape[:2], -1, head_dim).transpose(1, 2)


def _gpt2_scores(attn: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    h = _hidden(args, kwargs).float()
    q, k, _ = attn.c_attn(h).split(attn.split_size, dim=2)
    scale = attn.head_dim ** -0.5 if attn.scale_attn_weights else 1.0
    if attn.scale_attn_by_inverse_layer_idx:
        scale /= float(attn.layer_idx + 1)
    return _heads(q, attn.head_dim) @ _heads(k, attn.head_dim).transpose(-1, -2) * scale


def _llama_scores(attn: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    h = _hidden(args, kwargs).float()
    q, k = _heads(attn.q_proj(h), attn.head_dim), _heads(attn.k_proj(h), attn.head_dim)
    cos, sin = kwargs["position_embeddings"]
    q, k = apply_rotary_pos_emb(q, k, cos.float(), sin.float())
    k = repeat_kv(k, attn.num_key_value_groups)
    return q @ k.transpose(-1, -2) * attn.scaling


def _bert_scores(attn: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    kind = getattr(attn, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise BackboneError(f"attention maps of {kind!r} position embeddings are not supported; "
                            "choose a model with absolute positions")
    h = _hidden(args, kwargs).float()
    hd = attn.attention_head_size
    return _heads(attn.query(h), hd) @ _heads(attn.key(h), hd).transpose(-1, -2) * hd ** -0.5


def _softmax(causal: bool, scores: Callable) -> Callable:
    def probs(module, args, kwargs):
        s = scores(module, args, kwargs)
        if causal:
            t = s.shape[-1]
            above = torch.ones(t, t, dtype=torch.bool, device=s.device).triu(1)
            s = s.masked_fill(above, float("-inf"))
        return torch.softmax(s, dim=-1)

    return probs


#: ``Backbone.family`` -> how to read its attention
READERS: dict[str, AttentionReader] = {
    "gpt2": AttentionReader(lambda b, i: b.h[i].attn, _softmax(True, _gpt2_scores), causal=True),
    "llama": AttentionReader(lambda b, i: b.layers[i].self_attn, _softmax(True, _llama_scores), causal=True),
    "bert": AttentionReader(lambda b, i: b.layers[i].attention.self, _softmax(False, _bert_scores), causal=False),
}


class _Caught(Exception):
    """Raised by the pre-hook once the attention module's inputs are caught: the rest need not run."""


def catch_inputs(module: nn.Module, run: Callable[[], Any]) -> tuple[tuple, dict]:
    """The ``(args, kwargs)`` of ``module``'s first call while ``run()`` executes (which stops there)."""
    caught: dict[str, Any] = {}

    def hook(mod, args, kwargs):
        caught["call"] = (args, kwargs)
        raise _Caught

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    except _Caught:
        pass
    finally:
        handle.remove()
    if "call" not in caught:
        raise BackboneError("the attention module of the requested block was never called by the forward pass")
    return caught["call"]


def attention_probs(reservoir: nn.Module, tokens: torch.Tensor, lengths: torch.Tensor, layer: int) -> torch.Tensor:
    """Attention probabilities ``(B, heads, T, T)`` (float32) of block ``layer`` of ``reservoir``'s backbone.

    Parameters
    ----------
    reservoir : a :class:`reservoir.runtime.runner.Reservoir` (or anything called as one) whose
        ``backbone`` family has a reader in :data:`READERS`.
    tokens, lengths : a batch as the task encodes it (rows should not be padded: a causal
        model's real tokens never see padding, but an encoder's would).
    layer : the block, from 0.
    """
    backbone = reservoir.backbone
    reader = READERS.get(backbone.family)
    if reader is None:
        raise UsageError(f"a {backbone.family or type(backbone).__name__} backbone has no attention; choose a "
                         f"transformer backbone (families with attention maps: {sorted(READERS)})")
    if not 0 <= layer < backbone.n_layers:
        raise UsageError(f"layer {layer} is out of range for this backbone ({backbone.n_layers} blocks); "
                         f"choose a layer in [0, {backbone.n_layers - 1}]")
    module = reader.module(backbone, layer)
    with torch.inference_mode():
        args, kwargs = catch_inputs(module, lambda: reservoir(tokens, lengths, [layer + 1]))
        return reader.probs(module, args, kwargs).float()


def token_labels(task, tokens: np.ndarray) -> list[str]:
    """A short label per token of one example.

    Dense one-value tokens (bits, pixels): the value; id tokens: the symbol when the task's
    module has a ``VOCAB`` dict (ListOps, proteins), else the id; wider dense tokens
    (patches): the position.
    """
    if tokens.ndim == 2 and tokens.shape[1] == 1:
        return [f"{v:g}" for v in tokens[:, 0]]
    if tokens.ndim == 1:
        vocab = getattr(sys.modules.get(type(task).__module__), "VOCAB", None)
        names = {i: s for s, i in vocab.items()} if isinstance(vocab, dict) else {}
        return [names.get(int(i), str(int(i))) for i in tokens]
    return [str(i) for i in range(len(tokens))]


def _checkpoint_model(path: Path, task_name: str, backbone_name: str):
    """The trained FPT of a ``reservoir train`` checkpoint (best-validation parameters) and its identity."""
    from reservoir.model.backbones import load_backbone
    from reservoir.identity import task_label
    from reservoir.model.backbones import fingerprint as backbone_fingerprint, label as backbone_label
    from reservoir.train.checkpoint import read_checkpoint
    from reservoir.train.model import FPT, select_trainable

    obj = read_checkpoint(path, "pass a .pt file written by this version of `reservoir train` (its checkpoint folder)")
    ident = obj["identity"]
    wanted = {"task": task_label(task_name), "backbone": backbone_label(backbone_name)}
    for key, value in wanted.items():
        if ident.get(key) != value:
            raise IdentityError(f"checkpoint {path} was trained with {key} {ident.get(key)!r}, not {value!r}; "
                                f"pass --{key} {ident.get(key)}, or a checkpoint of this {key}")
    seed = ident["run_seed"]
    backbone = load_backbone(backbone_name, seed)
    if backbone_fingerprint(backbone) != ident["backbone_fingerprint"]:
        raise IdentityError(f"backbone {backbone_name!r} is not the one checkpoint {path} was trained on (its weights "
                            "differ); pass the same backbone folder or name")
    model = FPT(_task(task_name, ident["task_options"], seed).spec, backbone, blocks=ident["blocks"], seed=seed,
                input_scale=ident["input_scale"], dropout=0.0)
    params, _ = select_trainable(model, ident["trainable"])
    saved = obj["state"].get("best_params") or obj["params"]
    with torch.no_grad():
        for p, value in zip(params, saved, strict=True):
            p.copy_(value)
    return model.reservoir, ident


def _task(task_name: str, options: dict[str, Any], seed: int):
    from reservoir.tasks import make_task

    return make_task(task_name, options, seed)


def first_layer_attention(task_name: str, backbone_name: str, *, seed: int = 0, layer: int = 0, example: int = 0,
                          split: str = "test", input_scale: str = "paper", data_dir: Path | str | None = None,
                          limit: int | None = None,
                          checkpoint: Path | str | None = None) -> tuple[np.ndarray, list[str]]:
    """Attention probabilities of one block for one example, through the project's forward path.

    Parameters
    ----------
    task_name : a registered task (``reservoir tasks``) or ``file:PATH``.
    backbone_name : a registered backbone, a ``save_pretrained`` folder or ``hf:ID`` (and twins).
    seed : seeds the input layer, a random backbone and generated data (as ``extract --seed``).
    layer : the block, from 0 (the FPT paper's figures show block 0).
    example : row of ``split``.
    split : the split the example comes from.
    input_scale : the frozen input layer's scale (as ``extract --input-scale``).
    data_dir : data folder (default: ``$RESERVOIR_HOME/data`` or ``./data``).
    limit : the split's first ``limit`` examples are the ones available (``example < limit``).
    checkpoint : a ``reservoir train`` checkpoint (``.pt``) of this task and backbone: its
        trained input layer, positions and norms are used, and its seed, input scale and
        task options override ``seed`` and ``input_scale``.

    Returns
    -------
    weights : ``(heads, T, T)`` float32; row ``i`` is query token ``i``'s distribution over
        key tokens (rows sum to 1; zero above the diagonal for causal backbones).
    token_labels : one short string per token (:func:`token_labels`).

    Examples
    --------
    >>> w, labels = first_layer_attention("bit_xor", "gpt2-random")   # doctest: +SKIP
    >>> w.shape, labels[:3]                                           # doctest: +SKIP
    ((12, 10, 10), ['1', '0', '1'])
    """
    from reservoir.model.backbones import freeze, load_backbone
    from reservoir.config import default_data_dir, parse_input_scale
    from reservoir.model.reservoir import Reservoir, check_length

    if example < 0 or layer < 0:
        raise UsageError(f"example and layer count from 0; got example {example}, layer {layer}")
    if limit is not None and example >= limit:
        raise UsageError(f"example {example} is outside the first {limit} examples (--limit); "
                         f"choose an example below {limit} or raise the limit")
    if checkpoint is not None:
        reservoir, ident = _checkpoint_model(Path(checkpoint), task_name, backbone_name)
        task = _task(task_name, ident["task_options"], ident["run_seed"])
    else:
        task = _task(task_name, {}, seed)
        backbone = load_backbone(backbone_name, seed)
        reservoir = Reservoir(task.spec, backbone, seed=seed, input_scale=parse_input_scale(input_scale))
    if reservoir.backbone.family not in READERS:
        raise UsageError(f"backbone {backbone_name!r} ({reservoir.backbone.family or type(reservoir.backbone).__name__})"
                         f" has no attention to show; choose a transformer backbone such as gpt2, gpt2-random, "
                         f"smollm2-135m(-random) or a save_pretrained folder ({', '.join(sorted(READERS))} families)")
    check_length(task.spec, reservoir.backbone, backbone_name)
    task.check_split(split)
    data = task.load(split, Path(data_dir) if data_dir is not None else default_data_dir(), example + 1)
    if example >= len(data):
        raise UsageError(f"split {split!r} of task {task_name!r} has {len(data)} examples; choose an example "
                         f"below {len(data)}")
    length = int(data.lengths[example])
    tokens = task.encode(data.inputs[example:example + 1])[:, :length]
    freeze(reservoir.float()).eval()
    weights = attention_probs(reservoir, torch.from_numpy(np.ascontiguousarray(tokens)),
                              torch.tensor([length]), layer)
    return weights[0].numpy(), token_labels(task, tokens[0])

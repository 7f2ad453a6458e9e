"""The backbone contract and what every adapter shares.

A backbone maps the input layer's output ``x (B, T, d_input)`` to the hidden states of the
readout rows after each requested depth. Depth ``k`` is what the model truncated to its first
``k`` blocks outputs, final norm included (for LSTMs and echo state networks: the output of layer
``k``); depth 0 is the embedded input through that final norm. The final norm acts per token, so
it is applied to the readout rows only.

The base walks, the adapter declares: :meth:`Backbone.states` owns the depth loop, and a family
says how it embeds and calls a block (:meth:`Backbone.embed`, :meth:`Backbone.call_block`) and
declares its fast paths once, in its :class:`Capabilities`. A family whose blocks allow it
computes only the readout rows in the deepest block (:meth:`Backbone.readout_block`,
:func:`readout_attention`); meanwhile :func:`readout_rows` gives their positions, so that a module
whose computation depends on the position (the int8 engine's centring) reads its tables there.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from reservoir.errors import BackboneError, UsageError

#: FPT parameter groups a backbone may offer (``input`` and ``out`` belong to the FPT around it)
GROUPS = ("pos", "ln", "attn", "ff")


@dataclass(frozen=True)
class Capabilities:
    """What a family offers beyond the plain walk, declared once per adapter (``capabilities``)."""

    #: the deepest block that runs computes only the readout rows (:meth:`Backbone.readout_block`)
    readout_block: bool = False
    #: checked to convert to OpenVINO with equal features (``engine="auto"`` takes OpenVINO then)
    openvino: bool = False
    #: ``torch.compile`` can capture the walk (``compile=auto`` compiles long runs)
    compile: bool = False

    @property
    def fast_paths(self) -> tuple[str, ...]:
        """The names ``reservoir backbones`` prints, in this order."""
        named = (("readout-only last block", self.readout_block), ("openvino", self.openvino))
        return tuple(name for name, on in (*named, ("compile", self.compile)) if on)


class Backbone(nn.Module):
    """Base class of every adapter. Subclasses set ``d_model``, ``n_layers``, ``family``, their
    ``capabilities``, and the hooks :meth:`states` calls where the defaults do not fit
    (:meth:`embed`, :meth:`call_block`, :meth:`readout_block`)."""

    family: str = ""
    #: how to name a model of this family (``reservoir backbones`` lists it)
    naming: str = ""
    d_model: int
    #: width of the embedded tokens the backbone reads (the input layer's output); ``d_model`` if unset
    d_input: int | None = None
    n_layers: int
    #: the block stack (``train`` counts parameters per block from it); ``None`` for a backbone without one
    blocks: nn.ModuleList | None = None
    #: per-token modules applied after the last block, in order (the final norm): :meth:`finish`
    after: tuple[nn.Module, ...] = ()
    #: the one declaration of the fast paths
    capabilities: Capabilities = Capabilities(compile=True)
    causal: bool = True
    #: the version of how the adapter reads its depths, raised when a fix changes the features of the same
    #: weights: it enters the fingerprint, so feature files and checkpoints of an earlier reading are not reused
    reading: int = 1
    #: longest input the backbone has positions for (``None``: no limit)
    max_positions: int | None = None
    #: std of the backbone's own token embedding as loaded; ``--input-scale matched`` draws the input layer at it
    token_std: float | None = None
    #: use the readout-only deepest block where the family has one (engines switch it off to see every row)
    readout_last_block: bool = True

    @property
    def kind(self) -> str:
        """What messages call this backbone: its family (a Hugging Face model: its ``model_type``)."""
        return self.family or type(self).__name__

    @property
    def fast_paths(self) -> tuple[str, ...]:
        """The fast paths this backbone has (:attr:`Capabilities.fast_paths`)."""
        return self.capabilities.fast_paths

    @property
    def openvino(self) -> bool:
        """Checked to convert to OpenVINO with equal features (``engine="auto"`` takes OpenVINO then)."""
        return self.capabilities.openvino

    @property
    def compilable(self) -> bool:
        """Whether an automatic ``torch.compile`` may gain (``False``: it is never tried)."""
        return self.capabilities.compile

    def states(
        self, x: torch.Tensor, lengths: torch.Tensor, depths: Sequence[int], readout: torch.Tensor
    ) -> list[torch.Tensor]:
        """Hidden states at the ``readout`` positions ``(B, R)`` for each depth: ``[(B, R, d)]``.

        ``x`` is the input layer's output ``(B, T, d)`` (positions not yet added); ``lengths`` the
        real length of each row (right padding beyond it).
        """
        self.check_depths(depths)
        last = max(depths)
        h, context = self.embed(x, lengths, readout, last)
        # keep only the readout rows of each wanted depth, not every hidden state
        out = {0: gather(h, readout)} if 0 in depths else {}
        for i in range(last):
            if i == last - 1 and self.readout_last_block and self.capabilities.readout_block:
                rows = self.readout_block(i, h, readout, context)
                if rows is not None:
                    out[last] = rows
                    break
            h = self.call_block(i, h, context)
            if i + 1 in depths:
                out[i + 1] = gather(h, readout)
        return [self.finish(out[d]) for d in depths]

    def for_task(self, tokens: int | None) -> None:
        """Before any batch: the task's tokens a row when every row has that many, else ``None`` (rows of
        any length). Default: nothing (a vision model resizes its patch grid to it)."""

    def embed(
        self, x: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor, last: int
    ) -> tuple[torch.Tensor, Any]:
        """The states entering the first block ``(B, T', d)``, and what every block call reads (masks,
        rotary positions); ``last`` is the deepest block that will run. Default: ``x``, nothing else."""
        return x, None

    def call_block(self, i: int, h: torch.Tensor, context: Any) -> torch.Tensor:
        """Block ``i`` on the states ``h (B, T', d)``: its output states. Default: ``blocks[i](h)``."""
        return first_output(self.blocks[i](h))

    def readout_block(
        self, i: int, h: torch.Tensor, readout: torch.Tensor, context: Any
    ) -> torch.Tensor | None:
        """``gather(call_block(i, h, context), readout)`` computing only what the readout rows need, or
        ``None`` where block ``i`` is not one this computes exactly (it then runs whole)."""
        return None

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The modules after the blocks (:attr:`after`: the final norm, ...) on readout rows ``h (B, R, d)``."""
        for m in self.after:
            h = m(h)
        return h

    def forward(self, x, lengths, depths, readout):
        return torch.stack(self.states(x, lengths, depths, readout), dim=1)

    @property
    def input_width(self) -> int:
        return self.d_input or self.d_model

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by FPT group name (``pos``, ``ln``, ``attn``, ``ff``, ...)."""
        return {}

    def attention_module(self, layer: int) -> nn.Module:
        """The attention module of block ``layer`` (``reservoir attention`` reads its weights)."""
        raise UsageError(f"a {self.kind} backbone has no attention; choose a transformer backbone")

    def eager_attention(self) -> contextlib.AbstractContextManager:
        """Within: attention modules compute and return their weights (Hugging Face's ``eager`` implementation)."""
        return contextlib.nullcontext()

    def projections(self) -> dict[str, nn.Module]:
        """The matrix products int8 quantizes, by name in the backbone: every ``nn.Linear`` and
        transformers' ``Conv1D`` (embeddings and norms stay float)."""
        return {name: m for name, m in self.named_modules() if type(m) is nn.Linear or is_conv1d(m)}

    def check_saveable(self) -> None:
        """Refuse a backbone :meth:`save_pretrained` cannot write (checked before a run that will save it)."""
        raise BackboneError(
            f"a {self.kind} backbone cannot be saved as a backbone folder: "
            "only Hugging Face backbones (GPT-2, Llama, a save_pretrained folder, ...) are written as "
            "save_pretrained folders; choose one of them"
        )

    def save_pretrained(self, folder) -> None:
        """Write the backbone as a folder that :func:`~reservoir.model.backbones.load_backbone` reads back
        to equal parameters (Hugging Face backbones only)."""
        self.check_saveable()

    def check_depths(self, depths: Sequence[int]) -> None:
        bad = [d for d in depths if not 0 <= d <= self.n_layers]
        if not depths:
            raise UsageError(f"no depth requested; choose depths in [0, {self.n_layers}]")
        if bad:
            raise UsageError(
                f"depth {bad[0]} is out of range for this backbone; choose depths in [0, {self.n_layers}]"
            )


def weight_std(weight: torch.Tensor) -> float | None:
    """The std of a weight tensor's entries (for :attr:`Backbone.token_std`); ``None`` for a tensor
    without values (the meta device)."""
    if weight.is_meta:
        return None
    return float(weight.detach().double().std())


_READOUT_ROWS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "readout_rows", default=None
)


def at_readout(block: nn.Module, readout: torch.Tensor) -> contextlib.AbstractContextManager:
    """Within: ``block`` computes the readout rows ``readout (B, R)`` (:func:`readout_rows`), where one
    of its modules has ``reads_positions``; else nothing is set, so compiled graphs do not break on it."""
    if any(getattr(m, "reads_positions", False) for m in block.modules()):
        return _reading(readout)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _reading(readout: torch.Tensor):
    token = _READOUT_ROWS.set(readout)
    try:
        yield
    finally:
        _READOUT_ROWS.reset(token)


def readout_rows() -> torch.Tensor | None:
    """The positions ``(B, R)`` of the rows a readout-only last block is computing, else ``None``
    (rows ``(B, T, ...)`` are then positions ``0..T-1``)."""
    return _READOUT_ROWS.get()


def gather(h: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """``h (B, T, d)``, ``readout (B, R)`` -> ``(B, R, d)``."""
    return torch.gather(h, 1, readout[:, :, None].expand(-1, -1, h.shape[-1]))


def readout_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    readout: torch.Tensor,
    scale: float,
    dropout: float = 0.0,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of the readout queries alone: ``(B, R, H * hd)``.

    ``q (B, H, R, hd)`` are the queries of the positions ``readout (B, R)``; ``k``, ``v``
    ``(B, Hkv, T, hd)`` the keys and values of every position (``H`` a multiple of ``Hkv``, as
    Hugging Face's ``repeat_kv``). A query at position ``p`` attends to keys ``0..p`` (with
    ``window``, only ``p - window < key <= p``), as in the full causal block.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    keys = torch.arange(k.shape[2], device=q.device)
    mask = keys[None, None, None, :] <= readout[:, None, :, None].to(q.device)  # (B, 1, R, T)
    if window is not None:  # a sliding window: keys p - window < key <= p, as transformers' masks
        mask = mask & (keys[None, None, None, :] > readout[:, None, :, None].to(q.device) - window)
    out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def hooked(*modules: nn.Module) -> bool:
    """Whether any of ``modules`` has forward hooks; an observer expects the module itself to run, so the
    readout-only last block is not used then."""
    return any(m._forward_pre_hooks or m._forward_hooks for m in modules)


@torch.no_grad()
def stats_init(model: nn.Module, seed: int) -> nn.Module:
    """Redraw every parameter from ``N(mean, std)`` of its current (pretrained) values, in place.

    Statistics-only initialisation of the FPT paper (section 3.8). Buffers are left alone; a
    one-element tensor keeps its value.
    """
    g = torch.Generator().manual_seed(seed)
    for _, p in model.named_parameters():
        values = p.detach().double()
        mean, std = values.mean().item(), values.std().item() if values.numel() > 1 else 0.0
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(std).add_(mean))
    return model


@contextlib.contextmanager
def seeded(seed: int):
    """Context in which torch's default generator is seeded, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def freeze(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        p.requires_grad_(False)
    return module


@contextlib.contextmanager
def quiet_transformers():
    """transformers' and huggingface_hub's loading chatter off the terminal (progress bars, load
    reports, retry lines); errors still show, and levels and progress bars are restored after."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    levels = hf_logging.get_verbosity(), hub_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(levels[0])
        hub_logging.set_verbosity(levels[1])
        if bars:
            hf_logging.enable_progress_bar()


def from_pretrained(cls, *args, **kwargs):
    """``cls.from_pretrained(*args, **kwargs)`` without transformers' chatter (:func:`quiet_transformers`),
    never running code a model folder or hub repository ships (``trust_remote_code=False``)."""
    with quiet_transformers():
        return cls.from_pretrained(*args, **kwargs, trust_remote_code=False)


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is transformers' ``Conv1D`` (``x @ W + b``, ``W`` of shape ``(in, out)``); asked
    without importing transformers, which a model holding one has imported already."""
    conv1d = getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)
    return conv1d is not None and type(module) is conv1d


def columns(module: nn.Module, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Output features ``start:stop`` of a projection without computing the others (a module with a
    ``columns(x, start, stop)`` method computes them itself); any other module, or one whose weight is
    not a plain tensor (a quantized one), runs whole and is sliced."""
    if hasattr(module, "columns"):
        return module.columns(x, start, stop)
    plain = type(getattr(module, "weight", None)) in (torch.Tensor, nn.Parameter)
    if is_conv1d(module) and plain:  # x @ W + b with W (in, out), as Conv1D.forward computes it
        y = torch.addmm(module.bias[start:stop], x.reshape(-1, x.shape[-1]), module.weight[:, start:stop])
        return y.view(*x.shape[:-1], stop - start)
    if type(module) is nn.Linear and plain:
        bias = None if module.bias is None else module.bias[start:stop]
        return nn.functional.linear(x, module.weight[start:stop], bias)
    return module(x)[..., start:stop]


def params(modules) -> list[nn.Parameter]:
    """The parameters of ``modules``, each once, in order."""
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def without(ps: list[nn.Parameter], exclude: list[nn.Parameter]) -> list[nn.Parameter]:
    ids = {id(p) for p in exclude}
    return [p for p in ps if id(p) not in ids]


def is_norm(module: nn.Module) -> bool:
    """A normalisation layer: ``nn.LayerNorm`` or a module whose class is named like one
    (transformers' ``LlamaRMSNorm``, ``T5LayerNorm``, ...) holding its own parameters."""
    own = any(True for _ in module.parameters(recurse=False))
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or (
        own and type(module).__name__.endswith("Norm")
    )


class StopForward(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a hook to end a forward early, once what it reads has been computed."""


def first_output(output) -> torch.Tensor:
    """A block's hidden states from whatever it returns (a tensor, or a tuple/ModelOutput led by one)."""
    return output if isinstance(output, torch.Tensor) else output[0]


def check_length(x: torch.Tensor, limit: int | None, name: str) -> None:
    if limit is not None and x.shape[1] > limit:
        raise BackboneError(
            f"{name} reads at most {limit} tokens; got a batch of {x.shape[1]}. "
            "Choose a task with shorter sequences or a backbone with more positions"
        )


def make_mask(fn, embeds, positions, **kwargs):
    """Call a ``transformers.masking_utils`` mask builder across versions, passing the embeddings,
    ``cache_position`` and the cache under the names and only where its signature requires them."""
    params = inspect.signature(fn).parameters
    kwargs["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = embeds
    if "cache_position" in params:
        kwargs["cache_position"] = positions
    for name in ("cache", "past_key_values"):
        if name in params and params[name].default is inspect.Parameter.empty:
            kwargs[name] = None
    return fn(**kwargs)

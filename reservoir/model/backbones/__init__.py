"""Backbones: frozen sequence models that map embedded tokens to per-depth hidden states.

Depth convention (DESIGN.md): depth ``k`` is what the backbone truncated to its first
``k`` blocks outputs, final norm included (for LSTMs: the output of layer ``k``); depth 0
is the embedded input (input layer + positions) through that final norm. Only blocks up
to the deepest requested depth run, and the final norm is applied to the readout tokens
only (it acts per token, so that equals norming every position and then reading). In the
deepest block of a causal transformer (GPT-2, Llama) only the readout rows are kept, so
that block computes keys and values for every position but queries, attention output,
residual and MLP for the readout rows alone (:func:`readout_attention`); the
``readout_last_block`` attribute switches this off (tests compare both). While that block
computes the readout rows alone, :func:`readout_rows` gives their positions, so that a
projection whose computation depends on the position (the int8 engine's centring,
:class:`reservoir.runtime.engines.Centred`) reads its tables there.

A backbone is registered by name (``@register_backbone``) or loaded from a folder saved
with ``save_pretrained`` (``--backbone PATH`` or ``hf:PATH``), dispatched on the folder
config's ``model_type`` through :data:`FAMILIES`. Every backbone has two twins: ``NAME-random``
(the architecture built from the config by :data:`FROM_CONFIG`, default initialisation, no
weights read) and ``NAME-stats`` (each tensor redrawn from a normal with the pretrained
tensor's mean and std, paper section 3.8).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from reservoir.identity import canonical, config_dict
from reservoir.errors import BackboneError, UsageError  # noqa: F401  (BackboneError: re-exported)
from reservoir.registry import Registry


class Backbone(nn.Module):
    """Base class. Subclasses set ``d_model``, ``n_layers``, ``family`` (and ``max_positions`` when
    positions run out) and implement ``states``."""

    family: str = ""
    d_model: int
    n_layers: int
    causal: bool = True
    #: longest input the backbone has positions for (``None``: no limit)
    max_positions: int | None = None
    #: std of the backbone's own token embedding as loaded (its initialisation's for a random
    #: twin); ``--input-scale matched`` draws the input layer at this scale
    token_std: float | None = None
    #: compute only the readout rows in the deepest block that runs (families that implement it)
    readout_last_block: bool = True
    #: checked to convert to OpenVINO with equal features (``engine="auto"`` takes OpenVINO then)
    openvino: bool = False

    def states(self, x: torch.Tensor, lengths: torch.Tensor, depths: Sequence[int],
               readout: torch.Tensor) -> list[torch.Tensor]:
        """Hidden states at the ``readout`` positions ``(B, R)`` for each depth: ``[(B, R, d)]``.

        ``x`` is the input layer's output ``(B, T, d)`` (positions not yet added);
        ``lengths`` the real length of each row (right padding beyond it).
        """
        raise NotImplementedError  # pragma: no cover - abstract

    def forward(self, x, lengths, depths, readout):
        return torch.stack(self.states(x, lengths, depths, readout), dim=1)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by FPT group name (``pos``, ``ln``, ``attn``, ``ff``, ...)."""
        return {}

    def check_depths(self, depths: Sequence[int]) -> None:
        bad = [d for d in depths if not 0 <= d <= self.n_layers]
        if bad or not depths:
            raise UsageError(f"depth {bad[0]} is out of range for this backbone; choose depths in [0, {self.n_layers}]")


def weight_std(weight: torch.Tensor) -> float | None:
    """The std of a weight tensor's entries (for :attr:`Backbone.token_std`); ``None`` for a tensor
    without values (the meta device)."""
    if weight.is_meta:
        return None
    return float(weight.detach().double().std())


_READOUT_ROWS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("readout_rows", default=None)


def at_readout(block: nn.Module, readout: torch.Tensor) -> contextlib.AbstractContextManager:
    """Within: ``block`` computes the readout rows ``readout (B, R)`` (positions), not positions
    ``0..T-1`` (:func:`readout_rows`), where one of its modules reads positions (its
    ``reads_positions`` attribute); else nothing is set, so compiled graphs do not break on it."""
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


def readout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, readout: torch.Tensor, scale: float,
                      dropout: float = 0.0) -> torch.Tensor:
    """Causal attention of the readout queries alone: ``(B, R, H * hd)``.

    ``q (B, H, R, hd)`` are the queries of the positions ``readout (B, R)``; ``k``, ``v``
    ``(B, Hkv, T, hd)`` the keys and values of every position (``H`` a multiple of ``Hkv``:
    query head ``h`` reads key-value head ``h // (H / Hkv)``, as Hugging Face's ``repeat_kv``).
    A query at position ``p`` attends to keys ``0..p``, as in the full causal block, so the
    last block can compute queries, output projection and MLP for the readout rows only.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    keys = torch.arange(k.shape[2], device=q.device)
    mask = keys[None, None, None, :] <= readout[:, None, :, None].to(q.device)  # (B, 1, R, T)
    out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def hooked(*modules: nn.Module) -> bool:
    """Whether any of ``modules`` has forward hooks: an observer (such as
    :mod:`reservoir.report.attention`'s pre-hook) expects the module itself to run, so the readout-only
    last block is not used then."""
    return any(m._forward_pre_hooks or m._forward_hooks for m in modules)


BACKBONES: Registry[Backbone] = Registry("backbone")
#: model_type in a saved folder's config.json -> loader(path, seed) for that family (reads the weights)
FAMILIES: dict[str, Callable[[str, int], Backbone]] = {}
#: model_type -> builder(config, seed): the same architecture with default initialisation, no weights read
FROM_CONFIG: dict[str, Callable[[Any, int], Backbone]] = {}
#: twin suffixes: ``NAME-random`` (config only, default init) and ``NAME-stats`` (paper section 3.8)
TWINS = ("random", "stats")


def register_backbone(name: str, help: str = ""):
    """Decorator for a factory ``f(seed: int) -> Backbone``."""
    return BACKBONES.register(name, help=help)


def list_backbones() -> list[str]:
    return BACKBONES.names()


def is_model_path(name: str) -> bool:
    """``hf:PATH_OR_ID`` or an existing folder."""
    return name.startswith("hf:") or Path(name).is_dir()


def split_twin(name: str) -> tuple[str, str]:
    """``"PATH-random"`` -> ``("PATH", "random")``; names that are not twins -> ``(name, "pretrained")``.

    A registered name or an existing folder is never split, so a folder that happens to end
    in ``-random`` is loaded as it is.
    """
    if name in BACKBONES or Path(name).is_dir():
        return name, "pretrained"
    for twin in TWINS:
        base = name[: -len(twin) - 1]
        if name.endswith(f"-{twin}") and base and (base in BACKBONES or is_model_path(base)):
            return base, twin
    return name, "pretrained"


def fingerprint(model: "nn.Module") -> str:
    """SHA-256 (hex) of the backbone's class, configuration and every tensor of its state dict."""
    h = hashlib.sha256()
    h.update(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    h.update(canonical(config_dict(getattr(model, "config", None))).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def label(name: str) -> str:
    """A readable, machine-independent name: a registered name, or a folder's base name (plus twin)."""
    base, twin = split_twin(name)
    base = base[3:] if base.startswith("hf:") else base
    label = Path(base.rstrip("/")).name if ("/" in base or Path(base).is_dir()) else base
    return label if twin == "pretrained" else f"{label}-{twin}"


def is_backbone(name: str) -> bool:
    """Whether :func:`load_backbone` can resolve ``name`` (without loading anything)."""
    base, _ = split_twin(name)
    return base in BACKBONES or is_model_path(base)


def load_backbone(name: str, seed: int = 0) -> Backbone:
    """A registered name, a folder saved with ``save_pretrained``, ``hf:PATH_OR_ID``, or a twin of
    either: ``NAME-random`` (same architecture from the config, default init, no weights read) or
    ``NAME-stats`` (each tensor drawn from a normal with the pretrained tensor's mean and std).

    Random initialisations draw from ``seed``; the model is returned in eval mode.

    Examples
    --------
    >>> load_backbone("lstm").n_layers
    3
    """
    base, twin = split_twin(name)
    if os.environ.get("RESERVOIR_OFFLINE"):  # fail fast instead of retrying an unreachable hub
        import huggingface_hub.constants

        os.environ["HF_HUB_OFFLINE"] = "1"
        huggingface_hub.constants.HF_HUB_OFFLINE = True
    if base in BACKBONES:
        if twin == "random":
            raise BackboneError(f"{base} has no registered -random twin; choose from {list_backbones()}")
        model = BACKBONES.create(base, seed=seed)
    elif is_model_path(base):
        model = load_pretrained(base[3:] if base.startswith("hf:") else base, seed, init=twin)
    else:
        BACKBONES.factory(name)  # raises "unknown backbone ...; choose from ..."
        raise AssertionError  # pragma: no cover
    if twin == "stats":
        stats_init(model, seed)
    return model.eval()


def load_config(path: str):
    """The Hugging Face config of a folder or hub id; reads config.json only, never weights."""
    from transformers import AutoConfig

    if Path(path).is_dir() and not (Path(path) / "config.json").exists():
        raise BackboneError(f"{path} has no config.json; pass a folder written by save_pretrained")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise BackboneError(
            f"cannot load the config of {path!r} ({str(e).splitlines()[0]}); save the model with "
            "save_pretrained where the hub is reachable and pass its folder, or choose a registered backbone"
        ) from None


def load_pretrained(path: str, seed: int, init: str = "pretrained") -> Backbone:
    """Dispatch a folder (or hub id) on its config's ``model_type``.

    ``init="random"`` builds the architecture from the config alone (default initialisation
    seeded by ``seed``; no weight file is opened); ``"pretrained"`` and ``"stats"`` read the weights
    (the caller redraws them for ``"stats"``).
    """
    if Path(path).is_dir() and (Path(path) / "config.json").exists():
        model_type = json.loads((Path(path) / "config.json").read_text()).get("model_type", "")
        config = None
    else:
        config = load_config(path)
        model_type = config.model_type
    if model_type not in FAMILIES:
        raise BackboneError(f"{path} holds a {model_type!r} model; supported model types: {sorted(FAMILIES)}")
    if init == "random":
        if model_type not in FROM_CONFIG:
            raise BackboneError(f"{model_type!r} models have no -random twin yet; families with one: {sorted(FROM_CONFIG)}")
        with seeded(seed):
            return FROM_CONFIG[model_type](config or load_config(path), seed)
    return FAMILIES[model_type](path, seed)


@torch.no_grad()
def stats_init(model: nn.Module, seed: int) -> nn.Module:
    """Redraw every parameter from ``N(mean, std)`` of its current (pretrained) values, in place.

    Statistics-only initialisation of the FPT paper (section 3.8): the architecture and each
    tensor's first two moments are kept, the learned structure is not. Buffers (rotary
    frequencies, causal masks) are left alone; a one-element tensor keeps its value.
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


def from_pretrained(cls, *args, **kwargs):
    """``cls.from_pretrained(*args, **kwargs)`` without transformers' weight-loading progress bar
    (extract and train print their own progress)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return cls.from_pretrained(*args, **kwargs)


from reservoir.model.backbones import gpt2, hf, lstm, smollm  # noqa: E402,F401  (register families)

"""Backbones: frozen sequence models that map embedded tokens to per-depth hidden states.

Depth convention (DESIGN.md): depth ``k`` is what the backbone truncated to its first
``k`` blocks outputs, final norm included (for LSTMs: the output of layer ``k``); depth 0
is the embedded input (input layer + positions) through that final norm. Only blocks up
to the deepest requested depth run, and the final norm is applied to the readout tokens
only (it acts per token, so that equals norming every position and then reading).

A backbone is registered by name (``@register_backbone``) or loaded from a folder saved
with ``save_pretrained`` (``--backbone PATH`` or ``hf:PATH``), dispatched on the folder
config's ``model_type`` through :data:`FAMILIES`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from reservoir.registry import Registry


class BackboneError(RuntimeError):
    """A backbone that cannot be loaded; the message says what to do."""


class Backbone(nn.Module):
    """Base class. Subclasses set ``d_model``, ``n_layers``, ``family`` and implement ``states``."""

    family: str = ""
    d_model: int
    n_layers: int
    causal: bool = True

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
        if bad:
            raise ValueError(f"depth {bad[0]} is out of range for this backbone; choose depths in [0, {self.n_layers}]")


def gather(h: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """``h (B, T, d)``, ``readout (B, R)`` -> ``(B, R, d)``."""
    return torch.gather(h, 1, readout[:, :, None].expand(-1, -1, h.shape[-1]))


BACKBONES: Registry[Backbone] = Registry("backbone")
#: model_type in a saved folder's config.json -> loader(path, seed) for that family
FAMILIES: dict[str, Callable[[str, int], Backbone]] = {}


def register_backbone(name: str, help: str = ""):
    """Decorator for a factory ``f(seed: int) -> Backbone``."""
    return BACKBONES.register(name, help=help)


def list_backbones() -> list[str]:
    return BACKBONES.names()


def load_backbone(name: str, seed: int = 0) -> Backbone:
    """A registered name, a folder saved with ``save_pretrained``, or ``hf:PATH_OR_ID``.

    Random initialisations draw from ``seed``; the model is returned in eval mode.
    """
    if name in BACKBONES:
        model = BACKBONES.create(name, seed=seed)
    else:
        path = name[3:] if name.startswith("hf:") else name
        if name.startswith("hf:") or Path(path).is_dir():
            model = load_pretrained(path, seed)
        else:
            BACKBONES.factory(name)  # raises "unknown backbone ...; choose from ..."
            raise AssertionError  # pragma: no cover
    return model.eval()


def load_pretrained(path: str, seed: int) -> Backbone:
    """Dispatch a folder (or hub id) on its config's ``model_type``."""
    config = Path(path) / "config.json"
    if Path(path).is_dir():
        if not config.exists():
            raise BackboneError(f"{path} has no config.json; pass a folder written by save_pretrained")
        model_type = json.loads(config.read_text()).get("model_type", "")
    else:
        from transformers import AutoConfig

        try:
            model_type = AutoConfig.from_pretrained(path).model_type
        except OSError as e:
            raise BackboneError(
                f"cannot load {path!r} from the Hugging Face hub ({str(e).splitlines()[0]}); save the model with "
                "save_pretrained where the hub is reachable and pass its folder, or choose a -random backbone") from None
    if model_type not in FAMILIES:
        raise BackboneError(f"{path} holds a {model_type!r} model; supported model types: {sorted(FAMILIES)}")
    return FAMILIES[model_type](path, seed)


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


from reservoir.backbones import gpt2, lstm  # noqa: E402,F401  (register families)

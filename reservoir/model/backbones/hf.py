"""Any Hugging Face model as a backbone: the generic adapter, and the base of the written ones.

:class:`HFBackbone` holds a Hugging Face base model and its :class:`Parts`: the block stack, the
modules after it (the final norm), the token embedding and the learned positions. A family adapter
names them (:meth:`HFBackbone.locate`); for any other model they are found from its own hints: the
blocks by ``_no_split_modules`` (:func:`find_blocks`), the modules after them by running the model
once on two tokens (poolers left out; anything but norms and linear layers refused, since it could
not be applied to the readout rows alone), the token embedding by ``get_input_embeddings()``. A
model without learned positions gets the FPT's as an additive ``wpe`` initialised to zero, so frozen
features are exactly the model's own.

The generic adapter runs the model's own forward on ``inputs_embeds`` and reads each block call's
input with hooks (the last call's output for the deepest depth), stopping at the deepest requested
depth. Blocks are counted by call, so shared blocks applied again (ALBERT) give one depth per
application. Whether the model is causal, and whether a padded row keeps its states, is found by
running it (:meth:`HFBackbone.is_causal`, :meth:`HFBackbone.masks_padding`). It has no fast paths
and says so when it loads.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reservoir.errors import BackboneError, ReservoirError
from reservoir.model.backbones.base import (
    Backbone,
    Capabilities,
    StopForward,
    check_length,
    first_output,
    from_pretrained,
    gather,
    is_norm,
    params,
    quiet_transformers,
    seeded,
    weight_std,
    without,
)
from reservoir.tasks.pickles import refused_by_torch

#: longest sequence the added position embedding covers (above the paper's longest inputs, 2,000 ListOps
#: tokens), so that 128k-context configs do not allocate gigabytes of zeros
MAX_ADDED_POSITIONS = 4096
#: class-name parts of a block's sequence-mixing module (its ``attn`` group)
MIXER_NAMES = ("Attention", "Attn", "Mixer")
#: the file of a saved backbone folder that holds the added positions ``wpe`` (no place for them among the weights)
ADDED_POSITIONS = "added_positions.safetensors"
#: model_type -> the adapter class of its family (families register themselves, :func:`register_family`)
ADAPTERS: dict[str, type[HFBackbone]] = {}


class _Stop(StopForward):
    """Raised by a hook after the deepest requested block: the rest of the model need not run."""


def register_family(cls: type[HFBackbone]) -> type[HFBackbone]:
    """Class decorator: ``cls`` adapts every ``model_type`` in ``cls.model_types``."""
    for model_type in cls.model_types:
        ADAPTERS[model_type] = cls
    return cls


@dataclass
class Parts:
    """Where a model's parts are (named by a family's adapter or found by the generic one)."""

    blocks: nn.ModuleList
    #: per-token modules the model applies after its last block, in order (final norm, ...)
    after: tuple[nn.Module, ...]
    #: the token embedding the input layer replaces (``None`` for a model without one)
    embedding: nn.Module | None
    #: learned positions (modules or parameters): the ``pos`` group; empty -> an added ``wpe``
    positions: list = field(default_factory=list)
    #: longest input the learned positions cover (``None``: no limit of their own)
    max_positions: int | None = None


def n_layers_of(config) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        if isinstance(getattr(text, key, None), int):
            return getattr(text, key)
    return None


def max_positions_of(config) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_positions"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) > 0:  # XLNet's -1: none
            return getattr(config, key)
    return None


def base_model(model: nn.Module) -> nn.Module:
    """The model without task heads: the encoder of an encoder-decoder, the base model of a
    head model (``base_model_prefix``), else the model itself."""
    if getattr(model.config, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
        return model.get_encoder()
    prefix = getattr(model, "base_model_prefix", "")
    inner = getattr(model, prefix, None) if prefix else None
    return inner if isinstance(inner, nn.Module) and inner is not model else model


def find_blocks(model: nn.Module) -> nn.ModuleList:
    """The block stack: a ``ModuleList`` of the classes the model names in ``_no_split_modules``,
    else of one class with as many entries as the config has layers."""
    hints = set(getattr(model, "_no_split_modules", None) or [])
    n = n_layers_of(model.config)
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    by_hint = [(name, m) for name, m in lists if all(type(b).__name__ in hints for b in m)]
    same = [(name, m) for name, m in lists if len({type(b) for b in m}) == 1 and (n is None or len(m) == n)]
    for found in (by_hint, same):
        if found:
            return max(found, key=lambda nm: (len(nm[1]), -nm[0].count(".")))[1]
    raise BackboneError(
        f"the generic adapter found no block stack in this {model.config.model_type!r} model: no ModuleList of "
        f"{sorted(hints) or 'the classes in _no_split_modules (the model names none)'} and none of one class with "
        f"{n} entries (the config's layer count); this model needs an adapter of its own "
        "(reservoir/model/backbones/, one file)"
    )


def accepted(fn: Callable) -> set[str]:
    return set(inspect.signature(fn).parameters)


class HFBackbone(Backbone):
    """A Hugging Face model, run by its own forward and read by hooks (the generic adapter).

    Parameters
    ----------
    model
        a Hugging Face model (a head model or the encoder-decoder are reduced to the base
        model or the encoder, :func:`base_model`).
    quiet
        do not say on stderr that the generic adapter runs without fast paths.
    """

    family = "hf"
    naming = "any other save_pretrained folder or hf:ID (the generic adapter: the model's own forward, no fast paths)"
    #: the model types a written family adapts (:func:`register_family`)
    model_types: tuple[str, ...] = ()
    #: an example name for ``reservoir backbones``
    example = ""
    capabilities = Capabilities()
    #: read the depths by hooks on the model's own forward (:meth:`states`); ``False`` in a family adapter
    #: that calls its blocks itself (the base's walk then runs)
    by_hooks: bool = True
    #: a row padded beside longer ones keeps its states (a causal model's right padding always does):
    #: :meth:`masks_padding`
    pads: bool = True

    @property
    def reading(self) -> int:
        """2 where the model's own forward is read by hooks: a depth is the next block call's input, causal and
        padding as the model runs; a family that calls its blocks itself reads as it always did (1)."""
        return 2 if self.by_hooks else 1

    def __init__(self, model: nn.Module, *, quiet: bool = False):
        super().__init__()
        self.model = base_model(model)
        self.config = self.model.config
        parts = self.locate()
        # references into self.model, not registered twice (state_dict and fingerprints see each tensor once)
        for name, value in (
            ("blocks", parts.blocks),
            ("after", tuple(parts.after)),
            ("embedding", parts.embedding),
        ):
            object.__setattr__(self, name, value)
        self.n_layers = len(self.blocks)
        hidden = int(
            getattr(self.config, "hidden_size", None)
            or getattr(self.config, "n_embd", 0)
            or getattr(self.config, "d_model", 0)
        )
        width = getattr(self.embedding, "embedding_dim", None)
        self.d_input = int(width) if width else hidden
        # the features' width: a projection after the last block (OPT-350m's project_out) sets it
        widths = [m.out_features for m in self.after if isinstance(m, nn.Linear)]
        self.d_model = widths[-1] if widths else hidden
        self.causal = self.is_causal()
        self.pads = self.causal or not self.by_hooks or self.masks_padding()
        object.__setattr__(self, "positions", list(parts.positions))
        self.wpe: nn.Embedding | None = None
        if self.positions:
            self.max_positions = parts.max_positions
        else:
            n_pos = min(max_positions_of(self.config) or MAX_ADDED_POSITIONS, MAX_ADDED_POSITIONS)
            self.wpe = nn.Embedding(n_pos, self.d_input)
            nn.init.zeros_(self.wpe.weight)
            self.max_positions = n_pos
        weight = getattr(self.embedding, "weight", None)
        self.token_std = weight_std(weight) if isinstance(weight, torch.Tensor) else None
        self.drop_unused()
        if type(self) is HFBackbone and not quiet:
            print(
                f"{self.config.model_type}: no adapter of its own; the generic adapter runs it (the model's own "
                "forward read by hooks; no readout-only last block, no OpenVINO, no compiling)",
                file=sys.stderr,
            )

    # -- where things are -------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.config.model_type

    def locate(self) -> Parts:
        """The generic adapter's search (see the module docstring); family adapters name their parts."""
        model = self.model
        if "inputs_embeds" not in accepted(model.forward):
            raise BackboneError(
                f"this {model.config.model_type!r} model's forward takes no inputs_embeds, so the FPT "
                f"input layer cannot feed it; families with an adapter: {sorted(ADAPTERS)}"
            )
        blocks = self.block_stack()
        try:
            embedding = model.get_input_embeddings()
        except (NotImplementedError, AttributeError):
            embedding = None
        inside = {id(m) for m in blocks.modules()}
        positions = [
            m
            for m in model.modules()
            if isinstance(m, nn.Embedding) and id(m) not in inside and m is not embedding
        ]
        after = self._modules_after(blocks, embedding)
        return Parts(
            blocks, after, embedding, positions, max_positions_of(model.config) if positions else None
        )

    def block_stack(self) -> nn.ModuleList:
        """The blocks, one entry per application in the forward's order (:func:`find_blocks`)."""
        return find_blocks(self.model)

    @torch.no_grad()
    def _modules_after(self, blocks: nn.ModuleList, embedding: nn.Module | None) -> tuple[nn.Module, ...]:
        """The leaf modules the model's forward calls after its last block returns, in order (dropout
        and poolers left out), found by running it on two tokens."""
        inside = {id(m) for m in blocks.modules()}
        pooled = {id(m) for name, p in self.model.named_modules() if is_pooler(name, p) for m in p.modules()}
        calls: list[nn.Module | None] = []
        leaves = [
            m
            for m in self.model.modules()
            if id(m) not in inside and id(m) not in pooled and not any(True for _ in m.children())
        ]
        handles = [m.register_forward_hook(lambda m, a, o: calls.append(m)) for m in leaves]
        shapes: list[tuple[int, ...]] = []

        # the last block's call, and the shape it returns (a hook must return None: a value replaces the output)
        def ended(module, args, output) -> None:
            calls.append(None)
            shapes.append(tuple(first_output(output).shape))

        handles.append(blocks[-1].register_forward_hook(ended))
        width = getattr(embedding, "embedding_dim", None) or self.config.hidden_size
        self.probe(torch.zeros(1, 2, width), torch.tensor([2]), handles)
        if None not in calls:
            raise BackboneError(
                f"the generic adapter found a block stack in this {self.config.model_type!r} model "
                "that its forward never calls; it needs an adapter of its own"
            )
        if tuple(shapes[-1][:2]) != (1, 2):  # hooks read (batch, tokens, width); XLNet's are time-major
            raise BackboneError(
                f"the blocks of this {self.config.model_type!r} model return hidden states of shape "
                f"{tuple(shapes[-1])} for 1 row of 2 tokens, not (rows, tokens, width); it needs an adapter of its own"
            )
        last = len(calls) - 1 - calls[::-1].index(None)
        after = [m for m in calls[last + 1 :] if not isinstance(m, (nn.Dropout, nn.Identity))]
        # norms by class name, with or without parameters of their own (OLMo's final norm has none)
        odd = [
            type(m).__name__
            for m in after
            if not (isinstance(m, nn.Linear) or type(m).__name__.endswith("Norm"))
        ]
        if odd:
            raise BackboneError(
                f"after its last block this {self.config.model_type!r} model runs {odd}, which the "
                "generic adapter cannot apply to the readout rows alone; it needs an adapter of its own"
            )
        return tuple(after)

    @torch.no_grad()
    def probe(self, x: torch.Tensor, lengths: torch.Tensor, handles: list) -> None:
        """The model's own forward in eval mode on embedded tokens ``x`` (moved to its weights' device and
        dtype), read by the hooks ``handles``, which are removed after it."""
        param = next(self.model.parameters())
        was = self.model.training
        self.model.eval()
        try:
            self.own_forward(x.to(param.device, param.dtype), lengths)
        finally:
            for h in handles:
                h.remove()
            self.model.train(was)

    def last_states(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The last block call's output for embedded tokens ``x`` (:meth:`probe`), as float32."""
        states: list[torch.Tensor] = []
        hook = self.blocks[-1].register_forward_hook(
            lambda m, a, out: states.append(first_output(out).float())
        )
        self.probe(x, lengths, [hook])
        return states[-1]

    def is_causal(self) -> bool:
        """A decoder (each token sees only earlier ones), as the model runs, not as its type is named: two
        rows that differ only after their first token give the same last-block state of the first token
        (a bidirectional Gemma, ``use_bidirectional_attention``, or a BERT-generation encoder do not)."""
        if not self.by_hooks or next(self.model.parameters()).is_meta:  # a family's own masks; a model
            return True  # built to count its parameters runs nothing
        x = torch.randn(2, 8, self.d_input, generator=torch.Generator().manual_seed(0))
        x[1, 0] = x[0, 0]
        first = [self.last_states(x[i : i + 1], torch.tensor([8]))[0, 0] for i in (0, 1)]
        # a causal model computes the first token alike bit for bit; any later token's pull, however small
        # in a low-precision dtype, makes it bidirectional
        return bool((first[0] - first[1]).abs().max() <= 1e-6 * first[0].abs().max())

    def masks_padding(self) -> bool:
        """A bidirectional model's row padded beside a longer one keeps the states it has alone: its
        forward takes an attention mask and its attention honours it (eager attention is tried where
        the configured one does not, as Gemma's SDPA path with a bidirectional mask)."""
        if "attention_mask" not in accepted(self.model.forward):
            return False
        if next(self.model.parameters()).is_meta:
            return True
        x = torch.randn(2, 4, self.d_input, generator=torch.Generator().manual_seed(1))

        tolerance = max(
            1e-3, 4 * torch.finfo(next(self.model.parameters()).dtype).eps
        )  # the dtype's rounding

        def kept() -> bool:
            padded = self.last_states(x, torch.tensor([4, 2]))[1, :2]
            alone = self.last_states(x[1:, :2], torch.tensor([2]))[0]
            return bool((alone - padded).norm() <= tolerance * alone.norm())

        if kept():
            return True
        setter = getattr(self.model, "set_attn_implementation", None)
        if setter is None or getattr(self.config, "_attn_implementation", None) == "eager":
            return False
        setter("eager")
        return kept()

    def drop_unused(self) -> None:
        """Remove the token embedding: the FPT input layer replaces it, and a forward given ``inputs_embeds``
        never reads it (its width and std are read first)."""
        if self.embedding is None:
            return
        for _name, module in list(self.model.named_modules()):
            for child_name, child in list(module.named_children()):
                if child is self.embedding:
                    setattr(module, child_name, None)
        object.__setattr__(self, "embedding", None)

    # -- feeding and reading ----------------------------------------------------------------------
    def for_task(self, tokens: int | None) -> None:
        """Rows of any length refused up front where padding would change a row's states (:attr:`pads`)."""
        if tokens is None and not self.pads:
            raise BackboneError(self.padding_refusal())

    def padding_refusal(self) -> str:
        return (
            f"rows padded to a common length change this {self.config.model_type!r} model's states (its forward "
            "takes no attention mask, or its attention does not honour one); use it on a task of fixed length"
        )

    def call_kwargs(self, h: torch.Tensor, lengths: torch.Tensor) -> dict[str, Any]:
        """The model's forward arguments for embedded tokens ``h``: ``inputs_embeds``, an attention
        mask over right padding for bidirectional models, no cache."""
        names = accepted(self.model.forward)
        kwargs: dict[str, Any] = {"inputs_embeds": h}
        if not self.causal:
            real = torch.arange(h.shape[1], device=h.device)[None, :] < lengths.to(h.device)[:, None]
            if not self.pads and not bool(real.all()):
                raise BackboneError(self.padding_refusal())
            if "attention_mask" in names:
                kwargs["attention_mask"] = real.long()
        if "use_cache" in names:
            kwargs["use_cache"] = False
        return kwargs

    def own_forward(self, h: torch.Tensor, lengths: torch.Tensor) -> None:
        """The model's own forward on embedded tokens ``h``; a failure of the library's code is a
        BackboneError naming the model type (the generic adapter cannot run it)."""
        try:
            with quiet_transformers():
                self.model(**self.call_kwargs(h, lengths))
        except (StopForward, ReservoirError, torch.OutOfMemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - any other failure means the generic adapter cannot take it
            raise BackboneError(
                f"{self.config.model_type}'s own forward failed under the generic adapter ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); it needs an adapter of its own "
                "(reservoir/model/backbones/, one file: docs/contributing.md, recipe 1)"
            ) from None

    def add_positions(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus the added positions ``wpe`` (models without learned positions of their own)."""
        check_length(x, self.max_positions, f"{self.config.model_type} ({self.family} adapter)")
        if self.wpe is None:
            return x
        return x + self.wpe(torch.arange(x.shape[1], device=x.device)).to(x.dtype)

    def states(self, x, lengths, depths: Sequence[int], readout):
        """The generic adapter's walk: the model's own forward on ``inputs_embeds``, read by hooks, stopped
        at the deepest wanted depth (``by_hooks = False``: the base's :meth:`Backbone.states`). Depth ``k``
        is the input of the ``k+1``-th block call, as the model's own ``hidden_states`` (what its forward
        does between blocks, such as DeBERTa-v2's convolution after the first, included), and the last
        depth the last call's output. It cannot call a block itself, since each model's forward builds
        what its blocks take (masks, position biases, caches) in its own way."""
        if not self.by_hooks:
            return super().states(x, lengths, depths, readout)
        self.check_depths(depths)
        h = self.add_positions(x)
        last, caught = max(depths), {}
        wanted, calls = set(depths), [0]

        def before(
            module, args, kwargs
        ):  # the k+1-th block call's input is depth k (a shared block is called again)
            if calls[0] in wanted:
                caught[calls[0]] = gather(
                    kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], readout
                )
            if calls[0] == last:
                raise _Stop
            calls[0] += 1

        def after(module, args, output):  # the last call's output is the last depth
            if calls[0] == self.n_layers:
                caught[calls[0]] = gather(first_output(output), readout)
                raise _Stop

        handles = [block.register_forward_pre_hook(before, with_kwargs=True) for block in unique(self.blocks)]
        if last == self.n_layers:
            handles += [block.register_forward_hook(after) for block in unique(self.blocks)]
        try:
            self.own_forward(h, lengths)
        except _Stop:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return [self.finish(caught[d]) for d in depths]

    # -- groups, attention --------------------------------------------------------------------------
    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """``pos``: learned positions (or the added ``wpe``); ``ln``: every norm; ``attn``: each block's
        sequence-mixing modules (:data:`MIXER_NAMES`); ``ff``: the rest of each block."""
        ln = params(
            m
            for m in self.modules()
            if m is not self and type(m).__name__ != type(self).__name__ and is_norm(m)
        )
        pos = [
            p
            for item in self.positions
            for p in ([item] if isinstance(item, nn.Parameter) else item.parameters())
        ]
        pos = pos + (list(self.wpe.parameters()) if self.wpe is not None else [])
        attn: list[nn.Parameter] = []
        ff: list[nn.Parameter] = []
        for block in unique(self.blocks):
            mixers = without(params(self.mixers(block)), ln)
            attn += mixers
            ff += without(without(params([block]), ln), mixers)
        return {"pos": pos, "ln": ln, "attn": attn, "ff": ff}

    @staticmethod
    def mixers(block: nn.Module) -> list[nn.Module]:
        """The outermost modules of ``block`` whose class is named like a sequence mixer."""
        found: list[nn.Module] = []
        for m in block.modules():
            if (
                m is not block
                and any(s in type(m).__name__ for s in MIXER_NAMES)
                and not any(m in f.modules() for f in found)
            ):
                found.append(m)
        return found

    def attention_module(self, layer: int) -> nn.Module:
        attention = [m for m in self.mixers(self.blocks[layer]) if "Mixer" not in type(m).__name__]
        if not attention:
            raise BackboneError(
                f"a {self.config.model_type!r} block has no attention module (it mixes tokens by "
                f"{[type(m).__name__ for m in self.mixers(self.blocks[layer])] or 'nothing named'}); "
                "choose a transformer backbone"
            )
        return attention[0]

    @contextlib.contextmanager
    def eager_attention(self):
        before = getattr(self.config, "_attn_implementation", None)
        # transformers < 5 has no setter: the config's field is set instead
        use = getattr(self.model, "set_attn_implementation", None) or (
            lambda name: setattr(self.config, "_attn_implementation", name)
        )
        use("eager")
        try:
            yield
        finally:
            if before is not None and before != "eager":
                use(before)

    # -- saving -------------------------------------------------------------------------------------
    def check_saveable(self) -> None:
        """Refuse a backbone that is a part of the model ``AutoModel`` builds from its config (the
        encoder of an encoder-decoder): a folder of it would not load back as it."""
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        names = MODEL_MAPPING_NAMES.get(self.config.model_type, ())
        names = (names,) if isinstance(names, str) else tuple(names)
        if type(self.model).__name__ not in names:
            raise BackboneError(
                f"this backbone is the {type(self.model).__name__} of a {self.config.model_type!r} "
                f"model, which loads as {names[0] if names else 'another class'}: it cannot be saved "
                "as a backbone folder of its own; choose a decoder (GPT-2, Llama, ...) or an encoder model"
            )

    @torch.no_grad()
    def save_pretrained(self, folder: str | Path) -> None:
        """Write the backbone as a ``save_pretrained`` folder that :func:`load_model` takes and
        :func:`~reservoir.model.backbones.load_backbone` reads back to bitwise equal parameters.

        The token embedding, dropped on loading, is written back redrawn at the std it had
        (:attr:`token_std`, which ``--input-scale matched`` reads), so the folder is a complete model.
        Added positions ``wpe`` go to :data:`ADDED_POSITIONS` beside the weights.
        """
        self.check_saveable()
        with seeded(0):
            model = model_from_config(self.config)  # the architecture with its token embedding
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        redrawn = {id(p) for p in embedding.parameters()} if isinstance(embedding, nn.Module) else set()
        names = {name for name, p in model.named_parameters() if id(p) in redrawn}
        missing, unexpected = model.load_state_dict(self.model.state_dict(), strict=False)
        missing = [k for k in missing if k not in names and not _in_pooler(model, k)]
        if missing or unexpected:
            named = _named(("missing", missing), ("unexpected", unexpected))
            raise BackboneError(
                f"this {self.config.model_type!r} backbone does not fit the model its config builds "
                f"({named}); it cannot be saved as a folder"
            )
        if names and self.token_std:
            weight = embedding.weight
            z = torch.randn(weight.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
            weight.copy_((z / z.std() * self.token_std).to(weight.dtype))
        with quiet_transformers():
            model.save_pretrained(folder)
        if self.wpe is not None:
            from safetensors.torch import save_file

            save_file(
                {"weight": self.wpe.weight.detach().to("cpu", torch.float32).contiguous()},
                str(Path(folder) / ADDED_POSITIONS),
            )


def load_added_positions(backbone: HFBackbone, folder: str) -> None:
    """The added positions a saved backbone folder holds (:data:`ADDED_POSITIONS`, written by
    :meth:`HFBackbone.save_pretrained`) into ``backbone.wpe``; nothing for a folder without them."""
    path = Path(folder) / ADDED_POSITIONS
    if not path.is_file():
        return
    from safetensors.torch import load_file

    try:
        weight = load_file(str(path))["weight"]
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise BackboneError(
            f"cannot read the added positions {path} ({type(e).__name__}: {e}); pass the folder as "
            "train --save-backbone wrote it"
        ) from None
    want = None if backbone.wpe is None else tuple(backbone.wpe.weight.shape)
    if want != tuple(weight.shape):
        has = "learned positions of its own" if want is None else f"added positions of shape {want}"
        raise BackboneError(
            f"{path} holds added positions of shape {tuple(weight.shape)}, but this "
            f"{backbone.config.model_type!r} model has {has}; pass the folder as train --save-backbone "
            "wrote it"
        )
    with torch.no_grad():
        backbone.wpe.weight.copy_(weight)


def load_model(
    path: str, config=None, *, revision: str | None = None, dtype: torch.dtype = torch.float32
) -> nn.Module:
    """The Hugging Face model of a folder or hub id (at ``revision``), weights read in ``dtype``; refused,
    naming them, when the folder's weights do not fit its config (missing or wrongly shaped tensors)."""
    pinned = {"revision": revision} if revision else {}
    try:
        if config is None:
            from transformers import AutoConfig

            config = from_pretrained(AutoConfig, path, **pinned)
        cls = model_class(config)
        model, info = from_pretrained(cls, path, dtype=dtype, output_loading_info=True, **pinned)
    except OSError as e:
        raise BackboneError(
            f"cannot load weights from {path!r} ({str(e).splitlines()[0]}); pass a folder saved with "
            "save_pretrained (the hub is unreachable here), or use the -random twin"
        ) from None
    except (RuntimeError, ValueError, pickle.UnpicklingError) as e:  # shape mismatches and the like
        if refused := refused_by_torch(e):  # a pytorch_model.bin is read as tensors and plain data only
            raise BackboneError(
                f"the weights in {path!r} hold {refused}, which model weights never hold; refused "
                "without running it; pass a folder of safetensors weights saved with save_pretrained "
                "from a source you trust"
            ) from None
        raise BackboneError(
            f"the weights in {path!r} do not fit its config ({str(e).splitlines()[0][:300]}); "
            "pass the folder save_pretrained wrote for this model"
        ) from None
    except Exception as e:  # noqa: BLE001 - a damaged weight file fails in its reader's own error type
        raise BackboneError(
            f"the weights in {path!r} are unreadable ({type(e).__name__}: {str(e)[:200]}); save the "
            "model again with save_pretrained, or copy the folder again"
        ) from None
    missing = [
        k
        for k in info.get("missing_keys", [])
        if not k.endswith("num_batches_tracked") and not _in_pooler(model, k)
    ]
    mismatched = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", [])]
    if missing or mismatched:
        named = _named(("missing", missing), ("wrongly shaped", mismatched))
        raise BackboneError(
            f"the weights in {path!r} do not fit its config ({named}); these parts would be random. "
            "Pass the folder save_pretrained wrote for this model, or the -random twin for random weights"
        )
    return model


def is_pooler(name: str, module: nn.Module) -> bool:
    """A pooler (a head on the first token, not a hidden state): a ``*Pooler`` class, or a module
    named ``pooler*`` (ALBERT's ``pooler`` and ``pooler_activation``)."""
    return type(module).__name__.endswith("Pooler") or name.rpartition(".")[2].startswith("pooler")


def unique(modules) -> list[nn.Module]:
    """``modules`` each once, in order (a stack of shared blocks lists one module again)."""
    return list({id(m): m for m in modules}.values())


def _in_pooler(model: nn.Module, key: str) -> bool:
    """Whether parameter ``key`` belongs to a pooler (:func:`is_pooler`), which is never read here."""
    parts = key.split(".")
    module = model
    for i, name in enumerate(parts[:-1]):
        module = getattr(module, name, None)
        if module is None:
            return False
        if is_pooler(".".join(parts[: i + 1]), module):
            return True
    return False


def _named(*groups: tuple[str, list[str]], n: int = 4) -> str:
    """``what: k1, k2, k3, k4 and 5 more`` of each group of keys that has any, joined by ``; ``."""
    return "; ".join(
        f"{what}: {', '.join(keys[:n])}" + (f" and {len(keys) - n} more" if len(keys) > n else "")
        for what, keys in groups
        if keys
    )


def model_class(config):
    """The class a folder's model is built as: an encoder-only class its config names in ``architectures``
    (``T5EncoderModel``, whose ``AutoModel`` would be the whole encoder-decoder), else ``AutoModel`` (a
    model saved with a head is read as its base model)."""
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None) if name.endswith("EncoderModel") else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return transformers.AutoModel


def model_from_config(config) -> nn.Module:
    cls = model_class(config)
    with quiet_transformers():
        if cls.__name__ != "AutoModel":
            return cls._from_config(config, dtype=torch.float32)
        return cls.from_config(config, dtype=torch.float32, trust_remote_code=False)


def random_model(config, seed: int) -> nn.Module:
    """The architecture of ``config`` with its family's default initialisation, drawn once from ``seed``.

    Built under transformers' ``no_init_weights``, then initialised once by the model's ``init_weights``
    (the same distributions as building it plainly). Where that leaves a parameter untouched, the model
    is built plainly instead."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # an older transformers: its constructors draw, and post_init draws again
        no_init_weights = None
    if no_init_weights is not None:
        with seeded(seed), no_init_weights():
            model = model_from_config(config)
        with seeded(seed), torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
            model.init_weights()
        if not any(bool(torch.isnan(p).any()) for p in model.parameters()):
            return model
    with seeded(seed):
        return model_from_config(config)


def available_memory() -> int:
    """Bytes of memory this machine can still give (``MemAvailable``; the total where that is unknown)."""
    try:
        text = Path("/proc/meminfo").read_text()
        return int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("MemAvailable:"))) * 1024
    except (OSError, StopIteration, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_buildable(config, source: str, dtype: torch.dtype = torch.float32) -> None:
    """Refuse, in words, a config that builds no model or one larger than this machine's free memory in
    ``dtype`` (built on the meta device, which allocates nothing)."""
    try:
        with torch.device("meta"):
            model = model_from_config(config)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for a bad config
        raise BackboneError(
            f"the config of {source!r} builds no model ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}); fix its config.json or pass the "
            "folder save_pretrained wrote"
        ) from None
    n = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    size = n * torch.empty((), dtype=dtype).element_size()
    if size > available_memory():
        name = str(dtype).removeprefix("torch.")
        raise BackboneError(
            f"the config of {source!r} describes a model of {n:,} parameters ({size / 2**30:,.1f} GiB "
            f"in {name}), more than this machine's {available_memory() / 2**30:,.1f} GiB of free "
            "memory; check its config.json (sizes, layers, vocabulary), load it in half the memory with "
            "--load-dtype bfloat16, or use a larger machine"
        )


def takes_pixels_only(config) -> bool:
    """Whether ``config``'s model is a vision transformer read from pixels alone: patches of an image
    (``patch_size``, ``image_size``) through a forward that takes no ``inputs_embeds``."""
    if not (hasattr(config, "patch_size") and hasattr(config, "image_size")):
        return False
    try:
        cls = model_class(config)
        if cls.__name__ == "AutoModel":
            from transformers import MODEL_MAPPING

            cls = MODEL_MAPPING[type(config)]
    except (KeyError, ValueError):
        return False
    return "inputs_embeds" not in accepted(cls.forward) and "pixel_values" in accepted(cls.forward)


def adapter_for(model_type: str, config=None) -> type[HFBackbone]:
    """The family adapter of ``model_type``; the vision adapter for another vision transformer that reads
    pixels only (:func:`takes_pixels_only`); else the generic one."""
    if model_type in ADAPTERS:
        return ADAPTERS[model_type]
    if config is not None and "vit" in ADAPTERS and takes_pixels_only(config):
        return ADAPTERS["vit"]
    return HFBackbone

"""Attention probabilities of one block of a frozen backbone for one example (FPT paper, figures 3 to 5).

The example goes through the project's own forward path (:class:`reservoir.model.reservoir.Reservoir`);
a hook on the attention module of block ``layer``, which the backbone's adapter names, catches what it
returns and stops the forward there. The module runs with Hugging Face's ``eager`` attention, so the
weights are the library's own (what ``output_attentions=True`` returns). A backbone without attention
(an LSTM, an echo state network, a state-space model) is refused.

With ``checkpoint``, the input layer, positions and layer norms are those a ``reservoir train`` run
learned, as the paper's figures show them.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from reservoir.config import parse_input_scale
from reservoir.errors import BackboneError, DataError, IdentityError, UsageError
from reservoir.identity import task_label
from reservoir.model.backbones import fingerprint as backbone_fingerprint
from reservoir.model.backbones import freeze, load_backbone
from reservoir.model.backbones import label as backbone_label
from reservoir.model.backbones.base import StopForward
from reservoir.model.reservoir import Reservoir, check_length
from reservoir.paths import default_data_dir
from reservoir.tasks import make_task


class _Caught(StopForward):
    """Raised by the hook once the attention module has returned: the rest need not run."""


def catch_output(module: nn.Module, run: Callable[[], Any], call: int = 1) -> Any:
    """What ``module`` returns on its ``call``-th call while ``run()`` executes (which stops there)."""
    caught: dict[str, Any] = {}
    calls = [0]

    def hook(mod, args, output):
        calls[0] += 1
        if calls[0] == call:
            caught["out"] = output
            raise _Caught

    def ask(mod, args, kwargs):  # modules that return their weights only when asked (DeBERTa, T5)
        return args, {**kwargs, "output_attentions": True}

    handles = [module.register_forward_hook(hook)]
    if "output_attentions" in inspect.signature(module.forward).parameters:
        handles.append(module.register_forward_pre_hook(ask, with_kwargs=True))
    try:
        run()
    except _Caught:
        pass
    finally:
        for handle in handles:
            handle.remove()
    if "out" not in caught:
        raise BackboneError(
            "the attention module of the requested block was never called by the forward pass"
        )
    return caught["out"]


def weights_in(output: Any, n: int) -> torch.Tensor | None:
    """The attention weights ``(B, heads, n, n)`` among what an attention module returned."""
    items = (
        [output]
        if isinstance(output, torch.Tensor)
        else list(output.values() if isinstance(output, dict) else output)
    )
    for item in items:  # probabilities: (.., n, n), non-negative rows summing to 1 (not T5's position bias)
        if (
            isinstance(item, torch.Tensor)
            and item.dim() == 4
            and tuple(item.shape[-2:]) == (n, n)
            and bool((item >= 0).all())
            and torch.allclose(item.float().sum(-1), torch.ones(()), atol=1e-3)
        ):
            return item
    return None


def attention_probs(
    reservoir: nn.Module, tokens: torch.Tensor, lengths: torch.Tensor, layer: int
) -> torch.Tensor:
    """Attention probabilities ``(B, heads, T, T)`` (float32) of block ``layer`` of ``reservoir``'s backbone.

    Parameters
    ----------
    reservoir
        a :class:`reservoir.model.reservoir.Reservoir` (or anything called as one).
    tokens, lengths
        a batch as the task encodes it, unpadded (an encoder's tokens would see padding).
    layer
        the block, from 0.
    """
    backbone = reservoir.backbone
    if not 0 <= layer < backbone.n_layers:
        raise UsageError(
            f"layer {layer} is out of range for this backbone ({backbone.n_layers} blocks); "
            f"choose a layer in [0, {backbone.n_layers - 1}]"
        )
    module = backbone.attention_module(layer)
    blocks = list(getattr(backbone, "blocks", None) or [])
    # a block shared by several depths (ALBERT): this depth's call follows the earlier depths' calls
    call = 1 + sum(b is blocks[layer] for b in blocks[:layer]) if blocks else 1
    with torch.inference_mode(), backbone.eager_attention():
        output = catch_output(module, lambda: reservoir(tokens, lengths, [layer + 1]), call)
    weights = weights_in(output, tokens.shape[1])
    if weights is None:
        raise BackboneError(
            f"the attention module of block {layer} ({type(module).__name__}) did not return its "
            "weights; this family cannot show attention maps"
        )
    return weights.float()


def token_labels(task, tokens: np.ndarray) -> list[str]:
    """A short label per token of one example: the value of a one-value token, the symbol (the task module's
    ``VOCAB``) or id of an id token, else the position."""
    if tokens.ndim == 2 and tokens.shape[1] == 1:
        return [f"{v:g}" for v in tokens[:, 0]]
    if tokens.ndim == 1:
        vocab = getattr(sys.modules.get(type(task).__module__), "VOCAB", None)
        names = {i: s for s, i in vocab.items()} if isinstance(vocab, dict) else {}
        return [names.get(int(i), str(int(i))) for i in tokens]
    return [str(i) for i in range(len(tokens))]


def _checkpoint_model(path: Path, task_name: str, backbone_name: str):
    """The trained FPT of a ``reservoir train`` checkpoint (best-validation parameters) and its identity."""
    from reservoir.train.checkpoint import read_checkpoint
    from reservoir.train.model import FPT, select_trainable

    obj = read_checkpoint(
        path, "pass a .pt file written by this version of `reservoir train` (its checkpoint folder)"
    )
    ident = obj["identity"]
    wanted = {"task": task_label(task_name), "backbone": backbone_label(backbone_name)}
    for key, value in wanted.items():
        if ident.get(key) != value:
            raise IdentityError(
                f"checkpoint {path} was trained with {key} {ident.get(key)!r}, not {value!r}; "
                + (
                    f"pass --{key} {ident.get(key)}"
                    if key == "task"  # a backbone is recorded by its folder's base name: not a path to pass
                    else f"pass --backbone with the model it was trained on (recorded as {ident.get(key)!r})"
                )
                + f", or a checkpoint of this {key}"
            )
    seed = ident["run_seed"]
    backbone = load_backbone(backbone_name, seed)
    if backbone_fingerprint(backbone) != ident["backbone_fingerprint"]:
        raise IdentityError(
            f"backbone {backbone_name!r} is not the one checkpoint {path} was trained on (its weights "
            "differ); pass the same backbone folder or name"
        )
    model = FPT(
        make_task(task_name, ident["task_options"], seed).spec,
        backbone,
        blocks=ident["blocks"],
        seed=seed,
        input_scale=ident["input_scale"],
        dropout=0.0,
    )
    params, _ = select_trainable(model, ident["trainable"])
    saved = obj["state"].get("best_params") or obj["params"]
    if [tuple(t.shape) for t in saved] != [tuple(p.shape) for p in params]:
        raise DataError(
            f"checkpoint {path} holds {len(saved)} trained tensors of other shapes than this task and "
            f"backbone's {len(params)}; pass a checkpoint `reservoir train` wrote for them"
        )
    with torch.no_grad():
        for p, value in zip(params, saved, strict=True):
            p.copy_(value)
    return model.reservoir, ident


def first_layer_attention(
    task_name: str,
    backbone_name: str,
    *,
    seed: int = 0,
    layer: int = 0,
    example: int = 0,
    split: str = "test",
    input_scale: str = "paper",
    data_dir: Path | str | None = None,
    limit: int | None = None,
    checkpoint: Path | str | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Attention probabilities of one block for one example, through the project's forward path.

    Parameters
    ----------
    task_name
        a registered task (``reservoir tasks``) or ``file:PATH``.
    backbone_name
        a registered backbone, a ``save_pretrained`` folder or ``hf:ID`` (and twins).
    seed, input_scale
        as ``extract --seed`` and ``--input-scale``.
    layer
        the block, from 0 (the FPT paper's figures show block 0).
    example, split
        the row and the split it comes from.
    data_dir
        data folder (default: ``$RESERVOIR_HOME/data`` or ``./data``).
    limit
        ``example`` is a row of the seeded sample of ``limit`` that ``extract --limit`` draws.
    checkpoint
        a ``reservoir train`` checkpoint (``.pt``) of this task and backbone, whose trained input layer,
        positions and norms are used, and whose seed, input scale and task options override the arguments.

    Returns
    -------
    weights : ``(heads, T, T)`` float32; row ``i`` is query token ``i``'s distribution over key tokens.
    token_labels : one short string per token (:func:`token_labels`).

    Examples
    --------
    >>> w, labels = first_layer_attention("bit_xor", "gpt2-random")   # doctest: +SKIP
    >>> w.shape, labels[:3]                                           # doctest: +SKIP
    ((12, 10, 10), ['1', '0', '1'])
    """
    if example < 0 or layer < 0:
        raise UsageError(f"example and layer count from 0; got example {example}, layer {layer}")
    if limit is not None and example >= limit:
        raise UsageError(
            f"example {example} is outside the {limit} examples --limit keeps; "
            f"choose an example below {limit} or raise the limit"
        )
    if checkpoint is not None:
        reservoir, ident = _checkpoint_model(Path(checkpoint), task_name, backbone_name)
        task = make_task(task_name, ident["task_options"], ident["run_seed"])
    else:
        task = make_task(task_name, {}, seed)
        backbone = load_backbone(backbone_name, seed)
        reservoir = Reservoir(task.spec, backbone, seed=seed, input_scale=parse_input_scale(input_scale))
    try:
        reservoir.backbone.attention_module(0)
    except (UsageError, BackboneError):
        raise UsageError(
            f"backbone {backbone_name!r} ({reservoir.backbone.kind})"
            " has no attention to show; choose a transformer backbone such as gpt2, gpt2-random, "
            "smollm2-135m(-random) or a save_pretrained folder of a transformer"
        ) from None
    check_length(task.spec, reservoir.backbone, backbone_name)
    task.check_split(split)
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    data = task.read(split, folder, example + 1) if limit is None else task.load(split, folder, limit, seed)
    if example >= len(data):
        raise UsageError(
            f"split {split!r} of task {task_name!r} has {len(data)} examples; choose an example "
            f"below {len(data)}"
        )
    length = int(data.lengths[example])
    tokens = task.encode(data.inputs[example : example + 1])[:, :length]
    freeze(reservoir.float()).eval()
    weights = attention_probs(
        reservoir, torch.from_numpy(np.ascontiguousarray(tokens)), torch.tensor([length]), layer
    )
    return weights[0].numpy(), token_labels(task, tokens[0])

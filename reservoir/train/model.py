"""The FPT model: the shared forward path (:class:`reservoir.model.reservoir.Reservoir`) plus a linear
output layer on the readout tokens, its parameter groups and their counts.

The FPT of Lu et al. (2021, section 2.2) trains a small parameter set of a frozen transformer: the input
layer (orthogonal initialisation, gain 1.41), the positional embeddings, the layer norms and the output
layer; ``trainable`` picks the groups (``attn`` and ``ff`` unfreeze the blocks themselves). Untrained and in
eval mode, its readout states are exactly the features ``reservoir extract`` stores for the same seed, except
where position parameters start at exactly zero (:func:`draw_zero_positions`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from reservoir.config import TRAIN_GROUPS
from reservoir.errors import UsageError
from reservoir.model.backbones import Backbone
from reservoir.model.reservoir import Reservoir
from reservoir.tasks import TaskSpec

#: std of position parameters that start at exactly zero, drawn when the FPT is built (GPT-2's ``initializer_range``)
POSITION_STD = 0.02


def draw_zero_positions(backbone: Backbone, generator: torch.Generator) -> int:
    """Draw the backbone's ``pos`` parameters that are exactly zero from N(0, POSITION_STD^2); returns how many.

    Models without learned positions get an added position embedding that is zero; trained from there, an
    all-zero token keeps a zero state in a model without biases and its gradient overflows (why: see
    docs/guide/pipelines.md, all-zero tokens).
    """
    drawn = 0
    with torch.no_grad():
        for p in backbone.param_groups().get("pos", []):
            if p.numel() and not p.is_meta and not bool(p.detach().any()):
                p.copy_(
                    torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.dtype) * POSITION_STD
                )
                drawn += 1
    return drawn


def output_layer(d_model: int, n_out: int, generator: torch.Generator) -> nn.Linear:
    """``nn.Linear``'s default initialisation, drawn from ``generator`` (no global RNG)."""
    layer = nn.Linear(d_model, n_out)
    with torch.no_grad():
        nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
        bound = 1 / math.sqrt(d_model)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return layer


class FPT(nn.Module):
    """Input layer -> dropout -> backbone truncated to ``blocks`` -> linear output per readout token.

    Parameters
    ----------
    spec, backbone, blocks
        the task's spec, the backbone and how many of its blocks run.
    seed
        seeds the input layer (as extraction does), the output layer and zero positions
        (:func:`draw_zero_positions`).
    input_scale
        the input layer's scale.
    dropout
        after a dense input layer (not an id embedding: the FPT code's) and in the backbone's own dropout layers.

    ``forward(tokens, lengths)`` returns logits ``(B, n_readout, outputs_per_token, n_classes)``.
    """

    def __init__(
        self,
        spec: TaskSpec,
        backbone: Backbone,
        *,
        blocks: int,
        seed: int,
        input_scale: str = "paper",
        dropout: float = 0.1,
    ):
        super().__init__()
        from reservoir.train.seeds import derive

        backbone.check_depths([blocks])
        self.spec, self.blocks = spec, blocks
        draw_zero_positions(backbone, torch.Generator().manual_seed(derive(seed, "positions")))
        self.reservoir = Reservoir(spec, backbone, seed=seed, input_scale=input_scale, dropout=dropout)
        for module in backbone.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
        g = torch.Generator().manual_seed(derive(seed, "output layer"))
        self.out = output_layer(backbone.d_model, spec.outputs_per_token * spec.n_classes, g)

    @property
    def backbone(self) -> Backbone:
        return self.reservoir.backbone

    def features(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Readout states ``(B, n_readout, d)`` after ``blocks`` blocks (the stored features, untrained)."""
        return self.reservoir(tokens, lengths, [self.blocks])[:, 0]

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.features(tokens, lengths)
        return self.out(h).view(*h.shape[:2], self.spec.outputs_per_token, self.spec.n_classes)

    @property
    def run_blocks(self) -> list[nn.Module]:
        """The distinct blocks the first ``blocks`` applications run (a shared block, as ALBERT's, once)."""
        blocks = self.backbone.blocks
        return list({id(b): b for b in blocks[: self.blocks]}.values()) if blocks is not None else []

    def groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by group: ``input``, the backbone's groups (``pos``, ``ln``, ...), ``out``; blocks past
        ``blocks`` are in no group."""
        blocks = self.backbone.blocks
        run = {id(p) for b in self.run_blocks for p in b.parameters()}
        unrun = {id(p) for p in blocks.parameters()} - run if blocks is not None else set()
        groups = {
            "input": list(self.reservoir.input_layer.parameters()),
            **self.backbone.param_groups(),
            "out": list(self.out.parameters()),
        }
        return {name: [p for p in params if id(p) not in unrun] for name, params in groups.items()}


def select_trainable(model: FPT, trainable: Sequence[str]) -> tuple[list[nn.Parameter], list[str]]:
    """Freeze everything, then unfreeze the named groups (explicit parameter lists, no name matching).

    Returns the trainable parameters (in a fixed order) and notes about groups this backbone lacks.
    """
    groups = model.groups()
    unknown = [g for g in trainable if g not in groups and g not in TRAIN_GROUPS]
    if unknown:
        raise UsageError(
            f"unknown trainable group {unknown[0]!r}; choose from {sorted(set(groups) | set(TRAIN_GROUPS))}"
        )
    for p in model.parameters():
        p.requires_grad_(False)
    params, seen, notes = [], set(), []
    for name in trainable:
        if not groups.get(name):
            notes.append(f"{model.backbone.kind} has no {name!r} parameters; skipped")
            continue
        for p in groups[name]:
            if id(p) not in seen:
                seen.add(id(p))
                p.requires_grad_(True)
                params.append(p)
    if not params:
        raise UsageError(
            f"trainable groups {list(trainable)} select no parameters of this model; "
            f"choose from {sorted(g for g, ps in groups.items() if ps)}"
        )
    return params, notes


def _shape_terms(params: Sequence[nn.Parameter]) -> str:
    shapes = Counter("x".join(map(str, p.shape)) for p in params)
    return " + ".join(f"{n} x {s}" if n > 1 else s for s, n in shapes.items())


def _reached(p: nn.Parameter, rows: int) -> int:
    """Parameters of a position table ``p`` that rows of ``rows`` tokens reach (the paper's ``l x n_dim``)."""
    return min(p.shape[0], rows) * p[0].numel() if p.ndim == 2 else p.numel()


def param_counts(model: FPT) -> list[dict[str, Any]]:
    """One row per group: parameter count and its arithmetic (``12 x (4 x 768) + 2 x 768 = 38,400``).

    Blocks are assumed identical: the per-block term is the first block's, times :attr:`FPT.run_blocks`. A
    position table counts the rows the task's positions reach, as the paper counts them (``l x n_dim``: 64 x
    768 for CIFAR-10 in GPT-2's table of 1024): the other rows never get a gradient. With no block run
    (``--blocks 0``) no position reads another, so rows of one length reach only the rows the readout reads.
    """
    blocks = model.backbone.blocks
    in_blocks = {id(p) for p in blocks.parameters()} if blocks is not None else set()
    first = {id(p) for p in blocks[0].parameters()} if blocks is not None and len(blocks) else set()
    n_run = len(model.run_blocks)
    rows = []
    seq = model.spec.seq_len
    if n_run == 0 and not model.spec.variable_length:
        seq = min(seq, model.spec.n_readout)
    for name, params in model.groups().items():
        tables = [p for p in params if name == "pos" and p.ndim == 2 and p.shape[0] > seq]
        table_ids = {id(p) for p in tables}
        total = sum(_reached(p, seq) if id(p) in table_ids else p.numel() for p in params)
        per_block = [p for p in params if id(p) in first]
        outside = [p for p in params if id(p) not in in_blocks and id(p) not in table_ids]
        terms = []
        if per_block:
            terms.append(f"{n_run} x ({_shape_terms(per_block)})")
        if outside:
            terms.append(_shape_terms(outside))
        terms += [f"{seq}x{p.shape[1]} of {_shape_terms([p])}" for p in tables]
        rows.append(
            {
                "group": name,
                "params": total,
                "arithmetic": " + ".join(terms) or "0",
                "trainable": bool(params) and all(p.requires_grad for p in params),
            }
        )
    return rows


def format_counts(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["group"]) for r in rows)
    lines = [
        f"{r['group']:{width}s} {'train ' if r['trainable'] else 'frozen'} {r['params']:>12,d}  "
        f"= {r['arithmetic']}"
        for r in rows
    ]
    n_train = sum(r["params"] for r in rows if r["trainable"])
    lines.append(f"{'':{width}s} trainable {n_train:,d} of {sum(r['params'] for r in rows):,d}")
    return "\n".join(lines)

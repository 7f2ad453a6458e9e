"""The one forward path: frozen input layer -> backbone -> readout tokens at each depth.

``extract``, ``train`` and the scikit-learn transformer all build their model here, so the features a
file stores, the untrained end-to-end model and ``ReservoirFeatures`` are the same numbers (tested).
The depth convention is the backbones' (:mod:`reservoir.model.backbones`); the readout rule is
:func:`readout_index`, by the run's readout (:data:`READOUTS`). ``padded`` is the official FPT code's
readout, which depends on padding; ``all`` is for tasks of fixed length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from reservoir.config import READOUT_CHOICES as READOUTS
from reservoir.errors import BackboneError, UsageError
from reservoir.model.backbones import Backbone
from reservoir.model.input_layer import make_input_layer
from reservoir.tasks import TaskSpec


def readout_positions(lengths: torch.Tensor, n_readout: int, width: int | None = None) -> torch.Tensor:
    """The readout rule, defined once: positions ``(B, n_readout)`` of the last ``n_readout`` real
    tokens of each row, or (``width`` given, the padded readout) of the last ``n_readout``
    positions of rows padded to ``width``."""
    last = lengths if width is None else torch.full_like(lengths, width)
    return last[:, None] - n_readout + torch.arange(n_readout, device=lengths.device)[None, :]


def readout_count(spec: TaskSpec, readout: str) -> int:
    """Rows a feature holds per example and depth under ``readout``: 1 for ``mean``, the task's length
    for ``all``, else the task's ``n_readout``."""
    return {"mean": 1, "all": spec.seq_len}.get(readout, spec.n_readout)


def readout_index(lengths: torch.Tensor, spec: TaskSpec, readout: str, width: int) -> torch.Tensor:
    """Positions ``(B, R)`` the backbone's states are read at, for a batch ``width`` tokens wide:
    :func:`readout_positions` for ``last`` and ``padded``, every position ``0..width-1`` for ``mean``
    (whose rows :meth:`Reservoir.forward` then averages over the real tokens) and ``0..seq_len-1`` for
    ``all``."""
    if readout == "mean":
        return torch.arange(width, device=lengths.device).expand(len(lengths), width)
    if readout == "all":
        return readout_positions(lengths, spec.seq_len)
    return readout_positions(lengths, spec.n_readout, width if readout == "padded" else None)


def check_readout(spec: TaskSpec, readout: str) -> None:
    """Refuse, before anything runs, a readout the task cannot take (UsageError naming the fix):
    ``mean`` and ``all`` of a task that reads several tokens, ``all`` of a task of variable length, ``padded``
    of a task of fixed length (where it is ``last``)."""
    if readout not in READOUTS:
        raise UsageError(f"unknown readout {readout!r}; choose from {', '.join(READOUTS)}")
    if readout in ("mean", "all") and spec.n_readout > 1 and spec.n_readout != spec.seq_len:
        raise UsageError(
            f"task {spec.name!r} reads its last {spec.n_readout} tokens, one label each; --readout {readout} "
            "gives another number of rows than it has labels: use --readout last"
        )
    if readout == "all" and spec.variable_length:
        raise UsageError(
            f"--readout all stores every position's state and needs a task of fixed length; task {spec.name!r} "
            f"has sequences of up to {spec.seq_len} tokens: use --readout mean (every real token, averaged) "
            "or last"
        )
    if readout == "padded" and not spec.variable_length:
        raise UsageError(
            f"--readout padded pads rows to the task's length and reads its last position; task {spec.name!r} "
            f"has rows of one length ({spec.seq_len} tokens), so it reads what --readout last reads, under another "
            "identity: use --readout last"
        )


def check_length(spec: TaskSpec, backbone: Backbone, backbone_name: str) -> None:
    """Refuse, before anything runs, a task longer than the backbone's positions."""
    limit = getattr(backbone, "max_positions", None)
    if limit is not None and spec.seq_len > limit:
        raise BackboneError(
            f"task {spec.name!r} has sequences of up to {spec.seq_len} tokens, but backbone {backbone_name!r} reads at "
            f"most {limit} positions; shorten the task (e.g. --task-opt max_len={limit} where the task has it) or "
            "choose a backbone with more positions"
        )


class Reservoir(nn.Module):
    """Frozen input layer -> dropout -> backbone -> hidden states of the readout tokens.

    Parameters
    ----------
    spec
        the task's spec (token kind and width or vocabulary, readout count).
    backbone
        the backbone (its blocks run up to the deepest requested depth).
    seed
        seeds the input layer (:func:`reservoir.model.input_layer.make_input_layer`).
    input_scale
        the input layer's scale (``"paper"``, ``"matched"`` or a std as text).
    dropout
        after a dense input layer (training only; 0 for extraction). An id embedding goes to the backbone as it is,
        as in the FPT code, where the backbone's own embedding dropout is the only one.
    readout
        one of :data:`READOUTS` (:func:`check_readout` refuses what the task cannot take).

    ``forward(tokens, lengths, depths, readout=None)`` returns ``(B, n_depths, R, d)`` in the
    backbone's dtype, ``R`` :func:`readout_count`; ``readout`` the positions to read (default
    :func:`readout_index` of the batch). Under the ``mean`` readout the states at those positions
    are averaged over the positions before each row's length.
    """

    def __init__(
        self,
        spec: TaskSpec,
        backbone: Backbone,
        *,
        seed: int,
        input_scale: str = "paper",
        dropout: float = 0.0,
        readout: str = "last",
    ):
        super().__init__()
        check_readout(spec, readout)
        self.spec, self.readout = spec, readout
        self.input_layer = make_input_layer(
            spec, backbone.input_width, seed, input_scale, getattr(backbone, "token_std", None)
        )
        self.dropout = nn.Dropout(dropout) if spec.token_kind == "dense" else nn.Identity()
        self.backbone = backbone
        backbone.for_task(None if spec.variable_length else spec.seq_len)
        self.compute_dtype = torch.float32

    def to_compute(self, dtype: torch.dtype) -> Reservoir:
        """Run the backbone in ``dtype``; the input layer stays float32."""
        self.backbone.to(dtype)
        self.compute_dtype = dtype
        return self

    def forward(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        depths: Sequence[int],
        readout: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if readout is None:
            readout = readout_index(lengths, self.spec, self.readout, tokens.shape[1])
        x = self.dropout(self.input_layer(tokens)).to(self.compute_dtype)
        states = self.backbone(x, lengths, depths, readout)
        if self.readout != "mean":
            return states
        real = (readout < lengths[:, None]).to(states.dtype)  # (B, W): 1 at real tokens
        total = (states * real[:, None, :, None]).sum(2, keepdim=True)
        return total / lengths.to(states.dtype)[:, None, None, None]


class FixedDepths(nn.Module):
    """``reservoir`` reading ``depths``, features as float32: ``(tokens, lengths, readout) -> (B,
    n_depths, n_readout, d)``, the module an engine runs."""

    def __init__(self, reservoir: Reservoir, depths: Sequence[int]):
        super().__init__()
        self.reservoir, self.depths = reservoir, tuple(depths)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
        return self.reservoir(tokens, lengths, self.depths, readout).float()

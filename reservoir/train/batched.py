"""Several runs of one FPT trained in one forward and backward pass: the run dimension folded into the batch.

The runs of a group (learning rates x seeds of one backbone) share the template model's frozen modules; what
differs between them (the trainable parameters, and every frozen tensor a run draws from its seed) is stacked,
one row a run (:class:`RunStack`). A batch holds each run's rows one after another. Modules whose tensors every
run shares run once over all rows; each module that owns a stacked tensor computes each run's rows with that
run's tensors, by the operation it runs alone (the functional form of ``nn.Linear``, ``Conv1D``,
``nn.LayerNorm`` and ``nn.Embedding``, else its own forward once a run), so a run's numbers are those it
computes alone. Inside :func:`drawing`, dropout draws each run's rows from that run's generator states.

Caveat: a family that reads a stacked tensor elsewhere than through its module's forward reads the
template's copy, which is NaN; :class:`reservoir.train.group.GroupRun` checks the stacked forward against
each run's own model before training, and such runs train one after another.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from reservoir.errors import BackboneError
from reservoir.model.backbones.hf import available_memory

#: the share of free device memory (CUDA) and of available memory (CPU) a group may take
CUDA_SHARE = 0.8
CPU_SHARE = 0.5
#: the most tokens a step of a group takes on the CPU, where a group saves only each step's fixed cost
#: (docs/benchmarks.md, runs trained together)
CPU_TOKENS = 2048


@dataclasses.dataclass
class Bound:
    """What the stacked modules of a forward read: a tensor per stacked name ``(runs, *shape)``, the rows each run
    has in the batch, and each run's generator states (training only)."""

    tensors: list[torch.Tensor]
    runs: int
    rows: int
    generators: list[dict[str, torch.Tensor]] | None = None

    def narrowed(self, r: int) -> Bound:
        """Run ``r`` alone (its generator states shared, so that its draws carry on)."""
        return Bound(
            [t[r : r + 1] for t in self.tensors],
            1,
            self.rows,
            None if self.generators is None else [self.generators[r]],
        )

    def each_run(self, fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> torch.Tensor:
        """``fn`` on each run's rows of ``tensors``, with the run's generator state as the device's, joined;
        the caller's generator state is restored afterwards."""
        assert self.generators is not None, "only a training forward draws"
        rows = tensors[0].shape[0]
        if rows % self.runs:
            raise BackboneError(
                f"a random draw of a batched forward got a tensor of {rows} rows, which is not {self.runs} runs' "
                "rows one after another; train these runs one after another (--concurrent-runs 1)"
            )
        generator, key = device_generator(tensors[0].device)
        caller = generator.get_state()
        chunks = [t.chunk(self.runs) for t in tensors]
        out = []
        try:
            for r in range(self.runs):
                generator.set_state(self.generators[r][key])
                out.append(fn(*(c[r] for c in chunks)))
                self.generators[r][key] = generator.get_state()
        finally:
            generator.set_state(caller)
        return torch.cat(out)


_BOUND: contextvars.ContextVar[Bound | None] = contextvars.ContextVar("reservoir_bound_runs", default=None)


def bound() -> Bound:
    b = _BOUND.get()
    assert b is not None, "a stacked module runs only inside RunStack.bound"
    return b


def device_generator(device: torch.device) -> tuple[torch.Generator, str]:
    """The generator dropout on ``device`` draws from, and its key in a run's generator states."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index], "cuda"
    return torch.default_generator, "torch"


# ---------------------------------------------------------------- per-run draws

_DROPOUT = F.dropout
_SDPA = F.scaled_dot_product_attention


def _run_dropout(input, p=0.5, training=True, inplace=False):
    b = _BOUND.get()
    if b is None or b.generators is None or not training or p == 0:
        return _DROPOUT(input, p, training, inplace)
    return b.each_run(lambda x: _DROPOUT(x, p, training, False), input)


def _run_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
    b = _BOUND.get()
    if b is None or b.generators is None or not dropout_p:
        return _SDPA(query, key, value, attn_mask, dropout_p, *args, **kwargs)
    by_row = attn_mask is not None and attn_mask.dim() > 0 and attn_mask.shape[0] == query.shape[0] > 1
    if by_row:
        return b.each_run(
            lambda q, k, v, m: _SDPA(q, k, v, m, dropout_p, *args, **kwargs), query, key, value, attn_mask
        )
    return b.each_run(
        lambda q, k, v: _SDPA(q, k, v, attn_mask, dropout_p, *args, **kwargs), query, key, value
    )


@contextlib.contextmanager
def drawing() -> Iterator[None]:
    """Within: dropout and attention dropout draw each run's rows from its own generator states."""
    F.dropout, F.scaled_dot_product_attention = _run_dropout, _run_sdpa
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = _DROPOUT, _SDPA


# ---------------------------------------------------------------- stacked modules


def _tensor(module: nn.Module, slots: dict[str, int], name: str, b: Bound, r: int) -> torch.Tensor | None:
    """``module``'s tensor ``name`` for run ``r``: its row of the bound stacked tensor, or the module's own."""
    return b.tensors[slots[name]][r] if name in slots else getattr(module, name)


def _runs(x: torch.Tensor, b: Bound) -> tuple[torch.Tensor, ...]:
    """``x`` split into the bound runs' rows (its first dimension holds them one run after another)."""
    if x.dim() == 0 or x.shape[0] % b.runs:
        raise BackboneError(
            f"a stacked module of a batched forward got a tensor of shape {tuple(x.shape)}, which is not "
            f"{b.runs} runs' rows one after another; train these runs one after another (--concurrent-runs 1)"
        )
    return x.chunk(b.runs)


def _by_run(module: nn.Module, slots: dict[str, int], fn: Callable, x: torch.Tensor) -> torch.Tensor:
    """``fn(rows, weight, bias)`` of each bound run's rows of ``x`` with that run's ``weight`` and ``bias``
    (:func:`_tensor`), joined."""
    b = bound()
    return torch.cat(
        [
            fn(xr, _tensor(module, slots, "weight", b, r), _tensor(module, slots, "bias", b, r))
            for r, xr in enumerate(_runs(x, b))
        ]
    )


def _linear(module: nn.Module, slots: dict[str, int]) -> tuple[Callable, Callable]:
    def columns(x, start, stop):  # reservoir.model.backbones.base.columns of nn.Linear
        def linear(xr, w, bias):
            return F.linear(xr, w[start:stop], None if bias is None else bias[start:stop])

        return _by_run(module, slots, linear, x)

    return (lambda x: _by_run(module, slots, F.linear, x)), columns


def _conv1d(module: nn.Module, slots: dict[str, int]) -> tuple[Callable, Callable]:
    """transformers' ``Conv1D``: ``x @ weight + bias``, as its forward computes it (``addmm`` of the rows)."""

    def product(xr, w, bias):
        return torch.addmm(bias, xr.reshape(-1, xr.shape[-1]), w).view(*xr.shape[:-1], w.shape[-1])

    def columns(x, start, stop):  # reservoir.model.backbones.base.columns of Conv1D
        return _by_run(module, slots, lambda xr, w, bias: product(xr, w[:, start:stop], bias[start:stop]), x)

    return (lambda x: _by_run(module, slots, product, x)), columns


def _layer_norm(module: nn.LayerNorm, slots: dict[str, int]) -> tuple[Callable, None]:
    def norm(xr, w, bias):
        return F.layer_norm(xr, module.normalized_shape, w, bias, module.eps)

    return (lambda x: _by_run(module, slots, norm, x)), None


def _embedding(module: nn.Embedding, slots: dict[str, int]) -> tuple[Callable, None]:
    def forward(idx):
        b = bound()
        if idx.dim() >= 2 and idx.shape[0] == b.runs * b.rows:  # ids by row: each run's rows its own table
            return torch.cat(
                [F.embedding(ir, b.tensors[slots["weight"]][r]) for r, ir in enumerate(_runs(idx, b))]
            )
        out = []  # a lookup not by row (positions): every row of a run gets the run's vectors
        for r in range(b.runs):
            vectors = F.embedding(idx, b.tensors[slots["weight"]][r])
            vectors = vectors[0] if idx.dim() >= 2 and idx.shape[0] == 1 else vectors
            out.append(vectors.unsqueeze(0).expand(b.rows, *vectors.shape))
        return torch.cat(out)

    return forward, None


def _each_run(module: nn.Module, slots: dict[str, int]) -> Callable:
    """Any other module: called once a run, on its rows, with its tensors (``torch.func.functional_call``)."""

    def by_row(value, b: Bound) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == b.runs * b.rows

    def rows(value, r: int, b: Bound):
        return value[r * b.rows : (r + 1) * b.rows] if by_row(value, b) else value

    def spread(out: torch.Tensor, b: Bound) -> torch.Tensor:
        out = out[0] if out.dim() > 1 and out.shape[0] == 1 else out
        return out.unsqueeze(0).expand(b.rows, *out.shape)

    def join(outs: list, b: Bound, rowwise: bool):
        first = outs[0]
        if isinstance(first, torch.Tensor):
            return torch.cat(outs if rowwise else [spread(o, b) for o in outs])
        if isinstance(first, (tuple, list)):
            return type(first)(join([o[i] for o in outs], b, rowwise) for i in range(len(first)))
        return first

    def forward(*args, **kwargs):
        b = bound()
        rowwise = any(by_row(a, b) for a in (*args, *kwargs.values()))
        patched = module.__dict__.pop("forward")
        outs = []
        try:
            for r in range(b.runs):
                tensors = {name: b.tensors[i][r] for name, i in slots.items()}
                token = _BOUND.set(b.narrowed(r))
                try:
                    outs.append(
                        torch.func.functional_call(
                            module,
                            tensors,
                            tuple(rows(a, r, b) for a in args),
                            {k: rows(v, r, b) for k, v in kwargs.items()},
                            strict=False,
                        )
                    )
                finally:
                    _BOUND.reset(token)
        finally:
            module.forward = patched
        return join(outs, b, rowwise)

    return forward, None


def _kinds() -> dict[type, Callable]:
    """How each module type computes the rows of several runs (anything else: :func:`_each_run`)."""
    from transformers.pytorch_utils import Conv1D

    return {nn.Linear: _linear, Conv1D: _conv1d, nn.LayerNorm: _layer_norm, nn.Embedding: _embedding}


def _kind(module: nn.Module) -> Callable:
    kind = _kinds().get(type(module), _each_run)
    if kind is _embedding and (
        module.padding_idx is not None
        or module.max_norm is not None
        or module.sparse
        or module.scale_grad_by_freq
    ):
        return _each_run
    return kind


# ---------------------------------------------------------------- the stack


class RunStack:
    """The runs of a group on one template model: their stacked tensors, and the template's modules that read them.

    Parameters
    ----------
    template
        the model every run shares; its copies of the stacked tensors are set to NaN, so that a path reading
        them outside the stacked modules shows.
    names
        the template's stacked parameters: the first ``trainable`` train, the others differ between runs.
    values
        each run's values of ``names``.
    """

    def __init__(
        self,
        template: nn.Module,
        names: Sequence[str],
        values: Sequence[Sequence[torch.Tensor]],
        trainable: int,
    ):
        self.template, self.names, self.trainable = template, list(names), trainable
        params = dict(template.named_parameters())
        device = params[names[0]].device
        self.shapes = [tuple(params[n].shape) for n in names[:trainable]]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.runs = len(values)
        with torch.no_grad():
            #: the trainable tensors of every run, flat: (runs, P)
            self.theta = torch.stack(
                [torch.cat([v.detach().reshape(-1).float() for v in run[:trainable]]) for run in values]
            ).to(device)
            self.frozen = [
                torch.stack([run[i].detach() for run in values]).to(device)
                for i in range(trainable, len(names))
            ]
        self._views()
        owners: dict[str, dict[str, int]] = {}
        for i, name in enumerate(self.names):
            owner, _, local = name.rpartition(".")
            owners.setdefault(owner, {})[local] = i
        with torch.no_grad():
            for p in template.parameters():
                p.requires_grad_(False)
            for name in self.names:
                params[name].fill_(float("nan"))
        for owner, slots in owners.items():
            module = template.get_submodule(owner)
            forward, columns = _kind(module)(module, slots)
            module.forward = forward
            if columns is not None:
                module.columns = columns

    def _views(self) -> None:
        """The trainable leaves the forward reads and each run's :attr:`params`, views of :attr:`theta`."""
        self.leaves, self.params, offset = [], [[] for _ in range(self.runs)], 0
        for shape, size in zip(self.shapes, self.sizes):
            view = self.theta[:, offset : offset + size]
            self.leaves.append(view.view(self.runs, *shape).detach().requires_grad_())
            for r in range(self.runs):
                self.params[r].append(nn.Parameter(view[r].view(shape)))
            offset += size

    def tensors(self, index: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Every stacked tensor of the runs ``index`` (all: ``None``), in the order of :attr:`names`."""
        live = [*self.leaves, *self.frozen]
        return live if index is None else [t.index_select(0, index) for t in live]

    def best(self, index: torch.Tensor, params: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
        """The stacked tensors of the runs ``index`` with their trainable ones set to ``params`` (one list a run)."""
        trained = [torch.stack([run[i] for run in params]) for i in range(self.trainable)]
        return [*trained, *(t.index_select(0, index) for t in self.frozen)]

    @contextlib.contextmanager
    def bound(
        self, tensors: list[torch.Tensor], rows: int, generators: list[dict[str, torch.Tensor]] | None = None
    ) -> Iterator[None]:
        """Within: the template computes runs of ``rows`` rows each with ``tensors`` and ``generators``."""
        token = _BOUND.set(Bound(tensors, len(tensors[0]), rows, generators))
        try:
            yield
        finally:
            _BOUND.reset(token)

    def gradients(self) -> None:
        """Each run's parameters take their rows of the leaves' gradients (the leaves' are cleared)."""
        for k, leaf in enumerate(self.leaves):
            for r in range(self.runs):
                self.params[r][k].grad = None if leaf.grad is None else leaf.grad[r]
            leaf.grad = None

    def keep(self, runs: Sequence[int]) -> None:
        """Keep only the runs ``runs``, in that order; their :attr:`params` are new tensors."""
        index = torch.tensor(list(runs), dtype=torch.long, device=self.theta.device)
        with torch.no_grad():
            self.theta = self.theta.index_select(0, index)
            self.frozen = [t.index_select(0, index) for t in self.frozen]
        self.runs = len(runs)
        self._views()


# ---------------------------------------------------------------- sizing a group


def saved_bytes(step: Callable[[], None]) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``step()`` runs its forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


def runs_that_fit(run_bytes: int, device: torch.device, n_runs: int, run_tokens: int) -> tuple[int, int]:
    """How many of ``n_runs`` runs of ``run_bytes`` each fit :data:`CUDA_SHARE` of a card's free memory or
    :data:`CPU_SHARE` of the machine's available memory (at least one; on the CPU at most :data:`CPU_TOKENS`
    tokens a step), and the bytes that share is."""
    if device.type == "cuda":
        budget = int(torch.cuda.mem_get_info(device)[0] * CUDA_SHARE)
        most = n_runs
    else:
        budget = int(available_memory() * CPU_SHARE)
        most = min(n_runs, CPU_TOKENS // max(run_tokens, 1))
    return max(1, min(most, budget // max(run_bytes, 1))), budget


def differing(a: nn.Module, b: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of ``b`` whose values differ from ``a``'s (same architecture), by name."""
    theirs = dict(b.named_parameters())
    return {n: theirs[n] for n, p in a.named_parameters() if not torch.equal(p, theirs[n])}


def same_buffers(a: nn.Module, b: nn.Module) -> bool:
    theirs = dict(b.named_buffers())
    return all(torch.equal(t, theirs[n]) for n, t in a.named_buffers())


def repeat_rows(t: torch.Tensor, runs: int) -> torch.Tensor:
    """``t`` once for each of ``runs`` runs, one after another along the rows."""
    return t.repeat(runs, *([1] * (t.dim() - 1)))

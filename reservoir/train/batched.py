"""Several runs of one FPT trained in one forward and backward pass: the run dimension folded into the batch.

The runs of a group (learning rates x seeds of one backbone) share the template model's frozen modules; what
differs between them is stacked, one row a run (:class:`RunStack`): the trainable parameters, and every frozen
tensor a run draws from its seed (the input layer, a random backbone's weights). A batch holds the rows of
every run one after another (``R`` runs of ``n`` rows: rows ``r*n .. (r+1)*n - 1`` are run ``r``'s), and
each module that owns a stacked tensor computes each run's rows with that run's row of it:

- ``nn.Linear`` and transformers' ``Conv1D``: one batched matrix product over the runs (``baddbmm``);
- ``nn.LayerNorm``: one normalisation of every row, then each run's scale and shift;
- ``nn.Embedding``: each run's rows look up its own table; a lookup not by row (positions) gives every row
  of a run that run's vectors;
- any other module: called once a run, on that run's rows, with that run's tensors.

Modules whose tensors every run shares (a pretrained backbone's blocks) run once over all rows, as large
matrix products. Randomness stays each run's own: inside :func:`drawing`, dropout
(``torch.nn.functional.dropout``, which ``nn.Dropout`` calls) and attention dropout
(``scaled_dot_product_attention``) draw each run's rows from that run's generator states, set as the
device's generator in turn, so a run draws the numbers it draws alone. The optimiser is each run's Adam,
with its own learning rate, gradient clipping (the norm of its own gradients) and skipped steps
(:meth:`RunStack.update`), computed for every run at once on one flat buffer.

A family that reads a stacked tensor elsewhere than through its module's forward reads the template's copy,
which is NaN: :func:`reservoir.train.loop.GroupRun` holds the stacked forward against each run's own model
before training, and such runs train one after another. :func:`runs_that_fit` sizes a group from the memory
one run's step takes, measured.
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

#: Adam's settings as :func:`reservoir.train.loop.optimizer` leaves them (torch's defaults)
BETAS = (0.9, 0.999)
EPS = 1e-8
#: the share of free device memory (CUDA) and of available memory (CPU) a group may take
CUDA_SHARE = 0.8
CPU_SHARE = 0.5


@dataclasses.dataclass
class Bound:
    """What the stacked modules of a forward read: a tensor per stacked name ``(runs, *shape)``, the rows each run
    has in the batch, and each run's generator states (training only: dropout draws from them)."""

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
        """``fn`` on each run's rows of ``tensors`` (split evenly along their first dimension), with the run's
        generator state as the device's, joined; the caller's generator state is as before afterwards."""
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
    """The generator dropout on ``device`` draws from, and its key in a run's generator states
    (:func:`reservoir.train.seeds.generator_states`)."""
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
    """Within: dropout and attention dropout draw each run's rows from its own generator states (those of the
    bound forward; elsewhere they are torch's own)."""
    F.dropout, F.scaled_dot_product_attention = _run_dropout, _run_sdpa
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = _DROPOUT, _SDPA


# ---------------------------------------------------------------- stacked modules


def _tensor(
    module: nn.Module, slots: dict[str, int], name: str, b: Bound
) -> tuple[torch.Tensor | None, bool]:
    """``module``'s tensor ``name``: the bound runs' ``(runs, *shape)`` when it is stacked, else its own."""
    if name in slots:
        return b.tensors[slots[name]], True
    return getattr(module, name), False


def _product(x: torch.Tensor, w, stacked_w: bool, bias, stacked_b: bool, b: Bound) -> torch.Tensor:
    """Each run's rows of ``x`` times its ``w`` ``(runs, in, out)`` (or the shared ``(in, out)``), plus bias."""
    x3 = x.reshape(b.runs, -1, x.shape[-1])
    if stacked_w:
        if bias is None:
            y = torch.bmm(x3, w)
        else:
            y = torch.baddbmm(bias[:, None, :] if stacked_b else bias, x3, w)
    else:
        y = torch.matmul(x3, w)
        if bias is not None:
            y = y + (bias[:, None, :] if stacked_b else bias)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _linear(module: nn.Module, slots: dict[str, int]) -> Callable:
    def forward(x):
        b = bound()
        w, sw = _tensor(module, slots, "weight", b)
        bias, sb = _tensor(module, slots, "bias", b)
        return _product(x, w.transpose(-1, -2), sw, bias, sb, b)

    def columns(x, start, stop):
        b = bound()
        w, sw = _tensor(module, slots, "weight", b)
        bias, sb = _tensor(module, slots, "bias", b)
        w = w[..., start:stop, :].transpose(-1, -2)
        return _product(x, w, sw, None if bias is None else bias[..., start:stop], sb, b)

    return forward, columns


def _conv1d(module: nn.Module, slots: dict[str, int]) -> Callable:
    def forward(x):
        b = bound()
        w, sw = _tensor(module, slots, "weight", b)
        bias, sb = _tensor(module, slots, "bias", b)
        return _product(x, w, sw, bias, sb, b)

    def columns(x, start, stop):
        b = bound()
        w, sw = _tensor(module, slots, "weight", b)
        bias, sb = _tensor(module, slots, "bias", b)
        return _product(x, w[..., start:stop], sw, None if bias is None else bias[..., start:stop], sb, b)

    return forward, columns


def _layer_norm(module: nn.LayerNorm, slots: dict[str, int]) -> Callable:
    shape = tuple(module.normalized_shape)

    def forward(x):
        b = bound()
        w, sw = _tensor(module, slots, "weight", b)
        bias, sb = _tensor(module, slots, "bias", b)
        y = F.layer_norm(x, shape, None, None, module.eps).reshape(b.runs, -1, *shape)
        if w is not None:
            y = y * (w.reshape(b.runs, 1, *shape) if sw else w)
        if bias is not None:
            y = y + (bias.reshape(b.runs, 1, *shape) if sb else bias)
        return y.reshape(x.shape)

    return forward, None


def _embedding(module: nn.Embedding, slots: dict[str, int]) -> Callable:
    def forward(idx):
        b = bound()
        w = b.tensors[slots["weight"]]  # (runs, V, d)
        if idx.dim() >= 2 and idx.shape[0] == b.runs * b.rows:  # ids by row: each run's rows its own table
            offsets = torch.arange(b.runs, device=idx.device).mul_(w.shape[1])
            flat = idx.reshape(b.runs, -1) + offsets[:, None]
            return F.embedding(flat.reshape(idx.shape), w.reshape(-1, w.shape[-1]))
        out = w.index_select(1, idx.reshape(-1)).reshape(b.runs, *idx.shape, w.shape[-1])
        if idx.dim() >= 2 and idx.shape[0] == 1:
            out = out.squeeze(1)
        out = out.unsqueeze(1).expand(b.runs, b.rows, *out.shape[1:])  # every row of a run: its vectors
        return out.reshape(b.runs * b.rows, *out.shape[2:])

    return forward, None


def _each_run(module: nn.Module, slots: dict[str, int]) -> Callable:
    """Any other module: called once a run, on its rows, with its tensors (``torch.func.functional_call``). A call
    with no argument by row (a lookup of positions) gives each run's output to every row of the run."""

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
    """The runs of a group on one template model: their stacked tensors, the template's modules that read them,
    and each run's Adam.

    Parameters
    ----------
    template
        the model every run shares (its modules run every run's rows); its copies of the stacked tensors are
        set to NaN, so that a path reading them outside the stacked modules shows.
    names
        the template's parameters that are stacked: the first ``trainable`` train, the others are frozen tensors
        that differ between runs.
    values
        each run's values of ``names``.
    lrs
        each run's learning rate.
    """

    def __init__(
        self,
        template: nn.Module,
        names: Sequence[str],
        values: Sequence[Sequence[torch.Tensor]],
        trainable: int,
        lrs: Sequence[float],
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
        self.exp_avg = torch.zeros_like(self.theta)
        self.exp_avg_sq = torch.zeros_like(self.theta)
        self.step = torch.zeros(self.runs, 1, device=device)
        self.lr = torch.tensor(list(lrs), dtype=torch.float32, device=device)[:, None]
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
        """The trainable leaves: views of :attr:`theta`, one per trainable name ``(runs, *shape)``."""
        self.leaves, offset = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            view = self.theta[:, offset : offset + size].view(self.runs, *shape)
            self.leaves.append(view.detach().requires_grad_())
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
        """Within: the template computes ``len(tensors[0])`` runs of ``rows`` rows each with ``tensors``, drawing
        dropout from ``generators`` (one a run)."""
        token = _BOUND.set(Bound(tensors, len(tensors[0]), rows, generators))
        try:
            yield
        finally:
            _BOUND.reset(token)

    def run_params(self, r: int) -> list[torch.Tensor]:
        """Copies of run ``r``'s trainable tensors."""
        return [leaf[r].detach().clone() for leaf in self.leaves]

    def run_moments(self, r: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Copies of run ``r``'s Adam moments (first, second), one tensor a trainable name, and its step count."""

        def split(flat: torch.Tensor) -> list[torch.Tensor]:
            return [t.view(s).clone() for t, s in zip(flat[r].split(self.sizes), self.shapes)]

        return split(self.exp_avg), split(self.exp_avg_sq), self.step[r, 0].clone()

    @torch.no_grad()
    def set_run(
        self,
        r: int,
        params: Sequence[torch.Tensor],
        exp_avg: Sequence[torch.Tensor],
        exp_avg_sq: Sequence[torch.Tensor],
        step: float,
    ) -> None:
        """Run ``r``'s trainable tensors, Adam moments and step count (a resumed checkpoint's)."""
        for flat, parts in ((self.theta, params), (self.exp_avg, exp_avg), (self.exp_avg_sq, exp_avg_sq)):
            flat[r].copy_(torch.cat([p.reshape(-1).float() for p in parts]))
        self.step[r] = step

    def keep(self, runs: Sequence[int]) -> None:
        """Keep only the runs ``runs`` (in that order): the others left the group."""
        index = torch.tensor(list(runs), dtype=torch.long, device=self.theta.device)
        with torch.no_grad():
            self.theta = self.theta.index_select(0, index)
            self.exp_avg = self.exp_avg.index_select(0, index)
            self.exp_avg_sq = self.exp_avg_sq.index_select(0, index)
            self.step = self.step.index_select(0, index)
            self.lr = self.lr.index_select(0, index)
            self.frozen = [t.index_select(0, index) for t in self.frozen]
        self.runs = len(runs)
        self._views()

    @torch.no_grad()
    def update(self, max_norm: float) -> torch.Tensor:
        """One Adam step of every run from the gradients of its leaves, each clipped to ``max_norm`` (0: no
        clipping) by the norm of its own gradients; a run whose norm is not finite keeps its parameters, moments
        and step count (as fused Adam's ``found_inf``). Returns each run's gradient norm ``(runs,)``, on the
        device: nothing here waits for it."""
        r = self.runs
        grads = torch.cat(
            [
                (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)).reshape(r, -1)
                for leaf in self.leaves
            ],
            dim=1,
        )
        for leaf in self.leaves:
            leaf.grad = None
        norm = torch.linalg.vector_norm(grads, dim=1)
        limit = max_norm if max_norm > 0 else float("inf")
        grads.mul_(torch.clamp(limit / (norm + 1e-6), max=1.0)[:, None])
        ok = torch.isfinite(norm)[:, None]
        step = self.step + ok.to(self.step.dtype)
        exp_avg = torch.lerp(self.exp_avg, grads, 1 - BETAS[0])
        exp_avg_sq = torch.addcmul(self.exp_avg_sq * BETAS[1], grads, grads, value=1 - BETAS[1])
        correction1 = 1 - torch.pow(BETAS[0], step)
        correction2 = 1 - torch.pow(BETAS[1], step)
        denom = (exp_avg_sq.sqrt() / correction2.sqrt()).add_(EPS)
        theta = self.theta - (self.lr / correction1) * exp_avg / denom
        self.theta.copy_(torch.where(ok, theta, self.theta))
        self.exp_avg.copy_(torch.where(ok, exp_avg, self.exp_avg))
        self.exp_avg_sq.copy_(torch.where(ok, exp_avg_sq, self.exp_avg_sq))
        self.step.copy_(step)
        return norm


# ---------------------------------------------------------------- sizing a group


def saved_bytes(step: Callable[[], None]) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``step()`` runs its forward (each storage
    once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


def runs_that_fit(run_bytes: int, device: torch.device, n_runs: int) -> tuple[int, int]:
    """How many of ``n_runs`` runs of ``run_bytes`` each fit the memory ``device`` can still give (a share of it:
    :data:`CUDA_SHARE` of a card's free memory, :data:`CPU_SHARE` of the machine's available memory), at least
    one; and the bytes that share is."""
    if device.type == "cuda":
        budget = int(torch.cuda.mem_get_info(device)[0] * CUDA_SHARE)
    else:
        budget = int(available_memory() * CPU_SHARE)
    return max(1, min(n_runs, budget // max(run_bytes, 1))), budget


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

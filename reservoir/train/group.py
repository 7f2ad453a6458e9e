"""Runs (learning rate, seed) of one sweep trained together, the run dimension folded into the batch
(:mod:`reservoir.train.batched`): :class:`GroupRun`, its batches (:class:`GroupBatches`), :func:`train_group`
and :func:`group_size`. Each run follows the stopping rule it follows alone
(:func:`reservoir.train.run.advance`) and returns the result it returns alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from reservoir.config import TrainConfig
from reservoir.model.backbones import load_backbone
from reservoir.progress import bar
from reservoir.runtime import machine
from reservoir.tasks import SplitData, Task
from reservoir.train.batched import (
    CPU_TOKENS,
    RunStack,
    differing,
    drawing,
    repeat_rows,
    runs_that_fit,
    same_buffers,
    saved_bytes,
)
from reservoir.train.checkpoint import augments
from reservoir.train.data import Batch, Batches, Splits, batch_tensors, train_width
from reservoir.train.model import FPT, select_trainable
from reservoir.train.run import Evaluation, Member, load_model, trainable
from reservoir.train.seeds import generator_states, run_generators
from reservoir.train.step import (
    Diverged,
    autocast,
    check_steps,
    loss_and_correct,
    optimize,
    optimizer,
    train_dtype,
)


class GroupBatches(Batches):
    """The training batches of a group of runs: each run's rows of its own step, one run after another."""

    def __init__(self, task: Task, data: SplitData, batch_size: int, device: torch.device, **options: Any):
        super().__init__(task, data, 0, batch_size, device, **options)  # each run's seed is its plan's

    def _build(self, plan: tuple[tuple[int, int], ...]) -> Batch:
        by_run = [(self.rows(step, seed), seed, step) for seed, step in plan]
        rows = np.concatenate([r for r, _, _ in by_run])
        inputs = np.concatenate([self.inputs(*run) for run in by_run]) if self.augment else None
        batch = batch_tensors(self.task, self.data, rows, self.width, inputs)
        return tuple(t.pin_memory() for t in batch) if self.pin else batch

    def take(self, plan: tuple[tuple[int, int], ...]) -> Batch:
        """The batch of ``plan``, a ``(seed, step)`` a run; the worker starts building the next steps'."""
        ahead = self._ahead[1] if self._ahead is not None and self._ahead[0] == plan else None
        current = ahead or self._pool.submit(self._build, plan)
        following = tuple((seed, step + 1) for seed, step in plan)
        self._ahead = (following, self._pool.submit(self._build, following))
        return current.result()


class GroupRun:
    """Runs (learning rate, seed) of ``train`` trained together (:mod:`reservoir.train.batched`): each step one
    forward and backward over every run's batch, each run with its own Adam, clipping, data order and dropout
    generators. A run leaves the group when it meets its stopping rule, ``--steps`` or ``--max-time``, or
    diverges; it writes the checkpoint and returns the result it would alone, with ``batch_runs``.

    Building it loads each seed's model (:func:`~reservoir.train.run.load_model`), stacks what differs, checks
    the stacked forward against each run's own model (:attr:`mismatch` says why not, and the runs must then
    train one after another) and resumes each run's checkpoint under ``cfg.resume``.
    """

    #: validation rows the stacked forward is held against each run's own model on
    PROBE_ROWS = 8

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        data: Splits,
        runs: Sequence[tuple[float, int]],
        *,
        device: torch.device,
        log: Callable[[str], None],
        shared: dict[str, Any],
        show_counts: bool,
    ):
        self.cfg, self.task, self.data, self.device, self.log = cfg, task, data, device, log
        self.size = len(runs)
        self.tag = f"[batch of {self.size}]"
        self.mismatch = ""
        seeds = list(dict.fromkeys(seed for _, seed in runs))
        probe = [
            t.to(device)
            for t in batch_tensors(task, data.val, np.arange(min(self.PROBE_ROWS, len(data.val))))
        ]
        template: FPT | None = None
        built: dict[int, dict[str, Any]] = {}
        for seed in seeds:
            log(f"{self.tag} loading backbone {cfg.backbone} (seed {seed}) ...")
            with run_generators(seed, device):
                model, weights = load_model(cfg, task, seed, device)
                states = generator_states(device)
            model.eval()
            with torch.inference_mode():
                reference = model(*probe[:2]).float()
            if template is None:
                template, values = model, {}
            elif not same_buffers(template, model):
                self.mismatch = f"the buffers of {cfg.backbone} differ between seeds {seeds[0]} and {seed}"
                return
            else:
                values = {n: t.detach() for n, t in differing(template, model).items()}
            built[seed] = {
                "weights": weights,
                "rng": states,
                "values": values,
                "reference": reference,
            }
            del model
        assert template is not None
        self.blocks = template.blocks
        params, self.counts = trainable(template, cfg, log, show_counts)
        named = dict(template.named_parameters())
        by_id = {id(p): n for n, p in named.items()}
        trained = [by_id[id(p)] for p in params]
        seeded = {n for b in built.values() for n in b["values"]} - set(trained)
        names = trained + [n for n in named if n in seeded]
        own = {n: named[n].detach().clone() for n in names}
        self.model = template
        self.stack = RunStack(
            template,
            names,
            [[built[seed]["values"].get(n, own[n]) for n in names] for _, seed in runs],
            len(trained),
        )
        del own
        self.mismatch = self._check(probe, [built[seed]["reference"] for _, seed in runs])
        if self.mismatch:
            return
        self.members = [
            Member.of(
                cfg,
                shared,
                weights=built[seed]["weights"],
                blocks=self.blocks,
                lr=lr,
                seed=seed,
                rng={k: v.clone() for k, v in built[seed]["rng"].items()},
            )
            for lr, seed in runs
        ]
        #: each run's Adam, over its parameters in the stack
        self.opts = [optimizer(params, m.lr) for params, m in zip(self.stack.params, self.members)]
        for params, opt, m in zip(self.stack.params, self.opts, self.members):
            m.resume(cfg, params, opt, device, log)
        self.dtype = train_dtype(cfg.dtype, device, template.backbone.d_model, log, self.tag)
        if cfg.compile:
            log(f"{self.tag} trains eager: --compile compiles a run trained alone (--concurrent-runs 1)")
        self.active = list(self.members)
        #: (losses, gradient norms) device tensors ``(runs,)`` of the steps since the last read (:meth:`read`)
        self.unread: list[tuple[torch.Tensor, torch.Tensor]] = []
        for m in self.members:
            m.runs_on(self.dtype, device)
            m.start()

    def _check(self, probe: list[torch.Tensor], references: list[torch.Tensor]) -> str:
        """Why the stacked forward of the probe rows is not each run's own (``""``: it is, to float tolerance)."""
        tokens, lengths = probe[0], probe[1]
        self.model.eval()
        try:
            with torch.inference_mode(), self.stack.bound(self.stack.tensors(), len(tokens)):
                out = self.model(repeat_rows(tokens, self.size), repeat_rows(lengths, self.size))
        except Exception as e:  # noqa: BLE001 - any failure of the stacked forward means: train one at a time
            return f"the stacked forward of {self.cfg.backbone} fails ({type(e).__name__}: {str(e)[:200]})"
        out = out.float().reshape(self.size, *references[0].shape)
        for r, reference in enumerate(references):
            scale = float(reference.abs().max()) or 1.0
            if not torch.allclose(out[r], reference, rtol=1e-3, atol=1e-4 * scale):
                return (
                    f"the stacked forward of {self.cfg.backbone} differs from run {r}'s own (largest difference "
                    f"{float((out[r] - reference).abs().max()):.3g}): its family reads a trained or seeded tensor "
                    "outside its module's forward"
                )
        return ""

    def step(self, batch: Batch) -> None:
        """One step of every active run on ``batch``: one forward and backward, then each run's :func:`optimize`."""
        stack = self.stack
        tokens, lengths, labels = (t.to(self.device, non_blocking=True) for t in batch)
        n = len(tokens) // stack.runs  # the batch size, or every training row where there are fewer
        self.model.train()
        with (
            stack.bound(stack.tensors(), n, [m.rng for m in self.active]),
            drawing(),
            autocast(self.dtype, self.device),
        ):
            logits = self.model(tokens, lengths)
        losses = torch.stack(
            [loss_and_correct(x, y)[0] for x, y in zip(logits.chunk(stack.runs), labels.chunk(stack.runs))]
        )
        losses.sum().backward()
        stack.gradients()
        norms = torch.stack(
            [optimize(params, opt, self.cfg.grad_clip) for params, opt in zip(stack.params, self.opts)]
        )
        self.unread.append((losses.detach(), norms.detach()))
        for m in self.active:
            m.state.step += 1

    def read(self) -> None:
        """The steps since the last read, brought to the host at once; a diverged run (:func:`check_steps`) drops
        the runs of its learning rate with higher seeds."""
        if not self.unread:
            return
        # (steps, 2, runs): each step's losses and gradient norms
        both = torch.stack([torch.stack([loss, norm]) for loss, norm in self.unread]).float().cpu()
        for r, m in enumerate(self.active):
            if m.stopped:
                continue
            try:
                m.state.pending_losses.extend(
                    check_steps(
                        both[:, 0, r].tolist(),
                        both[:, 1, r].tolist(),
                        m.state.step - len(self.unread),
                        m.tag,
                        m.lr,
                    )
                )
            except Diverged as e:
                m.outcome = e
                self.log(f"{e}; the run leaves the batch")
                for other in self.active:
                    if other.lr == m.lr and other.seed > m.seed and not other.stopped:
                        other.dropped = True
        self.unread.clear()

    def scores(
        self, members: list[Member], d: SplitData, tensors: list[torch.Tensor]
    ) -> list[tuple[float, float]]:
        """Accuracy and mean cross-entropy of each of ``members`` over the whole split ``d``, as :func:`scores`."""
        k, size = len(members), self.cfg.eval_batch_size
        correct = torch.zeros(k, dtype=torch.long, device=self.device)
        losses, counts = [], []
        self.model.eval()
        with torch.inference_mode(), autocast(self.dtype, self.device):
            for start in range(0, len(d), size):
                rows = np.arange(start, min(start + size, len(d)))
                tokens, lengths, labels = (t.to(self.device) for t in batch_tensors(self.task, d, rows))
                with self.stack.bound(tensors, len(rows)):
                    logits = self.model(repeat_rows(tokens, k), repeat_rows(lengths, k))
                each = [loss_and_correct(x, labels) for x in logits.chunk(k)]
                losses.append(torch.stack([loss for loss, _ in each]))
                correct += torch.stack([c for _, c in each])
                counts.append(labels.numel())
        means = torch.stack(losses).cpu().tolist()
        total = sum(counts)
        out = []
        for r, c in enumerate(correct.cpu().tolist()):
            loss_sum = 0.0
            for chunk, n in zip(means, counts):
                loss_sum += chunk[r] * n
            out.append((c / total, loss_sum / total))
        return out

    def validate(self, members: list[Member]) -> None:
        """A validation pass of ``members``' current parameters, together, recorded for each
        (:meth:`Member.record`); the steps must have been read."""
        if not members:
            return
        every = len(members) == self.stack.runs
        tensors = self.stack.tensors(None if every else self._index(members))
        for m, (acc, loss) in zip(members, self.scores(members, self.data.val, tensors)):
            params = self.stack.params[self.active.index(m)]
            m.record(self.cfg, Evaluation(m.state.step, acc, loss), params, self.log)

    def _index(self, members: list[Member]) -> torch.Tensor:
        return torch.tensor([self.active.index(m) for m in members], dtype=torch.long, device=self.device)

    def checkpoint(self, m: Member) -> None:
        """Count run ``m``'s time so far, then save it as it saves alone, with its own generator states (not
        when the losses read now show it diverged)."""
        self.read()
        if m.stopped:  # the read found it diverged: a diverged run keeps no checkpoint, as alone
            return
        r = self.active.index(m)
        m.save(self.stack.params[r], self.opts[r], self.device)

    def leave(self, members: list[Member]) -> None:
        """``members`` leave the group: each finished one validates if needed, checkpoints and is scored on the
        test split at its best validation step; a diverged or dropped one ends."""
        if not members:
            return
        self.read()
        finishing = [m for m in members if not m.stopped]
        self.validate(
            [m for m in finishing if not m.state.history or m.state.history[-1]["step"] != m.state.step]
        )
        finishing = [m for m in finishing if not m.stopped]
        if finishing:
            for m in finishing:
                assert m.state.best_params is not None, "the last step always runs a validation pass"
                self.checkpoint(m)
            best = self.stack.best(self._index(finishing), [m.state.best_params for m in finishing])
            for m, (test, _) in zip(finishing, self.scores(finishing, self.data.test, best)):
                result = m.result(self.cfg, blocks=self.blocks, test=test, counts=self.counts, log=self.log)
                m.outcome = {**result, "batch_runs": self.size}
        leaving = {id(m) for m in members}
        kept = [r for r, m in enumerate(self.active) if id(m) not in leaving]
        self.active = [self.active[r] for r in kept]
        if self.active:
            self.stack.keep(kept)
            opts = []
            for params, m, r in zip(self.stack.params, self.active, kept):
                opts.append(optimizer(params, m.lr))
                opts[-1].load_state_dict(self.opts[r].state_dict())
            self.opts = opts
            self.log(f"{self.tag} {len(members)} run(s) left the batch; {len(self.active)} go on")

    def train(self, on_step: Callable[[int], None] | None, progress: bool) -> None:
        """Step, validate, record and checkpoint each run as it would alone, until every run has left."""
        cfg = self.cfg
        self.leave([m for m in self.active if not m.running(cfg)])  # resumed finished
        if not self.active:
            return
        start = min(m.state.step for m in self.active)
        with (
            bar(cfg.steps, f"{self.tag} training", initial=start, enabled=progress, unit="step") as shown,
            GroupBatches(
                self.task,
                self.data.train,
                cfg.batch_size,
                self.device,
                dropout=cfg.dropout,
                augment=augments(cfg, self.task),
            ) as batches,
        ):
            while self.active:
                self.step(batches.take(tuple((m.seed, m.state.step) for m in self.active)))
                shown.update()
                due = [
                    m for m in self.active if m.state.step % cfg.eval_every == 0 or m.state.step >= cfg.steps
                ]
                if due:
                    self.read()
                    self.validate([m for m in due if not m.stopped])
                for m in self.active:  # a run the read found diverged saves nothing (:meth:`checkpoint`)
                    if cfg.checkpoint_every and m.state.step % cfg.checkpoint_every == 0 and not m.state.done:
                        self.checkpoint(m)
                if on_step is not None:
                    on_step(max(m.state.step for m in self.active))
                leaving = [m for m in self.active if not m.running(cfg)]
                if leaving:
                    self.leave(leaving)


def train_group(
    cfg: TrainConfig,
    task: Task,
    data: Splits,
    runs: Sequence[tuple[float, int]],
    *,
    device: torch.device,
    on_step: Callable[[int], None] | None,
    log: Callable[[str], None],
    shared: dict[str, Any],
    show_counts: bool,
    progress: bool,
) -> dict[tuple[float, int], dict[str, Any] | Diverged | None] | None:
    """Train ``runs`` together (:class:`GroupRun`): each run's result, :class:`Diverged` or ``None`` (dropped);
    ``None`` where they cannot train together, and the caller trains them one after another."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        group = GroupRun(
            cfg, task, data, runs, device=device, log=log, shared=shared, show_counts=show_counts
        )
    if group.mismatch:
        log(f"{group.tag} {group.mismatch}; its runs train one after another")
        return None
    group.train(on_step, progress)
    return {(m.lr, m.seed): m.outcome for m in group.members}


def group_size(
    cfg: TrainConfig, task: Task, data: Splits, device: torch.device, n_runs: int, log: Callable[[str], None]
) -> int:
    """Runs a group trains together: ``cfg.concurrent_runs``, or as many of ``n_runs`` as fit the device's memory
    (:func:`~reservoir.train.batched.runs_that_fit`), from what one run takes, measured: 6 times its trainable
    parameters (gradients, Adam moments, best and flat copies), its frozen tensors that differ between seeds,
    and one step's activations (on CUDA the peak of a training step and a validation batch; on the CPU twice
    what autograd saves)."""
    if cfg.concurrent_runs is not None or n_runs == 1:
        return min(cfg.concurrent_runs or 1, n_runs)
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        backbone = load_backbone(cfg.backbone, cfg.seed)
        blocks = backbone.n_layers if cfg.blocks is None else min(cfg.blocks, backbone.n_layers)
        model = FPT(
            task.spec,
            backbone,
            blocks=blocks,
            seed=cfg.seed,
            input_scale=cfg.input_scale,
            dropout=cfg.dropout,
        ).to(device)
        params, _ = select_trainable(model, cfg.trainable)
        seeded = 0
        if cfg.seeds > 1:
            other = load_backbone(cfg.backbone, cfg.seed + 1).to(device)
            seeded = sum(p.numel() * p.element_size() for p in differing(backbone, other).values())
            del other
        train_rows = np.arange(min(cfg.batch_size, len(data.train)))
        width = train_width(task, data.train, cfg.dropout)
        tokens, lengths, labels = (t.to(device) for t in batch_tensors(task, data.train, train_rows, width))
        model.train()

        def forward() -> torch.Tensor:
            return loss_and_correct(model(tokens, lengths), labels)[0]

        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            forward().backward()
            model.eval()
            val_rows = np.arange(min(cfg.eval_batch_size, len(data.val)))
            with torch.inference_mode():
                model(*(t.to(device) for t in batch_tensors(task, data.val, val_rows)[:2]))
            activations = torch.cuda.max_memory_allocated(device) - before
            what = "measured peak of a step"
        else:
            loss = [None]
            activations = 2 * saved_bytes(lambda: loss.__setitem__(0, forward()))
            loss[0].backward()
            what = "twice what a step saves for its backward pass"
        trainable = sum(p.numel() * p.element_size() for p in params)
    per_run = activations + 6 * trainable + seeded
    run_tokens = cfg.batch_size * task.spec.seq_len
    fit, budget = runs_that_fit(per_run, device, n_runs, run_tokens)
    cpu_rule = f"; at most {CPU_TOKENS} tokens a step on the CPU ({run_tokens} a run)" if not cuda else ""
    log(
        f"{fit} of {n_runs} runs a batch: each takes about {per_run / 2**20:.1f} MiB ({what} "
        f"{activations / 2**20:.1f} MiB), {budget / 2**20:.0f} MiB to give on {machine.on(device)}{cpu_rule}"
    )
    return fit

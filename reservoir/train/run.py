"""One run (learning rate, seed) of end-to-end training, alone: :func:`train_run` and :class:`TrainingRun`
(the model, its optimiser; its steps, validation passes and records); and what every run does alone or trained
together: its model (:func:`load_model`), its bookkeeping (:class:`Member`: state, checkpoint, records, result)
and the stopping rule (:func:`advance`).

A run stops at ``steps``, after ``patience`` validation passes without progress (:func:`advance`), or
when validation accuracy reaches ``stop_at`` (by default 100%).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reservoir.config import TrainConfig
from reservoir.errors import IdentityError, UsageError
from reservoir.model.backbones import fingerprint as backbone_fingerprint
from reservoir.model.backbones import load_backbone
from reservoir.model.devices import resolve_device
from reservoir.model.reservoir import check_length
from reservoir.progress import bar
from reservoir.progress import log as log_line
from reservoir.results import SOLVED, TIMED_OUT, stopped_by
from reservoir.runtime import machine
from reservoir.runtime.runner import CompiledOrEager
from reservoir.settings import default
from reservoir.tasks import Task
from reservoir.train.checkpoint import (
    RunState,
    augments,
    check_resumable,
    load_checkpoint,
    run_checkpoint,
    save_checkpoint,
    settings_identity,
)
from reservoir.train.data import Batch, Batches, Splits
from reservoir.train.model import FPT, format_counts, param_counts, select_trainable
from reservoir.train.seeds import run_generators
from reservoir.train.step import Diverged, evaluate, optimizer, read_steps, scores, train_dtype, train_step

#: the relative fall of the lowest validation loss that counts as progress for ``patience``
LOSS_PROGRESS = 1e-3
#: the rise of validation accuracy over its value at the last progress that counts as progress (as Keras'
#: ``min_delta``: a slow creep counts once it adds up to it)
ACC_PROGRESS = 1e-3
#: validation passes whose mean training losses make the training-loss trend (:func:`loss_falling`)
TREND_PASSES = 20
#: the fall of the trend line over :data:`TREND_PASSES` passes, as a fraction of the loss, that counts as progress
TREND_FALL = 0.01
#: ... when it is also this many standard errors of the line's slope (a flat, noisy loss is not progress)
TREND_T = 2.0


#: what a validation pass changes in a run's state besides its history (:meth:`Member.record`)
UNDONE = (
    "best_val",
    "best_step",
    "best_params",
    "steps_to_target",
    "best_val_loss",
    "progress_val",
    "evals_since_best",
    "done",
    "stop_reason",
    "pending_losses",
)


def solved(state: RunState, stop_at: float) -> None:
    """End a run whose validation accuracy reached ``stop_at`` (``--stop-at``)."""
    state.done, state.stop_reason = True, SOLVED.format(100 * stop_at)


def loss_trend(losses: Sequence[float]) -> tuple[float, float]:
    """``(fall, t)`` of the least-squares line through the logs of ``losses``: the fraction of the loss it
    falls, and its slope in standard errors."""
    y = np.log(np.maximum(np.asarray(losses, dtype=np.float64), 1e-12))
    x = np.arange(len(y), dtype=np.float64) - (len(y) - 1) / 2
    slope = float(x @ (y - y.mean()) / (x @ x))
    residual = y - y.mean() - slope * x
    se = math.sqrt(float(residual @ residual) / max(len(y) - 2, 1) / float(x @ x))
    fall = -math.expm1(slope * (len(y) - 1))
    if se == 0:  # the losses lie on the line: the slope is exact
        return fall, math.copysign(math.inf, slope) if slope else 0.0
    return fall, slope / se


def loss_falling(losses: Sequence[float]) -> bool:
    """Whether the training loss still falls (:func:`loss_trend` over the last :data:`TREND_PASSES` passes)."""
    window = list(losses)[-TREND_PASSES:]
    if len(window) < 3:
        return False
    fall, t = loss_trend(window)
    return fall >= TREND_FALL and t <= -TREND_T


def advance(state: RunState, cfg: TrainConfig) -> None:
    """The stopping rule, after the validation pass ``state.history[-1]``: record progress, the target, and stop
    the run when it is solved (``stop_at``) or made no progress in ``patience`` passes.

    Progress is any of: a validation accuracy :data:`ACC_PROGRESS` above the last progress, a validation loss
    :data:`LOSS_PROGRESS` below its lowest, or a training loss still falling (:func:`loss_falling`)."""
    last = state.history[-1]
    val, val_loss = last["val_accuracy"], last["val_loss"]
    state.evals_since_best += 1
    if val - state.progress_val >= ACC_PROGRESS - 1e-12:  # 1e-12: 0.751 - 0.750 is not exactly 1e-3
        state.progress_val, state.evals_since_best = val, 0
    if val_loss < state.best_val_loss * (1 - LOSS_PROGRESS):
        state.best_val_loss, state.evals_since_best = val_loss, 0
    if loss_falling([h["loss"] for h in state.history]):
        state.evals_since_best = 0
    if cfg.target is not None and state.steps_to_target is None and val >= cfg.target:
        state.steps_to_target = state.step
    if val >= cfg.stop_at:
        solved(state, cfg.stop_at)
    else:
        stall(state, cfg)


def stall(state: RunState, cfg: TrainConfig) -> None:
    """End a run that made no progress in ``patience`` validation passes (:func:`advance`)."""
    if cfg.patience and state.evals_since_best >= cfg.patience:
        state.done = True
        state.stop_reason = (
            f"no validation accuracy {100 * ACC_PROGRESS:g} points higher, no validation loss {100 * LOSS_PROGRESS:g}% "
            f"lower and no falling training loss in {cfg.patience} validation passes"
        )


def stop_at_again(state: RunState, cfg: TrainConfig, ckpt: Path) -> None:
    """A resumed run under the ``--stop-at`` of this invocation, where a fresh run at it would be: one that stopped
    below it trains on (unless its patience ends it at that pass), one whose last validation pass reaches it ends
    there; one that passed it before its last step is refused (its parameters and optimiser of that step are gone)."""
    crossed = next((h for h in state.history if h["val_accuracy"] >= cfg.stop_at), None)
    if crossed is not None and crossed["step"] < state.step:
        raise IdentityError(
            f"checkpoint {ckpt} reached {100 * crossed['val_accuracy']:.2f}% validation accuracy at step "
            f"{crossed['step']}, before its step {state.step}: a run at --stop-at {cfg.stop_at:g} stops there, which "
            f"it cannot continue from; drop --resume to train it afresh, or resume it with a --stop-at above its "
            f"{100 * state.best_val:.2f}%"
        )
    if crossed is not None:
        solved(state, cfg.stop_at)
    elif state.done and stopped_by(state.stop_reason, SOLVED):  # by a --stop-at it no longer reaches
        state.done, state.stop_reason = False, ""
        stall(state, cfg)


def load_model(cfg: TrainConfig, task: Task, seed: int, device: torch.device) -> tuple[FPT, dict[str, Any]]:
    """Run ``seed``'s FPT on ``device``, and the record of its weights for the run's identity: the backbone's
    fingerprint (taken before the FPT draws its zero positions) and, under ``--input-scale matched``, the
    token-embedding std the input layer is scaled to (``matched_std``: the embedding is dropped before the
    fingerprint is taken). The backbone is checked for the task's length, ``--blocks`` and
    (``--save-backbone``) saving."""
    backbone = load_backbone(cfg.backbone, seed)
    check_length(task.spec, backbone, cfg.backbone)
    if cfg.save_backbone is not None:
        backbone.check_saveable()  # before it trains
    blocks = backbone.n_layers if cfg.blocks is None else cfg.blocks
    if not 0 <= blocks <= backbone.n_layers:
        raise UsageError(
            f"--blocks {blocks}: backbone {cfg.backbone} has {backbone.n_layers} blocks; "
            f"choose 0 to {backbone.n_layers} (or leave it out to run them all)"
        )
    weights: dict[str, Any] = {"backbone_fingerprint": backbone_fingerprint(backbone)}
    if cfg.input_scale == "matched" and backbone.token_std is not None:
        weights["matched_std"] = float(backbone.token_std)
    model = FPT(
        task.spec, backbone, blocks=blocks, seed=seed, input_scale=cfg.input_scale, dropout=cfg.dropout
    ).to(device)
    if cfg.dropout != default(TrainConfig, "dropout") and not any(
        isinstance(m, torch.nn.Dropout) for m in model.modules()
    ):
        ids = f", and task {task.name!r} feeds token ids, which take no input dropout"
        raise UsageError(
            f"--dropout {cfg.dropout:g} would change nothing: backbone {cfg.backbone} has no dropout layer"
            f"{ids if task.spec.token_kind == 'ids' else ''}; drop --dropout"
        )
    return model, weights


def trainable(
    model: FPT, cfg: TrainConfig, log: Callable[[str], None], show_counts: bool
) -> tuple[list[torch.nn.Parameter], list[dict[str, Any]]]:
    """The parameters ``cfg.trainable`` selects (:func:`~reservoir.train.model.select_trainable`, its notes
    logged) and the model's parameter counts (logged with ``show_counts``)."""
    params, notes = select_trainable(model, cfg.trainable)
    for note in notes:
        log(note)
    counts = param_counts(model)
    if show_counts:
        log(format_counts(counts))
    return params, counts


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One validation pass: the step it followed, the validation accuracy and loss."""

    step: int
    accuracy: float
    loss: float


@dataclasses.dataclass
class Member:
    """The bookkeeping of one run (learning rate, seed), alone (:class:`TrainingRun`) or in a group
    (:class:`reservoir.train.group.GroupRun`): its identity, checkpoint, state, the clock of this stretch
    (when and at which step it began), and in a group its own generator states ``rng`` and its ``outcome``."""

    lr: float
    seed: int
    name: str
    ident: dict[str, Any]
    ckpt: Path
    rng: dict[str, torch.Tensor] | None = None
    state: RunState = dataclasses.field(default_factory=RunState)
    clock: tuple[float, int] = (0.0, 0)
    outcome: dict[str, Any] | Diverged | None = None
    #: left unfinished: a run of the same learning rate and a lower seed diverged (the rate is set aside)
    dropped: bool = False

    @classmethod
    def of(
        cls,
        cfg: TrainConfig,
        shared: dict[str, Any],
        *,
        weights: dict[str, Any],
        blocks: int,
        lr: float,
        seed: int,
        rng: dict[str, torch.Tensor] | None = None,
    ) -> Member:
        """The run ``(lr, seed)`` of a sweep whose :func:`~reservoir.train.checkpoint.settings_identity` is
        ``shared`` and whose weights :func:`load_model` records as ``weights``
        (:func:`~reservoir.train.checkpoint.run_checkpoint`)."""
        ident, name, ckpt = run_checkpoint(cfg, shared, weights=weights, blocks=blocks, lr=lr, seed=seed)
        return cls(lr, seed, name, ident, ckpt, rng)

    @property
    def tag(self) -> str:
        return f"[lr={self.lr:g} seed={self.seed}]"

    @property
    def seconds(self) -> float:
        """Seconds of training so far, earlier stretches of a resumed run included."""
        return self.state.seconds + time.perf_counter() - self.clock[0]

    @property
    def stopped(self) -> bool:
        return self.outcome is not None or self.dropped

    def start(self) -> None:
        """Begin a stretch of training at the current step."""
        self.clock = (time.perf_counter(), self.state.step)

    def running(self, cfg: TrainConfig) -> bool:
        out_of_time = cfg.max_time is not None and self.seconds >= cfg.max_time
        return not self.stopped and not self.state.done and self.state.step < cfg.steps and not out_of_time

    def resume(
        self,
        cfg: TrainConfig,
        params: list[torch.nn.Parameter],
        opt: torch.optim.Optimizer,
        device: torch.device,
        log: Callable[[str], None],
    ) -> None:
        """Set the state the run starts from: under ``--resume``, its checkpoint's (restored into ``params``,
        ``opt`` and the generators: :func:`~reservoir.train.checkpoint.load_checkpoint`), under this
        ``--stop-at`` (:func:`stop_at_again`); a fresh one otherwise."""
        ckpt, tag = self.ckpt, self.tag
        self.state = RunState()
        if cfg.resume:
            check_resumable(ckpt, self.name, self.ident)
        if cfg.resume and ckpt.exists():
            self.state = state = load_checkpoint(ckpt, params, opt, self.ident, device, generators=self.rng)
            # its scores are of the longer run: reported as this one's, they mislead
            if state.step > cfg.steps:
                raise IdentityError(
                    f"checkpoint {ckpt} has trained {state.step} steps, more than --steps {cfg.steps}; pass --steps "
                    f"{state.step} or more to resume it, or drop --resume to train {cfg.steps} steps from the start"
                )
            before = state.before_last_pass
            if before is not None and state.step < cfg.steps:  # continued past a pass a whole run never made
                del state.history[before.pop("history") :]
                for key, value in before.items():
                    setattr(state, key, value)
                state.before_last_pass = None
            stop_at_again(state, cfg, ckpt)
            log(
                f"{tag} resumed {ckpt} at step {state.step}"
                + (" (finished)" if state.done or state.step >= cfg.steps else "")
            )
        elif ckpt.exists():
            log(f"{tag} starting over; {ckpt} will be replaced (pass --resume to continue it)")
        elif cfg.resume:
            others = sorted(p.name for p in ckpt.parent.glob("*.pt"))
            log(
                f"{tag} --resume: no checkpoint of this run in {ckpt.parent}, starting at step 0"
                + (
                    f" (it holds {len(others)} of other runs, e.g. {others[0]}: another --lr, --trainable, "
                    "--blocks or --seed names another run)"
                    if others
                    else ""
                )
            )

    def runs_on(self, dtype: str, device: torch.device) -> None:
        """Note the compute dtype and the machine of this stretch where they differ from the last ones."""
        for seen, now in ((self.state.dtypes, dtype), (self.state.machines, machine.on(device))):
            if not seen or seen[-1] != now:
                seen.append(now)

    def record(
        self,
        cfg: TrainConfig,
        evaluation: Evaluation,
        params: Sequence[torch.Tensor],
        log: Callable[[str], None],
    ) -> None:
        """Record ``evaluation`` in the history (with the mean training loss since the last), the best step and
        a copy of its parameters ``params``, and the stopping rule (:func:`advance`); one line of log. The
        steps must have been read."""
        state = self.state
        began, first = self.clock
        rate = (state.step - first) / max(time.perf_counter() - began, 1e-9)
        elapsed = self.seconds
        before = None
        if evaluation.step % cfg.eval_every:  # off the schedule: kept to take back (:meth:`resume`)
            before = {k: getattr(state, k) for k in UNDONE}
            before.update(pending_losses=list(state.pending_losses), history=len(state.history))
        state.history.append(
            {
                "step": evaluation.step,
                "loss": float(np.mean(state.pending_losses)) if state.pending_losses else math.nan,
                "val_accuracy": evaluation.accuracy,
                "val_loss": evaluation.loss,
            }
        )
        state.pending_losses.clear()
        if evaluation.accuracy > state.best_val:
            state.best_val, state.best_step = evaluation.accuracy, evaluation.step
            state.best_params = [p.detach().clone() for p in params]
        advance(state, cfg)
        if before is not None and before["best_params"] is state.best_params:
            del before["best_params"]  # unchanged: not saved twice
        state.before_last_pass = before
        log(
            f"{self.tag} step {state.step}/{cfg.steps}: loss {state.history[-1]['loss']:.4f}, "
            f"val loss {evaluation.loss:.4f}, val {100 * evaluation.accuracy:.2f}% "
            f"(best {100 * state.best_val:.2f}% at {state.best_step}), {rate:.2f} steps/s, {elapsed:.0f}s"
        )

    def save(
        self, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, device: torch.device
    ) -> None:
        """Count the time so far and begin a new stretch, then save the run
        (:func:`~reservoir.train.checkpoint.save_checkpoint`; with :attr:`rng`, its own generator states)."""
        self.state.seconds = self.seconds
        self.start()
        save_checkpoint(self.ckpt, params, opt, self.state, self.ident, device, rng=self.rng)

    def result(
        self,
        cfg: TrainConfig,
        *,
        blocks: int,
        test: float,
        counts: list[dict[str, Any]],
        log: Callable[[str], None],
    ) -> dict[str, Any]:
        """The result of the finished run, scored ``test`` at its best validation step, and why it stopped (its
        stopping rule, ``--max-time`` or ``--steps``), said in the log."""
        state = self.state
        # a pass at a --max-time cut is off the schedule (or the run is not done): its rules stop no whole run
        if state.step < cfg.steps and (not state.done or state.before_last_pass is not None):
            why = TIMED_OUT.format(cfg.max_time, state.step)
        elif state.done:
            why = state.stop_reason
        else:
            why = f"reached --steps {cfg.steps}"
        log(
            f"{self.tag} {why}; best val {100 * state.best_val:.2f}% at step {state.best_step}, "
            f"test {100 * test:.2f}%"
        )
        return {
            "lr": self.lr,
            "seed": self.seed,
            "blocks": blocks,
            "test_accuracy": test,
            "val_accuracy": state.best_val,
            "best_step": state.best_step,
            "steps": state.step,
            "steps_to_target": state.steps_to_target,
            "stop_reason": why,
            "seconds": state.seconds,
            "dtypes": state.dtypes,
            "machines": state.machines,
            "history": state.history,
            "param_counts": counts,
            "checkpoint": str(self.ckpt),
            "backbone_fingerprint": self.ident["backbone_fingerprint"],
            **({"matched_std": self.ident["matched_std"]} if "matched_std" in self.ident else {}),
        }


class TrainingRun:
    """One (learning rate, seed) of ``train``: the model, its optimiser, its bookkeeping (:attr:`run`, a
    :class:`Member`), and the steps the loop takes (:meth:`step`, :meth:`validate`, :meth:`checkpoint`,
    :meth:`finish`).

    Building it loads the backbone (:func:`load_model`), checks the trainable groups, and resumes the
    checkpoint (``cfg.resume``) of the same run identity.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        data: Splits,
        *,
        lr: float,
        seed: int,
        device: torch.device,
        log: Callable[[str], None],
        show_counts: bool,
        shared: dict[str, Any],
    ):
        self.cfg, self.task, self.data, self.device, self.log = cfg, task, data, device, log
        log(f"[lr={lr:g} seed={seed}] loading backbone {cfg.backbone} ...")
        self.model, weights = load_model(cfg, task, seed, device)
        self.blocks = self.model.blocks
        self.run = run = Member.of(cfg, shared, weights=weights, blocks=self.blocks, lr=lr, seed=seed)
        self.params, self.counts = trainable(self.model, cfg, log, show_counts)
        self.opt = optimizer(self.params, lr)
        run.resume(cfg, self.params, self.opt, device, log)
        self.dtype = train_dtype(cfg.dtype, device, self.model.backbone.d_model, log, run.tag)
        run.runs_on(self.dtype, device)
        # evaluation runs the eager model: one compiled training graph, no recompiles for other batch sizes
        self.forward = CompiledOrEager(self.model, cfg.compile, dynamic=task.spec.variable_length)
        #: (loss, gradient norm) device tensors of the steps since the last read (:meth:`read`)
        self.unread: list[tuple[torch.Tensor, torch.Tensor]] = []
        run.start()

    def step(self, batch: Batch) -> None:
        """One optimiser step on ``batch`` (a compiled graph whose backward fails falls back to eager)."""
        self.model.train()
        try:
            self.unread.append(
                train_step(self.forward, self.params, self.opt, batch, self.dtype, self.cfg.grad_clip)
            )
        except Exception as e:  # noqa: BLE001 - a compiled graph whose backward fails falls back to eager
            if not self.forward.compiled:
                raise
            self.forward.fall_back(e)
            self.unread.append(
                train_step(self.forward, self.params, self.opt, batch, self.dtype, self.cfg.grad_clip)
            )
        self.run.state.step += 1

    def read(self) -> None:
        """The steps since the last read, brought to the host at once (:func:`read_steps`)."""
        run = self.run
        run.state.pending_losses.extend(
            read_steps(self.unread, run.state.step - len(self.unread), run.tag, run.lr)
        )
        self.unread.clear()

    def validate(self) -> None:
        """A validation pass of the current parameters; then the steps are read and the pass recorded
        (:meth:`Member.record`)."""
        self.model.eval()
        val, val_loss = scores(
            self.model, self.task, self.data.val, self.cfg.eval_batch_size, self.dtype, self.device
        )
        self.read()
        self.run.record(self.cfg, Evaluation(self.run.state.step, val, val_loss), self.params, self.log)

    def checkpoint(self) -> None:
        """Read the steps, then save the run (:meth:`Member.save`)."""
        self.read()
        self.run.save(self.params, self.opt, self.device)

    def finish(self) -> dict[str, Any]:
        """Checkpoint the end, put the best validation step's parameters back and score the test split;
        returns the run's result (:meth:`Member.result`)."""
        state = self.run.state
        assert state.best_params is not None, "the last step always runs a validation pass"
        self.checkpoint()
        with torch.no_grad():
            for p, best in zip(self.params, state.best_params):
                p.copy_(best)
        self.model.eval()
        test = evaluate(
            self.model, self.task, self.data.test, self.cfg.eval_batch_size, self.dtype, self.device
        )
        return self.run.result(self.cfg, blocks=self.blocks, test=test, counts=self.counts, log=self.log)


def train_run(
    cfg: TrainConfig,
    task: Task,
    data: Splits,
    *,
    lr: float,
    seed: int,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
    show_counts: bool = False,
    shared: dict[str, Any] | None = None,
    on_trained: Callable[[FPT], None] | None = None,
) -> dict[str, Any]:
    """Train one (learning rate, seed); returns its scores and bookkeeping. The loop: step, validate, record
    and checkpoint until the run stops (:class:`TrainingRun`); then finish.

    ``on_step(step)`` is called after every step (after any checkpoint of that step); an exception it
    raises interrupts the run as a kill would. ``on_trained(model)`` is called at the end with the
    parameters of the best validation step. ``shared`` is the sweep's
    :func:`~reservoir.train.checkpoint.settings_identity` (computed here when not given).
    """
    if log is None:
        log = lambda msg: log_line(msg, progress)  # noqa: E731
    if shared is None:
        shared = settings_identity(cfg, task, data.named(), data.left_out)
    device = resolve_device(cfg.device)
    with run_generators(seed, device):
        training = TrainingRun(
            cfg, task, data, lr=lr, seed=seed, device=device, log=log, show_counts=show_counts, shared=shared
        )
        run, state = training.run, training.run.state
        # a bar of steps (rate and ETA) between the validation lines
        with (
            bar(cfg.steps, f"{run.tag} training", initial=state.step, enabled=progress, unit="step") as shown,
            Batches(
                task, data.train, seed, cfg.batch_size, device, cfg.dropout, augments(cfg, task)
            ) as batches,
        ):
            while run.running(cfg):
                training.step(batches.take(state.step))
                shown.update()
                step = state.step
                if step % cfg.eval_every == 0 or step >= cfg.steps:
                    training.validate()
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and not state.done:
                    training.checkpoint()
                if on_step is not None:
                    on_step(step)
            if not state.history or state.history[-1]["step"] != state.step:  # stopped on time
                training.validate()
        result = training.finish()
        if on_trained is not None:
            on_trained(training.model)
        return result

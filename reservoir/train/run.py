"""One run (learning rate, seed) of end-to-end training, alone: :func:`train_run` and :class:`TrainingRun`
(the model, its optimiser, state and checkpoint; its steps, validation passes and records), and the stopping
rule every run follows, alone or trained together (:func:`advance`).

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
from reservoir.runtime import machine
from reservoir.runtime.runner import CompiledOrEager
from reservoir.tasks import Task
from reservoir.train.checkpoint import (
    RunState,
    augments,
    check_resumable,
    checkpoint_path,
    load_checkpoint,
    run_identity,
    run_name,
    save_checkpoint,
    settings_identity,
)
from reservoir.train.data import Batch, Batches, Splits
from reservoir.train.model import FPT, format_counts, param_counts, select_trainable
from reservoir.train.seeds import run_generators
from reservoir.train.step import evaluate, optimizer, read_steps, scores, train_dtype, train_step

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


#: why a run that reached ``--stop-at`` stopped
SOLVED = "validation accuracy reached {:g}%"
#: why a run that ``--max-time`` cut short stopped
TIMED_OUT = "reached --max-time {:g} s at step {}"


def stopped_by(reason: str, template: str) -> bool:
    """Whether a run's stop reason is one ``template`` (:data:`SOLVED`, :data:`TIMED_OUT`) writes."""
    return reason.startswith(template.split("{")[0])


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
        state.done, state.stop_reason = (
            True,
            (
                f"no validation accuracy {100 * ACC_PROGRESS:g} points higher, no validation loss {100 * LOSS_PROGRESS:g}% "
                f"lower and no falling training loss in {cfg.patience} validation passes"
            ),
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


def note_evaluation(
    state: RunState,
    cfg: TrainConfig,
    evaluation: Evaluation,
    params: Callable[[], list[torch.Tensor]],
    log: Callable[[str], None],
    tag: str,
    *,
    rate: float,
    elapsed: float,
) -> None:
    """Record ``evaluation`` in the history of ``state`` (with the mean training loss since the last), the best
    step and its parameters (``params()``: copies of the trainable tensors) and the stopping rule (:func:`advance`);
    one line of log."""
    state.history.append(
        {
            "step": evaluation.step,
            "loss": float(np.mean(state.pending_losses)),
            "val_accuracy": evaluation.accuracy,
            "val_loss": evaluation.loss,
        }
    )
    state.pending_losses.clear()
    if evaluation.accuracy > state.best_val:
        state.best_val, state.best_step = evaluation.accuracy, evaluation.step
        state.best_params = params()
    advance(state, cfg)
    log(
        f"{tag} step {state.step}/{cfg.steps}: loss {state.history[-1]['loss']:.4f}, "
        f"val loss {evaluation.loss:.4f}, val {100 * evaluation.accuracy:.2f}% "
        f"(best {100 * state.best_val:.2f}% at {state.best_step}), {rate:.2f} steps/s, {elapsed:.0f}s"
    )


def resume_state(
    cfg: TrainConfig,
    ckpt: Path,
    name: str,
    ident: dict[str, Any],
    load: Callable[[], RunState],
    log: Callable[[str], None],
    tag: str,
) -> RunState:
    """The state a run starts from: under ``--resume``, its checkpoint's (``load()`` restores it), under this
    ``--stop-at`` (:func:`stop_at_again`); a fresh one otherwise."""
    state = RunState()
    if cfg.resume:
        check_resumable(ckpt, name, ident)
    if cfg.resume and ckpt.exists():
        state = load()
        if state.step > cfg.steps:  # its scores are of the longer run: reported as this one's, they mislead
            raise IdentityError(
                f"checkpoint {ckpt} has trained {state.step} steps, more than --steps {cfg.steps}; pass --steps "
                f"{state.step} or more to resume it, or drop --resume to train {cfg.steps} steps from the start"
            )
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
    return state


def stop_reason(state: RunState, cfg: TrainConfig) -> str:
    """Why a run that leaves its loop stopped: its stopping rule, ``--max-time`` or ``--steps``."""
    if state.done:
        return state.stop_reason
    if state.step < cfg.steps:
        return TIMED_OUT.format(cfg.max_time, state.step)
    return f"reached --steps {cfg.steps}"


def run_result(
    state: RunState,
    *,
    lr: float,
    seed: int,
    blocks: int,
    test: float,
    why: str,
    counts: list[dict[str, Any]],
    ckpt: Path,
    fingerprint: str,
) -> dict[str, Any]:
    """The result of one finished run, scored ``test`` at its best validation step, stopped for ``why``."""
    return {
        "lr": lr,
        "seed": seed,
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
        "checkpoint": str(ckpt),
        "backbone_fingerprint": fingerprint,
    }


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
    """Train one (learning rate, seed); returns its scores and bookkeeping.

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
        return _train_run(
            cfg,
            task,
            data,
            lr=lr,
            seed=seed,
            device=device,
            on_step=on_step,
            log=log,
            show_counts=show_counts,
            shared=shared,
            on_trained=on_trained,
            progress=progress,
        )


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One validation pass: the step it followed, the validation accuracy and loss."""

    step: int
    accuracy: float
    loss: float


class TrainingRun:
    """One (learning rate, seed) of ``train``: the model, its optimiser, its state and checkpoint, and the
    steps the loop takes (:meth:`step`, :meth:`validate`, :meth:`record`, :meth:`checkpoint`, :meth:`finish`).

    Building it loads the backbone, checks ``--blocks`` and the trainable groups, and resumes the
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
        self.cfg, self.task, self.data, self.lr, self.seed, self.device, self.log = (
            cfg,
            task,
            data,
            lr,
            seed,
            device,
            log,
        )
        self.tag = tag = f"[lr={lr:g} seed={seed}]"
        log(f"{tag} loading backbone {cfg.backbone} ...")
        backbone = load_backbone(cfg.backbone, seed)
        check_length(task.spec, backbone, cfg.backbone)
        if cfg.save_backbone is not None:
            backbone.check_saveable()  # before it trains
        self.blocks = blocks = backbone.n_layers if cfg.blocks is None else cfg.blocks
        if not 0 <= blocks <= backbone.n_layers:
            raise UsageError(
                f"--blocks {blocks}: backbone {cfg.backbone} has {backbone.n_layers} blocks; "
                f"choose 0 to {backbone.n_layers} (or leave it out to run them all)"
            )
        self.ident = run_identity(
            shared, backbone_fingerprint=backbone_fingerprint(backbone), blocks=blocks, lr=lr, seed=seed
        )
        self.model = FPT(
            task.spec, backbone, blocks=blocks, seed=seed, input_scale=cfg.input_scale, dropout=cfg.dropout
        ).to(device)
        self.params, notes = select_trainable(self.model, cfg.trainable)
        for note in notes:
            log(note)
        self.counts = param_counts(self.model)
        if show_counts:
            log(format_counts(self.counts))
        self.opt = optimizer(self.params, lr)
        name = run_name(cfg, blocks, lr, seed)
        self.ckpt = checkpoint_path(cfg.checkpoint_folder, name, self.ident)
        self.state = self._resumed(name)
        self.dtype = train_dtype(cfg.dtype, device, backbone.d_model, log, tag)
        for seen, now in ((self.state.dtypes, self.dtype), (self.state.machines, machine.on(device))):
            if not seen or seen[-1] != now:
                seen.append(now)
        # evaluation runs the eager model: one compiled training graph, no recompiles for other batch sizes
        self.forward = CompiledOrEager(self.model, cfg.compile, dynamic=task.spec.variable_length)
        #: (loss, gradient norm) device tensors of the steps since the last read (:meth:`read`)
        self.unread: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.clock = (time.perf_counter(), self.state.step)  # when and at which step this stretch began

    def _resumed(self, name: str) -> RunState:
        """The checkpoint's state under ``--resume`` (a fresh one otherwise, saying it replaces an old one)."""
        return resume_state(
            self.cfg,
            self.ckpt,
            name,
            self.ident,
            lambda: load_checkpoint(self.ckpt, self.params, self.opt, self.ident, self.device),
            self.log,
            self.tag,
        )

    @property
    def running(self) -> bool:
        return not self.state.done and self.state.step < self.cfg.steps and not self.out_of_time

    @property
    def seconds(self) -> float:
        """Seconds of training so far, earlier stretches of a resumed run included."""
        return self.state.seconds + time.perf_counter() - self.clock[0]

    @property
    def out_of_time(self) -> bool:
        return self.cfg.max_time is not None and self.seconds >= self.cfg.max_time

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
        self.state.step += 1

    def read(self) -> None:
        """The steps since the last read, brought to the host at once (:func:`read_steps`)."""
        self.state.pending_losses.extend(
            read_steps(self.unread, self.state.step - len(self.unread), self.tag, self.lr)
        )
        self.unread.clear()

    def validate(self) -> Evaluation:
        """A validation pass of the current parameters; changes nothing of the run."""
        self.model.eval()
        val, val_loss = scores(
            self.model, self.task, self.data.val, self.cfg.eval_batch_size, self.dtype, self.device
        )
        return Evaluation(self.state.step, val, val_loss)

    def record(self, evaluation: Evaluation) -> None:
        """Record ``evaluation`` (:func:`note_evaluation`)."""
        self.read()
        began, first = self.clock
        note_evaluation(
            self.state,
            self.cfg,
            evaluation,
            lambda: [p.detach().clone() for p in self.params],
            self.log,
            self.tag,
            rate=(self.state.step - first) / max(time.perf_counter() - began, 1e-9),
            elapsed=self.seconds,
        )

    def checkpoint(self) -> None:
        """Count the time so far, then save the run (:func:`~reservoir.train.checkpoint.save_checkpoint`)."""
        self.state.seconds = self.seconds
        self.clock = (time.perf_counter(), self.state.step)
        self.read()
        save_checkpoint(self.ckpt, self.params, self.opt, self.state, self.ident, self.device)

    def finish(self) -> dict[str, Any]:
        """Checkpoint the end, put the best validation step's parameters back and score the test split;
        returns the run's result."""
        state, cfg = self.state, self.cfg
        why = stop_reason(state, cfg)
        assert state.best_params is not None, "the last step always runs a validation pass"
        self.checkpoint()
        with torch.no_grad():
            for p, best in zip(self.params, state.best_params):
                p.copy_(best)
        self.model.eval()
        test = evaluate(self.model, self.task, self.data.test, cfg.eval_batch_size, self.dtype, self.device)
        self.log(
            f"{self.tag} {why}; best val {100 * state.best_val:.2f}% at step {state.best_step}, "
            f"test {100 * test:.2f}%"
        )
        return run_result(
            state,
            lr=self.lr,
            seed=self.seed,
            blocks=self.blocks,
            test=test,
            why=why,
            counts=self.counts,
            ckpt=self.ckpt,
            fingerprint=self.ident["backbone_fingerprint"],
        )


def _train_run(
    cfg: TrainConfig,
    task: Task,
    data: Splits,
    *,
    lr: float,
    seed: int,
    device: torch.device,
    on_step: Callable[[int], None] | None,
    log: Callable[[str], None],
    show_counts: bool,
    shared: dict[str, Any],
    on_trained: Callable[[FPT], None] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The loop of :func:`train_run`: step, validate, record and checkpoint until the run stops; then finish."""
    run = TrainingRun(
        cfg, task, data, lr=lr, seed=seed, device=device, log=log, show_counts=show_counts, shared=shared
    )
    # a bar of steps (rate and ETA) between the validation lines
    with (
        bar(cfg.steps, f"{run.tag} training", initial=run.state.step, enabled=progress, unit="step") as shown,
        Batches(task, data.train, seed, cfg.batch_size, device, cfg.dropout, augments(cfg, task)) as batches,
    ):
        while run.running:
            run.step(batches.take(run.state.step))
            shown.update()
            step = run.state.step
            if step % cfg.eval_every == 0 or step >= cfg.steps:
                run.record(run.validate())
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and not run.state.done:
                run.checkpoint()
            if on_step is not None:
                on_step(step)
        if not run.state.history or run.state.history[-1]["step"] != run.state.step:  # stopped on time
            run.record(run.validate())
    result = run.finish()
    if on_trained is not None:
        on_trained(run.model)
    return result

"""The training loop of end-to-end FPT runs: data, steps, validation, sweeps and results.

Differences from the official code, following the critique of Rothermel et al. (2021),
whose conclusions flip with the learning rate:

- a seeded validation split (the task's ``val`` split when it has one, else a fraction
  of train) selects the step (early stopping) and, in a sweep, the learning rate;
- test accuracy is computed once, on the whole test split (no dropped last batch, no
  random test batches), with the parameters of the best validation step;
- every source of randomness draws from a named stream of the run's seed
  (:mod:`reservoir.train.seeds`): the data order is a function of ``(seed, epoch)``, dropout
  draws from torch generators forked for the run (the CPU's and, on CUDA, the device's; the
  caller's are untouched) and checkpointed, so a resumed run continues exactly where the
  checkpoint left it.

A step never waits for the host and the host never waits for a step: the next step's batch is
built (and pinned, on CUDA) on a worker thread while the device runs the current one
(:class:`Batches`), and each step's loss and gradient norm stay on the device until the next
validation pass or checkpoint reads them all at once (:func:`read_steps`). A step whose
gradient norm is not finite is skipped on the device (fused Adam's ``found_inf``: parameters,
moments and step count stay as they were), and the read that finds it stops the run, naming
the step.

A run stops at ``steps``, after ``patience`` validation passes without progress (no validation
accuracy 0.1 points above the last progress, no validation loss 0.1% below its lowest, and no
training loss still falling: :func:`advance`), or when validation accuracy reaches ``stop_at``
(by default 100%: it cannot improve further). With ``save_backbone``, the run's trained backbone
(at its best validation step) is then saved as a backbone folder (:mod:`reservoir.train.export`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from reservoir import __version__
from reservoir.config import TRAIN_DTYPES, TrainConfig
from reservoir.errors import DataError, ReservoirError, UsageError
from reservoir.model.backbones import fingerprint as backbone_fingerprint
from reservoir.model.backbones import load_backbone
from reservoir.model.devices import resolve_device
from reservoir.model.reservoir import check_length
from reservoir.progress import bar
from reservoir.progress import log as log_line
from reservoir.results import Result, sample_std, seed_summary, write_result
from reservoir.runtime import machine
from reservoir.runtime.dtypes import choose as choose_dtype
from reservoir.runtime.dtypes import cuda_bf16_native
from reservoir.runtime.runner import CompiledOrEager
from reservoir.tasks import SplitData, Task, make_task
from reservoir.tasks.sizes import check_classes, check_train_split
from reservoir.train import batched
from reservoir.train.checkpoint import (
    RunState,
    check_resumable,
    checkpoint_path,
    load_checkpoint,
    run_identity,
    run_name,
    save_checkpoint,
    settings_identity,
)
from reservoir.train.export import check_free, save_backbone
from reservoir.train.model import FPT, format_counts, param_counts, select_trainable
from reservoir.train.seeds import generator_states, rng, run_generators

# ---------------------------------------------------------------- data


@dataclasses.dataclass
class Splits:
    train: SplitData
    val: SplitData
    test: SplitData
    #: the task's names of the validation split (``None``: held out of train) and of the test split used
    val_name: str | None = None
    test_name: str = "test"

    def named(self) -> dict[str, SplitData]:
        return {"train": self.train, "val": self.val, "test": self.test}


def _take(d: SplitData, idx: np.ndarray) -> SplitData:
    return SplitData(d.inputs[idx], d.labels[idx], d.lengths[idx])


def load_data(task: Task, cfg: TrainConfig) -> Splits:
    """Train, validation and test splits by the roles the task declares (``TaskSpec.roles``): its
    validation split (``val``, TAPE's ``valid``) or a seeded share of train, and its first test split
    (``test``, or the first ``test_*``, e.g. TAPE's ``test_fold_holdout``)."""
    data_dir = Path(cfg.data_dir)
    val_name, test_names = task.spec.roles
    if not test_names:
        raise DataError(f"task {task.name!r} declares no test split (splits {list(task.spec.splits)})")
    train = task.load("train", data_dir, cfg.limit, cfg.seed)
    held_out = not any(
        s in task.spec.splits for s in ("val", "valid")
    )  # else the task's own validation split
    check_train_split(
        f"task {task.spec.name!r}",
        train.labels,
        limit=cfg.limit,
        val_fraction=cfg.val_fraction,
        n_val=(lambda n: max(1, int(round(cfg.val_fraction * n)))) if held_out else None,
        n_classes=task.spec.n_classes,
    )
    test = task.load(test_names[0], data_dir, cfg.limit, cfg.seed)
    read = {"train": train, test_names[0]: test}
    if val_name is not None:
        val = read[val_name] = task.load(val_name, data_dir, cfg.limit, cfg.seed)
    check_classes(
        f"task {task.spec.name!r}",
        {s: d.labels for s, d in read.items()},
        limit=cfg.limit,
        names=task.class_names,
        full=None if task.draws else (lambda s: task.load(s, data_dir).labels),
    )
    if val_name is None:
        from sklearn.model_selection import train_test_split

        y = train.labels
        strat = y if y.ndim == 1 and len(np.unique(y)) > 1 and np.bincount(y).min() >= 2 else None
        n_val = max(1, int(round(cfg.val_fraction * len(train))))
        if len(train) - n_val < 1:
            raise DataError(
                f"train split has {len(train)} examples: too few to hold out a validation split; "
                "raise --limit or the task's n_train"
            )
        fit_idx, val_idx = train_test_split(
            np.arange(len(train)), test_size=n_val, random_state=cfg.seed, stratify=strat
        )
        train, val = _take(train, np.sort(fit_idx)), _take(train, np.sort(val_idx))
    for name, d in (("train", train), (val_name or "held-out validation", val), (test_names[0], test)):
        if len(d) == 0:
            raise DataError(f"the {name} split of task {task.name!r} is empty; check --data-dir and --limit")
    return Splits(train, val, test, val_name, test_names[0])


def batch_tensors(
    task: Task, d: SplitData, rows: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = torch.from_numpy(np.ascontiguousarray(task.encode(d.inputs[rows])))
    lengths = torch.from_numpy(np.asarray(d.lengths[rows], dtype=np.int64))
    labels = torch.from_numpy(np.asarray(d.labels[rows], dtype=np.int64))
    return tokens, lengths, labels


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The shuffled row order of one epoch: a function of (seed, epoch) only, so resume needs just the step."""
    return rng(seed, "data order", epoch).permutation(n)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Batches:
    """The training batches of a run by step, each built on a worker thread while the step before it runs (and
    pinned when the run's device is CUDA, so its copy to the device is asynchronous; pinned blocks come from
    torch's caching host allocator, which reuses them). Full batches only: each epoch drops a different
    remainder, and every step has one shape (one compiled graph)."""

    def __init__(self, task: Task, data: SplitData, seed: int, batch_size: int, device: torch.device):
        self.task, self.data, self.seed, self.batch_size = task, data, seed, batch_size
        self.per_epoch = max(1, len(data) // batch_size)
        self.pin = device.type == "cuda"
        self._order: tuple[int, np.ndarray | None] = (-1, None)  # the worker thread's alone
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reservoir-batches")
        self._ahead: tuple[int, Future] | None = None

    def rows(self, step: int) -> np.ndarray:
        """The training rows of step ``step`` (0-based): a function of (seed, step) alone."""
        epoch, i = divmod(step, self.per_epoch)
        if epoch != self._order[0]:
            self._order = (epoch, epoch_order(self.seed, epoch, len(self.data)))
        return self._order[1][i * self.batch_size : (i + 1) * self.batch_size]

    def _build(self, step: int) -> Batch:
        batch = batch_tensors(self.task, self.data, self.rows(step))
        return tuple(t.pin_memory() for t in batch) if self.pin else batch

    def take(self, step: int) -> Batch:
        """The batch of ``step``; the worker starts building the next step's."""
        ahead = self._ahead[1] if self._ahead is not None and self._ahead[0] == step else None
        current = ahead or self._pool.submit(self._build, step)
        self._ahead = (step + 1, self._pool.submit(self._build, step + 1))
        return current.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- loop

#: the relative fall of the lowest validation loss that counts as progress for ``patience``: bit XOR's
#: plateau runs fall about 1% a validation pass, a run stuck on bit memory's 75% about 0.003%
LOSS_PROGRESS = 1e-3
#: the rise of validation accuracy over its value at the last progress that counts as progress for
#: ``patience`` (0.1 points; as Keras' ``min_delta``, a slow creep counts once it adds up to it): on a
#: plateau scored over many outputs (bit memory's 1,000,000 bits) the accuracy wanders by hundredths of
#: a point, and every new record of that noise would otherwise restart the patience count
ACC_PROGRESS = 1e-3
#: validation passes whose mean training losses make the training-loss trend (:func:`loss_falling`)
TREND_PASSES = 20
#: the fall of the trend line over :data:`TREND_PASSES` passes, as a fraction of the loss, that counts as progress
TREND_FALL = 0.01
#: ... when it is also this many standard errors of the line's slope (a flat, noisy loss is not progress)
TREND_T = 2.0


def autocast(dtype: str, device: torch.device | str = "cpu"):
    if dtype == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loss_and_correct(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = logits.float().reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    return nn.functional.cross_entropy(flat, y), (flat.argmax(-1) == y).sum()


def scores(
    forward: Callable,
    task: Task,
    d: SplitData,
    batch_size: int,
    dtype: str,
    device: torch.device | str = "cpu",
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy over every output (every bit for bit tasks) of the whole split."""
    correct, total, loss_sum = 0, 0, 0.0
    with torch.inference_mode(), autocast(dtype, device):
        for start in range(0, len(d), batch_size):
            rows = np.arange(start, min(start + batch_size, len(d)))
            tokens, lengths, labels = (t.to(device) for t in batch_tensors(task, d, rows))
            loss, c = loss_and_correct(forward(tokens, lengths), labels)
            correct, total, loss_sum = (
                correct + int(c),
                total + labels.numel(),
                loss_sum + float(loss) * labels.numel(),
            )
    return correct / total, loss_sum / total


def evaluate(
    forward: Callable,
    task: Task,
    d: SplitData,
    batch_size: int,
    dtype: str,
    device: torch.device | str = "cpu",
) -> float:
    """Accuracy over every output (every bit for bit tasks) of the whole split."""
    return scores(forward, task, d, batch_size, dtype, device)[0]


def optimizer(params: list[nn.Parameter], lr: float) -> torch.optim.Adam:
    """The run's Adam: fused, so that :func:`train_step` can skip a step on the device (``found_inf``)."""
    return torch.optim.Adam(params, lr=lr, fused=True)


def train_step(
    forward: Callable,
    params: list[nn.Parameter],
    opt: torch.optim.Optimizer,
    batch: Batch,
    dtype: str,
    grad_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Adam step on one batch (the model must be in train mode; the batch moves to its device). Returns the
    loss and the gradient norm as tensors on the device: nothing here waits for the device. A step whose gradient
    norm is not finite is skipped by the device when ``opt`` is fused Adam (:func:`optimizer`): its kernel
    leaves parameters, moments and step count as they were; :func:`read_steps` then stops the run."""
    device = params[0].device
    tokens, lengths, labels = (t.to(device, non_blocking=True) for t in batch)
    with autocast(dtype, device):
        logits = forward(tokens, lengths)
    loss, _ = loss_and_correct(logits, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), optimize(params, opt, grad_clip).detach()


def optimize(params: list[nn.Parameter], opt: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
    """The optimiser's step from the gradients of ``params``, clipped to the norm ``grad_clip`` (0: not clipped);
    returns their norm before clipping, on the device. A step whose norm is not finite is skipped by the device
    when ``opt`` is fused Adam (``found_inf``)."""
    norm = nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if opt.defaults.get("fused"):
        opt.found_inf = (~torch.isfinite(norm)).to(torch.float32)
    opt.step()
    return norm


def read_steps(
    steps: list[tuple[torch.Tensor, torch.Tensor]], first: int, tag: str, lr: float
) -> list[float]:
    """The losses of ``steps``, the (loss, gradient norm) device tensors of :func:`train_step` for steps
    ``first + 1, first + 2, ...``, read in one synchronisation; Diverged naming the first step whose gradient
    norm or loss is not finite (:func:`check_steps`)."""
    if not steps:
        return []
    losses, norms = torch.stack([torch.stack(s) for s in steps]).float().cpu().T.tolist()
    return check_steps(losses, norms, first, tag, lr)


def check_steps(losses: list[float], norms: list[float], first: int, tag: str, lr: float) -> list[float]:
    """``losses``, the training losses of steps ``first + 1, first + 2, ...`` read from the device beside their
    gradient norms ``norms``; Diverged naming the first step whose gradient norm or loss is not finite."""
    for i, (loss, norm) in enumerate(zip(losses, norms)):
        if not math.isfinite(norm) and math.isfinite(loss):
            raise Diverged(
                f"{tag} the gradients are not finite at step {first + i + 1} (gradient norm {norm} with a finite loss "
                f"{loss:.4g}): with a finite loss this is an overflow in the backward pass, not the learning rate. "
                "A known cause: a token whose hidden state is exactly zero (an all-zero input token in a backbone "
                "without biases, e.g. SmolLM2, whose position parameters were set to zero), where RMSNorm's "
                "derivative is 1/sqrt(eps) per block; the FPT draws position parameters that start at zero, so check "
                "the backbone's own positions and norms"
            )
        if not math.isfinite(loss):
            raise Diverged(
                f"{tag} the training loss became {loss} at step {first + i + 1}; lower --lr (now {lr:g}) "
                "or keep --grad-clip above 0"
            )
    return losses


def train_dtype(
    name: str, device: torch.device, width: int, log: Callable[[str], None], tag: str = ""
) -> str:
    """The compute dtype of a run: ``name``, or for ``auto`` the faster training dtype on ``device``, measured
    at the backbone's ``width`` on a CPU, bf16 on a CUDA card only where it is native
    (:func:`reservoir.runtime.dtypes.choose`; said in the log, as is an explicit bf16 the card emulates)."""
    if name == "auto":
        dtype, why = choose_dtype(device, width, allowed=TRAIN_DTYPES)
        log(f"{tag} {why}".strip())
        return dtype
    if name == "bfloat16" and device.type == "cuda" and not cuda_bf16_native(device):
        log(
            f"{tag} --dtype bfloat16: {torch.cuda.get_device_name(device)} emulates bf16, slower than float32; "
            "--dtype auto runs float32 on it".strip()
        )
    return name


def solved(state: RunState, stop_at: float) -> None:
    """End a run whose validation accuracy reached ``stop_at`` (``--stop-at``)."""
    state.done, state.stop_reason = True, f"validation accuracy reached {100 * stop_at:g}%"


def loss_trend(losses: Sequence[float]) -> tuple[float, float]:
    """``(fall, t)`` of the least-squares line through the logs of ``losses`` (one a validation pass): the
    fraction of the loss the line falls over them, and its slope in standard errors (negative: falling)."""
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
    """Whether the training loss still falls: over its last :data:`TREND_PASSES` validation passes, its trend
    line (:func:`loss_trend`) falls by :data:`TREND_FALL` of it or more, :data:`TREND_T` standard errors or more."""
    window = list(losses)[-TREND_PASSES:]
    if len(window) < 3:
        return False
    fall, t = loss_trend(window)
    return fall >= TREND_FALL and t <= -TREND_T


def advance(state: RunState, cfg: TrainConfig) -> None:
    """The stopping rule, after the validation pass ``state.history[-1]``: record progress, the target, and stop
    the run when it is solved (``stop_at``) or made no progress in ``patience`` passes.

    Progress is any of: a validation accuracy :data:`ACC_PROGRESS` above the last progress, a validation loss
    :data:`LOSS_PROGRESS` below its lowest, or a training loss still falling (:func:`loss_falling`). Validation
    alone is noisy where it matters: on bit XOR a run's accuracy sits on a plateau and its validation loss
    wanders for thousands of steps while the training loss (a mean over the pass's steps) keeps falling
    until the run solves the task; a run that has converged or is stuck has a flat training loss and stops."""
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
    elif cfg.patience and state.evals_since_best >= cfg.patience:
        state.done, state.stop_reason = (
            True,
            (
                f"no validation accuracy {100 * ACC_PROGRESS:g} points higher, no validation loss {100 * LOSS_PROGRESS:g}% "
                f"lower and no falling training loss in {cfg.patience} validation passes"
            ),
        )


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
    """``evaluation`` into the history of ``state`` (with the mean training loss since the last, which must have
    been read), the best step and its parameters (``params()``: copies of the run's trainable tensors), and the
    stopping rule (:func:`advance`); one line of log, at ``rate`` steps/s after ``elapsed`` seconds."""
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
    """The state a run starts from: under ``--resume``, its checkpoint's (``load()`` restores it; one of another
    identity beside it is refused), ended where its best validation already reached ``--stop-at``; a fresh one
    otherwise, saying that it replaces an old checkpoint."""
    state = RunState()
    if cfg.resume:
        check_resumable(ckpt, name, ident)
    if cfg.resume and ckpt.exists():
        state = load()
        if not state.done and state.best_val >= cfg.stop_at:  # solved by a lower --stop-at than it ran with
            solved(state, cfg.stop_at)
        log(
            f"{tag} resumed {ckpt} at step {state.step}"
            + (" (finished)" if state.done or state.step >= cfg.steps else "")
        )
    elif ckpt.exists():
        log(f"{tag} starting over; {ckpt} will be replaced (pass --resume to continue it)")
    return state


def stop_reason(state: RunState, cfg: TrainConfig) -> str:
    """Why a run that leaves its loop stopped: its stopping rule, ``--max-time`` or ``--steps`` (more of either
    continue it)."""
    if state.done:
        return state.stop_reason
    if state.step < cfg.steps:
        return f"reached --max-time {cfg.max_time:g} s at step {state.step}"
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
    """The result of one finished run (scores and bookkeeping), scored ``test`` on the test split at its best
    validation step, stopped for ``why``."""
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

    ``on_step(step)`` is called after every step (after any checkpoint of that step); an
    exception it raises interrupts the run as a kill would. ``on_trained(model)`` is called at
    the end with the model holding the parameters of the best validation step. ``shared`` is
    the sweep's :func:`~reservoir.train.checkpoint.settings_identity` (computed here when not given).
    The run's torch generators (dropout; the CPU's and a CUDA device's) are forked from the caller's and
    seeded from the run's seed (:func:`reservoir.train.seeds.run_generators`).
    """
    if log is None:
        log = lambda msg: log_line(msg, progress)  # noqa: E731
    if shared is None:
        shared = settings_identity(cfg, task, data.named())
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
    steps the loop takes: :meth:`step` (one optimiser step), :meth:`validate` (a validation pass, changing
    nothing), :meth:`record` (an evaluation into the history, the best step and the stopping rule),
    :meth:`checkpoint` and :meth:`finish` (the best step's parameters back, scored on the test split).

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
        """``evaluation`` into the history (with the mean training loss since the last), the best step and
        its parameters, and the stopping rule (:func:`advance`); one line of log."""
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
        """Checkpoint the end, put the best validation step's parameters back, score the test split; the run's
        result (scores and bookkeeping)."""
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
    """The loop of :func:`train_run`: step, validate and record every ``eval_every`` steps (and at the last),
    checkpoint every ``checkpoint_every``, until the stopping rule or ``--steps``; then finish."""
    run = TrainingRun(
        cfg, task, data, lr=lr, seed=seed, device=device, log=log, show_counts=show_counts, shared=shared
    )
    # a bar of steps (rate and ETA) between the validation lines: a step of a large model can take seconds
    with (
        bar(cfg.steps, f"{run.tag} training", initial=run.state.step, enabled=progress, unit="step") as shown,
        Batches(task, data.train, seed, cfg.batch_size, device) as batches,
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


# ---------------------------------------------------------------- runs trained together


class GroupBatches(Batches):
    """The training batches of a group of runs (:class:`GroupRun`): each run's rows of its own step by its own
    data order (:meth:`Batches.rows` of its seed), one run after another, built a step ahead on a worker thread
    (and pinned for CUDA) as :class:`Batches` builds one run's."""

    def __init__(self, task: Task, data: SplitData, batch_size: int, device: torch.device):
        super().__init__(task, data, 0, batch_size, device)
        self._orders: dict[int, tuple[int, np.ndarray]] = {}  # the worker thread's alone

    def run_rows(self, seed: int, step: int) -> np.ndarray:
        """Run ``seed``'s training rows of its step ``step``, as :meth:`Batches.rows` gives them alone."""
        epoch, i = divmod(step, self.per_epoch)
        if self._orders.get(seed, (-1,))[0] != epoch:
            self._orders[seed] = (epoch, epoch_order(seed, epoch, len(self.data)))
        return self._orders[seed][1][i * self.batch_size : (i + 1) * self.batch_size]

    def _build(self, plan: tuple[tuple[int, int], ...]) -> Batch:
        rows = np.concatenate([self.run_rows(seed, step) for seed, step in plan])
        batch = batch_tensors(self.task, self.data, rows)
        return tuple(t.pin_memory() for t in batch) if self.pin else batch

    def take(self, plan: tuple[tuple[int, int], ...]) -> Batch:
        """The batch of ``plan``, a ``(seed, step)`` a run; the worker starts building the next steps'."""
        ahead = self._ahead[1] if self._ahead is not None and self._ahead[0] == plan else None
        current = ahead or self._pool.submit(self._build, plan)
        following = tuple((seed, step + 1) for seed, step in plan)
        self._ahead = (following, self._pool.submit(self._build, following))
        return current.result()


@dataclasses.dataclass
class Member:
    """One run of a :class:`GroupRun`: its settings, state, checkpoint and generator states; ``outcome`` is its
    result once it finished, :class:`Diverged` once it diverged."""

    lr: float
    seed: int
    tag: str
    ident: dict[str, Any]
    ckpt: Path
    rng: dict[str, torch.Tensor]
    state: RunState = dataclasses.field(default_factory=RunState)
    clock: tuple[float, int] = (0.0, 0)
    outcome: dict[str, Any] | Diverged | None = None
    #: left unfinished: a run of the same learning rate and a lower seed diverged (the rate is set aside)
    dropped: bool = False

    @property
    def seconds(self) -> float:
        """Seconds of training so far, earlier stretches of a resumed run included."""
        return self.state.seconds + time.perf_counter() - self.clock[0]

    @property
    def stopped(self) -> bool:
        return self.outcome is not None or self.dropped


class GroupRun:
    """Runs (learning rate, seed) of ``train`` trained together (:mod:`reservoir.train.batched`): the backbone held
    once, the runs' trainable parameters and seeded tensors stacked, each step one forward and backward over every
    run's batch, each run with its Adam, clipping, data order and dropout generators. A run leaves the group when
    it meets its stopping rule, ``--steps`` or ``--max-time``, or diverges; it writes the checkpoints (one file a
    run, the one it writes alone) and returns the result it returns alone, with ``batch_runs``: the number of
    runs it started training with.

    Building it builds each seed's model as :class:`TrainingRun` does (the dropout generators then stand where
    the run's stand alone), stacks what differs, holds the stacked forward against each run's own model
    (:attr:`mismatch` says why not, and then the runs must train one after another) and resumes each run's
    checkpoint under ``cfg.resume``.
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
                backbone = load_backbone(cfg.backbone, seed)
                check_length(task.spec, backbone, cfg.backbone)
                blocks = self._blocks(backbone)
                fingerprint = backbone_fingerprint(backbone)
                model = FPT(
                    task.spec,
                    backbone,
                    blocks=blocks,
                    seed=seed,
                    input_scale=cfg.input_scale,
                    dropout=cfg.dropout,
                ).to(device)
                states = generator_states(device)
            model.eval()
            with torch.inference_mode():
                reference = model(*probe[:2]).float()
            if template is None:
                template, values = model, {}
            elif not batched.same_buffers(template, model):
                self.mismatch = f"the buffers of {cfg.backbone} differ between seeds {seeds[0]} and {seed}"
                return
            else:
                values = {n: t.detach() for n, t in batched.differing(template, model).items()}
            built[seed] = {
                "fingerprint": fingerprint,
                "rng": states,
                "values": values,
                "reference": reference,
            }
            del model, backbone
        assert template is not None
        self.blocks = template.blocks
        params, notes = select_trainable(template, cfg.trainable)
        for note in notes:
            log(note)
        self.counts = param_counts(template)
        if show_counts:
            log(format_counts(self.counts))
        named = dict(template.named_parameters())
        by_id = {id(p): n for n, p in named.items()}
        trained = [by_id[id(p)] for p in params]
        seeded = {n for b in built.values() for n in b["values"]} - set(trained)
        names = trained + [n for n in named if n in seeded]
        own = {n: named[n].detach().clone() for n in names}
        self.model = template
        self.stack = batched.RunStack(
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
            Member(
                lr,
                seed,
                f"[lr={lr:g} seed={seed}]",
                run_identity(
                    shared,
                    backbone_fingerprint=built[seed]["fingerprint"],
                    blocks=self.blocks,
                    lr=lr,
                    seed=seed,
                ),
                Path(),
                {k: v.clone() for k, v in built[seed]["rng"].items()},
            )
            for lr, seed in runs
        ]
        #: each run's Adam, over its parameters in the stack
        self.opts = [optimizer(params, m.lr) for params, m in zip(self.stack.params, self.members)]
        for r, m in enumerate(self.members):
            name = run_name(cfg, self.blocks, m.lr, m.seed)
            m.ckpt = checkpoint_path(cfg.checkpoint_folder, name, m.ident)
            m.state = resume_state(cfg, m.ckpt, name, m.ident, lambda r=r, m=m: self._load(r, m), log, m.tag)
        self.dtype = train_dtype(cfg.dtype, device, template.backbone.d_model, log, self.tag)
        if cfg.compile:
            log(f"{self.tag} trains eager: --compile compiles a run trained alone (--concurrent-runs 1)")
        for m in self.members:
            for seen, now in ((m.state.dtypes, self.dtype), (m.state.machines, machine.on(device))):
                if not seen or seen[-1] != now:
                    seen.append(now)
        self.active = list(self.members)
        #: (losses, gradient norms) device tensors ``(runs,)`` of the steps since the last read (:meth:`read`)
        self.unread: list[tuple[torch.Tensor, torch.Tensor]] = []
        began = time.perf_counter()
        for m in self.members:
            m.clock = (began, m.state.step)

    def _blocks(self, backbone) -> int:
        blocks = backbone.n_layers if self.cfg.blocks is None else self.cfg.blocks
        if not 0 <= blocks <= backbone.n_layers:
            raise UsageError(
                f"--blocks {blocks}: backbone {self.cfg.backbone} has {backbone.n_layers} blocks; "
                f"choose 0 to {backbone.n_layers} (or leave it out to run them all)"
            )
        return blocks

    def _check(self, probe: list[torch.Tensor], references: list[torch.Tensor]) -> str:
        """Why the stacked forward of the probe rows is not each run's own (``""``: it is, to float tolerance)."""
        tokens, lengths = probe[0], probe[1]
        self.model.eval()
        try:
            with torch.inference_mode(), self.stack.bound(self.stack.tensors(), len(tokens)):
                out = self.model(
                    batched.repeat_rows(tokens, self.size), batched.repeat_rows(lengths, self.size)
                )
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

    def _load(self, r: int, m: Member) -> RunState:
        """Run ``r``'s checkpoint into its parameters in the stack, its Adam and its generator states."""
        return load_checkpoint(
            m.ckpt, self.stack.params[r], self.opts[r], m.ident, self.device, generators=m.rng
        )

    def running(self, m: Member) -> bool:
        cfg = self.cfg
        out_of_time = cfg.max_time is not None and m.seconds >= cfg.max_time
        return not m.stopped and not m.state.done and m.state.step < cfg.steps and not out_of_time

    def step(self, batch: Batch) -> None:
        """One step of every active run on ``batch`` (its rows, run after run): one forward and backward, then each
        run's clipping and Adam (:func:`optimize`, as alone); nothing waits for the device."""
        stack, n = self.stack, self.cfg.batch_size
        tokens, lengths, labels = (t.to(self.device, non_blocking=True) for t in batch)
        self.model.train()
        with (
            stack.bound(stack.tensors(), n, [m.rng for m in self.active]),
            batched.drawing(),
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
        """The steps since the last read, brought to the host at once; a run whose loss or gradient norm is not
        finite has diverged (:func:`check_steps`), and the runs of its learning rate with higher seeds are
        dropped (the rate is set aside, as it is when its runs train one after another)."""
        if not self.unread:
            return
        both = (
            torch.stack([torch.stack([loss, norm]) for loss, norm in self.unread]).float().cpu()
        )  # (S, 2, R)
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
        """Accuracy and mean cross-entropy of each of ``members`` (its stacked ``tensors``) over every output of the
        whole split ``d`` (:func:`scores` of each run alone), its batches of ``eval_batch_size`` rows a run."""
        k, size = len(members), self.cfg.eval_batch_size
        correct = torch.zeros(k, dtype=torch.long, device=self.device)
        losses, counts = [], []
        self.model.eval()
        with torch.inference_mode(), autocast(self.dtype, self.device):
            for start in range(0, len(d), size):
                rows = np.arange(start, min(start + size, len(d)))
                tokens, lengths, labels = (t.to(self.device) for t in batch_tensors(self.task, d, rows))
                with self.stack.bound(tensors, len(rows)):
                    logits = self.model(batched.repeat_rows(tokens, k), batched.repeat_rows(lengths, k))
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

    def validate(self, members: list[Member]) -> list[Evaluation]:
        """A validation pass of ``members``' current parameters, together; changes nothing of the runs."""
        every = len(members) == self.stack.runs
        tensors = self.stack.tensors(None if every else self._index(members))
        return [
            Evaluation(m.state.step, acc, loss)
            for m, (acc, loss) in zip(members, self.scores(members, self.data.val, tensors))
        ]

    def _index(self, members: list[Member]) -> torch.Tensor:
        return torch.tensor([self.active.index(m) for m in members], dtype=torch.long, device=self.device)

    def record(self, m: Member, evaluation: Evaluation) -> None:
        """``evaluation`` into run ``m``'s history, best step and stopping rule, as a run alone records it
        (:func:`note_evaluation`); the steps must have been read."""
        r = self.active.index(m)
        began, first = m.clock
        note_evaluation(
            m.state,
            self.cfg,
            evaluation,
            lambda: [p.detach().clone() for p in self.stack.params[r]],
            self.log,
            m.tag,
            rate=(m.state.step - first) / max(time.perf_counter() - began, 1e-9),
            elapsed=m.seconds,
        )

    def checkpoint(self, m: Member) -> None:
        """Count run ``m``'s time so far, then save it as it saves alone (its parameters, its Adam, its state),
        with its own generator states."""
        m.state.seconds = m.seconds
        m.clock = (time.perf_counter(), m.state.step)
        self.read()
        r = self.active.index(m)
        save_checkpoint(m.ckpt, self.stack.params[r], self.opts[r], m.state, m.ident, self.device, rng=m.rng)

    def leave(self, members: list[Member]) -> None:
        """``members`` leave the group: each finished one validates if its last step had no pass, checkpoints, and
        is scored on the test split at its best validation step (together); a diverged or dropped one ends."""
        if not members:
            return
        self.read()
        finishing = [m for m in members if not m.stopped]
        unrecorded = [
            m for m in finishing if not m.state.history or m.state.history[-1]["step"] != m.state.step
        ]
        if unrecorded:
            for m, evaluation in zip(unrecorded, self.validate(unrecorded)):
                self.record(m, evaluation)
        finishing = [m for m in finishing if not m.stopped]
        if finishing:
            why = {id(m): stop_reason(m.state, self.cfg) for m in finishing}
            for m in finishing:
                assert m.state.best_params is not None, "the last step always runs a validation pass"
                self.checkpoint(m)
            best = self.stack.best(self._index(finishing), [m.state.best_params for m in finishing])
            for m, (test, _) in zip(finishing, self.scores(finishing, self.data.test, best)):
                self.log(
                    f"{m.tag} {why[id(m)]}; best val {100 * m.state.best_val:.2f}% at step {m.state.best_step}, "
                    f"test {100 * test:.2f}%"
                )
                m.outcome = {
                    **run_result(
                        m.state,
                        lr=m.lr,
                        seed=m.seed,
                        blocks=self.blocks,
                        test=test,
                        why=why[id(m)],
                        counts=self.counts,
                        ckpt=m.ckpt,
                        fingerprint=m.ident["backbone_fingerprint"],
                    ),
                    "batch_runs": self.size,
                }
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
        """Step, validate and record each run every ``eval_every`` of its steps (and at its last), checkpoint it
        every ``checkpoint_every``, until every run has left (:meth:`leave`)."""
        cfg = self.cfg
        self.leave([m for m in self.active if not self.running(m)])  # resumed finished
        if not self.active:
            return
        start = min(m.state.step for m in self.active)
        with (
            bar(cfg.steps, f"{self.tag} training", initial=start, enabled=progress, unit="step") as shown,
            GroupBatches(self.task, self.data.train, cfg.batch_size, self.device) as batches,
        ):
            while self.active:
                self.step(batches.take(tuple((m.seed, m.state.step) for m in self.active)))
                shown.update()
                due = [
                    m for m in self.active if m.state.step % cfg.eval_every == 0 or m.state.step >= cfg.steps
                ]
                if due:
                    self.read()
                    due = [m for m in due if not m.stopped]
                    for m, evaluation in zip(due, self.validate(due) if due else []):
                        self.record(m, evaluation)
                saving = [
                    m
                    for m in self.active
                    if cfg.checkpoint_every and m.state.step % cfg.checkpoint_every == 0 and not m.state.done
                ]
                for m in saving:
                    if not m.stopped:
                        self.checkpoint(m)
                if on_step is not None:
                    on_step(max(m.state.step for m in self.active))
                leaving = [m for m in self.active if not self.running(m)]
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
    """Train ``runs`` together (:class:`GroupRun`); each run's result, :class:`Diverged`, or ``None`` (dropped:
    its rate diverged at a lower seed). ``None`` where they cannot train together (said in the log): the caller
    trains them one after another."""
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
    (:func:`~reservoir.train.batched.runs_that_fit`; on the CPU also no more than
    :data:`~reservoir.train.batched.CPU_TOKENS` tokens a step), from what one run takes, measured: its trainable parameters
    (with their gradients, Adam moments, best copy and flat copies: 6 times), its frozen tensors that differ
    between seeds, and one step's activations (on CUDA the peak of a training step and of a validation batch
    over what was allocated before; on the CPU twice what autograd saves for the backward pass)."""
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
            seeded = sum(p.numel() * p.element_size() for p in batched.differing(backbone, other).values())
            del other
        train_rows = np.arange(min(cfg.batch_size, len(data.train)))
        tokens, lengths, labels = (t.to(device) for t in batch_tensors(task, data.train, train_rows))
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
            activations = 2 * batched.saved_bytes(lambda: loss.__setitem__(0, forward()))
            loss[0].backward()
            what = "twice what a step saves for its backward pass"
        trainable = sum(p.numel() * p.element_size() for p in params)
    per_run = activations + 6 * trainable + seeded
    run_tokens = cfg.batch_size * task.spec.seq_len
    fit, budget = batched.runs_that_fit(per_run, device, n_runs, run_tokens)
    cpu_rule = (
        f"; at most {batched.CPU_TOKENS} tokens a step on the CPU ({run_tokens} a run)" if not cuda else ""
    )
    log(
        f"{fit} of {n_runs} runs a batch: each takes about {per_run / 2**20:.1f} MiB ({what} "
        f"{activations / 2**20:.1f} MiB), {budget / 2**20:.0f} MiB to give on {machine.on(device)}{cpu_rule}"
    )
    return fit


class Diverged(ReservoirError):
    """A run whose loss or gradients stopped being finite. Alone it stops ``train``; in a sweep its
    learning rate is set aside (recorded as diverged, never selected) and the sweep goes on."""


def _sweep_runs(
    cfg: TrainConfig,
    lr: float,
    seeds: list[int],
    run: Callable[[float, int], dict[str, Any]],
    log: Callable[[str], None],
) -> list[dict[str, Any]] | str:
    """The runs of one learning rate, or (in a sweep) why it diverged: its other seeds are skipped."""
    out = []
    for seed in seeds:
        try:
            out.append(run(lr, seed))
        except Diverged as e:
            if len(cfg.lr) == 1:
                raise
            log(f"{e}; learning rate {lr:g} set aside, the sweep goes on")
            return str(e)
    return out


def _train_groups(
    cfg: TrainConfig,
    task: Task,
    data: Splits,
    pairs: list[tuple[float, int]],
    size: int,
    *,
    device: torch.device,
    on_step: Callable[[int], None] | None,
    log: Callable[[str], None],
    shared: dict[str, Any],
    progress: bool,
) -> dict[tuple[float, int], dict[str, Any] | Diverged | None]:
    """The runs ``pairs`` (in the order they run one after another) trained in groups of ``size``
    (:func:`train_group`; a group that cannot train together trains one after another): each run's result or
    :class:`Diverged`. Once a run diverged, the runs of its learning rate not yet started never start, as one
    after another they never would."""
    outcomes: dict[tuple[float, int], dict[str, Any] | Diverged | None] = {}
    pending = list(pairs)
    while pending:
        aside = {lr for (lr, _), o in outcomes.items() if isinstance(o, Diverged)}
        pending = [run for run in pending if run[0] not in aside]
        group, pending = pending[:size], pending[size:]
        if not group:
            break
        common = dict(on_step=on_step, log=log, shared=shared, progress=progress)
        show = group[0] == pairs[0]
        done = (
            train_group(cfg, task, data, group, device=device, show_counts=show, **common)
            if len(group) > 1
            else None
        )
        if done is None:
            done = {}
            for lr, seed in group:
                if any(isinstance(o, Diverged) for (rate, _), o in done.items() if rate == lr):
                    continue
                try:
                    done[(lr, seed)] = train_run(
                        cfg, task, data, lr=lr, seed=seed, show_counts=(lr, seed) == pairs[0], **common
                    )
                except Diverged as e:
                    done[(lr, seed)] = e
            done = {k: {**o, "batch_runs": 1} if isinstance(o, dict) else o for k, o in done.items()}
        outcomes.update(done)
    return outcomes


def _sweep_outcomes(
    cfg: TrainConfig,
    seeds: list[int],
    outcomes: dict[tuple[float, int], dict[str, Any] | Diverged | None],
    log: Callable[[str], None],
) -> tuple[dict[float, list[dict[str, Any]]], dict[float, str]]:
    """The runs of each learning rate and the rates set aside, from the runs' ``outcomes``, as
    :func:`_sweep_runs` gives them one after another: a rate whose run diverged is set aside with the message of
    its lowest diverged seed (raised where it is the only rate)."""
    runs: dict[float, list[dict[str, Any]]] = {}
    diverged: dict[float, str] = {}
    for lr in cfg.lr:
        done = []
        for seed in seeds:
            outcome = outcomes.get((lr, seed))
            if isinstance(outcome, Diverged):
                if len(cfg.lr) == 1:
                    raise outcome
                log(f"{outcome}; learning rate {lr:g} set aside, the sweep goes on")
                diverged[lr] = str(outcome)
                break
            assert isinstance(outcome, dict), "a run is dropped only after a lower seed of its rate diverged"
            done.append(outcome)
        else:
            runs[lr] = done
    return runs, diverged


def train(
    cfg: TrainConfig, *, progress: bool = True, on_step: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Train every (learning rate, seed) of ``cfg``; select the learning rate on mean validation accuracy.

    Writes one result (``mode: end-to-end``) to ``results/{task}/{backbone}/`` and returns it.
    ``test_accuracy`` is the mean over seeds at the selected learning rate, each run scored
    at its best validation step; ``test_std`` and ``runs`` give the spread and each run.

    Examples
    --------
    >>> train(TrainConfig(task="bit_xor", backbone="gpt2-random", lr=(1e-4, 1e-3), seeds=3))  # doctest: +SKIP
    """
    device = resolve_device(cfg.device)  # an absent device fails before any data is read
    if cfg.save_backbone is not None:
        check_free(cfg.save_backbone)  # before anything trains
    task = make_task(cfg.task, cfg.task_options, cfg.seed)
    if task.spec.target != "class":
        raise UsageError(
            f"reservoir train trains a classifier end to end; task {cfg.task!r} has real-valued targets: "
            f"extract its features and fit a ridge readout (reservoir extract --task {cfg.task}, then "
            "reservoir fit --head ridge)"
        )
    data = load_data(task, cfg)
    shared = settings_identity(cfg, task, data.named())
    log = lambda msg: log_line(msg, progress)  # noqa: E731
    seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))
    runs: dict[float, list[dict[str, Any]]] = {}
    trained: list[FPT] = []  # the one run's model, when its backbone is saved (config: one lr, one seed)
    keep = trained.append if cfg.save_backbone is not None else None
    diverged: dict[float, str] = {}
    pairs = [(lr, s) for lr in cfg.lr for s in seeds]
    size = group_size(cfg, task, data, device, len(pairs), log)
    if size > 1:
        outcomes = _train_groups(
            cfg,
            task,
            data,
            pairs,
            size,
            device=device,
            on_step=on_step,
            log=log,
            shared=shared,
            progress=progress,
        )
        runs, diverged = _sweep_outcomes(cfg, seeds, outcomes, log)
    for lr in cfg.lr if size == 1 else ():
        done = _sweep_runs(
            cfg,
            lr,
            seeds,
            lambda lr, s: train_run(
                cfg,
                task,
                data,
                lr=lr,
                seed=s,
                progress=progress,
                on_step=on_step,
                log=log,
                show_counts=(lr, s) == (cfg.lr[0], seeds[0]),
                shared=shared,
                on_trained=keep,
            ),
            log,
        )
        if isinstance(done, str):
            diverged[lr] = done
        else:
            runs[lr] = [{**r, "batch_runs": 1} for r in done]
    if not runs:
        raise DataError(
            f"every learning rate of the sweep diverged ({', '.join(f'{lr:g}' for lr in cfg.lr)}); "
            "sweep lower ones"
        )
    val_mean = {lr: float(np.mean([r["val_accuracy"] for r in rs])) for lr, rs in runs.items()}
    best_lr = max(runs, key=lambda lr: (val_mean[lr], -cfg.lr.index(lr)))
    chosen = runs[best_lr]
    # the result's identity adds what checkpoints may change on --resume but its numbers depend on
    identity = {
        **shared,
        "blocks": chosen[0]["blocks"],
        "lr": list(cfg.lr),
        "seeds": seeds,
        "steps": cfg.steps,
        "stop_at": cfg.stop_at,
        "backbone_fingerprints": {str(r["seed"]): r["backbone_fingerprint"] for r in chosen},
    }
    summary = seed_summary(chosen)
    result = Result(
        task=shared["task"],
        backbone=shared["backbone"],
        mode="end-to-end",
        depth=chosen[0]["blocks"],
        head="linear",
        trainable=list(cfg.trainable),
        seed=cfg.seed,
        lr=best_lr,
        identity=identity,
        config={"train": cfg.to_json(), "task_options": task.options()},
        scores={
            "metric": "accuracy",
            "test_score": summary["test_accuracy"],
            "val_score": summary["val_accuracy"],
            **summary,
            "n_train": len(data.train),
            "n_val": len(data.val),
            "n_test": len(data.test),
            "test_split": data.test_name,
        },
        seconds=float(sum(r["seconds"] / r["batch_runs"] for rs in runs.values() for r in rs)),
        machines=list(dict.fromkeys(m for rs in runs.values() for r in rs for m in r["machines"])),
        extra={
            "target": cfg.target,
            "param_counts": chosen[0]["param_counts"],
            "n_trainable": sum(r["params"] for r in chosen[0]["param_counts"] if r["trainable"]),
            "runs": [{k: v for k, v in r.items() if k != "param_counts"} for rs in runs.values() for r in rs],
            "sweep": {
                f"{lr:g}": {
                    "val_mean": val_mean[lr],
                    "val_std": sample_std([r["val_accuracy"] for r in rs]),
                    "test_mean": float(np.mean([r["test_accuracy"] for r in rs])),
                    "test_std": sample_std([r["test_accuracy"] for r in rs]),
                }
                for lr, rs in runs.items()
            }
            | {f"{lr:g}": {"diverged": why} for lr, why in diverged.items()},
        },
    ).to_json()
    if trained:
        folder = _save_trained(cfg, trained[0], result)
        log(f"saved the trained backbone to {folder}; use it with --backbone {folder}")
    result["path"] = str(write_result(result))
    return result


def _save_trained(cfg: TrainConfig, model: FPT, result: dict[str, Any]) -> Path:
    """Save the backbone of the run of ``result`` (:func:`reservoir.train.export.save_backbone`), with
    what it is in its ``reservoir.json``."""
    run = result["runs"][0]
    backbone = model.backbone
    blocks = (
        f"; only its first {run['blocks']} of {backbone.n_layers} blocks ran, the others are as loaded"
        if run["blocks"] < backbone.n_layers
        else ""
    )
    provenance = {
        "description": f"the {backbone.kind} backbone of {result['backbone']} trained end "
        f"to end on {result['task']} (groups {','.join(cfg.trainable)}; lr {run['lr']:g}, seed "
        f"{run['seed']}; {run['steps']} steps, best validation at step {run['best_step']}): test "
        f"accuracy {100 * run['test_accuracy']:.2f}% on {result['test_split']}. The backbone alone: "
        f"the input and output layers of the run are not saved{blocks}.",
        "made_by": "reservoir train --save-backbone",
        "version": __version__,
        "task": result["task"],
        "task_options": result["config"]["task_options"],
        "source_backbone": result["backbone"],
        "source_fingerprint": run["backbone_fingerprint"],
        "trainable": list(cfg.trainable),
        "lr": run["lr"],
        "seed": run["seed"],
        "blocks": run["blocks"],
        "steps": run["steps"],
        "best_step": run["best_step"],
        "stop_reason": run["stop_reason"],
        "val_accuracy": run["val_accuracy"],
        "test_accuracy": run["test_accuracy"],
        "test_split": result["test_split"],
        "n_train": result["n_train"],
        "n_val": result["n_val"],
        "n_test": result["n_test"],
        "run_identity_hash": result["identity_hash"],
        "checkpoint": run["checkpoint"],
        "config": result["config"],
    }
    if backbone.token_std is not None:
        provenance["token_embedding"] = (
            "not trained and not read by the FPT (its input layer replaces it): written "
            f"redrawn, N(0, 1) scaled to the std it had ({backbone.token_std:.6g}), so the "
            "folder is a complete model"
        )
    again = f"the run is checkpointed ({run['checkpoint']}): rerun with --resume to save it without training again"
    try:
        return save_backbone(backbone, cfg.save_backbone, provenance)
    except UsageError as e:
        raise UsageError(f"{e}; {again}") from None
    except OSError as e:
        raise DataError(
            f"cannot write the backbone folder {cfg.save_backbone} ({type(e).__name__}: {e}); free the "
            f"space or choose another folder: {again}"
        ) from None


def summary(result: dict[str, Any]) -> str:
    """Human-readable lines for stdout: parameter counts, the sweep, and the selected result."""
    lines = [format_counts(result["param_counts"]), ""]
    if len(result["sweep"]) > 1 or len(result["seeds"]) > 1:
        lines.append("| lr | val mean | val std | test mean | test std |")
        lines.append("|---|---|---|---|---|")
        for lr, s in result["sweep"].items():
            mark = " (selected)" if float(lr) == result["lr"] else ""
            lines.append(
                f"| {lr}{mark} | {100 * s['val_mean']:.2f} | {100 * s['val_std']:.2f} | "
                f"{100 * s['test_mean']:.2f} | {100 * s['test_std']:.2f} |"
            )
        lines.append("")
    spread = f" +- {100 * result['test_std']:.2f}" if len(result["seeds"]) > 1 else ""
    lines.append(
        f"{result['task']} / {result['backbone']} end-to-end, trainable {','.join(result['trainable'])}, "
        f"lr {result['lr']:g}, seeds {result['seeds']}: test {100 * result['test_accuracy']:.2f}%{spread} "
        f"(val {100 * result['val_accuracy']:.2f}%), best steps {result['best_step']}, "
        f"steps run {result['steps']}, steps to target {result['steps_to_target']}"
    )
    if result["config"]["train"].get("save_backbone"):
        lines.append(f"backbone saved to {result['config']['train']['save_backbone']}")
    lines.append(result["path"])
    return "\n".join(lines)

"""End-to-end FPT training: input layer -> backbone (mostly frozen) -> output layer on the readout tokens.

The FPT of Lu et al. (2021, section 2.2) trains a small parameter set of a frozen
transformer: the input layer (orthogonal initialisation, gain 1.41), the positional
embeddings, the layer norms and the output layer; ``trainable`` picks the groups
(``attn`` and ``ff`` unfreeze the blocks themselves). Bit tasks predict each bit of
each readout token; classification tasks one label from the last real token.

Differences from the official code, following the critique of Rothermel et al. (2021),
whose conclusions flip with the learning rate:

- a seeded validation split (the task's ``val`` split when it has one, else a fraction
  of train) selects the step (early stopping) and, in a sweep, the learning rate;
- test accuracy is computed once, on the whole test split (no dropped last batch, no
  random test batches), with the parameters of the best validation step;
- every source of randomness is seeded and checkpointed (model, optimiser, torch,
  numpy and python RNG states, step); the data order is a function of ``(seed, epoch)``,
  so a resumed run continues exactly where the checkpoint left it.

A run stops at ``steps``, after ``patience`` validation passes without improvement, or
when validation accuracy reaches 100% (it cannot improve further).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from reservoir import __version__
from reservoir.backbones import Backbone, load_backbone
from reservoir.config import TRAIN_GROUPS, TrainConfig, results_dir
from reservoir.input_layer import make_input_layer
from reservoir.report import write_result
from reservoir.tasks import DataError, SplitData, Task, TaskSpec, get_task

#: TrainConfig fields that may change between a checkpoint and its ``--resume``
RESUMABLE_CHANGES = ("steps", "resume", "checkpoint_every", "checkpoint_dir", "compile", "eval_batch_size",
                     "lr", "seeds", "data_dir")
CHECKPOINT_FORMAT = 1


class FPT(nn.Module):
    """Input layer -> dropout -> backbone truncated to ``depth`` blocks -> linear output per readout token.

    ``forward(tokens, lengths)`` returns logits ``(B, n_readout, outputs_per_token, n_classes)``.
    """

    def __init__(self, spec: TaskSpec, backbone: Backbone, *, depth: int, seed: int, dropout: float = 0.1):
        super().__init__()
        backbone.check_depths([depth])
        self.spec, self.depth = spec, depth
        self.input_layer = make_input_layer(spec, backbone.d_model, seed)
        self.input_dropout = nn.Dropout(dropout)
        self.backbone = backbone
        for module in backbone.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            self.out = nn.Linear(backbone.d_model, spec.outputs_per_token * spec.n_classes)

    def readout(self, lengths: torch.Tensor) -> torch.Tensor:
        """Positions of the last ``n_readout`` real tokens of each row ``(B, R)``."""
        r = self.spec.n_readout
        return lengths[:, None] - r + torch.arange(r, device=lengths.device)[None, :]

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.input_dropout(self.input_layer(tokens))
        h = self.backbone.states(x, lengths, [self.depth], self.readout(lengths))[0]
        logits = self.out(h)
        return logits.view(*h.shape[:2], self.spec.outputs_per_token, self.spec.n_classes)

    def groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by group: ``input``, the backbone's groups (``pos``, ``ln``, ...), ``out``."""
        return {"input": list(self.input_layer.parameters()), **self.backbone.param_groups(),
                "out": list(self.out.parameters())}


def select_trainable(model: FPT, trainable: Sequence[str]) -> tuple[list[nn.Parameter], list[str]]:
    """Freeze everything, then unfreeze the named groups (explicit parameter lists, no name matching).

    Returns the trainable parameters (in a fixed order) and notes about requested groups
    this backbone does not have.
    """
    groups = model.groups()
    unknown = [g for g in trainable if g not in groups and g not in TRAIN_GROUPS]
    if unknown:
        raise ValueError(f"unknown trainable group {unknown[0]!r}; choose from {sorted(set(groups) | set(TRAIN_GROUPS))}")
    for p in model.parameters():
        p.requires_grad_(False)
    params, seen, notes = [], set(), []
    for name in trainable:
        if not groups.get(name):
            notes.append(f"{model.backbone.family or 'this backbone'} has no {name!r} parameters; skipped")
            continue
        for p in groups[name]:
            if id(p) not in seen:
                seen.add(id(p))
                p.requires_grad_(True)
                params.append(p)
    if not params:
        raise ValueError(f"trainable groups {list(trainable)} select no parameters of this model; "
                         f"choose from {sorted(g for g, ps in groups.items() if ps)}")
    return params, notes


def _shape_terms(params: Sequence[nn.Parameter]) -> str:
    shapes = Counter("x".join(map(str, p.shape)) for p in params)
    return " + ".join(f"{n} x {s}" if n > 1 else s for s, n in shapes.items())


def _blocks(backbone: Backbone) -> nn.ModuleList | None:
    """The backbone's list of blocks: its first ModuleList child with ``n_layers`` entries."""
    for child in backbone.children():
        if isinstance(child, nn.ModuleList) and len(child) == backbone.n_layers:
            return child
    return None


def param_counts(model: FPT) -> list[dict[str, Any]]:
    """One row per group: parameter count and its arithmetic (``12 x (4 x 768) + 2 x 768 = 38,400``).

    Blocks are assumed identical, so the per-block term is read from the first block.
    """
    blocks = _blocks(model.backbone)
    in_blocks = {id(p) for p in blocks.parameters()} if blocks is not None else set()
    first = {id(p) for p in blocks[0].parameters()} if blocks is not None and len(blocks) else set()
    rows = []
    for name, params in model.groups().items():
        total = sum(p.numel() for p in params)
        per_block = [p for p in params if id(p) in first]
        outside = [p for p in params if id(p) not in in_blocks]
        terms = []
        if per_block:
            terms.append(f"{len(blocks)} x ({_shape_terms(per_block)})")
        if outside:
            terms.append(_shape_terms(outside))
        rows.append({"group": name, "params": total, "arithmetic": " + ".join(terms) or "0",
                     "trainable": bool(params) and all(p.requires_grad for p in params)})
    return rows


def format_counts(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["group"]) for r in rows)
    lines = [f"{r['group']:{width}s} {'train ' if r['trainable'] else 'frozen'} {r['params']:>12,d}  "
             f"= {r['arithmetic']}" for r in rows]
    n_train = sum(r["params"] for r in rows if r["trainable"])
    lines.append(f"{'':{width}s} trainable {n_train:,d} of {sum(r['params'] for r in rows):,d}")
    return "\n".join(lines)


# ---------------------------------------------------------------- data


@dataclasses.dataclass
class Splits:
    train: SplitData
    val: SplitData
    test: SplitData


def _take(d: SplitData, idx: np.ndarray) -> SplitData:
    return SplitData(d.inputs[idx], d.labels[idx], d.lengths[idx])


def load_data(task: Task, cfg: TrainConfig) -> Splits:
    """Train, validation and test splits; validation is the task's ``val`` split or a seeded share of train."""
    data_dir = Path(cfg.data_dir)
    train = task.load("train", data_dir, cfg.limit)
    test = task.load("test", data_dir, cfg.limit)
    if "val" in task.spec.splits:
        val = task.load("val", data_dir, cfg.limit)
    else:
        from sklearn.model_selection import train_test_split

        y = train.labels
        strat = y if y.ndim == 1 and len(np.unique(y)) > 1 and np.bincount(y).min() >= 2 else None
        n_val = max(1, int(round(cfg.val_fraction * len(train))))
        if len(train) - n_val < 1:
            raise DataError(f"train split has {len(train)} examples: too few to hold out a validation split; "
                            "raise --limit or the task's n_train")
        fit_idx, val_idx = train_test_split(np.arange(len(train)), test_size=n_val, random_state=cfg.seed,
                                            stratify=strat)
        train, val = _take(train, np.sort(fit_idx)), _take(train, np.sort(val_idx))
    for name, d in (("train", train), ("val", val), ("test", test)):
        if len(d) == 0:
            raise DataError(f"the {name} split of task {task.name!r} is empty; check --data-dir and --limit")
    return Splits(train, val, test)


def batch_tensors(task: Task, d: SplitData, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = torch.from_numpy(np.ascontiguousarray(task.encode(d.inputs[rows])))
    lengths = torch.from_numpy(np.asarray(d.lengths[rows], dtype=np.int64))
    labels = torch.from_numpy(np.asarray(d.labels[rows], dtype=np.int64))
    return tokens, lengths, labels


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The shuffled row order of one epoch: a function of (seed, epoch) only, so resume needs just the step."""
    return np.random.default_rng([seed, 7, epoch]).permutation(n)


# ---------------------------------------------------------------- loop


def autocast(dtype: str):
    if dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loss_and_correct(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = logits.float().reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    return nn.functional.cross_entropy(flat, y), (flat.argmax(-1) == y).sum()


def evaluate(forward: Callable, task: Task, d: SplitData, batch_size: int, dtype: str) -> float:
    """Accuracy over every output (every bit for bit tasks) of the whole split."""
    correct, total = 0, 0
    with torch.inference_mode(), autocast(dtype):
        for start in range(0, len(d), batch_size):
            tokens, lengths, labels = batch_tensors(task, d, np.arange(start, min(start + batch_size, len(d))))
            _, c = loss_and_correct(forward(tokens, lengths), labels)
            correct, total = correct + int(c), total + labels.numel()
    return correct / total


def train_step(forward: Callable, params: list[nn.Parameter], opt: torch.optim.Optimizer,
               batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], dtype: str, grad_clip: float) -> float:
    """One Adam step on one batch (the model must be in train mode); returns the loss."""
    tokens, lengths, labels = batch
    with autocast(dtype):
        logits = forward(tokens, lengths)
    loss, _ = loss_and_correct(logits, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    return float(loss.detach())


@dataclasses.dataclass
class RunState:
    """Everything a run needs to continue exactly (saved in checkpoints)."""

    step: int = 0
    best_val: float = -1.0
    best_step: int = 0
    best_params: list[torch.Tensor] | None = None
    steps_to_target: int | None = None
    evals_since_best: int = 0
    done: bool = False
    stop_reason: str = ""
    seconds: float = 0.0
    pending_losses: list[float] = dataclasses.field(default_factory=list)
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)


def run_name(cfg: TrainConfig, depth: int, lr: float, seed: int) -> str:
    return f"{'-'.join(cfg.trainable)}_depth{depth}_lr{lr:g}_seed{seed}"


def identity(cfg: TrainConfig, depth: int, lr: float, seed: int) -> dict[str, Any]:
    d = {k: v for k, v in cfg.to_json().items() if k not in RESUMABLE_CHANGES}
    return {**d, "depth": depth, "run_lr": lr, "run_seed": seed}


def _fingerprint(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def save_checkpoint(path: Path, model: FPT, params: list[nn.Parameter], opt: torch.optim.Optimizer,
                    state: RunState, ident: dict[str, Any], fingerprint: float) -> None:
    """Write atomically: a temp file in the same folder, fsync, then ``os.replace``."""
    obj = {
        "format": CHECKPOINT_FORMAT, "version": __version__, "identity": ident, "fingerprint": fingerprint,
        "params": [p.detach().clone() for p in params], "optimizer": opt.state_dict(),
        "state": dataclasses.asdict(state),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def load_checkpoint(path: Path, params: list[nn.Parameter], opt: torch.optim.Optimizer, ident: dict[str, Any],
                    fingerprint: float) -> RunState:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise DataError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); delete it to start over") from None
    if obj.get("format") != CHECKPOINT_FORMAT:
        raise DataError(f"checkpoint {path} has format {obj.get('format')!r}, expected {CHECKPOINT_FORMAT}; "
                        "delete it to start over")
    diff = sorted(k for k in set(ident) | set(obj["identity"]) if ident.get(k) != obj["identity"].get(k))
    if diff:
        shown = ", ".join(f"{k}={obj['identity'].get(k)!r} (now {ident.get(k)!r})" for k in diff)
        raise ValueError(f"checkpoint {path} was written with different settings: {shown}; "
                         "rerun with the same options to resume it, or drop --resume to start over")
    if not math.isclose(obj["fingerprint"], fingerprint, rel_tol=1e-9, abs_tol=1e-6):
        raise DataError(f"the frozen model differs from the one checkpoint {path} was trained on "
                        f"(parameter sum {obj['fingerprint']!r}, now {fingerprint!r}); delete it to start over")
    with torch.no_grad():
        for p, saved in zip(params, obj["params"], strict=True):
            p.copy_(saved)
    opt.load_state_dict(obj["optimizer"])
    torch.set_rng_state(obj["rng"]["torch"])
    np.random.set_state(obj["rng"]["numpy"])
    random.setstate(obj["rng"]["python"])
    return RunState(**obj["state"])


def compiled(model: FPT, enabled: bool, dynamic: bool) -> Callable:
    """The training forward, compiled when ``enabled`` (evaluation runs eager: one graph, no recompiles)."""
    if not enabled:
        return model
    try:
        return torch.compile(model, dynamic=dynamic)
    except Exception as e:  # noqa: BLE001 - compilation is an optimisation, eager always works
        print(f"torch.compile unavailable ({e}); running eager", file=sys.stderr)
        return model


def train_run(cfg: TrainConfig, task: Task, data: Splits, *, lr: float, seed: int, progress: bool = True,
              on_step: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None,
              show_counts: bool = False) -> dict[str, Any]:
    """Train one (learning rate, seed); returns its scores and bookkeeping.

    ``on_step(step)`` is called after every step (after any checkpoint of that step); an
    exception it raises interrupts the run as a kill would.
    """
    if log is None:
        log = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    backbone = load_backbone(cfg.backbone, seed)
    depth = backbone.n_layers if cfg.depth is None else cfg.depth
    model = FPT(task.spec, backbone, depth=depth, seed=seed, dropout=cfg.dropout)
    params, notes = select_trainable(model, cfg.trainable)
    for note in notes:
        log(note)
    counts = param_counts(model)
    if show_counts:
        log(format_counts(counts))
    opt = torch.optim.Adam(params, lr=lr)
    ident, fingerprint = identity(cfg, depth, lr, seed), _fingerprint(model)
    ckpt = cfg.checkpoint_folder / f"{run_name(cfg, depth, lr, seed)}.pt"
    tag = f"[lr={lr:g} seed={seed}]"
    state = RunState()
    if cfg.resume and ckpt.exists():
        state = load_checkpoint(ckpt, params, opt, ident, fingerprint)
        log(f"{tag} resumed {ckpt} at step {state.step}" + (" (finished)" if state.done or state.step >= cfg.steps else ""))
    elif ckpt.exists():
        log(f"{tag} starting over; {ckpt} will be replaced (pass --resume to continue it)")
    forward = compiled(model, cfg.compile, task.spec.variable_length)

    def checkpoint():
        save_checkpoint(ckpt, model, params, opt, state, ident, fingerprint)

    n, bs = len(data.train), cfg.batch_size
    per_epoch = max(1, n // bs)  # full batches only (each epoch drops a different remainder): one compiled shape
    order_epoch, order = -1, None
    losses = state.pending_losses
    start, start_step = time.perf_counter(), state.step
    while not state.done and state.step < cfg.steps:
        epoch, i = divmod(state.step, per_epoch)
        if epoch != order_epoch:
            order_epoch, order = epoch, epoch_order(seed, epoch, n)
        model.train()
        batch = batch_tensors(task, data.train, order[i * bs:(i + 1) * bs])
        try:
            losses.append(train_step(forward, params, opt, batch, cfg.dtype, cfg.grad_clip))
        except Exception as e:  # noqa: BLE001 - a compiled graph that fails falls back to eager
            if forward is model:
                raise
            log(f"compiled forward failed ({type(e).__name__}: {e}); falling back to eager")
            forward = model
            losses.append(train_step(forward, params, opt, batch, cfg.dtype, cfg.grad_clip))
        state.step += 1
        if not math.isfinite(losses[-1]):
            raise DataError(f"{tag} the training loss became {losses[-1]} at step {state.step}; lower --lr "
                            f"(now {lr:g}) or keep --grad-clip above 0")
        if state.step % cfg.eval_every == 0 or state.step >= cfg.steps:
            model.eval()
            val = evaluate(model, task, data.val, cfg.eval_batch_size, cfg.dtype)
            state.history.append({"step": state.step, "loss": float(np.mean(losses)), "val_accuracy": val})
            losses.clear()
            if val > state.best_val:
                state.best_val, state.best_step, state.evals_since_best = val, state.step, 0
                state.best_params = [p.detach().clone() for p in params]
            else:
                state.evals_since_best += 1
            if cfg.target is not None and state.steps_to_target is None and val >= cfg.target:
                state.steps_to_target = state.step
            if val >= 1.0:
                state.done, state.stop_reason = True, "validation accuracy reached 100%"
            elif cfg.patience and state.evals_since_best >= cfg.patience:
                state.done, state.stop_reason = True, f"no improvement in {cfg.patience} validation passes"
            elapsed = state.seconds + time.perf_counter() - start
            rate = (state.step - start_step) / max(time.perf_counter() - start, 1e-9)
            log(f"{tag} step {state.step}/{cfg.steps}: loss {state.history[-1]['loss']:.4f}, "
                f"val {100 * val:.2f}% (best {100 * state.best_val:.2f}% at {state.best_step}), "
                f"{rate:.2f} steps/s, {elapsed:.0f}s")
        if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 and not state.done:
            state.seconds += time.perf_counter() - start
            start, start_step = time.perf_counter(), state.step
            checkpoint()
        if on_step is not None:
            on_step(state.step)
    stop_reason = state.stop_reason if state.done else f"reached --steps {cfg.steps}"  # more --steps continue it
    assert state.best_params is not None, "the last step always runs a validation pass"
    state.seconds += time.perf_counter() - start
    checkpoint()
    with torch.no_grad():
        for p, best in zip(params, state.best_params):
            p.copy_(best)
    model.eval()
    test = evaluate(model, task, data.test, cfg.eval_batch_size, cfg.dtype)
    log(f"{tag} {stop_reason}; best val {100 * state.best_val:.2f}% at step {state.best_step}, "
        f"test {100 * test:.2f}%")
    return {"lr": lr, "seed": seed, "depth": depth, "test_accuracy": test, "val_accuracy": state.best_val,
            "best_step": state.best_step, "steps": state.step, "steps_to_target": state.steps_to_target,
            "stop_reason": stop_reason, "seconds": state.seconds, "history": state.history,
            "param_counts": counts, "checkpoint": str(ckpt)}


def _std(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def train(cfg: TrainConfig, *, progress: bool = True, on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Train every (learning rate, seed) of ``cfg``; select the learning rate on mean validation accuracy.

    Writes one result (``mode: end-to-end``) to ``results/{task}/{backbone}/`` and returns it.
    ``test_accuracy`` is the mean over seeds at the selected learning rate, each run scored
    at its best validation step; ``test_std`` and ``runs`` give the spread and each run.

    Examples
    --------
    >>> train(TrainConfig(task="bit_xor", backbone="gpt2-random", lr=(1e-4, 1e-3), seeds=3))  # doctest: +SKIP
    """
    _check(cfg)
    task = get_task(cfg.task, **cfg.task_options)
    data = load_data(task, cfg)
    log = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)
    seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))
    runs: dict[float, list[dict[str, Any]]] = {}
    for lr in cfg.lr:
        runs[lr] = [train_run(cfg, task, data, lr=lr, seed=s, progress=progress, on_step=on_step, log=log,
                              show_counts=(lr, s) == (cfg.lr[0], seeds[0])) for s in seeds]
    val_mean = {lr: float(np.mean([r["val_accuracy"] for r in rs])) for lr, rs in runs.items()}
    best_lr = max(cfg.lr, key=lambda lr: (val_mean[lr], -cfg.lr.index(lr)))
    chosen = runs[best_lr]
    tests = [r["test_accuracy"] for r in chosen]
    to_target = [r["steps_to_target"] for r in chosen]
    reached = [s for s in to_target if s is not None]
    result = {
        "task": cfg.task, "backbone": cfg.backbone, "mode": "end-to-end", "depth": chosen[0]["depth"],
        "head": "linear", "trainable": list(cfg.trainable), "seed": cfg.seed, "version": __version__,
        "test_accuracy": float(np.mean(tests)), "test_std": _std(tests),
        "test_min": float(min(tests)), "test_max": float(max(tests)),
        "val_accuracy": val_mean[best_lr], "val_std": _std([r["val_accuracy"] for r in chosen]),
        "n_train": len(data.train), "n_val": len(data.val), "n_test": len(data.test),
        "seconds": float(sum(r["seconds"] for rs in runs.values() for r in rs)),
        "lr": best_lr, "seeds": seeds, "steps": [r["steps"] for r in chosen],
        "best_step": [r["best_step"] for r in chosen],
        "target": cfg.target, "steps_to_target": to_target,
        "steps_to_target_mean": float(np.mean(reached)) if reached and len(reached) == len(chosen) else None,
        "param_counts": chosen[0]["param_counts"],
        "n_trainable": sum(r["params"] for r in chosen[0]["param_counts"] if r["trainable"]),
        "runs": [{k: v for k, v in r.items() if k != "param_counts"} for rs in runs.values() for r in rs],
        "sweep": {f"{lr:g}": {"val_mean": val_mean[lr], "val_std": _std([r["val_accuracy"] for r in rs]),
                              "test_mean": float(np.mean([r["test_accuracy"] for r in rs])),
                              "test_std": _std([r["test_accuracy"] for r in rs])} for lr, rs in runs.items()},
        "config": {"train": cfg.to_json(), "task_options": task.options()},
    }
    result["path"] = str(write_result(result, results_dir(cfg.task, cfg.backbone)))
    return result


def _check(cfg: TrainConfig) -> None:
    """Reject option values the CLI cannot (library callers build configs directly)."""
    checks = [
        (cfg.lr and all(lr > 0 for lr in cfg.lr), "lr", "positive numbers", list(cfg.lr)),
        (cfg.seeds >= 1, "seeds", ">= 1", cfg.seeds),
        (cfg.steps >= 1, "steps", ">= 1", cfg.steps),
        (cfg.batch_size >= 1, "batch_size", ">= 1", cfg.batch_size),
        (cfg.eval_every >= 1, "eval_every", ">= 1", cfg.eval_every),
        (cfg.dtype in ("float32", "bfloat16"), "dtype", "float32 or bfloat16", cfg.dtype),
        (0 <= cfg.dropout < 1, "dropout", "in [0, 1)", cfg.dropout),
        (cfg.target is None or 0 < cfg.target <= 1, "target", "in (0, 1]", cfg.target),
        (len(set(cfg.lr)) == len(cfg.lr), "lr", "distinct values", list(cfg.lr)),
        (bool(cfg.trainable), "trainable", "at least one group", list(cfg.trainable)),
    ]
    for ok, name, rule, value in checks:
        if not ok:
            raise ValueError(f"The {name!r} parameter of train must be {rule}. Got {value!r} instead.")


def summary(result: dict[str, Any]) -> str:
    """Human-readable lines for stdout: parameter counts, the sweep, and the selected result."""
    lines = [format_counts(result["param_counts"]), ""]
    if len(result["sweep"]) > 1 or len(result["seeds"]) > 1:
        lines.append("| lr | val mean | val std | test mean | test std |")
        lines.append("|---|---|---|---|---|")
        for lr, s in result["sweep"].items():
            mark = " (selected)" if float(lr) == result["lr"] else ""
            lines.append(f"| {lr}{mark} | {100 * s['val_mean']:.2f} | {100 * s['val_std']:.2f} | "
                         f"{100 * s['test_mean']:.2f} | {100 * s['test_std']:.2f} |")
        lines.append("")
    spread = f" +- {100 * result['test_std']:.2f}" if len(result["seeds"]) > 1 else ""
    lines.append(f"{result['task']} / {result['backbone']} end-to-end, trainable {','.join(result['trainable'])}, "
                 f"lr {result['lr']:g}, seeds {result['seeds']}: test {100 * result['test_accuracy']:.2f}%{spread} "
                 f"(val {100 * result['val_accuracy']:.2f}%), best steps {result['best_step']}, "
                 f"steps run {result['steps']}, steps to target {result['steps_to_target']}")
    lines.append(result["path"])
    return "\n".join(lines)

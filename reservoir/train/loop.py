"""The sweep of end-to-end FPT training: every (learning rate, seed) of a config trained (:func:`train`), the
learning rate selected, the result written (and shown: :func:`summary`).

Unlike the official code (following the critique of Rothermel et al. 2021, whose conclusions flip with the
learning rate): a seeded validation split selects the step and, in a sweep, the learning rate; test accuracy is
computed once, on the whole test split, at the best validation step; every source of randomness draws from a
named stream of the run's seed (:mod:`reservoir.train.seeds`) and is checkpointed, so a resumed run continues
exactly where its checkpoint left it. Losses stay on the device until a validation pass or checkpoint reads
them, and a step whose gradients are not finite stops its run (:mod:`reservoir.train.step`). With
``save_backbone``, the trained backbone is saved as a backbone folder (:mod:`reservoir.train.export`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reservoir import __version__
from reservoir.config import TrainConfig
from reservoir.errors import DataError, UsageError
from reservoir.model.devices import resolve_device
from reservoir.paths import home
from reservoir.progress import log as log_line
from reservoir.results import TIMED_OUT, Result, best_rate, seed_summary, stopped_by, sweep_of, write_result
from reservoir.tasks import Task, make_task, unread_splits
from reservoir.train.checkpoint import settings_identity
from reservoir.train.data import Splits, load_data
from reservoir.train.export import check_free, save_backbone
from reservoir.train.group import group_size, train_group
from reservoir.train.model import FPT, format_counts
from reservoir.train.run import train_run
from reservoir.train.step import Diverged


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
    on_trained: Callable[[FPT], None] | None,
) -> dict[tuple[float, int], dict[str, Any] | Diverged | None]:
    """The runs ``pairs`` trained in groups of ``size`` (:func:`train_group`; a group of one, or one that cannot
    train together, trains one after another: :func:`train_run`): each run's result, :class:`Diverged` or
    ``None`` (dropped). A rate whose run diverged is set aside, as it is found: the runs of it not yet started
    never start; where it is the only rate, its :class:`Diverged` is raised."""
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
                        cfg,
                        task,
                        data,
                        lr=lr,
                        seed=seed,
                        show_counts=(lr, seed) == pairs[0],
                        on_trained=on_trained,
                        **common,
                    )
                except Diverged as e:
                    done[(lr, seed)] = e
            done = {k: {**o, "batch_runs": 1} if isinstance(o, dict) else o for k, o in done.items()}
        for (lr, _), outcome in done.items():  # the first diverged run of a rate (by seed) sets it aside
            if isinstance(outcome, Diverged) and lr not in aside:
                if len(cfg.lr) == 1:
                    raise outcome
                log(f"{outcome}; learning rate {lr:g} set aside, the sweep goes on")
                aside.add(lr)
        outcomes.update(done)
    return outcomes


def train(
    cfg: TrainConfig, *, progress: bool = True, on_step: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Train every (learning rate, seed) of ``cfg``; select the learning rate on mean validation accuracy.

    Writes one result (``mode: end-to-end``) to ``results/{task}/{backbone}/`` and returns it:
    ``test_accuracy`` is the mean over seeds at the selected learning rate, ``test_std`` the spread.

    Examples
    --------
    >>> train(TrainConfig(task="bit_xor", backbone="gpt2-random", lr=(1e-4, 1e-3), seeds=3))  # doctest: +SKIP
    """
    device = resolve_device(cfg.device)  # an absent device fails before any data is read
    if cfg.save_backbone is not None:
        # before anything trains
        check_free(cfg.save_backbone, (cfg.checkpoint_folder, home() / "results"))
    task = make_task(cfg.task, cfg.task_options, cfg.seed)
    if task.spec.target != "class":
        raise UsageError(
            f"reservoir train trains a classifier end to end; task {cfg.task!r} has real-valued targets: "
            f"extract its features and fit a ridge readout (reservoir extract --task {cfg.task}, then "
            "reservoir fit --head ridge)"
        )
    data = load_data(task, cfg)
    shared = settings_identity(cfg, task, data.named(), data.left_out)
    log = lambda msg: log_line(msg, progress)  # noqa: E731
    unread = unread_splits(task.spec.splits)
    if unread:
        log(f"{task.name}: {unread}")
    seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))
    trained: list[FPT] = []  # the one run's model, when its backbone is saved (config: one lr, one seed)
    keep = trained.append if cfg.save_backbone is not None else None
    pairs = [(lr, s) for lr in cfg.lr for s in seeds]
    size = group_size(cfg, task, data, device, len(pairs), log)
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
        on_trained=keep,
    )
    runs: dict[float, list[dict[str, Any]]] = {}
    diverged: dict[float, str] = {}
    for lr in cfg.lr:
        done = [outcomes.get((lr, seed)) for seed in seeds]
        why = next((o for o in done if isinstance(o, Diverged)), None)
        if why is not None:
            diverged[lr] = str(why)
        else:
            assert all(isinstance(o, dict) for o in done), (
                "a run is dropped only after a lower seed of its rate diverged"
            )
            runs[lr] = done
    if not runs:
        raise DataError(
            f"every learning rate of the sweep diverged ({', '.join(f'{lr:g}' for lr in cfg.lr)}); "
            "sweep lower ones"
        )
    val_mean = {lr: float(np.mean([r["val_accuracy"] for r in rs])) for lr, rs in runs.items()}
    best_lr = best_rate(val_mean, list(cfg.lr))
    chosen = runs[best_lr]
    # the result's identity adds what checkpoints may change on --resume but its numbers depend on
    identity = {
        **shared,
        "blocks": chosen[0]["blocks"],
        "lr": list(cfg.lr),
        "seeds": seeds,
        "steps": cfg.steps,
        "stop_at": cfg.stop_at,
        # a run cut short by --max-time is not the whole run: its result is kept apart (a later, longer one is not)
        **(
            {"max_time": cfg.max_time}
            if any(stopped_by(r["stop_reason"], TIMED_OUT) for rs in runs.values() for r in rs)
            else {}
        ),
        "backbone_fingerprints": {str(r["seed"]): r["backbone_fingerprint"] for r in chosen},
        **(
            {"matched_stds": {str(r["seed"]): r["matched_std"] for r in chosen}}
            if "matched_std" in chosen[0]
            else {}
        ),
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
            "sweep": sweep_of(runs, diverged),
        },
    ).to_json()
    if trained:
        folder = _save_trained(cfg, trained[0], result)
        log(f"saved the trained backbone to {folder}; use it with --backbone {folder}")
    result["path"] = str(write_result(result))
    return result


def _save_trained(cfg: TrainConfig, model: FPT, result: dict[str, Any]) -> Path:
    """Save the backbone of the run of ``result`` (:func:`reservoir.train.export.save_backbone`)."""
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
            if "diverged" in s:
                lines.append(f"| {lr} (diverged: {s['diverged']}) | | | | |")
                continue
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

"""Checkpoints of a training run: named and checked by the run's identity, written atomically.

A checkpoint holds the trainable parameters, the optimiser, the run state (step, best validation and
its parameters, history) and the state of every torch generator the run draws from
(:func:`reservoir.train.seeds.generator_states`), so ``--resume`` continues exactly. Its file name
carries the run's readable name and the digest of its identity; ``--resume`` with other settings is
refused, naming the fields that differ. It is read with ``torch.load(weights_only=True)``, so nothing in
it runs code.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reservoir import __version__
from reservoir.config import TrainConfig
from reservoir.errors import DataError, IdentityError
from reservoir.identity import data_fingerprint, differences, digest, task_label
from reservoir.model.backbones import label as backbone_label
from reservoir.results import atomic_write
from reservoir.tasks.pickles import refused_by_torch, torch_load_reason
from reservoir.train.seeds import generator_states, set_generator_states

CPU = torch.device("cpu")

#: version of the checkpoint layout (fused Adam's state; the CUDA generator of a CUDA run)
CHECKPOINT_FORMAT = 3
#: TrainConfig fields that may change between a checkpoint and its ``--resume`` (they change no step taken)
RESUMABLE_CHANGES = (
    "steps",
    "stop_at",
    "max_time",
    "resume",
    "checkpoint_every",
    "checkpoint_dir",
    "compile",
    "device",
    "eval_batch_size",
    "lr",
    "seeds",
    "data_dir",
    "save_backbone",
    "concurrent_runs",
)


@dataclasses.dataclass
class RunState:
    """Everything a run needs to continue exactly (saved in checkpoints)."""

    step: int = 0
    best_val: float = -1.0
    best_step: int = 0
    best_params: list[torch.Tensor] | None = None
    steps_to_target: int | None = None
    best_val_loss: float = float("inf")
    #: the validation accuracy of the last progress in accuracy (``run.ACC_PROGRESS`` counts from there)
    progress_val: float = -1.0
    #: validation passes since the last progress (``run.advance``)
    evals_since_best: int = 0
    done: bool = False
    stop_reason: str = ""
    seconds: float = 0.0
    pending_losses: list[float] = dataclasses.field(default_factory=list)
    #: the compute dtypes the run has taken steps in, in order (``--dtype auto`` resolves per machine)
    dtypes: list[str] = dataclasses.field(default_factory=list)
    #: the machines the run has taken steps on, in order (:func:`reservoir.runtime.machine.describe`)
    machines: list[str] = dataclasses.field(default_factory=list)
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    #: the state a validation pass off the ``eval_every`` schedule changed (the last step's, or ``--max-time``'s
    #: cut), as it was before: a run continued past that step takes it back, since an uninterrupted run makes no
    #: such pass (:meth:`reservoir.train.run.Member.resume`)
    before_last_pass: dict[str, Any] | None = None


#: the version of the tasks' augmentation a run's identity records (:meth:`reservoir.tasks.Task.augment`)
AUGMENTATION = 1


def augments(cfg: TrainConfig, task) -> bool:
    """Whether a run augments its training examples: ``--augment`` on a task with an augmentation."""
    return cfg.augment and bool(task.augmentation)


def settings_identity(cfg: TrainConfig, task, data, left_out: list[int] = ()) -> dict[str, Any]:
    """The part of a training identity shared by every run of a sweep: task, data (with the classes a
    ``--limit`` sample left out) and settings."""
    settings = {
        k: v
        for k, v in cfg.to_json().items()
        if k not in RESUMABLE_CHANGES and k not in ("task", "backbone", "task_options", "seed", "augment")
    }
    # recorded where they apply, so runs of other tasks keep their identity
    if augments(cfg, task):
        settings["augment"] = AUGMENTATION
    if task.spec.token_kind == "ids" and cfg.dropout:  # an id embedding passes only the backbone's dropout
        settings["embedding_dropout"] = "backbone"
    subset = {"subset": task.subset(cfg.limit, cfg.seed, left_out)} if cfg.limit is not None else {}
    return {
        "format": CHECKPOINT_FORMAT,
        "task": task_label(cfg.task),
        "task_options": task.identity_options(),
        "data": data_fingerprint(data),
        **subset,
        "backbone": backbone_label(cfg.backbone),
        **settings,
    }


def run_checkpoint(
    cfg: TrainConfig, shared: dict[str, Any], *, weights: dict[str, Any], blocks: int, lr: float, seed: int
) -> tuple[dict[str, Any], str, Path]:
    """The identity of one (learning rate, seed) run of a sweep whose :func:`settings_identity` is ``shared``
    and whose backbone's weights are recorded as ``weights`` (its ``backbone_fingerprint``, and ``matched_std``
    where the input layer is scaled to it), its readable name, and the path of its checkpoint (the name and
    the identity's digest)."""
    identity = {
        **shared,
        **weights,
        "blocks": blocks,
        "run_lr": lr,
        "run_seed": seed,
    }
    name = f"{'-'.join(cfg.trainable)}_blocks{blocks}_lr{lr:g}_seed{seed}"
    return identity, name, Path(cfg.checkpoint_folder) / f"{name}-{digest(identity)}.pt"


def check_resumable(path: Path, name: str, identity: dict[str, Any]) -> None:
    """``--resume`` without a checkpoint of this identity, beside one of another: refuse, naming the differences."""
    if path.exists():
        return
    others = sorted(p for p in path.parent.glob(f"{name}-*.pt") if p != path)
    for other in others:
        try:
            old = torch.load(other, map_location="cpu", weights_only=True)["identity"]
        except Exception:  # noqa: BLE001 - an unreadable neighbour says nothing about this run
            continue
        if not isinstance(old, dict):
            continue
        if old.get("format") != CHECKPOINT_FORMAT:
            raise IdentityError(
                f"checkpoint {other} was written by another version of reservoir (checkpoint format "
                f"{old.get('format')!r}; this version reads format {CHECKPOINT_FORMAT}) and cannot be "
                "resumed by it; drop --resume to start the run over (that file is left as it is)"
            )
        raise IdentityError(
            f"checkpoint {other} was written with other settings: {'; '.join(differences(old, identity))}; "
            "rerun with the same options to resume it, or drop --resume to start a new run"
        )


def save_checkpoint(
    path: Path,
    params: list[nn.Parameter],
    opt: torch.optim.Optimizer,
    state: RunState,
    identity: dict[str, Any],
    device: torch.device = CPU,
    rng: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write atomically; ``device`` is the run's, whose generator is saved beside the CPU's; ``rng``, when
    given, holds the run's own generator states (a run of a group)."""
    obj = {
        "format": CHECKPOINT_FORMAT,
        "version": __version__,
        "identity": identity,
        "params": [p.detach().clone() for p in params],
        "optimizer": opt.state_dict(),
        "state": dataclasses.asdict(state),
        "rng": generator_states(device) if rng is None else rng,
    }
    atomic_write(path, lambda f: torch.save(obj, f))


def read_checkpoint(path: Path, fix: str) -> dict[str, Any]:
    """The contents of a checkpoint of this format; DataError naming ``path`` and ``fix`` otherwise."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
        fmt = obj.get("format")
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        if refused := refused_by_torch(e):
            raise DataError(
                f"checkpoint {path} holds {refused}, which a checkpoint of reservoir never holds; refused "
                f"without running it (checkpoints are read as tensors and plain data only); {fix}"
            ) from None
        raise DataError(f"checkpoint {path} is unreadable ({torch_load_reason(e)}); {fix}") from None
    if type(fmt) is not int or fmt != CHECKPOINT_FORMAT:
        raise DataError(f"checkpoint {path} has format {fmt!r}, expected {CHECKPOINT_FORMAT}; {fix}")
    wrong = misshapen(obj)
    if wrong:
        raise DataError(f"checkpoint {path} does not hold what `reservoir train` writes ({wrong}); {fix}")
    return obj


#: the types of the identity fields a checkpoint's readers use
IDENTITY_TYPES = {
    "task": str,
    "backbone": str,
    "backbone_fingerprint": str,
    "input_scale": str,
    "task_options": dict,
    "trainable": list,
    "blocks": int,
    "run_seed": int,
}


def misshapen(obj: dict[str, Any]) -> str:
    """What in ``obj`` is not the shape :func:`save_checkpoint` writes (``""``: nothing)."""

    def tensors(value: Any) -> bool:
        return isinstance(value, list) and all(
            isinstance(t, torch.Tensor) and t.is_floating_point() for t in value
        )

    kinds = {"identity": dict, "params": list, "optimizer": dict, "state": dict, "rng": dict}
    for key, kind in kinds.items():
        if not isinstance(obj.get(key), kind):
            return f"{key!r} is {type(obj.get(key)).__name__}, not {kind.__name__}"
    identity, state = obj["identity"], obj["state"]
    for key, kind in IDENTITY_TYPES.items():
        if not isinstance(identity.get(key), kind) or isinstance(identity.get(key), bool):
            return f"its identity's {key!r} is {identity.get(key)!r}"
    if identity["blocks"] < 0 or not 0 <= identity["run_seed"] < 2**32:
        return f"its identity's blocks {identity['blocks']} or seed {identity['run_seed']} is out of range"
    if not tensors(obj["params"]) or not (
        state.get("best_params") is None or tensors(state.get("best_params"))
    ):
        return "its trainable parameters are not a list of float tensors"
    before = state.get("before_last_pass")
    if before is not None and not (
        isinstance(before, dict)
        and isinstance(before.get("history"), int)
        and (before.get("best_params") is None or tensors(before["best_params"]))
    ):
        return "its state before the last validation pass is not a dict of the run state's values"
    fields = {f.name: f for f in dataclasses.fields(RunState)}
    if (
        not set(fields) - {"before_last_pass"} <= set(state) <= set(fields)
    ):  # without it: written before it was
        return f"its run state has the fields {sorted(state)[:6]}, not {sorted(fields)[:6]}..."
    defaults = RunState()
    for name, value in state.items():
        default = getattr(defaults, name)
        if (
            name != "best_params"
            and default is not None
            and not isinstance(value, type(default))
            and not (isinstance(default, float) and isinstance(value, int))
        ):
            return f"its run state's {name!r} is {type(value).__name__}, not {type(default).__name__}"
    entry = {"step": int, "loss": float, "val_accuracy": float, "val_loss": float}
    for h in state["history"]:
        if not isinstance(h, dict) or any(
            not isinstance(h.get(k), (kind, int)) or isinstance(h.get(k), bool) for k, kind in entry.items()
        ):
            return f"its validation history holds {str(h)[:60]}, not a pass's step, loss and accuracies"
    if state["history"] and state.get("best_params") is None:
        return "it has validation passes but no best parameters"
    rng = obj["rng"]
    if (
        not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 for t in rng.values())
        or "torch" not in rng
    ):
        return "its generator states are not uint8 tensors"
    if not isinstance(obj["optimizer"].get("state"), dict) or not isinstance(
        obj["optimizer"].get("param_groups"), list
    ):
        return "its optimiser state is not an optimiser's state_dict"
    return ""


def load_checkpoint(
    path: Path,
    params: list[nn.Parameter],
    opt: torch.optim.Optimizer,
    identity: dict[str, Any],
    device: torch.device = CPU,
    generators: dict[str, torch.Tensor] | None = None,
) -> RunState:
    """Restore parameters, optimiser and generators (into ``generators`` when given) of a run from ``path``;
    refuse a checkpoint of another identity."""
    obj = read_checkpoint(path, "delete it to start over")
    diff = differences(obj["identity"], identity)
    if diff:
        raise IdentityError(
            f"checkpoint {path} was written with other settings: {'; '.join(diff)}; rerun with the "
            "same options to resume it, or drop --resume to start over"
        )
    shapes = [tuple(t.shape) for t in obj["params"]]
    if shapes != [tuple(p.shape) for p in params]:  # an earlier version listed blocks past --blocks
        raise DataError(
            f"checkpoint {path} holds {len(shapes)} trainable tensors of other shapes than this run's "
            f"{len(params)} (it was written by an earlier version of the project); delete it to start over"
        )
    with torch.no_grad():
        for p, saved in zip(params, obj["params"], strict=True):
            p.copy_(saved)
    try:
        opt.load_state_dict(obj["optimizer"])
        if generators is None:
            set_generator_states(obj["rng"], device)
        else:
            generators.update(obj["rng"])
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as e:
        raise DataError(
            f"checkpoint {path} holds an optimiser or generator state this run cannot take "
            f"({type(e).__name__}: {str(e)[:200]}); delete it to start over"
        ) from None
    return RunState(**obj["state"])

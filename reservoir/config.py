"""Paths and run configurations: one place for each default.

Working folders default to ``./data``, ``./features/{task}/{backbone}.h5`` and
``./results/{task}/{backbone}/``, all under ``$RESERVOIR_HOME`` when it is set.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def home() -> Path:
    return Path(os.environ.get("RESERVOIR_HOME", "."))


def default_data_dir() -> Path:
    return home() / "data"


def slug(name: str) -> str:
    """A file-name-safe name for a task or backbone (a folder path gives its last part)."""
    for prefix in ("hf:", "file:"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if os.sep in name or Path(name).exists():
        name = Path(name.rstrip(os.sep)).stem or name
    return re.sub(r"[^A-Za-z0-9_.-]+", "--", name)


def features_path(task: str, backbone: str) -> Path:
    return home() / "features" / slug(task) / f"{slug(backbone)}.h5"


def results_dir(task: str, backbone: str) -> Path:
    return home() / "results" / slug(task) / slug(backbone)


def parse_depths(text: str, n_layers: int) -> list[int]:
    """``"all"`` -> 0..n_layers; ``"0,3,6"`` -> [0, 3, 6] (sorted, unique, range-checked)."""
    if text == "all":
        return list(range(n_layers + 1))
    try:
        depths = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise ValueError(f"depths {text!r} must be 'all' or comma-separated integers like 0,3,6") from None
    bad = [d for d in depths if not 0 <= d <= n_layers]
    if not depths or bad:
        raise ValueError(f"depths {text!r} must lie in [0, {n_layers}] for this backbone")
    return depths


@dataclass(frozen=True)
class ExtractConfig:
    """One extraction run.

    Parameters
    ----------
    task, backbone : registered names (or ``file:PATH`` / a model folder).
    task_options : the task's own options (``--task-opt key=value``).
    split : a split name or ``"all"``.
    limit : keep the first ``limit`` examples of each split.
    seed : seeds the input layer, random backbones and generated data.
    batch_size : examples per forward pass; ``None``: about 16,384 tokens a batch, more for
        backbones that ask (``reservoir.extract.auto_batch_size``).
    dtype : compute dtype of the backbone: ``"auto"`` is bfloat16 where the CPU multiplies
        bf16 natively, else float32 (features are stored as float32).
    depths : ``"all"`` or comma-separated depths.
    readout : ``"last"`` reads the last real token; ``"padded"`` pads every example to the
        task's length and reads the last position, reproducing the official FPT code.
    compile : compile the forward with torch.compile (falls back to eager on failure);
        ``None`` compiles runs big enough to repay the compile time (``reservoir.extract.AUTO_COMPILE_TOKENS``).
    """

    task: str
    backbone: str
    task_options: dict[str, Any] = field(default_factory=dict)
    split: str = "all"
    limit: int | None = None
    seed: int = 0
    batch_size: int | None = None
    dtype: str = "auto"
    depths: str = "all"
    readout: str = "last"
    compile: bool | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    out: Path | None = None

    @property
    def out_path(self) -> Path:
        return Path(self.out) if self.out else features_path(self.task, self.backbone)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["data_dir"], d["out"] = str(self.data_dir), str(self.out_path)
        return d


@dataclass(frozen=True)
class FitConfig:
    """One ``fit`` run over a feature file.

    Parameters
    ----------
    task, backbone : name the feature file and results folder.
    features : the HDF5 file (default ``features/{task}/{backbone}.h5``).
    depth : ``"all"`` or comma-separated depths.
    head : ``logreg``, ``ridge`` or ``torch``.
    val_fraction : share of train carved out (seeded) to choose regularisation.
    seed : seeds the validation split and the torch head.
    """

    task: str
    backbone: str
    features: Path | None = None
    depth: str = "all"
    head: str = "logreg"
    val_fraction: float = 0.1
    seed: int = 0

    @property
    def features_path(self) -> Path:
        return Path(self.features) if self.features else features_path(self.task, self.backbone)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["features"] = str(self.features_path)
        return d


#: FPT parameter groups a ``train`` run can unfreeze; the paper's default is input, pos, ln, out
TRAIN_GROUPS = ("input", "pos", "ln", "attn", "ff", "out")
PAPER_TRAINABLE = ("input", "pos", "ln", "out")


@dataclass(frozen=True)
class TrainConfig:
    """One end-to-end ``train`` run (or a sweep over learning rates and seeds).

    Parameters
    ----------
    task, backbone : registered names (or ``file:PATH`` / a model folder).
    task_options : the task's own options (``--task-opt key=value``).
    trainable : parameter groups to train (input, pos, ln, attn, ff, out, or a backbone's own group).
    lr : Adam learning rates; more than one makes a sweep selected on validation accuracy.
    seeds : runs per learning rate, with seeds ``seed, seed+1, ...``.
    seed : first seed; seeds the input layer, random backbones, output layer, dropout and data order.
    steps : maximum gradient steps per run.
    batch_size : training examples per step.
    eval_batch_size : examples per forward pass when scoring validation and test.
    eval_every : steps between validation passes (model selection and early stopping).
    patience : validation passes without improvement before stopping (0: never stop early).
    target : validation accuracy whose first crossing is reported as ``steps_to_target``.
    val_fraction : share of train held out (seeded by ``seed``) when the task has no val split.
    limit : keep the first ``limit`` examples of each split.
    depth : blocks of the backbone to run (default: all).
    dtype : ``bfloat16`` runs the forward under CPU autocast; parameters stay float32.
    compile : torch.compile the model (falls back to eager on failure).
    grad_clip : maximum gradient norm.
    dropout : dropout after the input layer and in the backbone's own dropout layers.
    checkpoint_every : steps between checkpoints (0: only at the end).
    resume : continue from the run's checkpoint when one exists.
    """

    task: str
    backbone: str
    task_options: dict[str, Any] = field(default_factory=dict)
    trainable: tuple[str, ...] = PAPER_TRAINABLE
    lr: tuple[float, ...] = (1e-3,)
    seeds: int = 1
    seed: int = 0
    steps: int = 10000
    batch_size: int = 32
    eval_batch_size: int = 256
    eval_every: int = 100
    patience: int = 10
    target: float | None = None
    val_fraction: float = 0.1
    limit: int | None = None
    depth: int | None = None
    dtype: str = "float32"
    compile: bool = False
    grad_clip: float = 1.0
    dropout: float = 0.1
    checkpoint_every: int = 500
    resume: bool = False
    data_dir: Path = field(default_factory=default_data_dir)
    checkpoint_dir: Path | None = None

    @property
    def checkpoint_folder(self) -> Path:
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return home() / "checkpoints" / slug(self.task) / slug(self.backbone)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["trainable"], d["lr"] = list(self.trainable), list(self.lr)
        d["data_dir"], d["checkpoint_dir"] = str(self.data_dir), str(self.checkpoint_folder)
        return d

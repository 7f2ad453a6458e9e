"""Run configurations: one declaration per setting, one place for each default (working folders:
:mod:`reservoir.paths`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import UsageError
from reservoir.paths import default_data_dir, home, slug
from reservoir.registry import ENGINES, HEADS
from reservoir.settings import (
    AllOf,
    Config,
    Distinct,
    Interval,
    Matches,
    NotEmpty,
    OneOf,
    Suffix,
    comma_list,
    key_values,
    selecting,
    setting,
)

#: choices of the options that take one (the CLI's click.Choice lists come from the fields declaring
#: them, :func:`choices`); engines and heads are read from their registries
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "int8", "int8-static")
READOUT_CHOICES = ("last", "mean", "all", "padded")
#: dtypes the frozen weights are read in (``--load-dtype``) and the features stored in (``--store-dtype``)
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
#: named input scales; a positive number is also accepted (:func:`parse_input_scale`)
INPUT_SCALE_CHOICES = ("paper", "matched")
#: ``--device`` values: auto, cpu, mps, cuda or cuda:N
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"
#: ``--limit``, as extract and train say it
LIMIT_HELP = (
    "Take N examples of each split: a sample drawn by --seed, stratified by class for class targets (random "
    "otherwise), rows in source order; generated tasks take their first N draws. A train split lacking a class "
    "another split holds is refused."
)
#: the data folder's default, as help texts say it
DATA_DIR_TEXT = "$RESERVOIR_HOME/data or ./data"


def parse_input_scale(value: Any) -> str:
    """``--input-scale``: ``paper``, ``matched`` or a positive number (returned in its canonical
    spelling, ``"0.02"``, so equal scales give equal run identities)."""
    text = str(value).strip().lower()
    if text in INPUT_SCALE_CHOICES:
        return text
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not (number > 0 and number < float("inf")):
        raise UsageError(
            f"--input-scale must be one of {list(INPUT_SCALE_CHOICES)} or a positive number (the std of "
            f"the input layer's outputs). Got {value!r} instead."
        )
    return repr(number)


# ---------------------------------------------------------------- depths: one parser, one validator


def parse_depths(value: Any) -> str | tuple[int, ...]:
    """Syntax of a depth selection, checked while options are parsed.

    ``"all"``; ``"0,3,6"``; an int; or a sequence of ints. Negative depths count from the
    deepest available one (``-1``: the last block). Returns ``"all"`` or a tuple of ints.

    >>> parse_depths("6,0,-1")
    (6, 0, -1)
    """
    if isinstance(value, str):
        text = value.strip()
        if text == "all":
            return "all"
        try:
            depths = tuple(int(p) for p in text.split(","))
        except ValueError:
            depths = ()
        if not depths:
            raise UsageError(f"depths {value!r} must be 'all' or comma-separated integers like 0,3,6")
        return depths
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    try:
        items = list(value)
    except TypeError:
        items = [value]
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in items):
        raise UsageError(f"depths {value!r} must be 'all', an integer or a list of integers")
    depths = tuple(int(d) for d in items)
    if not depths:
        raise UsageError("depths names no depth; give 'all' or at least one integer")
    return depths


def select_depths(value: Any, available: Sequence[int], where: str) -> list[int]:
    """Resolve a depth selection against the depths ``available`` (``range(n_layers + 1)`` of a
    backbone, or the depths a feature file holds): sorted, unique, each one available.

    ``where`` names the thing in the error, e.g. ``"in backbone lstm"``.

    >>> select_depths("0,-1", range(13), "in gpt2-random")
    [0, 12]
    """
    available = sorted(int(d) for d in available)
    parsed = parse_depths(value)
    if parsed == "all":
        return available
    top = available[-1]
    bad = [d for d in parsed if (top + 1 + d if d < 0 else d) not in available]
    depths = sorted({top + 1 + d if d < 0 else d for d in parsed})
    if bad:
        contiguous = available == list(range(top + 1))
        allowed = f"in [0, {top}]" if contiguous else f"from {available}"
        given = value if isinstance(value, str) else ",".join(map(str, parsed))
        raise UsageError(
            f"depths {given!r}: depth {bad[0]} is not available {where}; choose depths "
            f"{allowed} (negative counts from the last), or 'all'"
        )
    return depths


#: ``--device``: auto, cpu, mps, cuda or cuda:N (whether the device is present is checked where it
#: is used, :func:`reservoir.model.devices.resolve_device`)
DEVICE = Matches(DEVICE_PATTERN, "auto, cpu, cuda, cuda:N or mps")
#: counts of at least one (rows, examples, workers)
POSITIVE = Interval(1, None, integer=True)


#: the largest seed: scikit-learn's ``random_state`` and numpy's legacy seeding take 32-bit seeds
MAX_SEED = 2**32 - 1
#: the largest learning rate ``train`` takes (Adam's steps are about lr: beyond it no run learns, and past
#: float32's range torch's optimiser fails to even store it)
MAX_LR = 100
#: a run's seed
SEED = Interval(0, MAX_SEED, integer=True)
#: the share of train held out for validation
VAL_FRACTION = Interval(0.01, 0.5)


# ---------------------------------------------------------------- settings shared by several commands


def task_setting(default: Any = dataclasses.MISSING, *, default_text: str | None = None) -> Any:
    """``--task``: a registered task or ``file:PATH`` (checked against the registry by ``reservoir.api``)."""
    return setting(default, help="Registered task or file:PATH.", short="-t", default_text=default_text)


def backbone_setting(default: Any = "gpt2-random", *, default_text: str | None = None) -> Any:
    """``--backbone``: a registered backbone, a ``save_pretrained`` folder or ``hf:ID``."""
    return setting(
        default,
        help="Registered backbone, a save_pretrained folder, or hf:ID.",
        short="-b",
        default_text=default_text,
    )


def task_options_setting(help: str = "A task option (repeatable).", selects: str | None = None) -> Any:
    """``--task-opt KEY=VALUE`` (repeatable): the task's own options."""
    return setting(
        factory=dict,
        help=help,
        parse=key_values,
        selects=selects,
        option="--task-opt",
        metavar="KEY=VALUE",
        multiple=True,
    )


def device_setting(
    help: str = "Where the backbone runs; auto: a CUDA GPU when present, else the CPU.",
) -> Any:
    """``--device``: auto, cpu, cuda, cuda:N or mps."""
    return setting("auto", DEVICE, help=help, metavar="auto|cpu|cuda[:N]|mps")


def data_dir_setting(
    default: Any = dataclasses.MISSING, help: str = "Data folder", default_text: str = DATA_DIR_TEXT
) -> Any:
    """``--data-dir``: the data folder."""
    factory = default_data_dir if default is dataclasses.MISSING else dataclasses.MISSING
    return setting(default, help=f"{help}.", factory=factory, path="dir", default_text=default_text)


def input_scale_setting(help: str) -> Any:
    """``--input-scale``: ``paper``, ``matched`` or a positive std."""
    return setting("paper", help=help, parse=parse_input_scale, metavar="paper|matched|STD")


def depths_setting(help: str, default_text: str = "all") -> Any:
    """``--depths``: ``all`` or comma-separated depths (one parser, :func:`parse_depths`)."""
    return setting(None, help=help, parse=parse_depths, default_text=default_text)


# ---------------------------------------------------------------- the commands' configs


@dataclass(frozen=True)
class ExtractConfig(Config):
    """One extraction run (``reservoir extract``; :func:`reservoir.api.extract`). Each field's help is the
    option's; ``depths`` ``None`` is all of them; the default ``out`` is named by the run's identity
    (``features/TASK/BACKBONE/DTYPE-seedS[-limitN][-scale-X]-HASH.h5``, :mod:`reservoir.identity`)."""

    command = "extract"

    task: str = task_setting()
    backbone: str = backbone_setting()
    split: str = setting("all", help="A split name or 'all'.")
    limit: int | None = setting(None, None, POSITIVE, help=LIMIT_HELP)
    seed: int = setting(
        0,
        SEED,
        help="Seeds the input layer, random backbones and generated data (bit tasks, generated ListOps; "
        "--task-opt seed=N seeds the data alone).",
    )
    input_scale: str = input_scale_setting(
        "Scale of the frozen input layer: paper (orthogonal gain 1.41, N(0, 1) id embeddings), matched "
        "(the std of the backbone's own token embeddings) or an output std."
    )
    batch_size: int | None = setting(
        None,
        None,
        POSITIVE,
        help="Examples per forward pass.",
        default_text="about 16,384 tokens a batch; 32,768 for LSTMs",
    )
    load_dtype: str = setting(
        "float32",
        OneOf(FLOAT_DTYPES),
        help="Dtype the frozen weights are read and kept in: bfloat16 or float16 take half of float32's "
        "memory (the backbone then computes in it, on PyTorch; with another --dtype it computes in that one "
        "from the rounded weights).",
    )
    store_dtype: str = setting(
        "float32",
        OneOf(FLOAT_DTYPES),
        help="Dtype the features are stored in: bfloat16 or float16 take half of float32's disk and write "
        "time; bfloat16 holds a bfloat16 run's features exactly, float16 holds values up to 65,504.",
    )
    dtype: str = setting(
        "auto",
        OneOf(DTYPE_CHOICES),
        help="Backbone compute dtype; auto: the float dtype this machine multiplies fastest (measured), or "
        "int8 on OpenVINO where int8 is measured faster here and its probe accuracy was measured within "
        "0.5 points of float32 on this CPU kind (stderr says which, and why); float32 for real-valued "
        "targets; int8 (int8 weights, activations quantized per token at run time) and int8-static "
        "(activation scales calibrated too) run on OpenVINO, both centring on the first rows' position means. Features are stored as --store-dtype.",
    )
    engine: str = setting(
        "auto",
        OneOf(ENGINES, first=("auto",)),
        help="What runs the forward: torch, openvino (pip install 'reservoir[openvino]'; CPU), onnxruntime "
        "(pip install 'reservoir[onnx]'; CPU), or auto: on the CPU, for runs long enough to repay "
        "converting, the installed engine measured fastest for this model and CPU, else PyTorch.",
    )
    depths: str | tuple[int, ...] | None = depths_setting(
        "'all' or comma-separated depths, e.g. 0,3,6 (negative: from the last block)."
    )
    readout: str = setting(
        "last",
        OneOf(READOUT_CHOICES),
        help="'last' real token; 'mean' of every real token's state; 'all' positions (tasks of fixed "
        "length); or 'padded' (pad to full length, read the last position: the official code).",
    )
    compile: bool | None = setting(
        None,
        help="torch.compile the forward (eager if compiling fails).",
        flag="pair",
        default_text="when the eager rate measured on the first batch and the last compile of the same "
        "shapes say it pays; sharded runs: 300,000+ tokens",
    )
    device: str = device_setting()
    workers: int | None = setting(
        None,
        None,
        POSITIVE,
        help="Extract shards on a local dask cluster of N worker processes (joined into one file).",
    )
    scheduler: str | None = setting(
        None,
        help="Extract shards on the workers of a running dask scheduler (tcp://HOST:PORT).",
        metavar="ADDRESS",
    )
    shard_rows: int = setting(
        8192,
        POSITIVE,
        help="Rows of a shard (rounded to the batch size); also the block within which lengths are bucketed.",
    )
    task_options: dict[str, Any] = task_options_setting()
    data_dir: Path = data_dir_setting()
    out: Path | None = setting(
        None,
        help="Feature file.",
        path="file",
        default_text="features/TASK/BACKBONE/DTYPE-seedS-HASH.h5, named by the run's identity; -limitN and "
        "-scale-X come before the hash when set",
    )
    force: bool = setting(
        False,
        help="Extract again even when a complete file of this run exists (e.g. one that failed "
        "verification); it is moved aside to FILE.old, never overwritten.",
        flag="single",
    )

    def combined(self) -> None:
        object.__setattr__(self, "depths", "all" if self.depths is None else self.depths)
        if self.workers and self.scheduler:
            raise UsageError(
                f"give --workers ({self.workers}) or --scheduler ({self.scheduler!r}), not both: "
                "--scheduler uses the workers of a running cluster"
            )
        if self.engine != "auto" and self.dtype != "auto":  # before any data or model is read
            refused = ENGINES.factory(self.engine).refuses(self.dtype)
            if refused is not None:
                raise UsageError(refused)
        if self.load_dtype != "float32":
            if self.engine != "auto" and ENGINES.factory(self.engine).converts:
                raise UsageError(
                    f"--load-dtype {self.load_dtype} keeps the weights in {self.load_dtype}, which only the "
                    f"PyTorch engine computes with; drop --engine {self.engine} (or pass --engine torch), or "
                    "load the weights in float32"
                )
            if self.dtype.startswith("int8"):
                raise UsageError(
                    f"--dtype {self.dtype} quantizes float32 weights on OpenVINO; load them in float32 (drop "
                    "--load-dtype)"
                )


@dataclass(frozen=True)
class FitConfig(Config):
    """One ``fit`` run over a feature file (:func:`reservoir.api.fit`). ``task`` and ``backbone`` given with
    ``features`` must match the file's; without ``features``, the one complete file extracted for them
    under ``features/`` is read (several: name one). Results already written for the same data are
    reused."""

    command = "fit"

    task: str | None = task_setting(None, default_text="the file's")
    backbone: str | None = backbone_setting(None, default_text="the file's")
    features: Path | None = setting(
        None,
        help="Feature file.",
        path="file",
        default_text="the one extracted for --task and --backbone under features/",
    )
    depths: str | tuple[int, ...] | None = depths_setting(
        "'all' or comma-separated depths (negative: from the last stored one)."
    )
    depth: int | None = setting(
        None,
        help="One depth: the single-depth form of --depths (--depth 6 is --depths 6); not with --depths.",
    )
    readout: str | None = setting(
        None,
        None,
        OneOf(READOUT_CHOICES),
        help="The --readout the features were extracted with (picks the file among a task's extractions).",
        selects="readout",
        default_text="any",
    )
    task_options: dict[str, Any] = task_options_setting(
        "A --task-opt the features were extracted with (repeatable; picks the file).", selects="task_options"
    )
    limit: int | None = setting(
        None,
        None,
        POSITIVE,
        help="The --limit the features were extracted with (picks the file).",
        selects="limit",
        default_text="any",
    )
    extract_seed: int | None = setting(
        None,
        None,
        SEED,
        help="The --seed the features were extracted with (picks the file; --seed seeds the validation split).",
        selects="seed",
        default_text="any",
    )
    head: str | None = setting(
        None, None, OneOf(HEADS), help="Linear head.", default_text="logreg; ridge for real-valued targets"
    )
    val_fraction: float = setting(
        0.1,
        VAL_FRACTION,
        help="Share of train held out to choose regularisation (when the file has no val split).",
    )
    seed: int = setting(0, SEED, help="Seeds the validation split and the torch head.")
    device: str = device_setting("Where the torch head trains; auto: a CUDA GPU when present, else the CPU.")
    memory_mb: int = setting(
        1024,
        POSITIVE,
        help="Train features of a depth above this many MiB are streamed from the file instead of loaded "
        "(logreg: L-BFGS over streamed gradients; torch: block-wise mini-batches; ridge always streams).",
    )
    baselines: bool = setting(
        True,
        help="Also fit the baselines of the same data with the same head: majority class, the raw input, "
        "random tanh features of the same width, the task's rules (ListOps: first operator); reused when "
        "already written.",
        flag="pair",
    )
    data_dir: Path | None = data_dir_setting(
        None, "Data folder the baselines read the task's data from", "the one the extraction read"
    )

    @property
    def extraction(self) -> dict[str, Any]:
        """What the features must have been extracted with, as their identity records it (the options
        given, each field declared with ``selects``: the file to read is the one extraction that matches)."""
        given = {key: getattr(self, name) for key, name in selecting(type(self)).items()}
        return {key: value for key, value in given.items() if value not in (None, {})}

    def combined(self) -> None:
        if self.features is None and self.task is None:
            raise UsageError(
                "fit needs --features FILE, or --task (and --backbone) to find the extracted file"
            )
        if self.depth is not None:
            if self.depths is not None:
                raise UsageError(
                    f"--depth {self.depth} and --depths are the same option (one depth, a list); give one"
                )
            object.__setattr__(self, "depths", parse_depths(self.depth))
            object.__setattr__(self, "depth", None)  # said once, as depths (a config rebuilt by replace)
        object.__setattr__(self, "depths", "all" if self.depths is None else self.depths)


#: FPT parameter groups a ``train`` run can unfreeze; the paper's default is input, pos, ln, out
TRAIN_GROUPS = ("input", "pos", "ln", "attn", "ff", "out")
#: compute dtypes of training (bfloat16 runs the forward under autocast); auto picks one of them per machine
TRAIN_DTYPES = ("float32", "bfloat16")
TRAIN_DTYPE_CHOICES = ("auto", *TRAIN_DTYPES)
PAPER_TRAINABLE = ("input", "pos", "ln", "out")


def _seeds_runs(cfg: Any) -> str:
    return f" (it seeds {cfg.seeds} runs)" if cfg.seeds > 1 else ""


@dataclass(frozen=True)
class TrainConfig(Config):
    """One end-to-end ``train`` run, or a sweep over learning rates, seeds and runs trained together
    (:func:`reservoir.api.train`). Seeds are ``seed, seed+1, ...``; each seeds the input layer, random
    backbones, the output layer, dropout and data order. Generated data is drawn once, by the first seed
    (or the task's own ``seed`` option), and every run of the sweep reads the same data. Progress for ``patience`` is a validation accuracy 0.1 points above the last
    progress, a validation loss 0.1% below its lowest, or a training loss still falling
    (:func:`reservoir.train.run.advance`). ``max_time`` and ``concurrent_runs`` are not part of a run's
    identity; ``auto`` dtype is, so a run resumed on another CPU continues in that CPU's dtype."""

    command = "train"

    task: str = task_setting()
    backbone: str = backbone_setting()
    trainable: tuple[str, ...] = setting(
        PAPER_TRAINABLE,
        NotEmpty("at least one group"),
        help="Groups to train, from input,pos,ln,attn,ff,out (or a backbone's own group, e.g. lstm).",
        parse=comma_list(str),
    )
    lr: tuple[float, ...] = setting(
        (1e-3,),
        AllOf(
            (
                Interval(0, MAX_LR, closed="right", each=True),
                Distinct(lambda lr: f"{lr:g}", "to 6 significant digits (they name runs and checkpoints)"),
            )
        ),
        help="Adam learning rate(s); a list is a sweep selected on validation accuracy.",
        parse=comma_list(float),
    )
    seeds: int = setting(1, POSITIVE, help="Runs per learning rate.")
    seed: int = setting(
        0,
        Interval(0, lambda cfg: MAX_SEED - cfg.seeds + 1, note=_seeds_runs, integer=True),
        help="First seed (runs use seed, seed+1, ...); also seeds generated data (bit tasks, generated "
        "ListOps).",
    )
    steps: int = setting(20000, POSITIVE, help="Maximum gradient steps.")
    batch_size: int = setting(32, POSITIVE, help="Examples per step.")
    eval_batch_size: int = setting(
        256, POSITIVE, help="Examples per forward pass when scoring validation and test.", option=False
    )
    eval_every: int = setting(100, POSITIVE, help="Steps between validation passes.")
    patience: int = setting(
        10,
        Interval(0, None),
        help="Validation passes without progress (a validation accuracy 0.1 points above the last progress, "
        "a validation loss 0.1% below its lowest, or a training loss still falling over the last 20 "
        "passes) before stopping (0: never).",
    )
    target: float | None = setting(
        None,
        None,
        Interval(0, 1, closed="right"),
        help="Validation accuracy whose first crossing is reported as steps_to_target.",
    )
    stop_at: float = setting(
        1.0,
        Interval(0, 1, closed="right"),
        help="Validation accuracy at which a run counts as solved and stops (it may change on --resume).",
    )
    max_time: float | None = setting(
        None,
        None,
        Interval(0, None, closed="neither"),
        help="Seconds of training after which a run stops, validates and reports test at its best step "
        "(per run, counted across --resume; more time on --resume continues it). Wall-clock seconds: runs "
        "trained together (--concurrent-runs) each count their shared steps' time whole, so on a busy "
        "processor they take fewer steps each than alone (the result records batch_runs).",
    )
    val_fraction: float = setting(
        0.1,
        VAL_FRACTION,
        help="Share of train held out for validation (when the task has no val split).",
    )
    limit: int | None = setting(None, None, POSITIVE, help=LIMIT_HELP)
    blocks: int | None = setting(
        None, None, Interval(0, None), help="Blocks of the backbone to run.", default_text="all"
    )
    input_scale: str = input_scale_setting(
        "Scale of the input layer's initialisation (as extract --input-scale)."
    )
    dtype: str = setting(
        "auto",
        OneOf(TRAIN_DTYPE_CHOICES),
        help="bfloat16 runs the forward under autocast (parameters and Adam stay float32); auto: the faster "
        "of the two on this machine, measured (as extract --dtype auto).",
    )
    compile: bool = setting(False, help="torch.compile the model.", flag="pair")
    device: str = device_setting()
    grad_clip: float = setting(1.0, Interval(0, None), help="Maximum gradient norm (0: no clipping).")
    dropout: float = setting(0.1, Interval(0, 1, closed="left"), help="Dropout.")
    augment: bool = setting(
        True,
        help="Augment the training images as the FPT code does (cifar10, cifar10_lra: a crop of the image padded "
        "by 4 pixels, a horizontal flip, a rotation of up to 20 degrees); other tasks have no augmentation.",
        flag="pair",
    )
    checkpoint_every: int = setting(
        500, Interval(0, None), help="Steps between checkpoints (0: only at the end)."
    )
    checkpoint_dir: Path | None = setting(
        None, help="Checkpoint folder.", path="dir", default_text="checkpoints/TASK/BACKBONE"
    )
    resume: bool = setting(
        False, help="Continue each run from its checkpoint when there is one.", flag="single"
    )
    concurrent_runs: int | None = setting(
        None,
        None,
        POSITIVE,
        help="Runs (learning rates x seeds) trained together in one process, the frozen backbone held once "
        "(1: one after another).",
        default_text="as many as fit the device's memory",
    )
    save_backbone: Path | None = setting(
        None,
        help="After the run, save its trained backbone (best validation step; not the input and output "
        "layers) as a save_pretrained folder that --backbone DIR loads. One --lr and --seeds 1; DIR must "
        "not exist or be empty.",
        path="any",
        metavar="DIR",
    )
    task_options: dict[str, Any] = task_options_setting()
    data_dir: Path = data_dir_setting()

    def combined(self) -> None:
        if self.save_backbone is not None and (len(self.lr) > 1 or self.seeds > 1):
            given = [
                f"--lr {','.join(f'{lr:g}' for lr in self.lr)}" if len(self.lr) > 1 else "",
                f"--seeds {self.seeds}" if self.seeds > 1 else "",
            ]
            raise UsageError(
                f"--save-backbone saves the backbone of one run; {' and '.join(g for g in given if g)} "
                "make several. Give one --lr and --seeds 1: run the sweep without --save-backbone, then "
                "rerun with the learning rate it selected and --resume --save-backbone DIR, which saves "
                "that learning rate's first-seed run from its checkpoint without training it again"
            )

    @property
    def checkpoint_folder(self) -> Path:
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return home() / "checkpoints" / slug(self.task) / slug(self.backbone)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "checkpoint_dir": str(self.checkpoint_folder)}


@dataclass(frozen=True, kw_only=True)
class AttentionConfig(Config):
    """One ``reservoir attention`` plot: one block's attention for one example (seed and input scale as
    :class:`ExtractConfig`)."""

    command = "attention"

    task: str = task_setting()
    backbone: str = backbone_setting()
    layer: int = setting(0, Interval(0, None), help="Block whose attention to show (from 0).")
    example: int = setting(0, Interval(0, None), help="Row of the split.")
    split: str = setting("test", help="Split the example comes from.")
    seed: int = setting(
        0, SEED, help="Seeds the input layer, a random backbone and generated data (as extract --seed)."
    )
    input_scale: str = input_scale_setting("Scale of the frozen input layer (as extract --input-scale).")
    heads: tuple[int, ...] | None = setting(
        None,
        None,
        Interval(0, None, each=True),
        help="Heads to show, e.g. 0,3,5.",
        parse=comma_list(int),
        default_text="all",
    )
    checkpoint: Path | None = setting(
        None,
        help="A `reservoir train` checkpoint (.pt) of this task and backbone: show the attention with its "
        "trained input layer, positions and norms (its seed and input scale are used).",
        path="file",
        exists=True,
    )
    data_dir: Path | None = data_dir_setting(None)
    out: Path = setting(dataclasses.MISSING, Suffix(".png"), help="PNG file to write.", path="file")


def check_export_out(out: Path, format: str) -> None:
    """Refuse an ``--out`` named as another kind of file than an export of ``format`` writes (UsageError)."""
    if format == "parquet" and Path(out).suffix.lower() not in ("", ".parquet", ".pq"):
        raise UsageError(
            f"--out {out} names a {Path(out).suffix} file, and export writes Parquet; name it .parquet (or use "
            "--format datasets for a folder)"
        )


@dataclass(frozen=True)
class ExportConfig(Config):
    """One ``reservoir export``: a feature file as Parquet or a ``datasets`` folder."""

    command = "export"

    features: Path = setting(help="The feature file.", path="file", argument=True)
    out: Path = setting(
        help="Where to write: a .parquet file, or a folder for --format datasets.", path="any"
    )
    format: str = setting(
        "parquet",
        OneOf(("parquet", "datasets")),
        help="Parquet (one file), or a Hugging Face datasets folder (datasets.load_from_disk reads it).",
    )
    depths: str | tuple[int, ...] | None = depths_setting(
        "Comma-separated depths to export.", "every stored one"
    )
    splits: tuple[str, ...] = setting(
        (),
        help="A split to export (repeatable).",
        option="--split",
        multiple=True,
        default_text="every one",
    )

    def combined(self) -> None:
        check_export_out(self.out, self.format)


@dataclass(frozen=True)
class PredictConfig(Config):
    """One ``reservoir predict`` (:func:`reservoir.api.predict`): a saved probe applied to new data, through
    the extraction its features went through (``data``), or to a split of a feature file (``features``)."""

    command = "predict"

    probe: Path = setting(
        help="A probe `reservoir fit` saved beside a result (RESULT.probe.npz).", path="file"
    )
    features: Path | None = setting(
        None,
        help="Feature file extracted as the probe's were (backbone, seed, dtype, readout, depth).",
        path="file",
    )
    data: Path | None = setting(
        None,
        help="New data to predict on, any input --task file:PATH reads, labeled or not: every row, in order, "
        "through the probe's extraction (its features kept under features/ for the next call) and the probe.",
        path="any",
    )
    split: str | None = setting(
        None,
        help="Split of the --features file to predict.",
        default_text="test; predict for a file of data read to predict on",
    )
    task_options: dict[str, Any] = task_options_setting(
        "How to read --data, as extract's (input=COLUMN, mode=RGB, ...); the probe's own are the default."
    )
    backbone: str | None = setting(
        None,
        help="Where to load the probe's backbone from for --data.",
        default_text="where its extraction did",
    )
    out: Path | None = setting(
        None,
        None,
        Suffix(".csv"),
        help="CSV file to write: row (and file, for image folders), prediction(s), label(s) where given, and "
        "prediction_name, label_name where the data names its classes.",
        path="file",
        default_text="stdout",
    )

    def combined(self) -> None:
        given = [f"--{k} {v}" for k, v in (("features", self.features), ("data", self.data)) if v is not None]
        other = {"--split": self.split, "--task-opt": self.task_options, "--backbone": self.backbone}
        wrong = [f"{o} {v}" for o, v in other.items() if v and (o == "--split") == (self.data is not None)]
        if len(given) != 1 or wrong:
            raise UsageError(
                "give --data PATH (new data) or --features FILE (extracted as the probe's were), not both; --split "
                f"is for --features, --task-opt and --backbone for --data. Got {' '.join(given + wrong) or 'neither'}"
            )


def parse_depth_rules(value: Any) -> tuple[str | int, ...]:
    """The depths an output-only setting reports in the task layout (``report --depth``): ``"chosen"`` on
    validation, ``"last"`` or a depth number; one or several, repeats dropped."""
    rules = []
    for item in [value] if isinstance(value, (str, int)) else value:
        text = str(item).strip()
        if text not in ("chosen", "last") and not text.isdigit():
            raise UsageError(f"expected 'chosen', 'last' or a depth number (0, 1, ...); got {item!r}")
        rules.append(int(text) if text.isdigit() else text)
    return tuple(dict.fromkeys(rules)) or ("chosen",)


@dataclass(frozen=True)
class ReportConfig(Config):
    """One ``reservoir report`` (and :func:`reservoir.api.results`): which results, how laid out."""

    command = "report"

    paths: tuple[Path, ...] = setting(
        (), help="Result JSON files or folders.", path="any", exists=True, argument=True, nargs=-1
    )
    paper: int | None = setting(
        None,
        help="Lay the table out like the FPT paper's table N and put its numbers beside ours.",
        metavar="N",
    )
    paper_rows: tuple[str, ...] = setting(
        (),
        help="Our backbone (and trained groups) standing for a row of the paper's table (repeatable).",
        option="--as",
        metavar="BACKBONE[:GROUPS]=ROW",
        multiple=True,
    )
    layout: str | None = setting(
        None,
        None,
        OneOf(("depth", "task")),
        help="One table per task with a column per depth, or a row per setting with a column per task.",
        default_text="the paper table's, else depth",
    )
    depths: tuple[str | int, ...] = setting(
        ("chosen",),
        help="The depth whose test accuracy an output-only setting reports in the task layout: chosen on "
        "validation, last (the deepest, what the paper's output layer reads) or a number; repeat for a "
        "line per rule.",
        parse=parse_depth_rules,
        option="--depth",
        metavar="chosen|last|N",
        multiple=True,
        default_text="chosen",
    )
    csv: Path | None = setting(None, help="Also write every cell as CSV (one line per cell).", path="file")
    plots: Path | None = setting(
        None,
        help="Also write PNG plots there: accuracy by depth with the baselines, training curves.",
        path="dir",
    )

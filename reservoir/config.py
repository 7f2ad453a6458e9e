"""Paths and run configurations: one place for each default.

Working folders default to ``./data``, ``./features/`` and ``./results/``, all under
``$RESERVOIR_HOME`` when it is set. Feature files are named by the identity of the run
that produced them (:mod:`reservoir.identity`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import UsageError
from reservoir.registry import ENGINES, HEADS


def home() -> Path:
    return Path(os.environ.get("RESERVOIR_HOME", "."))


def cache_dir() -> Path:
    """Converted models and compile records: ``$RESERVOIR_CACHE``, else ``$RESERVOIR_HOME/cache``,
    else ``~/.cache/reservoir``."""
    if os.environ.get("RESERVOIR_CACHE"):
        return Path(os.environ["RESERVOIR_CACHE"])
    if os.environ.get("RESERVOIR_HOME"):
        return Path(os.environ["RESERVOIR_HOME"]) / "cache"
    return Path.home() / ".cache" / "reservoir"


def default_data_dir() -> Path:
    return home() / "data"


def slug(name: str) -> str:
    """A file-name-safe name for a task or backbone (a folder path gives its last part)."""
    for prefix in ("hf:", "file:"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    if os.sep in name or Path(name).exists():
        name = Path(name.rstrip(os.sep)).stem or name
    return re.sub(r"[^A-Za-z0-9_.-]+", "--", name)


def features_dir() -> Path:
    return home() / "features"


def results_dir(task: str, backbone: str) -> Path:
    return home() / "results" / slug(task) / slug(backbone)


#: choices of the options that take one (the CLI's click.Choice lists come from the fields declaring
#: them, :func:`choices`); engines and heads are read from their registries
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "int8", "int8-static")
READOUT_CHOICES = ("last", "mean", "all", "padded")
#: dtypes the frozen weights are read in (``--load-dtype``; reservoir.model.backbones.LOAD_DTYPES)
LOAD_DTYPE_CHOICES = ("float32", "bfloat16", "float16")
#: named input scales; a positive number is also accepted (:func:`parse_input_scale`)
INPUT_SCALE_CHOICES = ("paper", "matched")
#: ``--device`` values: auto, cpu, mps, cuda or cuda:N
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"


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
            depths = tuple(int(p) for p in text.split(",") if p.strip())
        except ValueError:
            depths = ()
        if not depths:
            raise UsageError(f"depths {value!r} must be 'all' or comma-separated integers like 0,3,6")
        return depths
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    try:
        depths = tuple(int(d) for d in value)
    except (TypeError, ValueError):
        raise UsageError(f"depths {value!r} must be 'all', an integer or a list of integers") from None
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
        raise UsageError(
            f"depths {_text(value)!r}: depth {bad[0]} is not available {where}; choose depths "
            f"{allowed} (negative counts from the last), or 'all'"
        )
    return depths


def depths_json(value: Any) -> str | list[int] | None:
    """A depth selection as a config records it: ``"all"`` or text as given, else the list of ints (one int too)."""
    return value if value is None or isinstance(value, str) else list(parse_depths(value))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ",".join(map(str, parse_depths(value)))


# ---------------------------------------------------------------- run configurations


def default(cls: type, name: str) -> Any:
    """The default of field ``name`` of a config dataclass (help texts show it from here)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def from_options(cls: type, **options: Any):
    """A config from command-line options: ``None`` means unset, so the dataclass default applies."""
    return cls(**{k: v for k, v in options.items() if v is not None})


# ---------------------------------------------------------------- constraints: declared once, one validator


def _number(x: Any) -> str:
    return str(x)


class Constraint:
    """A rule a parameter's value meets; :func:`check` writes the message when it does not.

    ``owner`` is the object the parameter belongs to (a config, an estimator), for rules that
    depend on its other parameters."""

    def ok(self, value: Any, owner: Any = None) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def text(self, owner: Any = None) -> str:
        """What the value must be, completing "must be ..."."""
        raise NotImplementedError  # pragma: no cover - abstract


@dataclass(frozen=True)
class Interval(Constraint):
    """A number in ``[low, high]`` (``closed``: ``"both"``, ``"left"``, ``"right"``, ``"neither"``);
    a bound ``None`` is open, a callable bound is computed from the owner; ``each``: a non-empty
    sequence whose every value is; ``note`` (from the owner) follows the rule; ``integer``: an int
    only. NaN is in no interval."""

    low: float | Callable[[Any], float] | None = None
    high: float | Callable[[Any], float] | None = None
    closed: str = "both"
    each: bool = False
    note: Callable[[Any], str] | None = None
    integer: bool = False

    def _bounds(self, owner: Any) -> tuple[Any, Any]:
        return tuple(b(owner) if callable(b) else b for b in (self.low, self.high))

    def _in(self, x: Any, owner: Any) -> bool:
        low, high = self._bounds(owner)
        left, right = self.closed in ("both", "left"), self.closed in ("both", "right")
        try:
            return (low is None or (x >= low if left else x > low)) and (
                high is None or (x <= high if right else x < high)
            )
        except TypeError:
            return False

    def ok(self, value: Any, owner: Any = None) -> bool:
        if self.each:
            return isinstance(value, (list, tuple)) and bool(value) and all(self._in(x, owner) for x in value)
        if self.integer and not isinstance(value, (int, np.integer)):
            return False
        return not isinstance(value, bool) and self._in(value, owner)

    def text(self, owner: Any = None) -> str:
        low, high = self._bounds(owner)
        left, right = self.closed in ("both", "left"), self.closed in ("both", "right")
        if low is not None and high is not None:
            rule = f"in {'[' if left else '('}{_number(low)}, {_number(high)}{']' if right else ')'}"
        elif low is not None:
            rule = f"{'>=' if left else '>'} {_number(low)}"
        else:
            rule = f"{'<=' if right else '<'} {_number(high)}"
        return (
            ("an integer " if self.integer else "")
            + rule
            + (" (each)" if self.each else "")
            + (self.note(owner) if self.note else "")
        )


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of ``choices``: a tuple, or a registry (:class:`reservoir.registry.Registry`) read when
    asked, after the ``first`` fixed choices (``"auto"``). The command line's ``click.Choice`` of
    the parameter lists :meth:`values`."""

    choices: Any
    first: tuple[str, ...] = ()

    def values(self) -> list[Any]:
        found = self.choices.names() if hasattr(self.choices, "names") else self.choices
        return [*self.first, *found]

    def ok(self, value: Any, owner: Any = None) -> bool:
        try:
            return value in self.values()
        except TypeError:  # an unhashable value
            return False

    def text(self, owner: Any = None) -> str:
        values = self.values()
        return repr(values[0]) if len(values) == 1 else f"one of {values}"


@dataclass(frozen=True)
class Divides(Constraint):
    """A positive integer dividing ``number``."""

    number: int

    def ok(self, value: Any, owner: Any = None) -> bool:
        return isinstance(value, (int, np.integer)) and value >= 1 and self.number % value == 0

    def text(self, owner: Any = None) -> str:
        divisors = ", ".join(str(d) for d in range(1, self.number + 1) if self.number % d == 0)
        return f"a divisor of {self.number} ({divisors})"


@dataclass(frozen=True)
class Matches(Constraint):
    """Text matching ``pattern`` whole; ``said`` says which in words."""

    pattern: str
    said: str

    def ok(self, value: Any, owner: Any = None) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None

    def text(self, owner: Any = None) -> str:
        return self.said


@dataclass(frozen=True)
class Distinct(Constraint):
    """A sequence without repeated values."""

    def ok(self, value: Any, owner: Any = None) -> bool:
        return len(set(value)) == len(value)

    def text(self, owner: Any = None) -> str:
        return "distinct values"


@dataclass(frozen=True)
class NotEmpty(Constraint):
    """A non-empty sequence; ``said`` names one element ("at least one group")."""

    said: str

    def ok(self, value: Any, owner: Any = None) -> bool:
        return bool(value)

    def text(self, owner: Any = None) -> str:
        return self.said


def check(
    owner: str,
    name: str,
    value: Any,
    rule: Constraint,
    obj: Any = None,
    *,
    note: str = "",
    noun: str = "parameter",
) -> None:
    """``value`` of ``name`` meets ``rule``; else a UsageError in scikit-learn's words: "The 'depth'
    parameter of fit must be in [0, 12]. Got 13 instead." (``note`` follows the rule; ``noun``
    "option" for a task's options). The one place such a message is written."""
    if not rule.ok(value, obj):
        shown = list(value) if isinstance(value, tuple) else value
        raise UsageError(
            f"The {name!r} {noun} of {owner} must be {rule.text(obj)}{note}. Got {shown!r} instead."
        )


def param(default: Any = dataclasses.MISSING, *rules: Constraint, factory: Any = dataclasses.MISSING) -> Any:
    """A config field (``default``, or ``factory`` for a mutable one) with its constraints declared."""
    return field(default=default, default_factory=factory, metadata={"rules": rules})


def constraints(owner: Any) -> dict[str, tuple[Constraint, ...]]:
    """The declared constraints of a config dataclass's fields, or an estimator's
    ``parameter_constraints``, by parameter name."""
    if dataclasses.is_dataclass(owner):
        return {f.name: f.metadata["rules"] for f in dataclasses.fields(owner) if f.metadata.get("rules")}
    return dict(getattr(owner, "parameter_constraints", {}))


def validate(obj: Any, owner: str) -> None:
    """Every declared constraint of ``obj``'s parameters (:func:`constraints`), by :func:`check`;
    a parameter whose default is ``None`` takes ``None``."""
    for name, rules in constraints(obj).items():
        value = getattr(obj, name)
        if value is None and _default_is_none(obj, name):
            continue
        for rule in rules:
            check(owner, name, value, rule, obj)


def _default_is_none(obj: Any, name: str) -> bool:
    if dataclasses.is_dataclass(obj):
        return default(type(obj), name) is None
    parameter = inspect.signature(type(obj)).parameters.get(name)
    return parameter is not None and parameter.default is None


def choices(cls: type, name: str) -> OneOf:
    """The :class:`OneOf` declared for field ``name`` of ``cls`` (the command line's choices)."""
    return next(r for r in constraints(cls)[name] if isinstance(r, OneOf))


#: ``--device``: auto, cpu, mps, cuda or cuda:N (whether the device is present is checked where it
#: is used, :func:`reservoir.model.devices.resolve_device`)
DEVICE = Matches(DEVICE_PATTERN, "auto, cpu, cuda, cuda:N or mps")
#: counts of at least one (rows, examples, workers)
POSITIVE = Interval(1, None)


def check_device(owner: str, value: str) -> None:
    """``value`` is auto, cpu, cuda, cuda:N or mps (:data:`DEVICE`)."""
    check(owner, "device", value, DEVICE)


#: the largest seed: scikit-learn's ``random_state`` and numpy's legacy seeding take 32-bit seeds
MAX_SEED = 2**32 - 1
#: the largest learning rate ``train`` takes (Adam's steps are about lr: beyond it no run learns, and past
#: float32's range torch's optimiser fails to even store it)
MAX_LR = 100
#: a run's seed
SEED = Interval(0, MAX_SEED)
#: a share of the rows, strictly between none and all
FRACTION = Interval(0, 1, closed="neither")


@dataclass(frozen=True)
class ExtractConfig:
    """One extraction run.

    Parameters
    ----------
    task, backbone
        registered names (or ``file:PATH`` / a model folder).
    task_options
        the task's own options (``--task-opt key=value``).
    split
        a split name or ``"all"``.
    limit
        keep the first ``limit`` examples of each split.
    seed
        seeds the input layer, random backbones and generated data (tasks marked
        ``generated``: bit tasks, generated ListOps); a task's own ``seed`` option, when given,
        seeds its data instead.
    input_scale
        scale of the frozen input layer; ``"paper"``: orthogonal gain 1.41 for
        dense tokens, N(0, 1) embeddings for ids (the FPT code); ``"matched"``: the std of the
        backbone's own token embedding (:func:`reservoir.model.input_layer.make_input_layer`); a
        positive number: that std.
    batch_size
        examples per forward pass; ``None``: about 16,384 tokens a batch, more for
        backbones that ask (``reservoir.extract.plan.auto_batch_size``).
    dtype
        compute dtype of the backbone: ``"auto"`` is the float dtype this machine multiplies
        fastest (measured; features are stored as float32), float32 for a task with real-valued
        targets (forecasting needs more digits than bf16 keeps), and ``"int8"`` on the CPU where
        int8 is measured faster than every float path and its probe accuracy was measured within
        0.5 points of float32 on this CPU kind (:mod:`reservoir.runtime.quantized`); ``"int8"`` (int8 weights,
        activations quantized per token at run time) and ``"int8-static"`` (activation scales
        calibrated on the run's first rows) run on the OpenVINO engine (:mod:`reservoir.runtime.engines`).
    load_dtype
        the dtype the frozen weights are read and kept in: ``"float32"``, or ``"bfloat16"`` and
        ``"float16"``, which take half the memory (a model twice as large fits); the backbone then
        computes in that dtype (``dtype`` auto) on the PyTorch engine. Part of the identity.
    engine
        what runs the forward: ``"torch"`` (eager or compiled), ``"openvino"`` (the
        ``openvino`` extra; CPU only), ``"onnxruntime"`` (the ``onnx`` extra; CPU only; float32 and
        int8), or ``"auto"``: on the CPU, for a backbone that converts, the installed engines measured
        against PyTorch on the first batch (OpenVINO for runs of 20,000+ tokens, ONNX Runtime for
        200,000+), PyTorch otherwise or when converting fails. Not part of the identity (like
        ``compile``): the float engines compute the same features, checked against PyTorch float32 on
        the first batch.
    depths
        ``"all"`` or comma-separated depths (negative: from the last block).
    readout
        ``"last"`` reads the last real token; ``"mean"`` averages the states of every real
        token; ``"all"`` keeps every token's state (tasks of fixed length); ``"padded"`` pads every
        example to the task's length and reads the last position, reproducing the official FPT code.
    compile
        compile the forward with torch.compile (falls back to eager on failure);
        ``None`` compiles when the measured costs say it repays the compile time
        (:mod:`reservoir.runtime.compiling`; sharded runs: ``reservoir.extract.run.AUTO_COMPILE_TOKENS``).
    device
        ``auto`` (a CUDA GPU when present, else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or
        ``mps``. Not part of the run's identity: it changes where the numbers are computed.
    workers
        extract shards on a dask ``LocalCluster`` of this many worker processes (threads
        split between them; on a machine with several GPUs one per GPU).
    scheduler
        the address of a running dask.distributed scheduler whose workers extract the
        shards (``tcp://host:8786``); excludes ``workers``.
    shard_rows
        rows of a shard, rounded to the batch size; variable-length tasks are bucketed
        by length within these blocks in every run, so a single process and a sharded run
        compute the same batches.
    data_dir
        the data folder.
    out
        the feature file; ``None``: derived from the run's identity
        (``features/TASK/BACKBONE/DTYPE-seedS[-limitN][-scale-X]-HASH.h5``).
    force
        extract again even when a complete file of this run is there (one that failed
        verification, say): that file is moved aside to ``FILE.old``, never overwritten.
    """

    task: str
    backbone: str = "gpt2-random"
    task_options: dict[str, Any] = field(default_factory=dict)
    split: str = "all"
    limit: int | None = param(None, POSITIVE)
    seed: int = param(0, SEED)
    input_scale: str = "paper"
    batch_size: int | None = param(None, POSITIVE)
    dtype: str = param("auto", OneOf(DTYPE_CHOICES))
    load_dtype: str = param("float32", OneOf(LOAD_DTYPE_CHOICES))
    engine: str = param("auto", OneOf(ENGINES, first=("auto",)))
    depths: str | tuple[int, ...] = "all"
    readout: str = param("last", OneOf(READOUT_CHOICES))
    compile: bool | None = None
    device: str = param("auto", DEVICE)
    workers: int | None = param(None, POSITIVE)
    scheduler: str | None = None
    shard_rows: int = param(8192, POSITIVE)
    data_dir: Path = field(default_factory=default_data_dir)
    out: Path | None = None
    force: bool = False

    def __post_init__(self) -> None:
        validate(self, "extract")
        object.__setattr__(self, "input_scale", parse_input_scale(self.input_scale))
        if self.workers and self.scheduler:
            raise UsageError(
                f"give --workers ({self.workers}) or --scheduler ({self.scheduler!r}), not both: "
                "--scheduler uses the workers of a running cluster"
            )
        parse_depths(self.depths)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["data_dir"], d["out"] = str(self.data_dir), str(self.out) if self.out else None
        d["depths"] = depths_json(self.depths)
        return d


@dataclass(frozen=True)
class FitConfig:
    """One ``fit`` run over a feature file.

    Parameters
    ----------
    task, backbone
        the task and backbone of the features; ``None``: taken from the file.
        Given with ``features``, they must match the file's.
    features
        the HDF5 file; ``None``: the one complete file extracted for ``task`` and
        ``backbone`` under ``features/`` (several: name one).
    depths
        ``"all"`` or comma-separated depths (negative: from the last stored one).
    head
        a registered head (:data:`reservoir.registry.HEADS`: ``logreg``, ``ridge``, ``torch`` and
        any a module of :mod:`reservoir.probe` registers; ``fit --head`` lists them).
    val_fraction
        share of train carved out (seeded) to choose regularisation.
    seed
        seeds the validation split and the torch head.
    device
        where the torch head trains (``auto``: a CUDA GPU when present, else the CPU).
    memory_mb
        features of one depth (train rows) above this many MiB are never loaded at once:
        the logistic and torch heads then train on blocks read from the file (ridge always does).
    baselines
        also fit the baselines of the file's data (:mod:`reservoir.probe.baselines`: majority,
        raw input, random tanh features of the same width, the task's rules), read again from
        ``data_dir``; results already written for the same data are reused.
    data_dir
        the data folder the baselines read the task's data from; ``None``: the folder the
        extraction read (recorded in the feature file), else the default data folder.
    """

    task: str | None = None
    backbone: str | None = None
    features: Path | None = None
    depths: str | tuple[int, ...] = "all"
    head: str = param("logreg", OneOf(HEADS))
    val_fraction: float = param(0.1, FRACTION)
    seed: int = param(0, SEED)
    device: str = param("auto", DEVICE)
    memory_mb: int = param(1024, POSITIVE)
    baselines: bool = True
    data_dir: Path | None = None

    def __post_init__(self) -> None:
        validate(self, "fit")
        if self.features is None and self.task is None:
            raise UsageError(
                "fit needs --features FILE, or --task (and --backbone) to find the extracted file"
            )
        parse_depths(self.depths)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["features"] = str(self.features) if self.features else None
        d["depths"] = depths_json(self.depths)
        d["data_dir"] = str(self.data_dir) if self.data_dir else None
        return d


#: FPT parameter groups a ``train`` run can unfreeze; the paper's default is input, pos, ln, out
TRAIN_GROUPS = ("input", "pos", "ln", "attn", "ff", "out")
#: compute dtypes of training (bfloat16 runs the forward under autocast); auto picks one of them per machine
TRAIN_DTYPES = ("float32", "bfloat16")
TRAIN_DTYPE_CHOICES = ("auto", *TRAIN_DTYPES)
PAPER_TRAINABLE = ("input", "pos", "ln", "out")


def _seeds_runs(cfg: Any) -> str:
    return f" (it seeds {cfg.seeds} runs)" if cfg.seeds > 1 else ""


@dataclass(frozen=True)
class TrainConfig:
    """One end-to-end ``train`` run (or a sweep over learning rates and seeds).

    Parameters
    ----------
    task, backbone
        registered names (or ``file:PATH`` / a model folder).
    task_options
        the task's own options (``--task-opt key=value``).
    trainable
        parameter groups to train (input, pos, ln, attn, ff, out, or a backbone's own group).
    lr
        Adam learning rates; more than one makes a sweep selected on validation accuracy.
    seeds
        runs per learning rate, with seeds ``seed, seed+1, ...``.
    seed
        first seed; seeds the input layer, random backbones, output layer, dropout and data order
        (and generated data, unless the task's own ``seed`` option is given).
    steps
        maximum gradient steps per run (the paper's random GPT-2 needs about 2e4 on bit XOR, its table 6).
    batch_size
        training examples per step.
    eval_batch_size
        examples per forward pass when scoring validation and test.
    eval_every
        steps between validation passes (model selection and early stopping).
    patience
        validation passes without progress before stopping (0: never stop early). Progress is a validation
        accuracy 0.1 points above the last progress, a validation loss 0.1% below its lowest, or a training loss
        still falling: the least-squares line through the mean training losses of the last 20 passes falls by 1%
        or more, 2 standard errors or more (:func:`reservoir.train.loop.advance`). A run that converged or is
        stuck has a flat training loss and stops; one whose validation wanders on a plateau while its training
        loss falls goes on.
    target
        validation accuracy whose first crossing is reported as ``steps_to_target``.
    stop_at
        validation accuracy at which a run counts as solved and stops (default 1.0: only a perfect
        validation pass stops it before ``patience``); may change on ``resume``, and a resumed run whose best
        validation already reached it ends there.
    max_time
        seconds of training after which a run stops (as Lightning's ``max_time``), counted per run and across
        ``resume``: it validates, reports test at its best validation step and says it stopped on time;
        ``resume`` with a larger ``max_time`` or none continues it. Not part of the run's identity.
    val_fraction
        share of train held out (seeded by ``seed``) when the task has no val split.
    limit
        keep the first ``limit`` examples of each split.
    blocks
        blocks of the backbone to run (default: all).
    input_scale
        the input layer's scale (as ``extract --input-scale``).
    dtype
        ``bfloat16`` runs the forward under autocast (parameters, gradients and Adam stay float32);
        ``auto`` (the default) takes the faster of the two on the machine the run is on, measured as
        ``extract --dtype auto`` measures (:func:`reservoir.runtime.dtypes.choose`). The identity keeps
        ``auto``, so a run resumed on another CPU continues in that CPU's dtype; each run's result
        lists the dtypes it ran in.
    compile
        torch.compile the model (falls back to eager on failure).
    device
        as for extraction (``auto``: a CUDA GPU when present, else the CPU).
    grad_clip
        maximum gradient norm.
    dropout
        dropout after the input layer and in the backbone's own dropout layers.
    checkpoint_every
        steps between checkpoints (0: only at the end).
    resume
        continue from the run's checkpoint when one exists.
    concurrent_runs
        runs (learning rates x seeds) trained together in one process, the frozen backbone held once and
        each run's trainable parameters stacked (:mod:`reservoir.train.batched`); ``None``: as many as fit
        the device's memory; 1: one after another.
    save_backbone
        after the run, write its trained backbone (the parameters of the best validation step) to
        this folder, which must not exist or be empty, as a ``save_pretrained`` folder that ``backbone`` takes
        (:mod:`reservoir.train.export`); one learning rate and one seed only.
    """

    task: str
    backbone: str = "gpt2-random"
    task_options: dict[str, Any] = field(default_factory=dict)
    trainable: tuple[str, ...] = param(PAPER_TRAINABLE, NotEmpty("at least one group"))
    lr: tuple[float, ...] = param((1e-3,), Interval(0, MAX_LR, closed="right", each=True), Distinct())
    seeds: int = param(1, POSITIVE)
    seed: int = param(0, Interval(0, lambda cfg: MAX_SEED - cfg.seeds + 1, note=_seeds_runs))
    steps: int = param(20000, POSITIVE)
    batch_size: int = param(32, POSITIVE)
    eval_batch_size: int = param(256, POSITIVE)
    eval_every: int = param(100, POSITIVE)
    patience: int = param(10, Interval(0, None))
    target: float | None = param(None, Interval(0, 1, closed="right"))
    stop_at: float = param(1.0, Interval(0, 1, closed="right"))
    max_time: float | None = param(None, Interval(0, None, closed="neither"))
    val_fraction: float = param(0.1, FRACTION)
    limit: int | None = param(None, POSITIVE)
    blocks: int | None = param(None, Interval(0, None))
    input_scale: str = "paper"
    dtype: str = param("auto", OneOf(TRAIN_DTYPE_CHOICES))
    compile: bool = False
    device: str = param("auto", DEVICE)
    grad_clip: float = param(1.0, Interval(0, None))
    dropout: float = param(0.1, Interval(0, 1, closed="left"))
    checkpoint_every: int = 500
    resume: bool = False
    concurrent_runs: int | None = param(None, POSITIVE)
    data_dir: Path = field(default_factory=default_data_dir)
    checkpoint_dir: Path | None = None
    save_backbone: Path | None = None

    def __post_init__(self) -> None:
        validate(self, "train")
        object.__setattr__(self, "input_scale", parse_input_scale(self.input_scale))
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
        d = dataclasses.asdict(self)
        d["trainable"], d["lr"] = list(self.trainable), list(self.lr)
        d["data_dir"], d["checkpoint_dir"] = str(self.data_dir), str(self.checkpoint_folder)
        d["save_backbone"] = str(self.save_backbone) if self.save_backbone is not None else None
        return d


@dataclass(frozen=True)
class AttentionConfig:
    """One ``reservoir attention`` plot: one block's attention for one example.

    Parameters
    ----------
    layer
        the block whose attention is shown (from 0).
    example
        the row of ``split`` shown.
    split
        the split the example comes from.
    seed
        seeds the input layer, a random backbone and generated data (as :class:`ExtractConfig`).
    input_scale
        the input layer's scale (as :class:`ExtractConfig`).
    """

    layer: int = param(0, Interval(0, None))
    example: int = param(0, Interval(0, None))
    split: str = "test"
    seed: int = param(0, SEED)
    input_scale: str = "paper"

    def __post_init__(self) -> None:
        validate(self, "attention")
        object.__setattr__(self, "input_scale", parse_input_scale(self.input_scale))

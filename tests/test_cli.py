"""The command line: exit codes, messages, and nothing half-written left behind."""

from __future__ import annotations

import json
from pathlib import Path

from reservoir.runtime.runner import resolve_dtype


def test_unknown_task_exits_2_listing_choices(cli, home):
    r = cli("extract", "--task", "cifar11")
    assert r.exit_code == 2
    assert (
        "unknown task 'cifar11'; choose from [" in r.output
        and "'digits'" in r.output
        and "'mnist'" in r.output
    )


def test_unknown_backbone_exits_2(cli, home):
    r = cli("extract", "--task", "digits", "--backbone", "gpt5")
    assert r.exit_code == 2 and "unknown backbone 'gpt5'" in r.output and "'gpt2-random'" in r.output


def test_bad_depths_and_task_options_exit_2_while_parsing(cli, home):
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--depths", "0,x", "--limit", "4")
    assert r.exit_code == 2 and "depths '0,x' must be 'all' or comma-separated integers" in r.output
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--depths", "0,,1", "--limit", "4")
    assert r.exit_code == 2 and "depths '0,,1' must be 'all' or comma-separated integers" in r.output
    r = cli("extract", "--task", "digits", "--task-opt", "colour=red")
    assert r.exit_code == 2 and "unknown option 'colour' for task 'digits'" in r.output
    r = cli("extract", "--task", "bit_xor", "--task-opt", "n_bits=five")
    assert r.exit_code == 2 and "task option n_bits='five' is not a valid int" in r.output
    r = cli("fit", "--task", "digits", "--depth", "0,2")
    assert r.exit_code == 2 and "'0,2' is not a valid integer" in r.output
    assert not (home / "features").exists()


def test_every_required_option_left_out_exits_2_naming_it(cli, home):
    """Each command run without a required option says which, as a usage error, for every click version."""
    import click

    from reservoir.cli import main

    def commands(group, path=()):
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from commands(command, (*path, name))
            else:
                yield (*path, name), command

    checked = 0
    for path, command in commands(main):
        required = [p for p in command.params if p.required and isinstance(p, click.Option)]
        (home / "given").write_text("")
        arguments = [
            str(home / "given") for p in command.params if p.required and isinstance(p, click.Argument)
        ]
        if required:
            r = cli(*path, *arguments)
            assert r.exit_code == 2 and "Missing option" in r.output and "Traceback" not in r.output, (
                path,
                r.output,
            )
            checked += 1
    assert checked >= 4


def test_fit_depth_is_the_single_depth_form_of_depths(cli, home, tmp_path):
    """`reservoir fit --depth 6`: on a 12-block file it fits depth 6 and no other."""
    from tests.conftest import save_tiny_gpt2

    folder = save_tiny_gpt2(tmp_path / "gpt2-12x16", n_layer=12, n_embd=16)
    r = cli(
        "-q", "extract", "--task", "digits", "--backbone", str(folder), "--limit", "100", "--dtype", "float32"
    )
    assert r.exit_code == 0, r.output
    path = Path(r.stdout.strip())
    r = cli("-q", "fit", "--features", str(path), "--depth", "6", "--head", "ridge")
    assert r.exit_code == 0, r.output
    assert "| d6 |" in r.stdout and " d5 |" not in r.stdout and " d7 |" not in r.stdout
    results = list((home / "results" / "digits" / folder.name).glob("*.json"))
    assert [json.loads(p.read_text())["depth"] for p in results] == [6]
    r = cli("fit", "--features", str(path), "--depth", "6", "--depths", "6")
    assert r.exit_code == 2 and "--depth 6 and --depths are the same option" in r.output
    assert len(list((home / "results" / "digits" / folder.name).glob("*.json"))) == 1


def test_a_depth_the_backbone_lacks_exits_1_naming_the_range(cli, home):
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--depths", "0,9", "--limit", "4")
    assert (
        r.exit_code == 1
        and "depth 9 is not available in backbone lstm (3 blocks); choose depths in [0, 3]" in r.output
    )
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--depths", "-9", "--limit", "4")
    assert r.exit_code == 1 and "depth -9 is not available" in r.output  # the value given, not -9 + 4
    assert "Traceback" not in r.output and not (home / "features").exists()


def test_missing_mnist_offline_exits_1_and_leaves_no_file(cli, home, monkeypatch):
    monkeypatch.setenv("RESERVOIR_OFFLINE", "1")
    r = cli("extract", "--task", "mnist", "--backbone", "lstm", "--data-dir", str(home / "nodata"))
    assert r.exit_code == 1
    assert f"in {home / 'nodata' / 'mnist'}" in r.output
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        assert name in r.output
    assert not list(home.rglob("*.h5*"))


def test_download_attempt_without_network_gives_up_fast(tmp_path, monkeypatch):
    """With downloads allowed but no route to the host, the error still names the folder and files."""
    import time
    import urllib.request

    import pytest

    from reservoir.tasks import DataError, get_task

    monkeypatch.delenv("RESERVOIR_OFFLINE", raising=False)

    def no_network(url, timeout):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"needs train-images-idx3-ubyte.gz.*download failed.*unreachable"):
        get_task("mnist").load("train", tmp_path)
    assert time.perf_counter() - start < 5
    assert not list((tmp_path / "mnist").iterdir())  # no partial download left behind


def test_extract_fit_report_on_digits(cli, home, tiny_gpt2):
    r = cli("-q", "extract", "--task", "digits", "--backbone", str(tiny_gpt2))
    assert r.exit_code == 0, r.output
    path = Path(r.stdout.strip())
    assert path.exists() and path.parent == home / "features" / "digits" / tiny_gpt2.name
    assert path.name.startswith(f"{resolve_dtype('auto')}-seed0-") and path.suffix == ".h5"
    r = cli("-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--head", "ridge")
    assert r.exit_code == 0, r.output
    assert "### digits" in r.stdout and " d2 |" in r.stdout and "baseline: majority class" in r.stdout
    results = sorted((home / "results" / "digits" / tiny_gpt2.name).glob("*.json"))
    assert len(results) == 3
    res = json.loads(results[-1].read_text())
    for key in (
        "task",
        "backbone",
        "mode",
        "depth",
        "head",
        "trainable",
        "test_accuracy",
        "val_accuracy",
        "n_train",
        "n_val",
        "n_test",
        "seconds",
        "seed",
        "config",
        "version",
    ):
        assert key in res
    assert res["mode"] == "output-only" and res["n_test"] == 360 and res["n_train"] == 1437
    assert res["test_accuracy"] > 0.5  # chance is 0.1
    r = cli("report")
    assert (
        r.exit_code == 0
        and "| tiny-gpt20 | ridge |" in r.stdout
        and "baseline: raw-input linear head" in r.stdout
    )


def test_quiet_is_taken_after_the_command_as_before_it(cli, home, tiny_gpt2):
    r = cli("extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "100", "-q")
    assert r.exit_code == 0 and r.stderr == "" and Path(r.stdout.strip()).exists()
    fit = ("fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "100", "--head", "ridge")
    loud, after, before = cli(*fit), cli(*fit, "--quiet"), cli("-q", *fit)
    assert "depth 0:" in loud.stderr and after.stderr == before.stderr == ""
    assert after.stdout == before.stdout and "### digits" in after.stdout


def test_fit_without_features_exits_1(cli, home):
    r = cli("fit", "--task", "digits", "--backbone", "lstm")
    assert r.exit_code == 1 and "no feature file for task 'digits' and backbone 'lstm'" in r.output
    assert "run `reservoir extract --task digits --backbone lstm` first" in r.output


def test_listings(cli):
    r = cli("tasks")
    assert r.exit_code == 0 and "mnist" in r.stdout and "64 tokens x 16" in r.stdout
    r = cli("backbones")
    assert r.exit_code == 0 and "gpt2-random" in r.stdout and "lstm" in r.stdout


# -- one validation layer: every option and task option, at parse time when the value alone decides --


BAD_VALUES = [
    (
        ("train", "--task", "digits", "--lr", "abc"),
        "--lr 'abc' must be a comma-separated list of float values",
    ),
    (("train", "--task", "digits", "--trainable", ""), "--trainable '' names no values"),
    (
        ("extract", "--task", "bit_xor", "--task-opt", "n_bits=-3"),
        "The 'n_bits' option of task bit_xor must be in [1, 1048576]. Got -3 instead.",
    ),
    (
        ("extract", "--task", "bit_memory", "--task-opt", "mask_prob=1.5"),
        "The 'mask_prob' option of task bit_memory must be in [0.0, 1.0]. Got 1.5 instead.",
    ),
    (
        ("extract", "--task", "bit_memory", "--task-opt", "n_bits=70"),
        "The 'n_bits' option of task bit_memory must be a multiple of token_bits (50). Got 70 instead.",
    ),
    (
        ("extract", "--task", "listops", "--task-opt", "max_args=1"),
        "The 'max_args' option of task listops must be in [2, 1000]. Got 1 instead.",
    ),
    (
        ("extract", "--task", "listops", "--task-opt", "min_length=10", "--task-opt", "max_length=11"),
        "The 'max_length' option of task listops must be > min_length + 1 (11)",
    ),
    (
        (
            "extract",
            "--task",
            "listops",
            "--task-opt",
            "max_depth=100",
        ),  # found by tests/faults/test_fuzz.py: a hang
        "The 'max_depth' and 'max_args' options of task listops (100, 10) draw expressions of 1,006,691 tokens on average",
    ),
    (
        ("extract", "--task", "mnist", "--task-opt", "patch=3"),
        "The 'patch' option of task mnist must be a divisor of 32 (1, 2, 4, 8, 16, 32). Got 3 instead.",
    ),
    (
        ("extract", "--task", "digits", "--task-opt", "seed=-1"),
        "The 'seed' option of task digits must be in [0, 4294967295]. Got -1 instead.",
    ),
    (
        ("extract", "--task", "file:nowhere.npz", "--task-opt", "test_fraction=1.5"),
        "The 'test_fraction' option of task file:PATH must be in (0, 1). Got 1.5 instead.",
    ),
    (
        ("extract", "--task", "digits", "--split", "nosuch"),
        "Invalid value for --split: task 'digits' has no split 'nosuch'; choose from ['train', 'test'] or 'all'",
    ),
    (
        ("extract", "--task", "digits", "--seed", "-1"),
        "The 'seed' parameter of extract must be an integer in [0, 4294967295]. Got -1",
    ),
    (
        ("extract", "--task", "digits", "--workers", "2", "--scheduler", "tcp://x:1"),
        "give --workers (2) or --scheduler",
    ),
    (
        ("fit", "--task", "digits", "--seed", "4294967296"),
        "The 'seed' parameter of fit must be an integer in [0, 4294967295]",
    ),
    (
        ("train", "--task", "digits", "--lr", "-1"),
        "The 'lr' parameter of train must be in (0, 100] (each). Got [-1.0] instead.",
    ),
    (
        ("train", "--task", "digits", "--lr", "1e-3,1e-3"),
        "The 'lr' parameter of train must be distinct values to 6 significant digits (they name runs and checkpoints). Got [0.001, 0.001] instead.",
    ),
    (
        (
            "train",
            "--task",
            "digits",
            "--lr",
            "0.001,0.0010000001",
        ),  # one name, one checkpoint, one sweep key
        "The 'lr' parameter of train must be distinct values to 6 significant digits",
    ),
    (("train", "--task", "digits", "--lr", "nan"), "The 'lr' parameter of train must be in (0, 100] (each)"),
    (
        (
            "train",
            "--task",
            "digits",
            "--lr",
            "3.4e37",
        ),  # found by tests/faults/test_fuzz.py: torch's Adam overflowed
        "The 'lr' parameter of train must be in (0, 100] (each). Got [3.4e+37] instead.",
    ),
    (
        ("train", "--task", "digits", "--trainable", "nosuch"),
        "Invalid value for --trainable: unknown trainable group 'nosuch'; choose from ['attn', 'ff', 'input', 'ln', 'out', 'pos']",
    ),
    (
        ("train", "--task", "digits", "--seed", "4294967295", "--seeds", "2"),
        "The 'seed' parameter of train must be an integer in [0, 4294967294] (it seeds 2 runs). Got 4294967295 instead.",
    ),
]


def test_bad_option_values_exit_2_naming_the_value_and_the_range(cli, home):
    for args, message in BAD_VALUES:
        r = cli(*args)
        assert r.exit_code == 2, (args, r.output)
        assert message in " ".join(r.output.split()), (args, r.output)
        assert "Traceback" not in r.output
    assert not (home / "features").exists() and not (home / "results").exists()


def test_a_backbone_s_own_trainable_group_is_accepted(cli, home):
    r = cli(
        "-q",
        "train",
        "--task",
        "digits",
        "--backbone",
        "lstm",
        "--trainable",
        "lstm,out",
        "--limit",
        "120",
        "--steps",
        "1",
        "--eval-every",
        "1",
        "--checkpoint-every",
        "0",
    )
    assert r.exit_code == 0, r.output


def test_the_documented_exit_status_table_matches_the_code(cli, home):
    """One command per row of the user guide's exit status table, with the status the table gives it."""
    import re

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "commands.md").read_text()
    rows = dict(re.findall(r"^\| (\d) \| (.*?) \|", guide, flags=re.M))
    assert (
        set(rows) == {"0", "1", "2"} and "usage error" in rows["2"] and "once the command runs" in rows["1"]
    )
    assert cli("tasks").exit_code == 0
    assert cli("extract", "--task", "bit_xor", "--task-opt", "n_bits=-3").exit_code == 2
    assert cli("fit", "--task", "digits", "--backbone", "lstm").exit_code == 1  # nothing extracted


def test_listops_generation_that_cannot_finish_gives_up_in_words():
    import pytest

    from reservoir.errors import DataError
    from reservoir.tasks import get_task

    task = get_task("listops", min_length=0, max_length=3, max_depth=1, n_train=50)
    with pytest.raises(
        DataError, match=r"found 10 of \d+ distinct expressions .* widen min_length..max_length"
    ):
        task.load("train", Path("."))

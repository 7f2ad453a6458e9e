"""The command line: exit codes, messages, and nothing half-written left behind."""

from __future__ import annotations

import json
from pathlib import Path

from reservoir.runtime.runner import resolve_dtype


def test_unknown_task_exits_2_listing_choices(cli, home):
    r = cli("extract", "--task", "cifar11")
    assert r.exit_code == 2
    assert "unknown task 'cifar11'; choose from [" in r.output and "'digits'" in r.output and "'mnist'" in r.output


def test_unknown_backbone_exits_2(cli, home):
    r = cli("extract", "--task", "digits", "--backbone", "gpt5")
    assert r.exit_code == 2 and "unknown backbone 'gpt5'" in r.output and "'gpt2-random'" in r.output


def test_bad_depths_and_task_options_exit_2_while_parsing(cli, home):
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--depths", "0,x", "--limit", "4")
    assert r.exit_code == 2 and "depths '0,x' must be 'all' or comma-separated integers" in r.output
    r = cli("extract", "--task", "digits", "--task-opt", "colour=red")
    assert r.exit_code == 2 and "unknown option 'colour' for task 'digits'" in r.output
    r = cli("extract", "--task", "bit_xor", "--task-opt", "n_bits=five")
    assert r.exit_code == 2 and "task option n_bits='five' is not a valid int" in r.output
    r = cli("fit", "--task", "digits", "--depth", "2")
    assert r.exit_code == 2 and "--depth was renamed --depths; pass --depths 2" in r.output
    assert not (home / "features").exists()


def test_a_depth_the_backbone_lacks_exits_1_naming_the_range(cli, home):
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--depths", "0,9", "--limit", "4")
    assert r.exit_code == 1 and "depth 9 is not available in backbone lstm (3 blocks); choose depths in [0, 3]" in r.output
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
    for key in ("task", "backbone", "mode", "depth", "head", "trainable", "test_accuracy", "val_accuracy",
                "n_train", "n_val", "n_test", "seconds", "seed", "config", "version"):
        assert key in res
    assert res["mode"] == "output-only" and res["n_test"] == 360 and res["n_train"] == 1437
    assert res["test_accuracy"] > 0.5  # chance is 0.1
    r = cli("report")
    assert r.exit_code == 0 and "| tiny-gpt20 | ridge |" in r.stdout and "baseline: raw-input linear head" in r.stdout


def test_fit_without_features_exits_1(cli, home):
    r = cli("fit", "--task", "digits", "--backbone", "lstm")
    assert r.exit_code == 1 and "no feature file for task 'digits' and backbone 'lstm'" in r.output
    assert "run `reservoir extract --task digits --backbone lstm` first" in r.output


def test_listings(cli):
    r = cli("tasks")
    assert r.exit_code == 0 and "mnist" in r.stdout and "64 tokens x 16" in r.stdout
    r = cli("backbones")
    assert r.exit_code == 0 and "gpt2-random" in r.stdout and "lstm" in r.stdout

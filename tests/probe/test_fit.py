"""``fit``: which feature file ``--task``/``--backbone`` resolve to (by identity), and splits too small
for a head refused up front."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def user_file(path: Path, seed: int, n: int = 60) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=rng.random((n, 6, 3)).astype("float32"), y=np.arange(n) % 3)
    return path


def extract(cli, task: str, backbone: Path, *extra: str) -> Path:
    r = cli("-q", "extract", "--task", task, "--backbone", str(backbone), "--dtype", "float32", *extra)
    assert r.exit_code == 0, r.output
    return Path(r.stdout.strip())


def test_fit_picks_the_file_whose_data_digest_matches_among_same_named_user_files(cli, home, tiny_gpt2):
    a = user_file(home / "A" / "data.npz", seed=1)
    b = user_file(home / "B" / "data.npz", seed=2)
    fa, fb = extract(cli, f"file:{a}", tiny_gpt2), extract(cli, f"file:{b}", tiny_gpt2)
    assert fa.parent == fb.parent and fa != fb  # one folder: features/data.npz/BACKBONE/
    for path, features in ((b, fb), (a, fa)):
        r = cli(
            "-q",
            "fit",
            "--task",
            f"file:{path}",
            "--backbone",
            str(tiny_gpt2),
            "--head",
            "ridge",
            "--depths",
            "1",
            "--no-baselines",
        )
        assert r.exit_code == 0, r.output
        results = sorted((home / "results").rglob("*depth1*.json"), key=lambda p: p.stat().st_mtime)
        assert json.loads(results[-1].read_text())["features"] == str(features)

    c = user_file(home / "C" / "data.npz", seed=3)  # never extracted
    r = cli("-q", "fit", "--task", f"file:{c}", "--backbone", str(tiny_gpt2), "--no-baselines")
    assert r.exit_code == 1 and "none of the 2 feature files" in r.output
    assert "holds features of the data of another file named 'data.npz'" in r.output and str(fa) in r.output

    fb2 = extract(cli, f"file:{b}", tiny_gpt2, "--seed", "5")  # a second run of B's data: both truly match
    r = cli("-q", "fit", "--task", f"file:{b}", "--backbone", str(tiny_gpt2), "--no-baselines")
    assert r.exit_code == 1 and "2 feature files match" in r.output
    assert str(fb) in r.output and str(fb2) in r.output and str(fa) not in r.output


def test_a_user_file_extracted_from_one_folder_is_fitted_from_another(cli, home, tiny_gpt2, monkeypatch):
    """A ``file:`` task's features and results sit under the file's name whatever the working folder: from
    the folder holding the file as from its parent."""
    user_file(home / "data" / "toy.npz", seed=1)
    monkeypatch.chdir(home)
    features = extract(cli, "file:data/toy.npz", tiny_gpt2)
    monkeypatch.chdir(home / "data")
    r = cli(
        "-q", "fit", "--task", "file:toy.npz", "--backbone", str(tiny_gpt2), "--depths", "1", "--no-baselines"
    )
    assert r.exit_code == 0, r.output
    (result,) = (home / "results").rglob("*depth1*.json")
    assert json.loads(result.read_text())["features"] == str(features)
    assert result.parent.parent == home / "results" / "toy.npz" and features.parent.parent.name == "toy.npz"


def test_files_that_differ_only_in_their_splits_are_listed_apart(cli, home, tiny_gpt2):
    """Two extractions of one task that differ in what no fit option chooses by (the splits): each file's line
    shows the setting they differ in, so the two lines never read alike."""
    files = [
        extract(cli, "digits", tiny_gpt2, "--limit", "40", "--split", split) for split in ("train", "test")
    ]
    r = cli("-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--no-baselines")
    assert r.exit_code == 1 and "2 feature files match" in r.output and "differing in" in r.output
    lines = [line for line in r.output.splitlines() if any(str(f) in line for f in files)]
    assert len(lines) == 2 and all("splits" in line for line in lines)
    assert lines[0].split("(", 1)[1] != lines[1].split("(", 1)[1]


@pytest.mark.parametrize("limit", ["10", "60"])
def test_fit_refuses_a_train_split_too_small_and_writes_no_result(cli, home, tiny_gpt2, limit):
    path = extract(cli, "digits", tiny_gpt2, "--limit", limit, "--depths", "0")
    r = cli("fit", "--features", str(path), "--head", "ridge")
    assert (
        r.exit_code == 1
        and "fewer than one per class for validation: extract the features again with --limit 91 or more"
        in r.output
    ), r.output
    assert "or raise --val-fraction" in r.output
    assert f"(now {limit})" in r.output and "Traceback" not in r.output
    assert not (home / "results").exists()


def test_a_file_made_before_splits_were_checked_for_their_classes_is_refused(cli, home, tmp_path, tiny_gpt2):
    """Feature files whose splits disagree on their classes (made before extraction refused them: the first
    rows of a sorted file under --limit) are refused before any head is fitted, naming the classes, the splits
    and the extraction that mends them."""
    import h5py

    import reservoir.tasks.sizes
    from reservoir.identity import digest

    rng = np.random.default_rng(0)
    x = rng.random((40, 6, 3)).astype("float32")
    np.savez(
        tmp_path / "d.npz", x_train=x[:30], y_train=np.arange(30) % 3, x_test=x[30:], y_test=np.arange(10) % 4
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reservoir.tasks.sizes, "check_classes", lambda *a, **k: None)
        path = extract(cli, f"file:{tmp_path / 'd.npz'}", tiny_gpt2, "--limit", "40")
    with h5py.File(path, "r+") as f:  # as a file of format 2 records it: the first rows, no subset rule
        identity = json.loads(f.attrs["identity"])
        identity.pop("subset")
        f.attrs["identity"] = json.dumps({**identity, "format": 2})
        f.attrs["identity_hash"] = digest({**identity, "format": 2})
    r = cli("-q", "fit", "--features", str(path), "--no-baselines")
    assert r.exit_code == 1, r.output
    assert "split 'train' lacks class 3, which 'test' holds" in r.output
    assert "this file holds the first 40 rows of each split" in r.output and "reservoir extract" in r.output
    assert not (home / "results").exists()


def test_fit_picks_among_a_task_s_extractions_by_their_options(cli, home, tiny_gpt2):
    """Two extractions of one task and backbone differ in readout: fit names both and the options that tell
    them apart, and --readout picks one; an option no file matches is refused, with the extract command that
    makes the file asked for."""
    last = extract(cli, "digits", tiny_gpt2, "--limit", "200", "--depths", "0,1")
    mean = extract(cli, "digits", tiny_gpt2, "--limit", "200", "--depths", "0,1", "--readout", "mean")
    r = cli(
        "-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--head", "ridge", "--no-baselines"
    )
    assert r.exit_code == 1 and "2 feature files match" in r.output
    assert "differing in readout; pass --features with one of them, or --readout to choose" in r.output
    for readout, path in (("mean", mean), ("last", last)):
        r = cli("-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--head", "ridge",
                "--no-baselines", "--readout", readout, "--depth", "1")  # fmt: skip
        assert r.exit_code == 0, r.output
        results = [json.loads(p.read_text()) for p in (home / "results" / "digits").rglob("*.json")]
        assert any(res["config"]["fit"]["features"] == str(path) for res in results)
    seed_7 = ("-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--extract-seed", "7")
    r = cli(*seed_7, "--limit", "200")
    assert r.exit_code == 1 and "holds features of seed 0" in r.output
    made_by = re.search(r"run `reservoir (extract [^`]+)` first", r.output).group(1)
    r = cli("-q", "fit", "--features", str(mean), "--readout", "last")
    assert r.exit_code == 1 and "holds features of readout 'mean'" in r.output
    extract(
        cli, "digits", tiny_gpt2, "--limit", "200", "--depths", "0"
    )  # differs from `last` in depths alone
    r = cli("-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--readout", "last")
    assert r.exit_code == 1 and "differing in depths; pass --features with one of them (no option" in r.output
    assert cli("-q", *shlex.split(made_by), "--depths", "0,1").exit_code == 0  # the file the error asks for
    assert cli(*seed_7, "--limit", "200", "--depth", "1", "--no-baselines").exit_code == 0


def test_real_valued_targets_take_the_ridge_head_by_default(cli, home, tiny_gpt2):
    path = extract(cli, "narma10", tiny_gpt2, "--task-opt", "n_train=200", "--task-opt", "n_val=50",
                   "--task-opt", "n_test=50", "--depths", "0,1")  # fmt: skip
    r = cli("-q", "fit", "--features", str(path), "--no-baselines", "--depth", "1")
    assert r.exit_code == 0, r.output
    (result,) = [json.loads(p.read_text()) for p in (home / "results" / "narma10").rglob("*.json")]
    assert result["head"] == "ridge"


def test_a_fit_seed_or_held_out_share_that_changes_nothing_is_said_or_refused(cli, home, tmp_path, tiny_gpt2):
    """A file with its own validation split: ``--val-fraction`` (a share of train held out where there is none)
    is refused before any result; ``--seed`` with a head that takes none fits the same probe at every seed, so
    the result says so (``seeded``) and fit says it in words. Without the split, the seed draws it."""
    split = np.array(["train"] * 40 + ["val"] * 10 + ["test"] * 10)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "v.npz", x=rng.random((60, 6, 3)).astype("float32"), y=np.arange(60) % 3, split=split)
    path = extract(cli, f"file:{tmp_path / 'v.npz'}", tiny_gpt2, "--depths", "1")
    r = cli("fit", "--features", str(path), "--no-baselines", "--val-fraction", "0.3")
    assert (
        r.exit_code == 1
        and "has a validation split of its own, which is used: --val-fraction 0.3" in r.output
    )
    assert "Traceback" not in r.output and not (home / "results").exists()
    r = cli("fit", "--features", str(path), "--no-baselines", "--seed", "1", "--head", "ridge")
    assert (
        r.exit_code == 0
        and "--seed 1 changed nothing:" in r.stderr
        and "head ridge takes no seed" in r.stderr
    )
    (result,) = [json.loads(p.read_text()) for p in (home / "results").rglob("*.json")]
    assert result["seeded"] is False and result["seed"] == 1
    plain = extract(cli, f"file:{user_file(tmp_path / 'p.npz', 0)}", tiny_gpt2, "--depths", "1")
    r = cli("fit", "--features", str(plain), "--no-baselines", "--seed", "1", "--head", "ridge")
    assert r.exit_code == 0 and "changed nothing" not in r.stderr, r.output
    seeded = [
        json.loads(p.read_text()) for p in (home / "results").rglob("*.json") if "p.npz" in p.read_text()
    ]
    assert [s["seeded"] for s in seeded] == [True]


def test_a_fit_of_streamed_rows_is_a_result_of_its_own_beside_the_loaded_one(cli, home, tiny_gpt2):
    """``--memory-mb`` below a depth's train features streams them to another solver (other scores): that fit
    neither overwrites nor is folded with the fit of the loaded rows, and the report tells the two apart."""
    x = np.random.default_rng(4).random((11_000, 6, 3)).astype("float32")  # 8,800 train rows x 32: over 1 MiB
    data = home / "data" / "big.npz"
    data.parent.mkdir()
    np.savez(data, x=x, y=(x[:, -1, 0] > 0.5).astype(int))
    extract(cli, f"file:{data}", tiny_gpt2)
    fit = [
        "-q",
        "fit",
        "--task",
        f"file:{data}",
        "--backbone",
        str(tiny_gpt2),
        "--depths",
        "1",
        "--no-baselines",
    ]
    for extra in ([], ["--memory-mb", "1"]):
        r = cli(*fit, "--head", "logreg", *extra)
        assert r.exit_code == 0, r.output
    found = [json.loads(p.read_text()) for p in (home / "results").rglob("*depth1*.json")]
    assert sorted(r["streamed"] for r in found) == [False, True], [r["key"] for r in found]
    assert len({r["key"] for r in found}) == 2
    report = cli("report")
    assert report.exit_code == 0, report.output
    rows = [line for line in report.stdout.splitlines() if "| logreg |" in line]
    assert len(rows) == 2 and sum("fit streamed true" in line for line in rows) == 1, report.stdout

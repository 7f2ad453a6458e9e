"""Results (reservoir/results.py): one typed result of every kind, written and read by one module."""

from __future__ import annotations

import json

import pytest

from reservoir.results import REQUIRED, Result, load_results, write_result


def result(mode: str = "output-only", **extra) -> Result:
    return Result(
        task="digits",
        backbone="lstm",
        mode=mode,
        depth=None if mode == "baseline" else 2,
        head="ridge",
        trainable=["out"],
        seed=0,
        identity={"task": "digits", "seed": 0},
        config={"fit": {"val_fraction": 0.1}},
        scores={
            "metric": "accuracy",
            "test_score": 0.9,
            "val_score": 0.8,
            "test_accuracy": 0.9,
            "val_accuracy": 0.8,
            "n_train": 10,
            "n_val": 2,
            "n_test": 5,
        },  # fmt: skip
        seconds=1.5,
        extra=extra,
    )


@pytest.mark.parametrize("mode", ["output-only", "baseline", "end-to-end"])
def test_every_kind_is_written_with_the_whole_schema_and_read_back(home, mode):
    path = write_result(result(mode, baseline="majority") if mode == "baseline" else result(mode))
    written = json.loads(path.read_text())
    assert set(REQUIRED) <= set(written) and written["mode"] == mode
    (read,) = load_results([path])
    assert read["key"] == written["key"] and read["test_score"] == 0.9


def test_a_result_file_of_the_accuracy_only_schema_is_still_read(home, tmp_path):
    """Files written before ``metric`` and ``test_score`` existed hold accuracies alone."""
    old = result().to_json()
    for k in ("metric", "test_score", "val_score"):
        old.pop(k)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    (read,) = load_results([path])
    assert (read["metric"], read["test_score"], read["val_score"]) == ("accuracy", 0.9, 0.8)


def test_a_result_refuses_an_unknown_mode_or_missing_scores():
    with pytest.raises(ValueError, match="result mode 'probe' is not one of"):
        result("probe")
    with pytest.raises(ValueError, match=r"result scores lack \['n_test'\]"):
        Result(**{**result().__dict__, "scores": {k: v for k, v in result().scores.items() if k != "n_test"}})


@pytest.mark.parametrize(
    "fails",
    [
        OSError(28, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos"),
    ],
    ids=["full-disk", "torch-save"],
)
def test_a_write_that_fails_names_the_file_and_the_fix_and_leaves_nothing(tmp_path, fails):
    """A full disk while writing (as ``open`` reports it, or as ``torch.save`` does) and a folder that cannot be
    made: a StoreError naming the file and the fix, no temporary file left, an earlier file kept."""
    from reservoir.errors import StoreError
    from reservoir.results import atomic_write

    target = tmp_path / "r.json"
    target.write_text("before")

    def write(f):
        f.write(b"partial")
        raise fails

    with pytest.raises(StoreError, match=rf"{target} could not be written: the disk is full\. Free space"):
        atomic_write(target, write)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and target.read_text() == "before"
    with pytest.raises(StoreError, match="could not be written: its folder cannot be made .* Choose another"):
        atomic_write(target / "under-a-file.json", lambda f: f.write(b"x"))


def test_report_names_a_file_of_another_kind_and_the_json_it_skips(cli, tmp_path):
    """A feature file or a saved probe given to report is named as not a result (not 'rerun the fit'); in a
    folder, JSON files that are not results are skipped with a note."""
    (tmp_path / "f.h5").write_bytes(b"\\x89HDF\\r\\n\\x1a\\n" + bytes(64))
    r = cli("report", str(tmp_path / "f.h5"))
    assert r.exit_code == 1 and "f.h5 is not a reservoir result" in r.output and "rerun" not in r.output, (
        r.output
    )
    (tmp_path / "notes.json").write_text("{}")
    r = cli("report", str(tmp_path))
    assert "skipped 1 JSON file(s) that are not results" in r.stderr, r.output

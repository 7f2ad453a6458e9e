"""Train splits too small for a head (reservoir/tasks/sizes.py): refused naming the side that is short and the
fix that helps."""

from __future__ import annotations

import numpy as np
import pytest

from reservoir.errors import UsageError
from reservoir.tasks.sizes import check_train_split


def tenth(n: int) -> int:
    return max(1, round(0.1 * n))


def test_a_validation_part_short_of_a_class_each_says_validation_and_raise_val_fraction():
    labels = np.arange(15) % 10
    with pytest.raises(UsageError) as e:
        check_train_split("task 'digits'", labels, limit=15, n_val=tenth, val_fraction=0.1)
    said = str(e.value)
    assert "leaves 2 for validation and 13 to train on, fewer than one per class for validation" in said
    assert "pass --limit" in said and "(now 15)" in said and said.endswith("or raise --val-fraction")


def test_data_shorter_than_its_limit_is_not_told_to_raise_the_limit():
    with pytest.raises(UsageError) as e:
        check_train_split("task 'narma10'", np.zeros(1), limit=50, n_val=tenth, val_fraction=0.1)
    said = str(e.value)
    assert "raise --limit" not in said and "give more examples" in said
    assert "fewer than --limit 50; a task option may set its size" in said
    with pytest.raises(UsageError, match=r"raise --limit \(now 1\) or leave it out"):
        check_train_split("task 'narma10'", np.zeros(1), limit=1, n_val=tenth, val_fraction=0.1)
    check_train_split("task 'narma10'", np.zeros(20), limit=20, n_val=tenth, val_fraction=0.1)


@pytest.mark.parametrize("counts", [[10] * 10, [50, 3, 1, 7], [1, 1, 98], [5], [2, 2, 2, 1]])
def test_the_limit_named_to_keep_every_class_is_the_smallest_that_does(counts):
    """``keeps_every_class``: a stratified ``--limit`` sample of that many rows holds every class, and one row
    fewer does not (under any seed)."""
    from reservoir.tasks import sample_rows
    from reservoir.tasks.sizes import keeps_every_class

    labels = np.repeat(np.arange(len(counts)), counts)
    need = keeps_every_class(labels)

    def kept(n: int, seed: int) -> int:
        return len(np.unique(labels[sample_rows(labels, n, seed, "train", stratify=True)]))

    assert all(kept(need, seed) == len(counts) for seed in range(5))
    assert need == len(counts) or all(kept(need - 1, seed) < len(counts) for seed in range(5))


def test_a_limit_sample_that_loses_a_class_says_so_and_records_it(cli, home):
    """digits --limit 9: a stratified sample of 9 rows cannot hold 10 classes. Extraction says which class
    every split lost and the --limit that keeps them all; the identity records it, and so does the data's
    label in a report, so its results never stand as the 10-class task's."""
    import json

    import h5py

    from reservoir.report.rows import data_label

    r = cli("-q", "extract", "--task", "digits", "--backbone", "lstm", "--limit", "9", "--depths", "0")
    assert r.exit_code == 0, r.output
    assert (
        "note: task 'digits': the sample of --limit 9 holds 9 of train's 10 classes, class 8 left out of "
        "every split: its results are of 9 classes; pass --limit 10 or more to keep them all"
    ) in r.stderr
    with h5py.File(r.stdout.strip().splitlines()[-1]) as f:
        identity = json.loads(f.attrs["identity"])
    assert identity["subset"] == {"rule": "stratified", "seed": 0, "left_out": [8]}
    label = data_label({"identity": identity})
    assert label.endswith("a stratified sample (--limit 9, seed 0), without class 8"), label
    r = cli("-q", "extract", "--task", "digits", "--backbone", "lstm", "--limit", "10", "--depths", "0")
    assert r.exit_code == 0 and "note:" not in r.stderr

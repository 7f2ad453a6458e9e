"""Digests taken as the writer writes (:class:`reservoir.extract.digests.RunningDigests`) equal those read back
from the completed file, whatever order the rows arrive in and however the run was interrupted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reservoir.extract.digests import DIGESTS, RunningDigests, content_digests
from reservoir.extract.h5 import h5_file
from reservoir.extract.store import FeatureWriter

SHAPE = (3, 1, 8)
IDENTITY = {
    "task": "t",
    "backbone": "b",
    "seed": 0,
    "dtype": "float32",
    "readout": "last",
    "depths": [0, 1, 2],
}


def rows_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float32)


def write(path, order: list[np.ndarray], features: np.ndarray, stop: int | None = None):
    """Write ``features`` batch by batch in ``order``; stop (without completing) after ``stop`` batches."""
    w = FeatureWriter.open(path, IDENTITY, {}, {"w": np.zeros(2, np.float32)})
    try:
        done = w.split("train", np.arange(len(features)), np.full(len(features), 4), SHAPE)
        for i, rows in enumerate(order):
            if stop is not None and i == stop:
                return None
            rows = rows[~done[rows]]
            if len(rows):
                w.write("train", rows, features[rows])
        return w.finish()
    finally:
        w.close()


@pytest.mark.parametrize(
    "order",
    [
        "in order",
        "buckets out of order",
        "resumed",
    ],
)
def test_digests_taken_while_writing_equal_the_files_own(tmp_path, order, monkeypatch):
    features = rows_of(103)
    batches = [np.arange(i, min(i + 10, 103)) for i in range(0, 103, 10)]
    taken = []
    real = RunningDigests.taken

    def spy(self, split):
        out = real(self, split)
        taken.append(out[1])
        return out

    monkeypatch.setattr(RunningDigests, "taken", spy)
    path = tmp_path / "f.h5"
    if order == "buckets out of order":
        batches = batches[3:] + batches[:3]
    if order == "resumed":
        assert write(path, batches, features, stop=4) is None
    write(path, batches, features)
    with h5_file(path) as f:
        recorded = json.loads(f["train"].attrs[DIGESTS])
        assert recorded == content_digests(f, "train")  # read back from the file alone
        np.testing.assert_array_equal(f["train"]["features"][:], features)
    assert taken == ([103] if order == "in order" else [0])  # in order, nothing is read back


def test_a_file_damaged_after_completion_no_longer_matches_its_digests(tmp_path):
    features = rows_of(40)
    path = write(tmp_path / "f.h5", [np.arange(0, 20), np.arange(20, 40)], features)
    with h5_file(path, "r+") as f:
        recorded = json.loads(f["train"].attrs[DIGESTS])
        f["train"]["features"][5, 1] += 1.0
        assert content_digests(f, "train")["features"][1] != recorded["features"][1]
        assert content_digests(f, "train")["features"][0] == recorded["features"][0]

"""Features stored as float16 or bfloat16 (``--store-dtype``): the float32 features rounded as torch rounds
them, read back as float32 by every reader, recorded in the identity, half the bytes on disk; a bfloat16 run
stored as bfloat16 loses nothing; a value float16 cannot hold is refused, never stored as inf."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.errors import StoreError
from reservoir.extract.store import FeatureWriter, open_features, read_depths
from reservoir.extract.stored import STORED, as_float32, finite, to_stored

pytestmark = pytest.mark.usefixtures("one_thread")

OPTS = ("--task", "digits", "--limit", "120", "--depths", "0,1,2", "--batch-size", "32")
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def rounded(x: np.ndarray, store: str) -> np.ndarray:
    """``x`` rounded to ``store`` by torch, as float32."""
    return torch.from_numpy(x).to(TORCH[store]).float().numpy()


@pytest.mark.parametrize("store", ["float16", "bfloat16"])
def test_rounding_is_torchs_and_reading_back_is_exact(store):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10_000) * 10.0 ** rng.integers(-6, 4, 10_000), [0.0, -0.0, 1.0]])
    x = x.astype(np.float32)
    kept = to_stored(x, store)
    assert kept.dtype == STORED[store] and finite(kept).all()
    np.testing.assert_array_equal(as_float32(kept), rounded(x, store))
    assert to_stored(kept, store) is kept  # already stored: taken as it is


def test_bfloat16_bits_that_are_not_finite_are_found():
    bits = to_stored(np.array([np.inf, -np.inf, np.nan, 3.0], dtype=np.float32), "bfloat16")
    assert finite(bits).tolist() == [False, False, False, True]


def extract(cli, backbone, out: Path, *extra: str):
    r = cli("-q", "extract", *OPTS, "--backbone", str(backbone), "--out", str(out), *extra)
    assert r.exit_code == 0, r.output
    with open_features(out) as f:
        return read_depths(f, "train")[0], f["train"]["features"].dtype, json.loads(f.attrs["identity"])


@pytest.mark.parametrize("store", ["float16", "bfloat16"])
def test_stored_features_are_the_float32_ones_rounded_at_half_the_bytes(cli, home, tiny_gpt2, store):
    full, dtype, identity = extract(cli, tiny_gpt2, home / "f32.h5", "--dtype", "float32")
    assert dtype == np.float32 and "store_dtype" not in identity  # float32 files keep their identities
    half, dtype, identity = extract(
        cli, tiny_gpt2, home / "half.h5", "--dtype", "float32", "--store-dtype", store
    )
    assert dtype == STORED[store] and identity["store_dtype"] == store
    assert half.dtype == np.float32
    np.testing.assert_array_equal(half, rounded(full, store))
    with h5py.File(home / "f32.h5") as a, h5py.File(home / "half.h5") as b:
        ratio = b["train/features"].id.get_storage_size() / a["train/features"].id.get_storage_size()
        assert 0.49 < ratio < 0.52  # half, besides the chunks' checksums
    # fit reads them; the file is verified (digests of the stored bytes) and reused by the same command
    r = cli("-q", "fit", "--features", str(home / "half.h5"), "--head", "ridge", "--depths", "2")
    assert r.exit_code == 0, r.output
    again = cli("extract", *OPTS, "--backbone", str(tiny_gpt2), "--out", str(home / "half.h5"), "--dtype",
                "float32", "--store-dtype", store)  # fmt: skip
    assert again.exit_code == 0 and "reusing" in again.stderr and "contents verified" in again.stderr


def test_a_bfloat16_run_stored_as_bfloat16_loses_nothing(cli, home, tiny_gpt2):
    full, *_ = extract(cli, tiny_gpt2, home / "f32.h5", "--dtype", "bfloat16", "--engine", "torch")
    kept, *_ = extract(cli, tiny_gpt2, home / "bf.h5", "--dtype", "bfloat16", "--engine", "torch",
                       "--store-dtype", "bfloat16")  # fmt: skip
    np.testing.assert_array_equal(kept, full)


def test_the_default_file_name_says_how_features_are_stored(cli, home, tiny_gpt2):
    r = cli(
        "-q", "extract", *OPTS, "--backbone", str(tiny_gpt2), "--dtype", "float32", "--store-dtype", "float16"
    )
    assert r.exit_code == 0, r.output
    (path,) = (home / "features").rglob("*.h5")
    assert path.name.startswith("float32-store-float16-seed0-")


def test_a_value_float16_cannot_hold_is_refused_and_the_rows_stay_undone(tmp_path):
    identity = {"format": 1, "store_dtype": "float16", "depths": [0], "task": "t", "backbone": "b", "seed": 0,
                "dtype": "float32", "readout": "last"}  # fmt: skip
    writer = FeatureWriter.open(tmp_path / "f.h5", identity, {}, {})
    try:
        done = writer.split("train", np.zeros(2, dtype=np.int64), np.ones(2, dtype=np.int64), (1, 1, 4))
        features = np.ones((2, 1, 1, 4), dtype=np.float32)
        features[1, 0, 0, 2] = 1e5
        with pytest.raises(
            StoreError,
            match=r"row 1 of split 'train' .*beyond float16's range.*bfloat16 or float32 \(--store-dtype\)",
        ):
            writer.write("train", np.arange(2), features)
        assert not done.any() and not writer.f["train/done"][:].any()
    finally:
        writer.close()

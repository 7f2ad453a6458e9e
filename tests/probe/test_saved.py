"""Saved probes (:mod:`reservoir.probe.saved`) keep the class names of their data: predictions name their
classes, and features whose data names the same ids otherwise are refused."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from reservoir import api
from reservoir.errors import IdentityError, UsageError
from reservoir.probe.saved import load_probe, predict_file, predicted_names, predictions_csv
from tests.extract.test_export import named_images

pytestmark = pytest.mark.usefixtures("home", "one_thread")


def test_a_probe_names_the_classes_it_predicts_and_refuses_data_that_names_them_otherwise(
    tmp_path, cli, tiny_gpt2
):
    root = named_images(tmp_path / "images", ("10", "2", "1"), n=10)
    features = api.extract(f"file:{root}", str(tiny_gpt2), depths="1", dtype="float32", compile=False)
    r = cli("-q", "fit", "--features", str(features), "--head", "ridge", "--no-baselines")
    assert r.exit_code == 0, r.output
    (result,) = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("*depth1*.json")]
    probe = load_probe(result["probe"])
    assert probe.class_names == ["1", "2", "10"]  # natural order of the folder names
    predictions, labels, names = predict_file(probe, features, "test")
    assert names == probe.class_names
    rows = list(
        csv.DictReader(predictions_csv(predictions, labels, probe.class_names, None, names).splitlines())
    )
    assert [r["label_name"] for r in rows] == [probe.class_names[k] for k in labels]
    assert [r["prediction_name"] for r in rows] == [probe.class_names[k] for k in predictions]
    assert predicted_names(probe, predictions).tolist() == [r["prediction_name"] for r in rows]
    assert "prediction_name" not in predictions_csv(predictions, labels)  # without names: ids only
    unnamed = list(csv.DictReader(predictions_csv(predictions, labels, probe.class_names).splitlines()))
    assert "label_name" not in unnamed[0] and unnamed[0]["prediction_name"]  # labels of data naming none

    other = named_images(tmp_path / "other", ("ant", "bee", "cow"), n=10)
    elsewhere = api.extract(f"file:{other}", str(tiny_gpt2), depths="1", dtype="float32", compile=False)
    with pytest.raises(
        IdentityError, match="names class\\(es\\) 'ant', 'bee', 'cow' that the probe does not know"
    ):
        predict_file(probe, elsewhere, "test")
    assert np.array_equal(predict_file(probe, features, "test")[1], labels)


def test_labels_of_data_that_names_no_classes_are_never_named_by_the_probes_names(tmp_path, cli, tiny_gpt2):
    """``predict --features`` of data whose labels are bare ids, with a probe whose data named its classes:
    predictions are named by the probe, the file's labels are not (their ids mean what that data meant)."""
    rng = np.random.default_rng(0)
    x = rng.random((60, 5, 3)).astype("float32")
    np.savez(tmp_path / "named.npz", x=x, y=np.array(["bird", "cat", "dog"])[np.arange(60) % 3])
    np.savez(tmp_path / "bare.npz", x=x[::-1].copy(), y=(np.arange(60) % 2).astype(bool))
    files = {}
    for name in ("named", "bare"):
        r = cli("-q", "extract", "--task", f"file:{tmp_path / name}.npz", "--backbone", str(tiny_gpt2))
        assert r.exit_code == 0, r.output
        files[name] = r.stdout.strip()
    r = cli("-q", "fit", "--features", files["named"], "--head", "ridge", "--depths", "1", "--no-baselines")
    assert r.exit_code == 0, r.output
    (probe,) = (tmp_path / "results").rglob("*depth1*.probe.npz")
    out = tmp_path / "p.csv"
    r = cli("predict", "--probe", str(probe), "--features", files["bare"], "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert "label_name" not in rows[0] and {r["label"] for r in rows} == {"0", "1"}
    assert {r["prediction_name"] for r in rows} <= {"bird", "cat", "dog"}


def test_a_probe_of_several_readout_tokens_reads_the_flattened_features_read_features_returns(tiny_gpt2):
    """``probe.predict`` takes ``api.read_features(path, split, depth=K)``'s ``(N, n_readout * d_model)`` as it
    takes ``(N, n_readout, d_model)``: the same predictions as the feature file's; another width is refused
    naming both forms."""
    features = api.extract("bit_xor", str(tiny_gpt2), limit=40, depths="1", dtype="float32", compile=False)
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    probe = load_probe(result["probe"])
    r, d = probe.meta["n_readout"], probe.meta["d_model"]
    X, _ = api.read_features(features, "test", depth=1)
    assert r > 1 and X.shape[1:] == (r * d,)
    expected = predict_file(probe, features, "test")[0]
    np.testing.assert_array_equal(probe.predict(X), expected)
    np.testing.assert_array_equal(probe.predict(X.reshape(len(X), r, d)), expected)
    with pytest.raises(UsageError, match=rf"features must be \(N, {r}, {d}\) .* or \(N, {r * d}\)"):
        probe.predict(X[:, :-1])

"""Saved probes (:mod:`reservoir.probe.saved`) keep the class names of their data: predictions name their
classes, and features whose data names the same ids otherwise are refused."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from reservoir import api
from reservoir.errors import IdentityError
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
    predictions, labels = predict_file(probe, features, "test")
    rows = list(csv.DictReader(predictions_csv(predictions, labels, probe.class_names).splitlines()))
    assert [r["label_name"] for r in rows] == [probe.class_names[k] for k in labels]
    assert [r["prediction_name"] for r in rows] == [probe.class_names[k] for k in predictions]
    assert predicted_names(probe, predictions).tolist() == [r["prediction_name"] for r in rows]
    assert "prediction_name" not in predictions_csv(predictions, labels)  # without names: ids only

    other = named_images(tmp_path / "other", ("ant", "bee", "cow"), n=10)
    elsewhere = api.extract(f"file:{other}", str(tiny_gpt2), depths="1", dtype="float32", compile=False)
    with pytest.raises(IdentityError, match="class names: class 0 is '1' to the probe and 'ant' in the file"):
        predict_file(probe, elsewhere, "test")
    assert np.array_equal(predict_file(probe, features, "test")[1], labels)

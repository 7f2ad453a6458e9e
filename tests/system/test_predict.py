"""``reservoir predict --data PATH`` (and ``api.predict(probe, data=...)``): new data of any kind ``--task
file:PATH`` reads goes through the probe's extraction and the probe in one call, every row in input order,
named where the classes are, scored where labels are given; bad input is refused in words before any file is
written."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from reservoir import api
from reservoir.errors import DataError, UsageError
from reservoir.probe.saved import load_probe
from tests.conftest import save_tiny_gpt2
from tests.extract.test_export import named_images

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = pytest.mark.usefixtures("home", "one_thread")

CLASSES = ["down", "up"]


def table(path, x, labels=None, split=None):
    """A Parquet file of token rows ``x`` (N, T, d), with a ``label`` column (names) and a ``split`` column."""
    columns = {"x": [row.tolist() for row in x]}
    if labels is not None:
        columns["label"] = list(labels)
    if split is not None:
        columns["split"] = list(split)
    pq.write_table(pa.table(columns), path)
    return path


def rows(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6, 3)).astype(np.float32)
    return x, np.array([CLASSES[k] for k in (x[:, :, 0].mean(1) > 0).astype(int)])


@pytest.fixture
def fitted(tmp_path, tiny_gpt2):
    """A probe fitted on a labeled Parquet of named classes: (probe path, training file, its features, rows)."""
    x, y = rows(80)
    mine = table(tmp_path / "mine.parquet", x, y)
    features = api.extract(f"file:{mine}", str(tiny_gpt2), depths="2", dtype="float32", compile=False)
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    return result["probe"], mine, features, x


def lines(text):
    return list(csv.DictReader(text.splitlines()))


def test_predict_on_an_unlabeled_parquet_gives_every_row_in_order_with_class_names(tmp_path, cli, fitted):
    probe_path, _, features, x = fitted
    order = np.random.default_rng(1).permutation(len(x))[:30]
    new = table(tmp_path / "new.parquet", x[order])  # rows of the training file, shuffled: no labels
    r = cli("predict", "--probe", probe_path, "--data", str(new))
    assert r.exit_code == 0, r.output
    got = lines(r.stdout)
    assert list(got[0]) == ["row", "prediction", "prediction_name"]  # no labels: no label columns
    assert [int(g["row"]) for g in got] == list(range(len(order)))
    assert [g["prediction_name"] for g in got] == [CLASSES[int(g["prediction"])] for g in got]
    assert "30 rows predicted" in r.stderr and "no labels to score" in r.stderr and "label" in r.stderr
    # the same extraction, row by row in input order: the features are those of the same rows in training
    made = r.stderr.split("features in ")[1].split(";")[0].strip()
    X_new, placeholders = api.read_features(made, "predict", depth=2)
    X_all = np.concatenate([api.read_features(features, s, depth=2)[0] for s in ("train", "test")])
    probe = load_probe(probe_path)
    assert (placeholders == -1).all()
    assert [int(g["prediction"]) for g in got] == probe.predict(X_new).tolist()
    # each new row's features equal the features of the training row it copies
    distances = ((X_new[:, None] - X_all[None]) ** 2).sum(-1).min(1)
    assert np.allclose(distances, 0, atol=1e-6)
    again = cli("predict", "--probe", probe_path, "--data", f"file:{new}")  # written as --task takes it
    assert again.exit_code == 0 and again.stdout == r.stdout and "reusing" in again.stderr
    assert not list((tmp_path / "features").rglob("*.partial")) and not list(
        (tmp_path / "features").rglob("*.lock")
    )
    names = api.predict(probe_path, data=new, names=True, progress=False)
    assert names.tolist() == [g["prediction_name"] for g in got]


def test_labels_given_are_scored_and_a_file_whose_rows_are_all_test_is_read_whole(tmp_path, cli, fitted):
    probe_path, *_ = fitted
    x, y = rows(24, seed=5)
    new = table(tmp_path / "labeled.parquet", x, y, split=["test"] * len(x))  # all test: no train split
    r = cli("predict", "--probe", probe_path, "--data", str(new), "--out", str(tmp_path / "p.csv"))
    assert r.exit_code == 0, r.output
    got = lines((tmp_path / "p.csv").read_text())
    assert len(got) == 24 and [g["label_name"] for g in got] == y.tolist()
    accuracy = np.mean([g["prediction"] == g["label"] for g in got])
    assert f"24 rows, accuracy {100 * accuracy:.2f}%" in r.stderr and "wrote" in r.stderr
    assert api.predict(probe_path, data=new, progress=False).tolist() == [int(g["prediction"]) for g in got]


def test_an_image_folder_without_labels_is_predicted_file_by_file(tmp_path, cli, tiny_gpt2):
    root = named_images(tmp_path / "images", ("cat", "dog"), n=12)
    features = api.extract(f"file:{root}", str(tiny_gpt2), depths="1", dtype="float32", compile=False)
    r = cli("-q", "fit", "--features", str(features), "--head", "ridge", "--no-baselines")
    assert r.exit_code == 0, r.output
    (probe_path,) = (tmp_path / "results").rglob("*.probe.npz")
    loose = tmp_path / "new"
    (loose / "more").mkdir(parents=True)
    for k, name in enumerate(["10.png", "2.png", "more/1.png"]):  # natural order: 2, 10, more/1
        shutil.copy(root / ("cat" if k else "dog") / f"{k}.png", loose / name)
    r = cli("predict", "--probe", str(probe_path), "--data", str(loose))
    assert r.exit_code == 0, r.output
    got = lines(r.stdout)
    assert [g["file"] for g in got] == ["2.png", "10.png", "more/1.png"]
    assert list(got[0]) == ["row", "file", "prediction", "prediction_name"]
    assert {g["prediction_name"] for g in got} <= {"cat", "dog"}
    assert "no labels to score (the images lie in" in r.stderr
    # class folders of only some of the probe's classes keep the probe's numbering
    some = tmp_path / "some"
    shutil.copytree(root / "dog", some / "dog")
    r = cli("predict", "--probe", str(probe_path), "--data", str(some))
    assert r.exit_code == 0, r.output
    assert {g["label"] for g in lines(r.stdout)} == {"1"} and "accuracy" in r.stderr


def test_bad_input_is_refused_in_words_before_any_file_is_written(tmp_path, cli, fitted, tiny_gpt2):
    probe_path, mine, features, x = fitted
    other_model = save_tiny_gpt2(tmp_path / "other", seed=1)  # the same architecture, other weights
    moved = shutil.copytree(tiny_gpt2, tmp_path / "moved")  # the probe's weights, elsewhere
    arrays = tmp_path / "rows.npz"
    np.savez(arrays, x=x[:10])
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = cli("predict", "--probe", probe_path, "--data", str(arrays), "--task-opt", "input=x")
    assert r.exit_code == 1 and "--task-opt input=x names a table's input column" in r.stderr, r.output
    assert "does not apply to" in r.stderr and "an .npz file's arrays are read by their names" in r.stderr
    narrow = table(tmp_path / "narrow.parquet", x[:10, :, :2])  # tokens of 2 values, the probe's have 3
    r = cli("predict", "--probe", probe_path, "--data", str(narrow))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "narrow.parquet holds tokens of 2 value(s), the probe reads tokens of 3 value(s)" in r.stderr
    r = cli("predict", "--probe", str(mine), "--data", str(mine))  # a Parquet file is not a probe
    assert r.exit_code == 1 and "is not a saved probe: it is a Parquet file" in r.stderr
    r = cli("predict", "--probe", str(features), "--data", str(mine))
    assert r.exit_code == 1 and "pass it as --features" in r.stderr
    other = table(tmp_path / "other.parquet", x[:10], ["up", "left"] * 5)  # a class the probe does not know
    r = cli("predict", "--probe", probe_path, "--data", str(other))
    assert r.exit_code == 1 and "'left' name no class the probe knows (its classes: down, up)" in r.stderr
    r = cli("predict", "--probe", probe_path, "--data", str(mine), "--features", str(features))
    assert r.exit_code == 2 and "not both" in r.output
    r = cli("predict", "--probe", probe_path, "--data", str(mine), "--split", "train")
    assert r.exit_code == 2 and "--split is for --features" in r.output
    r = cli("predict", "--probe", probe_path, "--data", str(tmp_path / "absent.parquet"))
    assert r.exit_code == 1 and "absent.parquet does not exist" in r.stderr
    r = cli("predict", "--probe", probe_path, "--data", str(features))  # features are not data
    assert r.exit_code == 1 and "is a feature file `reservoir extract` wrote, not data" in r.stderr
    r = cli("predict", "--probe", probe_path, "--data", str(mine), "--backbone", str(other_model))
    assert r.exit_code == 1 and "loads other weights than the probe's features came from" in r.stderr
    assert "Traceback" not in r.output
    shallow = save_tiny_gpt2(tmp_path / "shallow", n_layer=1)  # has no depth 2, the probe's
    r = cli("predict", "--probe", probe_path, "--data", str(mine), "--backbone", str(shallow))
    assert r.exit_code == 1 and "is not the probe's backbone ('tiny-gpt20'), and depth" in r.stderr, r.output
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert [p for p in after if p not in before and "shallow" not in p.parts] == [
        narrow.relative_to(tmp_path),
        other.relative_to(tmp_path),
    ]
    r = cli("predict", "--probe", probe_path, "--data", str(mine), "--backbone", str(moved))  # a moved folder
    assert r.exit_code == 0, r.output
    assert len(lines(r.stdout)) == len(x) and "accuracy" in r.stderr


def test_names_need_a_probe_whose_data_named_its_classes(tmp_path, tiny_gpt2):
    x, y = rows(60)
    ids = table(tmp_path / "ids.parquet", x, [CLASSES.index(v) for v in y])
    features = api.extract(f"file:{ids}", str(tiny_gpt2), depths="1", dtype="float32", compile=False)
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    assert api.predict(result["probe"], data=ids, progress=False).shape == (60,)
    with pytest.raises(UsageError, match="named no classes"):
        api.predict(result["probe"], data=ids, names=True)
    meta = json.loads(str(np.load(result["probe"])["meta"]))
    assert meta["tokens"] == {"kind": "dense", "width": 3} and meta["extraction"]["backbone"] == str(
        tiny_gpt2
    )


def test_a_probe_of_a_model_object_predicts_in_the_process_that_holds_it(tmp_path, tiny_gpt2, monkeypatch):
    """A probe fitted on a model object's features predicts new data in the same process without the model
    handed over again; in another process (the object unknown there) it asks for it in words."""
    from transformers import GPT2Model

    from reservoir.model.backbones import OBJECTS

    x, y = rows(60)
    mine = table(tmp_path / "mine.parquet", x, y)
    model = GPT2Model.from_pretrained(tiny_gpt2).eval()
    features = api.extract(f"file:{mine}", model, depths="2", dtype="float32", compile=False)
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    new = table(tmp_path / "new.parquet", rows(5, seed=1)[0])
    same = api.predict(result["probe"], data=str(new), progress=False)
    np.testing.assert_array_equal(
        same, api.predict(result["probe"], data=str(new), backbone=model, progress=False)
    )
    monkeypatch.setattr("reservoir.model.backbones.OBJECTS", {})
    assert OBJECTS  # the process's own table, set aside for the call below
    with pytest.raises(UsageError, match=r"fitted on features of a model object .* backbone=model"):
        api.predict(result["probe"], data=str(new), progress=False)


def test_a_folder_labeled_only_in_part_is_predicted_unlabeled(tmp_path, fitted, tiny_gpt2):
    """A folder of a labeled train.parquet and an unlabeled test.parquet (Kaggle's layout) is predicted on as
    unlabeled data, every row in order; extracted as a task, the file without labels is named."""
    probe, _, _, _ = fitted
    folder = tmp_path / "kaggle"
    folder.mkdir()
    x, y = rows(10)
    table(folder / "train.parquet", x, y)
    table(folder / "test.parquet", rows(4, seed=1)[0])
    predicted = api.predict(probe, data=str(folder), progress=False)
    assert len(predicted) == 14
    with pytest.raises(DataError, match=r"test.parquet has no column named y / label / labels / target"):
        api.extract(f"file:{folder}", str(tiny_gpt2), dtype="float32", compile=False)


def test_a_class_label_of_the_probes_classes_in_another_order_is_renumbered_by_name(tmp_path, cli, fitted):
    """A datasets ClassLabel naming the probe's classes in another order (["up", "down"] to a probe of
    ["down", "up"]) is scored by name: each row's label is the probe's id of its name; a class the probe does
    not know is refused naming it."""
    ds = pytest.importorskip("datasets")
    probe_path, *_ = fitted
    x, y = rows(12, seed=3)
    features = ds.Features(
        {"x": ds.Sequence(ds.Sequence(ds.Value("float32"))), "label": ds.ClassLabel(names=["up", "down"])}
    )
    swapped = ["up", "down"]
    data = {"x": x.tolist(), "label": [swapped.index(n) for n in y]}
    ds.Dataset.from_dict(data, features=features).save_to_disk(tmp_path / "swapped")
    r = cli(
        "predict",
        "--probe",
        probe_path,
        "--data",
        str(tmp_path / "swapped"),
        "--out",
        str(tmp_path / "p.csv"),
    )
    assert r.exit_code == 0, r.output
    got = lines((tmp_path / "p.csv").read_text())
    assert [g["label_name"] for g in got] == y.tolist()
    assert [CLASSES[int(g["label"])] for g in got] == y.tolist()
    other = ds.Features({"x": features["x"], "label": ds.ClassLabel(names=["up", "sideways"])})
    ds.Dataset.from_dict(data, features=other).save_to_disk(tmp_path / "other")
    r = cli("predict", "--probe", probe_path, "--data", str(tmp_path / "other"))
    assert r.exit_code == 1 and "names a class 'sideways' that the probe does not know" in r.output


def test_data_of_another_fixed_row_length_is_refused_naming_both_and_rows_of_their_own_lengths_are_not(
    tmp_path, cli, fitted, tiny_gpt2
):
    """New data whose rows are of another fixed length than the probe's data's (images of another size) is
    refused before extraction, naming both lengths (both image sizes, and the ``image_size`` to resize to);
    data whose rows have their own lengths is predicted, and a probe that predates the record is not checked."""
    probe_path, _, _, x = fitted
    short = table(tmp_path / "short.parquet", x[:10, :4])  # rows of 4 tokens, the probe's data's have 6
    r = cli("predict", "--probe", probe_path, "--data", str(short))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "short.parquet holds rows of 4 tokens, the probe's data had rows of 6 tokens each" in r.stderr
    assert not (tmp_path / "features" / "short.parquet").exists()
    mostly = tmp_path / "mostly.parquet"  # rows of 4 tokens and one of the probe's 6: not rows of 6 tokens
    pq.write_table(pa.table({"x": [r.tolist() for r in x[:9, :4]] + [x[9].tolist()]}), mostly)
    r = cli("predict", "--probe", probe_path, "--data", str(mostly))
    assert (
        r.exit_code == 1
        and "mostly.parquet holds rows of up to 6 tokens, the probe's data had rows of 6" in r.stderr
    )

    small = named_images(tmp_path / "small", ("cat", "dog"), n=12)  # 8x8 images: 16 tokens at patch=2
    features = api.extract(
        f"file:{small}", str(tiny_gpt2), depths="1", dtype="float32", compile=False, task_options={"patch": 2}
    )
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    big = tmp_path / "big"
    big.mkdir()
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(big / f"{i}.png")
    r = cli("predict", "--probe", result["probe"], "--data", str(big))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert (
        "big holds 16x16 images, 64 tokens a row at patch=2; the probe's data had 16 tokens a row (8x8 images "
        "at patch=2): pass --task-opt image_size=8x8 to resize them to the probe's size" in r.stderr
    )
    r = cli("predict", "--probe", result["probe"], "--data", str(big), "--task-opt", "image_size=8x8")
    assert r.exit_code == 0, r.output
    assert len(lines(r.stdout)) == 3

    rng = np.random.default_rng(2)  # rows of their own lengths, fitted and predicted on rows of others
    ragged = [rng.standard_normal((int(n), 3)).tolist() for n in rng.integers(3, 9, 60)]
    pq.write_table(
        pa.table({"x": ragged, "label": [CLASSES[k % 2] for k in range(60)]}), tmp_path / "ragged.parquet"
    )
    features = api.extract(
        f"file:{tmp_path / 'ragged.parquet'}", str(tiny_gpt2), depths="1", dtype="float32", compile=False
    )
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    assert load_probe(result["probe"]).meta["row_tokens"] is None
    longer = table(tmp_path / "longer.parquet", rng.standard_normal((5, 12, 3)).astype(np.float32))
    assert api.predict(result["probe"], data=longer, progress=False).shape == (5,)

    z = dict(np.load(probe_path))  # a probe written before the row length was recorded
    meta = json.loads(str(z.pop("meta")))
    del meta["row_tokens"]
    np.savez(tmp_path / "older.probe.npz", meta=np.array(json.dumps(meta)), **z)
    assert api.predict(str(tmp_path / "older.probe.npz"), data=short, progress=False).shape == (10,)


def test_a_backbone_folder_named_relative_to_where_the_fit_ran_is_asked_for_from_elsewhere(
    tmp_path, cli, tiny_gpt2, monkeypatch
):
    """A probe whose extraction named its backbone by a relative folder, applied from another directory: the
    message says it is the probe's recorded folder, not found from here, and to pass --backbone PATH."""
    x, y = rows(40)
    mine = table(tmp_path / "mine.parquet", x, y)
    shutil.copytree(tiny_gpt2, tmp_path / "tiny")
    monkeypatch.chdir(tmp_path)
    features = api.extract(f"file:{mine}", "tiny", depths="1", dtype="float32", compile=False)
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = cli("predict", "--probe", result["probe"], "--data", str(mine))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "records its backbone as the folder 'tiny', named relative to where its fit ran" in r.stderr
    assert "pass --backbone PATH with the probe's model folder (the Python API: backbone=PATH)" in r.stderr
    with pytest.raises(UsageError, match="records its backbone as the folder 'tiny'"):
        api.predict(result["probe"], data=mine, progress=False)
    r = cli("predict", "--probe", result["probe"], "--data", str(mine), "--backbone", str(tmp_path / "tiny"))
    assert r.exit_code == 0, r.output
    assert len(lines(r.stdout)) == len(x)


def test_features_of_data_of_some_of_the_probe_s_classes_are_read_with_the_probe_s_ids(
    tmp_path, cli, fitted, tiny_gpt2
):
    """Data to predict on extracted alone (``--task-opt predict=true``) whose labels name only some of the probe's
    classes numbers them its own way ('up' is its class 0, the probe's 1): ``predict --features`` reads its one
    split by default and scores the labels by name, as ``predict --data`` of the same rows does; a class the
    probe does not know is refused naming it."""
    probe_path, _, _, x = fitted

    def alone(name, labels):
        path = table(tmp_path / f"{name}.parquet", x[: len(labels)], labels)
        made = api.extract(
            f"file:{path}",
            str(tiny_gpt2),
            depths="2",
            dtype="float32",
            compile=False,
            task_options={"predict": True},
        )
        return path, made

    ups, made = alone("ups", ["up"] * 12)
    by_features = cli("predict", "--probe", probe_path, "--features", str(made))
    by_data = cli("predict", "--probe", probe_path, "--data", str(ups))
    assert by_features.exit_code == 0 and by_data.exit_code == 0, by_features.output
    assert by_features.stdout == by_data.stdout and {g["label_name"] for g in lines(by_features.stdout)} == {
        "up"
    }
    assert [g["label"] for g in lines(by_features.stdout)] == ["1"] * 12
    _, other = alone("left", ["left"] * 4)
    r = cli("predict", "--probe", probe_path, "--features", str(other))
    assert r.exit_code == 1, r.output
    assert "names class(es) 'left' that the probe does not know (its classes: down, up)" in r.stderr


def test_images_turned_on_their_side_are_refused_though_of_as_many_patches(tmp_path, cli, tiny_gpt2):
    """A probe of 8x16 images (8 patches a row at patch=4) and new 16x8 images: as many tokens, each patch in
    another place. The probe records its images' shape, so they are refused naming both shapes and the
    ``image_size`` to resize to, which then predicts."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)

    def images(root, shape, classes):
        for c in classes:
            (root / c).mkdir(parents=True, exist_ok=True)
            for i in range(8):
                Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
        return root

    wide = images(tmp_path / "wide", (8, 16), ("cat", "dog"))
    features = api.extract(f"file:{wide}", str(tiny_gpt2), depths="1", dtype="float32", compile=False)
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    assert load_probe(result["probe"]).meta["image_shape"] == [8, 16, 3]
    tall = images(tmp_path / "tall", (16, 8), ("cat",))
    r = cli("predict", "--probe", result["probe"], "--data", str(tall))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert (
        "tall holds 16x8 images, 8 tokens a row at patch=4; the probe's data had 8 tokens a row (8x16 images"
        in (r.stderr)
    )
    assert "pass --task-opt image_size=8x16" in r.stderr
    r = cli("predict", "--probe", result["probe"], "--data", str(tall), "--task-opt", "image_size=8x16")
    assert r.exit_code == 0 and len(lines(r.stdout)) == 8, r.output


def test_class_ids_given_to_a_probe_of_named_classes_are_read_by_name_or_refused(
    tmp_path, cli, fitted, tiny_gpt2
):
    """Labels given as class ids to a probe whose classes are named: where every name is a number (labels
    ``"2"`` and ``"10"``), each id is the class of that name, never the class at that place; where the names
    are words an id does not say which it means, and the data is refused, naming them."""
    probe_path, _, _, x = fitted
    np.savez(tmp_path / "ids.npz", x=x[:8], y=np.array([0, 1] * 4))
    r = cli("predict", "--probe", probe_path, "--data", str(tmp_path / "ids.npz"))
    assert (
        r.exit_code == 1
        and "gives its labels as class ids and the probe's classes are named (down, up)" in (r.output)
    ), r.output
    x, y = rows(60, seed=2)
    numbers = np.where(y == "up", "10", "2")
    named = table(tmp_path / "numbers.parquet", x, numbers)
    features = api.extract(f"file:{named}", str(tiny_gpt2), depths="2", dtype="float32", compile=False)
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    np.savez(tmp_path / "ints.npz", x=x[:10], y=numbers[:10].astype(int))
    r = cli(
        "predict",
        "--probe",
        result["probe"],
        "--data",
        str(tmp_path / "ints.npz"),
        "--out",
        str(tmp_path / "p.csv"),
    )
    assert r.exit_code == 0, r.output
    got = lines((tmp_path / "p.csv").read_text())
    assert [g["label_name"] for g in got] == numbers[:10].tolist()
    assert [int(g["label"]) for g in got] == [["2", "10"].index(n) for n in numbers[:10]]
    np.savez(tmp_path / "other.npz", x=x[:4], y=np.array([2, 3, 2, 10]))
    r = cli("predict", "--probe", result["probe"], "--data", str(tmp_path / "other.npz"))
    assert r.exit_code == 1 and "label 3 names no class the probe knows (its classes: 2, 10)" in r.output, (
        r.output
    )


def test_fit_after_predicting_on_the_training_file_still_finds_its_features(tmp_path, tiny_gpt2):
    """``predict --data`` of the file a probe was fitted on writes a feature file of data to predict on beside the
    training one: a later fit by task and backbone passes it over (it has no train split) and finds the other."""
    x, y = rows(40)
    mine = table(tmp_path / "mine.parquet", x, y)
    features = api.extract(f"file:{mine}", str(tiny_gpt2), depths="1", dtype="float32", compile=False)
    (result,) = api.fit(f"file:{mine}", str(tiny_gpt2), head="ridge", baselines=False, progress=False)
    api.predict(result["probe"], data=str(mine), progress=False)
    assert len(list(features.parent.glob("*.h5"))) == 2
    (again,) = api.fit(f"file:{mine}", str(tiny_gpt2), head="ridge", baselines=False, progress=False)
    assert Path(again["features"]) == Path(features)


def test_new_data_is_read_by_the_engine_and_padding_of_the_probe_s_features(tmp_path, tiny_gpt2):
    """A probe's features made by OpenVINO: new data is extracted by OpenVINO too (not chosen again by its size:
    bfloat16 engines differ by about 1%). A probe of the padded readout pads new rows to its data's length, so a
    row's prediction is the same in any file, and rows longer than that are refused."""
    pytest.importorskip("openvino")
    x, y = rows(40)
    mine = table(tmp_path / "mine.parquet", x, y)
    features = api.extract(f"file:{mine}", str(tiny_gpt2), depths="1", dtype="float32", engine="openvino")
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    predicted = api.predict(result["probe"], data=mine, progress=False)
    made = list((tmp_path / "features").rglob("*.h5")) if (tmp_path / "features").exists() else []
    from reservoir.extract.h5 import h5_file

    engines = set()
    for path in {Path(p) for p in made} | set((Path(features).parent).glob("*.h5")):
        with h5_file(path) as f:
            engines.add(json.loads(f.attrs["config"])["engine_used"])
    assert engines == {"openvino"} and predicted.shape == (40,)

    rng = np.random.default_rng(3)  # rows of 3 to 8 tokens, read padded to the longest
    ragged = [rng.standard_normal((int(n), 3)).tolist() for n in [8, *rng.integers(3, 9, 59)]]
    labels = [CLASSES[int(np.mean([t[0] for t in r]) > 0)] for r in ragged]
    pq.write_table(pa.table({"x": ragged, "label": labels}), tmp_path / "ragged.parquet")
    features = api.extract(
        f"file:{tmp_path / 'ragged.parquet'}", str(tiny_gpt2), depths="1", dtype="float32", readout="padded"
    )
    (result,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    assert load_probe(result["probe"]).meta["padded_width"] == 8
    whole = api.predict(result["probe"], data=tmp_path / "ragged.parquet", progress=False)
    short = [r for r in ragged if len(r) <= 5]
    pq.write_table(pa.table({"x": short}), tmp_path / "short.parquet")
    alone = api.predict(result["probe"], data=tmp_path / "short.parquet", progress=False)
    np.testing.assert_array_equal(alone, whole[[len(r) <= 5 for r in ragged]])
    one = table(tmp_path / "one.parquet", np.asarray(short[:1], dtype=np.float32))  # rows of one length
    np.testing.assert_array_equal(api.predict(result["probe"], data=one, progress=False), alone[:1])
    longer = table(tmp_path / "longer.parquet", rng.standard_normal((3, 9, 3)).astype(np.float32))
    with pytest.raises(DataError, match="rows of up to 9 tokens; the probe reads rows padded to 8 tokens"):
        api.predict(result["probe"], data=longer, progress=False)


def test_a_feature_file_of_another_store_naming_or_row_length_is_refused(tmp_path, fitted, tiny_gpt2):
    """``predict --features``: features stored in another dtype, of data that names its classes where the probe's
    gave ids, or of rows of another length than the probe's data's fixed length, are refused as ``--data`` is."""
    from reservoir.errors import IdentityError

    probe_path, mine, _, x = fitted
    half = api.extract(f"file:{mine}", str(tiny_gpt2), depths="2", dtype="float32", store_dtype="float16")
    with pytest.raises(IdentityError, match="store_dtype: probe 'float32', file 'float16'") as e:
        api.predict(probe_path, half)
    assert "--store-dtype" not in str(
        e.value
    )  # the command to extract what the probe reads: float32, the default
    (of_half,) = api.fit(features=str(half), head="ridge", baselines=False, progress=False)
    with pytest.raises(
        IdentityError, match="store_dtype: probe 'float16', file 'float32'.*--store-dtype float16`"
    ):
        api.predict(of_half["probe"], fitted[2])
    ids = tmp_path / "ids.npz"
    np.savez(ids, x=x, y=(np.array(rows(80)[1]) == "up").astype(int))
    features = api.extract(f"file:{ids}", str(tiny_gpt2), depths="2", dtype="float32")
    (by_id,) = api.fit(features=str(features), head="ridge", baselines=False, progress=False)
    _, named = rows(80)
    with pytest.raises(IdentityError, match="the file's data names its classes \\('down', 'up'\\)"):
        api.predict(by_id["probe"], api.extract(f"file:{mine}", str(tiny_gpt2), depths="2", dtype="float32"))
    short = table(tmp_path / "short.parquet", x[:, :4], named)
    four = api.extract(f"file:{short}", str(tiny_gpt2), depths="2", dtype="float32", limit=None)
    with pytest.raises(IdentityError, match="rows: the probe's data had rows of 6 tokens each"):
        api.predict(probe_path, four)


def test_a_probe_whose_weights_hold_nan_is_refused(tmp_path, fitted):
    probe_path = fitted[0]
    z = dict(np.load(probe_path))
    key = next(k for k, a in z.items() if a.dtype.kind == "f")
    z[key] = np.full_like(z[key], np.nan)
    np.savez(tmp_path / "nan.probe.npz", **z)
    with pytest.raises(DataError, match=f"nan.probe.npz is a damaged probe \\(its {key} hold NaN or inf\\)"):
        load_probe(tmp_path / "nan.probe.npz")


def test_a_probe_naming_fewer_classes_than_it_predicts_is_refused(tmp_path, fitted):
    z = dict(np.load(fitted[0]))
    meta = json.loads(str(z.pop("meta")))
    meta["class_names"] = meta["class_names"][:1]
    np.savez(tmp_path / "short.probe.npz", meta=np.array(json.dumps(meta)), **z)
    with pytest.raises(
        DataError, match="short.probe.npz is a damaged probe \\(it names 1 classes of its 2\\)"
    ):
        load_probe(tmp_path / "short.probe.npz")


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc, a folder that takes no new files")
def test_an_out_where_no_file_can_be_made_is_said_so(cli, fitted):
    probe_path, mine, _, _ = fitted
    r = cli("predict", "--probe", probe_path, "--data", str(mine), "--out", "/proc/preds.csv")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "its folder takes no new files" in r.output and "Write to another folder" in r.output, r.output

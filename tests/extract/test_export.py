"""``reservoir export``: a feature file as Parquet or a datasets folder, equal to what the readers return."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reservoir import api
from reservoir.errors import StoreError

pytestmark = pytest.mark.usefixtures("home", "one_thread")


@pytest.fixture
def digits(tiny_gpt2):
    return api.extract("digits", str(tiny_gpt2), limit=40, depths="0,1,2", dtype="float32", compile=False)


def test_parquet_holds_every_split_depth_and_label_as_the_reader_returns_them(digits, tmp_path, cli):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "features.parquet"
    r = cli("export", str(digits), "--out", str(out), "--depths", "0,-1")
    assert r.exit_code == 0, r.output
    table = pq.read_table(out)
    meta = table.schema.metadata
    assert json.loads(meta[b"reservoir.depths"]) == [0, 2]
    assert json.loads(meta[b"reservoir.identity"])["task"] == "digits"
    assert table.column_names == ["split", "row", "label", "d0", "d2"]
    splits = table.column("split").to_pylist()
    assert splits == sorted(splits, key=["train", "test"].index)  # the identity's order
    for split in ("train", "test"):
        part = table.filter(np.array(splits) == split)
        for depth in (0, 2):
            X, y = api.read_features(digits, split, depth=depth)
            np.testing.assert_array_equal(
                np.stack(part.column(f"d{depth}").to_numpy(zero_copy_only=False)), X
            )
            np.testing.assert_array_equal(part.column("label").to_numpy(), y)
        assert part.column("row").to_pylist() == list(range(len(y)))


def test_a_split_named_twice_is_written_once_in_the_order_given(digits, tmp_path, cli):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "twice.parquet"
    r = cli(
        "export", str(digits), "--out", str(out), "--split", "test", "--split", "train", "--split", "test"
    )
    assert r.exit_code == 0, r.output
    table = pq.read_table(out)
    n_test, n_train = (len(api.read_features(digits, s, depth=0)[1]) for s in ("test", "train"))
    assert table.column("split").to_pylist() == ["test"] * n_test + ["train"] * n_train
    assert table.column("row").to_pylist() == list(range(n_test)) + list(range(n_train))


def test_datasets_folder_loads_with_load_from_disk(digits, tmp_path, cli):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "exported"
    r = cli("export", str(digits), "--out", str(out), "--format", "datasets", "--split", "test")
    assert r.exit_code == 0, r.output
    loaded = datasets.load_from_disk(str(out))
    assert list(loaded) == ["test"]
    X, y = api.read_features(digits, "test", depth=1)
    np.testing.assert_allclose(np.asarray(loaded["test"]["d1"], dtype=np.float32), X)
    assert loaded["test"]["label"] == list(y)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    r = cli("export", str(digits), "--out", str(tmp_path / "features"), "--format", "datasets")
    assert r.exit_code == 1 and "is not a datasets folder an export wrote" in r.output
    assert (tmp_path / "features" / "digits").is_dir()  # an existing folder of other things is never replaced


def test_a_depth_or_split_the_file_lacks_is_refused_and_nothing_is_written(digits, tmp_path, cli):
    out = tmp_path / "x.parquet"
    r = cli("export", str(digits), "--out", str(out), "--depths", "5")
    assert r.exit_code == 1 and "5" in r.output and "Traceback" not in r.output
    r = cli("export", str(digits), "--out", str(out), "--split", "val")
    assert r.exit_code == 1 and "split 'val' is not in" in r.output
    assert not out.exists() and not list(tmp_path.glob(".x.parquet*"))


def test_an_out_named_for_another_format_is_refused_and_a_missing_folder_made(digits, tmp_path, cli):
    """An --out of another kind is a usage error found while parsing (exit 2, as predict's), and from Python too."""
    from reservoir.errors import UsageError
    from reservoir.extract.export import export

    r = cli("export", str(digits), "--out", str(tmp_path / "feats.csv"))
    assert r.exit_code == 2 and "names a .csv file, and export writes Parquet" in r.output
    with pytest.raises(UsageError, match="names a .csv file, and export writes Parquet"):
        export(digits, tmp_path / "feats.csv")
    assert not list(tmp_path.glob("*feats*"))
    out = tmp_path / "new" / "folder" / "feats.parquet"
    r = cli("export", str(digits), "--out", str(out), "--depths", "0")
    assert r.exit_code == 0 and out.exists() and "partial" not in r.output


def named_images(root, names=("cat", "dog", "emu"), n: int = 6, seed: int = 0):
    """An image folder ``root/NAME/*.png`` (``n`` random 8x8 images a class)."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(seed)
    for name in names:
        for i in range(n):
            path = root / name / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    return root


def test_the_class_names_of_the_data_are_a_column_and_in_the_metadata(tmp_path, cli, tiny_gpt2):
    """A feature file of data that names its classes (an image folder) exports ``label_name`` beside ``label``,
    and the names in the schema's metadata."""
    pq = pytest.importorskip("pyarrow.parquet")
    root = named_images(tmp_path / "images")
    features = api.extract(f"file:{root}", str(tiny_gpt2), depths="0", dtype="float32", compile=False)
    out = tmp_path / "named.parquet"
    r = cli("export", str(features), "--out", str(out))
    assert r.exit_code == 0, r.output
    table = pq.read_table(out)
    assert table.column_names == ["split", "row", "label", "label_name", "d0"]
    names = ["cat", "dog", "emu"]
    assert json.loads(table.schema.metadata[b"reservoir.class_names"]) == names
    labels, words = table.column("label").to_pylist(), table.column("label_name").to_pylist()
    assert words == [names[k] for k in labels] and set(words) == set(names)


def test_a_users_own_parquet_file_or_datasets_folder_is_never_replaced_and_an_export_is(
    digits, tmp_path, cli
):
    """An existing --out that an export did not write (a user's Parquet file, a stray file named .parquet, a
    user's datasets folder) is refused and left as it was; one an export wrote is replaced."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")
    mine = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), mine)
    notes = tmp_path / "notes.parquet"
    notes.write_text("hello")
    folder = tmp_path / "myds"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"a": [1, 2]})}).save_to_disk(str(folder))
    for out, fmt in ((mine, "parquet"), (notes, "parquet"), (folder, "datasets")):
        before = sorted((p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
        r = cli("export", str(digits), "--out", str(out), "--format", fmt)
        assert r.exit_code == 1 and f"{out} exists and is not a" in r.output and "Traceback" not in r.output
        after = sorted((p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
        assert after == before
    assert pq.read_table(mine).column_names == ["a"] and notes.read_text() == "hello"
    for fmt, out in (("parquet", tmp_path / "x.parquet"), ("datasets", tmp_path / "x")):
        for depths in ("0", "1"):  # the second export replaces the first
            r = cli("export", str(digits), "--out", str(out), "--format", fmt, "--depths", depths)
            assert r.exit_code == 0, r.output
    assert pq.read_table(tmp_path / "x.parquet").column_names[-1] == "d1"
    assert "d1" in datasets.load_from_disk(str(tmp_path / "x"))["test"].column_names


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_an_export_cut_short_leaves_nothing_and_each_export_writes_a_file_of_its_own(
    digits, tmp_path, cli, monkeypatch, error
):
    """An export that fails (a full disk) or is interrupted partway leaves no file, hidden or not; and every
    export writes under a name of its own before the rename, so two exports to one --out never write into
    each other's file."""
    from reservoir.extract import export as module

    out, write = tmp_path / "x.parquet", module.write_parquet
    names = []

    def cut(pa, pq, f, splits, depths, meta, path):
        names.append(Path(path).name)
        Path(path).write_bytes(b"PAR1 half a file")
        raise error

    monkeypatch.setattr(module, "write_parquet", cut)
    if isinstance(error, OSError):
        with pytest.raises(StoreError, match=r"x.parquet could not be written: the disk is full"):
            module.export(digits, out=out)
    else:
        with pytest.raises(KeyboardInterrupt):
            module.export(digits, out=out)
    assert not out.exists() and not list(tmp_path.glob(".x.parquet*")), list(tmp_path.iterdir())
    monkeypatch.setattr(module, "write_parquet", lambda *a: (names.append(Path(a[-1]).name), write(*a)))
    module.export(digits, out=out)
    module.export(digits, out=out)
    assert len(set(names)) == 3 and out.exists() and not list(tmp_path.glob(".x.parquet*"))

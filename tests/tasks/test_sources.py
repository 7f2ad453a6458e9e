"""``--task file:PATH`` sources (:mod:`reservoir.tasks.streams`): Parquet, Arrow, ``datasets`` folders, image
folders, .npz and .h5, each through ``extract`` and ``fit``, with the features of the same rows given as an
.npz; lazy rows equal eager ones bit for bit; bad inputs refused in words before any feature file exists."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from reservoir.api import read_features
from reservoir.errors import DataError
from reservoir.identity import data_fingerprint
from reservoir.tasks import get_task, patches

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
feather = pytest.importorskip("pyarrow.feather")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.usefixtures("one_thread")

N_TRAIN, N_TEST = 36, 12


def arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Dense rows (6 tokens of 3 floats), 3 classes, a train and a test split."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N_TRAIN + N_TEST, 6, 3)).astype(np.float32)
    y = np.arange(len(x)) % 3
    return {"x_train": x[:N_TRAIN], "y_train": y[:N_TRAIN], "x_test": x[N_TRAIN:], "y_test": y[N_TRAIN:]}


def table(a: dict[str, np.ndarray], target: str = "y"):
    """The rows of ``a`` as one Arrow table: train rows then test rows, a ``split`` column naming them."""
    x = np.concatenate([a["x_train"], a["x_test"]])
    return pa.table(
        {
            "x": pa.array(x.tolist(), type=pa.list_(pa.list_(pa.float32()))),
            target: np.concatenate([a["y_train"], a["y_test"]]),
            "split": ["train"] * N_TRAIN + ["test"] * N_TEST,
        }
    )


def write(kind: str, folder: Path, a: dict[str, np.ndarray]) -> Path:
    """``a`` written as a source of ``kind``."""
    if kind == "npz":
        np.savez(folder / "d.npz", **a)
        return folder / "d.npz"
    if kind == "h5":
        with h5py.File(folder / "d.h5", "w") as f:
            for k, v in a.items():
                f[k] = v
        return folder / "d.h5"
    if kind == "parquet":
        pq.write_table(table(a), folder / "d.parquet", row_group_size=5)
        return folder / "d.parquet"
    if kind == "arrow":
        feather.write_feather(table(a), folder / "d.arrow", chunksize=7)
        return folder / "d.arrow"
    if kind == "datasets":
        datasets = pytest.importorskip("datasets")
        datasets.disable_progress_bars()
        split = {
            s: datasets.Dataset.from_dict({"x": a[f"x_{s}"], "label": a[f"y_{s}"]}, features=None)
            for s in ("train", "test")
        }
        datasets.DatasetDict(split).save_to_disk(folder / "ds")
        return folder / "ds"
    raise AssertionError(kind)


def image_folder(root: Path, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """An image folder (``root/SPLIT/CLASS/NNN.png``, 8x8 RGB) and the same images as patch tokens (4x4
    patches in [0, 1]) in the folder's order (class folders sorted, files sorted), as npz arrays."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", 30), ("test", 9)):
        pixels, labels = [], []
        for c in range(3):
            for i in range(n // 3):
                im = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                path = root / split / f"class{c}" / f"{i:03d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(im).save(path)
                pixels.append(im)
                labels.append(c)
        out[f"x_{split}"] = patches(np.stack(pixels), 4).astype(np.float32) / 255.0
        out[f"y_{split}"] = np.array(labels)
    return root, out


def extract(cli, task: str, backbone: Path, out: Path, *extra: str) -> Path:
    r = cli(
        "-q",
        "extract",
        "--task",
        task,
        "--backbone",
        str(backbone),
        "--dtype",
        "float32",
        "--out",
        str(out),
        *extra,
    )
    assert r.exit_code == 0, r.output
    return out


def fit(cli, home: Path, task: str, backbone: Path, features: Path) -> dict:
    """``fit`` with a ridge head (and the baselines, which read the data again); the depth-1 result."""
    r = cli(
        "-q",
        "fit",
        "--task",
        task,
        "--backbone",
        str(backbone),
        "--features",
        str(features),
        "--head",
        "ridge",
    )
    assert r.exit_code == 0, r.output
    assert list((home / "results").rglob("baseline_ridge_*.json"))
    latest = sorted((home / "results").rglob("*depth1*.json"), key=lambda p: p.stat().st_mtime)[-1]
    return json.loads(latest.read_text())


def same_features(a: Path, b: Path) -> None:
    for split in ("train", "test"):
        xa, ya, da = read_features(a, split)
        xb, yb, db = read_features(b, split)
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb) and list(da) == list(db)


@pytest.mark.parametrize("kind", ["npz", "h5", "parquet", "arrow", "datasets"])
def test_each_source_extracts_the_features_of_the_same_rows_as_npz_and_fits(
    cli, home, tmp_path, tiny_gpt2, kind
):
    a = arrays()
    ref = extract(cli, f"file:{write('npz', tmp_path, a)}", tiny_gpt2, tmp_path / "ref.h5")
    (tmp_path / kind).mkdir()
    source = write(kind, tmp_path / kind, a)
    got = extract(cli, f"file:{source}", tiny_gpt2, tmp_path / f"{kind}.h5")
    same_features(ref, got)
    result = fit(cli, home, f"file:{source}", tiny_gpt2, got)
    assert result["features"] == str(got) and 0 <= result["test_accuracy"] <= 1


def test_an_image_folder_extracts_as_its_patches_given_as_npz_and_fits(cli, home, tmp_path, tiny_gpt2):
    root, a = image_folder(tmp_path / "images")
    np.savez(tmp_path / "ref.npz", **a)
    ref = extract(cli, f"file:{tmp_path / 'ref.npz'}", tiny_gpt2, tmp_path / "ref.h5")
    got = extract(cli, f"file:{root}", tiny_gpt2, tmp_path / "images.h5")
    same_features(ref, got)
    result = fit(cli, home, f"file:{root}", tiny_gpt2, got)
    assert result["features"] == str(got)
    task = get_task(f"file:{root}")
    assert (task.spec.seq_len, task.spec.token_dim, task.spec.n_classes) == (4, 48, 3)


def test_an_image_folder_without_splits_holds_out_a_seeded_fraction(tmp_path):
    root, _ = image_folder(tmp_path / "images")
    flat = tmp_path / "flat"
    shutil.copytree(root / "train", flat)
    a, b = get_task(f"file:{flat}", seed="3"), get_task(f"file:{flat}", seed="3")
    assert a.spec.splits == ("train", "test")
    assert (len(a.load("train", ".")), len(a.load("test", "."))) == (24, 6)
    assert data_fingerprint({s: a.load(s, ".") for s in ["train", "test"]}) == data_fingerprint(
        {s: b.load(s, ".") for s in ["train", "test"]}
    )


def fingerprints(path: Path, limit: int | None = None, **options: str):
    task = get_task(f"file:{path}", **options)
    data = {s: task.load(s, ".", limit) for s in task.spec.splits}
    return task, data, data_fingerprint(data)


@pytest.mark.parametrize("kind", ["h5", "parquet", "arrow", "datasets"])
@pytest.mark.parametrize("limit", [None, 7])
def test_lazy_rows_equal_eager_rows_bit_for_bit(tmp_path, kind, limit):
    a = arrays(1)
    _, eager, digest = fingerprints(write("npz", tmp_path, a), limit)
    (tmp_path / kind).mkdir()
    task, lazy, lazy_digest = fingerprints(write(kind, tmp_path / kind, a), limit)
    assert lazy_digest == digest  # the data digest a feature file's identity records
    rng = np.random.default_rng(0)
    for s in ("train", "test"):
        assert type(lazy[s].inputs).__name__ == "Rows" and isinstance(eager[s].inputs, np.ndarray)
        rows = rng.permutation(len(eager[s]))  # any order, as bucketed batches ask
        got = lazy[s].inputs[rows]
        assert got.dtype == eager[s].inputs.dtype and got.tobytes() == eager[s].inputs[rows].tobytes()
        assert np.array_equal(lazy[s].labels, eager[s].labels) and np.array_equal(
            lazy[s].lengths, eager[s].lengths
        )


def test_building_reads_each_chunk_once_and_batches_read_only_their_chunks(tmp_path, monkeypatch):
    """The task's one pass reads every row group once and computes the data digest (no second pass);
    a batch reads the row groups holding its rows, and at most two stay decoded."""
    from reservoir.tasks import streams

    reads = []
    read = streams.TableChunks.read
    monkeypatch.setattr(streams.TableChunks, "read", lambda self, i: reads.append(i) or read(self, i))
    path = write("parquet", tmp_path, arrays())  # 48 rows, row groups of 5: 10 chunks
    task = get_task(f"file:{path}")
    data = {s: task.load(s, ".") for s in task.spec.splits}
    data_fingerprint(data)
    assert reads == list(range(10))
    reads.clear()
    train = data["train"].inputs
    train[np.array([7, 3, 12])]  # rows 3..12 of the file: row groups 0, 1 and 2
    assert sorted(reads) == [0, 1, 2] and len(train.chunks._cache) == 2
    reads.clear()
    train[np.array([12, 11])]  # row group 2, still kept
    assert reads == []


def test_variable_length_lists_equal_padded_ids_with_lengths(tmp_path):
    """Ragged Parquet lists and an .h5 of padded ids with ``lengths`` give the .npz's rows and digest."""
    rng = np.random.default_rng(2)
    n = 40
    ids = rng.integers(1, 30, (n, 9))
    lengths = rng.integers(1, 10, n)
    y = np.arange(n) % 2
    np.savez(tmp_path / "v.npz", x=ids, y=y, lengths=lengths)
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f["x"], f["y"], f["lengths"] = ids, y, lengths
    rows = [r[:k].tolist() for r, k in zip(ids, lengths)]
    pq.write_table(pa.table({"sequence": rows, "label": y}), tmp_path / "v.parquet", row_group_size=6)
    task, eager, digest = fingerprints(tmp_path / "v.npz")
    for name in ("v.h5", "v.parquet"):
        other, lazy, lazy_digest = fingerprints(tmp_path / name)
        assert lazy_digest == digest and other.spec == dataclasses.replace(task.spec, name=other.spec.name)
        for s in eager:
            picked = np.arange(len(eager[s]))[::-1]
            assert all(np.array_equal(u, v) for u, v in zip(lazy[s].inputs[picked], eager[s].inputs[picked]))
            assert np.array_equal(other.encode(lazy[s].inputs[picked]), task.encode(eager[s].inputs[picked]))


def test_real_valued_targets_are_a_regression_task_with_regression_true(cli, home, tmp_path, tiny_gpt2):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((80, 5, 2)).astype(np.float32)
    path = _parquet(tmp_path / "r.parquet", {"x": x.tolist(), "target": x.sum((1, 2))})
    task = get_task(f"file:{path}", regression="true")
    assert task.spec.target == "regression" and task.load("train", ".").labels.dtype == np.float32
    assert np.array_equal(
        np.sort(np.concatenate([task.load(s, ".").labels for s in ("train", "test")])),
        np.sort(x.sum((1, 2))),
    )
    out = extract(cli, f"file:{path}", tiny_gpt2, tmp_path / "r.h5", "--task-opt", "regression=true")
    r = cli(
        "fit",
        "--task",
        f"file:{path}",
        "--backbone",
        str(tiny_gpt2),
        "--features",
        str(out),
        "--head",
        "ridge",
    )
    assert r.exit_code == 0 and "(nrmse, lower is better)" in r.output, r.output


def test_an_npz_records_the_same_task_options_as_before(tmp_path):
    """Options added for tables and images enter the identity only when set: npz feature files keep theirs.
    Such an option is refused for an npz, which it would not change, but a file's recorded identity that
    holds one (written before the refusal) is still read."""
    from reservoir.tasks.userfile import FileTask

    path = write("npz", tmp_path, arrays())
    assert get_task(f"file:{path}").identity_options() == {"n_classes": 0, "test_fraction": 0.2, "seed": 0}
    with pytest.raises(DataError, match="patch=2 cuts images into patches and does not apply"):
        get_task(f"file:{path}", patch="2")
    assert FileTask.recorded(str(path), patch=2).identity_options()["patch"] == 2


# -- bad inputs ------------------------------------------------------------------------------------


def _parquet(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def _images(root: Path, sizes, modes=None, folders=("c0", "c1")) -> Path:
    for i, size in enumerate(sizes):
        f = root / folders[i % 2] / f"{i}.png"
        f.parent.mkdir(parents=True, exist_ok=True)
        mode = (modes or ["RGB"] * len(sizes))[i]
        Image.new(mode, size[::-1]).save(f)
    return root


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _h5(path: Path, **arrays) -> Path:
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f[k] = v
    return path


def _with(root: Path, name: str, data: bytes | None) -> Path:
    """``root`` with an empty folder (``data`` None) or a file of ``data`` at ``name``."""
    if data is None:
        (root / name).mkdir(parents=True)
    else:
        (root / name).write_bytes(data)
    return root


def bad_sources(tmp: Path):
    """(name, build(tmp) -> (path, options), the message expected)."""
    x = [[[0.5, 1.0]] * 3] * 6
    y = [0, 1] * 3
    return {
        "no input column": (
            lambda: (_parquet(tmp / "a.parquet", {"feat": x, "y": y}), ()),
            "has no column named x / input / inputs / image / img / pixel_values / sequence for the examples "
            "(columns: ['feat', 'y']); pass --task-opt input=COLUMN",
        ),
        "two input columns": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x, "inputs": x, "y": y}), ()),
            "more than one column could hold the examples (['x', 'inputs']); pass --task-opt input=COLUMN",
        ),
        "named column missing": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x, "y": y}), ("target=kind",)),
            "has no column 'kind' (columns: ['x', 'y']); pass --task-opt target=COLUMN",
        ),
        "text input": (
            lambda: (_parquet(tmp / "a.parquet", {"x": ["ab"] * 6, "y": y}), ()),
            "column 'x' holds text, one value per row",
        ),
        "text targets of a regression": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x, "y": ["a", "b"] * 3}), ("regression=true",)),
            "regression targets must be numbers",
        ),
        "real-valued labels": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x, "y": [0.5, 1.5] * 3}), ()),
            "column 'y' holds non-integer values; give class ids 0..C-1 (sklearn.preprocessing.LabelEncoder "
            "turns names into ids), or pass --task-opt regression=true",
        ),
        "missing value": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x[:5] + [None], "y": y}), ()),
            "column 'x' has a missing value in row 5; fill or drop it",
        ),
        "missing label": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x, "y": y[:4] + [None, 1]}), ()),
            "column 'y' has a missing value in row 4; fill or drop it",
        ),
        "missing value inside a row": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x[:5] + [[[0.5, None]] * 3], "y": y}), ()),
            "column 'x' has missing values inside its lists; fill or drop them",
        ),
        "missing id inside a row": (
            lambda: (_parquet(tmp / "a.parquet", {"x": [[1, 2]] * 5 + [[3, None]], "y": y}), ()),
            "column 'x' has missing values inside its lists; fill or drop them",
        ),
        "NaN": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x[:4] + [[[float("nan"), 1.0]] * 3] * 2, "y": y}), ()),
            "column 'x' holds NaN, infinite or beyond float32's range (3.4e38) values (row 4)",
        ),
        "beyond float32": (  # read in float32, 1e39 would be infinite
            lambda: (_parquet(tmp / "a.parquet", {"x": x[:3] + [[[1e39, 1.0]] * 3] * 3, "y": y}), ()),
            "column 'x' holds NaN, infinite or beyond float32's range (3.4e38) values (row 3)",
        ),
        "empty row": (
            lambda: (_parquet(tmp / "a.parquet", {"x": [[1, 2], [3], [], [4], [5, 6], [7]], "y": y}), ()),
            "column 'x': row 2 is empty; every row needs at least one token",
        ),
        "empty tokens": (
            lambda: (
                _parquet(
                    tmp / "a.parquet",
                    {"x": pa.array([[[]] * 2] * 6, pa.list_(pa.list_(pa.float32()))), "y": y},
                ),
                (),
            ),
            "column 'x': its tokens are empty lists; every token needs at least one value",
        ),
        "ragged tokens": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x[:5] + [[[0.5]] * 3], "y": y}), ()),
            "the tokens of a row have different widths ([1, 2])",
        ),
        "image of another size": (
            lambda: (_images(tmp / "im", [(8, 8)] * 5 + [(8, 12)]), ()),
            "is 8x12 but image",
        ),
        "image of another mode": (
            lambda: (_images(tmp / "im", [(8, 8)] * 6, ["RGB"] * 5 + ["L"]), ()),
            "has mode L but image",
        ),
        "empty class folder": (
            lambda: (_with(_images(tmp / "im", [(8, 8)] * 4), "c9", None), ()),
            "c9 holds no images (files ending .png",
        ),
        "unreadable image": (
            lambda: (_with(_images(tmp / "im", [(8, 8)] * 4), "c1/zz.png", b"not a png"), ()),
            "zz.png is unreadable",
        ),
        "image size not HxW": (
            lambda: (_images(tmp / "im", [(8, 8)] * 6), ("image_size=8by8",)),
            "The 'image_size' option of task file:PATH must be HEIGHTxWIDTH in pixels (e.g. 32x32, each at most "
            "32768). Got '8by8' instead.",
        ),
        "patch not dividing": (
            lambda: (_images(tmp / "im", [(8, 8)] * 6), ("patch=3",)),
            "images are 8x8, which patch=3 does not divide; pass --task-opt patch=P",
        ),
        "split folders without classes": (
            lambda: (_images(tmp / "im", [(8, 8)] * 6, folders=("train", "test")), ()),
            "holds split folders (test, train) with images but no class folders; put each split's images in",
        ),
        "16-bit image": (
            lambda: (_images(tmp / "im", [(8, 8)] * 6, ["I;16"] * 6), ("mode=L",)),
            "has mode I;16: values of more than 8 bits, which converting to an 8-bit mode clips at 255",
        ),
        "missing split name": (
            lambda: (
                _parquet(
                    tmp / "a.parquet", {"x": x, "y": y, "split": ["train"] * 3 + [None, "test", "test"]}
                ),
                (),
            ),
            "column 'split' has a missing value in row 3; fill or drop it",
        ),
        "array of Python objects": (
            lambda: (
                _npz(tmp / "a.npz", x=np.ones((6, 3, 2), np.float32), y=np.array(["a", 1] * 3, dtype=object)),
                (),
            ),
            "holds an array of Python objects (pandas' .values of text, mixed types); save each array with a plain",
        ),
        "input column of an npz": (
            lambda: (_npz(tmp / "a.npz", x=np.array(x, np.float32), y=y), ("input=nope",)),
            "--task-opt input=nope names a table's input column (Parquet, Arrow, datasets) and does not apply to "
            f"{tmp / 'a.npz'}: an .npz file's arrays are read by their names (x, y, split, or x_<split>, y_<split>); "
            "drop the option",
        ),
        "target column of an h5": (
            lambda: (_h5(tmp / "a.h5", x=np.array(x, np.float32), y=y), ("target=nope",)),
            "--task-opt target=nope names a table's label column (Parquet, Arrow, datasets) and does not apply",
        ),
        "split column of an npz": (
            lambda: (_npz(tmp / "a.npz", x=np.array(x, np.float32), y=y), ("split=nope",)),
            "--task-opt split=nope names a table's split column (Parquet, Arrow, datasets) and does not apply to",
        ),
        "input column of an image folder": (
            lambda: (_images(tmp / "im", [(8, 8)] * 6), ("input=image",)),
            "does not apply to {}: an image folder's images are the inputs, their class folders the labels".format(
                tmp / "im"
            ),
        ),
        "patch of tokens": (
            lambda: (_npz(tmp / "a.npz", x=np.array(x, np.float32), y=y), ("patch=2",)),
            f"--task-opt patch=2 cuts images into patches and does not apply to {tmp / 'a.npz'}: it holds tokens of "
            "real values; drop the option",
        ),
        "image size of token ids": (
            lambda: (_parquet(tmp / "a.parquet", {"x": [[1, 2, 3]] * 6, "y": y}), ("image_size=4x4",)),
            "--task-opt image_size=4x4 resizes images and does not apply to",
        ),
        "vocabulary of images": (
            lambda: (_images(tmp / "im", [(8, 8)] * 6), ("vocab_size=9",)),
            "--task-opt vocab_size=9 sizes a vocabulary of token ids and does not apply to",
        ),
        "test fraction of split data": (
            lambda: (
                _npz(tmp / "a.npz", x=np.array(x, np.float32), y=y, split=np.array(["train", "test"] * 3)),
                ("test_fraction=0.5",),
            ),
            f"--task-opt test_fraction=0.5 sizes the test split drawn from rows without splits and does not apply "
            f"to {tmp / 'a.npz'}: it gives its splits (train, test); drop the option",
        ),
        "split missing": (
            lambda: (_parquet(tmp / "a.parquet", {"x": x, "y": y, "split": ["train"] * 6}), ()),
            "has no (or an empty) 'test' split",
        ),
    }


@pytest.mark.parametrize("case", list(bad_sources(Path("."))))
def test_bad_inputs_are_refused_in_words_before_any_feature_file(cli, home, tmp_path, tiny_gpt2, case):
    build, message = bad_sources(tmp_path)[case]
    path, options = build()
    opts = [a for o in options for a in ("--task-opt", o)]
    out = tmp_path / "f.h5"
    r = cli("extract", "--task", f"file:{path}", *opts, "--backbone", str(tiny_gpt2), "--out", str(out))
    assert r.exit_code == 1 and message in r.output, r.output
    assert "Traceback" not in r.output and (str(path) in r.output or "option of task file:PATH" in r.output)
    assert not list(tmp_path.glob("f.h5*")) and not (home / "features").exists()


@pytest.mark.parametrize("kind", ["npz", "h5"])
def test_several_labels_a_row_take_a_split_array_of_one_name_a_row(tmp_path, kind):
    """Labels ``(N, k)`` (multi-label 0/1 rows) with a ``split`` array of ``N`` names, the layout the docs give:
    each split holds its rows' labels; a split array of another length is refused naming the length wanted."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 4, 3)).astype(np.float32)
    y = np.array([[0, 1], [1, 0], [1, 1], [0, 0], [1, 0]] * 2)
    names = np.array(["train"] * 7 + ["test"] * 3)
    write = _npz if kind == "npz" else _h5
    split = names if kind == "npz" else names.astype("S")  # h5py stores text as bytes
    task = get_task(f"file:{write(tmp_path / f'ml.{kind}', x=x, y=y, split=split)}")
    assert task.spec.splits == ("train", "test") and task.spec.outputs_per_token == 2
    for name, rows in (("train", slice(0, 7)), ("test", slice(7, 10))):
        d = task.read(name, tmp_path)
        assert np.array_equal(np.asarray(d.inputs), x[rows]) and d.labels.tolist() == y[rows, None].tolist()
    short = write(tmp_path / f"short.{kind}", x=x, y=y, split=split[:9])
    with pytest.raises(DataError, match=r"split has shape \(9,\); expected \(10,\), one name per row"):
        get_task(f"file:{short}")


def within_one_of_proportional(got: np.ndarray, whole: np.ndarray, n: int) -> None:
    """``got`` (a sample's labels) holds ``n`` rows and each class of ``whole`` (the split's labels) within one
    row of its proportional share."""
    classes, counts = np.unique(whole, return_counts=True)
    taken = np.array([(got == c).sum() for c in classes])
    share = n * counts / len(whole)
    assert len(got) == n and (taken >= 1).all(), (taken, share)
    assert np.all(np.abs(taken - share) < 1), (taken, share)


def sorted_sources(root: Path) -> dict[str, Path]:
    """A class-sorted image folder (``root/SPLIT/CLASS/``, classes of 24, 12 and 6 train images) and a Parquet
    file sorted by label (three classes of 30 rows, every fifth row ``test``): the first rows of each split are
    of one class."""
    rng = np.random.default_rng(4)
    for split, sizes in (("train", (24, 12, 6)), ("test", (8, 4, 2))):
        for c, n in zip(("a", "b", "c"), sizes):
            for i in range(n):
                path = root / "images" / split / c / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    y = np.repeat(np.arange(3), 30)
    x = rng.standard_normal((len(y), 6, 3)).astype(np.float32)
    split = np.where(np.arange(len(y)) % 5 == 4, "test", "train")
    pq.write_table(
        pa.table({"x": pa.array(x.tolist(), type=pa.list_(pa.list_(pa.float32()))), "y": y, "split": split}),
        root / "sorted.parquet",
        row_group_size=8,
    )
    return {"images": root / "images", "parquet": root / "sorted.parquet"}


@pytest.mark.parametrize("kind", ["images", "parquet"])
def test_a_limit_keeps_every_class_of_a_class_sorted_source_in_proportion(
    cli, home, tmp_path, tiny_gpt2, kind
):
    """``--limit N`` of a source read class by class draws a seeded sample stratified by class: every class of
    every split, each within one row of its share, rows in source order; another seed draws other rows; the
    rule and its seed are in the file's identity."""
    path = sorted_sources(tmp_path)[kind]
    task = get_task(f"file:{path}")
    whole = {s: task.load(s, ".").labels for s in ("train", "test")}
    files = {}
    for seed in ("0", "1"):
        out = extract(
            cli, f"file:{path}", tiny_gpt2, tmp_path / f"{kind}{seed}.h5", "--limit", "10", "--seed", seed
        )
        for split in ("train", "test"):
            _, y, _ = read_features(out, split)
            within_one_of_proportional(y, whole[split], 10)
        with h5py.File(out, "r") as f:
            identity = json.loads(f.attrs["identity"])
        assert identity["subset"] == {"rule": "stratified", "seed": int(seed)} and identity["limit"] == 10
        files[seed] = identity["data"]
        rows = task.load("train", ".", 10, int(seed)).inputs.positions
        assert np.all(np.diff(rows) > 0)  # source order kept within the sample
    assert files["0"]["train"]["sha256"] != files["1"]["train"]["sha256"]


def test_a_sample_of_a_streamed_source_reads_only_its_rows_when_asked(tmp_path, monkeypatch):
    """A sample of a chunked source stays lazy: taking it reads nothing, and a batch reads only the chunks that
    hold its rows."""
    from reservoir.tasks import streams

    path = sorted_sources(tmp_path)["parquet"]
    task = get_task(f"file:{path}")
    reads = []
    read = streams.TableChunks.read
    monkeypatch.setattr(streams.TableChunks, "read", lambda self, i: reads.append(i) or read(self, i))
    sample = task.load("train", ".", 9, 0)
    assert reads == [] and type(sample.inputs).__name__ == "Rows"
    first = sample.inputs[np.array([0])]
    assert len(reads) == 1 and first.shape == (1, 6, 3)
    assert np.array_equal(sample.labels, np.repeat(np.arange(3), 3))


def test_class_names_follow_natural_order_and_name_columns_become_ids(cli, home, tmp_path, tiny_gpt2):
    """Class folders ``1``, ``2``, ``10`` are classes 0, 1, 2 (not ``1``, ``10``, ``2``), and a column of label
    names is numbered in the same natural order over every split; the names are the task's and the feature
    file's."""
    rng = np.random.default_rng(5)
    root = tmp_path / "folders"
    for c in ("10", "2", "1"):
        for i in range(6):
            path = root / c / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    task = get_task(f"file:{root}")
    assert task.class_names == ["1", "2", "10"]
    files = task.load("train", ".").inputs
    names = [files.chunks.files[p].parent.name for p in files.positions]
    assert [task.class_names[k] for k in task.load("train", ".").labels] == names

    y = np.array(["class10", "class2", "class1"] * 8)
    x = rng.standard_normal((len(y), 4, 2)).astype(np.float32)
    split = np.array(["train"] * 18 + ["test"] * 6)
    pq.write_table(
        pa.table({"x": pa.array(x.tolist()), "label": y, "split": split}), tmp_path / "named.parquet"
    )
    task = get_task(f"file:{tmp_path / 'named.parquet'}")
    assert task.class_names == ["class1", "class2", "class10"]
    assert task.load("train", ".").labels.tolist()[:3] == [2, 1, 0] and task.spec.n_classes == 3
    out = extract(cli, f"file:{tmp_path / 'named.parquet'}", tiny_gpt2, tmp_path / "named.h5")
    with h5py.File(out, "r") as f:
        assert json.loads(f.attrs["class_names"]) == ["class1", "class2", "class10"]
    np.savez(tmp_path / "named.npz", x_train=x[:18], y_train=y[:18], x_test=x[18:], y_test=y[18:])
    assert get_task(f"file:{tmp_path / 'named.npz'}").class_names == ["class1", "class2", "class10"]
    np.savez(tmp_path / "mixed.npz", x_train=x[:18], y_train=y[:18], x_test=x[18:], y_test=np.arange(6))
    with pytest.raises(DataError, match="y_train hold class names and y_test numbers"):
        get_task(f"file:{tmp_path / 'mixed.npz'}")


@pytest.mark.parametrize("kind", ["npz", "h5", "parquet", "arrow", "datasets"])
def test_every_source_reads_whole_to_predict_on_with_or_without_labels(tmp_path, kind):
    """``predict=true``: every row of any source as one split in input order (train rows, then test rows: the
    splits a source has follow each other), the same rows as its splits held, labels where it has them and
    ``-1`` placeholders where it has none, saying why."""
    from reservoir.tasks.userfile import FileTask

    a = arrays()
    labeled = FileTask.to_predict(str(write(kind, tmp_path, a)))
    d = labeled.read("predict", tmp_path)
    assert labeled.spec.splits == ("predict",) and labeled.unlabeled is None
    assert np.array_equal(np.asarray(d.inputs), np.concatenate([a["x_train"], a["x_test"]]))
    assert d.labels.tolist() == np.concatenate([a["y_train"], a["y_test"]]).tolist()
    bare = {k: v for k, v in a.items() if k.startswith("x_")}
    (tmp_path / "bare").mkdir()
    if kind in ("parquet", "arrow"):  # tables: no label column
        path = tmp_path / "bare" / f"d.{kind}"
        rows = pa.table({"x": pa.array(np.concatenate(list(bare.values())).tolist())})
        pq.write_table(rows, path) if kind == "parquet" else feather.write_feather(rows, path)
    elif kind == "datasets":
        datasets = pytest.importorskip("datasets")
        split = {s: datasets.Dataset.from_dict({"x": a[f"x_{s}"]}) for s in ("train", "test")}
        datasets.DatasetDict(split).save_to_disk(tmp_path / "bare" / "ds")
        path = tmp_path / "bare" / "ds"
    else:
        path = write(kind, tmp_path / "bare", bare)
    unlabeled = FileTask.to_predict(str(path))
    d = unlabeled.read("predict", tmp_path)
    assert np.array_equal(np.asarray(d.inputs), np.concatenate([a["x_train"], a["x_test"]]))
    assert (d.labels == -1).all() and unlabeled.unlabeled and "y" in unlabeled.unlabeled
    with pytest.raises(DataError, match="has no"):  # to train on, the same source still needs its labels
        FileTask(str(path))


def test_token_ids_to_predict_on_keep_the_vocabulary_they_are_given(tmp_path):
    from reservoir.tasks.userfile import FileTask

    np.savez(tmp_path / "ids.npz", x=np.array([[1, 2, 3], [3, 2, 1]]))
    task = FileTask.to_predict(str(tmp_path / "ids.npz"), vocab_size=10)
    assert task.spec.vocab_size == 10 and task.identity_options()["vocab_size"] == 10
    with pytest.raises(DataError, match="token id 3, beyond vocab_size=3.*leave vocab_size out"):
        FileTask.to_predict(str(tmp_path / "ids.npz"), vocab_size=3)
    with pytest.raises(
        DataError, match="token id 3, beyond vocab_size=3.*predict on data of the probe's ids"
    ):
        FileTask.to_predict(str(tmp_path / "ids.npz"), vocab_size=3, given=())  # the probe's vocabulary


def test_split_words_in_names_and_hidden_files_are_read_as_meant(tmp_path):
    """Split folders and files named by a word of their name (mnist_png's ``training``/``testing``,
    ``mnist_train.parquet``) are those splits; a class folder called ``train`` (CIFAR-100 has one) stays a
    class; hidden files and folders (macOS's ``._x.png``, ``.ipynb_checkpoints``) are passed over."""
    from reservoir.tasks import get_task

    for split, n in (("training", 6), ("testing", 2)):
        _images(tmp_path / "mnist_png" / split, [(8, 8)] * n)
    task = get_task(f"file:{tmp_path / 'mnist_png'}")
    assert task.spec.splits == ("train", "test") and task.class_names == ["c0", "c1"]
    assert [len(task.load(s, ".")) for s in ("train", "test")] == [6, 2]

    tables = tmp_path / "tables"
    tables.mkdir()
    x = [[[0.5, 1.0]] * 3] * 6
    _parquet(tables / "mnist_train.parquet", {"x": x, "y": [0, 1] * 3})
    _parquet(tables / "mnist_test.parquet", {"x": x[:4], "y": [0, 1] * 2})
    _parquet(tables / "mnist_validation.parquet", {"x": x[:2], "y": [0, 1]})
    _with(tables, "._mnist_train.parquet", b"resource fork")
    task = get_task(f"file:{tables}")
    assert task.spec.splits == ("train", "test", "validation")
    assert [len(task.load(s, ".")) for s in ("train", "test", "validation")] == [6, 4, 2]

    classes = _images(tmp_path / "c100", [(8, 8)] * 6)
    (classes / "c0").rename(classes / "train")
    _with(classes, "c1/._0.png", b"resource fork")
    _with(classes, ".ipynb_checkpoints", None)
    task = get_task(f"file:{classes}")
    assert task.class_names == ["c1", "train"]
    assert sum(len(task.load(s, ".")) for s in task.spec.splits) == 6


def test_data_verify_names_the_columns_it_took_and_the_classes(cli, tmp_path):
    """`reservoir data verify file:PATH` says where the inputs and labels were read and the classes by id."""
    x = np.random.default_rng(0).random((40, 6, 2))
    pq.write_table(
        pa.table({"x": [r.tolist() for r in x], "label": ["cat", "dog"] * 20}), tmp_path / "mine.parquet"
    )
    r = cli("data", "verify", f"file:{tmp_path / 'mine.parquet'}")
    assert r.exit_code == 0, r.output
    assert (
        "mine.parquet: column 'x', labels: column 'label'" in r.output and "classes: 0 cat, 1 dog" in r.output
    )


def test_splits_whose_class_labels_list_their_names_in_other_orders_are_read_by_name(tmp_path):
    """A DatasetDict (and the Parquet files it writes) whose splits' ClassLabels list the same classes in other
    orders (a column class-encoded split by split, one split lacking a class): every id is renumbered by its
    name into one list of every split's names in natural order, for training and for data to predict on."""
    datasets = pytest.importorskip("datasets")
    from reservoir.tasks.userfile import FileTask

    x = [[[float(i), 1.0]] * 2 for i in range(6)]
    words = {"train": ["cat", "dog", "eel"] * 2, "test": ["eel", "cat", "dog", "dog", "eel", "cat"]}
    orders = {"train": ["cat", "dog", "eel"], "test": ["eel", "dog", "cat"]}
    splits = {
        s: datasets.Dataset.from_dict(
            {"x": x, "label": [orders[s].index(w) for w in words[s]]},
            features=datasets.Features(
                {"x": datasets.Sequence(datasets.Sequence(datasets.Value("float32"))),
                 "label": datasets.ClassLabel(names=orders[s])}
            ),
        )
        for s in ("train", "test")
    }  # fmt: skip
    datasets.DatasetDict(splits).save_to_disk(tmp_path / "ds")
    (tmp_path / "pq").mkdir()
    for s, d in splits.items():
        d.to_parquet(tmp_path / "pq" / f"{s}.parquet")
    for path in (tmp_path / "ds", tmp_path / "pq"):
        task = get_task(f"file:{path}")
        assert task.class_names == ["cat", "dog", "eel"]
        for s in ("train", "test"):
            assert [task.class_names[k] for k in task.load(s, ".").labels] == words[s], (path, s)
    whole = FileTask.to_predict(str(tmp_path / "ds"))
    assert whole.class_names == ["cat", "dog", "eel"]
    labels = whole.read("predict", tmp_path).labels
    assert [whole.class_names[k] for k in labels] == words["train"] + words["test"]


@pytest.mark.parametrize("kind", ["npz", "h5"])
def test_a_file_of_whole_arrays_beside_split_arrays_is_refused_naming_them(tmp_path, kind):
    """x and y beside x_test and y_test: the split arrays would be passed over (a test split drawn from x
    instead), so the file is refused, naming them."""
    a = {"x": np.ones((20, 3, 2), np.float32), "y": np.arange(20) % 2, "x_test": np.ones((5, 3, 2), np.float32),
         "y_test": np.arange(5) % 2}  # fmt: skip
    if kind == "npz":
        np.savez(tmp_path / "both.npz", **a)
    else:
        with h5py.File(tmp_path / "both.h5", "w") as f:
            for k, v in a.items():
                f[k] = v
    with pytest.raises(DataError, match=r"holds both x .* and split arrays \(x_test, y_test\)"):
        get_task(f"file:{tmp_path / f'both.{kind}'}")


def test_a_dev_split_validates_and_a_split_without_a_role_is_named_as_passed_over(
    cli, home, tmp_path, tiny_gpt2
):
    """A split called ``dev`` is the validation split (where none of val, valid, validation is); a split no role
    reads (``Test`` beside ``test``) is extracted, and extract and fit say it is passed over."""
    x = [[[0.5, float(i % 3)]] * 2 for i in range(40)]
    split = ["train"] * 24 + ["test"] * 6 + ["dev"] * 5 + ["Test"] * 5
    _parquet(tmp_path / "d.parquet", {"x": x, "y": [i % 2 for i in range(40)], "split": split})
    task = get_task(f"file:{tmp_path / 'd.parquet'}")
    assert task.spec.roles == ("dev", ("test",))
    r = cli(
        "extract",
        "--task",
        f"file:{tmp_path / 'd.parquet'}",
        "--backbone",
        str(tiny_gpt2),
        "--dtype",
        "float32",
    )
    assert r.exit_code == 0 and "split(s) Test have no role and are passed over" in r.stderr, r.output
    r = cli(
        "fit", "--task", f"file:{tmp_path / 'd.parquet'}", "--backbone", str(tiny_gpt2), "--head", "ridge"
    )
    assert r.exit_code == 0 and "split(s) Test have no role and are passed over" in r.stderr, r.output
    (result,) = [json.loads(p.read_text()) for p in (home / "results").rglob("output-only*depth1*.json")]
    assert result["n_val"] == 5


def test_class_labels_given_as_a_column_or_one_hot_read_as_class_ids(tmp_path):
    """Labels of one class a row given as an (n, 1) column (Keras' CIFAR-10) or one-hot (Keras'
    ``to_categorical``) are read as the same class ids as (n,) labels: the same drawn test split, the same
    classes; labels of several classes a row stay several 0/1 labels."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((60, 4, 2)).astype(np.float32), np.arange(60) % 3
    for name, labels in (("ids", y), ("column", y[:, None]), ("hot", np.eye(3, dtype=np.int64)[y])):
        np.savez(tmp_path / f"{name}.npz", x=x, y=labels)
    ids = get_task(f"file:{tmp_path / 'ids.npz'}")
    for name in ("column", "hot"):
        task = get_task(f"file:{tmp_path / f'{name}.npz'}")
        assert task.spec.label_shape == () and task.spec.n_classes == 3
        for s in ("train", "test"):
            assert task.load(s, ".").labels.tolist() == ids.load(s, ".").labels.tolist(), (name, s)
    several = np.eye(3, dtype=np.int64)[y]
    several[0, 1 - y[0] % 2] = 1  # a row of two classes: not one-hot
    np.savez(tmp_path / "several.npz", x=x, y=several)
    assert get_task(f"file:{tmp_path / 'several.npz'}").spec.label_shape == (1, 3)


def test_n_classes_below_the_classes_a_class_label_names_is_refused_in_words(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"x": datasets.Sequence(datasets.Sequence(datasets.Value("float32"))),
         "label": datasets.ClassLabel(names=["a", "b", "c"])}
    )  # fmt: skip
    rows = {"x": [[[0.5, 1.0]] * 2] * 8, "label": [0, 1] * 4}
    split = {s: datasets.Dataset.from_dict(rows, features=features) for s in ("train", "test")}
    datasets.DatasetDict(split).save_to_disk(tmp_path / "ds")
    with pytest.raises(DataError, match=r"names 3 classes \(a, b, c\), more than n_classes=2"):
        get_task(f"file:{tmp_path / 'ds'}", n_classes="2")


def test_class_names_saved_as_byte_strings_in_an_npz_read_as_text(tmp_path):
    """Labels saved as bytes (``dtype S``, as h5py and older numpy code write them) name their classes as text,
    as an .h5 file's do: ``cat``, not ``b'cat'``."""
    x = np.ones((12, 3, 2), np.float32)
    np.savez(tmp_path / "b.npz", x=x, y=np.array([b"cat", b"dog"] * 6))
    np.savez(tmp_path / "s.npz", x=x, y=np.array(["cat", "dog"] * 6))
    for name in ("b", "s"):
        assert get_task(f"file:{tmp_path / f'{name}.npz'}").class_names == ["cat", "dog"]


def test_table_shards_are_read_in_natural_order(tmp_path):
    """A folder of shards numbered without padding (``part-2``, ``part-10``) is read in natural order, as an
    image folder's files are: data to predict on keeps the rows in the order the shards number them."""
    from reservoir.tasks.userfile import FileTask

    (tmp_path / "shards").mkdir()
    for k in (1, 2, 10):
        _parquet(tmp_path / "shards" / f"part-{k}.parquet", {"x": [[[float(k), 0.0]]] * 2, "y": [0, 1]})
    task = FileTask.to_predict(str(tmp_path / "shards"))
    d = task.read("predict", tmp_path)
    assert [float(np.asarray(row)[0, 0]) for row in d.inputs] == [1.0, 1.0, 2.0, 2.0, 10.0, 10.0]

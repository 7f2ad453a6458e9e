"""CIFAR-10, TAPE remote homology and user files, read from small fixtures in the official formats."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import tarfile

import numpy as np
import pytest

from reservoir.tasks import DataError, cifar, get_task, homology
from reservoir.tasks.download import DataArchive

PER_BATCH = 4  # images per fixture batch: 5 train batches -> 20 train images, 4 test images


def cifar_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n)


def write_batch(path, images, labels):
    """The official layout: b'data' (N, 3072) uint8, channel-major rows; b'labels' a list."""
    data = np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3072))
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"fixture", b"data": data, b"labels": [int(v) for v in labels]}, f)


def write_cifar(folder) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    folder.mkdir(parents=True)
    out = {}
    for i, name in enumerate((*cifar.TRAIN_FILES, "test_batch")):
        out[name] = cifar_images(PER_BATCH, i)
        write_batch(folder / name, *out[name])
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"c%d" % i for i in range(10)]}, f)
    return out


@pytest.fixture
def cifar_dir(tmp_path):
    batches = write_cifar(tmp_path / "cifar10" / "cifar-10-batches-py")
    return tmp_path, batches


def test_cifar10_patches_and_labels(cifar_dir):
    data_dir, batches = cifar_dir
    task = get_task("cifar10")
    train = task.read("train", data_dir, 6)  # the first 6 rows: from batch 1 into batch 2
    x1, y1 = batches["data_batch_1"]
    x2, y2 = batches["data_batch_2"]
    np.testing.assert_array_equal(train.inputs, np.concatenate([x1, x2[:2]]))
    np.testing.assert_array_equal(train.labels, np.concatenate([y1, y2[:2]]))
    assert len(task.load("train", data_dir)) == 5 * PER_BATCH
    test = task.load("test", data_dir)
    np.testing.assert_array_equal(test.labels, batches["test_batch"][1])
    tokens = task.encode(train.inputs)
    assert tokens.shape == (6, 64, 48) and tokens.dtype == np.float32 and task.spec.seq_len == 64
    img = (train.inputs[0].astype(np.float32) / 255 - cifar.FPT_MEAN) / cifar.FPT_STD
    np.testing.assert_allclose(
        tokens[0, 0].reshape(4, 4, 3), img[:4, :4], atol=1e-6
    )  # (p1 p2 c), c innermost
    np.testing.assert_allclose(tokens[0, 1].reshape(4, 4, 3), img[:4, 4:8], atol=1e-6)  # row-major patches
    np.testing.assert_allclose(tokens[0, 8].reshape(4, 4, 3), img[4:8, :4], atol=1e-6)
    raw = get_task("cifar10", normalize="false").encode(train.inputs[:1])
    np.testing.assert_allclose(raw[0, 0].reshape(4, 4, 3), train.inputs[0, :4, :4] / 255.0, rtol=1e-6)


def test_grayscale_matches_hand_computed_lra_values():
    # floor((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5), tf.image.rgb_to_grayscale on uint8
    pixels = np.array(
        [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [100, 150, 200], [0, 0, 0], [10, 20, 30]],
        dtype=np.uint8,
    )
    hand = [76, 149, 29, 255, 141, 0, 18]  # 0.2989*255.5=76.4; 0.587*255.5=149.98; ...; 18.08 for (10,20,30)
    np.testing.assert_array_equal(cifar.grayscale(pixels), hand)


def test_cifar10_lra_tokens_and_lra_split(cifar_dir):
    data_dir, batches = cifar_dir
    task = get_task("cifar10_lra")
    assert task.spec.splits == ("train", "test") and task.spec.token_dim == 1
    d = task.load("test", data_dir)
    assert d.inputs.shape == (PER_BATCH, 32, 32) and d.inputs.dtype == np.uint8
    np.testing.assert_array_equal(d.inputs, cifar.grayscale(batches["test_batch"][0]))
    tokens = task.encode(d.inputs)
    assert tokens.shape == (PER_BATCH, 1024, 1)
    np.testing.assert_allclose(
        tokens[0, 33, 0], (d.inputs[0, 1, 1] / 255 - 0.5) / 0.5, rtol=1e-6
    )  # row-major
    lra = get_task("cifar10_lra", lra_split="true")
    assert lra.spec.splits == ("train", "val", "test")
    train, val = lra.load("train", data_dir), lra.load("val", data_dir)
    assert (len(train), len(val)) == (18, 2)  # LRA: val = train[90%:]
    np.testing.assert_array_equal(val.labels, batches["data_batch_5"][1][-2:])


def test_cifar_folder_next_to_data_dir_is_found(tmp_path):
    batches = write_cifar(tmp_path / "cifar-10-batches-py")  # where torchvision / make_cifar_batches put it
    np.testing.assert_array_equal(get_task("cifar10").load("test", tmp_path).labels, batches["test_batch"][1])


def fixture_archive(tmp_path, monkeypatch, corrupt=None):
    src = tmp_path / "src"
    write_cifar(src / "cifar-10-batches-py")
    data_dir = tmp_path / "data"
    (data_dir / "cifar10").mkdir(parents=True)
    path = data_dir / "cifar10" / cifar.ARCHIVE.name
    with tarfile.open(path, "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    blob = path.read_bytes()
    md5, size = hashlib.md5(blob).hexdigest(), len(blob)
    if corrupt == "truncate":
        path.write_bytes(blob[: size // 2])
    elif corrupt == "flip":
        path.write_bytes(blob[:-9] + bytes([blob[-9] ^ 0xFF]) + blob[-8:])
    archive = DataArchive(cifar.ARCHIVE.name, md5, (), cifar.ARCHIVE.contents, cifar.ARCHIVE.members, size)
    monkeypatch.setattr(cifar, "ARCHIVE", archive)
    return data_dir, path


def test_cifar_archive_is_checked_then_unpacked(tmp_path, monkeypatch):
    data_dir, _ = fixture_archive(tmp_path, monkeypatch)
    assert len(get_task("cifar10").load("test", data_dir)) == PER_BATCH
    assert (data_dir / "cifar10" / "cifar-10-batches-py" / "data_batch_5").exists()


@pytest.mark.parametrize(
    "corrupt, message",
    [
        ("truncate", r"is truncated \(\d+ of \d+ bytes\); delete it"),
        ("flip", r"has checksum \w+, expected \w+; delete it"),
    ],
)
def test_bad_archive_names_the_file_and_leaves_no_folder(tmp_path, monkeypatch, corrupt, message):
    data_dir, path = fixture_archive(tmp_path, monkeypatch, corrupt)
    with pytest.raises(DataError, match=message) as e:
        get_task("cifar10").load("train", data_dir)
    assert str(path) in str(e.value)
    assert not (data_dir / "cifar10" / "cifar-10-batches-py").exists()


def test_truncated_archive_without_checksum_is_caught_when_unpacking(tmp_path, monkeypatch):
    data_dir, path = fixture_archive(tmp_path, monkeypatch, "truncate")
    monkeypatch.setattr(
        cifar, "ARCHIVE", DataArchive(path.name, None, (), "cifar-10-batches-py", cifar.ARCHIVE.members)
    )
    with pytest.raises(DataError, match="is truncated or not a valid archive"):
        get_task("cifar10").load("train", data_dir)
    assert [p.name for p in (data_dir / "cifar10").iterdir()] == [path.name]  # no half-unpacked folder


def test_cifar_errors_name_the_file_and_the_fix(cifar_dir, tmp_path):
    data_dir, _ = cifar_dir
    folder = data_dir / "cifar10" / "cifar-10-batches-py"
    with pytest.raises(
        DataError,
        match=r"needs the folder cifar-10-batches-py/ .* Place that folder there, or the "
        r"archive cifar-10-python.tar.gz \(md5 c58f30108f718f92721af3b95e74349a",
    ):
        get_task("cifar10", download="false").load("train", tmp_path / "empty")
    (folder / "data_batch_1").write_bytes((folder / "data_batch_1").read_bytes()[:1000])
    with pytest.raises(DataError, match=r"data_batch_1 is unreadable or truncated .* fetch cifar10"):
        get_task("cifar10").load("train", data_dir)
    x, y = cifar_images(PER_BATCH, 9)
    write_batch(folder / "data_batch_1", x, np.array([0, 1, 10, 2]))
    with pytest.raises(DataError, match=r"data_batch_1: label 10 of image 2 is outside 0..9"):
        get_task("cifar10").load("train", data_dir)


# -- remote homology ------------------------------------------------------------------------

TAPE_IUPAC = [
    "<pad>",
    "<mask>",
    "<cls>",
    "<sep>",
    "<unk>",
    "A",
    "B",
    "C",
    "D",
    "E",
    "F",
    "G",
    "H",
    "I",
    "K",
    "L",
    "M",
    "N",
    "O",
    "P",
    "Q",
    "R",
    "S",
    "T",
    "U",
    "V",
    "W",
    "X",
    "Y",
    "Z",
]  # TAPE's IUPAC_VOCAB order


def protein_records(n: int, seed: int, long_every: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    letters = np.array(list(homology.AMINO_ACIDS))
    out = []
    for i in range(n):
        length = 40 if long_every and i % long_every == 0 else int(rng.integers(5, 20))
        out.append(
            {
                "id": f"d{seed}_{i}",
                "primary": "".join(rng.choice(letters, length)),
                "protein_length": length,
                "fold_label": int(rng.integers(0, 5)),  # a few folds, every one in train (as in TAPE)
            }
        )
    return out


def write_lmdb(path, records):
    import lmdb

    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"num_examples", pickle.dumps(len(records)))
        for i, rec in enumerate(records):
            txn.put(str(i).encode(), pickle.dumps(rec))
    env.close()


def rewrite(path, records):
    if path.suffix == ".json":
        path.write_text(json.dumps(records))
    else:
        shutil.rmtree(path)
        write_lmdb(path, records)


def write_tape(data_dir, fmt: str, sizes=None, long_every: int = 0) -> dict[str, list[dict]]:
    folder = data_dir / "remote_homology"
    folder.mkdir(parents=True, exist_ok=True)
    sizes = sizes or {
        "train": 30,
        "valid": 6,
        "test_fold_holdout": 5,
        "test_superfamily_holdout": 5,
        "test_family_holdout": 6,
    }
    out = {}
    for k, (split, n) in enumerate(sizes.items()):
        out[split] = protein_records(n, k, long_every)
        path = folder / f"remote_homology_{split}.{fmt}"
        if fmt == "json":
            path.write_text(json.dumps(out[split]))
        else:
            write_lmdb(path, out[split])
    return out


def test_vocabulary_is_tapes_iupac_order_with_padding_zero():
    assert list(homology.VOCAB) == ["<pad>", *TAPE_IUPAC[5:]] and homology.VOCAB["<pad>"] == 0
    assert all(homology.VOCAB[a] == TAPE_IUPAC.index(a) - 4 for a in homology.AMINO_ACIDS)
    np.testing.assert_array_equal(homology.tokenize("ACDXZ", "x"), [1, 3, 4, 23, 25])
    task = get_task("remote_homology")
    assert (task.spec.vocab_size, task.spec.n_classes, task.spec.seq_len) == (26, 1195, 1024)
    assert task.spec.splits == (
        "train",
        "valid",
        "test_fold_holdout",
        "test_superfamily_holdout",
        "test_family_holdout",
    )


def test_tape_json_and_lmdb_readers_agree(tmp_path):
    records = write_tape(tmp_path / "j", "json")
    write_tape(tmp_path / "l", "lmdb")
    task = get_task("remote_homology")
    for split in task.spec.splits:
        a, b = task.load(split, tmp_path / "j"), task.load(split, tmp_path / "l")
        assert len(a) == len(records[split])
        np.testing.assert_array_equal(a.labels, [r["fold_label"] for r in records[split]])
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(a.lengths, [len(r["primary"]) for r in records[split]])
        for x, y, r in zip(a.inputs, b.inputs, records[split]):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, [TAPE_IUPAC.index(c) - 4 for c in r["primary"]])
    tokens = task.encode(a.inputs)
    assert tokens.shape == (len(a), a.lengths.max()) and tokens[np.arange(len(a)), a.lengths - 1].min() > 0
    assert len(task.load("train", tmp_path / "l", limit=7)) == 7


def test_long_sequences_are_truncated_counted_and_kept(tmp_path, capsys):
    records = write_tape(tmp_path, "json", long_every=3)
    task = get_task("remote_homology", max_len="30")
    d = task.load("train", tmp_path)
    n_long = sum(len(r["primary"]) > 30 for r in records["train"])
    assert (
        len(d) == len(records["train"]) and n_long == 10
    )  # every example stays: accuracy is over all of them
    assert d.lengths.max() == 30 and task.truncated["train"] == n_long
    assert (
        f"{n_long} of 30 sequences are longer than 30 residues and were truncated" in capsys.readouterr().err
    )
    np.testing.assert_array_equal(d.inputs[0], homology.tokenize(records["train"][0]["primary"][:30], ""))


@pytest.mark.parametrize("fmt", ["json", "lmdb"])
def test_tape_errors_name_the_file_and_the_fix(tmp_path, fmt):
    records = write_tape(tmp_path, fmt)
    task = get_task("remote_homology", download="false")
    path = tmp_path / "remote_homology" / f"remote_homology_valid.{fmt}"
    bad = [dict(r) for r in records["valid"]]
    bad[2]["fold_label"] = 1195
    rewrite(path, bad)
    with pytest.raises(
        DataError,
        match=r"record 2 \(d1_2\) of .*remote_homology_valid.* fold_label 1195 is outside "
        r"0..1194",
    ):
        task.load("valid", tmp_path)
    bad[2]["fold_label"], bad[3]["primary"] = 3, "ACJD"
    rewrite(path, bad)
    with pytest.raises(DataError, match=r"record 3 .* residue 'J' at position 2 is not one of TAPE's 25"):
        task.load("valid", tmp_path)
    with pytest.raises(ValueError, match="has no split 'test'; choose from"):
        task.load("test", tmp_path)
    with pytest.raises(
        DataError,
        match=r"remote_homology_train.lmdb \(TAPE's LMDB\) or .*remote_homology_train.json "
        r"\(TAPE's JSON\)\. Download TAPE's .*remote_homology.tar.gz",
    ):
        task.load("train", tmp_path / "elsewhere")


def test_unreadable_lmdb_and_json_raise_data_errors(tmp_path):
    folder = tmp_path / "remote_homology"
    folder.mkdir()
    (folder / "remote_homology_train.lmdb").write_bytes(b"not an lmdb database at all" * 100)
    task = get_task("remote_homology", download="false")
    with pytest.raises(
        DataError, match=r"remote_homology_train.lmdb (is not a readable LMDB|has no b'num_examples')"
    ):
        task.load("train", tmp_path)
    import lmdb

    env = lmdb.open(str(folder / "remote_homology_valid.lmdb"))
    with env.begin(write=True) as txn:
        txn.put(b"num_examples", pickle.dumps(3))
        txn.put(b"0", pickle.dumps({"primary": "ACD", "fold_label": 1}))
    env.close()
    with pytest.raises(DataError, match=r"says it holds records 0..2 but record 1 is missing"):
        task.load("valid", tmp_path)
    (folder / "remote_homology_test_fold_holdout.json").write_text('[{"primary": "AC", "fold_label": 1}, ')
    with pytest.raises(DataError, match=r"remote_homology_test_fold_holdout.json is not readable JSON"):
        task.load("test_fold_holdout", tmp_path)


# -- user files -------------------------------------------------------------------------------


def test_user_npz_dense_with_split_array(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 7, 3)).astype(np.float32)
    y = np.arange(30) % 4
    split = np.array(["train"] * 20 + ["val"] * 4 + ["test"] * 6)
    np.savez(tmp_path / "mine.npz", x=x, y=y, split=split)
    task = get_task(f"file:{tmp_path / 'mine.npz'}")
    spec = task.spec
    assert (spec.token_kind, spec.seq_len, spec.token_dim, spec.n_classes) == ("dense", 7, 3, 4)
    assert spec.splits == ("train", "val", "test")
    d = task.load("test", tmp_path)
    np.testing.assert_array_equal(task.encode(d.inputs), x[24:])
    np.testing.assert_array_equal(d.labels, y[24:])
    assert len(task.load("train", tmp_path, limit=5)) == 5
    import h5py

    with h5py.File(tmp_path / "mine.h5", "w") as f:  # h5py returns variable-length strings as bytes objects
        f["x"], f["y"] = x, y
        f.create_dataset("split", data=list(split), dtype=h5py.string_dtype())
    h5 = get_task(f"file:{tmp_path / 'mine.h5'}")
    assert h5.spec.splits == ("train", "val", "test")
    np.testing.assert_array_equal(h5.load("val", tmp_path).inputs, x[20:24])


def test_user_ids_with_lengths_and_keras_layout(tmp_path):
    import h5py

    rng = np.random.default_rng(1)
    x = rng.integers(1, 9, (12, 6))
    lengths = rng.integers(1, 7, 12)
    with h5py.File(tmp_path / "ids.h5", "w") as f:
        f["x_train"], f["y_train"], f["lengths_train"] = x[:8], np.arange(8) % 3, lengths[:8]
        f["x_test"], f["y_test"], f["lengths_test"] = x[8:], np.arange(4) % 3, lengths[8:]
    task = get_task(f"file:{tmp_path / 'ids.h5'}", n_classes="5")
    spec = task.spec
    assert spec.token_kind == "ids" and spec.variable_length and spec.n_classes == 5 and spec.vocab_size <= 9
    d = task.load("train", tmp_path)
    tokens = task.encode(d.inputs)
    assert tokens.shape == (8, lengths[:8].max())
    for row, n, full in zip(tokens, lengths[:8], x[:8]):
        np.testing.assert_array_equal(row[:n], full[:n])
        assert (row[n:] == 0).all()


def test_user_file_without_splits_gets_a_seeded_stratified_test(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.random.default_rng(0).integers(0, 5, (50, 4)), y=np.arange(50) % 2)
    a = get_task(f"file:{tmp_path / 'a.npz'}", test_fraction="0.2")
    b = get_task(f"file:{tmp_path / 'a.npz'}", test_fraction="0.2")
    assert (len(a.load("train", ".")), len(a.load("test", "."))) == (40, 10)
    np.testing.assert_array_equal(a.load("test", ".").inputs, b.load("test", ".").inputs)
    assert np.bincount(a.load("test", ".").labels).tolist() == [5, 5]


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"x": np.zeros(5), "y": np.zeros(5, int)},
            r"x is float64 with shape \(5,\); expected \(N, T, d\) floats",
        ),
        ({"x": np.zeros((5, 3, 2)), "y": np.zeros(4, int)}, r"y has shape \(4,\); expected \(5,\)"),
        ({"x": np.zeros((5, 3, 2))}, r"has no array 'y'"),
        (
            {"x": np.full((5, 3, 2), np.nan), "y": np.zeros(5, int)},
            r"NaN, infinite or beyond float32.s range",
        ),
        ({"x": np.zeros((5, 3), int), "y": np.array([0, 1, 2, 3, 0.5])}, r"non-integer values"),
        (
            {"x": np.zeros((5, 3), int), "y": np.array([0, 1, np.nan, 3, 0])},
            r"y holds NaN or infinite labels \(row 2\)",
        ),
        (
            {"x": np.zeros((5, 3), int), "y": np.arange(5), "split": np.array(["train"] * 5)},
            r"no .* 'test' split",
        ),
        (
            {"x": np.zeros((5, 3), int), "y": np.arange(5), "lengths": np.array([1, 2, 3, 4, 9])},
            r"lengths must lie in 1..3",
        ),
        # found by tests/faults/test_fuzz.py: each of these was a traceback, an h5py or scikit-learn message, or a hang
        (
            {"x": np.zeros((6, 3), int), "y": np.arange(6) % 2, "split": np.array(["train", "test", ""] * 2)},
            r"the split array names a split ''; split names are letters, digits",
        ),
        (
            {
                "x": np.zeros((6, 3), int),
                "y": np.arange(6) % 2,
                "split": np.array(["train", "test", "a/b"] * 2),
            },
            r"names a split 'a/b'",
        ),
        (
            {
                "x": np.zeros((6, 3), int),
                "y": np.arange(6) % 2,
                "split": np.array(["train", "test", "input_layer"] * 2),
            },
            r"names a split 'input_layer'",
        ),
        (
            {
                "x_train": np.zeros((4, 3), int),
                "y_train": np.arange(4) % 2,
                "x_test": np.zeros((2, 3), int),
                "y_test": np.arange(2),
                "x_.hidden": np.zeros((2, 3), int),
                "y_.hidden": np.arange(2),
            },
            r"an x_<split> array names a split '.hidden'",
        ),
        (
            {"x": np.zeros((6, 3, 1)), "y": np.array([0, 1, 0, 1, 0, 2**40])},
            r"y has label 1099511627776 \(row 5\), not a class id",
        ),
        (
            {"x": np.full((6, 3), 2**40), "y": np.arange(6) % 2},
            r"x holds token id 1099511627776; ids must be at most 1,048,575",
        ),
    ],
)
def test_user_file_with_wrong_shapes_names_the_array(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=message) as e:
        get_task(f"file:{tmp_path / 'bad.npz'}")
    assert "bad.npz" in str(e.value)


def test_user_file_label_out_of_range_and_missing_file(tmp_path):
    np.savez(tmp_path / "l.npz", x=np.zeros((6, 2, 1), np.float32), y=np.array([0, 1, 2, 3, 4, 7]))
    with pytest.raises(DataError, match=r"label 7 \(split '\w+', row \d\) is out of range for n_classes=5"):
        get_task(f"file:{tmp_path / 'l.npz'}", n_classes="5", test_fraction="0.5")
    with pytest.raises(DataError, match=r"nope.npz does not exist; pass an existing file or folder"):
        get_task(f"file:{tmp_path / 'nope.npz'}")
    with pytest.raises(
        ValueError, match=r"unknown option 'n_class' for task file:PATH; choose from \[.*'n_classes'"
    ):
        get_task(f"file:{tmp_path / 'l.npz'}", n_class="5")


def test_user_file_without_splits_too_few_rows_per_class_to_stratify_is_split_unstratified(tmp_path):
    """12 rows of 5 classes: a 20% test (3 rows) cannot hold every class; scikit-learn refused to stratify it."""
    np.savez(tmp_path / "s.npz", x=np.zeros((12, 2, 1), np.float32), y=np.arange(12) % 5)
    task = get_task(f"file:{tmp_path / 's.npz'}")
    assert (len(task.load("train", ".")), len(task.load("test", "."))) == (9, 3)
    np.savez(tmp_path / "one.npz", x=np.zeros((1, 2, 1), np.float32), y=np.zeros(1, int))
    with pytest.raises(
        DataError,
        match=r"one.npz has 1 rows without a split array: holding out test_fraction 0.2 "
        r"leaves none to train on",
    ):
        get_task(f"file:{tmp_path / 'one.npz'}")


# -- through the command line -------------------------------------------------------------------


def test_data_errors_exit_1_and_leave_no_feature_file(cli, home, tmp_path, tiny_gpt2):
    np.savez(tmp_path / "bad.npz", x=np.zeros((5, 3, 2)), y=np.zeros(4, int))
    cases = [
        ("--task", f"file:{tmp_path / 'bad.npz'}"),
        ("--task", "cifar10", "--data-dir", str(tmp_path / "none")),
        ("--task", "remote_homology", "--data-dir", str(tmp_path / "none")),
    ]
    for args in cases:
        r = cli("extract", *args, "--backbone", str(tiny_gpt2), "--out", str(tmp_path / "f.h5"))
        assert r.exit_code == 1, r.output
        assert str(tmp_path) in r.output and ("; " in r.output or ". " in r.output)
        assert not list(tmp_path.glob("f.h5*")) and not (home / "features").exists()


def test_homology_extract_and_fit_report_every_test_split(cli, home, tmp_path, tiny_gpt2):
    write_tape(tmp_path, "json")
    out = tmp_path / "rh.h5"
    r = cli(
        "-q",
        "extract",
        "--task",
        "remote_homology",
        "--backbone",
        str(tiny_gpt2),
        "--data-dir",
        str(tmp_path),
        "--out",
        str(out),
    )
    assert r.exit_code == 0, r.output
    r = cli(
        "-q",
        "fit",
        "--task",
        "remote_homology",
        "--backbone",
        str(tiny_gpt2),
        "--features",
        str(out),
        "--head",
        "ridge",
        "--depths",
        "2",
    )
    assert r.exit_code == 0, r.output
    result = json.loads(next((home / "results").rglob("*.json")).read_text())
    assert result["test_split"] == "test_fold_holdout" and result["n_val"] == 6 and result["n_test"] == 5
    assert set(result["test_accuracies"]) == {
        "test_fold_holdout",
        "test_superfamily_holdout",
        "test_family_holdout",
    }
    assert result["n_tests"] == {
        "test_fold_holdout": 5,
        "test_superfamily_holdout": 5,
        "test_family_holdout": 6,
    }
    assert result["test_accuracy"] == result["test_accuracies"]["test_fold_holdout"]


def test_data_commands(cli, tmp_path, monkeypatch, cifar_dir):
    data_dir, _ = cifar_dir
    r = cli("data", "list", "--data-dir", str(data_dir))
    assert r.exit_code == 0
    rows = {line.split()[0]: line for line in r.output.splitlines()[1:]}
    assert "present" in rows["cifar10"] and "missing 5 of 5" in rows["remote_homology"]
    assert "no files" in rows["bit_xor"] and set(rows) >= {"mnist", "listops", "digits", "cifar10_lra"}
    r = cli("data", "where", "remote_homology", "--data-dir", str(data_dir))
    assert r.exit_code == 0 and f"data folder: {data_dir}  (from --data-dir)" in r.output
    assert f"need {data_dir}/remote_homology/remote_homology_valid.lmdb | " in r.output
    r = cli("data", "verify", "cifar10", "--data-dir", str(data_dir))
    assert r.exit_code == 0, r.output
    assert "differs from the official" in r.output and "train: 20 examples of the official 50000" in r.output
    r = cli("data", "fetch", "cifar10", "--data-dir", str(tmp_path / "none"))  # offline in tests
    assert (
        r.exit_code == 1
        and f"in {tmp_path / 'none' / 'cifar10'}" in r.output
        and "cifar-10-python.tar.gz" in r.output
    )
    r = cli("data", "fetch", "nope")  # the TASK argument named as the command spells it
    assert r.exit_code == 2 and "Invalid value for 'TASK': unknown task 'nope'" in r.output
    r = cli("data", "where", "digits", "nope")
    assert r.exit_code == 2 and "Invalid value for 'TASKS': unknown task 'nope'" in r.output
    write_tape(tmp_path / "rh", "lmdb")
    r = cli("data", "verify", "remote_homology", "--data-dir", str(tmp_path / "rh"))
    assert r.exit_code == 0 and "train: 30 examples of the official 12312" in r.output
    (data_dir / "cifar10" / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x04junk")
    r = cli("data", "verify", "cifar10", "--data-dir", str(data_dir))
    assert r.exit_code == 1 and "test_batch is unreadable or truncated" in r.output


def test_fetch_says_ready_only_for_files_that_load(cli, tmp_path):
    """``data fetch`` of a task whose files are present reads them: damaged ones are refused naming the file
    (exit 1), good ones are ready."""
    from tests.conftest import write_mnist

    good = tmp_path / "good"
    write_mnist(good / "mnist", {"train": 30, "t10k": 10})
    r = cli("data", "fetch", "mnist", "--data-dir", str(good))
    assert r.exit_code == 0 and "mnist: ready" in r.output, r.output
    bad = tmp_path / "bad" / "mnist"
    shutil.copytree(good / "mnist", bad)
    (bad / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b junk")
    r = cli("data", "fetch", "mnist", "--data-dir", str(bad.parent))
    assert r.exit_code == 1 and "mnist: its files are present but do not load" in r.output
    assert (
        "t10k-images-idx3-ubyte.gz" in r.output
        and "mnist: ready" not in r.output
        and "Traceback" not in r.output
    )


def test_cifar_augmentation_crops_flips_and_rotates_as_the_fpt_code():
    """The FPT code's CIFAR augmentation, step by step: a shift is a crop of a zero-padded copy, a flip mirrors left
    to right after it, 90 degrees turn counter-clockwise as displayed (torchvision's sign); draws stay within 4 pixels
    and 20 degrees, show only the image's pixels or black, and follow the generator alone."""
    from reservoir.tasks.cifar import augment_images, transform

    images = np.arange(1, 1 + 2 * 6 * 6 * 3).reshape(2, 6, 6, 3).astype(np.uint16)
    still, no, zero = np.zeros((2, 2), int), np.zeros(2, bool), np.zeros(2)
    np.testing.assert_array_equal(transform(images, still, no, zero), images)
    np.testing.assert_array_equal(transform(images, still, ~no, zero), images[:, :, ::-1])
    np.testing.assert_array_equal(
        transform(images, still, no, np.full(2, 90.0)), np.rot90(images, 1, axes=(1, 2))
    )
    moved = transform(images, np.array([[1, 2], [0, 0]]), np.array([True, False]), zero)
    np.testing.assert_array_equal(moved[0, :5, 2:], images[0, 1:, 2:][:, ::-1])  # cropped, then mirrored
    assert (moved[0, 5] == 0).all() and (moved[0, :, :2] == 0).all()
    gray = np.random.default_rng(0).integers(1, 256, size=(64, 32, 32)).astype(np.uint8)
    a, b = augment_images(gray, np.random.default_rng(7)), augment_images(gray, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.uint8 and a.shape == gray.shape and not np.array_equal(a, gray)
    assert set(np.unique(a)) <= set(np.unique(gray)) | {0}
    # at most 4 pixels and 20 degrees: the centre pixel of each image is a pixel within 4 + 1 of it
    near = [{int(v) for v in g[11:21, 11:21].ravel()} for g in gray]
    assert all(int(x[15, 15]) in n for x, n in zip(a, near))

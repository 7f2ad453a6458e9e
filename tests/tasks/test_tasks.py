"""Every registered task yields tokens and labels of its declared shapes; ListOps follows LRA."""

from __future__ import annotations

import numpy as np
import pytest

from reservoir.errors import UsageError
from reservoir.tasks import TASKS, DataError, get_task, listops
from tests.conftest import write_mnist

#: a data folder holding the real MNIST files (mnist/), for the test that reads them
SHARED_MNIST = __import__("os").environ.get("RESERVOIR_TEST_DATA", "data")


def data_dir_for(name: str, tmp_path):
    """Tasks that need files get a tiny fixture in the official format written here."""
    if name == "mnist":
        write_mnist(tmp_path / "mnist", {"train": 12, "t10k": 7})
    return tmp_path


FILE_TASKS = {
    "cifar10",
    "cifar10_lra",
    "remote_homology",
}  # their files are written in tests/tasks/test_download.py


@pytest.mark.parametrize("name", [n for n in TASKS.names() if n not in FILE_TASKS])
def test_task_yields_declared_shapes(name, tmp_path):
    task = get_task(name)
    spec = task.spec
    assert "train" in spec.splits and "test" in spec.splits
    for split in spec.splits:
        data = task.load(
            split, data_dir_for(name, tmp_path) if split == spec.splits[0] else tmp_path, limit=5
        )
        assert len(data) == 5
        tokens = task.encode(data.inputs)
        assert tokens.shape[0] == 5
        if spec.token_kind == "dense":
            assert tokens.dtype == np.float32 and tokens.shape[2] == spec.token_dim
            assert tokens.shape[1] == spec.seq_len
        else:
            assert tokens.dtype == np.int64 and tokens.max() < spec.vocab_size and tokens.min() >= 0
            assert tokens.shape[1] == data.lengths.max() <= spec.seq_len
        assert data.labels.shape == (5, *spec.label_shape)
        if spec.target == "regression":  # real values: finite float32 targets
            assert data.labels.dtype == np.float32 and np.isfinite(data.labels).all()
        else:
            assert data.labels.min() >= 0 and data.labels.max() < spec.n_classes
        assert (data.lengths >= spec.n_readout).all() and (data.lengths <= spec.seq_len).all()


def test_unknown_task_and_option_name_the_choices():
    with pytest.raises(ValueError, match=r"unknown task 'nope'; choose from \[.*'digits'"):
        get_task("nope")
    with pytest.raises(
        ValueError, match=r"unknown option 'n_bitz' for task 'bit_xor'; choose from \[.*'n_bits'"
    ):
        get_task("bit_xor", n_bitz="3")
    assert get_task("bit_xor", n_bits="3").spec.seq_len == 6


def test_generated_tasks_are_seeded_and_limit_only_truncates():
    a = get_task("bit_memory", n_bits=100, token_bits=10).load("train", ".", limit=20)
    b = get_task("bit_memory", n_bits=100, token_bits=10).load("train", ".", limit=20)
    np.testing.assert_array_equal(a.inputs, b.inputs)
    xor = get_task("bit_xor")
    full, head = xor.load("test", "."), xor.load("test", ".", limit=10)
    np.testing.assert_array_equal(full.inputs[:10], head.inputs)
    assert not np.array_equal(xor.load("train", ".", limit=10).inputs, head.inputs)


def test_bit_tasks_labels_are_what_the_paper_says():
    d = get_task("bit_xor").load("train", ".", limit=50)
    np.testing.assert_array_equal(d.labels[:, :, 0], d.inputs[:, :5] ^ d.inputs[:, 5:])
    t = get_task("bit_memory", n_bits=100, token_bits=10, mask_prob=0.5)
    m = t.load("train", ".", limit=30)
    patterns, query = m.inputs[:, :500].reshape(30, 5, 100), m.inputs[:, 500:]
    target = m.labels.reshape(30, 100) * 2 - 1
    assert all(
        any((p == target[i]).all() for p in patterns[i]) for i in range(30)
    )  # query is a stored pattern
    shown = query != 0
    np.testing.assert_array_equal(query[shown], target[shown])  # unmasked bits agree
    assert 0.35 < shown.mean() < 0.65


def test_listops_evaluates_like_lra():
    assert listops.evaluate("( ( ( [MAX 4 ) 7 ) ] )") == 7
    assert listops.evaluate("( ( ( [SM 4 ) 7 ) ] )") == 1
    assert listops.evaluate("( ( ( ( [MED 1 ) 2 ) 9 ) ] )") == 2
    assert listops.evaluate("( ( ( [MIN ( ( ( [MAX 4 ) 7 ) ] ) ) 5 ) ] )") == 5
    assert listops.evaluate("( ( ( ( ( [MED 1 ) 2 ) 8 ) 9 ) ] )") == 5  # median 5.0 -> int


def test_listops_tokenization_keeps_closing_bracket_unless_fpt():
    text = "( ( ( [MAX 4 ) 7 ) ] )"
    v = listops.VOCAB
    np.testing.assert_array_equal(listops.tokenize(text), [v["[MAX"], v["4"], v["7"], v["]"]])
    np.testing.assert_array_equal(listops.tokenize(text, keep_brackets=False), [v["[MAX"], v["4"], v["7"]])
    assert len(v) == 16 and v["<pad>"] == 0


def lra_generate_tree(rng, depth, max_depth, max_args):
    """LRA's own ``generate_tree`` (its ListOps generator), the reference :func:`listops.draw_tree` follows."""
    r = rng.random() if depth < max_depth else 1
    if r > listops.VALUE_P:
        return rng.randint(0, 9), 1
    length, values = 2, []
    for _ in range(rng.randint(2, max_args)):
        sub, sub_len = lra_generate_tree(rng, depth + 1, max_depth, max_args)
        values.append(sub)
        length += sub_len
    tree = (rng.choice(listops.OPERATORS), values[0])
    for v in values[1:]:
        tree = (tree, v)
    return (tree, listops.END), length


def lra_to_string(tree):
    return (
        str(tree) if not isinstance(tree, tuple) else f"( {lra_to_string(tree[0])} {lra_to_string(tree[1])} )"
    )


@pytest.mark.parametrize("seed,max_depth,max_args", [(0, 10, 10), (1, 6, 4), (2, 3, 30), (3, 1, 2)])
def test_listops_draws_lra_trees_draw_for_draw(seed, max_depth, max_args):
    """The same texts and lengths as LRA's generator from the same seed, and the random stream left where LRA's
    leaves it (so every later draw is the same too)."""
    import random

    ours, theirs = random.Random(seed), random.Random(seed)
    for _ in range(300):
        tree, length = lra_generate_tree(theirs, 1, max_depth, max_args)
        pieces, got = listops.draw_tree(ours, max_depth, max_args)
        assert (" ".join(pieces), got) == (lra_to_string(tree), length)
    assert ours.random() == theirs.random()


def test_listops_generator_lengths_dedup_and_heldout():
    import random

    rng = random.Random(0)
    for _ in range(200):
        pieces, length = listops.draw_tree(rng, 10, 10)
        text = " ".join(pieces)
        assert length == sum(1 for t in text.split() if t not in "()")  # ops + ']' + values
    t = get_task("listops", n_val=5, n_test=5, n_train=20)
    test = listops.generate(5, 0, listops.STREAM["test"], 500, 2000, 10, 10)
    train = t.texts("train", ".", None)[0]
    assert len(set(train)) == 20 and not set(train) & set(test)
    assert all(500 < sum(1 for x in s.split() if x not in "()") < 2000 for s in train)
    d = t.load("train", ".", limit=4)
    assert (d.lengths == 512).all()  # 500+ tokens truncated to max_len


def test_listops_streams_give_the_same_expressions_however_many_are_asked_for_and_when():
    listops._stream.cache_clear()
    args = (7, listops.STREAM["val"], 100, 400, 10, 10)
    short = listops.generate(4, *args)
    longer = listops.generate(9, *args)  # continues the kept stream
    fresh = listops._Stream(*args, frozenset()).take(9)
    assert longer == fresh and short == fresh[:4] and listops.generate(2, *args) == fresh[:2]
    listops.generate(9, *args).clear()  # a caller holds a copy, never the stream's own list
    assert listops.generate(9, *args) == fresh


def test_a_listops_stream_that_gave_up_stays_given_up(monkeypatch):
    """As if drawn again from the start: the same error, not a stream that drew on past it."""
    from reservoir.tasks import DataError

    monkeypatch.setattr(listops, "MAX_MISSES", 0)  # the first repeated expression ends the stream
    listops._stream.cache_clear()
    digits = (0, listops.STREAM["train"], 0, 2, 1, 2)  # single digits only
    with pytest.raises(DataError, match="distinct expressions") as first:
        listops.generate(10, *digits)
    with pytest.raises(DataError) as again:
        listops.generate(10, *digits)
    assert str(again.value) == str(first.value)
    found = int(str(first.value).split("found ")[1].split(" of")[0])
    assert len(set(listops.generate(found, *digits))) == found


def test_listops_reads_lra_tsv(tmp_path):
    (tmp_path / "listops").mkdir()
    (tmp_path / "listops" / "basic_test.tsv").write_text(
        "Source\tTarget\n( ( ( [MAX 4 ) 7 ) ] )\t7\n( ( ( [SM 4 ) 7 ) ] )\t1\n"
    )
    d = get_task("listops", source="lra").load("test", tmp_path)
    np.testing.assert_array_equal(d.labels, [7, 1])
    np.testing.assert_array_equal(d.lengths, [4, 4])
    (tmp_path / "listops" / "basic_val.tsv").write_text("( [MAX 4 ]\t4\n")
    from reservoir.tasks import DataError

    with pytest.raises(DataError, match="basic_val.tsv should start with the header"):
        get_task("listops", source="lra").load("val", tmp_path)


@pytest.mark.parametrize("option", ["n_train=10", "seed=3", "max_depth=4", "min_length=10"])
def test_listops_generation_options_are_refused_with_lra_files(option):
    """LRA's files are read whole: an option that shapes generated expressions would change nothing (the same
    rows under another identity), and is refused naming it; at its default it passes."""
    key, value = option.split("=")
    with pytest.raises(
        UsageError, match=f"The '{key}' option of task listops \\({value}\\) shapes generated"
    ):
        get_task("listops", source="lra", **{key: value})
    assert get_task("listops", source="lra", n_train="96000").source == "lra"
    assert get_task("listops", **{key: value}).source == "generate"


@pytest.mark.parametrize(
    "line, found",
    [
        ("( [MAX 4 ]\tx", "found target 'x'"),
        ("( [MAX 4 ]\t12", "found target '12'"),
        ("( [MAX 4 ]", "found 1 column(s)"),
        ("( [MAX 4 ]\t4\t4", "found 3 column(s)"),
    ],
)
def test_a_bad_lra_listops_line_is_named_with_its_file_and_line(tmp_path, home, cli, tiny_gpt2, line, found):
    """A target that is not a class 0..9, or a line without its target, is refused naming the file, the line
    and what it should hold (exit 1, no traceback, no feature file)."""
    (tmp_path / "listops").mkdir()
    tsv = tmp_path / "listops" / "basic_train.tsv"
    tsv.write_text(f"Source\tTarget\n( [MIN 4 ]\t4\n{line}\n")
    r = cli(
        "extract", "--task", "listops", "--task-opt", "source=lra", "--split", "train",
        "--backbone", str(tiny_gpt2), "--data-dir", str(tmp_path),
    )  # fmt: skip
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert (
        f"Error: {tsv}, line 3: expected an expression, a tab and a target class from 0 to 9; {found}"
        in r.output
    )
    assert not list((home / "features").rglob("*.h5*"))


@pytest.mark.parametrize("gzipped", [True, False])
def test_a_file_that_is_not_mnist_is_named_with_the_way_to_fetch_it(tmp_path, home, cli, tiny_gpt2, gzipped):
    """A gzip of a few random bytes, or a file that is not gzip at all, in place of an MNIST file: a DataError
    naming the file, saying it is not an MNIST IDX file and how to get a good one (exit 1, no traceback)."""
    import gzip

    write_mnist(tmp_path / "mnist", {"train": 12, "t10k": 7})
    bad = tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz"
    junk = bytes(range(1, 9))
    bad.write_bytes(gzip.compress(junk) if gzipped else junk)
    r = cli(
        "extract", "--task", "mnist", "--split", "test", "--backbone", str(tiny_gpt2), "--data-dir", str(tmp_path)
    )  # fmt: skip
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"Error: {bad} is not an MNIST IDX file" in r.output
    assert "delete it and fetch it again (reservoir data fetch mnist" in r.output
    assert not list((home / "features").rglob("*.h5*"))
    bad.write_bytes((tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes())  # labels in its place
    with pytest.raises(DataError, match="is not an MNIST IDX file .*header of 28x28 uint8 images"):
        get_task("mnist").load("test", tmp_path)


@pytest.mark.skipif(
    not __import__("os").path.exists(SHARED_MNIST + "/mnist"),
    reason="real MNIST not present: set RESERVOIR_TEST_DATA to a data folder holding mnist/",
)
def test_real_mnist_layout():
    task = get_task("mnist")
    d = task.load("test", SHARED_MNIST)
    assert len(d) == 10000 and np.bincount(d.labels).min() > 800
    x = task.encode(d.inputs[:2])
    assert x.shape == (2, 64, 16) and x.max() <= 1.0
    assert x[0, 0].max() == 0  # the padded corner patch is empty


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 not a whole archive"])
def test_a_damaged_copy_of_the_digits_split_is_made_again(tmp_path, monkeypatch, damage):
    """The digits split kept in the cache, found empty or cut short, is made again (and kept whole), as if
    it were absent, not a traceback in every later digits run."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    whole = get_task("digits").load("train", tmp_path)
    (kept,) = (tmp_path / "digits").glob("split-*.npz")
    kept.write_bytes(damage)
    again = get_task("digits").load("train", tmp_path)
    assert np.array_equal(again.labels, whole.labels) and kept.stat().st_size > 1000

"""The Python API: extract/fit functions and the scikit-learn transformer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from reservoir import api
from reservoir.tasks import DataError, get_task


def digit_tokens(n: int = 200):
    """scikit-learn's digits as the ``digits`` task encodes them: 16 tokens of 4 (2x2 patches)."""
    d = load_digits()
    task = get_task("digits")
    return task.encode(d.images[:n].astype(np.uint8)), d.target[:n]


def test_transformer_in_a_pipeline_with_cross_val_score(tiny_gpt2):
    X, y = digit_tokens(180)
    model = Pipeline(
        [
            ("reservoir", api.ReservoirFeatures(backbone=str(tiny_gpt2), depth="all")),
            ("scale", StandardScaler()),
            ("head", LogisticRegression(max_iter=500)),
        ]
    )
    scores = cross_val_score(model, X, y, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.5  # 10 classes: chance is 0.1
    assert model.fit(X, y).named_steps["reservoir"].transform(X[:5]).shape == (
        5,
        3 * 32,
    )  # depths 0..2 x width 32


def test_transformer_features_equal_extracted_features(tiny_gpt2, tmp_path):
    path = api.extract(
        "digits", str(tiny_gpt2), limit=30, batch_size=7, dtype="float32", out=tmp_path / "d.h5"
    )
    X, y = digit_tokens(2000)
    task = get_task("digits")
    train = task.load("train", ".", limit=30)
    tokens = task.encode(train.inputs)
    feats = (
        api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=[0, 2], seed=0, dtype="float32")
        .fit(tokens)
        .transform_depths(tokens)
    )
    for k, depth in enumerate((0, 2)):
        stored, labels = api.read_features(path, "train", depth)
        np.testing.assert_allclose(feats[:, k], stored, atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(labels, train.labels)


def test_variable_length_ids_do_not_depend_on_batch_mates(tiny_gpt2):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 20, n) for n in (3, 9, 5, 12, 1, 7)]
    t = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=-1, batch_size=4).fit(seqs)
    together = t.transform(seqs)
    assert together.shape == (6, 32) and t.spec_.vocab_size == 20
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(t.transform([s])[0], together[i], atol=1e-5)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 20\); got up to 25"):
        t.transform([np.array([1, 25])])


def test_transformer_parameters_follow_the_sklearn_contract(tiny_gpt2):
    t = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=1, seed=3)
    assert clone(t).get_params() == t.get_params() and t.get_params()["seed"] == 3
    with pytest.raises(Exception, match="not fitted"):
        t.transform(np.zeros((2, 4, 3), np.float32))
    with pytest.raises(
        ValueError, match=r"depth 5 is not available in backbone .*; choose depths in \[0, 2\]"
    ):
        api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=5).fit(np.zeros((2, 4, 3), np.float32))
    out = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=1).fit_transform(
        np.random.rand(3, 5).astype(np.float32)
    )
    assert out.shape == (3, 32)  # (N, T) floats: one value a token


@pytest.mark.parametrize(
    "X, message",
    [
        (np.zeros((0, 4, 3), np.float32), "X is empty"),
        ([], "X is empty"),
        (np.zeros((2, 0, 3), np.float32), "sequence 0 of X has no tokens"),
        ([np.array([1, 2]), np.array([], int)], "sequence 1 of X has no tokens"),
        (np.array([[0.5, 1.0], [np.nan, 1.0]]), r"NaN or infinite values \(sequence 1\)"),
        ([np.ones((3, 2)), np.array([[1.0, np.inf]])], r"NaN or infinite values \(sequence 1\)"),
        (np.array([[0.5, 1.0], [1e39, 1.0]]), r"beyond float32's range \(sequence 1\)"),
        (np.array([[1, None], [2, 3]], dtype=object), "whose values are not all numbers"),
        (3.0, "X is a float; give sequences"),
        (
            [np.ones((4, 3), np.int64)] * 2,
            r"sequence 0 of X is int64 with shape \(4, 3\); give each sequence as \(T_i,\) integer ids or "
            r"\(T_i, d\) floats \(integer tokens of d values as floats: .astype\('float32'\)\)",
        ),
        ([np.ones((4, 3)), np.ones((4, 3), np.uint8)], r"sequence 1 of X is uint8 with shape \(4, 3\)"),
    ],
)
def test_the_transformer_refuses_what_extract_refuses_in_a_file(tiny_gpt2, X, message):
    """No rows, a row without tokens, non-finite values or values float32 cannot hold, missing values, no sequences,
    rows of integers with a token width: refused before the model runs (no NaN features, no recursion, TypeError or
    error inside torch)."""
    t = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=1, engine="torch")
    with pytest.raises(ValueError, match=message):
        t.fit(X)
    fitted = t.fit(np.ones((2, 3, 2), np.float32) if "NaN" in message else [np.array([1, 2])])
    with pytest.raises(ValueError, match=message):
        fitted.transform(X)


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "auto"])
def test_transform_refuses_sequences_longer_than_the_backbone_as_fit_does(tmp_path, capfd, engine):
    """A sequence longer than the backbone's positions is refused by ``transform`` with ``fit``'s message,
    before any engine runs (no engine's own error or log line)."""
    from transformers import GPT2Config, GPT2Model

    from reservoir.errors import BackboneError

    if engine == "onnxruntime":
        pytest.importorskip("onnxruntime")
    GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=128)).save_pretrained(tmp_path / "gpt")
    t = api.ReservoirFeatures(backbone=str(tmp_path / "gpt"), engine=engine, dtype="float32")
    long = np.random.default_rng(0).normal(size=(2, 200, 3)).astype(np.float32)
    with pytest.raises(BackboneError) as by_fit:
        t.fit(long)
    t.fit(np.zeros((6, 10, 3), np.float32))
    capfd.readouterr()
    with pytest.raises(BackboneError) as by_transform:
        t.transform(long)
    assert str(by_transform.value) == str(by_fit.value)
    assert "up to 200 tokens" in str(by_fit.value) and "reads at most 128 positions" in str(by_fit.value)
    assert capfd.readouterr().err == ""
    assert t.transform(np.zeros((2, 128, 3), np.float32)).shape == (2, 32)  # the backbone's length still runs


def test_api_extract_and_fit_on_a_user_npz(tiny_gpt2, tmp_path, home):
    rng = np.random.default_rng(0)
    y = np.arange(80) % 2
    x = rng.normal(size=(80, 6, 2)).astype(np.float32)
    x[:, :, 0] += 2.0 * y[:, None]  # learnable: the first feature carries the class
    np.savez(tmp_path / "mine.npz", x=x, y=y, split=np.where(np.arange(80) < 60, "train", "test"))
    path = api.extract(f"file:{tmp_path / 'mine.npz'}", str(tiny_gpt2))
    assert path.parent.parent.name == "mine.npz" and path.exists()  # features/mine.npz/BACKBONE/...-HASH.h5
    results = api.fit(f"file:{tmp_path / 'mine.npz'}", str(tiny_gpt2), head="logreg")
    assert [r["depth"] for r in results] == [0, 1, 2, None, None, None] and all(
        r["n_test"] == 20 for r in results
    )
    assert [r["baseline"] for r in results[3:]] == ["majority", "raw", "tanh-32"]  # the tiny GPT-2 is 32 wide
    assert max(r["test_accuracy"] for r in results) >= 0.8
    with pytest.raises(ValueError, match=r"unknown setting 'limt'; choose from \[.*'limit'"):
        api.extract("digits", str(tiny_gpt2), limt=5)
    np.savez(tmp_path / "bad.npz", x=x[:, :, 0].astype(np.float64), y=y[:5])
    with pytest.raises(DataError, match=r"bad.npz: x is float64 with shape \(80, 6\)"):
        api.extract(f"file:{tmp_path / 'bad.npz'}", str(tiny_gpt2))
    assert not list((home / "features").rglob("bad*"))


@pytest.mark.parametrize("dtype", ["int8", "int8-static"])
def test_int8_transformer_calibrates_as_an_extraction_does(tiny_gpt2, tmp_path, home, dtype):
    """``ReservoirFeatures(dtype="int8")`` calibrates on the first rows it is fitted on, as extract
    does on the first rows of its first split: on the same rows the features agree."""
    pytest.importorskip("openvino")
    from reservoir.runtime.engines import relative_error

    path = api.extract("digits", str(tiny_gpt2), limit=30, batch_size=7, dtype=dtype, out=tmp_path / "d.h5")
    task = get_task("digits")
    tokens = task.encode(task.load("train", ".", limit=30).inputs)
    feats = (
        api.ReservoirFeatures(backbone=str(tiny_gpt2), depth="all", seed=0, dtype=dtype)
        .fit(tokens)
        .transform_depths(tokens)
    )
    stored = np.stack([api.read_features(path, "train", d)[0] for d in range(feats.shape[1])], 1)
    assert relative_error(feats, stored) < 1e-3


@pytest.mark.parametrize("dtype", ["float32", "auto", "int8"])
def test_a_fitted_transformer_pickles_and_its_copy_gives_the_same_features(tiny_gpt2, dtype):
    """A fitted transformer (or a pipeline holding one) pickles as scikit-learn models do (``joblib.dump``):
    the copy rebuilds its runner from the fitted settings (the resolved dtype, int8's calibration rows) and
    transforms to the same features, bit for bit."""
    import copy
    import pickle

    if dtype == "int8":
        pytest.importorskip("openvino")
    X, _ = digit_tokens(40)
    fitted = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=[0, 2], dtype=dtype).fit(X)
    expected = fitted.transform(X)
    again = pickle.loads(pickle.dumps(fitted))
    assert again.dtype_ == fitted.dtype_ and again.depths_ == fitted.depths_
    np.testing.assert_array_equal(again.transform(X), expected)
    np.testing.assert_array_equal(copy.deepcopy(fitted).transform(X[:7]), expected[:7])
    assert "runner_" not in pickle.loads(pickle.dumps(api.ReservoirFeatures())).__dict__  # unfitted stays so


@pytest.mark.parametrize(
    "change", [{"seed": 1}, {"input_scale": "0.02"}, {"engine": "openvino"}, {"backbone": "other"}]
)
def test_a_copy_after_set_params_transforms_as_the_fitted_original(tiny_gpt2, tmp_path, change):
    """``set_params`` after ``fit`` takes effect at the next fit: a pickled or deep-copied transformer builds the
    runner the original was fitted with, not one of the new settings (which gave other features, silently)."""
    import copy
    import pickle

    from tests.conftest import save_tiny_gpt2

    if change.get("backbone"):
        change = {"backbone": str(save_tiny_gpt2(tmp_path / "other", seed=5))}
    X = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    fitted = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=1, dtype="float32", engine="torch").fit(X)
    expected = fitted.transform(X)
    fitted.set_params(**change)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(fitted)).transform(X), expected)
    np.testing.assert_array_equal(copy.deepcopy(fitted).transform(X), expected)


def test_a_pickled_transformer_refuses_a_folder_whose_weights_changed(tmp_path):
    """A copy rebuilds its backbone from the folder it was fitted on: one saved again with other weights is refused
    in words, not read as the fitted model; a numpy integer seed (a grid search's) fits as an int does."""
    import pickle

    from reservoir.errors import UsageError
    from tests.conftest import save_tiny_gpt2

    folder = save_tiny_gpt2(tmp_path / "model", seed=0)
    X = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    fitted = api.ReservoirFeatures(backbone=str(folder), depth=1, dtype="float32", seed=np.int64(2)).fit(X)
    saved = pickle.dumps(fitted)
    np.testing.assert_array_equal(pickle.loads(saved).transform(X), fitted.transform(X))
    save_tiny_gpt2(folder, seed=1)
    with pytest.raises(
        UsageError, match="holds other weights \\(or hooks\\) than it did when this ReservoirFeatures"
    ):
        pickle.loads(saved)


def test_a_copy_of_a_transformer_of_a_model_object_refuses_the_object_changed_since(tiny_gpt2):
    """A model object its caller edits in place after the fit (a weight scaled, a hook added): a pickled or
    deep-copied transformer would rebuild on the edited object, so it is refused in words; unedited, the copy
    gives the fitted features."""
    import copy
    import pickle

    from transformers import GPT2Model

    from reservoir.errors import UsageError

    model = GPT2Model.from_pretrained(tiny_gpt2)
    X = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    fitted = api.ReservoirFeatures(backbone=model, depth=1, dtype="float32").fit(X)
    np.testing.assert_array_equal(copy.deepcopy(fitted).transform(X), fitted.transform(X))
    hook = model.h[0].mlp.register_forward_hook(lambda module, args, out: out * 0)
    with pytest.raises(UsageError, match=r"the model object \(GPT2Model\) holds other weights \(or hooks\)"):
        copy.deepcopy(fitted)
    hook.remove()
    with torch.no_grad():
        model.h[0].mlp.c_fc.weight.mul_(2)
    with pytest.raises(UsageError, match=r"the model object \(GPT2Model\) holds other weights"):
        pickle.loads(pickle.dumps(fitted))


def test_a_folder_saved_again_is_loaded_again(tmp_path):
    """The transformer's in-process cache of loaded backbones knows a folder by its files: a model saved
    again under the same name gives the new model's features, those of a fresh process."""
    from reservoir.api import estimator
    from tests.conftest import save_tiny_gpt2

    folder = save_tiny_gpt2(tmp_path / "model", seed=0)
    X = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    before = api.ReservoirFeatures(backbone=str(folder), depth=1, dtype="float32").fit_transform(X)
    save_tiny_gpt2(folder, seed=1)
    after = api.ReservoirFeatures(backbone=str(folder), depth=1, dtype="float32").fit_transform(X)
    estimator._LOADED.clear()
    fresh = api.ReservoirFeatures(backbone=str(folder), depth=1, dtype="float32").fit_transform(X)
    assert not np.allclose(before, after)
    np.testing.assert_array_equal(after, fresh)


def test_a_data_frame_gives_the_features_of_its_array(tiny_gpt2):
    """Rows of a pandas frame (what a pipeline step with ``set_output(transform="pandas")`` hands on), and
    an object array of numbers, are sequences of one value a token, as the array they hold."""
    pd = pytest.importorskip("pandas")
    X = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    t = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=1, dtype="float32")
    want = t.fit_transform(X)
    np.testing.assert_array_equal(t.fit_transform(pd.DataFrame(X, columns=list("abcdef"))), want)
    np.testing.assert_array_equal(t.fit_transform(X.astype(object)), want)


@pytest.mark.parametrize(
    "params, X, message",
    [
        ({}, [np.array([1, -2, 3])], r"token ids must be >= 0; got -2"),
        ({"vocab_size": 3}, [np.array([1, 7])], r"must lie in \[0, 3\); got up to 7"),
        ({}, [np.array([1, 10**9])], r"token ids must be at most 1,048,575; got 1,000,000,000"),
        ({"vocab_size": 0}, [np.array([1])], r"'vocab_size' parameter .* must be an integer >= 1. Got 0"),
        ({"vocab_size": 5.5}, [np.array([1])], r"'vocab_size' parameter .* Got 5.5"),
        ({"seed": 2.0}, [np.array([1])], r"'seed' parameter .* must be an integer in"),
        (
            {"depth": [1.5]},
            [np.array([1])],
            r"depths \[1.5\] must be 'all', an integer or a list of integers",
        ),
        ({}, ["abc", "de"], r"sequence 0 of X is <U3 with shape \(\); give each sequence as"),
        (
            {"vocab_size": 8},
            np.zeros((2, 3, 4), np.float32),
            r"vocab_size=8 sizes a vocabulary of integer token ids, and X holds real-valued tokens",
        ),
    ],
)
def test_fit_refuses_ids_and_settings_it_cannot_honour(tiny_gpt2, params, X, message):
    """Negative ids, ids past ``vocab_size``, a vocabulary or seed that is not a whole number, a depth that is
    not one, a vocabulary for real-valued tokens: refused by ``fit`` in words, not truncated nor failing inside torch."""
    with pytest.raises(ValueError, match=message):
        api.ReservoirFeatures(backbone=str(tiny_gpt2), **{"depth": 1, **params}).fit(X)


def test_a_vision_backbone_on_rows_of_several_lengths_reads_each_row_alone(tmp_path):
    """Fitted on rows of 3, 4 and 9 tokens (of varying length: no image grid), a ViT transformer gives a row the
    features it has alone beside a row of 9 tokens, a square width."""
    from tests.zoo import save_tiny

    folder = save_tiny("vit", tmp_path / "vit")
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=(n, 3)).astype(np.float32) for n in (3, 4, 9)]
    t = api.ReservoirFeatures(backbone=str(folder), depth=-1, dtype="float32", engine="torch").fit(rows)
    assert t.spec_.variable_length
    np.testing.assert_allclose(t.transform([rows[0], rows[2]])[0], t.transform([rows[0]])[0], atol=1e-5)


@pytest.mark.parametrize("kind", ["vit", "siglip_vision"])
def test_a_vision_backbone_fitted_on_images_reads_a_shorter_row_alone(tmp_path, kind):
    """Fitted on rows of 16 tokens (an image grid, its positions resized to 4 x 4), a row of 9 tokens takes its
    first positions beside a 16-token row as alone (the batch's width gave it the grid's), and a 16-token row
    keeps the grid's beside a shorter or a longer one."""
    from tests.zoo import save_tiny

    folder = save_tiny(kind, tmp_path / kind)
    rng = np.random.default_rng(0)
    images, short = rng.normal(size=(4, 16, 3)).astype(np.float32), rng.normal(size=(9, 3)).astype(np.float32)
    t = api.ReservoirFeatures(backbone=str(folder), depth=-1, dtype="float32", engine="torch").fit(images)
    together = t.transform([short, images[0]])
    np.testing.assert_allclose(together[0], t.transform([short])[0], atol=1e-5)
    np.testing.assert_allclose(together[1], t.transform(images[:1])[0], atol=1e-5)
    longer = rng.normal(size=(25, 3)).astype(np.float32)  # a wider batch: the image row keeps its grid
    np.testing.assert_allclose(t.transform([images[0], longer])[0], t.transform(images[:1])[0], atol=1e-5)


def test_features_the_backbone_cannot_hold_are_refused_not_returned(tiny_gpt2):
    """Inputs within float32's range whose features overflow inside the backbone (1e20: its squares do) are
    refused in words naming the sequence, not returned as NaN."""
    X = np.ones((3, 4, 2), np.float32)
    X[1, 2] = 1e20
    fitted = api.ReservoirFeatures(backbone=str(tiny_gpt2), depth=1, dtype="float32", engine="torch").fit(
        X[:1]
    )
    with pytest.raises(ValueError, match="NaN or inf features for sequence 1 of X in float32"):
        fitted.transform(X)


def test_a_refit_that_fails_leaves_the_transformer_as_it_was(tmp_path):
    """A refit refused after some of its settings were read (sequences past the backbone's positions, a
    vocab_size for real-valued tokens) leaves the fitted transformer as it was: the same depths, features and
    length check, never the new depths over the old runner; a first fit that fails leaves it unfitted."""
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted
    from transformers import GPT2Config, GPT2Model

    from reservoir.errors import BackboneError

    GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16)).save_pretrained(tmp_path / "gpt")
    x = np.random.default_rng(0).normal(size=(5, 8, 3)).astype(np.float32)
    t = api.ReservoirFeatures(backbone=str(tmp_path / "gpt"), depth=-1, dtype="float32").fit(x)
    before = t.transform(x)
    for params, X, error in (
        ({"depth": "all"}, np.zeros((2, 40, 3), np.float32), BackboneError),
        ({"depth": "all", "vocab_size": 9}, x, ValueError),
    ):
        t.set_params(**params)
        with pytest.raises(error):
            t.fit(X)
        t.set_params(depth=-1, vocab_size=None)
        assert t.depths_ == [2] and t.spec_.seq_len == 8
        np.testing.assert_array_equal(t.transform(x), before)
        with pytest.raises(BackboneError, match="reads at most 16 positions"):
            t.transform(np.zeros((2, 40, 3), np.float32))
    fresh = api.ReservoirFeatures(backbone=str(tmp_path / "gpt"), dtype="float32")
    with pytest.raises(BackboneError):
        fresh.fit(np.zeros((2, 40, 3), np.float32))
    with pytest.raises(NotFittedError):
        check_is_fitted(fresh)

"""Stored features equal a truncated model's output; same seed -> same file; resume == uninterrupted."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from reservoir.config import ExtractConfig
from reservoir.extract.run import extract
from reservoir.extract.store import FeatureWriter, open_features, partial_path
from tests.conftest import save_tiny_gpt2


def run(tmp_path, name="f.h5", **kw):
    cfg = ExtractConfig(
        **{
            "task": "digits",
            "backbone": "lstm",
            "limit": 40,
            "batch_size": 16,
            "dtype": "float32",
            "out": tmp_path / name,
            **kw,
        }
    )
    return extract(cfg, progress=False)


def stored_input_layer(f):
    from torch import nn

    g = f["input_layer"]
    w = torch.from_numpy(g["weight"][:])
    if "bias" in g:
        layer = nn.Linear(w.shape[1], w.shape[0])
        layer.load_state_dict({"weight": w, "bias": torch.from_numpy(g["bias"][:])})
    else:
        layer = nn.Embedding(*w.shape)
        layer.load_state_dict({"weight": w})
    return layer


def task_tokens(task_name, split="train", limit=40, **opts):
    from reservoir.tasks import get_task

    task = get_task(task_name, **opts)
    d = task.load(split, ".", limit)
    return task, d


def test_gpt2_depth_k_equals_truncated_model(tmp_path, tiny_gpt2):
    from transformers import GPT2Model

    path = run(tmp_path, backbone=str(tiny_gpt2))
    task, d = task_tokens("digits")
    with open_features(path) as f:
        assert list(f.attrs["depths"]) == [0, 1, 2]
        feats = f["train"]["features"][:]
        np.testing.assert_array_equal(f["train"]["labels"][:], d.labels)
        emb = stored_input_layer(f)(torch.from_numpy(task.encode(d.inputs)))
    for k in (0, 1, 2):
        model = GPT2Model.from_pretrained(tiny_gpt2, n_layer=k).eval()
        with torch.no_grad():
            ref = model(inputs_embeds=emb).last_hidden_state[:, -1].numpy()
        np.testing.assert_allclose(feats[:, k, 0], ref, atol=1e-5, rtol=1e-5)


def test_lstm_depth_k_equals_stacked_lstm(tmp_path):
    from reservoir.model.backbones import load_backbone

    path = run(tmp_path, backbone="lstm", depths="0,2,3")
    task, d = task_tokens("digits")
    backbone = load_backbone("lstm", seed=0)
    with open_features(path) as f:
        feats = f["train"]["features"][:]
        emb = stored_input_layer(f)(torch.from_numpy(task.encode(d.inputs)))
    np.testing.assert_allclose(feats[:, 0, 0], emb[:, -1].detach().numpy(), atol=1e-6)
    for col, k in ((1, 2), (2, 3)):
        ref = torch.nn.LSTM(768, 768, num_layers=k, batch_first=True)
        state = {}
        for i in range(k):
            for name, p in backbone.layers[i].named_parameters():
                state[name.replace("_l0", f"_l{i}")] = p
        ref.load_state_dict(state)
        with torch.no_grad():
            out = ref(emb)[0][:, -1].numpy()
        np.testing.assert_allclose(feats[:, col, 0], out, atol=1e-5, rtol=1e-4)


def test_variable_length_readout_is_last_real_token(tmp_path, tiny_gpt2):
    """ListOps rows of different lengths: each row's features equal the row run alone."""
    from transformers import GPT2Model

    opts = {"max_len": 64, "n_train": 6, "n_val": 1, "n_test": 1, "min_length": 5, "max_length": 60}
    path = run(
        tmp_path,
        task="listops",
        task_options=opts,
        backbone=str(tiny_gpt2),
        batch_size=3,
        limit=None,
        split="train",
    )
    task, d = task_tokens("listops", limit=None, **opts)
    assert len(set(d.lengths.tolist())) > 1
    model = GPT2Model.from_pretrained(tiny_gpt2).eval()
    with open_features(path) as f:
        feats = f["train"]["features"][:, -1, 0]
        layer = stored_input_layer(f)
    for i in range(len(d)):
        with torch.no_grad():
            emb = layer(torch.from_numpy(d.inputs[i].astype(np.int64))[None])
            ref = model(inputs_embeds=emb).last_hidden_state[0, -1].numpy()
        np.testing.assert_allclose(feats[i], ref, atol=1e-5, rtol=1e-5)


def test_same_seed_same_file_other_seed_differs(tmp_path):
    a, b = run(tmp_path, "a.h5", seed=3), run(tmp_path, "b.h5", seed=3)
    c = run(tmp_path, "c.h5", seed=4)
    with h5py.File(a) as fa, h5py.File(b) as fb, h5py.File(c) as fc:
        np.testing.assert_array_equal(fa["train/features"][:], fb["train/features"][:])
        np.testing.assert_array_equal(fa["input_layer/weight"][:], fb["input_layer/weight"][:])
        assert not np.array_equal(fa["train/features"][:], fc["train/features"][:])
        assert fa.attrs["seed"] == 3 and fa.attrs["complete"]
    assert a.read_bytes() == b.read_bytes().replace(b"b.h5", b"a.h5")


def test_interrupted_run_resumes_to_the_same_file(tmp_path, monkeypatch):
    full = run(tmp_path, "full.h5")
    calls = {"n": 0}
    write = FeatureWriter.write

    def flaky(self, split, rows, features):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # killed midway
        return write(self, split, rows, features)

    monkeypatch.setattr(FeatureWriter, "write", flaky)
    out = tmp_path / "resumed.h5"
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "resumed.h5")
    assert not out.exists() and partial_path(out).exists()
    with h5py.File(partial_path(out)) as f:
        assert not f.attrs["complete"] and 0 < f["train"].attrs["rows_done"] < 40
    monkeypatch.setattr(FeatureWriter, "write", write)
    run(tmp_path, "resumed.h5")
    assert out.exists() and not partial_path(out).exists()
    with h5py.File(full) as a, h5py.File(out) as b:
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])
            assert b[split]["done"][:].all()


def test_resume_with_other_settings_is_refused(tmp_path, monkeypatch):
    from reservoir.extract.store import StoreError

    monkeypatch.setattr(FeatureWriter, "write", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "x.h5", seed=1)
    with pytest.raises(StoreError, match=r"unfinished run with other settings \(.*seed: stored 1, asked 2"):
        run(tmp_path, "x.h5", seed=2)


def test_four_block_model_cut_to_two_gives_depth_two(tmp_path):
    """A folder holding a 4-block GPT-2 and one holding its first 2 blocks agree at depth 2."""
    from transformers import GPT2Model

    four = save_tiny_gpt2(tmp_path / "four", n_layer=4)
    GPT2Model.from_pretrained(four, n_layer=2).save_pretrained(tmp_path / "two")
    a = run(tmp_path, "four.h5", backbone=str(four), seed=7)
    b = run(tmp_path, "two.h5", backbone=str(tmp_path / "two"), seed=7)
    with open_features(a) as fa, open_features(b) as fb:
        assert list(fa.attrs["depths"]) == [0, 1, 2, 3, 4] and list(fb.attrs["depths"]) == [0, 1, 2]
        for split in ("train", "test"):
            np.testing.assert_allclose(fb[split]["features"][:, -1], fa[split]["features"][:, 2], atol=1e-6)


@pytest.mark.parametrize("backbone", ["gpt2-random", "lstm", "lstm-12-residual-pos"])
def test_registered_backbones_extract_without_nan(tmp_path, backbone):
    path = run(tmp_path, backbone=backbone, limit=10, depths="0,1,2")  # a row of each of the 10 classes
    with open_features(path) as f:
        x = f["test"]["features"][:]
        assert x.shape == (10, 3, 1, 768) and np.isfinite(x).all() and x.std() > 0


def test_splits_that_disagree_on_their_classes_are_refused_before_anything_is_extracted(cli, home, tmp_path):
    """A class the test split holds and train lacks is refused before extraction (exit 1), naming the class,
    the splits and the fix, and no file is left; when only --limit's sample leaves classes out, the fix is the
    --limit that keeps them."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 4, 2)).astype(np.float32)
    np.savez(
        tmp_path / "lacking.npz",
        x_train=x[:30],
        y_train=np.arange(30) % 3,
        x_test=x[30:],
        y_test=np.arange(10) % 4,
    )
    out = tmp_path / "out" / "f.h5"
    args = ["extract", "--backbone", "lstm", "--dtype", "float32", "--out", str(out)]
    r = cli(*args, "--task", f"file:{tmp_path / 'lacking.npz'}")
    assert r.exit_code == 1, r.output
    assert "split 'train' lacks class 3, which 'test' holds" in r.output
    assert "give the train split examples of every class" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists() and not (home / "features").exists()

    y = np.arange(40) % 4
    np.savez(tmp_path / "even.npz", x_train=x[:32], y_train=y[:32], x_test=x[32:], y_test=y[32:])
    r = cli(*args, "--task", f"file:{tmp_path / 'even.npz'}", "--limit", "3")
    assert r.exit_code == 1, r.output
    assert "the sample of --limit 3 leaves them out: pass --limit 4 or more" in r.output
    assert not (tmp_path / "out").exists()
    assert cli(*args, "--task", f"file:{tmp_path / 'even.npz'}", "--limit", "4").exit_code == 0


def test_readout_all_of_one_label_an_example_says_before_extracting_that_no_head_fits_it(cli, home):
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--readout", "all", "--limit", "20",
            "--depths", "0,1")  # fmt: skip
    assert r.exit_code == 0, r.output
    said = r.output.index("readout all: every position's state, and one label an example")
    assert said < r.output.index("extracting digits") and "will refuse these features" in r.output

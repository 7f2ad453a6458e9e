"""The fast extraction path: bf16 close to float32, compiled equal to eager, padding and
bucketing never change a feature, prefetch and background writes keep errors and resume."""

from __future__ import annotations

import threading

import h5py
import numpy as np
import pytest
import torch

from reservoir.config import ExtractConfig
from reservoir.extract import plan
from reservoir.extract import run as ex
from reservoir.extract.plan import plan_batches
from reservoir.extract.run import prefetch
from reservoir.extract.store import FeatureWriter, StoreError, open_features, partial_path
from reservoir.model.backbones import load_backbone
from reservoir.runtime import runner as fw
from reservoir.runtime.runner import FeatureRunner, resolve_dtype, round_width
from reservoir.tasks import get_task

LISTOPS = {"max_len": 200, "n_train": 14, "n_val": 1, "n_test": 1, "min_length": 5, "max_length": 190}


def runner_for(
    task, backbone, dtype="float32", compile=False, batch_size=None, depths=None, seed=0, engine="torch"
):
    bb = load_backbone(str(backbone), seed)
    depths = depths or list(range(bb.n_layers + 1))
    return FeatureRunner.build(
        task.spec, bb, depths, seed=seed, dtype=dtype, compile=compile, batch_size=batch_size, engine=engine
    )


def digits(n=48):
    task = get_task("digits")
    d = task.load("train", ".", n)
    return task, task.encode(d.inputs), d.lengths


def rel_err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Norm-wise relative error per (row, depth): ``|a - b| / |b|`` over the feature vector
    (an all-zero ``b``, such as a blank patch at depth 0 of an LSTM, counts ``|a - b|``)."""
    return np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(b, axis=-1), 1e-6)


@pytest.mark.parametrize("backbone", ["tiny", "lstm"])
def test_bf16_features_close_to_float32_but_not_equal(backbone, tiny_gpt2):
    task, tokens, lengths = digits()
    name = tiny_gpt2 if backbone == "tiny" else backbone
    depths = None if backbone == "tiny" else [0, 1, 3]
    f32 = runner_for(task, name, "float32", depths=depths)(tokens, lengths)
    b16 = runner_for(task, name, "bfloat16", depths=depths)(tokens, lengths)
    assert b16.dtype == np.float32 and b16.shape == f32.shape
    err = rel_err(b16, f32)
    assert err.max() < 0.05, err.max(axis=0)
    assert err[:, 1:].mean() > 1e-4  # blocks really ran in bf16


def test_auto_dtype_is_a_native_float_dtype_and_others_are_refused():
    from reservoir.runtime.dtypes import candidates

    assert resolve_dtype("auto") in candidates()
    assert resolve_dtype("float32") == "float32" and resolve_dtype("float16") == "float16"
    with pytest.raises(ValueError, match="dtype 'float64' is not supported; choose from"):
        resolve_dtype("float64")


def test_auto_compile_only_for_big_runs():
    assert ex.should_compile(None, ex.AUTO_COMPILE_TOKENS) and not ex.should_compile(
        None, ex.AUTO_COMPILE_TOKENS - 1
    )
    assert ex.should_compile(True, 1) and not ex.should_compile(False, 10**9)
    lstm = load_backbone("lstm")  # dynamo cannot capture nn.LSTM: auto never compiles it, asked it does
    assert not ex.should_compile(None, 10**9, lstm) and ex.should_compile(True, 1, lstm)


@pytest.mark.slow  # a real inductor compile: 20 s to minutes on 2 shared cores
def test_compiled_forward_equals_eager(tiny_gpt2):
    """A real inductor compile (weight freezing) of the tiny GPT-2, with a padded last batch."""
    task, tokens, lengths = digits(40)
    eager = runner_for(task, tiny_gpt2)(tokens, lengths)
    runner = runner_for(task, tiny_gpt2, compile=True, batch_size=24)
    out = np.concatenate([runner(tokens[:24], lengths[:24]), runner(tokens[24:], lengths[24:])])
    assert runner.compiled  # no fallback happened
    np.testing.assert_allclose(out, eager, atol=1e-5, rtol=1e-5)


def identity_compile(monkeypatch):
    """torch.compile replaced by the identity: the compiled path's padding runs eagerly (fast)."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)


def test_compiled_path_pads_rows_and_width_without_changing_features(monkeypatch, tiny_gpt2):
    identity_compile(monkeypatch)
    task = get_task("listops", **LISTOPS)
    d = task.load("train", ".", None)
    rows = np.arange(5)
    tokens, lengths = task.encode(d.inputs[rows]), d.lengths[rows]
    assert tokens.shape[1] % fw.WIDTH_MULTIPLE != 0
    plain = runner_for(task, tiny_gpt2)
    padded = runner_for(task, tiny_gpt2, compile=True, batch_size=8)
    batch = padded.prepare(tokens, lengths)
    assert batch.tokens.shape == (8, round_width(tokens.shape[1], 200)) and batch.n == 5
    assert batch.tokens.shape[1] % fw.WIDTH_MULTIPLE == 0 or batch.tokens.shape[1] == 200
    np.testing.assert_allclose(padded.run(batch), plain(tokens, lengths), atol=1e-5, rtol=1e-5)


def test_round_width_stops_at_the_task_length():
    assert round_width(65, 1024) == 128 and round_width(64, 1024) == 64
    assert round_width(195, 200) == 200 and round_width(190, 200) == 192 and round_width(250, 200) == 250


def test_compile_failure_falls_back_to_eager(monkeypatch, capsys, tiny_gpt2):
    def broken(fn, **kw):
        def run(*a):
            raise RuntimeError("inductor exploded")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    task, tokens, lengths = digits(8)
    runner = runner_for(task, tiny_gpt2, compile=True, batch_size=8)
    out = runner(tokens, lengths)
    assert not runner.compiled and "inductor exploded" in capsys.readouterr().err
    np.testing.assert_array_equal(out, runner_for(task, tiny_gpt2)(tokens, lengths))


def test_bucketing_gives_the_features_of_unbucketed_batches(tmp_path, tiny_gpt2):
    """Causal model, readout = last real token: batch composition never changes a feature."""
    task = get_task("listops", **LISTOPS)
    d = task.load("train", ".", None)
    assert len(set(d.lengths.tolist())) > 3
    runner = runner_for(task, tiny_gpt2)
    feats = {}
    for bucket in (True, False):
        out = np.zeros((len(d), len(runner.depths), 1, runner.backbone.d_model), dtype=np.float32)
        batches = plan_batches(d.lengths, 4, bucket)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(d)))
        for rows in batches:
            assert np.all(np.diff(rows) > 0)
            out[rows] = runner(task.encode(d.inputs[rows]), d.lengths[rows])
        feats[bucket] = out
    spread = [np.ptp(d.lengths[r]) for r in plan_batches(d.lengths, 4, True)]
    assert max(spread) < np.ptp(d.lengths)  # buckets group similar lengths
    np.testing.assert_allclose(feats[True], feats[False], atol=1e-5, rtol=1e-5)


def test_prefetch_keeps_order_runs_ahead_on_a_thread_and_raises_producer_errors():
    threads = []

    def items():
        for i in range(5):
            threads.append(threading.current_thread().name)
            yield i
        raise ValueError("bad batch 5")

    got = []
    with pytest.raises(ValueError, match="bad batch 5"):
        for x in prefetch(items(), depth=2):
            got.append(x)
    assert got == [0, 1, 2, 3, 4] and set(threads) == {"reservoir-prefetch"}


def run(tmp_path, name, backbone, **kw):
    cfg = ExtractConfig(
        **{
            "task": "digits",
            "backbone": str(backbone),
            "limit": 40,
            "batch_size": 8,
            "depths": "0,1",
            "dtype": "float32",
            "compile": False,
            "out": tmp_path / name,
            **kw,
        }
    )
    return ex.extract(cfg, progress=False)


def test_writer_thread_failure_surfaces_and_never_completes_then_resume_matches(
    tmp_path, monkeypatch, tiny_gpt2
):
    full = run(tmp_path, "full.h5", tiny_gpt2)
    write, seen = FeatureWriter.write, []

    def failing(self, split, rows, features):
        seen.append(threading.current_thread().name)
        if len(seen) == 4:
            raise OSError("disk full")
        return write(self, split, rows, features)

    monkeypatch.setattr(FeatureWriter, "write", failing)
    out = tmp_path / "resumed.h5"
    with pytest.raises(
        StoreError, match=r"resumed.h5 stopped: the write failed \(disk full\).*rerun the same"
    ):
        run(tmp_path, "resumed.h5", tiny_gpt2)
    assert set(seen) == {"reservoir-writer"}  # writes ran off the main thread
    assert not out.exists() and partial_path(out).exists()
    with h5py.File(partial_path(out)) as f:
        assert not f.attrs["complete"] and f["train"].attrs["rows_done"] == 24
        assert f["train"]["done"][:].sum() == 24
    with pytest.raises(StoreError, match="does not exist"):
        open_features(out)
    monkeypatch.setattr(FeatureWriter, "write", write)
    run(tmp_path, "resumed.h5", tiny_gpt2)
    with h5py.File(full) as a, h5py.File(out) as b:
        assert b.attrs["complete"]
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])


def test_default_extraction_records_the_resolved_dtype(tmp_path):
    path = ex.extract(
        ExtractConfig(task="digits", backbone="lstm", limit=10, depths="0,1", out=tmp_path / "d.h5"),
        progress=False,
    )
    with open_features(path) as f:
        assert f.attrs["dtype"] == resolve_dtype("auto")


def test_auto_batch_size_holds_about_a_token_budget_and_gives_lstms_more_rows(tiny_gpt2):
    gpt2, lstm = load_backbone(str(tiny_gpt2)), load_backbone("lstm")
    assert plan.auto_batch_size(gpt2, 64) == plan.BATCH_TOKENS // 64
    assert plan.auto_batch_size(gpt2, 10**6) == 1 and plan.auto_batch_size(gpt2, 1) == plan.MAX_BATCH_ROWS
    assert plan.auto_batch_size(lstm, 1024) > plan.auto_batch_size(gpt2, 1024)

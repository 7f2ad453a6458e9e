"""The ONNX Runtime engine computes the features PyTorch computes at every depth; its int8 stays close
and a row never depends on its batch; the exported file is cached; ``auto`` takes it when measured
fastest and falls back to PyTorch when it cannot export; every way it fails says what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from reservoir.errors import BackboneError, UsageError  # noqa: E402
from reservoir.model.backbones import load_backbone  # noqa: E402
from reservoir.runtime import engines, onnx, records  # noqa: E402
from reservoir.runtime import runner as runner_module  # noqa: E402
from reservoir.runtime.runner import FeatureRunner  # noqa: E402
from reservoir.tasks import get_task  # noqa: E402
from tests.runtime.test_engines import LISTOPS, batches, runner  # noqa: E402  (the same helpers, one copy)

pytestmark = pytest.mark.usefixtures("one_thread", "cache")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty RESERVOIR_CACHE: exported files and measured rates of this test alone."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("task_name", ["listops", "bit_xor"])
def test_float32_equals_pytorch_at_every_depth(tiny_gpt2, task_name):
    task = get_task(task_name, **(LISTOPS if task_name == "listops" else {}))
    ort, pt = runner(task, str(tiny_gpt2), "onnxruntime"), runner(task, str(tiny_gpt2), "torch")
    assert (ort.engine, pt.engine) == ("onnxruntime", "torch")
    for tokens, lengths in batches(task):  # another batch and width: the same file, its axes free
        ours, ref = ort(tokens, lengths), pt(tokens, lengths)
        assert ours.shape == ref.shape and ours.shape[1] == 3  # depths 0, 1, 2
        for depth in range(ours.shape[1]):
            np.testing.assert_allclose(ours[:, depth], ref[:, depth], rtol=1e-4, atol=1e-5)
    assert ort.forward.error < 1e-5 and ort.forward.path.exists()


@pytest.mark.slow  # about 30 s: an LSTM exported and quantised
def test_an_lstm_exports_with_equal_features_and_int8_that_would_stay_float_is_refused():
    task = get_task("listops", **LISTOPS)
    ort, pt = runner(task, "lstm", "onnxruntime"), runner(task, "lstm", "torch")
    for tokens, lengths in batches(task, 6):
        np.testing.assert_allclose(ort(tokens, lengths), pt(tokens, lengths), rtol=1e-4, atol=1e-5)
    (tokens, lengths), _ = batches(task, 6)
    q = runner(task, "lstm", "onnxruntime", "int8", calibration=lambda: [(tokens[:4], lengths[:4])])
    with pytest.raises(BackboneError, match="no matrix product with int8 weights.*use --dtype float32"):
        q(tokens, lengths)


def test_int8_is_close_to_float32_and_a_row_never_depends_on_its_batch(tiny_gpt2):
    task = get_task("listops", **LISTOPS)
    (tokens, lengths), _ = batches(task)
    q = runner(task, str(tiny_gpt2), "onnxruntime", "int8", calibration=lambda: [(tokens[:4], lengths[:4])])
    ref = runner(task, str(tiny_gpt2), "torch")(tokens, lengths)
    together = q(tokens, lengths)
    assert 0 < engines.relative_error(together, ref) < 0.1  # quantized, and close
    assert "MatMulInteger" in {n.op_type for n in __import__("onnx").load(str(q.forward.path)).graph.node}
    alone = np.concatenate(
        [q(tokens[i : i + 1, : lengths[i]], lengths[i : i + 1]) for i in range(len(tokens))]
    )
    shuffled = np.random.default_rng(0).permutation(len(tokens))
    mixed = np.empty_like(together)
    mixed[shuffled] = q(tokens[shuffled], lengths[shuffled])
    # ONNX Runtime's scales are per tensor: each row runs alone, so its scales are its own
    np.testing.assert_array_equal(alone, together)
    np.testing.assert_array_equal(mixed, together)


def test_the_exported_file_is_cached_by_model_and_a_second_run_does_not_export(tiny_gpt2, cache, monkeypatch):
    task = get_task("bit_xor")
    (tokens, lengths), _ = batches(task)
    said = []
    first = runner(task, str(tiny_gpt2), "onnxruntime", log=said.append)(tokens, lengths)
    assert "exported to" in said[-1] and len(list((cache / onnx.FOLDER).glob("*.onnx"))) == 1

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx, "export", no_export)
    again = runner(task, str(tiny_gpt2), "onnxruntime", log=said.append)(tokens, lengths)
    assert "cached file" in said[-1] and "export" not in said[-1].split(";")[1]
    np.testing.assert_array_equal(again, first)
    other = FeatureRunner.build(
        task.spec,
        load_backbone(str(tiny_gpt2), 0),
        [0, 1],
        seed=1,
        dtype="float32",
        engine="onnxruntime",
        log=said.append,
    )  # another input layer and depths: another file
    with pytest.raises(
        BackboneError, match="torch could not export it to ONNX .*exported again.*pass --engine torch"
    ):
        other(tokens, lengths)


@pytest.mark.parametrize(
    "damage", ["flipped", pytest.param("no digest", marks=pytest.mark.slow)]
)  # 10-15 s each
def test_a_cached_file_that_differs_from_its_digest_is_exported_again(tiny_gpt2, cache, damage):
    """A bit flipped in the cached file (which the check against PyTorch may tolerate), or an export cut before its
    digest was written: the file is not used but exported again, saying so, and the features are the first run's."""
    task = get_task("bit_xor")
    (tokens, lengths), _ = batches(task)
    first = runner(task, str(tiny_gpt2), "onnxruntime")(tokens, lengths)
    (path,) = (cache / onnx.FOLDER).glob("*.onnx")
    if damage == "flipped":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        onnx.digest_path(path).unlink()
    said = []
    again = runner(task, str(tiny_gpt2), "onnxruntime", log=said.append)(tokens, lengths)
    assert any(f"the cached file {path}" in line and "exporting it again" in line for line in said), said
    assert "exported to" in said[-1]
    np.testing.assert_array_equal(again, first)
    assert onnx.damage(path) is None


def test_features_that_disagree_with_pytorch_are_refused(tiny_gpt2, monkeypatch):
    monkeypatch.setitem(engines.TOLERANCE, "float32", -1.0)  # any difference is too large
    task = get_task("bit_xor")
    (tokens, lengths), _ = batches(task)
    with pytest.raises(
        BackboneError, match="ONNX Runtime engine's features differ from PyTorch's by .*pass --engine torch"
    ):
        runner(task, str(tiny_gpt2), "onnxruntime")(tokens, lengths)


def test_dtypes_it_does_not_compute_and_other_devices_are_refused_in_words(tiny_gpt2):
    cpu, bb = torch.device("cpu"), load_backbone(str(tiny_gpt2), 0)
    for dtype in ("bfloat16", "float16", "int8-static"):
        with pytest.raises(
            UsageError, match=f"--engine onnxruntime computes float32 or int8, not --dtype {dtype}"
        ):
            engines.choose_engine("onnxruntime", dtype, cpu, bb)[0]
    with pytest.raises(Exception, match="--engine onnxruntime runs on the CPU, not cuda"):
        engines.choose_engine("onnxruntime", "float32", torch.device("cuda"), bb)[0]


def test_auto_considers_onnxruntime_for_long_float32_runs_of_backbones_that_convert(tiny_gpt2, monkeypatch):
    cpu, bb = torch.device("cpu"), load_backbone(str(tiny_gpt2), 0)
    assert "onnxruntime" in engines.auto_candidates("float32", cpu, bb, engines.ONNX_MIN_TOKENS)[0]
    assert "onnxruntime" not in engines.auto_candidates("float32", cpu, bb, engines.ONNX_MIN_TOKENS - 1)[0]
    assert (
        "onnxruntime" not in engines.auto_candidates("bfloat16", cpu, bb, None)[0]
    )  # it computes float32 only
    monkeypatch.setattr(engines, "openvino_installed", lambda: False)
    assert engines.choose_engine("auto", "float32", cpu, bb, None) == (
        "onnxruntime",
        "auto: ONNX Runtime is installed",
    )
    assert engines.choose_engine("auto", "int8", cpu, bb, 10)[0] == "onnxruntime"  # the int8 engine installed


def test_auto_takes_onnxruntime_when_its_measured_rate_is_highest(tiny_gpt2):
    task, bb = get_task("bit_xor"), load_backbone(str(tiny_gpt2), 0)
    key = engines.engine_key("float32", bb, task.spec.seq_len, torch.get_num_threads())
    candidates = engines.auto_candidates("float32", torch.device("cpu"), bb, 10**6)[0]
    records.put(
        engines.ENGINE_RATES, key, {"torch": 1.0, **dict.fromkeys(candidates, 2.0), "onnxruntime": 3.0}
    )
    r = runner(task, str(tiny_gpt2), "auto", tokens=10**6)
    assert r.engine == "onnxruntime" and r.measure_key is None
    assert "auto: ONNX Runtime ran this model fastest on this CPU (measured before:" in r.engine_reason
    assert "ONNX Runtime 3" in r.engine_reason and "PyTorch eager 1" in r.engine_reason


def test_auto_measures_onnxruntime_on_the_first_batch_and_keeps_its_rate(tiny_gpt2, monkeypatch):
    """Never measured: the first batch runs on every installed engine, the rates are kept, the run goes
    on with the faster (faked: ONNX Runtime), and every batch's features are PyTorch's."""
    task = get_task("bit_xor", n_train=64)
    d = task.load("train", ".", None)
    tokens, lengths = task.encode(d.inputs), d.lengths
    ref = runner(task, str(tiny_gpt2), "torch")(tokens, lengths)
    monkeypatch.setattr(runner_module, "faster_engine", lambda rates: "onnxruntime")
    said = []
    r = runner(task, str(tiny_gpt2), "auto", tokens=10**6, log=said.append)
    assert r.measure_key and "onnxruntime" in r.candidates
    first, second = r(tokens[:32], lengths[:32]), r(tokens[32:], lengths[32:])
    np.testing.assert_allclose(np.concatenate([first, second]), ref, rtol=1e-4, atol=1e-5)
    assert r.engine == "onnxruntime" and "measured now, on the first batch" in r.engine_reason
    assert any(text.startswith("engine onnxruntime (auto:") for text in said)
    kept = next(iter(records.read(engines.ENGINE_RATES).values()))
    convert = kept.pop("convert")  # each converting engine's measured conversion seconds, beside the rates
    assert set(kept) == {"torch", *r.candidates} and all(rate > 0 for rate in kept.values())
    assert set(convert) <= set(r.candidates) and all(seconds >= 0 for seconds in convert.values())


def failing_export(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("both ONNX exporters failed: Unsupported: aten::x")

    monkeypatch.setattr(onnx, "export", fail)


def test_auto_falls_back_to_pytorch_when_the_model_fails_to_export(tiny_gpt2, monkeypatch):
    monkeypatch.setattr(engines, "openvino_installed", lambda: False)  # ONNX Runtime is auto's only converter
    failing_export(monkeypatch)
    task = get_task("bit_xor")
    (tokens, lengths), _ = batches(task)
    said = []
    r = runner(task, str(tiny_gpt2), "auto", tokens=10**6, log=said.append)
    assert r.engine == "onnxruntime"
    features = r(tokens[:8], lengths[:8])  # too few rows to measure: converting fails on the batch
    np.testing.assert_allclose(
        features, runner(task, str(tiny_gpt2), "torch")(tokens[:8], lengths[:8]), rtol=1e-6, atol=1e-7
    )
    assert r.engine == "torch" and r.engine_reason.startswith("auto: ONNX Runtime failed")
    assert "torch could not export it to ONNX" in said[-1] and said[-1].endswith(
        "running PyTorch eager instead"
    )


# -- through the command line -----------------------------------------------------------------


def read(path: Path) -> tuple[dict, dict, np.ndarray]:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["identity"]), json.loads(f.attrs["config"]), f["test"]["features"][:]


def test_engine_onnxruntime_through_the_cli_equals_torch_and_an_export_failure_exits_1(
    cli, home, tiny_gpt2, monkeypatch
):
    base = (
        "extract",
        "--task",
        "digits",
        "--backbone",
        str(tiny_gpt2),
        "--limit",
        "24",
        "--batch-size",
        "8",
        "--dtype",
        "float32",
    )
    r = cli(*base, "--engine", "torch", "--out", str(home / "torch.h5"))
    assert r.exit_code == 0, r.output
    r = cli(*base, "--engine", "onnxruntime", "--out", str(home / "ort.h5"))
    assert r.exit_code == 0, r.output
    assert "onnxruntime engine (--engine onnxruntime)" in r.output and "features within" in r.output
    _, config, ours = read(home / "ort.h5")
    assert config["engine_used"] == "onnxruntime"
    np.testing.assert_allclose(ours, read(home / "torch.h5")[2], rtol=1e-4, atol=1e-5)
    r = cli(*base, "--engine", "onnxruntime", "--dtype", "bfloat16", "--out", str(home / "bf16.h5"))
    assert (
        r.exit_code == 2 and "--engine onnxruntime computes float32 or int8, not --dtype bfloat16" in r.output
    )
    failing_export(monkeypatch)
    monkeypatch.setenv("RESERVOIR_CACHE", str(home / "empty-cache"))
    r = cli(*base, "--engine", "onnxruntime", "--out", str(home / "failed.h5"))
    assert (
        r.exit_code == 1
        and "torch could not export it to ONNX" in r.output
        and "pass --engine torch" in r.output
    )
    assert "Traceback" not in r.output and not (home / "failed.h5").exists()


@pytest.mark.slow  # about 15 s: an export in a fresh process
def test_no_exporter_line_reaches_the_terminal(tiny_gpt2, tmp_path):
    """A whole ``reservoir extract --engine onnxruntime --dtype int8`` in its own process: the exporter's
    and quantizer's notes, progress bars and warnings never reach stderr."""
    env = {
        **os.environ,
        "RESERVOIR_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "RESERVOIR_HOME": str(tmp_path),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "reservoir",
            "extract",
            "--task",
            "digits",
            "--backbone",
            str(tiny_gpt2),
            "--limit",
            "24",
            "--engine",
            "onnxruntime",
            "--dtype",
            "int8",
            "--out",
            str(tmp_path / "f.h5"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "onnxruntime: exported to" in r.stderr
    for noise in ("torchvision", "Writing model", "[torch.onnx]", "Warning", "W1", "[transformers]"):
        assert noise not in r.stderr, r.stderr


@pytest.mark.parametrize("readout", ["mean", "last"])
def test_each_readout_has_its_own_file_whose_axes_fit_any_batch(tiny_gpt2, cache, readout):
    """A file exported for one readout is never taken for another, and one exported from a first batch of one
    row, for the mean over rows of other widths, fits every later batch: equal to PyTorch on each."""
    task = get_task("listops", **LISTOPS)
    (tokens, lengths), short = batches(task)
    other = "last" if readout == "mean" else "mean"
    runner(task, str(tiny_gpt2), "onnxruntime", readout=other)(tokens[:1], lengths[:1])
    ours, ref = (runner(task, str(tiny_gpt2), e, readout=readout) for e in ("onnxruntime", "torch"))
    for t, n in ((tokens[:1], lengths[:1]), (tokens, lengths), short):
        np.testing.assert_allclose(ours(t, n), ref(t, n), rtol=1e-4, atol=1e-5)
    assert len(list((cache / onnx.FOLDER).glob("*.onnx"))) == 2


def test_models_of_one_weights_and_other_settings_export_their_own_files(tmp_path, cache):
    """Two GPT-2 folders of the same weights and another activation are two models: each its own file, each
    equal to its own PyTorch features (one file served both)."""
    from transformers import GPT2Config, GPT2Model

    task = get_task("bit_xor")
    (tokens, lengths), _ = batches(task)
    for activation in ("gelu_new", "relu"):
        torch.manual_seed(0)
        config = GPT2Config(n_layer=2, n_embd=32, n_head=4, activation_function=activation)
        GPT2Model(config).save_pretrained(tmp_path / activation)
        ours, ref = (runner(task, str(tmp_path / activation), e) for e in ("onnxruntime", "torch"))
        np.testing.assert_allclose(ours(tokens, lengths), ref(tokens, lengths), rtol=1e-4, atol=1e-5)
    assert len(list((cache / onnx.FOLDER).glob("*.onnx"))) == 2


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_a_vision_model_on_a_fixed_length_task_past_the_example_width_converts_at_its_width(tmp_path, engine):
    """A ViT of 64 patch positions on rows of 100 tokens (a grid of 10 x 10, its positions resized): a graph
    converted from rows cut to 64 tokens took the other positions and failed to run; rows of one width are
    converted at that width and give PyTorch's features."""
    from transformers import ViTConfig, ViTModel

    from reservoir.tasks import TaskSpec
    from tests.zoo import VISION

    if engine == "openvino":
        pytest.importorskip("openvino")
    torch.manual_seed(0)
    ViTModel(ViTConfig(**VISION)).eval().save_pretrained(tmp_path / "vit")
    spec = TaskSpec("t", "dense", seq_len=100, n_classes=2, token_dim=4)
    x, lengths = np.random.default_rng(0).normal(size=(3, 100, 4)).astype(np.float32), np.full(3, 100)
    ref, ours = (
        FeatureRunner.build(
            spec, load_backbone(str(tmp_path / "vit")), [2], seed=0, dtype="float32", engine=e
        )
        for e in ("torch", engine)
    )
    np.testing.assert_allclose(ours(x, lengths), ref(x, lengths), rtol=1e-4, atol=1e-5)


def test_an_engine_that_fails_after_its_first_batch_stops_the_run_rather_than_switch(tiny_gpt2, monkeypatch):
    """``auto`` falls back to PyTorch only on the first batch: a converting engine that fails on a later batch
    is an error, never a run whose rows went through two engines."""
    monkeypatch.setattr(engines, "openvino_installed", lambda: False)
    task = get_task("bit_xor")
    (tokens, lengths), _ = batches(task)
    r = runner(task, str(tiny_gpt2), "auto", tokens=10**6)
    r(tokens[:8], lengths[:8])
    assert r.engine == "onnxruntime"

    def fail(*args):
        raise BackboneError("a shape the graph does not fit")

    monkeypatch.setattr(r, "forward", fail)
    with pytest.raises(BackboneError, match="a shape the graph does not fit"):
        r(tokens[:8], lengths[:8])
    assert r.engine == "onnxruntime"

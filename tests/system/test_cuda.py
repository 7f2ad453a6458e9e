"""The CUDA path against the CPU, on a machine with a GPU (skipped elsewhere; ``make gpu`` runs it).

Features per depth equal the CPU's (float32 to float32 rounding, TF32 off; bf16 to bf16's
tolerance) for GPT-2, Llama, the LSTM and the echo state network; the compiled forward equals the
eager one; the readout-only last block equals the full block; a whole extraction through the
command line (pinned pool, copies on the device's stream, the writer thread) writes the CPU's
features; the compile decision is measured and recorded on the card; the torch probe head scores
within a point of the CPU's; training has finite losses and a resumed run equals an uninterrupted
one; an absent device index exits 1 in words. The helpers take any device, and
tests/model/test_devices.py runs them on the CPU, so they are checked on every machine.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.model.backbones import Backbone, load_backbone
from reservoir.runtime.runner import FeatureRunner, resolve
from reservoir.tasks import TaskSpec
from tests.conftest import save_tiny_gpt2

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (make gpu runs these)"
)

#: the devices the comparison helpers run on here: the CPU, and CUDA where present
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
#: float32 CPU against CUDA (IEEE float32 both sides): summation order alone
F32_REL = 1e-4
#: bf16 against float32 after a few blocks (bf16's epsilon is 2**-8; tests/model/backbones/test_base.py's bound)
BF16_REL = 5e-2
ROWS, WIDTH = 24, 32
DENSE = TaskSpec("dense", "dense", seq_len=16, n_classes=10, token_dim=4)
IDS = TaskSpec("ids", "ids", seq_len=40, n_classes=10, vocab_size=16, variable_length=True)


def tiny(kind: str, folder: Path) -> Backbone:
    """A small random backbone of each kind the CUDA path must agree on."""
    if kind == "gpt2":
        return load_backbone(str(save_tiny_gpt2(folder / "gpt2", n_layer=3, n_embd=WIDTH)))
    if kind == "llama":
        from tests.zoo import save_tiny

        return load_backbone(str(save_tiny("llama", folder / "llama")))
    if kind == "lstm":
        from reservoir.model.backbones.lstm import LSTMBackbone, LSTMConfig

        torch.manual_seed(0)
        return LSTMBackbone(LSTMConfig(n_layers=2, d_model=WIDTH))
    return load_backbone("esn:units=64")


def inputs(spec: TaskSpec, rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` examples of ``spec``: values in [0, 1], or ids of varied lengths (padded with ``pad_id``)."""
    rng = np.random.default_rng(seed)
    if spec.token_kind == "dense":
        return rng.random((rows, spec.seq_len, spec.token_dim), dtype=np.float32), np.full(rows, spec.seq_len)
    lengths = rng.integers(1, spec.seq_len + 1, rows)
    tokens = rng.integers(1, spec.vocab_size, (rows, spec.seq_len))
    tokens[np.arange(spec.seq_len) >= lengths[:, None]] = spec.pad_id
    return tokens[:, : lengths.max()], lengths


def features(
    backbone: Backbone,
    spec: TaskSpec,
    device: str,
    dtype: str = "float32",
    *,
    compile: bool = False,
    batch_size: int = 8,
    readout_last_block: bool = True,
) -> np.ndarray:
    """Every depth's features of :func:`inputs` through a :class:`FeatureRunner` on ``device`` (a copy of
    ``backbone``: the runner converts its own), in batches of ``batch_size`` run asynchronously."""
    backbone = copy.deepcopy(backbone)
    backbone.readout_last_block = readout_last_block
    runner = FeatureRunner.build(
        spec,
        backbone,
        list(range(backbone.n_layers + 1)),
        seed=0,
        dtype=dtype,
        compile=compile,
        batch_size=batch_size,
        device=device,
        engine="torch",
    )
    tokens, lengths = inputs(spec)
    pending = [
        runner.run_async(runner.prepare(tokens[i : i + batch_size], lengths[i : i + batch_size]))
        for i in range(0, len(tokens), batch_size)
    ]
    return np.concatenate([resolve(p) for p in pending])


def rel_errors(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per depth, the largest norm-wise relative error of a row's feature vector."""
    err = np.linalg.norm(got - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-12)
    return err.reshape(len(err), err.shape[1], -1).max(axis=(0, 2))


def assert_close_per_depth(got: np.ndarray, ref: np.ndarray, rel: float, what: str) -> None:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all(), f"{what}: features not finite"
    errors = rel_errors(got, ref)
    assert errors.max() < rel, (
        f"{what}: relative error per depth {np.array2string(errors, precision=2)} >= {rel}"
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cuda-models")


KINDS = ["gpt2", "llama", "lstm", "esn"]


@pytest.mark.parametrize("spec", [DENSE, IDS], ids=["dense", "ids"])
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_float32_features_equal_the_cpus_per_depth(folder, kind, spec):
    backbone = tiny(kind, folder)
    ref = features(backbone, spec, "cpu")
    assert_close_per_depth(features(backbone, spec, "cuda"), ref, F32_REL, f"{kind} float32 cuda vs cpu")


@pytest.mark.parametrize("kind", KINDS)
def test_cuda_bf16_features_are_within_bf16_of_float32(folder, kind):
    from reservoir.runtime.dtypes import cuda_bf16_native

    if not cuda_bf16_native("cuda"):
        pytest.skip(f"{torch.cuda.get_device_name()} has no native bf16")
    backbone = tiny(kind, folder)
    ref = features(backbone, DENSE, "cpu")
    assert_close_per_depth(
        features(backbone, DENSE, "cuda", "bfloat16"), ref, BF16_REL, f"{kind} bf16 cuda vs cpu float32"
    )


def test_auto_is_bf16_exactly_where_the_card_is_native():
    from reservoir.runtime.runner import resolve_dtype

    native = torch.cuda.get_device_capability() >= (8, 0)
    assert resolve_dtype("auto", "cuda") == ("bfloat16" if native else "float32")


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_readout_only_last_block_equals_the_full_block_on_cuda(folder, kind):
    backbone = tiny(kind, folder)
    for spec in (DENSE, IDS):
        full = features(backbone, spec, "cuda", readout_last_block=False)
        assert_close_per_depth(features(backbone, spec, "cuda"), full, F32_REL, f"{kind} readout-only block")


@pytest.mark.parametrize("store", ["float16", "bfloat16"])
def test_features_rounded_on_the_card_equal_its_float32_features_rounded_by_torch(folder, store):
    """--store-dtype converts on the device, before the copy back: the bits equal rounding the card's float32
    features on the host, and the writer keeps them as they come."""
    from reservoir.extract.stored import STORED, as_float32, to_stored
    from reservoir.model.devices import DTYPES

    backbone = tiny("gpt2", folder)
    runner = FeatureRunner.build(
        DENSE, backbone, [0, 3], seed=0, dtype="float32", batch_size=4, device="cuda", engine="torch"
    )
    tokens, lengths = inputs(DENSE, rows=8)
    batch = runner.prepare(tokens[:4], lengths[:4])
    full = resolve(runner.run_async(batch, "float32"))
    kept = to_stored(resolve(runner.run_async(runner.prepare(tokens[:4], lengths[:4]), store)), store)
    assert kept.dtype == STORED[store]
    np.testing.assert_array_equal(as_float32(kept), torch.from_numpy(full).to(DTYPES[store]).float().numpy())


def test_pinned_buffers_are_reused_across_batches(folder):
    backbone = tiny("gpt2", folder)
    runner = FeatureRunner.build(
        DENSE, backbone, [0, 3], seed=0, dtype="float32", batch_size=4, device="cuda", engine="torch"
    )
    tokens, lengths = inputs(DENSE, rows=80)
    out = [
        resolve(runner.run_async(runner.prepare(tokens[i : i + 4], lengths[i : i + 4])))
        for i in range(0, 80, 4)
    ]
    assert np.concatenate(out).shape == (80, 2, 1, WIDTH)
    assert (
        runner.outputs.allocated == 1 and runner.inputs.allocated == 3
    )  # tokens, lengths, readout: one each
    assert all(t.is_pinned() for kept in runner.inputs.free.values() for t, _ in kept)


def extract_file(cli, home: Path, backbone: str, device: str, *extra: str) -> Path:
    r = cli(
        "-q",
        "extract",
        "--task",
        "digits",
        "--backbone",
        backbone,
        "--limit",
        "100",
        "--dtype",
        "float32",
        "--batch-size",
        "7",
        "--device",
        device,
        "--out",
        str(home / f"{device}-{len(extra)}.h5"),
        *extra,
    )
    assert r.exit_code == 0, r.output
    return Path(r.stdout.strip())


def assert_files_agree(a: Path, b: Path, rel: float) -> None:
    with h5py.File(a) as fa, h5py.File(b) as fb:
        for split in ("train", "test"):
            assert_close_per_depth(fa[split]["features"][:], fb[split]["features"][:], rel, f"{split} file")
            np.testing.assert_array_equal(fa[split]["labels"][:], fb[split]["labels"][:])


def test_a_whole_extraction_on_cuda_writes_the_cpus_features(cli, home, tiny_gpt2):
    """Batches of 7 with a short last one: pooled pinned buffers, copies and events on the device's stream, and
    the writer thread resolving them must write every row the CPU writes."""
    cpu = extract_file(cli, home, str(tiny_gpt2), "cpu")
    assert_files_agree(extract_file(cli, home, str(tiny_gpt2), "cuda"), cpu, F32_REL)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_on_a_second_device_features_land_before_they_are_read(cli, home, tiny_gpt2):
    """cuda:1 while cuda:0 is current: the copy's completion event must be on cuda:1's stream."""
    torch.cuda.set_device(0)
    cpu = extract_file(cli, home, str(tiny_gpt2), "cpu")
    assert_files_agree(extract_file(cli, home, str(tiny_gpt2), "cuda:1"), cpu, F32_REL)


def test_a_missing_device_index_exits_1_in_words(cli, home):
    name = f"cuda:{torch.cuda.device_count()}"
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--limit", "4", "--device", name)
    assert (
        r.exit_code == 1
        and f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)" in r.output
    )
    assert "use --device cuda:0" in r.output and "Traceback" not in r.output


def test_the_torch_head_on_cuda_scores_within_a_point_of_the_cpus(home, tiny_gpt2):
    from reservoir import api

    path = api.extract("digits", str(tiny_gpt2), limit=600, dtype="float32")
    scores = {
        d: api.fit(features=path, head="torch", depths="2", device=d, baselines=False)[0]["test_accuracy"]
        for d in ("cpu", "cuda")
    }
    assert abs(scores["cuda"] - scores["cpu"]) <= 0.01, scores


def test_a_short_training_run_on_cuda_has_finite_losses(cli, home, tiny_gpt2):
    r = cli(
        "-q",
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--steps",
        "20",
        "--eval-every",
        "5",
        "--device",
        "cuda",
        "--task-opt",
        "n_train=512",
        "--task-opt",
        "n_test=256",
    )
    assert r.exit_code == 0, r.output
    result = json.loads(Path(r.stdout.strip().splitlines()[-1]).read_text())
    losses = [h["loss"] for run in result.get("runs", [result]) for h in run.get("history", [])]
    assert losses and all(np.isfinite(losses)), losses


def test_a_resumed_cuda_run_equals_an_uninterrupted_one(tiny_gpt2, home):
    """Dropout on (the CUDA generator draws it), checkpoints every 10 steps, killed at step 27: the resumed run
    redoes 21..27 and ends as the uninterrupted one did."""
    from reservoir.config import TrainConfig
    from reservoir.tasks import get_task
    from reservoir.train import load_data, train_run
    from tests.train.test_loop import whole_and_killed

    opts = {"n_train": "512", "n_test": "256"}
    task = get_task("bit_xor", **opts)
    cfg = TrainConfig(
        task="bit_xor",
        backbone=str(tiny_gpt2),
        task_options=opts,
        steps=40,
        batch_size=16,
        eval_every=10,
        patience=0,
        checkpoint_every=10,
        dropout=0.1,
        lr=(3e-3,),
        device="cuda",
        data_dir=home / "data",
    )
    data = load_data(task, cfg)
    whole, cut = whole_and_killed(cfg, task, data, home)
    resumed = train_run(dataclasses.replace(cut, resume=True), task, data, lr=3e-3, seed=0, progress=False)
    for key in ("test_accuracy", "val_accuracy", "best_step", "steps", "history"):
        assert resumed[key] == whole[key], key


# -- compiled graphs last: each compiles for tens of seconds on a cold cache --------------------------------


@pytest.mark.parametrize("kind, dtype", [("gpt2", "float32"), ("gpt2", "bfloat16"), ("llama", "bfloat16")])
def test_the_compiled_forward_equals_eager_on_cuda(folder, kind, dtype):
    from reservoir.runtime.dtypes import cuda_bf16_native

    if dtype == "bfloat16" and not cuda_bf16_native("cuda"):
        pytest.skip(f"{torch.cuda.get_device_name()} has no native bf16")
    backbone = tiny(kind, folder)
    eager = features(backbone, DENSE, "cuda", dtype)
    compiled = features(backbone, DENSE, "cuda", dtype, compile=True)
    assert_close_per_depth(
        compiled, eager, F32_REL if dtype == "float32" else BF16_REL, f"{kind} {dtype} compiled"
    )


def test_the_compile_decision_is_measured_and_recorded_on_the_card(cli, home, tiny_gpt2, monkeypatch):
    monkeypatch.setenv("RESERVOIR_CACHE", str(home / "cache"))
    r = cli(
        "extract",
        "--task",
        "digits",
        "--backbone",
        str(tiny_gpt2),
        "--limit",
        "100",
        "--dtype",
        "float32",
        "--batch-size",
        "8",
        "--device",
        "cuda",
    )
    assert r.exit_code == 0 and "tokens/s (measured now)" in r.output, r.output  # the probe ran on the card
    r = cli(
        "-q",
        "extract",
        "--task",
        "digits",
        "--backbone",
        str(tiny_gpt2),
        "--limit",
        "100",
        "--dtype",
        "float32",
        "--batch-size",
        "8",
        "--device",
        "cuda",
        "--compile",
        "--seed",
        "1",
    )
    assert r.exit_code == 0, r.output
    records = json.loads((home / "cache" / "compile-costs.json").read_text())
    assert records and all(v["compile_seconds"] >= 0 for v in records.values())

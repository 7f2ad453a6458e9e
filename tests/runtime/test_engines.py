"""The OpenVINO engine computes the features PyTorch computes; int8 stays close and row-independent;
every way it can fail says what to do, and ``engine="auto"`` falls back to PyTorch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.errors import BackboneError, DeviceError, UsageError
from reservoir.model.backbones import gather, load_backbone
from reservoir.model.reservoir import FixedDepths
from reservoir.registry import ENGINES
from reservoir.runtime import engines, openvino, records
from reservoir.runtime import runner as runner_module
from reservoir.runtime.runner import FeatureRunner
from reservoir.tasks import get_task

pytest.importorskip("openvino")
pytestmark = pytest.mark.usefixtures("one_thread")

LISTOPS = {"max_len": 120, "n_train": 12, "n_val": 1, "n_test": 1, "min_length": 5, "max_length": 110}
#: a fast run: 24 digits per split through the 2-block, 32-wide GPT-2
BASE = ("--limit", "24", "--batch-size", "8")


def runner(task, backbone: str, engine: str, dtype: str = "float32", log=None, **kwargs) -> FeatureRunner:
    """A runner of every depth of ``backbone`` on ``engine`` (messages to ``log``, else dropped)."""
    bb = load_backbone(backbone, 0)
    return FeatureRunner.build(
        task.spec,
        bb,
        list(range(bb.n_layers + 1)),
        seed=0,
        dtype=dtype,
        engine=engine,
        log=log or (lambda text: None),
        **kwargs,
    )


def batches(task, n: int = 12):
    """Two batches of different widths (variable-length tasks) from the task's training rows."""
    d = task.load("train", ".", None)
    tokens, lengths = task.encode(d.inputs[:n]), d.lengths[:n]
    short = np.argsort(lengths)[: n // 2]
    return [(tokens, lengths), (tokens[short][:, : int(lengths[short].max())], lengths[short])]


@pytest.mark.parametrize("task_name", ["listops", "bit_xor"])
def test_openvino_float32_equals_pytorch(tiny_gpt2, task_name):
    task = get_task(task_name, **(LISTOPS if task_name == "listops" else {}))
    ov, pt = runner(task, str(tiny_gpt2), "openvino"), runner(task, str(tiny_gpt2), "torch")
    assert (ov.engine, pt.engine) == ("openvino", "torch")
    for tokens, lengths in batches(task):  # a second shape reuses the converted model
        np.testing.assert_allclose(ov(tokens, lengths), pt(tokens, lengths), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("readout", ["last", "mean"])
def test_a_first_batch_of_one_token_rows_converts_a_graph_that_keeps_the_causal_mask(tiny_gpt2, readout):
    """Rows of varying length whose first batch holds one token each: the graph converted from it must still
    mask the positions ahead of each query (traced on one position, transformers builds no mask), so later,
    right-padded rows equal PyTorch's and never read their padding."""
    task = get_task("listops", **LISTOPS)
    ov = runner(task, str(tiny_gpt2), "openvino", readout=readout)
    pt = runner(task, str(tiny_gpt2), "torch", readout=readout)
    rng = np.random.default_rng(0)
    first = (rng.integers(1, 10, (4, 1)), np.ones(4, dtype=np.int64))
    lengths = np.array([12, 3, 7, 1])
    later = (rng.integers(1, 10, (4, 12)) * (np.arange(12) < lengths[:, None]), lengths)
    for tokens, lengths in (first, later):
        np.testing.assert_allclose(ov(tokens, lengths), pt(tokens, lengths), rtol=1e-4, atol=1e-5)


def test_rows_of_one_width_run_on_graphs_compiled_for_their_shapes_with_equal_features(tiny_gpt2):
    """Fixed-width rows: the full batch and the last get a graph each for their exact shapes (no
    dynamic-shape warm-up); further shapes and the check's few rows run on the dynamic graph; every
    one computes PyTorch's features."""
    task = get_task("bit_xor", n_train=64)
    d = task.load("train", ".", None)
    tokens, lengths = task.encode(d.inputs), d.lengths
    ov, pt = runner(task, str(tiny_gpt2), "openvino"), runner(task, str(tiny_gpt2), "torch")
    for rows in (32, 32, 20, 24, 4):
        np.testing.assert_allclose(
            ov(tokens[:rows], lengths[:rows]), pt(tokens[:rows], lengths[:rows]), rtol=1e-4, atol=1e-5
        )
    assert sorted(shapes[0][0] for shapes in ov.forward.static) == [20, 32]
    lstm = runner(get_task("listops", **LISTOPS), "lstm", "openvino")
    assert not lstm.forward.static_shapes  # rows of many widths keep one dynamic graph


def test_openvino_converts_an_lstm_with_equal_features():
    task = get_task("listops", **LISTOPS)
    ov, pt = runner(task, "lstm", "openvino"), runner(task, "lstm", "torch")
    for tokens, lengths in batches(task, 6):
        np.testing.assert_allclose(ov(tokens, lengths), pt(tokens, lengths), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int8", "int8-static"])
def test_int8_is_close_to_float32_and_a_row_never_depends_on_its_batch(tiny_gpt2, dtype):
    task = get_task("listops", **LISTOPS)
    (tokens, lengths), _ = batches(task)
    q = runner(task, str(tiny_gpt2), "auto", dtype, calibration=lambda: [(tokens[:4], lengths[:4])])
    assert q.engine == "openvino"  # int8 exists on OpenVINO only: auto takes it
    ref = runner(task, str(tiny_gpt2), "torch")(tokens, lengths)
    together = q(tokens, lengths)
    assert engines.relative_error(together, ref) < 0.1
    assert not np.array_equal(together, ref)  # it is quantized
    alone = np.concatenate(
        [q(tokens[i : i + 1, : lengths[i]], lengths[i : i + 1]) for i in range(len(tokens))]
    )
    # per-tensor scales would move a row by about the quantization error (2 to 3% on GPT-2 small);
    # per-token and static scales leave only rounding from other kernel shapes (bf16 between the
    # int8 products, about 1e-4 here)
    assert engines.relative_error(alone, together) < 2e-3


def test_int8_fixes_its_width_on_fixed_length_tasks_and_reads_nothing_past_a_row(tiny_gpt2):
    """On a task of fixed length ``int8`` fixes its graph's width (OpenVINO then fuses the centring
    tables) and widens a narrower batch: whatever fills the positions past a row's length never
    reaches its features. Variable-length tasks keep a free width (short batches stay short)."""
    task = get_task("listops", **LISTOPS)
    (tokens, lengths), (short, short_lengths) = batches(task)
    assert not runner(task, str(tiny_gpt2), "openvino", "int8", calibration=list).forward.fixed
    q = runner(task, str(tiny_gpt2), "openvino", "int8", calibration=lambda: [(tokens[:4], lengths[:4])])
    model = FixedDepths(q.reservoir, q.depths)
    forward = openvino.OpenVINOForward(
        model, "int8", 1, q.forward.calibration, width=task.spec.seq_len, fixed_width=True
    )
    narrow_batch = q.prepare(short, short_lengths)
    assert forward.fixed and short.shape[1] < task.spec.seq_len
    filled = (
        np.random.default_rng(0)
        .choice(np.unique(tokens), (len(short), task.spec.seq_len))
        .astype(short.dtype)
    )
    filled[:, : short.shape[1]] = short
    narrow_features = forward(*narrow_batch[:3]).numpy()  # converts and checks on the narrow batch
    filled_features = forward(*q.prepare(filled, short_lengths)[:3]).numpy()
    assert narrow_features.shape == (len(short), len(q.depths), 1, 32)
    np.testing.assert_allclose(filled_features, narrow_features, rtol=1e-5, atol=1e-6)


def test_int8_centres_in_the_dtype_the_run_recorded_not_one_measured_again(tiny_gpt2, monkeypatch):
    """The float dtype of int8's centring pass is decided once, recorded in the run's identity
    (``calibration.dtype``, test_int8_dtypes_name_their_file_and_static_records_its_calibration) and handed to
    every runner, so shards on workers whose own measurement would pick another dtype (another load, another
    CPU) centre as the driver did; a runner given none measures."""
    task = get_task("listops", **LISTOPS)
    (tokens, lengths), _ = batches(task)
    seen = []
    kept = openvino.position_means
    monkeypatch.setattr(openvino, "position_means", lambda *a: seen.append(a[3]) or kept(*a))
    monkeypatch.setattr(openvino, "calibration_dtype", lambda: "float16")
    for given in ("float32", None):
        q = runner(task, str(tiny_gpt2), "openvino", "int8", calibration=lambda: [(tokens[:4], lengths[:4])],
                   centre_dtype=given)  # fmt: skip
        q(tokens, lengths)
    assert seen == ["float32", "float16"]


@pytest.mark.parametrize("dtype", ["int8", "int8-static"])
def test_int8_without_calibration_rows_is_refused(tiny_gpt2, dtype):
    with pytest.raises(UsageError, match=f"{dtype} needs calibration rows"):
        runner(get_task("bit_xor"), str(tiny_gpt2), "openvino", dtype)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_centred_projections_compute_the_same_features(tmp_path, tiny_gpt2, family):
    """int8 quantizes each backbone projection's input minus its mean at that position over the
    calibration rows: in float32 the features do not change, for every projection of every family,
    the readout-only deepest block (rows of different lengths: tables read at each row's own
    readout position) included."""
    from tests.model.test_backbones import save_tiny_encoder, save_tiny_llama

    path = {
        "gpt2": tiny_gpt2,
        "llama": save_tiny_llama(tmp_path / "llama"),
        "bert": save_tiny_encoder(tmp_path / "bert"),
    }[family]
    task = get_task("listops", **{**LISTOPS, "max_len": 60, "max_length": 55})
    r = runner(task, str(path), "torch")
    model = FixedDepths(r.reservoir, r.depths)
    (tokens, lengths), _ = batches(task)
    calibration = [tuple(t.numpy() for t in r.prepare(tokens[:4], lengths[:4])[:3])]
    shifts = engines.position_means(model, calibration, task.spec.seq_len)
    assert set(shifts) == set(engines.projections(model))
    assert shifts and all(name.startswith("reservoir.backbone.") for name in shifts)
    batch = r.prepare(tokens, lengths)[:3]
    last = [name for name in engines.projections(model) if ".mlp." in name or ".output." in name][
        -1
    ]  # deepest MLP's
    quantized = []  # what int8 would quantize there: the centred input of the deepest block's last projection
    with torch.inference_mode():
        ref = model(*batch)
        with engines.centred(model, shifts):
            assert all(isinstance(model.get_submodule(name), engines.Centred) for name in shifts)
            hook = model.get_submodule(last).module.register_forward_pre_hook(
                lambda m, a: quantized.append(a[0])
            )
            centred = model(*batch)
            with engines.whole_blocks(model):
                model(*batch)
            hook.remove()
    np.testing.assert_allclose(centred.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)
    if family != "bert":  # the causal families' deepest block computes the readout rows alone, read at their
        # own positions (rows of different lengths): the same centred values as the whole block's there
        readout_rows, every_row = quantized
        assert readout_rows.shape[1] == task.spec.n_readout and len(set(batch[2][:, -1].tolist())) > 1
        np.testing.assert_allclose(readout_rows, gather(every_row, batch[2]), rtol=1e-4, atol=1e-5)
    assert set(engines.projections(model)) == set(shifts)  # put back
    assert r.backbone.readout_last_block


def test_a_position_mean_is_the_mean_input_there(tiny_gpt2):
    """The shift of the first block's attention projection at each position is the mean of its
    input (``ln_1`` of the input layer's output plus positions) there over the calibration rows,
    its scale the largest departure from that mean there; a position no calibration row reaches
    gets the mean over all positions and the largest scale."""
    task = get_task("listops", **LISTOPS)
    r = runner(task, str(tiny_gpt2), "torch")
    model = FixedDepths(r.reservoir, r.depths)
    (tokens, lengths), _ = batches(task)
    tokens, lengths = tokens[:4, :30], np.minimum(lengths[:4], 30)
    batch = r.prepare(tokens, lengths)[:3]
    shift, scale, moved = engines.position_means(model, [tuple(t.numpy() for t in batch)], 50)[
        "reservoir.backbone.model.h.0.attn.c_attn"
    ]
    bb = r.backbone
    with torch.inference_mode():
        x = bb.blocks[0].ln_1(r.reservoir.input_layer(batch[0]) + bb.model.wpe(torch.arange(30)))
        attn = bb.blocks[0].attn.c_attn
        np.testing.assert_allclose(moved, attn(shift) - scale * attn.bias, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(shift[:30], x.mean(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(scale[:30, 0], (x - x.mean(0)).abs().amax(dim=(0, 2)), rtol=1e-4, atol=1e-5)
    assert torch.all(scale[30:] == scale[:30].max())
    np.testing.assert_allclose(
        shift[30:], np.broadcast_to(x.mean((0, 1)), (20, x.shape[-1])), rtol=1e-4, atol=1e-6
    )


def test_the_calibration_pass_in_bf16_leaves_the_float32_model_as_it_was(tiny_gpt2):
    """The int8 engines read their calibration rows with the model computing in the CPU's fast float
    dtype: the tables are bf16's rounding of float32's (shift and scale within bf16's precision;
    ``moved`` from the float32 projections, so that centring stays exact), and afterwards every
    weight and buffer is the same float32 tensor, bit for bit, and the model computes in float32."""
    task = get_task("listops", **LISTOPS)
    r = runner(task, str(tiny_gpt2), "torch")
    model = FixedDepths(r.reservoir, r.depths)
    (tokens, lengths), _ = batches(task)
    calibration = [tuple(t.numpy() for t in r.prepare(tokens[:8], lengths[:8])[:3])]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    exact = engines.position_means(model, calibration, task.spec.seq_len)
    fast = engines.position_means(model, calibration, task.spec.seq_len, "bfloat16")
    assert set(fast) == set(exact)
    for name in exact:
        (s, c, _), (fs, fc, fm) = exact[name], fast[name]
        assert fs.dtype == fc.dtype == fm.dtype == torch.float32
        assert relative(fs, s) < 2e-2 and relative(fc, c) < 5e-2
        assert not torch.equal(fs, s)  # computed in bf16 indeed
        module = model.get_submodule(name)
        with torch.inference_mode():
            np.testing.assert_allclose(
                fm, module(fs) - fc * module(torch.zeros_like(fs[:1])), rtol=1e-5, atol=1e-6
            )
    after = model.state_dict()
    assert set(after) == set(before)
    assert all(after[k].dtype == before[k].dtype and torch.equal(after[k], before[k]) for k in before)
    assert r.reservoir.compute_dtype == torch.float32
    batch = r.prepare(tokens, lengths)[:3]
    with torch.inference_mode():
        assert model(*batch).dtype == torch.float32


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_engine_choice_follows_device_install_and_size(monkeypatch, tiny_gpt2):
    cpu, bb = torch.device("cpu"), load_backbone(str(tiny_gpt2), 0)
    assert (
        engines.choose_engine("auto", "bfloat16", cpu, bb, tokens=engines.OPENVINO_MIN_TOKENS)[0]
        == "openvino"
    )
    assert (
        engines.choose_engine("auto", "bfloat16", cpu, bb, tokens=engines.OPENVINO_MIN_TOKENS - 1)[0]
        == "torch"
    )
    assert engines.choose_engine("auto", "int8", cpu, bb, tokens=10)[0] == "openvino"
    assert engines.choose_engine("auto", "float32", torch.device("cuda"), bb)[0] == "torch"
    with pytest.raises(DeviceError, match="--engine openvino runs on the CPU, not cuda"):
        engines.choose_engine("openvino", "float32", torch.device("cuda"), bb)[0]
    with pytest.raises(
        UsageError, match="--dtype int8 runs on the OpenVINO or ONNX Runtime engine; pass --engine openvino"
    ):
        engines.choose_engine("torch", "int8", cpu, bb)[0]
    monkeypatch.setattr(engines, "openvino_installed", lambda: False)
    monkeypatch.setattr(engines, "onnxruntime_installed", lambda: False)
    assert engines.choose_engine("auto", "float32", cpu, bb)[0] == "torch"
    with pytest.raises(UsageError, match=r"OpenVINO is not installed; pip install 'reservoir\[openvino\]'"):
        engines.choose_engine("openvino", "float32", cpu, bb)[0]


@pytest.mark.parametrize("faster", ["torch", "openvino"])
def test_auto_takes_the_engine_measured_fastest_before(tiny_gpt2, tmp_path, monkeypatch, faster):
    """With this CPU and model's rates kept (faked here), ``auto`` takes the faster engine and says so."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    task, bb = get_task("bit_xor"), load_backbone(str(tiny_gpt2), 0)
    key = engines.engine_key("float32", bb, task.spec.seq_len, torch.get_num_threads())
    others = engines.auto_candidates("float32", torch.device("cpu"), bb, 10**6)[0][
        1:
    ]  # ONNX Runtime, where installed
    records.put(
        engines.ENGINE_RATES,
        key,
        {"torch": 2.0, "openvino": 1.0, **dict.fromkeys(others, 0.5)}
        if faster == "torch"
        else {"torch": 1.0, "openvino": 2.0, **dict.fromkeys(others, 0.5)},
    )
    r = runner(task, str(tiny_gpt2), "auto", tokens=10**6)
    assert r.engine == faster and r.measure_key is None
    shown = "".join(", ONNX Runtime 0" for _ in others)  # the installed engines' rates, every one named
    assert (
        f"fastest on this CPU (measured before: OpenVINO 2 tokens/s{shown}, PyTorch eager 1)"
        in r.engine_reason
        or f"fastest on this CPU (measured before: OpenVINO 1 tokens/s{shown}, PyTorch eager 2)"
        in r.engine_reason
    )


def test_auto_keeps_pytorch_where_the_measured_conversion_cannot_pay_for_itself(
    tiny_gpt2, tmp_path, monkeypatch
):
    """OpenVINO measured twice PyTorch's rate, converting in 4.5 s: a job of 20,000 tokens at 10,000 tokens/s
    on PyTorch (2 s) keeps PyTorch and says why; a job of a million tokens converts."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    task, bb = get_task("bit_xor"), load_backbone(str(tiny_gpt2), 0)
    key = engines.engine_key("float32", bb, task.spec.seq_len, torch.get_num_threads())
    others = engines.auto_candidates("float32", torch.device("cpu"), bb, 10**6)[0][1:]
    kept = {"torch": 1e4, "openvino": 2e4, **dict.fromkeys(others, 0.5e4), "convert": {"openvino": 4.5}}
    records.put(engines.ENGINE_RATES, key, kept)
    short = runner(task, str(tiny_gpt2), "auto", tokens=20_000)
    assert (
        short.engine == "torch"
        and "converting to OpenVINO (measured 4.5 s) would not pay" in short.engine_reason
    )
    assert runner(task, str(tiny_gpt2), "auto", tokens=10**6).engine == "openvino"
    assert engines.pays(
        {"torch": 1e4, "openvino": 2e4}, {}, "openvino", 20_000
    )  # no cost measured: the threshold


def test_auto_measures_both_engines_on_the_first_batch_and_keeps_the_rates(tiny_gpt2, tmp_path, monkeypatch):
    """Never measured on this CPU and model: the first batch runs on both engines, the rates are
    kept, the run goes on with the faster (faked slower OpenVINO, then faster), and every batch's
    features are PyTorch's."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    task = get_task("bit_xor", n_train=64)
    d = task.load("train", ".", None)
    tokens, lengths = task.encode(d.inputs), d.lengths
    ref = runner(task, str(tiny_gpt2), "torch")(tokens, lengths)
    for winner in ("torch", "openvino"):
        (tmp_path / engines.ENGINE_RATES).unlink(missing_ok=True)
        monkeypatch.setattr(runner_module, "faster_engine", lambda rates, w=winner: w)
        r = runner(task, str(tiny_gpt2), "auto", tokens=10**6)
        assert (
            r.engine == "openvino"
            and r.measure_key
            and "measured against it on the first batch" in r.engine_reason
        )
        first, second = r(tokens[:32], lengths[:32]), r(tokens[32:], lengths[32:])
        np.testing.assert_allclose(np.concatenate([first, second]), ref, rtol=1e-4, atol=1e-5)
        assert (
            r.engine == winner
            and r.measure_key is None
            and "measured now, on the first batch" in r.engine_reason
        )
        kept = records.read(engines.ENGINE_RATES)
        measured = {"torch", *engines.auto_candidates("float32", torch.device("cpu"), r.backbone, 10**6)[0]}
        rates = next(iter(kept.values()))
        assert len(kept) == 1 and set(rates) - {"convert"} == measured >= {"torch", "openvino"}
        assert rates["convert"]["openvino"] > 0  # the conversion's fixed cost, weighed by later runs
        assert runner(task, str(tiny_gpt2), "auto", tokens=10**6).measure_key is None  # measured once


def test_a_first_batch_too_small_to_measure_settles_the_engine(tiny_gpt2, tmp_path, monkeypatch):
    """A first batch of fewer rows than a measurement takes runs the engine ``auto`` starts with, and that engine
    is the run's: a later large batch measures nothing, so every row goes through one engine (a later switch
    gave the same rows other features, train and test from two engines)."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    monkeypatch.setattr(runner_module, "faster_engine", lambda rates: "torch")  # a measurement would switch
    task = get_task("bit_xor", n_train=64)
    d = task.load("train", ".", None)
    tokens, lengths = task.encode(d.inputs), d.lengths
    r = runner(task, str(tiny_gpt2), "auto", tokens=10**6)
    assert r.engine == "openvino" and r.measure_key
    small = r(tokens[:4], lengths[:4])
    assert r.measure_key is None
    large = r(tokens, lengths)
    assert r.engine == "openvino" and not records.read(engines.ENGINE_RATES)
    np.testing.assert_allclose(large[:4], small, rtol=1e-5, atol=1e-6)


# -- through the command line -----------------------------------------------------------------


@pytest.fixture
def extract(cli, tiny_gpt2):
    """``extract(*args)`` -> (click result, path printed on stdout or None)."""

    def run(*args: str):
        r = cli("extract", "--task", "digits", "--backbone", str(tiny_gpt2), *BASE, *args)
        return r, (Path(r.stdout.strip().splitlines()[-1]) if r.exit_code == 0 else None)

    return run


def read(path: Path) -> tuple[dict, dict, np.ndarray]:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["identity"]), json.loads(f.attrs["config"]), f["test"]["features"][:]


def test_int8_dtypes_name_their_file_and_static_records_its_calibration(extract, home, monkeypatch):
    r, path = extract("--dtype", "int8")
    assert r.exit_code == 0, r.output
    identity, config, _ = read(path)
    assert path.name.startswith("int8-seed0-") and identity["dtype"] == "int8"
    assert identity["calibration"] == {
        "split": "train",
        "rows": 24,
        "recipe": engines.INT8_RECIPE,
        "engine": "openvino",
        "dtype": engines.calibration_dtype(),
    }
    assert config["engine_used"] == "openvino" and "openvino engine (auto: int8)" in r.output
    r, path = extract("--dtype", "int8-static")
    assert r.exit_code == 0, r.output
    identity, _, _ = read(path)
    assert path.name.startswith("int8-static-seed0-")
    assert identity["calibration"] == {
        "split": "train",
        "rows": 24,
        "recipe": engines.INT8_RECIPE,
        "engine": "openvino",
        "dtype": engines.calibration_dtype(),
    }
    r, again = extract("--dtype", "int8-static")
    assert again == path and "reusing" in r.output
    monkeypatch.setattr(engines, "INT8_RECIPE", engines.INT8_RECIPE + 1)  # another int8 recipe: never reused
    r, other = extract("--dtype", "int8-static")
    assert r.exit_code == 0 and other != path and "reusing" not in r.output
    if importlib.util.find_spec(
        "onnxruntime"
    ):  # another engine's int8 quantizes by its own recipe: never reused
        r, first = extract("--dtype", "int8", "--engine", "openvino")
        r, theirs = extract("--dtype", "int8", "--engine", "onnxruntime")
        assert (
            r.exit_code == 0 and theirs != first and read(theirs)[0]["calibration"]["engine"] == "onnxruntime"
        )


def test_the_engine_is_not_part_of_the_identity(extract, home):
    r, path = extract("--dtype", "float32", "--engine", "torch")
    assert r.exit_code == 0
    r, again = extract("--dtype", "float32", "--engine", "openvino")
    assert again == path and "reusing" in r.output  # the same features: the engines agree (tests above)


def test_a_bad_engine_or_an_int8_dtype_on_pytorch_is_refused(extract, home):
    r, _ = extract("--engine", "onnx")
    choices = ["auto", *ENGINES.names()]  # every registered engine, in --engine's order
    assert (
        r.exit_code == 2
        and f"The 'engine' parameter of extract must be one of {choices}. Got 'onnx'" in r.output
    )
    assert {"torch", "openvino", "onnxruntime"} <= set(choices)
    r, _ = extract("--dtype", "int8", "--engine", "torch")
    assert (
        r.exit_code == 2  # a usage error found before any data or model is read
        and "--dtype int8 runs on the OpenVINO or ONNX Runtime engine; pass --engine openvino" in r.output
    )
    assert "Traceback" not in r.output and not list((home / "features").rglob("*.h5*"))


def failing_conversion(monkeypatch):
    def fail(self, example):
        raise BackboneError(
            "OpenVINO could not convert this backbone (OpConversionFailure: aten::x); pass --engine torch"
        )

    monkeypatch.setattr(openvino.OpenVINOForward, "prepare", fail)


def test_auto_falls_back_to_pytorch_when_openvino_cannot_convert(extract, home, monkeypatch):
    r, expected = extract("--dtype", "float32", "--engine", "torch", "--out", str(home / "torch.h5"))
    monkeypatch.setattr(engines, "OPENVINO_MIN_TOKENS", 0)  # this tiny run takes OpenVINO under auto
    failing_conversion(monkeypatch)
    r, path = extract("--dtype", "float32")
    assert r.exit_code == 0, r.output
    assert "could not convert" in r.output and "running PyTorch eager instead" in r.output
    assert (
        "on torch, batch" in r.output and read(path)[1]["engine_used"] == "torch"
    )  # settled before the first row
    np.testing.assert_array_equal(read(path)[2], read(expected)[2])


def test_an_explicit_engine_that_fails_stops_with_the_fix_and_no_complete_file(extract, home, monkeypatch):
    failing_conversion(monkeypatch)
    r, _ = extract("--engine", "openvino")
    assert (
        r.exit_code == 1
        and "could not convert this backbone" in r.output
        and "pass --engine torch" in r.output
    )
    assert "Traceback" not in r.output and not list((home / "features").rglob("*.h5"))


def test_features_that_disagree_with_pytorch_stop_the_run(extract, home, monkeypatch):
    monkeypatch.setitem(engines.TOLERANCE, "bfloat16", -1.0)  # any difference is too large
    r, _ = extract("--dtype", "bfloat16", "--engine", "openvino")
    assert (
        r.exit_code == 1
        and "features differ from PyTorch's by" in r.output
        and "pass --engine torch" in r.output
    )
    assert not list((home / "features").rglob("*.h5"))


def test_the_sklearn_transformer_runs_on_openvino(tiny_gpt2):
    from reservoir.api import ReservoirFeatures

    rng = np.random.default_rng(0)
    X = rng.random((20, 7, 3)).astype(np.float32)
    pt = ReservoirFeatures(str(tiny_gpt2), depth="all", dtype="float32", engine="torch").fit(X).transform(X)
    ov = ReservoirFeatures(str(tiny_gpt2), depth="all", dtype="float32", engine="openvino").fit(X)
    assert ov.runner_.engine == "openvino"
    np.testing.assert_allclose(ov.transform(X), pt, rtol=1e-4, atol=1e-5)
    static = ReservoirFeatures(str(tiny_gpt2), depth="all", dtype="int8-static").fit(
        X
    )  # calibrated on X's rows
    assert engines.relative_error(static.transform_depths(X), pt.reshape(20, 3, -1)) < 0.1


def test_no_library_log_line_reaches_the_terminal(tiny_gpt2, tmp_path):
    """A whole ``reservoir extract`` through OpenVINO, in its own process: transformers' log lines
    (its note on GPT-2's unset ``loss_type`` while converting, say) never reach stderr."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "RESERVOIR_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("TRANSFORMERS_VERBOSITY", None)
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
            "openvino",
            "--dtype",
            "float32",
            "--out",
            str(tmp_path / "f.h5"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "openvino: convert" in r.stderr
    assert "[transformers]" not in r.stderr and "Warning" not in r.stderr, r.stderr


def test_the_converters_send_no_telemetry_unless_their_user_opted_in(home, tiny_gpt2, monkeypatch, tmp_path):
    """OpenVINO's import and converter and NNCF, which send usage events from forked processes unless a
    consent file opts out, fork nothing in a whole int8-static run and write nothing in the home folder; a
    user's opt-in file still decides."""
    import os
    import subprocess
    import sys

    checker = pytest.importorskip("openvino_telemetry.utils.opt_in_checker")
    for name in ("CI", "TF_BUILD", "JENKINS_URL"):  # these decline by themselves
        monkeypatch.delenv(name, raising=False)
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.setenv("HOME", str(user))
    counting = (  # a fresh process, so that OpenVINO's import is in the run
        "import multiprocessing, sys\n"
        "started = []\n"
        "multiprocessing.Process.start = lambda process: started.append(process)\n"
        "from reservoir.cli import main\n"
        "try:\n    main(sys.argv[1:], standalone_mode=False)\n"
        "finally:\n    print('processes started:', len(started), file=sys.stderr)\n"
    )
    run = [sys.executable, "-c", counting, "-q", "extract", "--task", "digits", "--backbone", str(tiny_gpt2),
           *BASE, "--dtype", "int8-static", "--engine", "openvino"]  # fmt: skip
    r = subprocess.run(run, capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0 and "processes started: 0" in r.stderr, r.stderr[-2000:]
    assert list(user.iterdir()) == []
    engines.decline_telemetry()
    assert checker.OptInChecker().check(False, True) == checker.ConsentCheckResult.DECLINED
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "1"
    (user / "intel").mkdir()
    (user / "intel" / "openvino_telemetry").write_text("1")
    assert checker.OptInChecker().check(False, True) == checker.ConsentCheckResult.ACCEPTED

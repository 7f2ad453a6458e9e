"""``--dtype auto`` takes int8 only where both halves of the rule hold (its probe accuracy measured on this
CPU kind and model, its speed measured here), says so, and stays one option away from float; every
condition that rules int8 out keeps a float dtype."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest
import torch

from reservoir.model.backbones import load_backbone
from reservoir.runtime import engines, quantized, records
from reservoir.runtime.machine import cpu

pytest.importorskip("openvino")
pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
FAST = {
    "openvino int8": 600.0,
    "openvino bfloat16": 400.0,
    "torch bfloat16": 350.0,
    "openvino float32": 200.0,
}
SLOW = {**FAST, "openvino int8": 420.0}  # 1.05x the fastest float path: short of the margin


@pytest.fixture
def probed(monkeypatch, tmp_path):
    """This CPU kind and GPT-2 with any weights counted as probed, short runs allowed, rates kept in a
    fresh cache; ``probed(rates)`` sets what the MLP measurement finds."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "cache"))
    kind = quantized.cpu_kind(cpu()[1])
    for weights in ("random", "pretrained"):
        monkeypatch.setitem(quantized.PROBED, (kind, "gpt2", weights), "MNIST -0.1, CIFAR-10 -0.2 (faked)")
    monkeypatch.setattr(quantized, "MIN_TOKENS", 100)
    calls = []

    def found(rates):
        def measure(width, threads):
            calls.append((width, threads))
            return dict(rates)

        monkeypatch.setattr(quantized, "block_rates", measure)
        return calls

    return found


def choose(backbone, **kw):
    args = dict(device=CPU, engine="auto", backbone=backbone, twin="random", tokens=10**6, target="class")
    return quantized.choose_int8(**{**args, **kw})


def test_cpu_kinds_follow_the_int8_instructions():
    assert quantized.cpu_kind({"avx2", "avx512f", "avx512_vnni", "amx_int8"}) == "amx"
    assert quantized.cpu_kind({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni"}) == "avx512-vnni"
    assert quantized.cpu_kind({"avx2", "avx_vnni"}) == "avx-vnni"
    assert quantized.cpu_kind({"avx2", "fma"}) == "avx2"
    assert quantized.cpu_kind(set()) == "other"


def test_int8_where_measured_faster_and_probed_and_the_measurement_is_kept(probed, tiny_gpt2):
    calls = probed(FAST)
    bb = load_backbone(str(tiny_gpt2), 0)
    take, why = choose(bb)
    assert take and why.startswith("auto: int8, 1.50x the fastest float path here") and "measured now" in why
    assert "int8 600 tokens/s, OpenVINO bfloat16 400" in why
    assert "MNIST -0.1, CIFAR-10 -0.2 (faked)" in why and "--dtype float32" in why
    take, why = choose(bb)
    assert take and "measured before" in why and len(calls) == 1  # one measurement per machine
    assert calls == [(bb.d_model, torch.get_num_threads())]
    assert next(iter(records.read(quantized.RATES).values())) == FAST


def test_int8_short_of_the_margin_keeps_float(probed, tiny_gpt2):
    probed(SLOW)
    take, why = choose(load_backbone(str(tiny_gpt2), 0))
    assert not take and f"1.05x the fastest float path here, short of {quantized.MARGIN}x" in why


@pytest.mark.parametrize(
    "change, says",
    [
        (dict(device=torch.device("cuda")), "int8 runs on the CPU, not cuda"),
        (dict(load_dtype="bfloat16"), "weights loaded in bfloat16"),
        (dict(target="regression"), "real-valued targets keep float"),
        (dict(engine="torch"), "--engine torch does not compute int8"),
        (dict(engine="onnxruntime"), "--engine onnxruntime does not compute int8"),
        (dict(tokens=99), "99 tokens < 100, calibrating would not pay"),
        (dict(twin="stats"), "not measured for gpt2 (stats weights)"),
    ],
)
def test_every_condition_that_rules_int8_out_keeps_float_and_measures_nothing(
    probed, tiny_gpt2, change, says
):
    calls = probed(FAST)
    take, why = choose(load_backbone(str(tiny_gpt2), 0), **change)
    assert not take and says in why and not calls


def test_a_cpu_kind_or_model_never_probed_keeps_float(probed, monkeypatch, tiny_gpt2):
    calls = probed(FAST)
    monkeypatch.setattr(quantized, "PROBED", {})
    take, why = choose(load_backbone(str(tiny_gpt2), 0))
    kind = quantized.cpu_kind(cpu()[1])
    assert not take and f"not measured for gpt2 (random weights) on this {kind} CPU" in why and not calls
    take, why = choose(load_backbone("lstm", 0))
    assert not take and "not measured for lstm (random weights)" in why and not calls
    bb = load_backbone(str(tiny_gpt2), 0)
    monkeypatch.setattr(type(bb), "openvino", property(lambda self: False))
    assert choose(bb) == (False, f"not int8: {type(bb).__name__} is not checked to convert")
    monkeypatch.setattr(engines, "openvino_installed", lambda: False)
    assert choose(load_backbone(str(tiny_gpt2), 0)) == (False, "not int8: OpenVINO is not installed")


def test_the_block_measurement_times_int8_against_every_float_path(monkeypatch, tmp_path):
    """The real measurement, at a small width: OpenVINO's int8 and every float dtype this CPU multiplies
    natively, on OpenVINO and on PyTorch, each a positive rate."""
    from reservoir.runtime.dtypes import candidates

    monkeypatch.setattr(quantized, "ROWS", 128)
    rates = quantized.block_rates(64, 1)
    assert set(rates) == {"openvino int8"} | {f"{e} {d}" for e in ("openvino", "torch") for d in candidates()}
    assert all(r > 0 for r in rates.values())


# -- through the command line -----------------------------------------------------------------


def extract(cli, backbone: Path, *args: str):
    r = cli(
        "extract",
        "--task",
        "digits",
        "--backbone",
        str(backbone),
        "--limit",
        "24",
        "--batch-size",
        "8",
        *args,
    )
    assert r.exit_code == 0, r.output
    path = Path(r.stdout.strip().splitlines()[-1])
    with h5py.File(path, "r") as f:
        return r, json.loads(f.attrs["identity"])


def test_extract_takes_int8_says_why_and_float32_stays_one_option_away(probed, cli, home, tiny_gpt2):
    probed(FAST)
    r, identity = extract(cli, tiny_gpt2)
    assert identity["dtype"] == "int8" and identity["calibration"]["engine"] == "openvino"
    assert "int8 (auto: int8, 1.50x the fastest float path here" in r.output
    auto = Path(r.stdout.strip().splitlines()[-1])
    r, again = extract(
        cli, tiny_gpt2, "--dtype", "int8"
    )  # the same run as asking for int8: its file is reused
    assert again == identity and "reusing" in r.output and Path(r.stdout.strip().splitlines()[-1]) == auto
    r, identity = extract(cli, tiny_gpt2, "--dtype", "float32")
    assert identity["dtype"] == "float32" and "calibration" not in identity
    r, identity = extract(cli, tiny_gpt2, "--engine", "torch")
    assert identity["dtype"] != "int8"


def test_extract_keeps_float_where_int8_is_not_faster(probed, cli, home, tiny_gpt2):
    probed(SLOW)
    r, identity = extract(cli, tiny_gpt2)
    assert identity["dtype"] in ("float32", "bfloat16") and "calibration" not in identity
    assert "auto: int8" not in r.output

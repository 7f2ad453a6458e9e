"""``--dtype auto`` follows the measurement: the fastest float dtype this CPU multiplies, cached per CPU."""

from __future__ import annotations

import json

import pytest

from reservoir.runtime import dtypes


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    monkeypatch.setattr(dtypes, "candidates", lambda flags=None: ["float32", "bfloat16"])
    return tmp_path


def fake(rates):
    calls = []

    def measure(dtype, width, threads):
        calls.append(dtype)
        return rates[dtype]

    return measure, calls


@pytest.mark.parametrize(
    "rates, chosen",
    [
        ({"float32": 310.0, "bfloat16": 165.0}, "float32"),
        ({"float32": 310.0, "bfloat16": 1400.0}, "bfloat16"),
        ({"float32": 310.0, "bfloat16": 320.0}, "float32"),
    ],
)  # within the margin
def test_auto_takes_the_fastest_measured_dtype(cache, monkeypatch, rates, chosen):
    measure, _ = fake(rates)
    real = dtypes.measured_rates
    monkeypatch.setattr(
        dtypes, "measured_rates", lambda width=768, threads=None: real(width, threads, measure=measure)
    )
    dtype, why = dtypes.choose("cpu")
    assert dtype == chosen
    assert "measured now" in why and f"{rates['bfloat16']:,.0f}" in why
    from reservoir.runtime.runner import resolve_dtype

    assert resolve_dtype("auto") == chosen and resolve_dtype("float32") == "float32"


def test_rates_are_measured_once_per_cpu_and_kept(cache):
    measure, calls = fake({"float32": 300.0, "bfloat16": 900.0})
    first, cached = dtypes.measured_rates(768, 2, measure=measure)
    again, cached_again = dtypes.measured_rates(768, 2, measure=measure)
    assert (cached, cached_again) == (False, True) and first == again and calls == ["float32", "bfloat16"]
    record = json.loads((cache / "dtype-rates.json").read_text())
    (key,) = record
    assert json.loads(key)[2:4] == [2, 768]  # threads and width are part of the key
    dtypes.measured_rates(768, 1, measure=measure)  # other threads: measured again
    assert len(calls) == 4


def test_a_real_measurement_gives_positive_rates(cache):
    assert dtypes.rate("float32", width=64) > 0


def test_rates_measured_by_this_run_are_said_measured_now_for_the_rest_of_it(cache, monkeypatch):
    """The first run on a fresh cache measures the rates once and says "measured now" every time it gives
    its reason; a later run reads them and says "measured before"."""
    measure, calls = fake({"float32": 300.0, "bfloat16": 900.0})
    monkeypatch.setattr(dtypes, "rate", measure)
    monkeypatch.setattr(dtypes, "_MEASURED", {})
    assert "measured now" in dtypes.choose("cpu")[1] and "measured now" in dtypes.choose("cpu")[1]
    assert len(calls) == 2
    monkeypatch.setattr(dtypes, "_MEASURED", {})  # a later process
    assert "measured before" in dtypes.choose("cpu")[1] and len(calls) == 2


def test_auto_takes_a_dtype_the_engine_asked_for_computes(monkeypatch):
    """``--dtype auto`` where bfloat16 multiplies fastest: bfloat16 for PyTorch and ``auto``, float32 for an
    engine that computes no bfloat16 (ONNX Runtime: it was refused, naming a dtype the user never gave)."""
    from reservoir.runtime import runner

    monkeypatch.setattr(runner, "choose_dtype", lambda device: ("bfloat16", "faked"))
    assert runner.resolve_dtype("auto", "cpu") == "bfloat16"
    assert runner.resolve_dtype("auto", "cpu", "torch") == "bfloat16"
    assert runner.resolve_dtype("auto", "cpu", "onnxruntime") == "float32"
    assert (
        runner.resolve_dtype("float16", "cpu", "onnxruntime") == "float16"
    )  # a dtype given is the engine's to refuse

"""When ``--dtype auto`` takes int8: on a CPU where int8 is measured faster than every float path and
where its probe accuracy has been measured within :data:`ACCURACY_BAR` points of float32's, and only
where int8 can run and pays (:func:`choose_int8`).

Accuracy is measured once per CPU kind (:func:`cpu_kind`) and model by ``benchmarks/probe.py``;
:data:`PROBED` keeps the pairings within the bar, and any other never gets int8 from ``auto``. Speed is
measured on this machine once, one transformer block in int8's recipe against every float path
(:func:`block_rates`), and kept in the cache. The rule and its measurements: docs/performance.md,
"int8".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from reservoir.model.devices import DTYPES
from reservoir.runtime import records
from reservoir.runtime.dtypes import ROWS, best_of, candidates

#: int8's probe accuracy must be within this many points of float32's on MNIST and on CIFAR-10
ACCURACY_BAR = 0.5
#: int8 must run at least this many times the fastest float path
MARGIN = 1.1
#: runs shorter than this keep a float dtype: calibrating and quantizing are not repaid
MIN_TOKENS = 200_000

#: ``(CPU kind, model type, weights)`` whose int8 probes were measured within :data:`ACCURACY_BAR` of
#: float32 on MNIST and CIFAR-10 (docs/benchmarks.md, "When --dtype auto takes int8, per CPU kind"); a
#: change to the int8 recipe measures them again
PROBED: dict[tuple[str, str, str], str] = {
    ("avx512-vnni", "gpt2", "random"): "MNIST -0.16, CIFAR-10 -0.03",  # AMD Zen 4, int8 recipe 3
}


def cpu_kind(flags: set[str]) -> str:
    """The kind of int8 products a CPU runs, from its flags: ``amx`` (AMX int8 tiles), ``avx512-vnni``,
    ``avx-vnni`` (VNNI on 256-bit registers), ``avx2`` (no int8 dot-product instruction), ``other``."""
    if "amx_int8" in flags:
        return "amx"
    if "avx512_vnni" in flags:
        return "avx512-vnni"
    if "avx_vnni" in flags:
        return "avx-vnni"
    return "avx2" if "avx2" in flags else "other"


#: the rates' file in the cache folder (:mod:`reservoir.runtime.records`)
RATES = "int8-rates.json"


#: the timed block's shape: rows of this many tokens, this many rows (:data:`reservoir.runtime.dtypes.ROWS` tokens)
TOKENS = 64
HEAD_WIDTH = 64
#: interleaved rounds of timing (each path's fastest call counts)
ROUNDS = 3


def block_rates(width: int, threads: int) -> dict[str, float]:
    """Tokens/s of one pre-norm transformer block of ``width`` (rows of :data:`TOKENS` tokens, heads of
    :data:`HEAD_WIDTH`) in ``--dtype int8``'s recipe on OpenVINO and in each float path here:
    ``{"openvino int8": r, "openvino bfloat16": r, "torch float32": r, ...}``, each the fastest call over
    :data:`ROUNDS` interleaved rounds."""
    from reservoir.runtime.engines import cpu_config, import_openvino

    ov = import_openvino()
    try:
        import openvino.opset13 as ops
    except ImportError:  # OpenVINO before 2025 keeps the opsets under openvino.runtime
        from openvino.runtime import opset13 as ops

    rows, heads = max(1, ROWS // TOKENS), max(1, width // HEAD_WIDTH)
    rng = np.random.default_rng(0)

    def drawn(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    weights = {"qkv": drawn(3 * width, width), "out": drawn(width, width)}
    weights |= {"up": drawn(4 * width, width), "down": drawn(width, 4 * width)}
    x = rng.standard_normal((rows, TOKENS, width)).astype(np.float32)

    def openvino(dtype: str) -> Callable[[], Any]:
        int8 = dtype == "int8"

        def linear(h, name: str):
            w = weights[name]
            if int8:  # int8 per output channel, as nncf's INT8_SYM
                scale = np.abs(w).max(1, keepdims=True) / 127
                q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
                w = ops.multiply(
                    ops.convert(ops.constant(q), ov.Type.f32), ops.constant(scale.astype(np.float32))
                )
            else:
                w = ops.constant(w)
            return ops.matmul(h, w, False, True)

        def norm(h):
            return ops.mvn(h, ops.constant(np.array([-1], np.int64)), True, 1e-5, "inside_sqrt")

        def split_heads(t):
            t = ops.reshape(t, ops.constant(np.array([rows, TOKENS, heads, -1], np.int64)), False)
            return ops.transpose(t, ops.constant(np.array([0, 2, 1, 3], np.int64)))

        source = ops.parameter([rows, TOKENS, width], ov.Type.f32)
        q, k, v = (split_heads(t) for t in ops.split(linear(norm(source), "qkv"), -1, 3).outputs())
        scores = ops.multiply(
            ops.matmul(q, k, False, True), ops.constant(np.float32(1 / np.sqrt(HEAD_WIDTH)))
        )
        mixed = ops.transpose(
            ops.matmul(ops.softmax(scores, -1), v, False, False),
            ops.constant(np.array([0, 2, 1, 3], np.int64)),
        )
        mixed = ops.reshape(mixed, ops.constant(np.array([rows, TOKENS, width], np.int64)), False)
        h = ops.add(source, linear(mixed, "out"))
        out = ops.add(h, linear(ops.gelu(linear(norm(h), "up"), "tanh"), "down"))
        model = ov.Model([out], [source])
        request = ov.Core().compile_model(model, "CPU", cpu_config(dtype, threads)).create_infer_request()
        return lambda: request.infer({0: x})

    def pytorch(dtype: str) -> Callable[[], Any]:
        f = torch.nn.functional
        kind = DTYPES[dtype]
        w = {k: torch.from_numpy(v).to(kind) for k, v in weights.items()}
        source = torch.from_numpy(x).to(kind)

        @torch.inference_mode()
        def block():
            q, k, v = f.linear(f.layer_norm(source, (width,)), w["qkv"]).split(width, -1)
            q, k, v = (t.view(rows, TOKENS, heads, -1).transpose(1, 2) for t in (q, k, v))
            mixed = f.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(rows, TOKENS, width)
            h = source + f.linear(mixed, w["out"])
            return h + f.linear(
                f.gelu(f.linear(f.layer_norm(h, (width,)), w["up"]), approximate="tanh"), w["down"]
            )

        return block

    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        calls = {"openvino int8": openvino("int8")}
        for dtype in candidates():
            calls |= {f"openvino {dtype}": openvino(dtype), f"torch {dtype}": pytorch(dtype)}
        best = dict.fromkeys(calls, float("inf"))
        for turn in range(ROUNDS):  # interleaved, each round in another order: a slow moment slows them alike
            for name in list(calls)[turn:] + list(calls)[:turn]:
                best[name] = min(best[name], best_of(calls[name]))
        return {name: rows * TOKENS / seconds for name, seconds in best.items()}
    finally:
        torch.set_num_threads(n)


def measured_rates(
    width: int, threads: int, *, measure: Callable[[int, int], dict[str, float]] | None = None
) -> tuple[dict[str, float], bool]:
    """``(rates, cached)``: :func:`block_rates` of this CPU, threads, width and library versions, read from
    the cache when measured before, else measured now and kept."""
    from reservoir.runtime.engines import import_openvino

    ov_version = import_openvino().__version__

    key = json.dumps(["block", *records.machine(threads), width, torch.__version__, ov_version])
    kept = records.get(RATES, key)
    if isinstance(kept, dict) and "openvino int8" in kept:
        return kept, True
    rates = (measure or block_rates)(width, threads)
    records.put(RATES, key, rates)
    return rates, False


def choose_int8(
    *,
    device: torch.device,
    engine: str,
    backbone: Any,
    twin: str,
    tokens: int,
    target: str,
    load_dtype: str = "float32",
) -> tuple[bool, str]:
    """``(take, why)``: whether ``--dtype auto`` takes int8 for this run, and why (or why not), in words.
    ``twin``: the backbone's weights, ``"random"``, ``"pretrained"`` or ``"stats"``."""
    from reservoir.runtime.engines import openvino_installed
    from reservoir.runtime.machine import cpu

    model_type = getattr(backbone, "kind", type(backbone).__name__)
    kind = cpu_kind(cpu()[1])
    refusals = (
        (device.type != "cpu", f"int8 runs on the CPU, not {device.type}"),
        (load_dtype != "float32", f"weights loaded in {load_dtype}"),
        (target != "class", "real-valued targets keep float"),
        (engine not in ("auto", "openvino"), f"--engine {engine} does not compute int8"),
        (not openvino_installed(), "OpenVINO is not installed"),
        (not getattr(backbone, "openvino", False), f"{type(backbone).__name__} is not checked to convert"),
        (tokens < MIN_TOKENS, f"{tokens:,} tokens < {MIN_TOKENS:,}, calibrating would not pay"),
        (
            (kind, model_type, twin) not in PROBED,
            f"int8's probe accuracy is not measured for {model_type} ({twin} weights) on this {kind} CPU",
        ),
    )
    for refused, why in refusals:
        if refused:
            return False, f"not int8: {why}"
    start = time.perf_counter()
    rates, cached = measured_rates(backbone.d_model, torch.get_num_threads())
    took = time.perf_counter() - start
    floats = {k: v for k, v in rates.items() if k != "openvino int8"}
    best = max(floats, key=floats.get)
    ratio = rates["openvino int8"] / floats[best]
    named = best.replace("openvino", "OpenVINO").replace("torch", "PyTorch")
    measured = (
        f"one block, {'measured before' if cached else f'measured now, in {took:.1f} s, once for this machine'}: int8 "
        f"{rates['openvino int8']:,.0f} tokens/s, {named} {floats[best]:,.0f}"
    )
    if ratio < MARGIN:
        return False, f"not int8: {ratio:.2f}x the fastest float path here, short of {MARGIN}x ({measured})"
    return True, (
        f"auto: int8, {ratio:.2f}x the fastest float path here ({measured}) and within {ACCURACY_BAR} points "
        f"of float32 in this CPU kind's probes ({PROBED[kind, model_type, twin]}); --dtype float32 for float features"
    )

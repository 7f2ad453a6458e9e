"""The rows of ``benchmarks/extract.py``: each builds one way to turn a batch of tokens into
the readout token's features at every depth, from the same seeded weights.

Every row is registered by name (:func:`row`) with a one-line description; its builder gets
the shared :class:`Setup` and returns a :class:`Built`: a callable that runs the timed batch
once (numpy tokens in, float32 numpy features ``(B, depths, d)`` out, copies included) and a
line saying exactly which API did the work. A builder raises :class:`NotInstalled` when its
library is missing and :class:`Unavailable` when the row cannot exist here; anything else it
raises is a failure, reported in one line by the caller.

Feature convention (the project's, docs/guide/feature-file.md): depth ``k`` is the hidden state after
block ``k`` through the final layer norm ``ln_f``; depth 0 is the embedded input (input layer
plus positions) through ``ln_f``. Hugging Face's ``hidden_states`` apply ``ln_f`` to the last
one only, so the peers' wrapper (:class:`Readout`) applies it to the others; the official
baseline does not (it is timed as the official code runs, and its features are not compared).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkout  # noqa: E402, F401  (the checkout's reservoir first on sys.path)

from reservoir.model.devices import DTYPES
from reservoir.model.input_layer import make_input_layer  # noqa: E402
from reservoir.runtime.engines import DYNAMIC_GROUP, INT8_DTYPES, one_line  # noqa: E402,F401  (one_line: also used by extract.py)
from reservoir.runtime.runner import FeatureRunner, resolve_dtype  # noqa: E402
from reservoir.tasks import TaskSpec  # noqa: E402

INSTALL = "pip install 'reservoir[bench]'"
#: the official FPT code's batch size
BASELINE_BATCH = 16
#: rows compared with the float32 reference (the first rows of the timed batch)
CHECK_ROWS = 16
#: rows of the calibration set for NNCF's static int8 quantization, in items of CALIB_ITEM rows
CALIB_ROWS, CALIB_ITEM = 64, 8


class NotInstalled(Exception):
    """The row's library is not installed."""


class Unavailable(Exception):
    """The row cannot exist here (not a failure: e.g. a dtype the project does not have yet)."""


@dataclass
class Built:
    run: Callable[[], np.ndarray]
    dtype: str
    how: str
    rows: int  # examples per call
    comparable: bool = True  # features in the project's convention (compared with the float32 reference)


@dataclass
class RowSpec:
    name: str
    help: str
    build: Callable[[Setup], Built]
    cpu_only: bool = False


ROWS: dict[str, RowSpec] = {}


def row(name: str, help: str, *, cpu_only: bool = False):
    """Register a row builder under ``name`` (the order of registration is the order of the table)."""

    def register(build):
        ROWS[name] = RowSpec(name, help, build, cpu_only)
        return build

    return register


def need(module: str):
    """Import an optional library, or raise :class:`NotInstalled`."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise NotInstalled(f"not installed ({INSTALL}): no module {module}") from None


@contextlib.contextmanager
def quiet():
    """Library chatter (exporter progress, NNCF's tables and progress bars, warnings) goes to
    stderr, so stdout stays the report; their usage telemetry declined, as the engines decline it."""
    from reservoir.runtime.engines import decline_telemetry

    decline_telemetry()
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class Readout(nn.Module):
    """Input layer -> Hugging Face ``GPT2Model`` (``output_hidden_states=True``) -> the last token
    of every hidden state through ``ln_f`` (the project's features), ``(B, n_layer + 1, d)`` float32."""

    def __init__(self, input_layer: nn.Module, model: nn.Module, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.input_layer, self.model, self.dtype = input_layer, model, dtype

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.input_layer(tokens).to(self.dtype)
        hs = self.model(inputs_embeds=x, output_hidden_states=True, use_cache=False).hidden_states
        last = len(hs) - 1
        return torch.stack(
            [h[:, -1] if k == last else self.model.ln_f(h[:, -1]) for k, h in enumerate(hs)], 1
        ).float()


def frozen(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        p.requires_grad_(False)
    return module.eval()


@dataclass
class Setup:
    """What every row is built from: the model's shape and seed, the inputs, the device and threads."""

    shape: dict
    seed: int
    seq_len: int
    token_dim: int
    batch: int
    device: torch.device
    threads: int
    workdir: Path
    ours_dtype: str = "auto"
    ours_compile: bool | None = None
    notes: dict = field(default_factory=dict)  # shared facts a row learned (exporter used, ...)

    @cached_property
    def spec(self) -> TaskSpec:
        return TaskSpec("bench", "dense", seq_len=self.seq_len, token_dim=self.token_dim, n_classes=10)

    @cached_property
    def tokens(self) -> np.ndarray:
        """``max(batch, 16)`` rows of ``seq_len`` tokens of ``token_dim`` values in [0, 1] (MNIST's range)."""
        rng = np.random.default_rng(self.seed)
        return rng.random((max(self.batch, BASELINE_BATCH), self.seq_len, self.token_dim), dtype=np.float32)

    @property
    def timed(self) -> np.ndarray:
        return self.tokens[: self.batch]

    @cached_property
    def calibration(self) -> list[np.ndarray]:
        """A calibration set drawn apart from the timed inputs (same distribution, another seed)."""
        rng = np.random.default_rng(self.seed + 1)
        x = rng.random((CALIB_ROWS, self.seq_len, self.token_dim), dtype=np.float32)
        return [x[i : i + CALIB_ITEM] for i in range(0, CALIB_ROWS, CALIB_ITEM)]

    def hf_model(self):
        """A Hugging Face ``GPT2Model`` with the seeded default initialisation: the weights of
        ``reservoir.model.backbones.load_backbone("gpt2-random", seed)`` (``random_gpt2``)."""
        from reservoir.model.backbones.gpt2 import random_gpt2

        return frozen(random_gpt2(self.seed, **self.shape).to_transformers())

    def input_layer(self) -> nn.Module:
        return frozen(make_input_layer(self.spec, self.shape["n_embd"], self.seed))

    def readout(self, dtype: torch.dtype = torch.float32) -> Readout:
        return frozen(Readout(self.input_layer(), self.hf_model().to(dtype), dtype))

    @cached_property
    def reference(self) -> np.ndarray:
        """Float32 eager features of the first :data:`CHECK_ROWS` rows on the CPU: what every row is compared with."""
        with torch.inference_mode():
            return self.readout()(torch.from_numpy(self.tokens[:CHECK_ROWS])).numpy()

    def torch_run(self, fn: Callable, tokens: np.ndarray) -> Callable[[], np.ndarray]:
        device = self.device

        @torch.inference_mode()
        def run():
            return fn(torch.from_numpy(tokens).to(device)).cpu().numpy()

        return run

    # -- the ONNX export shared by the ONNX Runtime rows (and OpenVINO's fallback) ---------------
    @cached_property
    def onnx_path(self) -> Path:
        """The float32 :class:`Readout` exported to ONNX with a dynamic batch axis
        (:func:`reservoir.runtime.onnx.export`: the dynamo exporter, else the TorchScript one)."""
        need("onnx")
        from reservoir.runtime.onnx import export

        path = self.workdir / "readout.onnx"
        self.notes["onnx"] = export(
            self.readout(),
            (torch.from_numpy(self.tokens[:2]),),
            path,
            input_names=["tokens"],
            output_names=["features"],
            dynamic={"tokens": {0: "batch"}},
        )
        return path


# -- the rows, in table order ----------------------------------------------------------------


@row(
    "official",
    "the official FPT code's forward: HF GPT2Model, eager float32, output_hidden_states=True, batch 16",
)
def official(s: Setup) -> Built:
    model = s.hf_model().to(s.device)
    layer = s.input_layer().to(s.device)

    def forward(tokens):
        out = model(inputs_embeds=layer(tokens), output_hidden_states=True)
        return torch.stack([h[:, -1] for h in out.hidden_states], 1)

    attention = getattr(model.config, "_attn_implementation", None) or "default"
    return Built(
        s.torch_run(forward, s.tokens[:BASELINE_BATCH]),
        "float32",
        f"transformers GPT2Model eager ({attention} attention), hidden states gathered at the last token",
        BASELINE_BATCH,
        comparable=False,
    )


@row(
    "hf-compiled",
    "HF GPT2Model under torch.compile (inductor, freezing) in the fastest float dtype, "
    "output_hidden_states=True",
)
def hf_compiled(s: Setup) -> Built:
    name = resolve_dtype("auto", s.device)  # bf16 where native (AVX512-BF16/AMX, CUDA), else float32
    torch._inductor.config.freezing = True
    model = s.readout(DTYPES[name]).to(s.device)
    fn = torch.compile(model)
    return Built(
        s.torch_run(fn, s.timed),
        name,
        f"torch.compile(GPT2Model wrapper), torch._inductor.config.freezing=True, {name}, batch {s.batch}",
        s.batch,
    )


def ort_session(s: Setup, path: Path):
    need("onnxruntime")
    from reservoir.runtime.onnx import session

    sess, tokens = session(path, s.threads), s.timed

    def run():
        return sess.run(None, {"tokens": tokens})[0]

    return run


@row("ort-fp32", "ONNX Runtime, float32: the HF model exported to ONNX", cpu_only=True)
def ort_fp32(s: Setup) -> Built:
    need("onnxruntime")
    path = s.onnx_path
    return Built(
        ort_session(s, path),
        "float32",
        f"{s.notes['onnx']} -> onnxruntime CPUExecutionProvider, ORT_ENABLE_ALL, "
        f"intra_op_num_threads={s.threads}",
        s.batch,
    )


@row("ort-int8", "ONNX Runtime, dynamic int8 (quantize_dynamic, QInt8 weights)", cpu_only=True)
def ort_int8(s: Setup) -> Built:
    need("onnxruntime")
    from reservoir.runtime.onnx import quantize_int8

    path = s.workdir / "readout-int8.onnx"
    how = quantize_int8(s.onnx_path, path, s.workdir, op_types=None)  # ORT's defaults, as a user would run it
    return Built(
        ort_session(s, path),
        "int8 (U8S8, dynamic)",
        f"{s.notes['onnx']} -> {how}; ORT's x86 default -> onnxruntime CPU, the whole batch at once "
        "(one activation scale per tensor: a row depends on its batch)",
        s.batch,
    )


def ov_float_model(s: Setup):
    """The float32 :class:`Readout` as an OpenVINO model: ``openvino.convert_model`` of the
    ``torch.export`` program, else of the ONNX file."""
    ov = need("openvino")
    if "ov_model" in s.notes:
        return s.notes["ov_model"]
    errors = []
    try:
        with quiet(), torch.no_grad():
            program = torch.export.export(
                s.readout(),
                (torch.from_numpy(s.tokens[:2]),),
                dynamic_shapes={"tokens": {0: torch.export.Dim("batch")}},
            )
            model, how = ov.convert_model(program), "openvino.convert_model(torch.export.export(model))"
    except Exception as e:  # noqa: BLE001 - try the ONNX file
        errors.append(one_line(e))
        with quiet():
            model, how = ov.convert_model(str(s.onnx_path)), f"openvino.convert_model({s.notes['onnx']} file)"
        how += f" (from torch failed: {errors[0]})"
    model.reshape({model.inputs[0]: ov.PartialShape([-1, s.seq_len, s.token_dim])})
    s.notes["ov_model"], s.notes["ov_how"] = model, how
    return model


def ov_compiled(s: Setup, model, extra: dict | None = None):
    ov = need("openvino")
    props = ov.properties
    config = {
        props.inference_num_threads: s.threads,  # one stream, every thread on it
        props.hint.performance_mode: props.hint.PerformanceMode.LATENCY,
        **(extra or {}),
    }
    with quiet():
        compiled = ov.Core().compile_model(model, "CPU", config)
    precision = compiled.get_property(props.hint.inference_precision)
    precision = getattr(precision, "get_type_name", lambda: str(precision))()
    request, tokens = compiled.create_infer_request(), s.timed

    def run():
        request.infer({0: tokens})
        return request.get_output_tensor(0).data.copy()

    return run, precision


@row("ov-float", "OpenVINO, float (OpenVINO picks the inference precision)", cpu_only=True)
def ov_float(s: Setup) -> Built:
    run, precision = ov_compiled(s, ov_float_model(s))
    return Built(
        run,
        f"{precision} (OpenVINO's choice)",
        f"{s.notes['ov_how']} -> compile_model CPU, hint LATENCY, inference_num_threads={s.threads}; "
        f"ov.properties.hint.inference_precision = {precision}",
        s.batch,
    )


@row(
    "ov-int8", "OpenVINO, int8 by NNCF (nncf.quantize, calibrated; else nncf.compress_weights)", cpu_only=True
)
def ov_int8(s: Setup) -> Built:
    nncf = need("nncf")
    need("openvino")
    base = ov_float_model(s)
    nncf.set_log_level(logging.ERROR)
    try:
        with quiet():
            model = nncf.quantize(
                base.clone(),
                nncf.Dataset(s.calibration),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=CALIB_ROWS // CALIB_ITEM,
            )
        how = (
            f"nncf.quantize(model_type=TRANSFORMER, {CALIB_ROWS} calibration rows of the same kind of inputs, "
            "another seed): static int8 weights and activations"
        )
        dtype = "int8 (static, weights + activations)"
    except Exception as e:  # noqa: BLE001 - fall back to weight-only int8
        with quiet():
            model = nncf.compress_weights(base.clone(), mode=nncf.CompressWeightsMode.INT8_ASYM)
        how = f"nncf.compress_weights(INT8_ASYM): weight-only int8 (nncf.quantize failed: {one_line(e)})"
        dtype = "int8 weights only"
    run, precision = ov_compiled(s, model)
    return Built(
        run,
        f"{dtype}; other ops {precision}",
        f"{s.notes['ov_how']} -> {how} -> compile_model CPU, hint LATENCY, inference_num_threads={s.threads}",
        s.batch,
    )


@row(
    "ov-int8-dynamic",
    "OpenVINO, int8 weights (nncf.compress_weights) and activations quantized per token at run time",
    cpu_only=True,
)
def ov_int8_dynamic(s: Setup) -> Built:
    nncf, ov = need("nncf"), need("openvino")
    nncf.set_log_level(logging.ERROR)
    with quiet():
        model = nncf.compress_weights(ov_float_model(s).clone(), mode=nncf.CompressWeightsMode.INT8_SYM)
    run, precision = ov_compiled(
        s, model, {ov.properties.hint.dynamic_quantization_group_size: str(DYNAMIC_GROUP)}
    )
    return Built(
        run,
        f"int8 weights, activations per token at run time; other ops {precision}",
        f"{s.notes['ov_how']} -> nncf.compress_weights(INT8_SYM) -> compile_model CPU, hint LATENCY, "
        f"inference_num_threads={s.threads}, dynamic_quantization_group_size={DYNAMIC_GROUP} (ours' group; "
        "OpenVINO's default is 32)",
        s.batch,
    )


def ours_runner(s: Setup, dtype: str, engine: str) -> FeatureRunner:
    from reservoir.extract.run import should_compile
    from reservoir.model.backbones.gpt2 import random_gpt2

    backbone = random_gpt2(s.seed, **s.shape)  # = load_backbone("gpt2-random", seed) at the GPT-2-small shape
    depths = list(range(s.shape["n_layer"] + 1))
    tokens = 50_000 * s.seq_len  # as an extraction of 50,000 such examples would decide
    compile = should_compile(s.ours_compile, tokens)
    calibration = [(x, np.full(len(x), s.seq_len)) for x in s.calibration]  # the NNCF peer's calibration rows
    return FeatureRunner.build(
        s.spec,
        backbone,
        depths,
        seed=s.seed,
        dtype=dtype,
        compile=compile,
        batch_size=s.batch,
        device=s.device,
        engine=engine,
        tokens=tokens,
        calibration=(lambda: calibration) if dtype in INT8_DTYPES else None,
        log=lambda text: print(text, file=sys.stderr),
    )


def ours_built(s: Setup, dtype: str, engine: str = "auto") -> Built:
    runner = ours_runner(s, dtype, engine)
    tokens, lengths = s.timed, np.full(s.batch, s.seq_len, dtype=np.int64)

    def run():
        return runner(tokens, lengths)[:, :, 0]

    how = {
        "torch": "compiled" if runner.compiled else "eager",
        "openvino": "OpenVINO CPU plugin",
        "onnxruntime": "ONNX Runtime CPU provider"
        + (", one row per call" if runner.dtype_name == "int8" else ""),
    }[runner.engine]
    return Built(
        run,
        runner.dtype_name,
        f"reservoir.runtime.runner.FeatureRunner(dtype={dtype!r} -> {runner.dtype_name}, engine={engine!r} -> "
        f"{runner.engine}, {how}, batch {s.batch}): prepare, forward, features copied out to numpy",
        s.batch,
    )


@row(
    "ours",
    "reservoir.runtime.runner.FeatureRunner as an extraction runs it: dtype auto, engine auto (OpenVINO where "
    "installed on the CPU, else PyTorch compiled)",
)
def ours(s: Setup) -> Built:
    return ours_built(s, s.ours_dtype)


@row(
    "ours-torch",
    "reservoir.runtime.runner.FeatureRunner on PyTorch (engine torch), dtype auto, compiled as an "
    "extraction of 50,000 such examples would be",
)
def ours_torch(s: Setup) -> Built:
    return ours_built(s, s.ours_dtype, "torch")


def ours_at(dtype: str):
    def build(s: Setup) -> Built:
        from reservoir.runtime.dtypes import candidates

        if s.device.type == "cpu" and dtype not in candidates():
            raise Unavailable(f"not available: this CPU does not multiply {dtype} natively")
        return ours_built(s, dtype)

    return build


for _dtype in ("float32", "bfloat16", "float16"):
    row(
        f"ours-{_dtype}",
        f"reservoir.runtime.runner.FeatureRunner as an extraction runs it with --dtype {_dtype} "
        "(engine auto): the default's rival dtypes",
    )(ours_at(_dtype))


@row(
    "ours-int8",
    "reservoir.runtime.runner.FeatureRunner, dtype int8: int8 weights, activations centred per position "
    "(means of the NNCF peer's calibration rows) and quantized per token at run time (OpenVINO)",
    cpu_only=True,
)
def ours_int8(s: Setup) -> Built:
    return ours_built(s, "int8")


@row(
    "ours-int8-static",
    "reservoir.runtime.runner.FeatureRunner, dtype int8-static: activations centred per position, "
    "scales calibrated, both on the NNCF peer's calibration rows (OpenVINO)",
    cpu_only=True,
)
def ours_int8_static(s: Setup) -> Built:
    return ours_built(s, "int8-static")


def ours_on(engine: str, dtype: str):
    def build(s: Setup) -> Built:
        from reservoir.runtime.dtypes import candidates

        if s.device.type != "cpu" and engine != "torch":
            raise Unavailable(f"not available: --engine {engine} runs on the CPU")
        if s.device.type == "cpu" and dtype in ("bfloat16", "float16") and dtype not in candidates():
            raise Unavailable(f"not available: this CPU does not multiply {dtype} natively")
        return ours_built(s, dtype, engine)

    return build


for _engine, _dtype in (
    ("torch", "float32"),
    ("torch", "bfloat16"),
    ("openvino", "float32"),
    ("openvino", "bfloat16"),
    ("onnxruntime", "float32"),
    ("onnxruntime", "int8"),
):
    row(
        f"ours-{_engine}-{_dtype}",
        f"reservoir.runtime.runner.FeatureRunner with --engine {_engine} --dtype {_dtype}, "
        "compiled as an extraction of 50,000 such examples would be (torch)",
        cpu_only=_engine != "torch",
    )(ours_on(_engine, _dtype))

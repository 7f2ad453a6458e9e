"""The ONNX Runtime engine: the forward module exported to ONNX and run by ONNX Runtime's CPU provider.

The module every engine runs (:class:`reservoir.model.reservoir.FixedDepths` over
:class:`reservoir.runtime.runner.Reservoir`) is exported with the batch and the width free
(:func:`export`), so one file serves every batch shape of a run. ``int8`` centres the projections
as the OpenVINO engine does (:func:`reservoir.runtime.engines.centred`) before export, then
quantizes with ``quantize_dynamic``. ONNX Runtime computes one activation scale per tensor at run
time, so a row quantized beside others would depend on them: ``int8`` runs each row alone
(:meth:`ONNXForward._infer`).

The file is cached in ``$RESERVOIR_CACHE/onnx/`` under a digest of everything that makes it
(:func:`file_key`); a change to how it is made that moves features must bump :data:`FILE_RECIPE`.
Beside it, ``FILE.sha256`` holds the SHA-256 of its bytes (and of its weights beside it), written after it: a cached file that differs
(damaged, or an export cut before its digest) is exported again, since the check against PyTorch on
the first rows tolerates a small change (an int8 file's a large one).
``benchmarks/peers.py`` builds its ONNX Runtime rows from :func:`export`, :func:`quantize_int8` and
:func:`session`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reservoir.errors import BackboneError
from reservoir.identity import changed_files, file_sha256
from reservoir.paths import cache_dir
from reservoir.runtime import engines
from reservoir.runtime.engines import (
    FORWARDS,
    ONNX_DTYPES,
    ONNX_INSTALL,
    ConvertedForward,
    Engine,
    calibration_dtype,
    centred,
    one_line,
    position_means,
    readout_of,
    register_engine,
)

#: operations ``int8`` quantizes (those with a constant weight: ``MatMulConstBOnly``); lookups stay float
QUANTIZED_OPS = ("MatMul", "Gemm")
#: operations a quantized file computes int8 products with
INT8_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "ConvInteger", "DynamicQuantizeLSTM", "QAttention")
#: the ONNX file's input and output names
INPUTS, OUTPUT = ("tokens", "lengths", "readout"), "features"
#: version of how the file is made (export settings, quantization); a change that moves features bumps it
FILE_RECIPE = 1
#: the cache folder's subfolder of ONNX files
FOLDER = "onnx"
#: weights past this many bytes are written beside the ONNX file (its protobuf holds at most 2 GB)
LARGE_BYTES = 1_800_000_000
#: loggers whose lines say nothing to a user while exporting (torch's exporter notes, onnxscript's passes)
LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx", "onnxscript", "onnx_ir")


def versions() -> dict[str, str | None]:
    """The versions a file and a measured rate depend on."""
    engines.decline_telemetry()  # before ONNX Runtime's import
    out: dict[str, str | None] = {"torch": torch.__version__}
    for name in ("onnxruntime", "onnx", "onnxscript"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out


def quiet() -> contextlib.AbstractContextManager:
    """The exporter's and the quantizer's chatter kept off the terminal (:func:`engines.quiet`)."""
    return engines.quiet(*LOGGERS)


def export(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path | str,
    *,
    input_names: Sequence[str] = INPUTS,
    output_names: Sequence[str] = (OUTPUT,),
    dynamic: dict[str, dict[int, str]] | None = None,
) -> str:
    """Export ``module`` called on ``example`` to the ONNX file ``path`` with the named axes of ``dynamic``
    (``{input name: {axis: name}}``) left free: torch's dynamo exporter, else the TorchScript one. Returns
    which exporter wrote it; raises ``RuntimeError`` naming both failures."""
    dynamic = dynamic or {}
    errors = []
    for dynamo in (True, False):
        if dynamo:
            dims = {}
            shapes = tuple(
                {
                    axis: dims.setdefault(name, torch.export.Dim(name))
                    for axis, name in dynamic.get(n, {}).items()
                }
                or None
                for n in input_names
            )
            kwargs: dict[str, Any] = dict(dynamic_shapes=shapes, optimize=True)
        else:
            batch = {0: next(iter(dynamic.get(input_names[0], {}).values()), "batch")} if dynamic else {}
            kwargs = dict(dynamic_axes={**dynamic, **dict.fromkeys(output_names, batch)} if dynamic else None)
        try:
            with quiet(), torch.no_grad():
                torch.onnx.export(
                    module,
                    example,
                    str(path),
                    input_names=list(input_names),
                    output_names=list(output_names),
                    dynamo=dynamo,
                    verbose=False,
                    **kwargs,
                )
            how = (
                "torch.onnx.export(dynamo=True)" if dynamo else "torch.onnx.export(dynamo=False, TorchScript)"
            )
            return how + (f" (dynamo exporter failed: {errors[0]})" if errors else "")
        except Exception as e:  # noqa: BLE001 - try the other exporter, then say both
            errors.append(one_line(e))
    raise RuntimeError("both ONNX exporters failed: " + " | ".join(errors))


def quantize_int8(
    source: Path | str,
    path: Path | str,
    workdir: Path | str | None = None,
    *,
    op_types: Sequence[str] | None = QUANTIZED_OPS,
    large: bool = False,
) -> str:
    """``source`` quantized to ``path`` by ``quantize_dynamic`` (int8 weights), after ``quant_pre_process``
    where it succeeds. ``op_types=None``: ONNX Runtime's default operations; ``large``: weights kept
    beside the file. Returns what was done."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pre = "quant_pre_process"
    source, path = Path(source).resolve(), Path(path).resolve()
    # ONNX Runtime's shape inference writes a scratch file into the working folder: it works in ``tmp``
    with tempfile.TemporaryDirectory(dir=workdir) as tmp, contextlib.chdir(tmp):
        prepared = Path(tmp) / "pre.onnx"
        try:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            with quiet():
                quant_pre_process(str(source), str(prepared), save_as_external_data=large)
            source = prepared
        except Exception as e:  # noqa: BLE001 - quantize the plain export instead
            pre = f"no quant_pre_process ({one_line(e)})"
        with quiet():
            quantize_dynamic(
                str(source),
                str(path),
                weight_type=QuantType.QInt8,
                use_external_data_format=large,
                **({} if op_types is None else {"op_types_to_quantize": list(op_types)}),
            )
    ops = "ONNX Runtime's default ops" if op_types is None else "+".join(op_types)
    return (
        f"{pre} -> quantize_dynamic(weight_type=QInt8, {ops}: uint8 activations quantized per tensor at run "
        "time, int8 weights per tensor)"
    )


def session(path: Path | str, threads: int):
    """An ONNX Runtime CPU session of ``path`` on ``threads`` threads (one stream, every graph optimization)."""
    engines.decline_telemetry()
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def file_key(
    module: torch.nn.Module,
    example: Sequence[torch.Tensor],
    dtype: str,
    dynamic: dict,
    tables: dict[str, Sequence[torch.Tensor]] | None = None,
) -> str:
    """SHA-256 of what an exported file depends on: the module's class, its backbone's class, reading and configuration,
    weights and buffers, depths and readout, the inputs' dtypes and trailing shapes, the free axes, the dtype,
    the int8 tables, :data:`FILE_RECIPE` and the library versions."""
    from reservoir.identity import canonical, config_dict

    h = hashlib.sha256()
    reservoir = getattr(module, "reservoir", None)
    backbone = getattr(reservoir, "backbone", None)
    head = {
        "recipe": FILE_RECIPE,
        "versions": versions(),
        "dtype": dtype,
        "dynamic": dynamic,
        "class": type(module).__qualname__,
        "backbone": f"{type(backbone).__module__}.{type(backbone).__qualname__}",
        "reading": getattr(backbone, "reading", 1),
        "config": canonical(config_dict(getattr(backbone, "config", None))),
        "readout": readout_of(module),
        "depths": list(getattr(module, "depths", ())),
        "inputs": [[str(t.dtype), list(t.shape[2:])] for t in example],
        "readout_last_block": [bool(getattr(m, "readout_last_block", False)) for m in module.modules()],
    }
    h.update(json.dumps(head, sort_keys=True, default=str).encode())

    def add(name: str, t: torch.Tensor) -> None:
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")

    for name, t in module.state_dict().items():
        add(name, t)
    for name, t in module.named_buffers():  # those no state dict holds (rotary frequencies) too
        add(f"buffer:{name}", t)
    for name in sorted(tables or {}):
        for i, t in enumerate(tables[name]):
            add(f"table:{name}:{i}", t)
    return h.hexdigest()


class Unquantized(Exception):
    """``int8``: quantizing left every product of the backbone float."""


def digest_path(path: Path) -> Path:
    """Where the SHA-256 of an exported file (and of its weights beside it) is recorded: ``FILE.sha256``."""
    return path.with_name(path.name + ".sha256")


def exported_files(path: Path) -> list[Path]:
    """An exported file and its weights beside it (``FILE.data``) where there are such."""
    return [p for p in (path, path.with_name(path.name + ".data")) if p.exists()]


def damage(path: Path) -> str | None:
    """How a cached exported file differs from the digests its export recorded, in words; ``None`` if it does not."""
    try:
        recorded = json.loads(digest_path(path).read_text())
        if not isinstance(recorded, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError):
        return "has no digest recorded by its export (an export cut short, or one made before digests)"
    stamp = path.with_name(path.name + ".verified")
    if changed_files(exported_files(path), recorded, stamp):
        return "differs from the digest its export recorded"
    return None


class ONNXForward(ConvertedForward):
    """The converted forward (:class:`~reservoir.runtime.engines.ConvertedForward`) of ONNX Runtime: the
    module exported, or loaded from the cache, at the first call; ``dtype`` ``float32`` or ``int8``,
    ``threads`` ONNX Runtime's intra-op threads (PyTorch's thread count)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.path: Path | None = None
        self.how = ""
        self.inputs: list[str] = []

    def _tables(self) -> dict[str, tuple[torch.Tensor, ...]] | None:
        if self.dtype != "int8":
            return None
        start = time.perf_counter()
        tables = position_means(
            self.eager, self.calibration(), self.width, self.centre_dtype or calibration_dtype()
        )
        self.seconds["centre"] = time.perf_counter() - start
        return tables

    def _make(self, example: tuple[torch.Tensor, ...], path: Path, tables) -> None:
        """Export (int8: centred, then quantized) into ``path``, written whole or not at all (weights past
        :data:`LARGE_BYTES` beside it in ``path.data``)."""
        import onnx

        dynamic = {
            "tokens": {0: "batch", 1: "width"},
            "lengths": {0: "batch"},
            "readout": {0: "batch", 1: "width"} if self.every_position else {0: "batch"},
        }
        big = sum(t.numel() * t.element_size() for t in self.eager.state_dict().values()) > LARGE_BYTES
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmp:
            exported = Path(tmp) / "float.onnx"
            start = time.perf_counter()
            with centred(self.eager, tables) if tables else contextlib.nullcontext():
                self.how = export(self.eager, example, exported, dynamic=dynamic)
            self.seconds["export"] = time.perf_counter() - start
            if self.dtype == "int8":
                start = time.perf_counter()
                quantized = Path(tmp) / "int8.onnx"
                self.how += " -> " + quantize_int8(exported, quantized, tmp, large=big)
                exported = quantized
                graph = onnx.load(str(exported), load_external_data=False).graph
                if not any(n.op_type in INT8_OPS for n in graph.node):
                    raise Unquantized(
                        "quantize_dynamic found no matrix product with int8 weights in this backbone "
                        "(its recurrent or fused operations stay float); use --dtype float32"
                    )
                self.seconds["quantize"] = time.perf_counter() - start
            whole = Path(tmp) / path.name
            with quiet():
                onnx.save_model(
                    onnx.load(str(exported)),
                    str(whole),
                    save_as_external_data=big,
                    all_tensors_to_one_file=True,
                    location=path.name + ".data",
                )
            if big:
                os.replace(Path(tmp) / (path.name + ".data"), path.parent / (path.name + ".data"))
            os.replace(whole, path)
            recorded = Path(tmp) / "sha256"
            recorded.write_text(json.dumps({p.name: file_sha256(p) for p in exported_files(path)}))
            os.replace(recorded, digest_path(path))

    def prepare(self, batch: tuple[torch.Tensor, ...]) -> None:
        """Load the cached file of this module and dtype, or export it, open a session and check against
        PyTorch float32 on ``batch``'s first rows."""

        example = self.example(batch)
        tables = self._tables()
        start = time.perf_counter()
        dynamic = {"batch": [0], "width": [1], "readout width": self.every_position}
        path = (
            cache_dir() / FOLDER / f"{file_key(self.eager, example, self.dtype, dynamic, tables)[:32]}.onnx"
        )
        self.seconds["key"] = time.perf_counter() - start
        cached = path.exists()
        if cached and (differs := damage(path)):
            self.log(f"onnxruntime: the cached file {path} {differs}: exporting it again")
            cached = False
        if not cached:
            try:
                self._make(example, path, tables)
            except Unquantized as e:
                raise BackboneError(f"--engine onnxruntime --dtype int8: {e}") from None
            except Exception as e:  # noqa: BLE001 - named with the way out
                raise BackboneError(
                    f"ONNX Runtime could not take this backbone: torch could not export it to ONNX "
                    f"({one_line(e)}); pass --engine torch"
                ) from None
        start = time.perf_counter()
        try:
            with quiet():
                self.request = session(path, self.threads)
            self.inputs = [i.name for i in self.request.get_inputs()]  # a graph that never reads one lacks it
        except Exception as e:  # noqa: BLE001 - a damaged cached file, or an op the runtime lacks
            raise BackboneError(
                f"ONNX Runtime could not load the exported model {path} ({one_line(e)}); delete "
                "the file to export it again, or pass --engine torch"
            ) from None
        self.path = path
        self.seconds["load"] = time.perf_counter() - start
        rows = self.check_rows(batch)
        self.compare(self._infer(rows).numpy(), rows)
        source = f"cached file {path.name}" if cached else f"exported to {path.name}"
        self.accept("onnxruntime", len(rows[0]), source)

    def _run(self, tokens: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor) -> np.ndarray:
        feed = {"tokens": tokens, "lengths": lengths, "readout": readout}
        arrays = {n: np.ascontiguousarray(feed[n].numpy()) for n in self.inputs}
        try:
            return self.request.run(None, arrays)[0]
        except Exception as e:  # noqa: BLE001 - onnxruntime's own errors: a graph this batch's shapes do not fit
            raise BackboneError(
                f"ONNX Runtime could not run a batch of shapes {[list(t.shape) for t in feed.values()]} through the "
                f"graph it exported ({one_line(e)}); pass --engine torch"
            ) from None

    def _infer(self, args: Sequence[torch.Tensor]) -> torch.Tensor:
        """float32: the batch at once. int8: each row alone, cut to its own length, so that its run-time
        activation scales are its own."""
        tokens, lengths, readout = args
        if self.dtype != "int8":
            return torch.from_numpy(self._run(tokens, lengths, readout))
        out = []
        for i in range(len(tokens)):
            width = max(int(lengths[i]), int(readout[i].max()) + 1)
            out.append(self._run(tokens[i : i + 1, :width], lengths[i : i + 1], readout[i : i + 1]))
        return torch.from_numpy(np.concatenate(out))


@register_engine
class ONNXEngine(Engine):
    """ONNX Runtime's CPU provider, from the module exported to ONNX (float32, dynamic int8)."""

    name, label = "onnxruntime", "ONNX Runtime"
    dtypes = ONNX_DTYPES
    install = ONNX_INSTALL

    @property
    def auto_tokens(self) -> int:  # type: ignore[override]
        return engines.ONNX_MIN_TOKENS

    def installed(self) -> bool:
        return engines.onnxruntime_installed()

    def missing(self, dtype: str) -> str:
        return (
            "--engine onnxruntime: ONNX Runtime (with onnx and onnxscript, for torch's exporter) is not "
            f"installed; {ONNX_INSTALL}, or pass --engine torch"
        )


FORWARDS["onnxruntime"] = ONNXForward

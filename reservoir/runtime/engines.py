"""Engines that run the frozen forward: PyTorch (eager or compiled), OpenVINO, or ONNX Runtime (:mod:`reservoir.runtime.onnx`).

Every engine runs the same module, :class:`reservoir.runtime.runner.Reservoir`; a converting engine
converts it, its readout-only deepest block included. OpenVINO also computes ``int8`` (activations
quantized per token at run time, so a row never depends on its batch) and ``int8-static`` (scales
calibrated by NNCF).

Both int8 dtypes quantize each projection's input centred per position (:class:`Centred`,
:func:`position_means`), so a row's int8 features depend on the calibration rows, which are part of the
run's identity; a change that moves int8 features must bump :data:`INT8_RECIPE`. ``int8-static`` keeps
whole last blocks and a free width: with constant tables, OpenVINO's static int8 pass folds the
per-position factor wrongly.

After converting, an engine checks its features on the first rows against PyTorch's eager float32
forward and stops with an error naming ``--engine torch`` beyond :data:`TOLERANCE`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from reservoir.errors import BackboneError, DeviceError, ReservoirError, UsageError
from reservoir.model.backbones import columns, quiet_transformers, readout_rows
from reservoir.registry import ENGINES
from reservoir.runtime.dtypes import choose as choose_dtype

#: the int8 dtypes: only converting engines compute them
INT8_DTYPES = ("int8", "int8-static")
# The measurements behind the constants below: docs/benchmarks.md, "Constants the code takes from these
# measurements".
#: values per dynamic quantization group of the ``int8`` dtype
DYNAMIC_GROUP = 128
#: version of the int8 recipe, recorded in an int8 run's identity (``calibration.recipe``): a change that
#: moves int8 features bumps it, so no earlier file is reused
INT8_RECIPE = 3
#: what ``int8`` computes between its int8 products (norms, attention, residual sums)
INT8_FLOAT = "float32"
#: ``int8-static`` calibrates on about this many tokens of the run's first split, at most
#: :data:`CALIBRATION_ROWS` rows, in batches of :data:`CALIBRATION_BATCH` rows
CALIBRATION_TOKENS, CALIBRATION_ROWS, CALIBRATION_BATCH = 16384, 256, 16
#: ``engine="auto"`` takes OpenVINO for runs of at least this many tokens, where converting is repaid
OPENVINO_MIN_TOKENS = 20_000
#: ``engine="auto"`` considers ONNX Runtime for float32 runs of at least this many tokens
ONNX_MIN_TOKENS = 200_000


#: the conversion example's width (the converted graph computes the same features at any width)
EXAMPLE_WIDTH = 64
#: the narrowest example of rows of varying width: traced on one position, a causal model keeps no mask
#: (transformers builds none for a single query), and every wider batch would then read ahead of each position
MIN_EXAMPLE_WIDTH = 2
#: rows of the first batch checked against PyTorch's eager float32 forward: 4, or about CHECK_TOKENS tokens
CHECK_ROWS, CHECK_TOKENS = 4, 2048
#: largest relative feature error (norm-wise, worst depth) accepted against PyTorch's float32 forward
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2, "int8": 0.15, "int8-static": 0.15}
INSTALL = "pip install 'reservoir[openvino]'"


def openvino_installed() -> bool:
    return importlib.util.find_spec("openvino") is not None


#: the ONNX Runtime engine (:mod:`reservoir.runtime.onnx`): how to install it, and the dtypes it computes
ONNX_INSTALL = "pip install 'reservoir[onnx]'"
ONNX_DTYPES = ("float32", "int8")


def onnxruntime_installed() -> bool:
    """ONNX Runtime and what torch's exporter needs (``onnx``, ``onnxscript``) are importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx", "onnxscript"))


class Engine:
    """What runs the frozen forward during extraction, registered in :data:`reservoir.registry.ENGINES`
    by :func:`register_engine`.

    An engine is not part of a float run's identity: a converting engine computes PyTorch's features
    to its dtype's :data:`TOLERANCE`, checked on the first batch.
    """

    #: its ``--engine`` name, and how messages name it
    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    #: the compute dtypes it computes
    dtypes: ClassVar[tuple[str, ...]] = ()
    #: the device types it runs on
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: the command that installs what it needs ("" : nothing to install)
    install: ClassVar[str] = ""
    #: tokens a float run needs for ``auto`` to consider it (``None``: ``auto`` never converts to it)
    auto_tokens: ClassVar[int | None] = None
    #: it converts the PyTorch module (``False``: PyTorch itself, the reference every engine is checked against)
    converts: ClassVar[bool] = True

    def installed(self) -> bool:
        """What it needs is importable."""
        return True

    def missing(self, dtype: str) -> str:
        """The message when it is asked for and not installed."""
        return (
            f"--engine {self.name}: {self.label} is not installed; {self.install}, or pass --engine torch"
            + (" with --dtype auto" if dtype in INT8_DTYPES else "")
        )

    def refuses(self, dtype: str) -> str | None:
        """Why it does not compute ``dtype`` (a dtype it lacks, with the engines that have it); ``None`` when it does."""
        if dtype in self.dtypes:
            return None
        others = [e.name for e in engines() if dtype in e.dtypes and e is not self]
        return (
            f"--engine {self.name} computes {' or '.join(self.dtypes)}, not --dtype {dtype}; choose "
            f"--dtype {' or '.join(self.dtypes)}" + (f", or --engine {' or '.join(others)}" if others else "")
        )

    def why_not(self, dtype: str, device: torch.device, backbone: Any = None) -> ReservoirError | None:
        """Why it cannot run ``dtype`` on ``device`` here, as the error to raise; ``None`` when it can."""
        if device.type not in self.devices:
            return DeviceError(
                f"--engine {self.name} runs on the CPU, not {device}; use --engine torch on {device}, or --device cpu"
            )
        if (refused := self.refuses(dtype)) is not None:
            return UsageError(refused)
        if not self.installed():
            return UsageError(self.missing(dtype))
        return None

    def forward(
        self,
        eager: nn.Module,
        dtype: str,
        threads: int,
        calibration: Callable[[], list[tuple[np.ndarray, ...]]] | None,
        log: Callable[[str], None],
        *,
        width: int,
        fixed_width: bool,
        centre_dtype: str | None = None,
    ) -> Any:
        """Its forward over ``eager`` (the float32 module ``(tokens, lengths, readout) -> (B, n_depths,
        n_readout, d)``): an object with ``prepare(batch)`` (convert and check against ``eager``, raising
        :class:`reservoir.errors.BackboneError`), ``request`` (``None`` until prepared), ``seconds``,
        ``error`` and ``__call__(tokens, lengths, readout)`` returning float32 features.
        ``calibration``: the int8 dtypes' calibration batches; ``centre_dtype``: the float dtype their centring
        pass computes in (``None``: this CPU's fastest, :func:`calibration_dtype`). Default: the forward its module
        registers in :data:`FORWARDS`."""
        ENGINES.names()  # imports the runtime's modules: each converting engine's adds its forward
        return FORWARDS[self.name](
            eager,
            dtype,
            threads,
            calibration,
            log,
            width=width,
            fixed_width=fixed_width,
            centre_dtype=centre_dtype,
        )


#: the converting engines' forwards (:class:`ConvertedForward`), each registered by its module, by engine name
FORWARDS: dict[str, Callable[..., Any]] = {}


def register_engine(cls: type[Engine]) -> type[Engine]:
    """Class decorator: register an :class:`Engine` subclass under its ``name`` (an instance)."""
    ENGINES.register(cls.name, cls(), help=(cls.__doc__ or "").strip().splitlines()[0])
    return cls


def engines() -> list[Engine]:
    """The registered engines, in registration order (PyTorch first)."""
    return [ENGINES[name] for name in ENGINES.names()]


@register_engine
class TorchEngine(Engine):
    """PyTorch, eager or compiled: the reference, on every device."""

    name, label = "torch", "PyTorch"
    dtypes = ("float32", "bfloat16", "float16")
    devices = ("cpu", "cuda", "mps")
    converts = False

    def refuses(self, dtype: str) -> str | None:
        """The int8 dtypes: the engines that compute them (how to install those missing); else ``None``."""
        if dtype not in INT8_DTYPES:
            return None
        computing = [e for e in engines() if dtype in e.dtypes]
        runs_it = (
            f"the {computing[0].label} engine only"
            if len(computing) == 1
            else f"the {' or '.join(e.label for e in computing)} engine"
        )
        ways = " or ".join(
            f"--engine {e.name}" + ("" if e.installed() or i else f" ({e.install})")
            for i, e in enumerate(computing)
        )
        return f"--dtype {dtype} runs on {runs_it}; pass {ways}, or choose --dtype auto, float32 or bfloat16"


@register_engine
class OpenVINOEngine(Engine):
    """OpenVINO's CPU plugin, from the converted module; the only engine of ``int8-static``."""

    name, label = "openvino", "OpenVINO"
    dtypes = ("float32", "bfloat16", "float16", "int8", "int8-static")
    install = INSTALL

    @property
    def auto_tokens(self) -> int:  # type: ignore[override]
        return OPENVINO_MIN_TOKENS

    def installed(self) -> bool:
        return openvino_installed()


def choose_engine(
    name: str, dtype: str, device: torch.device, backbone: Any = None, tokens: int | None = None
) -> tuple[str, str]:
    """``(engine, why)``: for ``auto``, the first of :func:`auto_candidates` (``tokens=None``: a
    long-lived caller, the API's), else ``torch``; an explicit engine is asked :meth:`Engine.why_not`."""
    if name != "auto" and name not in ENGINES:
        raise UsageError(f"engine {name!r} is not supported; choose from {['auto', *ENGINES.names()]}")
    why = f"--engine {name}"
    if name == "auto":
        found, why = auto_candidates(dtype, device, backbone, tokens)
        name = found[0] if found else "torch"
        if found:
            why = (
                "auto: int8"
                if dtype in INT8_DTYPES
                else f"auto: {ENGINES[name].label} is installed"
                + ("" if tokens is None else f" and {tokens:,} tokens >= {ENGINES[name].auto_tokens:,}")
            )
    error = ENGINES[name].why_not(dtype, device, backbone)
    if error is not None:
        raise error
    return name, why


def auto_candidates(
    dtype: str, device: torch.device, backbone: Any, tokens: int | None
) -> tuple[list[str], str]:
    """The converting engines ``auto`` may run for ``dtype`` (first: the one it starts on), and why
    there are none. An int8 dtype takes the first installed engine that computes it (``auto`` never
    switches between int8 recipes); a float dtype, those installed, for a backbone checked to convert,
    in runs of at least their :attr:`Engine.auto_tokens`."""
    converting = [e for e in engines() if e.auto_tokens is not None and device.type in e.devices]
    if not converting:
        return [], f"auto on {device.type}"
    computing = [e for e in converting if dtype in e.dtypes]
    installed = [e for e in computing if e.installed()]
    if not installed:
        first = computing[0] if computing else converting[0]
        return [], f"auto: {first.label} is not installed ({first.install})"
    if dtype in INT8_DTYPES:
        return [installed[0].name], ""
    if not getattr(backbone, "openvino", False):
        return [], f"auto: {type(backbone).__name__} is not checked to convert to OpenVINO or ONNX"
    found = [e.name for e in installed if tokens is None or tokens >= e.auto_tokens]
    if not found:
        least = min(installed, key=lambda e: e.auto_tokens)
        return [], f"auto: {tokens:,} tokens < {least.auto_tokens:,}, converting would not pay"
    return found, ""


#: the engines' measured rates in the cache folder (:mod:`reservoir.runtime.records`)
ENGINE_RATES = "engine-rates.json"
#: rows a first batch needs for ``auto`` to measure the engines on it (fewer: too short to time)
MEASURE_MIN_ROWS = 16


def engine_key(dtype: str, backbone: Any, width: int, threads: int) -> str:
    """The key of the engines' rates: CPU, threads, runtime versions, dtype, architecture and row width."""
    import json

    from reservoir.runtime import records

    try:
        ov_version = import_openvino().__version__
    except ImportError:
        ov_version = None
    try:
        from onnxruntime import __version__ as ort_version
    except ImportError:
        ort_version = None
    return json.dumps(
        [
            *records.machine(threads),
            torch.__version__,
            ov_version,
            dtype,
            records.architecture(backbone),
            width,
        ]
        + ([ort_version] if ort_version else []),
        sort_keys=True,
        default=str,
    )


def faster_engine(rates: dict[str, float]) -> str:
    """The engine ``auto`` takes from measured rates: the fastest, PyTorch only when faster than every other."""
    others = {e: r for e, r in rates.items() if e != "torch"}
    best = max(others, key=others.get) if others else "torch"
    return "torch" if rates.get("torch", 0.0) > rates.get(best, 0.0) else best


def pays(rates: dict[str, float], convert: dict[str, float], engine: str, tokens: int | None) -> bool:
    """Whether converting to ``engine`` repays ``convert[engine]`` seconds over a job of ``tokens`` against
    PyTorch (``tokens=None``, a long-lived caller, or no conversion measured: it pays)."""
    if engine == "torch" or tokens is None or engine not in convert:
        return True
    return convert[engine] + tokens / rates[engine] < tokens / rates["torch"]


def measured_reason(rates: dict[str, float], when: str) -> str:
    """Why ``auto`` runs :func:`faster_engine` of ``rates`` (``when``: "before", "now, on the first batch")."""
    order = [e for e in engines() if e.converts] + [e for e in engines() if not e.converts]
    shown = ", ".join(
        f"{e.label} {rates[e.name]:,.0f} tokens/s" if i == 0 else f"{e.label} {rates[e.name]:,.0f}"
        for i, e in enumerate(e for e in order if e.name in rates)
    )
    return (
        f"auto: {ENGINES[faster_engine(rates)].label} ran this model fastest on this CPU (measured {when}: "
        f"{shown.replace('PyTorch', 'PyTorch eager')})"
    )


def calibration_batches(rows: int) -> list[np.ndarray]:
    """Row indices of each calibration batch: the first ``rows`` rows in batches of :data:`CALIBRATION_BATCH`
    (static int8's ranges depend on the batching, so every caller must batch alike)."""
    return [np.arange(i, min(i + CALIBRATION_BATCH, rows)) for i in range(0, rows, CALIBRATION_BATCH)]


#: graphs compiled for one batch shape each (rows of one width): the full batch and the last
STATIC_SHAPES = 2
#: smaller batches (the check's few rows) run on the dynamic graph, on one stream
STATIC_MIN_ROWS = 16
#: OpenVINO streams a CPU batch is split among, where each gets a thread
STREAMS = 2


def calibration_rows(seq_len: int, available: int) -> int:
    """Rows ``int8-static`` calibrates on: about :data:`CALIBRATION_TOKENS` tokens, 8 to
    :data:`CALIBRATION_ROWS` rows, at most the rows there are."""
    return min(available, max(8, min(CALIBRATION_ROWS, CALIBRATION_TOKENS // max(seq_len, 1))))


class Centred(nn.Module):
    """``module`` applied to ``x`` of ``T`` positions as ``module(u) * scale[:T] + moved[:T]`` with
    ``u = (x - shift[:T]) / scale[:T]`` and ``moved = module(shift) - scale * module(0)``: in exact
    arithmetic ``module(x)``, but int8 then quantizes each row's departure from the mean row at its
    position, not the large part every row shares there.
    """

    #: its tables are per position: a readout-only block tells it the readout rows' positions
    reads_positions = True

    def __init__(self, module: nn.Module, shift: torch.Tensor, scale: torch.Tensor, moved: torch.Tensor):
        super().__init__()
        self.module = module
        self.register_buffer("shift", shift)
        self.register_buffer("scale", scale)
        self.register_buffer("moved", moved)

    def _tables(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tables at the positions of ``x``'s rows: ``0..T-1``, or the readout positions while a
        readout-only last block computes those rows alone (:func:`reservoir.model.backbones.readout_rows`)."""
        rows = readout_rows()
        if rows is None:
            width = x.shape[-2]
            return self.shift[:width], self.scale[:width], self.moved[:width]
        return self.shift[rows], self.scale[rows], self.moved[rows]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift, scale, moved = self._tables(x)
        return self.module((x - shift) / scale) * scale + moved

    def columns(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Output features ``start:stop`` only (the readout-only block's query or key-value columns)."""
        shift, scale, moved = self._tables(x)
        return columns(self.module, (x - shift) / scale, start, stop) * scale + moved[..., start:stop]


def projections(model: nn.Module) -> dict[str, nn.Module]:
    """The backbone's matrix products int8 quantizes, by name in ``model``
    (:meth:`reservoir.model.backbones.Backbone.projections`). The input layer is not among them: int8
    often holds the task's own values exactly as they are, and not once centred."""
    from reservoir.model.backbones import Backbone

    backbone = getattr(getattr(model, "reservoir", None), "backbone", None)
    if backbone is not None:
        return {"reservoir.backbone." + name: m for name, m in backbone.projections().items()}
    return Backbone.projections(model)


@contextlib.contextmanager
def whole_blocks(model: nn.Module):
    """``model`` with the readout-only last block switched off (every projection then sees every
    position, in order), restored after."""
    backbones = [m for m in model.modules() if getattr(m, "readout_last_block", False)]
    for m in backbones:
        m.readout_last_block = False
    try:
        yield model
    finally:
        for m in backbones:
            m.readout_last_block = True


def position_means(
    model: nn.Module, batches: list[tuple[np.ndarray, ...]], width: int, dtype: str = "float32"
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``{name: (shift, scale, moved)}`` for :class:`Centred`, over ``batches``: each projection's
    mean input at each of ``width`` positions, ``(width, d)``; the largest departure from it there,
    ``(width, 1)``; and ``module(shift) - scale * module(0)``, by the float32 projections. Positions no
    row reaches get the values over all positions; projections fed anything but ``(B, T, d)`` rows are
    left out.

    One pass with the model computing in ``dtype`` (:func:`computing_in`), keeping per position and
    feature only the sum, the least and the largest input: ``max(largest - mean, mean - least)`` is the
    largest departure exactly, since float rounding is monotone."""
    found = projections(model)
    total: dict[str, torch.Tensor] = {}
    count: dict[str, torch.Tensor] = {}
    least: dict[str, torch.Tensor] = {}
    most: dict[str, torch.Tensor] = {}
    flat: set[str] = set()

    def add(name: str, x: torch.Tensor) -> None:
        t = x.shape[1]
        if name not in total:
            total[name] = torch.zeros(width, x.shape[-1], dtype=torch.float64)
            count[name] = torch.zeros(width, 1, dtype=torch.float64)
            least[name] = torch.full((width, x.shape[-1]), torch.inf)
            most[name] = torch.full((width, x.shape[-1]), -torch.inf)
        total[name][:t] += x.double().sum(0)
        count[name][:t] += x.shape[0]
        torch.minimum(least[name][:t], x.amin(0).float(), out=least[name][:t])
        torch.maximum(most[name][:t], x.amax(0).float(), out=most[name][:t])

    with computing_in(model, dtype):
        _observe(model, found, batches, width, add, flat)
    tables = {}
    with torch.inference_mode():
        for name in sorted(set(total) - flat):
            seen = count[name] > 0
            shift = torch.where(
                seen, total[name] / count[name].clamp(min=1), total[name].sum(0) / count[name].sum()
            ).float()
            spread = torch.maximum(most[name] - shift, shift - least[name]).amax(1, keepdim=True)
            spread = torch.where(seen, spread, 0.0)
            scale = torch.where(seen, spread, spread.max()).float().clamp(min=1e-6)
            module = found[name]
            moved = module(shift) - scale * module(torch.zeros_like(shift[:1]))
            tables[name] = (shift.contiguous(), scale.contiguous(), moved.float().contiguous())
    return tables


def calibration_dtype() -> str:
    """The float dtype the int8 engines' calibration pass computes in: this CPU's fastest
    (:func:`reservoir.runtime.dtypes.choose`)."""
    return choose_dtype("cpu")[0]


@contextlib.contextmanager
def computing_in(model: nn.Module, dtype: str):
    """``model`` with every :class:`reservoir.model.reservoir.Reservoir` in it computing in ``dtype``
    (the input layer stays float32), its float32 weights and buffers put back after."""
    from reservoir.model.reservoir import Reservoir

    inner = [m for m in model.modules() if isinstance(m, Reservoir)]
    if dtype == "float32" or not inner:
        yield model
        return
    kept = [
        (owner, kind, key, tensor)
        for r in inner
        for owner in r.backbone.modules()
        for kind in ("_parameters", "_buffers")
        for key, tensor in getattr(owner, kind).items()
        if tensor is not None
    ]
    data = [t.data for *_, t in kept]
    computed = [r.compute_dtype for r in inner]
    try:
        for r in inner:
            r.to_compute(getattr(torch, dtype))
        yield model
    finally:
        for (owner, kind, key, tensor), d in zip(kept, data):
            tensor.data = d
            getattr(owner, kind)[key] = tensor
        for r, c in zip(inner, computed):
            r.compute_dtype = c


def _observe(
    model: nn.Module,
    found: dict[str, nn.Module],
    batches: list[tuple[np.ndarray, ...]],
    width: int,
    see: Callable[[str, torch.Tensor], None],
    flat: set[str],
) -> None:
    """Run ``model`` (whole blocks) on ``batches``, calling ``see(name, input)`` for each projection
    in ``found`` fed ``(B, T <= width, d)`` rows; names fed anything else go into ``flat``."""

    def hook(name):
        def call(module, args):
            x = args[0]
            if x.dim() != 3 or x.shape[1] > width:
                flat.add(name)
            else:
                see(name, x.detach())

        return call

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in found.items()]
    try:
        with whole_blocks(model), torch.inference_mode():
            for batch in batches:
                model(*(torch.from_numpy(np.asarray(t)) for t in batch))
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def centred(
    model: nn.Module, shifts: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], whole: bool = False
):
    """``model`` with the projections named in ``shifts`` wrapped in :class:`Centred`, restored after
    (``whole``: whole last blocks, :func:`whole_blocks`)."""
    swapped = []
    for name, tables in shifts.items():
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        swapped.append((owner, child, getattr(owner, child)))
        setattr(owner, child, Centred(swapped[-1][2], *tables))
    try:
        with whole_blocks(model) if whole else contextlib.nullcontext():
            yield model
    finally:
        for owner, child, module in swapped:
            setattr(owner, child, module)


def readout_of(module: nn.Module) -> str | None:
    """The readout of an engine's module (:class:`~reservoir.model.reservoir.FixedDepths`)."""
    return getattr(getattr(module, "reservoir", None), "readout", None)


class ConvertedForward:
    """What the converting engines' forwards share: ``(tokens, lengths, readout) -> (B, n_depths, n_readout, d)``
    float32, the module converted and checked against PyTorch at the first call (:meth:`prepare`), then run
    (:meth:`_infer`). ``eager`` is the float32 PyTorch module; ``calibration`` (the int8 dtypes) returns the
    calibration batches as numpy arrays, ``width`` is the widest rows it will be called with (the int8 tables'
    length), ``fixed_width``: every row spans ``width`` positions (a task of fixed length), ``centre_dtype``
    the float dtype the int8 centring computes in (``None``: this CPU's fastest)."""

    def __init__(
        self,
        eager: nn.Module,
        dtype: str,
        threads: int,
        calibration: Callable[[], list[tuple[np.ndarray, ...]]] | None = None,
        log: Callable[[str], None] | None = None,
        width: int | None = None,
        fixed_width: bool = False,
        centre_dtype: str | None = None,
    ):
        if dtype in INT8_DTYPES and calibration is None:
            raise UsageError(
                f"--dtype {dtype} needs calibration rows; this caller gives none (use --dtype auto)"
            )
        if dtype in INT8_DTYPES and not width:
            raise ValueError(f"--dtype {dtype} needs the widest row width (the per-position tables' length)")
        self.eager, self.dtype, self.threads, self.width = eager, dtype, threads, width
        self.calibration, self.log = calibration, log or (lambda text: None)
        self.fixed_width, self.centre_dtype = fixed_width, centre_dtype
        #: the ``mean`` readout: a readout column a position, as wide as the tokens
        self.every_position = readout_of(eager) == "mean"
        self.request: Any = None
        self.seconds: dict[str, float] = {}
        self.error: float | None = None

    def example(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The rows to convert from (:func:`narrow`): rows of one width (a task of fixed length) at that width,
        since a graph may depend on it (a vision model's grid); else cut to :data:`EXAMPLE_WIDTH` tokens."""
        return narrow(batch, batch[0].shape[1] if self.fixed_width else None, self.every_position)

    def check_rows(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The first rows of ``batch`` checked against PyTorch: :data:`CHECK_ROWS`, or about :data:`CHECK_TOKENS` tokens."""
        return tuple(t[: max(1, min(CHECK_ROWS, CHECK_TOKENS // batch[0].shape[1]))] for t in batch)

    def compare(self, ours: np.ndarray, rows: tuple[torch.Tensor, ...]) -> float:
        """:attr:`error`: ``ours``, the features of ``rows``, against PyTorch's eager float32 forward's
        (:func:`relative_error`)."""
        with torch.inference_mode():
            ref = self.eager(*rows).float().numpy()
        self.error = relative_error(ours, ref)
        return self.error

    def accept(self, engine: str, rows: int, source: str = "") -> None:
        """Log the conversion's steps and :attr:`error` on ``rows`` rows (``source``: where the graph came
        from); beyond the dtype's :data:`TOLERANCE`, drop the request and raise
        :class:`reservoir.errors.BackboneError` naming ``--engine torch``."""
        steps = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        self.log(
            f"{engine}: {source + '; ' if source else ''}{steps}; features within {self.error:.1e} of PyTorch "
            f"float32 on {rows} rows"
        )
        if not self.error <= TOLERANCE[self.dtype]:
            self.request = None
            raise BackboneError(
                f"the {ENGINES[engine].label} engine's features differ from PyTorch's by {self.error:.2g} (relative, "
                f"worst depth; at most {TOLERANCE[self.dtype]:g} is accepted for {self.dtype}); pass --engine torch"
            )

    def prepare(self, batch: tuple[torch.Tensor, ...]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _infer(self, args: Sequence[torch.Tensor]) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
        if self.request is None:
            self.prepare((tokens, lengths, readout))
        return self._infer((tokens, lengths, readout))


def narrow(
    batch: tuple[torch.Tensor, ...], width: int | None = None, every_position: bool = False
) -> tuple[torch.Tensor, ...]:
    """Two rows of ``(tokens, lengths, readout)`` cut to ``width`` tokens (:data:`EXAMPLE_WIDTH`),
    lengths and readout positions moved inside the cut (``every_position``: a readout of every position, the
    ``mean`` readout's, cut with the tokens); the batch's own two rows if narrower, padded to
    :data:`MIN_EXAMPLE_WIDTH` tokens where the width varies. A batch of one row gives it twice: an exporter fixes
    an axis its example has as 1."""
    tokens, lengths, readout = (t[:2] if len(t) > 1 else t.repeat(2, *[1] * (t.dim() - 1)) for t in batch)
    if width is None and tokens.shape[1] < MIN_EXAMPLE_WIDTH:  # padded past the rows' lengths: never read
        more = MIN_EXAMPLE_WIDTH - tokens.shape[1]
        tokens = torch.cat([tokens, tokens.new_zeros((len(tokens), more, *tokens.shape[2:]))], dim=1)
        if every_position:
            readout = torch.cat([readout, readout[:, -1:].repeat(1, more)], dim=1)
    width = width or EXAMPLE_WIDTH
    if tokens.shape[1] <= width:
        return tokens, lengths, readout
    shift = (readout.max(dim=1).values + 1 - width).clamp(min=0)
    readout = (readout - shift[:, None]).clamp(min=0)
    return (
        tokens[:, :width].contiguous(),
        (lengths - shift).clamp(min=1, max=width),
        readout[:, -width:].contiguous() if every_position else readout,
    )


def precision(dtype: str):
    """OpenVINO's inference precision for ``dtype``: a float dtype itself, :data:`INT8_FLOAT` for
    ``int8``, this CPU's fastest float dtype for ``int8-static``."""
    ov = import_openvino()

    floats = {"float32": ov.Type.f32, "bfloat16": ov.Type.bf16, "float16": ov.Type.f16}
    if dtype in floats:
        return floats[dtype]
    return floats[INT8_FLOAT if dtype == "int8" else choose_dtype("cpu")[0]]


def cpu_config(dtype: str, threads: int, streams: int = 1) -> dict[Any, Any]:
    """OpenVINO's CPU plugin settings for ``dtype`` (:func:`precision`) on ``threads`` threads, split among
    ``streams`` streams (one: latency mode)."""
    props = import_openvino().properties
    config: dict[Any, Any] = {
        props.inference_num_threads: threads,
        props.hint.performance_mode: props.hint.PerformanceMode.THROUGHPUT
        if streams > 1
        else props.hint.PerformanceMode.LATENCY,
        props.hint.inference_precision: precision(dtype),
    }
    if streams > 1:
        config[props.num_streams] = streams
    if dtype == "int8":
        # OpenVINO 2024 parses only a string as unsigned
        config[props.hint.dynamic_quantization_group_size] = str(DYNAMIC_GROUP)
    return config


def relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    """Norm-wise relative error of ``(B, n_depths, ...)`` features, worst depth."""
    ours, ref = ours.reshape(len(ours), ours.shape[1], -1), ref.reshape(len(ref), ref.shape[1], -1)
    num = np.linalg.norm((ours - ref).transpose(1, 0, 2).reshape(ref.shape[1], -1), axis=1)
    den = np.linalg.norm(ref.transpose(1, 0, 2).reshape(ref.shape[1], -1), axis=1)
    return float(np.max(num / np.maximum(den, 1e-30)))


def one_line(e: BaseException) -> str:
    """An exception as ``Type: first line`` (at most 240 characters)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:240]


@contextlib.contextmanager
def quiet(*loggers: str):
    """The converters' and quantizers' chatter (progress bars, tables, warnings, the records of ``loggers``)
    kept off the terminal, and their usage telemetry declined (:func:`decline_telemetry`)."""
    decline_telemetry()
    levels = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
            quiet_transformers(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def import_openvino():
    """The ``openvino`` module, imported with its usage telemetry declined (its import sends an event)."""
    decline_telemetry()
    import openvino

    return openvino


@functools.cache
def decline_telemetry() -> None:
    """Send no usage telemetry from this process unless its user opted in.

    OpenVINO's import and converter and NNCF send an event per call unless a consent file opts out (with no
    file they send), each from a process forked by a thread pool: beside torch's threads such a fork can hang the run.
    Here no file counts as declined; a user's consent file (``opt_in_out --opt_in``) still decides. ONNX
    Runtime's telemetry is declined through ``ORT_DISABLE_TELEMETRY``, unless the environment sets it."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return
    check = OptInChecker.check

    def declined_without_a_file(self, *args, **kwargs):
        result = check(self, *args, **kwargs)
        return ConsentCheckResult.DECLINED if result == ConsentCheckResult.NO_FILE else result

    OptInChecker.check = declined_without_a_file

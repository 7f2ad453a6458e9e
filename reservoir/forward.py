"""The one forward path: frozen input layer -> backbone -> readout tokens at each depth.

``extract``, ``train`` and the scikit-learn transformer all build their model here, so the
features a file stores, the untrained end-to-end model and ``ReservoirFeatures`` are the
same numbers (tests check it).

- The **depth convention** is the backbones' (:mod:`reservoir.backbones`): depth ``k`` is
  the backbone truncated to its first ``k`` blocks, final norm included; depth 0 is the
  embedded input through that norm.
- The **readout rule** is :func:`readout_positions`: the last ``n_readout`` real tokens of
  each row, or with ``padded`` the last positions of rows padded to the task's length (the
  official FPT code's readout, which depends on padding).
- **Compilation** is :class:`CompiledOrEager`: torch.compile when asked, eager with a
  message when compiling or the compiled call fails.
- :class:`FeatureRunner` turns token batches into float32 feature arrays for extraction:
  compute dtype, static shapes for the compiled graph, padding rows dropped.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch import nn

from reservoir.backbones import Backbone, freeze
from reservoir.engines import INT8_DTYPES, OpenVINOForward, choose_engine
from reservoir.errors import BackboneError, UsageError
from reservoir.input_layer import make_input_layer
from reservoir.tasks import TaskSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: compiled variable-length batches are padded to a multiple of this many tokens
WIDTH_MULTIPLE = 64
#: batches whose time a :class:`FeatureRunner` keeps (the compile decision's measurements)
TIMED_BATCHES = 64


def resolve_device(name: str) -> torch.device:
    """``auto`` -> the first CUDA device when one is present, else the CPU; ``cpu``, ``cuda``,
    ``cuda:N`` and ``mps`` as asked, or DeviceError naming what this machine has."""
    from reservoir.config import check_device
    from reservoir.errors import DeviceError

    check_device("--device", name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= found:
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise DeviceError(f"--device {name}: this machine has {found} CUDA device(s) (torch {torch.__version__}, "
                              f"{build}); use --device cpu, or auto to take a GPU when there is one")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceError("--device mps: Apple's Metal backend is not available here; use --device cpu or auto")
    return torch.device(name)


def bf16_native() -> bool:
    """Whether this CPU has native bf16 matrix products (oneDNN with AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


def resolve_dtype(name: str, device: torch.device | str = "cpu") -> str:
    """``"auto"`` -> ``"bfloat16"`` where the device multiplies bf16 natively (a CPU with
    AVX512-BF16 or AMX, a CUDA GPU with bf16 support), else ``"float32"``; the int8 dtypes of
    the OpenVINO engine (:mod:`reservoir.engines`) as they are."""
    if name == "auto":
        kind = torch.device(device).type
        if kind == "cuda":
            return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
        return "bfloat16" if kind == "cpu" and bf16_native() else "float32"
    if name not in DTYPES and name not in INT8_DTYPES:
        raise UsageError(f"dtype {name!r} is not supported; choose from {['auto', *DTYPES, *INT8_DTYPES]}")
    return name


def readout_positions(lengths: torch.Tensor, n_readout: int, width: int | None = None) -> torch.Tensor:
    """The readout rule, defined once: positions ``(B, n_readout)`` of the last ``n_readout`` real
    tokens of each row, or (``width`` given, the padded readout) of the last ``n_readout``
    positions of rows padded to ``width``."""
    last = lengths if width is None else torch.full_like(lengths, width)
    return last[:, None] - n_readout + torch.arange(n_readout, device=lengths.device)[None, :]


def check_length(spec: TaskSpec, backbone: Backbone, backbone_name: str) -> None:
    """Refuse, before anything runs, a task longer than the backbone's positions."""
    limit = getattr(backbone, "max_positions", None)
    if limit is not None and spec.seq_len > limit:
        raise BackboneError(
            f"task {spec.name!r} has sequences of up to {spec.seq_len} tokens, but backbone {backbone_name!r} reads at "
            f"most {limit} positions; shorten the task (e.g. --task-opt max_len={limit} where the task has it) or "
            "choose a backbone with more positions")


class Reservoir(nn.Module):
    """Frozen input layer -> dropout -> backbone -> hidden states of the readout tokens.

    Parameters
    ----------
    spec : the task's spec (token kind and width or vocabulary, readout count).
    backbone : the backbone (its blocks run up to the deepest requested depth).
    seed : seeds the input layer (:func:`reservoir.input_layer.make_input_layer`).
    input_scale : the input layer's scale (``"paper"``, ``"matched"`` or a std as text).
    dropout : after the input layer (training only; 0 for extraction).

    ``forward(tokens, lengths, depths, readout=None)`` returns ``(B, n_depths, n_readout, d)``
    in the backbone's dtype; ``readout=None`` reads the last real tokens.
    """

    def __init__(self, spec: TaskSpec, backbone: Backbone, *, seed: int, input_scale: str = "paper",
                 dropout: float = 0.0):
        super().__init__()
        self.spec = spec
        self.input_layer = make_input_layer(spec, backbone.d_model, seed, input_scale,
                                            getattr(backbone, "token_std", None))
        self.dropout = nn.Dropout(dropout)
        self.backbone = backbone
        self.compute_dtype = torch.float32

    def to_compute(self, dtype: torch.dtype) -> "Reservoir":
        """Run the backbone in ``dtype``; the input layer stays float32."""
        self.backbone.to(dtype)
        self.compute_dtype = dtype
        return self

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, depths: Sequence[int],
                readout: torch.Tensor | None = None) -> torch.Tensor:
        if readout is None:
            readout = readout_positions(lengths, self.spec.n_readout)
        x = self.dropout(self.input_layer(tokens)).to(self.compute_dtype)
        return self.backbone(x, lengths, depths, readout)


class FixedDepths(nn.Module):
    """``reservoir`` reading ``depths``, features as float32: ``(tokens, lengths, readout) -> (B,
    n_depths, n_readout, d)``, the module an engine runs."""

    def __init__(self, reservoir: Reservoir, depths: Sequence[int]):
        super().__init__()
        self.reservoir, self.depths = reservoir, tuple(depths)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
        return self.reservoir(tokens, lengths, self.depths, readout).float()


class CompiledOrEager:
    """``fn`` under ``torch.compile`` when ``enabled``; if compiling or a compiled call fails, the
    eager ``fn`` from then on, with one message on stderr.

    ``compiled`` says which runs; :meth:`fall_back` switches by hand (training calls it when
    the backward pass of a compiled graph fails).
    """

    def __init__(self, fn: Callable, enabled: bool, *, hint: str = "", **compile_kwargs: Any):
        self.eager = self.fn = fn
        self.compiled = False
        self.hint = hint
        if enabled:
            from reservoir.compiling import use_persistent_cache

            use_persistent_cache()
            try:
                self.fn, self.compiled = torch.compile(fn, **compile_kwargs), True
            except Exception as e:  # noqa: BLE001 - compilation is an optimisation, eager always works
                self.fall_back(e)

    def fall_back(self, e: BaseException) -> None:
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"torch.compile failed ({type(e).__name__}: {first}); running eager{self.hint}", file=sys.stderr)
        self.fn, self.compiled = self.eager, False

    def __call__(self, *args, **kwargs):
        if not self.compiled:
            return self.eager(*args, **kwargs)
        try:
            return self.fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            self.fall_back(e)
            return self.eager(*args, **kwargs)


class Pending(NamedTuple):
    """Features being copied from the GPU into pinned host memory; :func:`resolve` waits for them."""

    host: torch.Tensor
    done: Any  # torch.cuda.Event


def resolve(features: "np.ndarray | Pending") -> np.ndarray:
    """The features as a numpy array (waiting for a GPU copy to finish)."""
    if isinstance(features, Pending):
        features.done.synchronize()
        return features.host.numpy()
    return features


def round_width(width: int, seq_len: int, multiple: int = WIDTH_MULTIPLE) -> int:
    """``width`` rounded up to ``multiple``, but never past the task's length (positions run out there)."""
    return max(width, min(-(-width // multiple) * multiple, seq_len))


class Batch(NamedTuple):
    """Model inputs of one batch; rows past ``n`` are padding whose outputs are dropped."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    readout: torch.Tensor
    n: int


class FeatureRunner:
    """Tokens -> per-depth readout features ``(B, n_depths, n_readout, d)`` as float32 numpy.

    Parameters
    ----------
    reservoir : the frozen input layer and backbone (:class:`Reservoir`); its backbone is
        converted to ``dtype`` in place.
    depths : depths to read; only blocks up to the deepest run.
    dtype : ``"auto"``, ``"bfloat16"`` or ``"float32"`` compute; ``"int8"`` or ``"int8-static"``
        on the OpenVINO engine.
    compile : compile the forward with inductor (weight freezing); eager if that fails (the
        ``torch`` engine only).
    batch_size : when compiling, smaller batches are padded to this many rows so one graph serves.
    device : where the backbone runs (:func:`resolve_device`); batches are prepared on the CPU
        (pinned for CUDA) and features come back as CPU arrays.
    engine : ``"torch"``, ``"openvino"`` or ``"auto"`` (:func:`reservoir.engines.choose_engine`;
        auto runs PyTorch when OpenVINO cannot convert the model or its check fails).
    tokens : tokens the run will extract (``engine="auto"`` takes OpenVINO for long runs only).
    padded : the padded readout (``reservoir extract --readout padded``), for calibration batches.
    calibration : the int8 dtypes only: returns the calibration batches as ``(tokens, lengths)``.
    log : where the runner reports (the OpenVINO engine's conversion costs, a fallback);
        stderr by default.

    Examples
    --------
    >>> runner = FeatureRunner.build(spec, backbone, [0, 6, 12], seed=0, dtype="auto")   # doctest: +SKIP
    >>> runner(tokens, lengths).shape                                                     # doctest: +SKIP
    (32, 3, 1, 768)
    """

    def __init__(self, reservoir: Reservoir, depths: Sequence[int], dtype: str, compile: bool = False, *,
                 batch_size: int | None = None, device: torch.device | str = "cpu", engine: str = "auto",
                 tokens: int | None = None, padded: bool = False,
                 calibration: Callable[[], list[tuple[np.ndarray, np.ndarray]]] | None = None,
                 log: Callable[[str], None] | None = None):
        self.spec, self.depths = reservoir.spec, tuple(depths)
        reservoir.backbone.check_depths(self.depths)
        self.device = torch.device(device)
        self.dtype_name = resolve_dtype(dtype, self.device)
        self.engine, self.engine_reason = choose_engine(engine, self.dtype_name, self.device, reservoir.backbone,
                                                        tokens)
        #: ``engine="auto"`` runs PyTorch when OpenVINO cannot convert or check (an explicit engine fails)
        self.falls_back = engine == "auto" and self.dtype_name in DTYPES
        self.log = log or (lambda text: print(text, file=sys.stderr))
        self.reservoir = freeze(reservoir.float()).eval().to(self.device)
        self.backbone = self.reservoir.backbone
        self.batch_size = batch_size
        #: ``(real tokens, seconds, compiled)`` of the first :data:`TIMED_BATCHES` CPU batches, for the
        #: compile decision (:mod:`reservoir.compiling`)
        self.timings: list[tuple[int, float, bool]] = []
        if self.engine == "openvino":
            batches = None if calibration is None else \
                (lambda: [tuple(t.numpy() for t in self.prepare(x, n, padded)[:3]) for x, n in calibration()])
            self.forward = OpenVINOForward(FixedDepths(self.reservoir, self.depths), self.dtype_name,
                                           torch.get_num_threads(), batches, self.log, width=self.spec.seq_len,
                                           fixed_width=not self.spec.variable_length)
        else:
            self._use_torch()
        if compile:
            self.enable_compile()

    def _use_torch(self) -> None:
        self.reservoir.to_compute(DTYPES[self.dtype_name])
        self.engine = "torch"
        self.forward = CompiledOrEager(FixedDepths(self.reservoir, self.depths), False)

    def _call(self, *args: torch.Tensor) -> torch.Tensor:
        try:
            return self.forward(*args)
        except BackboneError as e:  # OpenVINO could not convert or check, on the first batch
            if not (self.engine == "openvino" and self.falls_back):
                raise
            self.log(f"{e}: running PyTorch eager instead")
            self._use_torch()
            self.engine_reason = f"auto: OpenVINO failed ({e})"
            return self.forward(*args)

    def enable_compile(self) -> None:
        """Compile the forward (inductor, weight freezing) from now on; batches prepared after this
        are padded to the compiled shape. Eager, with a message, if compiling fails. The OpenVINO
        engine compiles in its own way and ignores this."""
        if self.engine == "torch" and not self.compiled:
            self.forward = CompiledOrEager(self.forward.eager, True, hint=" (pass --no-compile to skip compiling)",
                                           options={"freezing": True})

    @classmethod
    def build(cls, spec: TaskSpec, backbone: Backbone, depths: Sequence[int], *, seed: int, dtype: str,
              input_scale: str = "paper", compile: bool = False, batch_size: int | None = None,
              device: torch.device | str = "cpu", **kwargs: Any) -> "FeatureRunner":
        """The runner of a seeded :class:`Reservoir` over ``backbone`` (``kwargs``: ``engine``,
        ``tokens``, ``padded``, ``calibration``, ``log``)."""
        return cls(Reservoir(spec, backbone, seed=seed, input_scale=input_scale), depths, dtype, compile,
                   batch_size=batch_size, device=device, **kwargs)

    @property
    def compiled(self) -> bool:
        return getattr(self.forward, "compiled", False)

    def prepare(self, tokens: np.ndarray, lengths: np.ndarray, padded: bool = False) -> Batch:
        """Model inputs for a batch (thread-safe: runs on the prefetch thread).

        Compiled runs pad the batch to ``batch_size`` rows and variable-length widths to a
        multiple of :data:`WIDTH_MULTIPLE`, so the graph is reused.
        """
        n, width = tokens.shape[0], tokens.shape[1]
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.compiled:
            rows = max(n, self.batch_size or n)
            wide = round_width(width, self.spec.seq_len) if self.spec.variable_length and not padded else width
            if (rows, wide) != (n, width):
                fill = self.spec.pad_id if tokens.dtype.kind in "iu" else 0
                grown = np.full((rows, wide, *tokens.shape[2:]), fill, dtype=tokens.dtype)
                grown[:n, :width] = tokens
                tokens, width = grown, wide
                lengths = np.concatenate([lengths, np.full(rows - n, wide, dtype=np.int64)])
        lengths_t = torch.from_numpy(lengths)
        readout = readout_positions(lengths_t, self.spec.n_readout, width if padded else None)
        tokens_t = torch.from_numpy(np.ascontiguousarray(tokens))
        if self.device.type == "cuda":  # page-locked, so the copy to the GPU overlaps compute
            tokens_t, lengths_t, readout = tokens_t.pin_memory(), lengths_t.pin_memory(), readout.pin_memory()
        return Batch(tokens_t, lengths_t, readout, n)

    @torch.inference_mode()
    def run(self, batch: Batch) -> np.ndarray:
        """Features ``(n, n_depths, n_readout, d)`` of the batch's real rows (as float32 numpy)."""
        return resolve(self.run_async(batch))

    @torch.inference_mode()
    def run_async(self, batch: Batch) -> "np.ndarray | Pending":
        """As :meth:`run`, but on a GPU the copy back to (pinned) host memory is only started: the
        result is a :class:`Pending` that the writer thread resolves while the next batch runs."""
        args = [t.to(self.device, non_blocking=True) for t in (batch.tokens, batch.lengths, batch.readout)]
        start = time.perf_counter()
        out = self._call(*args)[: batch.n]
        if self.device.type != "cuda":
            features = out.cpu().numpy()
            if len(self.timings) < TIMED_BATCHES:  # a long-lived runner (the API's) keeps no growing log
                self.timings.append((int(batch.lengths[: batch.n].sum()), time.perf_counter() - start, self.compiled))
            return features
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Pending(host, done)

    def __call__(self, tokens: np.ndarray, lengths: np.ndarray, padded: bool = False) -> np.ndarray:
        return self.run(self.prepare(tokens, lengths, padded))

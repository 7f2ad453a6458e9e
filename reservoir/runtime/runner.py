"""Running the frozen forward for extraction: :class:`FeatureRunner` turns token batches into float32
feature arrays, choosing the compute dtype, the engine (:mod:`reservoir.runtime.engines`) and whether to
compile (:class:`CompiledOrEager`), padding batches to static shapes and dropping the padding rows.

On a CUDA device, batches go through reused page-locked buffers (:class:`PinnedPool`), everything runs
on the device's current stream, and features come back as a :class:`Pending` copy: nothing in the batch
loop may wait for the device except the first batch's timing.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from reservoir.errors import BackboneError, UsageError
from reservoir.model.backbones import Backbone, freeze
from reservoir.model.devices import DTYPES
from reservoir.model.reservoir import FixedDepths, Reservoir, readout_index
from reservoir.runtime import records
from reservoir.runtime.dtypes import choose as choose_dtype
from reservoir.runtime.dtypes import strict_float32
from reservoir.runtime.engines import (
    ENGINE_RATES,
    ENGINES,
    INT8_DTYPES,
    MEASURE_MIN_ROWS,
    auto_candidates,
    choose_engine,
    engine_key,
    faster_engine,
    measured_reason,
    pays,
)
from reservoir.tasks import TaskSpec

#: compiled variable-length batches are padded to a multiple of this many tokens
WIDTH_MULTIPLE = 64
#: batches whose time a :class:`FeatureRunner` keeps (the compile decision's measurements)
TIMED_BATCHES = 64
#: free page-locked buffers a :class:`PinnedPool` keeps per shape: the batches in flight, with room to spare
PINNED_KEEP = 8


def resolve_dtype(name: str, device: torch.device | str = "cpu", engine: str = "auto") -> str:
    """``"auto"`` -> the float dtype this device multiplies fastest (:func:`reservoir.runtime.dtypes.choose`),
    float32 where the ``engine`` asked for computes no other; the float and int8 dtypes as they are."""
    if name == "auto":
        fastest = choose_dtype(device)[0]
        computes = ENGINES[engine].dtypes if engine in ENGINES else (fastest,)
        return fastest if fastest in computes else "float32"
    if name not in DTYPES and name not in INT8_DTYPES:
        raise UsageError(f"dtype {name!r} is not supported; choose from {['auto', *DTYPES, *INT8_DTYPES]}")
    return name


def low_precision(module: torch.nn.Module) -> bool:
    """Whether ``module``'s floating tensors are kept in a 16-bit dtype (weights loaded with ``--load-dtype``)."""
    tensors = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
    return bool(tensors) and all(t.dtype in (torch.bfloat16, torch.float16) for t in tensors)


class CompiledOrEager:
    """``fn`` under ``torch.compile`` when ``enabled``; if compiling or a compiled call fails, the
    eager ``fn`` from then on, with one message on stderr.

    ``compiled`` says which runs; :meth:`fall_back` switches by hand (training, when a compiled backward fails).
    """

    def __init__(self, fn: Callable, enabled: bool, *, hint: str = "", **compile_kwargs: Any):
        self.eager = self.fn = fn
        self.compiled = False
        self.hint = hint
        if enabled:
            from reservoir.runtime.compiling import use_persistent_cache

            use_persistent_cache()
            try:
                self.fn, self.compiled = torch.compile(fn, **compile_kwargs), True
            except Exception as e:  # noqa: BLE001 - compilation is an optimisation, eager always works
                self.fall_back(e)

    def fall_back(self, e: BaseException) -> None:
        first = str(e).splitlines()[0] if str(e) else ""
        print(
            f"torch.compile failed ({type(e).__name__}: {first}); running eager{self.hint}", file=sys.stderr
        )
        self.fn, self.compiled = self.eager, False

    def __call__(self, *args, **kwargs):
        if not self.compiled:
            return self.eager(*args, **kwargs)
        try:
            return self.fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            self.fall_back(e)
            return self.eager(*args, **kwargs)


class PinnedPool:
    """Reused page-locked host buffers, so a batch in flight never allocates one.

    :meth:`take` lends a buffer of at least the rows asked for; :meth:`give` returns it with the CUDA
    event after which it is free, and it is lent again only once that event has completed. At most
    ``keep`` free buffers are kept per row shape and dtype. Thread-safe (the prefetch thread takes, the
    writer's gives back); ``pin=False`` lends ordinary memory.
    """

    def __init__(self, pin: bool = True, keep: int = PINNED_KEEP):
        self.pin, self.keep = pin, keep
        self.free: dict[tuple, list[tuple[torch.Tensor, Any]]] = {}
        self.lent: dict[int, torch.Tensor] = {}
        self.allocated = 0
        self.lock = threading.Lock()

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        rows, key = shape[0], (tuple(shape[1:]), dtype)
        with self.lock:
            kept = self.free.setdefault(key, [])
            found = next(
                (
                    i
                    for i, (buf, ready) in enumerate(kept)
                    if len(buf) >= rows and (ready is None or ready.query())
                ),
                None,
            )
            if found is None:
                buf = torch.empty(tuple(shape), dtype=dtype, pin_memory=self.pin)
                self.allocated += 1
            else:
                buf = kept.pop(found)[0]
            view = buf[:rows]
            self.lent[view.data_ptr()] = buf
        return view

    def give(self, view: torch.Tensor, ready: Any = None) -> None:
        """Return a buffer :meth:`take` lent (a buffer given back twice is kept once)."""
        with self.lock:
            buf = self.lent.pop(view.data_ptr(), None)
            if buf is None:
                return
            kept = self.free.setdefault((tuple(buf.shape[1:]), buf.dtype), [])
            kept.append((buf, ready))
            del kept[: -self.keep]

    def copy_in(self, array: np.ndarray) -> torch.Tensor:
        """A lent buffer holding ``array``."""
        source = torch.from_numpy(np.ascontiguousarray(array))
        return self.take(source.shape, source.dtype).copy_(source)


class Pending(NamedTuple):
    """Features being copied from the GPU into a pinned host buffer; :func:`resolve` waits for them
    and returns the buffer to ``pool``."""

    host: torch.Tensor
    done: Any  # torch.cuda.Event, recorded on the device's stream after the copy
    pool: PinnedPool | None = None


def resolve(features: np.ndarray | Pending) -> np.ndarray:
    """The features as a numpy array, waiting for a GPU copy to finish and lending its buffer again."""
    if isinstance(features, Pending):
        features.done.synchronize()
        array = features.host.numpy().copy()
        if features.pool is not None:
            features.pool.give(features.host)
        return array
    return features


def stored(features: torch.Tensor, store: str) -> torch.Tensor:
    """``features`` rounded to ``store`` (a ``--store-dtype``, :data:`~reservoir.model.devices.DTYPES`) where they
    are, bfloat16 viewed as int16 (numpy has no bfloat16)."""
    out = features.to(DTYPES[store])
    return out.view(torch.int16) if store == "bfloat16" else out


def round_width(width: int, seq_len: int, multiple: int = WIDTH_MULTIPLE) -> int:
    """``width`` rounded up to ``multiple``, but never past the task's length (positions run out there)."""
    return max(width, min(-(-width // multiple) * multiple, seq_len))


class Batch(NamedTuple):
    """Model inputs of one batch; rows past ``n`` are padding whose outputs are dropped. On CUDA the
    tensors are lent by the runner's :class:`PinnedPool` and returned once copied, so a batch runs once."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    readout: torch.Tensor
    n: int
    pinned: bool = False


class FeatureRunner:
    """Tokens -> per-depth readout features ``(B, n_depths, n_readout, d)`` as float32 numpy.

    Parameters
    ----------
    reservoir
        the frozen input layer and backbone (:class:`Reservoir`), converted to ``dtype`` in place.
    depths
        depths to read; only blocks up to the deepest run.
    dtype
        ``"auto"``, a float dtype, or ``"int8"`` / ``"int8-static"`` on a converting engine.
    compile
        compile the forward with inductor (the ``torch`` engine only); eager if that fails.
    batch_size
        when compiling, smaller batches are padded to this many rows so one graph serves.
    device
        where the backbone runs (:func:`reservoir.model.devices.resolve_device`); features come back on the CPU.
    engine
        ``"torch"``, ``"openvino"``, ``"onnxruntime"`` or ``"auto"`` (:func:`reservoir.runtime.engines.choose_engine`).
    tokens
        tokens the run will extract (``engine="auto"`` converts for long runs only).
    padded
        the padded readout (``reservoir extract --readout padded``), for calibration batches.
    calibration
        the int8 dtypes only: returns the calibration batches as ``(tokens, lengths)``.
    centre_dtype
        the int8 dtypes: the float dtype their centring pass computes in, as the run's identity records it
        (``None``: this CPU's fastest).
    log
        where the runner reports; stderr by default.
    store
        the dtype :meth:`run_async` hands features in (``--store-dtype``; bfloat16 as int16 bits).

    Examples
    --------
    >>> runner = FeatureRunner.build(spec, backbone, [0, 6, 12], seed=0, dtype="auto")   # doctest: +SKIP
    >>> runner(tokens, lengths).shape                                                     # doctest: +SKIP
    (32, 3, 1, 768)
    """

    def __init__(
        self,
        reservoir: Reservoir,
        depths: Sequence[int],
        dtype: str,
        compile: bool = False,
        *,
        batch_size: int | None = None,
        device: torch.device | str = "cpu",
        engine: str = "auto",
        tokens: int | None = None,
        padded: bool = False,
        calibration: Callable[[], list[tuple[np.ndarray, np.ndarray]]] | None = None,
        centre_dtype: str | None = None,
        log: Callable[[str], None] | None = None,
        store: str = "float32",
    ):
        self.spec, self.depths, self.readout = reservoir.spec, tuple(depths), reservoir.readout
        self.store = store
        reservoir.backbone.check_depths(self.depths)
        self.device = torch.device(device)
        self.dtype_name = resolve_dtype(dtype, self.device, engine)
        if self.device.type == "cuda" and self.dtype_name == "float32":
            strict_float32()
        on_cuda = self.device.type == "cuda"
        #: page-locked buffers for the batches' inputs and for the features copied back (CUDA only)
        self.inputs, self.outputs = PinnedPool(on_cuda), PinnedPool(on_cuda)
        self.engine, self.engine_reason = choose_engine(
            engine, self.dtype_name, self.device, reservoir.backbone, tokens
        )
        #: ``auto`` between float engines: the rates' key while the first batch is still to measure them
        #: (:meth:`_measure`), and the converting engines it measures
        self.measure_key: str | None = None
        self.candidates: list[str] = []
        #: a batch has run: the engine is settled (a later failure is an error, never a switch of engine)
        self.ran = False
        if engine == "auto" and self.converting and self.dtype_name in DTYPES:
            self._engine_by_measurement(reservoir.backbone, tokens)
        #: ``engine="auto"`` runs PyTorch when the converting engine cannot convert or check (an explicit engine fails)
        self.falls_back = engine == "auto" and self.dtype_name in DTYPES
        self.log = log or (lambda text: print(text, file=sys.stderr))
        # weights kept in bf16 or fp16 (--load-dtype) are never upcast whole
        if low_precision(reservoir.backbone):
            reservoir.input_layer.float()
            self.reservoir = freeze(reservoir).eval().to(self.device)
        else:
            self.reservoir = freeze(reservoir.float()).eval().to(self.device)
        self.backbone = self.reservoir.backbone
        self.batch_size = batch_size
        #: ``(real tokens, seconds or a CUDA (start, end) event pair, compiled)`` of the first
        #: :data:`TIMED_BATCHES` batches (:attr:`timings`)
        self._timed: list[tuple[int, Any, bool]] = []
        #: the compiled forward ran slower than eager in this run and was dropped (:meth:`keep_compile_if_faster`)
        self.compile_dropped = False
        self.centre_dtype = centre_dtype
        self.calibration_batches = (
            None
            if calibration is None
            else (
                lambda: [tuple(t.numpy() for t in self.prepare(x, n, padded)[:3]) for x, n in calibration()]
            )
        )
        if self.converting:
            self.forward = self._converting(self.engine)
        else:
            self._use_torch()
        if compile:
            self.enable_compile()

    @property
    def converting(self) -> bool:
        """The engine running now converts the module (not PyTorch itself)."""
        return ENGINES[self.engine].converts

    def _converting(self, engine: str) -> Any:
        """The forward of a converting engine (:meth:`reservoir.runtime.engines.Engine.forward`)."""
        return ENGINES[engine].forward(
            FixedDepths(self.reservoir, self.depths),
            self.dtype_name,
            torch.get_num_threads(),
            self.calibration_batches,
            self.log,
            width=self.spec.seq_len,
            fixed_width=not self.spec.variable_length,
            centre_dtype=self.centre_dtype,
        )

    def _engine_by_measurement(self, backbone: Backbone, tokens: int | None) -> None:
        """``auto``: the engine measured fastest for this CPU and model before, else the first converting
        engine for now and a measurement on the first batch."""
        self.candidates = auto_candidates(self.dtype_name, self.device, backbone, tokens)[0]
        key = engine_key(self.dtype_name, backbone, self.spec.seq_len, torch.get_num_threads())
        kept = records.get(ENGINE_RATES, key)
        if isinstance(kept, dict) and {"torch", *self.candidates} <= set(kept):
            rates = {e: kept[e] for e in ("torch", *self.candidates)}
            self.engine, self.engine_reason = faster_engine(rates), measured_reason(rates, "before")
            convert = kept.get("convert") or {}
            if not pays(rates, convert, self.engine, tokens):
                self.engine_reason = (
                    f"auto: PyTorch, as converting to {ENGINES[self.engine].label} (measured {convert[self.engine]:.1f} s) "
                    f"would not pay for itself over this run's {tokens:,} tokens ({self.engine_reason[6:]})"
                )
                self.engine = "torch"
        else:
            self.measure_key = key
            others = " and ".join(ENGINES[e].label for e in self.candidates[1:])
            self.engine_reason += (
                f"; {others + ' and ' if others else ''}PyTorch measured against it on the first batch"
            )

    def _measure(self, args: Sequence[torch.Tensor]) -> torch.Tensor:
        """Run the first batch on every candidate engine and PyTorch, keep the rates for this CPU and model,
        go on with the fastest and return its features; an engine that cannot convert or check is left out."""
        key, self.measure_key = self.measure_key, None
        tokens = int(args[1].sum())
        rates, outputs, forwards, failed, convert = {}, {}, {}, [], {}
        for engine in self.candidates:
            forward = self.forward if engine == self.engine else self._converting(engine)
            try:
                if forward.request is None:
                    begun = time.perf_counter()
                    forward.prepare(tuple(args))  # converting, compiling and checking are not the rate
                    convert[engine] = time.perf_counter() - begun  # the fixed cost a later run weighs
                forward(*args)  # its first call of this shape compiles it (OpenVINO): not the rate
                start = time.perf_counter()
                outputs[engine] = forward(*args)
                rates[engine] = tokens / (time.perf_counter() - start)
                forwards[engine] = forward
            except BackboneError as e:
                failed.append(f"{ENGINES[engine].label} failed ({e})")
                self.log(
                    f"{e}: "
                    + (
                        "measuring without it"
                        if len(failed) < len(self.candidates)
                        else "running PyTorch eager instead"
                    )
                )
        self.reservoir.to_compute(DTYPES[self.dtype_name])
        eager = CompiledOrEager(FixedDepths(self.reservoir, self.depths), False)
        eager(*args)  # its first call makes its kernels: not the rate
        start = time.perf_counter()
        outputs["torch"] = eager(*args)
        rates["torch"] = tokens / (time.perf_counter() - start)
        forwards["torch"] = eager
        if len(rates) > 1:  # a measurement without any converting engine says nothing about them
            records.put(ENGINE_RATES, key, {**rates, "convert": convert})
        self.engine = faster_engine(rates)
        self.forward = forwards[self.engine]
        self.engine_reason = (
            measured_reason(rates, "now, on the first batch")
            if len(rates) > 1
            else "auto: " + "; ".join(failed)
        )
        self.log(f"engine {self.engine} ({self.engine_reason})")
        return outputs[self.engine]

    def _use_torch(self) -> None:
        self.reservoir.to_compute(DTYPES[self.dtype_name])
        self.engine = "torch"
        self.forward = CompiledOrEager(FixedDepths(self.reservoir, self.depths), False)

    def _call(self, *args: torch.Tensor) -> torch.Tensor:
        try:
            if self.measure_key is not None and self.converting and len(args[0]) >= MEASURE_MIN_ROWS:
                out = self._measure(args)
            else:
                if self.measure_key is not None:  # too few rows to measure: this engine is the run's
                    self.measure_key = None
                    self.engine_reason += f" (not measured: a first batch of {len(args[0])} rows)"
                out = self.forward(*args)
            self.ran = True
            return out
        except BackboneError as e:  # the converting engine could not convert or check, on the first batch
            if not (self.converting and self.falls_back) or self.ran:  # never two engines in one run
                raise
            self.log(f"{e}: running PyTorch eager instead")
            failed = ENGINES[self.engine].label
            self._use_torch()
            self.engine_reason = f"auto: {failed} failed ({e})"
            return self.forward(*args)

    def enable_compile(self) -> None:
        """Compile the forward from now on (batches prepared after this are padded to the compiled shape);
        a converting engine ignores this."""
        if not self.converting and not self.compiled:
            self.forward = CompiledOrEager(
                self.forward.eager,
                True,
                hint=" (pass --no-compile to skip compiling)",
                options={"freezing": True},
            )

    def compile_costs(self) -> tuple[float, float | None] | None:
        """``(compile seconds, speedup)`` from this run's timed batches: the first compiled batch's time
        beyond the median's, and the compiled rate over the eager probe's (``None`` without a probe);
        ``None`` before three compiled batches."""
        timed = self.timings
        eager = [(t, s) for t, s, c in timed if not c]
        compiled = [(t, s) for t, s, c in timed if c]
        if len(compiled) < 3:
            return None
        per_token = float(np.median([s / t for t, s in compiled[1:]]))
        compile_s = max(compiled[0][1] - compiled[0][0] * per_token, 0.0)
        return compile_s, (1 / per_token) / (eager[0][0] / eager[0][1]) if eager else None

    def keep_compile_if_faster(self) -> bool | None:
        """Check the compile decision by this run's own batches: eager again from then on when the compiled
        batches ran slower than the eager probe (:meth:`compile_costs`). ``None``: not enough batches yet;
        ``True``: compiled kept; ``False``: dropped (:attr:`compile_dropped`)."""
        if not self.compiled or sum(c for *_, c in self._timed) < 4:  # counted before any CUDA wait
            return None
        _, speedup = self.compile_costs()
        if speedup is None or speedup >= 1:
            return True
        self.forward = CompiledOrEager(self.forward.eager, False)
        self.compile_dropped = True
        self.log(
            f"compiled: {speedup:.2f}x the eager probe's tokens/s, below eager's in this run; eager from here on"
        )
        return False

    @classmethod
    def build(
        cls,
        spec: TaskSpec,
        backbone: Backbone,
        depths: Sequence[int],
        *,
        seed: int,
        dtype: str,
        input_scale: str = "paper",
        input_layer: dict[str, Any] | None = None,
        compile: bool = False,
        batch_size: int | None = None,
        device: torch.device | str = "cpu",
        readout: str = "last",
        **kwargs: Any,
    ) -> FeatureRunner:
        """The one construction of a runner, shared by ``extract``, its shards and the Python API: a seeded
        :class:`Reservoir` over ``backbone`` reading ``readout`` (its input layer set to ``input_layer``'s
        tensors when given: a shard's worker takes the driver's), and the runner around it."""
        reservoir = Reservoir(spec, backbone, seed=seed, input_scale=input_scale, readout=readout)
        if input_layer is not None:
            reservoir.input_layer.load_state_dict(
                {k: torch.as_tensor(np.asarray(v)) for k, v in input_layer.items()}
            )
        return cls(reservoir, depths, dtype, compile, batch_size=batch_size, device=device, **kwargs)

    @property
    def compiled(self) -> bool:
        return getattr(self.forward, "compiled", False)

    @property
    def timings(self) -> list[tuple[int, float, bool]]:
        """``(real tokens, seconds, compiled)`` of the first :data:`TIMED_BATCHES` batches, for the compile
        decision; on CUDA, the device time around the forward (reading it waits for those batches)."""
        out = []
        for tokens, took, compiled in self._timed:
            if isinstance(took, tuple):
                start, end = took
                end.synchronize()
                took = start.elapsed_time(end) / 1000
            out.append((tokens, took, compiled))
        return out

    def prepare(self, tokens: np.ndarray, lengths: np.ndarray, padded: bool = False) -> Batch:
        """Model inputs for a batch (thread-safe: runs on the prefetch thread). Compiled runs pad the batch
        to ``batch_size`` rows and variable-length widths to a multiple of :data:`WIDTH_MULTIPLE`."""
        n, width = tokens.shape[0], tokens.shape[1]
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.compiled:
            rows = max(n, self.batch_size or n)
            wide = (
                round_width(width, self.spec.seq_len) if self.spec.variable_length and not padded else width
            )
            if (rows, wide) != (n, width):
                fill = self.spec.pad_id if tokens.dtype.kind in "iu" else 0
                grown = np.full((rows, wide, *tokens.shape[2:]), fill, dtype=tokens.dtype)
                grown[:n, :width] = tokens
                tokens, width = grown, wide
                lengths = np.concatenate([lengths, np.full(rows - n, wide, dtype=np.int64)])
        lengths_t = torch.from_numpy(lengths)
        readout = readout_index(lengths_t, self.spec, "padded" if padded else self.readout, width)
        if self.device.type == "cuda":  # page-locked, so the copy to the GPU overlaps compute
            pool = self.inputs
            return Batch(pool.copy_in(tokens), pool.copy_in(lengths), pool.copy_in(readout.numpy()), n, True)
        return Batch(torch.from_numpy(np.ascontiguousarray(tokens)), lengths_t, readout, n)

    @torch.inference_mode()
    def run(self, batch: Batch) -> np.ndarray:
        """Features ``(n, n_depths, n_readout, d)`` of the batch's real rows (as float32 numpy)."""
        return resolve(self.run_async(batch, "float32"))

    @torch.inference_mode()
    def run_async(self, batch: Batch, store: str | None = None) -> np.ndarray | Pending:
        """As :meth:`run`, in the dtype ``store`` (default: the runner's), but on a GPU the copy back is
        only started: the result is a :class:`Pending` the writer resolves while the next batch runs."""
        tokens = int(batch.lengths[: batch.n].sum())
        store = store or self.store
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                return self._run_cuda(batch, tokens, store)
        args = [t.to(self.device, non_blocking=True) for t in (batch.tokens, batch.lengths, batch.readout)]
        start = time.perf_counter()
        features = stored(self._call(*args)[: batch.n], store).cpu().numpy()
        self._keep_time(tokens, time.perf_counter() - start)
        return features

    def _keep_time(self, tokens: int, took: Any) -> None:
        if len(self._timed) < TIMED_BATCHES:  # a long-lived runner (the API's) keeps no growing log
            self._timed.append((tokens, took, self.compiled))

    def _run_cuda(self, batch: Batch, tokens: int, store: str) -> Pending:
        """Copy in, forward and copy out, all queued on this device's current stream (the caller made
        ``self.device`` current)."""
        stream = torch.cuda.current_stream(self.device)
        args = [t.to(self.device, non_blocking=True) for t in (batch.tokens, batch.lengths, batch.readout)]
        if batch.pinned:
            copied = torch.cuda.Event()
            copied.record(stream)
            for t in (batch.tokens, batch.lengths, batch.readout):
                self.inputs.give(t, copied)
        if not self._timed and not self.compiled:
            self._call(*args)  # the first CUDA call loads kernels and sets up cuBLAS: not the eager rate
        start = end = None
        if len(self._timed) < TIMED_BATCHES:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
        out = stored(self._call(*args)[: batch.n], store)
        if end is not None:
            end.record(stream)
            self._keep_time(tokens, (start, end))
        host = self.outputs.take(out.shape, out.dtype)
        host.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        return Pending(host, done, self.outputs)

    def __call__(self, tokens: np.ndarray, lengths: np.ndarray, padded: bool = False) -> np.ndarray:
        return self.run(self.prepare(tokens, lengths, padded))

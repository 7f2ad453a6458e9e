"""Stream a task through the frozen input layer and backbone into the feature store.

Extraction is the only expensive step of the method, so the default path is tuned for
CPUs (measured in ``docs/benchmarks.md``, ``make bench``):

- bf16 compute where the CPU multiplies bf16 natively (``dtype="auto"``; float32 on
  request); the input layer stays float32 and features are stored as float32;
- the forward (input layer, backbone, readout) compiled by inductor with weight freezing
  (oneDNN-packed weights), falling back to eager, with a message, when compilation fails;
  ``compile=None`` compiles only runs of at least :data:`AUTO_COMPILE_TOKENS` tokens, where
  the compile time is repaid;
- a compiled graph sees few shapes: each batch is padded to the batch size and, for
  variable-length tasks, to a width that is a multiple of :data:`WIDTH_MULTIPLE`; padding
  rows are dropped and the readout is the last real token, so padding never changes a
  feature (causal models need no mask; encoders build one from ``lengths``);
- only the blocks up to the deepest requested depth run (the backbones' ``states``);
- variable-length batches are bucketed by length;
- the next batches are encoded on a thread while the current one computes, and HDF5
  writes run on a background thread; a failure there stops the run with the original
  error and the file is never marked complete.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Sequence, TypeVar

import numpy as np
import torch
from torch import nn

from reservoir.backbones import Backbone, freeze, load_backbone
from reservoir.config import ExtractConfig, parse_depths
from reservoir.input_layer import input_layer_tensors, make_input_layer
from reservoir.store import FeatureWriter, partial_path
from reservoir.tasks import SplitData, Task, TaskSpec, get_task

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: ``dtype`` values accepted by :func:`resolve_dtype`
DTYPE_CHOICES = ("auto", "bfloat16", "float32")
#: with ``compile=None`` a run is compiled when it has at least this many tokens left to
#: extract: compiling costs 30 to 90 s here and gains about 4x over eager bf16 (docs/benchmarks.md)
AUTO_COMPILE_TOKENS = 300_000
#: compiled variable-length batches are padded to a multiple of this many tokens
WIDTH_MULTIPLE = 64
#: with ``batch_size=None`` a batch holds about this many tokens (a backbone may ask for more
#: with a ``batch_tokens`` attribute: an LSTM's step is a matrix product with one row per example)
BATCH_TOKENS = 16384
#: and at most this many examples
MAX_BATCH_ROWS = 512

T = TypeVar("T")


def bf16_native() -> bool:
    """Whether this CPU has native bf16 matrix products (oneDNN with AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


def resolve_dtype(name: str) -> str:
    """``"auto"`` -> ``"bfloat16"`` where the CPU supports it, else ``"float32"``."""
    if name == "auto":
        return "bfloat16" if bf16_native() else "float32"
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; choose from {list(DTYPE_CHOICES)}")
    return name


def auto_batch_size(backbone: nn.Module, seq_len: int) -> int:
    """Examples per batch when none is given: the backbone's ``batch_tokens`` (default
    :data:`BATCH_TOKENS`) divided by the task's length, within ``[1, MAX_BATCH_ROWS]``."""
    tokens = getattr(backbone, "batch_tokens", BATCH_TOKENS)
    return max(1, min(MAX_BATCH_ROWS, tokens // max(1, seq_len)))


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
    spec : the task's spec (token kind, length, readout count, padding id).
    input_layer : the frozen input layer (kept in float32).
    backbone : the frozen backbone; converted to ``dtype`` in place.
    depths : depths to read; only blocks up to the deepest run.
    dtype : ``"auto"``, ``"bfloat16"`` or ``"float32"`` compute.
    compile : compile the forward with inductor (weight freezing); falls back to eager if
        compilation fails.
    batch_size : when compiling, smaller batches are padded to this many rows so one graph serves.

    Examples
    --------
    >>> runner = FeatureRunner(spec, layer, backbone, [0, 6, 12], "auto")   # doctest: +SKIP
    >>> runner(tokens, lengths).shape                                       # doctest: +SKIP
    (32, 3, 1, 768)
    """

    def __init__(self, spec: TaskSpec, input_layer: nn.Module, backbone: Backbone, depths: Sequence[int],
                 dtype: str = "float32", compile: bool = False, *, batch_size: int | None = None):
        self.spec, self.depths = spec, tuple(depths)
        backbone.check_depths(self.depths)
        self.dtype_name = resolve_dtype(dtype)
        self.dtype = DTYPES[self.dtype_name]
        self.input_layer = freeze(input_layer.float()).eval()
        self.backbone = freeze(backbone.to(self.dtype)).eval()
        self.batch_size = batch_size
        self.compiled = bool(compile)
        self.forward = self._forward
        if self.compiled:
            try:
                self.forward = torch.compile(self._forward, options={"freezing": True})
            except Exception as e:  # noqa: BLE001 - compilation is an optimisation, eager always works
                self._fall_back(e)

    def _forward(self, tokens: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
        x = self.input_layer(tokens).to(self.dtype)
        return self.backbone(x, lengths, self.depths, readout).float()

    def _fall_back(self, e: BaseException) -> None:
        print(f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              "running eager (pass --no-compile to skip compiling)", file=sys.stderr)
        self.forward, self.compiled = self._forward, False

    def readout_positions(self, lengths: np.ndarray, width: int, padded: bool) -> np.ndarray:
        r = self.spec.n_readout
        last = np.full_like(lengths, width) if padded else lengths
        return (last[:, None] - r + np.arange(r)[None, :]).astype(np.int64)

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
        readout = self.readout_positions(lengths, width, padded)
        return Batch(torch.from_numpy(np.ascontiguousarray(tokens)), torch.from_numpy(lengths),
                     torch.from_numpy(readout), n)

    @torch.inference_mode()
    def run(self, batch: Batch) -> np.ndarray:
        """Features ``(n, n_depths, n_readout, d)`` of the batch's real rows."""
        args = (batch.tokens, batch.lengths, batch.readout)
        try:
            out = self.forward(*args)
        except Exception as e:  # noqa: BLE001
            if not self.compiled:
                raise
            self._fall_back(e)
            out = self.forward(*args)
        return out[: batch.n].numpy()

    def __call__(self, tokens: np.ndarray, lengths: np.ndarray, padded: bool = False) -> np.ndarray:
        return self.run(self.prepare(tokens, lengths, padded))


def plan_batches(lengths: np.ndarray, batch_size: int, bucket: bool) -> list[np.ndarray]:
    """Row indices of each batch. Bucketing sorts by length (longest first) so padding is
    small; rows within a batch are increasing so the store can write them directly."""
    order = np.argsort(-lengths, kind="stable") if bucket else np.arange(len(lengths))
    return [np.sort(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]


_END = object()


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Yield ``items`` computed on a background thread, at most ``depth`` ahead.

    An exception raised while producing an item is raised here, in the consumer; closing
    the generator stops the producer.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put((_END, e))

    thread = threading.Thread(target=work, name="reservoir-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


class BackgroundWriter:
    """Runs :meth:`FeatureWriter.write` on a thread so HDF5 I/O overlaps compute.

    At most ``depth`` batches wait. The first error in the thread (kept as it was, so a
    ``KeyboardInterrupt`` stays one) is raised by the next :meth:`submit` or :meth:`drain`;
    batches queued after it are dropped, so they are never marked done.
    """

    def __init__(self, writer: FeatureWriter, depth: int = 4):
        self.writer = writer
        self.error: BaseException | None = None
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._work, name="reservoir-writer", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            job = self.q.get()
            try:
                if job is None:
                    return
                if self.error is None:
                    self.writer.write(*job)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                self.error = e
            finally:
                self.q.task_done()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, split: str, rows: np.ndarray, features: np.ndarray) -> None:
        self.check()
        self.q.put((split, rows, features))

    def drain(self) -> None:
        """Wait until every submitted batch is written; raise the writer's error if any."""
        self.q.join()
        self.check()

    def close(self) -> None:
        if self.thread.is_alive():
            self.q.put(None)
            self.thread.join()


class Progress:
    """Examples/s and ETA on stderr."""

    def __init__(self, label: str, total: int, done: int = 0, enabled: bool = True):
        self.label, self.total, self.done, self.enabled = label, total, done, enabled
        self.start, self.new, self.last = time.perf_counter(), 0, 0.0
        self.tty = sys.stderr.isatty()

    def update(self, n: int) -> None:
        self.done += n
        self.new += n
        now = time.perf_counter()
        every = 1.0 if self.tty else 15.0
        if self.enabled and (now - self.last > every or self.done == self.total):
            self.last = now
            rate = self.new / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            end = "\n" if self.done == self.total or not self.tty else ""
            start = "\r" if self.tty else ""
            print(f"{start}{self.label}: {self.done}/{self.total} ({rate:.1f} ex/s, ETA {eta:.0f}s)   ",
                  end=end, file=sys.stderr, flush=True)


def load_splits(task: Task, cfg: ExtractConfig) -> dict[str, SplitData]:
    splits = task.spec.splits if cfg.split == "all" else (cfg.split,)
    for s in splits:
        task.check_split(s)
    return {s: task.load(s, Path(cfg.data_dir), cfg.limit) for s in splits}


def should_compile(setting: bool | None, tokens: int, backbone: nn.Module | None = None) -> bool:
    """``True``/``False`` as given; ``None`` (auto) compiles runs of at least :data:`AUTO_COMPILE_TOKENS`
    tokens, unless the backbone says compiling gains nothing (``compilable = False``)."""
    if setting is not None:
        return bool(setting)
    return tokens >= AUTO_COMPILE_TOKENS and getattr(backbone, "compilable", True)


def extract(cfg: ExtractConfig, *, progress: bool = True) -> Path:
    """Run one extraction; returns the path of the complete feature file.

    Data and backbone are loaded before any file is created, so bad input leaves
    nothing behind. An existing complete file is kept as is; a ``.partial`` file with
    the same settings is resumed.
    """
    out = cfg.out_path
    task = get_task(cfg.task, **cfg.task_options)
    data = load_splits(task, cfg)
    backbone = load_backbone(cfg.backbone, cfg.seed)
    depths = parse_depths(cfg.depths, backbone.n_layers)
    dtype = resolve_dtype(cfg.dtype)
    if out.exists() and not partial_path(out).exists():
        print(f"{out} is already complete; delete it to extract again", file=sys.stderr)
        return out
    batch_size = cfg.batch_size or auto_batch_size(backbone, task.spec.seq_len)
    layer = make_input_layer(task.spec, backbone.d_model, cfg.seed)
    identity = {**cfg.to_json(), "dtype": dtype, "batch_size": batch_size, "depths": depths, "splits": list(data),
                "task_options": task.options(), "n_layers": backbone.n_layers, "d_model": backbone.d_model}
    padded = cfg.readout == "padded"
    bucket = task.spec.variable_length and not padded
    writer = FeatureWriter.open(out, identity, input_layer_tensors(layer))
    try:
        plans, done = {}, {}
        for split, d in data.items():
            shape = (len(depths), task.spec.n_readout, backbone.d_model)
            done[split] = writer.split(split, d.labels, d.lengths, shape)
            plans[split] = [rows for rows in plan_batches(d.lengths, batch_size, bucket) if not done[split][rows].all()]
        width = {s: task.spec.seq_len if padded else None for s in data}
        todo = sum(len(rows) * (width[s] or int(data[s].lengths[rows].max())) for s in data for rows in plans[s])
        runner = FeatureRunner(task.spec, layer, backbone, depths, dtype, should_compile(cfg.compile, todo, backbone),
                               batch_size=batch_size)

        def batches(split: str) -> Iterator[tuple[np.ndarray, Batch]]:
            d = data[split]
            for rows in plans[split]:
                tokens = task.encode(d.inputs[rows])
                if padded and tokens.shape[1] < task.spec.seq_len:
                    pad = [(0, 0), (0, task.spec.seq_len - tokens.shape[1])] + [(0, 0)] * (tokens.ndim - 2)
                    tokens = np.pad(tokens, pad, constant_values=task.spec.pad_id)
                yield rows, runner.prepare(tokens, d.lengths[rows], padded)

        background = BackgroundWriter(writer)
        try:
            for split, d in data.items():
                bar = Progress(f"{cfg.task}/{split}", len(d), int(done[split].sum()), progress)
                with contextlib.closing(prefetch(batches(split))) as stream:
                    for rows, batch in stream:
                        fresh = len(rows) - int(done[split][rows].sum())  # a resumed batch may hold done rows
                        background.submit(split, rows, runner.run(batch))
                        bar.update(fresh)
            background.drain()
        finally:
            background.close()
        return writer.finish()
    finally:
        writer.close()

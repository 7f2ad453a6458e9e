"""Stream a task through the frozen input layer and backbone (:mod:`reservoir.runtime.runner`) into
the feature store, one file per run identity (:mod:`reservoir.identity`).

The compute dtype, the engine and the compile decision are chosen per run
(:mod:`reservoir.runtime.runner`); the default path is described in docs/benchmarks.md, "What the
default path does". Batches are padded to few shapes for a compiled graph, but padding rows are
dropped and the readout is the last real token, so padding never changes a feature. Batches are
encoded on a prefetch thread and written on a background one; a failure there stops the run with the
original error, and the file is never marked complete.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from reservoir.config import ExtractConfig, select_depths
from reservoir.errors import IdentityError, StoreError, interrupt_after
from reservoir.extract.h5 import h5_file
from reservoir.extract.plan import auto_batch_size, plan_split
from reservoir.extract.store import (
    FeatureWriter,
    check_complete_match,
    file_config,
    move_aside,
    partial_path,
    stored_identity,
    write_failed,
)
from reservoir.extract.stored import STORED
from reservoir.identity import differences, feature_identity, features_path_for
from reservoir.identity import digest as identity_hash
from reservoir.model.backbones import fingerprint, label, load_backbone, weights_kind
from reservoir.model.devices import check_fits, resolve_device
from reservoir.model.input_layer import input_layer_tensors
from reservoir.model.reservoir import check_length, check_readout, readout_count
from reservoir.progress import bar, log
from reservoir.runtime import machine
from reservoir.runtime.engines import INT8_DTYPES
from reservoir.runtime.runner import Batch, FeatureRunner, resolve, resolve_dtype
from reservoir.tasks import SplitData, Task, make_task, unread_splits

#: sharded runs (no probe) with ``compile=None`` compile when they have at least this many tokens left
#: (measured: docs/benchmarks.md, "Constants the code takes from these measurements")
AUTO_COMPILE_TOKENS = 300_000
T = TypeVar("T")


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
            with interrupt_after():
                item, error = q.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        with interrupt_after():
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
                    split, rows, features = job
                    # a GPU copy finishes here, off the main thread
                    self.writer.write(split, rows, resolve(features))
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                self.error = e
            finally:
                self.q.task_done()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, split: str, rows: np.ndarray, features: np.ndarray) -> None:
        self.check()
        with interrupt_after():
            self.q.put((split, rows, features))

    def drain(self) -> None:
        """Wait until every submitted batch is written; raise the writer's error if any."""
        with interrupt_after():
            self.q.join()
        self.check()

    def close(self) -> None:
        """Write what was submitted, then end the thread."""
        if self.thread.is_alive():
            with interrupt_after():
                self.q.put(None)
                self.thread.join()


def load_splits(task: Task, cfg: ExtractConfig) -> dict[str, SplitData]:
    """The splits a run extracts: every row, or a sample of ``cfg.limit`` drawn by the run's seed
    (:meth:`reservoir.tasks.Task.load`)."""
    splits = task.spec.splits if cfg.split == "all" else (cfg.split,)
    for s in splits:
        task.check_split(s)
    return {s: task.load(s, Path(cfg.data_dir), cfg.limit, cfg.seed) for s in splits}


def check_split_classes(task: Task, data: dict[str, SplitData], cfg: ExtractConfig) -> list[int]:
    """Refuse, before anything is extracted, a train split that lacks classes another split holds; the
    classes a ``--limit`` sample left out of every split (:func:`reservoir.tasks.sizes.check_sample`)."""
    from reservoir.tasks.sizes import check_sample

    return check_sample(
        f"task {cfg.task!r}",
        {s: d.labels for s, d in data.items()},
        limit=cfg.limit,
        names=task.class_names,
        full=None if task.draws else (lambda s: task.load(s, Path(cfg.data_dir)).labels),
    )


def dtype_reason(run: Run) -> str:
    """Why the compute dtype is what it is, in words (``extract`` prints it)."""
    from reservoir.runtime.dtypes import choose

    if run.cfg.dtype != "auto":
        return f"--dtype {run.cfg.dtype}"
    return run.dtype_why or choose(run.device)[1]


def should_compile(setting: bool | None, tokens: int, backbone: nn.Module | None = None) -> bool:
    """``True``/``False`` as given; ``None`` (auto) compiles runs of at least :data:`AUTO_COMPILE_TOKENS`
    tokens, unless the backbone says compiling gains nothing (its ``capabilities`` declare no ``compile``)."""
    if setting is not None:
        return bool(setting)
    return tokens >= AUTO_COMPILE_TOKENS and getattr(backbone, "compilable", True)


def count_tokens(data: dict[str, SplitData], seq_len: int, padded: bool) -> int:
    """Tokens of every row of ``data`` (rows of the padded readout count ``seq_len`` tokens)."""
    if padded:
        return sum(len(d) for d in data.values()) * seq_len
    return int(sum(int(np.sum(d.lengths)) for d in data.values()))


@dataclass
class Run:
    """An extraction, prepared: data and backbone loaded, identity and output file known."""

    cfg: ExtractConfig
    task: Task
    data: dict[str, SplitData]
    backbone: nn.Module
    depths: list[int]
    dtype: str
    device: torch.device
    identity: dict[str, Any]
    out: Path
    batch_size: int
    #: why ``--dtype auto`` took an int8 dtype ("": it took a float one, :func:`dtype_reason`)
    dtype_why: str = ""

    @property
    def padded(self) -> bool:
        return self.cfg.readout == "padded"

    @property
    def bucket(self) -> bool:
        return self.task.spec.variable_length and not self.padded

    @property
    def tokens_total(self) -> int:
        """Tokens of every row the run extracts (padded rows count in full)."""
        return count_tokens(self.data, self.task.spec.seq_len, self.padded)

    def calibration(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The int8 dtypes: the calibration batches, ``(tokens, lengths)`` of the first rows of the first split."""
        from reservoir.runtime.engines import calibration_batches

        split, n = self.identity["calibration"]["split"], self.identity["calibration"]["rows"]
        return [self.tokens(split, rows) for rows in calibration_batches(n)]

    def runner(self, progress: bool = True, engine: str | None = None) -> FeatureRunner:
        """The run's :class:`FeatureRunner` (engine, calibration and messages set up; not compiled yet), on
        ``engine`` (default: the option's)."""
        return FeatureRunner.build(
            self.task.spec,
            self.backbone,
            self.depths,
            seed=self.cfg.seed,
            input_scale=self.cfg.input_scale,
            dtype=self.dtype,
            batch_size=self.batch_size,
            device=self.device,
            engine=engine or ("torch" if self.cfg.load_dtype != "float32" else self.cfg.engine),
            tokens=self.tokens_total,
            padded=self.padded,
            readout=self.cfg.readout,
            calibration=self.calibration if self.dtype in INT8_DTYPES else None,
            centre_dtype=self.identity.get("calibration", {}).get("dtype"),
            log=lambda text: log(text, progress),
            store=self.cfg.store_dtype,
        )

    def settled_runner(self, progress: bool = True, begun_by: str | None = None) -> FeatureRunner:
        """The run's runner on the one engine that makes every row of its file: as asked; for ``--engine
        auto``, the engine ``begun_by`` (that made the rows of a file being resumed), else decided before
        the first row is kept, by running the first batch now where auto takes a converting engine."""
        if begun_by and self.cfg.engine not in ("auto", begun_by):
            raise IdentityError(
                f"{partial_path(self.out)} was begun on the {begun_by} engine; rerun with --engine "
                f"{begun_by} (or auto) to resume it, or delete it to start over on {self.cfg.engine}"
            )
        runner = self.runner(progress, engine=begun_by)
        if self.cfg.engine == "auto" and not begun_by and runner.converting and self.dtype not in INT8_DTYPES:
            split, rows = next(
                (split, batches[0])
                for split, d in self.data.items()
                for _, batches in plan_split(d.lengths, self.batch_size, self.bucket, self.cfg.shard_rows)
                if batches
            )
            runner(*self.tokens(split, rows), self.padded)
            runner.measure_key = None  # settled: no later batch measures and switches engines under the file
        return runner

    @property
    def feature_shape(self) -> tuple[int, int, int]:
        return (len(self.depths), readout_count(self.task.spec, self.cfg.readout), self.backbone.d_model)

    @property
    def feature_bytes(self) -> int:
        """Bytes of features the run writes (every split, in the dtype they are stored in)."""
        itemsize = STORED[self.cfg.store_dtype].itemsize
        return sum(len(d) for d in self.data.values()) * int(np.prod(self.feature_shape)) * itemsize

    def config(self, engine: str | None = None) -> dict[str, Any]:
        """The file's ``config``: the options and the execution settings actually used."""
        return {
            **self.cfg.to_json(),
            "out": str(self.out),
            "batch_size": self.batch_size,
            "engine_used": engine,
            "device_used": str(self.device),
            "n_layers": self.backbone.n_layers,
            "d_model": self.backbone.d_model,
            "torch": torch.__version__,
            "machine": machine.on(self.device),
            "image_shape": getattr(self.task, "image_shape", None),
            "padded_width": self.task.spec.seq_len if self.padded else None,
        }

    def tokens(self, split: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Model tokens and lengths of ``rows`` (padded to the task's length for the padded readout)."""
        d = self.data[split]
        tokens = self.task.encode(d.inputs[rows])
        if self.padded and tokens.shape[1] < self.task.spec.seq_len:
            pad = [(0, 0), (0, self.task.spec.seq_len - tokens.shape[1])] + [(0, 0)] * (tokens.ndim - 2)
            tokens = np.pad(tokens, pad, constant_values=self.task.spec.pad_id)
        return tokens, d.lengths[rows]

    def width(self, split: str, rows: np.ndarray) -> int:
        """Tokens per row of a batch as the model sees it (before compile padding)."""
        return self.task.spec.seq_len if self.padded else int(self.data[split].lengths[rows].max())

    def tokens_left(self, plans: dict[str, list[np.ndarray]]) -> int:
        return sum(len(rows) * self.width(s, rows) for s in plans for rows in plans[s])

    def compile_for(self, plans: dict[str, list[np.ndarray]]) -> bool:
        """The compile decision by size alone (sharded runs: each worker compiles its own graph)."""
        return should_compile(self.cfg.compile, self.tokens_left(plans), self.backbone)

    def compile_key(self, plans: dict[str, list[np.ndarray]]) -> tuple[str, int]:
        """The record key of this run's compiled shapes (:mod:`reservoir.runtime.compiling`) and how many
        distinct batch widths it compiles."""
        from reservoir.runtime.compiling import device_label, shape_key
        from reservoir.runtime.runner import round_width

        widths = {
            round_width(self.width(s, rows), self.task.spec.seq_len) if self.bucket else self.width(s, rows)
            for s in plans
            for rows in plans[s]
        }
        key = shape_key(
            self.backbone,
            dtype=self.dtype,
            device=device_label(self.device),
            batch_size=self.batch_size,
            widths=sorted(widths),
            depths=self.depths,
        )
        return key, max(len(widths), 1)

    def decide_compile(
        self,
        runner: FeatureRunner,
        plans: dict[str, list[np.ndarray]],
        background: BackgroundWriter,
        progress: bool = True,
    ) -> tuple[dict[str, int], str | None]:
        """Compile as asked, or (``compile=None``) when the measured costs say it pays
        (:func:`reservoir.runtime.compiling.decide`): the first batch runs eager as the probe (its
        features are kept) and is taken out of ``plans``. Returns the rows the probe wrote per split,
        and the compile record's key when the run compiles."""
        from reservoir.runtime.compiling import decide, read_record

        if runner.converting:
            log(
                f"{runner.engine} engine ({runner.engine_reason}): converted on the first batch, "
                "no torch.compile",
                progress,
            )
            return {}, None
        measurable = any(plans.values())
        compilable = getattr(self.backbone, "compilable", True)
        if self.cfg.compile is not None or not compilable or not measurable:
            if self.compile_for(plans):
                runner.enable_compile()
            why = (
                ("--compile" if self.cfg.compile else "--no-compile")
                if self.cfg.compile is not None
                else "the backbone does not compile"
                if not compilable
                else "by size"
            )
            log(f"{'compiled' if runner.compiled else 'eager'} ({why})", progress)
            return {}, self.compile_key(plans)[0] if runner.compiled else None
        split = next(s for s in plans if plans[s])
        rows = plans[split].pop(0)
        background.submit(
            split, rows, runner.run_async(runner.prepare(*self.tokens(split, rows), self.padded))
        )
        tokens, seconds, _ = runner.timings[-1]
        key, shapes = self.compile_key(plans)
        decision = decide(
            self.tokens_left(plans),
            tokens / seconds,
            blocks=max(self.depths),
            shapes=shapes,
            record=read_record(key),
            dtype=self.dtype,
        )
        if decision.compile:
            runner.enable_compile()
        log(decision.reason, progress)
        return {split: len(rows)}, key if decision.compile else None

    def record_compile(self, runner: FeatureRunner, key: str | None) -> None:
        """After a compiled run, remember its measured compile time and, when the probe measured the eager
        rate, its speedup (:meth:`FeatureRunner.compile_costs`)."""
        costs = runner.compile_costs() if key is not None else None
        if costs is None or not (runner.compiled or runner.compile_dropped):
            return
        from reservoir.runtime.compiling import write_record

        write_record(key, *costs)


def prepare(cfg: ExtractConfig, progress: bool, task: Task | None = None) -> Run:
    """Load data and backbone, compute the identity and the output file; touches no file. ``task``: the
    task of ``cfg.task`` already built (``predict`` builds one that numbers classes as its probe does)."""
    device = resolve_device(cfg.device)  # an absent device fails before any data is read
    task = task or make_task(cfg.task, cfg.task_options, cfg.seed)
    check_readout(task.spec, cfg.readout)
    data = load_splits(task, cfg)
    unread = unread_splits(data) if cfg.split == "all" else None
    if unread:
        log(f"{cfg.task}: {unread} (they are extracted, for export and api.read_features)", progress)
    log(f"loading backbone {cfg.backbone} ...", progress)
    halved = cfg.load_dtype != "float32"
    backbone = load_backbone(cfg.backbone, cfg.seed, dtype=cfg.load_dtype)
    check_length(task.spec, backbone, cfg.backbone)
    depths = select_depths(
        cfg.depths, range(backbone.n_layers + 1), f"in backbone {cfg.backbone} ({backbone.n_layers} blocks)"
    )
    lost = check_split_classes(task, data, cfg)  # the options checked first, then the data's classes
    labels = next(iter(data.values())).labels
    if cfg.readout == "all" and labels.ndim == 1:
        log(
            f"readout all: every position's state, and one label an example in task {task.name!r}: `reservoir "
            "fit` pairs a row with a label and will refuse these features; they are for export and "
            "api.read_features (--readout last or mean for a probe)",
            progress,
        )
    dtype = cfg.load_dtype if halved and cfg.dtype == "auto" else resolve_dtype(cfg.dtype, device, cfg.engine)
    # a CUDA card's free memory, before anything moves there
    check_fits(backbone, device, dtype, cfg.backbone)
    dtype_why = ""
    if cfg.dtype == "auto" and not halved and task.spec.target == "regression" and dtype != "float32":
        # bf16 keeps 8 bits of a state: a forecast's error then stops near 1% of the target's spread
        dtype_why = (
            f"auto: float32, not {dtype}, which multiplies fastest here: task {task.name!r} has real-valued "
            "targets"
        )
        dtype = "float32"
    if cfg.dtype == "auto" and not halved and dtype not in INT8_DTYPES:
        from reservoir.runtime.quantized import choose_int8

        take, why = choose_int8(
            device=device,
            engine=cfg.engine,
            backbone=backbone,
            twin=weights_kind(cfg.backbone),
            tokens=count_tokens(data, task.spec.seq_len, cfg.readout == "padded"),
            target=task.spec.target,
        )
        if take:
            dtype, dtype_why = "int8", why
    calibration = None
    if dtype in INT8_DTYPES:  # engines quantize by their own recipes: the int8 engine is part of the identity
        from reservoir.runtime.engines import INT8_RECIPE, calibration_dtype, calibration_rows, choose_engine

        first = next(iter(data))
        calibration = {
            "split": first,
            "rows": calibration_rows(task.spec.seq_len, len(data[first])),
            "recipe": INT8_RECIPE,
            "engine": choose_engine(cfg.engine, dtype, device, backbone)[0],
            "dtype": calibration_dtype(),  # decided once: every shard, on any worker, centres in it
        }
    identity = feature_identity(
        task_name=cfg.task,
        task=task,
        data=data,
        backbone=label(cfg.backbone),
        backbone_fingerprint=fingerprint(backbone),
        seed=cfg.seed,
        input_scale=cfg.input_scale,
        depths=depths,
        dtype=dtype,
        readout=cfg.readout,
        limit=cfg.limit,
        calibration=calibration,
        load_dtype=cfg.load_dtype,
        store_dtype=cfg.store_dtype,
        left_out=lost,
        token_std=getattr(backbone, "token_std", None),
    )
    out = Path(cfg.out) if cfg.out else features_path_for(identity)
    batch_size = cfg.batch_size or auto_batch_size(backbone, task.spec.seq_len)
    return Run(cfg, task, data, backbone, depths, dtype, device, identity, out, batch_size, dtype_why)


def extract(
    cfg: ExtractConfig,
    *,
    progress: bool = True,
    task: Task | None = None,
    accept: Callable[[Run], None] | None = None,
) -> Path:
    """Run one extraction; returns the path of the complete feature file. ``task``: the task already built
    (:func:`prepare`); ``accept``: called with the prepared run before any file is touched, to refuse it (by
    raising) where it cannot serve its caller (``predict`` checks it against its probe).

    Nothing is touched before the data, the backbone and the identity are loaded, so bad input leaves
    nothing behind. An existing complete file is reused when its identity equals this run's and its
    contents pass :func:`reservoir.extract.store.verify`, and refused otherwise (IdentityError,
    StoreError); with ``force`` it is moved aside and extracted again. A ``.partial`` file of the same
    identity is resumed. With ``workers`` or ``scheduler`` the rows are extracted as shards on dask
    workers (:mod:`reservoir.extract.sharded`).
    """
    run = prepare(cfg, progress, task)
    if accept is not None:
        accept(run)
    if run.out.exists() and cfg.force:
        aside = move_aside(run.out, run.identity)
        log(
            f"--force: moved {run.out} aside to {aside} (delete it when you no longer need it); extracting again",
            progress,
        )
    elif run.out.exists():
        check_complete_match(run.out, run.identity)  # identity, completeness, then every chunk and digest
        log(
            f"reusing {run.out} (same run identity {identity_hash(run.identity)}, contents verified)",
            progress,
        )
        return run.out
    try:
        if cfg.workers or cfg.scheduler:
            from reservoir.extract.sharded import extract_sharded

            return extract_sharded(run, progress=progress)
        return extract_local(run, progress=progress)
    except OSError as e:  # data and backbone are loaded: what fails now is writing
        raise write_failed(run.out, e) from None


def begun_engine(out: Path, identity: dict[str, Any]) -> str | None:
    """The engine that made the rows of ``out``'s unfinished file of this identity, if it holds any."""
    tmp = partial_path(out)
    if not tmp.exists():
        return None
    try:
        with h5_file(tmp) as f:
            begun = any(int(f[s].attrs.get("rows_done", 0)) for s in f if s != "input_layer")
            if differences(stored_identity(f), identity) or not begun:
                return None
            return file_config(f).get("engine_used")
    except (OSError, KeyError, ValueError, StoreError):
        return None  # unreadable, or another run's: the writer says so when it opens it


def extract_local(run: Run, *, progress: bool = True) -> Path:
    """Extract in this process into ``run.out`` (``.partial`` until complete; resumable)."""
    task, data, out = run.task, run.data, run.out
    runner = run.settled_runner(progress, begun_by=begun_engine(out, run.identity))
    layer = input_layer_tensors(runner.reservoir.input_layer)
    writer = FeatureWriter.open(out, run.identity, run.config(runner.engine), layer, nbytes=run.feature_bytes)
    try:
        plans, done = {}, {}
        for split, d in data.items():
            done[split] = writer.split(split, d.labels, d.lengths, run.feature_shape)
            plans[split] = [
                rows
                for _, batches in plan_split(d.lengths, run.batch_size, run.bucket, run.cfg.shard_rows)
                for rows in batches
                if not done[split][rows].all()
            ]
        log(
            f"extracting {task.name} through {run.cfg.backbone} on {run.device}: {run.dtype} ({dtype_reason(run)}) on "
            f"{runner.engine}, batch {run.batch_size}, depths {run.depths[0]}..{run.depths[-1]} ({len(run.depths)}) "
            f"-> {out}",
            progress,
        )

        def batches(split: str) -> Iterator[tuple[np.ndarray, Batch]]:
            for rows in plans[split]:
                yield rows, runner.prepare(*run.tokens(split, rows), run.padded)

        def shown_bar(split: str):
            return bar(
                len(data[split]), f"{task.name}/{split}", initial=int(done[split].sum()), enabled=progress
            )

        background = BackgroundWriter(writer)
        first = next(iter(data))
        shown = shown_bar(first)  # on screen before the first batch, which may also measure or compile
        try:
            probed, compile_key = run.decide_compile(runner, plans, background, progress)
            checked = compile_key is None
            for split in data:
                if split != first:
                    shown.close()
                    shown = shown_bar(split)
                shown.update(probed.get(split, 0))
                with contextlib.closing(prefetch(batches(split))) as stream:
                    for rows, batch in stream:
                        fresh = len(rows) - int(done[split][rows].sum())  # a resumed batch may hold done rows
                        background.submit(split, rows, runner.run_async(batch))
                        shown.update(fresh)
                        if not checked:
                            checked = runner.keep_compile_if_faster() is not None
            background.drain()
        finally:
            shown.close()
            background.close()
        run.record_compile(runner, compile_key)
        return writer.finish()
    finally:
        writer.close()

"""Extraction over dask.distributed workers: shards written on their own, joined without copying.

``--workers N`` starts a local cluster, ``--scheduler ADDRESS`` uses a running one (docs/guide/devices.md).
The rows of each split are cut into contiguous shards aligned with the batch plan
(:func:`reservoir.extract.plan.plan_split`), so a single process runs exactly the same batches and a
float32 sharded file equals the single-process one bit for bit. The driver encodes each shard's
tokens and settles the engine once (:func:`settle_engine`); a worker writes
``FILE.shards/SPLIT-START-STOP.h5`` with the store's one writer
(:class:`reservoir.extract.store.FeatureWriter`), refusing its shard when its backbone's weights differ
from the driver's. A rerun skips complete shards of the same identity and redoes missing ones; the
driver then writes ``FILE`` with the features as an HDF5 virtual dataset over the shards.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import IdentityError, ReservoirError, StoreError
from reservoir.extract.h5 import h5_file
from reservoir.extract.store import FeatureWriter, WriterLock, check_space, shard_dir, verify, write_joined
from reservoir.extract.stored import STORED, store_of
from reservoir.identity import differences, digest
from reservoir.model.reservoir import readout_count
from reservoir.progress import bar, log
from reservoir.runtime.engines import choose_engine


@dataclass
class ShardJob:
    """One shard: where it goes, what produced it, and its encoded batches."""

    path: str
    split: str
    start: int
    stop: int
    identity: dict[str, Any]
    backbone: str
    seed: int
    input_scale: str
    spec: Any
    input_layer: dict[str, np.ndarray]
    depths: list[int]
    dtype: str
    device: str
    compile: bool
    batch_size: int
    padded: bool
    threads: int  # torch threads on the worker (0: the worker's default)
    batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (rows, tokens, lengths)
    engine: str = "auto"
    tokens: int | None = None  # of the whole run
    readout: str = "last"
    calibration: list[tuple[np.ndarray, np.ndarray]] | None = (
        None  # the int8 dtypes: (tokens, lengths) batches
    )
    labels: np.ndarray | None = None  # of the shard's rows
    lengths: np.ndarray | None = None
    load_dtype: str = "float32"  # the dtype the weights are read in (--load-dtype)


def shard_path(out: Path, split: str, start: int, stop: int) -> Path:
    return shard_dir(out) / f"{split}-{start:010d}-{stop:010d}.h5"


def shard_state(path: Path, identity: dict[str, Any], engine: str) -> bool:
    """Whether a complete shard of this identity, made by ``engine``, is at ``path`` and passes
    :func:`reservoir.extract.store.verify` (a damaged one, or one another engine made, is removed and
    redone); IdentityError for another run's."""
    if not path.exists():
        return False
    try:
        with h5_file(path) as f:
            stored = json.loads(f.attrs["identity"])
            complete = bool(f.attrs.get("complete", False))
            diff = differences(stored, identity)
            made_by = json.loads(f.attrs.get("config", "{}")).get("engine_used")
            if complete and not diff and made_by != engine:
                raise StoreError(
                    f"shard {path} was made by the {made_by or 'an unrecorded'} engine, this run's shards "
                    f"by {engine}"
                )
            if complete and not diff:
                verify(f, fix="", shard=True)
    except StoreError as e:
        print(f"{str(e).rstrip('; ')}; extracting it again", file=sys.stderr)
        os.remove(path)
        return False
    except (OSError, KeyError, ValueError):
        os.remove(path)  # unreadable: redo it
        return False
    if diff:
        raise IdentityError(
            f"shard {path} belongs to another run ({'; '.join(diff)}); delete {path.parent} "
            "to extract again, or pass another --out"
        )
    return complete


# -- worker side -----------------------------------------------------------------------------

_RUNNERS: dict[tuple, Any] = {}
_RUNNERS_LOCK = threading.Lock()


def _runner(job: ShardJob):
    """The worker's FeatureRunner for this run (built once per worker process and reused)."""
    import torch

    from reservoir.model.backbones import fingerprint as backbone_fingerprint
    from reservoir.model.backbones import load_backbone
    from reservoir.runtime.runner import FeatureRunner

    device = job.device
    if device == "cuda" and torch.cuda.device_count() > 1:  # one worker per GPU
        try:
            from distributed import get_worker

            name = get_worker().name
            device = f"cuda:{int(name) % torch.cuda.device_count()}" if str(name).isdigit() else device
        except (ImportError, ValueError):
            pass
    key = (digest(job.identity), device)
    with _RUNNERS_LOCK:
        if key not in _RUNNERS:
            if job.threads:
                torch.set_num_threads(job.threads)
            backbone = load_backbone(job.backbone, job.seed, dtype=job.load_dtype)
            if backbone_fingerprint(backbone) != job.identity["backbone_fingerprint"]:
                raise IdentityError(
                    f"this worker's backbone {job.backbone!r} has other weights than the driver's; "
                    "give every worker the same model folder (or a registered name)"
                )
            _RUNNERS.clear()  # one run at a time per worker: free the previous model
            calibration = job.calibration
            _RUNNERS[key] = FeatureRunner.build(
                job.spec,
                backbone,
                job.depths,
                seed=job.seed,
                input_scale=job.input_scale,
                input_layer=job.input_layer,
                dtype=job.dtype,
                compile=job.compile,
                batch_size=job.batch_size,
                device=device,
                engine=job.engine,
                tokens=job.tokens,
                padded=job.padded,
                readout=job.readout,
                calibration=(lambda: calibration) if calibration else None,
                centre_dtype=job.identity.get("calibration", {}).get("dtype"),
            )
        return _RUNNERS[key]


def run_shard(job: ShardJob) -> str:
    """Extract one shard into its file (atomically); returns the path. Runs on a worker."""
    path = Path(job.path)
    runner = _runner(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (len(job.depths), readout_count(job.spec, job.readout), runner.backbone.d_model)
    if runner.engine != job.engine:  # an internal invariant: the worker runs the engine the driver settled
        raise ReservoirError(f"this worker runs {runner.engine}, the run's shards {job.engine}")
    writer = FeatureWriter.open(
        path,
        job.identity,
        {"shard": [job.split, job.start, job.stop], "engine_used": job.engine},
        job.input_layer,
        nbytes=(job.stop - job.start) * int(np.prod(shape)) * STORED[store_of(job.identity)].itemsize,
    )
    try:
        done = writer.split(job.split, job.labels, job.lengths, shape)
        for batch_rows, tokens, lengths in job.batches:
            local = batch_rows - job.start
            if not done[local].all():
                writer.write(job.split, local, runner(tokens, lengths, job.padded))
        return str(writer.finish())
    finally:
        writer.close()


# -- driver side -----------------------------------------------------------------------------


def _client(workers: int | None, scheduler: str | None):
    """A dask client: a LocalCluster of ``workers`` processes, or the cluster at ``scheduler``."""
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError) as e:
            raise ReservoirError(
                f"cannot reach the dask scheduler at {scheduler!r} ({e}); start one with "
                "`dask scheduler` and pass its address (tcp://HOST:PORT)"
            ) from None
    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
    )
    return Client(cluster), cluster


def require_distributed() -> None:
    """dask.distributed is the ``cluster`` extra: without it, say which extra to install."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ReservoirError(
            "--workers and --scheduler shard the run over dask.distributed, which is not installed; "
            "pip install 'reservoir[cluster]', or drop the option to extract in this process"
        ) from None


def threads_per_worker(workers: int) -> int:
    """CPU threads each of ``workers`` local workers may use (the cores this process may use, split)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, workers))


def extract_sharded(run, *, progress: bool = True) -> Path:
    """Extract ``run`` (a prepared :class:`reservoir.extract.run.Run`) as shards on dask workers, then
    join them into ``run.out``."""
    from reservoir.extract.plan import plan_split
    from reservoir.model.input_layer import input_layer_tensors
    from reservoir.model.reservoir import Reservoir

    require_distributed()
    cfg, out, identity = run.cfg, run.out, run.identity
    lock = WriterLock(out)
    try:
        reservoir = Reservoir(run.task.spec, run.backbone, seed=cfg.seed, input_scale=cfg.input_scale)
        layer = {k: v.numpy() for k, v in input_layer_tensors(reservoir.input_layer).items()}
        planned = {
            split: plan_split(d.lengths, run.batch_size, run.bucket, cfg.shard_rows)
            for split, d in run.data.items()
        }
        engine = settle_engine(run, progress)
        shards, todo = {}, {}
        for split, _d in run.data.items():
            shards[split] = []
            for (start, stop), batches in planned[split]:
                path = shard_path(out, split, start, stop)
                shards[split].append((start, stop, path))
                if not shard_state(path, identity, engine):
                    todo[(split, start, stop)] = (path, batches)
        # by the whole run, not what is left: a resumed run compiles (or not) as its first attempt did
        compile = run.compile_for(
            {split: [b for (_, batches) in planned[split] for b in batches] for split in planned}
        )
        n_done = sum(len(v) for v in shards.values()) - len(todo)
        log(
            f"extracting {run.task.name} through {cfg.backbone} as {sum(len(v) for v in shards.values())} shards "
            f"({n_done} already complete) on "
            f"{cfg.scheduler or f'{cfg.workers} local workers'}: {run.dtype} on {engine}, "
            f"{'compiled' if compile else 'eager'}, batch {run.batch_size} -> {out}",
            progress,
        )
        if todo:
            rows = sum(stop - start for (_, start, stop) in todo)
            check_space(shard_dir(out) / "shard.h5", rows * int(np.prod(run.feature_shape)) * 4)
            _run_jobs(run, todo, layer, compile, engine, progress)
        return write_joined(
            out,
            identity,
            run.config(engine),
            layer,
            {s: (run.data[s].labels, run.data[s].lengths, shards[s]) for s in run.data},
            run.feature_shape,
        )
    finally:
        lock.release(remove=out.exists())


def settle_engine(run, progress: bool) -> str:
    """The engine every shard of ``run`` runs, decided once, here: workers deciding ``--engine auto`` each
    for itself could run different engines, whose features differ in their last bits."""
    # nothing to settle: as asked, or PyTorch off the CPU
    if run.cfg.engine != "auto" or run.device.type != "cpu":
        engine, why = choose_engine(run.cfg.engine, run.dtype, run.device, run.backbone, run.tokens_total)
    else:
        runner = run.settled_runner(progress)
        engine, why = runner.engine, runner.engine_reason
    log(f"engine {engine} for every shard ({why})", progress)
    return engine


def _run_jobs(
    run, todo: dict, layer: dict[str, np.ndarray], compile: bool, engine: str, progress: bool
) -> None:
    from distributed import as_completed

    cfg = run.cfg
    # int8: the same calibration rows for every shard
    calibration = run.calibration() if "calibration" in run.identity else None
    client, cluster = _client(cfg.workers, cfg.scheduler)
    try:
        n_workers = cfg.workers or max(1, len(client.scheduler_info().get("workers", {})))
        threads = threads_per_worker(n_workers) if cfg.workers else 0

        def submit(split: str, start: int, stop: int, path: Path, batches: list):
            """Encode one shard's tokens now (not every shard's up front) and send it."""
            job = ShardJob(
                path=str(path),
                split=split,
                start=start,
                stop=stop,
                identity=run.identity,
                backbone=cfg.backbone,
                seed=cfg.seed,
                load_dtype=cfg.load_dtype,
                input_scale=cfg.input_scale,
                spec=run.task.spec,
                input_layer=layer,
                depths=run.depths,
                dtype=run.dtype,
                device=str(run.device),
                compile=compile,
                batch_size=run.batch_size,
                padded=run.padded,
                readout=run.cfg.readout,
                threads=threads,
                batches=[(rows, *run.tokens(split, rows)) for rows in batches],
                engine=engine,
                tokens=run.tokens_total,
                calibration=calibration,
                labels=run.data[split].labels[start:stop],
                lengths=run.data[split].lengths[start:stop],
            )
            future = client.submit(run_shard, job, pure=False, retries=2, key=f"reservoir-shard-{path.name}")
            sizes[future] = stop - start
            return future

        # at most two shards per worker in flight: the driver holds a few shards' tokens, not the dataset's
        pending, sizes = iter(todo.items()), {}
        first = [submit(*key, *value) for key, value in itertools.islice(pending, 2 * n_workers)]
        with bar(
            sum(stop - start for _, start, stop in todo), f"{run.task.name} shards", enabled=progress
        ) as shown:
            running = as_completed(first)
            for future in running:
                future.result()  # a worker's error is raised here, with its message
                shown.update(sizes.pop(future))
                for key, value in itertools.islice(pending, 1):
                    running.add(submit(*key, *value))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

"""The HDF5 feature store: one file per run identity (:mod:`reservoir.identity`).

Layout (the full one: docs/guide/feature-file.md)::

    /                      attrs: identity (JSON), identity_hash, readable copies, config (JSON), version, complete
    /input_layer/<name>    float32 tensors of the frozen input layer
    /<split>/features      (N, n_depths, n_readout, d_model) in the store dtype (:mod:`reservoir.extract.stored`),
                           one chunk per depth of a row block, each with a Fletcher-32 checksum
    /<split>/labels        (N, *label_shape)
    /<split>/lengths       (N,) real tokens per example
    /<split>/done          (N,) bool, rows written so far; attrs rows_done

A run writes ``FILE.partial`` and renames it to ``FILE`` only when every row of every split is written
(``complete`` set); a killed run resumes from the ``.partial`` file only when its identity equals the
one recorded there. Datasets are created without timestamps, so the same command with the same seed
writes the same bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from reservoir import __version__
from reservoir.errors import IdentityError, StoreError, UsageError, WriteFailed, write_failure
from reservoir.extract.digests import (
    BLOCK_BYTES,
    DIGESTS,
    FIX_FORCE,
    RunningDigests,
    check_recorded,
    depth_digest,
    feature_splits,
    seal,
)
from reservoir.extract.h5 import h5_file
from reservoir.extract.stored import STORED, as_float32, finite, store_of, to_stored
from reservoir.identity import array_digest, canonical, differences, digest

CHUNK_BYTES = 1 << 20
FIX_OTHER = "pass another --out, or delete it to extract again"
#: what to do about a file given to read features from that is not a complete feature file
FIX_READ = "pass a feature file `reservoir extract` wrote (it prints its path)"


def create_features(
    group: h5py.Group, n: int, shape: tuple[int, int, int], store: str = "float32"
) -> h5py.Dataset:
    """The ``features`` dataset ``(n, n_depths, n_readout, d)`` in the dtype ``store``: chunks of whole rows
    of one depth, each with a Fletcher-32 checksum."""
    dtype = STORED[store]
    rows = max(1, min(n, CHUNK_BYTES // (dtype.itemsize * shape[1] * shape[2])))
    ds = group.create_dataset(
        "features",
        shape=(n, *shape),
        dtype=dtype,
        chunks=(rows, 1, *shape[1:]),
        fletcher32=True,
        track_times=False,
    )
    if store == "bfloat16":
        ds.attrs["encoding"] = "bfloat16"
    return ds


#: the names of the ``features`` dataset's dimensions, as HDF5 dimension labels
FEATURE_DIMS = ("row", "depth", "readout", "feature")


def name_dimensions(group: h5py.Group, depths) -> None:
    """Label the dimensions of ``group["features"]`` (:data:`FEATURE_DIMS`) and attach a ``depth`` dimension
    scale holding the depths, for any HDF5 reader."""
    scale = group.create_dataset("depth", data=np.asarray(depths, dtype=np.int64), track_times=False)
    scale.make_scale("depth")
    features = group["features"]
    for i, name in enumerate(FEATURE_DIMS):
        features.dims[i].label = name
    features.dims[1].attach_scale(scale)


def partial_path(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def _open_h5(path: Path, mode: str = "r", fix: str = FIX_OTHER) -> h5py.File:
    """Open an HDF5 file, translating h5py's errors into what the file is and what to do (``fix``)."""
    try:
        return h5_file(path, mode)
    except OSError as e:
        if not h5py.is_hdf5(path):
            raise StoreError(
                f"{path} is not an HDF5 feature file (it is {path.stat().st_size:,d} bytes of something "
                f"else); {fix}"
            ) from None
        raise StoreError(
            f"{path} is an HDF5 file that cannot be opened ({str(e).splitlines()[0]}); it may be "
            f"truncated or in use by another program; {fix}"
        ) from None


def stored_identity(f: h5py.File, fix: str = FIX_OTHER) -> dict[str, Any]:
    """The identity recorded in a feature file; StoreError (saying ``fix``) for a file without one."""
    if "identity" not in f.attrs:
        version = f.attrs.get("version")
        what = (
            f"written by reservoir {version} (an older format without a run identity)"
            if version is not None
            else "not a reservoir feature file (no identity recorded)"
        )
        raise StoreError(f"{f.filename} is {what}; {fix}")
    with contextlib.suppress(ValueError, TypeError):
        identity = json.loads(f.attrs["identity"])
        # a run's identity holds every field its readers read (one of a run's data: its splits and options too)
        need = {*HEADER, *(("splits", "task_options") if "data" in identity else ())}
        if isinstance(identity, dict) and need <= identity.keys():
            return identity
    raise StoreError(f"{f.filename}: its recorded identity is damaged; {FIX_FORCE}")


def check_identity(f: h5py.File, wanted: dict[str, Any], fix: str = FIX_OTHER) -> None:
    """Raise IdentityError naming every field where ``f``'s identity differs from ``wanted``."""
    diff = differences(stored_identity(f), wanted)
    if diff:
        raise IdentityError(f"{f.filename} holds features of another run ({'; '.join(diff)}); {fix}")


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def writer_of(path: Path) -> str | None:
    """Who holds ``path``'s writer lock (``pid N on HOST``), or ``None`` when no live process writes it."""
    import fcntl

    try:
        fd = os.open(lock_path(Path(path)), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None


class WriterLock:
    """One writer per feature file: an exclusive ``flock`` on ``FILE.lock``, taken before the ``.partial``
    is touched, released by the kernel when its holder dies; a second live writer is refused."""

    def __init__(self, path: Path):
        import fcntl
        import socket

        self.path = lock_path(Path(path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (
                errno.EWOULDBLOCK,
                errno.EAGAIN,
                errno.EACCES,
            ):  # no lock to be had, not a holder
                os.close(self.fd)
                raise StoreError(
                    f"{path} cannot be locked against a second writer on this filesystem ({e.strerror}); pass "
                    "an --out on a filesystem with file locks (a local disk; NFS with lockd, Lustre with -o flock)"
                ) from None
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            raise StoreError(
                f"{path} is being written by {holder}; wait for that run to finish or stop it, "
                "or pass another --out"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)

    def release(self, remove: bool = False) -> None:
        if self.fd is None:
            return
        if remove:  # the file is complete: later runs reuse it and need no lock
            with contextlib.suppress(OSError):
                os.remove(self.path)
        os.close(self.fd)  # closing drops the flock
        self.fd = None


def shard_dir(path: Path) -> Path:
    """Where the shards of a distributed extraction of ``path`` live: ``FILE.shards/``."""
    return path.with_name(path.name + ".shards")


def check_shards(f: h5py.File) -> None:
    """Every shard a joined file reads through its virtual datasets is present (a missing one
    would read as fill values)."""
    folder = Path(f.filename).parent
    for name in feature_splits(f):
        ds = f[name].get("features")  # None where a damaged link lost it: verify names that
        if ds is None or not ds.is_virtual:
            continue
        missing = sorted({s.file_name for s in ds.virtual_sources() if not (folder / s.file_name).exists()})
        if missing:
            raise StoreError(
                f"{f.filename} reads its features from {len(missing)} shard file(s) that are gone "
                f"(e.g. {folder / missing[0]}); delete {f.filename} and rerun the extraction to redo them"
            )


def check_complete_match(path: Path, identity: dict[str, Any], fix: str = FIX_FORCE) -> None:
    """An existing file at ``path`` may be reused: a complete feature file of this very run whose contents
    pass :func:`verify` (IdentityError or StoreError otherwise)."""
    with _open_h5(path) as f:
        check_identity(f, identity)
        check_ready(f)
        verify(f, fix=fix)


def move_aside(path: Path, identity: dict[str, Any]) -> Path:
    """``--force``: move the complete file of this very run at ``path`` aside (``FILE.old``, ``FILE.old-2``,
    ...); a file of another run is refused as without it, an HDF5 file too damaged to open moved aside too."""
    try:
        with _open_h5(path) as f:
            check_identity(f, identity)
    except IdentityError:  # a file of another run, which it names: never moved
        raise
    except StoreError:
        if not h5py.is_hdf5(path):
            raise
        print(
            f"{path} cannot be opened (truncated or damaged), so its run is unknown; moving it aside",
            file=sys.stderr,
        )
    aside, n = path.with_name(path.name + ".old"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.old-{n}")
    os.replace(path, aside)
    return aside


#: the recorded extract options that change the features (:func:`extract_command` gives those not at default)
REPRODUCED = "split limit seed input_scale load_dtype store_dtype dtype depths readout".split()  # noqa: SIM905


def extract_command(f: h5py.File) -> str:
    """The ``reservoir extract`` command that writes ``f`` again, from its recorded options, with ``--force``."""
    return command_of(file_config(f), "--out", str(f.filename), "--force")


def command_of(c: dict[str, Any], *extra: str) -> str:
    """The ``reservoir extract`` command of the options in ``c`` (a feature file's :func:`file_config`, or
    the settings a search for one asks for), those at their default left out, then ``extra``."""
    import shlex

    from reservoir.config import ExtractConfig
    from reservoir.paths import default_data_dir
    from reservoir.settings import default, option_name

    words = ["reservoir", "extract", "--task", c["task"]] + (
        ["--backbone", c["backbone"]] if c.get("backbone") else []
    )
    for key, value in sorted(c.get("task_options", {}).items()):
        words += ["--task-opt", f"{key}={value}"]
    for key in REPRODUCED:
        value = c.get(key)
        if value not in (None, "all" if key == "depths" else None, default(ExtractConfig, key)):
            shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            words += [option_name(ExtractConfig, key), shown]
    if c.get("data_dir") and c["data_dir"] != str(default_data_dir()):
        words += ["--data-dir", c["data_dir"]]
    return shlex.join([*words, *extra])


def check_ready(f: h5py.File) -> None:
    """A feature file that may be read: marked complete, and every shard it reads present."""
    if not f.attrs.get("complete", False):
        final = Path(f.filename[: -len(".partial")] if f.filename.endswith(".partial") else f.filename)
        if writer := writer_of(final):
            raise StoreError(
                f"feature file {f.filename} is still being written by {writer} (`reservoir extract` is "
                "running); wait for it to finish, then read the complete file it prints"
            )
        if f.filename.endswith(".partial"):
            raise StoreError(
                f"feature file {f.filename} is not complete; rerun `reservoir extract` to finish it"
            )
        # a file gets its final name only once complete: one that is not was damaged since
        raise StoreError(
            f"feature file {f.filename} is not marked complete, though at its final name: it is damaged; {FIX_FORCE}"
        )
    check_shards(f)


def readable(f: h5py.File) -> bool:
    """Every chunk of every split's features reads back through its Fletcher-32 check."""
    for name in feature_splits(f):
        ds = f[name]["features"]
        try:
            for index in ds.iter_chunks():
                ds[index]
        except OSError:
            return False
    return True


# ---------------------------------------------------------------- content digests: verify before trust


def check_header(f: h5py.File, fix: str = FIX_FORCE, shard: bool = False) -> dict[str, Any]:
    """A complete file's identity, once its readable attributes agree with it and every split it names is
    there (a ``shard`` holds one); StoreError saying ``fix`` otherwise."""
    identity = stored_identity(f, fix)
    told = {"identity_hash": digest(identity)} | {k: identity[k] for k in HEADER if k in identity}
    for key, value in told.items():
        held = f.attrs.get(key)
        held = held.tolist() if hasattr(held, "tolist") else held
        if held != value:
            raise StoreError(
                f"{f.filename}: its {key} attribute ({held!r}) is not its identity's ({value!r}): the file was "
                f"edited or damaged since it was completed; {fix}"
            )
    missing = [s for s in identity.get("splits", []) if s not in f and not shard]
    if missing:
        raise StoreError(
            f"{f.filename}: split {missing[0]!r} of its identity is missing: the file is damaged; {fix}"
        )
    return identity


def verify(
    f: h5py.File,
    depths: list[int] | None = None,
    splits: list[str] | None = None,
    fix: str = FIX_FORCE,
    shard: bool = False,
) -> None:
    """Before a complete file is trusted: its readable attributes agree with its identity, every split
    the identity names is there and fully written; read ``depths`` of ``splits`` (default: all) through
    their checksums, refuse NaN or inf, and compare every digest with the one recorded at completion
    (StoreError saying ``fix`` otherwise). Files of formats before digests were recorded (1 and 2) are
    checked for readable chunks and finite values only. A ``shard`` holds one split of its run's identity."""
    identity = check_header(f, fix, shard)
    stored_depths = [int(d) for d in f.attrs["depths"]]
    for split in feature_splits(f) if splits is None else splits:
        g = f[split]
        try:
            recorded = json.loads(g.attrs[DIGESTS]) if DIGESTS in g.attrs else None
            labels, lengths = g["labels"][:], g["lengths"][:]
            written = bool(g["done"][:].all()) if "done" in g else identity.get("format", 0) < DIGESTED_FORMAT
            g["features"]  # noqa: B018 - the dataset is there
        except (OSError, ValueError, KeyError) as e:
            raise StoreError(
                f"{f.filename}: split {split!r} cannot be read ({(str(e).splitlines() or [type(e).__name__])[0]}): "
                f"the file is corrupt; {fix}"
            ) from None
        check_recorded(f"{f.filename}: split {split!r}", recorded, len(stored_depths), fix)
        if not written or (recorded is None and identity.get("format", 0) >= DIGESTED_FORMAT):
            why = "rows never written" if not written else "no digests recorded at completion"
            raise StoreError(f"{f.filename}: split {split!r} has {why}: the file is damaged; {fix}")
        for depth in stored_depths if depths is None else depths:
            k = depth_index(f, depth)
            where = f"{f.filename}: split {split!r}, depth {depth}"
            got = depth_digest(g["features"], k, where, fix)
            if recorded is not None and got != recorded["features"][k]:
                raise StoreError(
                    f"{where}: the features differ from the digest recorded when the file was completed "
                    f"(changed or damaged since); {fix}"
                )
        if recorded is not None:
            for name, values in (("labels", labels), ("lengths", lengths)):
                if array_digest(values) != recorded[name]:
                    raise StoreError(
                        f"{f.filename}: split {split!r}: the {name} differ from the digest recorded when "
                        f"the file was completed (changed or damaged since); {fix}"
                    )


#: room left for HDF5 metadata beside the features when checking free space
HEADROOM_BYTES = 1 << 20


def check_space(path: Path, nbytes: int) -> None:
    """Refuse before writing when the disk holding ``path`` has less free space than ``nbytes`` (plus
    :data:`HEADROOM_BYTES`)."""
    import shutil

    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < nbytes + HEADROOM_BYTES:
        raise StoreError(
            f"{path} needs about {(nbytes + HEADROOM_BYTES) / 2**20:,.1f} MiB and {path.parent} has "
            f"{free / 2**20:,.1f} MiB free: the disk is full. Free space (or pass --out on "
            "another disk) and rerun the same command"
        )


#: what failed writes left behind (the exception, the open file), referenced until the process ends (the
#: command line ends it right after reporting): freeing HDF5 objects whose writes failed can crash the interpreter
_FAILED: list = []


def write_failed(path: Path, e: Exception, *keep: Any) -> WriteFailed:
    """A failed write in the user's words: a full disk says so, every case says what to do.
    ``e`` and ``keep`` (the file) are kept alive, never closed (:data:`_FAILED`)."""
    _FAILED.append((e, keep))
    what, fix = write_failure(e)
    if fix.startswith(("Free", "Check")):
        fix += " (or pass --out on another disk)"
    elif fix.startswith(("Make", "Choose")):
        fix += " (or another --out)"
    # a file removed while written leaves nothing to resume from
    then = "it starts over" if getattr(e, "errno", None) == errno.ENOENT else "it resumes where it stopped"
    return WriteFailed(f"writing {path} stopped: {what}. {fix} and rerun the same command: {then}")


class FeatureWriter:
    """Incremental, resumable writer. Use :meth:`open`, then ``split``/``write``, then :meth:`finish`."""

    def __init__(self, path: Path, f: h5py.File, lock: WriterLock):
        self.path, self.f, self.lock = path, f, lock
        self.handles: dict[str, tuple] = {}
        self.failed = False
        self.digests = RunningDigests()
        self.store = store_of(stored_identity(f))

    @classmethod
    def open(
        cls,
        path: Path,
        identity: dict[str, Any],
        config: dict[str, Any],
        input_layer: dict[str, Any],
        nbytes: int = 0,
    ) -> FeatureWriter:
        """Lock ``path``, then open ``path.partial`` for writing, resuming it when its identity equals
        ``identity`` (IdentityError otherwise); a new file must find ``nbytes`` free on its disk."""
        path = Path(path)
        lock = WriterLock(path)
        try:
            return cls._open(path, identity, config, input_layer, lock, nbytes)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _open(
        cls,
        path: Path,
        identity: dict[str, Any],
        config: dict[str, Any],
        input_layer: dict[str, Any],
        lock: WriterLock,
        nbytes: int,
    ) -> FeatureWriter:
        tmp = partial_path(path)
        if tmp.exists():
            f = None
            try:
                f = h5_file(tmp, "r+")
                old = stored_identity(f)
            except (OSError, KeyError, ValueError, StoreError):
                if f is not None:
                    f.close()
                os.remove(tmp)  # unreadable leftovers of a killed run hold nothing to resume
            else:
                diff = differences(old, identity)
                if diff:
                    f.close()
                    raise IdentityError(
                        f"{tmp} is an unfinished run with other settings ({'; '.join(diff)}); rerun with the same "
                        "options to resume it, pass another --out, or delete it to start over"
                    )
                if any(f[name]["features"].is_virtual for name in feature_splits(f)):
                    f.close()
                    raise StoreError(
                        f"{tmp} was joined from the shards of a run with --workers and not finished; rerun with "
                        "--workers to finish it from its shards, or delete it to extract in one process"
                    )
                if readable(f):
                    return cls(path, f, lock)
                f.close()  # a chunk torn by a kill mid-write: start over rather than trust it
                print(
                    f"{tmp} has a chunk that fails its checksum (a write was cut short); starting over",
                    file=sys.stderr,
                )
                os.remove(tmp)
        check_space(tmp, nbytes)  # a resumed file has its space already
        f = None
        try:
            f = h5_file(tmp, "w", track_order=False)
            _write_header(f, identity, config, input_layer)
            f.flush()
        except (OSError, RuntimeError) as e:
            raise write_failed(tmp, e, f) from None
        return cls(path, f, lock)

    def split(
        self, name: str, labels: np.ndarray, lengths: np.ndarray, shape: tuple[int, int, int]
    ) -> np.ndarray:
        """Create (or reopen) a split; returns its ``done`` mask."""
        if name in self.f:
            held = self.f[name]["features"].shape
            if held == (len(labels), *shape):
                done = self.f[name]["done"][:]
                self.digests.start(name, self.f[name]["features"], fresh=not done.any())
                return done
            print(  # the same identity read by another version of an adapter, at another width
                f"{partial_path(self.path)} holds {name} features of shape {held}, this run writes "
                f"{(len(labels), *shape)}; starting {name} over",
                file=sys.stderr,
            )
            del self.f[name]
        try:
            self._create(name, labels, lengths, shape)
        except (OSError, RuntimeError) as e:
            raise self._failed(e) from None
        self.digests.start(name, self.f[name]["features"], fresh=True)
        return np.zeros(len(labels), dtype=bool)

    def _create(
        self, name: str, labels: np.ndarray, lengths: np.ndarray, shape: tuple[int, int, int]
    ) -> None:
        n = len(labels)
        g = self.f.create_group(name)
        create_features(g, n, shape, self.store)
        name_dimensions(g, self.f.attrs["depths"])
        g.create_dataset("labels", data=labels, track_times=False)
        g.create_dataset("lengths", data=lengths, track_times=False)
        g.create_dataset("done", shape=(n,), dtype=bool, fillvalue=False, track_times=False)
        g.attrs["rows_done"] = 0
        self.f.flush()

    def write(self, split: str, rows: np.ndarray, features: np.ndarray) -> None:
        """Write ``features`` (float32, or already in the stored dtype) for the (increasing) row indices
        ``rows``, then mark them done."""
        features = to_stored(features, self.store)
        ok = finite(features).reshape(len(rows), -1).all(1)
        if not ok.all():
            bad = int(rows[np.flatnonzero(~ok)[0]])
            if self.store == "float16":
                raise StoreError(
                    f"row {bad} of split {split!r} has a feature that is NaN, inf or beyond float16's range "
                    "(65,504); nothing was stored for it. Store as bfloat16 or float32 (--store-dtype), or "
                    "check the input data"
                )
            dtype = stored_identity(self.f).get("dtype")
            raise StoreError(
                f"the backbone produced NaN or inf features for row {bad} of split {split!r} in {dtype}; "
                "nothing was stored for it. Check the input data and --input-scale"
                + ("" if dtype == "float32" else ", or try --dtype float32")
            )
        sel = slice(int(rows[0]), int(rows[-1]) + 1) if len(rows) and np.all(np.diff(rows) == 1) else rows
        try:
            self._write(split, sel, len(rows), features)
        except (OSError, RuntimeError) as e:  # h5py reports failed flushes as RuntimeError
            raise self._failed(e) from None

    def _write(self, split: str, sel, n: int, features: np.ndarray) -> None:
        if split not in self.handles:  # kept open for the run: no handle is created and dropped per write
            g = self.f[split]
            self.handles[split] = (g, g["features"], g["done"])
        g, ds, done = self.handles[split]
        ds[sel] = features
        self.digests.add(split, sel.start if isinstance(sel, slice) else -1, features, ds.dtype)
        self.f.flush()  # features reach the file before the rows are marked done
        done[sel] = True
        g.attrs["rows_done"] = int(g.attrs["rows_done"]) + n
        self.f.flush()

    def finish(self) -> Path:
        """Mark complete and move into place; returns the final path."""
        for name, g in self.f.items():
            if name != "input_layer" and not g["done"][:].all():
                raise StoreError(f"split {name!r} of {self.path} is not fully written")
        try:
            self.handles.clear()
            self.f.flush()
            seal(self.f, self.digests)  # the digests verification compares with, of what the file holds
            self.f.attrs["complete"] = True
            self.f.close()
        except (OSError, RuntimeError) as e:  # h5py reports failed flushes as RuntimeError
            raise self._failed(e) from None
        os.replace(partial_path(self.path), self.path)
        self.lock.release(remove=True)
        return self.path

    def _failed(self, e: Exception) -> WriteFailed:
        """A write failed: the file is left open and referenced (never closed), the lock released by close."""
        self.failed = True
        return write_failed(partial_path(self.path), e, self.f, self.handles)

    def close(self) -> None:
        """Close the file (unless a write failed: see :data:`_FAILED`) and release the lock."""
        self.digests.close()
        try:
            if not self.failed and self.f.id.valid:
                self.handles.clear()
                self.f.close()
        finally:
            self.lock.release()


def write_joined(
    out: Path,
    identity: dict[str, Any],
    config: dict[str, Any],
    input_layer: dict[str, Any],
    splits: dict[str, tuple[np.ndarray, np.ndarray, list[tuple[int, int, Path]]]],
    shape: tuple[int, int, int],
) -> Path:
    """Write ``out`` whose features are virtual datasets over shard files (no copy). ``splits`` maps a split
    to its labels, lengths and ``(start, stop, shard path)`` list."""
    tmp = partial_path(out)
    with h5_file(tmp, "w", track_order=False) as f:
        _write_header(f, identity, config, input_layer)
        store = store_of(identity)
        for name, (labels, lengths, shards) in splits.items():
            g = f.create_group(name)
            layout = h5py.VirtualLayout(shape=(len(labels), *shape), dtype=STORED[store])
            for start, stop, path in shards:
                rel = os.path.relpath(path, out.parent)  # resolved next to the joined file
                layout[start:stop] = h5py.VirtualSource(rel, f"{name}/features", shape=(stop - start, *shape))
            unmapped = 0x7FC0 if store == "bfloat16" else np.nan  # NaN, refused by verification
            g.create_virtual_dataset("features", layout, fillvalue=unmapped)
            if store == "bfloat16":
                g["features"].attrs["encoding"] = "bfloat16"
            name_dimensions(g, identity["depths"])
            g.create_dataset("labels", data=labels, track_times=False)
            g.create_dataset("lengths", data=lengths, track_times=False)
            g.create_dataset("done", data=np.ones(len(labels), dtype=bool), track_times=False)
            g.attrs["rows_done"] = len(labels)
        f.attrs["sharded"] = True
        f.flush()
        seal(f)  # read through the shards: each chunk's checksum, finite values, the digests recorded
        f.attrs["complete"] = True
    os.replace(tmp, out)
    return out


#: the identity's fields a feature file also holds as attributes of their own, for reading at a glance
HEADER = ("task", "backbone", "seed", "dtype", "readout", "depths")
#: the first feature format whose complete files record their digests
DIGESTED_FORMAT = 3


def _write_header(
    f: h5py.File, identity: dict[str, Any], config: dict[str, Any], input_layer: dict[str, Any]
) -> None:
    f.attrs["identity"] = canonical(identity)
    f.attrs["identity_hash"] = digest(identity)
    f.attrs.update({k: identity[k] for k in HEADER if k != "depths"})
    f.attrs["depths"] = np.asarray(identity["depths"], dtype=np.int64)
    if identity.get("class_names"):
        f.attrs["class_names"] = json.dumps(identity["class_names"])
    f.attrs["config"] = json.dumps(config, sort_keys=True)
    f.attrs["version"] = __version__
    f.attrs["complete"] = False
    g = f.create_group("input_layer")
    for name, tensor in input_layer.items():
        g.create_dataset(name, data=np.asarray(tensor, dtype=np.float32), track_times=False)


def open_features(path: Path) -> h5py.File:
    """Open a complete feature file read-only; raises StoreError otherwise."""
    path = Path(path)
    if not path.exists():
        if writer := writer_of(path):
            raise StoreError(
                f"feature file {path} is still being written by {writer} (`reservoir extract` is running); "
                "wait for it to finish, then run this again"
            )
        hint = (
            f" (an unfinished run left {partial_path(path)}: rerun extract to resume it)"
            if partial_path(path).exists()
            else ""
        )
        raise StoreError(f"feature file {path} does not exist{hint}; run `reservoir extract` first")
    if path.is_dir():
        raise StoreError(
            f"{path} is a folder, not a feature file; pass the .h5 file `reservoir extract` printed"
        )
    f = _open_h5(path, fix=FIX_READ)
    try:
        stored_identity(f, FIX_READ)
        check_ready(f)
    except BaseException:
        f.close()
        raise
    return f


def file_config(f: h5py.File) -> dict[str, Any]:
    return json.loads(f.attrs["config"])


def class_names(f: h5py.File) -> list[str] | None:
    """The name of each class id of a feature file's labels, where its data named them; ``None`` otherwise."""
    if "class_names" in f.attrs:
        return [str(n) for n in json.loads(f.attrs["class_names"])]
    names = stored_identity(f).get("class_names")
    return [str(n) for n in names] if names else None


def name_of(names: list[str] | None, label: Any) -> str:
    """The name of class id ``label`` (its number as text where ``names`` has none)."""
    k = int(label)
    return names[k] if names is not None and 0 <= k < len(names) else str(k)


def depth_index(f: h5py.File, depth: int) -> int:
    """Where ``depth`` is among the file's depths (a negative one counts from the deepest stored, as
    ``--depths`` does); a value that is not an integer (a bool, a float, text) is refused."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
        raise UsageError(
            f"depth {depth!r} is not a depth: give an integer (a negative one counts from the deepest stored)"
        )
    depths = [int(d) for d in f.attrs["depths"]]
    at = max(depths) + 1 + depth if depth < 0 else depth
    if at not in depths:
        raise UsageError(f"depth {depth} is not in {f.filename}; it holds depths {depths}")
    return depths.index(at)


def read_depth(f: h5py.File, split: str, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Features ``(N, n_readout, d_model)`` and labels of one depth of one split (:func:`read_depths`)."""
    X, labels = read_depths(f, split, [depth])
    return X[:, 0], labels


def read_depths(f: h5py.File, split: str, depths: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features ``(N, n_depths, n_readout, d_model)`` float32 and labels of several depths (default: every
    stored one) of one split, the blocks of :func:`iter_depth`, checked the same way, joined."""
    if split not in f:
        raise UsageError(f"split {split!r} is not in {f.filename}; it holds {feature_splits(f)}")
    depths = [int(d) for d in f.attrs["depths"]] if depths is None else list(depths)
    for depth in depths:
        depth_index(f, depth)  # every depth present before anything is read
    ds = f[split]["features"]
    out = np.empty((ds.shape[0], len(depths), *ds.shape[2:]), dtype=np.float32)
    for j, depth in enumerate(depths):
        start = 0
        for X, _ in iter_depth(f, split, depth):
            out[start : start + len(X), j] = X
            start += len(X)
    return out, f[split]["labels"][:]


def iter_depth(
    f: h5py.File, split: str, depth: int, rows: int | None = None, select: np.ndarray | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream one depth in blocks of ``rows`` (default: about :data:`BLOCK_BYTES`); with ``select``
    (increasing row indices) only those rows. A corrupt chunk or a non-finite value raises StoreError."""
    if split not in f:
        raise UsageError(f"split {split!r} is not in {f.filename}; it holds {feature_splits(f)}")
    k = depth_index(f, depth)
    ds, labels = f[split]["features"], f[split]["labels"]
    rows = rows or max(1, BLOCK_BYTES // (4 * int(np.prod(ds.shape[2:]))))
    for start in range(0, ds.shape[0] if select is None else len(select), rows):
        index = slice(start, start + rows) if select is None else select[start : start + rows]
        try:
            X = as_float32(ds[index, k])
        except OSError as e:
            raise StoreError(
                f"{f.filename}: split {split!r}, depth {depth} cannot be read "
                f"({str(e).splitlines()[0]}); the file is corrupt: delete it and extract again"
            ) from None
        if not np.isfinite(X).all():
            raise StoreError(
                f"{f.filename}: split {split!r}, depth {depth} holds NaN or inf features; "
                "delete the file and extract again (check the input data and --input-scale; under a half-"
                "precision --dtype, try --dtype float32)"
            )
        yield X, labels[index]

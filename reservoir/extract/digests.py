"""Content digests of the feature store: per depth, the SHA-256 of its rows in row order, computed from what a
file holds (every chunk read through its Fletcher-32 check) or as a writer writes the rows
(:class:`RunningDigests`); recorded when a file is completed and compared on every reuse
(:func:`reservoir.extract.store.verify`)."""

from __future__ import annotations

import json
from typing import Any

import h5py
import numpy as np

from reservoir.errors import StoreError
from reservoir.extract.stored import finite

#: attribute (JSON) of each split's group, written when the file is completed: ``features``, one SHA-256 per
#: stored depth of its rows in row order, and ``labels`` and ``lengths`` (:func:`reservoir.identity.array_digest`)
DIGESTS = "sha256"
#: what to do about a complete file whose contents fail verification
FIX_FORCE = (
    "extract it again with --force (the same `reservoir extract` command plus --force: the damaged file "
    "is moved aside and a new one written)"
)

#: bytes of features read at a time when a depth is streamed
BLOCK_BYTES = 32 << 20


def feature_splits(f: h5py.File) -> list[str]:
    return [k for k in f if k != "input_layer"]


def block_rows(ds: h5py.Dataset) -> int:
    """Rows of one depth read at a time (about :data:`BLOCK_BYTES`), a whole number of chunks."""
    rows = max(1, BLOCK_BYTES // (4 * int(np.prod(ds.shape[2:])) or 1))
    chunk = ds.chunks[0] if ds.chunks else 1
    return max(chunk, rows // chunk * chunk)


def depth_hasher(ds: h5py.Dataset):
    """The SHA-256 of one depth of ``ds`` before its rows: fed the rows' bytes in row order, its digest is
    :func:`depth_digest`'s."""
    import hashlib

    return hashlib.sha256(f"{ds.dtype.str}{(ds.shape[0], *ds.shape[2:])}".encode())


def check_recorded(where: str, recorded: Any, n_depths: int, fix: str) -> None:
    """The digests recorded for a split at completion (``None``: a format before them) are whole: those of its
    labels, its lengths and one a depth; StoreError saying ``fix`` otherwise."""
    if recorded is None:
        return
    kept = recorded if isinstance(recorded, dict) else {}
    depths = kept.get("features")
    if not ({"labels", "lengths"} <= kept.keys() and isinstance(depths, list) and len(depths) == n_depths):
        raise StoreError(f"{where}: its recorded digests are damaged; {fix}")


def depth_digest(ds: h5py.Dataset, k: int, where: str, fix: str, h=None, start: int = 0) -> str:
    """SHA-256 of depth index ``k`` of a features dataset, every chunk read through its Fletcher-32
    check; a chunk that fails it, or a NaN or inf, raises StoreError starting with ``where``. ``h`` and
    ``start``: a hasher already fed the rows before ``start`` (:class:`RunningDigests`)."""
    h = depth_hasher(ds) if h is None else h
    rows = block_rows(ds)
    for first in range(start, ds.shape[0], rows):
        try:
            X = ds[first : first + rows, k]
        except OSError as e:
            raise StoreError(
                f"{where} cannot be read ({str(e).splitlines()[0]}): the file is corrupt; {fix}"
            ) from None
        ok = finite(X).reshape(len(X), -1).all(1)
        if not ok.all():
            raise StoreError(
                f"{where} holds NaN or inf features (row {first + int(np.flatnonzero(~ok)[0])}); {fix}"
            )
        h.update(np.ascontiguousarray(X).data)
    return h.hexdigest()


def content_digests(
    f: h5py.File, split: str, fix: str = FIX_FORCE, running: RunningDigests | None = None
) -> dict[str, Any]:
    """The digests of one split (:data:`DIGESTS`), computed from what the file holds (the rows a
    writer's ``running`` digests have not taken read back from the file)."""
    from reservoir.identity import array_digest

    g, depths = f[split], [int(d) for d in f.attrs["depths"]]
    hashers, start = running.taken(split) if running is not None else (None, 0)
    return {
        "features": [
            depth_digest(
                g["features"],
                k,
                f"{f.filename}: split {split!r}, depth {d}",
                fix,
                None if hashers is None else hashers[k],
                start,
            )
            for k, d in enumerate(depths)
        ],
        "labels": array_digest(g["labels"][:]),
        "lengths": array_digest(g["lengths"][:]),
    }


def seal(f: h5py.File, running: RunningDigests | None = None) -> None:
    """Record every split's content digests (the last step before a file is marked complete)."""
    for split in feature_splits(f):
        f[split].attrs[DIGESTS] = json.dumps(
            content_digests(f, split, fix="the run is not marked complete; rerun it", running=running)
        )


class RunningDigests:
    """Each split's per-depth SHA-256 fed the rows a writer writes, on a thread of its own, while they
    arrive in row order from row 0; a split whose rows come out of order (a resumed run, length buckets)
    is read back when the file is completed. The bytes hashed are those the file holds, so the digests
    equal :func:`content_digests` of the file."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(1, thread_name_prefix="reservoir-digest")
        self.next: dict[str, int] = {}
        self.hashers: dict[str, list | None] = {}

    def start(self, split: str, ds: h5py.Dataset, fresh: bool) -> None:
        self.next[split] = 0
        self.hashers[split] = [depth_hasher(ds) for _ in range(ds.shape[1])] if fresh else None

    def add(self, split: str, first: int, features: np.ndarray, dtype: np.dtype) -> None:
        """Take rows ``first..`` of ``split`` (``features`` ``(n, depths, ...)``, not changed afterwards)."""
        hashers = self.hashers.get(split)
        if hashers is None or first != self.next[split]:
            self.hashers[split] = None  # out of order: this split is read back when the file is completed
            return
        self.next[split] = first + len(features)

        def feed() -> None:
            for k, h in enumerate(hashers):
                h.update(np.ascontiguousarray(features[:, k], dtype=dtype).data)

        self.pool.submit(feed)

    def taken(self, split: str) -> tuple[list | None, int]:
        """The hashers of ``split`` and the first row they have not taken (``(None, 0)``: none taken)."""
        self.pool.shutdown(wait=True)
        hashers = self.hashers.get(split)
        return (hashers, self.next[split]) if hashers is not None else (None, 0)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

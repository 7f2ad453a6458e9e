"""What verification costs: seconds per GB to verify a complete feature file before trusting it.

    .venv/bin/python benchmarks/verify.py                  # a 1 GB file in a temporary folder
    .venv/bin/python benchmarks/verify.py --gb 4 --dir /data/scratch --cold

Writes a feature file of about ``--gb`` GB through :class:`reservoir.extract.store.FeatureWriter`
(GPT-2 small's shape: 13 depths of one 768-wide readout token, float32; random values), so its
completion records the digests as an extraction does, then times:

- ``seal``: recording the digests at completion (:func:`reservoir.extract.digests.seal`, inside
  ``FeatureWriter.finish``): the rows the writer's running digests took while writing are not read
  back (:class:`reservoir.extract.digests.RunningDigests`), so for rows written in order this is the
  wait for the last batch's hashing;
- ``read``: reading every chunk of every depth through its Fletcher-32 check, nothing else;
- ``verify``: what ``extract`` runs before reusing the file and ``fit`` before reading it
  (:func:`reservoir.extract.store.verify`): the same reads, a NaN/inf check and a SHA-256 per depth
  compared with the recorded one.

Warm runs read from the page cache (the file was just written); ``--cold`` drops the page cache
before each run (needs root: ``/proc/sys/vm/drop_caches``), so they read from the disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reservoir.extract.digests import block_rows  # noqa: E402
from reservoir.extract.h5 import h5_file
from reservoir.extract.store import FeatureWriter, verify  # noqa: E402
from reservoir.runtime.machine import describe, load  # noqa: E402

DEPTHS, READOUT, WIDTH = 13, 1, 768


def write(path: Path, gb: float) -> tuple[int, float]:
    """A complete feature file of about ``gb`` GB; returns its size in bytes and the seconds its seal took."""
    from reservoir.extract import store

    rows = int(gb * 1e9 / (DEPTHS * READOUT * WIDTH * 4))
    n_test = rows // 5
    identity = {
        "task": "bench",
        "backbone": "bench",
        "seed": 0,
        "dtype": "float32",
        "readout": "last",
        "depths": list(range(DEPTHS)),
    }
    writer = FeatureWriter.open(path, identity, {}, {}, nbytes=int(gb * 1e9))
    rng = np.random.default_rng(0)
    try:
        for split, n in (("train", rows - n_test), ("test", n_test)):
            writer.split(split, np.arange(n) % 10, np.full(n, 64), (DEPTHS, READOUT, WIDTH))
            for start in range(0, n, 2048):
                stop = min(n, start + 2048)
                writer.write(
                    split,
                    np.arange(start, stop),
                    rng.standard_normal((stop - start, DEPTHS, READOUT, WIDTH), dtype=np.float32),
                )
        sealed = {}
        seal = store.seal

        def timed(f, running=None):
            start = time.perf_counter()
            seal(f, running)
            sealed["s"] = time.perf_counter() - start

        store.seal = timed
        try:
            writer.finish()
        finally:
            store.seal = seal
    finally:
        writer.close()
    return path.stat().st_size, sealed["s"]


def read_only(path: Path) -> None:
    with h5_file(path) as f:
        for split in ("train", "test"):
            ds = f[split]["features"]
            rows = block_rows(ds)
            for k in range(DEPTHS):
                for start in range(0, ds.shape[0], rows):
                    ds[start : start + rows, k]


def verify_file(path: Path) -> None:
    with h5_file(path) as f:
        verify(f)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the feature file")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write it [default: a temporary folder]"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each run (root)")
    args = parser.parse_args()
    import h5py
    import torch  # noqa: F401  (the versions line, as the other benchmarks print it)

    print(f"# benchmarks/verify.py --gb {args.gb:g}{' --cold' if args.cold else ''}")
    print(f"# {describe()}")
    print(f"# numpy {np.__version__}, h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}); {load()}")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = Path(folder) / "bench.h5"
        size, seal_s = write(path, args.gb)
        gb = size / 1e9
        print(
            f"# file: {gb:.3f} GB ({DEPTHS} depths x {READOUT} x {WIDTH} float32 per row, 1 MiB chunks with "
            "Fletcher-32)"
        )
        print(f"seal (at completion): {seal_s:.2f} s, {seal_s / gb:.2f} s/GB")
        for name, fn in (
            ("read through checksums", read_only),
            ("verify (read + finite + SHA-256)", verify_file),
        ):
            times = []
            for _ in range(args.reps):
                if args.cold:
                    drop_caches()
                start = time.perf_counter()
                fn(path)
                times.append(time.perf_counter() - start)
            best, median = min(times), statistics.median(times)
            print(
                f"{name}{' (cold)' if args.cold else ' (warm)'}: best {best:.2f} s, median {median:.2f} s; "
                f"{best / gb:.2f} s/GB ({gb / best:.2f} GB/s)"
            )
    print(f"# after: {load()}")


if __name__ == "__main__":
    main()

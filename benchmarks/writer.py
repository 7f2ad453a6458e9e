"""The feature writer alone, fed as fast as it takes batches: can it keep pace with a card?

    .venv/bin/python benchmarks/writer.py --rows 60000                       # make gpu's job shape
    .venv/bin/python benchmarks/writer.py --rows 60000 --before ../before    # two checkouts, interleaved
    .venv/bin/python benchmarks/writer.py --rows 60000 --store-dtypes float32,bfloat16,float16

Each timing is a fresh process (``PYTHONPATH`` the checkout) that opens a :class:`FeatureWriter` for
``--rows`` rows of GPT-2 small's every depth (13 x 768 float32 a row, the 60,000-row MNIST job's 2.4 GB),
submits ready-made batches of ``--batch`` rows to the :class:`BackgroundWriter` as ``reservoir extract``
does, as fast as the writer takes them (a model of infinite speed), and finishes the file. Reported:
the seconds the producer waited for the writer (all of the batches' time here, since producing costs
nothing), the seconds ``finish`` took (flush, digests, closing), the whole, and the GB/s of features
written; the disk's own sequential write rate is measured in the same run (``dd``-like, 1 GiB, fsync)
for the limit. The checkouts alternate when two are given. With ``--store-dtypes`` one checkout writes the
features in each dtype (``reservoir extract --store-dtype``), handed to it already rounded, as a card hands
them; GB/s counts the float32 features they stand for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from child import tagged_json  # benchmarks/child.py, beside this script

CHILD = r"""
import json, sys, time, tempfile
from pathlib import Path
import numpy as np
from reservoir.extract.run import BackgroundWriter
from reservoir.extract.store import FeatureWriter

rows, batch, folder, store = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
shape = (13, 1, 768)
identity = {"task": "writer", "backbone": "none", "seed": 0, "dtype": "float32", "readout": "last", "depths": list(range(13)), "rows": rows}
rng = np.random.default_rng(0)
pool = [rng.standard_normal((batch, *shape), dtype=np.float32) for _ in range(4)]
if store != "float32":
    from reservoir.extract.stored import to_stored
    identity["store_dtype"] = store
    pool = [to_stored(x, store) for x in pool]
writer = FeatureWriter.open(folder / "f.h5", identity, {}, {"w": np.zeros(2, np.float32)}, nbytes=rows * 4 * 13 * 768)
writer.split("train", np.zeros(rows, np.int64), np.full(rows, 64, np.int64), shape)
background = BackgroundWriter(writer)
start = time.perf_counter()
for i, first in enumerate(range(0, rows, batch)):
    idx = np.arange(first, min(first + batch, rows))
    background.submit("train", idx, pool[i % 4][: len(idx)])
background.drain()
written = time.perf_counter()
background.close()
writer.finish()
done = time.perf_counter()
print("WRITER " + json.dumps({"batches_s": written - start, "finish_s": done - written, "whole_s": done - start}))
"""


def disk_rate(folder: Path, nbytes: int = 1 << 30) -> float:
    """GB/s of a sequential 1 GiB write and fsync in ``folder``."""
    block = os.urandom(1 << 24)
    path = folder / "disk-rate.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(nbytes // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - start
    path.unlink()
    return nbytes / took / 1e9


def timing(tree: Path, rows: int, batch: int, folder: Path, store: str = "float32") -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cmd = [sys.executable, "-c", CHILD, str(rows), str(batch), tmp, store]
        # `python -c` looks in its folder first: run it in one that is not a checkout
        return tagged_json(cmd, "WRITER", env=env, cwd=tmp, what=f"{tree}: the writer")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=60_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--before", type=Path, default=None, help="a checkout of the earlier code")
    p.add_argument("--after", type=Path, default=Path("."))
    p.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the files are written"
    )
    p.add_argument(
        "--store-dtypes", default=None, help="compare these --store-dtype values (comma-separated)"
    )
    args = p.parse_args(argv)
    if args.store_dtypes:
        trees = {store: (args.after, store) for store in args.store_dtypes.split(",")}
    elif args.before is None:
        trees = {"after": (args.after, "float32")}
    else:
        trees = {"before": (args.before, "float32"), "after": (args.after, "float32")}
    gb = args.rows * 13 * 768 * 4 / 1e9
    rate = disk_rate(args.dir)
    results: dict[str, list[dict[str, float]]] = {n: [] for n in trees}
    for rep in range(args.reps):
        for name in list(trees) if rep % 2 == 0 else list(reversed(trees)):
            results[name].append(timing(*trees[name][:1], args.rows, args.batch, args.dir, trees[name][1]))
    print(
        f"{args.rows} rows x 13 x 768 float32 = {gb:.2f} GB in batches of {args.batch}; disk {rate:.2f} GB/s (1 GiB + fsync)"
    )
    print("| run | batches (s) | finish (s) | whole (s) | GB/s | share of the disk's rate |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {name} | {med['batches_s']:.2f} | {med['finish_s']:.2f} | {med['whole_s']:.2f} | "
            f"{gb / med['whole_s']:.2f} | {gb / med['whole_s'] / rate:.0%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scaling out and scaling up: extraction throughput with 1 and 2 local dask workers beside one
process, and the peak memory of ``reservoir fit`` for N and 10N rows.

    .venv/bin/python benchmarks/scale.py --data-dir DATA                    # both parts
    .venv/bin/python benchmarks/scale.py --parts memory                     # no data needed

Throughput: ``reservoir extract --task mnist --backbone gpt2-random --limit N`` (every depth,
the default dtype for this CPU, ``--no-compile`` so each configuration runs the same kernels),
as one process and with ``--workers 1`` and ``--workers 2``; whole commands, start-up and
cluster start included, each into a fresh folder, examples/s over train + test.

Memory: a feature file of N rows (and one of 10N) with two depths of 768 float32 features
(random features with a class signal, written through the store), then ``reservoir fit --head
HEAD --depths 1`` on it in a child process; its peak resident memory (``ru_maxrss``). Ridge
reads a block of rows at a time; the logistic and torch heads stream with ``--memory-mb 1``
(every L-BFGS step or epoch reads the depth again), so the peak should not grow with N.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.runtime.machine import describe, load  # noqa: E402


def reservoir(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reservoir", "-q", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def throughput(args) -> None:
    print(
        f"\n## extraction: mnist, gpt2-random, every depth, --limit {args.limit} (train + test), --no-compile"
    )
    print("| configuration | seconds | examples/s | vs one process |")
    print("|---|---|---|---|")
    base = None
    for name, extra in (
        ("one process", []),
        ("--workers 1", ["--workers", "1"]),
        ("--workers 2", ["--workers", "2"]),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            r = reservoir(
                "extract",
                "--task",
                "mnist",
                "--backbone",
                "gpt2-random",
                "--limit",
                str(args.limit),
                "--data-dir",
                str(args.data_dir),
                "--no-compile",
                "--out",
                str(Path(tmp) / "f.h5"),
                *extra,
            )
            seconds = time.perf_counter() - start
            if r.returncode:
                raise SystemExit(r.stderr)
        rate = 2 * args.limit / seconds
        base = base or rate
        print(f"| {name} | {seconds:.1f} | {rate:.1f} | {rate / base:.2f}x |")


def synthetic_file(path: Path, n: int, seed: int = 0) -> None:
    """A feature file of ``n`` train and ``n // 5`` test rows, two depths of 768 (class signal + noise)."""
    from reservoir.extract.store import FeatureWriter

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(10, 768)).astype(np.float32)
    identity = {
        "format": 2,
        "task": "file:synthetic.npz",
        "task_options": {"n": n},
        "data": {},
        "backbone": "synthetic",
        "backbone_fingerprint": "",
        "seed": seed,
        "input_scale": "paper",
        "depths": [0, 1],
        "dtype": "float32",
        "readout": "last",
        "limit": None,
        "splits": ["train", "test"],
    }
    writer = FeatureWriter.open(path, identity, {}, {"weight": np.zeros((768, 1), np.float32)})
    try:
        for split, rows in (("train", n), ("test", max(1000, n // 5))):
            labels = rng.integers(0, 10, rows)
            writer.split(split, labels, np.ones(rows, np.int64), (2, 1, 768))
            for start in range(0, rows, 8192):
                idx = np.arange(start, min(start + 8192, rows))
                x = 3 * centres[labels[idx]][:, None, None, :] + rng.normal(
                    size=(len(idx), 2, 1, 768)
                ).astype(np.float32)
                writer.write(split, idx, x.astype(np.float32))
        writer.finish()
    finally:
        writer.close()


def peak_fit_memory(path: Path, head: str, extra: list[str]) -> tuple[float, float]:
    """Peak RSS (MiB) and seconds of ``reservoir fit --head HEAD --depths 1`` in a fresh child."""
    code = (
        "import resource, sys; from reservoir.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(code)\n"
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as home:
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                "-q",
                "fit",
                "--features",
                str(path),
                "--head",
                head,
                "--depths",
                "1",
                *extra,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "RESERVOIR_HOME": home},
        )
    if r.returncode:
        raise SystemExit(r.stderr)
    return int(r.stderr.strip().splitlines()[-1]) / 1024, time.perf_counter() - start


def memory(args) -> None:
    print(
        f"\n## fit peak memory: one depth of 768 float32 features, N = {args.rows:,d} and 10N "
        f"(logreg and torch streamed with --memory-mb 1)"
    )
    print("| head | train rows | features of one depth (MiB) | peak RSS of fit (MiB) | seconds |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for head in args.heads.split(","):
            rows = args.rows if head == "ridge" else args.stream_rows
            for n in (rows, 10 * rows):
                path = Path(tmp) / f"{n}.h5"
                if not path.exists():
                    synthetic_file(path, n)
                extra = [] if head == "ridge" else ["--memory-mb", "1"]
                peak, seconds = peak_fit_memory(path, head, extra)
                print(
                    f"| {head} | {n:,d} | {n * 768 * 4 / 2**20:,.0f} | {peak:,.0f} | {seconds:.1f} |",
                    flush=True,
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="throughput,memory", help="comma-separated: throughput, memory")
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="data folder with mnist/ (throughput)")
    p.add_argument("--limit", type=int, default=1000, help="examples per split for the throughput part")
    p.add_argument("--rows", type=int, default=20_000, help="N for the memory part (ridge)")
    p.add_argument("--stream-rows", type=int, default=2_000, help="N for the streamed logreg and torch heads")
    p.add_argument("--heads", default="ridge,logreg", help="heads of the memory part (ridge, logreg, torch)")
    args = p.parse_args()
    import torch

    print(f"# benchmarks/scale.py {' '.join(sys.argv[1:])}")
    print(f"# {describe()}")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads; {load()}")
    parts = args.parts.split(",")
    if "throughput" in parts:
        throughput(args)
    if "memory" in parts:
        memory(args)
    print(f"\n# after: {load()}")


if __name__ == "__main__":
    main()

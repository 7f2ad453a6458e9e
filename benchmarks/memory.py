"""Memory stays flat as the dataset grows: peak RSS of an extraction of 2,000 and 20,000 examples.

    .venv/bin/python benchmarks/memory.py --data-dir DATA
    .venv/bin/python benchmarks/memory.py --task bit_xor --task-opt n_train=20000

Each size runs ``reservoir extract`` (the default path: dtype, compile and batch size as
``ExtractConfig`` sets them) in its own process on the first N training examples of the
task (default: MNIST) with ``gpt2-random`` into a temporary folder, and reports that process's peak resident set
size (``ru_maxrss`` from ``wait4``, which also covers any compile workers it started), its
wall time and end-to-end examples/s (data loading, compilation and HDF5 writes included).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def measure(n: int, args: argparse.Namespace, folder: Path) -> tuple[float, float]:
    """Peak RSS (MiB) and wall seconds of one extraction of ``n`` examples."""
    cmd = [
        sys.executable,
        "-m",
        "reservoir",
        "--quiet",
        "extract",
        "--task",
        args.task,
        "--backbone",
        args.backbone,
        "--split",
        "train",
        "--limit",
        str(n),
        "--data-dir",
        str(args.data_dir),
        "--out",
        str(folder / f"{n}.h5"),
        *[x for opt in args.task_opts for x in ("--task-opt", opt)],
        *args.extract_opts,
    ]
    print(f"$ {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=sys.stderr)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"extraction of {n} examples failed with exit status {proc.returncode}")
    return usage.ru_maxrss / 1024, seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default="2000,20000", help="comma-separated example counts; the first is the reference"
    )
    p.add_argument("--task", default="mnist")
    p.add_argument("--backbone", default="gpt2-random")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("RESERVOIR_HOME", ".")) / "data")
    p.add_argument(
        "--task-opt",
        dest="task_opts",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task option for reservoir extract (repeatable), e.g. n_train=20000 for bit_xor",
    )
    p.add_argument(
        "--extract-opt",
        dest="extract_opts",
        action="append",
        default=[],
        help="extra option for reservoir extract (repeatable), e.g. --extract-opt=--no-compile",
    )
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"$ {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print("load average before: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            rss, seconds = measure(n, args, Path(tmp))
            rows.append((n, rss, seconds))
            (Path(tmp) / f"{n}.h5").unlink()
    print("load average after: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print()
    print("| examples | peak RSS MiB | vs first | wall s | examples/s (end to end) |")
    print("|---|---|---|---|---|")
    for n, rss, seconds in rows:
        print(
            f"| {n} | {rss:.0f} | {100 * (rss / rows[0][1] - 1):+.1f}% | {seconds:.0f} | {n / seconds:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

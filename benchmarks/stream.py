"""Streamed input: extract a Parquet file several times larger than the memory the process may use.

    .venv/bin/python benchmarks/stream.py                       # a 4,096 MiB file under a 1,024 MiB budget
    .venv/bin/python benchmarks/stream.py --budget-mib 400 --factor 4 --folder /big/disk

Writes (into ``--folder``, default a temporary folder) a Parquet file of ``factor * budget`` MiB:
rows of 32 tokens of 256 random float32 values (32 KiB a row), 10 classes, row groups of 512 rows
(16 MiB), no compression; and a 2-block, 64-wide random GPT-2 saved with ``save_pretrained``, so
that reading the data, not the model, dominates. Then, in a fresh process, runs ``reservoir.api.extract``
on ``file:PATH`` (float32, PyTorch eager, every depth) and reports that process's resident set size
(``VmRSS``, and its peak so far ``VmHWM``, from ``/proc/self/status``) after the imports, when the
task is built (every row read once: checked and digested), and when 10%, 50% and 100% of the rows
have been read for extraction. It fails (exit 1) when the peak exceeds the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROW_TOKENS, TOKEN_DIM, GROUP_ROWS = 32, 256, 512


def status() -> dict[str, float]:
    """This process's current and peak resident set size, MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def write_parquet(path: Path, mib: int) -> int:
    """A Parquet file of about ``mib`` MiB of float32 rows, written a row group at a time; returns its rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    row_bytes = ROW_TOKENS * TOKEN_DIM * 4
    rows = mib * 2**20 // row_bytes // GROUP_ROWS * GROUP_ROWS
    schema = pa.schema([("x", pa.list_(pa.list_(pa.float32(), TOKEN_DIM), ROW_TOKENS)), ("y", pa.int64())])
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(path, schema, compression="none") as w:
        for start in range(0, rows, GROUP_ROWS):
            flat = pa.array(rng.standard_normal(GROUP_ROWS * ROW_TOKENS * TOKEN_DIM, dtype=np.float32))
            x = pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(flat, TOKEN_DIM), ROW_TOKENS
            )
            y = pa.array(np.arange(start, start + GROUP_ROWS) % 10)
            w.write_table(pa.table({"x": x, "y": y}, schema=schema))
    return rows


def child(args: argparse.Namespace) -> int:
    """The measured process: extract ``args.data`` and print the measurements as JSON on stdout."""
    import numpy as np

    from reservoir import api
    from reservoir.tasks import streams

    marks = {"imports": status()}
    total = args.rows
    taken = {"rows": 0, "next": 0}
    points = [0.1, 0.5, 1.0]
    lock = threading.Lock()
    take = streams.Rows.take

    def counted(self, idx: np.ndarray) -> np.ndarray:
        out = take(self, idx)
        with lock:
            if taken["rows"] == 0:
                marks["task built (every row read, checked, digested)"] = status()
                marks["_built"] = time.perf_counter()
            taken["rows"] += len(idx)
            while taken["next"] < len(points) and taken["rows"] >= points[taken["next"]] * total:
                marks[f"{points[taken['next']]:.0%} of rows extracted"] = status()
                taken["next"] += 1
        return out

    streams.Rows.take = counted
    start = time.perf_counter()
    api.extract(
        f"file:{args.data}",
        str(args.model),
        out=str(args.out),
        dtype="float32",
        engine="torch",
        compile=False,
        seed=0,
    )
    end = time.perf_counter()
    built = marks.pop("_built", end)
    print(json.dumps({"marks": marks, "build_s": built - start, "extract_s": end - built}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-mib", type=int, default=1024, help="peak RSS the extraction may reach")
    p.add_argument("--factor", type=int, default=4, help="the file is this many times the budget")
    p.add_argument(
        "--folder", type=Path, default=None, help="where the file goes (default: a temporary folder)"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)

    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        rows = write_parquet(folder / "big.parquet", args.factor * args.budget_mib)
        size = (folder / "big.parquet").stat().st_size / 2**20
        print(
            f"wrote {folder / 'big.parquet'}: {size:,.0f} MiB, {rows:,d} rows in {time.perf_counter() - t0:.0f} s"
        )

        import torch
        from transformers import GPT2Config, GPT2Model

        torch.manual_seed(0)
        GPT2Model(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=1024)).save_pretrained(
            folder / "gpt2"
        )

        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--data",
            str(folder / "big.parquet"),
            "--model",
            str(folder / "gpt2"),
            "--out",
            str(folder / "features.h5"),
            "--rows",
            str(rows),
        ]
        load = os.getloadavg()[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            print(proc.stderr, file=sys.stderr)
            raise SystemExit(f"the extraction failed with exit status {proc.returncode}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])

    print(f"\nfile {size:,.0f} MiB = {size / args.budget_mib:.1f} x the budget of {args.budget_mib} MiB")
    print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| point | RSS MiB | peak RSS MiB |")
    print("|---|---|---|")
    for name, m in result["marks"].items():
        print(f"| {name} | {m['VmRSS']:.0f} | {m['VmHWM']:.0f} |")
    print(
        f"\nbuilding the task (one pass over the file): {result['build_s']:.0f} s; extraction: {result['extract_s']:.0f} s"
    )
    peak = max(m["VmHWM"] for m in result["marks"].values())
    if peak > args.budget_mib:
        print(f"peak RSS {peak:.0f} MiB exceeds the budget of {args.budget_mib} MiB")
        return 1
    print(f"peak RSS {peak:.0f} MiB, within the budget of {args.budget_mib} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The default ``reservoir extract`` job against the leanest peer's whole int8 job, interleaved, by phase.

    .venv/bin/python benchmarks/lean_job.py --data-dir DATA --rows 6000 --reps 2

Each repetition runs, each in a fresh process and in alternating order: ``reservoir extract --task mnist
--split train --limit ROWS --backbone gpt2-random`` with the defaults (``--dtype auto``, ``--engine auto``;
its phases timed in its process as ``benchmarks/gpu.py``'s job step times them: imports, preparing, the
first batch with its decisions, conversion or compilation, the steady batches, the waits for the writer
and the finishing), and ``benchmarks/ort_lean.py`` (no reservoir: its imports, export, quantization,
batches and writes). The whole of each job is the wall time of its process. Printed: each job's phases
(median over repetitions), its whole seconds (best of the repetitions) and tokens/s, and the ratio of the
peer's best whole time to ours (above 1: ours is faster), with the load average at the start and the end.
Both jobs use ``--threads`` threads; each gets a fresh ``RESERVOIR_HOME`` except for the reservoir cache,
which is kept across repetitions (a warm machine: the CPU's measured rates are reused).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child import tagged_json  # benchmarks/child.py, beside this script

HERE = Path(__file__).resolve().parent

OURS = r"""
import io, json, os, sys, time
from contextlib import redirect_stderr
began = time.perf_counter()
sys.path.insert(0, sys.argv[1])
from gpu import patch_phases, phases
from reservoir.cli import main as cli
imported = time.perf_counter() - began
marks = {"calls": [], "writer_wait": 0.0}
patch_phases(marks)
err = io.StringIO()
start = time.perf_counter()
with redirect_stderr(err):
    cli(sys.argv[2:], prog_name="reservoir", standalone_mode=False)
end = time.perf_counter()
out = phases(marks, start, end, imported)
out["said"] = [ln for ln in err.getvalue().replace("\r", "\n").splitlines() if ln.strip() and "%|" not in ln][-6:]
print("PHASES " + json.dumps(out), flush=True)
sys.stderr.flush()
os._exit(0)  # as the reservoir command ends (reservoir.__main__.entry): no interpreter teardown
"""


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    phases = tagged_json(cmd, "PHASES", env=env, cwd=cwd, what=str(cmd[:3]))
    return time.perf_counter() - start, phases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True, help="a folder holding mnist/")
    p.add_argument("--rows", type=int, default=6000)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    tokens = args.rows * 64
    results: dict[str, list[tuple[float, dict]]] = {"ours": [], "lean": []}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        warm = dict(
            os.environ, OMP_NUM_THREADS=str(args.threads), RESERVOIR_HOME=str(tmp), RESERVOIR_CACHE=str(cache)
        )
        subprocess.run(  # untimed: the CPU's measured rates a warm machine has
            [sys.executable, "-m", "reservoir", "-q", "extract", "--task", "digits", "--limit", "64", "--backbone",
             "gpt2-random", "--out", str(tmp / "warm.h5")],
            env=warm, cwd=tmp, capture_output=True, check=True,
        )  # fmt: skip
        for rep in range(args.reps):
            for name in ("lean", "ours") if rep % 2 == 0 else ("ours", "lean"):
                work = tmp / f"{name}-{rep}"
                work.mkdir()
                env = dict(
                    os.environ,
                    OMP_NUM_THREADS=str(args.threads),
                    RESERVOIR_HOME=str(work),
                    RESERVOIR_CACHE=str(cache),
                )
                if name == "ours":
                    argv_ = [
                        "extract", "--task", "mnist", "--split", "train", "--limit", str(args.rows),
                        "--backbone", "gpt2-random", "--data-dir", str(args.data_dir.resolve()),
                        "--out", str(work / "features.h5"),
                    ]  # fmt: skip
                    cmd = [sys.executable, "-c", OURS, str(HERE), *argv_]
                else:
                    cmd = [
                        sys.executable, str(HERE / "ort_lean.py"), "--data-dir", str(args.data_dir.resolve()),
                        "--rows", str(args.rows), "--out", str(work), "--threads", str(args.threads),
                    ]  # fmt: skip
                results[name].append(run(cmd, env, work))
    load = (load, os.getloadavg()[0])
    best = {n: min(t for t, _ in r) for n, r in results.items()}
    print(
        f"MNIST {args.rows} rows ({tokens:,} tokens), {args.threads} threads, {args.reps} reps interleaved; "
        f"load {load[0]:.2f} -> {load[1]:.2f}"
    )
    for name, runs in results.items():
        keys = [k for k, v in runs[0][1].items() if isinstance(v, (int, float))]
        cells = ", ".join(f"{k} {statistics.median(r[k] for _, r in runs):.1f}" for k in keys)
        print(f"{name}: whole {best[name]:.1f} s ({tokens / best[name]:,.0f} tokens/s); phases (s): {cells}")
    print(f"\nours against the lean ONNX Runtime int8 job: {best['lean'] / best['ours']:.2f}x")
    for line in results["ours"][0][1].get("said", []):
        print(f"  ours said: {line}")
    if args.json:
        args.json.write_text(
            json.dumps({"rows": args.rows, "threads": args.threads, "load": load, "runs": results})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

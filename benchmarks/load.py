"""Load held: peak memory and rate of whole `reservoir extract` jobs as the dataset grows, and `fit`
streaming a feature file several times the memory it is allowed.

    .venv/bin/python benchmarks/load.py                                  # 1,000,000 bit XOR rows, 100,000 MNIST-shaped
    .venv/bin/python benchmarks/load.py --bits-rows 20000 --images-rows 5000 --width 32   # a quick check

Each extraction runs as a child process under a pseudo-terminal (so its progress bar redraws twice
a second); when the rows done cross 10%, 50% and 100% of the job, the child's elapsed time, its
rows/s since the previous point and its peak resident memory so far (``VmHWM``) are recorded.
Memory that stays flat from 10% to 100% and a rate that holds is what streaming promises: the
dataset's tokens are held (the task's data), its features never are.

- bit XOR: ``--task bit_xor --task-opt n_train=ROWS`` (and 1% more as test rows), one depth;
- MNIST shape: a ``file:`` task of ROWS random 64 x 16 float tokens (MNIST's patches), one depth;
- fit: ``reservoir fit --head ridge --memory-mb M`` on the bit XOR file, whose one depth is
  several times M; its peak resident memory (``ru_maxrss`` of the child).

The backbone is a GPT-2 of ``--layers`` blocks and ``--width`` (random weights, saved with
save_pretrained), small enough that a million rows run on two cores; the store and the runner
are the same for any backbone. Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.runtime.machine import describe, load  # noqa: E402

BAR = re.compile(r"([\w:./-]+/\w+):\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)")
POINTS = (0.1, 0.5, 1.0)


def peak_kb(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``), in kB; 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(found.group(1)) if found else 0


def watch(command: list[str], total: int, env: dict[str, str]) -> tuple[list[dict], str]:
    """Run ``command`` under a pseudo-terminal; at 10%, 50% and 100% of ``total`` rows: seconds, rows/s since
    the previous point, peak memory. Returns the points and the command's last output line."""
    master, slave = pty.openpty()
    fcntl.ioctl(
        slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0)
    )  # a terminal's width for the bar
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=slave, env=env, text=True)
    os.close(slave)
    done: dict[str, int] = {}
    points, pending, buffer, last = [], list(POINTS), "", (0.0, 0)
    while True:
        try:
            chunk = os.read(master, 65536).decode(errors="replace")
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        buffer = (buffer + chunk).replace("\r", "\n")
        *lines, buffer = buffer.split("\n")
        for line in lines:
            found = BAR.search(line)
            if found:
                done[found.group(1)] = int(found.group(2))
            rows = sum(done.values())
            while pending and rows >= pending[0] * total:
                now = time.perf_counter() - start
                points.append(
                    {
                        "fraction": pending.pop(0),
                        "rows": rows,
                        "seconds": round(now, 1),
                        "rows_per_s": round((rows - last[1]) / max(now - last[0], 1e-9), 1),
                        "peak_mb": round(peak_kb(proc.pid) / 1024, 1),
                    }
                )
                last = (now, rows)
    out = proc.communicate()[0]
    os.close(master)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed with exit {proc.returncode}")
    return points, out.strip().splitlines()[-1]


def images_file(path: Path, rows: int) -> Path:
    """ROWS random MNIST-shaped examples (64 tokens of 16 floats), labels 0..9, an explicit 1% test split."""
    rng = np.random.default_rng(0)
    x = rng.random((rows, 64, 16), dtype=np.float32)
    split = np.where(np.arange(rows) % 100 == 0, "test", "train")
    np.savez(path, x=x, y=(np.arange(rows) % 10).astype(np.int64), split=split)
    return path


def fit_peak(features: str, memory_mb: int, env: dict[str, str]) -> tuple[float, float]:
    """Peak resident MB and seconds of ``reservoir fit --head ridge --memory-mb M`` in a child process."""
    code = (
        "import resource, sys\nfrom reservoir.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    code = e.code\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(code)\n"
    )
    start = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "-q",
            "fit",
            "--features",
            features,
            "--head",
            "ridge",
            "--memory-mb",
            str(memory_mb),
            "--no-baselines",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode:
        raise SystemExit(f"fit failed: {r.stderr[-2000:]}")
    return int(r.stderr.strip().splitlines()[-1]) / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bits-rows", type=int, default=1_000_000)
    parser.add_argument("--images-rows", type=int, default=100_000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--memory-mb", type=int, default=256, help="fit's allowance")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--keep", type=Path, default=None, help="a folder for the files (default: a temporary one)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    args = parser.parse_args()

    from tests.conftest import save_tiny_gpt2

    work = Path(args.keep or tempfile.mkdtemp(prefix="reservoir-load-"))
    work.mkdir(parents=True, exist_ok=True)
    model = save_tiny_gpt2(work / "model", n_layer=args.layers, n_embd=args.width)
    env = {**os.environ, "RESERVOIR_HOME": str(work), "OMP_NUM_THREADS": str(args.threads)}
    base = [
        sys.executable,
        "-m",
        "reservoir",
        "extract",
        "--backbone",
        str(model),
        "--depths",
        str(args.layers),
        "--dtype",
        "float32",
        "--engine",
        "torch",
    ]
    jobs = {
        "bit XOR": (
            [
                "--task",
                "bit_xor",
                "--task-opt",
                f"n_train={args.bits_rows}",
                "--task-opt",
                f"n_test={max(1, args.bits_rows // 100)}",
            ],
            args.bits_rows + max(1, args.bits_rows // 100),
        ),
        "MNIST shape": (
            ["--task", f"file:{images_file(work / 'images.npz', args.images_rows)}"],
            args.images_rows,
        ),
    }
    report = {
        "machine": describe(),
        "load": load(),
        "backbone": f"GPT-2, {args.layers} blocks, width {args.width}",
        "threads": args.threads,
        "jobs": {},
    }
    for name, (extra, total) in jobs.items():
        points, path = watch(base + extra, total, env)
        size = Path(path).stat().st_size / 2**20
        report["jobs"][name] = {"rows": total, "points": points, "file_mb": round(size, 1), "file": path}
        print(f"{name}: {total:,} rows -> {path} ({size:,.0f} MB)", file=sys.stderr)
    bits, small = report["jobs"]["bit XOR"], report["jobs"]["MNIST shape"]
    peak, seconds = fit_peak(bits["file"], args.memory_mb, env)
    floor, _ = fit_peak(
        small["file"], args.memory_mb, env
    )  # the same fit on a small file: the process's own floor
    report["fit"] = {
        "file_mb": bits["file_mb"],
        "memory_mb": args.memory_mb,
        "peak_mb": round(peak, 1),
        "seconds": round(seconds, 1),
        "small_file_mb": small["file_mb"],
        "small_peak_mb": round(floor, 1),
    }
    print(
        f"Machine: {report['machine']}; {report['load']}; {args.threads} threads; backbone {report['backbone']}, "
        "float32, PyTorch engine, one depth\n"
    )
    print("| job | rows | at | rows done | seconds | rows/s since previous | peak memory (MB) |")
    print("|---|---|---|---|---|---|---|")
    for name, job in report["jobs"].items():
        for p in job["points"]:
            print(
                f"| {name} | {job['rows']:,} | {100 * p['fraction']:.0f}% | {p['rows']:,} | {p['seconds']:,} | "
                f"{p['rows_per_s']:,.0f} | {p['peak_mb']:,.0f} |"
            )
    fit = report["fit"]
    print(
        f"\n`fit --head ridge --memory-mb {fit['memory_mb']}` on the bit XOR file ({fit['file_mb']:,.0f} MB of "
        f"features): peak {fit['peak_mb']:,.0f} MB resident, {fit['seconds']:.0f} s; the same fit on the MNIST-shaped "
        f"file ({fit['small_file_mb']:,.0f} MB): peak {fit['small_peak_mb']:,.0f} MB."
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

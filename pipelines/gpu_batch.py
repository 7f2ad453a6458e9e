"""A batch of end-to-end runs on one GPU within a time budget: every (task, seed) a `reservoir train` process of
its own, all at once, each stopped by `--max-time`, so a lent card's minutes give results, not killed runs.

    python pipelines/gpu_batch.py --out DIR                       # paper table 6's Random column on gpt2-random
    python pipelines/gpu_batch.py --out DIR --budget 330 --tasks bit_xor --seeds 0,1,2
    python pipelines/gpu_batch.py --out DIR --small               # a tiny model for a few steps (runs on a CPU)

The runs take table 6's settings (`make -C pipelines table6`: at most 20,000 steps and 10,000 examples a
split, learning rate 1e-3, compiled, stopping once validation reaches the task's target, which is also the
accuracy whose first crossing counts as converged) with one seed a process; their result files share a row of
the table (`reservoir report` folds the seeds of one setting). It writes two files into ``--out`` (default
``$OUT``): ``batch.log`` (each run's command, its stop and its summary line) and ``results.tar.gz`` (the
result files, ``TASK/BACKBONE/NAME.json``), which `python pipelines/ledger.py report --table 6 --runs ...`
keeps in the repository once unpacked.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu import said_lines  # noqa: E402  (benchmarks/gpu.py: the GPU check this batch goes with)

#: table 6's targets (pipelines/end_to_end.mk, TARGET_6_*)
TARGETS = {"bit_xor": 0.99, "bit_memory": 0.99, "listops": 0.3}
#: table 6's settings (STEPS_6, TRAIN_LIMIT_6, LR, TRAIN_OPTS_6)
SETTINGS = ["--steps", "20000", "--limit", "10000", "--lr", "1e-3", "--compile"]
SMALL = ["--steps", "3", "--limit", "40", "--lr", "1e-3", "--eval-every", "2", "--batch-size", "4"]
#: seconds a run needs after --max-time: its last validation, the test split and its result file
FINISH = 30


def command(task: str, backbone: str, seed: int, max_time: float, small: bool) -> list[str]:
    target = str(TARGETS.get(task, 0.9))
    return [
        sys.executable,
        "-m",
        "reservoir",
        "train",
        "--task",
        task,
        "--backbone",
        backbone,
        "--seed",
        str(seed),
        *(SMALL if small else SETTINGS),
        "--target",
        target,
        "--stop-at",
        target,
        "--max-time",
        f"{max_time:g}",
    ]


def tiny_backbone(work: Path) -> str:
    """The GPU check's tiny GPT-2 folder (``benchmarks/gpu.py --small``)."""
    from gpu import tiny_folder

    return tiny_folder(work)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=os.environ.get("OUT") or None)
    p.add_argument("--budget", type=float, default=330, help="seconds for the whole batch")
    p.add_argument("--tasks", default="bit_xor,bit_memory")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--backbone", default="gpt2-random")
    p.add_argument("--small", action="store_true")
    args = p.parse_args(argv)
    if args.out is None:
        print("no output folder: pass --out DIR, or set OUT", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    tasks = [t for t in args.tasks.split(",") if t]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    max_time = args.budget - FINISH
    if max_time <= 0:
        print(f"--budget {args.budget:g} leaves no training time; give more than {FINISH} s", file=sys.stderr)
        return 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reservoir-batch-") as tmp:
        work = Path(tmp)
        backbone = tiny_backbone(work) if args.small else args.backbone
        env = dict(
            os.environ,
            RESERVOIR_HOME=str(work / "home"),
            RESERVOIR_OFFLINE="1",
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
        )
        runs = {}
        for task in tasks:
            for seed in seeds:
                argv_ = command(task, backbone, seed, max_time, args.small)
                log = open(work / f"{task}-{seed}.log", "w")  # noqa: SIM115 - closed below
                runs[(task, seed)] = (
                    argv_,
                    log,
                    subprocess.Popen(argv_, stdout=log, stderr=log, env=env, cwd=ROOT),
                )
        with open(args.out / "batch.log", "w") as out:
            for (task, seed), (argv_, log, proc) in runs.items():
                left = args.budget - (time.perf_counter() - start)
                try:
                    code = proc.wait(timeout=max(left, 1))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGTERM)
                    code = f"stopped at the budget ({proc.wait()})"
                log.close()
                said = said_lines((work / f"{task}-{seed}.log").read_text())
                out.write(f"$ {' '.join(argv_[2:])}\nexit {code}\n" + "\n".join(said[-6:]) + "\n\n")
            out.write(f"batch took {time.perf_counter() - start:.0f} s\n")
        results = work / "home" / "results"
        with tarfile.open(args.out / "results.tar.gz", "w:gz") as tar:
            for f in sorted(results.rglob("*.json")) if results.exists() else []:
                tar.add(f, arcname=str(f.relative_to(results)))
    print((args.out / "batch.log").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

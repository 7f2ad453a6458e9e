"""SIGKILL an extraction at random moments; every rerun must complete to the uninterrupted file.

    .venv/bin/python benchmarks/kill_stress.py --kills 20            # digits through an LSTM, float32
    .venv/bin/python benchmarks/kill_stress.py --kills 20 -- --workers 2 --shard-rows 128

One uninterrupted ``reservoir extract`` gives the reference file and its duration; then, for
each trial, a fresh run is killed (SIGKILL, no chance to clean up) at a uniformly random
moment within that duration (start-up, data loading, writing, the final rename all get hit),
and the same command is rerun until it exits 0. The result must equal the reference bit for
bit (float32), and no ``.partial`` or lock may remain. Prints one line per trial and a
summary; exits 1 on the first mismatch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np


def command(out: Path, args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reservoir",
        "-q",
        "extract",
        "--task",
        args.task,
        "--backbone",
        args.backbone,
        "--limit",
        str(args.limit),
        "--dtype",
        "float32",
        "--batch-size",
        str(args.batch_size),
        "--out",
        str(out),
        *extra,
    ]


def equal(a: Path, b: Path) -> bool:
    with h5py.File(a) as fa, h5py.File(b) as fb:
        splits = [s for s in fa if s != "input_layer"]
        return (
            all(np.array_equal(fa[s]["features"][:], fb[s]["features"][:]) for s in splits)
            and fa.attrs["identity"] == fb.attrs["identity"]
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--task", default="digits")
    p.add_argument("--backbone", default="lstm")
    p.add_argument("--limit", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    p.add_argument("extra", nargs="*", help="more extract options (after --)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ref = tmp / "reference.h5"
        start = time.perf_counter()
        subprocess.run(command(ref, args, args.extra), env=env, check=True, stdout=subprocess.DEVNULL)
        duration = time.perf_counter() - start
        print(
            f"reference: {duration:.1f} s; killing {args.kills} runs at random moments in [0, {duration:.1f}] s"
        )
        reruns = 0
        for trial in range(args.kills):
            out = tmp / f"trial{trial}.h5"
            at = rng.uniform(0, duration)
            proc = subprocess.Popen(
                command(out, args, args.extra),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            time.sleep(at)
            finished = proc.poll() is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the run and any worker processes it started
            proc.wait()
            state = (
                "finished before the kill"
                if finished
                else (
                    "partial left"
                    if out.with_name(out.name + ".partial").exists()
                    or out.with_name(out.name + ".shards").exists()
                    else "nothing written yet"
                    if not out.exists()
                    else "complete"
                )
            )
            attempts = 0
            while True:
                attempts += 1
                r = subprocess.run(command(out, args, args.extra), env=env, capture_output=True, text=True)
                if r.returncode == 0:
                    break
                print(
                    f"  rerun {attempts} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
                )
                if attempts >= 3:
                    print(f"trial {trial}: the rerun does not complete")
                    return 1
            reruns += attempts
            ok = equal(out, ref)
            leftovers = [p.name for p in tmp.glob(f"trial{trial}.h5.*") if not p.name.endswith(".shards")]
            print(
                f"trial {trial:2d}: killed at {at:5.2f} s ({state}); rerun {'equal' if ok else 'DIFFERS'}"
                f"{'; left ' + ', '.join(leftovers) if leftovers else ''}"
            )
            if not ok or leftovers:
                return 1
        print(f"{args.kills} kills, {reruns} reruns: every rerun equals the uninterrupted file")
    return 0


if __name__ == "__main__":
    sys.exit(main())

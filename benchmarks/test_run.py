"""The default test run's wall time on this CPU, then with its vector ISA capped at AVX2 (an AVX2-only CPU's
instruction set, on this CPU's cores and clock).

The capped run sets ``ATEN_CPU_CAPABILITY=avx2`` (PyTorch's kernels) and ``DNNL_MAX_CPU_ISA=AVX2`` (oneDNN's,
so bf16 products are emulated, as on a Zen 3), and shows the tests a ``/proc/cpuinfo`` without the AVX-512,
AMX and VNNI flags (bound over it in a private mount namespace: ``unshare -rm``, which needs user
namespaces). OpenVINO's CPU plugin still reads the CPU's own features and picks kernels the capped oneDNN
then refuses, so its int8 tests fail under the cap: their names are printed, not counted as the code's.

    .venv/bin/python benchmarks/test_run.py            # both runs, about twice the default test run
    .venv/bin/python benchmarks/test_run.py --only capped
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import checkout  # noqa: F401  (the checkout's reservoir first on sys.path)

from reservoir.runtime.machine import describe, load

ROOT = Path(__file__).resolve().parents[1]
#: the default test run (the Makefile's ``test`` target)
PYTEST = [
    sys.executable,
    "-m",
    "pytest",
    *["-q", "-p", "no:cacheprovider", "--numprocesses", "auto", "--maxprocesses", "4"],
]
#: cpuinfo flags an AVX2-only CPU lacks
DROPPED = re.compile(r" (avx512\w*|amx\w*|avx_vnni|vaes|vpclmulqdq|gfni)(?=[ \n])")


def run(capped: bool) -> tuple[float, str, list[str]]:
    """Wall seconds, pytest's summary line and the failed tests of one default test run."""
    env_cmd = list(PYTEST)
    with tempfile.TemporaryDirectory() as tmp:
        if capped:
            cpuinfo = Path(tmp) / "cpuinfo"
            cpuinfo.write_text(DROPPED.sub("", Path("/proc/cpuinfo").read_text()))
            inner = " ".join(f"'{a}'" for a in env_cmd)
            env_cmd = [
                "unshare", "-rm", "sh", "-c",
                f"mount --bind {cpuinfo} /proc/cpuinfo && ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 exec {inner}",
            ]  # fmt: skip
        start = time.perf_counter()
        out = subprocess.run(env_cmd, cwd=ROOT, capture_output=True, text=True).stdout
        seconds = time.perf_counter() - start
    summary = next(
        (ln.strip("= ") for ln in reversed(out.splitlines()) if " in " in ln and "passed" in ln), "?"
    )
    return seconds, summary, [ln.split()[1] for ln in out.splitlines() if ln.startswith("FAILED ")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["native", "capped"], help="one of the two runs")
    args = parser.parse_args()
    if args.only != "native" and not shutil.which("unshare"):
        sys.exit("the capped run needs util-linux's unshare")
    print(f"# benchmarks/test_run.py{' --only ' + args.only if args.only else ''}")
    print(f"# {describe()}")
    print(f"# {load()}")
    for capped in (False, True):
        if args.only and args.only != ("capped" if capped else "native"):
            continue
        seconds, summary, failed = run(capped)
        label = "capped at AVX2" if capped else "this CPU's ISA"
        print(f"{label:>15}: {seconds / 60:4.1f} min ({seconds:.0f} s wall); {summary}")
        for name in failed:
            print(f"{'':>17}failed: {name}")
    print(f"# {load()}")


if __name__ == "__main__":
    main()

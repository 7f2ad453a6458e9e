"""Resident memory of a frozen backbone by the dtype its weights are loaded in (``--load-dtype``).

    .venv/bin/python benchmarks/load_dtype.py --backbone smollm2-135m

Each dtype loads in a fresh process: the process's resident memory (``VmRSS``) after importing
reservoir and torch, then after ``load_backbone(NAME, dtype=...)`` and one read of every weight (as a
forward pass reads them: weights that transformers maps from a float32 file stay file pages until read);
the difference is what the backbone holds, split into private memory (``RssAnon``) and mapped file pages
(``RssFile``). Also printed: the bytes of its tensors, and the largest resident memory of the process
(``VmHWM``), which includes what loading needed on the way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, sys
def status():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out
import torch
from reservoir.model.backbones import load_backbone
before = status()
model = load_backbone(sys.argv[1], 0, dtype=sys.argv[2])
with torch.no_grad():  # touch every weight, as a forward pass does: mapped file pages become resident
    total = sum(float(t.float().sum()) for t in model.state_dict().values())
after = status()
tensors = sum(t.numel() * t.element_size() for t in model.state_dict().values())
print(json.dumps({"before": before, "after": after, "tensors": tensors}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    from reservoir.runtime.machine import describe, load

    print(f"# benchmarks/load_dtype.py --backbone {args.backbone}")
    print(f"# {describe()}; {load()}")
    print(
        "| load dtype | backbone's resident memory (MiB) | of it, private (RssAnon) | of it, mapped file pages "
        "(RssFile) | its tensors (MiB) | process peak (MiB) | resident x float32 |"
    )
    print("|---|---|---|---|---|---|---|")
    first = None
    for dtype in args.dtypes:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, args.backbone, dtype], capture_output=True, text=True, check=True
        )
        m = json.loads(done.stdout.strip().splitlines()[-1])
        a, b = m["after"], m["before"]
        held = a["VmRSS"] - b["VmRSS"]
        first = first or held
        print(
            f"| {dtype} | {held / 2**20:,.0f} | {(a['RssAnon'] - b['RssAnon']) / 2**20:,.0f} | "
            f"{(a['RssFile'] - b['RssFile']) / 2**20:,.0f} | {m['tensors'] / 2**20:,.0f} | "
            f"{a['VmHWM'] / 2**20:,.0f} | {held / first:.2f} |"
        )


if __name__ == "__main__":
    main()

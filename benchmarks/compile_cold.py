"""A first compile's cost on this machine: ``torch.compile`` of the extraction forward with cold caches.

    .venv/bin/python benchmarks/compile_cold.py                 # a 2-block and a 12-block GPT-2

Each backbone runs in a fresh process with empty inductor and reservoir caches: a compiled
:class:`reservoir.runtime.runner.FeatureRunner` (bf16, every depth, 256 MNIST-shaped rows of 64 tokens)
is called twice; the first call's time less the second's is the cold compile. From the two sizes it
prints the fixed part and the part per block (a line through both), the figures
:data:`reservoir.runtime.compiling.COLD_SECONDS` and ``COLD_SECONDS_PER_BLOCK`` take.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from child import tagged_json  # benchmarks/child.py, beside this script

CHILD = r"""
import json, sys, time
import numpy as np
from reservoir.model.backbones import load_backbone
from reservoir.runtime.runner import FeatureRunner
from reservoir.tasks import TaskSpec
name = sys.argv[1]
spec = TaskSpec(name="mnist-like", token_kind="dense", seq_len=64, n_classes=10, token_dim=16)
b = load_backbone(name)
blocks = b.n_layers
r = FeatureRunner.build(spec, b, list(range(blocks + 1)), seed=0, dtype="bfloat16", engine="torch", compile=True,
                        batch_size=256)
x, n = np.random.default_rng(0).random((256, 64, 16), dtype=np.float32), np.full(256, 64)
t = time.perf_counter(); r(x, n); first = time.perf_counter() - t
t = time.perf_counter(); r(x, n); second = time.perf_counter() - t
print("COLD " + json.dumps({"blocks": blocks, "compile_s": first - second, "batch_s": second}))
"""


def cold(name: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(threads),
            TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor",
            RESERVOIR_CACHE=f"{tmp}/cache",
            RESERVOIR_HOME=tmp,
        )
        return tagged_json([sys.executable, "-c", CHILD, name], "COLD", env=env, cwd=tmp, what=name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        import torch
        from transformers import GPT2Config, GPT2Model

        torch.manual_seed(0)
        GPT2Model(GPT2Config(n_layer=2, n_embd=768, n_head=12)).save_pretrained(f"{tmp}/two-blocks")
        runs = [cold(f"{tmp}/two-blocks", args.threads), cold("gpt2-random", args.threads)]
    (a, b) = runs
    per_block = (b["compile_s"] - a["compile_s"]) / (b["blocks"] - a["blocks"])
    fixed = a["compile_s"] - per_block * a["blocks"]
    for r in runs:
        print(
            f"{r['blocks']:>3} blocks: cold compile {r['compile_s']:.1f} s (one batch {r['batch_s']:.2f} s)"
        )
    print(
        f"fixed {fixed:.1f} s + {per_block:.2f} s per block; {args.threads} threads, load {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

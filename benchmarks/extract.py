"""Extraction speed: the official code's forward, our default path, and the bf16 roofline.

    .venv/bin/python benchmarks/extract.py                 # make bench
    .venv/bin/python benchmarks/extract.py --inputs mnist --reps 3
    .venv/bin/python benchmarks/extract.py --inputs mnist --reps 3 --dtype float32 --no-compile   # other paths

On one input per sequence length (64 tokens of 16 values, the ``mnist`` shape, and 1024
tokens of 1 value, the ``cifar10_lra`` shape; random values in [0, 1], which do not change
the speed), a GPT-2-small shape with random weights (12 blocks x 768), every depth 0..12:

- baseline: what the official FPT code runs, a Hugging Face ``GPT2Model`` in eager float32
  with ``output_hidden_states=True``, batch 16;
- ours: :class:`reservoir.forward.FeatureRunner` with the extraction defaults
  (``ExtractConfig``: dtype, batch size; compiled as an extraction of 50,000 such examples
  would be), inputs prepared and features copied out to numpy as ``extract`` does;
- roofline: the machine's bf16 matrix-product rate (``torch.mm`` of two 2048 x 2048
  matrices) divided by the model's FLOPs per token (below).

The three are measured in interleaved repetitions (baseline, ours, peak, baseline, ...)
so that other jobs on the machine slow them alike; the table gives medians, the ratios
are medians of the per-repetition ratios, and the load average is printed with them.

FLOPs per token, from the model's shapes: ``2 * (d*3d + d*d + 2*d*d_ff)`` per block for
the matrix products (QKV, output projection, MLP), ``2 * (T+1) * d`` per block for
``QK^T`` and ``AV`` over the causal context (on average ``(T+1)/2`` keys; Kaplan et al.
2020 count ``2 n_layer n_ctx d_attn``), and ``2 * token_dim * d`` for the input layer.
Norms, GELU and softmax are left out: the roofline is for matrix products only.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reservoir.config import ExtractConfig  # noqa: E402
from reservoir.extract import auto_batch_size, should_compile  # noqa: E402
from reservoir.forward import FeatureRunner, bf16_native, resolve_dtype  # noqa: E402
from reservoir.tasks import TaskSpec  # noqa: E402

from matmul import matmul_rate, sync  # noqa: E402  (benchmarks/matmul.py, beside this script)

#: benchmark inputs: name -> (tokens, values per token), the shapes of the paper's tasks
INPUTS = {"mnist": (64, 16), "cifar10_lra": (1024, 1)}
GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768)
BASELINE_BATCH = 16


def flops_per_token(n_layer: int, d: int, d_ff: int, seq_len: int, token_dim: int) -> float:
    """Matrix-product FLOPs per token of a GPT-2 forward over ``seq_len`` tokens (see module doc)."""
    per_block = 2 * (d * 3 * d + d * d + 2 * d * d_ff) + 2 * (seq_len + 1) * d
    return n_layer * per_block + 2 * token_dim * d


DEVICE = torch.device("cpu")  # set by --device


def timed(fn) -> float:
    sync(DEVICE)
    start = time.perf_counter()
    fn()
    sync(DEVICE)
    return time.perf_counter() - start


def cpu_flags() -> str:
    """The CPU model and the flags that decide the fast paths (every figure names them)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
                 platform.processor())
    flags = next((set(ln.split(":", 1)[1].split()) for ln in text.splitlines() if ln.startswith("flags")), set())
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags]
    return f"{model}; flags {' '.join(shown) or 'none of avx2/avx512/amx'}"


def load() -> str:
    return "load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_input(name: str, reps: int, seed: int, dtype: str = "auto", compile: bool | None = None) -> dict:
    from transformers import GPT2Config, GPT2Model

    from reservoir.backbones import seeded
    from reservoir.backbones.gpt2 import random_gpt2
    from reservoir.input_layer import make_input_layer

    seq_len, token_dim = INPUTS[name]
    cfg = ExtractConfig(task=name, backbone="gpt2-random", dtype=dtype, compile=compile)
    spec = TaskSpec(name, "dense", seq_len=seq_len, token_dim=token_dim, n_classes=10)
    depths = list(range(GPT2_SMALL["n_layer"] + 1))
    backbone = random_gpt2(seed, **GPT2_SMALL)
    batch = cfg.batch_size or auto_batch_size(backbone, seq_len)
    n_batches = max(1, -(-8192 // (batch * seq_len)))  # at least 8k tokens a repetition
    rng = np.random.default_rng(seed)
    tokens = rng.random((batch * n_batches, seq_len, token_dim), dtype=np.float32)
    lengths = np.full(len(tokens), seq_len, dtype=np.int64)
    layer = make_input_layer(spec, GPT2_SMALL["n_embd"], seed)

    # baseline: the official code's forward (eager float32, every hidden state, batch 16)
    with seeded(seed):
        hf = GPT2Model(GPT2Config(**GPT2_SMALL)).eval().to(DEVICE)
    layer = layer.to(DEVICE)
    base_tokens = torch.from_numpy(tokens[:BASELINE_BATCH]).to(DEVICE)

    @torch.no_grad()
    def baseline():
        out = hf(inputs_embeds=layer(base_tokens), output_hidden_states=True)
        return torch.stack([h[:, -1] for h in out.hidden_states], 1)

    # ours: the extraction defaults (or --dtype/--compile), compiled as an extraction of 50,000 examples would be
    dtype = resolve_dtype(cfg.dtype, DEVICE)
    compile = should_compile(cfg.compile, 50_000 * seq_len)
    runner = FeatureRunner.build(spec, backbone, depths, seed=seed, dtype=dtype, compile=compile, batch_size=batch,
                                 device=DEVICE)
    batches = [(tokens[i:i + batch], lengths[i:i + batch]) for i in range(0, len(tokens), batch)]

    def ours():
        for t, n in batches:
            runner(t, n)

    first = timed(lambda: runner(*batches[0]))  # compiles
    baseline()
    flops = flops_per_token(GPT2_SMALL["n_layer"], GPT2_SMALL["n_embd"], 4 * GPT2_SMALL["n_embd"], seq_len, token_dim)
    rows = []
    for rep in range(reps):
        b = BASELINE_BATCH * seq_len / timed(baseline)
        o = len(tokens) * seq_len / timed(ours)
        peak = matmul_rate(dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32, device=DEVICE)
        rows.append((b, o, peak / flops, peak))
        print(f"  {name} rep {rep + 1}/{reps}: baseline {b:8.1f} tok/s | ours {o:8.1f} tok/s | "
              f"roofline {peak / flops:8.1f} tok/s ({peak / 1e9:.0f} GFLOP/s) | {load()}", file=sys.stderr, flush=True)
    med = [statistics.median(col) for col in zip(*rows)]
    return {
        "name": name, "seq_len": seq_len, "token_dim": token_dim, "dtype": dtype, "compiled": runner.compiled,
        "batch": batch, "first_call_s": first, "flops_per_token": flops,
        "baseline": med[0], "ours": med[1], "roofline": med[2], "peak": med[3],
        "speedup": statistics.median(o / b for b, o, _, _ in rows),
        "of_roofline": statistics.median(o / r for _, o, r, _ in rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inputs", default=",".join(INPUTS), help=f"comma-separated, from {list(INPUTS)}")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions of baseline, ours, matmul peak")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="our path's compute dtype (default: the extraction default)")
    p.add_argument("--device", default="auto", help="auto (a CUDA GPU when present, else the CPU), cpu, cuda[:N], mps")
    p.add_argument("--compile", default=None, action=argparse.BooleanOptionalAction,
                   help="force our path compiled or eager (default: the extraction default, auto)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.inputs.split(",") if n.strip()]
    bad = [n for n in names if n not in INPUTS]
    if bad or args.reps < 1:
        p.error(f"--inputs must name some of {list(INPUTS)} (got {bad}) and --reps must be >= 1")
    torch.manual_seed(args.seed)
    global DEVICE
    from reservoir.forward import resolve_device

    DEVICE = resolve_device(args.device)
    print(f"$ {shlex.join([Path(sys.executable).name, *sys.argv])}")
    gpu = f", {torch.cuda.get_device_name(DEVICE)}" if DEVICE.type == "cuda" else ""
    print(f"device {DEVICE}{gpu}; torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs "
          f"({cpu_flags()}), native bf16 on the CPU: {bf16_native()}")
    print(f"model: GPT-2-small shape {GPT2_SMALL}, random weights; depths 0..{GPT2_SMALL['n_layer']}")
    print(f"before: {load()}")
    results = [bench_input(n, args.reps, args.seed, args.dtype, args.compile) for n in names]
    print(f"after:  {load()}")
    print()
    print("| input | tokens | ours: dtype, compiled, batch | first call s | baseline tok/s | ours tok/s | "
          "roofline tok/s | ours / baseline | ours / roofline |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['name']} | {r['seq_len']} x {r['token_dim']} | {r['dtype']}, {r['compiled']}, {r['batch']} | "
              f"{r['first_call_s']:.0f} | {r['baseline']:.0f} | {r['ours']:.0f} | {r['roofline']:.0f} | "
              f"{r['speedup']:.1f}x | {100 * r['of_roofline']:.0f}% |")
    print()
    for r in results:
        print(f"{r['name']}: {r['flops_per_token'] / 1e6:.1f} MFLOP/token; {r['dtype']} matmul peak "
              f"{r['peak'] / 1e9:.0f} GFLOP/s (median over repetitions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

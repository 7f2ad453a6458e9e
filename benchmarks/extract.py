"""Extraction speed: the official code's forward, the best peers, our path, the roofline, end to end.

    .venv/bin/python benchmarks/extract.py                          # make bench: every row, 64 tokens, batch 256
    .venv/bin/python benchmarks/extract.py --tokens 1024            # long inputs (batch 16 by default there)
    .venv/bin/python benchmarks/extract.py --only official,ours,ort-int8 --reps 3 --no-e2e
    .venv/bin/python benchmarks/extract.py --layers 1 --batch 4 --tokens 16 --reps 1 --no-e2e   # smoke run

One run measures, on a GPT-2-small shape with random weights (``gpt2-random``: 12 blocks x 768,
``--layers`` for fewer), MNIST-shaped inputs (``--tokens`` tokens of 16 values in [0, 1] through
the seeded linear input layer; 64 by default), and every depth (the readout token's hidden
state after every block), these rows (``--only`` picks some; :mod:`peers` builds them):

- ``official``: what the official FPT code runs, a Hugging Face ``GPT2Model`` in eager float32
  with ``output_hidden_states=True``, batch 16;
- ``hf-compiled``: the savvy PyTorch peer, the same model under ``torch.compile`` with
  ``torch._inductor.config.freezing = True`` in the fastest float dtype (``--dtype auto``'s
  measured choice, :mod:`reservoir.runtime.dtypes`), batch ``--batch``;
- ``ort-fp32`` / ``ort-int8``: ONNX Runtime on the model exported with ``torch.onnx.export``
  (dynamo exporter, else TorchScript), float32 and dynamic int8 (``quantize_dynamic``, QInt8
  weights), ``--threads`` intra-op threads;
- ``ov-float`` / ``ov-int8``: OpenVINO on ``openvino.convert_model`` of the model, float at the
  precision OpenVINO picks (printed), and int8 by NNCF (``nncf.quantize`` on a calibration set
  of the same kind of inputs; ``nncf.compress_weights`` if that fails, as the row then says);
  ``ov-int8-dynamic``: OpenVINO's other int8, int8 weights (``nncf.compress_weights``) and
  activations quantized per token at run time, in groups of ``reservoir.runtime.engines.DYNAMIC_GROUP``
  values (the kind of int8 that ``ours-int8`` is);
- ``ours``: :class:`reservoir.runtime.runner.FeatureRunner` as an extraction of 50,000 such examples
  runs it: dtype ``auto`` (``--dtype``), engine ``auto`` (OpenVINO on the CPU when installed,
  else PyTorch), inputs prepared and features copied out to numpy; ``ours-torch``: the same on
  PyTorch, compiled as that extraction would be (``--compile``); ``ours-int8`` and
  ``ours-int8-static``: dtypes ``int8`` (activations quantized per token at run time) and
  ``int8-static`` (calibrated on the NNCF peer's calibration rows), on OpenVINO;
- ``roofline``: the matrix-product rate of the fastest float dtype measured (``torch.mm`` of two
  2048 x 2048 matrices, as ``benchmarks/matmul.py``, in each dtype the flags make native: float32,
  bf16, fp16; the fastest of each repetition counts, named in the row) divided by the model's
  FLOPs per token;
- ``e2e-N`` (``--e2e-rows``, ``--no-e2e`` to skip): the whole ``reservoir extract`` command in a
  subprocess (start-up, compile and HDF5 writes included) over N rows, tokens/s of the job:
  ``--task mnist --split train --limit N`` when N <= 60,000 and the inputs are MNIST's 64 x 16,
  else a ``file:`` task of N synthetic MNIST-like rows (pixel values k/255 as float16, written
  to a temporary .npz with a 16-row test split) with ``--split train``. The defaults (4,000 and
  100,000 rows) suit 64 tokens; with ``--tokens 1024`` give fewer rows or ``--no-e2e``. MNIST is
  read from ``--data-dir`` (default: reservoir's data folder);
- ``e2e-ort-int8-N``: the peer's whole job over the same N rows, the int8 job a practitioner writes with
  ONNX Runtime (``benchmarks/ort_job.py``: export, ``quantize_dynamic``, batches, HDF5 writes), timed the
  same way; the report gives the default job's rate over it.

Every peer computes the same features from the same weights (``Setup.hf_model`` draws
``gpt2-random``'s initialisation) and is measured in steady state: built, called once (compiling),
called once more, then the rows run in interleaved repetitions (a, b, c, ..., roofline, a, b,
c, ...) so that other work on the machine slows them alike. The table gives median tokens/s;
ratios and % of roofline are medians of the per-repetition ratios, which are printed too. The
feature error of a row is its features' norm-wise relative error against float32 eager, per
depth, averaged over the first 16 rows of the timed batch (the row's own output on that batch);
the table shows the largest over depths, ``--verbose`` every depth.

FLOPs per token, from the model's shapes (the same count for every row): ``2 * (d*3d + d*d +
2*d*d_ff)`` per block for the matrix products (2 x the blocks' matrix parameters: QKV, output
projection, MLP), ``2 * (T+1) * d`` per block for ``QK^T`` and ``AV`` over the causal context
(on average ``(T+1)/2`` keys; Kaplan et al. 2020 count ``2 n_layer n_ctx d_attn``), and
``2 * token_dim * d`` for the input layer. Norms, GELU and softmax are left out. Counting the
full ``T x T`` attention instead (``2 * 2 * T * d`` per block) is printed beside it.

A peer whose library is missing is reported as not installed (``pip install 'reservoir[bench]'``),
one that fails with its one-line error; neither stops the run. ONNX Runtime and OpenVINO rows
run on the CPU only and are skipped when ``--device`` is a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkout  # noqa: E402, F401  (the checkout's reservoir first on sys.path)
from matmul import matmul_rate, sync  # noqa: E402  (benchmarks/matmul.py, beside this script)
from peers import (
    BASELINE_BATCH,
    CHECK_ROWS,
    INSTALL,
    ROWS,
    NotInstalled,
    Setup,
    Unavailable,  # noqa: E402
    one_line,
    quiet,
)

from reservoir.model.devices import resolve_device
from reservoir.runtime.dtypes import candidates, choose  # noqa: E402
from reservoir.runtime.machine import FLAGS, cpu, load  # noqa: E402
from reservoir.runtime.runner import resolve_dtype  # noqa: E402

GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768)
TOKEN_DIM = 16  # MNIST's 4x4 patches
MNIST_TRAIN = 60_000
PACKAGES = ("torch", "transformers", "onnxruntime", "onnx", "openvino", "nncf")
E2E = "e2e"
#: the peer's whole job beside ours (``benchmarks/ort_job.py``): ONNX Runtime's dynamic int8, export included
E2E_ORT = "e2e-ort-int8"


#: the peers each of our rows is held against
FLOAT_PEERS, INT8_PEERS = ("hf-compiled", "ort-fp32", "ov-float"), ("ort-int8", "ov-int8", "ov-int8-dynamic")


def flops_per_token(
    n_layer: int, d: int, d_ff: int, seq_len: int, token_dim: int, causal: bool = True
) -> float:
    """Matrix-product FLOPs per token of a GPT-2 forward over ``seq_len`` tokens (see module doc);
    ``causal=False`` counts the full ``T x T`` attention."""
    attention = 2 * (seq_len + 1) * d if causal else 2 * 2 * seq_len * d
    per_block = 2 * (d * 3 * d + d * d + 2 * d * d_ff) + attention
    return n_layer * per_block + 2 * token_dim * d


DEVICE = torch.device("cpu")  # set by --device


def timed(fn) -> float:
    sync(DEVICE)
    start = time.perf_counter()
    fn()
    sync(DEVICE)
    return time.perf_counter() - start


def versions() -> str:
    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return ", ".join(f"{name} {version(name)}" for name in PACKAGES)


@dataclass
class Result:
    name: str
    help: str
    dtype: str = "-"
    how: str = ""
    status: str = ""  # empty when measured, else why not
    setup_s: float = float("nan")
    rates: list[float] = field(default_factory=list)  # tokens/s per repetition
    errors: list[float] | None = None  # relative feature error per depth
    tokens: int = 0  # per call
    run: object = None

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")


def build(name: str, setup: Setup) -> Result:
    """Build a row, call it twice (compile, then warm), and compare its features with float32."""
    spec = ROWS[name]
    result = Result(name, spec.help)
    if spec.cpu_only and DEVICE.type != "cpu":
        result.status = f"skipped: CPU-only (this run is on {DEVICE}; use --device cpu)"
        return result
    start = time.perf_counter()
    try:
        with quiet():
            built = spec.build(setup)
            out = built.run()  # compiles
            built.run()  # steady state from here
    except (NotInstalled, Unavailable) as e:
        result.status = str(e)
        return result
    except Exception as e:  # noqa: BLE001 - a peer that fails is reported, never fatal
        result.status = f"failed: {one_line(e)}"
        return result
    result.setup_s = time.perf_counter() - start
    result.dtype, result.how, result.run = built.dtype, built.how, built.run
    result.tokens = built.rows * setup.seq_len
    if built.comparable:
        got = np.asarray(out, dtype=np.float32)[:CHECK_ROWS]
        ref = setup.reference[: len(got)]
        result.errors = (
            (np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)).mean(axis=0).tolist()
        )
    return result


def synthetic_task(path: Path, rows: int, seq_len: int, seed: int) -> str:
    """A ``file:`` task of ``rows`` MNIST-like training rows (values k/255, float16) and 16 test rows."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, 256, (rows, seq_len, TOKEN_DIM), dtype=np.uint8) / np.float16(255)).astype(
        np.float16
    )
    x_test = (rng.integers(0, 256, (16, seq_len, TOKEN_DIM), dtype=np.uint8) / np.float16(255)).astype(
        np.float16
    )
    np.savez(path, x_train=x, y_train=rng.integers(0, 10, rows), x_test=x_test, y_test=np.arange(16) % 10)
    return f"file:{path}"


def end_to_end(rows: int, args, workdir: Path) -> Result:
    """The whole ``reservoir extract`` command over ``rows`` rows; tokens/s of the job."""
    result = Result(f"{E2E}-{rows}", "")
    out = workdir / f"{E2E}-{rows}.h5"
    cli = Path(sys.executable).with_name("reservoir")
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "reservoir"]
    if mnist_rows(rows, args):
        task = ["--task", "mnist"]
        result.help = f"reservoir extract --task mnist --split train --limit {rows} (real MNIST)"
    else:
        made = time.perf_counter()
        task = ["--task", synthetic_task(workdir / f"synthetic-{rows}.npz", rows, args.tokens, args.seed)]
        result.help = (
            f"reservoir extract --task file:SYNTHETIC.npz --split train --limit {rows} ({rows:,} synthetic "
            f"MNIST-like rows of {args.tokens} x {TOKEN_DIM}, written in {time.perf_counter() - made:.0f} s,"
            " not timed)"
        )
    backbone = "gpt2-random"
    if args.layers != GPT2_SMALL["n_layer"]:  # a smaller model: the same seeded weights, saved as a folder
        backbone = str(workdir / f"gpt2-{args.layers}-layers")
        if not Path(backbone).exists():
            Setup(
                dict(GPT2_SMALL, n_layer=args.layers),
                args.seed,
                args.tokens,
                TOKEN_DIM,
                1,
                DEVICE,
                args.threads,
                workdir,
            ).hf_model().save_pretrained(backbone)
        result.help += f", backbone {args.layers}-block GPT-2 folder (gpt2-random's weights)"
    command += [
        "extract",
        *task,
        "--split",
        "train",
        "--limit",
        str(rows),
        "--backbone",
        backbone,
        "--seed",
        str(args.seed),
        "--device",
        args.device,
        "--out",
        str(out),
    ]
    if args.data_dir:
        command += ["--data-dir", str(args.data_dir)]
    if args.dtype != "auto":
        command += ["--dtype", args.dtype]
    if args.compile is not None:
        command.append("--compile" if args.compile else "--no-compile")
    result.how = shlex.join(["reservoir", *command[1 if cli.exists() else 3 :]])
    result = timed_job(result, command, rows, args, resolve_dtype(args.dtype, DEVICE))
    if result.rates:  # the dtype the job ran, as its file records it (auto may take int8)
        import h5py

        with h5py.File(out, "r") as f:
            result.dtype = json.loads(f.attrs["identity"])["dtype"]
    return result


def mnist_rows(rows: int, args) -> bool:
    """Whether an end-to-end job over ``rows`` rows reads MNIST (else synthetic MNIST-like rows)."""
    return args.tokens == 64 and rows <= MNIST_TRAIN


def timed_job(result: Result, command: list[str], rows: int, args, dtype: str) -> Result:
    """``result`` with the whole ``command``'s tokens/s over ``rows`` rows (a subprocess on ``--threads``
    threads), or its failure in one line."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    print(f"  running {result.how}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        last = next((ln for ln in reversed(done.stderr.strip().splitlines()) if ln.strip()), "no message")
        result.status = f"failed: exit {done.returncode}: {last.strip()[:240]}"
        return result
    result.setup_s, result.rates, result.dtype = seconds, [rows * args.tokens / seconds], dtype
    return result


def ort_end_to_end(rows: int, args, workdir: Path) -> Result:
    """The int8 job a practitioner writes with ONNX Runtime over the same rows as :func:`end_to_end`, whole
    (``benchmarks/ort_job.py`` in a subprocess: imports, export, quantization, batches, writes)."""
    result = Result(f"{E2E_ORT}-{rows}", "")
    synthetic = not mnist_rows(rows, args)
    npz = workdir / f"synthetic-{rows}.npz"  # end_to_end's rows, when it made them
    if synthetic and not npz.exists():
        synthetic_task(npz, rows, args.tokens, args.seed)
    command = [
        sys.executable,
        str(Path(__file__).with_name("ort_job.py")),
        "--rows",
        str(rows),
        "--out",
        str(workdir / f"{E2E_ORT}-{rows}"),
        "--threads",
        str(args.threads),
        "--layers",
        str(args.layers),
        "--batch",
        str(args.batch),
        "--seed",
        str(args.seed),
        *(["--npz", str(npz)] if synthetic else []),
        *(["--data-dir", str(args.data_dir)] if args.data_dir else []),
    ]
    result.help = (
        f"the ONNX Runtime int8 job over the same {rows:,} rows"
        + (" (synthetic MNIST-like)" if synthetic else " (real MNIST)")
        + f": gpt2-random's weights exported to ONNX, quantize_dynamic (QInt8, ORT's defaults), batch {args.batch}, "
        "every depth written to HDF5"
    )
    result.how = shlex.join(["python", "benchmarks/ort_job.py", *command[2:]])
    return timed_job(result, command, rows, args, "int8 (U8S8, dynamic)")


def fmt(x: float, spec: str = ".0f", suffix: str = "") -> str:
    return "-" if x != x else f"{x:{spec}}{suffix}"  # NaN -> "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated rows, from {[*ROWS, E2E]} (default: all; the roofline is always measured)",
    )
    p.add_argument(
        "--reps", type=int, default=5, help="interleaved repetitions of every row and the matmul peak"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch, ONNX Runtime (intra-op) and OpenVINO threads, and OMP_NUM_THREADS of the end-to-end "
        "runs (default: torch's, i.e. OMP_NUM_THREADS or the cores)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="examples per call of every row but the official baseline (16) "
        "(default: 16,384 tokens' worth: 256 at 64 tokens, 16 at 1024)",
    )
    p.add_argument("--tokens", type=int, default=64, help="tokens per example (16 values each; MNIST: 64)")
    p.add_argument("--layers", type=int, default=GPT2_SMALL["n_layer"], help="blocks (smoke tests: 1 or 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="our path's compute dtype"
    )
    p.add_argument(
        "--compile",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="force our path compiled or eager (default: as an extraction of 50,000 examples would)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto (a CUDA GPU when present, else the CPU), cpu, cuda[:N], mps: our path, the HF rows and "
        "the roofline; ONNX Runtime and OpenVINO rows are CPU-only",
    )
    p.add_argument(
        "--e2e-rows", default="4000,100000", help="rows of each end-to-end `reservoir extract` run"
    )
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end runs")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data folder holding MNIST for the end-to-end runs (default: reservoir's)",
    )
    p.add_argument("--verbose", action="store_true", help="print the feature error at every depth")
    args = p.parse_args(argv)

    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else [*ROWS, E2E, E2E_ORT]
    bad = [n for n in only if n not in ROWS and n not in (E2E, E2E_ORT)]
    if bad:
        p.error(f"--only must name some of {[*ROWS, E2E, E2E_ORT]}; got {bad}")
    for name in ("reps", "tokens", "layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.tokens > 1024:
        p.error(f"--tokens must be <= 1024 (GPT-2's positions); got {args.tokens}")
    try:
        e2e_rows = [int(n) for n in args.e2e_rows.split(",") if n.strip()]
    except ValueError:
        p.error(f"--e2e-rows must be comma-separated integers; got {args.e2e_rows!r}")
    if any(n < 1 for n in e2e_rows):
        p.error(f"--e2e-rows must be positive; got {args.e2e_rows!r}")
    args.batch = args.batch or max(1, 16384 // args.tokens)
    if args.batch < 1 or (args.threads is not None and args.threads < 1):
        p.error("--batch and --threads must be >= 1")
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    global DEVICE
    DEVICE = resolve_device(args.device)

    shape = dict(GPT2_SMALL, n_layer=args.layers)
    d, n_layer = shape["n_embd"], shape["n_layer"]
    flops = flops_per_token(n_layer, d, 4 * d, args.tokens, TOKEN_DIM)
    flops_full = flops_per_token(n_layer, d, 4 * d, args.tokens, TOKEN_DIM, causal=False)
    model, flags = cpu()
    # the roofline is the fastest float dtype this device multiplies, measured each repetition: every
    # native candidate (float32, bf16, fp16 where the flags allow) is timed, the fastest counts
    floats = candidates() if DEVICE.type == "cpu" else [resolve_dtype("auto", DEVICE)]

    print(f"$ {shlex.join([Path(sys.executable).name, *sys.argv])}")
    gpu = f" ({torch.cuda.get_device_name(DEVICE)})" if DEVICE.type == "cuda" else ""
    print(
        f"cpu: {model}, {os.cpu_count()} CPUs; native float products: {', '.join(floats)}; the float dtype of "
        f"--dtype auto -> {resolve_dtype('auto', DEVICE)} ({choose(DEVICE)[1]}; `reservoir extract` may take "
        "int8 instead: the e2e rows name the dtype each job ran)"
    )
    have = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in FLAGS)
    print(f"cpu flags: {have}")
    print(f"versions: python {platform.python_version()}, {versions()}")
    print(
        f"threads: {args.threads} (torch intra-op, ONNX Runtime intra-op, OpenVINO inference threads, "
        f"OMP_NUM_THREADS of end-to-end runs); env OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    print(f"device: {DEVICE}{gpu}")
    print(
        f"model: GPT-2 shape {shape}, random weights (gpt2-random's seeded initialisation, seed {args.seed}); "
        f"depths 0..{n_layer}; inputs {args.tokens} tokens x {TOKEN_DIM} values in [0, 1]; batch {args.batch} "
        f"(official: {BASELINE_BATCH})"
    )
    print(
        f"FLOPs per token: {flops / 1e6:.1f} M = {n_layer} x (2 x {12 * d * d / 1e6:.2f} M block matrix parameters "
        f"+ 2 x (T+1) x d causal attention) + 2 x {TOKEN_DIM} x {d} input layer, T = {args.tokens}; "
        f"with the full T x T attention (2 x 2 x T x d) it would be {flops_full / 1e6:.1f} M"
    )
    print(
        f"roofline: the fastest of {', '.join(floats)} torch.mm, 2048 x 2048, on {DEVICE}, measured each repetition"
    )
    print(f"before: {load()}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="reservoir-bench-"))
    setup = Setup(
        shape,
        args.seed,
        args.tokens,
        TOKEN_DIM,
        args.batch,
        DEVICE,
        args.threads,
        workdir,
        ours_dtype=args.dtype,
        ours_compile=args.compile,
    )
    results: list[Result] = []
    try:
        for name in (n for n in ROWS if n in only):
            print(f"  building {name} ...", file=sys.stderr, flush=True)
            results.append(build(name, setup))
            r = results[-1]
            print(f"  {name}: {r.status or f'ready in {r.setup_s:.1f} s'}", file=sys.stderr, flush=True)
        live = [r for r in results if r.run is not None]
        peaks = []
        for rep in range(args.reps):
            for r in live:
                r.rates.append(r.tokens / timed(r.run))
            measured = {f: matmul_rate(dtype=getattr(torch, f), device=DEVICE) for f in floats}
            peak_dtype = max(measured, key=measured.get)
            peaks.append(measured[peak_dtype])
            print(
                f"rep {rep + 1}/{args.reps}: "
                + " | ".join(f"{r.name} {r.rates[-1]:.0f}" for r in live)
                + f" | roofline {peaks[-1] / flops:.0f} tok/s ({peak_dtype}; GFLOP/s "
                + ", ".join(f"{f} {v / 1e9:.0f}" for f, v in measured.items())
                + f") | {load()}",
                flush=True,
            )
        roof = Result(
            "roofline",
            f"{peak_dtype} torch.mm rate / FLOPs per token (the fastest float dtype measured)",
            peak_dtype,
            f"benchmarks/matmul.py's matmul_rate(2048, each of {floats})",
            rates=[p / flops for p in peaks],
        )
        results.append(roof)
        if {E2E, E2E_ORT} & set(only) and not args.no_e2e:
            print(f"end to end: {load()}", flush=True)
            for rows in e2e_rows:  # ours, then the peer's job over the same rows
                results += [end_to_end(rows, args, workdir)] if E2E in only else []
                results += [ort_end_to_end(rows, args, workdir)] if E2E_ORT in only else []
        print(f"after: {load()}")
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)

    by_name = {r.name: r for r in results}
    base, ours = by_name.get("official"), by_name.get("ours")

    def per_rep(r: Result, other: Result | None) -> list[float]:
        """Per-repetition ratios of ``r`` to ``other`` (one ratio to ``other``'s median for an end-to-end run)."""
        if not (other and other.rates and r.rates):
            return []
        if len(r.rates) != len(other.rates):
            return [r.rate / other.rate]
        return [a / b for a, b in zip(r.rates, other.rates)]

    def of_roof(r: Result) -> list[float]:
        if not r.rates:
            return []
        if len(r.rates) != len(roof.rates):
            return [r.rate / roof.rate]
        return [a / b for a, b in zip(r.rates, roof.rates)]

    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    print()
    print(
        "| row | dtype | setup s | tokens/s | x official | x ours | % of roofline | feature error vs float32 "
        "(max over depths) | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        err = "-" if r.errors is None else f"{max(r.errors):.2e}"
        note = r.status or ""
        print(
            f"| {r.name} | {r.dtype} | {fmt(r.setup_s)} | {fmt(r.rate)} | {fmt(med(per_rep(r, base)), '.2f', 'x')} | "
            f"{fmt(med(per_rep(r, ours)), '.2f', 'x')} | {fmt(100 * med(of_roof(r)), '.0f', '%')} | {err} | {note} |"
        )
    print()
    print("the issue's ratios (ours against the best peer of its kind, median of per-repetition ratios):")
    for mine, peers in (("ours", FLOAT_PEERS), ("ours-int8", INT8_PEERS), ("ours-int8-static", INT8_PEERS)):
        live = [by_name[n] for n in peers if n in by_name and by_name[n].rates]
        if mine in by_name and by_name[mine].rates and live:
            best = max(live, key=lambda r: r.rate)
            print(
                f"  {mine} / {best.name} (the fastest of {', '.join(r.name for r in live)}): "
                f"{med(per_rep(by_name[mine], best)):.2f}x"
            )
    rivals = [
        by_name[n]
        for n in (f"ours-{f}" for f in ("float32", "bfloat16", "float16"))
        if n in by_name and by_name[n].rates
    ]
    if "ours" in by_name and by_name["ours"].rates and rivals:
        best = max(rivals, key=lambda r: r.rate)
        print(
            f"  ours (the default) / {best.name} (the fastest of {', '.join(r.name for r in rivals)}): "
            f"{med(per_rep(by_name['ours'], best)):.2f}x"
        )
    for mine, peer in (
        ("ours-int8", "ov-int8-dynamic"),
        ("ours-int8-static", "ov-int8"),
    ):  # the same kind of int8
        if all(n in by_name and by_name[n].rates for n in (mine, peer)):
            print(
                f"  {mine} / {peer} (the same kind of int8): {med(per_rep(by_name[mine], by_name[peer])):.2f}x"
            )
    for rows in e2e_rows:  # the default whole job against the peer's whole int8 job, the same rows
        mine, peer = by_name.get(f"{E2E}-{rows}"), by_name.get(f"{E2E_ORT}-{rows}")
        if mine and peer and mine.rates and peer.rates:
            print(
                f"  {mine.name} (the default job) / {peer.name} (ONNX Runtime's int8 job): {mine.rate / peer.rate:.2f}x"
            )
    print()
    print("per-repetition ratios (x official; x ours; fraction of roofline):")
    for r in results:
        if r.rates:
            print(
                f"  {r.name}: "
                + "; ".join(
                    " ".join(f"{x:.2f}" for x in xs) or "-"
                    for xs in (per_rep(r, base), per_rep(r, ours), of_roof(r))
                )
            )
    print()
    print(
        "rows (setup s: building, exporting or compiling, and the first two calls; end to end: the whole job):"
    )
    for r in results:
        print(
            f"- {r.name}: {r.help}" + (f"; {r.how}" if r.how else "") + (f" [{r.status}]" if r.status else "")
        )
    print(
        f"- feature error: norm-wise |f - f32| / |f32| of each of the first {CHECK_ROWS} rows' features, averaged "
        "over the rows, at each depth, against HF GPT2Model eager float32 on the CPU; official: not compared "
        "(it keeps the hidden states without the final norm, as the official code does)"
    )
    if args.verbose:
        print()
        print("feature error per depth (depth 0 .. last):")
        for r in results:
            if r.errors is not None:
                print(f"  {r.name}: " + " ".join(f"{e:.2e}" for e in r.errors))
    missing = [r.name for r in results if r.status.startswith("not installed")]
    if missing:
        print(f"\nnot installed: {', '.join(missing)} ({INSTALL})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One prepared check of a GPU machine: environment, roofline, the CUDA tests, extraction and training speed.

    python benchmarks/gpu.py --out DIR                  # make gpu OUT=DIR; 480 s in all by default
    python benchmarks/gpu.py --out DIR --budget 300     # a shorter total
    python benchmarks/gpu.py --out DIR --small          # tiny model and sizes, on the CPU when there is no GPU
    python benchmarks/gpu.py --out DIR --steps env,test_cuda   # some steps only, the budget shared among them

Each step runs as a child process of this script with its own timeout, taken from what is left of
``--budget``; a step that fails or runs out of time is recorded as such in its file and in
``summary.md``, and the next step runs. It writes these files (at most eight) into ``--out``
(default: ``$OUT``):

- ``env.json``: the card, its driver, compute capability and memory, torch, CUDA, cuDNN,
  transformers, Python, the CPU;
- ``roofline.json``: ``torch.mm`` TFLOP/s in bf16 and in IEEE float32 (TF32 off), measured now;
- ``test_cuda.log``: ``pytest tests/system/test_cuda.py`` (CPU against CUDA features, compiled, training, resume);
- ``extract.json``: steady-state tokens/s of our extraction (:class:`reservoir.runtime.runner.FeatureRunner`,
  eager and compiled, called a batch at a time, and with batches in flight as ``reservoir extract`` runs them)
  against a plain Hugging Face ``GPT2Model`` in bf16 with SDPA attention called a batch at a time at the same
  batch, on GPT-2-small-shaped random weights, every depth, for the MNIST shape (64 tokens of 16
  values, batch 256) and the ListOps shape (512 token ids); each as a fraction of the bf16 roofline
  by FLOP count (``benchmarks/extract.py``'s ``flops_per_token``);
- ``job.json``: a whole 60,000-row MNIST-shaped ``reservoir extract`` (synthetic rows in a ``file:``
  task, nothing downloaded) with its tokens/s and where the time goes by phase;
- ``train.json``: training steps/s (:func:`reservoir.train.train_step`) for the bit-memory and
  ListOps shapes;
- ``science.log``: digits through ``gpt2-random`` on the device and on the CPU (float32), features
  compared per depth and a ridge head fitted on each, accuracy per depth;
- ``summary.md``: every step's status, time and headline numbers.

The script exits 0 whatever the steps do; 1 only when it cannot start (no output folder, a bad option).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from checkout import ROOT  # noqa: E402  (this checkout, or $RESERVOIR_CHECKOUT: job_before_after.py times two)

#: the steps in the order they run, each with its time cap in seconds at the default budget (scaled to --budget)
CAPS = {"env": 20, "roofline": 25, "test_cuda": 170, "extract": 90, "job": 80, "train": 50, "science": 45}
#: the file each step writes
FILES = {
    "env": "env.json",
    "roofline": "roofline.json",
    "test_cuda": "test_cuda.log",
    "extract": "extract.json",
    "job": "job.json",
    "train": "train.json",
    "science": "science.log",
}
SUMMARY = "summary.md"
DEFAULT_BUDGET = 480
#: a step given less than this many seconds is skipped
MIN_STEP = 8
#: GPT-2 small's shape (the ``gpt2-random`` backbone)
GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12)
TINY = dict(n_layer=2, n_embd=32, n_head=4)
#: batches queued at once in the in-flight measurement
IN_FLIGHT = 8


class Sizes:
    """What each step runs: the full shapes, or tiny ones (``--small``)."""

    def __init__(self, small: bool, job_rows: int | None = None):
        self.small = small
        self.shape = TINY if small else GPT2_SMALL
        self.batch = 8 if small else 256
        self.listops_len = 32 if small else 512
        self.job_rows = job_rows or (600 if small else 60_000)
        self.train_batch = 4 if small else 32
        self.reps = 1 if small else 10
        self.matmul_n = 256 if small else 8192
        self.matmul_s = 0.2 if small else 1.0
        self.train_steps = 2 if small else 50
        self.science_rows = 200 if small else None


# -- the parent: runs each step in a child with a timeout -------------------------------------------------


def child_command(step: str, args: argparse.Namespace, seconds: float) -> list[str]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--step",
        step,
        "--out",
        str(args.out),
        "--device",
        args.device,
        "--seconds",
        f"{seconds:.0f}",
        "--work",
        str(args.work),
    ]
    return (
        command
        + (["--small"] if args.small else [])
        + (["--job-rows", str(args.job_rows)] if args.job_rows else [])
        + ["--store-dtype", args.store_dtype]
    )


def run_step(step: str, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """Run ``step`` in a child for at most ``seconds``; its status, time and headline."""
    out = args.out / FILES[step]
    start = time.perf_counter()
    env = dict(
        os.environ,
        RESERVOIR_HOME=str(args.work / "home"),
        RESERVOIR_CACHE=str(args.work / "cache"),
        RESERVOIR_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    log = args.work / f"{step}.stderr"
    try:
        with open(log, "w") as err:
            done = subprocess.run(
                child_command(step, args, seconds),
                stdout=err,
                stderr=subprocess.STDOUT,
                timeout=seconds,
                env=env,
                cwd=ROOT,
            )
        status = "ok" if done.returncode == 0 else f"failed: exit {done.returncode}: {last_line(log)}"
    except subprocess.TimeoutExpired:
        status = f"skipped: out of time (stopped after {seconds:.0f} s)"
    took = time.perf_counter() - start
    if status != "ok":
        record_failure(out, step, status, log)
    return {"step": step, "status": status, "seconds": round(took, 1), "headline": headline(step, out)}


def last_line(path: Path) -> str:
    lines = (
        [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    )
    return lines[-1].strip()[:300] if lines else "no message"


def record_failure(out: Path, step: str, status: str, log: Path | None) -> None:
    """Say in the step's own file why it has no results (keeping what a log step wrote before it stopped;
    ``log`` None: a step that never ran)."""
    tail = log.read_text(errors="replace").splitlines()[-30:] if log is not None and log.is_file() else []
    if out.suffix == ".json":
        kept = read_json(out)
        out.write_text(json.dumps({**kept, "status": status, "log_tail": tail}, indent=1))
    else:
        with open(out, "a") as f:
            f.write(f"\n{status}\n" + "\n".join(tail) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def headline(step: str, out: Path) -> str:
    """One line of a step's results for the summary."""
    if step in ("test_cuda", "science"):
        lines = out.read_text(errors="replace").splitlines() if out.exists() else []
        summary = [
            ln.strip("= ")
            for ln in lines
            if ln.startswith("=") and ("passed" in ln or "skipped" in ln or "failed" in ln or "error" in ln)
        ]
        return (summary or [last_line(out) if out.exists() else "-"])[-1]
    r = read_json(out)
    if step == "env":
        return f"{r.get('card', '-')}, torch {r.get('torch', '-')}, CUDA {r.get('cuda', '-')}"
    if step == "roofline":
        return ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in r.get("tflops", {}).items())
    if step == "extract":
        return "; ".join(
            f"{name}: ours {s.get('ours_over_hf', '-')}x HF, {s.get('ours_of_roofline', '-')} of roofline"
            for name, s in r.get("shapes", {}).items()
        )
    if step == "job":
        limit, timed = r.get("limit", {}), r.get("phases", {})
        return (
            f"{r.get('tokens_per_s', '-')} tokens/s over {r.get('rows', '-')} rows; {limit.get('share', '-')} of its "
            f"limit ({limit.get('limit_s', '-')} s), steady batches {limit.get('steady_share', '-')} of theirs; "
            f"waiting for the writer {timed.get('waiting_for_writer_s', '-')} s"
        )
    if step == "train":
        return "; ".join(
            f"{name}: {s.get('steps_per_s', '-')} steps/s" for name, s in r.get("tasks", {}).items()
        )
    return ""


def write_summary(out: Path, rows: list[dict[str, Any]], args: argparse.Namespace, total: float) -> None:
    lines = [
        f"# GPU check ({'small' if args.small else 'full'}, device {args.device}, budget {args.budget:.0f} s, "
        f"took {total:.0f} s)",
        "",
        "| step | file | status | s | headline |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['step']} | {FILES[r['step']]} | {r['status']} | {r['seconds']} | {r['headline']} |"
        for r in rows
    ]
    (out / SUMMARY).write_text("\n".join(lines) + "\n")


def run_all(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    steps = args.steps
    share = args.budget / sum(CAPS[s] for s in steps)
    caps = {step: max(MIN_STEP, CAPS[step] * share) for step in steps}
    rows = []
    for i, step in enumerate(steps):
        left = args.budget - (time.perf_counter() - start)
        later = steps[i + 1 :]
        # its cap while the later steps can still start, up to twice the cap from time the earlier steps left over
        seconds = max(
            min(caps[step], left - MIN_STEP * len(later)),
            min(2 * caps[step], left - sum(caps[s] for s in later)),
        )
        if seconds < MIN_STEP:
            status = "skipped: out of time"
            record_failure(args.out / FILES[step], step, status, None)
            rows.append({"step": step, "status": status, "seconds": 0, "headline": "-"})
        else:
            print(f"{step}: up to {seconds:.0f} s ...", file=sys.stderr, flush=True)
            rows.append(run_step(step, args, seconds))
            print(
                f"{step}: {rows[-1]['status']} ({rows[-1]['seconds']} s) {rows[-1]['headline']}",
                file=sys.stderr,
                flush=True,
            )
    write_summary(args.out, rows, args, time.perf_counter() - start)
    print(args.out / SUMMARY)
    return 0


# -- the children: one step each --------------------------------------------------------------------------


def device_of(name: str):
    from reservoir.model.devices import resolve_device

    return resolve_device(name)


def sync(device) -> None:
    from matmul import sync as wait

    wait(device)


def step_env(args, sizes: Sizes) -> dict[str, Any]:
    import torch
    import transformers

    from reservoir.runtime.machine import describe

    device = device_of(args.device)
    info: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": describe(),
        "card": None,
        "driver": driver_version(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            card=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            devices=torch.cuda.device_count(),
        )
    return info


def driver_version() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``), or ``None`` where there is none."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def roofline(device, n: int, seconds: float = 1.0) -> dict[str, float]:
    """FLOP/s of ``torch.mm`` on ``n x n`` matrices in bf16 and in IEEE float32 (TF32 off) on ``device``."""
    import torch
    from matmul import matmul_rate

    from reservoir.runtime.dtypes import strict_float32

    strict_float32()
    return {
        name: matmul_rate(n, dtype, seconds, device)
        for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32))
    }


def step_roofline(args, sizes: Sizes) -> dict[str, Any]:
    device = device_of(args.device)
    rates = roofline(device, sizes.matmul_n, sizes.matmul_s)
    return {
        "device": str(device),
        "n": sizes.matmul_n,
        "tflops": {k: round(v / 1e12, 2) for k, v in rates.items()},
        "how": f"benchmarks/matmul.py matmul_rate: torch.mm of two n x n matrices for about {sizes.matmul_s} s "
        "after one untimed; "
        "float32 with TF32 off (reservoir.runtime.dtypes.strict_float32)",
    }


def step_test_cuda(args, sizes: Sizes) -> None:
    """pytest tests/system/test_cuda.py, its output into test_cuda.log as it runs (a stopped run keeps what it wrote)."""
    with open(args.out / FILES["test_cuda"], "w") as log:
        log.write("$ pytest -v -rs --durations=8 -p no:cacheprovider tests/system/test_cuda.py\n")
        log.flush()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-v",
                "-rs",
                "--durations=8",
                "-p",
                "no:cacheprovider",
                "tests/system/test_cuda.py",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        log.write(f"\npytest exit status {done.returncode}\n")


@contextmanager
def in_time(seconds: float):
    """A deadline: ``left()`` says how many seconds remain."""
    end = time.perf_counter() + seconds
    yield lambda: end - time.perf_counter()


def hf_sdpa(spec, shape: dict, seed: int, device, dtype):
    """The peer: a Hugging Face ``GPT2Model`` with ``gpt2-random``'s seeded weights, SDPA attention, in ``dtype``,
    behind the same input layer, every depth's last-token state through ``ln_f`` (``peers.Readout``)."""
    from peers import Readout, frozen
    from transformers import GPT2Config, GPT2Model

    from reservoir.model.backbones import seeded
    from reservoir.model.input_layer import make_input_layer

    with seeded(seed):
        model = frozen(GPT2Model(GPT2Config(**shape, attn_implementation="sdpa")))
    layer = frozen(make_input_layer(spec, shape["n_embd"], seed))
    return frozen(Readout(layer, model.to(dtype), dtype)).to(device), model.config._attn_implementation


def ours_runner(spec, shape: dict, seed: int, device, batch: int, compile: bool):
    from reservoir.model.backbones.gpt2 import random_gpt2
    from reservoir.runtime.runner import FeatureRunner

    backbone = random_gpt2(seed, **shape)
    return FeatureRunner.build(
        spec,
        backbone,
        list(range(shape["n_layer"] + 1)),
        seed=seed,
        dtype="auto",
        compile=compile,
        batch_size=batch,
        device=device,
        engine="torch",
    )


def shape_inputs(spec, batch: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    if spec.token_kind == "ids":
        tokens = rng.integers(1, spec.vocab_size, (batch, spec.seq_len))
    else:
        tokens = rng.random((batch, spec.seq_len, spec.token_dim), dtype=np.float32)
    return tokens, np.full(batch, spec.seq_len, dtype=np.int64)


def measure_rows(
    rows: dict[str, Callable[[], Any]], device, reps: int, left: Callable[[], float]
) -> dict[str, list[float]]:
    """Seconds per call of each row, in interleaved repetitions after two untimed calls each, while time lasts."""
    import extract

    extract.DEVICE = device
    for run in rows.values():
        run(), run()
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(reps):
        if left() < 5:
            break
        for name, run in rows.items():
            times[name].append(extract.timed(run))
    return times


def in_flight(runner, tokens, lengths, batches: int) -> Callable[[], Any]:
    """``batches`` batches queued with ``run_async`` before any is read, as the extraction's writer thread reads
    them while the next runs."""
    from reservoir.runtime.runner import resolve

    def run():
        pending = [runner.run_async(runner.prepare(tokens, lengths)) for _ in range(batches)]
        return [resolve(p) for p in pending]

    return run


def one_shape(
    name: str, spec, sizes: Sizes, device, peak: float, left: Callable[[], float]
) -> dict[str, Any]:
    """Ours (eager, then compiled while time lasts) against HF bf16 SDPA at one shape."""
    import statistics

    import numpy as np
    import torch
    from extract import flops_per_token

    shape, batch = sizes.shape, sizes.batch
    tokens, lengths = shape_inputs(spec, batch)
    d = shape["n_embd"]
    flops = flops_per_token(
        shape["n_layer"], d, 4 * d, spec.seq_len, spec.token_dim if spec.token_kind == "dense" else 0
    )
    hf, attention = hf_sdpa(spec, shape, 0, device, torch.bfloat16)
    x = torch.from_numpy(tokens).to(device)

    @torch.inference_mode()
    def hf_run():
        return hf(x).cpu().numpy()

    eager = ours_runner(spec, shape, 0, device, batch, compile=False)
    rows = {"hf-bf16-sdpa": hf_run, "ours-eager": lambda: eager(tokens, lengths)}
    compiled = None
    if left() > 60 and not sizes.small:  # a cold compile takes tens of seconds
        compiled = ours_runner(spec, shape, 0, device, batch, True)
        rows["ours-compiled"] = lambda: compiled(tokens, lengths)
    # as `reservoir extract` runs: batches queued ahead of reading any (the card never waits for the host)
    runner = compiled if compiled is not None else eager
    rows["ours-in-flight"] = in_flight(runner, tokens, lengths, IN_FLIGHT)
    times = measure_rows(rows, device, sizes.reps, left)
    n = batch * spec.seq_len
    rates = {
        k: n * (IN_FLIGHT if k == "ours-in-flight" else 1) / statistics.median(v)
        for k, v in times.items()
        if v
    }
    ref = hf_run()[:16]
    got = eager(tokens[:16], lengths[:16])[:, :, 0]
    error = float((np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)).max())
    best = max((r for k, r in rates.items() if k.startswith("ours")), default=float("nan"))
    one_at_a_time = max((r for k, r in rates.items() if k in ("ours-eager", "ours-compiled")), default=best)
    return {
        "seq_len": spec.seq_len,
        "tokens": spec.token_kind,
        "batch": batch,
        "depths": shape["n_layer"] + 1,
        "dtype_ours": eager.dtype_name,
        "attention_hf": attention,
        "flops_per_token": flops,
        "tokens_per_s": {k: round(v) for k, v in rates.items()},
        "ours_over_hf": round(best / rates["hf-bf16-sdpa"], 3) if "hf-bf16-sdpa" in rates else None,
        "ours_one_batch_at_a_time_over_hf": (
            round(one_at_a_time / rates["hf-bf16-sdpa"], 3) if "hf-bf16-sdpa" in rates else None
        ),
        "ours_of_roofline": f"{100 * best * flops / peak:.1f}%",
        "of_roofline": {k: round(v * flops / peak, 4) for k, v in rates.items()},
        "feature_error_ours_vs_hf": round(error, 5),
        "repetitions": {k: len(v) for k, v in times.items()},
    }


def step_extract(args, sizes: Sizes) -> dict[str, Any]:
    from reservoir.tasks import TaskSpec

    device = device_of(args.device)
    peak = roofline(device, sizes.matmul_n, sizes.matmul_s / 2)["bfloat16"]
    shapes = {
        "mnist": TaskSpec("mnist", "dense", seq_len=64, n_classes=10, token_dim=16),
        "listops": TaskSpec("listops", "ids", seq_len=sizes.listops_len, n_classes=10, vocab_size=16),
    }
    result: dict[str, Any] = {
        "device": str(device),
        "model": sizes.shape,
        "roofline_bf16_tflops": round(peak / 1e12, 2),
        "shapes": {},
    }
    with in_time(args.seconds - 5) as left:
        for name, spec in shapes.items():
            if left() < 15:
                result["shapes"][name] = {"status": "skipped: out of time"}
                continue
            try:
                result["shapes"][name] = one_shape(name, spec, sizes, device, peak, left)
            except Exception as e:  # noqa: BLE001 - one shape's failure is recorded, the other still runs
                result["shapes"][name] = {
                    "status": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                }
            write_json(args.out / FILES["extract"], result)  # kept if the next shape runs out of time
    return result


def synthetic_task(work: Path, rows: int) -> str:
    from extract import synthetic_task as write

    path = work / f"mnist-like-{rows}.npz"
    return f"file:{path}" if path.exists() else write(path, rows, 64, 0)


def step_job(args, sizes: Sizes) -> dict[str, Any]:
    """The whole ``reservoir extract`` in this process, timed by phase (``benchmarks/where.py``'s way)."""
    import io
    from contextlib import redirect_stderr

    start = time.perf_counter()
    task = synthetic_task(args.work, sizes.job_rows)
    made = time.perf_counter() - start
    backbone = "gpt2-random" if not sizes.small else tiny_folder(args.work)
    marks: dict[str, Any] = {"calls": [], "writer_wait": 0.0}
    imported = time.perf_counter()
    from reservoir.cli import main as cli

    imported = time.perf_counter() - imported
    patch_phases(marks)
    argv = [
        "extract",
        "--task",
        task,
        "--split",
        "train",
        "--limit",
        str(sizes.job_rows),
        "--backbone",
        backbone,
        "--device",
        args.device,
        "--out",
        str(args.work / "job.h5"),
        "--store-dtype",
        args.store_dtype,
        "--force",
    ]
    err = io.StringIO()
    begin = time.perf_counter()
    with redirect_stderr(err):
        cli(argv, prog_name="reservoir", standalone_mode=False)
    end = time.perf_counter()
    timed = phases(marks, begin, end, imported)
    return {
        "command": "reservoir " + " ".join(argv),
        "rows": sizes.job_rows,
        "tokens": sizes.job_rows * 64,
        "seconds": round(end - begin, 2),
        "tokens_per_s": round(sizes.job_rows * 64 / (end - begin)),
        "data_written_s": round(made, 1),
        "phases": timed,
        "limit": job_limit(args, sizes, end - begin, timed),
        "log": said_lines(err.getvalue())[-20:],
    }


def job_limit(args, sizes: Sizes, seconds: float, timed: dict[str, Any]) -> dict[str, Any]:
    """The job's limit, measured now: the larger of its matrix-product FLOPs at the device's ``torch.mm`` rate
    (the faster of bf16 and float32) and its feature bytes (as ``--store-dtype`` stores them) at the disk's sequential
    write rate (with fsync, in the job's folder);
    the whole job's share of it and the steady batches' share of theirs."""
    from extract import flops_per_token
    from writer import disk_rate

    shape = sizes.shape
    per_token = flops_per_token(shape["n_layer"], shape["n_embd"], 4 * shape["n_embd"], 64, 16)
    per_row_bytes = (shape["n_layer"] + 1) * shape["n_embd"] * (4 if args.store_dtype == "float32" else 2)
    rate = max(roofline(device_of(args.device), sizes.matmul_n, sizes.matmul_s).values())
    nbytes = sizes.job_rows * per_row_bytes
    disk = disk_rate(args.work, max(1 << 24, min(nbytes, 1 << 30)))  # GB/s

    def limit(rows: int) -> dict[str, float]:
        compute, write = rows * 64 * per_token / rate, rows * per_row_bytes / (disk * 1e9)
        return {
            "compute_s": round(compute, 3),
            "disk_s": round(write, 3),
            "limit_s": round(max(compute, write), 3),
        }

    whole = limit(sizes.job_rows)
    out = {"roofline_tflops": round(rate / 1e12, 2), "disk_gb_s": round(disk, 2), **whole}
    out["share"] = round(whole["limit_s"] / seconds, 3)
    out["phases_share_of_job"] = {
        k[:-2]: round(v / seconds, 3)
        for k, v in timed.items()
        if k.endswith("_s") and k not in ("imports_s", "steady_tokens_per_s")
    }
    if "steady_s" in timed:
        steady_rows = timed["steady_tokens_per_s"] * timed["steady_s"] / 64
        out["steady_share"] = round(limit(round(steady_rows))["limit_s"] / timed["steady_s"], 3)
    return out


def said_lines(text: str) -> list[str]:
    """The lines a run said on stderr, without its progress bars (redrawn with carriage returns)."""
    return [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip() and "%|" not in ln]


def patch_phases(marks: dict[str, Any]) -> None:
    """Record when each batch starts, when preparing ends, how long the main thread waits for the writer."""
    from reservoir.extract import run as run_module
    from reservoir.runtime.runner import FeatureRunner

    prepare, run_async, submit, drain = (
        run_module.prepare,
        FeatureRunner.run_async,
        run_module.BackgroundWriter.submit,
        run_module.BackgroundWriter.drain,
    )

    def timed_prepare(*a, **k):
        out = prepare(*a, **k)
        marks["prepared"] = time.perf_counter()
        return out

    def timed_run(self, batch, *store):
        marks["calls"].append((time.perf_counter(), batch.n, self.compiled))
        return run_async(self, batch, *store)

    def timed_submit(self, *a):
        t = time.perf_counter()
        submit(self, *a)
        marks["writer_wait"] += time.perf_counter() - t

    def timed_drain(self):
        drain(self)
        marks["drained"] = time.perf_counter()

    run_module.prepare, FeatureRunner.run_async = timed_prepare, timed_run
    run_module.BackgroundWriter.submit, run_module.BackgroundWriter.drain = timed_submit, timed_drain


def phases(marks: dict[str, Any], begin: float, end: float, imported: float) -> dict[str, Any]:
    calls = [(c[0], c[1], c[2] if len(c) > 2 else False) for c in marks["calls"]]
    at = [c[0] for c in calls] + [marks.get("drained", end)]
    out = {"imports_s": round(imported, 2), "preparing_s": round(marks.get("prepared", begin) - begin, 2)}
    # the first compiled call compiles: its own phase; the steady batches start after it
    compiling = next((i for i, c in enumerate(calls) if c[2]), None)
    steady = max(2, compiling + 1) if compiling is not None else 2
    if len(calls) > steady:
        steady_rows = sum(c[1] for c in calls[steady:])
        out.update(
            probe_and_decision_s=round(at[1] - at[0], 2),
            first_batch_after_decision_s=round(at[2] - at[1], 2) if compiling != 1 else 0.0,
            compiling_s=round(at[compiling + 1] - at[compiling], 2) if compiling is not None else 0.0,
            steady_s=round(at[-1] - at[steady], 2),
            steady_tokens_per_s=round(steady_rows * 64 / (at[-1] - at[steady])),
            batches=len(calls),
        )
    out.update(waiting_for_writer_s=round(marks["writer_wait"], 2), finishing_s=round(end - at[-1], 2))
    return out


def tiny_folder(work: Path) -> str:
    """A tiny GPT-2 saved as a folder (``--small``)."""
    import torch
    from transformers import GPT2Config, GPT2Model

    folder = work / "tiny-gpt2"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        GPT2Model(GPT2Config(**TINY, n_positions=1024)).save_pretrained(folder)
    return str(folder)


def train_rate(
    task_name: str, backbone: str, device, batch: int, left: Callable[[], float], steps: int
) -> dict:
    """Steps/s of :func:`reservoir.train.train_step` (the loop's step) on fixed batches of the task's train split."""
    import numpy as np
    import torch

    from reservoir.config import TRAIN_DTYPES, TrainConfig
    from reservoir.model.backbones import load_backbone
    from reservoir.runtime.dtypes import choose
    from reservoir.tasks import get_task
    from reservoir.train import FPT, batch_tensors, select_trainable, train_step

    task, frozen = (
        get_task(task_name, n_train=str(4 * batch)),
        load_backbone(backbone, 0),
    )  # 4 batches: generated fast
    model = FPT(task.spec, frozen, blocks=frozen.n_layers, seed=0).to(device)
    params, _ = select_trainable(model, TrainConfig(task_name, backbone).trainable)
    opt = torch.optim.Adam(params, lr=1e-4)
    dtype = choose(device, frozen.d_model, allowed=TRAIN_DTYPES)[0]
    data = task.load("train", Path(os.environ["RESERVOIR_HOME"]) / "data", batch * 4)
    batches = [batch_tensors(task, data, np.arange(i * batch, (i + 1) * batch) % len(data)) for i in range(4)]
    model.train()
    for b in batches[:2]:
        train_step(model, params, opt, b, dtype, 1.0)
    sync(device)
    done, start = 0, time.perf_counter()
    while done < steps and left() > 3:
        train_step(model, params, opt, batches[done % 4], dtype, 1.0)
        done += 1
    sync(device)
    rate = done / (time.perf_counter() - start)
    return {
        "dtype": dtype,
        "batch": batch,
        "seq_len": task.spec.seq_len,
        "steps": done,
        "steps_per_s": round(rate, 2),
        "examples_per_s": round(rate * batch, 1),
        "trainable": list(TrainConfig(task_name, backbone).trainable),
    }


def step_train(args, sizes: Sizes) -> dict[str, Any]:
    device = device_of(args.device)
    backbone = "gpt2-random" if not sizes.small else tiny_folder(args.work)
    result: dict[str, Any] = {"device": str(device), "backbone": backbone, "tasks": {}}
    with in_time(args.seconds - 5) as left:
        for name in ("bit_memory", "listops"):
            if left() < 10:
                result["tasks"][name] = {"status": "skipped: out of time"}
                continue
            try:
                result["tasks"][name] = train_rate(
                    name, backbone, device, sizes.train_batch, left, steps=sizes.train_steps
                )
            except Exception as e:  # noqa: BLE001 - one task's failure is recorded, the other still runs
                result["tasks"][name] = {
                    "status": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                }
            write_json(args.out / FILES["train"], result)
    return result


def step_science(args, sizes: Sizes) -> None:
    """Digits through the backbone on the device and on the CPU (float32): features per depth, then a ridge
    head per depth on each; everything said in science.log as it happens."""
    import h5py
    import numpy as np

    from reservoir import api

    backbone = "gpt2-random" if not sizes.small else tiny_folder(args.work)
    depths = "0,3,6,9,12" if not sizes.small else "all"
    limit = sizes.science_rows
    with open(args.out / FILES["science"], "w") as log:

        def say(text: str) -> None:
            log.write(text + "\n")
            log.flush()

        say(f"digits through {backbone}, float32, depths {depths}, on {args.device} and on the CPU")
        files = {}
        for device in dict.fromkeys((args.device, "cpu")):
            start = time.perf_counter()
            files[device] = api.extract(
                "digits",
                backbone,
                dtype="float32",
                depths=depths,
                device=device,
                limit=limit,
                out=args.work / f"science-{device.replace(':', '')}.h5",
            )
            say(f"extract on {device}: {time.perf_counter() - start:.1f} s -> {files[device]}")
        with h5py.File(files[args.device]) as a, h5py.File(files["cpu"]) as b:
            for split in ("train", "test"):
                x, y = a[split]["features"][:], b[split]["features"][:]
                err = np.linalg.norm(x - y, axis=-1) / np.maximum(np.linalg.norm(y, axis=-1), 1e-12)
                say(
                    f"{split}: largest relative difference per depth, {args.device} vs cpu: "
                    + ", ".join(f"{v:.1e}" for v in err.reshape(len(err), err.shape[1], -1).max(axis=(0, 2)))
                )
        for device, path in files.items():
            results = api.fit(features=path, head="ridge", depths="all", baselines=False)
            say(
                f"ridge test accuracy per depth, features from {device}: "
                + ", ".join(f"{r['depth']}: {100 * r['test_accuracy']:.1f}%" for r in results)
            )


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=1, default=str))


STEPS: dict[str, Callable] = {
    "env": step_env,
    "roofline": step_roofline,
    "test_cuda": step_test_cuda,
    "extract": step_extract,
    "job": step_job,
    "train": step_train,
    "science": step_science,
}


def run_child(args: argparse.Namespace) -> int:
    result = STEPS[args.step](args, Sizes(args.small, args.job_rows))
    if result is not None:
        write_json(args.out / FILES[args.step], {"status": "ok", **result})
    return 0


# -- options ---------------------------------------------------------------------------------------------


def fail(message: str) -> int:
    print(f"Error: {message}", file=sys.stderr)
    return 1


def steps_list(text: str) -> list[str]:
    named = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in named if s not in CAPS]
    if unknown or not named:
        raise argparse.ArgumentTypeError(
            f"unknown step {', '.join(unknown) or text!r}; choose from {','.join(CAPS)}"
        )
    return [s for s in CAPS if s in named]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out",
        type=Path,
        default=os.environ.get("OUT") or None,
        help="folder for the (at most 8) result files (default: $OUT)",
    )
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="seconds for every step together")
    p.add_argument(
        "--small", action="store_true", help="a tiny model and tiny sizes (runs on a CPU in under a minute)"
    )
    p.add_argument(
        "--job-rows",
        type=int,
        default=None,
        help="rows of the job step's extraction (default: 60,000; 600 with --small)",
    )
    p.add_argument(
        "--store-dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="the dtype the job step stores its features in (reservoir extract --store-dtype)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (a CUDA GPU when present, else the CPU), cpu, cuda[:N]"
    )
    p.add_argument(
        "--steps",
        type=steps_list,
        default=list(CAPS),
        help=f"the steps to run, comma-separated, in their own order (default: all of {','.join(CAPS)})",
    )
    p.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)  # a child: run one step
    p.add_argument("--seconds", type=float, default=60, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.out is None:
        return fail("no output folder: pass --out DIR, or set OUT")
    if not args.budget > 0:
        return fail(f"--budget must be a positive number of seconds; got {args.budget}")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail(
            f"cannot create the output folder {args.out} ({e.strerror}); pass --out a folder you can write"
        )
    if args.step:
        return run_child(args)
    from reservoir.errors import ReservoirError

    try:
        resolved = device_of(args.device)
    except ReservoirError as e:
        return fail(str(e))
    args.device = str(resolved) if args.device != "auto" else resolved.type
    with tempfile.TemporaryDirectory(prefix="reservoir-gpu-") as work:
        args.work = Path(work)
        return run_all(args)


if __name__ == "__main__":
    sys.exit(main())

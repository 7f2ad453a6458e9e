"""Runs trained together against the same runs one after another: a sweep's runs with the default
``concurrent_runs`` (as many as fit the memory) and with ``concurrent_runs=1``, in one process.

    .venv/bin/python benchmarks/train_batched.py                  # 2 rates x 3 seeds, 4-block 64-wide GPT-2, bit XOR
    .venv/bin/python benchmarks/train_batched.py --steps 600 --threads 2

The backbone is a random GPT-2 (``--blocks`` blocks, ``--width`` wide) saved with ``save_pretrained`` to a
temporary folder, so every run reads the same frozen weights. Both sweeps run :func:`reservoir.train.train`
with the same settings (dropout off, float32, the stopping rule's defaults but ``--steps``), results and
checkpoints in a temporary ``RESERVOIR_HOME``. Every step's training loss is recorded as the loop reads it
(:func:`reservoir.train.step.check_steps`). Printed, per run: the stop step, best step and test accuracy of both
sweeps (asserted equal), the largest difference of validation accuracy at any pass (in outputs of a pass) and
the largest relative difference of the training losses over the first ``--loss-steps`` steps; then each sweep's
wall time (data, models, training, validation and test: all of it), its training tokens/s (steps x batch x
tokens a row, over the wall time) and the ratio.

``--throughput`` measures instead the training step of a group (:meth:`reservoir.train.group.GroupRun.step`: one
forward and backward over every run's batch, each run's clipping and Adam, dropout 0.1 drawn from each run's
generators) at 1, 3 and 9 runs a batch on the bit memory (120 tokens x 50 bits), ListOps (up to 512 ids) and
MNIST (64 patches x 16; random images in the official format) shapes, beside one run's own step
(:func:`reservoir.train.step.train_step`): tokens/s of the real tokens, and the share of the float32 and bf16
matrix-product rooflines measured now (``(4096, 768) @ (768, 3072)``, as ``extract --dtype auto`` measures) that
the step's forward plus input-gradient FLOPs take (every block counted on every token: the readout-only last
block computes less, so the share is an upper bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reservoir.train.group  # noqa: E402
import reservoir.train.step  # noqa: E402
from reservoir.config import TrainConfig  # noqa: E402
from reservoir.model.backbones import load_backbone  # noqa: E402
from reservoir.runtime.machine import describe, load  # noqa: E402
from reservoir.tasks import make_task  # noqa: E402
from reservoir.train import loop  # noqa: E402
from reservoir.train.checkpoint import settings_identity  # noqa: E402
from reservoir.train.data import load_data  # noqa: E402
from reservoir.train.group import GroupBatches, GroupRun  # noqa: E402
from reservoir.train.step import optimizer, train_step  # noqa: E402


def backbone(folder: Path, blocks: int, width: int) -> Path:
    """A random GPT-2 of ``blocks`` blocks, ``width`` wide, written by ``save_pretrained``."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    GPT2Model(GPT2Config(n_layer=blocks, n_embd=width, n_head=4, n_positions=1024)).save_pretrained(folder)
    return folder


def sweep(cfg: TrainConfig, losses: dict[str, list[float]]) -> tuple[dict, float]:
    """``train(cfg)`` with every step's training loss of each run (by its tag) into ``losses``; the result and
    its wall seconds."""
    real = reservoir.train.step.check_steps

    def recording(values, norms, first, tag, lr):
        run = losses.setdefault(tag, [])
        assert len(run) == first, (tag, len(run), first)
        run.extend(values)
        return real(values, norms, first, tag, lr)

    # read by a run alone (read_steps) and by runs trained together (GroupRun.read)
    reservoir.train.step.check_steps = reservoir.train.group.check_steps = recording
    try:
        start = time.perf_counter()
        result = loop.train(cfg, progress=False)
        return result, time.perf_counter() - start
    finally:
        reservoir.train.step.check_steps = reservoir.train.group.check_steps = real


#: the shapes of --throughput: task options that keep the data small (the step's shape is the task's)
SHAPES = {
    "bit_memory": {"n_train": "400", "n_test": "40"},
    "listops": {"n_train": "400", "n_val": "40", "n_test": "40"},
    "mnist": {},
}


def write_mnist(folder: Path, rows: int) -> None:
    """Random images and labels in MNIST's official format (gzipped IDX), ``rows`` a split."""
    import gzip

    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(b"\0\0\x08\x03" + rows.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2)
            f.write(rng.integers(0, 256, (rows, 28, 28), dtype=np.uint8).tobytes())
        with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(
                b"\0\0\x08\x01" + rows.to_bytes(4, "big") + (np.arange(rows) % 10).astype(np.uint8).tobytes()
            )


def step_flops(tokens: int, width: int, blocks: int, length: int) -> float:
    """Forward plus input-gradient FLOPs of a step of ``tokens`` tokens through ``blocks`` GPT-2 blocks ``width``
    wide, rows ``length`` long: twice the forward's (its 12 d^2 weights a token a block, and causal attention's
    2 length d a token a block, each 2 FLOPs a multiply-add)."""
    return 2 * tokens * blocks * (2 * 12 * width**2 + 2 * 2 * length * width)


def timed(step: Callable[[], None], finish: Callable[[], None], seconds: float) -> float:
    """Seconds a call of ``step`` takes: two warm-up calls, then calls until ``seconds`` have passed (3 at least);
    ``finish()`` waits for the last."""
    step()
    step()
    finish()
    n, start = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - start < seconds:
        step()
        n += 1
    finish()
    return (time.perf_counter() - start) / n


def alone_seconds(task, folder: str, cfg: TrainConfig, batch, args) -> float:
    """Seconds of one run's own step (:func:`reservoir.train.step.train_step`) on ``batch``."""
    from reservoir.train import FPT, select_trainable

    model = FPT(task.spec, load_backbone(folder, 0), blocks=args.blocks, seed=0, dropout=cfg.dropout)
    params, _ = select_trainable(model, cfg.trainable)
    opt = optimizer(params, 1e-3)
    model.train()
    return timed(lambda: train_step(model, params, opt, batch, "float32", 1.0), lambda: None, args.seconds)


def group_seconds(task, data, cfg: TrainConfig, shared: dict, runs: int, seconds: float) -> float:
    """Seconds of a step of a group of ``runs`` runs (seeds ``0 .. runs-1``) on the task's training batches."""
    cpu = torch.device("cpu")
    group = GroupRun(
        cfg,
        task,
        data,
        [(1e-3, s) for s in range(runs)],
        device=cpu,
        log=lambda msg: None,
        shared=shared,
        show_counts=False,
    )
    assert not group.mismatch, group.mismatch
    with GroupBatches(task, data.train, cfg.batch_size, cpu) as batches:

        def step():
            group.step(batches.take(tuple((m.seed, m.state.step) for m in group.active)))

        return timed(step, group.read, seconds)


def throughput(args, home: Path, folder: str) -> None:
    """The --throughput table (module docstring)."""
    import numpy as np

    from reservoir.runtime.dtypes import candidates, rate
    from reservoir.train import batch_tensors

    roofline = {
        d: rate(d, threads=torch.get_num_threads()) for d in candidates() if d in ("float32", "bfloat16")
    }
    print(
        "# matrix-product roofline now, GFLOP/s: " + ", ".join(f"{d} {r:,.0f}" for d, r in roofline.items())
    )
    write_mnist(home / "data" / "mnist", 400)
    runs_list = [int(x) for x in args.runs.split(",")]
    print()
    print(
        "| shape | runs a batch | step (ms) | tokens/s | x one run alone | "
        + " | ".join(f"share of {d} roofline" for d in roofline)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(roofline))
    for name in args.shapes.split(","):
        cfg = TrainConfig(
            task=name,
            backbone=folder,
            task_options=SHAPES[name],
            seeds=max(runs_list),
            batch_size=args.batch_size,
            dropout=0.1,
            dtype="float32",
            checkpoint_dir=home / "throughput",
            data_dir=home / "data",
        )
        task = make_task(cfg.task, cfg.task_options, cfg.seed)
        data = load_data(task, cfg)
        shared = settings_identity(cfg, task, data.named())
        rows = np.arange(args.batch_size) % len(data.train)
        tokens, lengths, labels = batch_tensors(task, data.train, rows)
        real, width = int(lengths.sum()), tokens.shape[1]
        alone = alone_seconds(task, folder, cfg, (tokens, lengths, labels), args)
        rates = {0: (alone, real / alone)}
        for runs in runs_list:
            seconds = group_seconds(task, data, cfg, shared, runs, args.seconds)
            rates[runs] = (seconds, runs * real / seconds)
        for runs, (seconds, tps) in rates.items():
            flops = step_flops(tps * seconds, args.width, args.blocks, width) / seconds / 1e9
            shares = " | ".join(f"{100 * flops / r:.1f}%" for r in roofline.values())
            label = "1 (its own step)" if runs == 0 else str(runs)
            print(
                f"| {name} ({width} x {task.spec.token_dim or task.spec.vocab_size}) | {label} | "
                f"{1000 * seconds:.0f} | {tps:,.0f} | {tps / rates[0][1]:.2f} | {shares} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="bit_xor")
    ap.add_argument("--task-opt", action="append", default=[], help="KEY=VALUE, the task's own options")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--lr", default="1e-3,3e-3")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--loss-steps", type=int, default=200, help="steps whose training losses are compared")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--throughput", action="store_true", help="time the step on the bit memory, ListOps, MNIST shapes"
    )
    ap.add_argument("--shapes", default=",".join(SHAPES), help="--throughput's shapes")
    ap.add_argument("--runs", default="1,3,9", help="--throughput's runs a batch")
    ap.add_argument("--seconds", type=float, default=5.0, help="--throughput's seconds a measurement")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    home = Path(tempfile.mkdtemp(prefix="reservoir-batched-"))
    os.environ["RESERVOIR_HOME"] = str(home)
    if args.throughput:
        print(f"# {' '.join(sys.argv)}")
        print(f"# {describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads; {load()}")
        print(
            f"# GPT-2 {args.blocks} blocks x {args.width} (random), batch {args.batch_size} a run, float32, dropout 0.1"
        )
        throughput(args, home, str(backbone(home / "gpt2", args.blocks, args.width)))
        print(f"# {load()} (after)")
        return
    options = dict(kv.split("=", 1) for kv in args.task_opt)
    cfg = TrainConfig(
        task=args.task,
        backbone=str(backbone(home / "gpt2", args.blocks, args.width)),
        task_options=options,
        lr=tuple(float(x) for x in args.lr.split(",")),
        seeds=args.seeds,
        steps=args.steps,
        batch_size=args.batch_size,
        eval_every=args.eval_every,
        dropout=0.0,
        dtype="float32",
        data_dir=home / "data",
    )
    spec = make_task(cfg.task, cfg.task_options, cfg.seed).spec
    print(f"# {' '.join(sys.argv)}")
    print(f"# {describe()}")
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} threads; {args.task} ({spec.seq_len} tokens a row), "
        f"GPT-2 {args.blocks} blocks x {args.width}, lr {args.lr} x {args.seeds} seeds, batch {args.batch_size}, "
        f"at most {args.steps} steps, validation every {args.eval_every}, dropout off, float32"
    )
    print(f"# {load()} (before)")
    together_losses: dict[str, list[float]] = {}
    alone_losses: dict[str, list[float]] = {}
    together, t_together = sweep(dataclasses.replace(cfg, checkpoint_dir=home / "together"), together_losses)
    alone, t_alone = sweep(
        dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), alone_losses
    )
    print(f"# {load()} (after)")
    print()
    print(
        "| run | batch | stop step (together / alone) | best step | test accuracy | max val-accuracy difference "
        f"(outputs) | max rel. loss difference, first {args.loss_steps} steps |"
    )
    print("|---|---|---|---|---|---|---|")
    for a, b in zip(together["runs"], alone["runs"]):
        tag = f"[lr={a['lr']:g} seed={a['seed']}]"
        passes = max(
            abs(x["val_accuracy"] - y["val_accuracy"])
            for x, y in zip(a["history"], b["history"], strict=True)
        )
        n_out = together["n_val"] * spec.n_readout * spec.outputs_per_token
        la, lb = together_losses[tag][: args.loss_steps], alone_losses[tag][: args.loss_steps]
        rel = max(abs(x - y) / abs(y) for x, y in zip(la, lb, strict=True))
        print(
            f"| {tag} | {a['batch_runs']} | {a['steps']} / {b['steps']} | {a['best_step']} / {b['best_step']} | "
            f"{100 * a['test_accuracy']:.2f}% / {100 * b['test_accuracy']:.2f}% | {passes * n_out:.0f} of {n_out} | "
            f"{rel:.1e} |"
        )
    print()
    rows = args.batch_size * spec.seq_len
    for name, result, seconds in (("together", together, t_together), ("one after another", alone, t_alone)):
        steps = sum(r["steps"] for r in result["runs"])
        print(
            f"{name}: {seconds:.1f} s wall, {steps} run-steps, {steps * rows / seconds:,.0f} training tokens/s "
            f"({steps / seconds:.1f} run-steps/s)"
        )
    print(f"wall-time ratio (one after another / together): {t_alone / t_together:.2f}x")
    for a, b in zip(together["runs"], alone["runs"]):
        assert (a["steps"], a["best_step"], a["test_accuracy"]) == (
            b["steps"],
            b["best_step"],
            b["test_accuracy"],
        ), (
            a["lr"],
            a["seed"],
        )


if __name__ == "__main__":
    main()

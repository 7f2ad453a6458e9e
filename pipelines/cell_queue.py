"""The missing end-to-end cells of the paper's tables, in priority order, run within a time budget on the
device in hand: every lent minute (a card's, or a CPU's) adds cells.

    python pipelines/cell_queue.py list                      # every cell: kept, begun (with its time) or waiting, and its cost here
    python pipelines/cell_queue.py next --budget 600         # run the next cells that fit 600 s here, batched
    make -C pipelines next BUDGET=600                    # the same

A cell is one setting of a table (task, backbone, trained groups, learning rates x seeds, steps): one `reservoir
train` process whose runs train together (`--concurrent-runs`). Its cost on the device in hand is estimated from
its steps, its tokens per step and the backbone's size (forward plus input gradients, four multiply-adds per
weight per token) at a share of the device's rate (a card's bf16 roofline, or this CPU's measured matrix rate).
`next` takes the cells in order (on a CPU only those whose estimate fits the time left: the rest wait for a
card, listed with their cost), each given the time left (`--max-time`, counted across invocations): a cell
that ends has its result kept and the next one starts; a cell this machine cannot start (its backbone not installed,
its data absent) or that fails is passed over for the next; one the budget cuts leaves its checkpoints (trainable parameters, optimiser states, generators) in
``QUEUE/CELL/`` in the repository, so the next invocation, on any machine, resumes it. A cell that ends has its
result kept in the table's ledger (``pipelines/ledger.py``: ``LEDGER/tableN/``) and its checkpoints removed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "docs" / "results" / "runs"
QUEUE = LEDGER / "queue"
#: seconds a cell needs beyond its training: start-up, the last validation, the test split, the result
RESERVE = 45.0
#: the share of a device's rate a training step reaches: a CPU's of its measured matrix rate; a card's of its bf16
#: peak as measured on an H200 (docs/results/gpu: gpt2-random's FPT step at batch 32 took 51.7 steps/s on bit
#: memory, 7% of the peak by this count, and 19.4 on ListOps, 11%), the lower taken
SHARE = 0.3
CARD_SHARE = 0.07
#: bf16 dense matrix rates of the cards lent, in FLOP/s
CARDS = {"H100": 989e12, "H200": 989e12}
#: the paper's and the critique's settings the cells share
FPT = ("input", "pos", "ln", "out")
EVERY = ("input", "pos", "ln", "attn", "ff", "out")
SWEEP = (1e-5, 1e-4, 1e-3, 1e-2)
#: validation accuracy at which a cell's runs stop (the bit tasks: solved); ListOps' 30% is table 6's threshold of
#: steps to reach alone (:data:`TARGET_TABLES`: the tables a task's target applies to; all where not listed), and an
#: accuracy table's ListOps cell trains on
TARGETS = {"bit_xor": 0.99, "bit_memory": 0.99, "listops": 0.3}
TARGET_TABLES = {"listops": (6,)}
#: the paper's tables 18 and 20: each trains the output layer alone or with one other group
ABLATION = {
    ("out",): "output only",
    ("input", "out"): "output + input",
    ("pos", "out"): "output + positions",
    ("ln", "out"): "output + layernorm",
}
#: the critique's scaling table (101): its columns, and the blocks of its DistilGPT2 that run (as `make critique`)
CRITIQUE_TASKS = ("mnist", "cifar10", "cifar10_lra")
CRITIQUE_BLOCKS = 6


@dataclasses.dataclass(frozen=True)
class Cell:
    """One setting of a table to train: its runs are ``lrs`` x ``seeds``, at most ``steps`` steps each."""

    table: int
    task: str
    backbone: str
    trainable: tuple[str, ...] = FPT
    lrs: tuple[float, ...] = (1e-3,)
    seeds: int = 3
    steps: int = 20000
    limit: int | None = 10000
    batch_size: int = 32
    options: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        lrs = "-".join(f"{lr:g}" for lr in self.lrs)
        return f"table{self.table}_{self.task}_{Path(self.backbone).name}_{'-'.join(self.trainable)}_lr{lrs}_s{self.seeds}_{self.steps}"

    @property
    def runs(self) -> int:
        return len(self.lrs) * self.seeds

    def command(self) -> list[str]:
        target = TARGETS.get(self.task) if self.table in TARGET_TABLES.get(self.task, (self.table,)) else None
        return [
            "train",
            "--task",
            self.task,
            "--backbone",
            self.backbone,
            "--trainable",
            ",".join(self.trainable),
            "--lr",
            ",".join(f"{lr:g}" for lr in self.lrs),
            "--seeds",
            str(self.seeds),
            "--steps",
            str(self.steps),
            "--batch-size",
            str(self.batch_size),
            *(["--limit", str(self.limit)] if self.limit else []),
            *(["--target", str(target), "--stop-at", str(target)] if target else []),
            # every run in one group: the cell's time limit, counted per run, is then the cell's wall time
            *(["--concurrent-runs", str(self.runs)] if self.runs > 1 else []),
            *self.options,
        ]


def cells() -> list[Cell]:
    """Every end-to-end cell the tables miss, in the order lent time goes to them."""
    # table 6's speedup is FPT's steps against Random's: both rows (its D.4: the models of table 2's FPT)
    out = [
        Cell(6, "bit_memory", b, steps=40000) for b in ("smollm2-135m-random", "gpt2-random", "smollm2-135m")
    ]
    for task in ("bit_memory", "bit_xor", "listops", "mnist"):
        out += [Cell(2, task, b) for b in ("smollm2-135m", "smollm2-135m-random", "gpt2-random")]
    blocks = ("--blocks", str(CRITIQUE_BLOCKS))
    for task in CRITIQUE_TASKS:
        for b in ("smollm2-135m", "smollm2-135m-random"):
            out += [Cell(101, task, b, trainable, SWEEP, options=blocks) for trainable in (FPT, EVERY)]
    for table, backbone in ((18, "smollm2-135m"), (20, "smollm2-135m-random")):
        out += [Cell(table, "bit_memory", backbone, groups) for groups in ABLATION]
    for task in ("cifar10", "cifar10_lra", "remote_homology"):
        # remote homology at the paper's 1e-4 (its appendix C)
        lrs = (1e-4,) if task == "remote_homology" else (1e-3,)
        out += [Cell(2, task, b, lrs=lrs, steps=5000) for b in ("smollm2-135m", "gpt2-random")]
    return out


def weights(backbone: str) -> float:
    """Multiply-adds per token of a backbone's blocks (12 x blocks x width^2 for a transformer)."""
    from reservoir.model.backbones import parse_name

    base = parse_name(backbone).base
    shapes = {"smollm2-135m": (30, 576, 106e6)}
    if base in shapes:
        return shapes[base][2]
    from reservoir.model.backbones.gpt2 import GPT2_SIZES

    if base in GPT2_SIZES:
        shape = GPT2_SIZES[base]
        return 12 * shape["n_layer"] * shape["n_embd"] ** 2
    config = json.loads((Path(base) / "config.json").read_text())
    layers = config.get("n_layer") or config.get("num_hidden_layers")
    width = config.get("n_embd") or config.get("hidden_size")
    return 12 * layers * width**2


def rate() -> tuple[float, str]:
    """FLOP/s a training step reaches on the device in hand (:data:`CARD_SHARE` or :data:`SHARE` of its rate), and
    the device."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = next((r for card, r in CARDS.items() if card in name), 400e12)
        return CARD_SHARE * peak, name
    from reservoir.runtime.dtypes import measured_rates

    rates, _ = measured_rates()
    return SHARE * max(rates.values()) * 1e9, "cpu"


def cost(cell: Cell, flops: float) -> float:
    """Seconds ``cell`` needs at ``flops`` FLOP/s, its runs to their last step (an upper bound)."""
    from reservoir.tasks import get_task

    tokens = cell.batch_size * get_task(cell.task).spec.seq_len
    return len(cell.lrs) * cell.seeds * cell.steps * 4 * weights(cell.backbone) * tokens / flops


def state(queue: Path) -> dict:
    path = queue / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_state(queue: Path, value: dict) -> None:
    queue.mkdir(parents=True, exist_ok=True)
    tmp = queue / ".state.json.tmp"
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    tmp.replace(queue / "state.json")


def listing(todo: list[Cell], queue: Path, flops: float, device: str) -> str:
    """Every cell with its state and its estimated minutes here and on an H100."""
    done, card = state(queue), CARD_SHARE * CARDS["H100"]
    lines = [
        f"end-to-end cells, in order; estimated minutes here ({device}, {flops / 1e12:.3g} TFLOP/s) and on an H100 "
        f"({card / 1e12:.0f} TFLOP/s): every run to its last step, an upper bound"
    ]
    for cell in todo:
        entry = done.get(cell.name, {})
        status = "kept" if entry.get("done") else f"begun ({entry['seconds']:.0f} s)" if entry else "waiting"
        lines.append(
            f"  {status:16s} {cost(cell, flops) / 60:10.1f} {cost(cell, card) / 60:8.1f}  {cell.name}"
        )
    return "\n".join(lines)


def unready(cell: Cell, data_dir: Path) -> str | None:
    """Why ``cell`` cannot start here (its backbone is not installed, its data is not in ``data_dir``), or ``None``:
    such a cell waits for a machine that has them, and the next cells run."""
    from reservoir.errors import ReservoirError
    from reservoir.model.backbones import parse_name, smollm
    from reservoir.tasks import get_task

    named = parse_name(cell.backbone)
    if named.base == smollm.NAME and named.weights != "random" and not smollm.is_installed():
        return f"{smollm.NAME} is not installed here (`reservoir install {smollm.NAME}`)"
    task = get_task(cell.task)
    if task.generated:  # drawn from its seed by the run itself: nothing to find here
        return None
    try:
        task.read(task.spec.splits[0], data_dir, n=1)
    except (ReservoirError, OSError) as e:
        return f"its data is not here ({str(e).splitlines()[0][:160]})"
    return None


def run_cell(
    cell: Cell, seconds: float, ledger: Path, queue: Path, env: dict, data_dir: Path
) -> tuple[str, str]:
    """Train ``cell`` for at most ``seconds`` (counted across invocations: ``--max-time`` grows by the slice) on the
    data of ``data_dir``, with the models installed where this process finds them (its results go to a folder of
    their own); keep its result in the ledger when its runs end, else leave its checkpoints for the next one.
    Returns what it says of the cell and how it went: ``ended``, ``cut`` (by the time) or ``failed``."""
    from reservoir.paths import cache_dir
    from reservoir.results import TIMED_OUT, stopped_by

    done = state(queue)
    folder = queue / cell.name
    # begun elsewhere, its checkpoints not here (a card's too large to come back): it starts again from nought
    entry = done.get(cell.name, {}) if folder.is_dir() else {}
    entry = {"seconds": 0.0, **entry}
    limit = entry["seconds"] + seconds
    with tempfile.TemporaryDirectory(prefix="reservoir-queue-") as home:
        argv = [sys.executable, "-m", "reservoir", "-q", *cell.command(), "--max-time", f"{limit:g}",
                "--checkpoint-dir", str(folder), "--resume", "--data-dir", str(data_dir)]  # fmt: skip
        start = time.perf_counter()
        made = subprocess.run(
            argv,
            env={**env, "RESERVOIR_HOME": home, "RESERVOIR_CACHE": str(cache_dir())},
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        spent = time.perf_counter() - start
        if made.returncode:
            said = made.stderr.strip().splitlines()[-1] if made.stderr.strip() else made.returncode
            return f"{cell.name}: failed ({said})", "failed"
        results = sorted(Path(home, "results").rglob("end-to-end_*.json"))
        result = json.loads(results[-1].read_text())
        on_time = any(stopped_by(r.get("stop_reason", ""), TIMED_OUT) for r in result.get("runs", []))
        entry = {"seconds": limit, "done": not on_time, "wall": entry.get("wall", 0.0) + spent}
        if not on_time:
            sys.path.insert(0, str(ROOT / "pipelines"))
            from ledger import keep

            keep(results[-1:], ledger / f"table{cell.table}")
            shutil.rmtree(folder, ignore_errors=True)
        done[cell.name] = entry
        save_state(queue, done)
    how = "ended: result kept" if entry["done"] else "stopped on time: checkpoints kept"
    return f"{cell.name}: {how} ({spent:.0f} s, test {result['test_accuracy']:.3f})", "ended" if entry[
        "done"
    ] else "cut"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("list", "next"))
    p.add_argument("--budget", type=float, default=600.0, help="seconds this invocation may spend (next)")
    p.add_argument("--ledger", type=Path, default=LEDGER)
    p.add_argument(
        "--queue", type=Path, default=None, help="where begun cells keep checkpoints [LEDGER/queue]"
    )
    p.add_argument(
        "--cells", type=Path, default=None, help="a JSON list of cells in place of the tables' own"
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the tasks' data (default: where reservoir looks for it here)",
    )
    p.add_argument("--reserve", type=float, default=RESERVE, help="seconds a cell needs beyond training")
    args = p.parse_args(argv)
    if args.data_dir is None:
        from reservoir.paths import default_data_dir

        args.data_dir = default_data_dir()
    queue = args.queue or args.ledger / "queue"
    todo = (
        cells()
        if args.cells is None
        else [
            Cell(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
            for c in json.loads(args.cells.read_text())
        ]
    )
    flops, device = rate()
    if args.action == "list":
        print(listing(todo, queue, flops, device))
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # a missing model or dataset fails at once, not after a download's retries
    env.setdefault("RESERVOIR_OFFLINE", "1")
    start, said = time.perf_counter(), []
    for cell in todo:
        if state(queue).get(cell.name, {}).get("done"):
            continue
        left = args.budget - (time.perf_counter() - start) - args.reserve
        if left <= 0:
            break
        if device == "cpu" and cost(cell, flops) > left:
            continue  # waits for a card (listed below); a CPU runs the cells that fit it
        if why := unready(cell, args.data_dir):
            print(f"{cell.name}: skipped: {why}", file=sys.stderr)
            continue
        # it ends by itself, or on time
        message, how = run_cell(cell, left, args.ledger, queue, env, args.data_dir)
        said.append(message)
        print(message, file=sys.stderr)
        if how == "cut":  # the budget cut it: the next invocation resumes it; a failed cell is passed over
            break
    waiting = [c for c in todo if not state(queue).get(c.name, {}).get("done")]
    card = CARD_SHARE * CARDS["H100"]
    print(
        f"{len(said)} cell(s) run on {device}; {len(waiting)} waiting: about {sum(cost(c, card) for c in waiting) / 60:.0f} "
        f"min on an H100 ({sum(cost(c, flops) for c in waiting) / 3600:.0f} h here)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

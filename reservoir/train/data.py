"""The data of a training run: its splits (:func:`load_data`), the tensors of a batch of rows
(:func:`batch_tensors`), the order of each epoch (:func:`epoch_order`) and its training batches by step
(:class:`Batches`).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from reservoir.config import TrainConfig
from reservoir.errors import DataError, interrupt_after
from reservoir.settings import default
from reservoir.tasks import SplitData, Task
from reservoir.tasks.sizes import check_sample, check_train_split, holdout
from reservoir.train.seeds import rng


@dataclasses.dataclass
class Splits:
    train: SplitData
    val: SplitData
    test: SplitData
    #: the task's names of the validation split (``None``: held out of train) and of the test split used
    val_name: str | None = None
    test_name: str = "test"
    #: the classes of the whole train split a ``--limit`` sample left out of every split
    left_out: list[int] = dataclasses.field(default_factory=list)

    def named(self) -> dict[str, SplitData]:
        return {"train": self.train, "val": self.val, "test": self.test}


def _take(d: SplitData, idx: np.ndarray) -> SplitData:
    return SplitData(d.inputs[idx], d.labels[idx], d.lengths[idx])


def load_data(task: Task, cfg: TrainConfig) -> Splits:
    """Train, validation and test splits by the roles the task declares (``TaskSpec.roles``): its
    validation split or a seeded share of train, and its first test split."""
    data_dir = Path(cfg.data_dir)
    val_name, test_names = task.spec.roles
    if not test_names:
        raise DataError(f"task {task.name!r} declares no test split (splits {list(task.spec.splits)})")
    train = task.load("train", data_dir, cfg.limit, cfg.seed)
    held_out = val_name is None  # no validation split of its own
    check_train_split(
        f"task {task.spec.name!r}",
        train.labels,
        limit=cfg.limit,
        val_fraction=cfg.val_fraction,
        n_val=(lambda n: max(1, int(round(cfg.val_fraction * n)))) if held_out else None,
        n_classes=task.spec.n_classes,
        default_fraction=default(TrainConfig, "val_fraction"),
    )
    test = task.load(test_names[0], data_dir, cfg.limit, cfg.seed)
    read = {"train": train, test_names[0]: test}
    if val_name is not None:
        val = read[val_name] = task.load(val_name, data_dir, cfg.limit, cfg.seed)
    left_out = check_sample(
        f"task {task.spec.name!r}",
        {s: d.labels for s, d in read.items()},
        limit=cfg.limit,
        names=task.class_names,
        full=None if task.draws else (lambda s: task.load(s, data_dir).labels),
    )
    if val_name is None:
        n_val = max(1, int(round(cfg.val_fraction * len(train))))
        if len(train) - n_val < 1:
            raise DataError(
                f"train split has {len(train)} examples: too few to hold out a validation split; "
                "raise --limit or the task's n_train"
            )
        fit_idx, val_idx = holdout(train.labels, n_val, cfg.seed)
        train, val = _take(train, fit_idx), _take(train, val_idx)
    for name, d in (("train", train), (val_name or "held-out validation", val), (test_names[0], test)):
        if len(d) == 0:
            raise DataError(f"the {name} split of task {task.name!r} is empty; check --data-dir and --limit")
    return Splits(train, val, test, val_name, test_names[0], left_out)


def batch_tensors(
    task: Task, d: SplitData, rows: np.ndarray, width: int | None = None, inputs: np.ndarray | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, lengths and labels of ``rows`` (their raw ``inputs`` when given: augmented); the tokens padded (id 0,
    or zeros) to ``width`` when given, else to the longest of the rows."""
    tokens = torch.from_numpy(np.ascontiguousarray(task.encode(d.inputs[rows] if inputs is None else inputs)))
    if width is not None and tokens.shape[1] < width:
        pad = (0, width - tokens.shape[1]) if tokens.dim() == 2 else (0, 0, 0, width - tokens.shape[1])
        tokens = torch.nn.functional.pad(tokens, pad)
    lengths = torch.from_numpy(np.asarray(d.lengths[rows], dtype=np.int64))
    labels = torch.from_numpy(np.asarray(d.labels[rows], dtype=np.int64))
    return tokens, lengths, labels


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The shuffled row order of one epoch: a function of (seed, epoch) only, so resume needs just the step."""
    return rng(seed, "data order", epoch).permutation(n)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def train_width(task: Task, data: SplitData, dropout: float) -> int | None:
    """The width every training batch is padded to: on a task of variable length with dropout, the training
    split's longest row (as the FPT code pads ListOps to one length), so the dropout a run draws never depends
    on which rows share its batch, whether it trains alone or beside other runs; else ``None`` (each batch's
    longest row)."""
    return int(data.lengths.max()) if task.spec.variable_length and dropout > 0 and len(data) else None


class Batches:
    """The training batches of a run by step, each built on a worker thread while the step before it runs (and
    pinned for CUDA). Full batches only: each epoch drops a different remainder, and every step has one shape
    (one compiled graph). ``dropout``: the run's, which sets the width batches are padded to (:func:`train_width`);
    ``augment``: each step's rows augmented (:meth:`reservoir.tasks.Task.augment`) by draws of (seed, step) alone."""

    def __init__(
        self,
        task: Task,
        data: SplitData,
        seed: int,
        batch_size: int,
        device: torch.device,
        dropout: float = 0.0,
        augment: bool = False,
    ):
        self.task, self.data, self.seed, self.batch_size, self.augment = task, data, seed, batch_size, augment
        self.width = train_width(task, data, dropout)
        self.per_epoch = max(1, len(data) // batch_size)
        self.pin = device.type == "cuda"
        self._orders: dict[int, tuple[int, np.ndarray]] = {}  # by seed: the worker thread's alone
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reservoir-batches")
        self._ahead: tuple[int, Future] | None = None

    def rows(self, step: int, seed: int | None = None) -> np.ndarray:
        """The training rows of step ``step`` (0-based) of run ``seed`` (default: this one's): a function of
        (seed, step) alone."""
        seed = self.seed if seed is None else seed
        epoch, i = divmod(step, self.per_epoch)
        if self._orders.get(seed, (-1,))[0] != epoch:
            self._orders[seed] = (epoch, epoch_order(seed, epoch, len(self.data)))
        return self._orders[seed][1][i * self.batch_size : (i + 1) * self.batch_size]

    def inputs(self, rows: np.ndarray, seed: int, step: int) -> np.ndarray | None:
        """Run ``seed``'s raw inputs of ``rows`` at ``step``, augmented; ``None`` where it does not augment."""
        if not self.augment:
            return None
        return self.task.augment(self.data.inputs[rows], rng(seed, "augment", step))

    def _build(self, step: int) -> Batch:
        rows = self.rows(step)
        batch = batch_tensors(self.task, self.data, rows, self.width, self.inputs(rows, self.seed, step))
        return tuple(t.pin_memory() for t in batch) if self.pin else batch

    def take(self, step: int) -> Batch:
        """The batch of ``step``; the worker starts building the next step's."""
        ahead = self._ahead[1] if self._ahead is not None and self._ahead[0] == step else None
        current = ahead or self._pool.submit(self._build, step)
        self._ahead = (step + 1, self._pool.submit(self._build, step + 1))
        with interrupt_after():
            return current.result()

    def close(self) -> None:
        with interrupt_after():
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

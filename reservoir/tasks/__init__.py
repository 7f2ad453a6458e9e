"""Tasks: each owns its spec (token kind, shapes, classes, readout, splits) and its data.

A task turns a split into compact raw ``inputs`` (uint8 images, id lists, bits) and ``labels``;
:meth:`Task.encode` turns a batch of raw inputs into model tokens.

Register a task with ``@register_task("name")`` on a dataclass subclass of :class:`Task` in a module of
this package (:data:`TASKS` imports every module here on its first lookup, so a new module needs no
list). Its dataclass fields are the task's options (``--task-opt key=value`` on the CLI).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from reservoir.config import MAX_SEED  # noqa: F401  (task modules bound their seed options by it)
from reservoir.errors import DataError, UsageError  # noqa: F401  (DataError: re-exported for task modules)
from reservoir.paths import FILE_TASK, file_task_path
from reservoir.registry import Registry
from reservoir.settings import check


@dataclass(frozen=True)
class TaskSpec:
    """Everything downstream code needs to know about a task's tokens and labels.

    Parameters
    ----------
    name
        registered task name.
    token_kind
        ``"dense"`` (float vectors of ``token_dim``) or ``"ids"`` (ints < ``vocab_size``).
    seq_len
        tokens per example (the maximum for variable-length tasks).
    n_classes
        classes per predicted output.
    n_readout
        readout tokens per example (the last ``n_readout`` real tokens).
    outputs_per_token
        outputs predicted from each readout token (bits per token for bit tasks, else 1).
    splits
        split names; always includes ``train`` and ``test``.
    variable_length
        examples have different lengths (padding with id ``pad_id``).
    target
        ``"class"`` (integer labels) or ``"regression"`` (float labels; ``n_classes`` unused).
    """

    name: str
    token_kind: Literal["dense", "ids"]
    seq_len: int
    n_classes: int
    token_dim: int = 0
    vocab_size: int = 0
    n_readout: int = 1
    outputs_per_token: int = 1
    splits: tuple[str, ...] = ("train", "test")
    variable_length: bool = False
    pad_id: int = 0
    target: Literal["class", "regression"] = "class"

    @property
    def label_shape(self) -> tuple[int, ...]:
        """Shape of one example's label: ``()`` for a class, ``(n_readout, outputs)`` for bits."""
        if self.n_readout == 1 and self.outputs_per_token == 1:
            return ()
        return (self.n_readout, self.outputs_per_token)

    @property
    def roles(self) -> tuple[str | None, tuple[str, ...]]:
        """The validation split (``None``: hold out a share of train) and the test splits (:func:`split_roles`)."""
        return split_roles(self.splits)

    def describe(self) -> str:
        width = f"x {self.token_dim}" if self.token_kind == "dense" else f"ids < {self.vocab_size}"
        length = f"<= {self.seq_len}" if self.variable_length else str(self.seq_len)
        if self.target == "regression":
            outs = f"{self.outputs_per_token} real value(s) per readout token"
        elif self.label_shape == ():
            outs = f"{self.n_classes} classes"
        else:
            outs = f"{self.outputs_per_token} x {self.n_classes}-way per readout token"
        return (
            f"{length} tokens {width}; {outs}; readout last {self.n_readout}; splits {','.join(self.splits)}"
        )


#: names of a validation split, in order of preference (TAPE calls it ``valid``, Hugging Face datasets
#: ``validation``, GLUE's and many papers' files ``dev``)
VALIDATION_SPLITS = ("val", "valid", "validation", "dev")


def split_roles(splits) -> tuple[str | None, tuple[str, ...]]:
    """Roles of split names: the validation split (or ``None``) and the test splits (``test``, ``test_*``)."""
    val = next((s for s in VALIDATION_SPLITS if s in splits), None)
    return val, tuple(s for s in splits if s == "test" or s.startswith("test_"))


def unread_splits(splits) -> str | None:
    """Splits no role of :func:`split_roles` reads (``Test`` beside ``test``, a second validation split,
    ``unsupervised``), in words, or ``None``: what fit and train pass over."""
    val, tests = split_roles(splits)
    left = [s for s in splits if s not in ("train", val, *tests)]
    if not left:
        return None
    return (
        f"split(s) {', '.join(left)} have no role and are passed over: fit and train read train, one validation "
        f"split (the first of {', '.join(VALIDATION_SPLITS)}; else a share of train) and the test splits (test, "
        "test_*; train scores the first); rename a split to give it a role"
    )


@dataclass
class SplitData:
    """One split in raw, compact form: ``inputs`` one row per example (an object array for variable-length
    rows), ``labels`` ``(N, *spec.label_shape)``, ``lengths`` the real tokens per example."""

    inputs: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int | None) -> SplitData:
        """The first ``n`` rows (all if None), in source order."""
        if n is None or n >= len(self):
            return self
        return SplitData(self.inputs[:n], self.labels[:n], self.lengths[:n])

    def take(self, rows: np.ndarray) -> SplitData:
        """The rows at ``rows`` (ascending indices), in that order; lazy inputs stay lazy (nothing is read)."""
        inputs = self.inputs.subset(rows) if hasattr(self.inputs, "subset") else self.inputs[rows]
        return SplitData(inputs, self.labels[rows], self.lengths[rows])


#: how a subset of a split (``--limit N``) is drawn, by the rule's name (:meth:`Task.subset`)
SUBSET_RULES = {
    "all": "every row of the split (no limit)",
    "stratified": "a seeded sample stratified by class: each class's count within one of its proportional share "
    "(classes without a row of their own share come first, then the largest remainders; ties drawn by the "
    "seed), the rows of each class drawn at random by the seed, kept in source order",
    "random": "a seeded random sample of the rows (real-valued or several labels a row), kept in source order",
    "draws": "the first N examples of a generated task whose examples are independent seeded draws (already a "
    "random sample of the task's distribution: drawing more only to discard them would change nothing)",
}


def subset_stream(seed: int, split: str) -> np.random.Generator:
    """The generator a split's sample is drawn from, seeded by the run's ``seed`` and the split's name."""
    return np.random.default_rng([int(seed), zlib.crc32(split.encode())])


def class_quota(counts: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows to take of each class (``counts``, all > 0) for a sample of ``n``: the floor of each proportional
    share, plus one for as many classes as rows are left, first those whose share is below one row (so the
    sample keeps every class it can), then the largest remainders, ties in a seeded order."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    base, remainder = np.divmod(n * counts, total)  # integers: no rounding decides a row
    left = n - int(base.sum())
    order = np.lexsort((rng.random(len(counts)), -remainder, base > 0))  # the last key sorts first
    take = base.copy()
    take[order[:left]] += 1
    return take


def sample_rows(labels: np.ndarray, n: int, seed: int, split: str, *, stratify: bool) -> np.ndarray:
    """Ascending indices of a seeded sample of ``n`` of the rows of ``labels`` (all of them when ``n`` is not
    smaller): stratified by class (``labels`` one class id a row, :func:`class_quota`), or at random.

    >>> sample_rows(np.array([0] * 8 + [1] * 2), 5, seed=0, split="train", stratify=True).size
    5
    """
    total = len(labels)
    if n >= total:
        return np.arange(total)
    rng = subset_stream(seed, split)
    order = rng.permutation(total)
    if not stratify:
        return np.sort(order[:n])
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    take = class_quota(counts, n, rng)
    grouped = order[np.argsort(inverse.reshape(-1)[order], kind="stable")]  # by class, in random order within
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.sort(np.concatenate([grouped[a : a + k] for a, k in zip(starts, take)]))


@dataclass
class Task:
    """Base class; subclasses are dataclasses whose fields are the task's options."""

    name: ClassVar[str] = ""
    #: the task draws its examples from its ``seed`` option, which follows the run's ``--seed`` unless given
    generated: ClassVar[bool] = False
    #: how end-to-end training augments the task's training examples (:meth:`augment`), in words; empty: it does not
    augmentation: ClassVar[str] = ""

    @property
    def spec(self) -> TaskSpec:  # pragma: no cover - abstract
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "load" in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} defines load(); a task implements read(split, data_dir, n=None), the rows of a "
                "split in source order, and Task.load draws subsets from it (see docs/contributing.md, a task)"
            )

    @property
    def draws(self) -> bool:
        """The task's examples are independent seeded draws, so its first ``N`` are a random sample of it."""
        return False

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        """The rows of ``split`` in source order: all of them, or the first ``n``. Subsets are taken by
        :meth:`load`, never by cutting this."""
        raise NotImplementedError  # pragma: no cover - abstract

    def subset(self, limit: int | None, seed: int, left_out: Sequence[int] = ()) -> dict[str, Any]:
        """How :meth:`load` takes ``limit`` rows of a split: the rule (:data:`SUBSET_RULES`) and its seed, with
        ``left_out``, the classes of the whole train split the sample lost, where it lost some."""
        if limit is None:
            return {"rule": "all"}
        if self.draws:
            return {"rule": "draws"}
        spec = self.spec
        rule = "stratified" if spec.target == "class" and spec.label_shape == () else "random"
        return {"rule": rule, "seed": int(seed)} | (
            {"left_out": [int(c) for c in left_out]} if left_out else {}
        )

    def load(self, split: str, data_dir: Path, limit: int | None = None, seed: int = 0) -> SplitData:
        """The rows of ``split``: all of them, or a seeded sample of ``limit`` (:meth:`subset`), in source
        order; lazy inputs stay lazy.

        >>> d = get_task("digits").load("train", Path("."), limit=50, seed=0)
        >>> len(d), len(np.unique(d.labels))
        (50, 10)
        """
        rule = self.subset(limit, seed)["rule"]
        if rule in ("all", "draws"):
            return self.read(split, data_dir, limit)
        data = self.read(split, data_dir)
        if limit >= len(data):
            return data
        labels = data.labels
        return data.take(sample_rows(labels, limit, seed, split, stratify=rule == "stratified"))

    @property
    def class_names(self) -> list[str] | None:
        """The name of each class id, where the data names its classes; else ``None``."""
        return None

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        """Raw batch -> tokens: float32 ``(B, T, token_dim)`` or int64 ``(B, T)`` ids."""
        raise NotImplementedError  # pragma: no cover - abstract

    def augment(self, inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Raw training inputs, randomly transformed by ``rng`` as :attr:`augmentation` says (the same shape and
        dtype); as they are where the task has no augmentation."""
        return inputs

    def baseline_rules(self) -> dict[str, Callable[[SplitData], np.ndarray]]:
        """Rules a reservoir should beat, by name: each maps a split to one key per example, and
        the rule predicts the most common train label of each key (:mod:`reservoir.probe.baselines`)."""
        return {}

    def options(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    #: options that say how the data is fetched, not what it is: the identity records their defaults, so that
    #: every value finds the same feature file (one each would hold the same features)
    FETCHING: ClassVar[tuple[str, ...]] = ("download",)

    def identity_options(self) -> dict[str, Any]:
        """The options that change the data, for the run's identity (not where it was read from)."""
        fetching = {f.name: f.default for f in dataclasses.fields(self) if f.name in self.FETCHING}
        return {**self.options(), **fetching}

    def check_split(self, split: str) -> None:
        if split not in self.spec.splits:
            raise UsageError(
                f"task {self.name!r} has no split {split!r}; choose from {list(self.spec.splits)}"
            )


#: every task, registered by the modules of this package (found on the first lookup)
TASKS: Registry[Task] = Registry("task", home=__name__)
#: tasks named by a prefix and a value (``file:PATH``): the prefix -> the class whose ``named`` builds one
PREFIXED: Registry[type[Task]] = Registry("task prefix", home=__name__)


def prefixed(name: str) -> tuple[type[Task], str] | None:
    """The class of a prefixed task name and the value after its prefix (``None`` for a registered name)."""
    return next(((PREFIXED[p], name[len(p) :]) for p in PREFIXED if name.startswith(p)), None)


#: bounds of generated tasks' sizes: examples per split, and tokens (or bits) per example
MAX_ROWS = 2**31 - 1
MAX_TOKENS = 2**20


def check_value(task: str, key: str, value: Any, meta: Any) -> None:
    """Check that ``value`` of option ``key`` of ``task`` meets its field's declared constraints
    (:func:`reservoir.settings.check`); UsageError otherwise."""
    check(f"task {task}", key, value, *meta.get("rules", ()), noun="option")


def register_task(name: str):
    """Class decorator: register a :class:`Task` dataclass under ``name``."""

    def add(cls):
        cls.name = name
        TASKS.register(name, cls, help=(cls.__doc__ or "").strip().splitlines()[0])
        return cls

    return add


def get_task(name: str, **options: Any) -> Task:
    """Build a registered task; option values given as strings are converted to the field's type.

    >>> get_task("bit_xor").spec.seq_len
    10
    """
    if found := prefixed(name):
        cls, value = found
        return cls.named(value, **options)
    cls = TASKS.factory(name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in options.items():
        if key not in fields:
            raise UsageError(f"unknown option {key!r} for task {name!r}; choose from {sorted(fields)}")
        kwargs[key] = _convert(value, fields[key].type, key)
        check_value(name, key, kwargs[key], fields[key].metadata)
    return cls(**kwargs)


def task_class(name: str) -> type[Task]:
    """The class of a registered task or of ``file:PATH`` (nothing is read)."""
    found = prefixed(name)
    return found[0] if found else TASKS.factory(name)


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Option names and value types of a task, checked without reading data; returns the converted values."""
    fields = {f.name: f for f in dataclasses.fields(task_class(name)) if f.name != "path"}
    for key in options:
        if key not in fields:
            raise UsageError(f"unknown option {key!r} for task {name!r}; choose from {sorted(fields)}")
    values = {key: _convert(value, fields[key].type, key) for key, value in options.items()}
    user_file = file_task_path(name) is not None
    for key, value in values.items():
        check_value(f"{FILE_TASK}PATH" if user_file else name, key, value, fields[key].metadata)
    if not user_file:
        get_task(
            name, **values
        )  # options checked together (e.g. bit_memory's n_bits by token_bits); reads nothing
    return values


def make_task(name: str, options: dict[str, Any], seed: int) -> Task:
    """The task of a run; a generated task draws from the run's ``seed`` unless ``options`` set its own."""
    if task_class(name).generated and "seed" not in options:
        options = {**options, "seed": seed}
    return get_task(name, **options)


def _convert(value: Any, annotation: Any, key: str) -> Any:
    if not isinstance(value, str):
        return value
    kind = str(annotation)
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("bool"):
            if value.lower() in ("1", "true", "yes"):
                return True
            if value.lower() in ("0", "false", "no"):
                return False
            raise UsageError(value)
    except ValueError:
        raise UsageError(f"task option {key}={value!r} is not a valid {kind}") from None
    return value


def pad_ids(seqs: Sequence[np.ndarray], pad_id: int = 0, dtype: Any = np.int64) -> np.ndarray:
    """Right-pad variable-length rows (``(T,)`` ids, or ``(T, d)`` tokens) to the longest in the batch, as ``dtype``."""
    width = max(len(s) for s in seqs)
    out = np.full((len(seqs), width, *np.shape(seqs[0])[1:]), pad_id, dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def patches(pixels: np.ndarray, size: int) -> np.ndarray:
    """``(B, H, W, C)`` -> ``(B, (H/size)*(W/size), size*size*C)`` row-major patches."""
    b, h, w, c = pixels.shape
    x = pixels.reshape(b, h // size, size, w // size, size, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // size) * (w // size), size * size * c)

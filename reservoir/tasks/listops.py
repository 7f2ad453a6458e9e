"""ListOps (Long Range Arena): nested MIN/MAX/MED/SM expressions over digits, 10 classes.

Source: ``source="generate"`` follows LRA's ``listops.py`` (operators MIN, MAX, MED
(median truncated to int), SM (sum mod 10); from depth 1, a node below ``max_depth`` is
a value with probability 0.75, else an operator with 2..``max_args`` arguments; trees
kept when their length (operators + closing brackets + values) is strictly between
``min_length`` and ``max_length``; de-duplicated). Each split is its own seeded stream;
val and test trees are removed from train. ``source="lra"`` reads LRA's
``basic_{train,val,test}.tsv`` (header ``Source<TAB>Target``) from ``DATA_DIR/listops``.

Tokenization: parentheses carry no information and are dropped; the closing bracket
``]`` is kept, since without it the expression is ambiguous. ``tokenization="fpt"``
also drops ``]`` to reproduce the FPT paper's pipeline (whose numbers were measured on
bracket-less input). Ids: 0 padding, 1-4 operators, 5 ``]``, 6-15 digits. Sequences
longer than ``max_len`` (512 by default, up to 2000) are truncated to their first
``max_len`` tokens; the readout is the last real token.
"""

from __future__ import annotations

import csv
import functools
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from reservoir.errors import UsageError
from reservoir.settings import Interval, OneOf, default, setting
from reservoir.tasks import (
    MAX_ROWS,
    MAX_SEED,
    MAX_TOKENS,
    DataError,
    SplitData,
    Task,
    TaskSpec,
    pad_ids,
    register_task,
)

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VOCAB = {
    "<pad>": 0,
    **{op: i + 1 for i, op in enumerate(OPERATORS)},
    END: 5,
    **{str(d): 6 + d for d in range(10)},
}
VALUE_P = 0.25  # LRA: a node is an operator when random() <= VALUE_P
STREAM = {"train": 0, "val": 1, "test": 2}


DIGITS = tuple(str(d) for d in range(10))


def draw_tree(rng: random.Random, max_depth: int, max_args: int) -> tuple[list[str], int]:
    """One tree of LRA's ``generate_tree`` (the same draws from ``rng``): the pieces of its text form, to
    ``" ".join``, and its length (operators, ``]`` and values)."""
    rand, below, out = rng.random, rng._randbelow, []  # randint(a, b) and choice(seq) are a + _randbelow(...)

    def node(depth: int) -> int:
        if (rand() if depth < max_depth else 1) > VALUE_P:
            out.append(DIGITS[below(10)])
            return 1
        n_args, at, length = below(max_args - 1) + 2, len(out), 2
        out.append("")  # the opening brackets and the operator, drawn after the arguments
        for _ in range(n_args):
            length += node(depth + 1)
            out.append(")")
        out[at] = "( " * (n_args + 1) + OPERATORS[below(len(OPERATORS))]
        out.append("] )")
        return length

    return out, node(1)


def evaluate(text: str) -> int:
    """Value of an expression in LRA's text form."""
    stack: list[list] = [[]]
    for tok in text.split():
        if tok in OPERATORS:
            stack.append([tok])
        elif tok == END:
            op, *args = stack.pop()
            if op == "[MIN":
                v = min(args)
            elif op == "[MAX":
                v = max(args)
            elif op == "[MED":
                v = int(np.median(args))
            else:
                v = sum(args) % 10
            stack[-1].append(v)
        elif tok not in "()":
            stack[-1].append(int(tok))
    return stack[-1][0]


def tokenize(text: str, keep_brackets: bool = True) -> np.ndarray:
    drop = {"(", ")"} if keep_brackets else {"(", ")", END}
    try:
        return np.array([VOCAB[t] for t in text.split() if t not in drop], dtype=np.uint8)
    except KeyError as e:
        raise DataError(f"ListOps token {e.args[0]!r} is not one of {sorted(VOCAB)}") from None


class _Stream:
    """One seeded stream of distinct expressions, drawn as far as asked and kept."""

    def __init__(
        self,
        seed: int,
        stream: int,
        min_length: int,
        max_length: int,
        max_depth: int,
        max_args: int,
        exclude: frozenset,
    ):
        self.rng = random.Random(seed * 1000 + stream)
        self.args = (min_length, max_length, max_depth, max_args)
        self.exclude, self.seen, self.out = exclude, set(), []
        self.misses = self.wasted = 0
        self.lock = threading.Lock()

    def take(self, n: int) -> list[str]:
        min_length, max_length, max_depth, max_args = self.args
        with self.lock:
            while len(self.out) < n:
                # the options admit no more distinct expressions: give up, and stay given up
                if self.misses > MAX_MISSES or self.wasted > MAX_WASTED_TOKENS:
                    raise DataError(
                        f"ListOps generation found {len(self.out)} of {n} distinct expressions of length in "
                        f"({min_length}, {max_length}) and none in the next {self.misses:,d} draws (max_depth="
                        f"{max_depth}, max_args={max_args}); widen min_length..max_length, raise max_depth, or "
                        "ask for fewer examples (n_train, n_val, n_test, or --limit)"
                    )
                pieces, length = draw_tree(self.rng, max_depth, max_args)
                if min_length < length < max_length:
                    text = " ".join(pieces)
                    if text not in self.seen and text not in self.exclude:
                        self.seen.add(text)
                        self.out.append(text)
                        self.misses = self.wasted = 0
                        continue
                self.misses, self.wasted = self.misses + 1, self.wasted + length
            return self.out[:n]


@functools.lru_cache(maxsize=16)
def _stream(*key) -> _Stream:
    return _Stream(*key)


def generate(
    n: int,
    seed: int,
    stream: int,
    min_length: int,
    max_length: int,
    max_depth: int,
    max_args: int,
    exclude: frozenset = frozenset(),
) -> list[str]:
    """The first ``n`` distinct expressions of a seeded stream (kept by the process), none in ``exclude``."""
    return _stream(seed, stream, min_length, max_length, max_depth, max_args, exclude).take(n)


#: generation gives up after this many consecutive draws without a new expression, or this many tokens drawn
MAX_MISSES = 200_000
MAX_WASTED_TOKENS = 20_000_000
#: the largest mean expression length :func:`draw_tree` may be asked for (LRA's settings give about 120)
MAX_EXPECTED_LENGTH = 100_000


def expected_length(max_depth: int, max_args: int) -> float:
    """The mean length of :func:`draw_tree`'s expressions."""
    mean_args = (2 + max_args) / 2
    length = 1.0  # at max_depth: a value
    for _ in range(max_depth - 1):
        length = (1 - VALUE_P) + VALUE_P * (2 + mean_args * length)
        if length > 10 * MAX_EXPECTED_LENGTH:
            break
    return length


@functools.lru_cache(maxsize=4)
def heldout(
    seed: int, min_length: int, max_length: int, max_depth: int, max_args: int, n_val: int, n_test: int
) -> frozenset:
    """Every val and test expression, which train never holds (one object per setting)."""
    args = (min_length, max_length, max_depth, max_args)
    return frozenset(
        t for s, n in (("val", n_val), ("test", n_test)) for t in generate(n, seed, STREAM[s], *args)
    )


@register_task("listops")
@dataclass
class ListOps(Task):
    """LRA ListOps, closing brackets kept: up to 512 (or 2000) id tokens, 10 classes."""

    generated: ClassVar[bool] = True

    source: str = setting("generate", OneOf(("generate", "lra")))
    tokenization: str = setting("brackets", OneOf(("brackets", "fpt")))
    max_len: int = setting(512, Interval(1, 2000))
    n_train: int = setting(96000, Interval(1, MAX_ROWS))
    n_val: int = setting(2000, Interval(1, MAX_ROWS))
    n_test: int = setting(2000, Interval(1, MAX_ROWS))
    seed: int = setting(0, Interval(0, MAX_SEED))
    min_length: int = setting(500, Interval(0, MAX_TOKENS))
    max_length: int = setting(2000, Interval(2, MAX_TOKENS))
    max_depth: int = setting(10, Interval(1, 100))  # trees are drawn recursively
    max_args: int = setting(10, Interval(2, 1000))

    #: the options that shape generated expressions, which LRA's files (``source=lra``) do not read
    GENERATING: ClassVar[tuple[str, ...]] = (
        "n_train",
        "n_val",
        "n_test",
        "seed",
        "min_length",
        "max_length",
        "max_depth",
        "max_args",
    )

    def __post_init__(self):
        if self.source == "lra":
            given = [k for k in self.GENERATING if getattr(self, k) != default(type(self), k)]
            if given:
                raise UsageError(
                    f"The {given[0]!r} option of task listops ({getattr(self, given[0])}) shapes generated "
                    "expressions and does not apply with source=lra, which reads LRA's files whole: drop it "
                    "(--limit N takes a seeded sample of each split)"
                )
            return
        if expected_length(self.max_depth, self.max_args) > MAX_EXPECTED_LENGTH:
            raise UsageError(
                f"The 'max_depth' and 'max_args' options of task listops ({self.max_depth}, {self.max_args}) "
                f"draw expressions of {expected_length(self.max_depth, self.max_args):,.0f} tokens on "
                f"average, more than the {MAX_EXPECTED_LENGTH:,d} that can be drawn in reasonable time "
                "(LRA: 10 and 10, about 120); lower max_depth or max_args"
            )
        if self.max_length <= self.min_length + 1:
            raise UsageError(
                f"The 'max_length' option of task listops must be > min_length + 1 "
                f"({self.min_length + 1}): lengths are drawn strictly between them. "
                f"Got {self.max_length} instead."
            )

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            self.name,
            "ids",
            seq_len=self.max_len,
            vocab_size=len(VOCAB),
            n_classes=10,
            splits=("train", "val", "test"),
            variable_length=True,
            pad_id=0,
        )

    @property
    def draws(self) -> bool:
        """Generated expressions are independent seeded draws; LRA's files are read whole and sampled."""
        return self.source == "generate"

    def texts(self, split: str, data_dir: Path, n: int | None) -> tuple[list[str], list[int] | None]:
        if self.source == "lra":
            return self._read_tsv(Path(data_dir) / "listops" / f"basic_{split}.tsv", n)
        sizes = {"train": self.n_train, "val": self.n_val, "test": self.n_test}
        n = min(n or sizes[split], sizes[split])
        args = (self.min_length, self.max_length, self.max_depth, self.max_args)
        exclude = heldout(self.seed, *args, sizes["val"], sizes["test"]) if split == "train" else frozenset()
        return generate(n, self.seed, STREAM[split], *args, exclude=exclude), None

    @staticmethod
    def _read_tsv(path: Path, n: int | None) -> tuple[list[str], list[int]]:
        if not path.exists():
            raise DataError(
                f"{path} is missing; place LRA's basic_{{train,val,test}}.tsv in {path.parent} "
                "or use the generator (--task-opt source=generate)"
            )
        texts, targets = [], []
        with open(path, newline="") as f:
            reader = csv.reader(f, delimiter="\t")
            header = next(reader, None)
            if header != ["Source", "Target"]:
                raise DataError(f"{path} should start with the header 'Source<TAB>Target', found {header!r}")
            for row in reader:
                if n is not None and len(texts) >= n:
                    break
                if len(row) != 2 or row[1].strip() not in DIGITS:
                    found = f"target {row[1]!r}" if len(row) == 2 else f"{len(row)} column(s)"
                    raise DataError(
                        f"{path}, line {reader.line_num}: expected an expression, a tab and a target class "
                        f"from 0 to 9; found {found}. Fix or delete the line, or use the generator "
                        "(--task-opt source=generate)"
                    )
                texts.append(row[0])
                targets.append(int(row[1]))
        return texts, targets

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        texts, targets = self.texts(split, data_dir, n)
        labels = np.array(targets if targets is not None else [evaluate(t) for t in texts], dtype=np.int64)
        if len(labels) and (labels.min() < 0 or labels.max() > 9):
            raise DataError(f"ListOps {split} labels must be in [0, 9], found {labels.min()}..{labels.max()}")
        seqs = [tokenize(t, self.tokenization == "brackets")[: self.max_len] for t in texts]
        inputs = np.empty(len(seqs), dtype=object)
        inputs[:] = seqs
        return SplitData(inputs, labels, np.array([len(s) for s in seqs], dtype=np.int64))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        return pad_ids(list(inputs), self.spec.pad_id)

    def baseline_rules(self):
        """``first-operator``: the label most common among train trees with the same outermost operator."""
        return {"first-operator": first_operator}


def first_operator(data: SplitData) -> np.ndarray:
    """The id of each expression's first operator token (0 when it has none)."""
    ops = {VOCAB[op] for op in OPERATORS}
    return np.array([next((int(t) for t in seq if t in ops), 0) for seq in data.inputs], dtype=np.int64)

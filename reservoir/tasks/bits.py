"""Bit tasks of the FPT paper (section 2.1), generated from a seed.

``bit_xor``: two strings of ``n_bits`` bits, one bit a token; predict the XOR of the two
strings at the last ``n_bits`` tokens. ``bit_memory``: ``n_patterns`` strings of
``n_bits`` +-1 bits, then one of them again with each bit zeroed (masked) with
probability ``mask_prob``; predict the unmasked query at the last ``n_bits/token_bits``
tokens. Each split draws from its own seeded stream of independent examples, so ``--limit N`` takes the first N
draws (:data:`reservoir.tasks.SUBSET_RULES`, ``draws``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from reservoir.errors import UsageError
from reservoir.settings import Interval, setting
from reservoir.tasks import MAX_ROWS, MAX_SEED, MAX_TOKENS, SplitData, Task, TaskSpec, register_task

SPLIT_STREAM = {"train": 0, "val": 1, "test": 2}


def split_rng(seed: int, split: str) -> np.random.Generator:
    return np.random.default_rng([seed, SPLIT_STREAM[split]])


@register_task("bit_xor")
@dataclass
class BitXor(Task):
    """Bitwise XOR of two bit strings, one bit a token (FPT paper)."""

    generated: ClassVar[bool] = True

    n_bits: int = setting(5, Interval(1, MAX_TOKENS))
    n_train: int = setting(10000, Interval(1, MAX_ROWS))
    n_test: int = setting(1000, Interval(1, MAX_ROWS))
    seed: int = setting(0, Interval(0, MAX_SEED))

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            self.name,
            "dense",
            seq_len=2 * self.n_bits,
            token_dim=1,
            n_classes=2,
            n_readout=self.n_bits,
            outputs_per_token=1,
        )

    @property
    def draws(self) -> bool:
        return True

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        n = min(n or 10**12, self.n_train if split == "train" else self.n_test)
        bits = split_rng(self.seed, split).integers(0, 2, size=(n, 2, self.n_bits), dtype=np.uint8)
        labels = (bits[:, 0] ^ bits[:, 1])[:, :, None].astype(np.int64)
        return SplitData(bits.reshape(n, -1), labels, np.full(n, 2 * self.n_bits))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        return inputs.astype(np.float32)[:, :, None]


@register_task("bit_memory")
@dataclass
class BitMemory(Task):
    """Recall a stored bit string from a masked copy, 50-bit tokens (FPT paper)."""

    generated: ClassVar[bool] = True

    n_bits: int = setting(1000, Interval(1, MAX_TOKENS))
    n_patterns: int = setting(5, Interval(1, MAX_TOKENS))
    token_bits: int = setting(50, Interval(1, MAX_TOKENS))
    mask_prob: float = setting(0.5, Interval(0.0, 1.0))
    n_train: int = setting(10000, Interval(1, MAX_ROWS))
    n_test: int = setting(1000, Interval(1, MAX_ROWS))
    seed: int = setting(0, Interval(0, MAX_SEED))

    def __post_init__(self):
        if self.n_bits % self.token_bits:
            raise UsageError(
                f"The 'n_bits' option of task bit_memory must be a multiple of token_bits "
                f"({self.token_bits}). Got {self.n_bits} instead."
            )

    @property
    def spec(self) -> TaskSpec:
        per = self.n_bits // self.token_bits
        return TaskSpec(
            self.name,
            "dense",
            seq_len=(self.n_patterns + 1) * per,
            token_dim=self.token_bits,
            n_classes=2,
            n_readout=per,
            outputs_per_token=self.token_bits,
        )

    @property
    def draws(self) -> bool:
        return True

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        n = min(n or 10**12, self.n_train if split == "train" else self.n_test)
        rng = split_rng(self.seed, split)
        bits = rng.integers(0, 2, size=(n, self.n_patterns, self.n_bits), dtype=np.int8) * 2 - 1
        query = bits[np.arange(n), rng.integers(0, self.n_patterns, size=n)]
        keep = rng.random(size=query.shape) >= self.mask_prob
        inputs = np.concatenate([bits.reshape(n, -1), query * keep], axis=1).astype(np.int8)
        labels = ((query + 1) // 2).reshape(n, -1, self.token_bits).astype(np.int64)
        return SplitData(inputs, labels, np.full(n, self.spec.seq_len))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        return inputs.astype(np.float32).reshape(len(inputs), -1, self.token_bits)

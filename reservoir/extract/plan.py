"""Batch planning: how many rows a batch holds, which rows share a batch (bucketed by length),
and the blocks of rows a sharded run hands to its workers. A single process and a sharded
run plan the same batches, so they compute the same numbers."""

from __future__ import annotations

import numpy as np
from torch import nn

#: with ``batch_size=None`` a batch holds about this many tokens (a backbone's ``batch_tokens`` may ask for more)
BATCH_TOKENS = 16384
#: and at most this many examples
MAX_BATCH_ROWS = 512


def auto_batch_size(backbone: nn.Module, seq_len: int) -> int:
    """Examples per batch when none is given: the backbone's ``batch_tokens`` (default
    :data:`BATCH_TOKENS`) divided by the task's length, within ``[1, MAX_BATCH_ROWS]``."""
    tokens = getattr(backbone, "batch_tokens", BATCH_TOKENS)
    return max(1, min(MAX_BATCH_ROWS, tokens // max(1, seq_len)))


def plan_batches(lengths: np.ndarray, batch_size: int, bucket: bool, start: int = 0) -> list[np.ndarray]:
    """Row indices of each batch (offset by ``start``). Bucketing sorts by length (longest first)
    so padding is small; rows within a batch are increasing so the store can write them directly."""
    order = np.argsort(-lengths, kind="stable") if bucket else np.arange(len(lengths))
    return [start + np.sort(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]


def shard_bounds(n: int, batch_size: int, shard_rows: int) -> list[tuple[int, int]]:
    """Contiguous row blocks ``[start, stop)`` of about ``shard_rows`` rows (a multiple of the
    batch size): the shards of a distributed run and the bucketing blocks of every run."""
    size = max(batch_size, shard_rows // batch_size * batch_size)
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def plan_split(
    lengths: np.ndarray, batch_size: int, bucket: bool, shard_rows: int
) -> list[tuple[tuple[int, int], list[np.ndarray]]]:
    """The batch plan of a split, block by block: ``[((start, stop), batches), ...]``. Batches
    never cross a block, so a single process and a sharded run compute the same batches."""
    return [
        ((a, b), plan_batches(lengths[a:b], batch_size, bucket, start=a))
        for a, b in shard_bounds(len(lengths), batch_size, shard_rows)
    ]

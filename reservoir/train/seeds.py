"""Named random streams of a training run: each source of randomness draws from its own seed,
derived from the run's seed and the stream's name (no global seeding, no seed offsets)."""

from __future__ import annotations

import zlib

import numpy as np


def derive(seed: int, stream: str) -> int:
    """A 63-bit seed for ``stream`` of run ``seed`` (numpy's SeedSequence over both)."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(stream.encode())]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def rng(seed: int, stream: str, *keys: int) -> np.random.Generator:
    """A numpy generator for ``stream`` (and sub-keys such as the epoch) of run ``seed``."""
    return np.random.default_rng([derive(seed, stream), *keys])

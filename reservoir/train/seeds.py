"""Named random streams of a training run: each source of randomness draws from its own seed,
derived from the run's seed and the stream's name (no global seeding, no seed offsets); and the torch
generators a run draws from (dropout), forked for the run and saved in its checkpoints."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator

import numpy as np
import torch


def derive(seed: int, stream: str) -> int:
    """A 63-bit seed for ``stream`` of run ``seed`` (numpy's SeedSequence over both)."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(stream.encode())]).generate_state(
        2, np.uint32
    )
    return int((int(state[0]) << 31) ^ int(state[1]))


def rng(seed: int, stream: str, *keys: int) -> np.random.Generator:
    """A numpy generator for ``stream`` (and sub-keys such as the epoch) of run ``seed``."""
    return np.random.default_rng([derive(seed, stream), *keys])


def generator_states(device: torch.device) -> dict[str, torch.Tensor]:
    """The states of every torch generator a run on ``device`` draws from: the CPU's and a CUDA device's."""
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_generator_states(states: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore :func:`generator_states` for a run on ``device``; a state of a device the run does not use is
    ignored."""
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


@contextlib.contextmanager
def run_generators(seed: int, device: torch.device) -> Iterator[None]:
    """Inside the block, the torch generators of a run on ``device`` are forked from the caller's and seeded
    from the run's ``dropout`` stream."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(derive(seed, "dropout"))
        for d in cuda:
            with torch.cuda.device(d):
                torch.cuda.manual_seed(derive(seed, "dropout"))
        yield

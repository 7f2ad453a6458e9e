"""Shared fixtures: tiny real models saved with save_pretrained stand in for the hub."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

os.environ.setdefault("RESERVOIR_OFFLINE", "1")  # no test waits on the network
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs a worker per core (pytest-xdist): each takes one
    # thread, and so do the commands it starts, or two workers of two threads would oversubscribe two cores
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def save_tiny_gpt2(folder: Path, n_layer: int = 2, n_embd: int = 32, seed: int = 0) -> Path:
    """A real GPT-2 (random weights) written by save_pretrained, loaded like a hub download."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    model = GPT2Model(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=4, n_positions=1024))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> Path:
    """Folder of a 2-block, 32-wide GPT-2."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@contextmanager
def torch_threads(n: int):
    """Torch on ``n`` threads inside the block, as before after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (and the machine is shared): ``pytestmark =
    pytest.mark.usefixtures("one_thread")`` in a module that runs them."""
    with torch_threads(1):
        yield


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty RESERVOIR_HOME so features/ and results/ land in a temp folder."""
    monkeypatch.setenv("RESERVOIR_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def cli():
    """Invoke the CLI: ``cli("extract", "--task", ...)`` -> click Result (stderr kept apart)."""
    from reservoir.cli import main

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)

    return invoke


def write_mnist(folder, sizes: dict[str, int], cyclic_labels: bool = False):
    """A tiny MNIST in the official format (gzipped IDX files) in ``folder``: random images, ``sizes``
    rows per file prefix (``train``, ``t10k``); labels random, or ``0, 1, ..., 9, 0, ...``."""
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in sizes.items():
        with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(b"\0\0\x08\x03" + n.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2)
            f.write(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8).tobytes())
        labels = (
            (np.arange(n) % 10).astype(np.uint8) if cyclic_labels else rng.integers(0, 10, n, dtype=np.uint8)
        )
        with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(b"\0\0\x08\x01" + n.to_bytes(4, "big") + labels.tobytes())
    return folder

"""Stream a task through the frozen input layer and backbone into the feature store."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from reservoir.backbones import Backbone, load_backbone
from reservoir.config import ExtractConfig, parse_depths
from reservoir.input_layer import input_layer_tensors, make_input_layer
from reservoir.store import FeatureWriter, partial_path
from reservoir.tasks import SplitData, Task, TaskSpec, get_task

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class FeatureRunner:
    """Tokens -> per-depth readout features ``(B, n_depths, n_readout, d)`` as float32 numpy."""

    def __init__(self, spec: TaskSpec, input_layer: nn.Module, backbone: Backbone, depths: Sequence[int],
                 dtype: str = "float32", compile: bool = False):
        self.spec, self.depths = spec, tuple(depths)
        self.input_layer = input_layer.eval()
        self.backbone = backbone.to(DTYPES[dtype]).eval()
        self.dtype = DTYPES[dtype]
        self.forward = self._forward
        if compile:
            try:
                self.forward = torch.compile(self._forward, dynamic=spec.variable_length)
            except Exception as e:  # noqa: BLE001 - compilation is an optimisation, eager always works
                print(f"torch.compile unavailable ({e}); running eager", file=sys.stderr)

    def _forward(self, tokens: torch.Tensor, lengths: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
        x = self.input_layer(tokens).to(self.dtype)
        return self.backbone(x, lengths, self.depths, readout).float()

    def readout_positions(self, lengths: np.ndarray, width: int, padded: bool) -> np.ndarray:
        r = self.spec.n_readout
        last = np.full_like(lengths, width) if padded else lengths
        return (last[:, None] - r + np.arange(r)[None, :]).astype(np.int64)

    @torch.inference_mode()
    def __call__(self, tokens: np.ndarray, lengths: np.ndarray, padded: bool = False) -> np.ndarray:
        readout = torch.from_numpy(self.readout_positions(lengths, tokens.shape[1], padded))
        args = (torch.from_numpy(tokens), torch.from_numpy(lengths), readout)
        try:
            out = self.forward(*args)
        except Exception as e:  # noqa: BLE001
            if self.forward is self._forward:
                raise
            print(f"compiled forward failed ({type(e).__name__}: {e}); falling back to eager", file=sys.stderr)
            self.forward = self._forward
            out = self.forward(*args)
        return out.numpy()


def plan_batches(lengths: np.ndarray, batch_size: int, bucket: bool) -> list[np.ndarray]:
    """Row indices of each batch. Bucketing sorts by length (longest first) so padding is
    small; rows within a batch are increasing so the store can write them directly."""
    order = np.argsort(-lengths, kind="stable") if bucket else np.arange(len(lengths))
    return [np.sort(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]


class Progress:
    """Examples/s and ETA on stderr."""

    def __init__(self, label: str, total: int, done: int = 0, enabled: bool = True):
        self.label, self.total, self.done, self.enabled = label, total, done, enabled
        self.start, self.new, self.last = time.perf_counter(), 0, 0.0
        self.tty = sys.stderr.isatty()

    def update(self, n: int) -> None:
        self.done += n
        self.new += n
        now = time.perf_counter()
        every = 1.0 if self.tty else 15.0
        if self.enabled and (now - self.last > every or self.done == self.total):
            self.last = now
            rate = self.new / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            end = "\n" if self.done == self.total or not self.tty else ""
            start = "\r" if self.tty else ""
            print(f"{start}{self.label}: {self.done}/{self.total} ({rate:.1f} ex/s, ETA {eta:.0f}s)   ",
                  end=end, file=sys.stderr, flush=True)


def load_splits(task: Task, cfg: ExtractConfig) -> dict[str, SplitData]:
    splits = task.spec.splits if cfg.split == "all" else (cfg.split,)
    for s in splits:
        task.check_split(s)
    return {s: task.load(s, Path(cfg.data_dir), cfg.limit) for s in splits}


def extract(cfg: ExtractConfig, *, progress: bool = True) -> Path:
    """Run one extraction; returns the path of the complete feature file.

    Data and backbone are loaded before any file is created, so bad input leaves
    nothing behind. An existing complete file is kept as is; a ``.partial`` file with
    the same settings is resumed.
    """
    out = cfg.out_path
    task = get_task(cfg.task, **cfg.task_options)
    data = load_splits(task, cfg)
    backbone = load_backbone(cfg.backbone, cfg.seed)
    depths = parse_depths(cfg.depths, backbone.n_layers)
    if out.exists() and not partial_path(out).exists():
        print(f"{out} is already complete; delete it to extract again", file=sys.stderr)
        return out
    layer = make_input_layer(task.spec, backbone.d_model, cfg.seed)
    runner = FeatureRunner(task.spec, layer, backbone, depths, cfg.dtype, cfg.compile)
    identity = {**cfg.to_json(), "depths": depths, "splits": list(data), "task_options": task.options(),
                "n_layers": backbone.n_layers, "d_model": backbone.d_model}
    writer = FeatureWriter.open(out, identity, input_layer_tensors(layer))
    try:
        for split, d in data.items():
            shape = (len(depths), task.spec.n_readout, backbone.d_model)
            done = writer.split(split, d.labels, d.lengths, shape)
            bar = Progress(f"{cfg.task}/{split}", len(d), int(done.sum()), progress)
            padded = cfg.readout == "padded"
            for rows in plan_batches(d.lengths, cfg.batch_size, task.spec.variable_length and not padded):
                if done[rows].all():
                    continue
                tokens = task.encode(d.inputs[rows])
                if padded and tokens.shape[1] < task.spec.seq_len:
                    pad = [(0, 0), (0, task.spec.seq_len - tokens.shape[1])] + [(0, 0)] * (tokens.ndim - 2)
                    tokens = np.pad(tokens, pad, constant_values=task.spec.pad_id)
                writer.write(split, rows, runner(tokens, d.lengths[rows], padded))
                bar.update(len(rows))
        return writer.finish()
    finally:
        writer.close()


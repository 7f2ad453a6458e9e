"""Memory capacity (Jaeger 2001): how many past inputs a reservoir's state holds, linearly.

Inputs are i.i.d. uniform on [-1, 1], drawn from ``numpy.random.default_rng(seed)``. An example is a
window of ``window`` steps, as for the forecasting tasks (:mod:`reservoir.tasks.series`: the same
consecutive train, validation and test stretches after a washout); its label is the ``delays`` inputs
before the window's last step, ``u[t-1], ..., u[t-K]`` (float32, shape ``(1, delays)``). The capacity of
delay ``k`` is the squared correlation, on test steps, between ``u[t-k]`` and its linear readout from the
state at ``t`` (:func:`reservoir.probe.metrics.memory_capacity`); summed over delays it is at most the
number of units of a linear reservoir, and a windowed reservoir holds no input older than its window
(delays of ``window`` steps and more).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reservoir.errors import UsageError
from reservoir.settings import Interval, check, setting
from reservoir.tasks import MAX_TOKENS, SplitData, TaskSpec, register_task
from reservoir.tasks.series import SPLITS, Forecast, windows


def delayed(u: np.ndarray, steps: np.ndarray, delays: int) -> np.ndarray:
    """``(len(steps), delays)``: ``u[t-1], ..., u[t-delays]`` for each step ``t`` (each ``t >= delays``)."""
    return u[np.asarray(steps)[:, None] - np.arange(1, delays + 1)[None, :]]


@register_task("memory_capacity")
@dataclass
class MemoryCapacity(Forecast):
    """Linear memory capacity: the ``delays`` inputs before each window's last step (module docstring)."""

    delays: int = setting(40, Interval(1, MAX_TOKENS))

    def __post_init__(self):
        if self.horizon != 1:
            raise UsageError(
                f"The 'horizon' option of task memory_capacity ({self.horizon}) sets how far ahead a forecast "
                "reads; memory capacity reads the inputs before each window's last step, which 'delays' sets: "
                "drop horizon"
            )
        check(
            "memory_capacity",
            "washout",
            self.washout,
            Interval(self.delays, None),
            noun="option",
            note=f" (delays {self.delays}: the first step scored reads that many inputs back)",
        )

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            self.name,
            "dense",
            seq_len=self.window,
            token_dim=1,
            n_classes=1,
            outputs_per_token=self.delays,
            splits=SPLITS,
            target="regression",
        )

    def series(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        u = np.random.default_rng(self.seed).uniform(-1, 1, n_steps)
        return u, u

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        stretches, total = self.stretches()
        start, size = stretches[split]
        n = min(n or size, size)
        u, _ = self.series(total)
        x, _ = windows(u, u, start, n, self.window, self.horizon)
        labels = delayed(u, self.last_steps(split)[:n], self.delays).astype(np.float32)
        return SplitData(x, labels[:, None, :], np.full(n, self.window))

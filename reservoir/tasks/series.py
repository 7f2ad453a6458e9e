"""Reservoir computing's home tasks: one-step forecasting of Mackey-Glass and NARMA-10, generated from a seed.

Both series are generated with reservoirpy's definitions (``reservoirpy.datasets``, version 0.4), so a
series here equals reservoirpy's for the same seed (tests check it where reservoirpy is installed):

- **Mackey-Glass** (``mackey_glass``): the delay differential equation
  ``dx/dt = a x(t - tau) / (1 + x(t - tau)^n) - b x(t)`` with ``tau = 17``, ``a = 0.2``, ``b = 0.1``,
  ``n = 10``, stepped by reservoirpy's discrete update with ``h = 1`` (its ``_mg_rk4``: shaped as a fourth-order
  step but first-order accurate, so the series runs about 3% slower than the equation's) from ``x0 = 1.2`` after a
  history of ``tau`` values drawn as ``x0 + 0.2 (U[0, 1) - 0.5)`` from ``numpy.random.default_rng(seed)``.
  The series is then scaled to ``[-1, 1]`` by its minimum and maximum (as reservoirpy's tutorials do).
- **NARMA-10** (``narma10``): inputs ``u[t]`` drawn from ``U[0, 0.5]`` by ``default_rng(seed)`` and
  ``y[t+1] = 0.3 y[t] + 0.05 y[t] (y[t-10] + ... + y[t-1]) + 1.5 u[t-10] u[t] + 0.1`` from ``y = 0``:
  reservoirpy's ``narma(order=10, a1=0.3, a2=0.05, b=1.5, c=0.1)``. (Its sum runs over the ten values
  before ``y[t]`` and its product pairs ``u[t]`` with ``u[t-10]``; the classic statement of Atiya and
  Parlos sums ``y[t-9..t]`` and pairs ``u[t]`` with ``u[t-9]``.) Its target at each step is the ``y``
  reservoirpy pairs with that input, which depends on the inputs before it.

An example is a window of ``window`` consecutive steps, one value a token; its label is the value
``horizon`` steps after the window's last (Mackey-Glass: the series itself; NARMA: ``y``). Windows
advance by one step. The splits are consecutive stretches of one series, ``train`` then ``val`` then
``test``, so no label of one split is an input or label of another; the first ``washout`` steps are
dropped. Labels are float32: a probe regresses them (``reservoir fit --head ridge``) and reports NRMSE
and R^2 (:mod:`reservoir.probe.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from reservoir.errors import DataError
from reservoir.settings import Interval, OneOf, setting
from reservoir.tasks import MAX_ROWS, MAX_SEED, MAX_TOKENS, SplitData, Task, TaskSpec, register_task

SPLITS = ("train", "val", "test")


def mackey_glass(
    n_steps: int, seed: int, *, tau: int = 17, a: float = 0.2, b: float = 0.1, n: int = 10, x0: float = 1.2
) -> np.ndarray:
    """``n_steps`` values of the Mackey-Glass series, float64, as ``reservoirpy.datasets.mackey_glass``
    computes them with ``h = 1`` (module docstring)."""
    rng = np.random.default_rng(seed)
    history = x0 * np.ones(tau) + 0.2 * (rng.random(tau) - 0.5)
    x = np.empty(tau + n_steps)
    x[:tau] = history
    xt = x0
    for i in range(tau, tau + n_steps):
        x[i] = xt
        xtau = x[i - tau]
        k1 = -b * xt + a * xtau / (1 + xtau**n)  # reservoirpy's update, step h = 1
        k2 = 2 * k1 - b * k1
        k3 = 2 * k1 - b * k2
        k4 = k1 - b * k3
        xt = xt + (k1 + k2 + k3 + k4) / 6
    return x[tau:]


#: a NARMA output past this has left the recurrence's bounded regime (it stays near 0 to 1 where it is stable)
DIVERGED = 1e3


def narma(
    n_steps: int,
    seed: int,
    *,
    order: int = 10,
    a1: float = 0.3,
    a2: float = 0.05,
    b: float = 1.5,
    c: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``u`` and outputs ``y`` of NARMA of ``order``, both ``(n_steps,)`` float64 and paired step by
    step as ``reservoirpy.datasets.narma`` pairs ``u[order:]`` with ``y`` (module docstring)."""
    u = np.random.default_rng(seed).uniform(0, 0.5, size=(n_steps + order, 1))[:, 0]
    y = np.zeros(n_steps + order)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(order, n_steps + order - 1):
            y[t + 1] = a1 * y[t] + a2 * y[t] * np.sum(y[t - order : t]) + b * u[t - order] * u[t] + c
    if not np.isfinite(y).all() or np.abs(y).max() > DIVERGED:
        step = int(np.flatnonzero(~np.isfinite(y) | (np.abs(y) > DIVERGED))[0]) - order
        raise DataError(
            f"NARMA-{order} of seed {seed} diverges at step {step} of {n_steps} (its recurrence grows without bound "
            "for some input draws); choose another seed (--seed, or --task-opt seed=N)"
        )
    return u[order:], y[order:]


def windows(inputs: np.ndarray, targets: np.ndarray, start: int, n: int, window: int, horizon: int):
    """``n`` windows of ``inputs`` starting at ``start``, one step apart, and the ``targets`` ``horizon``
    steps after each window's last step: ``(n, window)`` and ``(n,)`` float32."""
    index = start + np.arange(n)[:, None] + np.arange(window)[None, :]
    return inputs[index].astype(np.float32), targets[start + np.arange(n) + window - 1 + horizon].astype(
        np.float32
    )


@dataclass
class Forecast(Task):
    """One-step (``horizon``) forecasting from windows of a generated series (module docstring)."""

    generated: ClassVar[bool] = True

    window: int = setting(32, Interval(1, MAX_TOKENS))
    horizon: int = setting(1, Interval(1, MAX_TOKENS))
    n_train: int = setting(2000, Interval(1, MAX_ROWS))
    n_val: int = setting(500, Interval(1, MAX_ROWS))
    n_test: int = setting(1000, Interval(1, MAX_ROWS))
    washout: int = setting(100, Interval(0, MAX_ROWS))
    seed: int = setting(0, Interval(0, MAX_SEED))

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            self.name,
            "dense",
            seq_len=self.window,
            token_dim=1,
            n_classes=1,
            splits=SPLITS,
            target="regression",
        )

    def series(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets of ``n_steps`` steps, aligned step by step."""
        raise NotImplementedError  # pragma: no cover - abstract

    def stretches(self) -> tuple[dict[str, tuple[int, int]], int]:
        """Each split's first step and number of windows, and the steps of the whole series: the splits
        follow the washout one after another, each ``window + horizon - 1`` steps longer than its windows."""
        span, start, out = self.window + self.horizon - 1, self.washout, {}
        for split, n in zip(SPLITS, (self.n_train, self.n_val, self.n_test)):
            out[split] = (start, n)
            start += n + span
        return out, start

    def last_steps(self, split: str) -> np.ndarray:
        """The step each window of ``split`` ends at: its label is the target ``horizon`` steps later."""
        start, n = self.stretches()[0][split]
        return start + self.window - 1 + np.arange(n)

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        stretches, total = self.stretches()
        start, size = stretches[split]
        inputs, targets = self.series(total)
        n = min(n or size, size)
        x, y = windows(inputs, targets, start, n, self.window, self.horizon)
        return SplitData(x, y, np.full(n, self.window))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        return inputs.astype(np.float32)[:, :, None]


@register_task("mackey_glass")
@dataclass
class MackeyGlass(Forecast):
    """Mackey-Glass (tau 17) one-step forecasting, scaled to [-1, 1] (reservoirpy's definition)."""

    tau: int = setting(17, Interval(1, 1000))

    def series(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        x = mackey_glass(n_steps, self.seed, tau=self.tau)
        x = 2 * (x - x.min()) / (x.max() - x.min()) - 1
        return x, x


@register_task("narma10")
@dataclass
class Narma10(Forecast):
    """NARMA-10: the output y from the inputs u (reservoirpy's definition); ``centred``: the inputs fed
    as ``4 u - 1``, from [0, 0.5] to [-1, 1] (centred and scaled as Mackey-Glass is), the targets unchanged."""

    centred: bool = setting(False, OneOf((False, True)))

    def series(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        u, y = narma(n_steps, self.seed)
        return (4 * u - 1 if self.centred else u), y

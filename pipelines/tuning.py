"""The same search budget for every model: a seeded quasi-random search over each model's free settings,
chosen on validation, every trial a run with an identity kept in a ledger, so a rerun reuses its trials.

A model's search space is a dict of scipy distributions; the draws are the points of a scrambled Sobol
sequence (``scipy.stats.qmc.Sobol``, seed 0), one coordinate a setting, mapped through each distribution's
quantile function: they cover every setting's range evenly (eight pseudo-random draws can leave a decade
of a one-setting space untried), and the first ``k`` do not depend on ``trials`` (a larger budget adds
trials, reusing the earlier ones). Each draw is rounded to three significant digits. A trial is scored by a ``run(params, seed)`` function returning at least
``val_nrmse`` and ``test_nrmse``; :func:`search` runs every draw on the tuning seed, takes the one of lowest
validation NRMSE (the earlier draw on ties), and runs it again on the other seeds.

The ledger is a JSON-lines file, one trial a line, keyed by the trial's identity (a digest of everything
that changes its numbers: what ``key`` holds, the settings and the seed); a line is appended as soon as its
trial ends, so an interrupted search resumes at the next trial.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from scipy.stats import qmc


def rounded(params: dict[str, Any]) -> dict[str, Any]:
    """Each float of ``params`` to three significant digits (the settings a trial names)."""
    return {k: float(f"{v:.3g}") if isinstance(v, float) else v for k, v in sorted(params.items())}


def draws(space: dict[str, Any], trials: int) -> list[dict[str, Any]]:
    """The ``trials`` settings of a search over ``space`` (one empty setting where there is nothing to tune)."""
    if not space:
        return [{}]
    names = sorted(space)
    with warnings.catch_warnings():  # a count that is not a power of 2 loses some of Sobol's balance
        warnings.simplefilter("ignore", UserWarning)
        points = qmc.Sobol(d=len(names), scramble=True, seed=0).random(trials)
    return [rounded({n: float(space[n].ppf(q)) for n, q in zip(names, p)}) for p in points]


def edges(
    space: dict[str, Any], params: dict[str, Any], tried: list[dict[str, Any]], margin: float = 0.1
) -> dict[str, str]:
    """The settings of ``params`` that are the lowest (highest) value ``tried`` and lie in the outer ``margin``
    of ``space``'s range, by the quantile of the setting's distribution: name -> ``"low edge"`` or
    ``"high edge"``. A choice there says a wider range might choose further out."""
    out = {}
    for n, v in params.items():
        if n not in space:
            continue
        q, values = float(space[n].cdf(v)), [t[n] for t in tried if n in t]
        if q < margin and v <= min(values):
            out[n] = "low edge"
        elif q > 1 - margin and v >= max(values):
            out[n] = "high edge"
    return out


def beyond(
    space: dict[str, Any], params: dict[str, Any], edge: dict[str, str], steps: int = 2
) -> list[dict[str, Any]]:
    """Settings past ``params``' edges (:func:`edges`), to measure whether an edge binds: each log-uniform
    setting at an edge moved out by one, then two, tenths of its range's span (the others kept). Settings of
    other distributions (a leak rate, a radius: bounds of what the model accepts) are not moved."""
    out = []
    for n, side in sorted(edge.items()):
        if space[n].dist.name != "loguniform":
            continue
        low, high = (float(b) for b in space[n].support())
        ratio = (high / low) ** (0.1 if side == "high edge" else -0.1)
        out += [rounded({**params, n: params[n] * ratio**k}) for k in range(1, steps + 1)]
    return out


def identity(key: dict[str, Any], params: dict[str, Any], seed: int) -> str:
    """The digest naming a trial: ``key`` (task, protocol, sizes, model), its settings and its seed."""
    text = json.dumps({**key, "params": params, "seed": seed}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Ledger:
    """The trials run so far, by identity, read from and appended to a JSON-lines ``path``.

    ``scoring``: the version of the code that scores a trial, recorded in each; a trial of another version (a
    record without one is version 1) is stale: the search runs it again rather than reuse it, and only
    ``keep_stale`` (rendering, which runs nothing) reads it back, for a table that says so (:meth:`stale`)."""

    def __init__(self, path: Path, scoring: int | None = None):
        self.path, self.scoring, self.keep_stale = path, scoring, False
        self.trials: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self.trials[record["id"]] = record
        self.ran = 0  # trials run (not read back) in this process

    def trial(
        self,
        key: dict[str, Any],
        params: dict[str, Any],
        seed: int,
        run: Callable[[dict[str, Any], int], dict[str, Any]],
        role: str,
    ) -> dict[str, Any]:
        """The trial of ``params`` on ``seed``: read back if the ledger holds it, else run and appended."""
        tid = identity(key, params, seed)
        if tid in self.trials and (self.keep_stale or not self.stale(self.trials[tid])):
            return self.trials[tid]
        started = time.perf_counter()
        scores = run(params, seed)
        record = {
            "id": tid,
            **key,
            "params": params,
            "seed": seed,
            "role": role,
            **scores,
            "seconds": round(time.perf_counter() - started, 2),
            "threads": torch.get_num_threads(),
            **({"scoring": self.scoring} if self.scoring is not None else {}),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        self.trials[tid] = record
        self.ran += 1
        return record

    def stale(self, record: dict[str, Any]) -> bool:
        """Whether a trial was scored by another version of the code than this ledger's ``scoring``."""
        return self.scoring is not None and record.get("scoring", 1) != self.scoring


def lowest_first(score: float) -> tuple[bool, float]:
    """A sort key of an error to minimise that puts NaN (a diverged trial) after every number."""
    return math.isnan(score), score


def search(
    ledger: Ledger,
    key: dict[str, Any],
    space: dict[str, Any],
    run: Callable[[dict[str, Any], int], dict[str, Any]],
    *,
    trials: int,
    seeds: int,
    tune_seed: int = 0,
) -> dict[str, Any]:
    """Tune ``key``'s model over ``space`` with ``trials`` draws on ``tune_seed``, then run the setting of
    lowest validation NRMSE on ``seeds`` seeds (``tune_seed`` first, its trial reused). Returns
    ``{"trials": [...], "best": params, "seeds": [...]}``, the records of the ledger."""
    tried = [ledger.trial(key, p, tune_seed, run, "search") for p in draws(space, trials)]
    if all(math.isnan(r["val_nrmse"]) for r in tried):
        raise ValueError(f"{key}: every trial of the search scored NaN on validation; no setting to choose")
    best = min(tried, key=lambda r: lowest_first(r["val_nrmse"]))["params"]
    others = [s for s in range(tune_seed, tune_seed + seeds) if s != tune_seed]
    seeded = [next(r for r in tried if r["params"] == best)]
    seeded += [ledger.trial(key, best, s, run, "seed") for s in others]
    return {"trials": tried, "best": best, "seeds": seeded}

"""Results: the one schema and atomic writer for ``fit`` and ``train``, and the reader ``report`` uses.

One JSON file per result under ``results/{task}/{backbone}/``. Schema (both modes):

- ``task``, ``backbone``, ``mode`` (``output-only``, ``end-to-end``, or ``baseline``: see
  :mod:`reservoir.probe.baselines`; its backbone is ``baseline-NAME``, its depth ``None``), ``depth``, ``head``,
  ``trainable`` (groups), ``seed``, ``lr`` (``None`` for output-only heads);
- ``metric`` (the primary metric of the task's targets, :mod:`reservoir.probe.metrics`:
  ``accuracy`` for classes, ``nrmse`` for real values), ``test_score`` and ``val_score`` (that
  metric on the test and validation rows), ``test_metrics`` (every metric of the target kind on the
  test rows), ``n_train``, ``n_val``, ``n_test``, ``seconds``; results of class targets also carry
  ``test_accuracy`` and ``val_accuracy`` (fractions in [0, 1]), which results written before
  ``metric`` existed hold alone (:func:`load_results` reads them as ``accuracy`` scores);
- ``identity``: the identity of what produced it (the feature file's, or the training
  run's), and ``identity_hash``, its digest;
- ``key``: digest of the identity hash, mode, head, depth, seed, trainable groups, learning
  rate, validation fraction, and ``streamed`` where the head read its training rows block by block. The file name carries readable parts and the key, so two
  runs that differ in any of them never overwrite each other, and ``report`` deduplicates
  by ``key``;
- ``config`` (everything needed to rerun) and ``version``.

Files are written atomically: a temp file in the same folder, flushed and fsynced, then
renamed over the final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from reservoir import __version__
from reservoir.errors import DataError, ReservoirError, StoreError, write_failure
from reservoir.identity import digest
from reservoir.paths import results_dir, slug

MODES = ("output-only", "end-to-end", "baseline")


@dataclass
class Result:
    """One result, of any kind (``mode``: ``output-only`` fits, ``baseline`` fits, ``end-to-end`` runs), as it
    is built once where it is produced and written as JSON (:meth:`to_json`, the module docstring's schema).

    ``scores`` holds the metric and the scores (``metric``, ``test_score``, ``val_score``, ``test_accuracy``,
    ``test_metrics``, ...) and the sizes (``n_train``, ``n_val``, ``n_test``); ``extra`` what one kind adds
    (a baseline's name, the features read, an end-to-end run's seeds, sweep and runs). ``identity_hash``
    is the digest of ``identity`` unless the producer recorded its own (a feature file's)."""

    task: str
    backbone: str
    mode: str
    depth: int | None
    head: str
    trainable: list[str]
    seed: int
    identity: dict[str, Any]
    config: dict[str, Any]
    scores: dict[str, Any]
    seconds: float
    lr: float | None = None
    machines: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    identity_hash: str | None = None
    version: str = __version__

    def __post_init__(self) -> None:
        if self.mode not in MODES:  # an internal invariant, not user input
            raise ValueError(f"result mode {self.mode!r} is not one of {MODES}")
        missing = [k for k in SCORED if k not in self.scores]
        if missing:
            raise ValueError(f"result scores lack {missing}")

    def to_json(self) -> dict[str, Any]:
        """The result as its file holds it (its ``key`` included)."""
        out = {
            **self.extra,
            **self.scores,
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("scores", "extra")},
        }
        out["trainable"] = list(self.trainable)
        out["identity_hash"] = self.identity_hash or digest(self.identity)
        out = with_scores(out)
        out["key"] = result_key(out)
        return out


#: the scores every result holds (:class:`Result`)
SCORED = ("metric", "test_score", "val_score", "n_train", "n_val", "n_test")
#: the fields every result file holds
REQUIRED = (
    *(f.name for f in fields(Result) if f.name not in ("scores", "extra", "machines")),
    *SCORED,
    "key",
)


def result_key(result: dict[str, Any]) -> str:
    """What makes a result distinct: the producing run's identity and the head's own settings."""
    fit = result.get("config", {}).get("fit", {})
    return digest(
        {
            "identity": result["identity_hash"],
            "mode": result["mode"],
            "head": result["head"],
            "depth": result["depth"],
            "seed": result["seed"],
            "trainable": list(result["trainable"]),
            "lr": result.get("lr"),
            "val_fraction": fit.get("val_fraction"),
            # a head fitted on streamed rows (another solver, other scores); absent from keys written before
            **({"streamed": True} if result.get("streamed") else {}),
        }
    )


def result_name(result: dict[str, Any]) -> str:
    """``{mode}_{head}_[{trainable}_]depth{d}_seed{s}[_lr{lr}]_{key}.json``."""
    parts = [result["mode"], result["head"]]
    if result["mode"] == "end-to-end":
        parts.append("-".join(result["trainable"]))
    if result["depth"] is not None:  # baselines have no depth
        parts.append(f"depth{result['depth']}")
    parts.append(f"seed{result['seed']}")
    if result.get("lr") is not None:
        parts.append(f"lr{result['lr']:g}")
    return slug("_".join(parts + [result["key"]])) + ".json"


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a temp file in the same folder, which is
    flushed, fsynced and renamed over ``path``; a failure or a kill never leaves a partial file
    under the final name (results and training checkpoints are written this way)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # created exclusively with the permissions a plain open() gives (mkstemp's would be private)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise unwritable(path, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, (OSError, RuntimeError)) and not isinstance(e, ReservoirError):
            raise unwritable(path, e) from None  # torch.save reports a full disk as a RuntimeError
        raise
    fsync_path(path.parent)  # make the rename itself durable
    return path


def unwritable(path: Path, e: BaseException) -> StoreError:
    """The error of a file that could not be written: where, the system's words, and the fix."""
    what, fix = write_failure(e)
    return StoreError(
        f"{path} could not be written: {what}. {fix} (or set RESERVOIR_HOME to another folder), then rerun"
    )


def fsync_path(path: Path) -> None:
    """Flush a file or folder (a folder: the names in it) to disk; best effort, a failure is ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def result_path(result: dict[str, Any]) -> Path:
    """Where ``result`` (with its ``key``) is written: ``results/{task}/{backbone}/{result_name}``."""
    return results_dir(result["task"], result["backbone"]) / result_name(result)


def write_result(result: Result | dict[str, Any]) -> Path:
    """Write ``result`` (a :class:`Result`, or the JSON of one) under ``results/{task}/{backbone}/``; returns
    the path."""
    if isinstance(result, Result):
        result = result.to_json()
    missing = [k for k in REQUIRED if k not in result]
    if missing:
        raise ValueError(f"result is missing fields {missing}")  # an internal invariant, not user input
    path = result_path(result)
    text = json.dumps(result, indent=2, sort_keys=True, default=str).encode()
    atomic_write(path, lambda f: f.write(text))
    return path


def with_scores(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with ``metric``, ``test_score`` and ``val_score``: a result written before they existed
    (an accuracy alone) gets them from its ``test_accuracy`` and ``val_accuracy``."""
    if "test_score" in result or "test_accuracy" not in result:
        return result
    return {
        "metric": "accuracy",
        "test_score": result["test_accuracy"],
        "val_score": result.get("val_accuracy"),
        **result,
    }


#: why a run that reached ``--stop-at`` stopped (a run's ``stop_reason``)
SOLVED = "validation accuracy reached {:g}%"
#: why a run that ``--max-time`` cut short stopped
TIMED_OUT = "reached --max-time {:g} s at step {}"


def stopped_by(reason: str, template: str) -> bool:
    """Whether a run's stop reason is one ``template`` (:data:`SOLVED`, :data:`TIMED_OUT`) writes."""
    return reason.startswith(template.split("{")[0])


def timed_out_at(reason: str) -> float | None:
    """The ``--max-time`` a run's stop reason says cut it (:data:`TIMED_OUT`); ``None`` for any other reason."""
    if not stopped_by(reason, TIMED_OUT):
        return None
    with contextlib.suppress(ValueError, IndexError):
        return float(reason[len(TIMED_OUT.split("{")[0]) :].split()[0])
    return None


def sample_std(values: list[float]) -> float:
    """The sample standard deviation over seeds (0 for one seed)."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def seed_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields of an end-to-end result that summarise its seeds' ``runs`` (at one learning rate): test and
    validation accuracy (mean, sample std, extremes), the seeds and their steps, and the steps to the target
    (their mean only when every seed reached it). :func:`merge_seeds` reuses it for runs of separate results."""
    tests = [r["test_accuracy"] for r in runs]
    vals = [r["val_accuracy"] for r in runs]
    to_target = [r["steps_to_target"] for r in runs]
    reached = [s for s in to_target if s is not None]
    return {
        "test_accuracy": float(np.mean(tests)),
        "test_std": sample_std(tests),
        "test_min": float(min(tests)),
        "test_max": float(max(tests)),
        "val_accuracy": float(np.mean(vals)),
        "val_std": sample_std(vals),
        "seeds": [r["seed"] for r in runs],
        "steps": [r["steps"] for r in runs],
        "best_step": [r["best_step"] for r in runs],
        "steps_to_target": to_target,
        "steps_to_target_mean": float(np.mean(reached)) if reached and len(reached) == len(runs) else None,
    }


def sweep_of(
    runs: dict[float, list[dict[str, Any]]], diverged: dict[float, str]
) -> dict[str, dict[str, Any]]:
    """A result's ``sweep``: each learning rate (as ``f"{lr:g}"``) with the mean and sample std of its runs'
    validation and test accuracy over the seeds that ran it (``n``), or why it diverged."""
    return {
        f"{lr:g}": {
            "val_mean": float(np.mean([r["val_accuracy"] for r in rs])),
            "val_std": sample_std([r["val_accuracy"] for r in rs]),
            "test_mean": float(np.mean([r["test_accuracy"] for r in rs])),
            "test_std": sample_std([r["test_accuracy"] for r in rs]),
            "n": len(rs),
        }
        for lr, rs in runs.items()
    } | {f"{lr:g}": {"diverged": why} for lr, why in diverged.items()}


def best_rate(val_mean: dict[float, float], order: list[float]) -> float:
    """The learning rate of a sweep with the best mean validation accuracy over its seeds, the first in ``order``
    on a tie."""
    return max(val_mean, key=lambda lr: (val_mean[lr], -(order.index(lr) if lr in order else len(order))))


def merge_seeds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """End-to-end results of one setting whose seeds ran apart (other processes or machines) as one result of
    all their seeds, as one sweep of them all selects: the learning rate of the best mean validation accuracy over
    every seed (the first listed on a tie) among those every seed ran, its runs; a seed run twice counted once.
    Where no rate ran on every seed, each result's runs at its own chosen rate. Its ``sweep`` is that of every
    seed's runs (:func:`sweep_of`), a rate that diverged in any of them diverged."""
    if len(results) == 1:
        return results[0]
    by_lr: dict[float, dict[int, dict[str, Any]]] = {}
    for r in results:
        for run in r.get("runs", []):
            by_lr.setdefault(run["lr"], {}).setdefault(run["seed"], run)
    diverged = {
        float(lr): cell["diverged"]
        for r in results
        for lr, cell in (r.get("sweep") or {}).items()
        if "diverged" in cell
    }
    sweep = sweep_of(
        {lr: [runs[s] for s in sorted(runs)] for lr, runs in by_lr.items() if lr not in diverged}, diverged
    )
    seeds = {s for r in results for s in r.get("seeds") or [run["seed"] for run in r.get("runs", [])]}
    order = [float(lr) for lr in results[0].get("identity", {}).get("lr") or sorted(by_lr)]
    every = [lr for lr in by_lr if set(by_lr[lr]) == seeds]
    if every:
        best = best_rate(
            {lr: float(np.mean([run["val_accuracy"] for run in by_lr[lr].values()])) for lr in every}, order
        )
        chosen = [by_lr[best][s] for s in sorted(seeds)]
    else:
        kept: dict[int, dict[str, Any]] = {}
        for r in results:
            for run in r.get("runs", []):
                if run["lr"] == r["lr"]:
                    kept.setdefault(run["seed"], run)
        best, chosen = results[0]["lr"], [kept[s] for s in sorted(kept)]
    summary = seed_summary(chosen)
    return {
        **results[0],
        **summary,
        "lr": best,
        "test_score": summary["test_accuracy"],
        "val_score": summary["val_accuracy"],
        "runs": chosen,
        "sweep": sweep,
        "seconds": float(sum(r.get("seconds", 0.0) for r in results)),
        "machines": list(dict.fromkeys(m for r in results for m in r.get("machines", []))),
    }


def _is_result(obj: Any) -> bool:
    return isinstance(obj, dict) and all(k in obj for k in REQUIRED) and obj.get("mode") in MODES


def kept_result(path: Path) -> dict[str, Any] | None:
    """The result written at ``path`` before, or ``None`` where there is none, or only a damaged one (which the
    caller computes again and writes over)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return obj if _is_result(obj) else None


def load_results(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every result under the given files and folders, each once (deduplicated by ``key``).

    A named file that is not a result is an error naming it; in folders, JSON files that are
    not results (or results of an older schema) are skipped.
    """
    out: dict[str, dict[str, Any]] = {}
    skipped: list[Path] = []
    for p in paths:
        p = Path(p)
        files = sorted(p.rglob("*.json")) if p.is_dir() else [p]
        for f in files:
            if f.suffix != ".json" and not p.is_dir():
                raise DataError(
                    f"{f} is not a reservoir result (results are the .json files `reservoir fit` and `reservoir "
                    "train` write; a feature file or a saved probe is not one): pass those, or their folder"
                )
            try:
                obj = json.loads(f.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise DataError(
                    f"cannot read result {f} ({type(e).__name__}: {e}); delete it or rerun the "
                    "fit/train that wrote it"
                ) from None
            if isinstance(obj, dict):
                obj = with_scores(obj)
            if not _is_result(obj):
                if p.is_dir():
                    skipped.append(f)
                    continue
                raise DataError(
                    f"{f} is not a reservoir result (it lacks "
                    f"{[k for k in REQUIRED if not isinstance(obj, dict) or k not in obj][:4]}); "
                    "pass result files written by `reservoir fit` or `reservoir train`"
                )
            out.setdefault(obj["key"], {**obj, "path": str(f)})
    if skipped:
        print(
            f"note: skipped {len(skipped)} JSON file(s) that are not results, such as {skipped[0]}",
            file=sys.stderr,
        )
    return list(out.values())

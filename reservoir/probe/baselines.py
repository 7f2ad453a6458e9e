"""Baselines beside every output-only result: what a reservoir's features add over the input.

``fit`` computes them from the same splits as the feature file (read again, and checked against its
data digest), with the same head, regularisation search and refit:

- ``majority``: the most common train label (per output for multi-output tasks; the train mean of
  real-valued targets);
- ``raw``: the head on the task's raw tokens, flattened: dense values zero-padded to the
  task's length, id tokens one-hot per position;
- ``tanh-W``: the head on ``W`` random tanh features of those raw tokens, ``W`` the width
  of the reservoir's features: ``tanh(X R / s + b)`` with ``R`` and the bias ``b`` drawn from
  N(0, 1) by the run's seed and ``s`` the std of ``X R`` over train, so the projections have
  unit std (random features as an extreme learning machine draws them: without the bias every
  feature is odd in the input, and no readout of them forms an even function such as a product);
- a task's rules (:meth:`reservoir.tasks.Task.baseline_rules`; ListOps: the first operator):
  the most common train label among the train examples with the same key, the majority
  label for a key train never showed.

A baseline's identity holds the data, the baseline and its width and seed, never the backbone: every
backbone's fit on the same data reuses the same baseline results.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.config import FitConfig
from reservoir.errors import DataError, IdentityError
from reservoir.identity import digest, reread
from reservoir.probe.heads import fit_probe, noting_convergence
from reservoir.probe.metrics import METRICS_BY_TARGET, result_scores, score_line, target_kind
from reservoir.probe.metrics import scores as metric_scores
from reservoir.probe.rows import ArrayRows
from reservoir.progress import log
from reservoir.results import Result, kept_result, result_key, result_path, write_result
from reservoir.runtime import machine
from reservoir.tasks import SplitData, Task, make_task
from reservoir.tasks.sizes import holdout

#: the version of the heads' fitting a fitted baseline's identity records
HEADS_VERSION = 2


def load_data(task: Task, identity: dict[str, Any], data_dir: Path) -> dict[str, SplitData]:
    """The splits a feature file was extracted from, read again and checked against its digest."""
    try:
        data = reread(task, identity, data_dir)
    except DataError as e:
        raise DataError(
            f"{e}\n(the baselines read the task's data again: pass --data-dir, or --no-baselines)"
        ) from None
    if data is None:
        raise IdentityError(
            f"the data of task {identity['task']!r} under {data_dir} differs from the data the "
            "features were extracted from; pass the --data-dir the extraction read, or --no-baselines"
        )
    return data


def raw_inputs(task: Task, data: SplitData) -> np.ndarray:
    """``(N, D)`` float32: the tokens the backbone reads, flattened (module docstring)."""
    spec = task.spec
    tokens = task.encode(data.inputs)
    pad = spec.seq_len - tokens.shape[1]
    if spec.token_kind == "ids":
        tokens = np.pad(tokens, ((0, 0), (0, pad)), constant_values=spec.pad_id)
        out = np.zeros((len(tokens), spec.seq_len, spec.vocab_size), np.float32)
        np.put_along_axis(out, tokens[:, :, None].astype(np.int64), 1.0, axis=2)
        return out.reshape(len(tokens), -1)
    tokens = np.pad(tokens, ((0, 0), (0, pad), (0, 0)))
    return tokens.reshape(len(tokens), -1).astype(np.float32)


def tanh_features(
    raw: dict[str, np.ndarray], width: int, seed: int, scale: float = 1.0
) -> dict[str, np.ndarray]:
    """``tanh(scale X R / s + b)`` per split (module docstring); ``s`` is measured on ``raw["train"]``, so the
    projections have standard deviation ``scale`` on train, and the bias ``b`` (one per feature) is N(0, 1)."""
    rng = np.random.default_rng(seed)
    R = rng.standard_normal((raw["train"].shape[1], width), dtype=np.float32)
    b = rng.standard_normal(width, dtype=np.float32)
    s = float(np.std(raw["train"] @ R)) or 1.0
    return {split: np.tanh(X @ R / (s / scale) + b) for split, X in raw.items()}


def lookup_rule(keys: np.ndarray, labels: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Predict the most common label of each key among ``(keys, labels)`` (the overall most common for an
    unseen key), voted per output."""
    flat = labels.reshape(len(labels), -1)

    def vote(rows: np.ndarray) -> np.ndarray:
        return np.array([np.bincount(col).argmax() for col in rows.T])

    overall = vote(flat)
    table = {k: vote(flat[keys == k]) for k in np.unique(keys)}

    def predict(new_keys: np.ndarray) -> np.ndarray:
        out = np.stack([table.get(k, overall) for k in new_keys]) if len(new_keys) else flat[:0]
        return out.reshape((len(new_keys),) + labels.shape[1:])

    return predict


def rule_predictor(keys: np.ndarray, labels: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """:func:`lookup_rule` for class labels; for real-valued labels, the mean of ``labels`` for every key."""
    if labels.dtype.kind != "f":
        return lookup_rule(keys, labels)
    mean = labels.mean(0)
    return lambda new_keys: np.broadcast_to(mean, (len(new_keys), *labels.shape[1:])).copy()


def rule_scores(
    keys: dict[str, np.ndarray],
    data: dict[str, SplitData],
    val: str | None,
    tests: list[str],
    val_fraction: float,
    seed: int,
) -> dict[str, Any]:
    """A lookup rule scored like a head (:func:`reservoir.probe.heads.fit_probe`)."""
    train_y = data["train"].labels
    kind = target_kind(train_y)
    if val is None:
        fit_i, val_i = holdout(train_y, val_fraction, seed)
        val_keys, val_y = keys["train"][val_i], train_y[val_i]
        fit_keys, fit_y = keys["train"][fit_i], train_y[fit_i]
    else:
        val_keys, val_y, fit_keys, fit_y = keys[val], data[val].labels, keys["train"], train_y
    primary = METRICS_BY_TARGET[kind][0]
    val_score = metric_scores(rule_predictor(fit_keys, fit_y)(val_keys), val_y, kind)[primary]
    rule = rule_predictor(keys["train"], train_y)
    return {
        **result_scores(
            kind, val_score, {t: metric_scores(rule(keys[t]), data[t].labels, kind) for t in tests}
        ),
        "n_train": len(train_y),
        "n_val": len(val_y),
        "n_test": len(data[tests[0]]),
        "n_tests": {t: len(data[t]) for t in tests},
        "hyperparameters": {},
        "val_scores": {},
        "seeded": val is None,
        "seconds": 0.0,
    }


def baseline_identity(identity: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
    """The identity of a baseline of a feature file's data: the data's fields, the baseline and ``extra``."""
    keep = ("format", "task", "task_options", "data", "limit", "splits")
    subset = {"subset": identity["subset"]} if "subset" in identity else {}
    return {**{k: identity[k] for k in keep}, **subset, "baseline": name, **extra}


def fit_baselines(
    identity: dict[str, Any],
    width: int,
    cfg: FitConfig,
    val: str | None,
    tests: list[str],
    *,
    data_dir: Path,
    loaded: tuple[Task, dict[str, SplitData]] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Every baseline of the data behind ``identity`` (module docstring), each written as a result with
    ``mode="baseline"`` under ``results/TASK/baseline-NAME/`` or read back when already written. ``loaded``:
    the task and its data when the caller has read and checked them already."""
    task, data = loaded or (
        make_task(identity["task"], dict(identity["task_options"]), identity["seed"]),
        None,
    )
    rules = task.baseline_rules()
    plan = [(rule, "rule", {}) for rule in ("majority", *rules)]
    # the heads' fits as they are since version 2 (scikit-learn's stopping, a single-row class kept in the fit
    # part), and random features with a bias: results of earlier fits are made again, not reused
    fitted = {"heads": HEADS_VERSION}
    tanh = {**fitted, "width": width, "seed": identity["seed"], "bias": "N(0, 1)"}
    plan += [("raw", cfg.head, fitted), (f"tanh-{width}", cfg.head, tanh)]
    raw = None
    out = []
    for baseline, head, extra in plan:
        described = {
            "task": identity["task"],
            "backbone": f"baseline-{baseline}",
            "mode": "baseline",
            "depth": None,
            "head": head,
            "trainable": [],
            "seed": cfg.seed,
            "identity": baseline_identity(identity, baseline, **extra),
            "machines": [machine.on("cpu")],
            "config": {"fit": {**cfg.to_json(), "features": None}},
            "extra": {"baseline": baseline},
        }
        keyed = {**described, "lr": None, "identity_hash": digest(described["identity"])}
        path = result_path({**keyed, "key": result_key(keyed)})
        kept = kept_result(path)
        if kept is not None:
            out.append({**kept, "path": str(path)})
            continue
        if data is None:
            data = load_data(task, identity, data_dir)
        if head == "rule":
            rule = rules.get(baseline, lambda d: np.zeros(len(d), np.int64))
            scores = rule_scores(
                {s: rule(d) for s, d in data.items()}, data, val, tests, cfg.val_fraction, cfg.seed
            )
        else:
            if raw is None:
                raw = {s: raw_inputs(task, d) for s, d in data.items()}
            X = raw if baseline == "raw" else tanh_features(raw, width, identity["seed"])
            train, test_rows, val_rows = _rows(X, data, val, tests)
            with noting_convergence(f"baseline {baseline}"):
                scores, _ = fit_probe(
                    head,
                    train,
                    test_rows,
                    val=val_rows,
                    val_fraction=cfg.val_fraction,
                    seed=cfg.seed,
                    memory_bytes=cfg.memory_mb * 2**20,
                )
        scores["test_split"] = tests[0]
        result = Result(**described, scores=scores, seconds=scores["seconds"]).to_json()
        result["path"] = str(write_result(result))
        out.append(result)
        log(
            f"baseline {display_name(baseline, scores.get('metric', 'accuracy'))} ({head}): {score_line(scores)}",
            progress,
        )
    return out


def display_name(baseline: str, metric: str) -> str:
    """A baseline as messages and tables name it: the majority rule of real-valued targets is the train mean."""
    from reservoir.probe.metrics import METRICS_BY_TARGET

    return "train mean" if baseline == "majority" and metric in METRICS_BY_TARGET["regression"] else baseline


def _rows(X: dict[str, np.ndarray], data: dict[str, SplitData], val: str | None, tests: list[str]):
    """The head's rows: one row per example, every output of a multi-output task beside the others."""

    def rows_of(split):
        y = data[split].labels
        return ArrayRows(X[split][:, None, :], y if y.ndim == 1 else y.reshape(len(y), 1, -1))

    return rows_of("train"), {t: rows_of(t) for t in tests}, (rows_of(val) if val else None)

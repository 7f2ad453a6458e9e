"""Fit a linear head per depth on a feature file and write one result per depth."""

from __future__ import annotations

import sys
from typing import Any

from reservoir import __version__
from reservoir.config import FitConfig, results_dir
from reservoir.heads import fit_depth
from reservoir.report import write_result
from reservoir.store import file_config, open_features, read_depth


def fit(cfg: FitConfig, *, progress: bool = True) -> list[dict[str, Any]]:
    """Fit ``cfg.head`` at each requested depth; returns the result dicts (also written as JSON).

    Regularisation is chosen on the file's ``val`` (or TAPE's ``valid``) split when it has one,
    else on a seeded ``val_fraction`` of train; the test accuracy is over the whole stored test
    split. A file with several test splits (``test`` and ``test_*``, e.g. TAPE's three holdouts)
    gets one result per depth whose ``test_accuracy`` is the first of them (``test_split``) and
    whose ``test_accuracies`` / ``n_tests`` hold every one.
    """
    results = []
    with open_features(cfg.features_path) as f:
        stored = [int(d) for d in f.attrs["depths"]]
        depths = stored if cfg.depth == "all" else _parse(cfg.depth, stored, f.filename)
        val, tests = split_roles(f)
        if "train" not in f or not tests:
            raise ValueError(f"{f.filename} has no {'train' if 'train' not in f else 'test'!r} split; "
                             "extract it with --split all")
        extract_cfg = file_config(f)
        for depth in depths:
            X_train, y_train = read_depth(f, "train", depth)
            X_val, y_val = read_depth(f, val, depth) if val else (None, None)
            per_test = {}
            for test in tests:  # same data and seed, so the same head; scored on each test split
                X_test, y_test = read_depth(f, test, depth)
                per_test[test] = fit_depth(cfg.head, X_train, y_train, X_test, y_test, X_val=X_val, y_val=y_val,
                                           val_fraction=cfg.val_fraction, seed=cfg.seed)
            scores = {**per_test[tests[0]], "test_split": tests[0],
                      "test_accuracies": {t: s["test_accuracy"] for t, s in per_test.items()},
                      "n_tests": {t: s["n_test"] for t, s in per_test.items()}}
            result = {
                "task": f.attrs["task"], "backbone": f.attrs["backbone"], "mode": "output-only", "depth": depth,
                "head": cfg.head, "trainable": ["out"], "seed": cfg.seed, "version": __version__,
                "config": {"fit": cfg.to_json(), "extract": extract_cfg}, **scores,
            }
            write_result(result, results_dir(cfg.task, cfg.backbone))
            results.append(result)
            if progress:
                more = "".join(f", {t} {100 * a:.1f}%" for t, a in list(scores["test_accuracies"].items())[1:])
                print(f"depth {depth}: {tests[0]} {100 * scores['test_accuracy']:.1f}%{more} "
                      f"(val {100 * scores['val_accuracy']:.1f}%, {scores['seconds']:.1f}s)", file=sys.stderr)
    return results


#: names of a validation split, in order of preference (TAPE calls it ``valid``)
VAL_SPLITS = ("val", "valid")


def split_roles(f) -> tuple[str | None, list[str]]:
    """The validation split (or None) and the test splits of a feature file, in the task's order."""
    order = file_config(f).get("splits") or sorted(k for k in f if k != "input_layer")
    val = next((s for s in VAL_SPLITS if s in f), None)
    return val, [s for s in order if s in f and (s == "test" or s.startswith("test_"))]


def _parse(text: str, stored: list[int], filename: str) -> list[int]:
    try:
        depths = [int(p) for p in text.split(",")]
    except ValueError:
        raise ValueError(f"depth {text!r} must be 'all' or comma-separated integers") from None
    missing = [d for d in depths if d not in stored]
    if missing:
        raise ValueError(f"depth {missing[0]} is not in {filename}; it holds depths {stored}")
    return depths

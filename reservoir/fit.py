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

    Regularisation is chosen on the file's ``val`` split when it has one, else on a seeded
    ``val_fraction`` of train; the test accuracy is over the whole stored test split.
    """
    results = []
    with open_features(cfg.features_path) as f:
        stored = [int(d) for d in f.attrs["depths"]]
        depths = stored if cfg.depth == "all" else _parse(cfg.depth, stored, f.filename)
        for split in ("train", "test"):
            if split not in f:
                raise ValueError(f"{f.filename} has no {split!r} split; extract it with --split all")
        has_val = "val" in f
        extract_cfg = file_config(f)
        for depth in depths:
            X_train, y_train = read_depth(f, "train", depth)
            X_test, y_test = read_depth(f, "test", depth)
            X_val, y_val = read_depth(f, "val", depth) if has_val else (None, None)
            scores = fit_depth(cfg.head, X_train, y_train, X_test, y_test, X_val=X_val, y_val=y_val,
                               val_fraction=cfg.val_fraction, seed=cfg.seed)
            result = {
                "task": f.attrs["task"], "backbone": f.attrs["backbone"], "mode": "output-only", "depth": depth,
                "head": cfg.head, "trainable": ["out"], "seed": cfg.seed, "version": __version__,
                "config": {"fit": cfg.to_json(), "extract": extract_cfg}, **scores,
            }
            write_result(result, results_dir(cfg.task, cfg.backbone))
            results.append(result)
            if progress:
                print(f"depth {depth}: test {100 * scores['test_accuracy']:.1f}% "
                      f"(val {100 * scores['val_accuracy']:.1f}%, {scores['seconds']:.1f}s)", file=sys.stderr)
    return results


def _parse(text: str, stored: list[int], filename: str) -> list[int]:
    try:
        depths = [int(p) for p in text.split(",")]
    except ValueError:
        raise ValueError(f"depth {text!r} must be 'all' or comma-separated integers") from None
    missing = [d for d in depths if d not in stored]
    if missing:
        raise ValueError(f"depth {missing[0]} is not in {filename}; it holds depths {stored}")
    return depths

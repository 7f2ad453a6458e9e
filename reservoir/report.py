"""Results: one JSON file per (task, backbone, mode, head, depth), and tables across them.

Schema (shared by ``fit`` and ``train``): task, backbone, mode (``output-only`` or
``end-to-end``), depth, head, trainable, test_accuracy, val_accuracy, n_train, n_val,
n_test, seconds, seed, config, version. Accuracies are fractions in [0, 1].
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from reservoir import __version__

REQUIRED = ("task", "backbone", "mode", "depth", "head", "trainable", "test_accuracy", "val_accuracy",
            "n_train", "n_val", "n_test", "seconds", "seed", "config", "version")


def result_name(result: dict[str, Any]) -> str:
    return f"{result['mode']}_{result['head']}_depth{result['depth']}.json"


def write_result(result: dict[str, Any], folder: Path) -> Path:
    """Write atomically (temp file + rename); returns the path."""
    result = {"version": __version__, **result}
    missing = [k for k in REQUIRED if k not in result]
    if missing:
        raise ValueError(f"result is missing fields {missing}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / result_name(result)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def load_results(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        p = Path(p)
        files = sorted(p.rglob("*.json")) if p.is_dir() else [p]
        for f in files:
            try:
                out.append(json.loads(f.read_text()))
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"cannot read result {f}: {e}") from None
    return out


def depth_table(results: list[dict[str, Any]]) -> str:
    """Markdown table: one row per (task, backbone, mode, head), one column per depth (test %)."""
    rows: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in results:
        rows[(r["task"], r["backbone"], r["mode"], r["head"])][int(r["depth"])] = r["test_accuracy"]
    depths = sorted({d for v in rows.values() for d in v})
    head = "| task | backbone | mode | head | " + " | ".join(f"d{d}" for d in depths) + " |"
    lines = [head, "|" + "---|" * (4 + len(depths))]
    for key in sorted(rows):
        cells = [f"{100 * rows[key][d]:.1f}" if d in rows[key] else "" for d in depths]
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)

"""Tables across results (:mod:`reservoir.results` owns the schema, the writer and the reader).

A row is one (task, backbone, mode, head, trainable groups, producing run): results of the
same features with several seeds share a row, shown as the mean (and spread) over seeds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from reservoir.results import load_results  # noqa: F401  (report's entry point reads through it)


def row_key(r: dict[str, Any]) -> tuple:
    return (r["task"], r["backbone"], r["mode"], r["head"], ",".join(r["trainable"]), r["identity_hash"][:6])


def cell(values: list[float]) -> str:
    mean = 100 * float(np.mean(values))
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {100 * float(np.std(values, ddof=1)):.1f} (n={len(values)})"


def depth_table(results: list[dict[str, Any]]) -> str:
    """Markdown: one row per (task, backbone, mode, head, trainable, run), one column per depth
    (test %, mean over seeds). ``run`` is the start of the producing identity's hash."""
    rows: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        rows[row_key(r)][int(r["depth"])].append(r["test_accuracy"])
    depths = sorted({d for v in rows.values() for d in v})
    head = "| task | backbone | mode | head | trainable | run | " + " | ".join(f"d{d}" for d in depths) + " |"
    lines = [head, "|" + "---|" * (6 + len(depths))]
    for key in sorted(rows):
        cells = [cell(rows[key][d]) if d in rows[key] else "" for d in depths]
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)

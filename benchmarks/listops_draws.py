"""ListOps generation: LRA's recursive generator against `reservoir.tasks.listops.draw_tree`, the same draws.

    .venv/bin/python benchmarks/listops_draws.py                 # 1,000 expressions of the default lengths, best of 3

Each repetition draws expressions of LRA's default shape (max_depth 10, max_args 10) from one seed and keeps
those of 500 to 2,000 tokens in their text form, as the task's generator does, first with LRA's own
``generate_tree`` and ``to_string`` (tuples, then recursive string concatenation), then with ``draw_tree``
(the text's pieces appended as drawn, joined once). Both runs must give the same texts; prints the seconds of
each (best of ``--reps``, alternating) and their ratio. A fresh process loading ``--task listops`` at its
defaults draws the 4,000 held-out validation and test expressions first (the train stream excludes them).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reservoir.tasks.listops import draw_tree  # noqa: E402
from tests.tasks.test_tasks import lra_generate_tree, lra_to_string  # noqa: E402  LRA's generator, the reference


def lra(n: int, seed: int) -> list[str]:
    rng, out = random.Random(seed), []
    while len(out) < n:
        tree, length = lra_generate_tree(rng, 1, 10, 10)
        if 500 < length < 2000:
            out.append(lra_to_string(tree))
    return out


def ours(n: int, seed: int) -> list[str]:
    rng, out = random.Random(seed), []
    while len(out) < n:
        pieces, length = draw_tree(rng, 10, 10)
        if 500 < length < 2000:
            out.append(" ".join(pieces))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000, help="expressions to keep per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    best = {"lra": float("inf"), "ours": float("inf")}
    texts = {}
    for _ in range(args.reps):
        for name, fn in (("lra", lra), ("ours", ours)):
            start = time.perf_counter()
            texts[name] = fn(args.n, args.seed)
            best[name] = min(best[name], time.perf_counter() - start)
    if texts["lra"] != texts["ours"]:
        sys.exit("the two generators gave different expressions")
    print(
        f"{args.n:,d} expressions (500 to 2,000 tokens), best of {args.reps}: LRA's generator {best['lra']:.2f} s, "
        f"draw_tree {best['ours']:.2f} s: {best['lra'] / best['ours']:.2f}x; the same texts"
    )


if __name__ == "__main__":
    main()

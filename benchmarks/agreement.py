"""Numerical agreement of two feature files of the same extraction (e.g. bf16 against float32).

    .venv/bin/python benchmarks/agreement.py BF16_FILE FLOAT32_FILE   # two `reservoir extract` outputs

Per depth and split: the norm-wise relative error of each example's feature vector,
``|a - b| / |b|`` with ``b`` the reference (second file), as its maximum and mean over the
examples, and the cosine similarity's minimum. Both files must hold the same rows (same
task, seed, limit and input layer). With ``--partial`` an unfinished run's ``FILE.partial``
may stand in for ``FILE``, and only rows written in both files are compared.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import h5py  # noqa: E402

from reservoir.extract.store import file_config, iter_depth, open_features, partial_path, stored_identity  # noqa: E402


def open_file(path: Path, partial: bool) -> h5py.File:
    if partial and not path.exists() and partial_path(path).exists():
        return h5py.File(partial_path(path), "r")
    return open_features(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("candidate", type=Path, help="feature file to check (e.g. bf16)")
    p.add_argument("reference", type=Path, help="reference feature file (e.g. float32)")
    p.add_argument(
        "--partial", action="store_true", help="accept unfinished runs; compare rows written in both"
    )
    args = p.parse_args(argv)
    print(f"$ {shlex.join([Path(sys.executable).name, *sys.argv])}")
    with open_file(args.candidate, args.partial) as fa, open_file(args.reference, args.partial) as fb:
        ca, cb = file_config(fa), file_config(fb)
        ia, ib = stored_identity(fa), stored_identity(fb)
        print(
            f"candidate: dtype {ia['dtype']}, compile {ca.get('compile')}; reference: dtype {ib['dtype']}, "
            f"compile {cb.get('compile')}"
        )
        for key in (
            "task",
            "task_options",
            "data",
            "seed",
            "input_scale",
            "backbone",
            "backbone_fingerprint",
        ):
            if ia.get(key) != ib.get(key):
                raise SystemExit(
                    f"the files differ in {key}; compare two extractions of the same rows through "
                    "the same backbone"
                )
        if not np.array_equal(fa["input_layer/weight"][:], fb["input_layer/weight"][:]):
            raise SystemExit(
                "the files hold different input layers; compare two extractions with the same seed"
            )
        depths = [int(d) for d in fa.attrs["depths"]]
        splits = [s for s in fa if s != "input_layer" and s in fb]
        print()
        print("| split | depth | rows | max rel. error | mean rel. error | min cosine |")
        print("|---|---|---|---|---|---|")
        for split in splits:
            rows = np.flatnonzero(fa[split]["done"][:] & fb[split]["done"][:])
            if not len(rows):
                continue
            for depth in depths:
                errs, coss = [], []
                for (a, _), (b, _) in zip(
                    iter_depth(fa, split, depth, select=rows), iter_depth(fb, split, depth, select=rows)
                ):
                    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
                    nb = np.maximum(np.linalg.norm(b, axis=1), 1e-12)
                    errs.append(np.linalg.norm(a - b, axis=1) / nb)
                    coss.append((a * b).sum(1) / (np.maximum(np.linalg.norm(a, axis=1), 1e-12) * nb))
                e, c = np.concatenate(errs), np.concatenate(coss)
                print(f"| {split} | {depth} | {len(e)} | {e.max():.2e} | {e.mean():.2e} | {c.min():.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

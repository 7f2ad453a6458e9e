"""Head fitting speed: logistic regression over every depth and the ridge head per depth, before and after.

    .venv/bin/python benchmarks/heads.py --ref 8e7ca17 --data-dir data
    .venv/bin/python benchmarks/heads.py --parts threads --data-dir data

Features are real MNIST images pushed through a seeded random ``tanh`` projection to 768
dimensions, one projection per depth (``(N, 1, 768)`` float32, what a feature file holds),
so the heads see data with class structure, not noise. Parts (``--parts``):

- ``logreg``: ``fit_depth("logreg")`` at each of ``--depths`` depths on ``--train`` training
  and ``--test`` test images: what ``reservoir fit --head logreg --depths all`` runs per depth,
  HDF5 reads aside.
- ``ridge``: ``fit_depth("ridge")`` on ``--ridge-train`` images at ``--ridge-depths`` depths
  (seconds per depth).
- ``threads``: one ``LogisticRegression`` fit (``C=0.1``, 4,500 x 768 standardized) and one
  ridge accumulation and decomposition (50,000 x 768) under BLAS/OpenMP limits "none" (the
  libraries' default) and 1: with no neighbour of ours, beside a busy process (a second Python
  doing a one-thread matrix product loop) in this session, and beside the same process
  started in a session of its own (``setsid``), as another user's job runs; repetitions
  interleaved.

With ``--ref GITREF`` the ``fit_depth`` of ``reservoir/heads.py`` at that revision is loaded
as a separate module and timed on the same data in the same run, alternating with the
current one depth by depth. Every timing also reports the cores that other processes used
meanwhile (``/proc/stat`` minus this process's CPU time): the machine may be shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np
import scipy
import sklearn
import threadpoolctl
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_info, threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.paths import default_data_dir  # noqa: E402
from reservoir.probe import heads  # noqa: E402
from reservoir.runtime.machine import describe, load  # noqa: E402
from reservoir.tasks import get_task  # noqa: E402

#: the neighbour: one thread multiplying matrices until stopped
BUSY = "import numpy as np\na = np.random.rand(1024, 1024)\nwhile True:\n    a @ a\n"
#: where the neighbour runs: not started, in this session, or in a session of its own like another user's job
#: (with the kernel's autogroup scheduling each session gets an equal share of the CPUs, whatever its threads)
NEIGHBOURS = ("none started", "busy process, same session", "busy process, own session")


def threads_line() -> str:
    libs = ", ".join(f"{lib['prefix']} ({lib['user_api']}) {lib['num_threads']}" for lib in threadpool_info())
    env = " ".join(
        f"{k}={os.environ[k]}"
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        if k in os.environ
    )
    return f"threads: {libs}; torch {torch.get_num_threads()}; env {env or 'unset'}"


def busy_jiffies() -> int:
    """Non-idle CPU time of the whole machine, in clock ticks (user, nice, system, irq, softirq)."""
    user, nice, system, _idle, _iowait, irq, softirq, *_ = map(
        int, Path("/proc/stat").read_text().split()[1:11]
    )
    return user + nice + system + irq + softirq


def timed(fn):
    """``(result, wall seconds, cores used by other processes meanwhile)``."""
    jiffies, cpu, start = busy_jiffies(), time.process_time(), time.perf_counter()
    result = fn()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    machine = (busy_jiffies() - jiffies) / os.sysconf("SC_CLK_TCK")
    return result, wall, max(machine - cpu, 0.0) / wall


def load_ref(ref: str) -> types.ModuleType:
    """``reservoir/heads.py`` of git revision ``ref`` as a module of its own (the working tree is untouched)."""
    source = subprocess.run(
        ["git", "show", f"{ref}:reservoir/heads.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    name = f"heads_at_{ref}"
    module = types.ModuleType(name)
    module.__file__ = f"{ref}:reservoir/heads.py"
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def features(images: np.ndarray, depth: int, dims: int = 768) -> np.ndarray:
    """``(N, 1, dims)`` float32: pixels through the seeded ``tanh`` projection of ``depth``."""
    rng = np.random.default_rng(depth)
    proj = rng.standard_normal((images[0].size, dims), dtype=np.float32) * np.float32(
        3 / np.sqrt(images[0].size)
    )
    bias = rng.standard_normal(dims, dtype=np.float32) * np.float32(0.5)
    out = np.empty((len(images), 1, dims), np.float32)
    for i in range(0, len(images), 10_000):
        x = images[i : i + 10_000].reshape(-1, images[0].size).astype(np.float32) / 255 - np.float32(0.13)
        out[i : i + 10_000, 0] = np.tanh(x @ proj + bias)
    return out


def compare(label: str, head: str, depths: list[int], data, versions: dict) -> dict:
    """Time ``fit_depth`` of every version at every depth, alternating which goes first;
    ``data(depth)`` gives ``(X_train, y_train, X_test, y_test)``."""
    rows = {name: [] for name in versions}
    for i, depth in enumerate(depths):
        X_train, y_train, X_test, y_test = data(depth)
        order = list(versions) if i % 2 == 0 else list(versions)[::-1]
        for name in order:
            res, wall, others = timed(
                lambda v=versions[name], d=(X_train, y_train, X_test, y_test): v.fit_depth(head, *d, seed=0)
            )
            rows[name].append((wall, others, res))
            print(
                f"# {label} depth {depth} {name}: {wall:.2f} s, {res['hyperparameters']}, "
                f"test {res['test_accuracy']:.4f}, other processes {others:.2f} cores",
                flush=True,
            )
    return rows


def part_threads(train_images, train_labels, reps: int) -> list[str]:
    """Thread limits against a busy neighbour: logreg (many small products) and ridge (one large)."""
    X = features(train_images[:4500], 0)[:, 0]
    Z = StandardScaler().fit_transform(X)
    big = features(train_images, 0)[:, 0]
    onehot = np.eye(10, dtype=np.uint8)[train_labels]

    def logreg():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            LogisticRegression(C=0.1, max_iter=300).fit(Z, train_labels[:4500])

    def ridge():
        heads.RidgeStats.zeros(big.shape[1], 10).add(big, onehot).decompose()

    works = {
        f"logreg fit, {len(Z):,} x {Z.shape[1]}": logreg,
        f"ridge stats + eigh, {len(big):,} x {big.shape[1]}": ridge,
    }
    results = {}
    for neighbour in NEIGHBOURS:
        proc = None
        if neighbour != NEIGHBOURS[0]:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            proc = subprocess.Popen(
                [sys.executable, "-c", BUSY], env=env, start_new_session="own" in neighbour
            )
            time.sleep(1.0)
        try:
            for _ in range(reps):
                for work, fn in works.items():
                    for limit in (None, 1):
                        with threadpool_limits(limits=limit):
                            _, wall, others = timed(fn)
                        results.setdefault((work, neighbour, limit), []).append((wall, others))
                        print(
                            f"# threads {work}, {neighbour}, limit {limit}: {wall:.2f} s, "
                            f"other processes {others:.2f} cores",
                            flush=True,
                        )
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait()
    lines = [
        "| work | neighbour we start | threads | seconds: median (min to max) | other processes (cores, median) |",
        "|---|---|---|---|---|",
    ]
    default = max(lib["num_threads"] for lib in threadpool_info())
    for (work, neighbour, limit), runs in results.items():
        walls = [w for w, _ in runs]
        lines.append(
            f"| {work} | {neighbour} | {f'{default} (default)' if limit is None else limit} | "
            f"{statistics.median(walls):.2f} ({min(walls):.2f} to {max(walls):.2f}) | "
            f"{statistics.median(o for _, o in runs):.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data-dir", type=Path, default=default_data_dir(), help="folder holding mnist/ [default: data]"
    )
    p.add_argument("--ref", default=None, help="git revision whose fit_depth is timed too (before/after)")
    p.add_argument("--parts", default="logreg,ridge", help="comma-separated: logreg, ridge, threads")
    p.add_argument("--depths", type=int, default=13, help="logreg depths (0..N-1)")
    p.add_argument("--train", type=int, default=5000)
    p.add_argument("--test", type=int, default=1000)
    p.add_argument("--ridge-train", type=int, default=50000)
    p.add_argument("--ridge-depths", type=int, default=3)
    p.add_argument("--reps", type=int, default=3, help="repetitions of each threads measurement")
    p.add_argument(
        "--features",
        type=Path,
        default=None,
        help="a feature file (`reservoir extract` output): the logreg part fits its depths (first --train "
        "train rows, first --test test rows) instead of projected pixels",
    )
    args = p.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := set(parts) - {"logreg", "ridge", "threads"}:
        p.error(f"unknown part {sorted(unknown)[0]!r}; choose from ['logreg', 'ridge', 'threads']")

    print(f"# benchmarks/heads.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# {describe()}")
    print(
        f"# torch {torch.__version__}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"scikit-learn {sklearn.__version__}, threadpoolctl {threadpoolctl.__version__}"
    )
    print(f"# {threads_line()}; fit_depth limits to heads.head_threads() = {heads.head_threads()}")
    print(f"# before: {load()}", flush=True)

    task = get_task("mnist")
    n_train = max(args.train, args.ridge_train)
    train, test = task.load("train", args.data_dir, n_train), task.load("test", args.data_dir, args.test)
    versions = {"after": heads}
    if args.ref:
        versions = {f"before ({args.ref})": load_ref(args.ref), "after": heads}
    table = []
    for head, label, n, depths in (
        ("logreg", "logreg", args.train, args.depths),
        ("ridge", "ridge", args.ridge_train, args.ridge_depths),
    ):
        if label not in parts:
            continue
        sub = dataclasses.replace(
            train, inputs=train.inputs[:n], labels=train.labels[:n], lengths=train.lengths[:n]
        )

        def projected(depth, sub=sub):
            return features(sub.inputs, depth), sub.labels, features(test.inputs, depth), test.labels

        def stored(depth, n=n):
            from reservoir.extract.store import open_features, read_depth

            with open_features(args.features) as f:
                X_train, y_train = read_depth(f, "train", depth)
                X_test, y_test = read_depth(f, "test", depth)
            return X_train[:n], y_train[:n], X_test[: args.test], y_test[: args.test]

        data = stored if (args.features and head == "logreg") else projected
        rows = compare(label, head, list(range(depths)), data, versions)
        table.append((head, n, depths, rows))

    if table:
        names = list(versions)
        print(
            f"\n| head | train x dims | depths | {' | '.join(f'{n} s' for n in names)} | "
            f"{'before / after | ' if args.ref else ''}same choice, max test diff | other processes (cores) |"
        )
        print("|---|---|---|" + "---|" * (len(names) + (3 if args.ref else 2)))
        for head, n, depths, rows in table:
            total = {name: sum(w for w, _, _ in rows[name]) for name in names}
            per = {name: statistics.median(w for w, _, _ in rows[name]) for name in names}
            shown = total if head == "logreg" else per
            cells = " | ".join(f"{shown[name]:.1f}" for name in names)
            ratio = f"{shown[names[0]] / shown[names[-1]]:.1f}x | " if args.ref else ""
            first, last = rows[names[0]], rows[names[-1]]
            same = all(a[2]["hyperparameters"] == b[2]["hyperparameters"] for a, b in zip(first, last))
            diff = max(abs(a[2]["test_accuracy"] - b[2]["test_accuracy"]) for a, b in zip(first, last))
            others = statistics.median(o for name in names for _, o, _ in rows[name])
            what = f"{depths} (total)" if head == "logreg" else f"{depths} (median per depth)"
            print(
                f"| {head} | {n:,} x 768 | {what} | {cells} | {ratio}{'yes' if same else 'no'}, "
                f"{100 * diff:.2f} pt | {others:.2f} |"
            )
    if "threads" in parts:
        print()
        print(
            "\n".join(
                part_threads(train.inputs[: args.ridge_train], train.labels[: args.ridge_train], args.reps)
            )
        )
    print(f"# after: {load()}")


if __name__ == "__main__":
    main()

"""Linear heads on cached features, with the scikit-learn estimator contract.

Labels are ``(n,)`` class ids or ``(n, m)`` for ``m`` outputs (bits) sharing one head; ``predict``
returns the same shape. :func:`fit_depth` standardizes, chooses the regularisation on a validation
split, refits on all of train and scores the test split, with BLAS and OpenMP limited to
:func:`head_threads` threads.

- ``logreg`` (:mod:`reservoir.probe.logistic`): multinomial logistic regression per output, by L-BFGS.
- ``ridge`` (:mod:`reservoir.probe.ridge`): closed-form ridge readout on one-hot targets.
- ``torch`` (:mod:`reservoir.probe.torch_head`): a linear layer trained with Adam, or LBFGS in memory.

A head registers itself (:func:`register_head`) with the grid it is searched over; rows come from
:mod:`reservoir.probe.rows` and fitted heads predict through :mod:`reservoir.probe.predictors`. Each
head has one implementation: ``fit(X, y)`` is ``fit_blocks`` on rows in memory.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from reservoir.probe.metrics import Metric, result_scores, target_kind
from reservoir.probe.metrics import scores as metric_scores
from reservoir.probe.predictors import pipeline_predictor
from reservoir.probe.rows import ArrayRows, Concat, Rows, stream_accuracy
from reservoir.registry import HEADS
from reservoir.tasks.sizes import holdout


def head_threads() -> int:
    """BLAS and OpenMP threads while a head fits: one, whatever the number of cores.

    :func:`fit_depth` holds this limit (threadpoolctl) for the whole fit of a depth; why one: see
    docs/benchmarks.md, section "Heads".

    Returns
    -------
    int
        The thread count, always 1.
    """
    return 1


@dataclass(frozen=True)
class HeadKind:
    """A registered head: its estimator, the hyperparameter searched on validation and its grid, how
    the grid is searched (``None``: :func:`search_refit`) and whether it fits real-valued targets."""

    estimator: Any
    param: str
    grid: tuple[float, ...]
    search: Callable[..., Search] | None = field(default=None, repr=False)
    regression: bool = False


def register_head(
    name: str,
    *,
    param: str,
    grid: tuple[float, ...],
    search: Callable[..., Search] | None = None,
    regression: bool = False,
):
    """Class decorator: register an estimator class (a ``predict_`` :class:`~reservoir.probe.predictors.Predictor`
    once fitted) as the head ``name``, searched over ``grid``; the class's first docstring line is its help."""

    def add(cls):
        kind = HeadKind(cls(), param, tuple(grid), search, regression)
        HEADS.register(name, kind, help=(cls.__doc__ or "").strip().splitlines()[0])
        return cls

    return add


def best_value(grid: tuple[float, ...], scores: dict[float, float], by: Metric | None = None) -> float:
    """The best-scoring value by metric ``by`` (default: accuracy); ties and NaN go to the first in the grid."""
    sign = 1.0 if by is None or by.greater_is_better else -1.0
    return max(grid, key=lambda v: (-np.inf if np.isnan(scores[v]) else sign * scores[v], -grid.index(v)))


#: what a grid search returns: validation accuracy per value, the best value, and the refitted
#: head's predictor ``X (n, d) -> (n, m)`` class ids, which scores every test split
Search = tuple[dict[float, float], float, Callable[[np.ndarray], np.ndarray]]


def _estimator(kind: HeadKind, value: float, seed: int, device: str):
    """The head's estimator at one grid value (seed and device set where it takes them)."""
    est = clone(kind.estimator).set_params(**{kind.param: value})
    if "seed" in est.get_params():
        est.set_params(seed=seed)
    if "device" in est.get_params():
        est.set_params(device=device)
    return est


def streams(kind: HeadKind, fit: Rows, val: Rows, *, refit_with_val: bool, memory_bytes: int | None) -> bool:
    """Whether :func:`search_refit` reads the training rows block by block (its head's ``fit_blocks``, another
    solver than the loaded rows' and so other scores): they hold more than ``memory_bytes`` of features."""
    train_bytes = fit.nbytes + (val.nbytes if refit_with_val else 0)
    return memory_bytes is not None and train_bytes > memory_bytes and hasattr(kind.estimator, "fit_blocks")


def search_refit(
    kind: HeadKind,
    fit: Rows,
    val: Rows,
    *,
    refit_with_val: bool,
    seed: int,
    device: str = "cpu",
    memory_bytes: int | None = None,
) -> Search:
    """Any head: fit it per grid value on ``fit``, score it on ``val``, refit the best on ``fit`` (+ ``val``
    when ``refit_with_val``). Training rows holding more than ``memory_bytes`` of features are read block
    by block (the head's ``fit_blocks``)."""
    streamed = streams(kind, fit, val, refit_with_val=refit_with_val, memory_bytes=memory_bytes)

    def trained(value: float, source: Rows) -> Callable[[np.ndarray], np.ndarray]:
        if streamed:
            return _estimator(kind, value, seed, device).fit_blocks(source).predict_
        model = make_pipeline(StandardScaler(), _estimator(kind, value, seed, device))
        return pipeline_predictor(model.fit(*source.load()))

    scores = {value: stream_accuracy(trained(value, fit), val) for value in kind.grid}
    best = best_value(kind.grid, scores)
    return scores, best, trained(best, Concat(fit, val) if refit_with_val else fit)


@contextlib.contextmanager
def noting_convergence(where: str) -> Iterator[None]:
    """Each head's :class:`~sklearn.exceptions.ConvergenceWarning` raised inside, said once on stderr as a note
    on ``where`` (a depth, a baseline) after it; other warnings pass on as they would have."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            yield
    finally:
        for w in caught:
            if not issubclass(w.category, ConvergenceWarning):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    said = dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning))
    if said:
        print(
            f"note: {where}: {'; '.join(said)}; its scores may move with more iterations (the Python API's "
            "LogRegHead(max_iter=...)), and --head ridge is solved in closed form",
            file=sys.stderr,
        )


def check_head_fits(head: str, labels: np.ndarray) -> None:
    """ValueError when ``labels`` are real values and ``head`` fits classes only, naming the heads that regress."""
    if target_kind(labels) == "regression" and not HEADS[head].regression:
        able = " or ".join(f"--head {n}" for n in HEADS.names() if HEADS[n].regression)
        raise ValueError(f"real-valued targets (regression); --head {head} fits classes: use {able}")


def evaluate(predict: Callable[[np.ndarray], np.ndarray], source: Rows) -> dict[str, float]:
    """Every metric of ``source``'s target kind of the predictions of ``predict``, made block by block."""
    preds, ys = [], []
    for X, y in source.blocks():
        pred = predict(X)
        preds.append(pred[:, 0] if (y.ndim == 1 and pred.ndim == 2) else pred)
        ys.append(y)
    return metric_scores(np.concatenate(preds), np.concatenate(ys), target_kind(source.labels))


def fit_depth(
    head: str,
    X_train,
    y_train,
    X_test,
    y_test,
    *,
    X_val=None,
    y_val=None,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """The scores of :func:`fit_probe` on arrays: ``X_*`` are ``(N, R, d)`` readout features."""
    return fit_probe(
        head,
        ArrayRows(X_train, y_train),
        {"test": ArrayRows(X_test, y_test)},
        val=None if X_val is None else ArrayRows(X_val, y_val),
        val_fraction=val_fraction,
        seed=seed,
    )[0]


def fit_probe(
    head: str,
    train: Rows,
    tests: dict[str, Rows],
    *,
    val: Rows | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    device: str = "cpu",
    memory_bytes: int | None = None,
) -> tuple[dict[str, Any], Callable[[np.ndarray], np.ndarray]]:
    """Choose the head's regularisation on validation, refit on all of train, score every test split with
    that one head (``test_accuracy`` and ``n_test`` are the first split's).

    Without an explicit ``val``, a seeded (stratified for single-label tasks) ``val_fraction`` of train
    is held out (``train`` must then offer ``take(index)``) and the refit uses train and validation; with
    one, the refit uses train. ``device`` is where the torch head trains. With ``memory_bytes``,
    training rows holding more features than that are never loaded at once (:func:`search_refit`).

    ``seeded`` in the scores says whether ``seed`` changed the fit (it draws the validation part, or the head
    takes it); a fit it did not change is the same at every seed.

    Returns the scores and the refitted head's predictor ``X (n, d) -> (n, m)``: for the registered heads
    a :class:`~reservoir.probe.predictors.Predictor`, whose state a saved probe keeps
    (:mod:`reservoir.probe.saved`).
    """
    kind = HEADS[head]  # UsageError naming the registered heads
    target = target_kind(train.labels)
    check_head_fits(head, train.labels)
    start = time.perf_counter()
    held_out = val is None
    if held_out:
        fit_index, val_index = holdout(train.labels, val_fraction, seed)
        fit, val = train.take(fit_index), train.take(val_index)
    else:
        fit = train
    with threadpool_limits(limits=head_threads()):
        scores, best, predict = (kind.search or search_refit)(
            kind, fit, val, refit_with_val=held_out, seed=seed, device=device, memory_bytes=memory_bytes
        )
        metrics = {name: evaluate(predict, test) for name, test in tests.items()}
    first = next(iter(tests))
    out = {
        **result_scores(target, scores[best], metrics),
        "n_train": train.n,
        "n_val": val.n,
        "n_test": tests[first].n,
        "n_tests": {k: t.n for k, t in tests.items()},
        "hyperparameters": {kind.param: best},
        "val_scores": {str(k): v for k, v in scores.items()},
        "seeded": held_out or "seed" in kind.estimator.get_params(),
        # streamed rows are fitted by another solver: a result of its own (results.result_key)
        "streamed": kind.search is None
        and streams(kind, fit, val, refit_with_val=held_out, memory_bytes=memory_bytes),
        "seconds": time.perf_counter() - start,
    }
    return out, predict

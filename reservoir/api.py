"""Python API: the CLI's ``extract`` and ``fit`` as functions, and a scikit-learn transformer.

>>> from reservoir import api
>>> path = api.extract("digits", "lstm", limit=100)                 # doctest: +SKIP
>>> results = api.fit(features=path, depths="all")                  # doctest: +SKIP
>>> X, y = api.read_features(path, "test", depth=2)                 # doctest: +SKIP

The transformer turns sequences into the readout features of a frozen backbone, so any
scikit-learn estimator can sit on top of it::

    from sklearn.pipeline import make_pipeline
    from sklearn.linear_model import LogisticRegression
    model = make_pipeline(ReservoirFeatures(backbone="gpt2-random", depth=6), LogisticRegression())
    cross_val_score(model, X, y, cv=5)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from reservoir.config import ExtractConfig, FitConfig, default, parse_input_scale, select_depths
from reservoir.errors import UsageError
from reservoir.tasks import TaskSpec, pad_ids

__all__ = ["ReservoirFeatures", "extract", "fit", "read_features"]


def _config(cls, task: Any, backbone: str, **settings: Any):
    if isinstance(task, cls):
        if settings:
            raise UsageError(f"give either a {cls.__name__} or settings, not both (got {sorted(settings)})")
        return task
    settings = {"task": task, "backbone": backbone, **settings}
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in settings if k not in names]
    if unknown:
        raise UsageError(f"unknown setting {unknown[0]!r}; choose from {sorted(names)}")
    return cls(**{k: v for k, v in settings.items() if v is not None})  # None: the config's default


def extract(task: str | ExtractConfig, backbone: str | None = None, *, progress: bool = False,
            **settings: Any) -> Path:
    """Stream a task through a frozen backbone into an HDF5 feature file; what ``reservoir extract`` runs.

    Parameters
    ----------
    task : a registered task name or ``"file:PATH"`` (or a whole ExtractConfig, then no settings).
    backbone : a registered backbone, a folder saved with ``save_pretrained``, or ``hf:ID``
        (``None``: the config's default, gpt2-random).
    progress : show progress on stderr.
    **settings : any field of :class:`reservoir.config.ExtractConfig` (``split``, ``limit``,
        ``seed``, ``batch_size``, ``dtype``, ``depths``, ``task_options``, ``data_dir``, ``out``, ...);
        an unknown name raises ValueError listing the valid ones.

    Returns
    -------
    The path of the complete feature file. Bad data raises :class:`reservoir.tasks.DataError`
    before any file is created.
    """
    from reservoir.extract.run import extract as run

    return run(_config(ExtractConfig, task=task, backbone=backbone, **settings), progress=progress)


def fit(task: str | FitConfig | None = None, backbone: str | None = None, *, progress: bool = False,
        **settings: Any) -> list[dict[str, Any]]:
    """Fit a linear head per depth on a feature file; what ``reservoir fit`` runs.

    Parameters
    ----------
    task, backbone : find the feature file extracted for them (or check that ``features``
        belongs to them); a whole FitConfig as ``task``, then no settings.
    progress : print one line per depth on stderr.
    **settings : any field of :class:`reservoir.config.FitConfig` (``features``, ``depths``,
        ``head``, ``val_fraction``, ``seed``, ...).

    Returns
    -------
    One result dict per depth (also written as JSON under ``results/TASK/BACKBONE/``, named by
    the features' identity, head, depth and seed), then one per baseline (``mode="baseline"``,
    under ``results/TASK/baseline-NAME/``) unless ``baselines=False``.
    """
    from reservoir.probe.fit import fit as run

    return run(_config(FitConfig, task=task, backbone=backbone, **settings), progress=progress)


def read_features(path: str | Path, split: str, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Features ``(N, n_readout * d_model)`` and labels of one depth of one split of a feature file."""
    from reservoir.extract.store import open_features, read_depth, verify

    with open_features(Path(path)) as f:
        if split in f:
            verify(f, [depth] if depth in [int(d) for d in f.attrs["depths"]] else [], [split])
        X, y = read_depth(f, split, depth)
    return X.reshape(len(X), -1), y


# -- the scikit-learn transformer -------------------------------------------------------------

_LOADED: dict[tuple[str, int], Any] = {}


def _backbone(name: str, seed: int):
    """Load once per (name, seed): every fold of a cross-validation shares the frozen model (a
    fresh copy, since the runner converts it to the compute dtype in place)."""
    import copy

    from reservoir.model.backbones import load_backbone

    key = (name, seed)
    if key not in _LOADED:
        if len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = load_backbone(name, seed)
    return copy.deepcopy(_LOADED[key])


def _sequences(X: Any) -> tuple[list[np.ndarray], str, int]:
    """Rows of ``X`` as per-example token arrays, the token kind and the token width (0 for ids)."""
    if isinstance(X, np.ndarray) and X.dtype != object:
        if X.ndim == 3 and X.dtype.kind == "f":
            return list(X), "dense", X.shape[2]
        if X.ndim == 2 and X.dtype.kind in "iu":
            return list(X), "ids", 0
        if X.ndim == 2 and X.dtype.kind == "f":
            return list(X[:, :, None]), "dense", 1
        raise UsageError(f"X must be (N, T, d) floats, (N, T) integer ids or (N, T) floats (one value a token); "
                         f"got {X.dtype} with shape {X.shape}")
    rows = [np.asarray(r) for r in X]
    if not rows:
        raise UsageError("X is empty; give at least one sequence")
    kinds = {("ids" if r.dtype.kind in "iu" else "dense") for r in rows}
    if len(kinds) > 1:
        raise UsageError("X mixes integer-id and float sequences; give one kind")
    if kinds == {"ids"}:
        return rows, "ids", 0
    rows = [r[:, None] if r.ndim == 1 else r for r in rows]
    widths = {r.shape[1] for r in rows}
    if len(widths) > 1 or any(r.ndim != 2 for r in rows):
        raise UsageError(f"float sequences must all be (T_i, d) with one d; got widths {sorted(widths)}")
    return rows, "dense", widths.pop()


class ReservoirFeatures(TransformerMixin, BaseEstimator):
    """Sequences -> readout features of a frozen backbone at one or more depths.

    ``fit`` learns nothing from the data: it only sizes the frozen, seeded input layer (token
    width, or the id vocabulary) and loads the backbone, so the transformer is safe inside a
    :class:`sklearn.pipeline.Pipeline` and cross-validation. The readout is the last real
    token of each sequence; features are those ``reservoir extract`` stores (a test checks it).

    Parameters
    ----------
    backbone : a registered backbone, a folder saved with ``save_pretrained``, or ``hf:ID``.
    depth : a depth (negative counts from the last block: ``-1``), a list of depths, ``"0,6"``
        or ``"all"`` (the same selection as ``reservoir extract --depths``). One depth gives
        ``(N, d_model)``; several give ``(N, n_depths * d_model)``, depth-major.
    seed : seeds the input layer and randomly initialised backbones.
    input_scale : the input layer's scale, as ``reservoir extract --input-scale``.
    device : where the backbone runs, as ``reservoir extract --device``.
    dtype : compute dtype, as ``reservoir extract --dtype`` (``"auto"``: bfloat16 where the CPU
        multiplies it natively, else float32; ``"int8"``, or ``"int8-static"`` calibrated on the
        first rows given to ``fit``); features are returned as float32.
    engine : ``"torch"``, ``"openvino"`` or ``"auto"`` (OpenVINO on the CPU when installed and the
        backbone converts), as ``reservoir extract --engine``.
    batch_size : sequences per forward pass (variable-length ones are bucketed by length).
    vocab_size : id vocabulary for integer input (None: largest id seen by ``fit`` + 1).

    Input ``X``: an array ``(N, T, d)`` of floats, ``(N, T)`` of integer ids, ``(N, T)`` of
    floats (one value a token), or a list of variable-length sequences (``(T_i,)`` ids or
    ``(T_i, d)`` floats).

    Examples
    --------
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.linear_model import LogisticRegression
    >>> model = make_pipeline(ReservoirFeatures(backbone="lstm", depth=2), LogisticRegression())
    >>> model.fit(X_train, y_train).score(X_test, y_test)           # doctest: +SKIP
    """

    def __init__(self, backbone: str = default(ExtractConfig, "backbone"), *, depth: int | Sequence[int] | str = -1,
                 seed: int = default(ExtractConfig, "seed"), input_scale: str = default(ExtractConfig, "input_scale"),
                 dtype: str = default(ExtractConfig, "dtype"), device: str = default(ExtractConfig, "device"),
                 batch_size: int = 32, vocab_size: int | None = None, engine: str = default(ExtractConfig, "engine")):
        self.backbone = backbone
        self.depth = depth
        self.seed = seed
        self.input_scale = input_scale
        self.dtype = dtype
        self.device = device
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self.engine = engine

    def fit(self, X: Any, y: Any = None) -> "ReservoirFeatures":
        from reservoir.runtime.engines import INT8_DTYPES, calibration_batches, calibration_rows
        from reservoir.model.devices import resolve_device
        from reservoir.model.reservoir import check_length
        from reservoir.runtime.runner import FeatureRunner, resolve_dtype

        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype, device)
        if not isinstance(self.batch_size, (int, np.integer)) or self.batch_size < 1:
            raise UsageError(f"The 'batch_size' parameter of ReservoirFeatures must be >= 1. Got {self.batch_size!r} instead.")
        rows, kind, width = _sequences(X)
        backbone = _backbone(self.backbone, self.seed)
        self.depths_ = select_depths(self.depth, range(backbone.n_layers + 1), f"in backbone {self.backbone}")
        vocab = 0
        if kind == "ids":
            vocab = self.vocab_size or int(max(r.max() for r in rows)) + 1
        self.spec_ = TaskSpec("sklearn", kind, seq_len=max(len(r) for r in rows), n_classes=1, token_dim=width,
                              vocab_size=vocab)
        check_length(self.spec_, backbone, self.backbone)
        calibration = None
        if dtype in INT8_DTYPES:
            first = rows[: calibration_rows(self.spec_.seq_len, len(rows))]
            calibration = lambda: [tokens for batch in calibration_batches(len(first))  # noqa: E731
                                   for _, tokens in self._batches([first[i] for i in batch], kind, width)]
        self.runner_ = FeatureRunner.build(self.spec_, backbone, self.depths_, seed=self.seed, dtype=dtype,
                                           input_scale=parse_input_scale(self.input_scale), device=device,
                                           engine=self.engine, calibration=calibration)
        self.n_features_out_ = len(self.depths_) * backbone.d_model
        return self

    def transform_depths(self, X: Any) -> np.ndarray:
        """Features ``(N, n_depths, d_model)``, one slice per depth in ``depths_``."""
        check_is_fitted(self, "runner_")
        rows, kind, width = _sequences(X)
        if kind != self.spec_.token_kind or width != self.spec_.token_dim:
            raise UsageError(f"X has {kind} tokens of width {width}, but this transformer was fitted on "
                             f"{self.spec_.token_kind} tokens of width {self.spec_.token_dim}")
        if kind == "ids":
            top = max(int(r.max()) for r in rows)
            if top >= self.spec_.vocab_size or min(int(r.min()) for r in rows) < 0:
                raise UsageError(f"token ids must lie in [0, {self.spec_.vocab_size}); got up to {top}. "
                                 "Set vocab_size to cover every id")
        if min(len(r) for r in rows) < 1:
            raise UsageError("every sequence needs at least one token")
        out = np.empty((len(rows), len(self.depths_), self.runner_.backbone.d_model), dtype=np.float32)
        for batch, (tokens, lengths) in self._batches(rows, kind, width):
            out[batch] = self.runner_(tokens, lengths)[:, :, -1]
        return out

    def _batches(self, rows: list[np.ndarray], kind: str, width: int):
        """``(row indices, (tokens, lengths))`` of each batch, bucketed by length, zero-padded."""
        from reservoir.extract.plan import plan_batches

        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        for batch in plan_batches(lengths, self.batch_size, bucket=True):
            seqs = [rows[i] for i in batch]
            if kind == "ids":
                tokens = pad_ids(seqs, 0)
            else:
                tokens = np.zeros((len(seqs), lengths[batch].max(), width), dtype=np.float32)
                for j, s in enumerate(seqs):
                    tokens[j, : len(s)] = s
            yield batch, (tokens, lengths[batch])

    def transform(self, X: Any) -> np.ndarray:
        """Features ``(N, n_depths * d_model)`` (depth-major)."""
        feats = self.transform_depths(X)
        return feats.reshape(len(feats), -1)

    def get_feature_names_out(self, input_features=None) -> np.ndarray:
        check_is_fitted(self, "runner_")
        d = self.runner_.backbone.d_model
        return np.array([f"depth{k}_{i}" for k in self.depths_ for i in range(d)], dtype=object)

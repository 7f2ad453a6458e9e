"""The scikit-learn transformer: sequences in, the readout features of a frozen backbone out, so any
scikit-learn estimator can sit on top of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from reservoir.config import (
    DEVICE,
    POSITIVE,
    SEED,
    ExtractConfig,
    parse_input_scale,
    select_depths,
)
from reservoir.errors import UsageError
from reservoir.settings import default, validate
from reservoir.tasks import TaskSpec, pad_ids


def _backbone_name(backbone: Any) -> Any:
    """A backbone as configs take it: a name as it is; a model object (a ``PreTrainedModel``, a reservoir
    ``Backbone``, any ``torch.nn.Module`` the generic adapter can map) by the name that stands for it in
    this process (:func:`reservoir.model.backbones.register_object`)."""
    if backbone is None or isinstance(backbone, str):
        return backbone
    from reservoir.model.backbones import register_object

    return register_object(backbone)


_LOADED: dict[tuple[Any, ...], Any] = {}


def _load_key(name: str, seed: int) -> tuple[Any, ...]:
    """What a loaded backbone stands for: its name and seed, and for a folder its absolute path and each
    file's size, times and inode, so a folder saved again (or the same name from another working
    folder) loads afresh."""
    from pathlib import Path

    from reservoir.model.backbones import parse_name

    parsed = parse_name(name)
    folder = Path(parsed.base)
    if parsed.source not in ("folder", "hub") or not folder.is_dir():
        return name, seed
    stats = [(str(p), p.stat()) for p in sorted(folder.rglob("*")) if p.is_file()]
    return (
        name,
        seed,
        str(folder.resolve()),
        *((f, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino) for f, s in stats),
    )


_WEIGHTS: dict[tuple[Any, ...], str] = {}


def _folder_weights(name: str, seed: int, backbone: Any) -> str | None:
    """The fingerprint of a backbone loaded from a folder (or the local hub cache), whose files can change under
    a fitted transformer's name, computed once per :func:`_load_key`; of a model object (which its caller can
    change in place), its registered name, whose digest is of its weights and hooks as they were when named
    (:func:`_backbone_name`); ``None`` for a name whose weights the name fixes."""
    from reservoir.model.backbones import fingerprint, parse_name

    source = parse_name(name).source
    if source == "object":
        return name
    if source not in ("folder", "hub"):
        return None
    key = _load_key(name, seed)
    if key not in _WEIGHTS:
        if len(_WEIGHTS) >= 8:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
        _WEIGHTS[key] = fingerprint(backbone)
    return _WEIGHTS[key]


def _backbone(name: str, seed: int):
    """Load once per backbone and seed (:func:`_load_key`): every fold of a cross-validation shares the frozen
    model (a fresh copy, since the runner converts it to the compute dtype in place)."""
    import copy

    from reservoir.model.backbones import load_backbone

    name = _backbone_name(name)
    key = _load_key(name, seed)
    if key not in _LOADED:
        if len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = load_backbone(name, seed)
    return copy.deepcopy(_LOADED[key])


def _sequences(X: Any) -> tuple[list[np.ndarray], str, int]:
    """Rows of ``X`` as per-example token arrays, the token kind and the token width (0 for ids); no rows,
    a row without tokens, and NaN or infinite values are refused, as ``extract`` refuses them in a file."""
    rows, kind, width = _rows(X)
    if not rows:
        raise UsageError("X is empty; give at least one sequence")
    empty = next((i for i, r in enumerate(rows) if len(r) == 0), None)
    if empty is not None:
        raise UsageError(f"sequence {empty} of X has no tokens; give every sequence at least one")
    if kind == "dense":
        bad = next((i for i, r in enumerate(rows) if not np.isfinite(r).all()), None)
        if bad is not None:
            raise UsageError(
                f"X holds NaN or infinite values (sequence {bad}); replace them before transforming"
            )
        top = float(np.finfo(np.float32).max)  # only wider floats can exceed it
        wide = (i for i, r in enumerate(rows) if r.dtype.itemsize > 4 and r.dtype.kind == "f")
        bad = next((i for i in wide if rows[i].size and np.abs(rows[i]).max() > top), None)
        if bad is not None:
            raise UsageError(
                f"X holds values beyond float32's range (sequence {bad}), which the backbone computes in; "
                "scale them down before transforming"
            )
    return rows, kind, width


def _check_ids(rows: list[np.ndarray], vocab: int) -> None:
    """Every id in ``[0, vocab)``, else a UsageError naming the id out of range and what to change."""
    from reservoir.tasks.labels import MAX_ID

    low, top = min(int(r.min()) for r in rows), max(int(r.max()) for r in rows)
    if low < 0:
        raise UsageError(f"token ids must be >= 0; got {low}. Map the ids to 0..V-1 first")
    if top > MAX_ID:  # the input layer holds a vector per id: a larger one would not fit in memory
        raise UsageError(f"token ids must be at most {MAX_ID:,d}; got {top:,d}. Map the ids to 0..V-1 first")
    if top >= vocab:
        raise UsageError(
            f"token ids must lie in [0, {vocab}); got up to {top}. Set vocab_size to cover every id"
        )


def _rows(X: Any) -> tuple[list[np.ndarray], str, int]:
    if isinstance(X, np.ndarray) and X.dtype != object:
        if X.ndim == 3 and X.dtype.kind == "f":
            return list(X), "dense", X.shape[2]
        if X.ndim == 2 and X.dtype.kind in "iu":
            return list(X), "ids", 0
        if X.ndim == 2 and X.dtype.kind == "f":
            return list(X[:, :, None]), "dense", 1
        raise UsageError(
            f"X must be (N, T, d) floats, (N, T) integer ids or (N, T) floats (one value a token); "
            f"got {X.dtype} with shape {X.shape}"
        )
    if hasattr(X, "to_numpy"):  # a pandas or polars frame: its rows
        return _rows(X.to_numpy())
    if isinstance(X, np.ndarray) and X.ndim > 1:  # an object array of one shape: its values, typed by numpy
        try:
            values = np.array(X.tolist())
        except (TypeError, ValueError):
            values = X
        if values.dtype == object:
            raise UsageError(
                f"X is an object array of shape {X.shape} whose values are not all numbers (missing values such "
                "as None or pandas' <NA>?); give numbers only"
            )
        return _rows(values)
    if not isinstance(X, np.ndarray) and hasattr(X, "__array__") and not hasattr(X, "__iter__"):
        return _rows(np.asarray(X))
    if hasattr(X, "tocsr"):
        raise UsageError("X is a sparse matrix; give dense sequences (X.toarray() for (N, T) values)")
    if not hasattr(X, "__iter__") or isinstance(X, (str, bytes, dict)):
        raise UsageError(
            f"X is a {type(X).__name__}; give sequences: an array (N, T, d) or (N, T), or a list of them"
        )
    rows = [np.asarray(r) for r in X]
    if not rows:
        return [], "dense", 0
    bad = next(
        (
            i
            for i, r in enumerate(rows)
            # integers are ids, one a token (an (N, T, d) integer array is refused the same way)
            if r.ndim not in (1, 2) or r.dtype.kind not in "iufb" or (r.ndim == 2 and r.dtype.kind in "iu")
        ),
        None,
    )
    if bad is not None:
        tokens = " (integer tokens of d values as floats: .astype('float32'))" if rows[bad].ndim == 2 else ""
        raise UsageError(
            f"sequence {bad} of X is {rows[bad].dtype} with shape {rows[bad].shape}; give each sequence as "
            f"(T_i,) integer ids or (T_i, d) floats{tokens}"
        )
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
    width, or the id vocabulary), notes whether every row has one length (a vision backbone's positions are then
    its patch grid resized to it) and loads the backbone, so the transformer is safe inside a
    ``sklearn.pipeline.Pipeline`` and cross-validation. The readout is the last real
    token of each sequence; features are those ``reservoir extract`` stores (a test checks it). A fitted
    transformer pickles (``joblib.dump``): its copy builds the same runner, of the settings and dtype ``fit`` read
    (``set_params`` takes effect at the next ``fit``), and refuses a folder backbone whose weights changed since.

    Input ``X``: an array ``(N, T, d)`` of floats, ``(N, T)`` of integer ids, ``(N, T)`` of
    floats (one value a token), or a list of variable-length sequences (``(T_i,)`` ids or
    ``(T_i, d)`` floats).

    Parameters
    ----------
    backbone : str or torch.nn.Module
        A registered backbone, a folder saved with ``save_pretrained``, ``hf:ID`` (``hf:ID@REVISION``),
        or a model object (used through a copy: the caller's model is never changed).
    depth : int, sequence of int or str
        A depth (negative counts from the last block: ``-1``), a list of depths, ``"0,6"`` or
        ``"all"`` (the same selection as ``reservoir extract --depths``). One depth gives
        ``(N, d_model)``; several give ``(N, n_depths * d_model)``, depth-major, each depth once in increasing
        order (``depths_``, as an extraction stores them).
    seed : int
        Seeds the input layer and randomly initialised backbones.
    input_scale : str
        The input layer's scale, as ``reservoir extract --input-scale``.
    dtype : str
        Compute dtype, as ``reservoir extract --dtype`` (``"auto"``: the float dtype this machine
        multiplies fastest; ``"int8"`` and ``"int8-static"``, each calibrated on the first rows given to
        ``fit``: both centre each projection's input by position means of those rows, and ``int8-static``
        takes its activation scales from them); features are returned as float32. In float32 a row's features do not depend on
        ``batch_size`` or its batch mates; in bfloat16 they agree to its precision (about 1%).
    device : str
        Where the backbone runs, as ``reservoir extract --device``.
    batch_size : int
        Sequences per forward pass (variable-length ones are bucketed by length).
    vocab_size : int, optional
        Id vocabulary for integer input (``None``: the largest id seen by ``fit`` + 1).
    engine : str
        ``"torch"``, ``"openvino"``, ``"onnxruntime"`` or ``"auto"``, as ``reservoir extract --engine``.

    Raises
    ------
    ValueError
        From ``fit``: a setting outside its range, input of another shape
        ([`UsageError`][reservoir.errors.UsageError]).
    BackboneError
        From ``fit`` and ``transform``: sequences longer than the backbone's positions
        ([`BackboneError`][reservoir.errors.BackboneError]).

    Examples
    --------
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.linear_model import LogisticRegression
    >>> model = make_pipeline(ReservoirFeatures(backbone="lstm", depth=2), LogisticRegression())
    >>> model.fit(X_train, y_train).score(X_test, y_test)           # doctest: +SKIP
    """

    parameter_constraints = {
        "seed": (SEED,),
        "device": (DEVICE,),
        "batch_size": (POSITIVE,),
        "vocab_size": (POSITIVE, None),
    }

    def __init__(
        self,
        backbone: str = default(ExtractConfig, "backbone"),
        *,
        depth: int | Sequence[int] | str = -1,
        seed: int = default(ExtractConfig, "seed"),
        input_scale: str = default(ExtractConfig, "input_scale"),
        dtype: str = default(ExtractConfig, "dtype"),
        device: str = default(ExtractConfig, "device"),
        batch_size: int = 32,
        vocab_size: int | None = None,
        engine: str = default(ExtractConfig, "engine"),
    ):
        self.backbone = backbone
        self.depth = depth
        self.seed = seed
        self.input_scale = input_scale
        self.dtype = dtype
        self.device = device
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self.engine = engine

    def fit(self, X: Any, y: Any = None) -> ReservoirFeatures:
        """Size the frozen input layer on ``X`` (token width, or id vocabulary) and load the backbone.

        Parameters
        ----------
        X : array or list of arrays
            Sequences (the class's input forms); only their shape and ids are read.
        y : ignored
            Present for the scikit-learn API.

        Returns
        -------
        ReservoirFeatures
            ``self``, fitted (``runner_``, ``depths_``).
        """
        before = {k: self.__dict__[k] for k in self.FITTED if k in self.__dict__}
        try:
            return self._fit(X)
        except BaseException:  # a fit that fails leaves the estimator as it was, never half refitted
            for k in self.FITTED:
                self.__dict__.pop(k, None)
            self.__dict__.update(before)
            raise

    #: the attributes a fit sets, together or not at all
    FITTED = (
        "dtype_",
        "depths_",
        "spec_",
        "calibration_rows_",
        "centre_dtype_",
        "settings_",
        "runner_",
        "n_features_out_",
    )

    def _fit(self, X: Any) -> ReservoirFeatures:
        from reservoir.model.devices import resolve_device
        from reservoir.model.reservoir import check_length
        from reservoir.runtime.engines import INT8_DTYPES, calibration_dtype, calibration_rows
        from reservoir.runtime.runner import resolve_dtype

        validate(self, "ReservoirFeatures")
        if not isinstance(self.backbone, str) and not hasattr(self.backbone, "state_dict"):
            raise UsageError(
                f"The 'backbone' parameter of ReservoirFeatures must be a name, a folder, hf:ID or a model object. "
                f"Got {self.backbone!r} instead."
            )
        self.dtype_ = resolve_dtype(self.dtype, resolve_device(self.device), self.engine)
        rows, kind, width = _sequences(X)
        name = _backbone_name(self.backbone)  # a model object named (its weights hashed) once
        backbone = _backbone(name, int(self.seed))
        self.depths_ = select_depths(self.depth, range(backbone.n_layers + 1), f"in backbone {name}")
        vocab = 0
        if kind == "ids":
            vocab = self.vocab_size or int(max(r.max() for r in rows)) + 1
            _check_ids(rows, vocab)
        elif self.vocab_size is not None:
            raise UsageError(
                f"vocab_size={self.vocab_size} sizes a vocabulary of integer token ids, and X holds real-valued "
                "tokens: it would change nothing; leave vocab_size out"
            )
        self.spec_ = TaskSpec(
            "sklearn",
            kind,
            seq_len=max(len(r) for r in rows),
            n_classes=1,
            token_dim=width,
            vocab_size=vocab,
            variable_length=len({len(r) for r in rows}) > 1,
        )
        check_length(self.spec_, backbone, name)
        # the int8 dtypes: the rows that calibrate the quantization and the dtype their centring computes in
        # (kept, so a copy builds the same runner)
        int8 = self.dtype_ in INT8_DTYPES
        self.calibration_rows_ = rows[: calibration_rows(self.spec_.seq_len, len(rows))] if int8 else None
        self.centre_dtype_ = calibration_dtype() if int8 else None
        # the settings the runner is built of, as fit read them: a copy (pickle, deepcopy) builds the same runner
        # after set_params, and refuses a folder that holds other weights by then
        self.settings_ = {
            **self._settings(),
            "weights": _folder_weights(name, int(self.seed), backbone),
        }
        self.runner_ = self._runner(backbone)
        self.n_features_out_ = len(self.depths_) * backbone.d_model
        return self

    def _settings(self) -> dict[str, Any]:
        """The settings a runner is built of, as they are now."""
        return {
            "backbone": self.backbone,
            "seed": int(self.seed),
            "input_scale": self.input_scale,
            "device": self.device,
            "engine": self.engine,
        }

    def _runner(self, backbone: Any = None) -> Any:
        """The feature runner of the fitted settings (``backbone`` loaded again when not given)."""
        from reservoir.model.devices import resolve_device
        from reservoir.runtime.engines import calibration_batches
        from reservoir.runtime.runner import FeatureRunner

        first, calibration = self.calibration_rows_, None
        if first is not None:

            def calibration():
                return [
                    tokens
                    for batch in calibration_batches(len(first))
                    for _, tokens in self._batches(
                        [first[i] for i in batch], self.spec_.token_kind, self.spec_.token_dim
                    )
                ]

        fitted = getattr(self, "settings_", None) or self._settings()
        if backbone is None:
            name = _backbone_name(fitted["backbone"])
            backbone = _backbone(name, fitted["seed"])
            weights = fitted.get("weights")
            if weights is not None and _folder_weights(name, fitted["seed"], backbone) != weights:
                what = (
                    f"the folder {fitted['backbone']} holds"
                    if isinstance(fitted["backbone"], str)
                    else f"the model object ({type(fitted['backbone']).__name__}) holds"
                )
                raise UsageError(
                    f"{what} other weights (or hooks) than it did when this ReservoirFeatures was fitted, so its "
                    "features would differ: restore those weights, or fit the transformer again"
                )
        return FeatureRunner.build(
            self.spec_,
            backbone,
            self.depths_,
            seed=fitted["seed"],
            dtype=self.dtype_,
            input_scale=parse_input_scale(fitted["input_scale"]),
            device=resolve_device(fitted["device"]),
            engine=fitted["engine"],
            calibration=calibration,
            centre_dtype=self.centre_dtype_,
        )

    def __getstate__(self) -> dict[str, Any]:
        """The settings and fitted attributes without the runner (its engine holds locks and compiled
        graphs): an unpickled transformer builds its runner again from the settings ``fit`` read and its dtype,
        and refuses a folder backbone whose weights changed since."""
        state = self.__dict__.copy()
        state.pop("runner_", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "spec_" in state:
            self.runner_ = self._runner()

    def transform_depths(self, X: Any) -> np.ndarray:
        """Features ``(N, n_depths, d_model)``, one slice per depth in ``depths_``; sequences longer than the
        backbone's positions are refused, as ``fit`` refuses them, before the backbone runs."""
        from reservoir.model.reservoir import check_length

        check_is_fitted(self, "runner_")
        rows, kind, width = _sequences(X)
        if kind != self.spec_.token_kind or width != self.spec_.token_dim:
            raise UsageError(
                f"X has {kind} tokens of width {width}, but this transformer was fitted on "
                f"{self.spec_.token_kind} tokens of width {self.spec_.token_dim}"
            )
        if kind == "ids":
            _check_ids(rows, self.spec_.vocab_size)
        if min(len(r) for r in rows) < 1:
            raise UsageError("every sequence needs at least one token")
        longest = max(len(r) for r in rows)
        if longest > self.spec_.seq_len:
            check_length(
                dataclasses.replace(self.spec_, seq_len=longest),
                self.runner_.backbone,
                _backbone_name(self.backbone),
            )
        out = np.empty((len(rows), len(self.depths_), self.runner_.backbone.d_model), dtype=np.float32)
        for batch, (tokens, lengths) in self._batches(rows, kind, width):
            out[batch] = self.runner_(tokens, lengths)[:, :, -1]
        bad = np.flatnonzero(~np.isfinite(out).reshape(len(out), -1).all(1))
        if len(bad):
            raise UsageError(
                f"the backbone produced NaN or inf features for sequence {bad[0]} of X in {self.dtype_}: check the "
                "scale of the input values and input_scale"
                + ("" if self.dtype_ == "float32" else ", or try dtype='float32'")
            )
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
        """Output feature names ``depth{k}_{i}``, depth-major as
        [`transform`][reservoir.api.ReservoirFeatures.transform] lays them out."""
        check_is_fitted(self, "runner_")
        d = self.runner_.backbone.d_model
        return np.array([f"depth{k}_{i}" for k in self.depths_ for i in range(d)], dtype=object)

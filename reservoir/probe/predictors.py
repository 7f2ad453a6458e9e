"""Fitted state: a head's predictor as arrays and numbers, so a saved probe predicts as the fit did.

Each head's predictor (in the head's module) registers by its ``kind`` and rebuilds itself from its state
(``from_state``); :func:`predictor_from_state` finds it by the kind the state records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted

from reservoir.probe.rows import _outputs, check_finite
from reservoir.registry import HEADS

#: ``n_classes`` of a head whose outputs are real values (float targets: ridge regression)
REGRESSION = 0


def predict_ids(scores: np.ndarray, m: int, k: int, y_ndim: int = 2) -> np.ndarray:
    """Scores ``(n, m * k)`` -> class ids ``(n, m)`` (``(n,)`` for ``y_ndim == 1``): the argmax per output,
    or the sign of one logit when ``k == 1``; for ``k`` :data:`REGRESSION` the scores themselves."""
    if k == REGRESSION:
        pred = scores.reshape(len(scores), m)
        return pred[:, 0] if y_ndim == 1 else pred
    z = scores.reshape(len(scores), m, k)
    pred = (z[:, :, 0] > 0).astype(np.int64) if k == 1 else z.argmax(-1)
    return pred[:, 0] if y_ndim == 1 else pred


def array(arrays: dict[str, np.ndarray], name: str, ndim: int, shape: tuple | None = None) -> np.ndarray:
    if name not in arrays:
        raise ValueError(f"the probe's state lacks the array {name!r}")
    a = np.asarray(arrays[name])
    if a.ndim != ndim or a.dtype.kind != "f" or (shape is not None and a.shape != shape):
        raise ValueError(
            f"the probe's array {name!r} is {a.dtype} {a.shape}, expected {ndim}-D floats"
            f"{f' of shape {shape}' if shape else ''}"
        )
    return a


class Predictor:
    """What a fitted head predicts with: ``X (n, d) -> (n, m)`` class ids, and its state.

    :meth:`state` gives the numbers (``meta``, JSON) and arrays that :func:`predictor_from_state` turns
    back into a predictor computing the same operations in the same dtypes, so its predictions equal the
    fit's. ``n_outputs`` (``m``) and ``n_classes`` (per output) describe its labels.

    Examples
    --------
    >>> meta, arrays = predictor.state()                            # doctest: +SKIP
    >>> again = predictor_from_state(meta, arrays)                  # doctest: +SKIP
    >>> (again(X) == predictor(X)).all()                            # doctest: +SKIP
    True
    """

    #: the name its state records; every subclass with one is found by it (:func:`predictor_from_state`)
    kind = ""
    #: the fewest classes per output its state may record (:data:`REGRESSION` for a head that regresses)
    min_classes = 1
    kinds: ClassVar[dict[str, type[Predictor]]] = {}
    n_outputs: int
    n_classes: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            Predictor.kinds[cls.kind] = cls

    def __call__(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def from_state(
        cls, meta: dict[str, Any], arrays: dict[str, np.ndarray], m: int, c: int
    ) -> Predictor:  # pragma: no cover - abstract
        """The predictor of this kind that ``meta`` and ``arrays`` describe; ValueError when malformed."""
        raise NotImplementedError


class PredictsThrough:
    """A head's ``predict`` through the predictor it fitted (``predict_``), one output's ids as ``(n,)``."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "predict_")
        check_finite(X)
        pred = self.predict_(X)
        return pred[:, 0] if self.y_ndim_ == 1 else pred


class ScaledPredictor(Predictor):
    """A fitted ``StandardScaler`` before an inner predictor."""

    kind = "standardized"

    def __init__(self, scaler: StandardScaler, inner: Predictor):
        self.scaler, self.inner = scaler, inner
        self.n_outputs, self.n_classes = inner.n_outputs, inner.n_classes

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return self.inner(self.scaler.transform(X))

    def state(self):
        meta, arrays = self.inner.state()
        s = self.scaler
        return (
            {
                "kind": self.kind,
                "n_outputs": self.n_outputs,
                "n_classes": self.n_classes,
                "inner": meta,
                "n_samples_seen": int(s.n_samples_seen_),
            },
            {
                "scaler.mean": s.mean_,
                "scaler.scale": s.scale_,
                "scaler.var": s.var_,
                **{f"inner.{k}": v for k, v in arrays.items()},
            },
        )

    @classmethod
    def from_state(cls, meta, arrays, m, c):
        inner = predictor_from_state(
            meta.get("inner") or {}, {k[6:]: v for k, v in arrays.items() if k.startswith("inner.")}
        )
        mean = array(arrays, "scaler.mean", 1)
        scaler = StandardScaler()
        scaler.mean_, scaler.scale_ = mean, array(arrays, "scaler.scale", 1, mean.shape)
        scaler.var_ = array(arrays, "scaler.var", 1, mean.shape)
        scaler.n_features_in_, scaler.n_samples_seen_ = len(mean), int(meta.get("n_samples_seen", 0))
        return cls(scaler, inner)


def pipeline_predictor(model) -> Callable[[np.ndarray], np.ndarray]:
    """The predictor of a fitted ``StandardScaler`` + head pipeline: a :class:`ScaledPredictor` where it can
    be, else ``model.predict``."""
    scaler, est = model[0], model[-1]
    inner = getattr(est, "predict_", None)
    if isinstance(scaler, StandardScaler) and isinstance(inner, Predictor):
        return ScaledPredictor(scaler, inner)
    return lambda X: _outputs(model.predict(X))


def predictor_from_state(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Predictor:
    """The predictor :meth:`Predictor.state` describes, by its kind's ``from_state``."""
    HEADS.names()  # every head's module, and so its predictor, registered
    kind = meta.get("kind")
    if kind not in Predictor.kinds:
        raise ValueError(f"unknown predictor kind {kind!r}; choose from {', '.join(sorted(Predictor.kinds))}")
    found = Predictor.kinds[kind]
    try:
        m, c = int(meta["n_outputs"]), int(meta["n_classes"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("the probe's state lacks n_outputs and n_classes") from None
    if m < 1 or c < found.min_classes:
        raise ValueError(f"the probe's state has {m} outputs of {c} classes")
    return found.from_state(meta, arrays, m, c)

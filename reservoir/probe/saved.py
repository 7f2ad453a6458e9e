"""Saved probes: the head a fit chose, kept beside its result and applied again to features.

Every depth a ``fit`` scores writes, beside its result ``RESULT.json``, the fitted head as
``RESULT.probe.npz``: numeric arrays and one JSON text, read back with ``allow_pickle=False``. It holds
the head's state as arrays (:class:`reservoir.probe.predictors.Predictor`: weights, intercept and the
standardisation its fit applied) and ``meta``: the head, depth, regularisation chosen, classes (and
``class_names``) and label shape, feature shape, seed, the feature file's identity and its hash, a digest
of its frozen input layer, its ``tokens``, its data's ``row_tokens`` (tokens a row, for data whose rows all
have one length: images of one size, fixed windows; ``None`` for rows of their own lengths), how its
``extraction`` named the backbone, and the test scores.

Applied to a feature file (:func:`predict_file`), it computes the fit's operations in the fit's dtypes,
block by block as the fit scored its test split, so the fit's file gives the fit's predictions. A file of
other extraction settings, depth, feature or label shape, or classes is refused, naming each difference;
its task may differ. New data goes through the probe's extraction and the probe in
:mod:`reservoir.probe.apply`.

>>> probe = load_probe("results/digits/lstm/output-only_logreg_depth2_seed0_KEY.probe.npz")  # doctest: +SKIP
>>> predictions, labels, names = predict_file(probe, "features/digits/lstm/FILE.h5", "test")          # doctest: +SKIP
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from reservoir import __version__
from reservoir.errors import DataError, IdentityError, UsageError
from reservoir.extract.store import (
    class_names,
    feature_splits,
    file_config,
    iter_depth,
    name_of,
    open_features,
    stored_identity,
    verify,
)
from reservoir.extract.stored import store_of
from reservoir.identity import array_digest, short
from reservoir.paths import FILE_TASK, file_task_path
from reservoir.probe.heads import head_threads
from reservoir.probe.predictors import REGRESSION, Predictor, predictor_from_state
from reservoir.probe.rows import check_finite, rows

#: version of the saved-probe layout
PROBE_FORMAT = 1
#: the ``kind`` a saved probe's metadata names
PROBE_KIND = "reservoir-probe"
#: the feature identity fields a probe's features and the features it is applied to must share
SAME_EXTRACTION = (
    "format",
    "backbone",
    "backbone_fingerprint",
    "seed",
    "input_scale",
    "dtype",
    "readout",
    "calibration",
)
#: what to do with a file that is not a saved probe
FIX_PROBE = "pass the RESULT.probe.npz that `reservoir fit` wrote beside a result (rerun the fit to write it)"


def probe_path(result_path: str | Path) -> Path:
    """Where the probe of the result at ``result_path`` lies: ``RESULT.json`` -> ``RESULT.probe.npz``."""
    return Path(result_path).with_suffix(".probe.npz")


def input_layer_digest(f: h5py.File | dict[str, Any]) -> str:
    """SHA-256 of a feature file's frozen input layer (every tensor, by name); or of the tensors of one
    (``{name: array}``, as :func:`reservoir.model.input_layer.input_layer_tensors` gives them)."""
    g = f["input_layer"] if isinstance(f, h5py.File) else f
    return array_digest(*[np.asarray(g[name]) for name in sorted(g)], np.array(sorted(g)))


def token_layout(tensors: Any) -> dict[str, Any]:
    """The tokens an input layer reads, from its tensors: ``{"kind": "ids", "vocab_size": V}`` or
    ``{"kind": "dense", "width": k}``."""
    weight = tuple(tensors["weight"].shape)
    if "bias" in tensors:
        return {"kind": "dense", "width": int(weight[1])}
    return {"kind": "ids", "vocab_size": int(weight[0])}


@dataclass
class SavedProbe:
    """A probe read back: its ``meta`` (module docstring) and the predictor its arrays rebuild.

    Examples
    --------
    >>> probe = load_probe("RESULT.probe.npz")                      # doctest: +SKIP
    >>> probe.depth, probe.head, probe.hyperparameters               # doctest: +SKIP
    (2, 'logreg', {'C': 0.1})
    >>> probe.predict(X)            # X (N, n_readout, d_model) features of depth 2  # doctest: +SKIP
    """

    path: Path
    meta: dict[str, Any]
    predictor: Predictor

    @property
    def depth(self) -> int:
        return int(self.meta["depth"])

    @property
    def head(self) -> str:
        return str(self.meta["head"])

    @property
    def hyperparameters(self) -> dict[str, float]:
        return dict(self.meta["hyperparameters"])

    @property
    def identity(self) -> dict[str, Any]:
        return dict(self.meta["identity"])

    @property
    def label_shape(self) -> tuple[int, ...]:
        return tuple(self.meta["label_shape"])

    @property
    def class_names(self) -> list[str] | None:
        """The name of each class id the probe predicts, where its training data named them; else ``None``."""
        names = self.meta.get("class_names")
        return [str(n) for n in names] if names else None

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class ids ``(N, *label_shape)`` of features ``(N, n_readout, d_model)`` of the probe's depth, or
        ``(N, n_readout * d_model)``, the readout tokens side by side as ``api.read_features(path, split,
        depth=K)`` returns them."""
        from threadpoolctl import threadpool_limits

        X = np.asarray(X)
        r, d = self.meta["n_readout"], self.meta["d_model"]
        if X.ndim == 2 and X.shape[1] == r * d:  # read_features' single-depth form
            X = X.reshape(len(X), r, d)
        if X.ndim != 3 or X.shape[1:] != (r, d):
            raise UsageError(
                f"features must be (N, {r}, {d}) (N rows of {r} readout token(s) of width {d}) or "
                f"(N, {r * d}) for the probe {self.path}; got {X.shape}. Read them with "
                f"api.read_features(path, split, depth={self.depth})"
            )
        check_finite(X)
        with threadpool_limits(limits=head_threads()):
            pred = self.predictor(X.reshape(len(X) * r, d))
        return pred.reshape(len(X), *self.label_shape)


def row_tokens(f: h5py.File) -> int | None:
    """Tokens a row of a feature file's data, where every row of every split has the same number (data of a
    fixed row length: images of one size, fixed windows); ``None`` for rows of their own lengths."""
    lengths = {int(n) for split in feature_splits(f) for n in np.unique(f[split]["lengths"][:])}
    return lengths.pop() if len(lengths) == 1 else None


def padded_width(f: h5py.File, config: dict[str, Any]) -> int | None:
    """The length a feature file's rows were padded to for the padded readout (where its ``config`` does not
    record it, its longest row); ``None`` for other readouts."""
    if stored_identity(f).get("readout") != "padded":
        return None
    recorded = config.get("padded_width")
    return int(recorded or max(int(np.max(f[s]["lengths"][:], initial=0)) for s in feature_splits(f)))


def file_meta(f: h5py.File) -> dict[str, Any]:
    """What a probe records of its feature file ``f``, the same for every depth fitted on it: class names, label
    and feature shapes, the input layer's digest and tokens, the rows' length and how the backbone was named."""
    train, config = f["train"], file_config(f)
    return {
        "class_names": class_names(f),
        "label_shape": list(train["labels"].shape[1:]),
        "n_readout": int(train["features"].shape[2]),
        "d_model": int(train["features"].shape[3]),
        "input_layer": input_layer_digest(f),
        "tokens": token_layout(f["input_layer"]),
        "row_tokens": row_tokens(f),
        "image_shape": config.get("image_shape"),
        "extraction": {k: config.get(k) for k in ("backbone", "load_dtype", "engine_used")},
        "padded_width": padded_width(f, config),
    }


def save_probe(
    path: str | Path,
    predictor: Predictor,
    f: h5py.File,
    result: dict[str, Any],
    of_file: dict[str, Any] | None = None,
) -> Path:
    """Write the probe of ``result`` (one depth's fit on the feature file ``f``; its head, depth, seed,
    chosen regularisation, identity and test accuracies) to ``path`` atomically; returns ``path``. ``of_file``:
    :func:`file_meta` of ``f``, read once for every depth of a fit (read here when not given)."""
    from reservoir.results import atomic_write

    meta_state, arrays = predictor.state()
    meta = {
        "kind": PROBE_KIND,
        "format": PROBE_FORMAT,
        "version": __version__,
        "head": result["head"],
        "depth": int(result["depth"]),
        "seed": result["seed"],
        "hyperparameters": result["hyperparameters"],
        "n_outputs": predictor.n_outputs,
        "n_classes": predictor.n_classes,
        "classes": list(range(predictor.n_classes)),
        "task": result["task"],
        "backbone": result["backbone"],
        "identity": result["identity"],
        "identity_hash": str(result["identity_hash"]),
        **(of_file or file_meta(f)),
        "test_split": result.get("test_split"),
        "test_accuracies": result.get("test_accuracies"),
        "metric": result.get("metric", "accuracy"),
        "test_scores": result.get("test_scores", result.get("test_accuracies")),
        "predictor": meta_state,
    }
    bad = [k for k, v in arrays.items() if np.asarray(v).dtype.kind not in "fiub"]
    if bad:  # an internal invariant: the state is numbers only
        raise ValueError(f"probe arrays {bad} are not numeric")
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    text = np.array(json.dumps(meta, sort_keys=True, default=str))
    return atomic_write(Path(path), lambda out: np.savez(out, meta=text, **arrays))


#: what a file is, by its first bytes (:func:`file_kind`)
MAGIC = {
    b"PAR1": "a Parquet file",
    b"\x89HDF": "an HDF5 file (a feature file? pass it as --features)",
    b"ARROW1": "an Arrow file",
    b"\x93NUMPY": "a single .npy array",
    b"\x89PNG": "a PNG image",
    b"\x80": "a Python pickle (never unpickled here)",
}


def file_kind(path: Path) -> str:
    """What ``path`` holds, in words, by its first bytes (for a message about a file of the wrong kind)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return "an unreadable file"
    kind = next((what for magic, what in MAGIC.items() if head.startswith(magic)), None)
    if kind:
        return kind
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON (a result? its probe lies beside it)"
    return "an empty file" if not head else "another kind of file"


def load_probe(path: str | Path) -> SavedProbe:
    """Read a probe written by ``fit`` (``allow_pickle=False``: numeric arrays and JSON only); DataError
    naming the file and the fix when it is not one."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"probe {path} does not exist{' (it is a folder)' if path.is_dir() else ''}; {FIX_PROBE}"
        )
    if not zipfile.is_zipfile(path):  # numpy would try it as a pickle and say so
        raise DataError(
            f"{path} is not a saved probe: it is {file_kind(path)}, not an .npz archive; {FIX_PROBE}"
        )
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a lone .npy array
            raise ValueError("it holds one array, not an .npz archive")
        with z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(
            f"{path} is not a saved probe (it cannot be read as .npz of plain arrays: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}); {FIX_PROBE}"
        ) from None
    if "meta" not in arrays or arrays["meta"].dtype.kind != "U" or arrays["meta"].ndim != 0:
        raise DataError(f"{path} is not a saved probe (no metadata in it); {FIX_PROBE}")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError:
        raise DataError(f"{path} is not a saved probe (its metadata is not JSON); {FIX_PROBE}") from None
    if not isinstance(meta, dict) or meta.get("kind") != PROBE_KIND:
        raise DataError(f"{path} is not a saved probe (its metadata names no reservoir probe); {FIX_PROBE}")
    if meta.get("format") != PROBE_FORMAT:
        raise DataError(
            f"{path} is a probe of format {meta.get('format')!r}, written by reservoir "
            f"{meta.get('version')}; this version reads format {PROBE_FORMAT}: rerun the fit to write it"
        )
    missing = [
        k
        for k in (
            "head",
            "depth",
            "hyperparameters",
            "label_shape",
            "n_readout",
            "d_model",
            "identity",
            "identity_hash",
            "input_layer",
            "predictor",
        )
        if k not in meta
    ]
    if missing:
        raise DataError(
            f"{path} is a damaged probe (its metadata lacks {missing}); rerun the fit to write it"
        )
    try:
        if bad := [k for k, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]:
            raise ValueError(f"its {', '.join(bad)} hold NaN or inf")
        predictor = predictor_from_state(meta["predictor"], arrays)
        names = meta.get("class_names")
        if names is not None and predictor.n_classes != REGRESSION and len(names) < predictor.n_classes:
            raise ValueError(f"it names {len(names)} classes of its {predictor.n_classes}")
    except ValueError as e:
        raise DataError(f"{path} is a damaged probe ({e}); rerun the fit to write it") from None
    return SavedProbe(path, meta, predictor)


def extract_hint(probe: SavedProbe) -> str:
    """The ``reservoir extract`` options that make features this probe reads."""
    i = probe.identity
    task = f"{FILE_TASK}YOUR_DATA" if file_task_path(i.get("task")) is not None else i.get("task")
    words = [
        f"--task {task}",
        f"--backbone {i.get('backbone')}",
        f"--seed {i.get('seed')}",
        f"--dtype {i.get('dtype')}",
        f"--readout {i.get('readout')}",
        f"--depths {probe.depth}",
    ]
    if i.get("input_scale", "paper") != "paper":
        words.append(f"--input-scale {i['input_scale']}")
    if i.get("load_dtype", "float32") != "float32":
        words.append(f"--load-dtype {i['load_dtype']}")
    if store_of(i) != "float32":
        words.append(f"--store-dtype {store_of(i)}")
    return "reservoir extract " + " ".join(words)


def check_features(probe: SavedProbe, f: h5py.File, split: str) -> None:
    """Check that ``f``'s ``split`` holds features this probe reads (the same extraction settings, a
    backbone compared by its weights' fingerprint, depth, shapes, labels among its classes); IdentityError
    naming every difference otherwise."""
    if split not in f:
        raise UsageError(
            f"split {split!r} is not in {f.filename}; it holds {feature_splits(f)}: pass --split "
            "with one of them"
        )
    identity, ours = stored_identity(f), probe.identity
    same_weights = ours.get("backbone_fingerprint") == identity.get("backbone_fingerprint")
    problems = [
        f"{key}: probe {short(ours.get(key), 40)}, file {short(identity.get(key), 40)}"
        for key in SAME_EXTRACTION
        if ours.get(key) != identity.get(key) and not (key == "backbone" and same_weights)
    ]
    if store_of(ours) != store_of(identity):
        problems.append(f"store_dtype: probe {store_of(ours)!r}, file {store_of(identity)!r}")
    depths = [int(d) for d in f.attrs["depths"]]
    if probe.depth not in depths:
        problems.append(f"depth: the probe reads depth {probe.depth}, the file holds depths {depths}")
    tokens, found = probe.meta.get("row_tokens"), {int(n) for n in np.unique(f[split]["lengths"][:])}
    if tokens and found and found != {int(tokens)}:  # the probe's data had rows of one length
        problems.append(
            f"rows: the probe's data had rows of {int(tokens):,d} tokens each, the file's {split!r} rows have "
            f"{', '.join(f'{n:,d}' for n in sorted(found)[:5])} tokens"
        )
    shape = tuple(f[split]["features"].shape[2:])
    if shape != (probe.meta["n_readout"], probe.meta["d_model"]):
        problems.append(
            f"features: the probe reads {probe.meta['n_readout']} readout token(s) of width "
            f"{probe.meta['d_model']}, the file holds {shape[0]} of width {shape[1]}"
        )
    labels = f[split]["labels"]
    top = int(np.max(labels[:])) if labels.shape[0] else -1
    names = class_names(f)
    order = probe_ids(probe, names)  # labels numbered otherwise, renumbered by name
    if identity.get("unlabeled"):
        pass  # placeholders: nothing to compare
    elif tuple(labels.shape[1:]) != probe.label_shape:
        problems.append(
            f"labels: the probe predicts labels of shape {list(probe.label_shape)} a row, the file's "
            f"are {list(labels.shape[1:])}"
        )
    elif order is None and probe.predictor.n_classes != REGRESSION and top >= probe.predictor.n_classes:
        problems.append(
            f"classes: the probe knows classes 0..{probe.predictor.n_classes - 1}, the file's labels "
            f"reach {top}"
        )
    if names and not probe.class_names and not identity.get("unlabeled"):
        problems.append(
            f"class names: the file's data names its classes ({', '.join(map(repr, names[:5]))}), the probe's data "
            "gave class ids: which name is which id is not known"
        )
    if order is not None and (order < 0).any():
        ours, unknown = probe.class_names or [], [n for n, k in zip(names or [], order) if k < 0]
        problems.append(
            f"class names: the file's data names class(es) {', '.join(map(repr, unknown[:5]))} that the probe does "
            f"not know (its classes: {', '.join(ours[:10])}{', ...' if len(ours) > 10 else ''})"
        )
    if not problems and probe.meta["input_layer"] != input_layer_digest(f):
        problems.append(
            "input layer: the file's frozen input layer differs from the one the probe's features "
            "went through (another token kind, width or vocabulary)"
        )
    if problems:
        raise IdentityError(
            f"probe {probe.path} cannot read {f.filename}: it holds features of other extraction "
            f"settings ({'; '.join(problems)}). Apply the probe to features extracted as its own "
            f"were: `{extract_hint(probe)}`"
        )


def probe_ids(probe: SavedProbe, names: list[str] | None) -> np.ndarray | None:
    """The probe's id of each class a feature file's data names, where the file numbers them otherwise (its
    data held other classes, or not all of the probe's): -1 for a name the probe does not know. ``None``
    where the ids agree or either side names no classes."""
    ours = probe.class_names
    if not ours or not names or list(names) == ours[: len(names)]:
        return None
    return np.array([ours.index(n) if n in ours else -1 for n in names], dtype=np.int64)


def default_split(features: str | Path) -> str:
    """The split ``predict --features`` reads unless told: ``test``, or the one split of a file of data read
    to predict on (``predict``)."""
    from reservoir.tasks.userfile import PREDICT_SPLIT

    with open_features(Path(features)) as f:
        return PREDICT_SPLIT if feature_splits(f) == [PREDICT_SPLIT] else "test"


def predict_file(
    probe: SavedProbe, features: str | Path, split: str = "test"
) -> tuple[np.ndarray, np.ndarray | None, list[str] | None]:
    """Predictions and labels, each ``(N, *label_shape)``, of ``probe`` on ``split`` of a feature file
    (checked by :func:`check_features` and against its digests), and the names the file's data gives its
    classes. Labels are ``None`` for data without labels, names ``None`` for data that names none; labels the
    file's data named otherwise than the probe's are renumbered by name (:func:`probe_ids`)."""
    from threadpoolctl import threadpool_limits

    with open_features(Path(features)) as f:
        check_features(probe, f, split)
        verify(f, [probe.depth], [split])
        labels = None if stored_identity(f).get("unlabeled") else f[split]["labels"][:]
        n = int(f[split]["labels"].shape[0])
        names = class_names(f)
        order = probe_ids(probe, names)
        if order is not None and labels is not None:  # the file's class ids as the probe's
            labels, names = np.where(labels >= 0, order[np.clip(labels, 0, None)], labels), probe.class_names
        parts = []
        with threadpool_limits(limits=head_threads()):
            for X, y in iter_depth(f, split, probe.depth):
                parts.append(probe.predictor(X.reshape(-1, X.shape[-1]) if labels is None else rows(X, y)[0]))
    shape = (n, *probe.label_shape) if labels is None else labels.shape
    if not parts:
        return np.zeros(shape, dtype=np.int64), labels, names
    return np.concatenate(parts).reshape(shape), labels, names


def score(probe: SavedProbe, predictions: np.ndarray, labels: np.ndarray) -> tuple[str, float]:
    """The probe's primary metric (its fit's, :mod:`reservoir.probe.metrics`) and its value on these
    predictions; NaN for no rows."""
    from reservoir.probe.metrics import METRICS

    name = probe.meta.get("metric", "accuracy")
    return name, (METRICS[name](predictions, labels) if labels.size else float("nan"))


def predictions_csv(
    predictions: np.ndarray,
    labels: np.ndarray | None,
    class_names: list[str] | None = None,
    files: list[str] | None = None,
    label_names: list[str] | None = None,
) -> str:
    """CSV of one line per row: ``row,prediction,label``; several values a row give ``prediction_I,...``
    and ``label_I,...`` columns; ``labels`` ``None`` gives no label columns. With ``class_names``
    (:attr:`SavedProbe.class_names`), ``prediction_name`` follows; with ``label_names`` (the names the
    labels' own data gives its classes), ``label_name``; with ``files`` (an image folder's), a ``file``
    column follows ``row``."""
    n = len(predictions)
    given = [predictions] if labels is None else [predictions, labels]
    if predictions.ndim == 1:
        names = ["prediction", "label"][: len(given)]
    else:
        index = ["_".join(map(str, i)) for i in np.ndindex(*predictions.shape[1:])]
        names = [f"{what}_{i}" for what in ("prediction", "label")[: len(given)] for i in index]
    values = np.concatenate([a.reshape(n, -1) for a in given], axis=1)
    ids = predictions.ndim == 1 and values.dtype.kind in "iub"
    wanted = (("prediction_name", 0, class_names), ("label_name", 1, label_names))
    named = [(w, k, ns) for w, k, ns in wanted if ids and ns and k < len(given)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["row", *(["file"] if files is not None else []), *names, *(w for w, _, _ in named)])
    number = int if values.dtype.kind in "iub" else repr  # real values in full (float64's shortest repr)
    for i, row in enumerate(values.tolist()):
        source = [files[i]] if files is not None else []
        writer.writerow([i, *source, *(number(v) for v in row), *(name_of(ns, row[k]) for _, k, ns in named)])
    return buf.getvalue()


def predicted_names(probe: SavedProbe, predictions: np.ndarray) -> np.ndarray | None:
    """The class names of ``predictions`` (one class id a row) where the probe's data named its classes;
    ``None`` otherwise."""
    names = probe.class_names
    if not names or predictions.ndim != 1 or predictions.dtype.kind not in "iub":
        return None
    return np.array([name_of(names, k) for k in predictions.tolist()], dtype=str)

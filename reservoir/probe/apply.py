"""A saved probe applied: to new data, through the extraction its features went through, or to a split of
a feature file (``reservoir predict``; :func:`reservoir.api.predict`).

New data (:func:`predict_data`) is any source ``--task file:PATH`` reads, with labels or without, read as
data to predict on (:meth:`reservoir.tasks.userfile.FileTask.to_predict`): every row in input order as one
split, class names numbered as the probe numbers them, with the probe's data's reading options where the
caller gives none, and the probe's vocabulary of token ids. It then goes through the probe's extraction as
the probe's feature file recorded it, at the probe's depth alone. Before any file is touched the data and
the prepared extraction are checked against the probe (DataError, IdentityError), each problem named with
the fix. The features are written as every extraction's are, and the next call on the same data reuses
them. Probes of int8 features cannot be applied to new data: int8's calibration comes from the rows
extracted.

>>> predicted = predict_data(load_probe("RESULT.probe.npz"), "new.parquet")   # doctest: +SKIP
>>> predicted.predictions[:3], predicted.names[:3]                            # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.config import ExtractConfig, PredictConfig
from reservoir.errors import DataError, IdentityError, UsageError
from reservoir.paths import FILE_TASK, file_task_path
from reservoir.probe.predictors import REGRESSION
from reservoir.probe.saved import (
    SAME_EXTRACTION,
    SavedProbe,
    default_split,
    input_layer_digest,
    load_probe,
    predict_file,
    predicted_names,
    predictions_csv,
    score,
    token_layout,
)

#: the options of a ``file:`` task that say how its rows are read (new data takes the probe's data's)
READING = ("input", "target", "patch", "image_size", "mode", "regression")


@dataclass
class Predicted:
    """What a probe predicted, row by row in order: ``predictions`` ``(N, *label_shape)``, the ``labels``
    (``None`` without them, ``unlabeled`` saying why), the rows' ``files`` (an image folder's), the ``split``,
    the feature file read, and the ``data`` it was made of (``None``: a feature file given)."""

    probe: SavedProbe
    predictions: np.ndarray
    labels: np.ndarray | None
    split: str
    features: Path
    data: Path | None = None
    files: list[str] | None = None
    unlabeled: str | None = None
    #: the names the data gives its classes (the labels' names; ``None`` where it names none)
    label_names: list[str] | None = None

    @property
    def names(self) -> np.ndarray | None:
        """The class name of each prediction, where the probe's data named its classes; else ``None``."""
        return predicted_names(self.probe, self.predictions)

    def csv(self) -> str:
        """One CSV line a row (:func:`reservoir.probe.saved.predictions_csv`)."""
        return predictions_csv(
            self.predictions, self.labels, self.probe.class_names, self.files, self.label_names
        )

    def summary(self, out: Path | None = None) -> str:
        """The line ``reservoir predict`` prints on stderr: the rows, their score where they have labels, the
        probe, and where the predictions went."""
        from reservoir.probe.metrics import METRICS

        p = self.probe
        where = (f"; features in {self.features}" if self.data is not None else "") + (
            f"; wrote {out}" if out is not None else ""
        )
        rows = f"{self.data if self.data is not None else self.split}: {len(self.predictions):,d} rows"
        probe = f"the {p.head} probe of depth {p.depth}"
        if self.labels is None:
            return f"{rows} predicted with {probe}; no labels to score ({self.unlabeled}){where}"
        name, value = score(p, self.predictions, self.labels)
        metric = METRICS[name]
        fitted = (p.meta.get("test_scores") or p.meta.get("test_accuracies") or {}).get(self.split)
        same = (
            f" (the fit's {self.split} {name}: {metric.format(fitted)})"
            if fitted is not None and not self.data
            else ""
        )
        return f"{rows}, {name} {metric.format(value)} with {probe}{same}{where}"


def predict(cfg: PredictConfig, *, progress: bool = True, probe: SavedProbe | None = None) -> Predicted:
    """What ``reservoir predict`` runs: ``cfg.probe`` (or ``probe``) on ``cfg.data`` or ``cfg.features``."""
    probe = probe or load_probe(cfg.probe)
    if cfg.data is None:
        split = cfg.split or default_split(cfg.features)
        predictions, labels, names = predict_file(probe, cfg.features, split)
        bare = f"{cfg.features} holds data without labels" if labels is None else None
        return Predicted(
            probe, predictions, labels, split, Path(cfg.features), unlabeled=bare, label_names=names
        )
    return predict_data(
        probe, cfg.data, task_options=cfg.task_options, backbone=cfg.backbone, progress=progress
    )


def recorded_backbone(probe: SavedProbe) -> str:
    """The backbone as the probe's extraction named it: its record in the probe, else in the fit's result
    beside it, else the identity's name; UsageError for a model object this process was not handed, and for
    a name that resolves to nothing here (a folder named relative to where the fit ran, or moved since)."""
    named = (probe.meta.get("extraction") or {}).get("backbone")
    result = probe.path.with_name(probe.path.name.removesuffix(".probe.npz") + ".json")
    if not named and result.is_file():
        try:
            named = json.loads(result.read_text())["config"]["extract"]["backbone"]
        except (OSError, ValueError, KeyError, TypeError):
            named = None
    named = named or str(probe.identity.get("backbone"))
    from reservoir.model.backbones import OBJECTS, parse_name  # torch: only for data run through a model

    if named.startswith("object:") and named not in OBJECTS:  # handed over in another process
        raise UsageError(
            f"the probe {probe.path} was fitted on features of a model object ({named}), which only its "
            "process knew; pass the model: api.predict(..., backbone=model)"
        )
    try:
        parse_name(named)
    except UsageError:
        why = (
            "which no longer exists (moved or removed since the fit)"
            if Path(named).is_absolute()
            else f"named relative to where its fit ran and not found from here ({Path.cwd()}), or moved since"
        )
        raise UsageError(
            f"the probe {probe.path} records its backbone as the folder {named!r}, {why}; pass --backbone PATH "
            "with the probe's model folder (the Python API: backbone=PATH)"
        ) from None
    return named


def reading_options(probe: SavedProbe, given: dict[str, Any] | None) -> dict[str, Any]:
    """The options new data is read with: the probe's data's (:data:`READING`), then ``given`` over them."""
    identity = probe.identity
    recorded = identity.get("task_options") or {} if file_task_path(identity.get("task")) is not None else {}
    options = {k: v for k, v in recorded.items() if k in READING}
    options["regression"] = probe.predictor.n_classes == REGRESSION
    tokens = probe.meta.get("tokens") or {}
    if tokens.get("kind") == "ids":
        options["vocab_size"] = tokens["vocab_size"]
    return {**options, **(given or {})}


def _tokens_text(tokens: dict[str, Any]) -> str:
    if tokens["kind"] == "ids":
        return f"token ids (a vocabulary of {tokens['vocab_size']:,d})"
    return f"tokens of {tokens['width']:,d} value(s)"


def _probe_image_size(probe: SavedProbe, tokens: int, patch: int, shape: tuple[int, ...]) -> str | None:
    """The size (``HxW``) of the probe's images: as its data's reading recorded it, else the one of ``tokens``
    patches of ``patch`` pixels in the new images' proportions ``shape``, or square; ``None`` if neither."""
    seen = probe.meta.get("image_shape")  # as extraction read them (resized or not); older probes lack it
    recorded = (
        f"{seen[0]}x{seen[1]}" if seen else (probe.identity.get("task_options") or {}).get("image_size")
    )
    if recorded:
        return str(recorded)
    h, w = shape[:2]
    for rows in (round((tokens * h / w) ** 0.5), round(tokens**0.5)):  # the new images' proportions; square
        cols = tokens // max(rows, 1)
        if rows * cols == tokens and (rows * w == cols * h or rows == cols):
            return f"{rows * patch}x{cols * patch}"
    return None


def _row_length_text(probe: SavedProbe, task: Any, data: Path, tokens: int) -> str:
    """The new data's rows are of another fixed length than the probe's data's ``tokens``, in words."""
    found = task.spec.seq_len
    shape = getattr(task, "image_shape", None)
    if shape is None:
        return (
            f"{data} holds rows of {'up to ' if task.spec.variable_length else ''}{found:,d} tokens, the probe's "
            f"data had rows of {tokens:,d} tokens each: give rows of {tokens:,d} tokens"
        )
    patch = int((probe.identity.get("task_options") or {}).get("patch", task.patch))
    size = _probe_image_size(probe, tokens, patch, shape)
    probes = f"{size} images" if size else f"images of {tokens:,d} patches"
    fix = size or "HxW"
    return (
        f"{data} holds {shape[0]}x{shape[1]} images, {found:,d} tokens a row at patch={task.patch}; the probe's "
        f"data had {tokens:,d} tokens a row ({probes} at patch={patch}): pass --task-opt image_size={fix} to "
        "resize them to the probe's size"
    )


def check_data(probe: SavedProbe, task: Any, data: Path) -> None:
    """Check that the data to predict on is of the probe's kind (tokens, their number a row where the probe's
    data had one, labels' shape, classes and names); DataError naming every difference and the fix otherwise."""
    spec, problems = task.spec, []
    wanted = probe.meta.get("tokens")
    found = (
        {"kind": "ids", "vocab_size": spec.vocab_size}
        if spec.token_kind == "ids"
        else {"kind": "dense", "width": spec.token_dim}
    )
    if wanted and (wanted["kind"] != found["kind"] or wanted.get("width") != found.get("width")):
        images = (
            " (images: the probe's --task-opt patch and mode)" if getattr(task, "image_shape", None) else ""
        )
        problems.append(f"{data} holds {_tokens_text(found)}, the probe reads {_tokens_text(wanted)}{images}")
    tokens = probe.meta.get("row_tokens")  # None: rows of their own lengths, or a probe that predates it
    seen, shape = probe.meta.get("image_shape"), getattr(task, "image_shape", None)
    if (tokens and (spec.variable_length or spec.seq_len != tokens)) or (
        seen and shape and list(shape[:2]) != list(seen[:2])  # images of another shape, of as many patches
    ):
        problems.append(_row_length_text(probe, task, data, int(tokens or spec.seq_len)))
    if task.unlabeled is None:
        labels = task.read(task.spec.splits[0], Path(".")).labels
        n_classes = probe.predictor.n_classes
        if tuple(labels.shape[1:]) != probe.label_shape:
            problems.append(
                f"labels of shape {list(labels.shape[1:])} a row, the probe predicts {list(probe.label_shape)}"
            )
        elif n_classes != REGRESSION and labels.size and int(labels.max()) >= n_classes:
            problems.append(f"label {int(labels.max())}, the probe knows classes 0..{n_classes - 1}")
        if task.class_names and not probe.class_names:
            problems.append(
                f"labels named {', '.join(task.class_names[:5])}, the probe's data gave class ids 0..C-1 (give "
                "ids, numbered as the probe's were)"
            )
    if problems:
        raise DataError(
            f"{data} is not data the probe {probe.path} reads: {'; '.join(problems)}. Give data of the kind its "
            "features were extracted from"
        )


def check_run(probe: SavedProbe, run: Any) -> None:
    """Check that the prepared extraction (:class:`reservoir.extract.run.Run`) is the probe's: every setting of
    :data:`reservoir.probe.saved.SAME_EXTRACTION` (the backbone by its weights), the features' shape and the
    frozen input layer; IdentityError naming each difference."""
    from reservoir.model.input_layer import input_layer_tensors, make_input_layer

    ours, theirs = probe.identity, run.identity
    same_weights = ours.get("backbone_fingerprint") == theirs.get("backbone_fingerprint")
    problems = [
        f"{key}: probe {ours.get(key)!r}, here {theirs.get(key)!r}"
        for key in SAME_EXTRACTION
        if ours.get(key) != theirs.get(key)
        and key != "backbone_fingerprint"
        and not (key == "backbone" and same_weights)
    ]
    if not same_weights:
        problems.append(
            f"backbone weights: {run.cfg.backbone} loads other weights than the probe's features came from "
            f"(fingerprint {str(theirs.get('backbone_fingerprint'))[:12]}, the probe's "
            f"{str(ours.get('backbone_fingerprint'))[:12]}); pass --backbone with the probe's model"
        )
    shape = run.feature_shape[1:]
    if shape != (probe.meta["n_readout"], probe.meta["d_model"]):
        problems.append(
            f"features: {shape[0]} readout token(s) of width {shape[1]}, the probe reads "
            f"{probe.meta['n_readout']} of width {probe.meta['d_model']}"
        )
    if not problems:
        layer = make_input_layer(
            run.task.spec,
            run.backbone.input_width,
            run.cfg.seed,
            run.cfg.input_scale,
            getattr(run.backbone, "token_std", None),
        )
        tensors = {k: v.numpy() for k, v in input_layer_tensors(layer).items()}
        if input_layer_digest(tensors) != probe.meta["input_layer"]:
            problems.append(
                f"input layer: the data's frozen input layer ({_tokens_text(token_layout(tensors))}) differs "
                "from the one the probe's features went through"
            )
    if problems:
        raise IdentityError(
            f"the probe {probe.path} cannot read features of {file_task_path(run.cfg.task)} extracted here: "
            f"{'; '.join(problems)}"
        )


def probe_engine(probe: SavedProbe) -> str:
    """The engine new data is extracted on: the one that made the probe's features (a bfloat16 engine's features
    differ from another's by about 1%, enough to move predictions), or PyTorch for float32 features where that
    engine is not installed here (every engine computes them to rounding); ``auto`` for a probe that records none."""
    from reservoir.registry import ENGINES

    used = (probe.meta.get("extraction") or {}).get("engine_used")
    if not used or used not in ENGINES.names():
        return "auto"
    if ENGINES[used].installed():
        return used
    if probe.identity.get("dtype") == "float32":
        return "torch"
    raise IdentityError(
        f"the probe {probe.path} reads {probe.identity.get('dtype')} features computed by the {ENGINES[used].label} "
        f"engine, which is not installed here, and another engine's differ by about 1%: {ENGINES[used].install}"
    )


def predict_data(
    probe: SavedProbe,
    data: str | Path,
    *,
    task_options: dict[str, Any] | None = None,
    backbone: Any = None,
    progress: bool = True,
) -> Predicted:
    """``probe`` on every row of ``data`` (module docstring), read with the probe's reading options and
    ``task_options`` over them. ``backbone``: where to load the probe's backbone (a name, a folder, or a name
    given to :func:`reservoir.model.backbones.register_object`), when not as its extraction named it."""
    from reservoir.extract.run import extract
    from reservoir.extract.stored import store_of
    from reservoir.settings import build
    from reservoir.tasks.userfile import PREDICT_SPLIT, FileTask

    path = file_task_path(str(data))  # ``file:PATH``, as --task takes it, is read as PATH
    identity, data = probe.identity, Path(str(data) if path is None or Path(data).exists() else path)
    if identity.get("calibration"):
        raise IdentityError(
            f"the probe {probe.path} reads {identity.get('dtype')} features, whose calibration came from the rows "
            "it extracted: new data cannot be extracted as they were. Fit a probe on float features (extract "
            "with --dtype float32 or bfloat16) to predict on new data"
        )
    options = reading_options(probe, task_options)
    task = FileTask.to_predict(str(data), probe.class_names, tuple(task_options or ()), **options)
    # the padded readout reads each row where the probe's data's rows were read: padded to their length
    if identity.get("readout") == "padded":
        if not probe.meta.get("padded_width"):
            raise IdentityError(
                f"the probe {probe.path} reads rows padded to its data's length (--readout padded) and predates "
                "recording that length; fit it again (`reservoir fit` on its features) to apply it to new data"
            )
        task.pad_to(int(probe.meta["padded_width"]))
    check_data(probe, task, data)
    cfg = build(
        ExtractConfig,
        task=f"{FILE_TASK}{data}",
        backbone=backbone if backbone is not None else recorded_backbone(probe),
        split=PREDICT_SPLIT,
        seed=identity["seed"],
        input_scale=identity.get("input_scale", "paper"),
        dtype=identity["dtype"],
        load_dtype=identity.get("load_dtype", "float32"),
        store_dtype=store_of(identity),
        readout=identity["readout"],
        depths=(probe.depth,),
        task_options=task.identity_options(),
        engine=probe_engine(probe),
    )
    try:
        path = extract(cfg, progress=progress, task=task, accept=lambda run: check_run(probe, run))
    except UsageError as e:  # a backbone the probe's depth is not in: say first that it is another backbone
        from reservoir.model.backbones import label

        if not isinstance(backbone, str) or label(backbone) == identity["backbone"]:
            raise
        raise IdentityError(
            f"--backbone {backbone} is not the probe's backbone ({identity['backbone']!r}), and {e}; pass "
            "--backbone with the probe's model, or leave it out"
        ) from None
    predictions, labels, names = predict_file(probe, path, PREDICT_SPLIT)
    return Predicted(probe, predictions, labels, PREDICT_SPLIT, path, data, task.files, task.unlabeled, names)

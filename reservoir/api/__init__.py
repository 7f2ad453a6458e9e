"""Python API: the CLI's ``extract``, ``fit``, ``train``, ``predict`` and ``report`` as functions, feature
files read back (arrays, an xarray Dataset, a torch Dataset), and a scikit-learn transformer.

Examples
--------
>>> from reservoir import api
>>> path = api.extract("digits", "lstm", limit=100)                 # doctest: +SKIP
>>> results = api.fit(features=path, depths="all")                  # doctest: +SKIP
>>> X, y = api.read_features(path, "test", depth=2)                 # doctest: +SKIP
>>> X, y, depths = api.read_features(path, "test")                  # doctest: +SKIP
>>> predictions = api.predict(results[0]["probe"], path, "test")    # doctest: +SKIP
>>> table = api.results()                                           # doctest: +SKIP

The transformer turns sequences into the readout features of a frozen backbone, so any
scikit-learn estimator can sit on top of it::

    from sklearn.pipeline import make_pipeline
    from sklearn.linear_model import LogisticRegression
    model = make_pipeline(ReservoirFeatures(backbone="gpt2-random", depth=6), LogisticRegression())
    cross_val_score(model, X, y, cv=5)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reservoir.config import ExtractConfig, FitConfig, PredictConfig, ReportConfig, TrainConfig
from reservoir.errors import ReservoirError, UsageError, optional
from reservoir.paths import FILE_TASK, file_task_path

if TYPE_CHECKING:
    from reservoir.api.estimator import ReservoirFeatures
    from reservoir.api.features import FeatureDataset, read_features

__all__ = [
    "FeatureDataset",
    "ReservoirFeatures",
    "extract",
    "fit",
    "load_probe",
    "predict",
    "read_features",
    "results",
    "train",
]


#: the names imported when first used: the command line does not pay for scikit-learn and torch's data module
_LAZY = {
    "ReservoirFeatures": "reservoir.api.estimator",
    "FeatureDataset": "reservoir.api.features",
    "read_features": "reservoir.api.features",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _watched(progress: bool | None) -> bool:
    """``progress`` as asked; ``None``: on where someone is watching (a terminal or a notebook)."""
    from reservoir.progress import interactive

    return interactive() if progress is None else bool(progress)


def _refused(option: str, message: str) -> UsageError:
    """A UsageError about one setting, naming its command-line option (``option``) for the command line."""
    error = UsageError(message)
    error.option = option  # type: ignore[attr-defined]
    return error


def configure(cls: type, task: Any = None, backbone: Any = None, **settings: Any) -> Any:
    """The config of a command from its settings, checked the one way both front doors check them.

    ``task`` may be a whole config of ``cls`` (and then no other settings). Unknown setting names, each
    field's rules and the checks across fields are the config's (:func:`reservoir.settings.build`); then
    what needs the registries: a known task and backbone, the task's options (converted from text), a
    split the task has, the trainable groups. UsageError (the command line's exit 2) naming the value and
    the choices."""
    from reservoir.config import TRAIN_GROUPS
    from reservoir.model.backbones import parse_name
    from reservoir.settings import build
    from reservoir.tasks import TASKS, check_options, get_task

    if isinstance(task, cls):
        if settings or backbone is not None:
            raise UsageError(f"give either a {cls.__name__} or settings, not both (got {sorted(settings)})")
        return task
    names = {f.name for f in dataclasses.fields(cls)}
    if backbone is not None and not isinstance(backbone, str):
        from reservoir.model.backbones import register_object

        backbone = register_object(backbone)
    given = {k: v for k, v in (("task", task), ("backbone", backbone)) if k in names}
    cfg = build(cls, **given, **settings)
    name = getattr(cfg, "task", None)
    if name is not None and not (file_task_path(name) is not None or name in TASKS):
        raise _refused("--task", f"unknown task {name!r}; choose from {TASKS.names()} or file:PATH")
    chosen = getattr(cfg, "backbone", None)
    if isinstance(chosen, str):
        try:
            parse_name(chosen)
        except UsageError as e:
            raise _refused("--backbone", str(e)) from None
    if isinstance(cfg, PredictConfig):  # its options read its --data: a file task's
        name = f"{FILE_TASK}{cfg.data or ''}"
    if "task_options" in names and name is not None:
        try:
            cfg = dataclasses.replace(cfg, task_options=check_options(name, cfg.task_options))
        except UsageError as e:
            raise _refused("--task-opt", str(e)) from None
    split = getattr(cfg, "split", None)
    if isinstance(cfg, ExtractConfig) and split != "all" and file_task_path(name) is None:
        splits = list(get_task(name, **cfg.task_options).spec.splits)
        if split not in splits:
            raise _refused("--split", f"task {name!r} has no split {split!r}; choose from {splits} or 'all'")
    if isinstance(cfg, TrainConfig) and not all(g in TRAIN_GROUPS for g in cfg.trainable):
        from reservoir.model.backbones import load_backbone

        try:
            groups = set(load_backbone(cfg.backbone, cfg.seed).param_groups())
        except (ReservoirError, OSError, ValueError):
            return cfg  # the run itself says why the backbone cannot be loaded (exit 1)
        bad = [g for g in cfg.trainable if g not in TRAIN_GROUPS and g not in groups]
        if bad:
            raise _refused(
                "--trainable",
                f"unknown trainable group {bad[0]!r}; choose from {sorted(set(TRAIN_GROUPS) | groups)}",
            )
    return cfg


def extract(
    task: str | ExtractConfig, backbone: str | None = None, *, progress: bool | None = None, **settings: Any
) -> Path:
    """Stream a task through a frozen backbone into an HDF5 feature file; what ``reservoir extract`` runs.

    A file of the same run identity that is already complete is verified and reused; an
    interrupted one is resumed.

    Parameters
    ----------
    task : str or ExtractConfig
        A registered task name or ``"file:PATH"``; or a whole
        [`ExtractConfig`][reservoir.config.ExtractConfig], and then no other settings.
    backbone : str or torch.nn.Module, optional
        A registered backbone, a folder saved with ``save_pretrained``, ``hf:ID`` (``hf:ID@REVISION`` to
        pin one), or a model object (a ``PreTrainedModel``, or any module the generic adapter maps),
        used through a copy (``None``: the config's default, ``gpt2-random``).
    progress : bool, optional
        Show progress (a bar, and status lines through the ``reservoir`` logger); ``None``: when someone
        is watching (a terminal or a notebook, :func:`reservoir.progress.interactive`).
    **settings
        Any field of [`ExtractConfig`][reservoir.config.ExtractConfig] (``split``, ``limit``, ``seed``,
        ``batch_size``, ``dtype``, ``depths``, ``task_options``, ``data_dir``, ``out``, ...).

    Returns
    -------
    Path
        The complete feature file.

    Raises
    ------
    ValueError
        An unknown setting (naming the valid ones) or a value outside its range
        ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.DataError
        Missing or bad data, before any file is created.

    Examples
    --------
    >>> path = extract("digits", "lstm", limit=100)                  # doctest: +SKIP
    >>> path.name                                                     # doctest: +SKIP
    'bfloat16-seed0-limit100-....h5'
    """
    from reservoir.extract.run import extract as run

    return run(configure(ExtractConfig, task, backbone, **settings), progress=_watched(progress))


def fit(
    task: str | FitConfig | None = None,
    backbone: str | None = None,
    *,
    progress: bool | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Fit a linear head per depth on a feature file, and the baselines of the same data; what
    ``reservoir fit`` runs.

    Parameters
    ----------
    task : str or FitConfig, optional
        With ``backbone``: find the feature file extracted for them (or check that ``features``
        belongs to them). A whole [`FitConfig`][reservoir.config.FitConfig], and then no other settings.
    backbone : str, optional
        The backbone the features were extracted with.
    progress : bool, optional
        Print one line per depth (``None``: when someone is watching, as :func:`extract`).
    **settings
        Any field of [`FitConfig`][reservoir.config.FitConfig] (``features``, ``depths``, ``head``,
        ``val_fraction``, ``seed``, ``baselines``, ...).

    Returns
    -------
    list of dict
        One result per depth (also written as JSON under ``results/TASK/BACKBONE/``, named by the
        features' identity, head, depth and seed; ``probe`` names the saved head), then one per
        baseline (``mode="baseline"``, under ``results/TASK/baseline-NAME/``) unless
        ``baselines=False``.

    Raises
    ------
    ValueError
        An unknown setting or a value outside its range ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.StoreError
        A feature file that is unfinished, of another task, or fails verification.

    Examples
    --------
    >>> results = fit(features=path, head="ridge", depths="0,2")     # doctest: +SKIP
    >>> [(r["depth"], r["test_accuracy"]) for r in results if r["mode"] == "output-only"]  # doctest: +SKIP
    """
    from reservoir.probe.fit import fit as run

    return run(configure(FitConfig, task, backbone, **settings), progress=_watched(progress))


# -- saved probes and results ----------------------------------------------------------------------


def load_probe(path: str | Path) -> Any:
    """The probe a fit saved beside a result (``RESULT.probe.npz``; a result's ``probe`` names it),
    read without unpickling anything.

    Parameters
    ----------
    path : str or Path
        The ``.probe.npz`` file.

    Returns
    -------
    reservoir.probe.saved.SavedProbe
        With ``depth``, ``head``, ``hyperparameters``, ``meta`` and ``predict(X)`` on features
        ``(N, n_readout, d_model)``.

    Raises
    ------
    reservoir.errors.DataError
        A file that is missing, not a probe, or damaged.

    Examples
    --------
    >>> probe = load_probe(results[0]["probe"])                      # doctest: +SKIP
    >>> X, y = read_features(path, "test", depth=probe.depth)        # doctest: +SKIP
    >>> (probe.predict(X.reshape(len(X), probe.meta["n_readout"], -1)) == y).mean()   # doctest: +SKIP
    """
    from reservoir.probe.saved import load_probe as load

    return load(path)


def predict(
    probe: Any,
    features: str | Path | None = None,
    split: str | None = None,
    *,
    data: str | Path | None = None,
    names: bool = False,
    task_options: dict[str, Any] | None = None,
    backbone: Any = None,
    progress: bool | None = None,
) -> np.ndarray:
    """A saved probe's predictions on new data, or on one split of a feature file; what ``reservoir
    predict`` runs.

    ``data`` (any input ``--task file:PATH`` reads, labeled or not) goes through the extraction the
    probe's features went through (backbone, seed, input scale, dtype, readout, at the probe's depth:
    :mod:`reservoir.probe.apply`) and the probe, every row in input order; its features are kept under
    ``features/``, named by the run's identity, and the next call on the same data reuses them. A
    ``features`` file must come from the probe's extraction settings (the same feature and label shapes,
    a depth the probe reads); on the file the probe was fitted on, the predictions are the fit's.

    Parameters
    ----------
    probe : str, Path or SavedProbe
        A ``RESULT.probe.npz`` path, or what [`load_probe`][reservoir.api.load_probe] returns.
    features : str or Path, optional
        A complete feature file (or give ``data``).
    split : str, optional
        The split of ``features`` to predict (default ``"test"``).
    data : str or Path, optional
        New data: a Parquet or Arrow file, a ``datasets`` folder, an image folder (class folders, or the
        images in it: unlabeled), an ``.npz`` or ``.h5``; every row is predicted, in input order (an image
        folder's in the natural order of its paths).
    names : bool
        Return the class name of each prediction instead of its id; UsageError where the probe's data
        named no classes.
    task_options : dict, optional
        How to read ``data`` (as ``extract``'s ``task_options``: ``input``, ``target``, ``mode``, ...); the
        probe's data's reading options are the default.
    backbone : str or torch.nn.Module, optional
        Where to load the probe's backbone for ``data`` when not where its extraction found it (a name, a
        folder, a model object); its weights must be the probe's.
    progress : bool, optional
        Show the extraction's progress (``None``: when someone is watching, as :func:`extract`).

    Returns
    -------
    numpy.ndarray
        Class ids (or real values) ``(N, *label_shape)``; with ``names``, the class names ``(N,)``.

    Raises
    ------
    ValueError
        ``features`` and ``data`` both or neither, ``names`` for a probe without class names
        ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.DataError
        Data of another kind than the probe reads (token width or vocabulary, label shape, classes),
        before anything is extracted.
    reservoir.errors.IdentityError
        Features (or an extraction) of other settings, naming each difference.

    Examples
    --------
    >>> results = fit(features=path, depths=2, head="ridge")          # doctest: +SKIP
    >>> predictions = predict(results[0]["probe"], path, "test")      # doctest: +SKIP
    >>> accuracy = (predictions == read_features(path, "test", depth=2)[1]).mean()  # doctest: +SKIP
    >>> accuracy == results[0]["test_accuracy"]                       # doctest: +SKIP
    True
    >>> predict(results[0]["probe"], data="new.parquet", names=True)  # doctest: +SKIP
    array(['cat', 'dog', ...], dtype='<U3')
    """
    from reservoir.probe.apply import predict as run
    from reservoir.probe.saved import SavedProbe
    from reservoir.probe.saved import load_probe as load

    saved = probe if isinstance(probe, SavedProbe) else load(probe)
    if names and not saved.class_names:
        raise UsageError(
            f"names=True: the probe {saved.path} predicts class ids its data named no classes for (class "
            "folders, a column of label names or a ClassLabel name them); drop names=True"
        )
    cfg = configure(
        PredictConfig,
        probe=saved.path,
        features=features,
        data=data,
        split=split,
        task_options=task_options,
        backbone=backbone,
    )
    predicted = run(cfg, progress=_watched(progress), probe=saved)
    return predicted.names if names else predicted.predictions


def results(
    paths: str | Path | Sequence[str | Path] | None = None,
    *,
    layout: str = "depth",
    depths: str | int | Sequence[str | int] = "chosen",
) -> Any:
    """The table ``reservoir report`` prints, as a ``pandas.DataFrame`` (needs ``pip install pandas``).

    Parameters
    ----------
    paths : str, Path or sequence of them, optional
        Result JSON files or folders (default: ``results/`` under ``$RESERVOIR_HOME``).
    layout : str
        ``"depth"`` (a column per depth, one table per task) or ``"task"`` (a column per task).
    depths : str, int or sequence of them
        In the task layout, the depth an output-only setting reports: ``"chosen"`` on validation,
        ``"last"``, a depth number, or several of them (a row per rule).

    Returns
    -------
    pandas.DataFrame
        One row per cell of the report (its ``--csv`` lines): task, setting, backbone, mode, head,
        column (a depth ``dN``, ``chosen``, a task, or ``baseline``), the ``metric`` (``accuracy``, a
        fraction, for classes; ``nrmse`` for real values), its test value, std over seeds and number of seeds,
        its validation value, the depth chosen, ...

    Raises
    ------
    ValueError
        An unknown layout or depth rule ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.DataError
        A path that does not exist, or no results found.
    ImportError
        pandas is not installed.

    Examples
    --------
    >>> table = results()                                            # doctest: +SKIP
    >>> table[table.column == "chosen"][["task", "setting", "depth", "test"]]   # doctest: +SKIP
    """
    pd = optional("pandas", "api.results")
    from reservoir.report.render import render

    if isinstance(paths, (str, Path)):
        paths = [paths]
    rendered = render(
        configure(ReportConfig, paths=tuple(Path(p) for p in paths or ()), layout=layout, depths=depths)
    )
    return pd.DataFrame(rendered.report.records)


# -- training end to end ------------------------------------------------------------------------------


def train(
    task: str | TrainConfig, backbone: str | None = None, *, progress: bool | None = None, **settings: Any
) -> dict[str, Any]:
    """Train the FPT end to end (input layer, chosen backbone groups, output layer); what
    ``reservoir train`` runs, with its options as keyword arguments checked as it checks them.

    Parameters
    ----------
    task : str or TrainConfig
        A registered task or ``"file:PATH"``; or a whole [`TrainConfig`][reservoir.config.TrainConfig], and
        then no other settings.
    backbone : str or torch.nn.Module, optional
        A registered backbone, a folder saved with ``save_pretrained``, ``hf:ID`` (``hf:ID@REVISION`` to
        pin one), or a model object (a ``PreTrainedModel``, or any module the generic adapter maps),
        used through a copy (``None``: the config's default, ``gpt2-random``).
    progress : bool, optional
        Show progress (a bar, and status lines through the ``reservoir`` logger); ``None``: when someone
        is watching (a terminal or a notebook, :func:`reservoir.progress.interactive`).
    **settings
        Any field of [`TrainConfig`][reservoir.config.TrainConfig] (``trainable``, ``lr``, ``seeds``,
        ``steps``, ``batch_size``, ``eval_every``, ``patience``, ``limit``, ``task_options``, ...);
        ``lr`` and ``trainable`` take one value, a list, or comma-separated text.

    Returns
    -------
    dict
        The result (``mode="end-to-end"``), also written as JSON under ``results/TASK/BACKBONE/``:
        test accuracy at the best validation step, mean over seeds at the learning rate chosen on
        validation.

    Raises
    ------
    ValueError
        An unknown setting, task, backbone, task option or trainable group, naming the valid ones
        ([`UsageError`][reservoir.errors.UsageError]).

    Examples
    --------
    >>> result = train("bit_xor", "gpt2-random", lr=[1e-4, 1e-3], steps=2000, limit=1000)  # doctest: +SKIP
    >>> result["test_accuracy"], result["lr"]                          # doctest: +SKIP
    """
    from reservoir.train.loop import train as run

    if isinstance(task, TrainConfig):
        if settings or backbone is not None:
            raise UsageError(f"give either a TrainConfig or settings, not both (got {sorted(settings)})")
        settings = {k: v for k, v in dataclasses.asdict(task).items() if k not in ("task", "backbone")}
        task, backbone = task.task, task.backbone
    return run(configure(TrainConfig, task, backbone, **settings), progress=_watched(progress))

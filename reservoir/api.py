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
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from reservoir.config import (
    DEVICE,
    SEED,
    ExtractConfig,
    FitConfig,
    ReportConfig,
    TrainConfig,
    parse_input_scale,
    select_depths,
)
from reservoir.errors import ReservoirError, StoreError, UsageError, optional
from reservoir.settings import Interval, default, validate
from reservoir.tasks import TaskSpec, pad_ids

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


def _watched(progress: bool | None) -> bool:
    """``progress`` as asked; ``None``: on where someone is watching (a terminal or a notebook)."""
    from reservoir.progress import interactive

    return interactive() if progress is None else bool(progress)


def _backbone_name(backbone: Any) -> Any:
    """A backbone as configs take it: a name as it is; a model object (a ``PreTrainedModel``, a reservoir
    ``Backbone``, any ``torch.nn.Module`` the generic adapter can map) by the name that stands for it in
    this process (:func:`reservoir.model.backbones.register_object`)."""
    if backbone is None or isinstance(backbone, str):
        return backbone
    from reservoir.model.backbones import register_object

    return register_object(backbone)


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
    given = {k: v for k, v in (("task", task), ("backbone", _backbone_name(backbone))) if k in names}
    cfg = build(cls, **given, **settings)
    name = getattr(cfg, "task", None)
    if name is not None and not (name.startswith("file:") or name in TASKS):
        raise _refused("--task", f"unknown task {name!r}; choose from {TASKS.names()} or file:PATH")
    chosen = getattr(cfg, "backbone", None)
    if isinstance(chosen, str):
        try:
            parse_name(chosen)
        except UsageError as e:
            raise _refused("--backbone", str(e)) from None
    if "task_options" in names and name is not None:
        try:
            cfg = dataclasses.replace(cfg, task_options=check_options(name, cfg.task_options))
        except UsageError as e:
            raise _refused("--task-opt", str(e)) from None
    split = getattr(cfg, "split", None)
    if isinstance(cfg, ExtractConfig) and split != "all" and not name.startswith("file:"):
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


def read_features(
    path: str | Path,
    split: str,
    depth: int | None = None,
    *,
    depths: str | int | Sequence[int] | None = None,
    as_xarray: bool = False,
) -> Any:
    """Features and labels of one split of a feature file, read through the store's verified readers
    (every depth read is checked against the digests recorded when the file was completed).

    Parameters
    ----------
    path : str or Path
        A complete feature file (what [`extract`][reservoir.api.extract] returns).
    split : str
        A split it holds (``"train"``, ``"test"``, ...).
    depth : int, optional
        One depth: returns ``(X, y)``, ``X`` of shape ``(N, n_readout * d_model)`` (the readout
        tokens side by side) and the labels ``y``.
    depths : str, int or sequence of int, optional
        Several depths (``"all"``, the default without ``depth``; ``"0,6"``; a list; negative counts
        from the last stored one): returns ``(X, y, depths)``.
    as_xarray : bool
        Return an ``xarray.Dataset`` instead (either form; needs ``pip install xarray``):
        ``features`` on the dimensions ``(row, depth, readout, feature)``, ``labels`` on ``(row,)``
        (bit tasks: ``(row, readout, output)``), the coordinate ``depth``, and the file's task,
        backbone, dtype, readout, seed and identity hash as attributes.

    Returns
    -------
    tuple or xarray.Dataset
        ``(X, y)`` for one ``depth``; else ``(X, y, depths)`` with ``X`` float32 of shape
        ``(N, n_depths, n_readout, d_model)``, ``y`` the labels ``(N,)`` or ``(N, n_readout, bits)``,
        and ``depths`` the stored depths along ``X``'s second axis; a Dataset with ``as_xarray``.

    Raises
    ------
    ValueError
        Both ``depth`` and ``depths``, a split or depth the file lacks
        ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.StoreError
        A file that is unfinished, damaged or fails verification.
    ImportError
        ``as_xarray`` without xarray installed.

    Examples
    --------
    >>> X, y = read_features(path, "test", depth=2)                  # doctest: +SKIP
    >>> X, y, depths = read_features(path, "test")                   # doctest: +SKIP
    >>> X.shape, depths                                               # doctest: +SKIP
    ((100, 3, 1, 32), [0, 1, 2])
    >>> read_features(path, "test", as_xarray=True).features.sel(depth=2)   # doctest: +SKIP
    """
    from reservoir.extract.store import feature_splits, open_features, read_depth, read_depths, verify

    if depth is not None and depths is not None:
        raise UsageError(
            f"give depth ({depth!r}: one depth, flattened features) or depths ({depths!r}: several, "
            "(N, n_depths, n_readout, d_model)), not both"
        )
    xr = optional("xarray", "read_features(..., as_xarray=True)") if as_xarray else None
    path = Path(path)
    with open_features(path) as f:
        if depth is not None and xr is None:  # the single-depth form
            if split in f:
                verify(f, [depth] if depth in [int(d) for d in f.attrs["depths"]] else [], [split])
            X, y = read_depth(f, split, depth)
            return X.reshape(len(X), -1), y
        if split not in f:
            raise UsageError(f"split {split!r} is not in {path}; it holds {feature_splits(f)}")
        wanted = [depth] if depth is not None else ("all" if depths is None else depths)
        chosen = select_depths(wanted, [int(d) for d in f.attrs["depths"]], f"in {path}")
        verify(f, chosen, [split])
        X, y = read_depths(f, split, chosen)
        attrs = {
            "path": str(path),
            "split": split,
            "identity_hash": str(f.attrs["identity_hash"]),
            **{
                k: (f.attrs[k].item() if hasattr(f.attrs[k], "item") else f.attrs[k])
                for k in ("task", "backbone", "dtype", "readout", "seed")
                if k in f.attrs
            },
        }
    if xr is None:
        return X, y, chosen
    if y.ndim == 1:
        label_dims: tuple[str, ...] = ("row",)
    elif y.ndim == 3 and y.shape[1] == X.shape[2]:
        label_dims = ("row", "readout", "output")
    else:
        label_dims = ("row", *(f"label_axis{i}" for i in range(1, y.ndim)))
    return xr.Dataset(
        {"features": (("row", "depth", "readout", "feature"), X), "labels": (label_dims, y)},
        coords={"row": np.arange(len(X)), "depth": np.asarray(chosen, dtype=np.int64)},
        attrs=attrs,
    )


class FeatureDataset(torch.utils.data.Dataset):
    """One depth of one split of a feature file as a torch ``Dataset`` of ``(features, label)``.

    Rows are read lazily: the file is opened on the first read in each process (so every
    ``DataLoader`` worker opens its own handle; an HDF5 handle never crosses a fork), and a read
    fetches the chunk holding the row, checked by its Fletcher-32 checksum, keeping it for the rows
    after it: reading in order reads each chunk once, while fully random access (``shuffle=True``)
    reads a chunk a row; for a split that fits in memory,
    [`read_features`][reservoir.api.read_features] and a ``TensorDataset`` are faster. ``features``
    is a float32 tensor ``(n_readout * d_model,)`` (as [`read_features`][reservoir.api.read_features]
    with ``depth`` gives a row), ``label`` an int64 tensor (a scalar, or ``(n_readout, bits)``).

    Parameters
    ----------
    path : str or Path
        A complete feature file.
    split : str
        A split it holds.
    depth : int
        A depth it holds.
    verify : bool
        Check the depth and labels against the digests recorded when the file was completed
        before the first row is served (one pass over the depth; ``False`` skips it).

    Raises
    ------
    ValueError
        A split or depth the file lacks ([`UsageError`][reservoir.errors.UsageError]).
    reservoir.errors.StoreError
        A file that fails verification, or a row that cannot be read or is not finite.

    Examples
    --------
    >>> from torch.utils.data import DataLoader
    >>> data = FeatureDataset(path, "train", depth=2)                # doctest: +SKIP
    >>> for X, y in DataLoader(data, batch_size=64, shuffle=True, num_workers=2):  # doctest: +SKIP
    ...     loss = torch.nn.functional.cross_entropy(model(X), y)
    """

    def __init__(self, path: str | Path, split: str, depth: int, *, verify: bool = True):
        from reservoir.extract.store import depth_index, feature_splits, open_features
        from reservoir.extract.store import verify as verify_file

        self.path, self.split, self.depth = Path(path), split, int(depth)
        with open_features(self.path) as f:
            if split not in f:
                raise UsageError(f"split {split!r} is not in {self.path}; it holds {feature_splits(f)}")
            self._k = depth_index(f, self.depth)
            if verify:
                verify_file(f, [self.depth], [split])
            ds = f[split]["features"]
            self.labels = f[split]["labels"][:]
            self._rows = ds.chunks[0] if ds.chunks else 1
        self._file = self._pid = self._block = None

    def __len__(self) -> int:
        return len(self.labels)

    def _features(self):
        if self._file is None or self._pid != os.getpid():  # first read in this process (a worker)
            from reservoir.extract.store import open_features

            self._file, self._pid, self._block = open_features(self.path), os.getpid(), None
        return self._file[self.split]["features"]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.labels)
        i = int(index) + (n if int(index) < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"row {index} is out of range: split {self.split!r} of {self.path} has {n} rows")
        ds = self._features()
        start = i // self._rows * self._rows
        if self._block is None or self._block[0] != start:
            where = f"{self.path}: split {self.split!r}, depth {self.depth}"
            try:
                block = ds[start : start + self._rows, self._k]
            except OSError as e:
                raise StoreError(
                    f"{where} cannot be read ({str(e).splitlines()[0]}); the file is corrupt: delete "
                    "it and extract again"
                ) from None
            if not np.isfinite(block).all():
                raise StoreError(f"{where} holds NaN or inf features; delete the file and extract again")
            self._block = (start, block)
        row = self._block[1][i - start]
        return torch.from_numpy(np.array(row, dtype=np.float32).reshape(-1)), torch.as_tensor(self.labels[i])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_file"] = state["_pid"] = state["_block"] = (
            None  # a pickled copy (spawned worker) opens its own
        )
        return state

    def close(self) -> None:
        """Close this process's handle (a later read opens it again)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = self._pid = self._block = None


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


def predict(probe: Any, features: str | Path, split: str = "test") -> np.ndarray:
    """Class ids of a saved probe on one split of a feature file; what ``reservoir predict`` runs.

    The file must come from the probe's extraction settings (backbone, seed, input scale, dtype,
    readout, a depth the probe reads, the same feature and label shapes). On the file the probe was
    fitted on, the predictions are the fit's.

    Parameters
    ----------
    probe : str, Path or SavedProbe
        A ``RESULT.probe.npz`` path, or what [`load_probe`][reservoir.api.load_probe] returns.
    features : str or Path
        A complete feature file.
    split : str
        The split to predict.

    Returns
    -------
    numpy.ndarray
        Class ids ``(N, *label_shape)``.

    Raises
    ------
    reservoir.errors.IdentityError
        A file of other extraction settings, naming each difference.

    Examples
    --------
    >>> results = fit(features=path, depths=2, head="ridge")          # doctest: +SKIP
    >>> predictions = predict(results[0]["probe"], path, "test")      # doctest: +SKIP
    >>> accuracy = (predictions == read_features(path, "test", depth=2)[1]).mean()  # doctest: +SKIP
    >>> accuracy == results[0]["test_accuracy"]                       # doctest: +SKIP
    True
    """
    from reservoir.probe.saved import SavedProbe, predict_file
    from reservoir.probe.saved import load_probe as load

    return predict_file(probe if isinstance(probe, SavedProbe) else load(probe), features, split)[0]


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
        column (a depth ``dN``, ``chosen``, a task, or ``baseline``), test accuracy (fraction), its
        std over seeds, the number of seeds, validation accuracy, the depth chosen, ...

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


# -- the scikit-learn transformer -------------------------------------------------------------

_LOADED: dict[tuple[str, int], Any] = {}


def _backbone(name: str, seed: int):
    """Load once per (name, seed): every fold of a cross-validation shares the frozen model (a
    fresh copy, since the runner converts it to the compute dtype in place)."""
    import copy

    from reservoir.model.backbones import load_backbone

    name = _backbone_name(name)
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
        raise UsageError(
            f"X must be (N, T, d) floats, (N, T) integer ids or (N, T) floats (one value a token); "
            f"got {X.dtype} with shape {X.shape}"
        )
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
    ``sklearn.pipeline.Pipeline`` and cross-validation. The readout is the last real
    token of each sequence; features are those ``reservoir extract`` stores (a test checks it).

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
        ``(N, d_model)``; several give ``(N, n_depths * d_model)``, depth-major.
    seed : int
        Seeds the input layer and randomly initialised backbones.
    input_scale : str
        The input layer's scale, as ``reservoir extract --input-scale``.
    dtype : str
        Compute dtype, as ``reservoir extract --dtype`` (``"auto"``: the float dtype this machine
        multiplies fastest; ``"int8"``, or ``"int8-static"`` calibrated on the first rows given to
        ``fit``); features are returned as float32.
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
        From ``fit``: a setting outside its range, input of another shape, sequences longer than
        the backbone's positions ([`UsageError`][reservoir.errors.UsageError]).

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
        "batch_size": (Interval(1, None, integer=True),),
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
        from reservoir.model.devices import resolve_device
        from reservoir.model.reservoir import check_length
        from reservoir.runtime.engines import INT8_DTYPES, calibration_batches, calibration_rows
        from reservoir.runtime.runner import FeatureRunner, resolve_dtype

        validate(self, "ReservoirFeatures")
        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype, device)
        rows, kind, width = _sequences(X)
        backbone = _backbone(self.backbone, self.seed)
        self.depths_ = select_depths(
            self.depth, range(backbone.n_layers + 1), f"in backbone {_backbone_name(self.backbone)}"
        )
        vocab = 0
        if kind == "ids":
            vocab = self.vocab_size or int(max(r.max() for r in rows)) + 1
        self.spec_ = TaskSpec(
            "sklearn", kind, seq_len=max(len(r) for r in rows), n_classes=1, token_dim=width, vocab_size=vocab
        )
        check_length(self.spec_, backbone, _backbone_name(self.backbone))
        calibration = None
        if dtype in INT8_DTYPES:
            first = rows[: calibration_rows(self.spec_.seq_len, len(rows))]

            def calibration():
                return [
                    tokens
                    for batch in calibration_batches(len(first))
                    for _, tokens in self._batches([first[i] for i in batch], kind, width)
                ]

        self.runner_ = FeatureRunner.build(
            self.spec_,
            backbone,
            self.depths_,
            seed=self.seed,
            dtype=dtype,
            input_scale=parse_input_scale(self.input_scale),
            device=device,
            engine=self.engine,
            calibration=calibration,
        )
        self.n_features_out_ = len(self.depths_) * backbone.d_model
        return self

    def transform_depths(self, X: Any) -> np.ndarray:
        """Features ``(N, n_depths, d_model)``, one slice per depth in ``depths_``."""
        check_is_fitted(self, "runner_")
        rows, kind, width = _sequences(X)
        if kind != self.spec_.token_kind or width != self.spec_.token_dim:
            raise UsageError(
                f"X has {kind} tokens of width {width}, but this transformer was fitted on "
                f"{self.spec_.token_kind} tokens of width {self.spec_.token_dim}"
            )
        if kind == "ids":
            top = max(int(r.max()) for r in rows)
            if top >= self.spec_.vocab_size or min(int(r.min()) for r in rows) < 0:
                raise UsageError(
                    f"token ids must lie in [0, {self.spec_.vocab_size}); got up to {top}. "
                    "Set vocab_size to cover every id"
                )
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
        """Output feature names ``depth{k}_{i}``, depth-major as
        [`transform`][reservoir.api.ReservoirFeatures.transform] lays them out."""
        check_is_fitted(self, "runner_")
        d = self.runner_.backbone.d_model
        return np.array([f"depth{k}_{i}" for k in self.depths_ for i in range(d)], dtype=object)

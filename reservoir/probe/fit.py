"""Fit a linear head per depth on a feature file and write one result per depth.

The file is ``--features`` or the one complete file extracted for ``--task`` and ``--backbone``; either
way its recorded identity must name the task asked for (for ``file:PATH`` tasks, the data digest must
match the file's contents), so results are never written under the wrong name.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from reservoir.config import FitConfig, select_depths
from reservoir.errors import DataError, IdentityError, StoreError, UsageError
from reservoir.extract.h5 import h5_file
from reservoir.extract.store import (
    check_header,
    class_names,
    command_of,
    extract_command,
    feature_splits,
    file_config,
    iter_depth,
    open_features,
    stored_identity,
    verify,
    writer_of,
)
from reservoir.identity import canonical, reread, short, task_label
from reservoir.model.backbones import label as backbone_label
from reservoir.model.devices import resolve_device
from reservoir.paths import FILE_TASK, default_data_dir, features_dir, file_task_path, slug
from reservoir.probe.heads import check_head_fits, fit_probe, noting_convergence
from reservoir.probe.metrics import score_line
from reservoir.probe.predictors import Predictor
from reservoir.probe.rows import Rows, rows
from reservoir.progress import log
from reservoir.results import Result, result_path, write_result
from reservoir.runtime import machine
from reservoir.settings import default, option_name, selecting
from reservoir.tasks import VALIDATION_SPLITS, unread_splits
from reservoir.tasks import split_roles as roles_of


class FileRows(Rows):
    """One depth of one split of a feature file (``index``: a subset of its rows), streamed in blocks."""

    def __init__(self, f: h5py.File, split: str, depth: int, index=None, labels: np.ndarray | None = None):
        self.f, self.split, self.depth, self.index = f, split, depth, index
        self.labels = f[split]["labels"][:] if labels is None else labels

    def take(self, index) -> FileRows:
        return FileRows(
            self.f,
            self.split,
            self.depth,
            index if self.index is None else self.index[index],
            self.labels[index],
        )

    @property
    def nbytes(self) -> int:
        ds = self.f[self.split]["features"]
        return self.n * int(np.prod(ds.shape[2:])) * ds.dtype.itemsize

    def blocks(self):
        for X, y in iter_depth(self.f, self.split, self.depth, select=self.index):
            yield rows(X, y)


#: the identity keys :func:`describe_file` always shows
DESCRIBED = ("backbone", "seed", "dtype", "limit", "subset", "depths", "readout")


def describe_file(p: Path, i: dict[str, Any], differ: Sequence[str] = ()) -> str:
    """A feature file's line in fit's messages: its main settings, and those of ``differ`` (the keys the
    files listed beside it differ in), so that no two lines read alike."""
    subset = i.get("subset") or {}
    limit = f"limit {i['limit']}" + (f" ({subset['rule']})" if i["limit"] and subset.get("rule") else "")
    extra = "".join(f", {k} {short(i.get(k), 40)}" for k in differ if k not in DESCRIBED)
    return (
        f"  {p}  (backbone {i['backbone']}, seed {i['seed']}, {i['dtype']}, {limit}, "
        f"depths {i['depths'][0]}..{i['depths'][-1]}, readout {i['readout']}{extra})"
    )


def extraction_mismatch(identity: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """Which of the extraction settings ``wanted`` (:attr:`reservoir.config.FitConfig.extraction`) the
    recorded ``identity`` differs in, or ``None``."""
    from reservoir.tasks import Task

    for key, value in wanted.items():
        if key == "task_options":
            recorded = identity.get("task_options", {})
            for option, given in value.items():
                if recorded.get(option) != given and option not in Task.FETCHING:
                    return f"task option {option}={recorded.get(option)!r}"
        elif identity.get(key) != value:
            return f"{key} {identity.get(key)!r}"
    return None


def other_weights(backbone: str, identity: dict[str, Any], read: dict) -> bool:
    """Whether a folder backbone, recorded by its base name only, holds other weights than the file was
    extracted from: loaded as the extraction loaded it, by fingerprint (``read`` caches them). A registered
    name or setting says its weights itself; a folder no longer there cannot be checked."""
    import contextlib
    import io

    from reservoir.model.backbones import fingerprint, load_backbone, parse_name

    parsed = parse_name(backbone)
    if parsed.source != "folder" or not Path(parsed.base).is_dir():
        return False
    seed, dtype = identity.get("seed", 0), identity.get("load_dtype", "float32")
    if (backbone, seed, dtype) not in read:
        with contextlib.redirect_stderr(io.StringIO()):  # the adapter's notes belong to extraction
            read[backbone, seed, dtype] = fingerprint(load_backbone(backbone, seed, dtype))
    return read[backbone, seed, dtype] != identity.get("backbone_fingerprint")


def identity_mismatch(task: str, backbone: str | None, identity: dict[str, Any], read: dict) -> str | None:
    """Why a feature file's recorded ``identity`` is not of ``task`` (and ``backbone``), or ``None``; for
    ``file:PATH`` tasks, by the data digest, and for folder backbones by their weights (``read`` caches the
    tasks built and the weights read)."""
    if identity.get("task") != task_label(task):
        return f"task {identity.get('task')!r}"
    if backbone is not None and identity.get("backbone") != backbone_label(backbone):
        return f"backbone {identity.get('backbone')!r}"
    if backbone is not None and other_weights(backbone, identity, read):
        return f"another folder named {identity.get('backbone')!r} (other weights)"
    if (path := file_task_path(task)) is not None:
        from reservoir.tasks.userfile import FileTask

        key = canonical(identity["task_options"])
        if key not in read:
            read[key] = FileTask.recorded(path, **identity["task_options"])
        if reread(read[key], identity, ".") is None:
            return f"the data of another file named {Path(path).name!r}"
    return None


def find_features(task: str, backbone: str | None, wanted: dict[str, Any] | None = None) -> Path:
    """The one complete feature file under ``features/`` whose recorded identity is of ``task``, ``backbone``
    and the extraction settings ``wanted``."""
    folder = features_dir() / slug(task_label(task))
    pattern = f"{slug(backbone_label(backbone))}/*.h5" if backbone else "*/*.h5"
    found = sorted(folder.glob(pattern))
    what = f"task {task!r}" + (f" and backbone {backbone!r}" if backbone else "")
    command = command_of({"task": task, "backbone": backbone, **(wanted or {})})
    if not found:
        partial = sorted(folder.glob(pattern + ".partial"))
        if partial:  # the extract that writes it, not a command of fit's options (which may lack its own)
            final = partial[0].with_name(partial[0].name.removesuffix(".partial"))
            writer = writer_of(final)
            how = (
                f"being written by {writer}: wait for it to finish"
                if writer
                else "rerun the extract that wrote it"
            )
            raise StoreError(
                f"no complete feature file for {what} under {folder}: {len(partial)} unfinished, e.g. "
                f"{partial[0]} ({how}), or pass --features FILE"
            )
        raise StoreError(
            f"no feature file for {what} under {folder}; run `{command}` first, or pass --features FILE"
        )
    matching, others, read = [], [], {}
    for p in found:
        try:
            with h5_file(p) as f:
                i = stored_identity(f)
        except (OSError, StoreError):
            others.append(f"  {p}  (unreadable, or not a feature file)")
            continue
        why = identity_mismatch(task, backbone, i, read) or extraction_mismatch(i, wanted or {})
        if why is None and (i.get("task_options") or {}).get("predict"):
            why = "data read to predict on (predict=true), which has no train split to fit"
        if why is None:
            matching.append((p, i))
        else:
            others.append(f"  {p}  (holds features of {why})")
    if len(matching) == 1:
        return matching[0][0]
    if not matching:
        raise StoreError(
            f"none of the {len(found)} feature files under {folder} holds features of {what}:\n"
            + "\n".join(others)
            + f"\nrun `{command}` first, or pass --features FILE"
        )
    keys = sorted(set().union(*(i for _, i in matching)))
    differ = [k for k in keys if len({canonical(i.get(k)) for _, i in matching}) > 1]
    chooses = selecting(FitConfig)
    options = [option_name(FitConfig, chooses[k]) for k in differ if k in chooses]
    raise StoreError(
        f"{len(matching)} feature files match {what}, differing in {', '.join(differ)}; pass --features with "
        "one of them"
        + (f", or {' or '.join(options)} to choose" if options else " (no option of fit chooses by these)")
        + ":\n"
        + "\n".join(describe_file(p, i, differ) for p, i in matching)
    )


def check_task(f: h5py.File, identity: dict[str, Any], cfg: FitConfig) -> tuple[Any, dict[str, Any]] | None:
    """The file belongs to ``cfg.task`` and ``cfg.backbone`` (when given); IdentityError otherwise.
    For a ``file:PATH`` task, returns the task and its data (read to check them), else ``None``."""
    if cfg.task is not None and task_label(cfg.task) != identity["task"]:
        raise IdentityError(
            f"{f.filename} holds features of task {identity['task']!r}, not {cfg.task!r}; pass the "
            "feature file of that task, or leave out --task to take it from the file"
        )
    if cfg.backbone is not None and backbone_label(cfg.backbone) != identity["backbone"]:
        raise IdentityError(
            f"{f.filename} holds features of backbone {identity['backbone']!r}, not {cfg.backbone!r}; "
            "pass the feature file of that backbone, or leave out --backbone"
        )
    if cfg.backbone is not None and other_weights(cfg.backbone, identity, {}):
        raise IdentityError(
            f"{f.filename} holds features of another folder named {identity['backbone']!r}: {cfg.backbone} holds "
            "other weights; extract its features first, or leave out --backbone"
        )
    if (path := file_task_path(cfg.task)) is not None:
        from reservoir.tasks.userfile import FileTask

        task = FileTask.recorded(path, **identity["task_options"])
        data = reread(task, identity, ".")
        if data is None:
            raise IdentityError(
                f"{f.filename} was extracted from another file named {Path(path).name!r} "
                f"(its contents differ from {path}); extract this file first, or pass the "
                "features of this one"
            )
        return task, data
    return None


def check_sizes(
    path: Path, y_train, cfg: FitConfig, has_val: bool, limit: int | None = None, n_classes: int = 0
) -> None:
    """Refuse up front a train split too small for the head's validation split or its classes
    (:func:`reservoir.tasks.sizes.check_train_split`)."""
    import math

    from reservoir.tasks.sizes import check_train_split

    check_train_split(
        str(path),
        y_train,
        limit=limit,
        val_fraction=cfg.val_fraction,
        n_val=None if has_val else (lambda n: math.ceil(cfg.val_fraction * n)),
        n_classes=n_classes,
        extracted=True,
        default_fraction=default(FitConfig, "val_fraction"),
    )


def task_classes(identity: dict[str, Any]) -> int:
    """The classes of a registered task as recorded (0 for ``file:`` tasks: their labels tell)."""
    from reservoir.tasks import TASKS, get_task

    if identity["task"] not in TASKS:
        return 0
    try:
        return get_task(identity["task"], **identity.get("task_options", {})).spec.n_classes
    except (UsageError, TypeError):  # options of another version of the task
        return 0


def check_label_rows(path: Path, f: h5py.File, identity: dict[str, Any]) -> None:
    """Refuse (DataError) a file whose readout rows per example differ from its labels per example."""
    rows_per = f["train"]["features"].shape[2]
    labels = f["train"]["labels"]
    per = 1 if labels.ndim == 1 else labels.shape[1]
    if rows_per != per:
        raise DataError(
            f"{path} holds {rows_per} readout rows per example (--readout {identity.get('readout')}) but "
            f"{per} label(s) per example, and a head pairs each row with one label; extract with --readout "
            "last or mean to fit this task, or read the rows with reservoir.api.read_features to fit "
            "targets of your own"
        )


def check_split_classes(path: Path, f: h5py.File, identity: dict[str, Any]) -> None:
    """Refuse (DataError) a feature file whose train split lacks classes another split holds
    (:func:`reservoir.tasks.sizes.check_classes`)."""
    from reservoir.tasks.sizes import check_classes

    limit = identity.get("limit")
    again = f"extract it again: `{extract_command(f)}`"
    if limit is not None and "subset" not in identity:
        fix = (
            f"this file holds the first {limit} rows of each split (--limit before it drew a stratified sample); "
            f"{again}, which draws one"
        )
    elif limit is not None:
        fix = f"extract it again with a larger --limit (now {limit}) or none (`{extract_command(f)}`, edited)"
    else:
        fix = (
            "give every split examples of every class (or drop the rows of the classes a split lacks), then "
            + again
        )
    check_classes(
        str(path),
        {s: f[s]["labels"][:] for s in feature_splits(f)},
        limit=limit,
        names=class_names(f),
        fix=fix,
    )


def split_roles(f: h5py.File, order: list[str]) -> tuple[str | None, list[str]]:
    """The validation split (or None) and the test splits of a feature file (:func:`reservoir.tasks.split_roles`)."""
    val, tests = roles_of(
        [s for s in order if s in f] + [s for s in VALIDATION_SPLITS if s in f and s not in order]
    )
    return val, list(tests)


def fit(cfg: FitConfig, *, progress: bool = True) -> list[dict[str, Any]]:
    """Fit ``cfg.head`` at each requested depth, then (``cfg.baselines``) the baselines of the same data
    (:mod:`reservoir.probe.baselines`); returns the result dicts, each also written as JSON, and saves each
    depth's head beside its result (:mod:`reservoir.probe.saved`).

    Regularisation is chosen on the file's validation split when it has one, else on a seeded
    ``val_fraction`` of train. With several test splits, ``test_accuracy`` is the first's (``test_split``)
    and ``test_accuracies`` / ``n_tests`` hold every one.
    """
    path = Path(cfg.features) if cfg.features else find_features(cfg.task, cfg.backbone, cfg.extraction)
    results = []
    with open_features(path) as f:
        identity = stored_identity(f)
        recorded = file_task_path(file_config(f).get("task"))
        if cfg.task is None and recorded is not None and Path(recorded).exists():
            try:  # the file the features came from, still there and unchanged: its baselines too
                named = dataclasses.replace(cfg, task=FILE_TASK + recorded)
                checked, cfg = check_task(f, identity, named), named
            except IdentityError:  # the file changed: no baselines, but the backbone is still checked
                checked = check_task(f, identity, dataclasses.replace(cfg, task=None))
        else:
            checked = check_task(f, identity, cfg)
        other = extraction_mismatch(identity, cfg.extraction)
        if other is not None:
            raise IdentityError(f"{path} holds features of {other}, not of the extraction asked for")
        depths = select_depths(cfg.depths, identity["depths"], f"in {path}")
        fix = f"extract it again: `{extract_command(f)}`"
        check_header(f, fix)
        val, tests = split_roles(f, identity["splits"])
        unread = unread_splits([s for s in identity["splits"] if s in f])
        if unread and "train" in f and tests:
            log(f"{path}: {unread}", progress)
        if "train" not in f or not tests:
            raise StoreError(
                f"{path} has no {'train' if 'train' not in f else 'test'!r} split (it holds "
                f"{feature_splits(f)}); "
                + (
                    "it holds data read to predict on (predict=true): extract labeled train and test rows to fit"
                    if identity.get("task_options", {}).get("predict")
                    else "extract it with --split all"
                )
            )
        extract_cfg = file_config(f)
        # verify the depths fitted, of every split read, against the digests recorded at completion
        verify(
            f,
            depths,
            ["train", *([val] if val else []), *tests],
            fix=fix,
        )
        check_label_rows(path, f, identity)
        check_split_classes(path, f, identity)
        labels = np.concatenate([f[s]["labels"][:].ravel() for s in feature_splits(f)])
        regression = labels.dtype.kind == "f"
        if cfg.head is None:  # the default head of the file's targets
            cfg = dataclasses.replace(cfg, head="ridge" if regression else "logreg")
        try:
            check_head_fits(cfg.head, labels)
        except ValueError as e:
            raise DataError(f"{path} holds {e}") from None
        check_sizes(
            path,
            f["train"]["labels"][:],
            cfg,
            val is not None,
            identity.get("limit"),
            0 if regression else max(len(np.unique(labels)), task_classes(identity)),
        )
        of_file = None  # what every depth's probe records of the file, read at the first
        for depth in depths:
            with noting_convergence(f"depth {depth}"):
                scores, predictor = fit_probe(
                    cfg.head,
                    FileRows(f, "train", depth),
                    {t: FileRows(f, t, depth) for t in tests},
                    val=FileRows(f, val, depth) if val else None,
                    val_fraction=cfg.val_fraction,
                    seed=cfg.seed,
                    device=cfg.device if cfg.head == "torch" else "cpu",
                    memory_bytes=cfg.memory_mb * 2**20,
                )
            scores["test_split"] = tests[0]
            head_on = machine.on(resolve_device(cfg.device) if cfg.head == "torch" else "cpu")
            result = Result(
                task=identity["task"],
                backbone=identity["backbone"],
                mode="output-only",
                depth=depth,
                head=cfg.head,
                trainable=["out"],
                seed=cfg.seed,
                identity=identity,
                identity_hash=f.attrs["identity_hash"],
                config={"fit": {**cfg.to_json(), "features": str(path)}, "extract": extract_cfg},
                scores=scores,
                seconds=scores["seconds"],
                machines=list(dict.fromkeys(m for m in (extract_cfg.get("machine"), head_on) if m)),
                extra={"features": str(path)},
            ).to_json()
            # the head, saved beside its result before the result names it
            if isinstance(predictor, Predictor):
                from reservoir.probe.saved import file_meta, probe_path, save_probe

                of_file = of_file or file_meta(f)
                result["probe"] = str(
                    save_probe(probe_path(result_path(result)), predictor, f, result, of_file)
                )
            result["path"] = str(write_result(result))
            results.append(result)
            if progress:
                print(f"depth {depth}: {score_line(scores)}", file=sys.stderr)
        if results and not results[-1]["seeded"] and cfg.seed != default(FitConfig, "seed"):
            log(
                f"--seed {cfg.seed} changed nothing: {path} has a validation split of its own and head {cfg.head} "
                f"takes no seed, so every seed fits these probes alike (the report counts them once); features "
                "of another seed: extract with --seed, then fit with --extract-seed",
                progress,
            )
        if cfg.baselines:
            if file_task_path(identity["task"]) is not None and not cfg.task:
                log(
                    f"no baselines: the file the features came from ({recorded or 'unrecorded'}) is not "
                    "there or has changed; pass --task file:PATH of that data to compute them",
                    progress,
                )
            else:
                from reservoir.probe.baselines import fit_baselines

                data_dir = Path(cfg.data_dir or extract_cfg.get("data_dir") or default_data_dir())
                results += fit_baselines(
                    identity,
                    f["train"]["features"].shape[-1],
                    cfg,
                    val,
                    tests,
                    data_dir=data_dir,
                    loaded=checked,
                    progress=progress,
                )
    return results

"""``reservoir data list | where | fetch | verify``: what each task needs, where it looks, what is there.

Each task's data is described by a :class:`Source`: the folders it looks in (in order), the
files it expects, how to fetch them, and the official checksums where they are known. The
data folder is ``--data-dir``, else ``$RESERVOIR_HOME/data``, else ``./data``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reservoir.registry import Registry
from reservoir.tasks import TASKS, DataError, Task, get_task
from reservoir.tasks.download import DataArchive, check_archive, md5sum


@dataclass
class Source:
    """Where a task's data lives and how to get it.

    ``looks_in`` are the places searched, in order; ``files`` the paths that must exist, in groups of
    alternatives (a split's LMDB or JSON); ``fetch(download)`` makes them present or raises a DataError
    saying which files to place where; ``official_md5`` maps files to their official checksums (of the
    decompressed content when ``gunzip_md5``); ``sizes`` gives the official examples per split.
    """

    task: str
    needs: str
    looks_in: tuple[Path, ...] = ()
    files: tuple[tuple[Path, ...], ...] = ()
    fetch: Callable[[bool], object] | None = None
    official_md5: dict[Path, str] = field(default_factory=dict)
    gunzip_md5: bool = False
    sizes: dict[str, int] = field(default_factory=dict)
    archive: tuple[Path, DataArchive] | None = None

    @property
    def generated(self) -> bool:
        return not self.files

    def missing(self) -> list[tuple[Path, ...]]:
        return [group for group in self.files if not any(p.exists() for p in group)]

    def status(self) -> str:
        if self.generated:
            return "no files"
        missing = self.missing()
        return "present" if not missing else f"missing {len(missing)} of {len(self.files)}"


#: where each task that reads files finds them, by task name (registered here or by the task's module)
SOURCES: Registry[Source] = Registry("data source", home="reservoir.tasks")


def source(*names: str):
    """Register ``f(task, data_dir) -> Source`` for the named tasks."""

    def add(f: Callable[[Task, Path], Source]):
        for n in names:
            SOURCES.register(n, f)
        return f

    return add


def source_of(task: Task, data_dir: Path) -> Source:
    if task.spec.name.startswith("file:"):
        return _file_source(task)
    if task.name not in SOURCES:
        return Source(task.name, "generated on the fly (no files)")
    return SOURCES.factory(task.name)(task, Path(data_dir))


@source("cifar10", "cifar10_lra")
def _cifar(task: Task, data_dir: Path) -> Source:
    from reservoir.tasks import cifar

    places = cifar.look_in(data_dir)
    found = next((p for p in places if all((p / m).exists() for m in cifar.ARCHIVE.members)), places[0])
    return Source(
        task.name,
        "CIFAR-10 python batches (data_batch_1..5, test_batch, batches.meta) or the official archive",
        looks_in=(*places, data_dir / cifar.FOLDER / cifar.ARCHIVE.name),
        files=tuple((found / m,) for m in cifar.ARCHIVE.members),
        fetch=lambda download: cifar.batches_folder(data_dir, task.name, download),
        official_md5={found / k: v for k, v in cifar.OFFICIAL_MD5.items()},
        archive=(data_dir / cifar.FOLDER / cifar.ARCHIVE.name, cifar.ARCHIVE),
        sizes={"train": 45000, "val": 5000, "test": 10000}
        if "val" in task.spec.splits
        else {"train": 50000, "test": 10000},
    )


@source("mnist")
def _mnist(task: Task, data_dir: Path) -> Source:
    from reservoir.tasks.download import ensure_files
    from reservoir.tasks.images import MNIST_DATA

    folder = data_dir / "mnist"
    return Source(
        "mnist",
        "MNIST IDX files (train/t10k images and labels, .gz)",
        looks_in=(folder,),
        files=tuple((folder / f.name,) for f in MNIST_DATA),
        fetch=lambda download: ensure_files(folder, MNIST_DATA, "mnist", download),
        official_md5={folder / f.name: f.md5 for f in MNIST_DATA},
        gunzip_md5=True,
        sizes={"train": 60000, "test": 10000},
    )


@source("remote_homology")
def _homology(task: Task, data_dir: Path) -> Source:
    from reservoir.tasks import homology

    return Source(
        "remote_homology",
        "TAPE remote-homology splits, LMDB or JSON (no published checksum: counts are checked)",
        looks_in=(data_dir / homology.FOLDER,),
        files=tuple(homology.split_files(data_dir, s) for s in homology.SPLITS),
        fetch=lambda download: [homology.find_split(data_dir, s, download) for s in homology.SPLITS],
        archive=(data_dir / homology.ARCHIVE.name, homology.ARCHIVE),
        sizes=homology.TAPE_SIZES,
    )


@source("listops")
def _listops(task: Task, data_dir: Path) -> Source:
    if getattr(task, "source", "generate") != "lra":
        return Source(
            "listops", "generated by the LRA procedure (no files; --task-opt source=lra reads LRA's TSVs)"
        )
    folder = data_dir / "listops"
    files = tuple((folder / f"basic_{s}.tsv",) for s in ("train", "val", "test"))

    def fetch(download: bool):
        missing = [g[0].name for g in files if not g[0].exists()]
        if missing:
            raise DataError(
                f"listops (source=lra) needs {', '.join(missing)} in {folder}: copy basic_train.tsv, "
                "basic_val.tsv and basic_test.tsv from the Long Range Arena release "
                "(github.com/google-research/long-range-arena, listops-1000/) there, "
                "or use the generator (--task-opt source=generate)"
            )
        return folder

    return Source(
        "listops", "LRA ListOps TSVs basic_{train,val,test}.tsv", looks_in=(folder,), files=files, fetch=fetch
    )


@source("digits")
def _digits(task: Task, data_dir: Path) -> Source:
    return Source("digits", "bundled with scikit-learn (no files)")


def _file_source(task: Task) -> Source:
    path = Path(task.options()["path"])
    return Source(
        task.spec.name,
        "your file or folder (.npz, .h5, Parquet, Arrow, a datasets folder or an image folder)",
        looks_in=(path,),
        files=((path,),),
    )


def data_dir_origin(data_dir: Path | None) -> tuple[Path, str]:
    """The data folder in use and why."""
    from reservoir.config import default_data_dir

    if data_dir is not None:
        return Path(data_dir), "--data-dir"
    if os.environ.get("RESERVOIR_HOME"):
        return default_data_dir(), "$RESERVOIR_HOME/data"
    return default_data_dir(), "./data (no --data-dir, RESERVOIR_HOME unset)"


def list_rows(data_dir: Path) -> list[str]:
    """One line per registered task: name, status, where it looks first, what it needs."""
    rows = []
    for name in TASKS.names():
        s = source_of(get_task(name), data_dir)
        have = [p for group in s.files for p in group if p.exists()]
        where = str(have[0].parent) if have and not s.missing() else str(s.looks_in[0]) if s.looks_in else "-"
        rows.append(f"{name:16s} {s.status():16s} {where}  [{s.needs}]")
    return rows


def where_lines(data_dir: Path, origin: str, names: list[str]) -> list[str]:
    lines = [f"data folder: {data_dir}  (from {origin})", ""]
    for name in names:
        task = get_task(name)
        s = source_of(task, data_dir)
        lines.append(f"{name}: {s.needs}")
        for p in s.looks_in:
            lines.append(f"  looks in {p}{'  (exists)' if p.exists() else ''}")
        for group in s.files:
            have = next((p for p in group if p.exists()), None)
            shown = " | ".join(str(p) for p in group)
            lines.append(f"  {'have' if have else 'need'} {have or shown}")
    from reservoir.tasks.streams import LAYOUTS

    return [*lines, "", *LAYOUTS]


def fetch(task: Task, data_dir: Path) -> list[str]:
    """Make the task's files present (download where possible); raises DataError saying what to place where."""
    s = source_of(task, data_dir)
    if s.fetch is None:
        return [f"{s.task}: nothing to fetch ({s.needs})"]
    s.fetch(True)
    s = source_of(task, data_dir)  # locations may have changed (unpacked archive)
    return [f"{s.task}: ready"] + [f"  {next(p for p in g if p.exists())}" for g in s.files]


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def verify(task: Task, data_dir: Path) -> Report:
    """Check presence, checksums and every split's contents (shapes, labels) of a task's data."""
    r = Report()
    s = source_of(task, data_dir)
    r.lines.append(f"{s.task}: {s.needs}")
    if s.generated:
        r.lines.append("  no files to verify")
    missing = s.missing()
    if missing:
        try:
            if s.fetch is None:
                raise DataError(f"missing {' or '.join(str(p) for p in missing[0])}")
            s.fetch(False)  # unpacks a local archive; never downloads
        except DataError as e:
            r.problems.append(str(e))
            return r
        s = source_of(task, data_dir)
    if s.archive and s.archive[0].exists():
        try:
            check_archive(*s.archive)
            r.lines.append(f"  archive {s.archive[0]}: size and checksum ok")
        except DataError as e:
            r.problems.append(str(e))
    for path, md5 in s.official_md5.items():
        if not path.exists():
            continue
        try:
            got = md5sum(path, s.gunzip_md5)
        except DataError as e:
            r.problems.append(str(e))
            continue
        verdict = (
            "official"
            if got == md5
            else f"md5 {got} differs from the official {md5} (accepted if it loads below)"
        )
        r.lines.append(f"  {path.name}: {verdict}")
    spec = task.spec
    sizes = s.sizes
    for split in spec.splits:
        try:
            d = task.load(split, data_dir)
        except DataError as e:
            r.problems.append(str(e))
            continue
        labels = d.labels.reshape(len(d), -1) if len(d) else d.labels
        if len(d) and spec.target != "regression" and (labels.min() < 0 or labels.max() >= spec.n_classes):
            r.problems.append(
                f"{split}: labels {labels.min()}..{labels.max()} outside 0..{spec.n_classes - 1}"
            )
        seen = len(np.unique(d.labels)) if d.labels.ndim == 1 else spec.n_classes
        extra = f" of the official {sizes[split]}" if split in sizes else ""
        trunc = getattr(task, "truncated", {}).get(split)
        extra += f"; {trunc} truncated to {spec.seq_len} tokens" if trunc else ""
        r.lines.append(
            f"  {split}: {len(d)} examples{extra}, {seen} distinct labels, "
            f"lengths {int(d.lengths.min()) if len(d) else 0}..{int(d.lengths.max()) if len(d) else 0}"
        )
    return r

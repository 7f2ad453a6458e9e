"""Data files and archives: where a task looks, checksums, and downloads that give up fast when offline."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reservoir.errors import DataError, unreadable

TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class DataFile:
    """One file a task needs: its name in the task's folder, checksum and download sources (``md5`` is of
    the decompressed content when ``gunzip_md5``, so a re-compressed copy still verifies)."""

    name: str
    md5: str
    urls: tuple[str, ...] = ()
    gunzip_md5: bool = False


def md5sum(path: Path, gunzip: bool = False) -> str:
    h = hashlib.md5()
    opener = gzip.open if gunzip else open
    try:
        with opener(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except (OSError, EOFError) as e:
        raise unreadable(path, e, "delete it and fetch it again") from None
    return h.hexdigest()


def verify(path: Path, md5: str, gunzip: bool = False) -> None:
    """Raise DataError when the md5 of ``path`` (of its decompressed content when ``gunzip``) is not ``md5``."""
    got = md5sum(path, gunzip)
    if got != md5:
        raise DataError(f"{path} has checksum {got}, expected {md5}; delete it and fetch it again")


def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as r, open(dest, "wb") as f:
        shutil.copyfileobj(r, f)


def fetch_verified(urls: Sequence[str], dest: Path, check, errors: list[str]) -> bool:
    """Download the first of ``urls`` that works into a temporary file, ``check`` it, rename it to ``dest``;
    failures are appended to ``errors``. Returns whether ``dest`` now exists."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for url in urls:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        os.close(fd)
        try:
            _download(url, Path(tmp))
            check(Path(tmp))
            os.replace(tmp, dest)
            return True
        except (OSError, DataError) as e:
            errors.append(f"{url}: {e}")
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return False


def ensure_files(folder: Path, files: tuple[DataFile, ...], task: str, download: bool = True) -> list[Path]:
    """Return the paths of ``files`` in ``folder``, downloading missing ones when the network allows;
    :class:`DataError` naming the files to place there when some cannot be had."""
    missing = [f for f in files if not (folder / f.name).exists()]
    errors: list[str] = []
    if missing and download and not os.environ.get("RESERVOIR_OFFLINE"):
        missing = [
            f
            for f in missing
            if not fetch_verified(
                f.urls, folder / f.name, lambda tmp, f=f: verify(tmp, f.md5, f.gunzip_md5), errors
            )
        ]
    if missing:
        names = ", ".join(f.name for f in missing)
        why = f" (download failed: {errors[0]})" if errors else ""
        raise DataError(
            f"task {task!r} needs {names} in {folder}{why}; place the files there "
            f"or point --data-dir (or RESERVOIR_HOME) at a folder that has {task}/ with them"
        )
    return [folder / f.name for f in files]


@dataclass(frozen=True)
class DataArchive:
    """A compressed archive that unpacks into ``contents`` (relative to the task's folder), holding
    ``members``; ``md5`` and ``size`` are of the archive (``md5=None``: no checksum is published)."""

    name: str
    md5: str | None
    urls: tuple[str, ...]
    contents: str
    members: tuple[str, ...]
    size: int | None = None

    def describe(self) -> str:
        check = f"md5 {self.md5}" if self.md5 else "no published checksum"
        return f"{self.name} ({check}; from {self.urls[0] if self.urls else 'no known source'})"


def check_archive(path: Path, archive: DataArchive) -> None:
    """Raise DataError when ``path`` is shorter than the archive should be, or its md5 differs."""
    size = os.path.getsize(path)
    if archive.size is not None and size < archive.size:
        raise DataError(f"{path} is truncated ({size} of {archive.size} bytes); delete it and fetch it again")
    if archive.md5 is not None:
        verify(path, archive.md5)


def unpack(path: Path, folder: Path, archive: DataArchive) -> Path:
    """Unpack ``path`` into ``folder``, moved into place once every member is there; returns the contents."""
    dest = folder / archive.contents
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".{archive.name}.", suffix=".unpack"))
    try:
        try:
            with tarfile.open(path, "r:*") as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(tmp, filter="data")
                else:  # pragma: no cover - Python < 3.11.4
                    tar.extractall(tmp)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            raise DataError(
                f"{path} is truncated or not a valid archive ({type(e).__name__}: {e}); "
                "delete it and fetch it again"
            ) from None
        missing = [m for m in archive.members if not (tmp / archive.contents / m).exists()]
        if missing:
            raise DataError(
                f"{path} does not hold {archive.contents}/{missing[0]}; delete it and fetch it again"
            )
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp / archive.contents, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def find_contents(candidates: Sequence[Path], members: Sequence[str]) -> Path | None:
    """The first folder in ``candidates`` that holds every one of ``members``."""
    for c in candidates:
        if all((c / m).exists() for m in members):
            return c
    return None


def ensure_archive(
    folder: Path, archive: DataArchive, task: str, download: bool = True, look_in: Sequence[Path] = ()
) -> Path:
    """Return a folder holding the archive's ``members``: an unpacked folder (in ``folder`` or ``look_in``,
    accepted without the archive checksum), else the archive in ``folder`` verified and unpacked, else a
    download when allowed; :class:`DataError` saying which files to place where otherwise."""
    folder = Path(folder)
    candidates = [folder / archive.contents, *map(Path, look_in)]
    found = find_contents(candidates, archive.members)
    if found is not None:
        return found
    local = folder / archive.name
    if local.exists():
        check_archive(local, archive)
        return unpack(local, folder, archive)
    errors: list[str] = []
    if (
        download
        and archive.urls
        and not os.environ.get("RESERVOIR_OFFLINE")
        and fetch_verified(archive.urls, local, lambda tmp: check_archive(tmp, archive), errors)
    ):
        return unpack(local, folder, archive)
    partial = [c for c in candidates if c.is_dir()]
    have = ""
    if partial:
        missing = [m for m in archive.members if not (partial[0] / m).exists()]
        have = f"; {partial[0]} exists but lacks {', '.join(missing)}"
    also = f" (or at {', '.join(str(c) for c in candidates[1:])})" if len(candidates) > 1 else ""
    why = f" (download failed: {errors[0]})" if errors else ""
    raise DataError(
        f"task {task!r} needs the folder {archive.contents}/ ({', '.join(archive.members)}) in {folder}{also}"
        f"{have}{why}. "
        f"Place that folder there, or the archive {archive.describe()} in {folder}, "
        f"or point --data-dir (or RESERVOIR_HOME) at a folder that has it; then run `reservoir data verify {task}`"
    )

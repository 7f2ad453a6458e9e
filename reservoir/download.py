"""Data files: where a task looks, checksums, and downloads that give up fast when offline."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from reservoir.tasks import DataError

TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class DataFile:
    """One file a task needs: its name in the task's folder, checksum and download sources.

    ``md5`` is of the file's content after gzip decompression when ``gunzip_md5`` is set
    (so a re-compressed copy of the official data still verifies), else of the file itself.
    """

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
        raise DataError(f"{path} is unreadable or truncated ({e}); delete it and fetch it again") from None
    return h.hexdigest()


def verify(path: Path, file: DataFile) -> None:
    got = md5sum(path, file.gunzip_md5)
    if got != file.md5:
        raise DataError(f"{path} has checksum {got}, expected {file.md5}; delete it and fetch it again")


def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as r, open(dest, "wb") as f:
        shutil.copyfileobj(r, f)


def ensure_files(folder: Path, files: tuple[DataFile, ...], task: str, download: bool = True) -> list[Path]:
    """Return the paths of ``files`` in ``folder``, downloading missing ones when the network allows.

    Downloads land in a temporary file that is verified and then renamed, so a failed or
    interrupted download never leaves a file that looks complete. Raises :class:`DataError`
    naming the folder and the files to place there when some cannot be had.
    """
    missing = [f for f in files if not (folder / f.name).exists()]
    errors = []
    if missing and download and not os.environ.get("RESERVOIR_OFFLINE"):
        folder.mkdir(parents=True, exist_ok=True)
        for f in list(missing):
            for url in f.urls:
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{f.name}.", suffix=".part")
                os.close(fd)
                try:
                    _download(url, Path(tmp))
                    verify(Path(tmp), f)
                    os.replace(tmp, folder / f.name)
                    missing.remove(f)
                    break
                except (OSError, DataError) as e:
                    errors.append(f"{url}: {e}")
                finally:
                    if os.path.exists(tmp):
                        os.remove(tmp)
    if missing:
        names = ", ".join(f.name for f in missing)
        why = f" (download failed: {errors[0]})" if errors else ""
        raise DataError(
            f"task {task!r} needs {names} in {folder}{why}; place the files there "
            f"or point --data-dir (or RESERVOIR_HOME) at a folder that has {task}/ with them")
    return [folder / f.name for f in files]

"""Working folders and names: ``./data``, ``./features/`` and ``./results/``, all under
``$RESERVOIR_HOME`` when it is set; caches under :func:`cache_dir`. Feature files are named by the
identity of the run that produced them (:mod:`reservoir.identity`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


def home() -> Path:
    return Path(os.environ.get("RESERVOIR_HOME", "."))


def cache_dir() -> Path:
    """Converted models, compile records, derived data: ``$RESERVOIR_CACHE``, else
    ``$RESERVOIR_HOME/cache``, else ``~/.cache/reservoir``."""
    if os.environ.get("RESERVOIR_CACHE"):
        return Path(os.environ["RESERVOIR_CACHE"])
    if os.environ.get("RESERVOIR_HOME"):
        return Path(os.environ["RESERVOIR_HOME"]) / "cache"
    return Path.home() / ".cache" / "reservoir"


def default_data_dir() -> Path:
    return home() / "data"


#: the prefix of a task read from a user's own file or folder (``--task file:PATH``)
FILE_TASK = "file:"


def file_task_path(name: Any) -> str | None:
    """PATH of a ``file:PATH`` task name; ``None`` for any other name (or none)."""
    return name[len(FILE_TASK) :] if isinstance(name, str) and name.startswith(FILE_TASK) else None


def slug(name: str) -> str:
    """A file-name-safe name for a task or backbone, the same from any folder: a ``file:PATH`` task gives its
    file's name, a path or ``hf:ID`` its last part."""
    if (path := file_task_path(name)) is not None:
        name = Path(path.rstrip(os.sep)).name or path
    else:
        name = name.removeprefix("hf:")
        if os.sep in name:
            name = Path(name.rstrip(os.sep)).stem or name
    return re.sub(r"[^A-Za-z0-9_.-]+", "--", name)


def features_dir() -> Path:
    return home() / "features"


def results_dir(task: str, backbone: str) -> Path:
    return home() / "results" / slug(task) / slug(backbone)

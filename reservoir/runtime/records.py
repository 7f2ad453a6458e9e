"""Measurements this machine keeps in the cache folder (``$RESERVOIR_CACHE``): one JSON file of
records by key per kind (the dtypes' product rates, the engines' rates, compile costs). A file
that is missing or unreadable reads as empty; writes are atomic and best effort (a read-only
cache measures again next time)."""

from __future__ import annotations

import json
from typing import Any

from reservoir.config import cache_dir


def machine(threads: int) -> list[Any]:
    """What every measured rate depends on: the CPU (model and flags) and the threads."""
    from reservoir.runtime.machine import cpu

    model, flags = cpu()
    return [model, sorted(flags), threads]


def architecture(backbone: Any) -> dict[str, Any]:
    """A backbone's architecture, not its weights: its class and configuration."""
    from reservoir.identity import config_dict

    return {"class": type(backbone).__qualname__, "config": config_dict(getattr(backbone, "config", None))}


def read(name: str) -> dict[str, Any]:
    """Every record of ``$RESERVOIR_CACHE/name`` (``{}`` when missing or unreadable)."""
    try:
        records = json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def get(name: str, key: str) -> Any:
    """The record under ``key``, or ``None``."""
    return read(name).get(key)


def put(name: str, key: str, value: Any) -> None:
    """Keep ``value`` under ``key`` (the file's other records kept)."""
    from reservoir.results import atomic_write

    records = read(name)
    records[key] = value
    text = json.dumps(records, indent=1, sort_keys=True).encode()
    try:
        atomic_write(cache_dir() / name, lambda f: f.write(text))
    except OSError:
        pass

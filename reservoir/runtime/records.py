"""Measurements this machine keeps in the cache folder (``$RESERVOIR_CACHE``): one JSON file of records
by key per kind (the dtypes' and engines' rates, compile costs). A missing or unreadable file reads as
empty; writes are atomic and best effort, under an exclusive lock (``NAME.lock``), so runs that start
together never lose each other's records."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterator
from typing import Any

from reservoir.paths import cache_dir


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
    """The record under ``key``, or ``None``; a record of anything but measurements (numbers, nulls, and
    records of them), damaged or edited by hand, is none: it is measured again."""
    record = read(name).get(key)
    return record if measured(record) else None


def measured(value: Any) -> bool:
    """Whether ``value`` holds measurements only: finite numbers or nulls, or records of them."""
    if isinstance(value, dict):
        return all(measured(v) for v in value.values())
    return value is None or (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """Hold the exclusive lock of ``$RESERVOIR_CACHE/name`` (no lock where the folder is not writable or its
    filesystem has none)."""
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        fd = os.open(cache_dir() / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a filesystem without locks: each record is still written whole
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def put(name: str, key: str, value: Any) -> None:
    """Keep ``value`` under ``key`` (the file's other records kept, those other processes write meanwhile too)."""
    from reservoir.results import atomic_write

    with locked(name):
        records = read(name)
        records[key] = value
        text = json.dumps(records, indent=1, sort_keys=True).encode()
        with contextlib.suppress(OSError):
            atomic_write(cache_dir() / name, lambda f: f.write(text))

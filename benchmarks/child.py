"""A benchmark's timed child process: run it, and read back the one JSON line it prints after its tag."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def tagged_json(
    cmd: list[str], tag: str, *, env: dict[str, str], cwd: str | Path, what: str, timeout: float = 3600
) -> Any:
    """The JSON after ``tag`` on the line of ``cmd``'s stdout that starts with it; a child that fails or prints
    none ends the benchmark, naming ``what`` with the child's exit status and the end of its stderr."""
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(tag + " ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(line[len(tag) + 1 :])

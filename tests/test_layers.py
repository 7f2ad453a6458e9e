"""Static contracts: imports flow down the pipeline's stages only (import-linter, setup.cfg's [importlinter]); ruff format and lint clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_imports_flow_down_the_pipeline():
    """``lint-imports`` checks the ``[importlinter]`` contract in setup.cfg: task data -> model ->
    runtime -> extraction -> probes and training -> report -> cli; an import that climbs back up
    (a lazy one included) fails here."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]' (import-linter)")
    done = subprocess.run(
        [exe, "--config", str(ROOT / "setup.cfg"), "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("check", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_is_clean(check):
    """``ruff format --check`` and ``ruff check`` (pyproject.toml's ``[tool.ruff]``) pass on the whole
    repository: a file the formatter would change, or a lint rule broken, fails here with ruff's report."""
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    done = subprocess.run([exe, *check, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]

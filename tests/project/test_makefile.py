"""The Make targets follow ``$RESERVOIR_HOME`` as the command line does (checked by dry runs: ``make -n``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(*args: str) -> str:
    done = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_demo_reports_the_results_where_its_fits_wrote_them(tmp_path):
    home = tmp_path / "home"
    report = [ln for ln in dry_run("demo", f"RESERVOIR_HOME={home}").splitlines() if " report " in ln]
    assert report and f"{home}/results/digits/smollm2-135m " in report[0]
    assert f"{home}/results/digits/baseline-*" in report[0]
    (line,) = [ln for ln in dry_run("demo", "RESERVOIR_HOME=").splitlines() if " report " in ln]
    assert " ./results/digits/smollm2-135m " in line


def test_a_fit_target_makes_its_own_folder_and_reads_data_under_the_home(tmp_path):
    home = tmp_path / "home"
    lines = dry_run("-B", "results/digits/tinygpt/done", f"RESERVOIR_HOME={home}").splitlines()
    assert any(f"--data-dir {home}/data " in ln for ln in lines)
    assert "mkdir -p results/digits/tinygpt && touch results/digits/tinygpt/done" in lines

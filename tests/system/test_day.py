"""The user guide's day (``docs/guide/day.md``) runs as written: its ``bash`` blocks, in order, each in a
fresh shell in one empty folder, a tiny GPT-2 saved as a folder named ``gpt2`` standing in for the
pretrained one; each exits 0, and what they leave is what the page says."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import save_tiny_gpt2

ROOT = Path(__file__).resolve().parents[2]
DAY = ROOT / "docs" / "guide" / "day.md"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


@pytest.mark.slow  # about 60 s: every command of the guide
def test_the_days_commands_run_in_order(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    model = save_tiny_gpt2(tmp_path / "models" / "gpt2", n_layer=6)  # depth 6 exists, as in GPT-2 small
    env = {
        **os.environ,
        "RESERVOIR_HOME": str(work),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    blocks = bash_blocks(DAY.read_text())
    assert len(blocks) >= 7, "the day lost its commands"
    for block in blocks:
        script, swapped = re.subn(r"--backbone gpt2\b", f"--backbone {model}", block)
        assert "--backbone" not in block or swapped, block
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, f"{block}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "Traceback" not in r.stderr, r.stderr
    predictions = list(csv.DictReader((work / "predictions.csv").read_text().splitlines()))
    assert len(predictions) == 20 and list(predictions[0]) == ["row", "prediction", "prediction_name"]
    assert [int(p["row"]) for p in predictions] == list(range(20))
    checked = list(csv.DictReader((work / "checked.csv").read_text().splitlines()))
    assert [c["prediction"] for c in checked] == [p["prediction"] for p in predictions]  # the same rows
    assert {c["label_name"] for c in checked} <= {"rising", "falling"}
    assert (work / "mine_features.parquet").is_file() and (work / "new_features.parquet").is_file()

"""The README's and the Python guide's examples run as written (in a temporary RESERVOIR_HOME)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide" / "python.md"


def python_blocks(path: Path) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    assert blocks, f"{path.name} has no python example"
    return blocks


@pytest.mark.slow  # GPT-2 small on 1,797 digits
def test_readme_python_example_runs(home, capsys):
    for code in python_blocks(README):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    score = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.5 < score <= 1.0  # 10 digits: chance is 0.1


@pytest.mark.slow  # GPT-2 small on 2,300 digits
def test_python_guide_examples_run(home, capsys):
    for code in python_blocks(GUIDE):
        exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide"})
    score = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.5 < score <= 1.0

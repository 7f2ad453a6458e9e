"""The README's Python API example runs as written (in a temporary RESERVOIR_HOME)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow  # about 100 s on a 2-core AVX2 CPU: GPT-2 small on 2,300 digits
def test_readme_python_example_runs(home, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    score = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.5 < score <= 1.0  # 10 digits: chance is 0.1

"""Progress on stderr (reservoir/progress.py)."""

from __future__ import annotations

import io

from reservoir import progress


def test_a_piped_bar_writes_its_last_count_once(monkeypatch):
    """Piped, a bar writes lines; closing it redraws the last count with new times, which is not written
    again (each 100% line once)."""
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    monkeypatch.setattr(progress, "PIPE_INTERVAL", 0.0)  # a line on every update
    with progress.bar(3, "x") as shown:
        for _ in range(3):
            shown.update(1)
    lines = err.getvalue().splitlines()
    assert [line.split("|")[0].strip() for line in lines] == ["x:   0%", "x:  33%", "x: 100%"]

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


def test_a_piped_line_is_written_again_only_when_its_count_changes():
    """The bar drawn is as wide as the rate leaves room for, so one count can come with bars of two widths:
    written once all the same; a bar without a total is told apart by its text without times."""
    err = io.StringIO()
    lines = progress._Lines(err)
    lines.write("x: 100%|#####| 3/3 [00:00<00:00, 14444.22ex/s]")
    lines.write("\rx: 100%|######| 3/3 [00:00<00:00, 9978.52ex/s]")
    lines.write("x: 3ex [00:00, 12.0ex/s]")
    lines.write("x: 3ex [00:01, 3.0ex/s]")
    lines.write("x: 4ex [00:01, 4.0ex/s]")
    assert err.getvalue().splitlines() == [
        "x: 100%|#####| 3/3 [00:00<00:00, 14444.22ex/s]",
        "x: 3ex [00:00, 12.0ex/s]",
        "x: 4ex [00:01, 4.0ex/s]",
    ]

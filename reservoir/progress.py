"""Progress on stderr with tqdm: percentage, elapsed, rate and ETA; one line per update when piped."""

from __future__ import annotations

import re
import sys
from typing import TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: seconds between updates when stderr is a terminal, and when it is a file or pipe
TTY_INTERVAL, PIPE_INTERVAL = 0.5, 15.0


class _Lines:
    """A stream for tqdm that writes each refresh as its own line (no ``\\r`` redraws in logs)."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        text = _ANSI.sub("", text).replace("\r", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def bar(total: int, desc: str, *, initial: int = 0, enabled: bool = True, unit: str = "ex"):
    """A tqdm bar on stderr; redrawn in place on a terminal, a line every 15 s when piped."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        disable=not enabled,
        leave=True,
        file=sys.stderr if tty else _Lines(sys.stderr),
        dynamic_ncols=tty,
        ncols=None if tty else 100,
        mininterval=TTY_INTERVAL if tty else PIPE_INTERVAL,
        smoothing=0.1,
    )


def log(message: str, enabled: bool = True) -> None:
    """One status line on stderr (loading a model, reusing a file, the path taken), above any bar on screen."""
    if enabled:
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)
        sys.stderr.flush()

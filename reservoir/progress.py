"""Progress and messages: tqdm bars (percentage, elapsed, rate and ETA) and the ``reservoir`` logger.

On a terminal a bar redraws in place; piped, it writes a line every 15 s; in a Jupyter notebook it is
a live widget (``tqdm.auto``, where ipywidgets is installed). Status lines go through the standard
``logging`` logger named ``reservoir`` (level INFO, written to stderr above any bar): raise its level to
silence them (``logging.getLogger("reservoir").setLevel(logging.WARNING)``), or replace its handler to
send them elsewhere.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from typing import TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TIMES = re.compile(r"\s*\[[^\]]*\]$")
#: a bar line with a total: its description and percentage, the bar drawn, then its count (``3/3``)
_BAR = re.compile(r"^(.*?)\|.*\|\s*(\S+)")
#: seconds between updates when stderr is a terminal, and when it is a file or pipe
TTY_INTERVAL, PIPE_INTERVAL = 0.5, 15.0


class _Lines:
    """A stream for tqdm that writes each refresh as its own line (no ``\\r`` redraws in logs)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.last = ""

    def write(self, text: str) -> None:
        text = _ANSI.sub("", text).replace("\r", "").strip()
        # its count, without the bar drawn (its width follows the rate's), times and rates
        bar = _BAR.match(text)
        done = f"{bar.group(1)} {bar.group(2)}" if bar else _TIMES.sub("", text)
        if text and done != self.last:  # closing a bar redraws its last count: written once
            self.stream.write(text + "\n")
            self.last = done

    def flush(self) -> None:
        self.stream.flush()


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (an IPython shell talking to a notebook front end)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def interactive() -> bool:
    """Whether someone is watching: stderr is a terminal, or this is a notebook (the API's default for progress)."""
    return sys.stderr.isatty() or in_notebook()


def bar(total: int, desc: str, *, initial: int = 0, enabled: bool = True, unit: str = "ex"):
    """A tqdm bar: a live widget in a notebook (``tqdm.auto``, where ipywidgets is installed), else on
    stderr, redrawn in place on a terminal, a line every 15 s when piped."""
    if in_notebook() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm as widget

        return widget(total=total, initial=initial, desc=desc, unit=unit, disable=not enabled, leave=True)
    from tqdm import tqdm

    tty = interactive()
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


class AboveBars(logging.Handler):
    """Writes each record on stderr as it is at the time (``tqdm.write``: above any bar on screen)."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: a handler never raises
            self.handleError(record)


#: the logger of every status line (module docstring)
LOGGER = logging.getLogger("reservoir")
if not LOGGER.handlers:
    LOGGER.addHandler(AboveBars())
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # its handler writes them; the root logger's would write them twice


def log(message: str, enabled: bool = True) -> None:
    """One status line (loading a model, reusing a file, the path taken) through the ``reservoir`` logger:
    on stderr, above any bar on screen, unless the logger's level or handlers say otherwise."""
    if enabled:
        LOGGER.info(message)

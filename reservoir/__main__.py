"""``python -m reservoir`` and the ``reservoir`` console command."""

from __future__ import annotations

import os
import sys
from typing import Any


def entry(argv: list[str] | None = None) -> None:
    """The ``reservoir`` command (:func:`reservoir.cli.main`), then, its output flushed, the end of the
    process without the interpreter's teardown (unloading torch, OpenVINO and their thread pools took
    1 to 2 s after every command, docs/benchmarks.md "Whole jobs"; a finished command has closed its
    files). An exception still ends the way Python ends it. Ending here also keeps Ctrl-C's exit status
    130: a Ctrl-C that lands while a model loads can leave CPython's "unhandled KeyboardInterrupt" flag set
    although the command caught it and said what is kept, and the interpreter's teardown then signals the
    process with SIGINT (exit status -2) instead of returning 130."""
    try:
        from reservoir.cli import main
    except KeyboardInterrupt:  # Ctrl-C while the command starts: nothing was done
        print("\ninterrupted: nothing was written", file=sys.stderr)
        os._exit(130)
    try:
        main(argv, prog_name="reservoir")
        code: Any = 0
    except SystemExit as e:
        code = e.code
    if not isinstance(code, int):  # SystemExit(None) is success; a message is printed, exit 1
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()

"""The project's errors, in one place.

Every error a user can cause or meet is a :class:`ReservoirError`; its message says what
was wrong, the value received and what to do. The command line turns them into exit
status 1 with the message and no traceback; exit 2 is kept for usage errors found while
click parses the options.

- :class:`UsageError`: a value that cannot work, found after parsing (a depth outside the
  backbone, a dtype the API was given); also a ``ValueError`` for library callers.
- :class:`DataError`: missing, corrupt or inconsistent data.
- :class:`BackboneError`: a backbone that cannot be loaded or cannot read the input.
- :class:`StoreError`: a feature file that is missing, unfinished, corrupt or not ours.
- :class:`IdentityError`: an artifact produced by another run than the one asked for.
- :class:`DeviceError`: a device that was asked for and is absent.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class ReservoirError(Exception):
    """Base class: a foreseeable failure whose message names the value and the fix."""


class UsageError(ReservoirError, ValueError):
    """A setting that cannot work (found after option parsing)."""


class DataError(ReservoirError):
    """Missing, corrupt or inconsistent data; the message names the file and the fix."""


class BackboneError(ReservoirError):
    """A backbone that cannot be loaded, or cannot read this input; the message says what to do."""


class StoreError(ReservoirError):
    """A feature file that is missing, unfinished, corrupt, locked or not a feature file."""


class WriteFailed(StoreError):
    """Writing a feature file failed (a full disk). HDF5's state in this process is not reliable
    afterwards (closing its handles can crash the interpreter), so the command line reports it and
    ends the process at once; the ``.partial`` file is resumed by the next run."""


class IdentityError(StoreError):
    """An artifact whose recorded identity differs from the run asked for."""


class DeviceError(ReservoirError):
    """A compute device that was asked for and is not present."""


def unreadable(path: object, e: BaseException, fix: str) -> DataError:
    """A data file that could not be read, in the user's words: the disk's I/O error (EIO) says to check the disk
    and rerun (the file may be fine); anything else calls the file unreadable or truncated and gives ``fix``."""
    import errno

    if getattr(e, "errno", None) == errno.EIO:
        return DataError(
            f"reading {path} failed: the disk reported an I/O error ({e}); check the disk, or copy the "
            "data to another one and point --data-dir there, then rerun"
        )
    return DataError(f"{path} is unreadable or truncated ({type(e).__name__}: {e}); {fix}")


def write_failure(e: BaseException) -> tuple[str, str]:
    """``(what happened, what to do)`` of a failed write, in the user's words: a full disk (as the OS, HDF5 or
    ``torch.save`` report it), a folder not writable, a disk I/O error, or the system's own words."""
    import errno

    code, said = getattr(e, "errno", None), str(e)
    text = (said.splitlines() or [""])[0]
    # HDF5 says it lines below the first; torch.save's writer finds its file shorter than it wrote
    if code == errno.ENOSPC or any(w in said for w in ("No space left", "errno = 28", "unexpected pos")):
        return "the disk is full", "Free space"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"its folder is not writable ({text})", "Make it writable"
    if code in (errno.ENOTDIR, errno.EEXIST):
        return f"its folder cannot be made ({text})", "Choose another folder"
    # the file being written, or its folder, was removed meanwhile; or no file can be made there
    if code == errno.ENOENT:
        return (
            f"a file it was writing could not be found ({text}): its folder takes no new files, or another command "
            "removed it meanwhile",
            "Write to another folder, or let one command write it at a time",
        )
    if code in (errno.EDQUOT, errno.EFBIG):
        return f"a size limit was reached ({text})", "Free space or raise the limit"
    return f"the write failed ({text or type(e).__name__})", "Check the disk"


def optional(module: str, what: str, install: str | None = None, error: type[Exception] = ImportError):
    """The optional package ``module``, imported; else ``error`` saying that ``what`` needs it and how to install
    it (``install``: the pip argument, default the package's own name)."""
    import importlib
    import importlib.util

    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = install or module.split(".")[0]
        if importlib.util.find_spec(module.split(".")[0]) is not None:  # installed, but it cannot load here
            raise error(
                f"{what} needs the optional package {module!r}, which is installed but cannot be imported "
                f"({e}); install a release that fits this environment (`pip install --upgrade {package}`)"
            ) from None
        raise error(
            f"{what} needs the optional package {module!r}, which is not installed here; "
            f"install it with `pip install {package}`"
        ) from None


@contextlib.contextmanager
def interrupt_after() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives inside the block and raise it as ``KeyboardInterrupt`` when
    the block ends. A queue or thread operation interrupted midway can leave its locks inconsistent, so
    a worker thread never wakes and the command hangs instead of exiting 130; the main thread's waits on
    its worker threads run inside this. A no-op off the main thread or under a SIGINT handler other than
    Python's own (a notebook's, or an enclosing block's)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt

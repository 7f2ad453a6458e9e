"""Opening HDF5 files as this project does: no HDF5 file locks, and a file that names itself on an error."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import h5py

#: HDF5's own file locks are off (one writer is :class:`WriterLock`'s job): a forked child (OpenVINO's and
#: NNCF's helpers fork) inherits HDF5's ``flock`` and kept a closed file locked against readers
LOCKING = False


class NamedFile(h5py.File):
    """``h5py.File`` whose context, left by an error, records the file's name on it (``h5_filename``): an error
    h5py raises on a damaged file names no file, and the file is closed by the time it is reported."""

    def __exit__(self, *exc: Any) -> None:
        if exc[1] is not None and not hasattr(exc[1], "h5_filename"):
            with contextlib.suppress(Exception):  # an exception that takes no attributes stays as it is
                exc[1].h5_filename = self.filename
        super().__exit__(*exc)


def h5_file(path: Path, mode: str = "r", **kwargs) -> h5py.File:
    """``h5py.File`` with this project's locking policy (:data:`LOCKING`), naming itself on an error left
    inside its context (:class:`NamedFile`)."""
    return NamedFile(path, mode, locking=LOCKING, **kwargs)

"""A training run's backbone saved as a backbone folder (``train --save-backbone DIR``).

The folder holds the backbone alone, with the parameters of the best validation step, as a Hugging Face
``save_pretrained`` folder (a model without learned positions also keeps its trained added positions) that
``--backbone DIR`` loads like any other; ``reservoir.json`` says what it is (the FPT paper's "Bit" row is
such a backbone, trained on bit memory).

The folder is written under a temporary name beside ``DIR``, loaded back and compared with the trained
backbone tensor by tensor, and only then renamed to ``DIR`` (a SIGKILL leaves the temporary one, which
the next save to ``DIR`` on that host removes). An existing ``DIR`` that is not empty is refused, before
the run trains and again at the rename.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any

import torch

from reservoir.errors import BackboneError, UsageError
from reservoir.model.backbones import Backbone, fingerprint, load_backbone
from reservoir.results import fsync_path

#: the provenance file of a saved backbone folder
PROVENANCE = "reservoir.json"
PROVENANCE_FORMAT = 1


def check_free(folder: Path, written: tuple[Path, ...] = ()) -> None:
    """Refuse a ``folder`` that exists and is not an empty folder (a saved backbone replaces nothing), or that holds
    a folder of ``written`` (where the run writes its checkpoints and results: it would not be empty by the end)."""
    folder = Path(folder)
    inside = [w for w in written if Path(w).resolve().is_relative_to(folder.resolve())]
    if inside:
        raise UsageError(
            f"--save-backbone {folder}: the run writes into {inside[0]}, inside it, and a saved backbone replaces "
            "nothing; choose a new folder outside it"
        )
    if folder.is_dir():
        held = sorted(p.name for p in folder.iterdir())
        if not held:
            return
        what = f"a folder holding {', '.join(held[:4])}{' and more' if len(held) > 4 else ''}"
    elif folder.exists() or folder.is_symlink():
        what = "a file"
    else:
        return
    raise UsageError(
        f"--save-backbone {folder}: {what} is there and is never overwritten; choose a new folder "
        "(or remove that one)"
    )


def _check_reloads(backbone: Backbone, folder: Path) -> str:
    """Load ``folder`` back and compare every tensor with ``backbone``'s; returns its fingerprint."""
    loaded = load_backbone(str(folder), 0)
    saved, read = backbone.state_dict(), loaded.state_dict()
    differ = sorted(set(saved) ^ set(read)) or [
        k for k in saved if not torch.equal(saved[k].detach().cpu().float(), read[k].float())
    ]
    if differ:  # an internal invariant: the adapter wrote a folder that does not read back
        raise BackboneError(
            f"the backbone folder written for {folder.name} does not load back to the trained "
            f"parameters ({', '.join(differ[:4])} differ); it was not kept"
        )
    return fingerprint(loaded)


#: this machine, in the name of a folder being written (a process id means something on its own host only)
_HOST = socket.gethostname().replace(".", "_") or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        pass
    return True


def remove_stale_partials(folder: Path) -> list[Path]:
    """Remove the half-written folders that killed saves to ``folder`` left on this host (their process is
    gone); another host's are left alone."""
    removed = []
    for tmp in folder.parent.glob(f".{glob.escape(folder.name)}.{glob.escape(_HOST)}.*-*.partial"):
        pid = tmp.name[len(f".{folder.name}.{_HOST}.") :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def save_backbone(backbone: Backbone, folder: Path, provenance: dict[str, Any]) -> Path:
    """Write ``backbone`` as a backbone folder at ``folder`` (module docstring), atomically.

    ``provenance`` goes to :data:`PROVENANCE`, with the folder's ``fingerprint`` added. Returns ``folder``.
    """
    folder = Path(folder)
    check_free(folder)
    backbone.check_saveable()
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(folder)
    tmp = folder.parent / f".{folder.name}.{_HOST}.{os.getpid()}-{secrets.token_hex(6)}.partial"
    os.mkdir(tmp)  # the permissions a plain folder gets (mkdtemp's would be private)
    try:
        backbone.save_pretrained(tmp)
        info = {"format": PROVENANCE_FORMAT, **provenance, "fingerprint": _check_reloads(backbone, tmp)}
        (tmp / PROVENANCE).write_text(json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
        for path in tmp.iterdir():
            fsync_path(path)
        fsync_path(tmp)
        try:
            os.rename(tmp, folder)  # replaces an empty folder, never one with files in it
        except OSError:
            if folder.exists() or folder.is_symlink():
                check_free(folder)  # it was filled while the run trained: refused in the same words
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(folder.parent)
    return folder

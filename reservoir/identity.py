"""The identity of an artifact: everything that changes its numbers.

A feature file (and its shards), a training run's checkpoint and every result record the
identity of the run that produced them. An artifact is reused only when the identity of
the run asked for equals the recorded one; default file names derive from it (readable
parts plus a short hash), so two different runs never share a file.

Identity of a feature file (:func:`feature_identity`):

- ``format``: the feature-file format version (:data:`FEATURE_FORMAT`);
- ``task`` and ``task_options`` (every option, defaults included; where a user file lies
  is not part of it, its contents are);
- ``data``: per split, the number of rows and a SHA-256 of the arrays actually read
  (inputs, labels, lengths) after ``limit``: the same files or generator settings give the
  same digest on any machine, another file with the same name does not;
- ``subset``: how ``limit`` rows of each split were taken, the rule and its seed (the run's
  ``--seed``): ``{"rule": "stratified", "seed": S}`` (a seeded sample stratified by class),
  ``random``, ``draws`` (a generated task's first draws) or ``all`` (no limit); rules in
  :data:`reservoir.tasks.SUBSET_RULES`, with ``left_out``, the classes of the whole train split the
  sample holds none of, where it lost some. Files of format 2 and before took the first ``limit`` rows
  and record no ``subset``;
- ``class_names`` (where the data names its classes): the name of each class id;
- ``unlabeled`` (data read to predict on that has no labels, ``--task-opt predict=true``): ``true``, and
  its stored labels are placeholders (``-1``);
- ``backbone`` (a readable name; for folders their base name) and ``backbone_fingerprint``:
  a SHA-256 of the adapter (its class and reading version), the architecture's configuration and of
  every weight and buffer as loaded
  (before any dtype conversion), so two folders called ``checkpoint-500`` differ and a
  ``-random`` twin built from another seed differs;
- ``seed`` and ``input_scale`` of the frozen input layer, ``depths``, the compute ``dtype``
  as resolved on this CPU (``auto`` is never stored), ``readout``, ``limit`` and ``splits``;
- ``calibration`` (the int8 dtypes only): the split and number of first rows whose
  activations fixed the per-position means int8 subtracts (and, for ``int8-static``, the scales),
  the int8 recipe's version (:data:`reservoir.runtime.engines.INT8_RECIPE`), the engine, and the float
  ``dtype`` the centring pass computed in (decided once, so every shard centres alike).

Execution settings that do not change what is computed (batch size, compile, the engine,
progress, the output path) are kept in the file's ``config`` but are not part of the
identity. The OpenVINO engine computes the same features as PyTorch in the same dtype (it
checks them against PyTorch float32 on every run's first batch), as a compiled graph does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.paths import FILE_TASK, features_dir, file_task_path, slug

#: a task (:class:`reservoir.tasks.Task`) and a split's data (:class:`reservoir.tasks.SplitData`), as this module reads
#: them: it sits below the tasks and names them only by what it uses (``load``, ``read``, ``subset``,
#: ``class_names``, ``identity_options``; ``inputs``, ``labels``, ``lengths``)
Task = Any
SplitData = Any

#: version of the feature-file layout; a file of another format is never reused (3: ``--limit`` draws a seeded,
#: stratified sample, recorded as ``subset``; before, it kept the first rows of each split)
FEATURE_FORMAT = 3
#: hex digits of the digest in file names
SHORT = 10


def canonical(obj: Any) -> str:
    """Stable JSON of an identity (sorted keys, no whitespace): the text that is hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest(identity: Mapping[str, Any], n: int = SHORT) -> str:
    """Short SHA-256 hex digest of an identity."""
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:n]


def rows_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """What :func:`array_digest` hashes before an array's contents: its dtype and shape."""
    return (f"object{tuple(shape)}" if np.dtype(dtype).kind == "O" else f"{dtype.str}{tuple(shape)}").encode()


def update_rows(h, a: np.ndarray) -> None:
    """Hash an array's contents after its header: object rows one by one (each with its own header),
    others as their bytes; rows fed in consecutive pieces hash as the whole array would."""
    if a.dtype.kind == "O":  # variable-length rows: each row's dtype, shape and bytes
        for row in a.ravel():
            _update(h, row)
        return
    h.update(np.ascontiguousarray(a).tobytes())


def _update(h, a: Any) -> None:
    if hasattr(a, "chunks_in_order"):  # lazy rows (reservoir.tasks.streams.Rows): streamed in order
        h.update(rows_header(a.dtype, a.shape))
        for piece in a.chunks_in_order():
            update_rows(h, piece)
        return
    a = np.asarray(a)
    h.update(rows_header(a.dtype, a.shape))
    update_rows(h, a)


def array_digest(*arrays: Any) -> str:
    """SHA-256 (hex) of arrays' dtypes, shapes and bytes (object arrays row by row). Lazy rows are
    streamed; a first array that carries its digest state (``sha256``, computed while its rows were
    checked) is not read again."""
    h = None
    for a in arrays:
        state = getattr(a, "sha256", None)
        if h is None and state is not None:
            h = state.copy()
            continue
        h = h or hashlib.sha256()
        _update(h, a)
    return (h or hashlib.sha256()).hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def changed_files(files: Sequence[Path], recorded: Mapping[str, str], stamp: Path) -> list[str]:
    """The names among ``files`` (and ``recorded``) whose SHA-256 is not the one ``recorded`` names (a file absent
    on either side counts). Files of the size, modification time and inode ``stamp`` kept when they were last found
    whole are not read again (loading a cached model then costs no pass over its bytes); files found whole are
    stamped so, where ``stamp``'s folder can be written."""
    present = {p.name: p for p in files if p.is_file()}
    seen = {n: [p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino] for n, p in present.items()}
    if set(present) == set(recorded):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(stamp.read_text()) == seen:
                return []
    changed = sorted(
        n
        for n in set(recorded) | set(present)
        if n not in present or recorded.get(n) != file_sha256(present[n])
    )
    if not changed:
        with contextlib.suppress(OSError):
            stamp.write_text(json.dumps(seen))
    return changed


def data_fingerprint(data: Mapping[str, SplitData]) -> dict[str, dict[str, Any]]:
    """Per split: rows and a digest of the inputs, labels and lengths actually read."""
    return {
        split: {"rows": len(d), "sha256": array_digest(d.inputs, d.labels, d.lengths)}
        for split, d in data.items()
    }


def load_as_recorded(task: Task, split: str, data_dir: Path | str, identity: Mapping[str, Any]) -> SplitData:
    """The rows of ``split`` an identity's run read: its ``limit`` taken by its ``subset`` rule and seed, or, for
    a file that records no rule (format 2 and before), the first ``limit`` rows."""
    subset = identity.get("subset")
    if subset is None:
        return task.read(split, Path(data_dir), identity.get("limit"))
    return task.load(split, Path(data_dir), identity.get("limit"), int(subset.get("seed", 0)))


def reread(task: Task, identity: Mapping[str, Any], data_dir: Path | str) -> dict[str, SplitData] | None:
    """The splits behind a recorded identity, read again from ``data_dir`` as recorded (its
    splits, limit and subset rule), or ``None`` when they differ from its data digest."""
    data = {s: load_as_recorded(task, s, data_dir, identity) for s in identity["splits"]}
    return data if data_fingerprint(data) == identity["data"] else None


def config_dict(config: Any) -> dict[str, Any]:
    """A backbone's architecture settings without machine- or version-specific entries."""
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    if hasattr(config, "to_dict"):  # a Hugging Face config
        skip = {"transformers_version", "torch_dtype", "dtype", "architectures"}
        return {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in skip}
    return {"repr": repr(config)}


def task_label(name: str) -> str:
    """``file:some/dir/mine.npz`` -> ``file:mine.npz``; registered names as they are."""
    path = file_task_path(name)
    return name if path is None else FILE_TASK + Path(path).name


def feature_identity(
    *,
    task_name: str,
    task: Task,
    data: Mapping[str, SplitData],
    backbone: str,
    backbone_fingerprint: str,
    seed: int,
    input_scale: str,
    depths: list[int],
    dtype: str,
    readout: str,
    limit: int | None,
    calibration: Mapping[str, Any] | None = None,
    load_dtype: str = "float32",
    store_dtype: str = "float32",
    left_out: Sequence[int] = (),
    token_std: float | None = None,
) -> dict[str, Any]:
    """The identity of a feature file (module docstring); ``backbone`` is the readable label and
    ``backbone_fingerprint`` the hash of :func:`reservoir.model.backbones.fingerprint`; ``token_std``, the
    backbone's token-embedding std that ``input_scale`` ``matched`` scales the input layer to (recorded as
    ``matched_std``: the embedding itself is dropped before the fingerprint is taken); ``load_dtype``,
    the dtype the frozen weights were kept in, and ``store_dtype``, the features', are recorded when they
    are not float32. The subset rule is the
    task's for ``limit`` and ``seed`` (``Task.subset``), the class names the task's (``Task.class_names``);
    a task whose data has no labels (its ``unlabeled`` says why) is recorded ``unlabeled``."""
    extra = {"calibration": dict(calibration)} if calibration else {}
    if input_scale == "matched" and token_std is not None:
        extra["matched_std"] = float(token_std)
    extra |= {k: v for k, v in (("load_dtype", load_dtype), ("store_dtype", store_dtype)) if v != "float32"}
    names = getattr(task, "class_names", None)
    if names:
        extra["class_names"] = [str(n) for n in names]
    if getattr(task, "unlabeled", None):
        extra["unlabeled"] = True
    return {
        "format": FEATURE_FORMAT,
        "task": task_label(task_name),
        "task_options": task.identity_options(),
        "data": data_fingerprint(data),
        "backbone": backbone,
        "backbone_fingerprint": backbone_fingerprint,
        "seed": int(seed),
        "input_scale": input_scale,
        "depths": [int(d) for d in depths],
        "dtype": dtype,
        "readout": readout,
        "limit": limit,
        "subset": task.subset(limit, seed, left_out),
        "splits": list(data),
        **extra,
    }


def features_path_for(identity: Mapping[str, Any]) -> Path:
    """Default feature file of a run: ``features/TASK/BACKBONE/DTYPE[-store-S]-seedS[-limitN][-scale-X]-HASH.h5``."""
    store = identity.get("store_dtype")
    parts = [identity["dtype"], *([f"store-{store}"] if store else []), f"seed{identity['seed']}"]
    if identity.get("limit"):
        parts.append(f"limit{identity['limit']}")
    if identity.get("input_scale", "paper") != "paper":
        parts.append(f"scale-{identity['input_scale']}")
    name = "-".join(parts + [digest(identity)]) + ".h5"
    return features_dir() / slug(identity["task"]) / slug(identity["backbone"]) / name


def short(value: Any, width: int = 60) -> str:
    """``value`` as canonical text, cut to ``width`` characters (messages that name values)."""
    text = canonical(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """``field: stored X, asked Y`` for every field that differs (nested dicts by their keys)."""
    out = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key), wanted.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            sub = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            out += [f"{key}.{k}: stored {short(a.get(k))}, asked {short(b.get(k))}" for k in sub]
        else:
            out.append(f"{key}: stored {short(a)}, asked {short(b)}")
    return out

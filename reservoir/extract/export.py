"""Feature files out, in the formats other tools read: Parquet, or a Hugging Face ``datasets`` folder.

One table row per example, the splits one after another: ``split``, ``row`` (its index in the split),
``label`` (a class id, a real value, or a list for several outputs a row), ``label_name`` (where the
data named its classes; neither label column for data without labels), then one column a depth,
``d{K}``: the example's readout rows at depth ``K``, flattened float32. The file's identity, depths and
class names go into the Parquet schema's metadata (``reservoir.identity``, ``reservoir.depths``,
``reservoir.class_names``) and, for a ``datasets`` folder, its description.

The file is verified first, then read and written block by block, under a temporary name renamed when
complete.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np

from reservoir.config import check_export_out, select_depths
from reservoir.errors import UsageError, optional
from reservoir.extract.store import (
    class_names,
    feature_splits,
    iter_depth,
    name_of,
    open_features,
    stored_identity,
    verify,
)
from reservoir.results import unwritable

FORMATS = ("parquet", "datasets")


def blocks(f: h5py.File, split: str, depths: Sequence[int]) -> Iterator[dict[str, np.ndarray]]:
    """The columns of ``split`` block by block: ``row``, ``label`` and one ``d{K}`` per depth."""
    streams = [iter_depth(f, split, d) for d in depths]
    start = 0
    for parts in zip(*streams):
        X0, labels = parts[0]
        n = len(X0)
        columns = {"row": np.arange(start, start + n, dtype=np.int64), "label": labels}
        for depth, (X, _) in zip(depths, parts):
            columns[f"d{depth}"] = X.reshape(n, -1)
        start += n
        yield columns


def _table(
    pa, split: str, columns: dict[str, np.ndarray], names: list[str] | None = None, labeled: bool = True
):
    n = len(columns["row"])
    arrays = {"split": pa.array([split] * n, pa.string()), "row": pa.array(columns["row"])}
    label = columns["label"]
    if labeled:  # data without labels stores placeholders: no column
        arrays["label"] = pa.array(label) if label.ndim == 1 else pa.array(list(label.reshape(n, -1)))
    if labeled and names and label.ndim == 1 and label.dtype.kind in "iub":
        arrays["label_name"] = pa.array([name_of(names, k) for k in label.tolist()], pa.string())
    for name, X in columns.items():
        if name.startswith("d"):
            arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(X.ravel(), pa.float32()), X.shape[1])
    return pa.table(arrays)


def write_parquet(
    pa, pq, f: h5py.File, splits: Sequence[str], depths: Sequence[int], meta: dict, path: Path
) -> None:
    """``splits`` of ``f`` at ``depths`` into one Parquet file at ``path``, block by block (``meta``: the
    schema's metadata)."""
    writer = None
    names, labeled = class_names(f), not stored_identity(f).get("unlabeled")
    try:
        for s in splits:
            for columns in blocks(f, s, depths):
                table = _table(pa, s, columns, names, labeled)
                if writer is None:
                    schema = table.schema.with_metadata(meta)
                    writer = pq.ParquetWriter(path, schema)
                writer.write_table(table.cast(schema))
    finally:
        if writer is not None:
            writer.close()


def check_out(out: Path, format: str) -> None:
    """Refuse an ``out`` that is something else than what an export of ``format`` writes there (it is never
    replaced); a missing parent folder is made."""
    check_export_out(out, format)
    out.parent.mkdir(parents=True, exist_ok=True)  # as extract --out: a missing folder is made
    if out.exists() and not exported(out, format):
        raise UsageError(
            f"{out} exists and is not a {'Parquet file' if format == 'parquet' else 'datasets folder'} an "
            "export wrote; choose another --out (or delete it)"
        )


def exported(out: Path, format: str) -> bool:
    """Whether ``out`` is what an export of ``format`` wrote: its metadata (the Parquet schema's, or each
    split's description in a ``datasets`` folder) holds a feature file's identity."""
    try:
        if format == "parquet":
            import pyarrow.parquet as pq

            return not out.is_dir() and b"reservoir.identity" in (pq.read_schema(out).metadata or {})
        splits = json.loads((out / "dataset_dict.json").read_text())["splits"]
        infos = [json.loads((out / s / "dataset_info.json").read_text()) for s in splits]
        return bool(infos) and all("reservoir.identity" in info.get("description", "") for info in infos)
    except Exception:  # noqa: BLE001 - a target that cannot be read as an export is not one
        return False


def export(
    features: str | Path,
    out: str | Path,
    *,
    format: str = "parquet",
    depths: Sequence[int] | None = None,
    splits: Sequence[str] | None = None,
) -> Path:
    """Write the feature file ``features`` (verified first) to ``out`` as Parquet (one file) or a ``datasets``
    folder (one subfolder per split, readable with ``datasets.load_from_disk``); ``depths`` and ``splits``
    default to every stored one. Returns ``out``. Raises UsageError for an unknown format, depth or split,
    or a missing optional package (pyarrow; ``datasets`` for the folder)."""
    if format not in FORMATS:
        raise UsageError(f"unknown export format {format!r}; choose from {', '.join(FORMATS)}")
    check_out(out := Path(out), format)
    pa = optional("pyarrow", "reservoir export", "'reservoir[data]'", UsageError)
    pq = optional("pyarrow.parquet", "reservoir export", "'reservoir[data]'", UsageError)
    with open_features(Path(features)) as f:
        stored = [int(d) for d in f.attrs["depths"]]
        depths = stored if depths is None else select_depths(tuple(depths), stored, f"in {features}")
        order = stored_identity(f).get("splits") or []
        present = [s for s in order if s in f] + [s for s in feature_splits(f) if s not in order]
        names = present if splits is None else list(dict.fromkeys(splits))  # a split named twice: once
        for s in names:
            if s not in f:
                raise UsageError(f"split {s!r} is not in {f.filename}; it holds {feature_splits(f)}")
        verify(f, depths, names, fix="extract it again")
        meta = {
            "reservoir.identity": json.dumps(stored_identity(f), sort_keys=True),
            "reservoir.depths": json.dumps(depths),
        }
        if class_names(f):
            meta["reservoir.class_names"] = json.dumps(class_names(f))
        # a name of this export's own, so that exports to one --out at once never write into each other's
        tmp = out.with_name(f".{out.name}.{secrets.token_hex(6)}.partial")
        try:
            write_export(pa, pq, f, names, depths, meta, tmp, format, out)
            if out.is_dir():
                shutil.rmtree(out)
            os.replace(tmp, out)
        except BaseException as e:  # an export cut short leaves nothing behind, under any name
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
            if isinstance(e, OSError):
                raise unwritable(out, e) from None
            raise
    return out


def write_export(pa, pq, f: h5py.File, names: list[str], depths: list[int], meta: dict, tmp: Path, format: str,
                 out: Path) -> None:  # fmt: skip
    """Write ``names``' features at ``depths`` of ``f`` to ``tmp`` in ``format`` (``out``: where it will lie)."""
    if format == "parquet":
        write_parquet(pa, pq, f, names, depths, meta, tmp)
        return
    import tempfile

    datasets = optional("datasets", "reservoir export --format datasets", None, UsageError)
    datasets.disable_progress_bars()  # its bars and messages say nothing to the user of this command
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.cache") as cache:
        parts = {}
        # each split through a Parquet file of its own, which datasets reads in blocks
        for s in names:
            part = Path(cache) / f"{s}.parquet"
            write_parquet(pa, pq, f, [s], depths, meta, part)
            parts[s] = datasets.Dataset.from_parquet(str(part), cache_dir=cache)
            parts[s].info.description = json.dumps(meta)
        datasets.DatasetDict(parts).save_to_disk(str(tmp))

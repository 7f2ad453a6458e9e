"""Remote homology (TAPE): a protein's amino-acid sequence -> its SCOP fold, 1195 classes.

Data: TAPE's ``DATA_DIR/remote_homology/remote_homology_<split>.lmdb`` (an LMDB of pickled records,
``b'num_examples'`` and ``str(i).encode()`` keys; needs ``pip install 'reservoir[data]'``) or ``.json``
(a list of records); LMDB is read when both exist. A record needs ``primary`` (the sequence) and
``fold_label`` (0..1194). Splits are TAPE's: ``train`` (12,312), ``valid`` (736), ``test_fold_holdout``
(718), ``test_superfamily_holdout`` (1,254), ``test_family_holdout`` (1,272). TAPE publishes no
checksum for its archive, so ``reservoir data verify remote_homology`` checks record counts and labels.

Tokens: the 25 letters of TAPE's IUPAC vocabulary in TAPE's order (``ABCDEFGHIKLMNOPQRSTUVWXYZ``) are
ids 1..25 (TAPE's ids minus 4), 0 is padding; TAPE's ``<cls>``/``<sep>`` are not added, and the
readout is the last real residue. Any other character raises a DataError, as TAPE's tokenizer refuses it.

Sequences longer than ``max_len`` (1024 by default) are truncated to their first ``max_len`` residues
and stay in their split, so an accuracy is always over the whole split; ``task.truncated`` counts them.
(The official FPT code instead skips batches longer than 1024 tokens and multiplies its reported
accuracies by 0.9739, the fraction kept; nothing here needs that correction.)

The FPT paper's homology accuracy was measured on TAPE's ``valid`` split (its code's test loader reads
``valid``). ``reservoir fit`` chooses regularisation on ``valid`` and reports every ``test_*`` split.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.settings import Interval, setting
from reservoir.tasks import DataError, SplitData, Task, TaskSpec, pad_ids, pickles, register_task
from reservoir.tasks.download import DataArchive, ensure_archive

FOLDER = "remote_homology"
SPLITS = ("train", "valid", "test_fold_holdout", "test_superfamily_holdout", "test_family_holdout")
TAPE_SIZES = {
    "train": 12312,
    "valid": 736,
    "test_fold_holdout": 718,
    "test_superfamily_holdout": 1254,
    "test_family_holdout": 1272,
}
AMINO_ACIDS = "ABCDEFGHIKLMNOPQRSTUVWXYZ"  # TAPE's IUPAC_VOCAB order (after its 5 special tokens)
VOCAB = {"<pad>": 0, **{a: i + 1 for i, a in enumerate(AMINO_ACIDS)}}
N_FOLDS = 1195
ARCHIVE = DataArchive(
    name="remote_homology.tar.gz",
    md5=None,
    urls=("http://s3.amazonaws.com/songlabdata/proteindata/data_pytorch/remote_homology.tar.gz",),
    contents=FOLDER,
    members=tuple(f"remote_homology_{s}.lmdb" for s in SPLITS),
)
_LUT = np.full(256, 255, dtype=np.uint8)
for _a, _i in VOCAB.items():
    if len(_a) == 1:
        _LUT[ord(_a)] = _i


def split_files(data_dir: Path, split: str) -> tuple[Path, Path]:
    """The LMDB and JSON paths a split is read from (the first that exists wins)."""
    base = Path(data_dir) / FOLDER / f"remote_homology_{split}"
    return base.with_suffix(".lmdb"), base.with_suffix(".json")


_TRIED: set[str] = set()


def find_split(data_dir: Path, split: str, download: bool = True) -> Path:
    lmdb_path, json_path = split_files(data_dir, split)
    for path in (lmdb_path, json_path):
        if path.exists():
            return path
    key = str(Path(data_dir).resolve())
    if (download and key not in _TRIED) or (Path(data_dir) / ARCHIVE.name).exists():
        _TRIED.add(key)  # one download attempt per folder and process, not one per split
        with contextlib.suppress(DataError):  # the message below says more precisely what is missing
            ensure_archive(Path(data_dir), ARCHIVE, "remote_homology", download)
        if lmdb_path.exists():
            return lmdb_path
    raise DataError(
        f"remote_homology split {split!r} needs {lmdb_path} (TAPE's LMDB) or {json_path} (TAPE's JSON). "
        f"Download TAPE's {ARCHIVE.urls[0]} and unpack it in {Path(data_dir)} "
        f"(tar -xzf remote_homology.tar.gz -C {Path(data_dir)}), or point --data-dir at a folder that has "
        f"{FOLDER}/remote_homology_<split>.lmdb or .json"
    )


def read_json(path: Path, n: int | None = None) -> list[dict[str, Any]]:
    """TAPE's JSON variant: a list of records (the first ``n``)."""
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(
            f"{path} is not readable JSON ({type(e).__name__}: {e}); "
            "replace it with TAPE's file or use its .lmdb version"
        ) from None
    if not isinstance(records, list):
        raise DataError(
            f"{path} holds a JSON {type(records).__name__}, expected a list of records as in TAPE's JSON files"
        )
    return records[:n]


def read_lmdb(path: Path, n: int | None = None) -> list[dict[str, Any]]:
    """TAPE's LMDB: pickled ``num_examples`` under ``b'num_examples'``, record ``i`` under ``str(i)`` (the
    first ``n``)."""
    try:
        import lmdb
    except ImportError:
        raise DataError(
            f"reading {path} needs the lmdb package: pip install 'reservoir[data]' (or pip install lmdb), "
            "or use TAPE's JSON files instead"
        ) from None
    try:
        env = lmdb.open(
            str(path),
            subdir=Path(path).is_dir(),
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=1,
        )
    except lmdb.Error as e:
        raise DataError(
            f"{path} is not a readable LMDB database ({e}); delete it and unpack TAPE's "
            "remote_homology.tar.gz again, or use the .json files"
        ) from None
    fix = "unpack TAPE's remote_homology.tar.gz again, or use its .json files"
    try:
        with env.begin(write=False) as txn:
            raw = txn.get(b"num_examples")
            if raw is None:
                raise DataError(
                    f"{path} has no b'num_examples' key, so it is not one of TAPE's LMDB files; "
                    "unpack TAPE's remote_homology.tar.gz again"
                )
            total = int(pickles.loads(raw, path, "a TAPE record", fix))
            total = total if n is None else min(total, n)
            records = []
            for i in range(total):
                value = txn.get(str(i).encode())
                if value is None:
                    raise DataError(
                        f"{path} says it holds records 0..{total - 1} but record {i} is missing; "
                        "the database is truncated: unpack TAPE's remote_homology.tar.gz again"
                    )
                records.append(pickles.loads(value, f"{path} (record {i})", "a TAPE record", fix))
    except lmdb.Error as e:
        raise DataError(
            f"{path} is not a readable LMDB database ({e}); unpack TAPE's remote_homology.tar.gz again"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise DataError(
            f"{path} holds a record that does not unpickle ({type(e).__name__}: {e}); "
            "unpack TAPE's remote_homology.tar.gz again"
        ) from None
    finally:
        env.close()
    return records


def tokenize(sequence: str, where: str) -> np.ndarray:
    """Amino-acid string -> uint8 ids 1..25; ``where`` names the record in errors."""
    if isinstance(sequence, bytes):
        sequence = sequence.decode("ascii", errors="replace")
    if not isinstance(sequence, str) or not sequence:
        raise DataError(f"{where}: 'primary' must be a non-empty amino-acid string, got {sequence!r:.40}")
    raw = np.frombuffer(sequence.encode("utf-8", errors="replace"), dtype=np.uint8)
    ids = _LUT[raw]
    if (ids == 255).any():
        pos = int(np.flatnonzero(ids == 255)[0])
        raise DataError(
            f"{where}: residue {sequence[pos]!r} at position {pos} is not one of TAPE's 25 amino-acid "
            f"codes {AMINO_ACIDS}; fix the sequence or remove the record"
        )
    return ids


def parse(records: list[dict[str, Any]], path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    seqs, labels = [], np.empty(len(records), dtype=np.int64)
    for i, rec in enumerate(records):
        where = (
            f"record {i}"
            + (f" ({rec.get('id')})" if isinstance(rec, dict) and "id" in rec else "")
            + f" of {path}"
        )
        if not isinstance(rec, dict) or "primary" not in rec or "fold_label" not in rec:
            keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise DataError(
                f"{where} has {keys}; TAPE's remote-homology records need 'primary' and 'fold_label'"
            )
        label = rec["fold_label"]
        try:
            label = int(np.asarray(label).reshape(()))
        except (TypeError, ValueError):
            raise DataError(f"{where}: fold_label {label!r} is not an integer") from None
        if not 0 <= label < N_FOLDS:
            raise DataError(
                f"{where}: fold_label {label} is outside 0..{N_FOLDS - 1}; "
                "the file is not TAPE's remote-homology data or is corrupt"
            )
        labels[i] = label
        seqs.append(tokenize(rec["primary"], where))
    return seqs, labels


@register_task("remote_homology")
@dataclass
class RemoteHomology(Task):
    """TAPE remote homology (fold), amino-acid ids, up to 1024 tokens: 1195 classes."""

    max_len: int = setting(1024, Interval(1, None))
    download: bool = True

    def __post_init__(self):
        self.truncated: dict[str, int] = {}  # split -> sequences truncated by the last load

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            self.name,
            "ids",
            seq_len=self.max_len,
            vocab_size=len(VOCAB),
            n_classes=N_FOLDS,
            splits=SPLITS,
            variable_length=True,
            pad_id=0,
        )

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        path = find_split(data_dir, split, self.download)
        seqs, labels = parse(read_lmdb(path, n) if path.suffix == ".lmdb" else read_json(path, n), path)
        self.truncated[split] = sum(len(s) > self.max_len for s in seqs)
        if self.truncated[split]:
            print(
                f"remote_homology/{split}: {self.truncated[split]} of {len(seqs)} sequences are longer than "
                f"{self.max_len} residues and were truncated to their first {self.max_len} (still counted)",
                file=sys.stderr,
            )
        inputs = np.empty(len(seqs), dtype=object)
        inputs[:] = [s[: self.max_len] for s in seqs]
        return SplitData(inputs, labels, np.array([len(s) for s in inputs], dtype=np.int64))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        return pad_ids(list(inputs), self.spec.pad_id)

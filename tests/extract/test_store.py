"""Verify before trust: a complete feature file is read through its checksums and compared with the
digests recorded when it was completed before ``extract`` reuses it or ``fit`` reads it; flipped
bytes, NaN or any edit after completion are refused naming the file, split and depth, and
``extract --force`` moves the damaged file aside and writes a new one."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from reservoir.errors import StoreError
from reservoir.extract.digests import DIGESTS, content_digests
from reservoir.extract.h5 import h5_file
from reservoir.extract.store import FeatureWriter, open_features, verify
from tests.conftest import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")

OPTS = ("--task", "digits", "--limit", "120", "--depths", "0,1,2", "--dtype", "float32", "--batch-size", "32")


def extract(cli, backbone, out: Path, *extra: str):
    return cli("-q", "extract", *OPTS, "--backbone", str(backbone), "--out", str(out), *extra)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_gpt2) -> Path:
    """A complete file, extracted once; each test damages a copy of it. Extracted on one thread, as the
    tests' own extractions are: a float32 product summed over another number of threads may differ in
    its last bits, and the tests compare files bit for bit."""
    from click.testing import CliRunner

    from reservoir.cli import main

    out = tmp_path_factory.mktemp("ref") / "ref.h5"
    with torch_threads(1):
        r = CliRunner().invoke(
            main,
            ["-q", "extract", *OPTS, "--backbone", str(tiny_gpt2), "--out", str(out)],
            catch_exceptions=False,
        )
    assert r.exit_code == 0, r.output
    return out


def flip_bytes(path: Path, split: str, depth_index: int) -> None:
    """Flip bytes in the middle of the first chunk of one depth, on disk, behind HDF5's back."""
    with h5py.File(path) as f:
        info = f[split]["features"].id.get_chunk_info_by_coord((0, depth_index, 0, 0))
    data = bytearray(path.read_bytes())
    for i in range(info.byte_offset + info.size // 2, info.byte_offset + info.size // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def edit(path: Path, split: str, depth_index: int, value: float) -> None:
    """Change one feature through h5py after completion (the chunk's checksum is rewritten to match)."""
    with h5py.File(path, "r+") as f:
        ds = f[split]["features"]
        x = ds[5, depth_index]
        x.flat[3] = value
        ds[5, depth_index] = x


def attrs(path: Path, split: str | None = None, **edits) -> None:
    """Edit attributes of the file (or of one split) after completion; ``None`` deletes one."""
    with h5py.File(path, "r+") as f:
        where = f if split is None else f[split]
        for name, value in edits.items():
            if value is None:
                del where.attrs[name]
            else:
                where.attrs[name] = value(where.attrs[name]) if callable(value) else value


def hollow(path: Path, what: str) -> None:
    """Remove a split, or mark a row of train never written, as a copied .partial marked complete holds."""
    with h5py.File(path, "r+") as f:
        if what == "split":
            del f["test"]
        else:
            f["train"]["done"][3] = False


DAMAGE = {
    "digests removed": (
        lambda p: attrs(p, "train", **{DIGESTS: None}),
        r"split 'train' has no digests recorded at completion: the file is damaged",
    ),
    "a split removed": (lambda p: hollow(p, "split"), r"split 'test' of its identity is missing"),
    "rows never written": (lambda p: hollow(p, "done"), r"split 'train' has rows never written"),
    "an attribute edited": (
        lambda p: attrs(p, seed=7),
        r"its seed attribute \(7\) is not its identity's \(0\): the file was edited",
    ),
    "its hash edited": (
        lambda p: attrs(p, identity_hash="0123456789"),
        r"its identity_hash attribute \('0123456789'\) is not its identity's",
    ),
    "flipped bytes": (
        lambda p: flip_bytes(p, "test", 1),
        r"split 'test', depth 1 cannot be read \(.*\): the file is corrupt",
    ),
    "NaN after completion": (
        lambda p: edit(p, "train", 2, np.nan),
        r"split 'train', depth 2 holds NaN or inf features \(row 5\)",
    ),
    "inf after completion": (
        lambda p: edit(p, "test", 0, np.inf),
        r"split 'test', depth 0 holds NaN or inf features",
    ),
    "a finite edit": (
        lambda p: edit(p, "train", 1, 0.125),
        r"split 'train', depth 1: the features differ from the digest recorded when the file was completed",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_complete_file_is_refused_by_extract_and_fit_and_force_extracts_again(
    cli, home, tmp_path, reference, tiny_gpt2, damage
):
    out = tmp_path / "f.h5"
    shutil.copy(reference, out)
    assert extract(cli, tiny_gpt2, out).exit_code == 0  # intact: reused
    hurt, message = DAMAGE[damage]
    hurt(out)
    for r in (
        extract(cli, tiny_gpt2, out),  # reuse
        cli("-q", "fit", "--features", str(out), "--head", "ridge", "--no-baselines"),
    ):
        assert r.exit_code == 1, r.output
        assert re.search(message, r.output) and str(out) in r.output, r.output
        assert "--force" in r.output and "Traceback" not in r.output
    fit = cli("-q", "fit", "--features", str(out), "--no-baselines")
    assert f"--out {out} --force" in fit.output  # fit names the very command that writes it again
    assert not list((home / "results").rglob("*.json")) if (home / "results").exists() else True

    r = extract(cli, tiny_gpt2, out, "--force")
    assert r.exit_code == 0, r.output
    assert out.with_name("f.h5.old").exists()  # moved aside, never overwritten
    with h5_file(out) as a, h5_file(reference) as b:
        verify(a)
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])
            assert a[split].attrs[DIGESTS] == b[split].attrs[DIGESTS]
    r = cli("-q", "fit", "--features", str(out), "--head", "ridge", "--no-baselines")
    assert r.exit_code == 0, r.output


def test_fit_refuses_a_file_whose_identity_was_edited(cli, home, tmp_path, reference):
    out = tmp_path / "f.h5"
    shutil.copy(reference, out)
    attrs(out, identity=lambda i: i.replace('"input_scale":"paper"', '"input_scale":"matched"'))
    r = cli("-q", "fit", "--features", str(out), "--head", "ridge", "--no-baselines")
    assert r.exit_code == 1 and "its identity_hash attribute" in r.output, r.output


def test_fit_by_task_and_backbone_verifies_the_file_it_finds(cli, home, tiny_gpt2):
    r = cli("-q", "extract", *OPTS, "--backbone", str(tiny_gpt2))
    assert r.exit_code == 0, r.output
    path = Path(r.stdout.strip())
    edit(path, "test", 2, np.nan)
    r = cli("-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--depths", "2", "--no-baselines")
    assert r.exit_code == 1 and "split 'test', depth 2 holds NaN or inf features" in r.output
    # only the depths fitted are read: depth 0 is intact
    r = cli(
        "-q",
        "fit",
        "--task",
        "digits",
        "--backbone",
        str(tiny_gpt2),
        "--depths",
        "0",
        "--head",
        "ridge",
        "--no-baselines",
    )
    assert r.exit_code == 0, r.output


def test_labels_edited_after_completion_are_refused(cli, home, tmp_path, reference, tiny_gpt2):
    out = tmp_path / "f.h5"
    shutil.copy(reference, out)
    with h5py.File(out, "r+") as f:
        y = f["train/labels"][:]
        f["train/labels"][:] = (y + 1) % 10
    r = extract(cli, tiny_gpt2, out)
    assert r.exit_code == 1 and "split 'train': the labels differ from the digest recorded" in r.output


def test_the_digests_are_recorded_at_completion_and_a_partial_has_none(reference):
    with h5_file(reference) as f:
        for split in ("train", "test"):
            recorded = json.loads(f[split].attrs[DIGESTS])
            assert len(recorded["features"]) == 3 and recorded == content_digests(f, split)


def test_api_read_features_verifies_the_depth_it_reads(tmp_path, reference):
    from reservoir import api

    out = tmp_path / "f.h5"
    shutil.copy(reference, out)
    edit(out, "test", 1, 3.0)
    X, _ = api.read_features(out, "test", 0)
    assert X.shape[0] == 120
    with pytest.raises(StoreError, match=r"split 'test', depth 1: the features differ"):
        api.read_features(out, "test", 1)


def test_report_reads_results_only_so_a_damaged_feature_file_does_not_change_it(
    cli, home, tmp_path, reference
):
    """``report`` never opens a feature file: its numbers come from results that ``fit`` wrote after
    verifying the file, so damage afterwards changes nothing it prints (and it cannot mistake it)."""
    out = tmp_path / "f.h5"
    shutil.copy(reference, out)
    assert cli("-q", "fit", "--features", str(out), "--head", "ridge", "--no-baselines").exit_code == 0
    before = cli("report")
    assert before.exit_code == 0 and "| ridge |" in before.stdout
    flip_bytes(out, "test", 1)
    after = cli("report")
    assert after.exit_code == 0 and after.stdout == before.stdout
    out.unlink()
    assert cli("report").stdout == before.stdout


# -- sharded runs: the joined file and its shards --------------------------------------------------


@pytest.fixture
def one_core():
    """This process (and the dask workers it starts) on one core: a local worker takes the cores this process may
    use, and a float32 sum split over two threads may differ in its last bits from the reference's one thread."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs os.sched_setaffinity to run a worker on one thread")
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    yield
    os.sched_setaffinity(0, cores)


@pytest.mark.slow  # about 23 s: three sharded runs on one core
def test_a_shard_damaged_after_the_join_is_refused_and_force_redoes_it(
    cli, home, tmp_path, tiny_gpt2, reference, one_core
):
    out = tmp_path / "joined.h5"
    r = extract(cli, tiny_gpt2, out, "--workers", "1", "--shard-rows", "64")
    assert r.exit_code == 0, r.output
    with (
        h5_file(out) as a,
        h5_file(reference) as b,
    ):  # one thread each (one_core): the same bits, the same digests
        for split in ("train", "test"):
            assert a[split].attrs[DIGESTS] == b[split].attrs[DIGESTS]
    shard = sorted((tmp_path / "joined.h5.shards").glob("test-*.h5"))[-1]
    with h5py.File(shard, "r+") as f:  # a shard is a feature file of the store's one writer
        f["test"]["features"][3, 1, 0, 0] = np.nan
    r = cli("-q", "fit", "--features", str(out), "--head", "ridge", "--no-baselines")
    assert r.exit_code == 1 and "split 'test', depth 1 holds NaN or inf features" in r.output, r.output
    r = extract(cli, tiny_gpt2, out, "--workers", "1", "--shard-rows", "64")
    assert r.exit_code == 1 and "split 'test', depth 1 holds NaN or inf features" in r.output
    r = extract(cli, tiny_gpt2, out, "--workers", "1", "--shard-rows", "64", "--force")
    assert r.exit_code == 0, r.output
    assert (
        f"{shard}: split 'test', depth 1 holds NaN or inf features" in r.output
        and "extracting it again" in r.output
    )
    with h5_file(out) as a, h5_file(reference) as b:
        verify(a)
        np.testing.assert_array_equal(a["test"]["features"][:], b["test"]["features"][:])


def test_the_command_that_extracts_a_file_again_writes_the_same_identity(cli, tmp_path, tiny_gpt2):
    """``extract_command`` (what fit's errors tell a user to run) gives every recorded option that changes
    the features and is not at its default: run as it reads, it writes a file of the same identity."""
    import shlex

    from reservoir.extract.store import extract_command, stored_identity

    first = tmp_path / "first.h5"
    opts = [
        "--seed",
        "3",
        "--store-dtype",
        "float16",
        "--readout",
        "mean",
        "--depths",
        "0,2",
        "--split",
        "test",
    ]
    assert extract(cli, tiny_gpt2, first, *opts).exit_code == 0
    with h5_file(first) as f:
        command = extract_command(f)
        identity = stored_identity(f)
    words = shlex.split(command)
    for option, value in zip(opts[::2], opts[1::2]):
        assert words[words.index(option) + 1] == value, command
    assert "--load-dtype" not in words and "--input-scale" not in words  # at their defaults
    again = tmp_path / "again.h5"
    words[words.index("--out") + 1] = str(again)
    assert cli("-q", *words[1:]).exit_code == 0
    with h5_file(again) as f:
        assert stored_identity(f) == identity


def test_a_forward_that_overflows_is_refused_with_advice_that_fits_its_dtype(cli, home, tiny_gpt2):
    """Features that overflow to inf or NaN stop the run naming the row and the dtype; float32 is not
    suggested to a run already in float32."""
    args = ["extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "20"]
    r = cli(*args, "--input-scale", "1e30", "--dtype", "float32", "--out", str(home / "x.h5"))
    assert r.exit_code == 1 and "NaN or inf features for row 0 of split 'train' in float32" in r.output
    (said,) = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert "--input-scale" in said and "--dtype float32" not in said and "Traceback" not in r.output
    assert not (home / "x.h5").exists()


@pytest.mark.parametrize(
    "code, said, fix",
    [
        (30, "its folder is not writable ([Errno 30] Read-only file system", "Make it writable"),
        (13, "its folder is not writable ([Errno 13] Permission denied", "Make it writable"),
        (28, "the disk is full", "Free space (or pass --out on another disk)"),
    ],
)
def test_a_failed_write_names_its_cause_and_the_fix_that_helps(tmp_path, code, said, fix):
    import os

    from reservoir.extract.store import write_failed

    e = OSError(code, os.strerror(code) if code != 30 else "Read-only file system")
    text = str(write_failed(tmp_path / "f.h5", e))
    assert f"writing {tmp_path / 'f.h5'} stopped: {said}" in text and fix in text
    assert ("Free space" in text) == (code == 28)


def test_a_partial_split_of_another_width_is_started_over(tmp_path, capsys):
    """A killed run's split written at another width under the same identity (an adapter of another
    version) is started over, not written into at the wrong shape."""
    identity = {
        "task": "t",
        "backbone": "b",
        "seed": 0,
        "dtype": "float32",
        "readout": "last",
        "depths": [0, 1],
    }
    labels, lengths = np.arange(3), np.full(3, 4)
    writer = FeatureWriter.open(tmp_path / "f.h5", identity, {}, {})
    writer.split("train", labels, lengths, (2, 1, 8))
    writer.write("train", np.arange(2), np.ones((2, 2, 1, 8), np.float32))
    writer.close()  # killed: the .partial stays
    writer = FeatureWriter.open(tmp_path / "f.h5", identity, {}, {})
    done = writer.split("train", labels, lengths, (2, 1, 4))
    assert not done.any() and writer.f["train"]["features"].shape == (3, 2, 1, 4)
    assert (
        "holds train features of shape (3, 2, 1, 8), this run writes (3, 2, 1, 4)" in capsys.readouterr().err
    )
    writer.write("train", np.arange(3), np.full((3, 2, 1, 4), 2, np.float32))
    writer.finish()
    with open_features(tmp_path / "f.h5") as f:
        assert (f["train"]["features"][:] == 2).all()


def test_a_sharded_join_cut_short_is_finished_by_workers_and_named_to_one_process(
    cli, home, tmp_path, tiny_gpt2
):
    """A run with --workers killed while joining leaves FILE.partial of virtual datasets over its shards: one
    process says to finish it with --workers (no traceback), and --workers finishes it from its shards."""
    out = tmp_path / "joined.h5"
    assert extract(cli, tiny_gpt2, out, "--workers", "1", "--shard-rows", "64").exit_code == 0
    with h5py.File(out, "r+") as f:  # as the join leaves it before it is sealed and renamed
        f.attrs["complete"] = False
    out.rename(tmp_path / "joined.h5.partial")
    r = extract(cli, tiny_gpt2, out)
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert (
        "was joined from the shards of a run with --workers and not finished; rerun with --workers"
        in r.output
    )
    r = extract(cli, tiny_gpt2, out, "--workers", "1", "--shard-rows", "64")
    assert r.exit_code == 0, r.output
    with h5_file(out) as f:
        verify(f)


def test_force_moves_aside_a_complete_file_too_truncated_to_open(cli, home, tmp_path, reference, tiny_gpt2):
    out = tmp_path / "f.h5"
    shutil.copy(reference, out)
    os.truncate(out, out.stat().st_size // 2)
    r = extract(cli, tiny_gpt2, out)
    assert r.exit_code == 1 and "cannot be opened" in r.output, r.output
    r = extract(cli, tiny_gpt2, out, "--force")
    assert r.exit_code == 0 and "cannot be opened (truncated or damaged)" in r.output, r.output
    assert out.with_name("f.h5.old").stat().st_size < reference.stat().st_size
    with h5_file(out) as f:
        verify(f)


def test_force_never_moves_aside_a_complete_file_of_another_run(cli, home, tmp_path, reference, tiny_gpt2):
    """``--force --out F`` where F holds another run's features (another --limit) refuses, naming the
    difference, and leaves the file where it is, whole."""
    out = tmp_path / "other.h5"
    shutil.copy(reference, out)
    r = cli("-q", "extract", *OPTS[:2], "--limit", "60", *OPTS[4:], "--backbone", str(tiny_gpt2), "--out", str(out),
            "--force")  # fmt: skip
    assert r.exit_code == 1 and "holds features of another run" in r.output, r.output
    assert "cannot be opened" not in r.output and not out.with_name("other.h5.old").exists()
    assert out.read_bytes() == reference.read_bytes()


def test_a_filesystem_without_file_locks_is_named_not_taken_for_another_writer(tmp_path, monkeypatch):
    import errno
    import fcntl

    from reservoir.extract.store import WriterLock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(StoreError, match=r"cannot be locked against a second writer on this filesystem"):
        WriterLock(tmp_path / "x.h5")


def test_a_file_at_its_final_name_not_marked_complete_is_named_damaged_and_force_redoes_it(
    cli, home, tmp_path, reference, tiny_gpt2
):
    """A file gets its final name only once complete: one found there unmarked was damaged since, and extract
    says so with the --force that redoes it, rather than asking again and again to finish it."""
    out = tmp_path / "u.h5"
    shutil.copy(reference, out)
    with h5py.File(out, "r+") as f:
        f.attrs["complete"] = False
    for r in (extract(cli, tiny_gpt2, out), cli("fit", "--features", str(out), "--head", "ridge")):
        assert (
            r.exit_code == 1 and "is not marked complete, though at its final name: it is damaged" in r.output
        )
        assert "--force" in r.output, r.output
    assert extract(cli, tiny_gpt2, out, "--force").exit_code == 0
    with h5_file(out) as f:
        verify(f)


def test_damaged_metadata_is_refused_in_words_never_with_a_traceback(cli, home, tmp_path, reference):
    """A feature file whose recorded identity lost a field, whose digests lost theirs, or whose HDF5
    structure lost an attribute is refused by fit in words (exit 1), not with a KeyError."""
    cases = {
        "identity": ("its recorded identity is damaged", lambda f: f.attrs.modify(
            "identity", json.dumps({k: v for k, v in json.loads(f.attrs["identity"]).items() if k != "task"}))),
        "digests": ("its recorded digests are damaged", lambda f: f["train"].attrs.modify(
            "sha256", json.dumps({"features": []}))),
        "structure": ("its HDF5 structure is damaged", lambda f: f.attrs.__delitem__("config")),
    }  # fmt: skip
    for name, (said, damage) in cases.items():
        out = tmp_path / f"{name}.h5"
        shutil.copy(reference, out)
        with h5py.File(out, "r+") as f:
            damage(f)
        r = cli("fit", "--features", str(out), "--head", "ridge", "--no-baselines")
        assert r.exit_code == 1 and said in r.output and "Traceback" not in r.output, (name, r.output)
        assert str(out) in r.output, r.output  # the file named

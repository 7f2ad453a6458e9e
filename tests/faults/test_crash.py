"""The store survives faults: SIGKILL at random moments, a full disk, truncated and corrupt files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_sigkill_at_random_moments_then_rerun_equals_the_uninterrupted_file():
    """Three kills through the stress script (``benchmarks/kill_stress.py --kills 20`` runs more)."""
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "kill_stress.py"),
            "--kills",
            "3",
            "--limit",
            "120",
            "--seed",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kills" in r.stdout and "every rerun equals the uninterrupted file" in r.stdout


@pytest.mark.slow
def test_sigkill_of_a_sharded_run_then_rerun_equals_the_uninterrupted_file():
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "kill_stress.py"),
            "--kills",
            "4",
            "--limit",
            "300",
            "--seed",
            "2",
            "--",
            "--workers",
            "2",
            "--shard-rows",
            "64",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_torn_chunk_in_a_partial_file_is_not_trusted(cli, home, tmp_path, monkeypatch):
    """A kill in the middle of writing a chunk: the resumed run starts over instead of failing."""
    from reservoir.runtime.runner import FeatureRunner

    out = tmp_path / "f.h5"
    args = (
        "-q",
        "extract",
        "--task",
        "digits",
        "--backbone",
        "lstm",
        "--depths",
        "0,1",
        "--limit",
        "200",
        "--dtype",
        "float32",
        "--batch-size",
        "50",
    )
    assert cli(*args, "--out", str(tmp_path / "ref.h5")).exit_code == 0
    calls = {"n": 0}
    run = FeatureRunner.run_async

    def killed_after_two(self, batch):
        calls["n"] += 1
        if calls["n"] > 2:
            raise SystemExit(1)  # the run dies; the writer thread has flushed two batches
        return run(self, batch)

    monkeypatch.setattr(FeatureRunner, "run_async", killed_after_two)
    cli(*args, "--out", str(out))
    monkeypatch.undo()
    partial = tmp_path / "f.h5.partial"
    with h5py.File(partial) as f:
        info = f["train/features"].id.get_chunk_info(0)
    data = bytearray(partial.read_bytes())
    data[info.byte_offset + 10] ^= 0xFF  # the chunk a kill tore
    partial.write_bytes(bytes(data))
    r = cli(*args, "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "fails its checksum" in r.output  # stderr (click 8.1 mixes it into output; 8.2 keeps both)
    with h5py.File(out) as a, h5py.File(tmp_path / "ref.h5") as b:
        np.testing.assert_array_equal(a["train/features"][:], b["train/features"][:])


def test_a_truncated_feature_file_is_named_with_the_fix(cli, home, tmp_path):
    out = tmp_path / "f.h5"
    assert (
        cli(
            "-q",
            "extract",
            "--task",
            "digits",
            "--backbone",
            "lstm",
            "--depths",
            "0",
            "--limit",
            "200",
            "--out",
            str(out),
        ).exit_code
        == 0
    )
    out.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    r = cli("fit", "--features", str(out))
    assert r.exit_code == 1 and str(out) in r.output and "Traceback" not in r.output
    assert "truncated" in r.output or "cannot be opened" in r.output or "corrupt" in r.output


def test_nan_features_are_refused_naming_file_split_and_depth(cli, home, tmp_path):
    out = tmp_path / "f.h5"
    assert (
        cli(
            "-q",
            "extract",
            "--task",
            "digits",
            "--backbone",
            "lstm",
            "--depths",
            "0,1",
            "--limit",
            "200",
            "--out",
            str(out),
        ).exit_code
        == 0
    )
    with h5py.File(out, "r+") as f:
        x = f["train/features"][:]
        x[3, 1] = np.nan
        f["train/features"][:] = x
    r = cli("fit", "--features", str(out), "--head", "ridge")
    assert r.exit_code == 1 and "split 'train', depth 1 holds NaN or inf features" in r.output


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (needs root; skipped elsewhere), grown to 64 MiB by calling it."""
    import os
    import shutil

    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")

    def grow():
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)

    yield mount, grow
    subprocess.run(["umount", "-l", str(mount)])


@pytest.mark.parametrize("when", ["known before writing", "filling during the run"])
def test_a_full_disk_fails_cleanly_and_the_rerun_after_freeing_space_completes(
    cli, home, tmp_path, small_disk, when
):
    mount, grow = small_disk
    args = (
        "-q",
        "extract",
        "--task",
        "digits",
        "--backbone",
        "lstm",
        "--depths",
        "0,1,2",
        "--limit",
        "300",
        "--dtype",
        "float32",
        "--batch-size",
        "50",
    )
    assert cli(*args, "--out", str(tmp_path / "ref.h5")).exit_code == 0
    out = mount / "f.h5"
    if when == "filling during the run":
        # the free-space check passes and the disk fills while writing; run as a user runs it, in a
        # process of its own (after a mid-write ENOSPC, HDF5's state in that process is not reusable)
        code = (
            f"from reservoir.extract import store; store.check_space = lambda path, nbytes: None\n"
            f"from reservoir.cli import main; main({[*args, '--out', str(out)]!r})"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        )
        r = SimpleNamespace(exit_code=proc.returncode, output=proc.stdout + proc.stderr)
    else:
        r = cli(*args, "--out", str(out))
    assert r.exit_code == 1, r.output
    assert (
        "the disk is full" in r.output
        and "rerun the same command" in r.output
        and "Traceback" not in r.output
    )
    assert not out.exists()
    grow()
    r = cli(*args, "--out", str(out))
    assert r.exit_code == 0, r.output
    with h5py.File(out) as a, h5py.File(tmp_path / "ref.h5") as b:
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])


#: run in a process of its own (as a user runs it): HDF5 writes fail with ENOSPC once N feature rows are written
FILLING_DISK = """
import errno, sys
import h5py
state = {"rows": 0}
setitem = h5py.Dataset.__setitem__

def filling(self, index, value):
    if self.name.endswith("/features"):
        state["rows"] += len(value)
        if state["rows"] > int(sys.argv[1]):
            raise OSError(errno.ENOSPC, "No space left on device")
    return setitem(self, index, value)

h5py.Dataset.__setitem__ = filling
from reservoir.cli import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("rows", [0, 130])
def test_a_disk_that_fills_mid_run_exits_1_in_words_and_the_rerun_resumes_to_the_same_file(
    cli, home, tmp_path, rows
):
    import os

    from reservoir.extract.h5 import h5_file
    from reservoir.extract.store import partial_path, verify

    args = (
        "-q",
        "extract",
        "--task",
        "digits",
        "--backbone",
        "lstm",
        "--depths",
        "0,1,2",
        "--limit",
        "300",
        "--dtype",
        "float32",
        "--batch-size",
        "50",
    )
    assert cli(*args, "--out", str(tmp_path / "ref.h5")).exit_code == 0
    out = tmp_path / "f.h5"
    proc = subprocess.run(
        [sys.executable, "-c", FILLING_DISK, str(rows), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert (
        f"writing {partial_path(out)} stopped: the disk is full. Free space (or pass --out on another disk) and "
        "rerun the same command: it resumes where it stopped" in output
    )
    assert "Traceback" not in output and output.count("\n") <= 2  # one line
    assert not out.exists() and partial_path(out).exists()  # nothing that looks complete
    with h5_file(partial_path(out)) as f:
        assert not f.attrs["complete"]
        assert sum(int(f[s].attrs["rows_done"]) for s in ("train", "test") if s in f) == (rows // 50) * 50
    r = cli(*args, "--out", str(out))  # space freed: the same command
    assert r.exit_code == 0, r.output
    with h5_file(out) as a, h5_file(tmp_path / "ref.h5") as b:
        verify(a)
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])
            assert a[split].attrs["sha256"] == b[split].attrs["sha256"]

"""Faults injected where they happen in practice: concurrent writers of the measurement records, a killed
save of a trained backbone, I/O errors while reading data and writing features, a reader of a file still
being written, a dask worker killed mid-run."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

from reservoir.runtime import records


def _put_many(cache: str, who: int, n: int) -> None:
    os.environ["RESERVOIR_CACHE"] = cache
    for k in range(n):
        records.put("rates.json", f"{who}-{k}", {"rate": k})


def test_two_processes_writing_the_measurement_records_lose_no_record(tmp_path, monkeypatch):
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_put_many, args=(str(tmp_path), who, 150)) for who in range(2)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    assert [w.exitcode for w in writers] == [0, 0]
    kept = records.read("rates.json")
    assert sorted(kept) == sorted(f"{who}-{k}" for who in range(2) for k in range(150))


# -- a reader of a file still being written ---------------------------------------------------

HOLD = "import sys, time; from reservoir.extract.store import WriterLock; WriterLock(sys.argv[1]); print('held', flush=True); time.sleep(120)"


def test_fit_on_a_file_still_being_written_is_refused_naming_the_writer(cli, home, tiny_gpt2):
    """While `extract` holds a file's writer lock, `fit` on its path (or its .partial) is refused, naming the writer;
    once the writer is gone, the advice is to resume the extraction."""
    import h5py

    out = home / "f.h5"
    assert (
        cli(
            "-q",
            "extract",
            "--task",
            "digits",
            "--backbone",
            str(tiny_gpt2),
            "--limit",
            "60",
            "--out",
            str(out),
        ).exit_code
        == 0
    )
    partial = out.with_name("f.h5.partial")
    out.rename(partial)
    with h5py.File(partial, "r+") as f:
        f.attrs["complete"] = False  # the state of a run in the middle of its rows
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for path in (out, partial):
            r = cli("fit", "--features", str(path), "--head", "ridge")
            assert r.exit_code == 1, r.output
            assert (
                f"is still being written by pid {holder.pid}" in r.output
                and "wait for it to finish" in r.output
            )
    finally:
        holder.kill()
        holder.wait()
    r = cli("fit", "--features", str(out), "--head", "ridge")
    assert (
        r.exit_code == 1 and "an unfinished run left" in r.output and "rerun extract to resume it" in r.output
    )


# -- I/O errors while reading data and writing features ---------------------------------------

EIO_ON_WRITE = """
import errno, sys
from reservoir.extract import store
calls = [0]
original = store.FeatureWriter._write
def failing(self, *args):
    calls[0] += 1
    if calls[0] == int(sys.argv[1]):
        raise OSError(errno.EIO, "Input/output error")
    return original(self, *args)
store.FeatureWriter._write = failing
from reservoir.cli import main
main(sys.argv[2:])
"""


def extract_args(tiny_gpt2, out):
    return [
        "-q",
        "extract",
        "--task",
        "digits",
        "--backbone",
        str(tiny_gpt2),
        "--limit",
        "64",
        "--batch-size",
        "8",
        "--dtype",
        "float32",
        "--engine",
        "torch",
        "--out",
        str(out),
    ]


def test_an_io_error_writing_features_mid_run_is_reported_and_the_rerun_equals_an_uninterrupted_run(
    home, tiny_gpt2
):
    import h5py

    env = {**os.environ, "OMP_NUM_THREADS": "1", "RESERVOIR_HOME": str(home)}
    out = home / "f.h5"
    r = subprocess.run(
        [sys.executable, "-c", EIO_ON_WRITE, "3", *extract_args(tiny_gpt2, out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert (
        f"writing {out}.partial stopped: the write failed ([Errno 5] Input/output error). Check the disk"
        in r.stderr
    )
    assert "rerun the same command: it resumes where it stopped" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()  # nothing that looks complete
    with h5py.File(out.with_name("f.h5.partial")) as f:
        assert not f.attrs.get("complete", False)
    for path, argv in ((out, [EIO_ON_WRITE, "0"]), (home / "whole.h5", [EIO_ON_WRITE, "0"])):
        r = subprocess.run(
            [sys.executable, "-c", *argv, *extract_args(tiny_gpt2, path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
    with h5py.File(out) as a, h5py.File(home / "whole.h5") as b:
        assert a.attrs["complete"] and a.attrs["identity"] == b.attrs["identity"]
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])


def test_an_io_error_reading_the_data_is_reported_in_words(cli, home, tmp_path, monkeypatch):
    import errno
    import gzip

    from tests.conftest import write_mnist

    write_mnist(tmp_path / "data" / "mnist", {"train": 40, "t10k": 20})

    class FailingDisk:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, *args):
            raise OSError(errno.EIO, "Input/output error")

    real = gzip.open
    monkeypatch.setattr(
        gzip,
        "open",
        lambda path, *a, **k: FailingDisk() if "train-images" in str(path) else real(path, *a, **k),
    )
    r = cli(
        "extract",
        "--task",
        "mnist",
        "--backbone",
        "lstm",
        "--limit",
        "20",
        "--data-dir",
        str(tmp_path / "data"),
    )
    assert r.exit_code == 1, r.output
    assert (
        "train-images-idx3-ubyte.gz failed: the disk reported an I/O error ([Errno 5] Input/output error)"
        in r.output
        and "then rerun" in r.output
        and "Traceback" not in r.output
    )
    assert not (home / "features").exists() or not list((home / "features").rglob("*.h5*"))
    monkeypatch.setattr(gzip, "open", real)
    r = cli(
        "-q",
        "extract",
        "--task",
        "mnist",
        "--backbone",
        "lstm",
        "--limit",
        "20",
        "--data-dir",
        str(tmp_path / "data"),
    )
    assert r.exit_code == 0, r.output


# -- a save of a trained backbone killed while writing ----------------------------------------

SLOW_SAVE = """
import sys, time
from reservoir.model.backbones.gpt2 import random_gpt2
from reservoir.train import export
backbone = random_gpt2(0, n_layer=1, n_embd=16, n_head=2)
original = type(backbone).save_pretrained
def slow(self, folder):
    original(self, folder)
    print('written', flush=True)
    time.sleep(120)  # killed here, before the rename
type(backbone).save_pretrained = slow
export.save_backbone(backbone, sys.argv[1], {"note": "killed"})
"""


def test_a_save_killed_while_writing_leaves_nothing_the_next_save_does_not_clean(home):
    """SIGKILL in the middle of `train --save-backbone`'s write: no folder under the final name, and the next save
    to it removes the half-written one and writes the folder."""
    import signal

    from reservoir.model.backbones import load_backbone
    from reservoir.model.backbones.gpt2 import random_gpt2
    from reservoir.train.export import save_backbone

    folder = home / "models" / "bit"
    saver = subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVE, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert saver.stdout.readline().strip() == "written"
    os.kill(saver.pid, signal.SIGKILL)
    saver.wait()
    (left,) = folder.parent.glob(".bit.*.partial")
    assert not folder.exists() and (left / "config.json").exists()
    save_backbone(random_gpt2(1, n_layer=1, n_embd=16, n_head=2), folder, {"note": "again"})
    assert not list(folder.parent.glob(".bit.*.partial")) and load_backbone(str(folder)).n_layers == 1


def test_a_resumed_file_keeps_the_engine_that_began_it(cli, home, tiny_gpt2, monkeypatch):
    """A file cut short on PyTorch and resumed where `--engine auto` would take OpenVINO goes on with PyTorch, so one
    engine made every row; asking for the other engine explicitly is refused with the fix."""
    import h5py

    pytest.importorskip("openvino")
    from reservoir.runtime import engines

    out = home / "f.h5"
    args = extract_args(tiny_gpt2, out)
    r = subprocess.run(
        [sys.executable, "-c", EIO_ON_WRITE, "3", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "RESERVOIR_HOME": str(home)},
        timeout=300,
    )
    assert r.returncode == 1 and out.with_name("f.h5.partial").exists(), r.stderr
    monkeypatch.setattr(engines, "OPENVINO_MIN_TOKENS", 0)  # auto would take OpenVINO for this tiny run
    auto = [a if a != "torch" else "auto" for a in args]
    r = cli(*[a if a != "auto" else "openvino" for a in auto])
    assert (
        r.exit_code == 1 and "was begun on the torch engine; rerun with --engine torch (or auto)" in r.output
    )
    r = cli(*auto)
    assert r.exit_code == 0, r.output
    with h5py.File(out) as f:
        assert json.loads(f.attrs["config"])["engine_used"] == "torch" and f.attrs["complete"]


def test_fit_by_task_while_its_extraction_runs_names_the_writer_not_another_command(cli, home, tiny_gpt2):
    """``fit --task T --backbone B`` finding only an unfinished file names it and its writer (or, once the
    writer is gone, the extract that wrote it), never a command of fit's options, which may lack the
    extraction's own (its --limit, its dtype)."""
    args = ("--task", "bit_xor", "--backbone", str(tiny_gpt2))
    assert cli("-q", "extract", *args, "--limit", "40", "--dtype", "float32").exit_code == 0
    (final,) = (home / "features").rglob("*.h5")
    partial = final.with_name(final.name + ".partial")
    final.rename(partial)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(final)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = cli("fit", *args)
        assert r.exit_code == 1 and f"being written by pid {holder.pid}" in r.output, r.output
        assert str(partial) in r.output and "run `reservoir extract" not in r.output
    finally:
        holder.kill()
        holder.wait()
    r = cli("fit", *args)
    assert r.exit_code == 1 and "rerun the extract that wrote it" in r.output, r.output

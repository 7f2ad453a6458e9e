"""Sharded extraction over dask.distributed (loopback only): equal to a single process bit for bit
(float32), through a LocalCluster and through a scheduler with separately started workers,
and after a worker dies mid-run; shards of another run are refused, missing ones named."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

#: variable-length ListOps (bucketed within shards) through the tiny GPT-2: 7 shards of up to 16 rows
LISTOPS = (
    "--task",
    "listops",
    "--task-opt",
    "max_len=64",
    "--task-opt",
    "n_train=64",
    "--task-opt",
    "n_val=8",
    "--task-opt",
    "n_test=24",
    "--task-opt",
    "min_length=5",
    "--task-opt",
    "max_length=60",
)
OPTS = ("--dtype", "float32", "--batch-size", "4", "--shard-rows", "16", "--depths", "0,1,2")


def extract(cli, backbone, out: Path, *extra: str):
    r = cli("-q", "extract", *LISTOPS, "--backbone", str(backbone), *OPTS, "--out", str(out), *extra)
    return r


def assert_same_features(a: Path, b: Path) -> None:
    with h5py.File(a) as fa, h5py.File(b) as fb:
        assert fa.attrs["identity"] == fb.attrs["identity"]
        splits = [s for s in fa if s != "input_layer"]
        assert splits == [s for s in fb if s != "input_layer"]
        for s in splits:
            np.testing.assert_array_equal(fa[s]["features"][:], fb[s]["features"][:])
            np.testing.assert_array_equal(fa[s]["labels"][:], fb[s]["labels"][:])
        np.testing.assert_array_equal(fa["input_layer/weight"][:], fb["input_layer/weight"][:])


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_gpt2):
    """The single-process reference file, computed with one thread as each worker is (float32 CPU
    kernels split some reductions by thread, so equal bits need equal threads per computation)."""
    from click.testing import CliRunner

    from reservoir.cli import main
    from tests.conftest import torch_threads

    out = tmp_path_factory.mktemp("single") / "f.h5"
    with torch_threads(1):
        r = CliRunner().invoke(
            main,
            ["-q", "extract", *LISTOPS, "--backbone", str(tiny_gpt2), *OPTS, "--out", str(out)],
            catch_exceptions=False,
        )
    assert r.exit_code == 0, r.output
    return out


def test_two_local_workers_equal_one_process_bit_for_bit(cli, home, tiny_gpt2, single, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = home / "sharded.h5"
    r = extract(cli, tiny_gpt2, out, "--workers", "2")
    assert r.exit_code == 0, r.output
    shards = sorted((home / "sharded.h5.shards").glob("*.h5"))
    assert len(shards) == 7 and not list(home.glob("*.partial")) and not (home / "sharded.h5.lock").exists()
    with h5py.File(out) as f:
        assert f["train/features"].is_virtual and f.attrs["complete"]
    assert_same_features(out, single)
    # fit reads the joined file unchanged
    r = cli("-q", "fit", "--features", str(out), "--head", "ridge", "--depths", "2")
    assert r.exit_code == 0, r.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster(tmp_path):
    """A scheduler and two single-threaded workers (no nanny), started as separate processes."""
    dask = shutil.which("dask", path=str(Path(sys.executable).parent))
    if dask is None:
        pytest.skip("the dask command is not installed")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per worker, as the reference
    procs = [
        subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    for i in range(2):
        procs.append(
            subprocess.Popen(
                [
                    dask,
                    "worker",
                    address,
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--name",
                    str(i),
                    "--local-directory",
                    str(tmp_path / f"w{i}"),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    from distributed import Client

    deadline = time.time() + 60
    with Client(address, timeout="30s") as client:
        while len(client.scheduler_info()["workers"]) < 2:
            assert time.time() < deadline, "workers did not start"
            time.sleep(0.2)
    yield address, procs
    for p in procs:
        p.kill()
        p.wait()


def test_scheduler_with_separately_started_workers_equals_one_process(cli, home, tiny_gpt2, single, cluster):
    address, _ = cluster
    out = home / "remote.h5"
    r = extract(cli, tiny_gpt2, out, "--scheduler", address)
    assert r.exit_code == 0, r.output
    assert_same_features(out, single)


def test_a_worker_killed_mid_run_then_a_rerun_equals_one_process(
    cli, home, tiny_gpt2, single, cluster, monkeypatch
):
    """Kill one worker as soon as the first shard lands; the run finishes on the other worker (dask
    reschedules the lost shards) or fails, and a rerun completes; either way the file equals the
    single-process one."""
    import threading

    address, procs = cluster
    out = home / "killed.h5"
    folder = home / "killed.h5.shards"

    def kill_when_a_shard_lands():
        deadline = time.time() + 120
        while time.time() < deadline and not list(folder.glob("*.h5")):
            time.sleep(0.01)
        procs[1].kill()

    killer = threading.Thread(target=kill_when_a_shard_lands)
    killer.start()
    r = extract(cli, tiny_gpt2, out, "--scheduler", address)
    killer.join()
    assert procs[1].poll() is not None  # the worker really died during the run
    if r.exit_code != 0:  # the lost shards were not rescheduled in time: rerun
        r = extract(cli, tiny_gpt2, out, "--scheduler", address)
    assert r.exit_code == 0, r.output
    assert_same_features(out, single)


def test_a_shard_of_another_run_is_refused_and_a_missing_shard_is_named(cli, home, tiny_gpt2, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = home / "s.h5"
    assert extract(cli, tiny_gpt2, out, "--workers", "1").exit_code == 0
    shard = sorted((home / "s.h5.shards").glob("train-*.h5"))[1]
    # another run (seed 1) told to write to the same place finds shards of seed 0
    out.unlink()
    r = extract(cli, tiny_gpt2, out, "--workers", "1", "--seed", "1")
    assert (
        r.exit_code == 1 and "belongs to another run (" in r.output and "seed: stored 0, asked 1" in r.output
    )
    # the joined file of seed 0 again, then one of its shards disappears
    assert extract(cli, tiny_gpt2, out, "--workers", "1").exit_code == 0
    shard.unlink()
    r = cli("fit", "--features", str(out))
    assert r.exit_code == 1 and "shard file(s) that are gone" in r.output and shard.name in r.output
    # delete the joined file and rerun: only the missing shard is computed again
    out.unlink()
    assert extract(cli, tiny_gpt2, out, "--workers", "1").exit_code == 0 and shard.exists()


@pytest.mark.slow  # about 22 s: a sharded run cut and resumed
def test_a_resumed_sharded_run_decides_compile_by_the_whole_run(cli, home, tiny_gpt2, monkeypatch):
    """The compile decision (by size) of a sharded run counts every shard's tokens, those already done too:
    a rerun after a kill compiles as the first attempt did, so its rows are of one graph."""
    import reservoir.extract.run

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    sizes = []
    monkeypatch.setattr(
        reservoir.extract.run,
        "should_compile",
        lambda setting, tokens, backbone=None: sizes.append(tokens) and False,
    )
    out = home / "s.h5"
    assert extract(cli, tiny_gpt2, out, "--workers", "1").exit_code == 0
    out.unlink()
    for shard in sorted((home / "s.h5.shards").glob("train-*.h5"))[1:]:
        shard.unlink()  # a kill that left the first shard only
    r = extract(cli, tiny_gpt2, out, "--workers", "1")
    assert r.exit_code == 0, r.output
    assert len(sizes) == 2 and sizes[0] == sizes[1] > 0


# int8-static centres and scales with the calibration rows, dynamic int8 only centres: about 25 s to 40 s each
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int8", "int8-static"])
def test_int8_shards_calibrate_on_the_same_rows_as_one_process(cli, home, tiny_gpt2, monkeypatch, dtype):
    """Every worker centres (and, int8-static, scales) with the run's calibration rows (the first
    rows of its first split), not its own shard's, so a sharded int8 run equals a single process."""
    pytest.importorskip("openvino")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one, sharded = home / "one.h5", home / "sharded.h5"
    assert extract(cli, tiny_gpt2, one, "--dtype", dtype).exit_code == 0
    r = extract(cli, tiny_gpt2, sharded, "--dtype", dtype, "--workers", "2")
    assert r.exit_code == 0, r.output
    with h5py.File(one) as fa, h5py.File(sharded) as fb:
        assert fa.attrs["identity"] == fb.attrs["identity"]
        for s in ("train", "test"):
            np.testing.assert_allclose(fa[s]["features"][:], fb[s]["features"][:], rtol=1e-5, atol=1e-6)


def test_without_dask_a_sharded_run_says_which_extra_to_install(cli, home, monkeypatch):
    """dask is the `cluster` extra: without it, --workers exits 1 naming the extra, and one process still runs."""
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` raises ImportError
    r = cli("extract", "--task", "bit_xor", "--backbone", "lstm", "--limit", "20", "--workers", "2")
    assert r.exit_code == 1 and "pip install 'reservoir[cluster]'" in r.output, r.output
    assert cli("-q", "extract", "--task", "bit_xor", "--backbone", "lstm", "--limit", "20").exit_code == 0


@pytest.mark.parametrize(
    "picked", [pytest.param("openvino", marks=pytest.mark.slow), "torch"]
)  # about 20 s each
def test_auto_settles_one_engine_for_every_shard_and_equals_one_process(
    cli, home, tiny_gpt2, monkeypatch, picked
):
    """`--engine auto` on a CPU where it takes OpenVINO, and on one where PyTorch measured faster: the driver decides
    once, every shard runs that engine and records it, and the joined file equals one process's bit for bit."""
    pytest.importorskip("openvino")
    from reservoir.runtime import engines, records
    from tests.conftest import torch_threads

    kept = records.get
    monkeypatch.setattr(engines, "OPENVINO_MIN_TOKENS", 0)  # a tiny run: auto considers OpenVINO
    monkeypatch.setattr(
        records,
        "get",
        lambda name, key: (
            {"torch": 1.0, "openvino": 1.0} if name == engines.ENGINE_RATES else kept(name, key)
        ),
    )  # measured before, on this machine ...
    monkeypatch.setattr(
        "reservoir.runtime.runner.faster_engine", lambda rates: picked
    )  # ... with this verdict
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with torch_threads(1):
        r = extract(cli, tiny_gpt2, home / "one.h5", "--engine", "auto")
    assert r.exit_code == 0, r.output
    r = extract(cli, tiny_gpt2, home / "two.h5", "--engine", "auto", "--workers", "2")
    assert r.exit_code == 0, r.output
    assert_same_features(home / "two.h5", home / "one.h5")
    for path in (home / "one.h5", home / "two.h5", *sorted((home / "two.h5.shards").glob("*.h5"))):
        with h5py.File(path) as f:
            assert json.loads(f.attrs["config"])["engine_used"] == picked, path


@pytest.mark.slow  # about 25 s: two sharded runs under two engines
def test_a_shard_another_engine_made_is_made_again(cli, home, tiny_gpt2, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert extract(cli, tiny_gpt2, home / "f.h5", "--workers", "2", "--engine", "torch").exit_code == 0
    (home / "f.h5").unlink()
    shard = sorted((home / "f.h5.shards").glob("*.h5"))[0]
    with h5py.File(shard, "r+") as f:  # as if a worker had decided for itself
        f.attrs["config"] = json.dumps({**json.loads(f.attrs["config"]), "engine_used": "openvino"})
    r = extract(cli, tiny_gpt2, home / "f.h5", "--workers", "2", "--engine", "torch")
    assert r.exit_code == 0 and f"shard {shard} was made by the openvino engine" in r.output, r.output
    with h5py.File(shard) as f:
        assert json.loads(f.attrs["config"])["engine_used"] == "torch"


def test_shards_stored_as_bfloat16_join_into_the_file_one_process_writes(cli, home, tiny_gpt2, monkeypatch):
    """The joined file's virtual features take the shards' stored dtype (bfloat16 bits) and read back as
    the single process's."""
    from reservoir.extract.store import open_features, read_depths

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one, sharded = home / "one.h5", home / "sharded.h5"
    assert extract(cli, tiny_gpt2, one, "--store-dtype", "bfloat16").exit_code == 0
    r = extract(cli, tiny_gpt2, sharded, "--store-dtype", "bfloat16", "--workers", "1")
    assert r.exit_code == 0, r.output
    assert_same_features(one, sharded)
    with open_features(sharded) as f:
        assert f["train/features"].is_virtual and f["train/features"].attrs["encoding"] == "bfloat16"
        with open_features(one) as g:
            np.testing.assert_array_equal(read_depths(f, "test")[0], read_depths(g, "test")[0])


def test_weights_read_in_bfloat16_shard_as_one_process_reads_them(cli, home, tiny_gpt2, monkeypatch):
    """``--load-dtype bfloat16`` with workers: each worker reads the weights in bfloat16 as the driver does (it
    read them in float32, and every shard was refused as another model's), and the file equals one process's."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one, sharded = home / "one.h5", home / "sharded.h5"
    load = ("--load-dtype", "bfloat16", "--dtype", "bfloat16")
    assert extract(cli, tiny_gpt2, one, *load).exit_code == 0
    r = extract(cli, tiny_gpt2, sharded, *load, "--workers", "1")
    assert r.exit_code == 0, r.output
    assert_same_features(one, sharded)

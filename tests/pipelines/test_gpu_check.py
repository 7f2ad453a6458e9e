"""benchmarks/gpu.py, the one prepared check of a GPU machine, in its small mode on this machine: every file
written (at most eight), each JSON one with its keys, a step out of time recorded instead of crashing,
and a bad start an exit 1 in words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
FILES = {
    "env.json",
    "roofline.json",
    "test_cuda.log",
    "extract.json",
    "job.json",
    "train.json",
    "science.log",
    "summary.md",
}


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        timeout=600,
    )


@pytest.mark.slow  # about 90 s: every step of the GPU check in its small mode
def test_the_small_check_writes_every_file_with_its_keys(tmp_path):
    done = check("--small", "--device", "cpu", env={"OUT": str(tmp_path)})  # --out defaults to $OUT
    assert done.returncode == 0, done.stderr
    assert {p.name for p in tmp_path.iterdir()} == FILES
    env, roof = (json.loads((tmp_path / f).read_text()) for f in ("env.json", "roofline.json"))
    assert env["status"] == "ok" and {"card", "driver", "torch", "cuda", "cudnn", "cpu"} <= set(env)
    assert roof["tflops"]["bfloat16"] > 0 and roof["tflops"]["float32"] > 0
    extract = json.loads((tmp_path / "extract.json").read_text())
    for shape in ("mnist", "listops"):
        s = extract["shapes"][shape]
        assert {"hf-bf16-sdpa", "ours-eager", "ours-in-flight"} <= set(s["tokens_per_s"]), s
        assert s["attention_hf"] == "sdpa" and s["ours_one_batch_at_a_time_over_hf"] > 0, s
        assert s["of_roofline"]["ours-eager"] > 0 and s["ours_over_hf"] > 0
    assert extract["shapes"]["listops"]["tokens"] == "ids"
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["rows"] == 600 and job["tokens_per_s"] > 0
    assert {"imports_s", "preparing_s", "probe_and_decision_s", "steady_s", "finishing_s"} <= set(
        job["phases"]
    )
    train = json.loads((tmp_path / "train.json").read_text())
    assert all(train["tasks"][t]["steps_per_s"] > 0 for t in ("bit_memory", "listops"))
    assert "skipped" in (tmp_path / "test_cuda.log").read_text()  # no CUDA here: collected, all skipped
    assert "ridge test accuracy per depth" in (tmp_path / "science.log").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("| ok |") == 7, summary


def test_steps_out_of_time_are_recorded_and_the_check_still_exits_0(tmp_path):
    done = check("--small", "--device", "cpu", "--budget", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert {p.name for p in tmp_path.iterdir()} == FILES
    assert json.loads((tmp_path / "extract.json").read_text())["status"] == "skipped: out of time"
    assert "skipped: out of time" in (tmp_path / "test_cuda.log").read_text()
    assert (tmp_path / "summary.md").read_text().count("skipped: out of time") == 7


def test_a_check_that_cannot_start_exits_1_in_words(tmp_path):
    done = check("--small", env={"OUT": ""})
    assert done.returncode == 1 and "no output folder: pass --out DIR, or set OUT" in done.stderr
    done = check("--small", "--out", str(tmp_path), "--device", "cuda:7")
    assert done.returncode == 1 and "--device cuda:7: this machine has" in done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())


def test_some_steps_only_share_the_budget_and_an_unknown_step_is_a_usage_error(tmp_path):
    done = check("--small", "--device", "cpu", "--steps", "roofline,env", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"env.json", "roofline.json", "summary.md"}
    summary = (tmp_path / "summary.md").read_text()
    assert summary.index("| env |") < summary.index("| roofline |") and summary.count("| ok |") == 2
    done = check("--small", "--steps", "env,warp", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "unknown step 'warp'; choose from env,roofline" in done.stderr


def run_script(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )


@pytest.mark.slow  # about 40 s: every variant of the profile
def test_the_profile_measures_every_variant_in_its_small_mode(tmp_path):
    done = run_script(ROOT / "benchmarks" / "gpu_profile.py", "--small", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    profile = json.loads((tmp_path / "profile.json").read_text())
    rates = profile["rates"]
    assert set(rates) == {"compiled", "compiled-in-flight", "compiled-512", "compiled-cudagraphs"}, profile
    assert all(r["tokens_per_s"] > 0 and r["of_roofline"] > 0 for r in rates.values())


@pytest.mark.slow  # about 35 s: a GPU batch of training runs on the CPU
def test_a_gpu_batch_stops_its_runs_on_time_and_packs_their_results(tmp_path):
    """Every (task, seed) a run of its own; each gives a result file, packed under TASK/BACKBONE/ for the ledger."""
    import tarfile

    done = run_script(
        ROOT / "pipelines" / "gpu_batch.py",
        "--small",
        "--seeds",
        "0,1",
        "--budget",
        "200",
        "--out",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        names = tar.getnames()
    assert sorted(n.split("/")[0] for n in names) == ["bit_memory", "bit_memory", "bit_xor", "bit_xor"], names
    log = (tmp_path / "batch.log").read_text()
    assert log.count("exit 0") == 4 and "--max-time 170" in log
    done = run_script(
        ROOT / "pipelines" / "gpu_batch.py", "--small", "--budget", "10", "--out", str(tmp_path)
    )
    assert done.returncode == 1 and "--budget 10 leaves no training time" in done.stderr

"""Ctrl-C during a command: it says what is kept and how to go on, exits 130, and a rerun completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reservoir.extract.store import open_features


def test_ctrl_c_during_extract_says_how_to_resume_and_exits_130(tiny_gpt2, tmp_path):
    out = tmp_path / "f.h5"
    env = {**os.environ, "RESERVOIR_HOME": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "reservoir", "extract", "--task", "digits", "--backbone", str(tiny_gpt2),
            "--batch-size", "1", "--dtype", "float32", "--engine", "torch", "--no-compile", "--out", str(out)]  # fmt: skip
    job = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = Path(f"{out}.partial")
    deadline = time.monotonic() + 120
    while not partial.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)  # some rows written
    assert job.poll() is None, job.communicate()
    job.send_signal(signal.SIGINT)
    stdout, stderr = job.communicate(timeout=120)
    assert job.returncode == 130, stderr
    assert "interrupted: the rows written so far are kept" in stderr and "resumes" in stderr
    assert "Traceback" not in stderr and "Aborted!" not in stderr
    assert partial.exists() and not out.exists()
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    with open_features(out) as f:
        assert f["test"]["features"].shape[0] == len(f["test"]["labels"])


def test_ctrl_c_while_train_loads_its_model_exits_130_saying_what_is_kept(tiny_gpt2, tmp_path):
    """Interrupted during the slow start of a command (loading the model), not only inside its loop."""
    import threading

    env = {**os.environ, "RESERVOIR_HOME": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "reservoir", "train", "--task", "digits", "--backbone", str(tiny_gpt2),
            "--steps", "100000", "--batch-size", "8", "--eval-every", "1000", "--checkpoint-every", "0"]  # fmt: skip
    job = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    loading = threading.Event()

    def read() -> None:
        for line in job.stderr:
            lines.append(line)
            if "loading backbone" in line:
                loading.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert loading.wait(120), "".join(lines)
    job.send_signal(signal.SIGINT)
    job.wait(timeout=120)
    reader.join(timeout=10)
    stderr = "".join(lines)
    assert job.returncode == 130, stderr
    assert "interrupted: each run keeps its last checkpoint" in stderr and "Traceback" not in stderr

"""Smoke tests of benchmarks/extract.py: every path runs on a 1-block model; nothing is timed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "extract.py"
SMOKE = ["--layers", "1", "--batch", "4", "--tokens", "16", "--reps", "1", "--no-e2e", "--device", "cpu"]


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def table(stdout: str) -> dict[str, list[str]]:
    """Row name -> cells of the results table (``| row | dtype | setup s | tokens/s | ... | note |``)."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 9 and cells[0] not in ("row", "---"):
            rows[cells[0]] = cells
    return rows


def check(r: subprocess.CompletedProcess, rows: list[str]) -> dict[str, list[str]]:
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(
        r"^cpu flags: avx2 (yes|no), avx512f (yes|no), avx512_bf16 (yes|no), avx512_vnni (yes|no), "
        r"avx_vnni (yes|no), amx_bf16 (yes|no), amx_int8 (yes|no)$",
        r.stdout,
        re.M,
    ), r.stdout
    assert re.search(r"^versions: .*torch .*onnxruntime .*openvino .*nncf ", r.stdout, re.M), r.stdout
    assert re.search(r"^before: load average", r.stdout, re.M) and re.search(
        r"^after: load average", r.stdout, re.M
    )
    found = table(r.stdout)
    for name in [*rows, "roofline"]:
        assert name in found, f"no table line for {name}:\n{r.stdout}"
    return found


@pytest.mark.slow  # about 18 s: the benchmark's smoke run
def test_smoke_official_ours_and_onnxruntime():
    """The lead's smoke command (our path eager here: an inductor compile belongs to the slow test)."""
    rows = ["official", "ours"] + (["ort-fp32", "ort-int8"] if installed("onnxruntime") else [])
    r = run(*SMOKE, "--only", ",".join(rows), "--no-compile", "--verbose")
    found = check(r, rows)
    for name in rows:  # measured, not failed: a number in tokens/s and no note
        assert re.fullmatch(r"\d+", found[name][3]) and not found[name][8], found[name]
    assert found["ours"][4] != "-" and found["ours"][5] == "1.00x"
    for name in rows[
        2:
    ]:  # the ONNX Runtime rows compute our features (float32: to rounding; int8: within 10%)
        assert float(found[name][7]) < (1e-4 if name == "ort-fp32" else 0.1), found[name]


@pytest.mark.slow  # about 15 s: the benchmark over every native dtype
def test_the_default_against_each_native_dtype():
    """The default path beside our path at each float dtype: rows of the dtypes this CPU multiplies
    natively are measured, the others say why not, and the default's ratio to the fastest is printed."""
    from reservoir.runtime.dtypes import candidates

    rows = ["ours", "ours-float32", "ours-bfloat16", "ours-float16"]
    r = run(*SMOKE, "--only", ",".join(rows), "--no-compile")
    found = check(r, rows)
    for name in rows[1:]:
        native = name.removeprefix("ours-") in candidates()
        assert bool(re.fullmatch(r"\d+", found[name][3])) == native, found[name]
        assert native or "does not multiply" in found[name][8], found[name]
    assert re.search(
        r"^  ours \(the default\) / ours-\w+ \(the fastest of ours-float32.*\): \d+\.\d\dx$", r.stdout, re.M
    )


@pytest.mark.slow  # two whole jobs in subprocesses, an ONNX export among them: about a minute
@pytest.mark.skipif(not installed("onnxruntime"), reason="ONNX Runtime is not installed")
def test_the_default_job_against_onnx_runtimes_int8_job_over_the_same_rows(tmp_path):
    """Both whole jobs run over the same synthetic rows, each writes every depth of every row, and the report
    gives the default job's rate over the peer's."""
    r = run(
        "--layers", "1", "--batch", "16", "--tokens", "16", "--reps", "1", "--device", "cpu", "--no-compile",
        "--only", "e2e,e2e-ort-int8", "--e2e-rows", "200",
    )  # fmt: skip
    found = check(r, ["e2e-200", "e2e-ort-int8-200"])
    for name in ("e2e-200", "e2e-ort-int8-200"):
        assert re.fullmatch(r"\d+", found[name][3]) and not found[name][8], found[name]
    assert re.search(
        r"^  e2e-200 \(the default job\) / e2e-ort-int8-200 \(ONNX Runtime's int8 job\): \d+\.\d\dx$",
        r.stdout,
        re.M,
    ), r.stdout


@pytest.mark.slow  # real inductor compiles, an ONNX export, OpenVINO conversion and NNCF calibration: about a minute
def test_every_row():
    r = run(*SMOKE)
    found = check(
        r,
        [
            "official",
            "hf-compiled",
            "ort-fp32",
            "ort-int8",
            "ov-float",
            "ov-int8",
            "ours",
            "ours-torch",
            "ours-int8",
            "ours-int8-static",
        ],
    )
    for cells in found.values():
        note = cells[8]
        # each row is measured, or says why not: never a failure of the benchmark itself
        assert re.fullmatch(r"\d+", cells[3]) or note.startswith(("not installed", "not available")), cells
    if installed("openvino"):
        assert "OpenVINO's choice" in found["ov-float"][1]
        for name in ("ours-int8", "ours-int8-static"):  # measured, and within 10% of float32
            assert re.fullmatch(r"\d+", found[name][3]) and float(found[name][7]) < 0.1, found[name]
        assert re.search(
            r"^  ours-int8-static / \S+ \(the fastest of ort-int8, ov-int8\): \d+\.\d\dx$", r.stdout, re.M
        )


def test_usage_errors():
    r = run("--only", "official,bogus")
    assert r.returncode == 2 and "--only must name some of" in r.stderr and "bogus" in r.stderr


def load(name: str):
    """A module of benchmarks/ (its siblings importable, as when run as a script)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_not_installed_is_reported_not_fatal():
    peers = load("peers")
    message = r"^not installed \(pip install 'reservoir\[bench\]'\): no module nope$"
    with pytest.raises(peers.NotInstalled, match=message):
        peers.need("nope")


def test_flops_per_token():
    extract = load("extract")
    # GPT-2 small at MNIST's 64 tokens of 16: 171.1 MFLOP (docs/benchmarks.md)
    assert extract.flops_per_token(12, 768, 3072, 64, 16) == pytest.approx(171.1e6, rel=1e-3)
    assert extract.flops_per_token(12, 768, 3072, 64, 16, causal=False) > extract.flops_per_token(
        12, 768, 3072, 64, 16
    )

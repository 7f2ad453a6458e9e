"""The queue of missing end-to-end cells (pipelines/cell_queue.py) in its CPU mode: a cell the first budget cuts
leaves its checkpoints, the next invocation resumes it and keeps its result; a cell too costly for the CPU
waits, listed with its card minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def queue(*args: str, cells: Path, ledger: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RESERVOIR_CACHE": str(ledger.parent / "cache")}
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "pipelines" / "cell_queue.py"),
            *args,
            "--cells",
            str(cells),
            "--ledger",
            str(ledger),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.slow
def test_two_small_budgets_resume_and_complete_one_cell(tiny_gpt2, tmp_path):
    cell = {"table": 6, "task": "bit_xor", "backbone": str(tiny_gpt2), "lrs": [1e-3], "seeds": 2, "steps": 3000,
            "limit": 200, "batch_size": 8, "options": ["--patience", "0", "--eval-every", "100",
            "--checkpoint-every", "100", "--dtype", "float32", "--device", "cpu"]}  # fmt: skip
    costly = {**cell, "backbone": "gpt2-random", "steps": 20000}
    cells, ledger = tmp_path / "cells.json", tmp_path / "runs"
    cells.write_text(json.dumps([cell, costly]))
    first = queue("next", "--budget", "12", "--reserve", "8", cells=cells, ledger=ledger)
    assert first.returncode == 0, first.stderr
    assert "stopped on time: checkpoints kept" in first.stderr
    (folder,) = [p for p in (ledger / "queue").iterdir() if p.is_dir()]
    assert list(folder.rglob("*.pt"))  # the runs' checkpoints, for the next invocation
    begun = json.loads((ledger / "queue" / "state.json").read_text())[folder.name]
    assert begun["done"] is False and begun["seconds"] > 0
    second = queue("next", "--budget", "400", "--reserve", "8", cells=cells, ledger=ledger)
    assert second.returncode == 0, second.stderr
    assert "ended: result kept" in second.stderr and "1 waiting" in second.stdout  # the costly cell waits
    (kept,) = (ledger / "table6" / "bit_xor").rglob("end-to-end_*.json")
    result = json.loads(kept.read_text())
    assert sorted(r["steps"] for r in result["runs"]) == [3000, 3000]
    assert not folder.exists()
    listing = queue("list", cells=cells, ledger=ledger)
    assert "kept" in listing.stdout and "waiting" in listing.stdout and "H100" in listing.stdout


def test_the_queue_trains_remote_homology_at_the_papers_learning_rate(monkeypatch):
    """The paper's appendix C trains remote homology at 1e-4 and every other task at 1e-3: so do the queue's cells."""
    monkeypatch.syspath_prepend(str(ROOT / "pipelines"))
    import cell_queue

    rates = {c.task: c.lrs for c in cell_queue.cells() if c.table == 2}
    assert rates["remote_homology"] == (1e-4,) and {rates[t] for t in rates if t != "remote_homology"} == {
        (1e-3,)
    }


def test_a_cell_reads_its_data_from_the_data_folder_given(tiny_gpt2, tmp_path):
    """The queue runs each cell in a folder of its own, yet reads the task's data where it is given (--data-dir,
    Make's DATA_DIR) and the models installed where this process finds them: an MNIST cell trains on a data folder
    the cell's own folder does not hold."""
    from tests.conftest import write_mnist

    write_mnist(tmp_path / "data" / "mnist", {"train": 120, "t10k": 40}, cyclic_labels=True)
    ran, _ = next_cells(tmp_path, [{**small(tiny_gpt2), "task": "mnist"}], tmp_path / "data")
    assert ran.returncode == 0 and "ended: result kept" in ran.stderr, ran.stderr


def small(backbone) -> dict:
    """A cell of four steps of one run on the CPU."""
    return {"table": 2, "backbone": str(backbone), "lrs": [1e-3], "seeds": 1, "steps": 4, "limit": 100,
            "batch_size": 8, "options": ["--eval-every", "2", "--dtype", "float32", "--device", "cpu"]}  # fmt: skip


def next_cells(tmp_path, todo: list[dict], data_dir: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """``cell_queue.py next`` over ``todo`` with the data of ``data_dir``; the run and its ledger."""
    cells, ledger = tmp_path / "cells.json", tmp_path / "runs"
    cells.write_text(json.dumps(todo))
    ran = queue(
        "next", "--budget", "300", "--reserve", "8", "--data-dir", str(data_dir), cells=cells, ledger=ledger
    )
    return ran, ledger


def test_a_cell_this_machine_cannot_start_or_that_fails_is_passed_over_for_the_next(tiny_gpt2, tmp_path):
    """An MNIST cell without its data here is skipped, naming why, a cell that fails (an option its backbone
    refuses) is said and passed over, and the cell after them still runs to its result."""
    base = small(tiny_gpt2)
    failing = {**base, "task": "bit_xor", "options": [*base["options"], "--blocks", "9"]}  # the model has 2
    todo = [{**base, "task": "mnist"}, failing, {**base, "task": "bit_memory"}]
    ran, ledger = next_cells(tmp_path, todo, tmp_path / "nodata")
    assert ran.returncode == 0, ran.stderr
    assert "table2_mnist" in ran.stderr and "skipped: its data is not here" in ran.stderr
    assert "table2_bit_xor" in ran.stderr and "failed" in ran.stderr
    assert "table2_bit_memory" in ran.stderr and "ended: result kept" in ran.stderr, ran.stderr
    assert list((ledger / "table2" / "bit_memory").rglob("end-to-end_*.json"))


def test_the_queue_s_cells_train_what_the_paper_s_columns_train(monkeypatch):
    """Tables 18 and 20 train the output layer alone and with one other group (the paper's four columns); the
    critique's scaling table (101) runs its three tasks on six blocks; ListOps stops at 30% only in table 6; every
    run of a cell trains in one group, so its time limit is the cell's wall time."""
    monkeypatch.syspath_prepend(str(ROOT / "pipelines"))
    import cell_queue

    todo = cell_queue.cells()
    for table in (18, 20):
        assert {c.trainable for c in todo if c.table == table} == set(cell_queue.ABLATION)
    critique = [c for c in todo if c.table == 101]
    assert {c.task for c in critique} == {"mnist", "cifar10", "cifar10_lra"}
    assert all(c.command()[-2:] == ["--blocks", "6"] for c in critique)
    listops = [c for c in todo if c.task == "listops"]
    assert listops and all("--stop-at" not in c.command() for c in listops if c.table != 6)
    for c in todo:
        command = c.command()
        assert c.runs == 1 or command[command.index("--concurrent-runs") + 1] == str(c.runs)

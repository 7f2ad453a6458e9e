"""The pipelines run as a user runs them: `make -C pipelines tableN` to a table, CSV and plots."""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESERVOIR = Path(sys.executable).parent / "reservoir"

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not RESERVOIR.exists(),
    reason="needs make and the installed reservoir command",
)


def make(tmp_path, *args, reservoir=RESERVOIR):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RESERVOIR_HOME", None)
    return subprocess.run(
        [
            "make",
            "-C",
            str(ROOT / "pipelines"),
            *args,
            f"OUT_ROOT={tmp_path}",
            f"RESERVOIR={reservoir}",
            f"DATA_DIR={tmp_path / 'data'}",
            *ledger(tmp_path, args),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def ledger(tmp_path, args) -> list[str]:
    """The tables' kept runs in the test's folder, not the repository's (unless the test names a LEDGER_DIR)."""
    return [] if any(a.startswith("LEDGER_DIR=") for a in args) else [f"LEDGER_DIR={tmp_path / 'ledger'}"]


def stand_in(tmp_path):
    """A tiny GPT-2 saved as the folder ``tinygpt`` stands in for PRETRAINED (and ``tinygpt-random``, built
    from its config, for the random twin); Make targets take bare names, so the returned ``reservoir``
    runs in the folder that holds it. Also a tiny MNIST (random images, official IDX format) in DATA_DIR."""
    from tests.conftest import save_tiny_gpt2, write_mnist

    models = tmp_path / "models"
    save_tiny_gpt2(models / "tinygpt")
    wrapper = tmp_path / "reservoir"
    wrapper.write_text(f'#!/bin/sh\ncd "{models}" && exec "{RESERVOIR}" "$@"\n')
    wrapper.chmod(0o755)
    write_mnist(tmp_path / "data" / "mnist", {"train": 120, "t10k": 100}, cyclic_labels=True)
    return wrapper


@pytest.mark.slow  # about 2 minutes: a table 2 through make, twice, then another head
def test_table2_renders_table_csv_and_plot_with_baselines_and_both_scales(tmp_path):
    reservoir = stand_in(tmp_path)
    settings = ("LIMIT=40", "TASKS_2=bit_xor", "PRETRAINED=tinygpt")
    r = make(
        tmp_path,
        "table2",
        *settings,
        "BACKBONES_2=tinygpt-random esn",
        "SCALES=paper matched",
        reservoir=reservoir,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    table = (tmp_path / "40" / "table2.md").read_text()
    assert table.startswith("Paper table 2:")
    for setting in (
        "| tinygpt-random (paper 100) | ridge |",
        "| tinygpt-random, input scale matched",
        "| esn | ridge |",
        "| esn, input scale matched",
        "| baseline: majority class, data: ",
        "| baseline: raw-input linear head, data: ",
        "| baseline: random tanh features (768 wide), data: ",
    ):
        assert setting.split(" (paper")[0] in table, setting
    assert "(paper 100)" in table  # the paper's random-init GPT-2 on bit XOR, beside ours
    rows = list(csv.DictReader((tmp_path / "40" / "table2.csv").open()))
    assert {r["input_scale"] for r in rows if r["mode"] == "output-only"} == {"paper", "matched"}
    (png,) = (tmp_path / "40" / "plots" / "table2").glob("*.png")
    assert png.name == "bit_xor-depth.png" and png.stat().st_size > 10_000
    # every extraction and fit behind the table is timed, on a named machine (the doc states the wall time)
    runs = [ln.split("\t") for ln in (tmp_path / "40" / "table2.runs").read_text().splitlines()]
    assert len(runs) == 2 * 2 + 2  # two scales of two backbones, and the random twin's seeds 1 and 2
    assert all(int(seconds) >= 0 and "cores;" in machine for _, seconds, machine in runs), runs
    # a second run finds everything made: nothing is extracted or fitted again
    again = make(
        tmp_path,
        "table2",
        *settings,
        "BACKBONES_2=tinygpt-random esn",
        "SCALES=paper matched",
        reservoir=reservoir,
    )
    assert again.returncode == 0 and "extract" not in again.stdout
    # another HEAD fits again on the same features, and the table shows its rows
    features = {p: p.stat().st_mtime_ns for p in (tmp_path / "40" / "features").rglob("*.h5")}
    other = make(
        tmp_path, "table2", *settings, "BACKBONES_2=esn", "SCALES=paper", "HEAD=logreg", reservoir=reservoir
    )
    assert other.returncode == 0 and "--head logreg" in other.stdout, (
        other.stdout[-3000:] + other.stderr[-3000:]
    )
    assert "| esn | logreg |" in (tmp_path / "40" / "table2.md").read_text()
    assert features and all(p.stat().st_mtime_ns == t for p, t in features.items())


@pytest.mark.slow  # about 60 s: three makes of table 2
def test_a_table_grows_run_by_run_across_machines_and_renders_from_its_kept_runs_alone(tmp_path):
    """Two invocations in separate working folders (two machines) keep their runs in one ledger; the second's table
    holds both; a third folder with no runs renders the table and docs/results.md from the ledger alone."""
    reservoir = stand_in(tmp_path)
    kept = tmp_path / "kept"
    common = ("LIMIT=40", "TASKS_2=bit_xor", "PRETRAINED=tinygpt", "RANDOM_SEEDS=", f"LEDGER_DIR={kept}")
    first = make(tmp_path / "a", "table2", *common, "BACKBONES_2=esn", reservoir=reservoir)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "| esn | ridge |" in (tmp_path / "a" / "40" / "table2.md").read_text()
    second = make(tmp_path / "b", "table2", *common, "BACKBONES_2=tinygpt-random", reservoir=reservoir)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    table = (tmp_path / "b" / "40" / "table2.md").read_text()
    assert (
        "| esn | ridge |" in table and "| tinygpt-random | ridge |" in table
    )  # the first machine's row stays
    results = sorted(p.name for p in (kept / "table2").rglob("*.json"))
    assert results and any("baseline" in p for p in results) and (kept / "table2.json").exists()
    kept_text = "".join(p.read_text() for p in (kept / "table2").rglob("*.json"))
    assert str(tmp_path) not in kept_text  # kept in the repository: no path of the machine that ran it
    doc = tmp_path / "doc" / "results.md"
    rendered = make(
        tmp_path / "c",
        "render",
        "LIMIT=40",
        "PRETRAINED=tinygpt",
        f"LEDGER_DIR={kept}",
        "RENDER_TABLES=2",
        "DOC_TABLES=2",
        f"DOC_OUT={doc}",
        reservoir=reservoir,
    )
    assert rendered.returncode == 0, rendered.stdout[-3000:] + rendered.stderr[-3000:]
    assert not (tmp_path / "c" / "40" / "features").exists()  # nothing extracted or fitted: the ledger alone
    again = (tmp_path / "c" / "40" / "table2.md").read_text()
    assert again == table
    assert "\nRan on: " in table and "esn (bit_xor)" in table  # the machine beside the runs it made
    assert (
        "| esn | ridge |" in doc.read_text() and (doc.parent / "results" / "table2" / "table2.csv").exists()
    )


@pytest.mark.slow  # about 60 s: table 18 through make
def test_table18_sets_the_output_only_head_at_the_chosen_and_last_depth_beside_the_paper_and_end_to_end(
    tmp_path,
):
    reservoir = stand_in(tmp_path)
    r = make(
        tmp_path,
        "table18",
        "LIMIT=100",
        "ABLATION_LIMIT=110",
        "ABLATION_STEPS=1",
        "PRETRAINED=tinygpt",
        "DATA_TASKS=mnist",
        "TASKS_18=mnist",
        "HEAD_TASKS_18=mnist",
        "SINGLE=out ln+out",
        "TRAIN_OPTS=--batch-size 4",
        reservoir=reservoir,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    table = (tmp_path / "100" / "table18.md").read_text()
    lines = table.splitlines()
    assert lines[0].startswith("Paper table 18:") and lines[1] == ""
    assert (
        "at most 110 examples a split, at most 1 steps" in lines[2]
    )  # the end-to-end runs' size, under the caption
    assert "at most 100 examples a split, extraction and fit seed(s) 0" in lines[4]  # the heads' size
    # ours beside the paper's output only (MNIST 23%) and output + layernorm (96%)
    assert re.search(
        r"\| tinygpt, depth chosen on validation \| ridge \| [\d.]+ \(100/100, d\d\) \(paper 23\) \|", table
    )
    assert re.search(r"\| tinygpt, last depth \| ridge \| [\d.]+ \(100/100, d2\) \(paper 23\) \|", table)
    assert re.search(r"\| tinygpt \[out\] \| linear \| [\d.]+ \(99/100\) \(paper 23\) \|", table)
    assert re.search(r"\| tinygpt \[ln,out\] \| linear \| [\d.]+ \(99/100\) \(paper 96\) \|", table)
    assert "| baseline: majority class | rule |" in table
    # the end-to-end runs live at their own size, the heads at LIMIT; markers name exactly what was rendered
    assert list((tmp_path / "110" / "train").glob("*/mnist/tinygpt/out.done"))
    assert (tmp_path / "100" / "done" / "paper" / "mnist" / "tinygpt.done").exists()
    rows = list(csv.DictReader((tmp_path / "100" / "table18.csv").open()))
    assert {(r["depth_rule"], r["depth"]) for r in rows if r["mode"] == "output-only"} >= {("last", "2")}


@pytest.mark.slow  # about 90 s: 12 runs through make (table 2 test averages seeds too)
def test_table20_averages_the_heads_over_three_extraction_seeds(tmp_path):
    reservoir = stand_in(tmp_path)
    r = make(
        tmp_path,
        "table20",
        "LIMIT=100",
        "ABLATION_LIMIT=110",
        "ABLATION_STEPS=1",
        "PRETRAINED=tinygpt",
        "DATA_TASKS=mnist",
        "TASKS_20=mnist",
        "HEAD_TASKS_20=mnist",
        "SINGLE=out",
        "TRAIN_OPTS=--batch-size 4",
        reservoir=reservoir,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    table = (tmp_path / "100" / "table20.md").read_text()
    assert "extraction and fit seed(s) 0 1 2 (mean and spread over seeds)" in table
    # the random stand-in's paper rows: output only on MNIST, 25%
    for rule in ("depth chosen on validation", "last depth"):
        ours = r"[\d.]+ ± [\d.]+ \(n=3\) \(100/100, d\d\)"
        assert re.search(rf"\| tinygpt-random, {rule} \| ridge \| {ours} \(paper 25\) \|", table), rule
    assert re.search(r"\| tinygpt-random \[out\] \| linear \| [\d.]+ \(99/100\) \(paper 25\) \|", table)
    assert [p.name for p in sorted((tmp_path / "100" / "done" / "paper" / "mnist").glob("*.done"))] == [
        "tinygpt-random.done",
        "tinygpt-random~s1.done",
        "tinygpt-random~s2.done",
    ]


@pytest.mark.slow  # about 90 s: a sweep through make (test_report renders table 101 in-process)
def test_critique_renders_table101_at_its_own_sizes_beside_the_critiques_numbers(tmp_path):
    reservoir = stand_in(tmp_path)
    r = make(
        tmp_path,
        "critique",
        "PRETRAINED=tinygpt",
        "DATA_TASKS=mnist",
        "CRITIQUE_TASKS=mnist",
        "CRITIQUE_LIMIT=110",
        "CRITIQUE_STEPS=2",
        "CRITIQUE_SEEDS=2",
        "CRITIQUE_LR=1e-3,1e-2",
        "CRITIQUE_BLOCKS=1",
        "CRITIQUE_TRAIN_OPTS=--batch-size 4 --eval-every 1",
        reservoir=reservoir,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    table = (tmp_path / "110" / "table101.md").read_text()
    assert table.startswith("Paper table 101: Critique (Rothermel et al. 2021)")
    assert "at most 110 examples a split, at most 2 steps, 2 seed(s) a learning rate, --lr 1e-3,1e-2" in table
    assert "only the first 1 blocks run" in table
    # frozen and unfrozen, pretrained and random: each beside the critique's GPT2 row, with its printed error
    for setting, critique in (
        ("tinygpt [input,pos,ln,out]", "98.5 ± 0.1"),
        ("tinygpt-random [input,pos,ln,out]", "98.0 ± 0.0"),
        ("tinygpt [input,pos,ln,attn,ff,out]", "99.0 ± 0.0"),
        ("tinygpt-random [input,pos,ln,attn,ff,out]", "98.7 ± 0.0"),
    ):
        assert re.search(
            rf"\| {re.escape(setting)} \| linear \| [\d.]+ ± [\d.]+ \(n=2\) \(99/100, lr 0\.00?1\) "
            rf"\(critique {re.escape(critique)}\) \|",
            table,
        ), setting
        # and every rate of its sweep, the one chosen on validation in bold
        assert re.search(
            rf"\| {re.escape(setting)} \| mnist \| (\*\*)?[\d.]+ ± [\d.]+ \[[\d.]+\](\*\*)? \| "
            rf"(\*\*)?[\d.]+ ± [\d.]+ \[[\d.]+\](\*\*)? \|",
            table,
        ), setting
    assert "| setting | task | lr 0.001 | lr 0.01 |" in table
    summaries = list((tmp_path / "110" / "train").glob("steps2_seeds2_lr1e-3-1e-2_*/mnist/*/*~b1.done"))
    assert len(summaries) == 4


def test_a_sweep_widened_by_a_rate_trains_only_that_rate(tmp_path):
    """Checkpoints are kept by the run (rate and seed), not by the sweep: a run's sweep made again with one more
    learning rate resumes the finished run of the first and trains only the added rate's."""
    reservoir = stand_in(tmp_path)
    run = "mnist/tinygpt/input+pos+ln+out~b1.done"
    settings = ("LIMIT=110", "STEPS=2", "SEEDS=1", "PRETRAINED=tinygpt", "DATA_TASKS=mnist")
    first = make(
        tmp_path,
        f"{tmp_path}/110/train/steps2_seeds1_lr1e-3/{run}",
        *settings,
        "LR=1e-3",
        reservoir=reservoir,
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "resumed" not in first.stderr
    wider = make(
        tmp_path,
        f"{tmp_path}/110/train/steps2_seeds1_lr1e-3-1e-2/{run}",
        *settings,
        "LR=1e-3,1e-2",
        reservoir=reservoir,
    )
    assert wider.returncode == 0, wider.stdout[-3000:] + wider.stderr[-3000:]
    assert re.findall(r"\[lr=(\S+) seed=0\] resumed .* at step 2 \(finished\)", wider.stderr) == ["0.001"]
    assert re.findall(r"\[lr=(\S+) seed=0\] step 2/2", wider.stderr) == ["0.01"]


def test_the_trained_attention_figure_reads_the_selected_rate_at_the_first_seed(tmp_path):
    """The run folder's checkpoints hold every rate and seed: the figure takes the rate its run selected on
    validation, at seed 0, not the newest file (the last seed of the last rate)."""
    reservoir = stand_in(tmp_path)
    settings = (
        "LIMIT=40",
        "STEPS=2",
        "SEEDS=2",
        "LR=1e-3,1e-2",
        "PRETRAINED=tinygpt",
        "TASK_OPTS_bit_xor=--task-opt n_train=60 --task-opt n_test=40",
        "TRAIN_OPTS=--batch-size 4 --eval-every 1",
    )
    png = tmp_path / "40" / "figures" / "bit_xor" / "tinygpt-trained.png"
    r = make(tmp_path, str(png), *settings, reservoir=reservoir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (done,) = (tmp_path / "40" / "train").glob(
        "steps2_seeds2_lr1e-3-1e-2*/bit_xor/tinygpt/input+pos+ln+out.done"
    )
    selected = re.search(r"end-to-end, .*, lr (\S+), seeds \[0, 1\]", done.read_text()).group(1)
    (used,) = re.findall(r"^\S+tinygpt-trained\.png: (\S+\.pt)$", r.stdout, re.M)
    assert Path(used).name.startswith(f"input-pos-ln-out_blocks2_lr{selected}_seed0-"), used
    assert len(list(Path(used).parent.glob("*.pt"))) == 4
    assert png.stat().st_size > 10_000


@pytest.mark.slow  # about 35 s: a make killed 6 s into its extraction, then two more makes
def test_an_extraction_cut_short_states_the_seconds_of_every_attempt_when_it_ends(tmp_path):
    """The make behind an output-only marker is killed (as by the end of a session) 6 s into its extraction: made
    again, the marker's wall time is the cut attempt's seconds and the second one's, and no clock is left."""
    reservoir = stand_in(tmp_path)
    slow = tmp_path / "slow-reservoir"  # an extraction that takes a minute
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" extract "*) sleep 60;; esac\nexec "{reservoir}" "$@"\n')
    slow.chmod(0o755)
    marker = tmp_path / "40" / "done" / "paper" / "bit_xor" / "esn.done"
    clock, seconds = marker.with_suffix(".clock"), marker.with_suffix(".seconds")

    def make_marker(reservoir, *settings):
        return [
            "make",
            "-C",
            str(ROOT / "pipelines"),
            str(marker),
            f"OUT_ROOT={tmp_path}",
            "LIMIT=40",
            "CLOCK_TICK=1",
            f"RESERVOIR={reservoir}",
            f"DATA_DIR={tmp_path / 'data'}",
            *settings,
        ]

    cut = subprocess.Popen(
        make_marker(slow), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 50
        while not (clock.exists() and int(clock.read_text() or 0) >= 6):
            assert time.monotonic() < deadline and cut.poll() is None
            time.sleep(0.2)
    finally:
        os.killpg(cut.pid, signal.SIGKILL)
        cut.wait()
    assert not marker.exists() and not seconds.exists()
    before = int(clock.read_text())
    start = time.monotonic()
    r = subprocess.run(make_marker(reservoir), capture_output=True, text=True, timeout=300)
    second = time.monotonic() - start
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    total = int(seconds.read_text().split("\t")[0])
    # bash's SECONDS counts whole seconds of the clock (a shell started at x.9 s and ended at y.1 s counts y - x), so a
    # stated time may exceed the measured one by up to one second
    assert second + 2 < total <= before + second + 1, (before, second, total)
    time.sleep(2.5)  # two ticks: the ticker ended with its recipe, and wrote no clock after it
    assert not clock.exists() and not clock.with_suffix(".clock.tmp").exists()
    # the next attempt starts from nought: a HEAD change remakes the marker, which states no more than its own time
    start = time.monotonic()
    r = subprocess.run(make_marker(reservoir, "HEAD=logreg"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert int(seconds.read_text().split("\t")[0]) <= time.monotonic() - start + 1


@pytest.mark.slow  # about 80 s: two makes of a training run (test_train resumes killed runs)
def test_a_training_run_cut_short_continues_from_its_checkpoint_to_the_uninterrupted_result(tmp_path):
    """A run cut at its step-10 checkpoint (as by the end of a session, before its marker was written) is made
    again: it resumes there, and ends exactly as the run made in one go."""
    reservoir = stand_in(tmp_path)
    cut = tmp_path / "cut-reservoir"  # the same command, stopped after 10 of the 20 steps
    cut.write_text(
        f'#!/bin/sh\ncase " $* " in *" train "*) exec "{reservoir}" "$@" --steps 10;; esac\n'
        f'exec "{reservoir}" "$@"\n'
    )
    cut.chmod(0o755)
    args = [
        "table6",
        "LIMIT=64",
        "STEPS_6=20",
        "SEEDS_6=2",
        "TRAIN_LIMIT_6=64",
        "PRETRAINED=tinygpt",
        "DATA_TASKS=",
        "TASKS_6=bit_xor",
        "CHECKPOINT_EVERY=10",
        "TRAIN_OPTS_6=--batch-size 4 --eval-every 5 --dtype float32",
    ]
    results = {}
    for name, first in (("whole", reservoir), ("resumed", cut)):
        root = tmp_path / name
        r = make(root, *args, reservoir=first)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        if first is cut:
            markers = list((root / "64" / "train").glob("*/bit_xor/*/*.done"))
            assert len(markers) == 2 and all(
                json.loads(Path(m.read_text().splitlines()[-1]).read_text())["steps"] == [10, 10]
                for m in markers
            )
            for m in markers:
                m.unlink()  # as if the session had ended before the markers were written
            r = make(root, *args, reservoir=reservoir)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        results[name] = {
            m.parent.name: json.loads(Path(m.read_text().splitlines()[-1]).read_text())
            for m in (root / "64" / "train").glob("*/bit_xor/*/*.done")
        }
    assert set(results["whole"]) == {"tinygpt", "tinygpt-random"}
    for backbone, whole in results["whole"].items():
        resumed = results["resumed"][backbone]
        assert resumed["steps"] == whole["steps"] == [20, 20]
        for a, b in zip(whole["runs"], resumed["runs"]):
            assert a["history"] == b["history"] and a["test_accuracy"] == b["test_accuracy"]
    assert (tmp_path / "resumed" / "64" / "table6.md").read_text() == (
        tmp_path / "whole" / "64" / "table6.md"
    ).read_text()
    # the wall time results_doc.py states: each training marker's result, its seconds and machines
    runs = (tmp_path / "whole" / "64" / "table6.runs").read_text().splitlines()
    assert len(runs) == 2 and all(
        Path(ln.split("\t")[0]).name == "input+pos+ln+out~t0.99.done" for ln in runs
    )
    assert all(
        run["machines"] and run["seconds"] > 0
        for result in results["whole"].values()
        for run in result["runs"]
    )
    # docs/results.md from it: the findings say whether every seed solves the task, the table states its wall time
    doc = tmp_path / "results.md"
    r = make(tmp_path / "whole", "docs", *args[1:], "DOC_TABLES=6", f"DOC_OUT={doc}", reservoir=reservoir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = doc.read_text()
    finding = next(line for line in text.splitlines() if line.startswith("**Table 6, bit_xor, end to end**"))
    assert (
        finding.count("lowest seed") == 2 and finding.count("solve") == 2
    )  # both sides: solved on every seed or not
    assert 'make -C pipelines table6 TASKS_6="bit_xor"' in text
    assert "training runs (every seed), one after another, on " in text


@pytest.mark.slow  # about 35 s: a whole table 2 through make
def test_the_bit_backbone_is_trained_once_saved_and_gives_table2_its_bit_row(tmp_path):
    """`make bit` trains PRETRAINED's random twin end to end on bit memory and saves it as a backbone folder;
    table 2 then has the paper's "Bit" row, extracted through that folder, beside the paper's number."""
    reservoir = stand_in(tmp_path)
    r = make(
        tmp_path,
        "bit",
        "PRETRAINED=tinygpt",
        "BIT_STEPS=2",
        "BIT_OPTS=--batch-size 4 --eval-every 1 --limit 100 --task-opt n_bits=100",
        reservoir=reservoir,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    folder = tmp_path / "models" / "bit-tinygpt"
    assert (folder / "config.json").exists() and "--save-backbone" in r.stdout
    r = make(
        tmp_path,
        "table2",
        "LIMIT=40",
        "TASKS_2=bit_xor",
        "PRETRAINED=tinygpt",
        "RANDOM_SEEDS=",
        reservoir=reservoir,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"--backbone {folder} " in r.stdout
    table = (tmp_path / "40" / "table2.md").read_text()
    assert re.search(r"\| bit-tinygpt \| ridge \| [\d.]+ \(40/40, d\d\) \(paper 100\) \|", table), table
    again = make(tmp_path, "bit", "PRETRAINED=tinygpt", "BIT_STEPS=2", reservoir=reservoir)
    assert again.returncode == 0 and "train" not in again.stdout  # made once


@pytest.mark.slow  # about 35 s: a whole table 2 through make
def test_a_vit_named_by_vit_gives_table2_the_papers_vit_row(tmp_path):
    """VIT names ImageNet-21k ViT weights (here a tiny random ViT folder stands in): table 2 extracts through it and
    sets it beside the paper's ViT row; without VIT the row is absent."""
    from tests.zoo import save_tiny

    reservoir = stand_in(tmp_path)
    vit = save_tiny("vit", tmp_path / "weights" / "tinyvit")
    r = make(
        tmp_path,
        "table2",
        "LIMIT=40",
        "TASKS_2=bit_xor",
        "PRETRAINED=tinygpt",
        "RANDOM_SEEDS=",
        f"VIT={vit}/",
        reservoir=reservoir,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"--backbone {vit}/ " in r.stdout
    table = (tmp_path / "40" / "table2.md").read_text()
    assert re.search(r"\| tinyvit \| ridge \| [\d.]+ \(40/40, d\d\) \(paper 100\) \|", table), table


def test_the_kept_results_document_is_what_render_writes_from_the_kept_runs(tmp_path):
    """docs/results.md and every table's CSV and record under docs/results/ are rendered again from the ledgers kept
    in the repository (no run): a document edited by hand, or left behind by the renderer's code, differs."""
    kept = ROOT / "docs" / "results"
    doc = tmp_path / "doc" / "results.md"
    shutil.copytree(kept, doc.parent / "results")
    rendered = make(tmp_path / "out", "render", f"LEDGER_DIR={kept / 'runs'}", f"DOC_OUT={doc}")
    assert rendered.returncode == 0, rendered.stdout[-3000:] + rendered.stderr[-3000:]
    assert doc.read_text() == (ROOT / "docs" / "results.md").read_text()
    for path in kept.rglob("*"):
        if path.suffix in (".csv", ".json", ".md") and "runs" not in path.relative_to(kept).parts:
            again = doc.parent / "results" / path.relative_to(kept)
            assert again.read_text() == path.read_text(), (
                f"{path.relative_to(ROOT)} is not what render writes"
            )


@pytest.mark.parametrize(
    "table, task, backbone, trainable, row",
    [
        (18, "bit_memory", "smollm2-135m", ["input", "out"], "(paper 98)"),
        (20, "bit_memory", "smollm2-135m-random", ["out"], "(paper 75)"),
        (101, "mnist", "smollm2-135m", ["input", "pos", "ln", "attn", "ff", "out"], "(critique 98.9 ± 0.0)"),
    ],
)
def test_every_table_the_queue_fills_renders_its_cells_beside_the_paper_s_row(
    tmp_path, monkeypatch, table, task, backbone, trainable, row
):
    """A cell the queue kept for an ablation table or the critique's scaling table renders beside the row its trained
    groups stand for (each table names its rows its own way: `reservoir report` refused the FPT/Random stand-ins)."""
    monkeypatch.syspath_prepend(str(ROOT / "pipelines"))
    import results_doc

    template = next((ROOT / "docs" / "results" / "runs" / "table6").rglob("end-to-end_*.json"))
    r = json.loads(template.read_text())
    identity = {**r["identity"], "backbone": backbone, "trainable": trainable, "task": task}
    made = {**r, "backbone": backbone, "trainable": trainable, "task": task, "identity": identity, "key": "k"}
    folder = tmp_path / "runs" / f"table{table}" / task / backbone
    folder.mkdir(parents=True)
    (folder / "end-to-end_cell.json").write_text(json.dumps(made))
    text = "\n".join(results_doc.queued(table, tmp_path / "runs"))
    assert f"| {backbone} [{','.join(trainable)}]" in text and row in text, text

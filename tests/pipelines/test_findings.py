"""The findings that open docs/results.md: computed from a table's CSV, a difference called decided only
where it exceeds twice the combined spread, the paper's direction set beside ours."""

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("findings", ROOT / "pipelines" / "findings.py")
findings = sys.modules["findings"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(findings)

COLUMNS = [
    "task",
    "setting",
    "backbone",
    "mode",
    "head",
    "trainable",
    "input_scale",
    "run",
    "n_train/n_test",
    "column",
    "depth",
    "test",
    "test_std",
    "n_seeds",
    "val",
    "paper",
]


def row(task, backbone, mode, test, std="", seeds=1, paper="", scale="paper", setting=None):
    return {
        "task": task,
        "setting": setting or backbone,
        "backbone": backbone,
        "mode": mode,
        "head": "ridge",
        "trainable": "out",
        "input_scale": scale,
        "run": "x",
        "n_train/n_test": "5000/5000",
        "column": task,
        "depth": "3",
        "test": str(test),
        "test_std": str(std),
        "n_seeds": str(seeds),
        "val": "0.5",
        "paper": paper,
    }


def write(tmp_path, rows, n=2):
    with (tmp_path / f"table{n}.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)


def test_a_difference_beyond_twice_the_spread_decides_and_the_papers_direction_is_named(tmp_path):
    write(
        tmp_path,
        [
            row("mnist", "p", "output-only", 0.647, paper="98.0"),
            row("mnist", "p-random", "output-only", 0.752, 0.022, 3, paper="91.7"),
            row("mnist", "p-random", "output-only", 0.99, scale="matched"),  # another input scale: ignored
            row("mnist", "", "baseline", 0.868, setting="baseline: random tanh features (576 wide)"),
            row("mnist", "", "baseline", 0.114, setting="baseline: majority class"),
        ],
    )
    (text,) = findings.findings({2: tmp_path}, "p")
    assert "pretrained p 64.7 ± 0.7% (1 seed)" in text  # one seed: the binomial standard error of 5,000 rows
    assert "random twin 75.2 ± 2.2% (3 seeds)" in text
    assert (
        "the random twin is ahead by 10.5 points, more than 2 times the combined spread (2.3): decided"
        in text
    )
    assert "The paper's table 2: 98 against 91.7 (pretrained ahead); ours goes the other way." in text
    assert "Strongest baseline: random tanh features (576 wide) 86.8%, 11.6 points above both." in text


def test_a_difference_within_the_spread_is_not_decided_and_missing_sides_give_no_finding(tmp_path):
    write(
        tmp_path,
        [
            row("bit_xor", "p", "output-only", 0.95),
            row("bit_xor", "p-random", "output-only", 0.93, 0.02, 3),
            row("mnist", "p", "output-only", 0.6),
        ],
    )  # no random twin on MNIST
    (text,) = findings.findings({2: tmp_path, 10: tmp_path}, "p")  # table 10 has no CSV: skipped
    assert (
        "they differ by 2.0 points, within 2 times the combined spread (2.0): not decided at this size"
        in text
    )
    assert "The paper" not in text and "baseline" not in text


def test_a_tables_wall_time_sums_its_timed_runs_and_names_the_machine_and_the_untimed(tmp_path):
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("results_doc", ROOT / "pipelines" / "results_doc.py")
    doc = module_from_spec(spec)
    spec.loader.exec_module(doc)
    runs = tmp_path / "table2.runs"
    runs.write_text("a.done\t600\tXeon, 2 cores; avx2 \nb.done\t1200\tXeon, 2 cores; avx2 \nc.done\t\n")
    assert doc.walltime(runs) == (
        "Wall time: 30 min for 2 extractions and fits, one after another, on "
        "Xeon, 2 cores; avx2 (1 more predate timing)."
    )
    runs.write_text("c.done\t\n")
    assert doc.walltime(runs) == "Wall time: not measured (its 1 extractions and fits predate timing)."
    assert doc.walltime(tmp_path / "missing.runs") == ""
    # a training marker: its result holds the run's seconds (every seed) and the machines it ran on
    result = tmp_path / "r.json"
    result.write_text(
        json.dumps({"mode": "end-to-end", "seconds": 1800.0, "machines": ["Zen 3, 2 cores; avx2"]})
    )
    (tmp_path / "t.done").write_text(f"summary\n{result}\n")
    runs.write_text(f"a.done\t600\tXeon, 2 cores; avx2\n{tmp_path / 't.done'}\t\n")
    assert doc.walltime(runs) == (
        "Wall time: 40 min for 1 extractions and fits and 1 training runs (every seed), one "
        "after another, on Xeon, 2 cores; avx2; Zen 3, 2 cores; avx2."
    )


def test_a_task_in_several_tables_is_told_once_from_the_table_with_the_papers_pair(tmp_path):
    write(
        tmp_path,
        [
            row("listops", "p", "output-only", 0.204, paper="32.8"),
            row("listops", "p-random", "output-only", 0.332, 0.013, 3),
        ],
        n=10,
    )
    depths = [
        {**row("listops", "p", "output-only", 0.162, paper="33"), "column": "d6", "depth": ""},
        {**row("listops", "p", "output-only", 0.204, paper="33"), "column": "d12", "depth": ""},
        {**row("listops", "p", "output-only", 0.204, paper="33"), "column": "chosen", "depth": "12"},
        {
            **row("listops", "p-random", "output-only", 0.332, 0.013, 3, paper="17"),
            "column": "d12",
            "depth": "",
        },
        {
            **row("listops", "p-random", "output-only", 0.332, 0.013, 3, paper="17"),
            "column": "chosen",
            "depth": "12",
        },
    ]
    write(
        tmp_path, depths, n=12
    )  # the depth layout: a row per depth, and the chosen one with the paper's number
    write(
        tmp_path, [row("mnist", "p", "output-only", 0.6), row("mnist", "p-random", "output-only", 0.7)], n=2
    )
    mnist, listops = findings.findings({2: tmp_path, 10: tmp_path, 12: tmp_path}, "p")
    assert mnist.startswith("**Table 2, mnist.**") and listops.startswith("**Table 12, listops.**")
    assert "The paper's table 12: 33 against 17" in listops


def test_no_direction_is_claimed_against_the_paper_or_a_baseline_within_the_spread(tmp_path):
    write(
        tmp_path,
        [
            row("bit_memory", "p", "output-only", 0.750, paper="100"),
            row("bit_memory", "p-random", "output-only", 0.752, 0.0, 3, paper="75.8"),
            row("bit_memory", "", "baseline", 0.745, setting="baseline: raw-input linear head"),
        ],
    )
    (text,) = findings.findings({2: tmp_path}, "p")
    assert (
        "The paper's table 2: 100 against 75.8 (pretrained ahead); ours does not decide a direction." in text
    )
    assert (
        "Strongest baseline: raw-input linear head 74.5%, 0.7 points below the better of the two, within 2 "
        "times the combined spread (0.9): level."
    ) in text


def test_the_steps_table_says_whether_every_seed_solves_the_task_beside_the_papers_steps(tmp_path):
    def trained(backbone, test, std, lowest, steps, paper):
        return {
            **row("bit_memory", backbone, "end-to-end", test, std, 3, paper=paper),
            "steps_to_target": steps,
            "target": "0.99",
            "test_min": str(lowest),
        }

    with (tmp_path / "table6.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS + ["steps_to_target", "target", "test_min"])
        w.writeheader()
        w.writerows(
            [
                trained("p", 0.9995, 0.0005, 0.999, "1200.0", "10000"),
                trained("p-random", 0.752, 0.003, 0.749, "", "40000"),
            ]
        )
    (text,) = findings.findings({6: tmp_path}, "p")
    assert (
        "pretrained p 100.0 ± 0.1% over 3 seeds, lowest seed 99.9%, validation 99% in 1,200 steps (mean over "
        "seeds): every seed solves it"
    ) in text
    assert (
        "random twin 75.2 ± 0.3% over 3 seeds, lowest seed 74.9%, 99% validation not reached by every seed: "
        "not solved on every seed (a seed below 99% test)"
    ) in text
    assert "The paper's table 6: 10,000 steps against 40,000, reaching 100% and 75.8% (table 2)." in text


def trained_row(task, backbone, trainable, test, std="", seeds=1, paper=""):
    return {
        **row(task, backbone, "end-to-end", test, std, seeds, paper=paper),
        "trainable": trainable,
        "head": "linear",
        "n_train/n_test": "900/1000",
    }


def head_row(task, backbone, test, rule, std="", seeds=1, paper=""):
    return {**row(task, backbone, "output-only", test, std, seeds, paper=paper), "depth_rule": rule}


def write_rows(tmp_path, n, rows):
    with (tmp_path / f"table{n}.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS + ["depth_rule", "lr"])
        w.writeheader()
        w.writerows(rows)


def test_the_ablations_name_the_best_group_and_set_pretrained_against_random_beside_the_papers_difference(
    tmp_path,
):
    write_rows(
        tmp_path,
        18,
        [
            head_row("mnist", "p", 0.647, "chosen", paper="23"),
            head_row("mnist", "p", 0.455, "last", paper="23"),
            trained_row("mnist", "p", "out", 0.511, paper="23"),
            trained_row("mnist", "p", "input,out", 0.664, paper="85"),
            trained_row("mnist", "p", "pos,out", 0.765, paper="93"),
            trained_row("mnist", "p", "ln,out", 0.850, paper="96"),
            row("mnist", "", "baseline", 0.88, setting="baseline: raw-input linear head"),
        ],
    )
    write_rows(
        tmp_path,
        20,
        [
            head_row("mnist", "p-random", 0.752, "chosen", 0.022, 3, paper="25"),
            head_row("mnist", "p-random", 0.70, "last", 0.02, 3, paper="25"),
            trained_row("mnist", "p-random", "out", 0.52, paper="25"),
            trained_row("mnist", "p-random", "ln,out", 0.70, paper="83"),
        ],
    )
    (text,) = findings.findings({18: tmp_path, 20: tmp_path}, "p")
    assert text.startswith("**Tables 18 and 20, mnist**")
    # each column with its spread (one seed: the binomial standard error of its test rows), the paper's in brackets:
    # its output layer reads the last block, so its number stands beside the head at the last depth
    assert (
        "Table 18, pretrained p: head 64.7 ± 0.7, head at the last depth 45.5 ± 0.7 (23), output layer "
        "51.1 ± 1.6 (23), + input 66.4 ± 1.5 (85), + positions 76.5 ± 1.3 (93), + layer norms 85.0 ± 1.1 "
        "(96)"
    ) in text
    assert (
        "best group + layer norms, against + positions: + layer norms is ahead by 8.5 points, more than 2 times "
        "the combined spread (1.8): decided (the paper's best: + layer norms, 96%)"
    ) in text
    assert "Table 20, random twin: head 75.2 ± 2.2, head at the last depth 70.0 ± 2.0 (25)" in text
    # only the columns both tables hold; the paper's difference beside ours
    assert (
        "Pretrained minus random, in points: head -10.5, decided; head at the last depth -24.5, decided (paper "
        "-2: ours agrees in direction); output layer -0.9, within the spread (paper -2: ours does not decide a "
        "direction); + layer norms +15.0, decided (paper +13: ours agrees in direction)."
    ) in text


def test_one_ablation_table_alone_has_no_comparison_and_a_lone_group_no_best(tmp_path):
    write_rows(
        tmp_path,
        20,
        [
            trained_row("bit_xor", "p-random", "out", 0.5, paper="50"),
            trained_row("bit_xor", "p-random", "ln,out", 1.0, paper="100"),
        ],
    )
    (text,) = findings.findings({18: tmp_path, 20: tmp_path}, "p")  # table 18 has no CSV
    # 100% on 1,000 test rows still has a spread (Agresti-Coull), never 0
    assert "Table 20, random twin: output layer 50.0 ± 1.6 (50), + layer norms 100.0 ± 0.1 (100)." in text
    assert "best group" not in text and "minus" not in text


def test_the_critique_sets_its_variants_against_each_other_beside_the_critiques_differences(tmp_path):
    frozen, unfrozen = "input,pos,ln,out", "input,pos,ln,attn,ff,out"
    rate = lambda r, lr: r | {"lr": lr}  # noqa: E731 (the rate a sweep chose; empty without a sweep)
    write_rows(
        tmp_path,
        101,
        [
            rate(trained_row("cifar10", "p", frozen, 0.40, 0.01, 3, paper="66.3"), "0.001"),
            rate(trained_row("cifar10", "p", unfrozen, 0.45, 0.01, 3, paper="77.7"), "0.0001"),
            rate(trained_row("cifar10", "p-random", frozen, 0.38, 0.01, 3, paper="61.8"), "0.001"),
            rate(trained_row("cifar10", "p-random", unfrozen, 0.30, 0.01, 3, paper="77.8"), "0.001"),
            trained_row("listops", "p", frozen, 0.30, 0.01, 3),
            trained_row("listops", "p-random", frozen, 0.31, 0.01, 3),
        ],
    )
    cifar, listops = findings.findings({101: tmp_path}, "p")
    assert (
        "frozen pretrained 40.0 ± 1.5 (66.3) at lr 0.001, frozen random 38.0 ± 1.5 (61.8) at lr 0.001, unfrozen "
        "pretrained 45.0 ± 1.6 (77.7) at lr 0.0001, unfrozen random 30.0 ± 1.4 (77.8) at lr 0.001"
    ) in cifar
    assert cifar.endswith(
        "Learning rates chosen: pretrained, unfrozen 0.0001 and frozen 0.001 (unfrozen lower); "
        "random, unfrozen 0.001 and frozen 0.001 (the same)."
    )
    assert (
        "finetuning every parameter, pretrained +5.0, decided (critique +11.4: ours agrees in direction)"
        in cifar
    )
    assert ("from scratch against the FPT -10.0, decided (critique +11.5: ours goes the other way)") in cifar
    assert (
        "pretraining, frozen +2.0, within the spread (critique +4.5: ours does not decide a direction)"
        in cifar
    )
    # ListOps: the critique prints no numbers; only the comparison both variants allow
    assert listops.endswith("Differences in points: pretraining, frozen -1.0, within the spread.")


def results_doc(tmp_path, root, *tables, **options):
    """Run pipelines/results_doc.py as `make docs` does: the tables rendered under ``root``, the document in
    tmp_path/docs."""
    cmd = [
        sys.executable,
        str(ROOT / "pipelines" / "results_doc.py"),
        "--root",
        str(root),
        "--pretrained",
        "p",
        "--out",
        str(tmp_path / "docs" / "results.md"),
        "--tables",
        *map(str, tables),
        *[f"--{k.replace('_', '-')}={v}" for k, v in options.items()],
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT / "pipelines")


def render(root, n, text, rows, plots):
    """Table n as the pipelines render it under root: markdown, CSV, runs (wall time) and plots."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"table{n}.md").write_text(text)
    write(root, rows, n=n)
    (root / f"table{n}.runs").write_text("a.done\t600\tZen 4, 2 cores; avx512_bf16\n")
    (root / "plots" / f"table{n}").mkdir(parents=True, exist_ok=True)
    for name in plots:
        (root / "plots" / f"table{n}" / name).write_bytes(b"png")


def test_the_document_keeps_each_table_as_a_record_that_outlives_the_folder_it_was_rendered_in(tmp_path):
    rows = [
        row("mnist", "p", "output-only", 0.647, paper="98.0"),
        row("mnist", "p-random", "output-only", 0.752),
    ]
    render(tmp_path / "out" / "5000", 2, "| the table as rendered |\n", rows, ["mnist-depth.png"])
    made = results_doc(
        tmp_path, tmp_path / "out" / "5000", 2, command_of="2=make -C pipelines table2 LIMIT=5000"
    )
    assert made.returncode == 0, made.stderr
    record = tmp_path / "docs" / "results" / "table2"
    assert sorted(p.name for p in record.iterdir()) == [
        "mnist-depth.png",
        "table2.csv",
        "table2.json",
        "table2.md",
    ]
    first = (tmp_path / "docs" / "results.md").read_text()
    for part in (
        "make -C pipelines table2 LIMIT=5000",
        "| the table as rendered |",
        "**Table 2, mnist.**",
        "Wall time: 10 min for 1 extractions and fits, one after another, on Zen 4, 2 cores; avx512_bf16.",
        "![mnist-depth](results/table2/mnist-depth.png)",
    ):
        assert part in first
    # out/ is gone (a new checkout): the same document from the record alone
    made = results_doc(tmp_path, tmp_path / "fresh" / "5000", 2)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "docs" / "results.md").read_text() == first
    # rendered again: the record is replaced whole (no plot of the old rendering stays), its findings follow
    render(
        tmp_path / "fresh" / "5000",
        2,
        "| rendered again |\n",
        [row("mnist", "p", "output-only", 0.9), row("mnist", "p-random", "output-only", 0.5)],
        ["cifar10-depth.png"],
    )
    assert results_doc(tmp_path, tmp_path / "fresh" / "5000", 2).returncode == 0
    assert sorted(p.name for p in record.glob("*.png")) == ["cifar10-depth.png"]
    again = (tmp_path / "docs" / "results.md").read_text()
    assert "| rendered again |" in again and "the pretrained model is ahead by 40.0 points" in again
    assert "mnist-depth" not in again and not list(record.parent.glob("*.new")) + list(
        record.parent.glob("*.old")
    )


def test_a_table_neither_rendered_nor_recorded_names_the_command_that_makes_it(tmp_path):
    made = results_doc(tmp_path, tmp_path / "out" / "5000", 12)
    assert made.returncode == 1
    assert "table12.md is missing and table 12 has no record" in made.stderr
    assert "run `make -C pipelines table12 LIMIT=5000 DATA_DIR=DATA` first" in made.stderr
    assert not (tmp_path / "docs" / "results.md").exists()


def test_a_record_carried_over_without_a_csv_keeps_its_findings_until_it_is_made_again(tmp_path):
    record = tmp_path / "docs" / "results" / "table6"
    record.mkdir(parents=True)
    (record / "table6.md").write_text("| old table |\n")
    (record / "table6.json").write_text(json.dumps({"command": "make -C pipelines table6", "wall_time": ""}))
    (record / "table6.findings.md").write_text("**Table 6, bit_xor, end to end** as computed then.\n")
    made = results_doc(tmp_path, tmp_path / "out" / "5000", 6)
    assert made.returncode == 0, made.stderr
    assert "## Findings\n" in (doc := (tmp_path / "docs" / "results.md").read_text())
    assert "**Table 6, bit_xor, end to end** as computed then." in doc and "| old table |" in doc
    render(tmp_path / "out" / "5000", 6, "| new table |\n", [row("mnist", "p", "output-only", 0.5)], [])
    assert results_doc(tmp_path, tmp_path / "out" / "5000", 6).returncode == 0
    assert "as computed then" not in (tmp_path / "docs" / "results.md").read_text()
    assert not (record / "table6.findings.md").exists()


def test_a_perfect_score_is_not_decided_against_a_near_perfect_one_on_a_thousand_rows():
    perfect, near = (
        findings.Side(name, test, 0.0, 1, 1000, None) for name, test in (("a", 1.0), ("b", 0.9956))
    )
    assert 0.001 < perfect.spread < near.spread  # the plain binomial error would be 0 at 100%
    diff, combined, decided = findings._decides(perfect, near)
    assert abs(diff - 0.0044) < 1e-12 and not decided

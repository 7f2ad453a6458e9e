"""reservoir report: a fixed depth beside the one chosen on validation, seeds of one setting in one row,
and the critique's numbers (with their printed error) beside ours."""

import csv
import json

import numpy as np
import pytest

from reservoir.report.paper import TABLES
from reservoir.report.tables import Report


def output_only(depth, val, test, *, task="mnist", backbone="b", seed=0, **identity):
    """An output-only result of the features of ``identity`` (seed, data and fingerprint vary with the seed)."""
    ident = {
        "data": f"data{seed}",
        "backbone_fingerprint": f"fp{seed}",
        "seed": seed,
        "input_scale": "paper",
        "limit": 50,
        "task_options": {"n_bits": 5},
        **identity,
    }
    return {
        "task": task,
        "backbone": backbone,
        "mode": "output-only",
        "depth": depth,
        "head": "ridge",
        "trainable": ["out"],
        "test_accuracy": test,
        "val_accuracy": val,
        "n_train": 50,
        "n_val": 5,
        "n_test": 50,
        "seconds": 0.0,
        "seed": 0,  # the fit's seed; the features' is the identity's
        "lr": None,
        "identity": ident,
        "identity_hash": f"hash{seed}{identity}",
        "key": f"{task}{backbone}{depth}{seed}{identity}",
        "config": {},
        "version": "x",
    }


def end_to_end(task, backbone, trainable, test, *, blocks=3):
    return {
        "task": task,
        "backbone": backbone,
        "mode": "end-to-end",
        "depth": blocks,
        "head": "linear",
        "trainable": trainable,
        "test_accuracy": test,
        "test_std": 0.01,
        "seeds": [0, 1, 2],
        "val_accuracy": 0.5,
        "n_train": 20,
        "n_val": 2,
        "n_test": 20,
        "seconds": 1.0,
        "seed": 0,
        "lr": 1e-4,
        "identity": {"input_scale": "paper", "task": task, "trainable": trainable},
        "identity_hash": "e2e",
        "key": f"{task}{backbone}{trainable}",
        "config": {},
        "version": "x",
    }


def test_task_layout_reports_the_depth_chosen_on_validation_and_the_last_depth():
    # two seeds of one setting (each its own extraction: seed, data digest and backbone fingerprint differ)
    results = [
        output_only(0, 0.5, 0.20, seed=0),
        output_only(1, 0.9, 0.60, seed=0),
        output_only(2, 0.7, 0.40, seed=0),
        output_only(0, 0.5, 0.30, seed=1),
        output_only(1, 0.8, 0.70, seed=1),
        output_only(2, 0.6, 0.50, seed=1),
        end_to_end("mnist", "b", ["out"], 0.25),
    ]
    rep = Report(results, paper=TABLES[18], paper_rows={"b:out": "output only"}, depths=("chosen", "last"))
    (e2e, row) = rep.rows  # sorted by mode: end-to-end first
    assert row.by_depth[1] and len(row.by_depth[1]) == 2 and (row.chosen, row.depth_for("last")) == (1, 2)
    table = rep.task_table()
    assert "| b, depth chosen on validation | ridge | 65.0 ± 7.1 (n=2) (50/50, d1) (paper 23) |" in table
    assert "| b, last depth | ridge | 45.0 ± 7.1 (n=2) (50/50, d2) (paper 23) |" in table
    assert "| b [out] | linear | 25.0 ± 1.0 (n=3) (20/20) (paper 23) |" in table  # end-to-end rows: one line
    cells = csv.DictReader(rep.csv().splitlines())
    rules = {(r["depth_rule"], r["depth"]) for r in cells if r["mode"] == "output-only"}
    assert rules == {("chosen", "1"), ("last", "2")}
    # a fixed depth; a row without it has an empty cell; the default keeps one unlabelled line
    fixed = Report(results, depths=(0, 5)).task_table()
    assert (
        "| b, depth 0 | ridge | 25.0 ± 7.1 (n=2) (50/50, d0) |" in fixed
        and "| b, depth 5 | ridge |  |" in fixed
    )
    assert "| b | ridge | 65.0 ± 7.1 (n=2) (50/50, d1) |" in Report(results).task_table()


def test_end_to_end_seeds_run_apart_share_one_row_with_their_spread_and_a_seed_run_twice_counts_once():
    """Seeds of one end-to-end setting trained in separate processes (or on other machines) are one row: the
    mean and sample std over every seed, the steps to the target of each; another setting keeps its own row."""

    def seeded(seeds, tests, steps, lr_runs=(), **identity):
        r = end_to_end("bit_xor", "b", ["input", "out"], float(np.mean(tests)))
        runs = [
            {
                "seed": s,
                "lr": 1e-4,
                "test_accuracy": t,
                "val_accuracy": t,
                "steps": n,
                "best_step": n,
                "steps_to_target": n,
            }
            for s, t, n in zip(seeds, tests, steps)
        ]
        r.update(seeds=list(seeds), runs=runs + list(lr_runs), target=0.99)
        r["identity"] = {
            **r["identity"],
            "seeds": list(seeds),
            "task_options": {"seed": seeds[0]},
            "backbone_fingerprints": {str(s): f"fp{s}" for s in seeds},  # as real runs record them, per seed
            **identity,
        }
        return r

    other_lr = {
        "seed": 9,
        "lr": 1e-3,
        "test_accuracy": 0.0,
        "val_accuracy": 0.0,
        "steps": 1,
        "best_step": 1,
        "steps_to_target": None,
    }
    results = [
        seeded([0], [0.90], [100], lr_runs=[other_lr]),
        seeded([1, 2], [0.80, 0.70], [200, 300]),
        seeded([1], [0.10], [900]),  # seed 1 again: counted once
        seeded([0], [0.50], [50], stop_at=0.5),  # another setting
    ]
    rows = Report(results).rows
    assert len(rows) == 2
    merged = next(row for row in rows if len(row.by_depth[3][0]["runs"]) == 3)
    (r,) = merged.by_depth[3]
    assert r["seeds"] == [0, 1, 2] and r["steps_to_target"] == [100, 200, 300]
    assert r["steps_to_target_mean"] == pytest.approx(200)
    mean, std, n = merged.spread(3)
    assert n == 3 and mean == pytest.approx(0.8) and std == pytest.approx(0.1)
    table = Report(results).depth_tables()
    assert "seeds [0, 1, 2]" in table and "seeds [0]," in table  # the merged row names every seed it holds


def test_seeds_run_apart_take_the_rate_one_sweep_of_them_all_selects():
    """Seeds of one sweep (two rates) trained in separate processes, each choosing its own rate, are one row at
    the rate of the best mean validation over every seed, as `--seeds 3` selects, and the row says that rate."""

    def alone(seed, vals):
        r = end_to_end("bit_xor", "b", ["input", "out"], 0.0)
        r["runs"] = [
            {
                "seed": seed,
                "lr": lr,
                "test_accuracy": v,
                "val_accuracy": v,
                "steps": 9,
                "best_step": 9,
                "steps_to_target": None,
            }
            for lr, v in zip((1e-3, 3e-2), vals)
        ]
        r.update(seeds=[seed], lr=1e-3 if vals[0] >= vals[1] else 3e-2)
        r["identity"] = {**r["identity"], "seeds": [seed], "lr": [1e-3, 3e-2], "task_options": {"seed": seed}}
        r["identity"]["backbone_fingerprints"] = {str(seed): f"fp{seed}"}
        r["identity"]["data"] = {"train": {"rows": 90, "sha256": f"drawn by seed {seed}"}}
        return r

    def sweep(r):  # a seed's own sweep, as its process wrote it
        r["sweep"] = {
            f"{run['lr']:g}": {"val_mean": run["val_accuracy"], "val_std": 0.0, "test_mean": run["test_accuracy"],
                               "test_std": 0.0} for run in r["runs"]}  # fmt: skip
        return r

    rep = Report(
        [sweep(alone(0, (0.30, 0.20))), sweep(alone(1, (0.20, 0.26))), sweep(alone(2, (0.21, 0.27)))]
    )
    (row,) = rep.rows
    (r,) = row.by_depth[3]
    assert r["lr"] == 3e-2 and [run["lr"] for run in r["runs"]] == [3e-2] * 3
    assert r["test_accuracy"] == pytest.approx(np.mean([0.20, 0.26, 0.27]))
    # the sweep table's cells are every seed's, not the first seed's alone with a spread of nought
    for lr, tests in (("0.001", [0.30, 0.20, 0.21]), ("0.03", [0.20, 0.26, 0.27])):
        assert r["sweep"][lr]["test_mean"] == pytest.approx(np.mean(tests))
        assert r["sweep"][lr]["test_std"] == pytest.approx(np.std(tests, ddof=1)) and r["sweep"][lr]["n"] == 3
    table = rep.sweep_table()
    assert (
        f"**{100 * np.mean([0.20, 0.26, 0.27]):.1f} ± {100 * np.std([0.20, 0.26, 0.27], ddof=1):.1f}" in table
    )
    assert (
        f"{100 * np.mean([0.30, 0.20, 0.21]):.1f} ± {100 * np.std([0.30, 0.20, 0.21], ddof=1):.1f}" in table
    )
    # each seed drew its own data: the row's data says it holds three data sets, not the first seed's alone
    rep.depth_tables()
    assert {rec["data"] for rec in rep.records} == {"train 90 rows: every row (3 data sets, one per seed)"}


def test_settings_that_differ_beyond_the_seed_keep_their_own_rows():
    rows = Report(
        [
            output_only(1, 0.9, 0.6, seed=0),
            output_only(1, 0.9, 0.6, seed=0, limit=80),
            output_only(1, 0.9, 0.6, seed=1, task_options={"n_bits": 5, "seed": 7}),
        ]
    ).rows  # data seed set apart
    assert len(rows) == 3


def test_critique_numbers_stand_beside_ours_with_their_error_and_tasks_it_lacks_get_a_column():
    groups = ["input", "pos", "ln", "out"]
    results = [
        end_to_end("mnist", "p", groups, 0.97),
        end_to_end("listops", "p", groups, 0.3),
        end_to_end("cifar10", "p-random", groups + ["attn", "ff"], 0.5),
    ]
    rep = Report(
        results,
        paper=TABLES[101],
        paper_rows={
            "p:input,pos,ln,out": "Frozen Pretrained, GPT2",
            "p-random:input,pos,ln,out,attn,ff": "Unfrozen Random, GPT2",
        },
    )
    table = rep.task_table()
    header = table.splitlines()[0]
    assert (
        header
        == "| setting | head | mnist (n train/test) | cifar10 (n train/test) | listops (n train/test) |"
    )
    assert (
        "| p [input,pos,ln,out] | linear | 97.0 ± 1.0 (n=3) (20/20) (critique 98.5 ± 0.1) |  | "
        "30.0 ± 1.0 (n=3) (20/20) |" in table
    )
    assert "(critique 77.8 ± 0.2)" in table


def test_report_depth_option(cli, tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    for i, r in enumerate([output_only(0, 0.5, 0.2), output_only(1, 0.9, 0.6), output_only(2, 0.7, 0.4)]):
        (folder / f"r{i}.json").write_text(json.dumps(r))
    r = cli("report", str(folder), "--layout", "task", "--depth", "chosen", "--depth", "last")
    assert r.exit_code == 0, r.output
    assert "| b, depth chosen on validation | ridge | 60.0 (50/50, d1) |" in r.output
    assert "| b, last depth | ridge | 40.0 (50/50, d2) |" in r.output
    r = cli("report", str(folder), "--layout", "task", "--depth", "7")
    assert (
        r.exit_code == 2
        and "--depth 7: no probe result of these has depth 7; they hold depths 0, 1, 2" in r.output
    )
    r = cli("report", str(folder), "--paper", "2", "--as", "nosuch=Random")
    assert (
        r.exit_code == 0
        and "--as nosuch=Random: no result has backbone 'nosuch' (the results' backbones: b)" in r.output
    )
    r = cli("report", str(folder), "--layout", "task", "--depth", "deepest")
    assert (
        r.exit_code == 2
        and "expected 'chosen', 'last' or a depth number (0, 1, ...); got 'deepest'" in r.output
    )
    r = cli(
        "report", str(folder), "--depth", "last"
    )  # no paper table: laid out by depth, every depth a column
    assert (
        r.exit_code == 2
        and "--depth picks the depth of the task layout" in r.output
        and "--layout task" in r.output
    )


def test_the_lstm_tables_put_the_papers_rows_beside_the_pipelines_backbones():
    """Tables 3 to 5 map the pipeline's LSTM backbones (PAPER_AS_3..5 in pipelines/end_to_end.mk) to the
    paper's rows: the random transformer, the 3-layer LSTM and the 12-layer ones."""
    import re
    from pathlib import Path

    make = (Path(__file__).resolve().parents[2] / "pipelines" / "end_to_end.mk").read_text()
    groups = ["input", "pos", "ln", "out"]
    for number, backbone, row, paper in (
        (3, "lstm", "LSTM", 50.9),
        (4, "lstm-12", "12", 16.2),
        (5, "lstm-12-residual", "+ Residual Connections", 16.8),
    ):
        mapping = re.search(
            rf"--as {re.escape(backbone)}:\$\(FPT_GROUPS\)='?{re.escape(row)}'?( |$)", make, re.M
        )
        assert mapping, (number, backbone)
        task = "bit_memory" if number == 3 else "listops"
        rep = Report(
            [end_to_end(task, backbone, groups, 0.5)],
            paper=TABLES[number],
            paper_rows={f"{backbone}:{','.join(groups)}": row},
        )
        assert f"(paper {paper:g})" in rep.task_table(), (number, rep.task_table())


def test_depth_layout_csv_gives_the_chosen_depth_its_papers_number():
    # table 12 has the paper's Pretrained at 1, 3, 6 and 12 blocks; our row is chosen at depth 3 on validation
    results = [
        output_only(d, val, test, task="listops")
        for d, val, test in ((1, 0.2, 0.2), (3, 0.4, 0.3), (6, 0.3, 0.4))
    ]
    rep = Report(results, paper=TABLES[12], paper_rows={"b": "Pretrained"})
    rep.markdown("depth")
    cells = {r["column"]: r for r in csv.DictReader(rep.csv().splitlines())}
    assert cells["chosen"]["depth"] == "3" and cells["chosen"]["paper"] == cells["d3"]["paper"] == "18"


def test_steps_table_gives_each_seeds_reach_the_spread_and_the_lowest_seed():
    """Table 6's cells: steps to the target when every seed crossed it, else which seeds did; the test mean with
    its spread and the lowest seed (a claim that every seed solves a task reads the lowest)."""
    groups = ["input", "pos", "ln", "out"]
    all_reached = {
        **end_to_end("bit_xor", "p", groups, 0.995),
        "target": 0.99,
        "steps_to_target": [200, 300, 400],
        "steps_to_target_mean": 300.0,
        "test_min": 0.99,
    }
    one_missed = {
        **end_to_end("bit_memory", "p", groups, 0.91),
        "target": 0.99,
        "steps_to_target": [1200, None, 1500],
        "steps_to_target_mean": None,
        "test_min": 0.75,
    }
    rep = Report([all_reached, one_missed], paper=TABLES[6], paper_rows={"p:input,pos,ln,out": "FPT"})
    table = rep.task_table()
    assert "300 steps to 99%; test 99.5 ± 1.0 (n=3), lowest seed 99.0 (20/20) (paper 500 steps)" in table
    assert (
        "2 of 3 seeds reached 99% (in 1,200, 1,500 steps); test 91.0 ± 1.0 (n=3), lowest seed 75.0" in table
    )
    lowest = {r["task"]: r["test_min"] for r in csv.DictReader(rep.csv().splitlines())}
    assert lowest == {"bit_xor": "0.99", "bit_memory": "0.75"}


def test_settings_that_would_share_a_label_are_told_apart_by_what_differs():
    """Two settings of one task with the same backbone and head (here: 50 and 80 rows) get their own lines, each
    named by the field that differs, and a third task's row of the same setting stays on the line it shares."""
    results = [
        output_only(1, 0.9, 0.60, limit=50),
        output_only(1, 0.9, 0.70, limit=80),
        output_only(1, 0.9, 0.40, task="cifar10", limit=50),
    ]
    rep = Report(results)
    table = rep.task_table()
    assert "| b, limit 50 | ridge | 40.0 (50/50) | 60.0 (50/50) |" in table  # columns: cifar10, mnist
    assert "| b, limit 80 | ridge |  | 70.0 (50/50) |" in table
    assert {r["setting"] for r in csv.DictReader(rep.csv().splitlines())} == {"b, limit 50", "b, limit 80"}
    assert "| b, limit 80 | ridge | 50/50 | 70.0 |" in Report(results).depth_tables()
    assert (
        "| b | ridge |" in Report(results[:1] + results[2:]).task_table()
    )  # nothing to tell apart: the plain label


def test_a_learning_rate_sweep_names_the_rate_chosen_on_validation_and_shows_every_rate():
    swept = end_to_end("mnist", "p", ["input", "pos", "ln", "out"], 0.42)
    swept |= {
        "lr": 0.001,
        "sweep": {
            "1e-05": {"val_mean": 0.2, "val_std": 0.0, "test_mean": 0.21, "test_std": 0.02},
            "0.001": {"val_mean": 0.49, "val_std": 0.05, "test_mean": 0.42, "test_std": 0.021},
            "0.01": {"diverged": "loss not finite at step 3"},
        },
    }
    single = end_to_end("cifar10", "p", ["out"], 0.3) | {
        "sweep": {"0.0001": {"val_mean": 0.3, "val_std": 0.0, "test_mean": 0.3, "test_std": 0.0}}
    }
    rep = Report([swept, single])
    table = rep.task_table()
    assert "| p [input,pos,ln,out] | linear |  | 42.0 ± 1.0 (n=3) (20/20, lr 0.001) |" in table
    assert "| p [out] | linear | 30.0 ± 1.0 (n=3) (20/20) |  |" in table  # one rate: nothing was chosen
    by_rate = table.split("the rate chosen on validation.")[1]
    assert "| setting | task | lr 1e-05 | lr 0.001 | lr 0.01 |" in by_rate
    assert (
        "| p [input,pos,ln,out] | mnist | 21.0 ± 2.0 [20.0] | **42.0 ± 2.1 [49.0]** | diverged |" in by_rate
    )
    assert "cifar10" not in by_rate
    assert sorted(r["lr"] for r in csv.DictReader(rep.csv().splitlines())) == ["", "0.001"]
    assert "learning rate" not in Report([single]).task_table()


def sized(
    rows: dict[str, int], limit, baseline: str | None = None, test: float = 0.5, depth: int = 0, **extra
):
    """A narma10 result (a baseline ``baseline``, else an LSTM's result at ``depth``) of the data of ``rows`` per
    split, drawn by ``limit``."""
    data = {s: {"rows": n, "sha256": f"{s}{n}"} for s, n in rows.items()}
    subset = {"rule": "random", "seed": 0} if limit else {"rule": "all"}
    r = output_only(
        depth,
        test,
        test,
        task="narma10",
        backbone=f"baseline-{baseline}" if baseline else "lstm",
        data=data,
        limit=limit,
        subset=subset,
        task_options={"window": 32, "seed": 0},
        **extra,
    )
    r.update(n_train=rows["train"], n_val=rows["val"], n_test=rows["test"], metric="nrmse", test_score=test)
    r["val_score"] = test
    if baseline:
        r.update(
            mode="baseline", baseline=baseline, head="rule" if baseline == "majority" else "ridge", depth=None
        )
        r["identity"]["baseline"] = baseline
    return r


def test_a_table_mixing_data_sizes_pairs_each_result_with_the_baselines_of_its_own_data(tmp_path):
    """A 200-row NARMA run and a full one, each with its own baselines: each data under a line naming it, its
    rows and its own baselines (never the other size's); a data without baselines says so; the CSV names the
    data of every line."""
    small = {"train": 200, "val": 200, "test": 200}
    full = {"train": 2000, "val": 500, "test": 1000}
    other = {"train": 300, "val": 300, "test": 300}
    results = [
        sized(full, None, test=0.10),
        sized(full, None, test=0.08, depth=1),
        sized(full, None, "majority", test=1.00),
        sized(full, None, "raw", test=0.40),
        sized(small, 200, test=0.30),
        sized(small, 200, "majority", test=0.99),
        sized(small, 200, "raw", test=0.55),
        sized(other, 300, test=0.20, input_scale="matched"),
    ]
    rep = Report(results)
    table = rep.depth_tables()
    lines = table.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("| *data:")]
    assert len(heads) == 3, table
    sections = [lines[a:b] for a, b in zip(heads, heads[1:] + [len(lines)])]
    by_size = {}
    for section in sections:
        size = next(w for w in ("train 2,000", "train 200,", "train 300") if w in section[0])
        by_size[size] = "\n".join(section)
    assert "| baseline: train mean | rule | 2000/1000 |" in by_size["train 2,000"]
    assert "| 1 |" in by_size["train 2,000"] and "0.4 |" in by_size["train 2,000"]
    assert "| baseline: train mean | rule | 200/200 |" in by_size["train 200,"]
    assert "0.99" in by_size["train 200,"] and "0.55" in by_size["train 200,"]
    assert "2000/1000" not in by_size["train 200,"] and "200/200" not in by_size["train 2,000"]
    assert "a random sample (--limit 200, seed 0)" in by_size["train 200,"]
    assert "baselines: none found for this data" in by_size["train 300"]
    cells = list(csv.DictReader(rep.csv().splitlines()))
    for c in cells:
        assert c["data"], c
    baselines = [c for c in cells if c["mode"] == "baseline" and c["setting"].startswith("baseline:")]
    assert {(c["n_train/n_test"], c["data"].split(" rows")[0]) for c in baselines} == {
        ("2000/1000", "train 2,000, val 500, test 1,000"),
        ("200/200", "train 200, val 200, test 200"),
    }
    assert any(c["setting"] == "baselines: none found for this data" for c in cells)
    task = Report(results).task_table()
    assert "| baseline: train mean, data: train 200, val 200, test 200 rows" in task
    assert "| baseline: train mean, data: train 2,000, val 500, test 1,000 rows" in task
    assert "none found" in task


def test_end_to_end_rows_of_other_data_stand_under_their_own_data_line():
    """End-to-end results of two subsets, beside probes of a third: each data under its line, the end-to-end
    rows never under the probes' (nor without a line where the task mixes data)."""
    probes = {"train": 200, "val": 200, "test": 200}
    results = [sized(probes, 200, test=0.30), sized(probes, 200, "raw", test=0.55)]
    for n, test in ((32, 0.4), (64, 0.3)):
        r = end_to_end("narma10", f"e2e{n}", ["input", "out"], test)
        r["identity"] |= {"data": {"train": {"rows": n, "sha256": f"t{n}"}}, "limit": n}
        r.update(n_train=n, n_test=n, metric="nrmse", test_score=test, val_score=test)
        results.append(r)
    lines = Report(results).depth_tables().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("| *data:")]
    sections = ["\n".join(lines[a:b]) for a, b in zip(heads, heads[1:] + [len(lines)])]
    assert len(sections) == 3, lines
    assert sorted(("e2e32" in s, "e2e64" in s, "raw-input" in s, "| lstm |" in s) for s in sections) == [
        (False, False, True, True),
        (False, True, False, False),
        (True, False, False, False),
    ]
    one = Report(results[2:3]).depth_tables()
    assert "*data:" not in one and "e2e32" in one  # one data: no line


def test_one_data_keeps_the_table_as_it_was_and_a_row_of_seeds_averages_their_baselines():
    """A table of one data has no data lines; a row of several seeds' data (a subset drawn per seed) shows the
    mean of the baselines of its seeds' data and how many it found."""
    results = [
        output_only(
            0,
            0.5,
            test,
            seed=seed,
            data={"train": {"rows": 50 + seed}},
            subset={"rule": "random", "seed": seed},
        )
        for seed, test in ((0, 0.5), (1, 0.7), (2, 0.6))
    ]
    for seed, test in ((0, 0.2), (1, 0.4)):
        b = output_only(
            None, test, test, seed=seed, backbone="baseline-majority", data={"train": {"rows": 50 + seed}}
        )
        b.update(mode="baseline", baseline="majority", head="rule")
        results.append(b)
    rep = Report(results)
    (row,) = rep.rows  # the seeds of one setting, each drawing its own sample: one row
    table = rep.depth_tables()
    assert "*data:" not in table
    assert "| baseline: majority class | rule | 50/50 |  |  | 30.0 ± 14.1 (n=2) (2 of 3 fits) |  |" in table


def test_results_of_one_seed_on_other_data_are_never_averaged_as_seeds():
    """Two results of one setting and seed whose data differ (a file edited between runs, or two files of one
    name) are two rows under data lines told apart, each with its own baselines; seeds of one data still fold."""
    edited = [
        output_only(depth, 0.5, test, data={"train": {"rows": 80, "sha256": sha}}, task_options={"seed": 0})
        for sha, test in (("a", 0.6), ("b", 0.55))
        for depth in (0, 1)
    ]
    for sha, test in (("a", 0.8), ("b", 0.3)):
        b = output_only(
            None,
            test,
            test,
            backbone="baseline-raw",
            data={"train": {"rows": 80, "sha256": sha}},
            task_options={"seed": 0},
        )
        b.update(mode="baseline", baseline="raw")
        edited.append(b)
    rep = Report(edited)
    assert len(rep.rows) == 2 and all(len(row.by_depth[0]) == 1 for row in rep.rows)
    table = rep.depth_tables()
    assert "±" not in table and "one per seed" not in table
    lines = table.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("| *data:")]
    assert len(heads) == 2 and lines[heads[0]] != lines[heads[1]], table
    sections = ["\n".join(lines[a:b]) for a, b in zip(heads, heads[1:] + [len(lines)])]
    assert sorted(("| 60.0 |" in s, "| 80.0 |" in s, "| 30.0 |" in s) for s in sections) == [
        (False, False, True),
        (True, True, False),
    ]
    task = rep.task_table()
    assert "| 60.0 (50/50, d0) |" in task and "| 55.0 (50/50, d0) |" in task, task  # two rows, told apart
    seeds = [output_only(0, 0.5, test, seed=seed) for seed, test in ((0, 0.5), (1, 0.7))]
    (row,) = Report(seeds).rows
    assert row.spread(0)[2] == 2


def test_results_of_an_edited_file_at_other_seeds_are_never_averaged_as_seeds():
    """A file task's data is drawn by no seed: fits at seeds 0 and 1 of a file edited between them are two
    rows told apart by their data, not two seeds; a --limit sample at each seed, or a task that draws its data
    from the seed, still folds."""

    def fit(seed, test, data, **more):
        return output_only(
            0, 0.5, test, task="file:pets.npz", seed=seed, data=data, **{"limit": None, **more}
        )

    rep = Report([fit(0, 0.5, "before"), fit(1, 0.7, "after")])
    assert sorted(row.spread(0)[2] for row in rep.rows) == [1, 1]
    assert "±" not in rep.depth_tables() and "one per seed" not in rep.depth_tables()
    assert len(Report([fit(0, 0.5, "same"), fit(1, 0.7, "same")]).rows) == 1
    sampled = [
        fit(s, t, f"sample{s}", limit=50, subset={"rule": "stratified", "seed": s})
        for s, t in ((0, 0.5), (1, 0.7))
    ]
    (row,) = Report(sampled).rows
    assert row.spread(0)[2] == 2


def test_results_of_one_seed_of_other_weights_of_one_backbone_name_are_never_averaged_as_seeds():
    """Two folders of one name (``checkpoint-500``) hold other weights: their results at one seed are two rows
    told apart by the weights, each folding its own seeds; a random twin's seeds (weights drawn from the seed)
    still fold into one row."""

    def of(weights: str, seed: int, test: float) -> dict:
        return output_only(0, 0.5, test, seed=seed, data="same", backbone_fingerprint=weights)

    rep = Report([of("aaaaaa1", 0, 0.6), of("aaaaaa1", 1, 0.7), of("bbbbbb2", 0, 0.2)])
    assert sorted(row.spread(0)[2] for row in rep.rows) == [1, 2]
    task = rep.task_table()
    assert "| b, seed [0, 1], weights aaaaaa | ridge | 65.0 ± 7.1 (n=2) (50/50) |" in task, task
    assert "| b, seed 0, weights bbbbbb | ridge | 20.0 (50/50) |" in task, task
    (row,) = Report([output_only(0, 0.5, test, seed=seed) for seed, test in ((0, 0.5), (1, 0.7))]).rows
    assert row.spread(0)[2] == 2 and not row.data


def test_seeds_under_input_scale_matched_fold_and_a_matched_std_of_one_seed_tells_weights_apart():
    """``--input-scale matched`` records the token-embedding std each seed's weights give (``matched_std``): the
    seeds of one setting still fold into one row, unlabelled by it; at one seed, folders of one fingerprint
    whose embeddings differ (another std) are told apart by their weights."""

    def of(seed: int, std: float, test: float, weights: str = "fp") -> dict:
        return output_only(
            0, 0.5, test, seed=seed, input_scale="matched", matched_std=std, backbone_fingerprint=weights
        )

    (row,) = Report([of(0, 0.0201, 0.6), of(1, 0.0199, 0.7)]).rows
    assert row.spread(0)[2] == 2
    assert "matched_std" not in Report([of(0, 0.0201, 0.6), of(1, 0.0199, 0.7)]).task_table()
    rep = Report([of(0, 0.02, 0.6), of(0, 0.03, 0.2)])
    assert sorted(row.spread(0)[2] for row in rep.rows) == [1, 1]
    assert "weights" in rep.task_table()


def test_a_fit_that_stopped_before_its_last_depths_is_marked_incomplete():
    """Results of a fit asked for every depth but written for the first ones only (Ctrl-C, a full disk) are
    never shown as a whole fit: the row says which depths have no result; a fit asked for fewer depths is
    whole."""
    stopped = [output_only(d, 0.5, 0.5 + d / 10, depths=[0, 1, 2]) for d in (0, 1)]
    for r in stopped:
        r["config"] = {"fit": {"depths": "all"}}
    rep = Report(stopped)
    assert "(incomplete: depths 2 of its fit have no result)" in rep.depth_tables()
    assert "(incomplete" in rep.task_table()
    for r in stopped:
        r["config"] = {"fit": {"depths": [0, 1]}}
    assert "incomplete" not in Report(stopped).depth_tables()


def probe(seed, depth, test, *, task="bit_xor", fit_seed=0, val_fraction=0.1):
    """A probe's result as ``fit`` writes it: its ``seed`` is the fit's (validation split, torch head), its
    features' seed is in the identity, and the task's seed option is the run's where the task draws its data."""
    r = output_only(
        depth, 0.5, test, task=task, seed=seed, data={"train": {"rows": 80, "sha256": f"s{seed}"}}
    )
    r["identity"]["task_options"] = {"seed": seed if task == "bit_xor" else 0}
    r["seed"] = fit_seed
    r["config"] = {"fit": {"val_fraction": val_fraction, "seed": fit_seed}}
    return r


@pytest.mark.parametrize("task", ["bit_xor", "digits"])
def test_probes_of_features_of_several_seeds_fold_into_one_row_naming_them(task):
    """Features extracted with seeds 0, 1, 2 and fitted with the fit's default seed are three seeds of one
    setting: one row, n=3, whether the task draws its data from the seed (bit_xor) or not (digits)."""
    rep = Report([probe(seed, 0, test, task=task) for seed, test in ((0, 0.5), (1, 0.7), (2, 0.6))])
    (row,) = rep.rows
    assert row.spread(0)[2] == 3
    assert "seed [0, 1, 2]" in rep.label(row) or rep.label(row) == "b"


def test_fits_of_one_file_with_another_val_fraction_are_not_seeds_and_fit_seeds_are():
    """Fits of the same features with another --val-fraction are a setting of their own, a row named by what
    differs, never averaged with the others; fits with another fit --seed (the validation split's and the torch
    head's) are seeds of one setting, folded with their spread."""
    results = [probe(0, 0, 0.5), probe(0, 0, 0.7, val_fraction=0.3), probe(0, 0, 0.6, fit_seed=1)]
    rep = Report(results)
    by_label = {rep.label(row): row for row in rep.rows}
    assert sorted(by_label) == ["b, fit val_fraction 0.1", "b, fit val_fraction 0.3"], sorted(by_label)
    assert by_label["b, fit val_fraction 0.1"].spread(0)[2] == 2
    assert by_label["b, fit val_fraction 0.3"].spread(0)[:2] == (0.7, None)


def test_no_setting_is_lost_from_the_task_layout_when_two_read_alike():
    """Data fixed by ``--task-opt seed=5`` beside data drawn by the run's seed (both run seed 0): two rows, told
    apart by the option; rows whose settings read alike even so (values cut short) are told apart by their run,
    so the task layout, one line per label, keeps every one."""
    drawn = probe(0, 0, 0.5)
    fixed = probe(0, 0, 0.7)
    fixed["identity"] = {**fixed["identity"], "task_options": {"seed": 5}, "data": {"train": {"sha256": "f"}}}
    fixed["identity_hash"], fixed["key"] = "fixed", "fixed"
    table = Report([drawn, fixed]).task_table()
    assert "50.0" in table and "70.0" in table and "task_options.seed 5" in table, table
    long = [probe(0, 0, t) for t in (0.5, 0.7)]
    for i, r in enumerate(long):  # two option values alike in their first 21 characters
        r["identity"] = {**r["identity"], "task_options": {"seed": 0, "path": "x" * 30 + str(i)}}
        r["identity_hash"], r["key"] = f"long{i}", f"long{i}"
    rep = Report(long)
    assert len({rep.label(row) for row in rep.rows}) == 2 and all(
        ", run " in rep.label(row) for row in rep.rows
    )
    assert "50.0" in rep.task_table() and "70.0" in rep.task_table()


def test_fits_whose_seed_changed_nothing_count_once_and_their_baselines_too():
    """Fits of one feature file at fit seeds 0, 1, 2 that the seed did not change (the file's own validation
    split, a head without a seed: ``seeded`` false) are one fit, not three seeds of spread 0; so are baselines
    fitted alike at each seed. Fits the seed changed stay seeds of their row."""

    def fitted(r, seed, seeded):
        return {
            **r,
            "seed": seed,
            "seeded": seeded,
            "config": {"fit": {"val_fraction": 0.1}},
            "key": f"{r['key']}{seed}",
        }

    for seeded, probes, bases in (
        (False, "50.0 |", "30.0 |"),
        (True, "50.0 ± 0.0 (n=3)", "30.0 ± 0.0 (n=3)"),
    ):
        results = [fitted(output_only(1, 0.5, 0.5), seed, seeded) for seed in (0, 1, 2)]
        for seed in (0, 1, 2):
            b = fitted(output_only(None, 0.3, 0.3, backbone="baseline-raw"), seed, seeded)
            b.update(mode="baseline", baseline="raw", head="ridge", key=f"raw{seed}")
            results.append(b)
        rep = Report(results)
        assert rep.rows[0].spread(1)[2] == (3 if seeded else 1)
        table = rep.depth_tables()
        assert f"| {probes}" in table and f"| {bases}" in table, table


def test_a_row_of_samples_of_several_seeds_names_every_seed_and_a_full_run_says_no_limit():
    """A row folding --limit samples drawn by seeds 0 and 1 says both seeds in its data line (not the first
    result's); a setting without --limit beside one with it is labelled ``limit none``."""

    def sampled(seed, test, limit=50):
        subset = {"rule": "stratified", "seed": seed} if limit else {"rule": "all"}
        return output_only(0, 0.5, test, seed=seed, subset=subset, limit=limit)

    from reservoir.report.rows import data_groups

    (group,) = data_groups(Report([sampled(1, 0.6), sampled(0, 0.7)]).rows, "mnist")
    assert group.label.endswith("(--limit 50, seeds 0, 1) (2 data sets, one per seed)"), group.label
    task = Report([sampled(0, 0.6), sampled(0, 0.7, limit=None)]).task_table()
    assert "| b, limit none | ridge |" in task and "| b, limit 50 | ridge |" in task, task


def test_a_task_of_several_data_plots_each_data_with_its_own_baselines(tmp_path):
    """Rows of a full run and of a --limit sample are plotted apart, each beside its own data's baselines,
    the data named in its title; a task of one data keeps one plot."""
    pytest.importorskip("matplotlib")
    import warnings

    results = []
    for data, limit, test in (("full", None, 0.8), ("small", 50, 0.4)):
        results += [output_only(d, 0.5, test, data=data, limit=limit) for d in (0, 1)]
        b = output_only(None, test / 2, test / 2, backbone="baseline-raw", data=data, limit=limit)
        b.update(mode="baseline", baseline="raw")
        results.append(b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = Report(results).plots(tmp_path)
    assert sorted(p.name for p in written) == ["mnist-depth-1.png", "mnist-depth-2.png"]
    assert [p.name for p in Report(results[:3]).plots(tmp_path / "one")] == ["mnist-depth.png"]

    from reservoir.report import plots

    drawn = []
    real = plots.depth_plot
    plots.depth_plot = lambda curves, path, **kw: drawn.append((curves, kw["baselines"])) or path
    try:
        Report(results).plots(tmp_path / "again")
    finally:
        plots.depth_plot = real
    pairs = sorted((next(iter(c.values()))[0], list(b.values())) for c, b in drawn)
    assert pairs == [(40.0, [20.0]), (80.0, [40.0])]  # each data's curve beside its own baseline only


def test_a_row_of_fit_seeds_shows_the_baselines_of_those_seeds_and_held_out_share():
    """Probes fitted at seeds 0 and 1 (one feature file) sit beside the mean of the baselines fitted at those seeds
    with the same share held out, not beside the first baseline found (seed 2's, or one held out otherwise)."""

    def fitted(r, seed, val_fraction=0.1):
        return {
            **r,
            "seed": seed,
            "config": {"fit": {"val_fraction": val_fraction}},
            "key": f"{r['key']}{seed}",
        }

    results = [fitted(output_only(1, 0.5, 0.5 + seed / 10), seed) for seed in (0, 1)]
    for seed, test, share in ((2, 0.9, 0.1), (0, 0.2, 0.1), (0, 0.8, 0.3), (1, 0.4, 0.1)):
        b = fitted(output_only(None, test, test, backbone="baseline-raw"), seed, share)
        b.update(mode="baseline", baseline="raw", head="ridge", key=f"raw{seed}{share}")
        results.append(b)
    table = Report(results).depth_tables()
    assert "| baseline: raw-input linear head | ridge | 50/50 |  |  | 30.0 ± 14.1 (n=2) |  |" in table
    alone = Report([results[0], results[2]])  # only seed 2's baseline: shown, and said so, in the CSV too
    assert "90.0 (not fitted at the probes' seeds and held-out share)" in alone.depth_tables()
    (record,) = [r for r in alone.records if r["mode"] == "baseline"]
    assert record["other_fit"] is True and record["test"] == 0.9
    partial = Report([results[0], results[1], results[3]])  # probes at seeds 0, 1; a baseline at seed 0 only
    assert "(1 of 2 fits)" in partial.depth_tables()
    (record,) = [r for r in partial.records if r["mode"] == "baseline"]
    assert (record["n_seeds"], record["of_fits"]) == (1, 2)


def test_seeds_cut_by_max_time_form_a_row_that_says_so():
    """Seeds of one setting run apart, one solved and two cut short by --max-time (their identity records it): the
    cut seeds are a row of their own whose label says they were cut, not a second row alike in words."""
    whole = end_to_end("bit_xor", "b", ["input", "out"], 0.9)
    cut = end_to_end("bit_xor", "b", ["input", "out"], 0.6)
    cut["identity"] = {**cut["identity"], "max_time": 285}
    cut["key"] += "cut"
    table = Report([whole, cut]).depth_tables()
    assert "cut at --max-time 285 s" in table and len(Report([whole, cut]).rows) == 2
    # written before the identity recorded it: the runs' stop reasons say it
    older = {**cut, "identity": {k: v for k, v in cut["identity"].items() if k != "max_time"}}
    older["runs"] = [{"seed": 0, "lr": 1e-4, "stop_reason": "reached --max-time 285 s at step 9800"}]
    assert "cut at --max-time 285 s" in Report([whole, older]).depth_tables()


def test_real_valued_targets_are_named_by_their_metric_in_the_csv_the_task_layout_and_the_plot(tmp_path):
    """An NRMSE row is never shown as an accuracy: the CSV names each record's metric, the task layout's
    column says nrmse and its direction, and the depth plot plots the error as it is, labelled so."""
    pytest.importorskip("matplotlib")
    from reservoir.report import plots

    results = [output_only(d, 0.5, 0.2 + d / 10, task="narma10") for d in (0, 1)]
    for r in results:
        r["metric"], r["test_score"], r["val_score"] = "nrmse", r.pop("test_accuracy"), r.pop("val_accuracy")
    rep = Report(results)
    assert "narma10 (nrmse, lower is better; n train/test)" in rep.task_table()
    assert {rec["metric"] for rec in rep.records} == {"nrmse"}
    seen = {}

    def spy(curves, path, **kw):
        seen.update(curves=curves, **kw)
        return path

    import unittest.mock

    with unittest.mock.patch.object(plots, "depth_plot", spy):
        rep.plots(tmp_path)
    assert seen["ylabel"] == "test nrmse (nrmse, lower is better)" and "test nrmse by depth" in seen["title"]
    assert list(seen["curves"].values())[0] == pytest.approx({0: 0.2, 1: 0.3})


def test_a_depth_fewer_seeds_reached_says_so_and_is_never_chosen_over_the_others():
    """Seed 0 fitted at depths 0..2, seeds 1 and 2 only at 0 and 1 (a fit stopped early): depth 2's cell holds
    one seed and says so, and the depth chosen on validation is picked among the depths every seed reached,
    though depth 2's one seed validates best. ``last`` is the deepest the features hold, not the deepest fitted."""
    results = [output_only(d, 0.5 + d / 10, 0.5, seed=s, depths=[0, 1, 2]) for s in (0, 1, 2) for d in (0, 1)]
    results.append(output_only(2, 0.99, 0.9, seed=0, depths=[0, 1, 2]))
    rep = Report(results, depths=("chosen", "last"))
    (row,) = rep.rows
    assert row.full == [0, 1] and row.chosen == 1 and row.depth_for("last") == 2
    assert "| 90.0 (1 of 3 seeds) |" in rep.depth_tables()
    assert "(50/50, d2) (1 of 3 seeds)" in rep.task_table()
    shallow = [output_only(d, 0.5, 0.5, depths=[0, 1, 2, 3]) for d in (0, 1)]  # fitted at --depths 0,1
    (row,) = Report(shallow).rows
    assert row.depth_for("last") is None and row.depth_for("chosen") in (0, 1)


def test_a_task_of_several_test_splits_says_which_the_cells_score_and_the_csv_holds_each():
    """Remote homology scores three test splits: the table says the cells are the first's, and each depth's
    CSV record holds the others' means."""
    results = [output_only(0, 0.5, t, task="remote_homology", seed=s) for s, t in ((0, 0.2), (1, 0.4))]
    for r, extra in zip(results, (0.6, 0.8)):
        r["test_split"] = "test_fold_holdout"
        r["test_scores"] = {"test_fold_holdout": r["test_accuracy"], "test_family_holdout": extra}
    rep = Report(results)
    table = rep.depth_tables()
    assert "### remote_homology (test split test_fold_holdout; every test split in the CSV)" in table, table
    (record,) = [r for r in rep.records if r["column"] == "d0"]
    assert record["test"] == pytest.approx(0.3) and record["test_family_holdout"] == pytest.approx(0.7)

"""Baselines beside the reservoir, the input scale knob, and the report built on both."""

import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.model.backbones import load_backbone
from reservoir.model.reservoir import Reservoir
from reservoir.probe.baselines import lookup_rule, raw_inputs
from reservoir.probe.ridge import RidgePath, RidgeStats
from reservoir.report.tables import Report
from reservoir.tasks import get_task
from reservoir.tasks.listops import VOCAB, first_operator
from tests.conftest import save_tiny_gpt2


def extract(cli, backbone, *args, task="listops"):
    r = cli(
        "-q",
        "extract",
        "--task",
        task,
        "--backbone",
        str(backbone),
        "--limit",
        "120",
        "--depths",
        "0,1",
        "--dtype",
        "float32",
        *args,
    )
    assert r.exit_code == 0, r.output
    return Path(r.stdout.strip().splitlines()[-1])


def baselines(home, task="listops"):
    return {
        p.parent.name: json.loads(p.read_text()) for p in (home / "results" / task).glob("baseline-*/*.json")
    }


def test_fit_writes_every_baseline_and_reuses_them_for_another_backbone(cli, home, tiny_gpt2):
    path = extract(cli, tiny_gpt2)
    r = cli("fit", "--features", str(path), "--head", "ridge")
    assert r.exit_code == 0, r.output
    found = baselines(home)
    assert sorted(found) == [
        "baseline-first-operator",
        "baseline-majority",
        "baseline-raw",
        "baseline-tanh-32",
    ]
    # the majority and first-operator numbers are what the rule gives, computed here by hand
    task = get_task("listops", seed=0)
    train, test = task.load("train", Path("."), 120), task.load("test", Path("."), 120)
    majority = np.bincount(train.labels).argmax()
    assert found["baseline-majority"]["test_accuracy"] == pytest.approx(np.mean(test.labels == majority))
    ops_train, ops_test = first_operator(train), first_operator(test)
    assert set(ops_train) <= {VOCAB[o] for o in ("[MIN", "[MAX", "[MED", "[SM")}
    by_op = {op: np.bincount(train.labels[ops_train == op]).argmax() for op in np.unique(ops_train)}
    expected = np.mean([by_op.get(op, majority) == y for op, y in zip(ops_test, test.labels)])
    assert found["baseline-first-operator"]["test_accuracy"] == pytest.approx(expected)
    assert found["baseline-raw"]["head"] == "ridge" and found["baseline-raw"]["n_train"] == 120
    # the table shows them beside the reservoir's numbers
    assert (
        "baseline: first-operator rule" in r.stdout and "baseline: random tanh features (32 wide)" in r.stdout
    )
    # another backbone on the same data reuses every baseline file untouched
    stamps = {p: p.stat().st_mtime_ns for p in (home / "results" / "listops").glob("baseline-*/*.json")}
    path2 = extract(cli, save_tiny_gpt2(home / "wider", n_embd=48))
    r = cli("-q", "fit", "--features", str(path2), "--head", "ridge")
    assert r.exit_code == 0, r.output
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())
    assert "baseline-tanh-48" in baselines(home)  # its width gets its own random features
    # a baseline file damaged since (cut short, or not a result) is computed again and written over
    majority = next(p for p in stamps if p.parent.name == "baseline-majority")
    for damage in ('{"task": "listops", "mo', "[]"):
        majority.write_text(damage)
        r = cli("-q", "fit", "--features", str(path), "--head", "ridge")
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        assert (
            json.loads(majority.read_text())["test_accuracy"] == found["baseline-majority"]["test_accuracy"]
        )


def test_no_baselines_and_a_head_changes_them(cli, home, tiny_gpt2):
    path = extract(cli, tiny_gpt2, task="digits")
    assert cli("-q", "fit", "--features", str(path), "--head", "ridge", "--no-baselines").exit_code == 0
    assert baselines(home, "digits") == {}
    assert cli("-q", "fit", "--features", str(path), "--head", "logreg").exit_code == 0
    heads = {b["head"] for b in baselines(home, "digits").values()}
    assert heads == {"rule", "logreg"}


def test_baselines_refuse_other_data(cli, home, tmp_path, tiny_gpt2):
    rng = np.random.default_rng(0)
    file = tmp_path / "mine.npz"
    np.savez(file, x=rng.random((60, 5, 2), dtype=np.float32), y=np.arange(60) % 3)
    r = cli("-q", "extract", "--task", f"file:{file}", "--backbone", str(tiny_gpt2))
    path = Path(r.stdout.strip())
    r = cli("fit", "--features", str(path))  # the file the features came from is read again for baselines
    assert r.exit_code == 0 and "no baselines" not in r.output
    assert list((home / "results" / "mine.npz").glob("baseline-majority/*.json"))
    np.savez(file, x=rng.random((60, 5, 2), dtype=np.float32), y=np.arange(60) % 3)  # the file changed since
    r = cli("fit", "--features", str(path))
    assert r.exit_code == 0 and "no baselines: the file the features came from" in r.output
    assert "has changed; pass --task file:PATH" in " ".join(r.output.split())
    r = cli("fit", "--features", str(path), "--task", f"file:{file}")
    assert r.exit_code == 1 and "was extracted from another file" in r.output and "Traceback" not in r.output


def test_raw_inputs_are_the_tokens_flattened():
    task = get_task("listops", seed=0, max_len=20)
    data = task.load("test", Path("."), 3)
    X = raw_inputs(task, data)
    assert X.shape == (3, 20 * len(VOCAB)) and set(np.unique(X)) <= {0.0, 1.0}
    onehot = X.reshape(3, 20, len(VOCAB))
    assert (onehot.sum(-1) == 1).all()  # one id per position, padding included
    assert (onehot[0, : data.lengths[0]].argmax(-1) == data.inputs[0]).all()
    digits = get_task("digits")
    d = digits.load("test", Path("."), 4)
    assert np.array_equal(raw_inputs(digits, d), digits.encode(d.inputs).reshape(4, -1))


def test_lookup_rule_votes_per_key_and_falls_back_to_the_majority():
    rule = lookup_rule(np.array([1, 1, 1, 2, 2, 3]), np.array([5, 5, 4, 7, 7, 5]))
    assert list(rule(np.array([1, 2, 3, 9]))) == [5, 7, 5, 5]
    multi = lookup_rule(np.zeros(4, int), np.array([[0, 1], [0, 1], [1, 1], [0, 0]]))
    assert multi(np.zeros(2, int)).tolist() == [[0, 1], [0, 1]]


def test_ridge_from_rows_equals_ridge_from_statistics():
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(40, 90)), rng.normal(size=(40, 3))
    X[:, 5] = 2.0  # a constant column
    primal, dual = RidgeStats.zeros(90, 3).add(X, Y).decompose(), RidgePath.from_rows(X, Y)
    for alpha in (0.1, 10.0, 1e4):
        for a, b in zip(primal.coef(alpha), dual.coef(alpha)):
            np.testing.assert_allclose(a, b, atol=1e-9)


@pytest.mark.parametrize("task", ["digits", "listops"])
def test_input_scale_matched_and_a_number(task, tiny_gpt2):
    backbone = load_backbone(str(tiny_gpt2))
    assert backbone.token_std == pytest.approx(0.02, rel=0.2)  # GPT-2's initializer_range
    spec = get_task(task).spec
    for scale, std in (("matched", backbone.token_std), ("0.5", 0.5)):
        layer = Reservoir(spec, backbone, seed=0, input_scale=scale).input_layer
        if spec.token_kind == "ids":
            assert layer.weight.std().item() == pytest.approx(std, rel=0.1)
        else:  # unit-variance inputs come out at the asked std
            out = layer(torch.randn(4000, spec.token_dim))
            assert out.std().item() == pytest.approx(std, rel=0.1)
    paper = Reservoir(spec, backbone, seed=0).input_layer
    if spec.token_kind == "ids":
        assert paper.weight.std().item() == pytest.approx(1.0, rel=0.1)


def test_input_scale_is_part_of_the_identity_and_checked(cli, home, tiny_gpt2):
    paper = extract(cli, tiny_gpt2, task="digits")
    matched = extract(cli, tiny_gpt2, "--input-scale", "matched", task="digits")
    number = extract(cli, tiny_gpt2, "--input-scale", "0.020", task="digits")
    assert "scale-matched" in matched.name and "scale-0.02-" in number.name and "scale" not in paper.name
    with h5py.File(matched, "r") as f:
        assert json.loads(f.attrs["identity"])["input_scale"] == "matched"
    r = cli(
        "-q",
        "extract",
        "--task",
        "digits",
        "--backbone",
        str(tiny_gpt2),
        "--limit",
        "120",
        "--depths",
        "0,1",
        "--dtype",
        "float32",
        "--out",
        str(paper),
        "--input-scale",
        "matched",
    )
    assert r.exit_code == 1 and 'input_scale: stored "paper", asked "matched"' in r.output
    for bad in ("0", "-1", "big", "inf"):
        r = cli("extract", "--task", "digits", "--input-scale", bad)
        assert (
            r.exit_code == 2
            and "--input-scale must be one of ['paper', 'matched'] or a positive number" in r.output
        )


def test_report_chooses_the_depth_on_validation_and_writes_csv_and_plots(tmp_path):
    def result(depth, val, test, backbone="b", seed=0):
        return {
            "task": "t",
            "backbone": backbone,
            "mode": "output-only",
            "depth": depth,
            "head": "ridge",
            "trainable": ["out"],
            "test_accuracy": test,
            "val_accuracy": val,
            "n_train": 10,
            "n_val": 2,
            "n_test": 5,
            "seconds": 0.0,
            "seed": seed,
            "lr": None,
            "identity": {"data": 1, "input_scale": "paper"},
            "identity_hash": "abcdef",
            "key": f"{backbone}{depth}{seed}",
            "config": {},
            "version": "x",
        }

    results = [result(0, 0.5, 0.9), result(1, 0.8, 0.6), result(2, 0.8, 0.7), result(1, 0.9, 0.62, seed=1)]
    results += [result(0, 0.5, 0.9, seed=1), result(2, 0.8, 0.7, seed=1)]  # every depth at both fit seeds
    results.append(
        {
            **result(None, 0.3, 0.3, backbone="baseline-majority"),
            "mode": "baseline",
            "baseline": "majority",
            "head": "rule",
        }
    )
    rep = Report(results)
    (row,) = rep.rows
    assert row.chosen == 1 and row.best_by_test == 0  # validation picks depth 1 although depth 0 tests best
    table = rep.depth_tables()
    line = next(line for line in table.splitlines() if line.startswith("| b |"))
    assert "| 1 | 61.0 ± 1.4 (n=2) | 90.0 (d0) |" in line
    assert "| baseline: majority class | rule | 10/5 |" in table
    rows = list(csv.DictReader(rep.csv().splitlines()))
    assert {r["column"] for r in rows} >= {"d0", "d1", "d2", "chosen", "baseline"}
    pytest.importorskip("matplotlib")
    (png,) = rep.plots(tmp_path)
    import matplotlib.image

    assert matplotlib.image.imread(png).std() > 0


def test_report_plots_training_curves_and_puts_paper_numbers_beside_ours(tmp_path):
    pytest.importorskip("matplotlib")
    from reservoir.report.paper import TABLES

    history = [{"step": s, "loss": 1.0 / s, "val_accuracy": 0.5 + s / 100} for s in (10, 20, 30)]
    e2e = {
        "task": "bit_xor",
        "backbone": "gpt2-random",
        "mode": "end-to-end",
        "depth": 12,
        "head": "linear",
        "trainable": ["input", "pos", "ln", "out"],
        "test_accuracy": 0.99,
        "test_std": 0.0,
        "seeds": [0],
        "val_accuracy": 0.8,
        "n_train": 90,
        "n_val": 10,
        "n_test": 50,
        "seconds": 1.0,
        "seed": 0,
        "lr": 0.001,
        "identity": {"input_scale": "paper"},
        "identity_hash": "123456",
        "key": "k",
        "config": {},
        "version": "x",
        "runs": [{"lr": 0.001, "seed": 0, "history": history}],
    }
    rep = Report([e2e], paper=TABLES[2], paper_rows={"gpt2-random:input,pos,ln,out": "Random"})
    table = rep.task_table()
    assert "| gpt2-random [input,pos,ln,out] | linear | 99.0 (90/50) (paper 100) |" in table
    written = rep.plots(tmp_path)
    assert [p.name for p in written] == ["bit_xor-training.png"]


def test_report_options_refuse_bad_input(cli, home, tiny_gpt2, tmp_path):
    path = extract(cli, tiny_gpt2, task="digits")
    assert cli("-q", "fit", "--features", str(path), "--head", "ridge").exit_code == 0
    r = cli("report", "--paper", "99")
    assert r.exit_code == 2 and "the paper has no table 99 here; choose from [1, 2" in r.output
    r = cli("report", "--as", "tiny=FPT")
    assert r.exit_code == 2 and "expected BACKBONE[:GROUPS]=ROW with --paper N" in r.output
    r = cli("report", "--paper", "2", "--as", "tiny=Nobody")
    assert r.exit_code == 2 and "ROW one of ['Bit', 'FPT', 'Random', 'ViT']" in r.output
    blocked = tmp_path / "file"
    blocked.write_text("")
    for option, target, fix in (
        ("--plots", blocked / "plots", "pass a --plots folder you can write"),
        ("--csv", blocked / "t.csv", "pass a --csv file you can write"),
    ):
        r = cli("report", option, str(target))
        assert r.exit_code == 1 and fix in r.output and "Traceback" not in r.output
    r = cli(
        "report",
        "--paper",
        "2",
        "--as",
        f"{tiny_gpt2.name}=Random",
        "--layout",
        "task",
        "--csv",
        str(tmp_path / "t.csv"),
    )
    assert r.exit_code == 0 and r.output.startswith("Paper table 2:") and (tmp_path / "t.csv").exists()


def test_random_tanh_features_have_a_bias_so_a_readout_forms_a_product():
    """Centred inputs and an even target (x1 * x2, NARMA's product term): without a bias every random tanh feature
    is odd, and no linear readout of them beats the mean; with one it fits the product."""
    from sklearn.linear_model import RidgeCV

    from reservoir.probe.baselines import tanh_features

    rng = np.random.default_rng(0)
    raw = {s: rng.uniform(-1, 1, size=(n, 2)).astype(np.float32) for s, n in (("train", 2000), ("test", 500))}
    y = {s: x[:, 0] * x[:, 1] for s, x in raw.items()}
    X = tanh_features(raw, 256, seed=3, scale=0.5)
    head = RidgeCV(alphas=(1e-6, 1e-4, 1e-2, 1.0)).fit(X["train"], y["train"])
    assert head.score(X["test"], y["test"]) > 0.9
    flipped = tanh_features({k: -v for k, v in raw.items()}, 256, 3, 0.5)
    assert not np.allclose(flipped["test"], -X["test"])  # not odd in the input

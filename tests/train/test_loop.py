"""End-to-end FPT training: frozen groups, parameter arithmetic, evaluation, sweeps, exact resume."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from reservoir.config import TrainConfig
from reservoir.errors import DataError
from reservoir.model.backbones import load_backbone
from reservoir.tasks import get_task
from reservoir.train import (
    FPT,
    Diverged,
    evaluate,
    load_data,
    param_counts,
    select_trainable,
    train,
    train_run,
    train_step,
)

#: a small, fast bit_xor: 512 train (51 held out for validation), 256 test
XOR_OPTS = {"n_train": "512", "n_test": "256"}


def xor_cfg(backbone, home: Path, **kw) -> TrainConfig:
    base = dict(
        task="bit_xor",
        backbone=str(backbone),
        task_options=XOR_OPTS,
        steps=30,
        batch_size=16,
        eval_every=10,
        patience=0,
        checkpoint_every=10,
        checkpoint_dir=home / "ckpt",
        data_dir=home / "data",
    )
    return TrainConfig(**{**base, **kw})


pytestmark = pytest.mark.usefixtures("one_thread")


def test_dropout_follows_a_dense_input_layer_and_not_an_id_embedding(tiny_gpt2):
    """As in the FPT code, dense tokens pass a dropout after the input layer and id tokens go to the backbone as
    embedded, whose own embedding dropout is the only one (id tokens were dropped out twice); the identity of a run
    on ids says so, so a checkpoint of the earlier model is not resumed."""
    from reservoir.model.backbones import load_backbone
    from reservoir.train.checkpoint import settings_identity

    backbone = load_backbone(str(tiny_gpt2), 0)
    dense = FPT(get_task("bit_xor").spec, backbone, blocks=2, seed=0, dropout=0.5).train()
    ids = FPT(
        get_task("listops").spec, load_backbone(str(tiny_gpt2), 0), blocks=2, seed=0, dropout=0.5
    ).train()
    x = torch.ones(2, 10, dtype=torch.long)
    embedded = ids.reservoir.input_layer(x)
    assert torch.equal(ids.reservoir.dropout(embedded), embedded)
    assert (dense.reservoir.dropout(torch.ones(4, 100)) == 0).any()
    cfg = TrainConfig(task="listops", backbone=str(tiny_gpt2))
    assert settings_identity(cfg, get_task("listops"), {})["embedding_dropout"] == "backbone"
    assert "embedding_dropout" not in settings_identity(
        dataclasses.replace(cfg, task="bit_xor"), get_task("bit_xor"), {}
    )


def test_paper_parameter_arithmetic_for_gpt2_base():
    """Layer norms: 4 x 768 per block x 12 blocks, plus the final norm (2 x 768), and positions l x 768 (the
    rows a task of l tokens reaches), as the paper counts."""
    from transformers import GPT2Config, GPT2Model

    from reservoir.model.backbones.gpt2 import GPT2_SIZES, GPT2Backbone

    with torch.device("meta"):  # shapes only: no 124M-parameter initialisation
        backbone = GPT2Backbone(GPT2Model(GPT2Config(**GPT2_SIZES["gpt2"])))
    model = FPT(get_task("bit_xor").spec, backbone, blocks=12, seed=0)
    select_trainable(model, ("input", "pos", "ln", "out"))
    rows = {r["group"]: r for r in param_counts(model)}
    assert rows["ln"]["params"] == 4 * 768 * 12 + 2 * 768 == 38_400
    assert rows["ln"]["arithmetic"] == "12 x (4 x 768) + 2 x 768"
    seq = get_task("bit_xor").spec.seq_len  # the rows of the position table its positions reach: l x n_dim
    assert rows["pos"]["params"] == seq * 768 and rows["pos"]["arithmetic"] == f"{seq}x768 of 1024x768"
    assert rows["input"]["params"] == 1 * 768 + 768 and rows["out"]["params"] == 768 * 2 + 2
    assert rows["attn"]["params"] == 12 * (768 * 3 * 768 + 3 * 768 + 768 * 768 + 768)
    assert rows["ff"]["params"] == 12 * (768 * 3072 + 3072 + 3072 * 768 + 768)
    assert [r["trainable"] for r in rows.values()] == [True, True, True, False, False, True]
    # the FPT of the first 6 blocks (--blocks 6) trains and counts only those blocks' parameters
    half = {r["group"]: r for r in param_counts(FPT(get_task("bit_xor").spec, backbone, blocks=6, seed=0))}
    assert (
        half["ln"]["arithmetic"] == "6 x (4 x 768) + 2 x 768"
        and half["ln"]["params"] == 6 * 4 * 768 + 2 * 768
    )
    assert half["attn"]["params"] == rows["attn"]["params"] // 2
    # no block run (--blocks 0): no position reads another, so only the readout's rows of the table get a gradient
    spec = get_task("bit_xor").spec
    none = {r["group"]: r for r in param_counts(FPT(spec, backbone, blocks=0, seed=0))}
    assert none["pos"]["params"] == spec.n_readout * 768 and none["ln"]["arithmetic"] == "2 x 768"


def test_only_selected_groups_change(tiny_gpt2, home):
    task = get_task("bit_xor", **XOR_OPTS)
    model = FPT(task.spec, load_backbone(str(tiny_gpt2), 0), blocks=2, seed=0)
    params, notes = select_trainable(model, ("ln", "out"))
    assert not notes
    groups = model.groups()
    chosen = {id(p) for g in ("ln", "out") for p in groups[g]}
    assert {id(p) for p in params} == chosen
    assert all(p.requires_grad == (id(p) in chosen) for p in model.parameters())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = task.load("train", home)
    from reservoir.train import batch_tensors
    from reservoir.train.step import optimizer

    model.train()
    train_step(
        model, params, optimizer(params, 1e-2), batch_tensors(task, data, np.arange(16)), "float32", 1.0
    )
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    names = {id(p): n for n, p in model.named_parameters()}
    assert changed == {names[i] for i in chosen}


def test_lstm_skips_groups_it_does_not_have_and_rejects_unknown_ones():
    task = get_task("bit_xor")
    model = FPT(task.spec, load_backbone("lstm", 0), blocks=3, seed=0)
    params, notes = select_trainable(model, ("input", "pos", "ln", "out"))
    assert any("'ln'" in n for n in notes) and any("'pos'" in n for n in notes)
    assert sum(p.numel() for p in params) == (768 + 768) + (768 * 2 + 2)
    with pytest.raises(ValueError, match=r"unknown trainable group 'norms'; choose from \[.*'lstm'"):
        select_trainable(model, ("norms",))


def test_dropout_active_in_train_and_off_in_eval(tiny_gpt2):
    task = get_task("bit_xor", **XOR_OPTS)
    model = FPT(task.spec, load_backbone(str(tiny_gpt2), 0), blocks=2, seed=0, dropout=0.1)
    assert all(m.p == 0.1 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    tokens = torch.from_numpy(task.encode(task.load("test", Path("."), 8).inputs))
    lengths = torch.full((8,), 10)
    model.eval()
    assert torch.equal(model(tokens, lengths), model(tokens, lengths))
    model.train()
    assert not torch.equal(model(tokens, lengths), model(tokens, lengths))


def test_validation_split_is_seeded_and_disjoint(home):
    task = get_task("digits")
    a = load_data(task, TrainConfig("digits", "lstm", val_fraction=0.2, seed=0, data_dir=home))
    b = load_data(task, TrainConfig("digits", "lstm", val_fraction=0.2, seed=0, data_dir=home))
    c = load_data(task, TrainConfig("digits", "lstm", val_fraction=0.2, seed=1, data_dir=home))
    full = task.load("train", home)
    assert len(a.train) + len(a.val) == len(full) and len(a.val) == round(0.2 * len(full))
    rows = {x.tobytes() for x in a.train.inputs}
    assert not any(x.tobytes() in rows for x in a.val.inputs)  # digits has no duplicate images across them
    assert np.array_equal(a.val.inputs, b.val.inputs) and not np.array_equal(a.val.inputs, c.val.inputs)
    assert np.array_equal(a.test.labels, task.load("test", home).labels)  # test is never touched


def test_evaluate_scores_every_example_of_the_split():
    """No dropped last batch: 37 examples in batches of 16 score exactly like one batch of 37."""
    task = get_task("bit_xor")
    d = task.load("test", Path("."), 37)
    calls = []

    def forward(tokens, lengths):  # predicts bit 1 everywhere
        calls.append(len(tokens))
        return torch.stack([torch.zeros(len(tokens), 5, 1), torch.ones(len(tokens), 5, 1)], dim=-1)

    acc = evaluate(forward, task, d, 16, "float32")
    assert calls == [16, 16, 5]
    assert acc == pytest.approx(d.labels.mean())


def test_patience_counts_a_falling_validation_loss_as_progress(tiny_gpt2, home, monkeypatch):
    """Bit XOR's 75% plateau: validation accuracy flat while the loss falls 1% a pass is progress (the
    run goes on to solve it); a loss falling less than 0.1% a pass is not, and patience stops the run (the
    training loss's own trend, tests/train/test_loop_stopping.py, is held flat here)."""
    from reservoir.train import run as one_run

    monkeypatch.setattr(one_run, "loss_falling", lambda losses: False)
    falling = [0.5 * 0.99**i for i in range(12)]
    flat = [falling[-1] * (1 - 1e-4 * i) for i in range(1, 30)]
    passes = iter(falling + flat)
    monkeypatch.setattr(one_run, "scores", lambda *args, **kw: (0.75, next(passes)))
    result = train(
        xor_cfg(tiny_gpt2, home, steps=40, eval_every=1, patience=3, checkpoint_every=0), progress=False
    )
    run = result["runs"][0]
    assert run["steps"] == 12 + 3 and run["best_step"] == 1
    assert run["stop_reason"] == (
        "no validation accuracy 0.1 points higher, no validation loss 0.1% lower and no "
        "falling training loss in 3 validation passes"
    )
    assert [h["val_loss"] for h in run["history"]] == falling + flat[:3]


@pytest.mark.parametrize("rise, steps", [(0.0003, 4), (0.0006, 12)])
def test_patience_counts_accuracy_progress_of_a_tenth_of_a_point(tiny_gpt2, home, monkeypatch, rise, steps):
    """A plateau scored over many outputs: records of 0.03 points a pass are noise, and patience (3) stops
    the run at its fourth pass, on the last record; a creep of 0.06 a pass adds up to 0.1 points every
    second pass, is progress, and runs to --steps (12). The losses are flat throughout."""
    from reservoir.train import run as one_run

    monkeypatch.setattr(one_run, "loss_falling", lambda losses: False)

    accuracies = iter([0.7 + rise * i for i in range(20)])
    monkeypatch.setattr(one_run, "scores", lambda *args, **kw: (next(accuracies), 0.5))
    result = train(
        xor_cfg(tiny_gpt2, home, steps=12, eval_every=1, patience=3, checkpoint_every=0), progress=False
    )
    run = result["runs"][0]
    assert run["steps"] == steps and run["best_step"] == steps
    assert run["stop_reason"].startswith("no validation accuracy" if steps == 4 else "reached --steps")


def test_zero_position_parameters_are_drawn_so_zero_tokens_keep_gradients_finite(tmp_path):
    """A Llama has no biases and gets added positions that start at zero (extraction: the model's own
    states); bit XOR's 0 bits are all-zero input tokens. Left at zero, their states stay zero and
    RMSNorm's derivative there (1/sqrt(eps) a norm) blows the gradient up (inf at SmolLM2's 30 blocks);
    the FPT draws the zero positions, seeded, and the gradient is of order 1."""
    from reservoir.train.data import batch_tensors
    from reservoir.train.step import loss_and_correct
    from tests.zoo import save_tiny

    folder = save_tiny("llama", tmp_path / "llama")
    task = get_task("bit_xor")
    data = task.load("train", tmp_path, 16)

    def build(seed, keep_zero=False):
        backbone = load_backbone(str(folder))
        (pos,) = backbone.param_groups()["pos"]
        assert not pos.any()  # as loaded: zero
        model = FPT(task.spec, backbone, blocks=backbone.n_layers, seed=seed, dropout=0.0)
        if keep_zero:
            with torch.no_grad():
                pos.zero_()
        return model, pos

    def grad_norm(model):
        params, _ = select_trainable(model, ("input", "pos", "ln", "out"))
        loss, _ = loss_and_correct(
            model(*batch_tensors(task, data, np.arange(16))[:2]), batch_tensors(task, data, np.arange(16))[2]
        )
        loss.backward()
        return float(torch.nn.utils.clip_grad_norm_(params, float("inf")))

    (a, pos_a), (_, pos_b), (_, pos_c) = build(0), build(0), build(1)
    assert (
        float(pos_a.detach().std()) == pytest.approx(0.02, rel=0.05)
        and torch.equal(pos_a, pos_b)
        and not torch.equal(pos_a, pos_c)
    )
    assert grad_norm(a) < 100 < 1000 < grad_norm(build(0, keep_zero=True)[0])


def test_train_writes_a_result_in_the_shared_schema(tiny_gpt2, home, cli):
    r = cli(
        "-q",
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--task-opt",
        "n_train=512",
        "--task-opt",
        "n_test=256",
        "--steps",
        "20",
        "--eval-every",
        "10",
        "--batch-size",
        "16",
        "--checkpoint-dir",
        str(home / "ckpt"),
    )
    assert r.exit_code == 0, r.output
    assert "12 x" not in r.output and "2 x (4 x 32) + 2 x 32" in r.output  # the tiny model's layer norms
    path = Path(r.output.strip().splitlines()[-1])
    result = json.loads(path.read_text())
    from reservoir.results import REQUIRED

    assert set(REQUIRED) <= set(result)
    assert result["mode"] == "end-to-end" and result["head"] == "linear" and result["depth"] == 2
    assert result["identity"]["backbone"] == tiny_gpt2.name and len(result["identity_hash"]) == 10
    assert result["trainable"] == ["input", "pos", "ln", "out"]
    assert (result["n_train"], result["n_val"], result["n_test"]) == (461, 51, 256)
    assert result["runs"][0]["best_step"] in (10, 20) and 0 <= result["test_accuracy"] <= 1
    assert result["config"]["train"]["lr"] == [0.001]


def test_report_puts_end_to_end_beside_output_only(tiny_gpt2, home, cli):
    opts = ["--task-opt", "n_train=256", "--task-opt", "n_test=128"]
    assert cli("-q", "extract", "--task", "bit_xor", "--backbone", str(tiny_gpt2), *opts).exit_code == 0
    assert (
        cli("-q", "fit", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--head", "ridge").exit_code == 0
    )
    r = cli(
        "-q",
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        *opts,
        "--steps",
        "10",
        "--eval-every",
        "10",
        "--checkpoint-dir",
        str(home / "ckpt"),
    )
    assert r.exit_code == 0, r.output
    for layout in ("depth", "task"):
        table = cli("report", "--layout", layout).output
        assert f"| {tiny_gpt2.name} | ridge |" in table  # output-only, at the depth chosen on validation
        assert f"| {tiny_gpt2.name} [input,pos,ln,out] | linear |" in table  # end to end, beside it
        assert "| baseline: majority class | rule |" in table


def test_bad_options_exit_2_while_parsing_and_1_after(tiny_gpt2, home, cli):
    r = cli("train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--lr", "1e-3,fast")
    assert r.exit_code == 2 and "'1e-3,fast' must be a comma-separated list of float values" in r.output
    r = cli("train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--depth", "3", "--steps", "1")
    assert r.exit_code == 2 and "--depth was renamed --blocks" in r.output
    r = cli("train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--trainable", "input,norms")
    assert r.exit_code == 2 and "unknown trainable group 'norms'" in r.output
    r = cli("train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--blocks", "3", "--steps", "1")
    assert r.exit_code == 1 and f"--blocks 3: backbone {tiny_gpt2} has 2 blocks; choose 0 to 2" in r.output
    r = cli("train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--lr", "1e-3,1e-3")
    assert r.exit_code == 2 and "The 'lr' parameter of train must be distinct values" in r.output
    assert "Traceback" not in r.output


def test_sweep_selects_on_validation_and_reports_spread(tiny_gpt2, home):
    cfg = xor_cfg(tiny_gpt2, home, lr=(1e-5, 1e-2), seeds=2, steps=20)
    result = train(cfg, progress=False)
    sweep = result["sweep"]
    assert set(sweep) == {"1e-05", "0.01"}
    best = max(sweep, key=lambda k: sweep[k]["val_mean"])
    assert result["lr"] == float(best) and result["val_accuracy"] == sweep[best]["val_mean"]
    chosen = [r for r in result["runs"] if r["lr"] == result["lr"]]
    assert [r["seed"] for r in chosen] == [0, 1] == result["seeds"]
    tests = [r["test_accuracy"] for r in chosen]
    assert result["test_accuracy"] == pytest.approx(np.mean(tests))
    assert result["test_std"] == pytest.approx(np.std(tests, ddof=1))
    assert len(result["runs"]) == 4


def test_a_diverging_learning_rate_is_set_aside_and_the_sweep_goes_on(tiny_gpt2, home, monkeypatch):
    """A sweep's learning rate whose loss stops being finite is recorded as diverged and never
    selected (its other seeds are skipped); alone, or when every rate diverges, it is an error. The runs train one
    after another, through ``train_step`` (runs trained together: tests/train/test_batched.py)."""
    from reservoir.train import run as one_run

    real = one_run.train_step

    def step(forward, params, opt, *args):  # the loss of a run at a learning rate above 1 is NaN
        nan = torch.tensor(float("nan"))
        return (nan, nan) if opt.param_groups[0]["lr"] > 1 else real(forward, params, opt, *args)

    monkeypatch.setattr(one_run, "train_step", step)
    one = dict(concurrent_runs=1, steps=10)
    result = train(xor_cfg(tiny_gpt2, home, lr=(1e-3, 50.0), seeds=2, **one), progress=False)
    assert result["lr"] == 1e-3 and "training loss became nan at step 1" in result["sweep"]["50"]["diverged"]
    assert [r["lr"] for r in result["runs"]] == [1e-3, 1e-3]  # the diverged rate's second seed never ran
    with pytest.raises(Diverged, match="training loss became nan at step 1; lower --lr"):
        train(xor_cfg(tiny_gpt2, home, lr=(50.0,), **one), progress=False)
    with pytest.raises(DataError, match=r"every learning rate of the sweep diverged \(50, 60\)"):
        train(xor_cfg(tiny_gpt2, home, lr=(50.0, 60.0), **one), progress=False)


class Killed(Exception):
    pass


def whole_and_killed(cfg, task, data, home, at: int = 27):
    """The run of ``cfg`` at lr 3e-3, seed 0, whole (checkpoints in ``home/a``), and the same run killed at step
    ``at`` (``home/b``); returns the whole run's result and the killed run's config, to resume."""
    whole = train_run(
        dataclasses.replace(cfg, checkpoint_dir=home / "a"), task, data, lr=3e-3, seed=0, progress=False
    )

    def kill(step):
        if step == at:
            raise Killed

    cut = dataclasses.replace(cfg, checkpoint_dir=home / "b")
    with pytest.raises(Killed):
        train_run(cut, task, data, lr=3e-3, seed=0, progress=False, on_step=kill)
    return whole, cut


def test_killed_run_resumes_to_identical_metrics_and_weights(tiny_gpt2, home):
    """Dropout on, checkpoint every 10 steps, killed at step 27: resume redoes 21..27 and ends identically."""
    task = get_task("bit_xor", **XOR_OPTS)
    cfg = xor_cfg(tiny_gpt2, home, steps=40, dropout=0.1, lr=(3e-3,))
    data = load_data(task, cfg)
    whole, cut = whole_and_killed(cfg, task, data, home)
    ckpt = torch.load(home / "b" / Path(whole["checkpoint"]).name, weights_only=False)
    assert ckpt["state"]["step"] == 20  # at most the steps since the last checkpoint are lost
    assert not list((home / "b").glob("*.tmp"))
    resumed = train_run(dataclasses.replace(cut, resume=True), task, data, lr=3e-3, seed=0, progress=False)
    for key in ("test_accuracy", "val_accuracy", "best_step", "steps", "history"):
        assert resumed[key] == whole[key], key
    a = torch.load(whole["checkpoint"], weights_only=False)
    b = torch.load(resumed["checkpoint"], weights_only=False)
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    assert all(torch.equal(x, y) for x, y in zip(a["state"]["best_params"], b["state"]["best_params"]))


def xor_whole(tiny_gpt2, home):
    """``(task, cfg, data, result)``: bit XOR for 30 steps at lr 3e-3, seed 0, run whole (checkpoints in
    ``home/a``), the run others are held against."""
    task = get_task("bit_xor", **XOR_OPTS)
    cfg = xor_cfg(tiny_gpt2, home, steps=30, lr=(3e-3,))
    data = load_data(task, cfg)
    whole = train_run(
        dataclasses.replace(cfg, checkpoint_dir=home / "a"), task, data, lr=3e-3, seed=0, progress=False
    )
    return task, cfg, data, whole


def test_resume_with_more_steps_extends_a_finished_run(tiny_gpt2, home):
    task, cfg, data, whole = xor_whole(tiny_gpt2, home)
    short = dataclasses.replace(cfg, checkpoint_dir=home / "b", steps=20)
    assert train_run(short, task, data, lr=3e-3, seed=0, progress=False)["steps"] == 20
    longer = train_run(
        dataclasses.replace(short, steps=30, resume=True), task, data, lr=3e-3, seed=0, progress=False
    )
    assert longer["steps"] == 30 and longer["history"] == whole["history"]
    assert longer["test_accuracy"] == whole["test_accuracy"]


def test_resume_with_more_steps_past_a_pass_off_the_schedule_equals_the_whole_run(tiny_gpt2, home):
    """A 25-step run validates at its last step, off the every-10 schedule; continued to 30 steps it takes that
    pass back (history, best step, patience, pending losses), so it ends as the whole 30-step run does."""
    task, cfg, data, whole = xor_whole(tiny_gpt2, home)
    short = dataclasses.replace(cfg, checkpoint_dir=home / "b", steps=25, patience=2)
    first = train_run(short, task, data, lr=3e-3, seed=0, progress=False)
    assert [h["step"] for h in first["history"]] == [10, 20, 25]
    longer = train_run(
        dataclasses.replace(short, steps=30, resume=True), task, data, lr=3e-3, seed=0, progress=False
    )
    fresh = dataclasses.replace(cfg, checkpoint_dir=home / "c", patience=2)
    fresh = train_run(fresh, task, data, lr=3e-3, seed=0, progress=False)
    for key in ("history", "best_step", "val_accuracy", "test_accuracy", "stop_reason", "steps"):
        assert longer[key] == fresh[key], key
    a = torch.load(longer["checkpoint"], weights_only=False)["state"]
    b = torch.load(fresh["checkpoint"], weights_only=False)["state"]
    assert all(torch.equal(x, y) for x, y in zip(a["best_params"], b["best_params"]))


def test_auto_dtype_takes_the_faster_training_dtype_and_a_resume_on_another_cpu_continues(
    tiny_gpt2, home, monkeypatch
):
    """``--dtype auto`` resolves per machine from the measured rates (float16 is never a training dtype); the
    identity keeps ``auto``, so a run checkpointed where float32 was faster resumes where bf16 is, and says so."""
    from reservoir.runtime import dtypes

    def rates_of(fast):
        return lambda width=768, threads=None: (
            {"float32": 100.0, "bfloat16": 100.0, "float16": 900.0, fast: 300.0},
            True,
        )

    task = get_task("bit_xor", **XOR_OPTS)
    cfg = xor_cfg(tiny_gpt2, home, steps=20, lr=(3e-3,))
    data = load_data(task, cfg)
    monkeypatch.setattr(dtypes, "measured_rates", rates_of("float32"))
    first = train_run(cfg, task, data, lr=3e-3, seed=0, progress=False)
    assert cfg.dtype == "auto" and first["dtypes"] == ["float32"]
    monkeypatch.setattr(dtypes, "measured_rates", rates_of("bfloat16"))
    said = []
    longer = train_run(
        dataclasses.replace(cfg, steps=30, resume=True),
        task,
        data,
        lr=3e-3,
        seed=0,
        progress=False,
        log=said.append,
    )
    assert longer["steps"] == 30 and longer["dtypes"] == ["float32", "bfloat16"]
    assert any("auto: bfloat16" in line for line in said)
    fixed = train_run(
        dataclasses.replace(cfg, dtype="float32", checkpoint_dir=home / "f"),
        task,
        data,
        lr=3e-3,
        seed=0,
        progress=False,
    )
    assert fixed["dtypes"] == ["float32"] and fixed["history"] == first["history"]
    assert longer["machines"] == first["machines"] and "cores;" in first["machines"][0]  # one CPU, named


def test_resume_refuses_other_settings_and_broken_files(tiny_gpt2, home, cli):
    args = [
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--task-opt",
        "n_train=256",
        "--task-opt",
        "n_test=64",
        "--steps",
        "10",
        "--eval-every",
        "10",
        "--checkpoint-dir",
        str(home / "c"),
    ]
    assert cli("-q", *args).exit_code == 0
    r = cli("-q", *args, "--resume", "--dropout", "0.2")
    assert r.exit_code == 1 and "was written with other settings: dropout: stored 0.1, asked 0.2" in r.output
    (ckpt,) = (home / "c").glob("*.pt")
    obj = torch.load(ckpt, weights_only=False)  # as an earlier version wrote it: one more trainable tensor
    torch.save({**obj, "params": obj["params"] + [torch.zeros(3)]}, ckpt)
    r = cli("-q", *args, "--resume")
    assert (
        r.exit_code == 1 and f"checkpoint {ckpt} holds" in r.output and "delete it to start over" in r.output
    )
    ckpt.write_bytes(b"not a checkpoint")
    r = cli("-q", *args, "--resume")
    assert r.exit_code == 1 and f"checkpoint {ckpt} is unreadable" in r.output and "delete it" in r.output


def test_resume_of_a_run_without_a_checkpoint_says_it_starts_over(tiny_gpt2, home, cli):
    """``--resume`` where a run (another --trainable, here) has no checkpoint trains it from step 0 and says so,
    naming the folder and the other runs' checkpoints there."""
    args = ["train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--task-opt", "n_train=64", "--task-opt",
            "n_test=32", "--steps", "4", "--eval-every", "2", "--checkpoint-dir", str(home / "c")]  # fmt: skip
    assert cli("-q", *args).exit_code == 0
    (first,) = (home / "c").glob("*.pt")
    r = cli(*args, "--resume", "--trainable", "input,attn")
    assert r.exit_code == 0, r.output
    assert f"--resume: no checkpoint of this run in {home / 'c'}, starting at step 0" in r.output
    assert f"(it holds 1 of other runs, e.g. {first.name}: another --lr, --trainable" in r.output
    r = cli(*args, "--resume")
    assert r.exit_code == 0 and "resumed" in r.output and "no checkpoint" not in r.output


def test_resume_with_fewer_steps_than_the_checkpoint_trained_is_refused(tiny_gpt2, home, cli):
    """A checkpoint trained past the --steps asked for is not reported as a run of fewer steps: --resume is
    refused naming both counts, and the checkpoint is kept."""
    args = ["train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--task-opt", "n_train=64", "--task-opt",
            "n_test=32", "--eval-every", "2", "--checkpoint-dir", str(home / "c")]  # fmt: skip
    assert cli("-q", *args, "--steps", "6").exit_code == 0
    (ckpt,) = (home / "c").glob("*.pt")
    before = ckpt.read_bytes()
    r = cli("-q", *args, "--steps", "4", "--resume")
    assert r.exit_code == 1 and f"checkpoint {ckpt} has trained 6 steps, more than --steps 4" in r.output
    assert "pass --steps 6 or more to resume it" in r.output and "Traceback" not in r.output
    assert ckpt.read_bytes() == before


def test_resume_beside_a_checkpoint_of_an_earlier_format_says_so_in_words(tiny_gpt2, home, cli):
    """A checkpoint written by a version with another checkpoint format (format 2: plain Adam, no CUDA generator)
    cannot continue exactly: --resume is refused, naming both formats and the fix, and the old file is kept."""
    from reservoir.train.checkpoint import CHECKPOINT_FORMAT

    args = [
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--task-opt",
        "n_train=256",
        "--task-opt",
        "n_test=64",
        "--steps",
        "10",
        "--eval-every",
        "10",
        "--checkpoint-dir",
        str(home / "c"),
    ]
    assert cli("-q", *args).exit_code == 0
    (ckpt,) = (home / "c").glob("*.pt")
    obj = torch.load(ckpt, weights_only=True)
    obj["identity"]["format"] = 2
    old = ckpt.with_name(ckpt.name.rsplit("-", 1)[0] + "-0123456789.pt")
    torch.save(obj, old)
    ckpt.unlink()
    r = cli("-q", *args, "--resume")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert (
        f"checkpoint {old} was written by another version of reservoir (checkpoint format 2; this version reads "
        f"format {CHECKPOINT_FORMAT}) and cannot be resumed by it; drop --resume to start the run over"
    ) in r.output
    assert old.exists()


def test_tiny_gpt2_learns_bit_xor_above_chance(home):
    """A fast property of the default run: 100 steps take a 1-block GPT-2 well above 50% per bit."""
    from tests.conftest import save_tiny_gpt2

    folder = save_tiny_gpt2(home / "gpt2-1x128", n_layer=1, n_embd=128)
    result = train(
        xor_cfg(
            folder,
            home,
            lr=(3e-3,),
            dropout=0.0,
            steps=100,
            eval_every=50,
            batch_size=64,
            task_options={"n_train": "4000", "n_test": "500"},
        ),
        progress=False,
    )
    assert result["test_accuracy"] > 0.65


@pytest.mark.slow
def test_tiny_gpt2_reaches_100_percent_on_bit_xor(tiny_gpt2, home):
    """The paper's claim (tables 2, 3) on the test fixture: a frozen random GPT-2 solves bit XOR."""
    result = train(
        xor_cfg(
            tiny_gpt2,
            home,
            lr=(1e-2,),
            dropout=0.0,
            steps=3000,
            eval_every=100,
            batch_size=64,
            target=1.0,
            task_options={},
        ),
        progress=False,
    )
    assert result["test_accuracy"] == 1.0 and result["steps_to_target"][0] is not None


@pytest.mark.slow
def test_sigkilled_cli_run_resumes_to_the_same_result(tiny_gpt2, tmp_path):
    """A real kill -9 of `reservoir train` mid-run, then --resume: the result equals an uninterrupted run's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = [
        sys.executable,
        "-m",
        "reservoir",
        "-q",
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--task-opt",
        "n_train=1024",
        "--task-opt",
        "n_test=256",
        "--steps",
        "400",
        "--eval-every",
        "20",
        "--checkpoint-every",
        "20",
        "--patience",
        "0",
        "--batch-size",
        "16",
    ]

    def env(name):
        return {**os.environ, "RESERVOIR_HOME": str(tmp_path / name), "OMP_NUM_THREADS": "1"}

    subprocess.run(args, env=env("whole"), check=True, capture_output=True)
    proc = subprocess.Popen(args, env=env("killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        ckpts = list(folder.rglob("*.pt"))
        if ckpts and torch.load(ckpts[0], weights_only=False)["state"]["step"] >= 100:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed; raise --steps"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    step = torch.load(ckpts[0], weights_only=False)["state"]["step"]
    assert 100 <= step < 400
    subprocess.run(args + ["--resume"], env=env("killed"), check=True, capture_output=True)
    a, b = (
        json.loads(next((tmp_path / n / "results").rglob("*.json")).read_text()) for n in ("whole", "killed")
    )
    for key in ("test_accuracy", "val_accuracy", "best_step", "steps"):
        assert a[key] == b[key], key
    assert a["runs"][0]["history"] == b["runs"][0]["history"]


def test_non_finite_gradients_skip_the_step_on_the_device_and_the_next_read_names_them():
    """A step whose gradient norm is NaN returns without waiting for the device and leaves parameters and Adam's
    moments and step count as they were; the read of its loss and norm names the step and blames the backward
    pass, not the learning rate (a NaN loss is blamed on the learning rate)."""
    from reservoir.train.step import Diverged, optimizer, read_steps, train_step

    layer = torch.nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.2, 0.2]]))
        layer.bias.zero_()
    params = list(layer.parameters())
    opt = optimizer(params, 1e-2)
    forward = lambda tokens, lengths: layer(tokens)[:, None, None, :]  # noqa: E731  (B, readout, outputs, classes)
    batch = (torch.ones(4, 3), torch.full((4,), 1), torch.zeros(4, 1, 1, dtype=torch.long))
    steps = [train_step(forward, params, opt, batch, "float32", 1.0)]
    before = [p.detach().clone() for p in params]
    exp_avg = opt.state[layer.weight]["exp_avg"].clone()
    hook = layer.weight.register_hook(lambda g: g * float("nan"))
    steps.append(train_step(forward, params, opt, batch, "float32", 1.0))
    assert all(isinstance(t, torch.Tensor) for t in steps[1]) and steps[1][1].isnan()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert (
        torch.equal(opt.state[layer.weight]["exp_avg"], exp_avg)
        and float(opt.state[layer.weight]["step"]) == 1
    )
    hook.remove()
    steps.append(train_step(forward, params, opt, batch, "float32", 1.0))
    assert float(opt.state[layer.weight]["step"]) == 2 and not torch.equal(layer.weight, before[0])
    assert read_steps(steps[:1], 0, "[run]", 1e-2) == [pytest.approx(float(steps[0][0]))]
    # logits 0.3 and 0.6 for class 0 and 1; Adam's first step (0.01 a parameter) closes the gap by 0.08
    assert float(steps[1][0]) == pytest.approx(math.log1p(math.exp(0.22)), abs=1e-4)
    said = (
        r"^\[run\] the gradients are not finite at step 42 \(gradient norm nan with a finite loss "
        rf"{float(steps[1][0]):.4g}\): with a finite loss this is an overflow"
    )
    with pytest.raises(Diverged, match=said):
        read_steps(steps, 40, "[run]", 1e-2)
    nan = torch.tensor(float("nan"))
    with pytest.raises(Diverged, match=r"the training loss became nan at step 2; lower --lr \(now 0\.01\)"):
        read_steps([steps[0], (nan, nan)], 0, "[run]", 1e-2)


@pytest.mark.parametrize("limit, held, left, classes", [("3", 1, 2, 3), ("60", 6, 54, 10)])
def test_data_too_small_to_train_on_is_refused_up_front_naming_limit(cli, home, limit, held, left, classes):
    r = cli("train", "--task", "digits", "--backbone", "lstm", "--limit", limit, "--steps", "2")
    assert r.exit_code == 1, r.output
    assert (
        f"task 'digits': the train split has {limit} examples of {classes} classes; holding out --val-fraction "
        f"0.1 leaves {held} for validation and {left} to train on, fewer than one per class for validation: pass --limit 95 or more "
        f"(now {limit})"
    ) in r.output
    assert "Traceback" not in r.output and "test_size" not in r.output
    assert not (home / "results").exists() and not (home / "checkpoints").exists()


def test_the_smallest_limit_named_trains(cli, home):
    r = cli(
        "-q",
        "train",
        "--task",
        "digits",
        "--backbone",
        "lstm",
        "--limit",
        "95",
        "--steps",
        "2",
        "--eval-every",
        "2",
        "--checkpoint-every",
        "0",
    )
    assert r.exit_code == 0, r.output


def test_a_single_class_train_split_is_refused(cli, home, tmp_path):
    import numpy as np

    path = tmp_path / "one.npz"
    np.savez(
        path,
        x=np.random.rand(40, 4, 2).astype("float32"),
        y=np.zeros(40, dtype=int),
        split=np.array(["train"] * 30 + ["test"] * 10),
    )
    r = cli("train", "--task", f"file:{path}", "--backbone", "lstm", "--steps", "2")
    assert r.exit_code == 1 and "the train split holds a single class in its 30 examples" in r.output
    assert not (home / "results").exists() and not (home / "checkpoints").exists()


def test_split_roles_come_from_the_task_so_tapes_valid_and_test_holdouts_train():
    """Remote homology has no ``val`` or ``test`` split: its validation split is ``valid`` and its
    test splits the ``test_*`` holdouts; training loads them by the roles the task declares."""
    import numpy as np

    from reservoir.config import TrainConfig
    from reservoir.tasks import SplitData, get_task, split_roles
    from reservoir.train.data import load_data

    task = get_task("remote_homology")
    assert task.spec.roles == (
        "valid",
        ("test_fold_holdout", "test_superfamily_holdout", "test_family_holdout"),
    )
    assert split_roles(("train", "val", "valid", "test")) == ("val", ("test",))
    asked = []

    def load(split, data_dir, limit=None, seed=0):
        asked.append(split)
        rng = np.random.default_rng(len(asked))
        return SplitData(rng.integers(1, 20, (40, 8)), np.arange(40) % 4, np.full(40, 8))

    task.load = load
    data = load_data(task, TrainConfig(task="remote_homology", backbone="lstm"))
    assert asked == ["train", "test_fold_holdout", "valid"]
    assert (data.val_name, data.test_name) == ("valid", "test_fold_holdout")


def test_stop_at_ends_a_run_once_validation_reaches_it_and_a_resume_may_lower_it(tiny_gpt2, home):
    """--stop-at stops at the first validation pass at or above it; resuming a run whose best validation already
    reached a lower --stop-at ends it there; results of other --steps or --stop-at never share a file."""
    task = get_task("bit_xor", **XOR_OPTS)
    cfg = xor_cfg(tiny_gpt2, home, steps=40, lr=(3e-3,), stop_at=0.05)
    data = load_data(task, cfg)
    run = train_run(cfg, task, data, lr=3e-3, seed=0, progress=False)
    assert run["steps"] == 10 and run["stop_reason"] == "validation accuracy reached 5%"
    whole = train_run(
        dataclasses.replace(cfg, stop_at=1.0, checkpoint_dir=home / "b", steps=20),
        task,
        data,
        lr=3e-3,
        seed=0,
        progress=False,
    )
    best = whole["val_accuracy"]
    lowered = train_run(
        dataclasses.replace(cfg, stop_at=best, checkpoint_dir=home / "b", steps=40, resume=True),
        task,
        data,
        lr=3e-3,
        seed=0,
        progress=False,
    )
    assert lowered["steps"] == 20 and lowered["stop_reason"] == f"validation accuracy reached {100 * best:g}%"
    paths = {
        train(dataclasses.replace(cfg, **kw), progress=False)["path"]
        for kw in ({}, {"stop_at": 0.5}, {"steps": 30})
    }
    assert len(paths) == 3


def test_a_checkpoint_written_before_the_pass_off_the_schedule_was_kept_still_resumes(tiny_gpt2, home):
    """A checkpoint whose run state lacks ``before_last_pass`` (written before it was kept) resumes; one whose
    value there is not a dict of the state's values is refused as not what train writes."""
    from reservoir.errors import DataError

    task, cfg, data, whole = xor_whole(tiny_gpt2, home)
    path = Path(whole["checkpoint"])
    obj = torch.load(path, weights_only=True)
    del obj["state"]["before_last_pass"]
    torch.save(obj, path)
    again = dataclasses.replace(cfg, checkpoint_dir=home / "a", resume=True)
    assert train_run(again, task, data, lr=3e-3, seed=0, progress=False)["history"] == whole["history"]
    obj["state"]["before_last_pass"] = {"best_params": ["not a tensor"]}
    torch.save(obj, path)
    with pytest.raises(DataError, match="before the last validation pass"):
        train_run(again, task, data, lr=3e-3, seed=0, progress=False)


@pytest.fixture
def tick(monkeypatch):
    """A clock of training that moves one second each time ``tick(step)`` is called (an ``on_step``)."""
    from reservoir.train import run as one_run

    now = [0.0]
    monkeypatch.setattr(one_run, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])}))

    def tick(step):
        now[0] += 1.0

    return tick


def test_max_time_stops_a_run_on_time_with_a_validation_pass_and_a_resume_with_more_time_continues_it(
    tiny_gpt2, home, tick
):
    """A clock that moves one second a step: --max-time 15 stops at step 15, after a validation pass there, and
    says so; resumed with --max-time 30 the run continues to step 30 and ends as the whole run does."""
    task, cfg, data, whole = xor_whole(tiny_gpt2, home)
    cut = dataclasses.replace(cfg, checkpoint_dir=home / "b", max_time=15)
    first = train_run(cut, task, data, lr=3e-3, seed=0, progress=False, on_step=tick)
    assert first["steps"] == 15 and first["stop_reason"] == "reached --max-time 15 s at step 15"
    assert [h["step"] for h in first["history"]] == [10, 15]
    more = dataclasses.replace(cut, max_time=30, resume=True)
    resumed = train_run(more, task, data, lr=3e-3, seed=0, progress=False, on_step=tick)
    # the pass at the cut is taken back: the resumed run is the whole run
    assert resumed["steps"] == 30 and resumed["history"] == whole["history"]
    assert resumed["test_accuracy"] == whole["test_accuracy"] and resumed["best_step"] == whole["best_step"]
    with pytest.raises(ValueError, match="max_time"):
        dataclasses.replace(cfg, max_time=0)


def test_a_pass_at_a_max_time_cut_stops_no_run_by_its_rules(tiny_gpt2, home, tick):
    """The pass at a --max-time cut is off the schedule: where it reaches a --stop-at the pass before it did not,
    the run is still cut on time (not solved), and resumed with more time it ends as the whole run at that
    --stop-at ends."""
    task, cfg, data, _ = xor_whole(tiny_gpt2, home)
    probe = dataclasses.replace(cfg, checkpoint_dir=home / "p", max_time=15)
    probe = train_run(probe, task, data, lr=3e-3, seed=0, progress=False, on_step=tick)
    val = {h["step"]: h["val_accuracy"] for h in probe["history"]}
    assert val[15] > val[10]  # what makes the cut pass the first to reach --stop-at below
    at = dataclasses.replace(cfg, stop_at=val[15])
    runs = {
        name: dataclasses.replace(at, checkpoint_dir=home / name, max_time=max_time)
        for name, max_time in (("whole", None), ("cut", 15))
    }
    whole = train_run(runs["whole"], task, data, lr=3e-3, seed=0, progress=False, on_step=tick)
    cut = train_run(runs["cut"], task, data, lr=3e-3, seed=0, progress=False, on_step=tick)
    assert cut["steps"] == 15 and cut["stop_reason"] == "reached --max-time 15 s at step 15"
    more = dataclasses.replace(runs["cut"], max_time=100, resume=True)
    resumed = train_run(more, task, data, lr=3e-3, seed=0, progress=False, on_step=tick)
    for key in ("history", "steps", "best_step", "stop_reason", "test_accuracy"):
        assert resumed[key] == whole[key], key


def test_a_max_time_no_step_fits_in_validates_the_start_quietly(tiny_gpt2, home):
    """Cut before its first step, a run validates its starting parameters: no training loss to average (NaN),
    and no library warning about an empty mean reaches the terminal."""
    import warnings

    task = get_task("bit_xor", **XOR_OPTS)
    cfg = xor_cfg(tiny_gpt2, home, max_time=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = train_run(cfg, task, load_data(task, cfg), lr=3e-3, seed=0, progress=False)
    assert result["steps"] == 0 and [h["step"] for h in result["history"]] == [0]
    assert np.isnan(result["history"][0]["loss"]) and result["stop_reason"].startswith("reached --max-time")


def test_progress_shows_a_bar_of_steps_between_whole_validation_lines(tiny_gpt2, home, capsys):
    """A run's progress counts its steps (a step of a large model takes seconds, and validation passes are far
    apart); piped, the bar and the validation lines come out as whole lines, and a resumed run counts from its
    checkpoint's step; with progress off nothing is written."""
    task = get_task("bit_xor", **XOR_OPTS)
    cfg = xor_cfg(tiny_gpt2, home, steps=20)
    data = load_data(task, cfg)
    train_run(cfg, task, data, lr=1e-3, seed=0, progress=True)
    lines = capsys.readouterr().err.splitlines()
    bars = [ln for ln in lines if ln.startswith("[lr=0.001 seed=0] training:")]
    assert bars and "20/20" in bars[-1] and "step" in bars[-1]
    assert any(ln.startswith("[lr=0.001 seed=0] step 10/20: loss ") for ln in lines)
    assert not any("\r" in ln or "\x1b" in ln for ln in lines)
    train_run(dataclasses.replace(cfg, steps=30, resume=True), task, data, lr=1e-3, seed=0, progress=True)
    bars = [ln for ln in capsys.readouterr().err.splitlines() if "training:" in ln]
    assert bars[0].split("|")[-1].strip().startswith("20/30") and "30/30" in bars[-1]
    train_run(
        dataclasses.replace(cfg, checkpoint_dir=home / "quiet"), task, data, lr=1e-3, seed=0, progress=False
    )
    assert capsys.readouterr().err == ""


def test_batches_are_built_one_step_ahead_on_a_worker_thread_and_pinned_only_for_cuda(monkeypatch):
    """Each step's batch is the rows of its epoch's seeded order, built on another thread than the caller's while
    the step before it runs (taking step s has already asked for step s + 1); pinned only for a CUDA device."""
    import threading

    from reservoir.train import data as run_data

    task = get_task("bit_xor", **XOR_OPTS)
    data = task.load("train", Path("."))
    built = []
    real = run_data.batch_tensors

    def recording(task, d, rows, width=None, inputs=None):
        built.append((threading.current_thread() is threading.main_thread(), rows[0]))
        return real(task, d, rows, width, inputs)

    monkeypatch.setattr(run_data, "batch_tensors", recording)
    with run_data.Batches(task, data, 3, 16, torch.device("cpu")) as batches:
        per_epoch = len(data) // 16
        for step in (0, 1, 2, per_epoch, per_epoch + 1):
            rows = run_data.epoch_order(3, step // per_epoch, len(data))[(step % per_epoch) * 16 :][:16]
            got = batches.take(step)
            assert all(torch.equal(a, b) for a, b in zip(got, real(task, data, rows)))
            assert not any(t.is_pinned() for t in got)
        assert batches.rows(per_epoch).tolist() != batches.rows(0).tolist()  # a new epoch, a new order
    assert not any(on_main for on_main, _ in built)
    # each take started the next step's build: step 3 was built though never taken (the worker builds in order;
    # step per_epoch + 2, asked for last, may be cancelled at close)
    firsts = [
        int(run_data.epoch_order(3, s // per_epoch, len(data))[(s % per_epoch) * 16])
        for s in (0, 1, 2, 3, per_epoch, per_epoch + 1)
    ]
    assert [int(first) for _, first in built[:6]] == firsts and len(built) in (6, 7)
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t)
    with run_data.Batches(task, data, 3, 16, torch.device("cuda", 0)) as batches:
        batches.take(0)
    assert len(pinned) >= 3  # tokens, lengths and labels of step 0


class FakeCuda:
    """torch.cuda's generator functions for a machine without CUDA: one generator state per device index."""

    def __init__(self, monkeypatch):
        self.states = {0: torch.arange(16, dtype=torch.uint8)}
        index = lambda device: torch.device(device).index or 0  # noqa: E731
        monkeypatch.setattr(
            torch.cuda, "get_rng_state", lambda device="cuda": self.states[index(device)].clone()
        )
        monkeypatch.setattr(
            torch.cuda,
            "set_rng_state",
            lambda state, device="cuda": self.states.__setitem__(index(device), state.clone()),
        )


def test_checkpoints_of_a_cuda_run_carry_its_device_generator_and_resume_restores_it(
    tiny_gpt2, home, monkeypatch
):
    """The RNG block of a CUDA run's checkpoint holds the CUDA generator's state beside the CPU's, loads with
    weights_only=True, and load_checkpoint puts both back; a CPU run's block holds the CPU's alone (a fake CUDA
    stands in here; tests/system/test_cuda.py resumes a real CUDA run to the uninterrupted one's history)."""
    from reservoir.train.checkpoint import RunState, load_checkpoint, save_checkpoint
    from reservoir.train.step import optimizer

    fake = FakeCuda(monkeypatch)
    cuda = torch.device("cuda", 0)
    params = [torch.nn.Parameter(torch.ones(3))]
    opt = optimizer(params, 1e-3)
    identity = {
        "task": "bit_xor",
        "backbone": "b",
        "backbone_fingerprint": "f",
        "input_scale": "paper",
        "task_options": {},
        "trainable": ["out"],
        "blocks": 1,
        "run_seed": 0,
    }  # what the readers check
    save_checkpoint(home / "gpu.pt", params, opt, RunState(step=5), identity, cuda)
    save_checkpoint(home / "cpu.pt", params, opt, RunState(step=5), identity, torch.device("cpu"))
    gpu = torch.load(home / "gpu.pt", weights_only=True)
    assert set(gpu["rng"]) == {"torch", "cuda"} and torch.equal(gpu["rng"]["cuda"], fake.states[0])
    assert set(torch.load(home / "cpu.pt", weights_only=True)["rng"]) == {"torch"}
    saved_cpu = torch.get_rng_state()
    fake.states[0] = torch.zeros(16, dtype=torch.uint8)
    torch.rand(3)
    assert load_checkpoint(home / "gpu.pt", params, opt, identity, cuda).step == 5
    assert torch.equal(fake.states[0], torch.arange(16, dtype=torch.uint8))
    assert torch.equal(torch.get_rng_state(), saved_cpu)


def test_generator_states_round_trip_on_the_cpu_and_a_run_forks_its_generators():
    """The helper a checkpoint uses gathers the CPU generator's state and restores it (the draws after equal the
    draws before); run_generators seeds the run's generator from its seed and gives the caller's back untouched."""
    from reservoir.train.seeds import derive, generator_states, run_generators, set_generator_states

    cpu = torch.device("cpu")
    states = generator_states(cpu)
    assert set(states) == {"torch"}
    first = torch.rand(4)
    set_generator_states(states, cpu)
    assert torch.equal(torch.rand(4), first)
    before = torch.get_rng_state()
    with run_generators(7, cpu):
        inside = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(inside, torch.rand(4, generator=torch.Generator().manual_seed(derive(7, "dropout"))))


@pytest.mark.parametrize(
    "capability, emulated_only, dtype", [((7, 5), True, "float32"), ((8, 0), False, "bfloat16")]
)
def test_auto_trains_in_bf16_only_on_a_card_that_multiplies_it_natively(
    monkeypatch, capability, emulated_only, dtype
):
    """A Turing card (7.5) runs bf16 only emulated, slower than float32 (torch's is_bf16_supported() still says
    yes): --dtype auto trains in float32 there and in bf16 on an Ampere (8.0); an explicit bf16 on the emulating
    card runs as asked and the log says it is emulated."""
    from reservoir.train.step import train_dtype

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Card")
    monkeypatch.setattr(
        torch.cuda,
        "is_bf16_supported",
        lambda including_emulation=True: including_emulation or not emulated_only,
    )
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    said = []
    assert train_dtype("auto", torch.device("cuda", 0), 64, said.append, "[run]") == dtype
    assert said and said[0].startswith("[run] auto on CUDA (Card")
    said.clear()
    assert train_dtype("bfloat16", torch.device("cuda", 0), 64, said.append, "[run]") == "bfloat16"
    assert said == (
        ["[run] --dtype bfloat16: Card emulates bf16, slower than float32; --dtype auto runs float32 on it"]
        if emulated_only
        else []
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_training_step_on_cuda_never_synchronises_the_host(tiny_gpt2):
    """torch's sync debug mode turns every host synchronisation into an error: a step (pinned batch, forward,
    backward, clipping, fused Adam with found_inf) runs under it."""
    from reservoir.train.data import Batches
    from reservoir.train.step import optimizer

    task = get_task("bit_xor", **XOR_OPTS)
    model = FPT(task.spec, load_backbone(str(tiny_gpt2), 0), blocks=2, seed=0).cuda()
    params, _ = select_trainable(model, ("input", "pos", "ln", "out"))
    opt = optimizer(params, 1e-3)
    model.train()
    with Batches(task, task.load("train", Path(".")), 0, 16, torch.device("cuda")) as batches:
        train_step(
            model, params, opt, batches.take(0), "float32", 1.0
        )  # the first step initialises Adam's state
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for step in range(1, 4):
                loss, norm = train_step(model, params, opt, batches.take(step), "float32", 1.0)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert loss.is_cuda and norm.is_cuda and torch.isfinite(loss)


def test_a_resume_under_another_stop_at_ends_where_a_fresh_run_at_it_ends_or_is_refused(tiny_gpt2, home):
    """A run stopped by --stop-at 5% and resumed at 100% trains on to the fresh 100% run's result; a run resumed at
    a --stop-at its validation passed before its last step (a fresh run stops there, where no parameters were kept)
    is refused in words, not ended at its last step as solved."""
    from reservoir.errors import IdentityError

    task = get_task("bit_xor", **XOR_OPTS)
    cfg = xor_cfg(tiny_gpt2, home, steps=30, lr=(3e-3,), stop_at=0.05)
    data = load_data(task, cfg)
    stopped = train_run(cfg, task, data, lr=3e-3, seed=0, progress=False)
    assert stopped["steps"] == 10
    fresh = train_run(
        dataclasses.replace(cfg, stop_at=1.0, checkpoint_dir=home / "fresh"),
        task,
        data,
        lr=3e-3,
        seed=0,
        progress=False,
    )
    raised = train_run(
        dataclasses.replace(cfg, stop_at=1.0, resume=True), task, data, lr=3e-3, seed=0, progress=False
    )
    for key in ("steps", "best_step", "stop_reason", "test_accuracy", "history"):
        assert raised[key] == fresh[key], key
    first = fresh["history"][0]["val_accuracy"]
    with pytest.raises(IdentityError, match=r"at step 10, before its step 30: a run at --stop-at"):
        train_run(
            dataclasses.replace(cfg, stop_at=first, resume=True), task, data, lr=3e-3, seed=0, progress=False
        )


def test_a_result_cut_by_max_time_is_kept_apart_from_the_whole_runs(tiny_gpt2, home, tick):
    """A sweep --max-time cut short writes its result beside the whole sweep's, never over it (one setting and
    seed otherwise); the result says the time it ran under."""
    cfg = xor_cfg(tiny_gpt2, home, steps=20, lr=(3e-3,))
    whole = train(cfg, progress=False)
    cut = train(
        dataclasses.replace(cfg, checkpoint_dir=home / "cut", max_time=5), progress=False, on_step=tick
    )
    assert cut["steps"] == [5] and cut["identity"]["max_time"] == 5 and "max_time" not in whole["identity"]
    assert cut["path"] != whole["path"] and Path(whole["path"]).exists()


def test_the_summary_of_a_sweep_with_a_diverged_rate_names_it(tiny_gpt2, home, monkeypatch):
    """A sweep whose rate diverged prints its table with that rate marked diverged (it raised a KeyError after
    writing the result)."""
    from reservoir.train.loop import summary
    from reservoir.train.step import optimize as real

    def optimize(params, opt, grad_clip):
        norm = real(params, opt, grad_clip)
        return torch.full_like(norm, float("inf")) if opt.param_groups[0]["lr"] > 1 else norm

    monkeypatch.setattr("reservoir.train.group.optimize", optimize)
    result = train(xor_cfg(tiny_gpt2, home, lr=(50.0, 1e-3), seeds=1, steps=10), progress=False)
    assert "| 50 (diverged: " in summary(result) and "| 0.001 (selected) |" in summary(result)


def test_a_run_of_no_blocks_resumes(tiny_gpt2, home):
    """--blocks 0 (the input and output layers alone) checkpoints a run that --resume continues."""
    cfg = xor_cfg(tiny_gpt2, home, steps=20, lr=(3e-3,), seeds=1, blocks=0)
    first = train(cfg, progress=False)
    again = train(dataclasses.replace(cfg, resume=True, steps=30), progress=False)
    assert first["depth"] == 0 and again["steps"] == [30]


def test_a_held_out_share_for_a_task_with_a_validation_split_is_refused(cli, home, tiny_gpt2):
    """ListOps has a validation split of its own: ``--val-fraction`` would change nothing but the run's identity,
    and is refused before any checkpoint; at its default the run starts."""
    small = ["n_train=80", "n_val=10", "n_test=10", "max_length=24", "min_length=4", "max_depth=2"]
    args = ["train", "--task", "listops", "--backbone", str(tiny_gpt2), "--steps", "1", "--seeds", "1"]
    args += [a for o in small for a in ("--task-opt", o)]
    r = cli(*args, "--val-fraction", "0.3")
    assert r.exit_code == 1 and "task 'listops' has a validation split of its own" in r.output, r.output
    assert "--val-fraction 0.3" in r.output and "Traceback" not in r.output
    assert not list(home.rglob("*.pt"))
    r = cli(*args)
    assert r.exit_code == 0, r.output
    # a file whose split array names its validation rows 'validation': its own split too
    rng = np.random.default_rng(0)
    split = np.array(["train"] * 40 + ["validation"] * 10 + ["test"] * 10)
    np.savez(home / "v.npz", x=rng.random((60, 4, 3)).astype("float32"), y=np.arange(60) % 2, split=split)
    r = cli("train", "--task", f"file:{home / 'v.npz'}", "--backbone", str(tiny_gpt2), "--steps", "1",
            "--val-fraction", "0.3")  # fmt: skip
    assert r.exit_code == 1 and "has a validation split of its own" in r.output, r.output


def test_a_dropout_that_no_layer_applies_is_refused(cli, home):
    """An LSTM on token ids has no dropout layer, and ids take no input dropout: ``--dropout 0.5`` would change
    nothing but the run's identity, and is refused before any checkpoint; at its default the run starts."""
    small = [
        "n_train=80",
        "n_val=10",
        "n_test=10",
        "max_length=24",
        "min_length=4",
        "max_depth=2",
        "max_len=32",
    ]
    args = ["train", "--task", "listops", "--backbone", "lstm", "--steps", "1", "--seeds", "1"]
    args += [a for o in small for a in ("--task-opt", o)]
    r = cli(*args, "--dropout", "0.5")
    assert (
        r.exit_code == 1
        and "--dropout 0.5 would change nothing: backbone lstm has no dropout layer" in r.output
    )
    assert (
        "task 'listops' feeds token ids, which take no input dropout" in r.output
        and "Traceback" not in r.output
    )
    assert not list(home.rglob("*.pt"))
    r = cli(*args)
    assert r.exit_code == 0, r.output


def test_a_matched_input_scale_run_never_resumes_the_checkpoint_of_another_token_embedding(
    tiny_gpt2, home, cli
):
    """Two folders of one name alike but for their token embedding, which the backbone's fingerprint leaves
    out: under ``--input-scale matched`` the input layer is scaled to each one's std, so the run records it
    (``matched_std``, in the checkpoint and the result) and ``--resume`` of the other refuses, naming it."""
    from transformers import GPT2Model

    model = GPT2Model.from_pretrained(tiny_gpt2)
    model.save_pretrained(home / "a" / "m")
    with torch.no_grad():
        model.wte.weight.mul_(10)
    model.save_pretrained(home / "b" / "m")
    args = ["train", "--task", "bit_xor", "--task-opt", "n_train=64", "--task-opt", "n_test=32", "--steps", "2",
            "--eval-every", "2", "--input-scale", "matched", "--checkpoint-dir", str(home / "c")]  # fmt: skip
    assert cli("-q", *args, "--backbone", str(home / "a" / "m")).exit_code == 0
    (ckpt,) = (home / "c").glob("*.pt")
    std = torch.load(ckpt, weights_only=False)["identity"]["matched_std"]
    r = cli("-q", *args, "--backbone", str(home / "b" / "m"), "--resume")
    assert r.exit_code == 1 and "was written with other settings: matched_std" in r.output, r.output
    result = train(
        xor_cfg(home / "b" / "m", home, steps=2, eval_every=2, input_scale="matched"), progress=False
    )
    assert result["identity"]["matched_stds"] == {"0": pytest.approx(10 * std, rel=1e-4)}

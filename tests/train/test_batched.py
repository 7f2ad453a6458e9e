"""Runs trained together (``concurrent_runs``, :mod:`reservoir.train.batched`): a batch of runs gives each run's
result alone, leaves a run out once it stops, checkpoints every run and resumes to the uninterrupted batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from reservoir.config import TrainConfig
from reservoir.errors import DataError
from reservoir.train import Diverged, batched, train
from reservoir.train.checkpoint import settings_identity
from reservoir.train.data import load_data
from reservoir.train.group import GroupBatches, GroupRun, group_size

#: a small, fast bit_xor: 512 train (51 held out for validation), 256 test
XOR_OPTS = {"n_train": "512", "n_test": "256"}

pytestmark = pytest.mark.usefixtures("one_thread")


def xor_cfg(backbone, home: Path, **kw) -> TrainConfig:
    base = dict(
        task="bit_xor",
        backbone=str(backbone),
        task_options=XOR_OPTS,
        lr=(1e-3, 3e-3),
        seeds=2,
        steps=30,
        batch_size=16,
        eval_every=10,
        patience=0,
        dropout=0.0,
        dtype="float32",
        checkpoint_every=10,
        checkpoint_dir=home / "ckpt",
        data_dir=home / "data",
    )
    return TrainConfig(**{**base, **kw})


def assert_same_runs(batch: dict, alone: dict, exact: bool = False) -> None:
    """Each run of ``batch`` is the run of ``alone``: the same steps, stop, best step and test accuracy, its mean
    training losses equal to float tolerance (bit for bit where ``exact``) and its validation accuracy within one
    output of a pass."""
    assert [(r["lr"], r["seed"]) for r in batch["runs"]] == [(r["lr"], r["seed"]) for r in alone["runs"]]
    for a, b in zip(batch["runs"], alone["runs"]):
        for key in ("steps", "best_step", "stop_reason", "test_accuracy", "blocks", "backbone_fingerprint"):
            assert a[key] == b[key], (key, a["lr"], a["seed"])
        assert [h["step"] for h in a["history"]] == [h["step"] for h in b["history"]]
        for x, y in zip(a["history"], b["history"]):
            if exact:
                assert x == y
            else:
                assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
                assert x["val_loss"] == pytest.approx(y["val_loss"], rel=1e-4)
                assert abs(x["val_accuracy"] - y["val_accuracy"]) <= 1.5 / 255  # 51 rows x 5 bits a pass


def test_a_batch_of_runs_equals_the_same_runs_one_after_another(tiny_gpt2, home):
    """2 learning rates x 2 seeds, dropout off: trained together (the default) and with ``concurrent_runs=1``, every
    run has the same losses to float tolerance, stop step and test accuracy, and the sweep the same result file."""
    cfg = xor_cfg(tiny_gpt2, home, lr=(1e-7, 3e-3), steps=60, patience=2)
    together = train(cfg, progress=False)
    alone = train(dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), progress=False)
    assert [r["batch_runs"] for r in together["runs"]] == [4] * 4
    assert [r["batch_runs"] for r in alone["runs"]] == [1] * 4
    assert_same_runs(together, alone)
    assert together["identity_hash"] == alone["identity_hash"] and together["path"] == alone["path"]
    for key in ("lr", "test_accuracy", "val_accuracy", "best_step", "steps", "sweep"):
        assert together[key] == alone[key], key


def test_dropout_draws_each_run_s_own_numbers_as_it_does_alone(tiny_gpt2, home):
    """Dropout on: each run of the batch draws its dropout (blocks, attention and input) from its own generators,
    the numbers it draws alone, so the losses still agree to float tolerance."""
    cfg = xor_cfg(tiny_gpt2, home, dropout=0.1, lr=(3e-3,), seeds=2, steps=20)
    together = train(cfg, progress=False)
    alone = train(dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), progress=False)
    assert_same_runs(together, alone)


def test_a_run_that_stops_leaves_the_batch_and_the_others_go_on(tiny_gpt2, home, capsys):
    """At lr 1e-7 nothing moves and patience stops both seeds at their third pass; the runs at 3e-3 go on alone in
    the batch to --steps, and every run writes its result and checkpoint."""
    cfg = xor_cfg(tiny_gpt2, home, lr=(1e-7, 3e-3), steps=50, patience=2)
    result = train(cfg, progress=True)
    err = capsys.readouterr().err
    steps = {(r["lr"], r["seed"]): r["steps"] for r in result["runs"]}
    assert steps == {(1e-7, 0): 30, (1e-7, 1): 30, (3e-3, 0): 50, (3e-3, 1): 50}
    assert "[batch of 4] 2 run(s) left the batch; 2 go on" in err
    assert "[lr=1e-07 seed=0] no validation accuracy" in err and "[lr=0.003 seed=1] step 50/50" in err
    for run in result["runs"]:
        saved = torch.load(run["checkpoint"], weights_only=True)
        assert saved["state"]["step"] == run["steps"] and saved["state"]["done"] >= (run["lr"] == 1e-7)


class Killed(Exception):
    pass


def test_a_killed_batch_resumes_to_the_uninterrupted_one(tiny_gpt2, home):
    """Dropout on, checkpoints every 10 steps, killed at step 27: the resumed batch redoes steps 21..27 from every
    run's checkpoint (parameters, Adam, generators) and ends bit for bit where the uninterrupted batch ends."""
    cfg = xor_cfg(tiny_gpt2, home, steps=40, dropout=0.1)
    whole = train(dataclasses.replace(cfg, checkpoint_dir=home / "a"), progress=False)

    def kill(step):
        if step == 27:
            raise Killed

    cut = dataclasses.replace(cfg, checkpoint_dir=home / "b")
    with pytest.raises(Killed):
        train(cut, progress=False, on_step=kill)
    files = sorted((home / "b").glob("*.pt"))
    assert len(files) == 4 and all(torch.load(f, weights_only=True)["state"]["step"] == 20 for f in files)
    resumed = train(dataclasses.replace(cut, resume=True), progress=False)
    assert_same_runs(resumed, whole, exact=True)
    for a, b in zip(whole["runs"], resumed["runs"]):
        x, y = torch.load(a["checkpoint"], weights_only=True), torch.load(b["checkpoint"], weights_only=True)
        assert all(torch.equal(p, q) for p, q in zip(x["params"], y["params"]))
        assert all(torch.equal(p, q) for p, q in zip(x["state"]["best_params"], y["state"]["best_params"]))
        assert all(torch.equal(x["rng"][k], y["rng"][k]) for k in x["rng"])


def test_a_batch_ended_off_the_schedule_and_resumed_with_more_steps_equals_the_whole_batch(tiny_gpt2, home):
    """A batch of 25 steps validates at step 25, off the every-10 schedule; resumed to 40 steps every run takes
    that pass back and ends bit for bit where the 40-step batch ends."""
    cfg = xor_cfg(tiny_gpt2, home, steps=40, patience=2)
    whole = train(dataclasses.replace(cfg, checkpoint_dir=home / "a"), progress=False)
    short = dataclasses.replace(cfg, checkpoint_dir=home / "b", steps=25)
    assert all(r["history"][-1]["step"] == 25 for r in train(short, progress=False)["runs"])
    assert_same_runs(
        train(dataclasses.replace(cfg, checkpoint_dir=home / "b", resume=True), progress=False),
        whole,
        exact=True,
    )


def test_a_batch_s_checkpoints_are_the_runs_own_and_resume_one_after_another(tiny_gpt2, home):
    """A run's checkpoint is the file it writes alone (parameters, fused Adam's state, its generators): a batch
    killed at step 27 resumes with ``concurrent_runs=1`` to the uninterrupted batch, to float tolerance."""
    cfg = xor_cfg(tiny_gpt2, home, steps=30, dropout=0.1)
    whole = train(dataclasses.replace(cfg, checkpoint_dir=home / "a"), progress=False)

    def kill(step):
        if step == 27:
            raise Killed

    cut = dataclasses.replace(cfg, checkpoint_dir=home / "b")
    with pytest.raises(Killed):
        train(cut, progress=False, on_step=kill)
    saved = torch.load(next((home / "b").glob("*.pt")), weights_only=True)
    assert saved["optimizer"]["param_groups"][0]["fused"] and saved["optimizer"]["state"][0]["step"] == 20
    resumed = train(dataclasses.replace(cut, resume=True, concurrent_runs=1), progress=False)
    assert_same_runs(resumed, whole)


def test_groups_hold_concurrent_runs_each_and_the_rest_train_after(tiny_gpt2, home):
    """``concurrent_runs=3`` of 4 runs: a batch of 3, then the fourth alone; each equals the run alone."""
    cfg = xor_cfg(tiny_gpt2, home, steps=20)
    grouped = train(dataclasses.replace(cfg, concurrent_runs=3), progress=False)
    alone = train(dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), progress=False)
    assert [r["batch_runs"] for r in grouped["runs"]] == [3, 3, 3, 1]
    assert_same_runs(grouped, alone)


def test_a_diverging_rate_leaves_the_batch_and_is_set_aside(tiny_gpt2, home, monkeypatch):
    """A run whose gradients stop being finite leaves the batch; its rate is recorded as diverged and never
    selected (its higher seeds are dropped), the other rate trains on; alone, or when every rate diverges, it is an
    error, as when the runs train one after another."""
    from reservoir.train.step import optimize as real

    def optimize(params, opt, grad_clip):  # the gradients of a run at a learning rate above 1 overflow
        norm = real(params, opt, grad_clip)
        return torch.full_like(norm, float("inf")) if opt.param_groups[0]["lr"] > 1 else norm

    # the step of runs trained together (GroupRun.step) and of a run alone (train_step)
    monkeypatch.setattr("reservoir.train.group.optimize", optimize)
    monkeypatch.setattr("reservoir.train.step.optimize", optimize)
    result = train(xor_cfg(tiny_gpt2, home, lr=(1e-3, 50.0), steps=10), progress=False)
    assert (
        result["lr"] == 1e-3 and "the gradients are not finite at step 1" in result["sweep"]["50"]["diverged"]
    )
    assert "[lr=50 seed=0]" in result["sweep"]["50"]["diverged"]
    assert [r["lr"] for r in result["runs"]] == [1e-3, 1e-3]
    with pytest.raises(Diverged, match=r"\[lr=50 seed=0\] the gradients are not finite at step 1"):
        train(xor_cfg(tiny_gpt2, home, lr=(50.0,), steps=10), progress=False)
    with pytest.raises(DataError, match=r"every learning rate of the sweep diverged \(50, 60\)"):
        train(xor_cfg(tiny_gpt2, home, lr=(50.0, 60.0), steps=10), progress=False)


def test_a_run_that_diverged_keeps_no_checkpoint_and_a_resume_finds_it_diverged(tiny_gpt2, home, monkeypatch):
    """A run whose divergence is read at a checkpoint step (not a validation step) saves no checkpoint, as alone:
    a resumed sweep finds the rate diverged again, never a healthy run to go on from."""
    from reservoir.train.step import optimize as real

    def optimize(params, opt, grad_clip):
        norm = real(params, opt, grad_clip)
        return torch.full_like(norm, float("inf")) if opt.param_groups[0]["lr"] > 1 else norm

    monkeypatch.setattr("reservoir.train.group.optimize", optimize)
    cfg = xor_cfg(tiny_gpt2, home, lr=(50.0, 1e-3), seeds=1, steps=10, checkpoint_every=5, eval_every=10)
    first = train(cfg, progress=False)
    assert (
        not list((home / "ckpt").glob("*lr50_*.pt")) and len(list((home / "ckpt").glob("*lr0.001_*.pt"))) == 1
    )
    again = train(dataclasses.replace(cfg, resume=True), progress=False)
    assert "diverged" in first["sweep"]["50"] and "diverged" in again["sweep"]["50"]


def test_a_batch_size_above_the_training_rows_trains_every_row_each_step(tiny_gpt2, home):
    """With fewer training rows than --batch-size, each step of each run takes every row, together as alone."""
    opts = {"n_train": "40", "n_test": "64"}
    cfg = xor_cfg(tiny_gpt2, home, task_options=opts, batch_size=64, steps=6, concurrent_runs=4)
    together = train(cfg, progress=False)
    alone = train(dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), progress=False)
    assert [r["batch_runs"] for r in together["runs"]] == [4] * 4
    assert_same_runs(together, alone)


def test_variable_length_runs_with_dropout_equal_the_runs_alone(tiny_gpt2, home):
    """ListOps rows of 4 to 24 tokens, dropout on: every training batch is padded to the training split's
    longest row, alone as together, so each run of the batch draws the dropout it draws alone and the runs agree
    (a batch padded to its own longest row gave each run the width of the other runs' rows)."""
    opts = {
        "n_train": "80",
        "n_val": "20",
        "n_test": "20",
        "max_length": "24",
        "min_length": "4",
        "max_depth": "2",
    }
    cfg = xor_cfg(
        tiny_gpt2,
        home,
        task="listops",
        task_options=opts,
        dropout=0.1,
        steps=6,
        eval_every=3,
        concurrent_runs=4,
    )
    together = train(cfg, progress=False)
    alone = train(dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), progress=False)
    assert [r["batch_runs"] for r in together["runs"]] == [4] * 4
    assert_same_runs(together, alone)


def test_any_module_computes_each_run_s_rows_with_its_own_tensors(tiny_gpt2, home, monkeypatch):
    """With no module kind of its own (every stacked module called once a run, ``torch.func.functional_call``), the
    batch still equals its runs alone."""
    monkeypatch.setattr(batched, "_kinds", dict)
    cfg = xor_cfg(tiny_gpt2, home, lr=(3e-3,), steps=10, dropout=0.1)
    together = train(cfg, progress=False)
    alone = train(dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), progress=False)
    assert [r["batch_runs"] for r in together["runs"]] == [2, 2]
    assert_same_runs(together, alone)


def test_a_stacked_forward_that_differs_from_the_runs_own_trains_them_one_after_another(
    tiny_gpt2, home, monkeypatch, capsys
):
    """A family whose stacked forward is not each run's own (here: layer norms that read the template's own scale
    and shift, not the runs') is caught before training, said, and its runs train one after another."""
    from torch.nn import LayerNorm

    def shared_scale(module, slots):
        def forward(x):
            return torch.nn.functional.layer_norm(x, module.normalized_shape, module.weight, module.bias)

        return forward, None

    kinds = batched._kinds()
    monkeypatch.setattr(batched, "_kinds", lambda: {**kinds, LayerNorm: shared_scale})
    cfg = xor_cfg(tiny_gpt2, home, lr=(3e-3,), steps=10)
    result = train(cfg, progress=True)
    assert "differs from run 0's own" in capsys.readouterr().err
    assert [r["batch_runs"] for r in result["runs"]] == [1, 1]


def test_as_many_runs_as_fit_the_memory_left(tiny_gpt2, home, monkeypatch):
    """``concurrent_runs`` unset: the group holds as many runs as a share of the available memory takes, from one
    run's measured step, at least one, and on the CPU no more than ``CPU_TOKENS`` tokens a step."""
    from reservoir.tasks import make_task

    cfg = xor_cfg(tiny_gpt2, home)
    task = make_task(cfg.task, cfg.task_options, cfg.seed)
    data = load_data(task, cfg)
    said = []
    cpu = torch.device("cpu")
    monkeypatch.setattr(batched, "available_memory", lambda: 2**40)
    assert group_size(cfg, task, data, cpu, 4, said.append) == 4
    # on the CPU, at most CPU_TOKENS tokens a step: rows of 10 tokens, 100 a run take 2 runs, 300 one
    assert group_size(dataclasses.replace(cfg, batch_size=100), task, data, cpu, 4, lambda m: None) == 2
    assert group_size(dataclasses.replace(cfg, batch_size=300), task, data, cpu, 4, lambda m: None) == 1
    monkeypatch.setattr(batched, "available_memory", lambda: 0)
    assert group_size(cfg, task, data, cpu, 4, said.append) == 1
    assert said[0].startswith("4 of 4 runs a batch: each takes about ") and "MiB to give on" in said[0]
    assert group_size(dataclasses.replace(cfg, concurrent_runs=3), task, data, cpu, 4, said.append) == 3
    per_run = float(said[0].split("each takes about ")[1].split(" MiB")[0]) * 2**20
    monkeypatch.setattr(batched, "available_memory", lambda: int(2.5 * per_run / batched.CPU_SHARE))
    assert group_size(cfg, task, data, cpu, 4, said.append) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_batched_step_on_cuda_never_synchronises_the_host(tiny_gpt2, home):
    """torch's sync debug mode turns every host synchronisation into an error: batched steps (pinned batch,
    forward with each run's dropout generators, backward, each run's clipping and Adam) run under it."""
    from reservoir.tasks import make_task

    cfg = xor_cfg(tiny_gpt2, home, device="cuda", dropout=0.1, lr=(1e-3, 3e-3), seeds=2)
    task = make_task(cfg.task, cfg.task_options, cfg.seed)
    data = load_data(task, cfg)
    shared = settings_identity(cfg, task, data.named())
    device = torch.device("cuda")
    runs = [(lr, s) for lr in cfg.lr for s in (0, 1)]
    group = GroupRun(
        cfg, task, data, runs, device=device, log=lambda m: None, shared=shared, show_counts=False
    )
    assert not group.mismatch
    with GroupBatches(task, data.train, cfg.batch_size, device) as batches:
        group.step(batches.take(tuple((m.seed, m.state.step) for m in group.active)))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                group.step(batches.take(tuple((m.seed, m.state.step) for m in group.active)))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    losses, norms = group.unread[-1]
    assert losses.is_cuda and norms.is_cuda and bool(torch.isfinite(losses).all())


def test_augmented_cifar_runs_batched_killed_and_resumed_equal_the_runs_alone(tiny_gpt2, home):
    """CIFAR-10 trains on augmented images (its identity says so; --no-augment trains on others): each run's draws
    depend on its seed and step alone, so a batch of runs equals the runs alone, and a run killed at step 13 and
    resumed from step 10 ends bit for bit where the uninterrupted one ends."""
    import pickle

    import numpy as np

    from tests.tasks.test_download import write_batch

    folder = home / "data" / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"):
        write_batch(folder / name, rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8), np.arange(40) % 10)
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"c%d" % i for i in range(10)]}))
    cfg = xor_cfg(tiny_gpt2, home, task="cifar10", task_options={}, steps=20, batch_size=8)
    together = train(cfg, progress=False)
    assert together["identity"]["augment"] == 1  # the version of the augmentation
    alone = train(dataclasses.replace(cfg, checkpoint_dir=home / "alone", concurrent_runs=1), progress=False)
    assert_same_runs(together, alone)
    plain = train(dataclasses.replace(cfg, checkpoint_dir=home / "plain", augment=False), progress=False)
    assert "augment" not in plain["identity"] and plain["identity_hash"] != together["identity_hash"]
    assert plain["runs"][0]["history"][0]["loss"] != together["runs"][0]["history"][0]["loss"]

    def kill(step):
        if step == 13:
            raise Killed

    one = dataclasses.replace(cfg, lr=(1e-3,), seeds=1, checkpoint_dir=home / "cut")
    whole = train(dataclasses.replace(one, checkpoint_dir=home / "whole"), progress=False)
    with pytest.raises(Killed):
        train(one, progress=False, on_step=kill)
    assert_same_runs(train(dataclasses.replace(one, resume=True), progress=False), whole, exact=True)

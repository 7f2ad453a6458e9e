"""The stopping rule of `train` (:func:`reservoir.train.run.advance`): a run stops when it is solved or has made
no progress in ``patience`` validation passes, where a training loss that still falls is progress."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from reservoir.config import TrainConfig
from reservoir.tasks import get_task
from reservoir.train import load_data, run, train, train_run
from reservoir.train.checkpoint import RunState

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = TrainConfig(task="bit_xor")  # the defaults: patience 10 passes, stop_at 1.0


def stop_pass(train_losses, val_acc=None, val_losses=None, cfg: TrainConfig = CFG) -> int | None:
    """The 1-based validation pass at which the rule stops a run with these histories (None: it never does)."""
    val_acc = [0.75] * len(train_losses) if val_acc is None else val_acc
    val_losses = [0.5] * len(train_losses) if val_losses is None else val_losses
    state = RunState()
    for i, (loss, acc, vloss) in enumerate(zip(train_losses, val_acc, val_losses), 1):
        state.step = 100 * i
        state.history.append({"step": state.step, "loss": loss, "val_accuracy": acc, "val_loss": vloss})
        run.advance(state, cfg)
        if state.done:
            return i
    return None


def noisy(levels, rel_std: float, seed: int) -> list[float]:
    """``levels`` times lognormal noise of ``rel_std``: a pass's mean training loss as the run reports it."""
    return list(np.asarray(levels) * np.exp(np.random.default_rng(seed).normal(0, rel_std, len(levels))))


def test_a_still_falling_training_loss_never_stops_the_run():
    """Validation rising over the first 20 passes (as in every run: a trend of fewer passes is too uncertain to
    count), then flat for 280 (accuracy on a plateau, loss constant), while the training loss falls 0.4% a pass
    with 1% noise a pass (bit XOR's slow phase falls 6% to 16% over 20 passes): no stop, for any noise draw."""
    rising = list(np.linspace(0.6, 0.75, run.TREND_PASSES))
    acc, vloss = rising + [0.75] * 280, [1.35 - a for a in rising] + [0.6] * 280
    for seed in range(20):
        assert stop_pass(noisy(0.5 * 0.996 ** np.arange(300), 0.01, seed), acc, vloss) is None, seed


def test_a_flat_training_loss_stops_after_the_patience():
    """Nothing improves after the first pass (its accuracy and loss are records): the run stops at pass 1 + 10."""
    assert stop_pass([0.3] * 50) == 1 + CFG.patience
    short = dataclasses.replace(CFG, patience=3)
    assert stop_pass([0.3] * 50, cfg=short) == 1 + 3
    assert stop_pass([0.3] * 50, cfg=dataclasses.replace(CFG, patience=0)) is None  # 0: never


def test_a_noisy_flat_training_loss_stops_in_reasonable_time():
    """A converged or stuck run: its training loss is flat with 2% noise a pass. A chance fall of the trend line is
    rarely both 1% and 2 standard errors, so every draw stops within three times the patience (one pass in 20 at
    most counts as falling)."""
    stops, falling = [], 0
    for seed in range(20):
        losses = noisy([0.3] * 60, 0.02, seed)
        stops.append(stop_pass(losses))
        falling += sum(run.loss_falling(losses[:i]) for i in range(1, 61))
    assert all(s is not None and s <= 3 * CFG.patience + 1 for s in stops), stops
    assert falling <= 20 * 60 / 20


def test_a_run_that_converges_stops_within_a_window_and_the_patience_of_flattening():
    """Falling 1% a pass for 50 passes, then flat: the trend window still falls for a few passes, then patience runs."""
    losses = list(0.5 * 0.99 ** np.minimum(np.arange(120), 50))
    stop = stop_pass(losses)
    assert 50 + CFG.patience < stop <= 50 + run.TREND_PASSES + CFG.patience


def test_a_fall_too_small_or_too_noisy_is_not_progress():
    """The trend must fall 1% of the loss over its 20 passes and by 2 standard errors: 0.025% a pass, noise-free, is
    too small; a 3% fall under 10% noise is too uncertain; a 3% fall under 0.5% noise counts. Only the last 20
    passes count."""
    assert run.TREND_PASSES == 20
    assert not run.loss_falling(0.3 * 0.99975 ** np.arange(20))
    fall, t = run.loss_trend(0.3 * 0.99975 ** np.arange(20))
    assert fall == pytest.approx(-math.expm1(19 * math.log(0.99975))) and t < -1e6
    assert not run.loss_falling(noisy(0.3 * 0.9984 ** np.arange(20), 0.10, 0))
    assert run.loss_falling(noisy(0.3 * 0.9984 ** np.arange(20), 0.005, 0))
    assert not run.loss_falling([0.3, 0.2])  # two passes make no trend
    assert not run.loss_falling(0.3 * 1.01 ** np.arange(20))  # rising
    assert not run.loss_falling(
        list(0.5 * 0.9 ** np.arange(20)) + [0.06] * 20
    )  # fell, then flat for 20 passes


def test_the_plateau_of_the_issue_goes_on_while_its_training_loss_falls():
    """The run the validation criteria alone stopped at step 7,400 (84.4% test): validation accuracy within 0.1
    point for 10 passes and no validation-loss record, while the training loss fell from 0.35 to 0.33 over those
    passes (with its noise)."""
    before = list(np.linspace(0.6, 0.35, 64))
    losses = before + noisy(np.linspace(0.35, 0.33, 10), 0.005, 1)
    acc = list(np.linspace(0.6, 0.843, 64)) + [0.843 + 0.0005 * (i % 2) for i in range(10)]
    vloss = list(np.linspace(0.6, 0.30, 64)) + [0.3002 + 0.0003 * (i % 3) for i in range(10)]
    assert stop_pass(losses, acc, vloss) is None
    # without the training loss's trend, these validation histories alone stop it at its 74th pass (step 7,400)
    no_trend = pytest.MonkeyPatch()
    no_trend.setattr(run, "loss_falling", lambda losses: False)
    try:
        assert stop_pass(losses, acc, vloss) == 74
    finally:
        no_trend.undo()


def test_stop_at_ends_a_run_whose_loss_still_falls():
    losses = list(0.5 * 0.99 ** np.arange(40))
    acc = [0.8] * 30 + [1.0] * 10
    assert stop_pass(losses, acc) == 31


XOR = {"n_train": "512", "n_test": "256"}


def test_real_runs_go_on_while_the_training_loss_falls_and_stop_when_it_is_flat(tiny_gpt2, home, monkeypatch):
    """End to end on a tiny GPT-2, validation held flat: at lr 3e-3 the training loss falls and the run is never out
    of patience (it reaches --steps); at lr 1e-7 nothing moves, and the same patience stops it at its fourth pass
    (the first pass is a validation record)."""
    monkeypatch.setattr(run, "scores", lambda *args, **kw: (0.75, 0.5))
    task = get_task("bit_xor", **XOR)
    cfg = TrainConfig(
        task="bit_xor",
        backbone=str(tiny_gpt2),
        task_options=XOR,
        steps=200,
        batch_size=32,
        eval_every=10,
        patience=3,
        dropout=0.0,
        checkpoint_every=0,
        checkpoint_dir=home / "ckpt",
        data_dir=home / "data",
    )
    data = load_data(task, cfg)
    learning = train_run(cfg, task, data, lr=3e-3, seed=0, progress=False)
    assert learning["steps"] == 200 and learning["stop_reason"] == "reached --steps 200"
    losses = [h["loss"] for h in learning["history"]]
    assert losses[-1] < 0.95 * losses[0]
    stuck = train_run(dataclasses.replace(cfg, lr=(1e-7,)), task, data, lr=1e-7, seed=0, progress=False)
    assert stuck["steps"] == 4 * 10 and stuck["stop_reason"].endswith(
        "no falling training loss in 3 validation passes"
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_every_seed_of_a_4_block_gpt2_solves_bit_xor_with_the_defaults(home, seed):
    """The case that motivated the rule: a frozen 4-block, 64-wide random GPT-2 on bit XOR, every training default
    (patience 10 passes of 100 steps, stop at 100% validation, at most 20,000 steps): each seed reaches 99% test."""
    from tests.conftest import save_tiny_gpt2

    folder = save_tiny_gpt2(home / "gpt2-4x64", n_layer=4, n_embd=64)
    result = train(
        TrainConfig(
            task="bit_xor",
            backbone=str(folder),
            seed=seed,
            checkpoint_dir=home / "ckpt",
            data_dir=home / "data",
        ),
        progress=False,
    )
    assert result["test_accuracy"] >= 0.99, result["runs"][0]["stop_reason"]

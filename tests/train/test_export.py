"""train --save-backbone: a run's trained backbone as a backbone folder (the paper's "Bit" row)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.config import TrainConfig
from reservoir.errors import BackboneError, DataError, UsageError
from reservoir.model.backbones import fingerprint, load_backbone
from reservoir.model.reservoir import readout_positions
from reservoir.tasks import make_task
from reservoir.train import FPT, batch_tensors, select_trainable, train
from reservoir.train.checkpoint import read_checkpoint
from tests.zoo import save_tiny

pytestmark = pytest.mark.usefixtures("one_thread")

#: a small bit_xor: 256 train (26 held out for validation), 64 test
XOR_OPTS = {"n_train": "256", "n_test": "64"}
EVERY_GROUP = ("input", "pos", "ln", "attn", "ff", "out")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A 3-block, 32-wide Llama (rotary: its positions are the FPT's added ``wpe``)."""
    return save_tiny("llama", tmp_path_factory.mktemp("tiny-llama"))


def xor_cfg(backbone, home: Path, **kw) -> TrainConfig:
    base = dict(
        task="bit_xor",
        backbone=str(backbone),
        task_options=XOR_OPTS,
        trainable=EVERY_GROUP,
        steps=12,
        batch_size=16,
        eval_every=4,
        patience=0,
        checkpoint_every=0,
        checkpoint_dir=home / "ckpt",
        data_dir=home / "data",
        save_backbone=home / "models" / "bit",
    )
    return TrainConfig(**{**base, **kw})


def trained_fpt(cfg: TrainConfig, result: dict) -> FPT:
    """The run's FPT rebuilt independently: its source backbone, then its checkpoint's best parameters."""
    task = make_task(cfg.task, cfg.task_options, cfg.seed)
    model = FPT(
        task.spec,
        load_backbone(cfg.backbone, cfg.seed),
        blocks=result["depth"],
        seed=cfg.seed,
        input_scale=cfg.input_scale,
        dropout=cfg.dropout,
    )
    params, _ = select_trainable(model, cfg.trainable)
    best = read_checkpoint(Path(result["runs"][0]["checkpoint"]), "")["state"]["best_params"]
    with torch.no_grad():
        for p, b in zip(params, best, strict=True):
            p.copy_(b)
    return model.eval()


def some_test_rows(cfg: TrainConfig, n: int = 32):
    task = make_task(cfg.task, cfg.task_options, cfg.seed)
    tokens, lengths, _ = batch_tensors(task, task.load("test", cfg.data_dir), np.arange(n))
    return task, tokens, lengths


def leftovers(folder: Path) -> list[str]:
    """Entries beside ``folder`` other than it (a temporary folder left behind)."""
    return (
        sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)
        if folder.parent.exists()
        else []
    )


@pytest.mark.parametrize("source", ["gpt2", "gpt2-random", "llama"])
def test_saved_backbone_reloads_to_the_run_s_best_parameters_and_features(
    source, tiny_gpt2, tiny_llama, home
):
    backbone = {"gpt2": str(tiny_gpt2), "gpt2-random": f"{tiny_gpt2}-random", "llama": str(tiny_llama)}[
        source
    ]
    cfg = xor_cfg(backbone, home, seed=3)
    result = train(cfg, progress=False)
    folder = cfg.save_backbone
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "reservoir.json"} <= names
    assert ("added_positions.safetensors" in names) == (
        source == "llama"
    )  # rotary: the FPT's positions beside
    assert leftovers(folder) == []

    saved = load_backbone(str(folder), 0)  # a folder's weights do not depend on the seed
    model = trained_fpt(cfg, result)
    untrained = load_backbone(cfg.backbone, cfg.seed)
    for group in ("pos", "ln", "attn", "ff"):
        got, want = saved.param_groups()[group], model.backbone.param_groups()[group]
        assert len(got) == len(want) > 0
        assert all(torch.equal(g, w) for g, w in zip(got, want)), group  # bitwise
        before = untrained.param_groups()[group]
        assert any(not torch.equal(b, w) for b, w in zip(before, want)), f"{group} did not train"
    state, trained = saved.state_dict(), model.backbone.state_dict()
    assert set(state) == set(trained) and all(torch.equal(state[k], trained[k]) for k in state)

    # the same input embeddings give the same hidden states at every depth, and the same FPT features
    task, tokens, lengths = some_test_rows(cfg)
    depths = list(range(saved.n_layers + 1))
    with torch.inference_mode():
        x = model.reservoir.input_layer(tokens)
        readout = readout_positions(lengths, task.spec.n_readout)
        assert torch.equal(saved(x, lengths, depths, readout), model.backbone(x, lengths, depths, readout))
    rebuilt = FPT(task.spec, saved, blocks=result["depth"], seed=cfg.seed, input_scale=cfg.input_scale).eval()
    rebuilt.reservoir.input_layer.load_state_dict(model.reservoir.input_layer.state_dict())
    with torch.inference_mode():
        assert torch.equal(rebuilt.features(tokens, lengths), model.features(tokens, lengths))

    info = json.loads((folder / "reservoir.json").read_text())
    assert info["task"] == "bit_xor" and info["trainable"] == list(EVERY_GROUP) and info["seed"] == 3
    assert info["steps"] == 12 and info["best_step"] == result["best_step"][0]
    assert (
        info["test_accuracy"] == result["test_accuracy"]
        and info["run_identity_hash"] == result["identity_hash"]
    )
    # the identity of features extracted from it is not the untrained model's
    assert info["fingerprint"] == fingerprint(saved) != fingerprint(untrained) == info["source_fingerprint"]
    assert result["config"]["train"]["save_backbone"] == str(folder)


def test_features_extracted_from_the_folder_are_the_trained_fpt_s(tiny_gpt2, home):
    """With the input layer left frozen, extraction's seeded input layer is the run's: `extract --backbone DIR`
    stores what the trained FPT's backbone computes, under a backbone fingerprint of its own."""
    from reservoir import api

    cfg = xor_cfg(tiny_gpt2, home, trainable=("pos", "ln", "attn", "ff", "out"))
    result = train(cfg, progress=False)
    model = trained_fpt(cfg, result)
    _, tokens, lengths = some_test_rows(cfg, 64)
    common = dict(
        task_options=XOR_OPTS,
        seed=cfg.seed,
        split="test",
        dtype="float32",
        engine="torch",
        data_dir=cfg.data_dir,
    )
    path = api.extract("bit_xor", str(cfg.save_backbone), depths=str(result["depth"]), **common)
    X, _ = api.read_features(path, "test", depth=result["depth"])
    with torch.inference_mode():
        want = model.features(tokens, lengths).reshape(len(tokens), -1).numpy()
    np.testing.assert_allclose(X, want, rtol=0, atol=1e-5)
    untrained = api.extract("bit_xor", str(tiny_gpt2), depths=str(result["depth"]), **common)
    with h5py.File(path) as f, h5py.File(untrained) as g:
        ours, theirs = (json.loads(h.attrs["identity"])["backbone_fingerprint"] for h in (f, g))
    assert ours != theirs


@pytest.mark.parametrize("many", [["--lr", "1e-3,1e-4"], ["--seeds", "2"]])
def test_a_sweep_or_several_seeds_is_a_usage_error_naming_the_fix(many, tiny_gpt2, home, cli):
    folder = home / "models" / "bit"
    r = cli("train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), *many, "--save-backbone", str(folder))
    assert r.exit_code == 2
    assert (
        "--save-backbone saves the backbone of one run" in r.output
        and "Give one --lr and --seeds 1" in r.output
    )
    assert "Traceback" not in r.output and not folder.exists()
    with pytest.raises(UsageError, match="saves the backbone of one run"):
        xor_cfg(tiny_gpt2, home, lr=(1e-3, 1e-4))


def test_the_sweep_s_run_is_saved_from_its_checkpoint_without_training(tiny_gpt2, home, monkeypatch):
    """The fix the usage error names: sweep, then rerun the selected --lr with --resume --save-backbone."""
    from reservoir.train import run as one_run

    sweep = train(xor_cfg(tiny_gpt2, home, lr=(1e-3, 1e-2), save_backbone=None), progress=False)
    monkeypatch.setattr(one_run, "train_step", lambda *a, **k: pytest.fail("a finished run trained again"))
    cfg = xor_cfg(tiny_gpt2, home, lr=(sweep["lr"],), resume=True)
    result = train(cfg, progress=False)
    run = next(r for r in sweep["runs"] if r["lr"] == sweep["lr"])
    assert result["test_accuracy"] == run["test_accuracy"]
    saved = load_backbone(str(cfg.save_backbone), 0).state_dict()
    trained = trained_fpt(cfg, result).backbone.state_dict()
    assert all(torch.equal(saved[k], trained[k]) for k in trained)


def test_an_existing_folder_is_refused_before_training_and_left_as_it_was(tiny_gpt2, home, cli):
    folder = home / "models" / "bit"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    r = cli(
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--task-opt",
        "n_train=256",
        "--steps",
        "4",
        "--save-backbone",
        str(folder),
    )
    assert r.exit_code == 1
    assert (
        f"--save-backbone {folder}: a folder holding notes.txt is there and is never overwritten" in r.output
    )
    assert [p.name for p in folder.iterdir()] == ["notes.txt"] and (
        folder / "notes.txt"
    ).read_text() == "mine"
    assert not (home / "checkpoints").exists() and not (home / "results").exists()  # nothing ran
    assert leftovers(folder) == []
    plain = home / "models" / "file"
    plain.write_text("x")
    r = cli("train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--save-backbone", str(plain))
    assert r.exit_code == 1 and "a file is there" in r.output and plain.read_text() == "x"
    # a folder not there yet, but holding where the run writes: it would not be empty by the end of the run
    for folder, inside in ((home, home / "checkpoints"), (home / "ck", home / "ck" / "runs")):
        extra = ["--checkpoint-dir", str(inside)] if folder.name == "ck" else []
        r = cli(
            "train", "--task", "bit_xor", "--backbone", str(tiny_gpt2), "--save-backbone", str(folder), *extra
        )
        assert r.exit_code == 1 and f"the run writes into {inside}" in r.output, r.output
    assert not (home / "results").exists() and not (home / "ck").exists()  # nothing ran


def test_a_folder_filled_while_the_run_trained_is_refused_and_the_fix_named(tiny_gpt2, home):
    cfg = xor_cfg(tiny_gpt2, home)

    def fill(step):
        if step == 1:
            cfg.save_backbone.mkdir(parents=True)
            (cfg.save_backbone / "notes.txt").write_text("mine")

    with pytest.raises(
        UsageError, match=r"is never overwritten.*rerun with --resume to save it without training"
    ):
        train(cfg, progress=False, on_step=fill)
    assert [p.name for p in cfg.save_backbone.iterdir()] == ["notes.txt"]
    assert leftovers(cfg.save_backbone) == []
    train(xor_cfg(tiny_gpt2, home, save_backbone=home / "models" / "bit2", resume=True), progress=False)
    assert (home / "models" / "bit2" / "reservoir.json").exists()


@pytest.mark.parametrize("where", ["writing the weights", "renaming"])
def test_a_failed_write_leaves_no_folder_behind(where, tiny_gpt2, home, monkeypatch):
    from reservoir.model.backbones.hf import HFBackbone
    from reservoir.train import export

    if where == "writing the weights":
        original = HFBackbone.save_pretrained

        def save_then_fail(self, folder):
            original(self, folder)  # a half-written folder: config and weights, no reservoir.json
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(HFBackbone, "save_pretrained", save_then_fail)
    else:

        def rename(src, dst):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(export.os, "rename", rename)
    cfg = xor_cfg(tiny_gpt2, home)
    with pytest.raises(
        DataError, match=r"cannot write the backbone folder .*No space left.*rerun with --resume"
    ):
        train(cfg, progress=False)
    assert not cfg.save_backbone.exists() and leftovers(cfg.save_backbone) == []


def test_an_empty_folder_is_filled_and_a_registered_random_gpt2_round_trips(home):
    from reservoir.model.backbones.gpt2 import random_gpt2
    from reservoir.train.export import save_backbone

    backbone = random_gpt2(0, n_layer=2, n_embd=32, n_head=4)  # what gpt2-random builds, at a tiny size
    folder = home / "empty"
    folder.mkdir()
    save_backbone(backbone, folder, {"note": "x"})
    state, saved = backbone.state_dict(), load_backbone(str(folder), 1).state_dict()
    assert set(state) == set(saved) and all(torch.equal(state[k], saved[k]) for k in state)
    assert json.loads((folder / "reservoir.json").read_text())["note"] == "x"
    umask = os.umask(0)
    os.umask(umask)
    assert (
        os.stat(folder).st_mode & 0o777 == 0o777 & ~umask
    )  # a plain folder's permissions, not mkdtemp's private ones


def test_backbones_that_cannot_be_saved_are_refused_before_training(home, tmp_path, tiny_gpt2):
    with pytest.raises(BackboneError, match="a lstm backbone cannot be saved as a backbone folder"):
        train(xor_cfg("lstm", home), progress=False)
    assert not (home / "ckpt").exists()
    t5 = load_backbone(str(save_tiny("t5", tmp_path / "t5")), 0)
    with pytest.raises(BackboneError, match="T5Stack of a 't5' model, which loads as T5Model"):
        t5.check_saveable()
    # added positions in a folder of a model with learned positions of its own are refused, not ignored
    from safetensors.torch import save_file

    folder = tmp_path / "gpt2"
    load_backbone(str(tiny_gpt2), 0).save_pretrained(folder)
    save_file({"weight": torch.zeros(4, 32)}, str(folder / "added_positions.safetensors"))
    with pytest.raises(BackboneError, match="has learned positions of its own"):
        load_backbone(str(folder), 0)


def test_the_best_validation_step_is_saved_not_the_last(tiny_gpt2, home, monkeypatch):
    """Validation accuracy falls after the first pass: the folder holds step 4's parameters, not step 12's."""
    from reservoir.train import run as one_run

    passes = iter([0.9, 0.8, 0.7])
    monkeypatch.setattr(one_run, "scores", lambda *a, **k: (next(passes, 0.5), 0.5))
    cfg = xor_cfg(tiny_gpt2, home)
    result = train(cfg, progress=False)
    assert result["best_step"] == [4] and result["runs"][0]["steps"] == 12
    saved = load_backbone(str(cfg.save_backbone), 0)
    best = trained_fpt(cfg, result).backbone
    assert all(torch.equal(a, b) for a, b in zip(saved.parameters(), best.parameters()))
    task = make_task(cfg.task, cfg.task_options, cfg.seed)
    last = FPT(task.spec, load_backbone(cfg.backbone, cfg.seed), blocks=2, seed=cfg.seed)
    params, _ = select_trainable(last, cfg.trainable)
    with torch.no_grad():
        for p, q in zip(
            params, read_checkpoint(Path(result["runs"][0]["checkpoint"]), "")["params"], strict=True
        ):
            p.copy_(q)
    assert any(not torch.equal(a, b) for a, b in zip(saved.parameters(), last.backbone.parameters()))
    assert json.loads((cfg.save_backbone / "reservoir.json").read_text())["best_step"] == 4


def test_a_sigkilled_save_s_half_written_folder_is_removed_by_the_next_save_on_its_host(home):
    """A SIGKILL skips the cleanup and leaves the temporary folder (a whole model); the next save to the same
    folder removes it when its process is gone, and leaves a live process's and another host's alone."""
    import subprocess
    import sys

    from reservoir.model.backbones.gpt2 import random_gpt2
    from reservoir.train.export import _HOST, save_backbone

    folder = home / "models" / "bit"
    folder.parent.mkdir(parents=True)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = folder.parent / f".bit.{_HOST}.{int(gone.stdout)}-0a1b2c.partial"
    live = folder.parent / f".bit.{_HOST}.{os.getpid()}-3d4e5f.partial"
    other_host = folder.parent / f".bit.elsewhere.{int(gone.stdout)}-6a7b8c.partial"
    for d in (stale, live, other_host):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    save_backbone(random_gpt2(0, n_layer=1, n_embd=16, n_head=2), folder, {"note": "x"})
    assert (folder / "config.json").exists()
    assert leftovers(folder) == sorted([live.name, other_host.name])

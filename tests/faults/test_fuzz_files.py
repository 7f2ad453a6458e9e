"""The front door, fuzzed (Hypothesis), for the files a user is handed: checkpoints (``attention
--checkpoint``, ``train --resume``) and model folders (``--backbone FOLDER``) with damaged, retyped,
truncated or crafted contents. Every command either succeeds or exits 1 or 2 with one message naming
the file or the option: never a traceback, and a payload a crafted file carries never runs.

The default run tries :data:`tests.faults.test_fuzz.DEFAULT_EXAMPLES` examples per property at most (fewer
where each example trains or loads a model); the ``slow``-marked twins try
:data:`tests.faults.test_fuzz.SLOW_EXAMPLES`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.faults.test_fuzz import FAST, SLOW, check_failure, invoke, sometimes

FEW = settings(FAST, max_examples=12)

pytestmark = pytest.mark.usefixtures("one_thread")


class Payload:
    """Unpickling this creates the file ``marker`` names: the side effect of a crafted file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


JUNK = st.sampled_from([None, "x", -1, 0, 2**40, 1.5, float("nan"), [], {}, [1, 2], {"a": 1}, True])


def junk_tensor(draw) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    return torch.full(shape, draw(st.sampled_from([0.0, float("nan"), 1e30])))


@st.composite
def mutations(draw) -> list[tuple[str, tuple[str, ...], object]]:
    """Changes to a checkpoint's contents: (action, path of keys, value)."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        path = tuple(
            draw(
                st.lists(
                    st.sampled_from(
                        [
                            "format",
                            "identity",
                            "params",
                            "optimizer",
                            "state",
                            "rng",
                            "torch",
                            "step",
                            "best_params",
                            "history",
                            "run_lr",
                            "param_groups",
                            "lr",
                            "blocks",
                            "0",
                            "cuda",
                        ]
                    ),
                    min_size=1,
                    max_size=3,
                )
            )
        )
        action = draw(st.sampled_from(["set", "set", "delete", "tensor", "payload"]))
        out.append(
            (
                action,
                path,
                draw(JUNK) if action == "set" else junk_tensor(draw) if action == "tensor" else None,
            )
        )
    return out


def mutate(obj, path: tuple[str, ...], action: str, value, marker: str):
    """``obj`` with the value at ``path`` (keys of dicts, indices of lists, as far as they lead) changed."""
    node, keys = obj, list(path)
    while len(keys) > 1:
        key = keys[0]
        child = (
            node.get(key)
            if isinstance(node, dict)
            else node[int(key)]
            if isinstance(node, list) and key.isdigit() and int(key) < len(node)
            else None
        )
        if not isinstance(child, (dict, list)):
            break
        node, keys = child, keys[1:]
    key = keys[0]
    if isinstance(node, list):
        if not node:
            return obj
        key = int(key) % len(node) if key.isdigit() else 0
    if action == "delete":
        if isinstance(node, dict):
            node.pop(key, None)
        else:
            del node[key]
    else:
        node[key] = Payload(marker) if action == "payload" else value
    return obj


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny GPT-2 folder, the arguments of a 2-step training run, and the checkpoint it wrote."""
    from tests.conftest import save_tiny_gpt2

    root = tmp_path_factory.mktemp("fuzz-ckpt")
    tiny = save_tiny_gpt2(root / "tiny", n_layer=2, n_embd=16)
    args = (
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny),
        "--task-opt",
        "n_train=64",
        "--task-opt",
        "n_test=16",
        "--steps",
        "2",
        "--eval-every",
        "1",
        "--batch-size",
        "4",
        "--checkpoint-every",
        "1",
    )
    from click.testing import CliRunner

    from reservoir.cli import main

    r = CliRunner().invoke(
        main,
        ["-q", *args, "--checkpoint-dir", str(root / "ckpt")],
        env={"RESERVOIR_HOME": str(root / "home")},
    )
    assert r.exit_code == 0, r.output
    (ckpt,) = (root / "ckpt").glob("*.pt")
    return tiny, args, ckpt


def run_checkpoint(trained, changes, cut: int | None, flip: int | None, resume: bool) -> None:
    tiny, args, original = trained
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        marker = str(tmp / "payload-ran")
        obj = torch.load(original, weights_only=True)
        for action, path, value in changes:
            obj = mutate(obj, path, action, value, marker)
        folder = tmp / "ckpt"
        folder.mkdir()
        ckpt = folder / original.name  # where --resume looks for this run's checkpoint
        torch.save(obj, ckpt)
        data = ckpt.read_bytes()
        if cut is not None:
            data = data[: cut % max(1, len(data))]
        if flip is not None and data:
            data = bytearray(data)
            data[flip % len(data)] ^= 0xFF
            data = bytes(data)
        ckpt.write_bytes(data)
        if resume:
            code, output = invoke(tmp / "home", "-q", *args, "--checkpoint-dir", str(folder), "--resume")
        else:
            code, output = invoke(
                tmp / "home",
                "-q",
                "attention",
                "--task",
                "bit_xor",
                "--backbone",
                str(tiny),
                "--checkpoint",
                str(ckpt),
                "--out",
                str(tmp / "a.png"),
            )
        if code != 0:
            check_failure(code, output, str(ckpt), ckpt.name)
        assert not Path(marker).exists(), "a crafted checkpoint ran its payload"


@pytest.mark.parametrize(
    "changes",
    [
        [("set", ("state", "history", "0"), {"step": "x"})],  # a validation pass without its numbers
        [("set", ("state", "best_params"), None)],  # passes made, but no best parameters
    ],
    ids=["history entry", "no best parameters"],
)
def test_a_checkpoint_whose_run_state_lost_its_passes_is_refused_in_words(trained, changes, monkeypatch):
    import tests.faults.test_fuzz as fuzz

    monkeypatch.setattr(fuzz, "event", lambda *_: None)  # hypothesis' events: only inside a @given test
    run_checkpoint(trained, changes, None, None, True)


checkpoint_runs = dict(
    changes=mutations(),
    cut=st.one_of(st.none(), st.none(), st.integers(0, 10**6)),
    flip=st.one_of(st.none(), st.none(), st.integers(0, 10**6)),
    resume=st.booleans(),
)


@FEW
@given(**checkpoint_runs)
def test_damaged_and_crafted_checkpoints(trained, changes, cut, flip, resume):
    run_checkpoint(trained, changes, cut, flip, resume)


@pytest.mark.slow
@SLOW
@given(**checkpoint_runs)
def test_damaged_and_crafted_checkpoints_many(trained, changes, cut, flip, resume):
    run_checkpoint(trained, changes, cut, flip, resume)


# -- model folders with odd configs ------------------------------------------------------------------

CONFIG_KEYS = (
    "model_type",
    "n_layer",
    "n_embd",
    "n_head",
    "n_positions",
    "architectures",
    "layer_norm_epsilon",
    "vocab_size",
    "activation_function",
    "torch_dtype",
    "auto_map",
    "num_hidden_layers",
    "hidden_size",
)
MODEL_TYPES = ("gpt2", "llama", "bert", "vit", "t5", "mamba", "nonexistent", "", "GPT2", "gpt2 ")


@st.composite
def configs(draw) -> list[tuple[str, str, object]]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(CONFIG_KEYS))
        if key == "model_type" and not sometimes(draw, 3):
            out.append(("set", key, draw(st.sampled_from(MODEL_TYPES))))
        else:
            out.append((draw(st.sampled_from(["set", "set", "delete"])), key, draw(JUNK)))
    return out


def run_model_folder(tiny_folder: Path, changes, weights: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = shutil.copytree(tiny_folder, tmp / "model")
        marker = tmp / "payload-ran"
        (folder / "custom.py").write_text(f"open({str(marker)!r}, 'w')\n")
        config = json.loads((folder / "config.json").read_text())
        for action, key, value in changes:
            if action == "delete":
                config.pop(key, None)
            else:
                config[key] = (
                    {"AutoConfig": "custom.Config", "AutoModel": "custom.Model"}
                    if key == "auto_map"
                    else value
                )
        (folder / "config.json").write_text(json.dumps(config))
        weights_file = folder / "model.safetensors"
        if weights == "missing":
            weights_file.unlink()
        elif weights == "truncated":
            weights_file.write_bytes(weights_file.read_bytes()[:200])
        code, output = invoke(
            tmp / "home",
            "-q",
            "extract",
            "--task",
            "digits",
            "--backbone",
            str(folder),
            "--limit",
            "20",
            "--dtype",
            "float32",
            "--engine",
            "torch",
            "--no-compile",
        )
        if code != 0:
            check_failure(code, output, str(folder), folder.name)
            assert not list((tmp / "home").rglob("*.h5"))
        assert not marker.exists(), "a model folder's own code ran"


model_folder_runs = dict(changes=configs(), weights=st.sampled_from(["kept"] * 4 + ["missing", "truncated"]))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from tests.conftest import save_tiny_gpt2

    return save_tiny_gpt2(tmp_path_factory.mktemp("fuzz-model"), n_layer=2, n_embd=16)


@FEW
@given(**model_folder_runs)
def test_model_folders_with_odd_configs(tiny_model, changes, weights):
    run_model_folder(tiny_model, changes, weights)


@pytest.mark.slow
@SLOW
@given(**model_folder_runs)
def test_model_folders_with_odd_configs_many(tiny_model, changes, weights):
    run_model_folder(tiny_model, changes, weights)

"""Nothing from a file runs code: crafted checkpoints, data pickles, weight files and model folders
are refused in words (exit 1, naming the file) before their payload can run."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from reservoir.errors import DataError
from reservoir.tasks import get_task, pickles
from tests.conftest import save_tiny_gpt2
from tests.tasks.test_download import protein_records, write_cifar, write_lmdb

pytestmark = pytest.mark.usefixtures("one_thread")


class Payload:
    """Unpickling this creates ``marker``: the side effect a crafted file would have."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


class SystemPayload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "payload-ran"
    yield path
    assert not path.exists(), "the crafted file's payload ran"


def test_a_crafted_checkpoint_given_to_attention_is_refused(cli, tmp_path, marker):
    evil = tmp_path / "shared.pt"
    torch.save({"format": 2, "identity": {}, "params": [torch.zeros(2)], "x": Payload(marker)}, evil)
    r = cli(
        "attention",
        "--task",
        "bit_xor",
        "--backbone",
        "gpt2-random",
        "--checkpoint",
        str(evil),
        "--out",
        str(tmp_path / "a.png"),
    )
    assert r.exit_code == 1, r.output
    assert (
        f"checkpoint {evil} holds a reference to io.open" in r.output
        and "refused without running it" in r.output
    )
    assert "Traceback" not in r.output and not (tmp_path / "a.png").exists()


@pytest.mark.parametrize("payload", [Payload, SystemPayload])
def test_a_crafted_checkpoint_planted_for_resume_is_refused(cli, home, tiny_gpt2, marker, payload):
    args = [
        "-q",
        "train",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--task-opt",
        "n_train=128",
        "--task-opt",
        "n_test=32",
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--checkpoint-dir",
        str(home / "c"),
    ]
    assert cli(*args).exit_code == 0
    (own,) = (home / "c").glob("*.pt")
    obj = torch.load(own, weights_only=True)
    torch.save(
        {**obj, "state": {**obj["state"], "history": [payload(marker)]}}, own
    )  # in place: the run's own name
    r = cli(*args, "--resume")
    assert r.exit_code == 1, r.output
    assert f"checkpoint {own} holds a reference to" in r.output and "refused without running it" in r.output
    # beside it under another identity: --resume reads its neighbours' identities to name the difference
    neighbour = own.with_name(own.name.replace(".pt", "x.pt"))
    own.rename(neighbour)
    r = cli(*args, "--resume", "--dropout", "0.3")
    assert r.exit_code in (0, 1) and "Traceback" not in r.output


def test_a_crafted_cifar_batch_is_refused_naming_the_file(cli, home, tmp_path, marker):
    folder = tmp_path / "data" / "cifar10" / "cifar-10-batches-py"
    write_cifar(folder)
    batch = pickle.loads((folder / "data_batch_1").read_bytes())
    (folder / "data_batch_1").write_bytes(pickle.dumps({**batch, b"batch_label": Payload(marker)}))
    r = cli(
        "extract",
        "--task",
        "cifar10",
        "--backbone",
        "lstm",
        "--limit",
        "8",
        "--data-dir",
        str(tmp_path / "data"),
        "--task-opt",
        "download=false",
    )
    assert r.exit_code == 1, r.output
    assert (
        f"{folder / 'data_batch_1'} holds a reference to io.open, which a CIFAR-10 batch never holds"
        in r.output
    )
    assert "Traceback" not in r.output and not list((home / "features").rglob("*.h5"))


def test_a_crafted_tape_record_is_refused_naming_the_record(tmp_path, marker):
    folder = tmp_path / "remote_homology"
    folder.mkdir()
    records = protein_records(4, 0)
    records[2]["primary"] = SystemPayload(marker)
    for split in get_task("remote_homology").spec.splits:
        write_lmdb(folder / f"remote_homology_{split}.lmdb", records)
    with pytest.raises(
        DataError,
        match=r"remote_homology_train.lmdb \(record 2\) holds a reference to "
        r"(posix|os|nt)\.system, which a TAPE record never holds; refused",
    ):
        get_task("remote_homology").load("train", tmp_path)


def test_crafted_weights_in_a_model_folder_are_refused(cli, home, tmp_path, marker):
    folder = save_tiny_gpt2(tmp_path / "model", n_layer=1)
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({**state, "x": Payload(marker)}, folder / "pytorch_model.bin")
    r = cli("extract", "--task", "digits", "--backbone", str(folder), "--limit", "20")
    assert r.exit_code == 1, r.output
    assert (
        "hold a reference to io.open, which model weights never hold; refused without running it" in r.output
    )


def test_a_model_folder_with_its_own_code_is_refused_without_asking(home, tmp_path, marker):
    """transformers asks on a terminal whether to run such code; a "y" waiting on stdin must not answer it."""
    from click.testing import CliRunner

    from reservoir.cli import main

    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "customnet",
                "auto_map": {"AutoConfig": "custom.Config", "AutoModel": "custom.Model"},
            }
        )
    )
    (folder / "custom.py").write_text(f"open({str(marker)!r}, 'w')\n")
    r = CliRunner().invoke(
        main, ["extract", "--task", "digits", "--backbone", str(folder), "--limit", "20"], input="y\n"
    )
    assert r.exit_code == 1, r.output
    assert "needs code of its own to load" in r.output and "never runs code from a model folder" in r.output


@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
def test_what_the_official_pickles_hold_still_loads(protocol):
    """Dicts, lists, bytes, strings, numbers, numpy arrays and scalars: what CIFAR-10 and TAPE files hold."""
    record = {
        b"data": np.arange(12, dtype=np.uint8).reshape(3, 4),
        "labels": [1, 2, 3],
        "name": "x",
        "f": 0.5,
        "scalar": np.int64(7),
        "t": (1, b"b"),
        "floats": np.linspace(0, 1, 5, dtype=np.float32),
        "none": None,
    }
    back = pickles.loads(pickle.dumps(record, protocol=protocol), "f", "a record", "fix")
    np.testing.assert_array_equal(back[b"data"], record[b"data"])
    np.testing.assert_array_equal(back["floats"], record["floats"])
    assert (
        back["scalar"] == 7
        and back["labels"] == [1, 2, 3]
        and back["t"] == (1, b"b")
        and back["none"] is None
    )


@pytest.mark.parametrize(
    "name", ["builtins.eval", "subprocess.Popen", "numpy.load", "torch.load", "os.system"]
)
def test_every_other_global_is_refused(name):
    module, attr = name.rsplit(".", 1)
    crafted = b"\x80\x02c" + module.encode() + b"\n" + attr.encode() + b"\nX\x01\x00\x00\x001\x85R."
    with pytest.raises(
        DataError, match=rf"f.pkl holds a reference to {module}\.{attr}, which a record never holds"
    ):
        pickles.loads(crafted, "f.pkl", "a record", "fix")

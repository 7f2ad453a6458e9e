"""Readouts beyond the last token: ``mean`` (over real tokens) and ``all`` (every position), in the
feature file's layout and the identity, and refused where the task cannot take them."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from reservoir.config import ExtractConfig
from reservoir.extract.run import extract
from reservoir.extract.store import read_depths
from reservoir.model.backbones import load_backbone
from reservoir.model.reservoir import Reservoir
from reservoir.tasks import make_task

pytestmark = pytest.mark.usefixtures("home", "one_thread")


def user_file(tmp_path, variable: bool, n: int = 40, t: int = 9):
    """A dense user file of ``n`` rows of ``t`` tokens of 3 values (lengths 2..t when ``variable``)."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((n, t, 3)).astype(np.float32), "y": np.arange(n) % 2}
    if variable:
        arrays["lengths"] = rng.integers(2, t + 1, n)
        for i, length in enumerate(arrays["lengths"]):
            arrays["x"][i, length:] = 0
    path = tmp_path / ("var.npz" if variable else "fixed.npz")
    np.savez(path, **arrays)
    return path, arrays


def extracted(tmp_path, path, backbone, readout, name=None):
    cfg = ExtractConfig(
        task=f"file:{path}",
        backbone=str(backbone),
        depths="0,1,2",
        dtype="float32",
        compile=False,
        batch_size=16,
        readout=readout,
        out=tmp_path / (name or f"{readout}.h5"),
    )
    out = extract(cfg, progress=False)
    with h5py.File(out) as f:
        return {s: read_depths(f, s) for s in ("train", "test")}, out


def reference_states(tiny_gpt2, path, row: np.ndarray, length: int) -> torch.Tensor:
    """Every position's state ``(n_depths, length, d)`` of one row run alone, cut to its length."""
    task = make_task(f"file:{path}", {}, 0)
    model = Reservoir(task.spec, load_backbone(str(tiny_gpt2), 0), seed=0).eval()
    tokens = torch.from_numpy(task.encode(row[None, :length]))
    with torch.no_grad():
        return model(tokens, torch.tensor([length]), [0, 1, 2], torch.arange(length)[None])[0]


def test_mean_readout_is_the_mean_over_real_tokens_whatever_the_batch(tmp_path, tiny_gpt2):
    """``--readout mean`` stores, per depth, the mean of the states of a row's real tokens: each row
    equals that row run alone and averaged, however long the other rows of its batch were."""
    path, arrays = user_file(tmp_path, variable=True)
    stored, _ = extracted(tmp_path, path, tiny_gpt2, "mean")
    X = np.concatenate([stored["train"][0], stored["test"][0]])
    assert X.shape[1:3] == (3, 1)
    task = make_task(f"file:{path}", {}, 0)
    data = {s: task.load(s, tmp_path, None) for s in ("train", "test")}
    rows = [(d.inputs[i], int(d.lengths[i])) for d in data.values() for i in range(len(d))]
    for i in (0, 7, len(rows) - 1):
        row, length = rows[i]
        want = reference_states(tiny_gpt2, path, np.asarray(row), length).mean(1).numpy()
        np.testing.assert_allclose(X[i, :, 0], want, rtol=1e-4, atol=1e-5)


def test_all_readout_keeps_every_position_and_its_last_row_is_the_last_readout(tmp_path, tiny_gpt2):
    """``--readout all`` on a task of fixed length stores ``(N, depths, T, d)``: each position's state
    (the same as the row alone), the last position equal to the ``last`` readout's feature, and a file
    of its own (the readout is in the identity, so neither is returned for the other)."""
    path, arrays = user_file(tmp_path, variable=False)
    every, every_path = extracted(tmp_path, path, tiny_gpt2, "all")
    last, last_path = extracted(tmp_path, path, tiny_gpt2, "last")
    assert every_path != last_path
    X_all, X_last = every["test"][0], last["test"][0]
    assert X_all.shape[1:3] == (3, 9) and X_last.shape[1:3] == (3, 1)
    np.testing.assert_allclose(X_all[:, :, -1], X_last[:, :, 0], rtol=1e-5, atol=1e-6)
    task = make_task(f"file:{path}", {}, 0)
    test = task.load("test", tmp_path, None)
    want = reference_states(tiny_gpt2, path, np.asarray(test.inputs[3]), 9).numpy()
    np.testing.assert_allclose(X_all[3], want, rtol=1e-4, atol=1e-5)
    with h5py.File(every_path) as f:
        assert f.attrs["readout"] == "all"


@pytest.mark.parametrize(
    "task, readout, message",
    [
        ("variable", "all", "--readout all stores every position's state and needs a task of fixed length"),
        ("bit_memory", "mean", "reads its last"),
    ],
)
def test_a_readout_the_task_cannot_take_is_refused_before_any_file(
    tmp_path, tiny_gpt2, cli, task, readout, message
):
    if task == "variable":
        task = f"file:{user_file(tmp_path, variable=True)[0]}"
    out = tmp_path / "refused.h5"
    r = cli(
        "extract", "--task", task, "--backbone", str(tiny_gpt2), "--readout", readout, "--limit", "20",
        "--out", str(out),
    )  # fmt: skip
    assert r.exit_code == 1, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not out.exists() and not list(tmp_path.glob("refused*"))


def test_an_ids_row_of_the_input_layer_does_not_depend_on_the_vocabulary_size():
    """An id's embedding row is the same in a vocabulary of 5 as of 10 or 11 ids, at widths where the table is not
    whole blocks of 16 values (torch draws a partial last block again), and unchanged where it is (GPT-2's 768)."""
    from reservoir.model.input_layer import make_input_layer
    from reservoir.tasks import TaskSpec

    def table(vocab, width, seed=3):
        spec = TaskSpec("t", "ids", seq_len=4, n_classes=2, vocab_size=vocab)
        return make_input_layer(spec, width, seed).weight.detach()

    for width in (50, 3, 768):
        small, large, odd = table(5, width), table(10, width), table(11, width)
        assert torch.equal(small, large[:5]) and torch.equal(large, odd[:10])
    drawn = torch.empty(10 * 768).normal_(generator=torch.Generator().manual_seed(3))
    assert torch.equal(table(10, 768), drawn.view(10, 768))

"""PNG plots (reservoir.report.plots) and attention maps read from the backbones (reservoir.report.attention)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from reservoir.errors import UsageError  # noqa: E402
from reservoir.report import plots  # noqa: E402
from reservoir.report.attention import first_layer_attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def read_png(path: Path, size: tuple[float, float]) -> np.ndarray:
    """The PNG's pixels, checked: the figure's size at plots.DPI, not blank, no temp file left beside it."""
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.shape[:2] == (round(size[1] * plots.DPI), round(size[0] * plots.DPI))
    assert pixels[..., :3].var() > 0
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    return pixels


def made_up_depths():
    gpt2 = dict(enumerate([50.0, 61, 72, 85, 93, 97, 99, 100, 100, 100, 100, 100, 100]))
    rnd = dict(enumerate([50.0, 55, 58, 63, 70, 72, 74, 75, 75, 76, 76, 75, 75]))
    return {"gpt2": gpt2, "gpt2-random": rnd, "lstm": {0: 50.0, 1: 52, 2: 53, 3: 54}}


def test_depth_plot_with_baselines_chosen_and_paper(tmp_path):
    out = tmp_path / "new" / "folder" / "depth.png"
    got = plots.depth_plot(
        made_up_depths(),
        out,
        title="bit_xor by depth",
        baselines={"majority": 50.0, "raw-input linear": 51.3, "random tanh features": 56.7},
        chosen={"gpt2": 8, "gpt2-random": 10, "lstm": 3},
        paper={"gpt2": {12: 100.0}, "lstm": {3: 60.9}},
    )
    assert got == out
    read_png(out, plots.DEPTH_SIZE)


def test_depth_plot_alone_and_bad_input(tmp_path):
    read_png(
        plots.depth_plot({"lstm": {0: 40.0, 3: 55.0}}, tmp_path / "d.png", title="one curve"),
        plots.DEPTH_SIZE,
    )
    with pytest.raises(UsageError, match="at least one curve"):
        plots.depth_plot({}, tmp_path / "x.png", title="none")
    with pytest.raises(UsageError, match=r"chosen depth 5 of 'lstm' has no accuracy"):
        plots.depth_plot({"lstm": {0: 40.0, 3: 55.0}}, tmp_path / "x.png", title="t", chosen={"lstm": 5})
    with pytest.raises(UsageError, match="without a curve"):
        plots.depth_plot({"lstm": {0: 40.0}}, tmp_path / "x.png", title="t", chosen={"gpt2": 0})
    assert not (tmp_path / "x.png").exists()


def test_training_curves(tmp_path):
    def history(rate):
        return [
            {
                "step": s,
                "loss": 0.7 * np.exp(-s * rate / 300),
                "val_accuracy": min(1.0, 0.5 + s * rate / 1000),
            }
            for s in range(100, 1100, 100)
        ]

    runs = {
        "lr=1e-3": history(1.0),
        "lr=1e-4": history(0.4) + [{"step": 1100, "loss": 0.1, "val_accuracy": None}],
    }
    out = plots.training_curves(runs, tmp_path / "train.png", title="bit_xor end-to-end")
    read_png(out, plots.TRAINING_SIZE)


@pytest.mark.parametrize("n_heads, heads", [(12, None), (4, [3, 1]), (1, None)])
def test_attention_maps(tmp_path, n_heads, heads):
    rng = np.random.default_rng(0)
    w = np.tril(rng.random((n_heads, 10, 10)))
    w /= w.sum(-1, keepdims=True)
    out = plots.attention_maps(
        w, tmp_path / "att.png", title="made up", tokens=list("0110100110"), heads=heads
    )
    read_png(out, plots.attention_layout(len(heads or range(n_heads)))[2])


def test_attention_maps_refuses_bad_input(tmp_path):
    w = np.full((2, 3, 3), 1 / 3)
    with pytest.raises(UsageError, match=r"shape \(n_heads, T, T\); got \(3, 3\)"):
        plots.attention_maps(w[0], tmp_path / "a.png", title="t")
    with pytest.raises(UsageError, match=r"heads \[2\] are not in \[0, 1\]"):
        plots.attention_maps(w, tmp_path / "a.png", title="t", heads=[2])
    with pytest.raises(UsageError, match="2 token labels for 3 tokens"):
        plots.attention_maps(w, tmp_path / "a.png", title="t", tokens=["a", "b"])


@pytest.mark.parametrize(
    "call",
    [
        lambda p: plots.depth_plot({"a": {0: 1.0}}, p, title="t"),
        lambda p: plots.training_curves({"a": [{"step": 1, "loss": 1.0, "val_accuracy": 0.5}]}, p, title="t"),
        lambda p: plots.attention_maps(np.ones((1, 2, 2)) / 2, p, title="t"),
    ],
)
def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch, call):
    import builtins

    real_import = builtins.__import__

    def without_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_matplotlib)
    with pytest.raises(UsageError, match=r"matplotlib is not installed; pip install 'reservoir\[plot\]'"):
        call(tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def hf_attentions(cls, folder: Path, task_name: str, example: int, seed: int = 0):
    """Hugging Face's own ``output_attentions`` (eager) for the input layer's embedding of the same example."""
    from reservoir.model.input_layer import make_input_layer
    from reservoir.tasks import make_task

    task = make_task(task_name, {}, seed)
    data = task.read("test", None, example + 1)  # the split's rows up to the example, in order
    model = cls.from_pretrained(folder, attn_implementation="eager").eval()
    x = make_input_layer(task.spec, model.config.hidden_size, seed, "paper")(
        torch.from_numpy(task.encode(data.inputs[example : example + 1]))
    )
    with torch.no_grad():
        return [a[0].numpy() for a in model(inputs_embeds=x, output_attentions=True).attentions]


def check_probabilities(w: np.ndarray, causal: bool) -> None:
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert (w >= 0).all()
    if causal:
        assert np.triu(w, 1).max() == 0.0


def test_gpt2_attention_equals_hugging_face(tiny_gpt2):
    from transformers import GPT2Model

    expected = hf_attentions(GPT2Model, tiny_gpt2, "bit_xor", example=3)
    for layer in (0, 1):
        w, labels = first_layer_attention("bit_xor", str(tiny_gpt2), layer=layer, example=3)
        assert w.shape == (4, 10, 10) and w.dtype == np.float32
        check_probabilities(w, causal=True)
        np.testing.assert_allclose(w, expected[layer], atol=1e-6)
    assert set(labels) <= {"0", "1"} and len(labels) == 10


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_rotary_and_encoder_attention_equal_hugging_face(tmp_path, family):
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    shape = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=50,
        max_position_embeddings=64,
    )
    if family == "llama":  # grouped key-value heads, rotary positions
        cls, model = LlamaModel, LlamaModel(LlamaConfig(num_key_value_heads=2, **shape))
    else:
        cls, model = BertModel, BertModel(BertConfig(**shape))
    model.save_pretrained(tmp_path / family)
    expected = hf_attentions(cls, tmp_path / family, "bit_xor", example=1)
    for layer in (0, 1):
        w, _ = first_layer_attention("bit_xor", str(tmp_path / family), layer=layer, example=1)
        check_probabilities(w, causal=family == "llama")
        np.testing.assert_allclose(w, expected[layer], atol=1e-6)


def test_attention_refuses_bad_layer_and_example(tiny_gpt2):
    with pytest.raises(UsageError, match=r"layer 2 is out of range .* \[0, 1\]"):
        first_layer_attention("bit_xor", str(tiny_gpt2), layer=2)
    with pytest.raises(
        UsageError, match="split 'test' of task 'bit_xor' has 1000 examples; choose an example below"
    ):
        first_layer_attention("bit_xor", str(tiny_gpt2), example=1000)
    with pytest.raises(UsageError, match="outside the 5 examples --limit keeps"):
        first_layer_attention("bit_xor", str(tiny_gpt2), example=5, limit=5)


def test_attention_with_a_training_checkpoint(tiny_gpt2, home):
    from reservoir.config import TrainConfig
    from reservoir.errors import IdentityError
    from reservoir.report.attention import _checkpoint_model
    from reservoir.train import train

    cfg = TrainConfig(
        task="bit_xor",
        backbone=str(tiny_gpt2),
        task_options={"n_train": "256", "n_test": "64"},
        steps=4,
        batch_size=16,
        eval_every=2,
        patience=0,
        lr=(0.05,),
        checkpoint_dir=home / "ckpt",
        data_dir=home / "data",
    )
    train(cfg, progress=False)
    (ckpt,) = (home / "ckpt").glob("*.pt")
    reservoir, ident = _checkpoint_model(ckpt, "bit_xor", str(tiny_gpt2))
    saved = torch.load(ckpt, weights_only=False)["state"]["best_params"]
    assert torch.equal(next(reservoir.input_layer.parameters()), saved[0])  # the trained input layer
    trained, _ = first_layer_attention("bit_xor", str(tiny_gpt2), checkpoint=ckpt)
    untrained, _ = first_layer_attention("bit_xor", str(tiny_gpt2))
    check_probabilities(trained, causal=True)
    assert not np.allclose(trained, untrained)
    with pytest.raises(IdentityError, match="trained with backbone") as refused:
        first_layer_attention("bit_xor", "gpt2-random", checkpoint=ckpt)
    assert f"pass --backbone with the model it was trained on (recorded as '{tiny_gpt2.name}')" in str(
        refused.value
    )


def test_cli_attention_writes_a_png(cli, tiny_gpt2, tmp_path):
    out = tmp_path / "plots" / "attention.png"
    r = cli(
        "attention",
        "--task",
        "bit_xor",
        "--backbone",
        str(tiny_gpt2),
        "--layer",
        "1",
        "--example",
        "2",
        "--out",
        str(out),
    )
    assert r.exit_code == 0, r.output
    assert r.output.strip() == str(out)
    read_png(out, plots.attention_layout(4)[2])


def test_cli_attention_refuses_an_lstm(cli, tmp_path):
    r = cli("attention", "--task", "bit_xor", "--backbone", "lstm", "--out", str(tmp_path / "a.png"))
    assert r.exit_code == 1
    assert "backbone 'lstm' (lstm) has no attention to show; choose a transformer backbone" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "a.png").exists()

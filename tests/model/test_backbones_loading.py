"""The model in: a model object in memory, a hub revision pin, and weights kept in bfloat16 or float16."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from reservoir import api
from reservoir.errors import BackboneError
from reservoir.extract.store import read_depths
from reservoir.model import backbones
from reservoir.model.backbones import load_backbone, split_revision

pytestmark = pytest.mark.usefixtures("home", "one_thread")

SMALL = {"limit": 40, "depths": "0,1,2", "dtype": "float32", "compile": False, "batch_size": 16}


def features(path) -> dict[str, np.ndarray]:
    with h5py.File(path) as f:
        return {s: read_depths(f, s)[0] for s in ("train", "test")}


def test_a_model_object_gives_the_features_of_its_saved_folder_and_stays_as_it_was(tiny_gpt2):
    """``api.extract`` and ``ReservoirFeatures`` take the model object itself: the features equal those of
    the same model saved with ``save_pretrained`` and loaded by folder, bit for bit, and the caller's
    model keeps its dtype, its gradients and its mode (extraction works on a copy)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_gpt2).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    by_object = api.extract("digits", model, **SMALL)
    by_folder = api.extract("digits", str(tiny_gpt2), **SMALL)
    assert by_object != by_folder  # each has its own file: the name is part of the identity
    a, b = features(by_object), features(by_folder)
    for split in a:
        np.testing.assert_array_equal(a[split], b[split])
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    X = np.random.default_rng(0).standard_normal((6, 5, 3)).astype(np.float32)
    settings = {"depth": [0, 2], "dtype": "float32"}
    np.testing.assert_array_equal(
        api.ReservoirFeatures(backbone=model, **settings).fit_transform(X),
        api.ReservoirFeatures(backbone=str(tiny_gpt2), **settings).fit_transform(X),
    )


def test_a_model_object_with_hooks_is_another_model_and_its_features_are_its_own(tiny_gpt2):
    """A forward hook (an ablation) changes what the same weights compute: the hooked object is named apart
    (``:altered-``, by the hook's code and the values it holds), so its features are extracted, never the
    unhooked file reused; with the hook removed, that file is found again."""
    from transformers import AutoModel

    from reservoir.model.backbones import register_object

    model = AutoModel.from_pretrained(tiny_gpt2)
    plain = api.extract("digits", model, **SMALL)
    hook = model.h[1].mlp.register_forward_hook(lambda module, args, out: out * 0)
    ablated = api.extract("digits", model, **SMALL)
    assert ablated != plain and ":altered-" in register_object(model)
    a, b = features(plain), features(ablated)
    assert not np.array_equal(a["test"][:, -1], b["test"][:, -1]) and np.array_equal(
        a["test"][:, 0], b["test"][:, 0]
    )
    half = model.h[1].mlp.register_forward_hook(lambda module, args, out: out * 0.5)
    both = register_object(model)
    half.remove()
    assert register_object(model) != both  # another hook: another model
    hook.remove()
    assert api.extract("digits", model, **SMALL) == plain


def test_weights_loaded_in_bfloat16_take_half_the_memory_and_stay_within_its_tolerance(tiny_gpt2):
    """``load_dtype="bfloat16"``: every weight is kept in bf16 (half the bytes of float32), the backbone
    computes in it, the identity records it, and the features are float32's within bf16's rounding."""
    full = load_backbone(str(tiny_gpt2), 0)
    half = load_backbone(str(tiny_gpt2), 0, dtype="bfloat16")
    size = lambda m: sum(t.numel() * t.element_size() for t in m.state_dict().values())  # noqa: E731
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert size(half) * 2 == size(full)
    settings = {k: v for k, v in SMALL.items() if k != "dtype"}
    f32 = features(api.extract("digits", str(tiny_gpt2), dtype="float32", **settings))
    path = api.extract("digits", str(tiny_gpt2), load_dtype="bfloat16", **settings)
    bf16 = features(path)
    with h5py.File(path) as f:
        assert f.attrs["dtype"] == "bfloat16" and json.loads(f.attrs["identity"])["load_dtype"] == "bfloat16"
    for split in f32:
        err = np.abs(bf16[split] - f32[split]).max() / np.abs(f32[split]).max()
        assert 0 < err < 3e-2


def test_load_dtype_refuses_what_cannot_compute_in_it(tiny_gpt2, cli):
    r = cli("extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--load-dtype", "bfloat16",
            "--engine", "openvino", "--limit", "20")  # fmt: skip
    assert r.exit_code == 2 and "only the PyTorch engine" in r.output and "Traceback" not in r.output
    r = cli("extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--load-dtype", "bfloat16",
            "--dtype", "int8", "--limit", "20")  # fmt: skip
    assert r.exit_code == 2 and "load them in float32" in r.output


def test_a_hub_revision_is_pinned_and_part_of_the_name(monkeypatch):
    """``hf:ID@REVISION`` reads the config and weights at that revision, and the label (hence the identity
    and the feature file's folder) carries it."""
    assert split_revision("org/model@v1.2") == ("org/model", "v1.2")
    assert split_revision("org/model") == ("org/model", None)
    assert backbones.label("hf:org/model@abc123") == "model@abc123"
    seen = {}

    def fake(cls, path, **kwargs):
        seen.update(kwargs, path=path)
        raise OSError("offline")

    monkeypatch.setattr(backbones, "from_pretrained", fake)
    with pytest.raises(BackboneError, match="cannot load the config of 'org/model'"):
        load_backbone("hf:org/model@abc123")
    assert seen == {"path": "org/model", "revision": "abc123"}


def test_an_encoder_saved_alone_from_an_encoder_decoder_family_loads(tmp_path):
    """A ``T5EncoderModel`` folder (how sentence-T5-style encoders ship) is read as the encoder its config's
    ``architectures`` names, not as the whole encoder-decoder ``AutoModel`` would build: its deepest
    depth equals the encoder's own last hidden state, and its random twin builds the encoder alone."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    T5EncoderModel(config).save_pretrained(tmp_path / "t5e")
    backbone = load_backbone(str(tmp_path / "t5e"))
    assert backbone.n_layers == 2 and backbone.d_model == 32
    model = T5EncoderModel.from_pretrained(tmp_path / "t5e").eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = model(inputs_embeds=x).last_hidden_state
        got = backbone(x, torch.tensor([5, 5]), [0, 2], torch.arange(5).expand(2, 5))
    torch.testing.assert_close(got[:, 1], want)
    twin = load_backbone(str(tmp_path / "t5e") + "-random", seed=1)
    assert type(twin.model).__name__ == "T5EncoderModel" and twin.n_layers == 2


def test_a_vision_transformer_with_no_position_table_is_refused_in_words(tmp_path):
    """A pixel-only vision transformer is taken by the vision adapter by its shape; one that keeps no table of
    absolute patch positions (BEiT) cannot take the input layer's tokens in place of its patches, and says so."""
    from transformers import BeitConfig, BeitModel

    config = BeitConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        image_size=32, patch_size=8)  # fmt: skip
    BeitModel(config).save_pretrained(tmp_path / "beit")
    with pytest.raises(BackboneError, match="has no table of absolute patch positions"):
        load_backbone(str(tmp_path / "beit"))


def test_a_model_larger_than_the_cards_free_memory_is_refused_up_front(tiny_gpt2, monkeypatch):
    """Before anything moves to a CUDA card, a backbone larger than its free memory is refused naming its size
    in the compute dtype and the card's free memory (the card's answer is stood in for here)."""
    from reservoir.errors import DeviceError
    from reservoir.model.devices import check_fits

    backbone = load_backbone(str(tiny_gpt2))
    n = sum(t.numel() for t in (*backbone.parameters(), *backbone.buffers()))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * n - 1, 80 << 30))
    with pytest.raises(
        DeviceError, match=rf"holds {n:,} values .* in float32\), more than the .* free on cuda:0"
    ):
        check_fits(backbone, torch.device("cuda:0"), "float32", "tiny")
    check_fits(backbone, torch.device("cuda:0"), "bfloat16", "tiny")  # half the bytes: fits
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: pytest.fail("the CPU asks no card"))
    check_fits(backbone, torch.device("cpu"), "float32", "tiny")


def test_a_model_object_the_adapters_cannot_run_is_refused_naming_it(tmp_path, monkeypatch):
    """A module that is neither a transformers model nor a :class:`Backbone` is refused when handed over;
    one whose blocks change the number of tokens (Longformer pads to its attention window) is refused on
    building; a failure of the library's forward under the generic adapter is a BackboneError naming the
    model type, not a bare library exception."""
    import transformers as t

    from tests.zoo import save_tiny

    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)
    with pytest.raises(BackboneError, match="TransformerEncoder is neither a transformers"):
        api.extract("bit_xor", encoder, **SMALL)
    config = t.LongformerConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, attention_window=4
    )
    with pytest.raises(BackboneError, match=r"'longformer' model return hidden states of shape \(1, 4, 32\)"):
        api.extract("bit_xor", t.LongformerModel(config), **SMALL)
    backbone = load_backbone(str(save_tiny("gpt_neox", tmp_path / "neox")))

    def fails(**kwargs):
        raise ValueError("not enough values to unpack")

    monkeypatch.setattr(backbone.model, "forward", fails)
    x, lengths = torch.zeros(2, 3, backbone.d_input), torch.tensor([3, 3])
    with pytest.raises(
        BackboneError, match=r"gpt_neox's own forward failed .*\(ValueError: not enough values"
    ):
        backbone.states(x, lengths, [1], torch.tensor([[2], [2]]))


def test_a_model_whose_blocks_are_not_batch_first_is_refused_before_any_feature():
    """XLNet's blocks take and return (tokens, rows, width): hooks reading (rows, tokens, width) would read the
    wrong rows, silently where a batch has as many rows as tokens. The generic adapter refuses it on building."""
    import transformers as t

    model = t.XLNetModel(t.XLNetConfig(d_model=32, n_layer=2, n_head=4, d_inner=64))
    with pytest.raises(BackboneError, match=r"'xlnet' model return hidden states of shape \(2, 1, 32\)"):
        api.extract("bit_xor", model, **SMALL)

"""Every architecture the adapters cover, each a tiny random model saved with save_pretrained and
loaded by folder (tests/zoo.py): features at every depth equal the library's own model cut at that
depth, the -random twin extracts, a short training step updates exactly the requested groups, and
attention maps are the library's own attention weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from reservoir.model.backbones import load_backbone
from reservoir.model.backbones.hf import HFBackbone
from tests.zoo import ARCHITECTURES, KINDS, LAYERS, MORE, save_tiny

#: DINOv2's blocks take an attention mask, and its attention returns its weights, from transformers 5.18 on
DINOV2_MASK = tuple(int(x) for x in __import__("transformers").__version__.split(".")[:2]) >= (5, 18)

pytestmark = pytest.mark.usefixtures("one_thread")
VISION = {
    "vit",
    "deit",
    "dinov2",
    "clip_vision",
    "siglip_vision",
    "vit_msn",
    "ijepa",
    "dinov2_with_registers",
}
#: where each architecture keeps its blocks, named independently of the adapters' own search
BLOCKS = {
    "gpt2": "h",
    "gptj": "h",
    "opt": "decoder.layers",
    "bert": "encoder.layer",
    "roberta": "encoder.layer",
    "electra": "encoder.layer",
    "deberta-v2": "encoder.layer",
    "deberta-v2-conv": "encoder.layer",
    "bert_generation": "encoder.layer",
    "opt_project": "decoder.layers",
    "t5": "block",
    "dinov2": "encoder.layer",
    "vit_msn": "layers",
    "ijepa": "layers",
    "dinov2_with_registers": "encoder.layer",
    "albert": "encoder.albert_layer_groups",
    "clip_vision": "encoder.layers",
    "siglip_vision": "encoder.layers",
    "falcon": "h",
    "bloom": "h",
    "mpt": "blocks",
    "gpt_bigcode": "h",
    "distilbert": "transformer.layer",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    return {kind: save_tiny(kind, root / kind) for kind in ARCHITECTURES}


@pytest.fixture(scope="module")
def more_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo-more")
    return {kind: save_tiny(kind, root / kind) for kind in MORE}


def test_the_zoo_covers_every_kind():
    assert len(ARCHITECTURES) >= 14
    kinds = {KINDS.get(a, "decoder") for a in ARCHITECTURES}
    assert kinds == {"decoder", "encoder", "encoder-decoder", "vision", "state-space"}


def library_model(folder, kind: str, k: int) -> nn.Module:
    """The library's own base model (the encoder of an encoder-decoder) with its blocks cut to ``k``."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    if model.config.is_encoder_decoder:
        model = model.get_encoder()
    parent_name, _, name = BLOCKS.get(kind, "layers").rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, name, nn.ModuleList(list(getattr(parent, name))[:k]))
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(model.config, attr):
            setattr(model.config, attr, k)
    return model


def inputs(backbone, kind: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = 64 if kind in VISION else 9  # vision: as many tokens as the model has patches
    lengths = torch.tensor([n, n]) if kind in VISION else torch.tensor([n, 5])
    x = torch.randn(2, n, backbone.input_width, generator=g)
    return x, lengths, (lengths - 1)[:, None]


def reference(folder, kind: str, backbone, x, lengths, readout, k: int) -> torch.Tensor:
    model = library_model(folder, kind, k)
    if kind in VISION:  # the FPT input layer replaces the patch embedding: feed patches + patch positions
        emb = (
            model.embeddings
        )  # ViT, DeiT, DINOv2: a parameter and patch_embeddings; CLIP, SigLIP: an embedding
        table = (
            emb.position_embeddings
            if hasattr(emb, "patch_embeddings")
            else emb.position_embedding.weight[None]
        )
        n_patches = emb.patch_embeddings.num_patches if hasattr(emb, "patch_embeddings") else emb.num_patches
        positions = table[:, table.shape[1] - n_patches :]
        emb.forward = lambda *a, **kw: x + positions
        out = model(pixel_values=torch.zeros(2, 3, 32, 32)).last_hidden_state
    else:
        kwargs = {"inputs_embeds": x}
        if KINDS.get(kind, "decoder") in ("encoder", "encoder-decoder"):  # by the zoo, not the adapter
            kwargs["attention_mask"] = (torch.arange(x.shape[1])[None] < lengths[:, None]).long()
        if (
            kind.startswith("deberta-v2") and k == 0
        ):  # DeBERTa's encoder fails with no layers: its embeddings' output
            out = model.embeddings(inputs_embeds=x, mask=kwargs["attention_mask"])
        else:
            out = model(**kwargs).last_hidden_state
    return torch.gather(out, 1, readout[:, :, None].expand(-1, -1, out.shape[-1]))


@pytest.mark.parametrize("kind", ARCHITECTURES + MORE)
def test_every_depth_equals_the_library_model_cut_there(request, kind):
    folders = request.getfixturevalue("more_folders" if kind in MORE else "folders")
    backbone = load_backbone(str(folders[kind]))
    assert backbone.n_layers == LAYERS
    x, lengths, readout = inputs(backbone, kind)
    with torch.inference_mode():
        ours = backbone(x, lengths, list(range(LAYERS + 1)), readout)
        for k in range(LAYERS + 1):
            want = reference(folders[kind], kind, backbone, x, lengths, readout, k)
            torch.testing.assert_close(ours[:, k], want, atol=1e-5, rtol=1e-5, msg=f"{kind} depth {k}")
    assert not torch.allclose(ours[:, 1], ours[:, LAYERS])  # the blocks do something
    assert ours.shape[-1] == backbone.d_model  # the width feature files are made for
    assert backbone.causal == (KINDS.get(kind, "decoder") in ("decoder", "state-space"))


def alone_equals_beside_others(backbone, kind: str) -> None:
    """A 3-token row gives the same features alone as beside rows of 4, 5, 9 and 16 tokens: square and other
    widths, so a vision model's positions for rows of any length never follow the batch's padded width."""
    g = torch.Generator().manual_seed(0)
    row = torch.randn(1, 3, backbone.input_width, generator=g)
    with torch.inference_mode():
        alone = backbone(row, torch.tensor([3]), [1, LAYERS], torch.tensor([[2]]))
        for n in (4, 5, 9, 16):
            x = torch.cat(
                [nn.functional.pad(row, (0, 0, 0, n - 3)), torch.randn(1, n, row.shape[2], generator=g)]
            )
            together = backbone(x, torch.tensor([3, n]), [1, LAYERS], torch.tensor([[2], [n - 1]]))
            torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-5, msg=f"{kind} beside {n}")


@pytest.mark.parametrize("kind", ARCHITECTURES + MORE)
def test_a_rows_features_do_not_depend_on_its_batch_mates(request, kind):
    folders = request.getfixturevalue("more_folders" if kind in MORE else "folders")
    alone_equals_beside_others(load_backbone(str(folders[kind])), kind)


def test_a_model_whose_attention_ignores_its_padding_mask_runs_eager_attention(tmp_path):
    """Gemma run bidirectionally through its own flag: where its configured attention lets a padded row
    attend to the padding, the adapter runs eager attention, and a row is the same alone and padded."""
    alone_equals_beside_others(load_backbone(str(save_tiny("gemma_bidirectional", tmp_path))), "gemma")


def test_a_bidirectional_model_without_an_attention_mask_refuses_padded_rows(tmp_path):
    """FNet's forward takes no attention mask: rows of one length run, rows padded to a common length are
    refused in words rather than mixing in the padding."""
    from reservoir.errors import BackboneError

    backbone = load_backbone(str(save_tiny("fnet", tmp_path)))
    x = torch.randn(2, 6, backbone.input_width, generator=torch.Generator().manual_seed(0))
    readout = torch.tensor([[5], [5]])
    with torch.inference_mode():
        full = backbone(x, torch.tensor([6, 6]), [1, LAYERS], readout)
        torch.testing.assert_close(full[1:], backbone(x[1:], torch.tensor([6]), [1, LAYERS], readout[1:]))
        with pytest.raises(BackboneError, match="rows padded to a common length change this 'fnet' model's"):
            backbone(x, torch.tensor([6, 3]), [1], torch.tensor([[5], [2]]))


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_the_random_twin_extracts(folders, kind, home):
    from reservoir import api
    from reservoir.extract.store import open_features

    path = api.extract("digits", f"{folders[kind]}-random", limit=10, depths="0,3", dtype="float32")
    with open_features(path) as f:
        features = f["train"]["features"][:]
    assert features.shape[1:3] == (2, 1) and np.isfinite(features).all()
    assert not np.allclose(features[:, 0], features[:, 1])


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_a_training_step_updates_exactly_the_requested_groups(folders, kind):
    from reservoir.tasks import get_task
    from reservoir.train.model import FPT, select_trainable

    task = get_task("digits")
    backbone = load_backbone(str(folders[kind]))
    model = FPT(task.spec, backbone, blocks=LAYERS, seed=0, dropout=0.0)
    groups = model.groups()
    present = [g for g in ("pos", "ln", "attn", "ff") if groups.get(g)]
    asked = ["input", *present[:2], "out"]
    params, _ = select_trainable(model, asked)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = task.load("train", ".", limit=8)
    tokens = torch.from_numpy(task.encode(data.inputs))
    logits = model(tokens, torch.from_numpy(np.asarray(data.lengths)))
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.from_numpy(np.asarray(data.labels)).reshape(-1).long()
    )
    torch.optim.SGD(params, lr=1.0).zero_grad()
    loss.backward()
    torch.optim.SGD(params, lr=1.0).step()
    chosen = {id(p) for g in asked for p in groups[g]}
    for name, p in model.named_parameters():
        changed = not torch.equal(p.detach(), before[name])
        assert changed == (id(p) in chosen and p.grad is not None and bool(p.grad.abs().sum())), name
    assert all(
        any(
            not torch.equal(p.detach(), before[n])
            for n, p in model.named_parameters()
            if id(p) in {id(q) for q in groups[g]}
        )
        for g in asked
    )


def test_a_group_a_model_lacks_is_skipped_with_a_note_naming_its_model_type(folders):
    from reservoir.tasks import get_task
    from reservoir.train.model import FPT, select_trainable

    model = FPT(get_task("digits").spec, load_backbone(str(folders["mamba"])), blocks=LAYERS, seed=0)
    params, notes = select_trainable(model, ["ff", "out"])
    assert notes == ["mamba has no 'ff' parameters; skipped"]
    assert {id(p) for p in params} == {id(p) for p in model.groups()["out"]}


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_every_parameter_an_fpt_of_fewer_blocks_trains_is_reached_by_the_loss(folders, kind):
    """An FPT that runs the first block of three trains only what runs: every group's parameters get a
    gradient, and those of the blocks that never run are in no group (nor in the parameter count)."""
    from reservoir.tasks import get_task
    from reservoir.train.model import FPT, param_counts, select_trainable

    task = get_task("digits")
    model = FPT(task.spec, load_backbone(str(folders[kind])), blocks=1, seed=0, dropout=0.0)
    params, _ = select_trainable(model, ["input", *model.groups(), "out"])
    data = task.load("train", ".", limit=8)
    logits = model(torch.from_numpy(task.encode(data.inputs)), torch.from_numpy(np.asarray(data.lengths)))
    logits.float().sum().backward()
    names = {id(p): n for n, p in model.named_parameters()}
    assert [names[id(p)] for p in params if p.grad is None] == []
    blocks = model.backbone.blocks
    later = {id(p) for b in blocks[1:] for p in b.parameters()} - {id(p) for p in blocks[0].parameters()}
    shared = len({id(b) for b in blocks}) == 1  # every depth runs one block (ALBERT): no block is left out
    assert bool(later) != shared and not later & {id(p) for p in params}
    tables = {id(p) for p in model.groups().get("pos", []) if p.ndim == 2 and p.shape[0] > task.spec.seq_len}
    reached = sum(task.spec.seq_len * p.shape[1] if id(p) in tables else p.numel() for p in params)
    assert sum(r["params"] for r in param_counts(model)) == reached  # a position table: the rows reached


ATTENTION = [a for a in ARCHITECTURES if a != "mamba"]


@pytest.mark.parametrize("kind", ATTENTION)
def test_attention_maps_are_the_library_attention_weights(folders, kind):
    from reservoir.model.reservoir import Reservoir
    from reservoir.report.attention import attention_probs
    from reservoir.tasks import get_task

    if kind == "dinov2" and not DINOV2_MASK:
        pytest.skip("DINOv2's attention returns its weights from transformers 5.18 (the floor is 5.17)")
    task = get_task("digits")
    backbone = load_backbone(str(folders[kind]))
    reservoir = Reservoir(task.spec, backbone, seed=0).eval()
    data = task.load("test", ".", limit=1)
    tokens = torch.from_numpy(task.encode(data.inputs))
    lengths = torch.tensor([tokens.shape[1]])
    ours = attention_probs(reservoir, tokens, lengths, layer=1)
    model = library_model(folders[kind], kind, LAYERS)
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        x = reservoir.input_layer(tokens)
        if kind in VISION:
            emb = model.embeddings
            positions = backbone.patch_positions(x.shape[1], x.dtype)
            emb.forward = lambda *a, **kw: x + positions
            out = model(pixel_values=torch.zeros(1, 3, 32, 32), output_attentions=True)
        else:
            out = model(inputs_embeds=backbone.add_positions(x), output_attentions=True)
    torch.testing.assert_close(ours, out.attentions[1].float(), atol=1e-5, rtol=1e-4)
    assert torch.allclose(ours.sum(-1), torch.ones(ours.shape[:-1]), atol=1e-4)


def test_a_state_space_model_has_no_attention_to_show(folders):
    backbone = load_backbone(str(folders["mamba"]))
    with pytest.raises(Exception, match="has no attention module"):
        backbone.attention_module(0)


@pytest.mark.parametrize("kind", ["gpt_neox", "t5", "mamba"])
def test_the_generic_adapter_says_it_runs_without_fast_paths(folders, kind, capsys):
    backbone = load_backbone(str(folders[kind]))
    assert type(backbone) is HFBackbone and not backbone.fast_paths and not backbone.openvino
    assert "no adapter of its own; the generic adapter runs it" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral", "qwen2", "qwen3"])
def test_families_with_the_readout_only_block_name_it(folders, kind):
    assert "readout-only last block" in load_backbone(str(folders[kind])).fast_paths


def test_mismatched_weights_are_refused_naming_them(folders, tmp_path):
    """A folder whose weights do not fit its config (a block's tensors missing) is refused, not
    extracted with random parts."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from reservoir.errors import BackboneError

    folder = tmp_path / "broken"
    shutil.copytree(folders["llama"], folder)
    weights = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if ".layers.1." not in k},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    with pytest.raises(BackboneError, match=r"do not fit its config \(missing: .*layers\.1\."):
        load_backbone(str(folder))


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_extract_raises_no_python_warning(folders, kind, home):
    """Library warnings that say nothing to a user (deprecations inside a dependency) never reach
    the terminal: an extraction through a Llama-family model and GPT-2 runs with every warning an
    error."""
    import warnings

    from reservoir import api

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = api.extract("digits", str(folders[kind]), limit=10, depths="0,3", dtype="float32")
    assert path.exists()


def test_a_dual_encoder_folder_is_read_as_its_vision_tower(tmp_path):
    """A CLIP folder of both towers (as the hub has them) extracts through its vision tower: the same
    features as that tower saved alone."""
    import transformers as t

    from tests.zoo import VISION as TOWER

    text = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=50,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    clip = t.CLIPModel(t.CLIPConfig(vision_config=TOWER, text_config=text, projection_dim=16)).eval()
    clip.save_pretrained(tmp_path / "clip")
    clip.vision_model.save_pretrained(tmp_path / "tower")
    both, tower = load_backbone(str(tmp_path / "clip")), load_backbone(str(tmp_path / "tower"))
    assert (
        type(both) is type(tower)
        and both.n_layers == LAYERS
        and both.config.model_type == "clip_vision_model"
    )
    x, lengths, readout = inputs(both, "clip_vision")
    with torch.inference_mode():
        torch.testing.assert_close(
            both(x, lengths, [0, 2, 3], readout), tower(x, lengths, [0, 2, 3], readout)
        )


def test_vision_blocks_without_a_mask_run_full_rows_and_refuse_padded_ones(folders, monkeypatch):
    """DINOv2's blocks take no attention mask before transformers 5.18: full rows (images) run the same, rows padded
    to a common length are refused in words rather than attending to the padding."""
    from reservoir.errors import BackboneError
    from reservoir.model.backbones.vit import VisionBackbone
    from reservoir.model.reservoir import Reservoir
    from reservoir.tasks import get_task

    task = get_task("digits")
    reservoir = Reservoir(task.spec, load_backbone(str(folders["dinov2"])), seed=0).eval()
    tokens = torch.from_numpy(task.encode(task.load("test", ".", limit=2).inputs))
    full = torch.tensor([tokens.shape[1]] * 2)
    with torch.inference_mode():
        masked = reservoir(tokens, full, [1, 2])
        monkeypatch.setattr(VisionBackbone, "blocks_take_mask", property(lambda self: False))
        for a, b in zip(masked, reservoir(tokens, full, [1, 2])):
            torch.testing.assert_close(a, b)
        with pytest.raises(
            BackboneError, match=r"blocks of transformers .* take no attention mask.*'transformers>=5.18'"
        ):
            reservoir(tokens, torch.tensor([tokens.shape[1], 9]), [1])


@pytest.mark.parametrize("kind", ARCHITECTURES + MORE)
def test_a_random_twin_is_drawn_once_from_the_families_own_distributions(kind):
    """:func:`random_model` (built without initialising, then one ``init_weights``) against the plain build
    (every layer draws, then ``post_init`` draws again): every tensor finite; where the plain build is
    constant (norms, biases) the same constant; elsewhere the same spread; the same seed the same weights."""
    from reservoir.model.backbones.hf import model_from_config, random_model
    from tests.zoo import _cfg

    config, _ = _cfg(kind)
    once = dict(random_model(config, 3).named_parameters())
    again = dict(random_model(config, 3).named_parameters())
    torch.manual_seed(3)
    plain = dict(model_from_config(config).named_parameters())
    assert once.keys() == plain.keys()
    for name, p in plain.items():
        q = once[name].detach()
        assert torch.isfinite(q).all() and torch.equal(q, again[name]), name
        if p.numel() > 1 and p.std() == 0:
            assert torch.equal(q, p.detach()), f"{kind} {name}: a constant of the family's init"
        elif p.numel() >= 1024:
            ratio = float(q.std() / p.detach().std())
            assert 0.8 < ratio < 1.25, f"{kind} {name}: spread {ratio:.2f} times the plain build's"


def test_a_parameter_the_familys_init_leaves_alone_builds_the_model_plainly(monkeypatch):
    from transformers import GPT2Model

    from reservoir.model.backbones.hf import model_from_config, random_model
    from tests.zoo import _cfg

    config, _ = _cfg("gpt2")
    real = GPT2Model._init_weights

    def skips_norms(self, module):
        if not isinstance(module, nn.LayerNorm):
            real(self, module)

    monkeypatch.setattr(GPT2Model, "_init_weights", skips_norms)
    got = random_model(config, 5).state_dict()
    torch.manual_seed(5)
    want = model_from_config(config).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("kind", ["bert_generation", "deberta-v2", "falcon"])
def test_causal_is_read_alike_in_bfloat16(more_folders, folders, kind):
    """The run that tells a decoder from an encoder holds in bfloat16, where an encoder's pull on the first
    token is no bigger than the dtype's rounding."""
    folder = (more_folders if kind in MORE else folders)[kind]
    assert load_backbone(str(folder), dtype="bfloat16").causal == (KINDS.get(kind, "decoder") == "decoder")

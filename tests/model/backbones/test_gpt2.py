"""The native GPT-2 of ``-random`` twins (:class:`reservoir.model.backbones.gpt2.NativeGPT2`) against
transformers' ``GPT2Model`` holding the same weights: features at every depth, the readout-only last block,
attention maps, parameter groups, the saved folder; its draws against transformers' own initialisation."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from reservoir.model.backbones import load_backbone
from reservoir.model.backbones.gpt2 import GPT2Backbone, NativeGPT2Backbone, random_gpt2

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE = dict(n_layer=3, n_head=4, n_embd=64)


@pytest.fixture(scope="module")
def pair():
    native = random_gpt2(7, **SHAPE).eval()
    library = GPT2Backbone(native.to_transformers()).eval()
    return native, library


def batch(width: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 5, 1])
    return torch.randn(3, 9, width, generator=g), lengths, (lengths - 1)[:, None]


def test_every_depth_equals_the_library_model_with_the_same_weights(pair):
    native, library = pair
    x, lengths, readout = batch()
    with torch.inference_mode():
        for depths in ([0, 1, 2, 3], [3], [0, 2]):  # the last block readout-only, and a full block before it
            torch.testing.assert_close(
                native(x, lengths, depths, readout),
                library(x, lengths, depths, readout),
                atol=1e-6,
                rtol=1e-5,
            )
        whole = library.model(inputs_embeds=x).last_hidden_state
        mine = native(x, lengths, [3], readout)[:, 0]
    torch.testing.assert_close(
        mine, torch.gather(whole, 1, readout[:, :, None].expand(-1, -1, 64)), atol=1e-6, rtol=1e-5
    )


def test_attention_maps_parameter_groups_and_projections_are_the_library_models(pair):
    from reservoir.model.reservoir import Reservoir
    from reservoir.report.attention import attention_probs
    from reservoir.tasks import TaskSpec

    native, library = pair
    spec = TaskSpec("t", "dense", seq_len=9, token_dim=5, n_classes=2)
    tokens, lengths = torch.rand(2, 9, 5), torch.tensor([9, 9])
    maps = [attention_probs(Reservoir(spec, b, seed=0).eval(), tokens, lengths, 1) for b in pair]
    torch.testing.assert_close(maps[0], maps[1], atol=1e-6, rtol=1e-5)
    assert torch.allclose(maps[0].sum(-1), torch.ones(())) and maps[0][0, 0].triu(1).abs().max() == 0
    groups = [{k: [tuple(p.shape) for p in v] for k, v in b.param_groups().items()} for b in pair]
    assert groups[0].keys() == groups[1].keys() and all(
        len(groups[0][k]) == len(groups[1][k]) for k in groups[0]
    )
    assert sorted(native.projections()) == sorted(library.projections())
    assert (native.d_input, native.max_positions, native.causal) == (
        library.d_input,
        library.max_positions,
        True,
    )


def test_the_saved_folder_loads_through_transformers_to_equal_features(pair, tmp_path):
    native, _ = pair
    native.save_pretrained(tmp_path / "saved")
    loaded = load_backbone(str(tmp_path / "saved")).eval()
    assert type(loaded) is GPT2Backbone
    x, lengths, readout = batch()
    with torch.inference_mode():
        torch.testing.assert_close(
            loaded(x, lengths, [0, 1, 3], readout),
            native(x, lengths, [0, 1, 3], readout),
            atol=1e-6,
            rtol=1e-5,
        )
    saved = loaded.model.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in native.model.state_dict().items())  # bit for bit
    assert abs(loaded.token_std - native.token_std) < 1e-6  # what --input-scale matched reads


def test_the_draws_follow_the_library_initialisation():
    """Every tensor against transformers' own random GPT-2 of the shape: the same constants (norms,
    biases) and the same spread per tensor (``c_proj`` scaled by 1/sqrt(2 n_layer)); a seed its own draw."""
    from transformers import GPT2Config

    from reservoir.model.backbones.hf import random_model

    shape = dict(n_layer=4, n_head=4, n_embd=128)
    native = random_gpt2(1, **shape).model.state_dict()
    library = random_model(GPT2Config(**shape), 1).state_dict()
    assert native.keys() == library.keys() - {"wte.weight"}
    for name, want in library.items():
        if name == "wte.weight":
            continue
        got = native[name]
        assert got.shape == want.shape, name
        if want.std() == 0:
            assert torch.equal(got, want), name
        else:
            assert 0.9 < float(got.std() / want.std()) < 1.1, name
    again, other = random_gpt2(1, **shape), random_gpt2(2, **shape)
    assert torch.equal(
        again.model.h[0].attn.c_attn.weight, random_gpt2(1, **shape).model.h[0].attn.c_attn.weight
    )
    assert not torch.equal(again.model.h[0].attn.c_attn.weight, other.model.h[0].attn.c_attn.weight)


def test_a_random_gpt2_job_imports_no_transformers(tmp_path):
    code = (
        "import sys, torch; from reservoir.model.backbones import load_backbone; "
        "b = load_backbone('gpt2-random', 0); x = torch.randn(2, 4, b.d_input); n = torch.tensor([4, 3]); "
        "b(x, n, [0, 12], (n - 1)[:, None]); "
        "found = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'sklearn', 'dask')]; "
        "assert not found, found; assert type(b).__name__ == 'NativeGPT2Backbone'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    assert issubclass(NativeGPT2Backbone, GPT2Backbone)


def test_its_state_dict_is_the_library_models_and_loads_back(pair):
    native, library = pair
    state = native.state_dict()
    want = dict(library.state_dict().items())
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in state)
    fresh = random_gpt2(9, **SHAPE)
    fresh.load_state_dict(state)  # a training checkpoint resumed
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), native.parameters(), strict=True))

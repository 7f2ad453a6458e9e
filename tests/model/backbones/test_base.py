"""The deepest block computes only the readout rows: same features as the full block then a
gather (fixed and right-padded lengths, one or several readout tokens, float32 and bf16),
same gradients for end-to-end training, and fewer FLOPs (queries, output projection and MLP
for R rows instead of T)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from reservoir.model.backbones import load_backbone
from reservoir.model.backbones.gpt2 import readout_block_supported
from reservoir.model.backbones.llama import RotaryBackbone, readout_supported
from reservoir.model.reservoir import readout_positions
from tests.conftest import save_tiny_gpt2

WIDTH, T, B = 32, 24, 5
#: bf16: the readout-only block multiplies the same rows by the same weights, but a GEMM over
#: R rows may round differently from one over T rows (bf16's epsilon is 2**-8)
BF16_REL = 1e-2


def tiny_llama(seed: int = 0, **overrides) -> RotaryBackbone:
    """A 3-block Llama (4 query / 2 key-value heads), random additive positions so they matter."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    config = LlamaConfig(
        **{
            **dict(
                hidden_size=WIDTH,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=10,
                max_position_embeddings=64,
                initializer_range=0.3,
            ),
            **overrides,
        }
    )
    backbone = RotaryBackbone(LlamaModel(config))
    torch.nn.init.normal_(backbone.wpe.weight, std=0.3)
    return backbone.eval()


#: every family with a readout-only last block, and the Llama-shaped families it reaches by structure
#: (Mistral with a sliding window shorter than the rows, Qwen2's biased projections, Qwen3's per-head norms)
FAST = ["gpt2", "llama", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="module", params=FAST)
def backbone(request, tmp_path_factory):
    from tests.zoo import save_tiny

    if request.param == "gpt2":
        return load_backbone(str(save_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), n_layer=3, n_embd=WIDTH)))
    if request.param == "llama":
        return tiny_llama()
    backbone = load_backbone(str(save_tiny(request.param, tmp_path_factory.mktemp(request.param))))
    torch.nn.init.normal_(backbone.wpe.weight, std=0.3)
    return backbone.eval()


def batch(variable: bool, n_readout: int, padded: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, WIDTH, generator=g)
    lengths = torch.tensor([T, 4, 17, T - 1, n_readout]) if variable else torch.full((B,), T)
    return x, lengths, readout_positions(lengths, n_readout, T if padded else None)


def both_paths(backbone, x, lengths, depths, readout):
    """(readout-only last block, full last block then gather) features."""
    out = []
    for fast in (True, False):
        backbone.readout_last_block = fast
        out.append(backbone(x, lengths, depths, readout).float())
    backbone.readout_last_block = True
    return out


def rel_err(a, b):
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()


@pytest.mark.parametrize("depths", [[0, 1, 2], [2], [1], [3], [0, 3]])
@pytest.mark.parametrize("n_readout", [1, 3])
@pytest.mark.parametrize("variable", [False, True])
def test_readout_block_equals_full_block_float32(backbone, depths, n_readout, variable):
    x, lengths, readout = batch(variable, n_readout)
    backbone.float()  # dtype changes outside inference mode: parameters stay usable for autograd
    with torch.inference_mode():
        fast, full = both_paths(backbone, x, lengths, depths, readout)
    assert fast.shape == (B, len(depths), n_readout, WIDTH)
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)


def test_padded_readout_reads_positions_in_the_padding(backbone):
    """The official padded readout: queries at padded positions still attend causally to 0..p."""
    x, lengths, readout = batch(True, 2, padded=True)
    backbone.float()
    with torch.inference_mode():
        fast, full = both_paths(backbone, x, lengths, [1, 2], readout)
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("depths", [[0, 1, 2], [2], [1]])
@pytest.mark.parametrize("n_readout", [1, 3])
def test_readout_block_equals_full_block_bf16(backbone, depths, n_readout):
    x, lengths, readout = batch(True, n_readout)
    backbone.to(torch.bfloat16)
    with torch.inference_mode():
        fast, full = both_paths(backbone, x.bfloat16(), lengths, depths, readout)
    backbone.float()
    with torch.inference_mode():
        ref = backbone(x, lengths, depths, readout)
    assert rel_err(fast, full) < BF16_REL
    assert rel_err(fast, ref) < 5 * BF16_REL  # and still bf16-close to float32


def test_gradients_equal_full_block(backbone):
    """End-to-end training differentiates through the same path (dropout off so both draw nothing). In float64:
    behind a final norm the blocks' gradients are 1e-7 of the largest one, and in float32 they are rounding noise
    that differs by CPU kernel (Llama's differed by their own size on an AVX2 CPU); in float64 both paths agree
    to rounding."""
    x, lengths, readout = batch(True, 2)
    backbone.double().train()
    set_dropout(backbone, 0.0)
    grads = []
    try:
        for fast in (True, False):
            backbone.readout_last_block = fast
            backbone.zero_grad()
            inputs = x.double().requires_grad_(True)
            backbone(inputs, lengths, [1, 3], readout).square().sum().backward()
            grads.append([inputs.grad] + [p.grad for p in backbone.parameters() if p.grad is not None])
    finally:
        backbone.readout_last_block = True
        backbone.zero_grad()
        backbone.float().eval()
    assert len(grads[0]) == len(grads[1]) > 1
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-15, rtol=1e-9)


def set_dropout(backbone, p: float) -> None:
    """GPT-2's dropout modules and Llama's attention dropout (a float on the attention module)."""
    for module in backbone.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = p


def test_dropout_in_training_acts_in_the_readout_only_block(backbone):
    x, lengths, readout = batch(True, 1)
    backbone.float().train()
    set_dropout(backbone, 0.5)
    try:
        with torch.no_grad():  # depth 1: the only block that runs is the readout-only one
            a, b = (backbone(x, lengths, [1], readout) for _ in range(2))
    finally:
        set_dropout(backbone, 0.0)
        backbone.eval()
    assert not torch.equal(a, b)


def flops(backbone, depths, readout, fast=True):
    x, lengths, _ = batch(False, readout.shape[1])
    backbone.float().readout_last_block = fast
    try:
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            backbone(x, lengths, depths, readout)
    finally:
        backbone.readout_last_block = True
    return counter.get_total_flops()


@pytest.mark.parametrize("n_readout", [1, 4])
def test_last_block_does_r_over_t_of_the_query_output_and_mlp_work(backbone, n_readout):
    """FLOPs of block 3 alone (depth 3 minus depth 2 with full blocks): keys and values for T
    rows, queries / output projection / MLP for R rows, attention R x T."""
    readout = readout_positions(torch.full((B,), T), n_readout)
    before = flops(backbone, [2], readout, fast=False)
    full = flops(backbone, [3], readout, fast=False) - before
    fast = flops(backbone, [3], readout) - before
    d, R = WIDTH, n_readout
    if backbone.family == "gpt2":
        kv, rows = 2 * d * d, d * d + d * d + 2 * d * 4 * d  # c_attn's k,v | q, c_proj, c_fc + c_proj
    else:
        kv_width = backbone.config.num_key_value_heads * (d // backbone.config.num_attention_heads)
        ff = backbone.config.intermediate_size
        kv, rows = 2 * d * kv_width, d * d + d * d + 3 * d * ff  # k, v | q, o, gate + up + down
    # attention itself: 4 B Tq T d where the counter knows the SDPA kernel (not CPU's fused one: 0)
    attention = full - 2 * B * T * (kv + rows)
    assert attention in (0, 4 * B * T * T * d)
    assert fast == 2 * B * T * kv + 2 * B * R * rows + attention * R // T
    assert fast < full


def test_unsupported_blocks_run_whole(tmp_path):
    """A GPT-2 with reorder_and_upcast_attn (not reproduced) runs the full block; one with
    scale_attn_by_inverse_layer_idx (reproduced) takes the readout path; both equal the full path."""
    from transformers import GPT2Config, GPT2Model

    from reservoir.model.backbones.gpt2 import GPT2Backbone

    x, lengths, readout = batch(True, 2)
    for flag, supported in (("reorder_and_upcast_attn", False), ("scale_attn_by_inverse_layer_idx", True)):
        torch.manual_seed(0)
        bb = GPT2Backbone(GPT2Model(GPT2Config(n_layer=3, n_embd=WIDTH, n_head=4, **{flag: True}))).eval()
        assert readout_block_supported(bb.blocks[2]) is supported
        with torch.inference_mode():
            fast, full = both_paths(bb, x, lengths, [2, 3], readout)
        torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
    llama = tiny_llama()
    assert readout_supported(llama.blocks[0], llama.config)


def test_a_hooked_attention_module_runs_whole(backbone):
    """reservoir.report.attention catches what the attention module returns with a hook; the last
    block must then call that module."""
    module = backbone.attention_module(0)
    called = []
    handle = module.register_forward_pre_hook(lambda *a: called.append(1))
    try:
        x, lengths, readout = batch(False, 1)
        with torch.inference_mode():
            backbone(x, lengths, [1], readout)
    finally:
        handle.remove()
    assert called


@pytest.mark.slow  # a real inductor compile of each tiny family
def test_compiled_readout_block_equals_eager_full_block(backbone):
    x, lengths, readout = batch(True, 2)
    backbone.float()
    with torch.inference_mode():
        _, full = both_paths(backbone, x, lengths, [0, 2], readout)
        compiled = torch.compile(backbone, fullgraph=True)
        torch.testing.assert_close(compiled(x, lengths, [0, 2], readout), full, atol=1e-5, rtol=1e-5)


def test_the_readout_only_block_compiles_as_one_graph(tmp_path):
    """Only a block whose projections read positions (int8's centring) is told the readout rows'
    positions: a plain block sets nothing, so ``torch.compile`` traces the forward without a break."""
    backbone = load_backbone(str(save_tiny_gpt2(tmp_path / "gpt2")), 0)
    x, lengths = torch.randn(2, 16, backbone.d_model), torch.full((2,), 16)
    with torch.inference_mode():
        explained = torch._dynamo.explain(backbone)(
            x, lengths, [0, backbone.n_layers], readout_positions(lengths, 1)
        )
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]

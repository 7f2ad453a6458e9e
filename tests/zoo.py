"""Tiny random Hugging Face models of many architectures, saved with ``save_pretrained`` as a hub
folder holds one (the same loading code as a download): one entry per architecture the
adapters cover, written by its family's own model class (head models where researchers
save them so: causal LMs, masked LMs, encoder-decoders)."""

from __future__ import annotations

from pathlib import Path

import torch

#: every architecture's shared tiny shape
W, LAYERS, HEADS, FF, VOCAB, POS = 32, 3, 4, 64, 50, 128

VISION = dict(
    hidden_size=W,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FF,
    image_size=32,
    patch_size=4,
)
#: DINOv2's families size their MLP by a ratio, not a width
DINOV2 = {**{k: v for k, v in VISION.items() if k != "intermediate_size"}, "mlp_ratio": 2}
DECODER = dict(
    hidden_size=W,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FF,
    vocab_size=VOCAB,
    max_position_embeddings=POS,
)


#: OPT names its MLP's width its own way
OPT = {**{k: v for k, v in DECODER.items() if k != "intermediate_size"}, "ffn_dim": FF}


def _cfg(kind: str):
    import transformers as t

    return {
        "gpt2": lambda: (
            t.GPT2Config(n_layer=LAYERS, n_embd=W, n_head=HEADS, n_positions=POS, vocab_size=VOCAB),
            t.GPT2LMHeadModel,
        ),
        "gptj": lambda: (
            t.GPTJConfig(
                n_layer=LAYERS, n_embd=W, n_head=HEADS, n_positions=POS, vocab_size=VOCAB, rotary_dim=4
            ),
            t.GPTJForCausalLM,
        ),
        "gpt_neox": lambda: (t.GPTNeoXConfig(**DECODER), t.GPTNeoXForCausalLM),
        "opt": lambda: (t.OPTConfig(**OPT, word_embed_proj_dim=W), t.OPTForCausalLM),
        "llama": lambda: (t.LlamaConfig(**DECODER, num_key_value_heads=2), t.LlamaForCausalLM),
        "mistral": lambda: (
            t.MistralConfig(**DECODER, num_key_value_heads=2, sliding_window=6),
            t.MistralForCausalLM,
        ),
        "qwen2": lambda: (t.Qwen2Config(**DECODER, num_key_value_heads=2), t.Qwen2ForCausalLM),
        "qwen3": lambda: (t.Qwen3Config(**DECODER, num_key_value_heads=2, head_dim=8), t.Qwen3ForCausalLM),
        "gemma": lambda: (t.GemmaConfig(**DECODER, num_key_value_heads=2, head_dim=8), t.GemmaForCausalLM),
        "gemma2": lambda: (
            t.Gemma2Config(**DECODER, num_key_value_heads=2, head_dim=8, sliding_window=6),
            t.Gemma2ForCausalLM,
        ),
        "gemma3_text": lambda: (
            t.Gemma3TextConfig(**DECODER, num_key_value_heads=2, head_dim=8, sliding_window=6),
            t.Gemma3ForCausalLM,
        ),
        # an embedding model's decoder run bidirectionally (EmbeddingGemma): causal by type, not as it runs
        "gemma3_bidirectional": lambda: (
            t.Gemma3TextConfig(
                **DECODER,
                num_key_value_heads=2,
                head_dim=8,
                sliding_window=6,
                use_bidirectional_attention=True,
            ),
            t.Gemma3TextModel,
        ),
        # Gemma's own flag for it: its SDPA path does not honour a padding mask (transformers 5.x)
        "gemma_bidirectional": lambda: (
            t.GemmaConfig(**DECODER, num_key_value_heads=2, head_dim=8, use_bidirectional_attention=True),
            t.GemmaModel,
        ),
        # mixes tokens by Fourier transforms: its forward takes no attention mask
        "fnet": lambda: (t.FNetConfig(**DECODER), t.FNetModel),
        "bert_generation": lambda: (t.BertGenerationConfig(**DECODER), t.BertGenerationEncoder),
        # OPT-350m's layout: tokens projected in and the last state projected out to another width
        "opt_project": lambda: (
            t.OPTConfig(**OPT, word_embed_proj_dim=16, do_layer_norm_before=False),
            t.OPTForCausalLM,
        ),
        "phi": lambda: (t.PhiConfig(**DECODER), t.PhiForCausalLM),
        "olmo": lambda: (t.OlmoConfig(**DECODER), t.OlmoForCausalLM),
        "bert": lambda: (t.BertConfig(**DECODER), t.BertForMaskedLM),
        "roberta": lambda: (t.RobertaConfig(**DECODER), t.RobertaForMaskedLM),
        "electra": lambda: (t.ElectraConfig(**DECODER, embedding_size=16), t.ElectraForMaskedLM),
        "albert": lambda: (t.AlbertConfig(**DECODER, embedding_size=16), t.AlbertForMaskedLM),
        "deberta-v2": lambda: (
            t.DebertaV2Config(
                **DECODER,
                relative_attention=True,
                position_buckets=8,
                pos_att_type=["p2c", "c2p"],
                position_biased_input=False,
            ),
            t.DebertaV2ForMaskedLM,
        ),
        # the xlarge layout: a convolution the encoder applies after its first block, outside it
        "deberta-v2-conv": lambda: (
            t.DebertaV2Config(**DECODER, relative_attention=True, position_buckets=8, conv_kernel_size=3),
            t.DebertaV2Model,
        ),
        "t5": lambda: (
            t.T5Config(d_model=W, d_kv=8, d_ff=FF, num_layers=LAYERS, num_heads=HEADS, vocab_size=VOCAB),
            t.T5ForConditionalGeneration,
        ),
        "bart": lambda: (
            t.BartConfig(
                d_model=W,
                encoder_layers=LAYERS,
                decoder_layers=LAYERS,
                encoder_attention_heads=HEADS,
                decoder_attention_heads=HEADS,
                encoder_ffn_dim=FF,
                decoder_ffn_dim=FF,
                vocab_size=VOCAB,
                max_position_embeddings=POS,
            ),
            t.BartForConditionalGeneration,
        ),
        "vit": lambda: (
            t.ViTConfig(**VISION),
            t.ViTModel,
        ),
        "deit": lambda: (
            t.DeiTConfig(**VISION),
            t.DeiTModel,
        ),
        "dinov2": lambda: (
            t.Dinov2Config(**DINOV2),
            t.Dinov2Model,
        ),
        "clip_vision": lambda: (t.CLIPVisionConfig(**VISION), t.CLIPVisionModel),
        # vision transformers read from pixels alone, with no adapter named for their type: the vision
        # adapter takes them by their shape (reservoir.model.backbones.hf.takes_pixels_only)
        "vit_msn": lambda: (t.ViTMSNConfig(**VISION), t.ViTMSNModel),
        "ijepa": lambda: (t.IJepaConfig(**VISION), t.IJepaModel),
        "dinov2_with_registers": lambda: (
            t.Dinov2WithRegistersConfig(**DINOV2),
            t.Dinov2WithRegistersModel,
        ),
        "siglip_vision": lambda: (t.SiglipVisionConfig(**VISION), t.SiglipVisionModel),
        "mamba": lambda: (
            t.MambaConfig(
                hidden_size=W,
                num_hidden_layers=LAYERS,
                vocab_size=VOCAB,
                state_size=4,
                expand=2,
                conv_kernel=3,
            ),
            t.MambaForCausalLM,
        ),
        # read by the generic adapter (no family file): parallel attention, ALiBi, multi-query, mixture of experts,
        # LayerNorm-free residual scaling, a distilled encoder, a second-generation state-space model
        "falcon": lambda: (
            t.FalconConfig(
                hidden_size=W, num_hidden_layers=LAYERS, num_attention_heads=HEADS, vocab_size=VOCAB
            ),
            t.FalconForCausalLM,
        ),
        "bloom": lambda: (
            t.BloomConfig(hidden_size=W, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB),
            t.BloomForCausalLM,
        ),
        "mpt": lambda: (
            t.MptConfig(d_model=W, n_layers=LAYERS, n_heads=HEADS, vocab_size=VOCAB, max_seq_len=POS),
            t.MptForCausalLM,
        ),
        "gpt_bigcode": lambda: (
            t.GPTBigCodeConfig(n_embd=W, n_layer=LAYERS, n_head=HEADS, n_positions=POS, vocab_size=VOCAB),
            t.GPTBigCodeForCausalLM,
        ),
        "phi3": lambda: (t.Phi3Config(**DECODER, num_key_value_heads=2, pad_token_id=0), t.Phi3ForCausalLM),
        "mixtral": lambda: (
            t.MixtralConfig(**DECODER, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
            t.MixtralForCausalLM,
        ),
        "granite": lambda: (t.GraniteConfig(**DECODER, num_key_value_heads=2), t.GraniteForCausalLM),
        "distilbert": lambda: (
            t.DistilBertConfig(
                dim=W,
                n_layers=LAYERS,
                n_heads=HEADS,
                hidden_dim=FF,
                vocab_size=VOCAB,
                max_position_embeddings=POS,
            ),
            t.DistilBertForMaskedLM,
        ),
        "mamba2": lambda: (
            t.Mamba2Config(
                hidden_size=W,
                num_hidden_layers=LAYERS,
                vocab_size=VOCAB,
                state_size=4,
                expand=2,
                conv_kernel=3,
                num_heads=4,
                head_dim=16,
                n_groups=1,
            ),
            t.Mamba2ForCausalLM,
        ),
    }[kind]()


ARCHITECTURES = (
    "gpt2",
    "gptj",
    "gpt_neox",
    "opt",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi",
    "olmo",
    "bert",
    "roberta",
    "electra",
    "albert",
    "deberta-v2",
    "t5",
    "bart",
    "vit",
    "deit",
    "dinov2",
    "clip_vision",
    "siglip_vision",
    "mamba",
)
#: more architectures, each checked depth by depth against the library's own model (the generic adapter reads them)
MORE = (
    "falcon",
    "bloom",
    "mpt",
    "gpt_bigcode",
    "phi3",
    "mixtral",
    "granite",
    "distilbert",
    "mamba2",
    "vit_msn",
    "ijepa",
    "dinov2_with_registers",
    "gemma3_bidirectional",
    "bert_generation",
    "opt_project",
    "deberta-v2-conv",
)
#: the kind of each: decoder, encoder, encoder-decoder's encoder, vision, state-space
KINDS = {
    "bert": "encoder",
    "roberta": "encoder",
    "electra": "encoder",
    "albert": "encoder",
    "deberta-v2": "encoder",
    "t5": "encoder-decoder",
    "bart": "encoder-decoder",
    "vit": "vision",
    "deit": "vision",
    "dinov2": "vision",
    "clip_vision": "vision",
    "siglip_vision": "vision",
    "mamba": "state-space",
    "distilbert": "encoder",
    "mamba2": "state-space",
    "vit_msn": "vision",
    "ijepa": "vision",
    "dinov2_with_registers": "vision",
    "gemma3_bidirectional": "encoder",
    "bert_generation": "encoder",
    "deberta-v2-conv": "encoder",
}


def save_tiny(kind: str, folder: Path, seed: int = 0) -> Path:
    """A tiny random model of architecture ``kind`` saved with ``save_pretrained`` into ``folder``."""
    config, cls = _cfg(kind)
    if hasattr(config, "initializer_range"):
        config.initializer_range = 0.2  # larger than the default, so every block visibly changes its input
    torch.manual_seed(seed)
    cls(config).eval().save_pretrained(folder)
    return folder

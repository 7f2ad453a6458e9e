"""BERT-shaped encoder adapter: BERT, RoBERTa, XLM-RoBERTa, ELECTRA (bidirectional, post-norm).

The model's own embedding module adds its positions and token type 0 to the input layer's output and
normalises; an attention mask over padding keeps a row's features independent of how far the batch was
padded. Every block ends in a LayerNorm, so there is no extra final norm. No readout-only last block
(one is possible for the last block alone, but not written).
"""

from __future__ import annotations

import torch

from reservoir.model.backbones.base import Capabilities, first_output, make_mask
from reservoir.model.backbones.hf import HFBackbone, Parts, register_family


@register_family
class EncoderBackbone(HFBackbone):
    """A BERT-shaped encoder (``BertModel``, ``RobertaModel``, ``ElectraModel``) without its pooler."""

    family = "bert"
    model_types = ("bert", "roberta", "xlm-roberta", "electra")
    naming = (
        "a save_pretrained folder of BERT, RoBERTa, XLM-RoBERTa, ELECTRA or a MiniLM-style sentence encoder"
    )
    capabilities = Capabilities(openvino=True, compile=True)
    by_hooks = False

    def locate(self) -> Parts:
        m, c = self.model, self.model.config
        emb = m.embeddings
        # RoBERTa's positions start at pad + 1
        offset = c.pad_token_id + 1 if hasattr(emb, "padding_idx") and c.model_type != "bert" else 0
        positions = [emb.position_embeddings] + (
            [emb.token_type_embeddings] if hasattr(emb, "token_type_embeddings") else []
        )
        return Parts(m.encoder.layer, (), emb.word_embeddings, positions, c.max_position_embeddings - offset)

    def is_causal(self) -> bool:
        return False

    def drop_unused(self) -> None:
        super().drop_unused()
        if getattr(self.model, "pooler", None) is not None:  # a head on the first token: never read here
            self.model.pooler = None

    def embed(self, x, lengths, readout, last):
        """The model's own embedding module on ``x`` (its positions, token type 0, norm; ELECTRA's
        projection to the hidden width); the attention mask over each row's padding."""
        try:
            from transformers.masking_utils import create_bidirectional_mask
        except ImportError:  # transformers < 5.0: the layers take an additive (B, 1, 1, T) mask
            create_bidirectional_mask = None

        h = self.add_positions(x)  # checks the length; BERT's positions are its own (no wpe)
        h = self.model.embeddings(inputs_embeds=h)
        if hasattr(self.model, "embeddings_project"):  # ELECTRA: embedding width -> hidden width
            h = self.model.embeddings_project(h)
        real = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
        if create_bidirectional_mask is None:
            mask = (1.0 - real[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        else:
            mask = make_mask(
                create_bidirectional_mask, h, None, config=self.config, attention_mask=real.long()
            )
        return h, mask

    def call_block(self, i, h, mask):
        return first_output(self.blocks[i](h, attention_mask=mask))

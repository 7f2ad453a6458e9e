"""Vision transformer adapter: ViT, DeiT, DINOv2 (bidirectional, pre-norm, final ``layernorm``).

As in the FPT paper's ViT row, the FPT input layer replaces the patch embedding: the embedded
tokens are the patches. The model's class and distillation tokens are not used; its learned
patch positions (``embeddings.position_embeddings`` after the special tokens) are added, resized
bicubically to the task's grid when the task has a square number of tokens (as Hugging Face's
``interpolate_pos_encoding`` resizes them for other image sizes), else the first ``T`` are
taken. Blocks are found as the generic adapter finds them (``_no_split_modules``); the final norm
``layernorm`` is applied to the readout rows. The readout token is the last one, as for every
family. No readout-only last block.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from reservoir.errors import BackboneError
from reservoir.model.backbones.base import first_output, gather
from reservoir.model.backbones.hf import HFBackbone, Parts, find_blocks, register_family


@register_family
class VisionBackbone(HFBackbone):
    """A Hugging Face ViT, DeiT or DINOv2 model whose patch embedding the FPT input layer replaces."""

    family = "vit"
    model_types = ("vit", "deit", "dinov2")
    naming = "a save_pretrained folder of ViT, DeiT or DINOv2 (the input layer replaces the patch embedding)"
    fast_paths = ("compile",)

    def locate(self) -> Parts:
        m = self.model
        emb = m.embeddings
        self.n_patches = emb.patch_embeddings.num_patches
        self.n_special = emb.position_embeddings.shape[1] - self.n_patches
        # positions past the patches' count exist only for square token counts (resized)
        return Parts(find_blocks(m), (m.layernorm,), None, [emb.position_embeddings], None)

    def is_causal(self) -> bool:
        return False

    def patch_positions(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """Positions ``(1, n, d)`` for ``n`` tokens: the model's patch positions, resized to a
        ``sqrt(n)`` grid when ``n`` is a square, else the first ``n``."""
        pos = self.model.embeddings.position_embeddings[:, self.n_special:]
        side, grid = math.isqrt(n), math.isqrt(self.n_patches)
        if n == self.n_patches:
            return pos.to(dtype)
        if side * side == n and grid * grid == self.n_patches:
            square = pos.reshape(1, grid, grid, -1).permute(0, 3, 1, 2).float()
            square = nn.functional.interpolate(square, size=(side, side), mode="bicubic", align_corners=False)
            return square.permute(0, 2, 3, 1).reshape(1, n, -1).to(dtype)
        if n > self.n_patches:
            raise BackboneError(f"{self.config.model_type} has {self.n_patches} patch positions; a sequence of {n} "
                                "tokens (not a square grid) does not fit. Choose a task of at most that many tokens or "
                                "a square number of tokens")
        return pos[:, :n].to(dtype)

    def states(self, x, lengths, depths: Sequence[int], readout):
        self.check_depths(depths)
        h = self.model.embeddings.dropout(x + self.patch_positions(x.shape[1], x.dtype))
        real = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
        mask = (1.0 - real[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        out = {0: gather(h, readout)} if 0 in depths else {}
        for k, layer in enumerate(self.blocks[: max(depths)], start=1):
            h = first_output(layer(h, mask))
            if k in depths:
                out[k] = gather(h, readout)
        return [self.finish(out[d]) for d in depths]

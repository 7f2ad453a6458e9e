"""Vision transformer adapter: ViT, DeiT, DINOv2, the vision towers of CLIP and SigLIP, and any other vision
transformer read from pixels alone that keeps a table of patch positions (ViT-MSN, I-JEPA, DINOv2 with
registers, ...: taken by its shape, :func:`reservoir.model.backbones.hf.takes_pixels_only`).

As in the FPT paper's ViT row, the FPT input layer replaces the patch embedding: the embedded tokens
are the patches. The class and distillation tokens are not used; the learned patch positions are added:
on a task of fixed length (images), resized bicubically to the task's grid when it has a square number of
tokens, else its first ``T`` (:meth:`VisionBackbone.patch_positions`); on a task of variable length, the first
positions, so a row's positions never depend on its length or its batch mates'. The norm the model applies to its
last hidden state is applied to the readout rows (none for CLIP, whose ``post_layernorm`` reads only the
pooled class token). A CLIP or SigLIP folder of both towers is read as its vision tower.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from reservoir.errors import BackboneError
from reservoir.model.backbones.base import Capabilities, first_output
from reservoir.model.backbones.hf import HFBackbone, Parts, find_blocks, register_family

#: where each family keeps its position table, its norm before the blocks and its norm of the last hidden state
LAYOUT = {
    "vit": ("position_embeddings", None, "layernorm"),
    "deit": ("position_embeddings", None, "layernorm"),
    "dinov2": ("position_embeddings", None, "layernorm"),
    "clip_vision_model": ("position_embedding", "pre_layrnorm", None),
    "siglip_vision_model": ("position_embedding", None, "post_layernorm"),
}


@register_family
class VisionBackbone(HFBackbone):
    """A Hugging Face vision transformer whose patch embedding the FPT input layer replaces."""

    family = "vit"
    model_types = ("vit", "deit", "dinov2", "clip", "clip_vision_model", "siglip", "siglip_vision_model")
    naming = (
        "a save_pretrained folder of ViT, DeiT, DINOv2, or CLIP's or SigLIP's vision tower (the input layer "
        "replaces the patch embedding)"
    )
    capabilities = Capabilities(compile=True)
    by_hooks = False
    reading = 2  # rows of any length take the first positions, not a grid resized to the batch's width

    def __init__(self, model: nn.Module, **kwargs):
        super().__init__(getattr(model, "vision_model", model), **kwargs)  # a dual encoder: its vision tower

    def layout(self) -> tuple[str, str | None, str | None]:
        """Where the model keeps its position table, its norm before the blocks and its norm of the last
        hidden state: :data:`LAYOUT`, else found by name."""
        if self.config.model_type in LAYOUT:
            return LAYOUT[self.config.model_type]
        m, emb = self.model, self.model.embeddings
        table = next(
            (n for n in ("position_embeddings", "position_embedding") if getattr(emb, n, None) is not None),
            None,
        )
        if table is None:
            raise BackboneError(
                f"this {self.config.model_type!r} vision model has no table of absolute patch positions for "
                "the FPT input layer's tokens to take in place of its patches (its blocks place their tokens "
                "themselves); choose a vision transformer with one: ViT, DeiT, DINOv2 and its variants, "
                "ViT-MSN, I-JEPA, or CLIP's or SigLIP's vision tower"
            )
        before = next(
            (n for n in ("pre_layrnorm", "pre_layernorm") if isinstance(getattr(m, n, None), nn.Module)), None
        )
        after = "layernorm" if isinstance(getattr(m, "layernorm", None), nn.Module) else None
        return table, before, after

    def locate(self) -> Parts:
        m = self.model
        table, before, after = self.layout()
        emb = m.embeddings
        positions = getattr(emb, table)
        self.n_patches = (
            emb.patch_embeddings.num_patches if hasattr(emb, "patch_embeddings") else emb.num_patches
        )
        self.n_special = self.position_table().shape[1] - self.n_patches
        # a reference, not registered twice
        object.__setattr__(self, "pre_norm", getattr(m, before) if before else None)
        # positions past the patches' count exist only for square token counts (resized)
        return Parts(find_blocks(m), (getattr(m, after),) if after else (), None, [positions], None)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """As every Hugging Face model's, with ``ln`` only the norms this path applies (the others read only
        the pooled token and would get no gradient)."""
        groups = super().param_groups()
        applied = {
            id(p) for m in (*self.blocks, *self.after, self.pre_norm) if m is not None for p in m.parameters()
        }
        return {**groups, "ln": [p for p in groups["ln"] if id(p) in applied]}

    def position_table(self) -> torch.Tensor:
        """The model's positions ``(1, special + patches, d)``."""
        positions = getattr(self.model.embeddings, self.layout()[0])
        return positions.weight[None] if isinstance(positions, nn.Embedding) else positions

    def is_causal(self) -> bool:
        return False

    def patch_positions(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """Positions ``(1, n, d)`` for ``n`` tokens: the model's patch positions, resized to a
        ``sqrt(n)`` grid when ``n`` is a square, else the first ``n``."""
        pos = self.position_table()[:, self.n_special :]
        side, grid = math.isqrt(n), math.isqrt(self.n_patches)
        if n == self.n_patches:
            return pos.to(dtype)
        if side * side == n and grid * grid == self.n_patches:
            square = pos.reshape(1, grid, grid, -1).permute(0, 3, 1, 2).float()
            square = nn.functional.interpolate(square, size=(side, side), mode="bicubic", align_corners=False)
            return square.permute(0, 2, 3, 1).reshape(1, n, -1).to(dtype)
        if n > self.n_patches:
            raise BackboneError(
                f"{self.config.model_type} has {self.n_patches} patch positions; a sequence of {n} "
                "tokens (not a square grid) does not fit. Choose a task of at most that many tokens or "
                "a square number of tokens"
            )
        return pos[:, :n].to(dtype)

    #: the task's tokens a row when every row has that many (:meth:`for_task`): the grid positions resize to
    grid_tokens: int | None = None

    def for_task(self, tokens: int | None) -> None:
        self.grid_tokens = tokens

    def positions_for(self, width: int, dtype: torch.dtype, lengths: torch.Tensor) -> torch.Tensor:
        """Positions ``(B or 1, width, d)`` of a batch ``width`` tokens wide, by each row's own length: a row of the
        task's fixed length takes :meth:`patch_positions`, any other its first positions (zero past them: padding),
        so a row's positions never depend on its batch mates'. Decided from shapes alone (no host synchronisation,
        one compiled graph)."""
        table = self.position_table()[:, self.n_special :]
        if width > max(self.n_patches, self.grid_tokens or 0):
            raise BackboneError(
                f"{self.config.model_type} has {self.n_patches} patch positions; rows of {width} tokens of a task "
                "of variable length do not fit. Choose a task of at most that many tokens"
            )
        first = nn.functional.pad(
            table[:, : min(width, self.n_patches)], (0, 0, 0, max(0, width - self.n_patches))
        )
        first = first.to(dtype)
        if self.grid_tokens is None or width < self.grid_tokens or self.grid_tokens == self.n_patches:
            return first
        grid = self.patch_positions(self.grid_tokens, dtype)
        grid = nn.functional.pad(grid, (0, 0, 0, width - self.grid_tokens))
        whole = (lengths.to(grid.device) == self.grid_tokens)[:, None, None]
        return torch.where(whole, grid, first)

    @property
    def blocks_take_mask(self) -> bool:
        """Whether a block's forward takes an attention mask after the hidden states (DINOv2's does from
        transformers 5.18 on; ViT's, DeiT's, CLIP's and SigLIP's always have)."""
        params = list(inspect.signature(self.blocks[0].forward).parameters.values())
        return len(params) > 1 and params[1].kind in (
            params[1].POSITIONAL_ONLY,
            params[1].POSITIONAL_OR_KEYWORD,
        )

    def embed(self, x, lengths, readout, last):
        """``x`` plus the patch positions, through the embedding dropout and the norm before the
        blocks; the attention mask over each row's padding, where the blocks take one (refused
        for rows of unequal length where they do not)."""
        h = x + self.positions_for(x.shape[1], x.dtype, lengths)
        dropout = getattr(self.model.embeddings, "dropout", None)
        h = dropout(h) if dropout is not None else h
        h = self.pre_norm(h) if self.pre_norm is not None else h
        real = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
        if not self.blocks_take_mask:
            if not bool(real.all()):
                from transformers import __version__ as transformers_version

                raise BackboneError(
                    f"the {self.kind} blocks of transformers {transformers_version} take no attention mask, so "
                    "rows padded to a common length would attend to the padding; pip install "
                    "'transformers>=5.18' for tasks of variable length (image tasks need no mask)"
                )
            return h, None
        return h, (1.0 - real[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min

    def call_block(self, i, h, mask):
        block = self.blocks[i]
        return first_output(block(h) if mask is None else block(h, mask))

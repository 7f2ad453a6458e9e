"""ALBERT adapter: one block group shared by every layer, so each application is a depth.

ALBERT's encoder applies its ``num_hidden_groups`` block groups ``num_hidden_layers`` times (layer ``i``
runs group ``i * groups // layers``): the stack lists each application, and the generic adapter, which
counts block calls, reads depth ``k`` as the ``k+1``-th call's input; everything else is found as it finds it. A
shared group's parameters belong to every depth that applies it, and are trained once.
"""

from __future__ import annotations

from torch import nn

from reservoir.model.backbones.hf import HFBackbone, register_family


@register_family
class AlbertBackbone(HFBackbone):
    """A Hugging Face ALBERT model, one depth per application of its shared blocks."""

    family = "albert"
    model_types = ("albert",)
    naming = "a save_pretrained folder of ALBERT (shared blocks: one depth per application)"

    def block_stack(self) -> nn.ModuleList:
        groups = self.model.encoder.albert_layer_groups
        n, g = self.config.num_hidden_layers, self.config.num_hidden_groups
        return nn.ModuleList([groups[int(i / (n / g))] for i in range(n)])

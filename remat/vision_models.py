"""The built-in image models' modules and configs, written from scratch: a ResNet-style conv net
and a ViT (the registry that builds them with example inputs is :mod:`remat.zoo`). They live apart
from :mod:`remat.models` (the language models, the dropout MLP) to keep each module short; the ViT
reuses that module's transformer pieces (``TransformerShape``, ``Block``, ``run_blocks``). Every
model's ``forward`` returns a scalar loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .models import Block, TransformerShape, run_blocks

IMAGE_CHANNELS = 3


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvNetConfig:
    """ResNet style image classifier."""

    channels: int = 8
    blocks: int = 2
    image: int = 16
    classes: int = 10
    batch: int = 4


@dataclass(frozen=True)
class ViTConfig(TransformerShape):
    """Vision transformer classifier with a cls token."""

    patch: int = 4
    image: int = 16
    classes: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.image % self.patch:
            raise ValueError(f"image={self.image} is not divisible by patch={self.patch}")


# --------------------------------------------------------------------------
# ConvNet
# --------------------------------------------------------------------------


def _conv_bn(c_in: int, c_out: int) -> list[nn.Module]:
    """A bias-free 3x3 same-padding conv followed by BatchNorm."""
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out)]


class ResidualBlock(nn.Module):
    """conv-bn-relu-conv-bn plus identity, then relu."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(channels, channels), nn.ReLU(), *_conv_bn(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` (N, C, H, W)."""
        return F.relu(x + self.body(x))


class ConvNet(nn.Module):
    """ResNet style classifier returning the cross-entropy loss."""

    def __init__(self, cfg: ConvNetConfig) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(IMAGE_CHANNELS, cfg.channels), nn.ReLU())
        self.blocks = nn.Sequential(*(ResidualBlock(cfg.channels) for _ in range(cfg.blocks)))
        self.head = nn.Linear(cfg.channels, cfg.classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of classifying images ``x`` (N, 3, H, W) as labels ``y`` (N,)."""
        return F.cross_entropy(self.predict(x), y)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (N, classes) of images ``x`` (N, 3, H, W)."""
        h = self.blocks(self.stem(x))
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.head(h)


# --------------------------------------------------------------------------
# ViT
# --------------------------------------------------------------------------


class ViT(nn.Module):
    """Vision transformer classifying from its cls token, returning the loss."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        patches = (cfg.image // cfg.patch) ** 2
        self.patch_emb = nn.Conv2d(IMAGE_CHANNELS, cfg.d_model, cfg.patch, stride=cfg.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.pos_emb = nn.Parameter(0.02 * torch.randn(1, patches + 1, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.heads, causal=False) for _ in range(cfg.layers))
        self.graph_break_after = cfg.graph_break_after
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of classifying images ``x`` (N, 3, H, W) as labels ``y`` (N,)."""
        return F.cross_entropy(self.predict(x), y)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (N, classes) of images ``x`` (N, 3, H, W), from the cls token."""
        patches = self.patch_emb(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        h = run_blocks(self.blocks, torch.cat((cls, patches), dim=1) + self.pos_emb, self.graph_break_after)
        return self.head(self.norm(h[:, 0]))

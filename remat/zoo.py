"""The built-in models, written from scratch: what ``remat plan NAME``, the demo and the tour train.

GPT-style (fused SDPA or explicit softmax attention), Llama-style, ResNet-style
conv net, ViT and a dropout MLP. Every model's ``forward`` takes the example
inputs made by :func:`build` and returns a scalar loss, so
``model(*inputs).backward()`` is one training step. :func:`build_loss_outside` builds the
same model the way most training loops are written: the model returns predictions and the loss is
computed outside it.

>>> model, inputs = build("gpt", layers=2, d_model=64, seq=32)
>>> model(*inputs).backward()
>>> outside = build_loss_outside("gpt", layers=2, d_model=64, seq=32)
>>> outside.step(outside.model)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .models import (
    GPT,
    DropoutMLP,
    GPTConfig,
    Inputs,
    Llama,
    LlamaConfig,
    MLPConfig,
    next_token_loss,
)
from .vision_models import IMAGE_CHANNELS, ConvNet, ConvNetConfig, ViT, ViTConfig

__all__ = ["GPT", "GPTConfig", "Llama", "LlamaConfig", "ConvNet", "ConvNetConfig", "ViT", "ViTConfig",
           "DropoutMLP", "MLPConfig", "MODELS", "ModelSpec", "LossOutside", "build", "build_loss_outside", "names"]


def _token_inputs(cfg: GPTConfig | LlamaConfig) -> Inputs:
    """Token ids and next-token targets, both int64 (B, T) in [0, vocab)."""
    shape = (cfg.batch, cfg.seq)
    return torch.randint(cfg.vocab, shape), torch.randint(cfg.vocab, shape)


def _image_inputs(cfg: ConvNetConfig | ViTConfig) -> Inputs:
    """Random images (N, 3, H, W) and int64 labels (N,) in [0, classes)."""
    images = torch.randn(cfg.batch, IMAGE_CHANNELS, cfg.image, cfg.image)
    return images, torch.randint(cfg.classes, (cfg.batch,))


def _regression_inputs(cfg: MLPConfig) -> Inputs:
    """Random features (N, width) and targets (N, 1)."""
    return torch.randn(cfg.batch, cfg.width), torch.randn(cfg.batch, 1)


@dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo entry: its config, model and example inputs."""

    config: type
    model: Callable[[Any], nn.Module]
    inputs: Callable[[Any], Inputs]
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy  # (predictions, targets)

    def make_config(self, name: str, overrides: dict[str, Any]) -> Any:
        """The config with ``defaults`` then ``overrides`` applied; ValueError on unknown fields."""
        valid = [f.name for f in dataclasses.fields(self.config)]
        unknown = sorted(set(overrides) - set(valid))
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown} for model {name!r}; valid fields: {valid}")
        return self.config(**{**self.defaults, **overrides})


MODELS: dict[str, ModelSpec] = {
    "gpt": ModelSpec(GPTConfig, GPT, _token_inputs, loss=next_token_loss),
    "gpt-softmax": ModelSpec(GPTConfig, GPT, _token_inputs, {"attention": "softmax"}, loss=next_token_loss),
    "llama": ModelSpec(LlamaConfig, Llama, _token_inputs, loss=next_token_loss),
    "convnet": ModelSpec(ConvNetConfig, ConvNet, _image_inputs),
    "vit": ModelSpec(ViTConfig, ViT, _image_inputs),
    "mlp-dropout": ModelSpec(MLPConfig, DropoutMLP, _regression_inputs, loss=F.mse_loss),
}


def _to(t: torch.Tensor, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Move ``t`` to ``device``, casting it to ``dtype`` only if it is floating point."""
    return t.to(device, dtype) if t.is_floating_point() else t.to(device)


def names() -> list[str]:
    """Names of all models in the zoo."""
    return list(MODELS)


def build(
    name: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    **overrides: Any,
) -> tuple[nn.Module, Inputs]:
    """Build model ``name`` and example inputs such that ``model(*inputs)`` is a scalar loss.

    ``overrides`` replace config fields. Torch is seeded with ``seed``; weights
    and inputs are drawn on the CPU, then moved, so they match across devices.
    Floating-point parameters, buffers and inputs take ``dtype``.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {names()}")
    spec = MODELS[name]
    cfg = spec.make_config(name, overrides)
    torch.manual_seed(seed)
    model = spec.model(cfg).to(device=device, dtype=dtype)
    inputs = tuple(_to(t, device, dtype) for t in spec.inputs(cfg))
    return model, inputs


class Predictor(nn.Module):
    """A zoo model that returns its predictions (``model.predict``): the loss is the caller's."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.predict(x)


@dataclass
class LossOutside:
    """A zoo model whose loss is computed outside it: ``loss(model(*inputs), targets)``."""

    model: nn.Module
    inputs: Inputs
    targets: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def step(self, run: Callable[..., torch.Tensor]) -> None:
        """One training step through ``run`` (the model, or what compiled it): forward, loss, backward."""
        self.loss(run(*self.inputs), self.targets).backward()


def build_loss_outside(name: str, **options: Any) -> LossOutside:
    """Model ``name`` returning its predictions (logits, or a regression's outputs), its inputs, its
    targets and its loss function; ``options`` as :func:`build`'s."""
    model, (*inputs, targets) = build(name, **options)
    return LossOutside(Predictor(model), tuple(inputs), targets, MODELS[name].loss)

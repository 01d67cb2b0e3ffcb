"""Tests for the benchmark model zoo in bench/models.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench import models


def _check_train_step(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Run forward+backward; the loss and every trainable grad must be finite."""
    loss = model(*inputs)
    assert loss.dim() == 0
    assert torch.isfinite(loss)
    loss.backward()
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None, f"{name} got no grad"
            assert torch.isfinite(param.grad).all(), f"{name} has a non-finite grad"


def test_names_match_registry() -> None:
    assert models.names() == ["gpt", "gpt-softmax", "llama", "convnet", "vit", "mlp-dropout"]


@pytest.mark.parametrize("name", models.names())
def test_forward_backward(name: str) -> None:
    _check_train_step(*models.build(name))


@pytest.mark.parametrize("name", ["gpt", "gpt-softmax"])
def test_gpt_with_dropout(name: str) -> None:
    _check_train_step(*models.build(name, dropout=0.1))


def test_softmax_attention_matches_sdpa() -> None:
    sdpa, inputs = models.build("gpt")
    softmax, _ = models.build("gpt-softmax")
    torch.testing.assert_close(softmax(*inputs), sdpa(*inputs))


def test_same_seed_same_loss() -> None:
    first = models.build("llama", seed=3)
    second = models.build("llama", seed=3)
    assert torch.equal(first[0](*first[1]), second[0](*second[1]))


def test_overrides() -> None:
    model, (idx, targets) = models.build("gpt", layers=3, seq=16, batch=5)
    assert isinstance(model, models.GPT)
    assert len(model.blocks) == 3
    assert idx.shape == targets.shape == (5, 16)
    assert idx.dtype == torch.int64
    assert int(idx.min()) >= 0 and int(idx.max()) < models.GPTConfig.vocab


def test_dtype_casts_floats_only() -> None:
    model, (images, labels) = models.build("convnet", dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert images.dtype == torch.float64
    assert labels.dtype == torch.int64


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="known models.*'gpt'"):
        models.build("resnet152")


def test_unknown_field() -> None:
    with pytest.raises(ValueError, match="'depth'.*valid fields.*'layers'"):
        models.build("gpt", depth=3)


def test_bad_config_value() -> None:
    with pytest.raises(ValueError, match="attention"):
        models.build("gpt", attention="flash")


def test_convnet_updates_batchnorm_stats() -> None:
    model, inputs = models.build("convnet")
    bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    before = bn.running_mean.clone()
    model(*inputs)
    assert not torch.equal(bn.running_mean, before)

"""Tests for the built-in model zoo in remat/zoo.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from remat import zoo


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
    assert zoo.names() == ["gpt", "gpt-softmax", "llama", "convnet", "vit", "mlp-dropout"]


@pytest.mark.parametrize("name", zoo.names())
def test_forward_backward(name: str) -> None:
    _check_train_step(*zoo.build(name))


@pytest.mark.parametrize("name", ["gpt", "gpt-softmax"])
def test_gpt_with_dropout(name: str) -> None:
    _check_train_step(*zoo.build(name, dropout=0.1))


def test_softmax_attention_matches_sdpa() -> None:
    sdpa, inputs = zoo.build("gpt")
    softmax, _ = zoo.build("gpt-softmax")
    torch.testing.assert_close(softmax(*inputs), sdpa(*inputs))


def test_same_seed_same_loss() -> None:
    first = zoo.build("llama", seed=3)
    second = zoo.build("llama", seed=3)
    assert torch.equal(first[0](*first[1]), second[0](*second[1]))


def test_overrides() -> None:
    model, (idx, targets) = zoo.build("gpt", layers=3, seq=16, batch=5)
    assert isinstance(model, zoo.GPT)
    assert len(model.blocks) == 3
    assert idx.shape == targets.shape == (5, 16)
    assert idx.dtype == torch.int64
    assert int(idx.min()) >= 0 and int(idx.max()) < zoo.GPTConfig.vocab


def test_dtype_casts_floats_only() -> None:
    model, (images, labels) = zoo.build("convnet", dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert images.dtype == torch.float64
    assert labels.dtype == torch.int64


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="known models.*'gpt'"):
        zoo.build("resnet152")


def test_unknown_field() -> None:
    with pytest.raises(ValueError, match="'depth'.*valid fields.*'layers'"):
        zoo.build("gpt", depth=3)


def test_bad_config_value() -> None:
    with pytest.raises(ValueError, match="attention"):
        zoo.build("gpt", attention="flash")


def test_convnet_updates_batchnorm_stats() -> None:
    model, inputs = zoo.build("convnet")
    bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    before = bn.running_mean.clone()
    model(*inputs)
    assert not torch.equal(bn.running_mean, before)

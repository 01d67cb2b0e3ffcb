"""Regions the model wraps in torch.utils.checkpoint: recomputed as asked by default, planned on request."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import remat


class CheckpointedMLP(nn.Module):
    """Two blocks; the first wrapped in ``checkpoint`` (non-reentrant, as torch.compile traces it)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.second = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = checkpoint(self.first, x, use_reentrant=False)
        return self.second(x).square().mean()


def _plan(**options: object) -> remat.Report:
    torch.manual_seed(0)
    return remat.plan(CheckpointedMLP(), torch.randn(32, 64), compiler="eager", **options)


def _region_values(report: remat.Report) -> list:
    """Each block's first linear layer: a matmul the fastest plan keeps unless told otherwise."""
    linears = [n for n in report.nodes if n.op == "aten.addmm.default" and n.decision != "backward"]
    assert len(linears) == 4, [n.op for n in linears]
    return [linears[0], linears[2]]


def test_a_checkpoint_region_is_recomputed_as_the_model_asks_and_the_report_says_so() -> None:
    report = _plan()  # no budget: without the region, remat would keep everything
    inside, outside = _region_values(report)
    assert inside.decision == "recomputed" and outside.decision == "kept"
    assert any("torch.utils.checkpoint regions recomputed as the model asks" in n for n in report.notes)


def test_checkpoint_regions_plan_lets_remat_decide_inside_them() -> None:
    report = _plan(checkpoint_regions="plan")
    inside, outside = _region_values(report)
    assert inside.decision == outside.decision == "kept"
    assert any("planned by remat like the rest" in n for n in report.notes)


@pytest.mark.parametrize("regions", ["recompute", "plan"])
def test_checkpoint_regions_keep_gradients_exact(regions: str) -> None:
    torch.manual_seed(0)
    model, x = CheckpointedMLP(), torch.randn(32, 64)
    reference = copy.deepcopy(model)
    remat.compile(model, compiler="eager", checkpoint_regions=regions)(x).backward()
    reference(x).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_an_unknown_checkpoint_regions_value_says_what_it_takes() -> None:
    with pytest.raises(ValueError, match="checkpoint_regions must be one of"):
        remat.plan(CheckpointedMLP(), torch.randn(4, 64), checkpoint_regions="ignore")

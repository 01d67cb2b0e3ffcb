"""Shared fixtures: small models from remat.zoo and budgets between their limits."""

from __future__ import annotations

import os

# Inductor's CPU compiler imports torch.utils.cpp_extension, which imports setuptools, whose
# distutils shim refuses to load once the standard library's distutils is in the process (some
# test's imports bring it in). Loading setuptools first installs the shim before that can happen.
import setuptools  # noqa: F401
import pytest
import torch

import remat
from remat import zoo
from remat.errors import GIB

# Tests plan afresh unless they turn the plan cache on themselves (tests/test_plan_cache.py);
# subprocesses inherit this too.
os.environ["REMAT_PLAN_CACHE"] = "off"

# Sizes where activations, not parameters, dominate the step's peak.
SMALL = {
    "gpt": {"batch": 8, "seq": 64},
    "gpt-softmax": {"batch": 8, "seq": 64},
    "llama": {"batch": 8, "seq": 64},
    "convnet": {"batch": 8},
    "vit": {"batch": 8},
    "mlp-dropout": {"batch": 64},
}


def build(name: str, **overrides: object) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return zoo.build(name, **{**SMALL.get(name, {}), **overrides})


def budget_between(report: remat.Report, fraction: float) -> float:
    """A budget_gb ``fraction`` of the way from the smallest feasible to the
    budget at which keeping everything fits (both with the headroom)."""
    return report.budget_at(fraction) / GIB


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()

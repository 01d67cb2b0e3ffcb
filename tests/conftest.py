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

# Under Inductor every plan is compiled, in seconds per block: one block of each model has
# every kind of op and decision the tests look at.
INDUCTOR_SIZE = {"gpt": {"layers": 1}, "gpt-softmax": {"layers": 1}, "llama": {"layers": 1}, "convnet": {"blocks": 1}}


def build(name: str, **overrides: object) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return zoo.build(name, **{**SMALL.get(name, {}), **overrides})


_PLANNED: dict[tuple, remat.Report] = {}


def planned(name: str, compiler: str, **overrides: object) -> remat.Report:
    """``remat.plan`` with no budget of ``build(name, **overrides)``, made once per session.

    Tests that need only a model's budgets (its smallest feasible and store-all) share this
    report: a plan depends on the graph and its shapes, not on the weights, so any model built
    alike gets the same. Under Inductor that saves each such test two compiles.
    """
    key = (name, compiler, tuple(sorted(overrides.items())))
    if key not in _PLANNED:
        model, inputs = build(name, **overrides)
        report = remat.plan(model, *inputs, compiler=compiler)
        report.min_feasible_bytes  # now, not under whatever a later test patches
        _PLANNED[key] = report
    return _PLANNED[key]


def budget_between(report: remat.Report, fraction: float) -> float:
    """A budget_gb ``fraction`` of the way from the smallest feasible to the
    budget at which keeping everything fits (both with the headroom)."""
    return report.budget_at(fraction) / GIB


@pytest.fixture(autouse=True)
def fresh_dynamo():
    from remat.passes.program.known_programs import KNOWN
    from remat.passes.scope.step import STEP

    def forget() -> None:
        torch._dynamo.reset()
        STEP.forget_measured()  # what a step measured after a graph: each test measures its own
        KNOWN.forget()  # and compiles its own programs: what a test compiles does not hang on the order

    forget()
    yield
    forget()

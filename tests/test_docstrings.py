"""The examples in remat's docstrings run."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["remat.budget", "remat.solvers.errors", "remat.solvers.lazy",
                                    "remat.passes.capture.values", "remat.passes.costs.profile",
                                    "remat.passes.costs.timing", "remat.passes.torch_adapter.profiler",
                                    "remat.solvers.plan",
                                    "remat.zoo"])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0

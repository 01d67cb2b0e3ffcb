"""Docstring examples run, and FORMULATION.md names what the code names."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import remat.solvers
from remat.solvers import ilp
from remat.solvers.testing import random_problem

FORMULATION = Path(ilp.__file__).with_name("FORMULATION.md").read_text()


def test_package_docstring_examples_run() -> None:
    result = doctest.testmod(remat.solvers, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_every_row_family_is_documented() -> None:
    model = ilp.build_model(random_problem(4, 30, 30), 10**6)
    families = {re.sub(r"(_\d+)+$", "", c.name) for c in model.prob.constraints()}
    assert families == {"need", "keep_or_recompute", "started", "operand", "memory", "peak", "scratch"}
    for family in families:
        assert f"`{family}_" in FORMULATION

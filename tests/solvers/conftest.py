"""Tiny hand-built problems with answers worked out in the test docstrings."""

from __future__ import annotations

import pytest

from remat.solvers import Problem
from remat.solvers.testing import Node, build_problem


def branch_problem(*, ban_b: bool = False, b_seconds: float = 0.1) -> Problem:
    """x -> a -> b -> out; the backward first allocates g1 (200 B) reading
    nothing, then reads b (g2), then a (g3).

    Steps a0 b1 out2 g1:3 g2:4 g3:5. Store-all peaks at step 3 with 420 B
    (x 10, a 100, b 100, out 10, g1 200). Recomputing b saves 100 B there
    for 0.1 s, recomputing a saves 100 B for 5 s, both reach 230 B (the
    step-4 floor: x, a, b, out, g2).
    """
    forward = [
        Node("a", 100, ("x",), recompute_seconds=5.0),
        Node("b", 100, ("a",), recompute_seconds=b_seconds, ban="random op" if ban_b else None),
        Node("out", 10, ("b",), output=True),
    ]
    backward = [Node("g1", 200), Node("g2", 10, ("b",)), Node("g3", 10, ("a",), grad=True)]
    return build_problem([("x", 10)], forward, backward)


def view_problem() -> Problem:
    """x -> a -> v = view(a) -> out; the backward allocates g1 (200 B), then
    reads v. The view cannot be kept: store-all keeps a and recomputes v,
    peaking at step 3 with 320 B (x 10, a 100, out 10, g1 200)."""
    forward = [
        Node("a", 100, ("x",), recompute_seconds=1.0),
        Node("v", reads=("a",), view=True),
        Node("out", 10, ("v",), output=True),
    ]
    backward = [Node("g1", 200), Node("g2", 10, ("v",))]
    return build_problem([("x", 10)], forward, backward)


def chain_problem() -> Problem:
    """x -> a -> b -> c, each 100 B; the backward reads c, b, a in turn.

    ``a`` is first needed at step 4 (where ``b`` would be recomputed), so
    recomputing it lowers the peak from 320 B at step 3 (x 10, a, b, c,
    gc 10) to 220 B; recomputing ``b`` needs ``a`` kept (``a`` is first
    needed after ``b``), and ``c`` is read at once.
    """
    forward = [
        Node("a", 100, ("x",), recompute_seconds=1.0),
        Node("b", 100, ("a",), recompute_seconds=1.0),
        Node("c", 100, ("b",), recompute_seconds=1.0),
    ]
    backward = [Node("gc", 10, ("c",)), Node("gb", 10, ("b",)), Node("ga", 10, ("a",), grad=True)]
    return build_problem([("x", 10)], forward, backward)


@pytest.fixture
def branch() -> Problem:
    return branch_problem()


@pytest.fixture
def view() -> Problem:
    return view_problem()


@pytest.fixture
def chain() -> Problem:
    return chain_problem()


@pytest.fixture
def make_branch():  # type: ignore[no-untyped-def]
    """branch_problem with options (a banned b, another recompute time)."""
    return branch_problem

"""``need_intervals`` (passes/modeling/problem.py): where the backward may first and last need each
forward value, directly or through a chain of recomputed users; and how the Problem
builder turns that into ``need_start``/``need_end``/``direct_start``/``last_use``."""

from __future__ import annotations

import pytest
import torch

from remat.passes.modeling.problem import build_problem, fixed_order, need_intervals
from remat.solvers.problem import Kind

from .helpers import F32, aten, analytic_costs, traced_joint


def joint(primals_1, tangents_1):
    """Steps (forward, then the backward in engine order):

    0 a = sin(x)     1 b = cos(a)     2 c = exp(b)     3 d = c * a (output)     4 e = -x (output)
    5 g1 = t * d     6 g2 = g1 * c    7 g3 = g2 + a * c    (g3 is the gradient)
    """
    a = aten.sin(primals_1)
    b = aten.cos(a)
    c = aten.exp(b)
    d = aten.mul(c, a)
    e = aten.neg(primals_1)
    g1 = aten.mul(tangents_1, d)
    g2 = aten.mul(g1, c)
    g3 = aten.addcmul(g2, a, c)
    return [d, e, g3]


@pytest.fixture(scope="module")
def graph():
    return traced_joint(joint, torch.randn(4, 4), torch.randn(4, 4), num_fwd_outputs=2)


def test_steps(graph) -> None:
    gm, info = graph
    order = fixed_order(gm.graph, info)
    assert [n.name for n in order.steps] == ["sin", "cos", "exp", "mul", "neg", "mul_1", "mul_2", "addcmul"]
    assert len(order.forward) == 5


def test_need_intervals_by_hand(graph) -> None:
    """Worked backwards through the forward:

    - d (mul): read at 5 only, no needed users: [5, 5].
    - c (exp): read at 6 and 7; its user d may be recomputed at 5: [5, 7].
    - b (cos): never read by the backward; needed only to recompute c, which is needed from
      5 on (for d) and is recomputed for its first read, 6, at the latest; a recomputation
      counts at the step before its read (never before the backward's first step, 5): [5, 5].
    - a (sin): read at 7; b and d may need it from 5 on: [5, 7].
    - e (neg): a forward output the backward never reads: no interval.
    """
    gm, info = graph
    first, last = need_intervals(fixed_order(gm.graph, info))
    assert {n.name: s for n, s in first.items()} == {"mul": 5, "exp": 5, "cos": 5, "sin": 5}
    assert {n.name: s for n, s in last.items()} == {"mul": 5, "exp": 7, "cos": 5, "sin": 7}


def test_problem_fields_by_hand(graph) -> None:
    """The Problem's forward values: bytes (a 4x4 float32 is 64 B), need interval, the first
    direct backward read (counted where its recomputation would count: the step before the
    read, never before 5), the last forward read (outputs live to the last step, 7), operands."""
    gm, info = graph
    values = build_problem(gm.graph, info, analytic_costs(gm.graph)).by_name()
    expected = {  # name: (need_start, need_end, direct_need, direct_start, last_use, operands)
        "sin": (5, 7, True, 6, 3, ()),
        "cos": (5, 5, False, None, 2, ("sin",)),
        "exp": (5, 7, True, 5, 3, ("cos",)),
        "mul": (5, 5, True, 5, 7, ("exp", "sin")),
        "neg": (None, None, False, None, 7, ()),
    }
    for name, (start, end, direct, direct_start, last_use, operands) in expected.items():
        v = values[name]
        assert v.kind is Kind.FORWARD and v.bytes == 16 * F32, name
        assert (v.need_start, v.need_end, v.direct_need, v.direct_start, v.last_use, v.operands) == (
            start, end, direct, direct_start, last_use, operands), name
    assert {n for n, v in values.items() if v.is_candidate} == {"sin", "cos", "exp", "mul"}
    grads = {n: (v.kind, v.produced, v.last_use) for n, v in values.items() if n.startswith(("mul_", "addcmul"))}
    assert grads == {"mul_1": (Kind.BACKWARD, 5, 6), "mul_2": (Kind.BACKWARD, 6, 7), "addcmul": (Kind.BACKWARD, 7, 7)}
    tangent = values["tangents_1_1"]
    assert (tangent.kind, tangent.produced, tangent.last_use) == (Kind.BACKWARD, 5, 7)

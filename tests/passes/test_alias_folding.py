"""Alias folding (``storage_owner``/``fold_aliases`` in passes/modeling/problem.py, ``storage_base`` in
passes/costs/profile.py): a view owns no storage; its reads keep its base's storage alive, in the
forward (``last_use``) and in the backward (``need_start``/``need_end``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from remat import solvers
from remat.passes.modeling.problem import build_problem, fixed_order, recompute_step, storage_owner
from remat.passes.costs.profile import storage_bytes
from remat.solvers.problem import Kind

from .helpers import F32, aten, analytic_costs, capture, traced_joint


def joint(primals_1, tangents_1, tangents_2):
    """x is 4x4 float32 (64 B). Steps, the backward in engine order:

    0 a = sin(x)        1 v = a.view(16)       2 w = v.view(2, 8)    3 o1 = -w (output)
    4 b = cos(x)        5 split(b, 2)          6 b0 = [0]            7 b1 = [1]
    8 o2 = b0 + b1 (output, 32 B)              9 c = exp(x)          10 o3 = sum(c) (output, 4 B)
    11 g1 = t1 * w (64 B, a gradient)          12 g2 = t2 * b1 (32 B)
    13 unbind(c) (a backward view of c)        14-17 its four elements, u3 the last
    18 g3 = g2 * u3 (32 B, a gradient)
    """
    a = aten.sin(primals_1)
    v = aten.view(a, [16])
    w = aten.view(v, [2, 8])
    o1 = aten.neg(w)
    b = aten.cos(primals_1)
    b0, b1 = aten.split(b, 2)
    o2 = aten.add(b0, b1)
    c = aten.exp(primals_1)
    o3 = aten.sum(c)
    g1 = aten.mul(tangents_1, w)
    g2 = aten.mul(tangents_2, b1)
    u3 = aten.unbind(c)[3]
    g3 = aten.mul(g2, u3)
    return [o1, o2, o3, g1, g3]


@pytest.fixture(scope="module")
def graph():
    return traced_joint(joint, torch.randn(4, 4), torch.randn(2, 8), torch.randn(2, 4), num_fwd_outputs=3)


@pytest.fixture(scope="module")
def problem(graph):
    gm, info = graph
    return build_problem(gm.graph, info, analytic_costs(gm.graph))


NAMES = ["sin", "view", "view_1", "neg", "cos", "split", "getitem", "getitem_1", "add", "exp", "sum_1",
         "mul", "mul_1", "unbind", "getitem_2", "getitem_3", "getitem_4", "getitem_5", "mul_2"]


def test_steps(graph) -> None:
    gm, info = graph
    assert [n.name for n in fixed_order(gm.graph, info).steps] == NAMES


def test_every_view_is_owned_by_its_base(graph) -> None:
    gm, _ = graph
    costs = analytic_costs(gm.graph)
    nodes = {n.name: n for n in gm.graph.nodes}
    owners = {name: storage_owner(nodes[name], costs, nodes).name for name in NAMES}
    assert {k: v for k, v in owners.items() if k != v} == {
        "view": "sin", "view_1": "sin",                           # a view of a view
        "split": "cos", "getitem": "cos", "getitem_1": "cos",     # split and its outputs
        "unbind": "exp", "getitem_2": "exp", "getitem_3": "exp",  # unbind and its outputs, in the backward
        "getitem_4": "exp", "getitem_5": "exp",
    }


def test_views_hold_no_bytes_and_cannot_be_kept(problem) -> None:
    values = problem.by_name()
    for name in ("view", "view_1", "split", "getitem", "getitem_1", "unbind", "getitem_2", "getitem_5"):
        assert values[name].bytes == 0, name
    for name in ("view", "view_1", "split", "getitem", "getitem_1"):
        assert values[name].kind is Kind.FORWARD and not values[name].savable, name
    assert [values[n].bytes for n in ("sin", "cos", "exp", "neg", "add", "sum_1")] == [64, 64, 64, 64, 32, 4]


def test_forward_reads_of_a_view_keep_the_base(problem) -> None:
    """sin's only direct forward reader is its view at step 1; the view of the view is read
    at 3. cos is read by split at 5; split's outputs are read at 8."""
    values = problem.by_name()
    assert values["sin"].last_use == 3
    assert values["cos"].last_use == 8
    assert values["exp"].last_use == 10


def test_backward_reads_of_a_view_are_the_base_s_need(problem) -> None:
    """sin is never read by the backward itself: its view of a view is, at 11. cos: through
    its split output at 12. exp: the backward unbinds it at 13, and reads an element at 18. A
    recomputation for a read counts at the step before it, never before the backward's first
    step (11): cos's need starts at 11, exp's at 12."""
    values = problem.by_name()
    need = {n: (values[n].need_start, values[n].need_end, values[n].direct_need) for n in ("sin", "cos", "exp")}
    assert need == {"sin": (11, 11, False), "cos": (11, 12, False), "exp": (12, 18, True)}
    assert (values["view_1"].need_start, values["view_1"].need_end, values["view_1"].direct_need) == (11, 11, True)
    assert (values["getitem_1"].need_start, values["getitem_1"].direct_need) == (11, True)


def test_store_all_keeps_the_bases_and_recomputes_the_views(problem) -> None:
    """Keeping everything keeps each base, recomputes the views (free), and holds each base's
    storage until its views' last backward read. By hand (x 64 B from step 0; tangents 64 + 32 B
    from 11): sin 0-11, neg 3-18, cos 4-12, add 8-18, exp 9-18, sum 10-18; g1 11-18, g2 12-18,
    g3 at 18."""
    plan = solvers.store_all(problem)
    assert plan.saved == {"sin", "cos", "exp"}
    assert plan.recomputed == {"view", "view_1", "split", "getitem_1"}
    assert plan.timeline == (128, 128, 128, 192, 256, 256, 256, 256, 288, 352, 356,
                             516, 484, 420, 420, 420, 420, 420, 452)


def test_a_view_of_a_saved_value_in_real_graphs_is_counted_as_its_base() -> None:
    """An MLP as remat receives it: the backward reads relu through alias(alias(relu)), both
    backward nodes; relu's storage is needed until the last of them is read (le)."""
    torch.manual_seed(0)
    got = capture(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(3, 4),
                  run_backward=False)
    values = build_problem(got.joint, got.info, analytic_costs(got.joint)).by_name()
    order = fixed_order(got.joint, got.info)
    step = {n.name: i for n, i in order.step_of.items()}
    assert values["alias"].kind is Kind.BACKWARD and values["alias"].bytes == 0
    assert values["alias_1"].bytes == 0
    relu = values["relu"]
    assert relu.bytes == storage_bytes(torch.empty(3, 8)) == 3 * 8 * F32
    # its first direct read, the weight gradient; a recomputation for it counts the step before
    assert relu.need_start == recompute_step(order, step["mm_1"]) == step["mm_1"] - 1
    assert relu.need_end == step["le"] > step["mm_1"]  # through the aliases, read later

"""``realized_peak`` (passes/modeling/memory.py): the partitioned forward and backward graphs run op by
op, storage by storage. Graph inputs live throughout; saved values until their last backward
read; the caller's outputs and the gradients to the end; each op's workspace at its step.

The graphs are written out node by node (as the partitioner hands them over: a backward
placeholder named like a forward node is that saved value), so every byte is known.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx

from remat.passes.modeling.memory import realized_peak
from remat.passes.costs.profile import NodeCost, profile_graph

aten = torch.ops.aten


class Builder:
    """A graph whose nodes carry the ``meta["val"]`` the partitioner's graphs carry."""

    def __init__(self) -> None:
        self.graph = fx.Graph()

    def input(self, name: str, *shape: int, dtype: torch.dtype = torch.float32) -> fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = torch.empty(shape, dtype=dtype)
        return node

    def op(self, name: str, target, *args) -> fx.Node:
        node = self.graph.create_node("call_function", target, args, name=name)
        real = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
        node.meta["val"] = target(*real)
        return node

    def done(self, *outputs: fx.Node) -> fx.GraphModule:
        self.graph.output(tuple(outputs))
        return fx.GraphModule(torch.nn.Module(), self.graph)


def simple_pair() -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward: x (4x4, 64 B); 0 a = relu(x) 64 B, saved; 1 b = a * a 64 B; 2 s = sum(b) 4 B,
    the caller's output. Backward: the tangent (4 B) arrives; 3 g = a * t 64 B; 4 g2 = 2 g 64 B,
    the gradient.

    Alive: x 0-4, a 0-3, b 1-2, s 2-4, t 3, g 3-4, g2 4. By step: 128, 192, 196, 200, 196."""
    fw = Builder()
    x = fw.input("x", 4, 4)
    a = fw.op("a", aten.relu.default, x)
    b = fw.op("b", aten.mul.Tensor, a, a)
    s = fw.op("s", aten.sum.default, b)
    forward = fw.done(s, a)
    bw = Builder()
    a_in, t = bw.input("a", 4, 4), bw.input("tangents_1")
    g = bw.op("g", aten.mul.Tensor, a_in, t)
    g2 = bw.op("g2", aten.mul.Tensor, g, 2)
    return forward, bw.done(g2)


def test_realized_peak_by_hand() -> None:
    assert realized_peak(*simple_pair()) == 200


def with_workspace(gm: fx.GraphModule, name: str, nbytes: int) -> None:
    node = next(n for n in gm.graph.nodes if n.name == name)
    node.meta["remat"] = NodeCost(bytes=0, flops=0.0, seconds=0.0, workspace=nbytes, kind="pointwise")


@pytest.mark.parametrize(("graph", "name", "workspace", "peak"), [
    ("forward", "b", 10, 202),      # step 1: 192 + 10, now above the backward's 200
    ("forward", "b", 4, 200),       # step 1: 196, still below step 3
    ("backward", "g2", 1000, 1196),  # step 4: 196 + 1000
])
def test_realized_peak_with_op_workspace(graph: str, name: str, workspace: int, peak: int) -> None:
    """The profile's ``node.meta["remat"]`` adds each op's scratch at its own step only."""
    forward, backward = simple_pair()
    with_workspace(forward if graph == "forward" else backward, name, workspace)
    assert realized_peak(forward, backward) == peak


def test_realized_peak_with_analytic_profile_costs() -> None:
    """Profiled without running (analytic), ops have no workspace: the peak is unchanged."""
    forward, backward = simple_pair()
    costs = profile_graph(forward.graph, mode="analytic") | profile_graph(backward.graph, mode="analytic")
    assert {costs[n].workspace for n in ("a", "b", "s", "g", "g2")} == {0}
    assert realized_peak(forward, backward) == 200


def test_a_view_of_a_saved_value_keeps_its_whole_storage() -> None:
    """Forward: x 64 B; 0 a = relu(x) 64 B, saved; 1 s = sum(a) 4 B. Backward: the tangent 4 B;
    2 r = a[0], a 16-byte view of a; 3 g = x + r 64 B. Reading r at 3 keeps a's 64 B alive
    there: 128, 132, 136, 196 (not 16 B of view with a freed at 2, which would peak at 152)."""
    fw = Builder()
    x = fw.input("x", 4, 4)
    a = fw.op("a", aten.relu.default, x)
    s = fw.op("s", aten.sum.default, a)
    forward = fw.done(s, a)
    bw = Builder()
    x_in, a_in, _ = bw.input("x", 4, 4), bw.input("a", 4, 4), bw.input("tangents_1")
    r = bw.op("r", aten.select.int, a_in, 0, 0)
    g = bw.op("g", aten.add.Tensor, x_in, r)
    assert realized_peak(forward, bw.done(g)) == 196


def test_outputs_of_a_multi_output_op_exist_from_its_step() -> None:
    """Forward: x 64 B; 0 a = relu(x) 64 B, saved; 1 var_mean(a) (two 16 B outputs, picked at 4
    and 5); 2 big = a * a 64 B; 3 o1 = sum(big) 4 B; 6 o2 = var + mean 16 B. Backward: the
    tangent 16 B; 7 g = sum(a) 4 B.

    var and mean are allocated by var_mean at step 1, so at step 3: x, a, var, mean, big, o1 =
    228 (picked at their getitems it would be 196)."""
    fw = Builder()
    x = fw.input("x", 4, 4)
    a = fw.op("a", aten.relu.default, x)
    vm = fw.op("vm", aten.var_mean.correction, a, [0])
    big = fw.op("big", aten.mul.Tensor, a, a)
    o1 = fw.op("o1", aten.sum.default, big)
    var = fw.op("var", operator.getitem, vm, 0)
    mean = fw.op("mean", operator.getitem, vm, 1)
    o2 = fw.op("o2", aten.add.Tensor, var, mean)
    forward = fw.done(o1, o2, a)
    bw = Builder()
    a_in, _ = bw.input("a", 4, 4), bw.input("tangents_1", 4)
    g = bw.op("g", aten.sum.default, a_in)
    assert realized_peak(forward, bw.done(g)) == 228

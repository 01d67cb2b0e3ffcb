"""``backward_order`` (passes/modeling/problem.py): the backward steps in the order torch runs them.

Pinned against torch's own ``reordering_to_mimic_autograd_engine``, the pass the
min-cut partitioner applies to every backward graph it builds: on a hand-written
joint graph whose listing order differs from the engine's, and on the graphs of
small real models (the backward torch actually built).
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from torch import nn
from torch._functorch.partitioners import reordering_to_mimic_autograd_engine

from remat.passes.modeling.problem import backward_order, fixed_order

from .helpers import aten, call_names, capture, traced_joint


def joint_out_of_engine_order(primals_1, primals_2, primals_3, tangents_1):
    """relu(x @ w) with its backward listed out of the engine's order: two nodes that read
    no tangent come before the first tangent use, as does a buffer update (``copy_``)."""
    wt = aten.t(primals_2)            # backward only, reads no tangent: listed first
    h = aten.mm(primals_1, primals_2)
    r = aten.relu(h)                  # the forward's output
    m = aten.le(r, 0)                 # backward only, reads no tangent
    u = aten.mul(r, 2)                # feeds the buffer update
    aten.copy_(primals_3, u)          # a buffer write before the first tangent use
    s = aten.sum(tangents_1)          # the first node that reads a tangent
    g = aten.mul(tangents_1, m)
    gx = aten.mm(g, wt)
    tp = aten.t(primals_1)
    gw = aten.mm(tp, g)
    return [r, gx, gw, s]


@pytest.fixture(scope="module")
def hand_joint() -> tuple[fx.GraphModule, object]:
    x, w, buf, t = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5), torch.randn(3, 5)
    return traced_joint(joint_out_of_engine_order, x, w, buf, t, num_fwd_outputs=1)


def backward_of(gm: fx.GraphModule, info) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and not info.is_required_fw(n)]


# torch's classification puts the copy_ (a side effect) and the mul it reads in the forward;
# backward_order is handed a list, so these tests hand it the copy_ too, as a backward graph
# that writes a buffer before its first tangent use would have it.
HAND_FORWARD = {"mm", "relu"}


def hand_backward(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.name not in HAND_FORWARD]


def engine_order(graph: fx.Graph, backward: list[fx.Node]) -> list[str]:
    """torch's order: the backward cut out of the joint graph as the partitioner cuts it
    (forward values and tangents become placeholders, nodes keep the joint graph's listing
    order), then ``reordering_to_mimic_autograd_engine``."""
    inside = set(backward)
    bw, env = fx.Graph(), {}
    for n in graph.nodes:  # placeholders first: the tangents and forward values the backward reads
        if n not in inside and n.op != "output" and any(u in inside for u in n.users):
            env[n] = bw.placeholder(n.name)
    for n in graph.nodes:
        if n in inside:
            env[n] = bw.node_copy(n, lambda a: env[a])
    outputs = [env[a] for a in graph.find_nodes(op="output")[0].all_input_nodes if a in inside]
    bw.output(outputs)
    gm = fx.GraphModule(torch.nn.Module(), bw)
    return call_names(reordering_to_mimic_autograd_engine(gm).graph)


def test_hand_joint_is_listed_out_of_engine_order(hand_joint) -> None:
    gm, info = hand_joint
    assert [n.name for n in hand_backward(gm)] == ["t", "le", "mul", "copy_", "sum_1", "mul_1", "mm_1", "t_1",
                                                   "mm_2"]
    assert {n.name for n in gm.graph.nodes if n.op == "call_function" and info.is_required_fw(n)} == {
        "mm", "relu", "mul", "copy_"}


def test_backward_order_by_hand(hand_joint) -> None:
    """The copy_ (with the mul it reads) first; then from the first tangent use on, each node
    right after whichever of its inputs have not run: le just before mul_1, t just before mm_1."""
    gm, _ = hand_joint
    order = backward_order(hand_backward(gm), gm.graph)
    assert [n.name for n in order] == ["mul", "copy_", "sum_1", "le", "mul_1", "t", "mm_1", "t_1", "mm_2"]


def test_backward_order_equals_torch_reordering_on_the_hand_joint(hand_joint) -> None:
    gm, info = hand_joint
    for backward in (hand_backward(gm), backward_of(gm, info)):
        assert [n.name for n in backward_order(backward, gm.graph)] == engine_order(gm.graph, backward)


def test_fixed_order_is_the_forward_then_the_engine_order(hand_joint) -> None:
    """With torch's classification (the buffer update is in the forward): the forward in
    listing order, then the backward with t moved from first to just before its reader."""
    gm, info = hand_joint
    order = fixed_order(gm.graph, info)
    assert [n.name for n in order.steps] == ["mm", "relu", "mul", "copy_",
                                             "sum_1", "le", "mul_1", "t", "mm_1", "t_1", "mm_2"]
    assert {n.name for n in order.forward} == {"mm", "relu", "mul", "copy_"}
    assert {n.name: i for n, i in order.step_of.items()}["t"] == 7


def test_without_a_tangent_reader_the_listing_order_stands() -> None:
    def joint(primals_1, tangents_1):
        a = aten.sin(primals_1)
        b = aten.cos(primals_1)  # a "backward" that reads no tangent: nothing to mimic
        c = aten.neg(b)
        return [a, c]

    gm, info = traced_joint(joint, torch.randn(2), torch.randn(2), num_fwd_outputs=1)
    backward = backward_of(gm, info)
    assert [n.name for n in backward_order(backward, gm.graph)] == ["cos", "neg"]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


class NormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn = nn.Linear(4, 6), nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.a(x)).tanh()


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 4, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-1, -2) / 2).softmax(-1) @ v
        return self.out(att.transpose(1, 2).reshape(2, 4, 8)).square()


MODELS = {"mlp": (MLP, (3, 4)), "batchnorm": (NormNet, (5, 4)), "attention": (Attention, (2, 4, 8))}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_backward_order_equals_the_backward_torch_built(name: str) -> None:
    """The backward graph torch's partitioner built (after its reordering) lists the joint
    graph's backward nodes in exactly remat's order. Forward nodes it recomputes, and nodes it
    dropped as dead, are left out of both sides."""
    make, shape = MODELS[name]
    torch.manual_seed(0)
    got = capture(make(), torch.randn(*shape))
    backward = [n for n in got.joint.nodes if n.op == "call_function" and not got.info.is_required_fw(n)]
    built = call_names(got.backward.graph)
    names = {n.name for n in backward}
    ours = [n.name for n in backward_order(backward, got.joint)]
    assert [n for n in built if n in names] == [n for n in ours if n in built]
    assert len(set(ours) & set(built)) >= 10


def test_the_mlp_backward_is_reordered_not_just_listed() -> None:
    """On the MLP the pin above is not trivial: relu's backward alias is listed before the
    first tangent use but runs just before its reader."""
    torch.manual_seed(0)
    got = capture(MLP(), torch.randn(3, 4))
    backward = [n for n in got.joint.nodes if n.op == "call_function" and not got.info.is_required_fw(n)]
    ours = [n.name for n in backward_order(backward, got.joint)]
    assert [n.name for n in backward] != ours
    assert ours.index("alias") == ours.index("alias_1") - 1
    assert [n.name for n in backward].index("alias") < [n.name for n in backward].index("mm")
    assert ours.index("alias") > ours.index("mm")

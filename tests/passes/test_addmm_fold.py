"""Matmuls Inductor folds into the add that reads them (``addmm_folded``, passes/modeling/problem.py's order).

Inductor's post-grad pattern turns ``add(mm(a, b), c)`` into ``addmm(c, a, b)`` at the add, so
the matmul runs there and its inputs live until then. With tied embeddings the LM head's weight
gradient is added to the embedding's at the end of the backward, which holds the logits
gradient through the whole backward: remat's order under Inductor must say so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from remat.passes import torch_adapter as adapter
from remat.passes.modeling.problem import fixed_order

from .helpers import Captured, aten, traced_joint


class TiedLM(nn.Module):
    """An embedding whose weight is also the LM head's (GPT-2's tying)."""

    def __init__(self, vocab: int = 64, d: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.body = nn.Linear(d, d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(self.embed(idx)))
        logits = F.linear(h, self.embed.weight)  # an LM head tied to the embedding, as GPT-2 ties them
        return F.cross_entropy(logits.flatten(0, 1), idx.flatten())


def tied_joint(**inductor_settings) -> Captured:
    """The tied LM's joint graph as remat gets it under Inductor (after Inductor's joint-graph
    passes, which drop the head's pair of transposes), with torch's min-cut plan, compiled and run
    (``grad``: the tied weight's gradient)."""
    got = Captured()

    def choose(joint, info):
        got.joint, got.info = joint, info
        return adapter.min_cut_saved_values(joint, info)

    def backend(gm, example_inputs):
        with adapter.saved_values_chooser(choose):
            return adapter.compile_inductor(gm, example_inputs, on_graph=lambda graph, kind: None)

    model, idx = tied_model()
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False, **inductor_settings):
        torch.compile(model, backend=backend)(idx).backward()
    got.grad = model.embed.weight.grad
    return got


def tied_model() -> tuple[TiedLM, torch.Tensor]:
    torch.manual_seed(0)
    return TiedLM(), torch.randint(0, 64, (2, 8))


def eager_grad() -> torch.Tensor:
    model, idx = tied_model()
    model(idx).backward()
    return model.embed.weight.grad


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


def test_the_tied_head_gradient_is_kept_where_the_graph_lists_it() -> None:
    """Folded, the head's weight gradient would hold the logits gradient (tokens x vocabulary) to the
    end of the backward; kept apart it holds its product (vocabulary x width), which is smaller."""
    got = tied_joint()
    ops = [n for n in got.joint.nodes if n.op == "call_function"]
    folded = {add: adapter.addmm_folded(add) for add in ops}
    folded = {add: mm for add, mm in folded.items() if mm is not None and not got.info.is_required_fw(add)}
    assert len(folded) == 1, folded  # the tied weight's two gradients summed
    (add, mm), = folded.items()
    plain = fixed_order(got.joint, got.info)
    inductor = fixed_order(got.joint, got.info, inductor=True)
    assert names(plain.steps).index(mm.name) < names(plain.steps).index(add.name) - 1
    assert inductor.unfolded == {add.name} and plain.unfolded == frozenset()
    assert names(inductor.steps) == names(plain.steps)


def test_a_fold_runs_at_the_add_unless_it_holds_more_than_its_product() -> None:
    def joint(a_1, w_1, c_1, col_1, row_1, x_1):
        m1 = aten.mm(a_1, w_1)
        r1 = aten.relu(x_1)               # a step between
        s1 = aten.add(m1, c_1)            # a bias-like addend: cannot be kept apart, runs at the add
        h = aten.relu(a_1)                # an activation, 64 x 32
        m2 = aten.mm(h, w_1)              # its product, 64 x 8
        r2 = aten.relu(x_1)
        s2 = aten.add(m2, r2)             # kept apart: h outweighs the product
        u, v = aten.relu(col_1), aten.relu(row_1)
        m3 = aten.mm(u, v)                # an outer product, 64 x 64, from 64 + 64 floats
        r3 = aten.relu(x_1)
        s3 = aten.add(m3, aten.relu(col_1))  # the product outweighs its inputs: runs at the add
        return [r1, s1, s2, r3, s3]

    example = (torch.randn(64, 32), torch.randn(32, 8), torch.randn(8), torch.randn(64, 1), torch.randn(1, 64),
               torch.randn(64, 8))
    gm, info = traced_joint(joint, *example, num_fwd_outputs=5)
    order = fixed_order(gm.graph, info, inductor=True)
    steps = names(order.steps)
    plain = names(fixed_order(gm.graph, info).steps)
    assert order.unfolded == {"add_1"}
    assert steps.index("mm") == steps.index("add") - 1 and plain.index("mm") < plain.index("add") - 1
    assert steps.index("mm_1") == plain.index("mm_1") and steps.index("add_1") == plain.index("add_1")
    assert steps.index("mm_2") == steps.index("add_2") - 1 and plain.index("mm_2") < plain.index("add_2") - 1


def test_the_fold_follows_torchs_rule() -> None:
    def joint(a_1, b_1, c_1, h_1):
        m1 = aten.mm(a_1, b_1)
        s1 = aten.add(m1, c_1)            # folded
        m2 = aten.mm(a_1, b_1)
        s2 = aten.add(c_1, m2)            # folded, either side
        m3 = aten.mm(a_1, b_1)
        s3 = aten.add(m3, c_1)            # not: the matmul has another reader
        t3 = aten.relu(m3)
        m4 = aten.mm(a_1, b_1)
        s4 = aten.add(m4, c_1, alpha=2)   # folded too: the pattern reads no keyword
        m5 = aten.mm(a_1, b_1)
        s5 = aten.add(m5, h_1)            # not: half and float
        m6 = aten.mm(a_1, b_1)
        s6 = aten.add(m6, 1.0)            # not: a number
        return [s1, s2, s3, t3, s4, s5, s6]

    a, b, c = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    gm, _ = traced_joint(joint, a, b, c, torch.randn(4, 5).half(), num_fwd_outputs=7)
    folded = {n.name: adapter.addmm_folded(n) for n in gm.graph.nodes if n.target is aten.add.Tensor}
    assert {add: mm.name for add, mm in folded.items() if mm is not None} == {"add": "mm", "add_1": "mm_1",
                                                                             "add_3": "mm_3"}
    assert [n.name for n in gm.graph.nodes if adapter.can_unfold(n)] == []  # c_1 broadcasts: none kept apart


def test_inductor_folds_what_the_rule_says() -> None:
    """Pinned against Inductor itself: its backward graph has one more addmm after its post-grad
    passes than before them for each add of the backward the rule folds."""
    seen = {"before": 0, "after": 0}

    def counter(when: str):
        def count(graph) -> None:
            seen[when] += sum(n.target is aten.addmm.default for n in graph.nodes)
        return count

    got = tied_joint(post_grad_custom_pre_pass=counter("before"), post_grad_custom_post_pass=counter("after"))
    folds = [n for n in got.joint.nodes
             if n.op == "call_function" and not got.info.is_required_fw(n) and adapter.addmm_folded(n) is not None]
    assert len(folds) == 1
    assert seen["after"] - seen["before"] == len(folds)


def test_inductor_keeps_an_unfolded_add_apart() -> None:
    """``adapter.unfold`` before Inductor's post-grad passes: no addmm is made of the tied add, and
    the gradients are the same."""
    seen = {"before": 0, "after": 0, "unfolded": 0}

    def unfold_and_count(graph) -> None:
        seen["unfolded"] += adapter.unfold(graph, {n.name for n in graph.nodes if adapter.can_unfold(n)})
        seen["before"] += sum(n.target is aten.addmm.default for n in graph.nodes)

    def count(graph) -> None:
        seen["after"] += sum(n.target is aten.addmm.default for n in graph.nodes)

    got = tied_joint(post_grad_custom_pre_pass=unfold_and_count, post_grad_custom_post_pass=count)
    assert seen["unfolded"] == 1 and seen["after"] == seen["before"]
    assert torch.allclose(got.grad, eager_grad(), atol=1e-6)
